//! `ferry-oci` owns what makes ferry an OCI runtime for container engines (Docker,
//! Podman, containerd), apart from serving the network (the `ferry` binary's `oci`
//! command drives `ferry run`'s servers for that):
//!
//! * [`cli`]: the command line answered (the one dispatch of `ferry oci` and of the lean
//!   `ferry-oci` executable): every command but `install` is answered here, without
//!   ferry's servers; [`create`]: `create`, around the network side ([`side`]: its
//!   command line and what it says, declared for both ends; the side itself is the
//!   `ferry` binary's `oci _serve`);
//! * [`args`]: runc's command line as engines speak it (global `--root`, `--log`,
//!   `--log-format`, `--systemd-cgroup`, …; `create`'s and `delete`'s options), and
//!   ferry's own global options (`--runtime`, `--preset`);
//! * [`options`]: the container's options (`ferry.*` annotations over presets) turned
//!   into `ferry run`'s flags, each named by its source for errors;
//! * [`spec`]: the bundle's `config.json` rewritten for the real runtime: the
//!   container's processes join the sandbox's network namespace (lo + the TAP), the
//!   sandbox's directory is mounted read-only at [`spec::MOUNT`] (control socket and
//!   shim), the shim preloaded where the image has its libraries, and the engine's network
//!   hooks see the namespace the engine gave the container (where the servers run);
//! * [`install`]: the engines' registrations of ferry (Docker's `daemon.json`, a
//!   Podman `containers.conf` drop-in, containerd's CRI table and a Kubernetes
//!   RuntimeClass), as text;
//! * [`state`]: container ids, the per-container state directory and the record of
//!   its network side (pid and start time, so a recycled pid is never signalled);
//! * [`sys`]: the few system calls this needs (entering or making a network namespace,
//!   `lo` up, pidfds and waiting on them).
//!
//! It must not serve traffic, decide policy (the `ferry-egress` crate's), or start
//! processes other than the ones its caller asks for (the real runtime, the engine's
//! hooks, ferry); it depends on nothing heavier than `serde_json`, for the lean
//! executable's start-up.

pub mod args;
pub mod cli;
pub mod create;
pub mod install;
pub mod options;
pub mod side;
pub mod spec;
pub mod state;
pub mod sys;
