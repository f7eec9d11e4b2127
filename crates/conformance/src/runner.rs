//! Runs each case in its own forked process with a deadline.
//!
//! Theory of operation: the parent stays single-threaded and never touches a socket.
//! For each case it makes a pipe, forks, and waits on the pipe with `poll` until the
//! deadline. The child moves the pipe's write end to a high fd (so the low fds the
//! fd-numbering cases look at are free), puts itself in its own process group, runs the
//! case, and writes exactly one line `NAME: RESULT\n` in a single `write`. The parent
//! prints that line; if the deadline passes first it kills the child's process group and
//! prints `NAME: TIMEOUT`; if the child dies without a line it prints `NAME: CRASH(..)`.

use std::io::Write;

use libc::c_int;

use crate::cases::Case;
use crate::sys::{Errno, pipe, wait_status};

/// Where the child keeps its end of the result pipe: high, out of the cases' way, but
/// below the 1024 a default `RLIMIT_NOFILE` allows (and below a lower limit, if set).
fn result_fd() -> c_int {
    let mut rl: libc::rlimit = crate::sys::zeroed();
    let soft = match sys!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl)) {
        Ok(_) => rl.rlim_cur.min(1024) as c_int,
        Err(_) => 1024,
    };
    soft - 1
}

/// What running one case produced.
pub enum Outcome {
    /// The case's own line.
    Line(String),
    /// The deadline passed.
    Timeout,
    /// The child died (signal, panic, exit) without writing its line.
    Crash(String),
}

/// Runs `cases` in order, printing one line each then `N cases`; returns whether every
/// case produced a line of its own (no timeout, no crash).
pub fn run_all(cases: &[Case]) -> bool {
    let mut clean = true;
    let stdout = std::io::stdout();
    for case in cases {
        let line = match run_one(case) {
            Outcome::Line(l) => {
                // A panic is a crash of the case, even though it reported one.
                clean &= !l.starts_with(&format!("{}: PANIC(", case.name));
                l
            }
            Outcome::Timeout => {
                clean = false;
                format!("{}: TIMEOUT", case.name)
            }
            Outcome::Crash(why) => {
                clean = false;
                format!("{}: CRASH({why})", case.name)
            }
        };
        let mut out = stdout.lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    println!("{} cases", cases.len());
    clean
}

fn run_one(case: &Case) -> Outcome {
    let result_fd = result_fd();
    let (r, w) = match pipe(libc::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return Outcome::Crash(format!("pipe={e}")),
    };
    // SAFETY: the runner is single-threaded (module docs), so the child is a whole copy
    // of it and may allocate and run the case. (In this module's unit tests the test
    // harness has other threads; the child then relies on glibc resetting malloc's locks
    // at fork, and on the test cases touching nothing else another thread could hold.)
    let pid = match sys!(unsafe { libc::fork() }) {
        Ok(pid) => pid,
        Err(e) => return Outcome::Crash(format!("fork={e}")),
    };
    if pid == 0 {
        drop(r);
        let fd = w.into_raw();
        // SAFETY: integers only: this child's own process group, and `fd`, the pipe's
        // write end this child now owns (`into_raw`), moved to the reserved high number.
        unsafe {
            libc::setpgid(0, 0);
            libc::dup3(fd, result_fd, libc::O_CLOEXEC);
            libc::close(fd);
        }
        let line = run_in_child(case);
        let bytes = format!("{line}\n");
        // SAFETY: `bytes` is a live String read for its own length; `_exit` then ends
        // the child without unwinding into the runner's code.
        unsafe {
            libc::write(result_fd, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(0)
        }
    }
    // SAFETY: integers only; `pid` is the child just forked (the same call in the child
    // closes the race on who runs first).
    unsafe { libc::setpgid(pid, pid) };
    drop(w);
    let collected = collect(r.raw(), pid, case.timeout_ms);
    // Whatever the outcome, nothing the case started may outlive it.
    // SAFETY: integers only, no memory involved: signals what is left of the case's
    // own process group (the child made it and is its leader).
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    if !matches!(collected, Collected::Died(_)) {
        let mut status = 0;
        let _ = sys!(libc::waitpid(pid, &mut status, 0));
    }
    match collected {
        Collected::Line(l) => Outcome::Line(l),
        Collected::Died(status) => Outcome::Crash(wait_status(status)),
        Collected::TimedOut => Outcome::Timeout,
    }
}

/// What the parent saw of a case child.
enum Collected {
    /// Its line (the child may or may not have exited yet).
    Line(String),
    /// It exited or was killed, with this wait status, without a line.
    Died(c_int),
    /// The deadline passed first.
    TimedOut,
}

/// In the child: runs the case, catching panics, and formats its line.
fn run_in_child(case: &Case) -> String {
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(case.run);
    let text = match result {
        Ok(Ok(text)) => text,
        Ok(Err(setup)) => format!("ERROR({setup})"),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            format!("PANIC({msg})")
        }
    };
    format!("{}: {}", case.name, text.replace('\n', "\\n"))
}

/// Reads the case's line from `fd` until `timeout_ms` passes or `pid` dies without one.
///
/// The pipe alone cannot tell a crash: a forked grandchild may still hold its write end,
/// so the child is also polled with `WNOHANG`.
fn collect(fd: c_int, pid: libc::pid_t, timeout_ms: u32) -> Collected {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.into());
    let mut buf = Vec::new();
    let mut died = None;
    loop {
        if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            buf.truncate(pos);
            return Collected::Line(String::from_utf8_lossy(&buf).into_owned());
        }
        if let Some(status) = died {
            // Reaped and the pipe is drained: no line is coming.
            return Collected::Died(status);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Collected::TimedOut;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let wait = left.as_millis().min(50) as c_int + 1;
        let ready = matches!(sys!(libc::poll(&mut p, 1, wait)), Ok(n) if n > 0);
        let open = if ready {
            drain_into(fd, &mut buf)
        } else {
            true
        };
        let mut st = 0;
        let flags = if open { libc::WNOHANG } else { 0 };
        if let Ok(n) = sys!(libc::waitpid(pid, &mut st, flags))
            && n == pid
        {
            died = Some(st);
            // One last look: the line may have raced the exit.
            drain_into(fd, &mut buf);
        }
    }
}

/// Appends whatever `fd` has now; false on EOF or error.
fn drain_into(fd: c_int, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    if !matches!(sys!(libc::poll(&mut p, 1, 0)), Ok(n) if n > 0) {
        return true;
    }
    match sys!(libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len())) {
        Ok(0) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n as usize]);
            true
        }
        Err(Errno(libc::EINTR)) | Err(Errno(libc::EAGAIN)) => true,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::Res;

    fn outcome(run: fn() -> Res, timeout_ms: u32) -> String {
        let case = Case {
            name: "t.case",
            run,
            timeout_ms,
        };
        match run_one(&case) {
            Outcome::Line(l) => l,
            Outcome::Timeout => "TIMEOUT".into(),
            Outcome::Crash(why) => format!("CRASH({why})"),
        }
    }

    #[test]
    fn lines_errors_panics_crashes_and_timeouts() {
        assert_eq!(outcome(|| Ok("fine".into()), 5000), "t.case: fine");
        assert_eq!(
            outcome(|| Err("bind=EINVAL".into()), 5000),
            "t.case: ERROR(bind=EINVAL)"
        );
        assert_eq!(outcome(|| Ok("a\nb".into()), 5000), "t.case: a\\nb");
        assert_eq!(outcome(|| panic!("boom"), 5000), "t.case: PANIC(boom)");
        assert_eq!(
            // SAFETY: no arguments; it ends the forked case child, as the test wants.
            outcome(|| unsafe { libc::abort() }, 5000),
            "CRASH(signal SIGABRT)"
        );
        // SAFETY: an integer; it ends the forked case child, as the test wants.
        assert_eq!(outcome(|| unsafe { libc::_exit(3) }, 5000), "CRASH(exit 3)");
        let hang: fn() -> Res = || loop {
            // SAFETY: no arguments; waits for a signal (the runner's SIGKILL).
            unsafe { libc::pause() };
        };
        assert_eq!(outcome(hang, 100), "TIMEOUT");
    }

    #[test]
    fn a_grandchild_holding_the_pipe_does_not_hide_a_crash() {
        let run: fn() -> Res = || {
            // SAFETY: the grandchild only sleeps and `_exit`s: nothing a lock held by
            // another thread at the fork could block.
            if unsafe { libc::fork() } == 0 {
                crate::sys::sleep_ms(3000);
                // SAFETY: an integer; ends the grandchild without running destructors.
                unsafe { libc::_exit(0) };
            }
            // SAFETY: no arguments; it ends the case child, as the test wants.
            unsafe { libc::abort() }
        };
        assert_eq!(outcome(run, 2000), "CRASH(signal SIGABRT)");
    }
}
