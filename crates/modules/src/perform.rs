//! What a module asks the server to do ([`Action`]) and a way to do it: [`Outbox`]
//! (non-blocking, resumable: for an event loop) and [`perform`] (blocking: tests, bench).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::io::Errno;
use rustix::net::{SendAncillaryBuffer, SendFlags};

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

    /// Writes as much as the socket takes now. Emitted buffers, and after them at most
    /// one copied file range (see [`Outbox::set_copy_max`]), leave in one gathered
    /// `sendmsg` — with `MSG_MORE` when more output follows, so a header and a small
    /// file leave in one segment and one call; a range above `copy_max` goes with
    /// `sendfile` on its own. Returns the bytes written; stops early (without an error)
    /// when the socket would block — check [`Outbox::is_empty`]. A file shorter than
    /// its range is an [`io::ErrorKind::UnexpectedEof`] error.
    pub fn advance(&mut self, sock: BorrowedFd<'_>) -> io::Result<u64> {
        let mut total = 0u64;
        while let Some(front) = self.queue.front() {
            let r = match front {
                Action::EmitFile { file, offset, len } if *len > self.copy_max => {
                    let mut off = offset + self.done;
                    let count = usize::try_from(len - self.done).unwrap_or(usize::MAX);
                    match retry_intr(|| rustix::fs::sendfile(sock, file, Some(&mut off), count)) {
                        Ok(0) => return Err(short_file()),
                        r => r,
                    }
                }
                _ => self.send_gathered(sock)?,
            };
            match r {
                Ok(n) => {
                    total += n as u64;
                    self.consume(n as u64);
                }
                Err(Errno::AGAIN) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(total)
    }

    /// One gathered send from the front: emitted buffers up to the first file range,
    /// and that range's staged bytes when it is copied (staging the next piece first
    /// if none is). The outer `Result` is a failed `pread`; the inner one the send's.
    fn send_gathered(&mut self, sock: BorrowedFd<'_>) -> io::Result<Result<usize, Errno>> {
        let mut window = 0;
        let mut staged = None;
        for (i, a) in self.queue.iter().enumerate() {
            match a {
                Action::Emit(_) => window = i + 1,
                Action::EmitFile { file, offset, len } if *len <= self.copy_max => {
                    // The stage belongs to the queue's first copied range (this one):
                    // `stage[at..end]` starts at its offset + its progress.
                    let done = if i == 0 { self.done } else { 0 };
                    if self.at == self.end {
                        let n = usize::try_from(len - done)
                            .unwrap_or(usize::MAX)
                            .min(COPY_CHUNK);
                        if self.stage.len() < n {
                            self.stage.resize(n, 0);
                        }
                        let pos = offset + done;
                        match retry_intr(|| rustix::io::pread(file, &mut self.stage[..n], pos)) {
                            Ok(0) => return Err(short_file()),
                            Ok(k) => (self.at, self.end) = (0, k),
                            Err(e) => return Err(e.into()),
                        }
                    }
                    staged = Some(done + ((self.end - self.at) as u64) < *len);
                    window = i + 1;
                    break;
                }
                Action::EmitFile { .. } => break,
            }
        }
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(window.min(MAX_GATHER));
        for (i, a) in self.queue.iter().take(window).enumerate() {
            let skip = if i == 0 { self.done as usize } else { 0 };
            match a {
                Action::Emit(b) if iov.len() < MAX_GATHER - 1 || staged.is_none() => {
                    iov.push(IoSlice::new(&b[skip..]))
                }
                Action::Emit(_) => break,
                Action::EmitFile { .. } => iov.push(IoSlice::new(&self.stage[self.at..self.end])),
            }
            if iov.len() == MAX_GATHER {
                break;
            }
        }
        // More follows: actions beyond what this call carries, or the rest of a range.
        let carried = iov.len();
        let more = self.queue.len() > carried || staged == Some(true);
        Ok(put(sock, &iov, more, &mut self.not_socket))
    }

    /// Accounts `n` bytes written from the front of the queue.
    fn consume(&mut self, mut n: u64) {
        while let Some(front) = self.queue.front() {
            let copied = matches!(front, Action::EmitFile { len, .. } if *len <= self.copy_max);
            let left = front.len() - self.done;
            if n < left {
                self.done += n;
                if copied {
                    self.at += n as usize;
                }
                return;
            }
            n -= left;
            self.queue.pop_front();
            self.done = 0;
            if copied {
                // A copied range is done: a large buffer goes, a small one is kept for
                // the next response.
                if self.stage.capacity() > KEEP_STAGE {
                    self.stage = Vec::new();
                }
                (self.at, self.end) = (0, 0);
            }
            if n == 0 {
                return;
            }
        }
    }
}

/// Most pieces one gathered send carries.
const MAX_GATHER: usize = 64;

/// A copy buffer at most this large stays with the outbox between ranges.
const KEEP_STAGE: usize = 64 * 1024;

/// Bytes of the output to `sock`: `sendmsg` (with `MSG_MORE` when `more` follows, so a
/// header and a small body leave in one segment), or `writev` once `sock` turned out
/// not to be a socket (`not_socket` remembers it).
fn put(
    sock: BorrowedFd<'_>,
    iov: &[IoSlice<'_>],
    more: bool,
    not_socket: &mut bool,
) -> Result<usize, Errno> {
    if !*not_socket {
        let flags = if more {
            SendFlags::MORE
        } else {
            SendFlags::empty()
        };
        let mut control = SendAncillaryBuffer::default();
        match retry_intr(|| {
            rustix::net::sendmsg(sock, iov, &mut control, flags | SendFlags::NOSIGNAL)
        }) {
            Err(Errno::NOTSOCK) => *not_socket = true,
            r => return r,
        }
    }
    retry_intr(|| rustix::io::writev(sock, iov))
}

/// A file range that reads past the file's end.
fn short_file() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "file is shorter than the range a module emitted",
    )
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
