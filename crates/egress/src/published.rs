//! Published ports' host side (`-p [IP:]HOST_PORT:PORT[/udp]`), the only way in: the
//! host socket a published port listens on ([`host_listener`]), one for every path
//! (socket mode's protocol server, nic mode's NIC server), and the hand-off of published
//! TCP connections from socket mode to nic mode ([`TapHandoff`], `--net both`). What a
//! path then does with a connection or datagram is its own.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The listen backlog of a published TCP port (the kernel caps it at `somaxconn`).
pub const BACKLOG: i32 = 1024;

/// Most connections waiting in a [`TapHandoff`] for the NIC server to take them.
pub const HANDOFF_MAX: usize = 1024;

/// A non-blocking host socket listening on `at` (TCP), or bound there (`udp`), with
/// `SO_REUSEADDR`, and the address it is on. `[::]` (`-p`'s default) takes both
/// families (`IPV6_V6ONLY` off, whatever the host's `net.ipv6.bindv6only`), or IPv4
/// alone (0.0.0.0) where the host has no IPv6.
pub fn host_listener(at: SocketAddr, udp: bool) -> io::Result<(OwnedFd, SocketAddr)> {
    listener_with(at, udp, ferry_sys::socket)
}

/// [`host_listener`], making its socket with `socket` (`domain`, `type`, `protocol`).
fn listener_with(
    at: SocketAddr,
    udp: bool,
    socket: impl Fn(i32, i32, i32) -> io::Result<OwnedFd>,
) -> io::Result<(OwnedFd, SocketAddr)> {
    let ty = if udp {
        libc::SOCK_DGRAM
    } else {
        libc::SOCK_STREAM
    } | libc::SOCK_NONBLOCK
        | libc::SOCK_CLOEXEC;
    let any6 = at.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let domain = if at.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let (fd, at) = match socket(domain, ty, 0) {
        Ok(fd) => (fd, at),
        Err(e) if any6 && e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            let v4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), at.port());
            (socket(libc::AF_INET, ty, 0)?, v4)
        }
        Err(e) => return Err(e),
    };
    if at.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        ferry_sys::setsockopt(
            fd.as_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            &0i32.to_ne_bytes(),
        )?;
    }
    ferry_sys::setsockopt(
        fd.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        &1i32.to_ne_bytes(),
    )?;
    ferry_sys::bind(fd.as_fd(), &at)?;
    if !udp {
        ferry_sys::listen(fd.as_fd(), BACKLOG)?;
    }
    Ok((fd, at))
}

/// Connections accepted on published TCP ports that no listener of the shim's is on,
/// passed to nic mode's NIC server (`--net both`), which connects each to the sandbox's
/// address on its port through the TAP: whatever listens there (a static or Go server,
/// or a shimmed one bound to the wildcard) takes it. Open once a NIC server serves it;
/// until then, and after it is closed, connections stay socket mode's. At most
/// [`HANDOFF_MAX`] wait.
#[derive(Debug)]
pub struct TapHandoff {
    queue: Mutex<VecDeque<(OwnedFd, u16)>>,
    /// Signalled for each connection queued.
    wake: OwnedFd,
    open: AtomicBool,
}

impl TapHandoff {
    /// A closed handoff.
    pub fn new() -> io::Result<TapHandoff> {
        Ok(TapHandoff {
            queue: Mutex::new(VecDeque::new()),
            wake: ferry_sys::eventfd()?,
            open: AtomicBool::new(false),
        })
    }

    /// Opens (a NIC server takes connections now) or closes it; closing resets what
    /// still waits.
    pub fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::SeqCst);
        if !open {
            for (conn, _) in self.queue().drain(..) {
                let _ = ferry_sys::linger_reset(conn.as_fd());
            }
        }
    }

    /// The descriptor that becomes readable when connections wait (for epoll).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Takes every waiting connection with its sandbox port.
    pub fn take(&self) -> Vec<(OwnedFd, u16)> {
        let _ = ferry_sys::eventfd_drain(self.wake.as_fd());
        self.queue().drain(..).collect()
    }

    /// Passes `conn` (for sandbox port `port`) on; gives it back when closed or full.
    pub fn send(&self, conn: OwnedFd, port: u16) -> Result<(), OwnedFd> {
        if !self.open.load(Ordering::SeqCst) {
            return Err(conn);
        }
        let mut q = self.queue();
        if q.len() >= HANDOFF_MAX {
            return Err(conn);
        }
        q.push_back((conn, port));
        drop(q);
        let _ = ferry_sys::eventfd_signal(self.wake.as_fd());
        Ok(())
    }

    /// The queue (a thread that panicked holding it left nothing half-done: each
    /// change is one push or one drain).
    fn queue(&self) -> MutexGuard<'_, VecDeque<(OwnedFd, u16)>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6_only(fd: BorrowedFd<'_>) -> i32 {
        ferry_sys::getsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap()
    }

    fn no_ipv6(domain: i32, ty: i32, proto: i32) -> io::Result<OwnedFd> {
        if domain == libc::AF_INET6 {
            return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
        }
        ferry_sys::socket(domain, ty, proto)
    }

    fn ipv6_available() -> bool {
        ferry_sys::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0).is_ok()
    }

    #[test]
    fn the_any_address_takes_both_families() {
        if !ipv6_available() {
            eprintln!("skipped: no IPv6 on this host");
            return;
        }
        let (l, at) = host_listener("[::]:0".parse().unwrap(), false).unwrap();
        assert_eq!(at, "[::]:0".parse().unwrap());
        assert_eq!(v6_only(l.as_fd()), 0);
        let port = ferry_sys::sock_addr(l.as_fd(), false)
            .unwrap()
            .unwrap()
            .port();
        // An IPv4 client reaches it, as an IPv4-mapped peer.
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        ferry_sys::set_nonblocking(l.as_fd(), false).unwrap();
        let (_conn, peer) = ferry_sys::accept4(l.as_fd(), libc::SOCK_CLOEXEC).unwrap();
        let peer = peer.unwrap();
        assert_eq!(peer.ip().to_canonical(), c.local_addr().unwrap().ip());
        // UDP likewise.
        let (u, _) = host_listener("[::]:0".parse().unwrap(), true).unwrap();
        assert_eq!(v6_only(u.as_fd()), 0);
        let port = ferry_sys::sock_addr(u.as_fd(), false)
            .unwrap()
            .unwrap()
            .port();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(b"hello", ("127.0.0.1", port)).unwrap();
        ferry_sys::set_nonblocking(u.as_fd(), false).unwrap();
        let mut buf = [0u8; 8];
        let (n, from) = ferry_sys::recv_from(u.as_fd(), &mut buf).unwrap();
        assert_eq!(
            (&buf[..n], from.map(|f| f.ip().to_canonical())),
            (&b"hello"[..], Some(s.local_addr().unwrap().ip()))
        );
    }

    #[test]
    fn without_ipv6_the_any_address_falls_back_to_ipv4() {
        let (l, at) = listener_with("[::]:0".parse().unwrap(), false, no_ipv6).unwrap();
        assert_eq!(at, "0.0.0.0:0".parse().unwrap());
        let bound = ferry_sys::sock_addr(l.as_fd(), false).unwrap().unwrap();
        assert!(bound.is_ipv4() && bound.port() != 0, "{bound}");
        std::net::TcpStream::connect(("127.0.0.1", bound.port())).unwrap();
        let (u, at) = listener_with("[::]:0".parse().unwrap(), true, no_ipv6).unwrap();
        assert_eq!(at, "0.0.0.0:0".parse().unwrap());
        assert!(
            ferry_sys::sock_addr(u.as_fd(), false)
                .unwrap()
                .unwrap()
                .is_ipv4()
        );
        // Only the any address falls back: a named IPv6 address is an error.
        let e = listener_with("[::1]:0".parse().unwrap(), false, no_ipv6).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAFNOSUPPORT));
    }

    #[test]
    fn listeners_are_non_blocking_and_reusable() {
        let (l, at) = host_listener("127.0.0.1:0".parse().unwrap(), false).unwrap();
        assert_eq!(at, "127.0.0.1:0".parse().unwrap());
        let e = ferry_sys::accept4(l.as_fd(), libc::SOCK_CLOEXEC).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let reuse =
            ferry_sys::getsockopt_int(l.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR).unwrap();
        assert_eq!(reuse, 1);
        // A port in use is an error the caller reports.
        let port = ferry_sys::sock_addr(l.as_fd(), false)
            .unwrap()
            .unwrap()
            .port();
        let taken = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port);
        assert!(host_listener(taken, false).is_err());
    }

    fn conn() -> OwnedFd {
        ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)
            .unwrap()
            .0
    }

    #[test]
    fn the_handoff_passes_connections_only_while_open_and_up_to_its_bound() {
        let h = TapHandoff::new().unwrap();
        assert!(
            h.send(conn(), 80).is_err(),
            "closed until a NIC server serves it"
        );
        h.set_open(true);
        h.send(conn(), 80).unwrap();
        h.send(conn(), 443).unwrap();
        let ports: Vec<u16> = h.take().into_iter().map(|(_, p)| p).collect();
        assert_eq!(ports, [80, 443]);
        assert!(h.take().is_empty());
        for _ in 0..HANDOFF_MAX {
            h.send(conn(), 80).unwrap();
        }
        assert!(h.send(conn(), 80).is_err(), "full");
        // Closing drops (resets) what waits, and refuses what comes.
        h.set_open(false);
        assert!(h.take().is_empty());
        assert!(h.send(conn(), 80).is_err());
    }
}
