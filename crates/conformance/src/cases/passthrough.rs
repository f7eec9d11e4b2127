//! COMPAT 10 — everything that is not AF_INET/AF_INET6 must be the kernel's, untouched:
//! AF_UNIX stream/datagram/seqpacket pairs, path and abstract addresses, peer
//! credentials, AF_NETLINK route sockets, and unix sockets mixed with inet ones.

use libc::c_int;

use super::epoll::Ep;
use super::{Case, Res};
use crate::flags::socktype_name;
use crate::net::{family_name, get_int, recv, recv_text, send, socket, tcp_pair};
use crate::sys::{Ctx, Fd, show, zeroed};

pub const CASES: &[Case] = &[
    Case::new("unix.stream_socketpair", stream_socketpair),
    Case::new(
        "unix.dgram_socketpair_boundaries",
        dgram_socketpair_boundaries,
    ),
    Case::new("unix.seqpacket_socketpair", seqpacket_socketpair),
    Case::new("unix.bound_path_stream", bound_path_stream),
    Case::new("unix.abstract_namespace", abstract_namespace),
    Case::new("unix.so_peercred", so_peercred),
    Case::new("unix.dgram_path_source", dgram_path_source),
    Case::new("unix.epoll_mixed_with_tcp", epoll_mixed_with_tcp),
    Case::new("netlink.route_dump_has_lo", route_dump_has_lo),
];

fn pair(ty: c_int) -> Result<(Fd, Fd), String> {
    let mut sv = [0; 2];
    sys!(libc::socketpair(libc::AF_UNIX, ty, 0, sv.as_mut_ptr())).ctx("socketpair")?;
    Ok((Fd::new(sv[0]), Fd::new(sv[1])))
}

fn identity(fd: c_int) -> String {
    let d = get_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).map(family_name);
    let t = get_int(fd, libc::SOL_SOCKET, libc::SO_TYPE).map(socktype_name);
    format!("{}/{}", show(d), show(t))
}

fn stream_socketpair() -> Res {
    let (a, b) = pair(libc::SOCK_STREAM)?;
    send(a.raw(), b"a->b", 0).ctx("send")?;
    send(b.raw(), b"b->a", 0).ctx("send")?;
    Ok(format!(
        "{} b_got={} a_got={}",
        identity(a.raw()),
        recv_text(b.raw(), 16, 0),
        recv_text(a.raw(), 16, 0)
    ))
}

fn dgram_socketpair_boundaries() -> Res {
    let (a, b) = pair(libc::SOCK_DGRAM)?;
    for m in [&b"1"[..], b"22", b"333"] {
        send(a.raw(), m, 0).ctx("send")?;
    }
    let mut buf = [0u8; 16];
    let lens: Vec<String> = (0..3).map(|_| show(recv(b.raw(), &mut buf, 0))).collect();
    Ok(format!("{} lens={}", identity(a.raw()), lens.join(",")))
}

fn seqpacket_socketpair() -> Res {
    let (a, b) = pair(libc::SOCK_SEQPACKET)?;
    send(a.raw(), b"record-one", 0).ctx("send")?;
    send(a.raw(), b"two", 0).ctx("send")?;
    let mut small = [0u8; 4];
    let first = show(recv(b.raw(), &mut small, 0));
    drop(a);
    Ok(format!(
        "{} recv(4)={first} next={} then={}",
        identity(b.raw()),
        recv_text(b.raw(), 16, 0),
        recv_text(b.raw(), 16, 0)
    ))
}

/// A `sockaddr_un` for `path` (a leading NUL makes it abstract); returns it and its length.
fn unix_addr(path: &[u8]) -> (libc::sockaddr_un, libc::socklen_t) {
    let mut sun: libc::sockaddr_un = zeroed();
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &s) in sun.sun_path.iter_mut().zip(path) {
        *d = s as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + path.len();
    let len = if path.first() == Some(&0) {
        len
    } else {
        len + 1
    };
    (sun, len as libc::socklen_t)
}

/// Listener and connected client on a unix address; returns (client, accepted, name).
fn unix_stream(path: &[u8]) -> Result<(Fd, Fd, String), String> {
    let (sun, len) = unix_addr(path);
    let p = (&raw const sun).cast();
    let l = socket(libc::AF_UNIX, libc::SOCK_STREAM, 0).ctx("socket")?;
    sys!(libc::bind(l.raw(), p, len)).ctx("bind")?;
    sys!(libc::listen(l.raw(), 4)).ctx("listen")?;
    let c = socket(libc::AF_UNIX, libc::SOCK_STREAM, 0).ctx("socket")?;
    sys!(libc::connect(c.raw(), p, len)).ctx("connect")?;
    let a = crate::net::accept(l.raw()).ctx("accept")?;
    let mut got: libc::sockaddr_un = zeroed();
    let mut glen = size_of::<libc::sockaddr_un>() as libc::socklen_t;
    sys!(libc::getsockname(l.raw(), (&raw mut got).cast(), &mut glen)).ctx("getsockname")?;
    let same = glen == len && got.sun_path.iter().zip(path).all(|(&a, &b)| a as u8 == b);
    Ok((c, a, format!("name_matches={same}")))
}

fn bound_path_stream() -> Res {
    let path = crate::sys::scratch_path("stream.sock");
    let _ = std::fs::remove_file(&path);
    let r = unix_stream(path.as_bytes());
    let _ = std::fs::remove_file(&path);
    let (c, a, name) = r?;
    send(c.raw(), b"over-path", 0).ctx("send")?;
    Ok(format!(
        "{name} got={} {}",
        recv_text(a.raw(), 16, 0),
        identity(a.raw())
    ))
}

fn abstract_namespace() -> Res {
    // SAFETY: no arguments; getpid cannot fail.
    let name = format!("\0ferry-conformance-{}", unsafe { libc::getpid() });
    let (c, a, same) = unix_stream(name.as_bytes())?;
    send(a.raw(), b"abstract", 0).ctx("send")?;
    Ok(format!("{same} got={}", recv_text(c.raw(), 16, 0)))
}

fn so_peercred() -> Res {
    let (a, _b) = pair(libc::SOCK_STREAM)?;
    let mut cred: libc::ucred = zeroed();
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    let p = (&raw mut cred).cast();
    sys!(libc::getsockopt(
        a.raw(),
        libc::SOL_SOCKET,
        libc::SO_PEERCRED,
        p,
        &mut len
    ))
    .ctx("getsockopt")?;
    // SAFETY: no arguments; these three cannot fail.
    let (pid, uid, gid) = unsafe { (libc::getpid(), libc::getuid(), libc::getgid()) };
    Ok(format!(
        "pid_is_self={} uid_is_self={} gid_is_self={}",
        cred.pid == pid,
        cred.uid == uid,
        cred.gid == gid
    ))
}

fn dgram_path_source() -> Res {
    let (rp, tp) = (
        crate::sys::scratch_path("dgram-r.sock"),
        crate::sys::scratch_path("dgram-t.sock"),
    );
    let _ = (std::fs::remove_file(&rp), std::fs::remove_file(&tp));
    let result = (|| -> Res {
        let r = socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0).ctx("socket")?;
        let t = socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0).ctx("socket")?;
        let (ra, rl) = unix_addr(rp.as_bytes());
        let (ta, tl) = unix_addr(tp.as_bytes());
        sys!(libc::bind(r.raw(), (&raw const ra).cast(), rl)).ctx("bind")?;
        sys!(libc::bind(t.raw(), (&raw const ta).cast(), tl)).ctx("bind")?;
        let msg = b"unix-dgram";
        let dst = (&raw const ra).cast();
        let sent = show(sys!(libc::sendto(
            t.raw(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            dst,
            rl
        )));
        let mut buf = [0u8; 32];
        let mut from: libc::sockaddr_un = zeroed();
        let mut flen = size_of::<libc::sockaddr_un>() as libc::socklen_t;
        let pf = (&raw mut from).cast();
        let n = sys!(libc::recvfrom(
            r.raw(),
            buf.as_mut_ptr().cast(),
            32,
            0,
            pf,
            &mut flen
        ))
        .ctx("recvfrom")?;
        let src = crate::sys::c_buf_str(&from.sun_path);
        Ok(format!(
            "sendto={sent} recvfrom={n} source_is_sender={}",
            src == tp
        ))
    })();
    let _ = (std::fs::remove_file(&rp), std::fs::remove_file(&tp));
    result
}

fn epoll_mixed_with_tcp() -> Res {
    let (ua, ub) = pair(libc::SOCK_STREAM)?;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(ub.raw(), libc::EPOLLIN as u32, 1)?;
    ep.add(s.raw(), libc::EPOLLIN as u32, 2)?;
    send(ua.raw(), b"u", 0).ctx("send")?;
    let unix_only = ep.show(8, 2000);
    send(c.raw(), b"t", 0).ctx("send")?;
    crate::net::wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    Ok(format!(
        "unix_only: {unix_only}; both: {}",
        ep.show(8, 2000)
    ))
}

fn route_dump_has_lo() -> Res {
    let nl = socket(
        libc::AF_NETLINK,
        libc::SOCK_RAW | libc::SOCK_CLOEXEC,
        libc::NETLINK_ROUTE,
    )
    .ctx("socket")?;
    let mut sa: libc::sockaddr_nl = zeroed();
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    let len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    let bound = show(sys!(libc::bind(nl.raw(), (&raw const sa).cast(), len)));
    let local = crate::net::local_addr(nl.raw()).ctx("getsockname")?;
    // struct { nlmsghdr; rtgenmsg { u8 family; } } padded to 20 bytes.
    let mut req = [0u8; 20];
    let hdr = libc::nlmsghdr {
        nlmsg_len: 20,
        nlmsg_type: libc::RTM_GETLINK,
        nlmsg_flags: (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
        nlmsg_seq: 1,
        nlmsg_pid: 0,
    };
    // SAFETY: `req` is a live 20-byte array; an nlmsghdr is 16 bytes of integers,
    // written unaligned at its start.
    unsafe { std::ptr::write_unaligned(req.as_mut_ptr().cast(), hdr) };
    req[16] = libc::AF_UNSPEC as u8;
    let sent = show(send(nl.raw(), &req, 0));
    let mut buf = vec![0u8; 65536];
    let (mut has_lo, mut done) = (false, false);
    while !done {
        let n = recv(nl.raw(), &mut buf, 0).ctx("recv")?;
        let mut off = 0;
        while off + 16 <= n {
            // SAFETY: `off + 16 <= n <= buf.len()` (the loop condition), so the 16 bytes
            // of an nlmsghdr are inside `buf`; read unaligned, and any bytes are a valid
            // header (integers only).
            let h: libc::nlmsghdr = unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
            if h.nlmsg_type == libc::NLMSG_DONE as u16 || h.nlmsg_type == libc::NLMSG_ERROR as u16 {
                done = true;
                break;
            }
            let end = (off + h.nlmsg_len as usize).min(n);
            has_lo |= buf[off..end].windows(3).any(|w| w == b"lo\0");
            if h.nlmsg_len < 16 {
                done = true;
                break;
            }
            off += (h.nlmsg_len as usize + 3) & !3;
        }
    }
    Ok(format!(
        "{} bind={bound} local={} send={sent} dump_has_lo={has_lo}",
        identity(nl.raw()),
        family_name(local.family())
    ))
}
