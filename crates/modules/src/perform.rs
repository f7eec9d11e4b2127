//! What a module asks the server to do ([`Action`]) and a way to do it: [`Outbox`]
//! (non-blocking, resumable: for an event loop) and [`perform`] (blocking: tests, bench).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::io::Errno;
use rustix::net::SendFlags;

/// One piece of output a module asked for, to be written to the instance's socket in
/// order. Modules never do I/O themselves.
#[derive(Debug, Clone)]
pub enum Action {
    /// Bytes the module produced (a header, compressed or transformed data) or a buffer
    /// it passed through unchanged (moved, not copied).
    Emit(Vec<u8>),
    /// A range of a file handed to the instance at start: sent with `sendfile`, so the
    /// bytes never enter the module's memory (nor the server's).
    EmitFile {
        /// The file (kept open as long as an action refers to it).
        file: Arc<OwnedFd>,
        /// First byte.
        offset: u64,
        /// Bytes to send (checked against the file's size when the module asked).
        len: u64,
    },
}

impl Action {
    /// Bytes this action puts on the socket.
    pub fn len(&self) -> u64 {
        match self {
            Action::Emit(b) => b.len() as u64,
            Action::EmitFile { len, .. } => *len,
        }
    }

    /// Whether the action writes nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bytes of a file range read (`pread`) and written per step when the range is copied
/// rather than sent with `sendfile` (see [`Outbox::set_copy_max`]).
pub const COPY_CHUNK: usize = 256 * 1024;

/// Actions waiting to go out on one socket, and how far the first one has got. Feed it
/// what [`crate::Instance`] returns; call [`Outbox::advance`] when the socket is
/// writable.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: VecDeque<Action>,
    /// Bytes of the front action already written.
    done: u64,
    /// The fd turned out not to be a socket: use write(2), not send(2) with MSG_MORE.
    not_socket: bool,
    /// File ranges of at most this many bytes are copied, not sent with `sendfile`.
    copy_max: u64,
    /// A copied range's bytes read but not written yet: `stage[at..end]`, which starts
    /// at the front action's `offset + done`. Freed when the range is done.
    stage: Vec<u8>,
    at: usize,
    end: usize,
}

fn retry_intr<T>(mut f: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            r => return r,
        }
    }
}

impl Outbox {
    /// An empty outbox. File ranges go out with `sendfile`.
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// File ranges (`EmitFile`) of at most `bytes` go out by copy — `pread` into a
    /// buffer of the outbox ([`COPY_CHUNK`] at a time, freed when the range is done),
    /// then `send` — instead of `sendfile`; 0 (the default): always `sendfile`. Copying
    /// costs the writer a copy per byte, `sendfile` costs page references per 4 KiB
    /// page for the sender and the receiver (on a veth pair, the same CPU often does
    /// both): which is cheaper depends on the size and the path (see docs/MODULES.md).
    pub fn set_copy_max(&mut self, bytes: u64) {
        self.copy_max = bytes;
    }

    /// Queues actions after those already queued.
    pub fn push(&mut self, actions: impl IntoIterator<Item = Action>) {
        self.queue
            .extend(actions.into_iter().filter(|a| !a.is_empty()));
    }

    /// Whether everything queued has been written.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Bytes still to write.
    pub fn pending_bytes(&self) -> u64 {
        self.queue.iter().map(Action::len).sum::<u64>() - self.done
    }

    /// Writes as much as the socket takes now: `Emit` with `send(MSG_MORE)` when more
    /// follows (so a header and a small file leave in one segment), `EmitFile` with
    /// `sendfile` (or copied, see [`Outbox::set_copy_max`]). Returns the bytes written;
    /// stops early (without an error) when the socket would block — check
    /// [`Outbox::is_empty`]. A file shorter than its range is an
    /// [`io::ErrorKind::UnexpectedEof`] error.
    pub fn advance(&mut self, sock: BorrowedFd<'_>) -> io::Result<u64> {
        let mut total = 0u64;
        while let Some(front) = self.queue.front() {
            let more = self.queue.len() > 1;
            let r = match front {
                Action::Emit(b) => put(sock, &b[self.done as usize..], more, &mut self.not_socket),
                Action::EmitFile { file, offset, len } if *len <= self.copy_max => {
                    if self.at == self.end {
                        // Stage the next piece of the range.
                        let n = usize::try_from(len - self.done)
                            .unwrap_or(usize::MAX)
                            .min(COPY_CHUNK);
                        if self.stage.len() < n {
                            self.stage.resize(n, 0);
                        }
                        let pos = offset + self.done;
                        match retry_intr(|| rustix::io::pread(file, &mut self.stage[..n], pos)) {
                            Ok(0) => return Err(short_file()),
                            Ok(k) => (self.at, self.end) = (0, k),
                            Err(e) => return Err(e.into()),
                        }
                    }
                    let rest = &self.stage[self.at..self.end];
                    let more_here = self.done + (rest.len() as u64) < *len;
                    put(sock, rest, more || more_here, &mut self.not_socket)
                        .inspect(|&k| self.at += k)
                }
                Action::EmitFile { file, offset, len } => {
                    let mut off = offset + self.done;
                    let count = usize::try_from(len - self.done).unwrap_or(usize::MAX);
                    match retry_intr(|| rustix::fs::sendfile(sock, file, Some(&mut off), count)) {
                        Ok(0) => return Err(short_file()),
                        r => r,
                    }
                }
            };
            match r {
                Ok(n) => {
                    total += n as u64;
                    self.done += n as u64;
                    if self.done == front_len(&self.queue) {
                        self.queue.pop_front();
                        self.done = 0;
                        if !self.stage.is_empty() {
                            // A copied range is done: its buffer goes.
                            self.stage = Vec::new();
                            (self.at, self.end) = (0, 0);
                        }
                    }
                }
                Err(Errno::AGAIN) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(total)
    }
}

/// Bytes of the output to `sock`: `send` (with `MSG_MORE` when `more` follows, so a
/// header and a small body leave in one segment), or `write` once `sock` turned out not
/// to be a socket (`not_socket` remembers it).
fn put(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    more: bool,
    not_socket: &mut bool,
) -> Result<usize, Errno> {
    if !*not_socket {
        let flags = if more {
            SendFlags::MORE
        } else {
            SendFlags::empty()
        };
        match retry_intr(|| rustix::net::send(sock, bytes, flags | SendFlags::NOSIGNAL)) {
            Err(Errno::NOTSOCK) => *not_socket = true,
            r => return r,
        }
    }
    retry_intr(|| rustix::io::write(sock, bytes))
}

/// A file range that reads past the file's end.
fn short_file() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "file is shorter than the range a module emitted",
    )
}

fn front_len(q: &VecDeque<Action>) -> u64 {
    q.front().map_or(0, Action::len)
}

/// Writes `actions` to `sock` in order, waiting for the socket when it is non-blocking
/// and full; returns the bytes written. For tests and benchmarks: a server uses an
/// [`Outbox`] in its event loop instead.
pub fn perform(actions: impl IntoIterator<Item = Action>, sock: impl AsFd) -> io::Result<u64> {
    let sock = sock.as_fd();
    let mut out = Outbox::new();
    out.push(actions);
    let mut total = 0;
    while !out.is_empty() {
        total += out.advance(sock)?;
        if !out.is_empty() {
            let mut fds = [PollFd::new(&sock, PollFlags::OUT)];
            retry_intr(|| poll(&mut fds, None))?;
        }
    }
    Ok(total)
}
