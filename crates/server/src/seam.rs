//! The I/O seam: every call the socket logic makes on a host socket, a readiness pair,
//! the receive pipe or a channel's control socket goes through [`Io`].
//!
//! The decisions (what a request, a host event or a pair event does: `ops.rs`,
//! `connect.rs`, `tx.rs`, `rx.rs`, the socket table of `table.rs`, `sock.rs`) never
//! enter the kernel themselves: they ask an [`Io`]. [`SysIo`] is the real one (a thin
//! layer over `ferry-sys`); the scripted fake of [`crate::testkit`] models host sockets
//! and pairs in memory, so that the ordering and readiness rules can be tested
//! in-process, deterministically, without threads or kernel sockets (`tests/core.rs`).
//!
//! Owns: the list of calls and their meaning (each is named after, and behaves as, the
//! system call of the same name on a non-blocking socket). Must not: decide anything,
//! keep state about sockets (the fake does, as the kernel would), or be reached around
//! by the socket logic. The event loop's own plumbing (epoll, eventfds, accepting
//! control connections, published listeners, the DNS forwarder) stays outside the seam:
//! it is not socket logic.

use std::collections::vec_deque;
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_ring::{BufSpan, Buffers};
use ferry_sys::Received;

use crate::sock::{NewPair, PairName, TxItem};

/// The calls the socket logic makes. Every fd is non-blocking but our end of a
/// readiness pair, made blocking to save a call per socket: each call on it passes
/// `MSG_DONTWAIT` or cannot block (`shutdown`, `ioctl`, `ppoll` with no timeout), and
/// the one that cannot say so, a splice into it, comes only after the pump has made it
/// non-blocking (`Rx::read_into_pair`). An error is the kernel's
/// (`io::Error::from_raw_os_error`), `WouldBlock` meaning `EAGAIN`.
pub(crate) trait Io: Send + Sync + std::fmt::Debug {
    /// `socket(domain, ty | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol)` in the host namespace.
    fn socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd>;
    /// A new readiness pair for socket `id` (see [`NewPair`]).
    fn new_pair(&self, id: u32) -> io::Result<NewPair>;
    /// A unix stream socket whose peer is gone: the placeholder of a detached pair end.
    fn orphan(&self) -> io::Result<OwnedFd>;
    /// An unbound unix stream socket of the server's namespace (the name probe).
    fn unix_socket(&self) -> io::Result<OwnedFd>;
    /// `bind` to an abstract unix name.
    fn bind_abstract(&self, fd: BorrowedFd<'_>, name: &PairName) -> io::Result<()>;
    /// The abstract name a unix socket is bound to, into `out`; its length.
    fn abstract_name(&self, fd: BorrowedFd<'_>, out: &mut [u8; 107]) -> io::Result<Option<usize>>;
    /// The network namespace a socket was made in (`SO_NETNS_COOKIE`).
    fn netns_cookie(&self, fd: BorrowedFd<'_>) -> io::Result<u64>;
    fn set_nonblocking(&self, fd: BorrowedFd<'_>, on: bool) -> io::Result<()>;
    fn bind(&self, fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()>;
    fn connect(&self, fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()>;
    /// `connect(AF_UNSPEC)`: dissolve an association.
    fn connect_unspec(&self, fd: BorrowedFd<'_>) -> io::Result<()>;
    fn listen(&self, fd: BorrowedFd<'_>, backlog: i32) -> io::Result<()>;
    /// `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`: the connection and its peer.
    fn accept(&self, fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, Option<SocketAddr>)>;
    /// `getsockname` (`peer` false) or `getpeername`.
    fn sock_addr(&self, fd: BorrowedFd<'_>, peer: bool) -> io::Result<Option<SocketAddr>>;
    fn setsockopt(&self, fd: BorrowedFd<'_>, level: i32, name: i32, value: &[u8])
    -> io::Result<()>;
    fn getsockopt(
        &self,
        fd: BorrowedFd<'_>,
        level: i32,
        name: i32,
        out: &mut [u8],
    ) -> io::Result<usize>;
    fn getsockopt_int(&self, fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32>;
    /// `ioctl(FIONREAD)`.
    fn pending_bytes(&self, fd: BorrowedFd<'_>) -> io::Result<i32>;
    fn shutdown(&self, fd: BorrowedFd<'_>, how: i32) -> io::Result<()>;
    /// `SO_LINGER` 0: the close that follows resets the connection.
    fn linger_reset(&self, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// `ppoll` with a zero timeout: the events that are ready now.
    fn poll_now(&self, fd: BorrowedFd<'_>, events: i16) -> io::Result<i16>;
    /// `SIOCATMARK`: the next byte to read is the urgent mark.
    fn at_mark(&self, fd: BorrowedFd<'_>) -> io::Result<bool>;
    /// `recv(flags)` into `buf` (callers pass `MSG_DONTWAIT`: our end of a pair may
    /// be blocking).
    fn recv(&self, fd: BorrowedFd<'_>, buf: &mut [u8], flags: i32) -> io::Result<usize>;
    /// Reads (and closes) what one `recvmsg` returns, descriptors included: how a
    /// filler is taken out of a pair.
    fn discard(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize>;
    /// `send(MSG_NOSIGNAL | MSG_DONTWAIT)`.
    fn send(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize>;
    /// One out-of-band byte (`MSG_OOB`) into a unix stream socket.
    fn send_oob(&self, fd: BorrowedFd<'_>, byte: u8) -> io::Result<usize>;
    /// Whether this kernel's unix stream sockets carry out-of-band data.
    fn unix_oob_works(&self) -> bool;
    /// A pipe of about `size` bytes for bulk receives, or `None` (bulk streams are then
    /// copied).
    fn rx_pipe(&self, size: usize) -> Option<(OwnedFd, OwnedFd)>;
    /// `splice` up to `len` bytes (non-blocking).
    fn splice(&self, from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize>;
    /// Sends the unsent parts of queued items in one call (see `hostio::send_items`).
    fn send_items(
        &self,
        fd: BorrowedFd<'_>,
        items: vec_deque::Iter<'_, TxItem>,
    ) -> io::Result<usize>;
    /// Receives into channel buffers (see `hostio::recv_spans`).
    fn recv_spans(
        &self,
        fd: BorrowedFd<'_>,
        bufs: &Buffers,
        spans: &[BufSpan],
        flags: i32,
        control: Option<&mut [u8]>,
    ) -> io::Result<Received>;
    /// A control message (bytes and descriptors) on a channel's control socket.
    fn ctl_send(&self, fd: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()>;
}

/// A pair name's nonce without a system call per pair: a keyed hash (SipHash, its key
/// drawn from the kernel's random source once per process) of a counter, so nonces
/// never repeat within a run and cannot be guessed from those seen before.
fn pair_nonce() -> u64 {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    KEY.get_or_init(RandomState::new)
        .hash_one(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The real [`Io`]: the system calls, through `ferry-sys`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SysIo;

/// The one [`SysIo`] every server uses.
pub(crate) static SYS: SysIo = SysIo;

impl Io for SysIo {
    fn socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
        ferry_sys::socket(
            domain,
            ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            protocol,
        )
    }

    fn new_pair(&self, id: u32) -> io::Result<NewPair> {
        // Both ends blocking (`SOCK_NONBLOCK` would set the program's too): see `Io`.
        let (ours, theirs) =
            ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)?;
        // An unpredictable part makes names of concurrent runs distinct; a name taken
        // anyway (by a process of the host) is tried again with another.
        let mut tries = 0;
        loop {
            let name = ferry_proto::pair_name(id, pair_nonce());
            match ferry_sys::bind_abstract(theirs.as_fd(), &name.0[..name.1]) {
                Ok(()) => return Ok(NewPair { ours, theirs, name }),
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && tries < 4 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    fn orphan(&self) -> io::Result<OwnedFd> {
        let (ours, peer) =
            ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)?;
        drop(peer);
        Ok(ours)
    }

    fn unix_socket(&self) -> io::Result<OwnedFd> {
        ferry_sys::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
    }

    fn bind_abstract(&self, fd: BorrowedFd<'_>, name: &PairName) -> io::Result<()> {
        ferry_sys::bind_abstract(fd, &name.0[..name.1])
    }

    fn abstract_name(&self, fd: BorrowedFd<'_>, out: &mut [u8; 107]) -> io::Result<Option<usize>> {
        ferry_sys::abstract_name(fd, out)
    }

    fn netns_cookie(&self, fd: BorrowedFd<'_>) -> io::Result<u64> {
        ferry_sys::netns_cookie(fd)
    }

    fn set_nonblocking(&self, fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
        ferry_sys::set_nonblocking(fd, on)
    }

    fn bind(&self, fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
        ferry_sys::bind(fd, addr)
    }

    fn connect(&self, fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
        ferry_sys::connect(fd, addr)
    }

    fn connect_unspec(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        rustix::net::connect_unspec(fd).map_err(io::Error::from)
    }

    fn listen(&self, fd: BorrowedFd<'_>, backlog: i32) -> io::Result<()> {
        ferry_sys::listen(fd, backlog)
    }

    fn accept(&self, fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
        ferry_sys::accept4(fd, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
    }

    fn sock_addr(&self, fd: BorrowedFd<'_>, peer: bool) -> io::Result<Option<SocketAddr>> {
        ferry_sys::sock_addr(fd, peer)
    }

    fn setsockopt(
        &self,
        fd: BorrowedFd<'_>,
        level: i32,
        name: i32,
        value: &[u8],
    ) -> io::Result<()> {
        ferry_sys::setsockopt(fd, level, name, value)
    }

    fn getsockopt(
        &self,
        fd: BorrowedFd<'_>,
        level: i32,
        name: i32,
        out: &mut [u8],
    ) -> io::Result<usize> {
        ferry_sys::getsockopt(fd, level, name, out)
    }

    fn getsockopt_int(&self, fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
        ferry_sys::getsockopt_int(fd, level, name)
    }

    fn pending_bytes(&self, fd: BorrowedFd<'_>) -> io::Result<i32> {
        ferry_sys::pending_bytes(fd)
    }

    fn shutdown(&self, fd: BorrowedFd<'_>, how: i32) -> io::Result<()> {
        ferry_sys::shutdown(fd, how)
    }

    fn linger_reset(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        ferry_sys::linger_reset(fd)
    }

    fn poll_now(&self, fd: BorrowedFd<'_>, events: i16) -> io::Result<i16> {
        ferry_sys::poll_now(fd, events)
    }

    fn at_mark(&self, fd: BorrowedFd<'_>) -> io::Result<bool> {
        ferry_sys::at_mark(fd)
    }

    fn recv(&self, fd: BorrowedFd<'_>, buf: &mut [u8], flags: i32) -> io::Result<usize> {
        ferry_sys::recv(fd, buf, flags)
    }

    fn discard(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
        ferry_sys::recv_with_fds(fd, buf, libc::MSG_DONTWAIT).map(|(n, _fds)| n)
    }

    fn send(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
        ferry_sys::send_nosignal(fd, buf)
    }

    fn send_oob(&self, fd: BorrowedFd<'_>, byte: u8) -> io::Result<usize> {
        ferry_sys::send_oob(fd, byte)
    }

    fn unix_oob_works(&self) -> bool {
        ferry_sys::unix_oob_works()
    }

    fn rx_pipe(&self, size: usize) -> Option<(OwnedFd, OwnedFd)> {
        // A splice into a pair whose program end has gone raises SIGPIPE (splice takes
        // no MSG_NOSIGNAL): the process ignores it from now on (the `ferry` binary does
        // from the start).
        let pipe = ferry_sys::pipe_sized(size).ok()?;
        ferry_sys::ignore_sigpipe().ok()?;
        Some(pipe)
    }

    fn splice(&self, from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        ferry_sys::splice(from, to, len)
    }

    fn send_items(
        &self,
        fd: BorrowedFd<'_>,
        items: vec_deque::Iter<'_, TxItem>,
    ) -> io::Result<usize> {
        crate::hostio::send_items(fd, items)
    }

    fn recv_spans(
        &self,
        fd: BorrowedFd<'_>,
        bufs: &Buffers,
        spans: &[BufSpan],
        flags: i32,
        control: Option<&mut [u8]>,
    ) -> io::Result<Received> {
        crate::hostio::recv_spans(fd, bufs, spans, flags, control)
    }

    fn ctl_send(&self, fd: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        ferry_sys::send_with_fds(fd, bytes, fds)
    }
}
