//! `ferry-sandbox` owns the sandbox itself: the namespaces a command runs in (a network
//! namespace with only `lo`, a PID namespace so nothing the command starts outlives
//! it, and a user namespace mapping the caller to root when not root), the sandbox's
//! init process (signal forwarding, reaping, exit-status passthrough), and the socket
//! factory through which host-side code creates sockets inside the sandbox's network
//! namespace. It also provides a veth "remote host" [`testbed`] for tests and
//! benchmarks. It must not do networking policy or relay any traffic (that is the
//! protocol server's), must not parse command lines (the CLI's), and must not run
//! anything between `clone` and `execve` that is not async-signal-safe: the caller may
//! have threads. A command can be held before its `execve` until the caller is ready
//! (`Spec::hold`, `Sandbox::start`).
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
//! Limits: there is no mount namespace, so `/sys/class/net` and `/proc` (other than
//! `/proc/self/net`, which follows the reader's namespace) still show the host. Linux
//! 5.3 or later (pidfd) is required.

mod factory;
mod init;
mod launch;
mod sys;
pub mod testbed;

pub use factory::SocketFactory;
pub use launch::{
    Error, FALLBACK_IDS, IdRange, Sandbox, Signaller, Spec, UserNs, launch, root_sandbox_ids,
    subordinate_ids, userns_available,
};
