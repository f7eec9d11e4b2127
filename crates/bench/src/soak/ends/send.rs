//! One connection's sends: the plan's calls asking for its chunks of the payload
//! ([`Sender::call`]), sent to the end ([`Sender::send_all`], the race case) or until a
//! send fails ([`Sender::send_until_refused`], the dead and sendfile cases), and the
//! sends tried after the first failure, which must all fail too ([`sticky`]).

use std::fs::File;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::Method;
use super::plan::{ConnPlan, FILE_LEN};
use super::sys;
use super::tally::Outcome;
use crate::soak::fill;

/// When sends that keep succeeding, or neither succeed nor fail, count as sends into a
/// dead connection: past `bytes` beyond the peer's stop, or `time` after the driver
/// reached it.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Bytes past the peer's stop.
    pub bytes: u64,
    /// Time since the sends passed the peer's stop.
    pub time: Duration,
    /// No progress for this long before the stop (or in the race case) is a stall.
    pub stall: Duration,
}

/// The sending end of one connection.
#[derive(Debug)]
pub struct Sender<'a> {
    sock: &'a TcpStream,
    plan: &'a ConnPlan,
    file: &'a File,
    buf: &'a mut Vec<u8>,
    /// Bytes the sends reported.
    pub sent: u64,
}

fn refused(e: &io::Error) -> Option<i32> {
    e.raw_os_error()
        .filter(|&n| n == libc::EPIPE || n == libc::ECONNRESET)
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

impl<'a> Sender<'a> {
    /// A sender of `plan`'s payload on `sock` (set up for the plan's method already);
    /// `file` holds the file's stream, `buf` is scratch.
    pub fn new(
        sock: &'a TcpStream,
        plan: &'a ConnPlan,
        file: &'a File,
        buf: &'a mut Vec<u8>,
    ) -> Sender<'a> {
        Sender {
            sock,
            plan,
            file,
            buf,
            sent: 0,
        }
    }

    /// One call of the plan's method for up to `want` (> 0) of the next payload bytes.
    pub fn call(&mut self, want: u64) -> io::Result<usize> {
        let h = &self.plan.head;
        let fd = self.sock.as_fd();
        if self.plan.head.method.from_file() {
            // Past the file's end (only the dead case sends that far, past its peer's
            // stop), the range starts over: those bytes are never read.
            let off = h.start + self.sent % (FILE_LEN - h.start);
            let n = want.min(FILE_LEN - off) as usize;
            return sys::sendfile(fd, self.file.as_fd(), off, n);
        }
        let n = want.min(1 << 20) as usize;
        self.buf.resize(n, 0);
        fill(h.key, h.start + self.sent, &mut self.buf[..n]);
        let bytes = &self.buf[..n];
        match self.plan.head.method {
            // SIGPIPE is ignored (Rust's runtime does, as Python's does).
            Method::Send => sys::send(fd, bytes, 0),
            Method::Write => sys::write(fd, bytes),
            _ => sys::send(fd, bytes, libc::MSG_NOSIGNAL),
        }
    }

    /// Waits (up to 100 ms) for room when the socket is non-blocking.
    fn wait(&self) {
        if self.plan.head.method.nonblocking() {
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLOUT)];
            let _ = poll(&mut fds, PollTimeout::from(100u16));
        }
    }

    /// Sends the whole payload (the race case): `AllSent`, or how it failed.
    pub fn send_all(&mut self, b: &Bounds) -> Outcome {
        let len = self.plan.head.len;
        let mut last = Instant::now();
        while self.sent < len {
            let want = self.plan.chunk.min(len - self.sent);
            match self.call(want) {
                Ok(0) => return self.failed("a send returned 0".into()),
                Ok(n) => {
                    self.sent += n as u64;
                    last = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if last.elapsed() > b.stall {
                        return self.stalled(format!("no room for {:?}", b.stall));
                    }
                    self.wait();
                }
                Err(e) => return self.failed(format!("{:?}: {e}", self.plan.head.method)),
            }
        }
        Outcome::AllSent { sent: self.sent }
    }

    /// Sends until a send fails (the dead and sendfile cases): `Refused` when it fails
    /// with EPIPE or ECONNRESET past the peer's stop; `Dead` when sends keep succeeding
    /// past the bounds; `AllSent` when the whole (finite) payload was reported sent.
    pub fn send_until_refused(&mut self, b: &Bounds) -> Outcome {
        let (stop, len) = (self.plan.head.stop, self.plan.head.len);
        let mut at_stop = (stop == 0).then(Instant::now);
        let mut last = Instant::now();
        loop {
            if self.sent >= len {
                return Outcome::AllSent { sent: self.sent };
            }
            match self.call(self.plan.chunk.min(len - self.sent)) {
                Ok(n) => {
                    self.sent += n as u64;
                    last = Instant::now();
                    if self.sent >= stop {
                        let t = *at_stop.get_or_insert(last);
                        if self.sent - stop > b.bytes || t.elapsed() > b.time {
                            return Outcome::Dead { sent: self.sent };
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Some(t) = at_stop.filter(|t| t.elapsed() > b.time) {
                        // Still taking bytes of late: sends that go on succeeding.
                        if last > t && last.elapsed() < b.time / 2 {
                            return Outcome::Dead { sent: self.sent };
                        }
                        let quiet = millis(last.elapsed());
                        let why = format!(
                            "no error {} ms after the peer's stop (no room for {quiet} ms)",
                            millis(t.elapsed())
                        );
                        return self.stalled(why);
                    }
                    if last.elapsed() > b.stall {
                        return self.stalled(format!("no room for {:?} before the stop", b.stall));
                    }
                    self.wait();
                }
                Err(e) => return self.refused_or_failed(&e, at_stop),
            }
        }
    }

    fn refused_or_failed(&mut self, e: &io::Error, at_stop: Option<Instant>) -> Outcome {
        let stop = self.plan.head.stop;
        match (refused(e), at_stop) {
            (Some(errno), Some(t)) => Outcome::Refused {
                sent: self.sent,
                errno,
                after_bytes: self.sent - stop,
                after_ms: millis(t.elapsed()),
                sticky: sticky(self.sock, self.file),
            },
            (Some(_), None) => self.failed(format!(
                "{:?}: {e} before the peer's stop ({} of {stop} bytes sent)",
                self.plan.head.method, self.sent
            )),
            (None, _) => self.failed(format!("{:?}: {e}", self.plan.head.method)),
        }
    }

    fn failed(&self, why: String) -> Outcome {
        Outcome::Failed {
            sent: self.sent,
            why: format!("{why} ({} bytes sent)", self.sent),
        }
    }

    fn stalled(&self, why: String) -> Outcome {
        Outcome::Stalled {
            sent: self.sent,
            why: format!("{why} ({} bytes sent)", self.sent),
        }
    }
}

/// After a send failed with EPIPE or ECONNRESET: whether `send` (1 byte), `write`
/// (4 KiB) and `sendfile` (4 KiB) all fail the same way now (as the kernel's do: the
/// error stays with the socket).
pub fn sticky(sock: &TcpStream, file: &File) -> bool {
    let fd = sock.as_fd();
    let page = [0x5au8; 4096];
    let tries = [
        sys::send(fd, &page[..1], libc::MSG_NOSIGNAL),
        sys::write(fd, &page),
        sys::sendfile(fd, file.as_fd(), 0, page.len()),
    ];
    tries
        .iter()
        .all(|r| r.as_ref().is_err_and(|e| refused(e).is_some()))
}
