//! `ferry-sandbox` owns the sandbox itself: the namespaces a command runs in (a network
//! namespace with only `lo` until nic mode adds its TAP; a PID namespace so nothing the command starts outlives it; a
//! user namespace whose root is an unprivileged host identity — the caller's own ids, or
//! for root a range of subordinate ids — unless the caller opts out; a mount namespace
//! with the sandbox's own `/proc` and `/sys` and its volumes, locked for the command by a
//! user namespace of its own),
//! the sandbox's init process (signal forwarding, reaping, exit-status passthrough), and
//! the socket factory through which host-side code creates sockets inside the sandbox's
//! network namespace (and opens `/dev/net/tun` there, for nic mode's TAP; the init also
//! lets the sandbox's groups make ping sockets). It also provides a veth "remote host" [`testbed`] for tests and
//! benchmarks. It must not do networking policy or relay any traffic (that is the
//! protocol server's), must not parse command lines (the CLI's), and must not run
//! anything between `clone` and `execve` that is not async-signal-safe: the caller may
//! have threads (glibc's `setresuid` and friends are not: they wait for the caller's
//! threads). A command can be held before its `execve` until the caller is ready
//! (`Spec::hold`, `Sandbox::start`), and watched: the init then says on stderr which of
//! its processes make inet sockets through the kernel (`Spec::watch`), or given raw ICMP
//! sockets its user namespace cannot make (`Spec::raw_icmp`, for busybox's `ping`), or
//! kept from re-aiming the host sockets handed to it (`Spec::guard_host_sockets`,
//! host_guard.rs, for ferry's `--handoff`: the init makes the command's `connect`,
//! `bind` and `listen` itself, or has a stand-in make them in the command's view,
//! stand_in.rs; and it asks whoever takes `Sandbox::handoff_requests` whether a TCP
//! connect is a hand-off, putting the host socket it gets at the command's fd number,
//! handoff.rs and carry.rs).
//!
//! ```no_run
//! let spec = ferry_sandbox::Spec {
//!     program: "sh".into(),
//!     args: vec!["-c".into(), "exit 7".into()],
//!     ..Default::default()
//! };
//! let mut sandbox = ferry_sandbox::launch(&spec)?;
//! let listener = sandbox.factory().socket(libc::AF_INET, libc::SOCK_STREAM, 0)?;
//! # drop(listener);
//! assert_eq!(sandbox.wait()?, 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The filesystem is the host's, except the sandbox's own `/proc` and `/sys` (its
//! `/sys/class/net` lists its own interfaces), root's sandbox's substitute `/etc/shadow`
//! (so `su` works inside) and the volumes ([`Volume`], [`Spec::volumes`]): host paths the
//! sandbox sees as its own (for root's sandbox, idmapped bind mounts; never a system
//! directory), with no set-id files or file capabilities made in them. Elsewhere the
//! sandbox's programs reach the files their host identity may; [`reach_advice`] says
//! which paths a run will find closed.
//!
//! Limits: inside a container that masks parts of its `/proc` the kernel refuses the
//! sandbox's `/proc` (launching fails, saying so), and where `/sys` is masked the sandbox
//! keeps the host's (with a warning). Idmapped volumes need a filesystem that supports
//! them (ext4, xfs, btrfs, tmpfs from 6.3). Linux 5.12 or later (`mount_setattr`) is
//! required for volumes, 5.3 (pidfd) otherwise.

#[cfg(test)]
mod bpf_test;
mod carry;
mod factory;
mod guard;
mod handoff;
mod host_guard;
mod init;
mod launch;
mod mounts;
mod raw_icmp;
mod reach;
mod stand_in;
mod sys;
pub mod testbed;
mod volume;
mod watch;

pub use factory::SocketFactory;
pub use handoff::{Answer, HandoffRequests, HandoffScope, Request, SockOpt};
pub use launch::{
    Error, FALLBACK_IDS, IdRange, Sandbox, Signaller, SocketWatch, Spec, UserNs, launch,
    root_sandbox_ids, subordinate_ids, userns_available,
};
pub use reach::reach_advice;
pub use volume::{MAX_VOLUMES, SYSTEM_DIRS, Volume, VolumeError};
