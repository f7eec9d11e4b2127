//! COMPAT 7 — socket options forwarded both ways: reuse, Nagle, keepalive, buffer
//! sizes, `TCP_INFO`, `TCP_CONGESTION`, the read-only identity options, and the errors
//! for unknown options and short lengths.
//!
//! Values the kernel picks (buffer sizes, MSS) are printed as relations: "doubled",
//! "mss>0".

use libc::c_int;

use super::{Case, Res};
use crate::flags::{proto_name, socktype_name, tcp_state_name};
use crate::net::{
    Addr, bind, connect, family_name, get_int, listen, listener, poll1, send, set_int, setsockopt,
    socket, tcp_pair, tcp_socket, udp_socket, wait_for,
};
use crate::sys::{Ctx, Errno, Fd, show, zeroed};

pub const CASES: &[Case] = &[
    Case::new("opt.so_reuseaddr", so_reuseaddr),
    Case::new(
        "opt.so_reuseaddr_time_wait_rebind",
        so_reuseaddr_time_wait_rebind,
    ),
    Case::new("opt.so_reuseport_two_listeners", so_reuseport_two_listeners),
    Case::new("opt.tcp_nodelay", tcp_nodelay),
    Case::new("opt.keepalive", keepalive),
    Case::new("opt.so_rcvbuf_doubled", so_rcvbuf_doubled),
    Case::new("opt.so_sndbuf_doubled", so_sndbuf_doubled),
    Case::new("opt.tcp_info_states", tcp_info_states),
    Case::new("opt.tcp_congestion", tcp_congestion),
    Case::new("opt.so_type_domain_protocol", so_type_domain_protocol),
    Case::new("opt.so_acceptconn", so_acceptconn),
    Case::new("opt.so_error_fresh", so_error_fresh),
    Case::new("opt.so_linger", so_linger),
    Case::new("opt.ip_tos_and_tclass", ip_tos_and_tclass),
    Case::new("opt.ipv6_v6only", ipv6_v6only),
    Case::new("opt.tcp_maxseg", tcp_maxseg),
    Case::new("opt.unknown_and_short", unknown_and_short),
    Case::new("opt.so_rcvlowat", so_rcvlowat),
    Case::new("opt.ip_ttl", ip_ttl),
    Case::new("opt.so_broadcast", so_broadcast),
    Case::new("opt.tcp_user_timeout_and_cork", tcp_user_timeout_and_cork),
];

/// `get=set-result→get` for an int option: `0→1`.
fn flip(fd: c_int, level: c_int, name: c_int, v: c_int) -> String {
    let before = show(get_int(fd, level, name));
    let set = set_int(fd, level, name, v);
    let after = show(get_int(fd, level, name));
    match set {
        Ok(()) => format!("{before}→{after}"),
        Err(e) => format!("{before} set={e}"),
    }
}

fn so_reuseaddr() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let u = udp_socket(libc::AF_INET6).ctx("socket")?;
    Ok(format!(
        "tcp={} udp6={}",
        flip(s.raw(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1),
        flip(u.raw(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)
    ))
}

/// A server that closes first leaves TIME_WAIT on its port; rebinding needs
/// SO_REUSEADDR on both the old listener (inherited by accepted sockets) and the new one.
fn so_reuseaddr_time_wait_rebind() -> Res {
    let l = tcp_socket(libc::AF_INET).ctx("socket")?;
    set_int(l.raw(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).ctx("setsockopt")?;
    bind(l.raw(), &Addr::loopback(libc::AF_INET, 0)).ctx("bind")?;
    listen(l.raw(), 8).ctx("listen")?;
    let addr = crate::net::local_addr(l.raw()).ctx("getsockname")?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let a = crate::net::accept(l.raw()).ctx("accept")?;
    drop(l);
    drop(a);
    wait_for(c.raw(), libc::POLLRDHUP).ctx("poll")?;
    drop(c);
    crate::sys::sleep_ms(20);
    let plain = tcp_socket(libc::AF_INET).ctx("socket")?;
    let without = show(bind(plain.raw(), &addr).map(|_| 0));
    let reuse = tcp_socket(libc::AF_INET).ctx("socket")?;
    set_int(reuse.raw(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).ctx("setsockopt")?;
    let with = show(bind(reuse.raw(), &addr).map(|_| 0));
    let lst = show(listen(reuse.raw(), 1).map(|_| 0));
    Ok(format!(
        "time_wait: bind={without} with_SO_REUSEADDR={with} listen={lst}"
    ))
}

fn so_reuseport_two_listeners() -> Res {
    let a = tcp_socket(libc::AF_INET).ctx("socket")?;
    set_int(a.raw(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1).ctx("setsockopt")?;
    bind(a.raw(), &Addr::loopback(libc::AF_INET, 0)).ctx("bind")?;
    listen(a.raw(), 8).ctx("listen")?;
    let addr = crate::net::local_addr(a.raw()).ctx("getsockname")?;
    let get = show(get_int(a.raw(), libc::SOL_SOCKET, libc::SO_REUSEPORT));
    let b = tcp_socket(libc::AF_INET).ctx("socket")?;
    set_int(b.raw(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1).ctx("setsockopt")?;
    let second = show(bind(b.raw(), &addr).map(|_| 0));
    let second_listen = show(listen(b.raw(), 8).map(|_| 0));
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    let third = show(bind(c.raw(), &addr).map(|_| 0));
    Ok(format!(
        "get={get} second_bind={second} listen={second_listen} without_option={third}"
    ))
}

fn tcp_nodelay() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let fresh = tcp_socket(libc::AF_INET6).ctx("socket")?;
    Ok(format!(
        "client={} accepted={} unconnected6={}",
        flip(c.raw(), libc::IPPROTO_TCP, libc::TCP_NODELAY, 1),
        flip(s.raw(), libc::IPPROTO_TCP, libc::TCP_NODELAY, 1),
        flip(fresh.raw(), libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
    ))
}

fn keepalive() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    let fd = c.raw();
    Ok(format!(
        "SO_KEEPALIVE={} IDLE=→{} INTVL=→{} CNT=→{}",
        flip(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30)
            .and_then(|_| get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE))
            .map_or_else(|e| e.to_string(), |v| v.to_string()),
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5)
            .and_then(|_| get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL))
            .map_or_else(|e| e.to_string(), |v| v.to_string()),
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3)
            .and_then(|_| get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT))
            .map_or_else(|e| e.to_string(), |v| v.to_string()),
    ))
}

/// Sets a buffer size and describes what `getsockopt` reports back.
fn buffer_size(fd: c_int, name: c_int, want: c_int) -> String {
    let default = match get_int(fd, libc::SOL_SOCKET, name) {
        Ok(v) if v > 0 => "default>0",
        Ok(_) => "default=0",
        Err(_) => "default=error",
    };
    if let Err(e) = set_int(fd, libc::SOL_SOCKET, name, want) {
        return format!("{default} set={e}");
    }
    let got = match get_int(fd, libc::SOL_SOCKET, name) {
        Ok(v) if v == want * 2 => "doubled".to_string(),
        Ok(v) if v == want => "set".to_string(),
        Ok(v) if v > 0 => "other>0".to_string(),
        Ok(v) => v.to_string(),
        Err(e) => e.to_string(),
    };
    format!("{default} get_after_set={got}")
}

fn so_rcvbuf_doubled() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    let u = udp_socket(libc::AF_INET).ctx("socket")?;
    Ok(format!(
        "tcp: {} udp: {}",
        buffer_size(c.raw(), libc::SO_RCVBUF, 65536),
        buffer_size(u.raw(), libc::SO_RCVBUF, 32768)
    ))
}

fn so_sndbuf_doubled() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    let u = udp_socket(libc::AF_INET).ctx("socket")?;
    Ok(format!(
        "tcp: {} udp: {}",
        buffer_size(c.raw(), libc::SO_SNDBUF, 65536),
        buffer_size(u.raw(), libc::SO_SNDBUF, 32768)
    ))
}

fn tcp_state(fd: c_int) -> String {
    let mut info: libc::tcp_info = zeroed();
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    let p = (&raw mut info).cast();
    match sys!(libc::getsockopt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_INFO,
        p,
        &mut len
    )) {
        Ok(_) => tcp_state_name(info.tcpi_state),
        Err(e) => e.to_string(),
    }
}

fn tcp_info_states() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    let fresh = tcp_state(c.raw());
    connect(c.raw(), &addr).ctx("connect")?;
    let a = crate::net::accept(l.raw()).ctx("accept")?;
    let est = (tcp_state(c.raw()), tcp_state(a.raw()));
    drop(a);
    wait_for(c.raw(), libc::POLLRDHUP).ctx("poll")?;
    Ok(format!(
        "fresh={fresh} listener={} client={} accepted={} after_peer_close={}",
        tcp_state(l.raw()),
        est.0,
        est.1,
        tcp_state(c.raw())
    ))
}

fn congestion(fd: c_int) -> Result<String, Errno> {
    let mut buf = [0 as libc::c_char; 32];
    let mut len = buf.len() as libc::socklen_t;
    let p = buf.as_mut_ptr().cast();
    sys!(libc::getsockopt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_CONGESTION,
        p,
        &mut len
    ))?;
    Ok(crate::sys::c_buf_str(&buf))
}

fn tcp_congestion() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    let get = match congestion(c.raw()) {
        Ok(name) if !name.is_empty() => "ok".to_string(),
        Ok(_) => "empty".to_string(),
        Err(e) => e.to_string(),
    };
    let set_reno =
        show(setsockopt(c.raw(), libc::IPPROTO_TCP, libc::TCP_CONGESTION, b"reno").map(|_| 0));
    let now = show(congestion(c.raw()));
    let bogus = setsockopt(
        c.raw(),
        libc::IPPROTO_TCP,
        libc::TCP_CONGESTION,
        b"no-such-cc\0",
    );
    Ok(format!(
        "get={get} set_reno={set_reno} now={now} set_bogus={}",
        show(bogus.map(|_| 0))
    ))
}

fn identity(fd: c_int) -> String {
    let ty = get_int(fd, libc::SOL_SOCKET, libc::SO_TYPE).map(socktype_name);
    let dom = get_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).map(family_name);
    let proto = get_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL).map(proto_name);
    format!("{}/{}/{}", show(dom), show(ty), show(proto))
}

fn so_type_domain_protocol() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let u4 = udp_socket(libc::AF_INET).ctx("socket")?;
    let t6 = tcp_socket(libc::AF_INET6).ctx("socket")?;
    let u6 = udp_socket(libc::AF_INET6).ctx("socket")?;
    let nb = socket(
        libc::AF_INET,
        libc::SOCK_STREAM | libc::SOCK_NONBLOCK,
        libc::IPPROTO_TCP,
    )
    .ctx("socket")?;
    Ok(format!(
        "tcp={} accepted={} udp={} tcp6={} udp6={} nonblock_tcp={}",
        identity(c.raw()),
        identity(s.raw()),
        identity(u4.raw()),
        identity(t6.raw()),
        identity(u6.raw()),
        identity(nb.raw())
    ))
}

fn so_acceptconn() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    let before = show(get_int(c.raw(), libc::SOL_SOCKET, libc::SO_ACCEPTCONN));
    connect(c.raw(), &addr).ctx("connect")?;
    let a = crate::net::accept(l.raw()).ctx("accept")?;
    let u = udp_socket(libc::AF_INET).ctx("socket")?;
    let g = |fd: &Fd| show(get_int(fd.raw(), libc::SOL_SOCKET, libc::SO_ACCEPTCONN));
    Ok(format!(
        "listener={} fresh={before} client={} accepted={} udp={}",
        g(&l),
        g(&c),
        g(&a),
        g(&u)
    ))
}

fn so_error_fresh() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let u = udp_socket(libc::AF_INET).ctx("socket")?;
    Ok(format!(
        "client={} accepted={} udp={}",
        crate::net::so_error(c.raw()),
        crate::net::so_error(s.raw()),
        crate::net::so_error(u.raw())
    ))
}

fn get_linger(fd: c_int) -> String {
    let mut lg: libc::linger = zeroed();
    let mut len = size_of::<libc::linger>() as libc::socklen_t;
    match sys!(libc::getsockopt(
        fd,
        libc::SOL_SOCKET,
        libc::SO_LINGER,
        (&raw mut lg).cast(),
        &mut len
    )) {
        Ok(_) => format!("{{{},{}}}", lg.l_onoff, lg.l_linger),
        Err(e) => e.to_string(),
    }
}

fn so_linger() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let before = get_linger(s.raw());
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 5,
    };
    let set = show(setsockopt(s.raw(), libc::SOL_SOCKET, libc::SO_LINGER, &lg).map(|_| 0));
    Ok(format!(
        "default={before} set={set} get={}",
        get_linger(s.raw())
    ))
}

fn ip_tos_and_tclass() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    let u6 = udp_socket(libc::AF_INET6).ctx("socket")?;
    Ok(format!(
        "IP_TOS={} IPV6_TCLASS={}",
        flip(c.raw(), libc::IPPROTO_IP, libc::IP_TOS, 0x10),
        flip(u6.raw(), libc::IPPROTO_IPV6, libc::IPV6_TCLASS, 0x20)
    ))
}

fn ipv6_v6only() -> Res {
    let t6 = tcp_socket(libc::AF_INET6).ctx("socket")?;
    let t4 = tcp_socket(libc::AF_INET).ctx("socket")?;
    Ok(format!(
        "v6={} on_v4={}",
        flip(t6.raw(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1),
        show(get_int(t4.raw(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY))
    ))
}

fn tcp_maxseg() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    let mss = match get_int(c.raw(), libc::IPPROTO_TCP, libc::TCP_MAXSEG) {
        Ok(v) if v > 0 => "mss>0".to_string(),
        other => show(other),
    };
    let (l, addr) = listener(libc::AF_INET)?;
    let small = tcp_socket(libc::AF_INET).ctx("socket")?;
    let set = show(set_int(small.raw(), libc::IPPROTO_TCP, libc::TCP_MAXSEG, 1000).map(|_| 0));
    connect(small.raw(), &addr).ctx("connect")?;
    let _a = crate::net::accept(l.raw()).ctx("accept")?;
    let capped = match get_int(small.raw(), libc::IPPROTO_TCP, libc::TCP_MAXSEG) {
        Ok(v) => format!("<=1000:{}", v <= 1000 && v > 0),
        Err(e) => e.to_string(),
    };
    Ok(format!(
        "connected={mss} set_before_connect={set} then={capped}"
    ))
}

fn unknown_and_short() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let u = udp_socket(libc::AF_INET).ctx("socket")?;
    let unknown = show(get_int(s.raw(), libc::SOL_SOCKET, 9999));
    let bad_level = show(get_int(s.raw(), 9999, 1));
    let tcp_on_udp = show(get_int(u.raw(), libc::IPPROTO_TCP, libc::TCP_NODELAY));
    let mut v: c_int = 0;
    let mut len: libc::socklen_t = 2;
    let p = (&raw mut v).cast();
    let short_get = sys!(libc::getsockopt(
        s.raw(),
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        p,
        &mut len
    ));
    let short = match short_get {
        Ok(_) => format!("ok len={len}"),
        Err(e) => e.to_string(),
    };
    let one: c_int = 1;
    let zero_len = show(sys!(libc::setsockopt(
        s.raw(),
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        (&raw const one).cast(),
        0
    )));
    Ok(format!(
        "unknown={unknown} bad_level={bad_level} tcp_opt_on_udp={tcp_on_udp} \
         optlen2_get={short} optlen0_set={zero_len}"
    ))
}

fn so_rcvlowat() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let set = flip(s.raw(), libc::SOL_SOCKET, libc::SO_RCVLOWAT, 10);
    send(c.raw(), &[1u8; 5], 0).ctx("send")?;
    crate::sys::sleep_ms(20);
    let below = show(poll1(s.raw(), libc::POLLIN, 0).map(crate::flags::poll_names));
    send(c.raw(), &[1u8; 5], 0).ctx("send")?;
    let at = show(wait_for(s.raw(), libc::POLLIN).map(crate::flags::poll_names));
    Ok(format!(
        "SO_RCVLOWAT={set} poll_5_bytes={below} poll_10_bytes={at}"
    ))
}

fn ip_ttl() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    let u6 = udp_socket(libc::AF_INET6).ctx("socket")?;
    Ok(format!(
        "IP_TTL={} IPV6_UNICAST_HOPS={}",
        flip(c.raw(), libc::IPPROTO_IP, libc::IP_TTL, 32),
        flip(u6.raw(), libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, 16)
    ))
}

fn so_broadcast() -> Res {
    let u = udp_socket(libc::AF_INET).ctx("socket")?;
    Ok(format!(
        "udp={}",
        flip(u.raw(), libc::SOL_SOCKET, libc::SO_BROADCAST, 1)
    ))
}

fn tcp_user_timeout_and_cork() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    Ok(format!(
        "TCP_USER_TIMEOUT={} TCP_CORK={} TCP_QUICKACK_set={}",
        flip(c.raw(), libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 5000),
        flip(c.raw(), libc::IPPROTO_TCP, libc::TCP_CORK, 1),
        show(set_int(c.raw(), libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1).map(|_| 0))
    ))
}
