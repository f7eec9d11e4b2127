//! The host I/O seam: every call a NIC server makes on a host socket goes through
//! [`HostIo`]. [`Sys`] is the real one (a thin layer over `ferry-sys`); the fake of
//! [`crate::testkit`] models host sockets in memory, so that the flows' rules can be
//! tested in-process, without threads or kernel sockets (`tests/flows.rs`).
//!
//! Owns: the list of calls and their meaning (each behaves as the system call of the
//! same name on a non-blocking socket; an error is the kernel's, `WouldBlock` meaning
//! `EAGAIN`). Must not: decide anything, or keep state about sockets (the fake does, as
//! the kernel would). The event loop's own plumbing (epoll, the stop eventfd, the
//! handoff's eventfd) stays outside: it is not flow logic.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};

/// The calls on host sockets (see the module's header).
pub trait HostIo: Send + Sync + fmt::Debug {
    /// `socket(domain, ty | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol)` in the host's
    /// namespace: a TCP or UDP socket, or a ping socket (`SOCK_DGRAM`, `IPPROTO_ICMP` or
    /// `IPPROTO_ICMPV6`).
    fn socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd>;
    fn bind(&self, fd: BorrowedFd<'_>, at: &SocketAddr) -> io::Result<()>;
    /// `connect`: `Err(EINPROGRESS)` while a stream's connect is under way.
    fn connect(&self, fd: BorrowedFd<'_>, to: &SocketAddr) -> io::Result<()>;
    /// `SO_ERROR`: how a connect that was under way ended (0: connected).
    fn connect_result(&self, fd: BorrowedFd<'_>) -> io::Result<i32>;
    /// `TCP_NODELAY` on.
    fn no_delay(&self, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// `send(MSG_NOSIGNAL)`.
    fn send(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize>;
    /// `recv(MSG_DONTWAIT)`: 0 is the end of a stream.
    fn recv(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize>;
    /// `shutdown(SHUT_WR)`: the peer reads the end of the stream.
    fn shutdown_write(&self, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// `SO_LINGER` 0: the close that follows resets the connection.
    fn linger_reset(&self, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// A non-blocking TCP listener on `at` for a published port: what
    /// [`ferry_egress::host_listener`] makes (`SO_REUSEADDR`; `[::]` takes both families,
    /// or falls back to 0.0.0.0 on a host without IPv6).
    fn listener(&self, at: &SocketAddr) -> io::Result<OwnedFd>;
    /// `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`: the connection and its peer.
    fn accept(&self, fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, Option<SocketAddr>)>;
    /// `getpeername`.
    fn peer(&self, fd: BorrowedFd<'_>) -> io::Result<Option<SocketAddr>>;
}

/// The real [`HostIo`]: the system calls, through `ferry-sys`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sys;

impl HostIo for Sys {
    fn socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
        ferry_sys::socket(
            domain,
            ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            protocol,
        )
    }

    fn bind(&self, fd: BorrowedFd<'_>, at: &SocketAddr) -> io::Result<()> {
        ferry_sys::bind(fd, at)
    }

    fn connect(&self, fd: BorrowedFd<'_>, to: &SocketAddr) -> io::Result<()> {
        ferry_sys::connect(fd, to)
    }

    fn connect_result(&self, fd: BorrowedFd<'_>) -> io::Result<i32> {
        ferry_sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)
    }

    fn no_delay(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        ferry_sys::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &1i32.to_ne_bytes(),
        )
    }

    fn send(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
        ferry_sys::send_nosignal(fd, buf)
    }

    fn recv(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
        ferry_sys::recv(fd, buf, libc::MSG_DONTWAIT)
    }

    fn shutdown_write(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        ferry_sys::shutdown(fd, libc::SHUT_WR)
    }

    fn linger_reset(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        ferry_sys::linger_reset(fd)
    }

    fn listener(&self, at: &SocketAddr) -> io::Result<OwnedFd> {
        ferry_egress::host_listener(*at, false).map(|(fd, _)| fd)
    }

    fn accept(&self, fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
        ferry_sys::accept4(fd, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
    }

    fn peer(&self, fd: BorrowedFd<'_>) -> io::Result<Option<SocketAddr>> {
        ferry_sys::sock_addr(fd, true)
    }
}
