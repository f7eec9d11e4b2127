//! Running one measured program: its own process group, a deadline, output captured to
//! memory, and an interrupt flag (Ctrl-C / SIGTERM) checked while it runs.
//!
//! A run that outlives its deadline gets SIGTERM (ferry forwards it and still writes its
//! counters), then SIGKILL for the whole group two seconds later. Nothing here ever
//! asserts a time: the caller decides what a failed run means.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

/// Set by the Ctrl-C / SIGTERM handler; every wait loop checks it.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// A flag that is not set.
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Installs the process-wide Ctrl-C / SIGTERM handler that sets this flag. Only the
    /// first call in a process installs one; later calls return an error.
    pub fn install(&self) -> Result<(), ctrlc::Error> {
        let flag = self.0.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
    }

    /// Whether Ctrl-C or SIGTERM has arrived.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Sets the flag (as the signal handler does).
    pub fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What happened to one run.
#[derive(Debug)]
pub struct Outcome {
    /// Exit status, when the program exited by itself before the deadline.
    pub status: Option<ExitStatus>,
    /// Whether the deadline passed and the group was killed.
    pub timed_out: bool,
    /// Captured standard output.
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
    /// Wall time from spawn to exit (or kill).
    pub elapsed: Duration,
}

impl Outcome {
    /// Exited by itself with status 0.
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.is_some_and(|s| s.success())
    }

    /// A one-line reason for a failed run: timeout, exit status, and the last line of
    /// stderr (or stdout) that says something.
    pub fn failure(&self) -> String {
        let what = if self.timed_out {
            format!("timed out after {:.0} s", self.elapsed.as_secs_f64())
        } else {
            match self.status {
                Some(s) => format!("exited with {s}"),
                None => "did not exit".to_owned(),
            }
        };
        let last = last_line(&self.stderr).or_else(|| last_line(&self.stdout));
        match last {
            Some(l) => format!("{what}: {l}"),
            None => what,
        }
    }
}

fn last_line(s: &str) -> Option<String> {
    s.lines()
        .rev()
        .map(|l| strip_ansi(l).trim().to_owned())
        .find(|l| !l.is_empty() && !l.starts_with('}') && !l.starts_with(']'))
        .map(|l| l.chars().take(160).collect())
}

/// Removes terminal colour sequences (`ESC [ … letter`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Why a run could not be made at all.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program's name.
        program: String,
        /// What spawn said.
        source: std::io::Error,
    },
    /// Ctrl-C or SIGTERM arrived while it ran (it was killed).
    #[error("interrupted")]
    Interrupted,
}

/// Runs `cmd` (stdin from /dev/null, output captured) in a process group of its own,
/// killing the group after `timeout` or when `stop` is set.
pub fn run(cmd: &mut Command, timeout: Duration, stop: &Interrupt) -> Result<Outcome, ExecError> {
    run_with(cmd, timeout, stop, |_| None)
}

/// [`run`], calling `helper` with the child's pid right after the spawn: the helper it
/// returns (e.g. slirp4netns for the child's namespace) is stopped when the run ends.
pub fn run_with(
    cmd: &mut Command,
    timeout: Duration,
    stop: &Interrupt,
    helper: impl FnOnce(u32) -> Option<Daemon>,
) -> Result<Outcome, ExecError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|source| ExecError::Spawn { program, source })?;
    let out = reader(child.stdout.take());
    let err = reader(child.stderr.take());
    let mut group = Group::new(&child);
    let helper = helper(child.id());
    let (status, timed_out) = wait(&mut child, &mut group, start + timeout, stop);
    let elapsed = start.elapsed();
    // Whatever the leader left behind in its group goes too.
    group.kill_now();
    drop(helper);
    // A process that left the group may still hold the pipes: wait a little, then take
    // what was read so far.
    let stdout = out.finish(Duration::from_secs(3));
    let stderr = err.finish(Duration::from_secs(3));
    if stop.is_set() {
        return Err(ExecError::Interrupted);
    }
    Ok(Outcome {
        status,
        timed_out,
        stdout,
        stderr,
        elapsed,
    })
}

fn wait(
    child: &mut Child,
    group: &mut Group,
    deadline: Instant,
    stop: &Interrupt,
) -> (Option<ExitStatus>, bool) {
    let mut termed: Option<Instant> = None;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return (termed.is_none().then_some(s), termed.is_some());
        }
        let now = Instant::now();
        match termed {
            None if now >= deadline || stop.is_set() => {
                group.signal(rustix::process::Signal::TERM);
                termed = Some(now);
            }
            Some(t) if now >= t + Duration::from_secs(2) => {
                group.kill_now();
                let _ = child.wait();
                return (None, true);
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A thread draining one pipe into a shared buffer.
struct Reader {
    buf: Arc<Mutex<Vec<u8>>>,
    done: Arc<AtomicBool>,
    _thread: JoinHandle<()>,
}

impl Reader {
    /// Waits up to `grace` for end of file, then returns what has been read.
    fn finish(self, grace: Duration) -> String {
        let end = Instant::now() + grace;
        while !self.done.load(Ordering::Acquire) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        let buf = self.buf.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&buf).into_owned()
    }
}

fn reader<R: Read + Send + 'static>(pipe: Option<R>) -> Reader {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let (b, d) = (buf.clone(), done.clone());
    let thread = std::thread::spawn(move || {
        if let Some(mut p) = pipe {
            let mut chunk = [0u8; 16384];
            while let Ok(n) = p.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                if let Ok(mut v) = b.lock() {
                    v.extend_from_slice(&chunk[..n]);
                }
            }
        }
        d.store(true, Ordering::Release);
    });
    Reader {
        buf,
        done,
        _thread: thread,
    }
}

/// Makes this process the reaper of its descendants' orphans (`PR_SET_CHILD_SUBREAPER`):
/// a process whose parent dies (a sandbox whose `ferry run` was killed, an nginx worker
/// whose master went first) is re-parented here instead of to the system's init, so
/// [`reap_all`] can wait until it is really gone.
pub fn adopt_orphans() -> std::io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(Into::into)
}

/// Reaps every child of this process, adopted orphans included, until none is left:
/// those still running after `grace` get SIGKILL (and `grace` again). Returns the pids
/// of children that were still there at the end (none, normally). Call it only when
/// no `Child` of this process is waited for anywhere else.
pub fn reap_all(grace: Duration) -> Vec<u32> {
    let mut end = Instant::now() + grace;
    let mut killed = false;
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::NOHANG) {
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(rustix::io::Errno::CHILD) => return Vec::new(),
            Err(_) => return children(),
        }
        if Instant::now() >= end {
            if killed {
                return children();
            }
            for pid in children() {
                if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            killed = true;
            end = Instant::now() + grace;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This process's children (every thread's), from /proc.
pub fn children() -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// A process group led by a child we spawned with `process_group(0)`.
#[derive(Debug)]
pub struct Group(Option<rustix::process::Pid>);

impl Group {
    /// The group of `child` (its pid is the group id).
    pub fn new(child: &Child) -> Group {
        Group(rustix::process::Pid::from_child(child).into())
    }

    /// Sends `sig` to every process of the group (errors ignored: it may be gone).
    pub fn signal(&self, sig: rustix::process::Signal) {
        if let Some(pid) = self.0 {
            let _ = rustix::process::kill_process_group(pid, sig);
        }
    }

    /// SIGKILL to the group, once.
    pub fn kill_now(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A long-running helper (a server in the remote namespace, slirp4netns): its group is
/// terminated, then killed, when the guard drops.
#[derive(Debug)]
pub struct Daemon {
    /// What it is, for messages.
    pub name: String,
    child: Child,
    group: Group,
}

impl Daemon {
    /// Spawns `cmd` in a group of its own, output discarded unless the caller set it.
    pub fn spawn(name: &str, cmd: &mut Command) -> std::io::Result<Daemon> {
        cmd.stdin(Stdio::null()).process_group(0);
        let child = cmd.spawn()?;
        let group = Group::new(&child);
        Ok(Daemon {
            name: name.to_owned(),
            child,
            group,
        })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.group.signal(rustix::process::Signal::TERM);
        let end = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < end {
            if !matches!(self.child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.group.kill_now();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` (stdin empty) and waits for it: its stdout, trimmed, or why it failed
/// (`what`, the status and the last line it wrote to stderr).
pub fn output(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_owned();
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        let err = text(&out.stderr);
        let last = err.lines().last().unwrap_or("");
        Err(format!("{what}: {} {last}", out.status))
    }
}

/// `pid` and every process below it (`/proc/<pid>/task/*/children`).
pub fn with_descendants(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() && all.len() < 256 {
        let p = all[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                all.extend(
                    kids.split_whitespace()
                        .filter_map(|k| k.parse::<u32>().ok()),
                );
            }
        }
        i += 1;
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_and_times_out() {
        let stop = Interrupt::new();
        let ok = run(
            Command::new("sh").args(["-c", "echo hi; echo oops >&2"]),
            Duration::from_secs(10),
            &stop,
        )
        .unwrap();
        assert!(ok.success());
        assert_eq!(ok.stdout.trim(), "hi");
        assert_eq!(ok.stderr.trim(), "oops");
        let slow = run(
            Command::new("sh").args(["-c", "sleep 30 & sleep 30"]),
            Duration::from_millis(200),
            &stop,
        )
        .unwrap();
        assert!(slow.timed_out);
        assert!(!slow.success());
        assert!(slow.failure().starts_with("timed out"));
    }

    #[test]
    fn colours_are_stripped() {
        assert_eq!(
            strip_ansi("\x1b[2mtime\x1b[0m \x1b[33m WARN\x1b[0m x"),
            "time  WARN x"
        );
    }

    #[test]
    fn failure_names_the_last_line() {
        let stop = Interrupt::new();
        let bad = run(
            Command::new("sh").args(["-c", "echo first >&2; echo 'no route' >&2; exit 3"]),
            Duration::from_secs(10),
            &stop,
        )
        .unwrap();
        assert!(!bad.success());
        assert!(bad.failure().contains("no route"), "{}", bad.failure());
    }
}
