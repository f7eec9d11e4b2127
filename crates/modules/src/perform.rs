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
    /// An empty outbox.
    pub fn new() -> Outbox {
        Outbox::default()
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
    /// `sendfile`. Returns the bytes written; stops early (without an error) when the
    /// socket would block — check [`Outbox::is_empty`].
    pub fn advance(&mut self, sock: BorrowedFd<'_>) -> io::Result<u64> {
        let mut total = 0u64;
        while let Some(front) = self.queue.front() {
            let more = self.queue.len() > 1;
            let r = match front {
                Action::Emit(b) => {
                    let rest = &b[self.done as usize..];
                    if self.not_socket {
                        retry_intr(|| rustix::io::write(sock, rest))
                    } else {
                        let flags = if more {
                            SendFlags::MORE
                        } else {
                            SendFlags::empty()
                        };
                        match retry_intr(|| {
                            rustix::net::send(sock, rest, flags | SendFlags::NOSIGNAL)
                        }) {
                            Err(Errno::NOTSOCK) => {
                                self.not_socket = true;
                                continue;
                            }
                            r => r,
                        }
                    }
                }
                Action::EmitFile { file, offset, len } => {
                    let mut off = offset + self.done;
                    let count = usize::try_from(len - self.done).unwrap_or(usize::MAX);
                    match retry_intr(|| rustix::fs::sendfile(sock, file, Some(&mut off), count)) {
                        Ok(0) => {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "file is shorter than the range a module emitted",
                            ));
                        }
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
                    }
                }
                Err(Errno::AGAIN) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(total)
    }
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
