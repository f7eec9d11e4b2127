//! What the process that runs the protocol servers may still do once the sandbox is set
//! up: the system calls of [`ALLOWED`] (some only with the arguments listed there), and
//! no capability but `CAP_KILL` (to signal the sandbox, which runs as another user).
//!
//! Theory of operation. The servers parse everything a hostile program writes; if one of
//! them were ever made to run the attacker's code, it should find itself with the tools
//! of a socket relay and nothing more: no `execve`, no new processes (threads only), no
//! `ptrace`, no `mount`/`setns`/`unshare`, no raw or packet sockets, no BPF, no kernel
//! keyrings, no module loading. [`confine`] drops capabilities in the calling thread
//! (threads started later inherit that), sets no-new-privileges and installs one
//! seccomp filter on every thread of the process (`TSYNC`). A call outside the list
//! fails with `EPERM` (a missed call then fails visibly instead of killing a sandbox's
//! connections); `clone3` fails with `ENOSYS`, so that glibc starts threads with
//! `clone`, whose flags the filter can check. The list was taken from `strace -f` of
//! `ferry run` serving curl, python, bash `/dev/tcp`, DNS, a published port with a
//! module, `--servers 2`, `ferry ctl` and a killed transfer, minus what only the set-up
//! calls (see docs/SECURITY.md).
//!
//! Must not: allow a call that only the set-up needs, or fail open (a filter that cannot
//! be installed stops `ferry run`, unless `--unconfined` says otherwise).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// `CAP_KILL`: signalling the sandbox's processes, which run as another user.
const CAP_KILL: u32 = 5;

/// Why the servers could not be confined.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// Dropping capabilities failed.
    #[error("dropping capabilities: {0}")]
    Capabilities(#[source] std::io::Error),
    /// Building the seccomp filter failed (an unknown architecture, say).
    #[error("building the seccomp filter: {0}")]
    Build(String),
    /// The kernel refused the filter.
    #[error("installing the seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
}

/// An argument condition: argument `arg` (a 32-bit value) equals one of `values`.
type ArgIn = (u8, &'static [u64]);

/// A system call the servers make after set-up, unconditionally or with one argument
/// from a list.
type Allowed = (i64, Option<ArgIn>);

/// `socket(2)` families: inet for the sandbox's sockets, unix for readiness pairs, name
/// probes and control, netlink for reading the host's addresses.
const FAMILIES: &[u64] = &[
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

/// `ioctl(2)` requests: bytes queued (`FIONREAD`), the urgent mark (`SIOCATMARK`), and
/// whether a descriptor is a terminal (logging). (The request type is `u64` on glibc,
/// `i32` elsewhere.)
#[allow(clippy::unnecessary_cast)]
const IOCTLS: &[u64] = &[
    libc::FIONREAD as u64,
    0x8905, // SIOCATMARK
    libc::TIOCOUTQ as u64,
    libc::FIONBIO as u64,
    libc::TCGETS as u64,
];

/// `fcntl(2)` commands.
const FCNTLS: &[u64] = &[
    libc::F_GETFD as u64,
    libc::F_SETFD as u64,
    libc::F_GETFL as u64,
    libc::F_SETFL as u64,
    libc::F_DUPFD_CLOEXEC as u64,
    libc::F_SETPIPE_SZ as u64,
    libc::F_GETPIPE_SZ as u64,
    libc::F_ADD_SEALS as u64,
    libc::F_GET_SEALS as u64,
];

/// `prctl(2)` options: thread names, and reading the dumpable flag and bounding set.
const PRCTLS: &[u64] = &[
    libc::PR_SET_NAME as u64,
    libc::PR_GET_NAME as u64,
    libc::PR_GET_DUMPABLE as u64,
    libc::PR_CAPBSET_READ as u64,
    0x5356_4d41, // PR_SET_VMA (glibc names anonymous mappings)
];

/// Every system call the servers' process may make once confined.
pub const ALLOWED: &[Allowed] = &[
    // Memory (the allocator, thread stacks, channel regions, compiled modules).
    (libc::SYS_brk, None),
    (libc::SYS_mmap, None),
    (libc::SYS_munmap, None),
    (libc::SYS_mremap, None),
    (libc::SYS_mprotect, None),
    (libc::SYS_madvise, None),
    (libc::SYS_memfd_create, None),
    (libc::SYS_ftruncate, None),
    // Threads and time.
    (libc::SYS_clone, None), // flags checked in `clone_rule`
    (libc::SYS_clone3, None),
    (libc::SYS_futex, None),
    (libc::SYS_set_robust_list, None),
    (libc::SYS_rseq, None),
    (libc::SYS_sched_yield, None),
    (libc::SYS_sched_getaffinity, None),
    (libc::SYS_sched_setaffinity, None),
    (libc::SYS_getcpu, None),
    (libc::SYS_nanosleep, None),
    (libc::SYS_clock_nanosleep, None),
    (libc::SYS_clock_gettime, None),
    (libc::SYS_gettid, None),
    (libc::SYS_getpid, None),
    (libc::SYS_getrandom, None),
    (libc::SYS_prlimit64, None),
    (libc::SYS_getrusage, None),
    (libc::SYS_exit, None),
    (libc::SYS_exit_group, None),
    (libc::SYS_restart_syscall, None),
    (libc::SYS_prctl, Some((0, PRCTLS))),
    // Signals: forwarding to the sandbox, waiting for it.
    (libc::SYS_rt_sigaction, None),
    (libc::SYS_rt_sigprocmask, None),
    (libc::SYS_rt_sigreturn, None),
    (libc::SYS_rt_sigtimedwait, None),
    (libc::SYS_sigaltstack, None),
    (libc::SYS_tgkill, None),
    (libc::SYS_kill, None),
    (libc::SYS_pidfd_send_signal, None),
    (libc::SYS_wait4, None),
    (libc::SYS_waitid, None),
    // Descriptors.
    (libc::SYS_read, None),
    (libc::SYS_write, None),
    (libc::SYS_readv, None),
    (libc::SYS_writev, None),
    (libc::SYS_pread64, None),
    (libc::SYS_close, None),
    (libc::SYS_close_range, None),
    (libc::SYS_dup, None),
    (libc::SYS_dup3, None),
    (libc::SYS_lseek, None),
    (libc::SYS_fcntl, Some((1, FCNTLS))),
    (libc::SYS_ioctl, Some((1, IOCTLS))),
    (libc::SYS_eventfd2, None),
    (libc::SYS_pipe2, None),
    (libc::SYS_splice, None),
    (libc::SYS_sendfile, None),
    (libc::SYS_epoll_create1, None),
    (libc::SYS_epoll_ctl, None),
    (libc::SYS_epoll_pwait, None),
    (libc::SYS_epoll_pwait2, None),
    (libc::SYS_ppoll, None),
    // Sockets.
    (libc::SYS_socket, Some((0, FAMILIES))),
    (libc::SYS_socketpair, None),
    (libc::SYS_bind, None),
    (libc::SYS_listen, None),
    (libc::SYS_accept4, None),
    (libc::SYS_connect, None),
    (libc::SYS_getsockname, None),
    (libc::SYS_getpeername, None),
    (libc::SYS_getsockopt, None),
    (libc::SYS_setsockopt, None),
    (libc::SYS_sendmsg, None),
    (libc::SYS_recvmsg, None),
    (libc::SYS_sendmmsg, None),
    (libc::SYS_recvmmsg, None),
    (libc::SYS_sendto, None),
    (libc::SYS_recvfrom, None),
    (libc::SYS_shutdown, None),
    // Files: /proc/PID/stat of the sandbox's processes, the stats file, removing the
    // run's directories at the end.
    (libc::SYS_openat, None),
    (libc::SYS_newfstatat, None),
    (libc::SYS_fstat, None),
    (libc::SYS_statx, None),
    (libc::SYS_getdents64, None),
    (libc::SYS_unlinkat, None),
    // x86_64's older names of the above, which glibc and std still use there.
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_epoll_wait, None),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_poll, None),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_unlink, None),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_rmdir, None),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_arch_prctl, None),
];

/// The seccomp programs of [`confine`]: the allowlist (anything else `EPERM`), and a
/// second filter that answers `clone3` with `ENOSYS` and lets every other call through
/// to the first (the kernel applies the stricter answer of the two).
pub fn filters() -> Result<[BpfProgram; 2], ConfineError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| ConfineError::Build(e.to_string()))?;
    let cond = |arg: u8, op: Op, v: u64| {
        SeccompCondition::new(arg, Len::Dword, op, v)
            .map_err(|e| ConfineError::Build(e.to_string()))
    };
    let rule = |c: Vec<SeccompCondition>| {
        SeccompRule::new(c).map_err(|e| ConfineError::Build(e.to_string()))
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &(nr, args) in ALLOWED {
        let r = match args {
            None if nr == libc::SYS_clone => {
                // Threads only: a new process would escape the filter's purpose.
                let thread = libc::CLONE_THREAD as u64;
                vec![rule(vec![cond(0, Op::MaskedEq(thread), thread)?])?]
            }
            None => Vec::new(),
            Some((arg, values)) => values
                .iter()
                .map(|&v| rule(vec![cond(arg, Op::Eq, v)?]))
                .collect::<Result<_, _>>()?,
        };
        rules.insert(nr, r);
    }
    let allow = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(|e| ConfineError::Build(e.to_string()))?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| ConfineError::Build(e.to_string()))?;
    let build =
        |f: SeccompFilter| BpfProgram::try_from(f).map_err(|e| ConfineError::Build(e.to_string()));
    Ok([build(allow)?, build(clone3)?])
}

/// Confines this process (see the module docs): capabilities down to `CAP_KILL` in the
/// calling thread (for those started after it; call it before starting the servers'
/// threads), no new privileges and the seccomp filters on every thread. Returns how many
/// system calls stay allowed.
pub fn confine() -> Result<usize, ConfineError> {
    confine_keeping(&[])
}

/// [`confine`], keeping the capabilities `extra` beside `CAP_KILL` (`ferry run
/// --publish-auto` keeps `CAP_NET_BIND_SERVICE`: it binds the ports it publishes later).
pub fn confine_keeping(extra: &[u32]) -> Result<usize, ConfineError> {
    let keep: Vec<u32> = std::iter::once(CAP_KILL)
        .chain(extra.iter().copied())
        .collect();
    ferry_sys::drop_capabilities(&keep).map_err(ConfineError::Capabilities)?;
    install(&filters()?)?;
    Ok(ALLOWED.len())
}

/// Installs filters built by [`filters`] on every thread of the process: the `clone3`
/// one first, as the allowlist would refuse the calls that install another.
pub fn install(filters: &[BpfProgram; 2]) -> Result<(), ConfineError> {
    for f in filters.iter().rev() {
        seccompiler::apply_filter_all_threads(f)?;
    }
    Ok(())
}
