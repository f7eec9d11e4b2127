//! COMPAT 8 (IPv6) — TCP and UDP on ::1, v4-mapped addresses on dual-stack sockets,
//! `IPV6_V6ONLY` in both settings.

use super::{Case, Res};
use crate::net::{
    Addr, accept, bind, connect, listen, listener, local_addr, peer_addr, recv_text, recvfrom,
    send, sendto, set_int, tcp_socket, udp_bound, udp_socket,
};
use crate::sys::{Ctx, Fd, show};

pub const CASES: &[Case] = &[
    Case::new("v6.tcp_loopback", tcp_loopback),
    Case::new("v6.udp_loopback", udp_loopback),
    Case::new("v6.v4mapped_accept", v4mapped_accept),
    Case::new("v6.v4mapped_connect", v4mapped_connect),
    Case::new("v6.v6only_rejects_v4", v6only_rejects_v4),
    Case::new("v6.udp_v4mapped_source", udp_v4mapped_source),
    Case::new("v6.dual_stack_bind_conflict", dual_stack_bind_conflict),
    Case::new("v6.flowinfo_scope", flowinfo_scope),
];

/// A TCP port free in both families right now: what a dual-stack `[::]:0` bind picks.
///
/// A `V6ONLY` socket binding port 0 only avoids IPv6 users of a port, so the port it
/// gets may be held on IPv4 (a TIME_WAIT, another program's listener); cases that then
/// use the port over IPv4 pick it this way instead.
fn dual_free_port() -> Result<u16, String> {
    let probe = tcp_socket(libc::AF_INET6).ctx("socket")?;
    set_int(probe.raw(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0).ctx("V6ONLY")?;
    bind(probe.raw(), &Addr::any(libc::AF_INET6, 0)).ctx("bind")?;
    Ok(local_addr(probe.raw()).ctx("getsockname")?.port())
}

/// An AF_INET6 TCP listener on `[::]:P` with `IPV6_V6ONLY` = `v6only`, P free in both
/// families.
fn dual_listener(v6only: bool) -> Result<(Fd, u16), String> {
    let port = dual_free_port()?;
    let l = tcp_socket(libc::AF_INET6).ctx("socket")?;
    set_int(
        l.raw(),
        libc::IPPROTO_IPV6,
        libc::IPV6_V6ONLY,
        v6only.into(),
    )
    .ctx("V6ONLY")?;
    bind(l.raw(), &Addr::any(libc::AF_INET6, port)).ctx("bind")?;
    listen(l.raw(), 16).ctx("listen")?;
    Ok((l, port))
}

fn tcp_loopback() -> Res {
    let (l, addr) = listener(libc::AF_INET6)?;
    let c = tcp_socket(libc::AF_INET6).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let mut peer = Addr::empty();
    let a = Fd::new(sys!(libc::accept(l.raw(), peer.ptr_mut(), peer.len_mut())).ctx("accept")?);
    send(c.raw(), b"over-v6", 0).ctx("send")?;
    Ok(format!(
        "listener={} accepted_peer={} got={}",
        addr.describe(),
        peer.describe(),
        recv_text(a.raw(), 16, 0)
    ))
}

fn udp_loopback() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET6)?;
    let (t, _) = udp_bound(libc::AF_INET6)?;
    sendto(t.raw(), b"dgram6", 0, &raddr).ctx("sendto")?;
    let mut buf = [0u8; 16];
    let (n, from) = recvfrom(r.raw(), &mut buf, 0).ctx("recvfrom")?;
    Ok(format!(
        "recvfrom={n} from={} addrlen={}",
        from.describe(),
        from.len()
    ))
}

fn v4mapped_accept() -> Res {
    let (l, port) = dual_listener(false)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &Addr::loopback(libc::AF_INET, port)).ctx("connect")?;
    let mut peer = Addr::empty();
    let a = Fd::new(sys!(libc::accept(l.raw(), peer.ptr_mut(), peer.len_mut())).ctx("accept")?);
    let local = local_addr(a.raw()).ctx("getsockname")?;
    Ok(format!(
        "accepted_peer={} accepted_local={}",
        peer.describe(),
        local.describe()
    ))
}

fn v4mapped_connect() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET6).ctx("socket")?;
    let mapped = Addr::parse("::ffff:127.0.0.1", addr.port());
    let r = show(connect(c.raw(), &mapped).map(|_| 0));
    let a = accept(l.raw()).ctx("accept")?;
    Ok(format!(
        "connect={r} local={} peer={} server_sees={}",
        show(local_addr(c.raw()).map(|a| a.describe())),
        show(peer_addr(c.raw()).map(|a| a.describe())),
        show(peer_addr(a.raw()).map(|a| a.describe()))
    ))
}

fn v6only_rejects_v4() -> Res {
    let (_l, port) = dual_listener(true)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    let v4 = show(connect(c.raw(), &Addr::loopback(libc::AF_INET, port)).map(|_| 0));
    let c6 = tcp_socket(libc::AF_INET6).ctx("socket")?;
    let v6 = show(connect(c6.raw(), &Addr::loopback(libc::AF_INET6, port)).map(|_| 0));
    Ok(format!("v4_connect={v4} v6_connect={v6}"))
}

fn udp_v4mapped_source() -> Res {
    let r = udp_socket(libc::AF_INET6).ctx("socket")?;
    set_int(r.raw(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0).ctx("V6ONLY")?;
    bind(r.raw(), &Addr::any(libc::AF_INET6, 0)).ctx("bind")?;
    let port = local_addr(r.raw()).ctx("getsockname")?.port();
    let (t, _) = udp_bound(libc::AF_INET)?;
    sendto(t.raw(), b"from-v4", 0, &Addr::loopback(libc::AF_INET, port)).ctx("sendto")?;
    let mut buf = [0u8; 16];
    let (n, from) = recvfrom(r.raw(), &mut buf, 0).ctx("recvfrom")?;
    let reply = show(sendto(r.raw(), b"back", 0, &from));
    Ok(format!(
        "recvfrom={n} from={} reply={reply} v4_got={}",
        from.describe(),
        recv_text(t.raw(), 8, 0)
    ))
}

fn dual_stack_bind_conflict() -> Res {
    let mut out = Vec::new();
    for v6only in [false, true] {
        let (_l, port) = dual_listener(v6only)?;
        let s4 = tcp_socket(libc::AF_INET).ctx("socket")?;
        let r = show(bind(s4.raw(), &Addr::any(libc::AF_INET, port)).map(|_| 0));
        out.push(format!("v6only={} v4_bind_same_port={r}", u8::from(v6only)));
    }
    Ok(out.join(" "))
}

fn flowinfo_scope() -> Res {
    let (l, addr) = listener(libc::AF_INET6)?;
    let c = tcp_socket(libc::AF_INET6).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let _a = accept(l.raw()).ctx("accept")?;
    let peer = peer_addr(c.raw()).ctx("getpeername")?;
    match peer.socket_addr() {
        Some(std::net::SocketAddr::V6(v6)) => Ok(format!(
            "flowinfo={} scope_id={} len={}",
            v6.flowinfo(),
            v6.scope_id(),
            peer.len()
        )),
        other => Ok(format!("unexpected {other:?}")),
    }
}
