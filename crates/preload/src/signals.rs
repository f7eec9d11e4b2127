//! Signal semantics the kernel gives sockets and the shim must copy: whether a blocking
//! call interrupted by a signal handler fails with `EINTR` or goes on (`SA_RESTART`),
//! and `SIGPIPE` for a send on a broken connection.
//!
//! **Knowing that a handler ran.** A blocking ferry call waits in user space (spinning,
//! then futex sleeps of at most 100 ms, with liveness checks in between); a signal that
//! arrives outside the futex system call runs its handler without interrupting anything
//! the shim can see, and the call would go on waiting (an `alarm()` meant to cut a
//! `recv` short would be lost). So while the shim is active it wraps the program's
//! handlers: `sigaction` (and `signal`, `sysv_signal`, `siginterrupt`, which glibc
//! implements with its internal `__sigaction`) installs a trampoline that counts, per
//! thread, the handlers that ran and those that ran without `SA_RESTART`, then calls
//! the program's handler. The program sees its own handler and flags when it asks. A
//! wait compares the counts with those at its start (also right before each sleep,
//! through the ring's `wait_with` check), so an interruption is noticed at once, or in
//! the worst race within one sleep slice. Handlers installed behind libc's back (raw
//! `rt_sigaction`) are still noticed when they interrupt the futex itself; the shim then
//! asks the installed handlers whether all have `SA_RESTART` ([`restartable`]).

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use libc::{sighandler_t, siginfo_t};

use crate::{config, real};

/// Signal numbers the kernel knows (1..=64).
const NSIG: usize = 65;

/// The program's handler for each signal (as it installed it), when wrapped.
static PROGRAM: [AtomicUsize; NSIG] = [const { AtomicUsize::new(libc::SIG_DFL) }; NSIG];
/// The program's `sa_flags` for each signal.
static FLAGS: [AtomicI32; NSIG] = [const { AtomicI32::new(0) }; NSIG];

/// The process whose handlers [`PROGRAM`] and [`FLAGS`] describe (0: not known yet).
/// A `vfork` child (and `posix_spawn`'s) runs in its parent's memory until it execs: its
/// `sigaction` changes only its own handlers in the kernel, and must leave the parent's
/// table alone, or the parent's trampoline would find `SIG_DFL` and swallow its signals.
/// A `fork` child has its own copy of the table and takes it over ([`after_fork`]).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// This process's id, from the kernel (not libc's cache, which a `vfork` child shares).
fn current_pid() -> i32 {
    // SAFETY: getpid reads no arguments (the six zeros are ignored) and touches no
    // memory.
    unsafe { ferry_sys::syscall6(libc::SYS_getpid, [0; 6]) }.map_or(0, |p| p as i32)
}

/// Records this process as the table's owner (the library constructor).
pub fn claim_table() {
    OWNER.store(current_pid(), Ordering::Release);
}

/// In a `fork` child (`pthread_atfork`): the copied table is this process's now.
pub fn after_fork() {
    claim_table();
}

/// Whether this process shares the table's memory with its owner: a `vfork` child.
fn borrowing_parents_memory() -> bool {
    let owner = OWNER.load(Ordering::Acquire);
    owner != 0 && owner != current_pid()
}

/// Handlers that ran on one thread: all of them, and those without `SA_RESTART`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Every wrapped handler.
    pub any: u32,
    /// Wrapped handlers without `SA_RESTART`.
    pub intr: u32,
}

thread_local! {
    // Const-initialised and without a destructor: plain thread-local memory, safe to
    // touch from a signal handler.
    static COUNTS: Cell<Counts> = const { Cell::new(Counts { any: 0, intr: 0 }) };
}

/// This thread's counts.
pub fn counts() -> Counts {
    COUNTS.with(Cell::get)
}

impl Counts {
    /// Whether handlers that ran since `self` (an earlier snapshot) make a blocking call
    /// fail with `EINTR`: one without `SA_RESTART`, or any when the socket has a timeout.
    pub fn interrupts_since(self, now: Counts, has_timeout: bool) -> bool {
        now.intr != self.intr || (has_timeout && now.any != self.any)
    }
}

/// Counts the handler, then runs the program's.
extern "C" fn trampoline(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let Some(i) = usize::try_from(sig).ok().filter(|&i| i < NSIG) else {
        return;
    };
    let flags = FLAGS[i].load(Ordering::Acquire);
    let h = PROGRAM[i].load(Ordering::Acquire);
    COUNTS.with(|c| {
        let mut v = c.get();
        v.any = v.any.wrapping_add(1);
        if flags & libc::SA_RESTART == 0 {
            v.intr = v.intr.wrapping_add(1);
        }
        c.set(v);
    });
    if flags & libc::SA_RESETHAND as c_int != 0 {
        PROGRAM[i].store(libc::SIG_DFL, Ordering::Release);
    }
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: `PROGRAM[i]` only ever holds `SIG_DFL`, `SIG_IGN` (both returned above)
        // or a handler the program passed to `sigaction`/`signal`, which C requires to
        // be a function of the type its flags say: with SA_SIGINFO, `sa_sigaction`'s
        // three-argument one. (Known gap: the handler and the flags are two loads, so a
        // `sigaction` on another thread changing a handler's type while this signal is
        // delivered could pair the new flags with the old handler, or the reverse.)
        let f = unsafe {
            std::mem::transmute::<usize, extern "C" fn(c_int, *mut siginfo_t, *mut c_void)>(h)
        };
        f(sig, info, ctx);
    } else {
        // SAFETY: as above: without SA_SIGINFO the program's handler is `sa_handler`'s
        // `void (*)(int)`.
        let f = unsafe { std::mem::transmute::<usize, extern "C" fn(c_int)>(h) };
        f(sig);
    }
}

fn index(sig: c_int) -> Option<usize> {
    usize::try_from(sig).ok().filter(|&i| i > 0 && i < NSIG)
}

/// `sigaction(2)`, wrapping real handlers in the trampoline while the shim is active.
///
/// # Safety
/// As for `sigaction(2)`: `act` must be null or point at a readable `struct sigaction`
/// whose handler is `SIG_DFL`, `SIG_IGN` or a function of the type its flags say (the
/// trampoline calls it); `old` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let Some(i) = index(sig).filter(|_| config::active()) else {
        // SAFETY: `act` and `old` null or valid (# Safety), passed on unchanged.
        return unsafe { real::sigaction(sig, act, old) };
    };
    if borrowing_parents_memory() {
        // A vfork child: its own handlers change in the kernel, unwrapped (it execs
        // soon); the parent's table stays as it is.
        // SAFETY: `act` and `old` null or valid (# Safety), passed on unchanged.
        let r = unsafe { real::sigaction(sig, act, old) };
        // SAFETY: `old` is null or a writable action (# Safety), which libc has just
        // filled; the reference ends before this returns.
        if let Some(o) = unsafe { old.as_mut() }.filter(|_| r == 0) {
            let tramp = trampoline as extern "C" fn(c_int, *mut siginfo_t, *mut c_void) as usize;
            if o.sa_sigaction == tramp {
                o.sa_sigaction = PROGRAM[i].load(Ordering::Acquire);
                o.sa_flags = FLAGS[i].load(Ordering::Acquire);
            }
        }
        return r;
    }
    let (prev_h, prev_f) = (
        PROGRAM[i].load(Ordering::Acquire),
        FLAGS[i].load(Ordering::Acquire),
    );
    let mut wrapped;
    let mut actp = act;
    // SAFETY: `act` is null or a readable action (# Safety), copied before libc sees it.
    if let Some(a) = unsafe { act.as_ref() } {
        FLAGS[i].store(a.sa_flags, Ordering::Release);
        PROGRAM[i].store(a.sa_sigaction, Ordering::Release);
        if a.sa_sigaction != libc::SIG_DFL && a.sa_sigaction != libc::SIG_IGN {
            wrapped = *a;
            wrapped.sa_sigaction =
                trampoline as extern "C" fn(c_int, *mut siginfo_t, *mut c_void) as usize;
            wrapped.sa_flags |= libc::SA_SIGINFO;
            actp = &wrapped;
        }
    }
    // SAFETY: `actp` is the caller's `act` (null or readable, # Safety) or `wrapped`, a
    // local copy of it with the trampoline, an `extern "C"` SA_SIGINFO handler, in the
    // handler's place; `old` null or writable (# Safety).
    let r = unsafe { real::sigaction(sig, actp, old) };
    if r != 0 {
        PROGRAM[i].store(prev_h, Ordering::Release);
        FLAGS[i].store(prev_f, Ordering::Release);
        return r;
    }
    // SAFETY: `old` is null or a writable action (# Safety), which libc has just
    // filled; the reference ends before this returns.
    if let Some(o) = unsafe { old.as_mut() } {
        let tramp = trampoline as extern "C" fn(c_int, *mut siginfo_t, *mut c_void) as usize;
        if o.sa_sigaction == tramp {
            o.sa_sigaction = prev_h;
            o.sa_flags = prev_f;
        }
    }
    r
}

/// Installs `h` with `flags` through [`sigaction`]; returns the previous handler.
///
/// # Safety
/// `h` must be `SIG_DFL`, `SIG_IGN` or a `void (*)(int)` handler (it is installed
/// without `SA_SIGINFO`).
unsafe fn install(sig: c_int, h: sighandler_t, flags: c_int, block_self: bool) -> sighandler_t {
    // SAFETY: `struct sigaction` is integers, a sigset of integers and a handler stored
    // as an integer (`sighandler_t`): all-zero is a valid value (SIG_DFL, no flags).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = h;
    act.sa_flags = flags;
    if block_self {
        // SAFETY: `act.sa_mask` is a live, initialised (empty) sigset; a bad `sig` is
        // refused with EINVAL, never written past the set.
        unsafe { libc::sigaddset(&mut act.sa_mask, sig) };
    }
    // SAFETY: as for `act`: all-zero is a valid `struct sigaction`.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `act` and `old` are live locals; `act`'s handler is `h`, a one-argument
    // handler or a disposition (# Safety), matching its flags (no SA_SIGINFO).
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// `signal(3)` with glibc's BSD semantics (`SA_RESTART`, the signal blocked in its
/// handler); glibc's own would bypass the exported `sigaction`.
///
/// # Safety
/// As for `signal(3)`: `h` must be `SIG_DFL`, `SIG_IGN` or a `void (*)(int)` handler.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(sig: c_int, h: sighandler_t) -> sighandler_t {
    if !config::active() {
        // SAFETY: `h` is a handler or a disposition (# Safety), passed on unchanged.
        return unsafe { real::signal(sig, h) };
    }
    // SAFETY: `h` is a one-argument handler or a disposition (# Safety), as `install`
    // asks.
    unsafe { install(sig, h, libc::SA_RESTART, true) }
}

/// `sysv_signal(3)`: one-shot, not restarting, not blocking itself.
///
/// # Safety
/// As for [`signal`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sysv_signal(sig: c_int, h: sighandler_t) -> sighandler_t {
    if !config::active() {
        // SAFETY: `h` is a handler or a disposition (# Safety), passed on unchanged.
        return unsafe { real::sysv_signal(sig, h) };
    }
    // SAFETY: `h` is a one-argument handler or a disposition (# Safety), as `install`
    // asks.
    unsafe {
        install(
            sig,
            h,
            (libc::SA_RESETHAND | libc::SA_NODEFER) as c_int,
            false,
        )
    }
}

/// `siginterrupt(3)`: sets or clears `SA_RESTART` of the installed handler.
///
/// # Safety
/// None beyond `siginterrupt(3)`'s: the arguments are integers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn siginterrupt(sig: c_int, flag: c_int) -> c_int {
    if !config::active() {
        // SAFETY: integers only, passed on unchanged.
        return unsafe { real::siginterrupt(sig, flag) };
    }
    // SAFETY: all-zero is a valid `struct sigaction` (see `install`).
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query (null new action) that writes only `cur`, a live local.
    if unsafe { sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
        return -1;
    }
    if flag != 0 {
        cur.sa_flags &= !libc::SA_RESTART;
    } else {
        cur.sa_flags |= libc::SA_RESTART;
    }
    // SAFETY: `cur` is the action `sigaction` just reported, the program's own handler
    // and flags (the trampoline is never reported), re-installed with only SA_RESTART
    // changed, so the handler still matches its flags.
    unsafe { sigaction(sig, &cur, std::ptr::null_mut()) }
}

/// Whether a blocking call interrupted by a handler the shim did not see installed
/// should restart: true when every installed handler has `SA_RESTART` (asked only on
/// such an interruption, which is rare).
pub fn restartable() -> bool {
    let max = libc::SIGRTMAX();
    for sig in 1..=max {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: all-zero is a valid `struct sigaction` (see `install`).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query (null new action) that writes only `old`, a live local.
        if unsafe { sigaction(sig, std::ptr::null(), &mut old) } != 0 {
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
    // SAFETY: `pthread_self()` names the calling thread, alive for the whole call; the
    // signal's effect (a handler, or the default action) is what the kernel's send
    // would have caused.
    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_without_sa_restart_is_noticed() {
        extern "C" fn nop(_: libc::c_int) {}
        // SAFETY: all-zero is a valid `struct sigaction` (see `install`).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = nop as extern "C" fn(libc::c_int) as usize;
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `sa` and `old` are live locals; `nop` is a one-argument handler that
        // does nothing (no SA_SIGINFO), restored below; SIGUSR2 is not used by the test
        // harness.
        unsafe { real::sigaction(libc::SIGUSR2, &sa, &mut old) };
        let noticed = !restartable();
        // SAFETY: `old` is the action libc just reported, re-installed as it was.
        unsafe { real::sigaction(libc::SIGUSR2, &old, std::ptr::null_mut()) };
        assert!(noticed);
    }

    #[test]
    fn counts_tell_interruptions() {
        let a = Counts { any: 1, intr: 1 };
        assert!(!a.interrupts_since(a, true));
        assert!(a.interrupts_since(Counts { any: 2, intr: 2 }, false));
        assert!(!a.interrupts_since(Counts { any: 2, intr: 1 }, false));
        assert!(a.interrupts_since(Counts { any: 2, intr: 1 }, true));
    }
}
