//! Signal semantics the kernel gives sockets and the shim must copy: whether a wait
//! interrupted by a signal handler restarts (`SA_RESTART`) or fails with `EINTR`, and
//! `SIGPIPE` for a send on a broken connection.

/// Whether a blocking call interrupted by a handler should restart: true when every
/// installed handler has `SA_RESTART`.
///
/// The ring's futex wait returns `EINTR` whenever a handler ran (it has a timeout, so the
/// kernel never restarts it), and the shim cannot tell which signal it was; it asks the
/// installed handlers instead (only on an interruption, which is rare). A socket with a
/// receive/send timeout never restarts, as in the kernel; the caller checks that.
pub fn restartable() -> bool {
    let max = libc::SIGRTMAX();
    for sig in 1..=max {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sigaction is plain data; all-zero is a valid value to be overwritten.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying (null new action) writes only `old`.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        let h = old.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN && old.sa_flags & libc::SA_RESTART == 0 {
            return false;
        }
    }
    true
}

/// Raises `SIGPIPE` in the calling thread, as the kernel does for a send on a broken
/// stream without `MSG_NOSIGNAL`.
pub fn sigpipe() {
    // SAFETY: pthread_self is always valid for the calling thread.
    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_without_sa_restart_is_noticed() {
        extern "C" fn nop(_: libc::c_int) {}
        // SAFETY: plain data.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = nop as extern "C" fn(libc::c_int) as usize;
        // SAFETY: plain data.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: installs a handler that does nothing (restored below); SIGUSR2 is not
        // used by the test harness.
        unsafe { libc::sigaction(libc::SIGUSR2, &sa, &mut old) };
        let noticed = !restartable();
        // SAFETY: restores the previous disposition.
        unsafe { libc::sigaction(libc::SIGUSR2, &old, std::ptr::null_mut()) };
        assert!(noticed);
    }
}
