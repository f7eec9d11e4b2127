//! COMPAT 3/8 (errors) — the errno for each misuse must be the kernel's: ports in use,
//! fds that are not sockets or not open, unconnected sockets, bad lengths, families,
//! types and protocols, calls in the wrong state.

use libc::c_int;

use super::{Case, Res};
use crate::net::{
    Addr, accept, bind, connect, get_int, listen, listener, local_addr, peer_addr, send, set_int,
    socket, tcp_pair, tcp_socket, udp_bound, udp_socket,
};
use crate::net::{poll1, recv_text, so_error};
use crate::sys::{Ctx, Fd, dev_null, pipe, set_nonblocking, show};

pub const CASES: &[Case] = &[
    Case::new("err.bind_in_use", bind_in_use),
    Case::new("err.enotsock_pipe_and_file", enotsock_pipe_and_file),
    Case::new("err.ebadf_closed_fd", ebadf_closed_fd),
    Case::new("err.unconnected_tcp", unconnected_tcp),
    Case::new("err.connect_twice_eisconn", connect_twice_eisconn),
    Case::new("err.getpeername_enotconn", getpeername_enotconn),
    Case::new("err.invalid_addrlen", invalid_addrlen),
    Case::new("err.wrong_family", wrong_family),
    Case::new("err.listen_on_udp", listen_on_udp),
    Case::new("err.accept_not_listening", accept_not_listening),
    Case::new("err.socket_bad_args", socket_bad_args),
    Case::new("err.bind_twice", bind_twice),
    Case::new("err.shutdown_errors", shutdown_errors),
    Case::new("err.bind_nonlocal", bind_nonlocal),
    Case::new("err.connect_on_listener", connect_on_listener),
    Case::new("err.reconnect_after_refused", reconnect_after_refused),
    Case::new(
        "err.reconnect_after_refused_nonblocking",
        reconnect_after_refused_nonblocking,
    ),
];

fn bind_in_use() -> Res {
    let (_l, addr) = listener(libc::AF_INET)?;
    let t = tcp_socket(libc::AF_INET).ctx("socket")?;
    let tcp = show(bind(t.raw(), &addr).map(|_| 0));
    let (_u, uaddr) = udp_bound(libc::AF_INET6)?;
    let u2 = udp_socket(libc::AF_INET6).ctx("socket")?;
    let udp = show(bind(u2.raw(), &uaddr).map(|_| 0));
    Ok(format!(
        "tcp={tcp} udp6={udp} udp_on_tcp_port={}",
        udp_on_tcp_port()?
    ))
}

/// TCP and UDP ports are separate: a UDP socket may bind a TCP listener's port. (A few
/// tries, since some other UDP socket on the machine may happen to hold that number.)
fn udp_on_tcp_port() -> Res {
    let mut last = String::new();
    for _ in 0..10 {
        let (_l, addr) = listener(libc::AF_INET)?;
        let u = udp_socket(libc::AF_INET).ctx("socket")?;
        match bind(u.raw(), &addr) {
            Ok(()) => return Ok("0".into()),
            Err(e) => last = e.to_string(),
        }
    }
    Ok(last)
}

/// Every socket call on `fd`, as `name=result` pairs.
fn all_calls(fd: c_int) -> String {
    let a = Addr::loopback(libc::AF_INET, 9);
    let mut buf = [0u8; 4];
    let r = [
        ("send", show(send(fd, b"x", libc::MSG_NOSIGNAL))),
        (
            "recv",
            show(crate::net::recv(fd, &mut buf, libc::MSG_DONTWAIT)),
        ),
        ("connect", show(connect(fd, &a).map(|_| 0))),
        ("bind", show(bind(fd, &a).map(|_| 0))),
        ("listen", show(listen(fd, 1).map(|_| 0))),
        ("accept", show(accept(fd).map(|_| 0))),
        (
            "getsockopt",
            show(get_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)),
        ),
        (
            "setsockopt",
            show(set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).map(|_| 0)),
        ),
        ("getsockname", show(local_addr(fd).map(|_| 0))),
        ("getpeername", show(peer_addr(fd).map(|_| 0))),
        ("shutdown", show(sys!(libc::shutdown(fd, libc::SHUT_RDWR)))),
    ];
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    // Group equal results: "send,recv,…=ENOTSOCK".
    while i < r.len() {
        let mut names = vec![r[i].0];
        let mut j = i + 1;
        while j < r.len() && r[j].1 == r[i].1 {
            names.push(r[j].0);
            j += 1;
        }
        out.push(format!("{}={}", names.join(","), r[i].1));
        i = j;
    }
    out.join(" ")
}

fn enotsock_pipe_and_file() -> Res {
    let (p, _w) = pipe(0).ctx("pipe")?;
    let f = dev_null().ctx("open")?;
    Ok(format!(
        "pipe: {}; /dev/null: {}",
        all_calls(p.raw()),
        all_calls(f.raw())
    ))
}

fn ebadf_closed_fd() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let fd = s.raw();
    drop(s);
    Ok(format!(
        "closed: {}; fd=-1: {}",
        all_calls(fd),
        all_calls(-1)
    ))
}

fn unconnected_tcp() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let mut buf = [0u8; 4];
    let recv = show(crate::net::recv(s.raw(), &mut buf, 0));
    let send = show(send(s.raw(), b"x", libc::MSG_NOSIGNAL));
    let read = show(sys!(libc::read(s.raw(), buf.as_mut_ptr().cast(), 4)));
    Ok(format!("recv={recv} send={send} read={read}"))
}

fn connect_twice_eisconn() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    let first = show(connect(c.raw(), &addr).map(|_| 0));
    let second = show(connect(c.raw(), &addr).map(|_| 0));
    let other = show(connect(c.raw(), &Addr::loopback(libc::AF_INET, 9)).map(|_| 0));
    drop(l);
    Ok(format!("connect={first} again={second} elsewhere={other}"))
}

fn getpeername_enotconn() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let (l, _) = listener(libc::AF_INET)?;
    let (u, _) = udp_bound(libc::AF_INET)?;
    Ok(format!(
        "fresh={} listener={} udp={}",
        show(peer_addr(s.raw()).map(|_| 0)),
        show(peer_addr(l.raw()).map(|_| 0)),
        show(peer_addr(u.raw()).map(|_| 0))
    ))
}

fn invalid_addrlen() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let a = Addr::loopback(libc::AF_INET, 0);
    let bind3 = show(sys!(libc::bind(s.raw(), a.ptr(), 3)));
    let connect0 = show(sys!(libc::connect(s.raw(), a.ptr(), 0)));
    let s6 = tcp_socket(libc::AF_INET6).ctx("socket")?;
    let a6 = Addr::loopback(libc::AF_INET6, 0);
    let bind6_short = show(sys!(libc::bind(s6.raw(), a6.ptr(), 16)));
    let mut short: libc::socklen_t = 0;
    let mut dummy = [0u8; 4];
    let p = dummy.as_mut_ptr().cast();
    let bad_len = show(sys!(libc::getsockname(s.raw(), p, &mut short)).map(|_| short));
    Ok(format!(
        "bind(len=3)={bind3} connect(len=0)={connect0} bind6(len=16)={bind6_short} getsockname(len=0)={bad_len}"
    ))
}

fn wrong_family() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let six = Addr::loopback(libc::AF_INET6, 0);
    let bind6on4 = show(bind(s.raw(), &six).map(|_| 0));
    let s6 = tcp_socket(libc::AF_INET6).ctx("socket")?;
    let (_l, addr4) = listener(libc::AF_INET)?;
    let connect4on6 = show(connect(s6.raw(), &addr4).map(|_| 0));
    Ok(format!(
        "bind_v6_addr_on_v4={bind6on4} connect_v4_addr_on_v6={connect4on6}"
    ))
}

fn listen_on_udp() -> Res {
    let (u, _) = udp_bound(libc::AF_INET)?;
    Ok(format!(
        "listen={} accept={}",
        show(listen(u.raw(), 1).map(|_| 0)),
        show(accept(u.raw()).map(|_| 0))
    ))
}

fn accept_not_listening() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let (c, _s2) = tcp_pair(libc::AF_INET)?;
    Ok(format!(
        "fresh={} connected={}",
        show(accept(s.raw()).map(|_| 0)),
        show(accept(c.raw()).map(|_| 0))
    ))
}

fn socket_bad_args() -> Res {
    let r = |d, t, p| show(socket(d, t, p).map(|_| 0));
    Ok(format!(
        "domain={} type={} stream_udp={} dgram_tcp={} bad_flag={}",
        r(9999, libc::SOCK_STREAM, 0),
        r(libc::AF_INET, 99, 0),
        r(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_UDP),
        r(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_TCP),
        r(libc::AF_INET, libc::SOCK_STREAM | 0x4000_0000, 0)
    ))
}

fn bind_twice() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let first = show(bind(s.raw(), &Addr::loopback(libc::AF_INET, 0)).map(|_| 0));
    let second = show(bind(s.raw(), &Addr::loopback(libc::AF_INET, 0)).map(|_| 0));
    Ok(format!("bind={first} again={second}"))
}

fn shutdown_errors() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let (c, _s2) = tcp_pair(libc::AF_INET)?;
    Ok(format!(
        "unconnected={} bad_how={}",
        show(sys!(libc::shutdown(s.raw(), libc::SHUT_WR))),
        show(sys!(libc::shutdown(c.raw(), 7)))
    ))
}

fn bind_nonlocal() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let doc = Addr::parse("192.0.2.1", 0);
    let plain = show(bind(s.raw(), &doc).map(|_| 0));
    let f = tcp_socket(libc::AF_INET).ctx("socket")?;
    set_int(f.raw(), libc::IPPROTO_IP, libc::IP_FREEBIND, 1).ctx("IP_FREEBIND")?;
    let freebind = show(bind(f.raw(), &doc).map(|_| 0));
    Ok(format!(
        "bind_192.0.2.1={plain} with_IP_FREEBIND={freebind}"
    ))
}

fn connect_on_listener() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    Ok(format!(
        "connect_listener={} listen_connected={}",
        show(connect(l.raw(), &addr).map(|_| 0)),
        show(listen(c.raw(), 1).map(|_| 0))
    ))
}

/// A port that is bound but not yet listening: connects to it are refused.
fn not_listening(family: c_int) -> Result<(Fd, Addr), String> {
    let l = tcp_socket(family).ctx("socket")?;
    bind(l.raw(), &Addr::loopback(family, 0)).ctx("bind")?;
    let addr = local_addr(l.raw()).ctx("getsockname")?;
    Ok((l, addr))
}

/// Connects `c` to `l` (now listening) and passes a few bytes each way.
fn talk(c: c_int, l: c_int) -> String {
    let a = match accept(l) {
        Ok(a) => a,
        Err(e) => return format!("accept={e}"),
    };
    let there = send(c, b"hi", 0).map_or_else(|e| e.to_string(), |_| recv_text(a.raw(), 2, 0));
    let back = send(a.raw(), b"yo", 0).map_or_else(|e| e.to_string(), |_| recv_text(c, 2, 0));
    format!("there={there} back={back}")
}

// A blocking connect refused, then the listener comes up: the same socket's second
// connect succeeds (the kernel puts a socket whose blocking connect failed back to
// unconnected), as asyncio's and many clients' retry loops expect.
fn reconnect_after_refused() -> Res {
    let (l, addr) = not_listening(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    let first = show(connect(c.raw(), &addr).map(|_| 0));
    listen(l.raw(), 4).ctx("listen")?;
    let second = show(connect(c.raw(), &addr).map(|_| 0));
    let third = show(connect(c.raw(), &addr).map(|_| 0));
    Ok(format!(
        "first={first} second={second} third={third} {}",
        talk(c.raw(), l.raw())
    ))
}

// A non-blocking connect refused: the next connect reports the failure (its error, or
// ECONNABORTED once SO_ERROR has taken it) and puts the socket back to unconnected; the
// one after that starts over, and connects once the listener is up.
fn reconnect_after_refused_nonblocking() -> Res {
    let mut out = Vec::new();
    for read_error in [false, true] {
        let (l, addr) = not_listening(libc::AF_INET)?;
        let c = tcp_socket(libc::AF_INET).ctx("socket")?;
        set_nonblocking(c.raw(), true).ctx("nonblock")?;
        let first = show(connect(c.raw(), &addr).map(|_| 0));
        let ev = poll1(c.raw(), libc::POLLOUT, 2000).ctx("poll")?;
        let err = if read_error {
            so_error(c.raw())
        } else {
            "-".into()
        };
        let second = show(connect(c.raw(), &addr).map(|_| 0));
        listen(l.raw(), 4).ctx("listen")?;
        let third = show(connect(c.raw(), &addr).map(|_| 0));
        let ev3 = poll1(c.raw(), libc::POLLOUT, 2000).ctx("poll")?;
        let err3 = so_error(c.raw());
        set_nonblocking(c.raw(), false).ctx("blocking")?;
        out.push(format!(
            "[first={first} pollout={} so_error={err} second={second} third={third} pollout={} so_error={err3} {}]",
            ev & libc::POLLOUT != 0,
            ev3 & libc::POLLOUT != 0,
            talk(c.raw(), l.raw())
        ));
    }
    Ok(out.join(" "))
}
