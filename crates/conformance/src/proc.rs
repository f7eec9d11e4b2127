//! Processes, signals and threads for cases: a forked peer with an exit status, running
//! this binary's exec helper, signal handlers that count, and waiting until another
//! thread is asleep inside a blocking call.

use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, pid_t};

use crate::sys::{Errno, Fd, pipe, wait_status, zeroed};

/// A forked child process; reaped by [`Child::wait`].
#[derive(Debug)]
pub struct Child(pid_t);

impl Child {
    /// Adopts a child started some other way (`posix_spawn`).
    pub fn from_pid(pid: pid_t) -> Child {
        Child(pid)
    }

    pub fn pid(&self) -> pid_t {
        self.0
    }

    /// Reaps the child: `exit 0`, `signal SIGPIPE`, …
    pub fn wait(self) -> String {
        let mut status = 0;
        match sys!(libc::waitpid(self.0, &mut status, 0)) {
            Ok(_) => wait_status(status),
            Err(e) => format!("waitpid={e}"),
        }
    }
}

/// Forks; the child runs `f` and `_exit`s with its return value (101 on panic).
///
/// Call only while the process is single-threaded (every case starts that way).
pub fn fork_with<F: FnOnce() -> c_int>(f: F) -> Result<Child, String> {
    // SAFETY: every case runs alone in its own child of the runner and starts
    // single-threaded, as this function requires; so the forked child is a whole copy
    // (no lock held by a thread that is not there) and may run `f`, allocate and unwind.
    match sys!(unsafe { libc::fork() }).map_err(|e| format!("fork={e}"))? {
        0 => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
            // SAFETY: `_exit` takes an integer and ends the child without running the
            // parent's `atexit` handlers or flushing its copied stdio buffers twice.
            unsafe { libc::_exit(code) }
        }
        pid => Ok(Child(pid)),
    }
}

/// Runs this binary as `--child-exec-case ARGS…` through `fork` + `execv`, with its
/// stdout captured; returns (child, read end of its stdout).
pub fn spawn_helper(args: &[String]) -> Result<(Child, Fd), String> {
    let argv = helper_argv(args);
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let (r, w) = pipe(libc::O_CLOEXEC).map_err(|e| format!("pipe={e}"))?;
    let child = fork_with(|| {
        // SAFETY: integers only; `w` is this child's copy of the pipe's write end, open
        // (moved into the closure), and stdout is the child's own to replace.
        if unsafe { libc::dup2(w.raw(), 1) } < 0 {
            return 120;
        }
        // SAFETY: the path is a C string literal; `ptrs` is a NULL-terminated array of
        // pointers into `argv`'s CStrings, all of which the closure keeps alive across
        // the call (the parent's copies, duplicated by fork).
        unsafe { libc::execv(c"/proc/self/exe".as_ptr(), ptrs.as_ptr()) };
        121
    })?;
    drop(w);
    Ok((child, r))
}

/// `argv` for the exec helper: `/proc/self/exe --child-exec-case ARGS…`.
pub fn helper_argv(args: &[String]) -> Vec<CString> {
    let mut argv = vec![
        c"/proc/self/exe".to_owned(),
        c"--child-exec-case".to_owned(),
    ];
    argv.extend(
        args.iter()
            .map(|a| CString::new(a.as_str()).expect("no NUL in args")),
    );
    argv
}

/// Reads a helper's whole stdout and reaps it: `"line" (exit 0)`.
pub fn collect_helper(child: Child, out: Fd) -> String {
    let mut text = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match sys!(libc::read(out.raw(), buf.as_mut_ptr().cast(), buf.len())) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n as usize]),
            Err(e) if e.0 == libc::EINTR => continue,
            Err(e) => return format!("read={e}"),
        }
    }
    let text = String::from_utf8_lossy(&text).trim().replace('\n', "; ");
    format!("[{text}] ({})", child.wait())
}

/// Counts deliveries of every signal routed to [`count_signal`].
pub static SIGNALS: AtomicUsize = AtomicUsize::new(0);

/// A handler that only counts.
pub extern "C" fn count_signal(_sig: c_int) {
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// Deliveries counted so far.
pub fn signal_count() -> usize {
    SIGNALS.load(Ordering::SeqCst)
}

/// Installs `handler` for `sig` with `flags` (`SA_RESTART` or 0) and an empty mask.
pub fn on_signal(sig: c_int, handler: extern "C" fn(c_int), flags: c_int) -> Result<(), Errno> {
    let mut sa: libc::sigaction = zeroed();
    sa.sa_sigaction = handler as usize;
    sa.sa_flags = flags;
    sys!(libc::sigemptyset(&mut sa.sa_mask))?;
    // SAFETY: `sa` is an initialised local; the handler is an `extern "C" fn(c_int)`
    // that does only async-signal-safe work (every one the cases pass: an atomic
    // increment, or one `send`), so it may run whenever the signal arrives.
    sys!(unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) }).map(drop)
}

/// Sets `sig` to `SIG_IGN` or `SIG_DFL`.
pub fn set_disposition(sig: c_int, disposition: libc::sighandler_t) -> Result<(), Errno> {
    let mut sa: libc::sigaction = zeroed();
    sa.sa_sigaction = disposition;
    sys!(libc::sigaction(sig, &sa, std::ptr::null_mut())).map(drop)
}

/// Arms a one-shot `ITIMER_REAL` (SIGALRM to the process) after `ms`.
pub fn alarm_ms(ms: u64) -> Result<(), Errno> {
    alarm_us(ms * 1000)
}

/// Arms a one-shot `ITIMER_REAL` (SIGALRM) `us` microseconds from now.
pub fn alarm_us(us: u64) -> Result<(), Errno> {
    alarm_every_us(us, 0)
}

/// Arms `ITIMER_REAL` (SIGALRM) `us` microseconds from now, then every `every_us` (0:
/// once; `alarm_us(0)` disarms it).
pub fn alarm_every_us(us: u64, every_us: u64) -> Result<(), Errno> {
    let mut it: libc::itimerval = zeroed();
    it.it_value.tv_sec = (us / 1_000_000) as libc::time_t;
    it.it_value.tv_usec = (us % 1_000_000) as libc::suseconds_t;
    it.it_interval.tv_sec = (every_us / 1_000_000) as libc::time_t;
    it.it_interval.tv_usec = (every_us % 1_000_000) as libc::suseconds_t;
    sys!(libc::setitimer(
        libc::ITIMER_REAL,
        &it,
        std::ptr::null_mut()
    ))
    .map(drop)
}

/// Blocks or unblocks `sig` for the calling thread.
pub fn mask_signal(sig: c_int, block: bool) -> Result<(), Errno> {
    let mut set: libc::sigset_t = zeroed();
    sys!(libc::sigemptyset(&mut set))?;
    sys!(libc::sigaddset(&mut set, sig))?;
    let how = if block {
        libc::SIG_BLOCK
    } else {
        libc::SIG_UNBLOCK
    };
    // SAFETY: `set` is an initialised local sigset; a null old-set pointer is allowed.
    let r = unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
    if r == 0 { Ok(()) } else { Err(Errno(r)) }
}

/// The calling thread's kernel id.
pub fn gettid() -> pid_t {
    // SAFETY: no arguments; gettid cannot fail.
    unsafe { libc::gettid() }
}

/// Gives thread `tid` of this process time to enter the blocking call the caller is
/// about to disturb: returns once the thread is asleep (`S` in its stat, twice 20 ms
/// apart), or after 1 s regardless. The second case covers an implementation that
/// waits by spinning in user space: the thread is in the call all the same, and how it
/// waits is not what the cases compare.
pub fn settle_blocked(tid: pid_t) {
    settle(tid, "/proc/self/task");
}

/// Like [`settle_blocked`] for another process.
pub fn settle_blocked_process(pid: pid_t) {
    settle(pid, "/proc");
}

fn settle(id: pid_t, dir: &str) {
    let path = format!("{dir}/{id}/stat");
    // The state follows the parenthesised command name, which may contain spaces.
    let asleep = || {
        std::fs::read_to_string(&path).is_ok_and(|stat| {
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
                == Some('S')
        })
    };
    for _ in 0..50 {
        crate::sys::sleep_ms(20);
        if asleep() {
            // Settle: the thread may sleep briefly before the call itself (a lock).
            crate::sys::sleep_ms(20);
            if asleep() {
                return;
            }
        }
    }
}
