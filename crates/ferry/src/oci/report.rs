//! What a container's network side says where the engine's user looks: each of its
//! warnings — a connection the egress policy refused, a port it could not publish — as
//! one line `ferry: …` on the container's stderr (what `docker logs`, `podman logs`
//! and `kubectl logs` show; not with a terminal, whose output the engine takes from a
//! console instead) and in the runtime's `--log` file (JSON with `--log-format json`,
//! as runc writes it). At most [`PER_SECOND`] lines a second go there, then a count of
//! those left out; the network side's own log (`network.log` in the container's state
//! directory) has them all. A line never blocks a server: the container's stderr is
//! written without waiting (a full pipe drops the line, counted as left out).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferry_oci::cli::log_line;
use ferry_oci::side::Targets;
use tracing_subscriber::fmt::MakeWriter;

/// Most lines a second on the container's stderr and in the runtime's log.
pub(crate) const PER_SECOND: u32 = 10;

/// The rate limit: [`PER_SECOND`] lines a window of a second.
#[derive(Debug)]
pub(crate) struct Limit {
    since: Instant,
    shown: u32,
    hidden: u64,
}

/// What [`Limit::admit`] decides for one line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Show it; `hidden` lines were left out before it (say so first).
    Show { hidden: u64 },
    /// Leave it out.
    Hide,
}

impl Limit {
    pub(crate) fn new(now: Instant) -> Limit {
        Limit {
            since: now,
            shown: 0,
            hidden: 0,
        }
    }

    pub(crate) fn admit(&mut self, now: Instant) -> Admit {
        if now.duration_since(self.since) >= Duration::from_secs(1) {
            self.since = now;
            self.shown = 0;
        }
        if self.shown >= PER_SECOND {
            self.hidden += 1;
            return Admit::Hide;
        }
        self.shown += 1;
        Admit::Show {
            hidden: std::mem::take(&mut self.hidden),
        }
    }

    /// A shown line that could not be written: counted as left out.
    fn lost(&mut self) {
        self.hidden += 1;
    }
}

/// The open targets and the limit.
struct Report {
    stderr: Option<File>,
    log: Option<(File, bool)>,
    limit: Limit,
}

impl Report {
    fn say(&mut self, text: &str) {
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        let hidden = match self.limit.admit(Instant::now()) {
            Admit::Show { hidden } => hidden,
            Admit::Hide => return,
        };
        let mut lines = Vec::new();
        if hidden > 0 {
            lines.push(format!(
                "ferry: {hidden} more lines not shown here (at most {PER_SECOND} a second)"
            ));
        }
        lines.push(format!("ferry: {text}"));
        let mut lost = false;
        for line in &lines {
            if let Some(f) = &mut self.stderr {
                // One write: a pipe takes it whole or not at all (under PIPE_BUF).
                lost |= f.write(format!("{line}\n").as_bytes()).is_err();
            }
            if let Some((f, json)) = &mut self.log {
                let _ = writeln!(f, "{}", log_line("warning", line, *json));
            }
        }
        if lost {
            self.limit.lost();
        }
    }
}

/// Where the network side's warnings go besides its own log (a `tracing` writer).
#[derive(Clone)]
pub(super) struct Sink(Arc<Mutex<Report>>);

impl Sink {
    /// Opens `t`'s targets (the container's stderr anew, not blocking, and the
    /// inherited descriptor closed); `None` when there is none.
    pub(super) fn open(t: &Targets) -> Option<Sink> {
        let stderr = t.stderr_fd.and_then(reopen_nonblocking);
        let log = t.log.as_ref().and_then(|(path, json)| {
            let f = File::options().create(true).append(true).open(path);
            f.map_err(|e| tracing::debug!("--log {}: {e}", path.display()))
                .ok()
                .map(|f| (f, *json))
        });
        if stderr.is_none() && log.is_none() {
            return None;
        }
        Some(Sink(Arc::new(Mutex::new(Report {
            stderr,
            log,
            limit: Limit::new(Instant::now()),
        }))))
    }
}

/// The container's stderr, opened anew through `/proc/self/fd` so that not blocking
/// is ours alone (the descriptor `create` passed shares the container's file
/// description, which must stay as it is); the passed one is closed.
fn reopen_nonblocking(fd: RawFd) -> Option<File> {
    let opened = File::options()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{fd}"));
    // `create` passed it for this use alone: nothing else here owns it.
    let _ = ferry_sys::close_raw(fd);
    opened
        .map_err(|e| {
            tracing::debug!("the container's stderr: {e}: ferry's lines stay in its own log")
        })
        .ok()
}

/// One event's text, said when the formatter is done with it.
pub(super) struct Line<'a> {
    sink: &'a Sink,
    buf: Vec<u8>,
}

impl Write for Line<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        self.sink
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .say(&text);
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            sink: self,
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_a_second_then_a_count() {
        let t0 = Instant::now();
        let mut l = Limit::new(t0);
        for _ in 0..PER_SECOND {
            assert_eq!(l.admit(t0), Admit::Show { hidden: 0 });
        }
        assert_eq!(l.admit(t0), Admit::Hide);
        assert_eq!(l.admit(t0 + Duration::from_millis(999)), Admit::Hide);
        assert_eq!(
            l.admit(t0 + Duration::from_secs(1)),
            Admit::Show { hidden: 2 }
        );
        assert_eq!(
            l.admit(t0 + Duration::from_secs(1)),
            Admit::Show { hidden: 0 }
        );
    }
}
