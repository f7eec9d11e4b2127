//! Socket addresses and the set-ups most cases start from: a loopback listener on an
//! ephemeral port, a connected TCP pair, a bound UDP socket, a port nobody listens on.
//!
//! Everything is on 127.0.0.1 or ::1 in the caller's own network namespace; ports are
//! always ephemeral (bind port 0, then `getsockname`) and never printed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{c_int, c_void, socklen_t};

use crate::sys::{Ctx, Errno, Fd, zeroed};

/// A socket address in a `sockaddr_storage`, with its length.
#[derive(Clone, Copy)]
pub struct Addr {
    storage: libc::sockaddr_storage,
    len: socklen_t,
}

impl Addr {
    /// An empty buffer for calls that fill in an address.
    pub fn empty() -> Addr {
        Addr {
            storage: zeroed(),
            len: size_of::<libc::sockaddr_storage>() as socklen_t,
        }
    }

    /// From a std address (used only as a value type; all I/O goes through libc).
    pub fn from_std(sa: SocketAddr) -> Addr {
        let mut a = Addr::empty();
        match sa {
            SocketAddr::V4(v4) => {
                let mut sin: libc::sockaddr_in = zeroed();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
                a.set(sin);
            }
            SocketAddr::V6(v6) => {
                let mut sin6: libc::sockaddr_in6 = zeroed();
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr.s6_addr = v6.ip().octets();
                sin6.sin6_scope_id = v6.scope_id();
                a.set(sin6);
            }
        }
        a
    }

    fn set<T: Copy>(&mut self, sa: T) {
        const { assert!(size_of::<T>() <= size_of::<libc::sockaddr_storage>()) };
        const { assert!(align_of::<T>() <= align_of::<libc::sockaddr_storage>()) };
        // SAFETY: `T` fits in the storage and needs no more alignment than it (both
        // asserted at compile time above; `T` is sockaddr_in or sockaddr_in6), and
        // `write` does not read or drop the bytes it replaces.
        unsafe { std::ptr::write((&raw mut self.storage).cast::<T>(), sa) };
        self.len = size_of::<T>() as socklen_t;
    }

    /// The loopback address of `family` (127.0.0.1 or ::1) with `port`.
    pub fn loopback(family: c_int, port: u16) -> Addr {
        if family == libc::AF_INET6 {
            Addr::from_std(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port))
        } else {
            Addr::from_std(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port))
        }
    }

    /// The wildcard address of `family` (0.0.0.0 or ::) with `port`.
    pub fn any(family: c_int, port: u16) -> Addr {
        if family == libc::AF_INET6 {
            Addr::from_std(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port))
        } else {
            Addr::from_std(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port))
        }
    }

    /// Parses `"127.0.0.1"` or `"::ffff:127.0.0.1"` plus a port.
    pub fn parse(ip: &str, port: u16) -> Addr {
        let ip: IpAddr = ip.parse().expect("literal address");
        Addr::from_std(SocketAddr::new(ip, port))
    }

    /// Copies `len` bytes of a `sockaddr` (from `getaddrinfo`, `recvmsg`, …).
    ///
    /// # Safety
    /// `sa` must be readable for `len` bytes (at most a `sockaddr_storage` are read).
    pub unsafe fn from_raw(sa: *const libc::sockaddr, len: socklen_t) -> Addr {
        let mut a = Addr::empty();
        let n = (len as usize).min(size_of::<libc::sockaddr_storage>());
        // SAFETY: `n <= len` bytes at `sa` are readable (# Safety); `n` is at most the
        // size of `a.storage`, a local the source cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(sa.cast::<u8>(), (&raw mut a.storage).cast(), n) };
        a.len = len;
        a
    }

    pub fn ptr(&self) -> *const libc::sockaddr {
        (&raw const self.storage).cast()
    }

    pub fn ptr_mut(&mut self) -> *mut libc::sockaddr {
        (&raw mut self.storage).cast()
    }

    pub fn len(&self) -> socklen_t {
        self.len
    }

    pub fn len_mut(&mut self) -> &mut socklen_t {
        &mut self.len
    }

    pub fn family(&self) -> c_int {
        c_int::from(self.storage.ss_family)
    }

    /// As a std value, for address families that have one.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self.family() {
            libc::AF_INET => {
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in,
                // whose fields are integers: any bytes the storage holds are a valid one
                // (the family says they are meant as one).
                let sin = unsafe { *self.ptr().cast::<libc::sockaddr_in>() };
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)).into())
            }
            libc::AF_INET6 => {
                // SAFETY: as above, for sockaddr_in6 (integers and byte arrays only).
                let sin6 = unsafe { *self.ptr().cast::<libc::sockaddr_in6>() };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                let port = u16::from_be(sin6.sin6_port);
                Some(SocketAddrV6::new(ip, port, sin6.sin6_flowinfo, sin6.sin6_scope_id).into())
            }
            _ => None,
        }
    }

    /// The port (0 for non-IP families).
    pub fn port(&self) -> u16 {
        self.socket_addr().map_or(0, |s| s.port())
    }

    /// `AF_INET 127.0.0.1 port>0` — family, address and whether a port is set, never
    /// the port itself (ephemeral ports differ between runs).
    pub fn describe(&self) -> String {
        match self.socket_addr() {
            Some(s) => {
                let port = if s.port() > 0 { "port>0" } else { "port=0" };
                format!("{} {} {port}", family_name(self.family()), s.ip())
            }
            None => format!("{} len={}", family_name(self.family()), self.len),
        }
    }

    /// Just the IP address as text.
    pub fn ip(&self) -> String {
        self.socket_addr()
            .map_or_else(|| "-".to_string(), |s| s.ip().to_string())
    }
}

/// `AF_INET`, `AF_INET6`, …
pub fn family_name(f: c_int) -> String {
    match f {
        libc::AF_INET => "AF_INET".into(),
        libc::AF_INET6 => "AF_INET6".into(),
        libc::AF_UNIX => "AF_UNIX".into(),
        libc::AF_NETLINK => "AF_NETLINK".into(),
        libc::AF_UNSPEC => "AF_UNSPEC".into(),
        other => format!("family{other}"),
    }
}

pub fn socket(domain: c_int, ty: c_int, proto: c_int) -> Result<Fd, Errno> {
    sys!(libc::socket(domain, ty, proto)).map(Fd::new)
}

pub fn tcp_socket(family: c_int) -> Result<Fd, Errno> {
    socket(family, libc::SOCK_STREAM, 0)
}

pub fn udp_socket(family: c_int) -> Result<Fd, Errno> {
    socket(family, libc::SOCK_DGRAM, 0)
}

pub fn bind(fd: c_int, a: &Addr) -> Result<(), Errno> {
    sys!(libc::bind(fd, a.ptr(), a.len())).map(drop)
}

pub fn connect(fd: c_int, a: &Addr) -> Result<(), Errno> {
    sys!(libc::connect(fd, a.ptr(), a.len())).map(drop)
}

pub fn listen(fd: c_int, backlog: c_int) -> Result<(), Errno> {
    sys!(libc::listen(fd, backlog)).map(drop)
}

pub fn accept(fd: c_int) -> Result<Fd, Errno> {
    sys!(libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut())).map(Fd::new)
}

pub fn local_addr(fd: c_int) -> Result<Addr, Errno> {
    let mut a = Addr::empty();
    sys!(libc::getsockname(fd, a.ptr_mut(), a.len_mut()))?;
    Ok(a)
}

pub fn peer_addr(fd: c_int) -> Result<Addr, Errno> {
    let mut a = Addr::empty();
    sys!(libc::getpeername(fd, a.ptr_mut(), a.len_mut()))?;
    Ok(a)
}

/// A TCP listener on the loopback address of `family`, ephemeral port, backlog 128.
pub fn listener(family: c_int) -> Result<(Fd, Addr), String> {
    let fd = tcp_socket(family).ctx("socket")?;
    bind(fd.raw(), &Addr::loopback(family, 0)).ctx("bind")?;
    listen(fd.raw(), 128).ctx("listen")?;
    let addr = local_addr(fd.raw()).ctx("getsockname")?;
    Ok((fd, addr))
}

/// A connected TCP pair over loopback: (client, accepted server side).
pub fn tcp_pair(family: c_int) -> Result<(Fd, Fd), String> {
    let (l, addr) = listener(family)?;
    let c = tcp_socket(family).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let s = accept(l.raw()).ctx("accept")?;
    Ok((c, s))
}

/// A UDP socket bound to the loopback address of `family`, ephemeral port.
pub fn udp_bound(family: c_int) -> Result<(Fd, Addr), String> {
    let fd = udp_socket(family).ctx("socket")?;
    bind(fd.raw(), &Addr::loopback(family, 0)).ctx("bind")?;
    let addr = local_addr(fd.raw()).ctx("getsockname")?;
    Ok((fd, addr))
}

/// Makes and closes a connected TCP pair and a UDP socket, so that whatever a socket
/// layer sets up once per process (a shim's channel to its server, with a few fds of its
/// own) exists before a case starts counting fds or lowering `RLIMIT_NOFILE`. Those
/// cases are about per-socket fds, not one-time set-up.
pub fn warm_up() -> Result<(), String> {
    let pair = tcp_pair(libc::AF_INET)?;
    let udp = udp_socket(libc::AF_INET6).ctx("socket")?;
    drop((pair, udp));
    Ok(())
}

/// A loopback address with a port that had a socket a moment ago and has none now.
pub fn closed_port(family: c_int) -> Result<Addr, String> {
    let (_l, addr) = listener(family)?;
    Ok(addr)
}

pub fn send(fd: c_int, buf: &[u8], flags: c_int) -> Result<usize, Errno> {
    sys!(libc::send(fd, buf.as_ptr().cast(), buf.len(), flags)).map(|n| n as usize)
}

pub fn recv(fd: c_int, buf: &mut [u8], flags: c_int) -> Result<usize, Errno> {
    sys!(libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags)).map(|n| n as usize)
}

pub fn sendto(fd: c_int, buf: &[u8], flags: c_int, to: &Addr) -> Result<usize, Errno> {
    let r = sys!(libc::sendto(
        fd,
        buf.as_ptr().cast(),
        buf.len(),
        flags,
        to.ptr(),
        to.len()
    ));
    r.map(|n| n as usize)
}

pub fn recvfrom(fd: c_int, buf: &mut [u8], flags: c_int) -> Result<(usize, Addr), Errno> {
    let mut from = Addr::empty();
    let p = buf.as_mut_ptr().cast();
    let n = sys!(libc::recvfrom(
        fd,
        p,
        buf.len(),
        flags,
        from.ptr_mut(),
        from.len_mut()
    ))?;
    Ok((n as usize, from))
}

/// Sends all of `buf` (blocking socket), retrying short writes.
pub fn send_all(fd: c_int, mut buf: &[u8]) -> Result<(), String> {
    while !buf.is_empty() {
        let n = send(fd, buf, libc::MSG_NOSIGNAL).ctx("send")?;
        buf = &buf[n..];
    }
    Ok(())
}

/// Receives exactly `n` bytes (blocking socket); short on EOF.
pub fn recv_exact(fd: c_int, n: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let k = recv(fd, &mut out[got..], 0).ctx("recv")?;
        if k == 0 {
            break;
        }
        got += k;
    }
    out.truncate(got);
    Ok(out)
}

/// One `recv` of up to `max` bytes, shown as `"text"`, `EOF` or the errno name.
pub fn recv_text(fd: c_int, max: usize, flags: c_int) -> String {
    let mut buf = vec![0u8; max];
    match recv(fd, &mut buf, flags) {
        Ok(0) => "EOF".into(),
        Ok(n) => format!("{:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) => e.to_string(),
    }
}

pub fn setsockopt<T: Copy>(fd: c_int, level: c_int, name: c_int, v: &T) -> Result<(), Errno> {
    let p = (v as *const T).cast::<c_void>();
    sys!(libc::setsockopt(
        fd,
        level,
        name,
        p,
        size_of::<T>() as socklen_t
    ))
    .map(drop)
}

pub fn set_int(fd: c_int, level: c_int, name: c_int, v: c_int) -> Result<(), Errno> {
    setsockopt(fd, level, name, &v)
}

pub fn get_int(fd: c_int, level: c_int, name: c_int) -> Result<c_int, Errno> {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    sys!(libc::getsockopt(
        fd,
        level,
        name,
        (&raw mut v).cast(),
        &mut len
    ))?;
    Ok(v)
}

/// `SO_ERROR` as an errno name (`0` for none).
pub fn so_error(fd: c_int) -> String {
    match get_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
        Ok(0) => "0".into(),
        Ok(e) => Errno(e).to_string(),
        Err(e) => format!("getsockopt={e}"),
    }
}

/// Bytes queued for reading (`FIONREAD`).
pub fn fionread(fd: c_int) -> Result<c_int, Errno> {
    let mut n: c_int = 0;
    sys!(libc::ioctl(fd, libc::FIONREAD, &mut n))?;
    Ok(n)
}

/// `SIOCATMARK` (not in the libc crate): at the urgent mark?
const SIOCATMARK: libc::Ioctl = 0x8905;

/// `ioctl(SIOCATMARK)`: 1 when the stream's next byte is its urgent mark, else 0.
pub fn at_mark(fd: c_int) -> Result<c_int, Errno> {
    let mut v: c_int = -1;
    sys!(libc::ioctl(fd, SIOCATMARK, &mut v))?;
    Ok(v)
}

/// Polls one fd; returns its `revents`.
pub fn poll1(fd: c_int, events: i16, timeout_ms: c_int) -> Result<i16, Errno> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    sys!(libc::poll(&mut p, 1, timeout_ms))?;
    Ok(p.revents)
}

/// Waits (up to 2 s) until `fd` reports any of `events`; returns the final revents.
pub fn wait_for(fd: c_int, events: i16) -> Result<i16, Errno> {
    poll1(fd, events, 2000)
}

/// Sends with `MSG_DONTWAIT` until `EAGAIN`; returns the byte total.
pub fn fill_send_buffer(fd: c_int) -> Result<usize, String> {
    let chunk = vec![0x5au8; 65536];
    let mut total = 0;
    loop {
        match send(fd, &chunk, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
            Ok(n) => total += n,
            Err(e) if e.0 == libc::EAGAIN => return Ok(total),
            Err(e) => return Err(format!("send={e}")),
        }
    }
}

/// Fills `fd`'s send buffer until a send fails with `EAGAIN` and the socket then stays
/// unwritable for 200 ms (what is in flight may still make room just after the first
/// `EAGAIN`); returns the byte total.
pub fn fill_until_unwritable(fd: c_int) -> Result<usize, String> {
    let mut total = fill_send_buffer(fd)?;
    for _ in 0..50 {
        match poll1(fd, libc::POLLOUT, 200) {
            Ok(0) => return Ok(total),
            Ok(_) => total += fill_send_buffer(fd)?,
            Err(e) => return Err(format!("poll={e}")),
        }
    }
    Err("still writable after 50 fills".into())
}

/// Receives with `MSG_DONTWAIT` until `EAGAIN`; returns the byte total.
pub fn drain(fd: c_int) -> Result<usize, String> {
    let mut buf = vec![0u8; 65536];
    let mut total = 0;
    loop {
        match recv(fd, &mut buf, libc::MSG_DONTWAIT) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n,
            Err(e) if e.0 == libc::EAGAIN => return Ok(total),
            Err(e) => return Err(format!("recv={e}")),
        }
    }
}
