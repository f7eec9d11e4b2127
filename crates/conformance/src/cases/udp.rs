//! COMPAT 8 (datagrams) — UDP over loopback: source addresses, connected sockets,
//! truncation, 64 KB datagrams, message boundaries, ICMP errors, `FIONREAD`, implicit
//! binding.

use super::{Case, Res};
use crate::flags::poll_names;
use crate::net::{
    Addr, bind, connect, fionread, local_addr, peer_addr, poll1, recv, recv_text, recvfrom, send,
    sendto, udp_bound, udp_socket, wait_for,
};
use crate::sys::{Ctx, set_nonblocking, show, sleep_ms};

pub const CASES: &[Case] = &[
    Case::new("udp.sendto_recvfrom_source", sendto_recvfrom_source),
    Case::new("udp.connect_send_recv", connect_send_recv),
    Case::new("udp.connected_filters_others", connected_filters_others),
    Case::new("udp.msg_trunc", msg_trunc),
    Case::new("udp.datagram_64k", datagram_64k),
    Case::new("udp.too_big_emsgsize", too_big_emsgsize),
    Case::new("udp.boundaries_preserved", boundaries_preserved),
    Case::new("udp.zero_length_datagram", zero_length_datagram),
    Case::new("udp.nonblocking_eagain", nonblocking_eagain),
    Case::new("udp.connected_icmp_refused", connected_icmp_refused),
    Case::new("udp.unconnected_no_icmp_error", unconnected_no_icmp_error),
    Case::new("udp.disconnect_af_unspec", disconnect_af_unspec),
    Case::new("udp.fionread_next_datagram", fionread_next_datagram),
    Case::new("udp.peek_then_recv", peek_then_recv),
    Case::new(
        "udp.send_unconnected_edestaddrreq",
        send_unconnected_edestaddrreq,
    ),
    Case::new("udp.bind_any_receives_loopback", bind_any_receives_loopback),
    Case::new("udp.autobind_on_sendto", autobind_on_sendto),
    Case::new("udp.burst_in_order", burst_in_order),
];

fn sendto_recvfrom_source() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, taddr) = udp_bound(libc::AF_INET)?;
    let sent = show(sendto(t.raw(), b"datagram", 0, &raddr));
    let mut buf = [0u8; 64];
    let (n, from) = recvfrom(r.raw(), &mut buf, 0).ctx("recvfrom")?;
    Ok(format!(
        "sendto={sent} recvfrom={n} from={} is_sender={} addrlen={}",
        from.describe(),
        from.port() == taddr.port(),
        from.len()
    ))
}

fn connect_send_recv() -> Res {
    let (a, aaddr) = udp_bound(libc::AF_INET)?;
    let (b, baddr) = udp_bound(libc::AF_INET)?;
    connect(a.raw(), &baddr).ctx("connect")?;
    connect(b.raw(), &aaddr).ctx("connect")?;
    let s1 = show(send(a.raw(), b"a->b", 0));
    let s2 = show(send(b.raw(), b"b->a", 0));
    Ok(format!(
        "send={s1},{s2} b_got={} a_got={} peer={}",
        recv_text(b.raw(), 16, 0),
        recv_text(a.raw(), 16, 0),
        show(peer_addr(a.raw()).map(|p| p.describe()))
    ))
}

fn connected_filters_others() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t1, t1addr) = udp_bound(libc::AF_INET)?;
    let (t2, _) = udp_bound(libc::AF_INET)?;
    connect(r.raw(), &t1addr).ctx("connect")?;
    sendto(t2.raw(), b"stranger", 0, &raddr).ctx("sendto")?;
    sendto(t1.raw(), b"peer", 0, &raddr).ctx("sendto")?;
    wait_for(r.raw(), libc::POLLIN).ctx("poll")?;
    let first = recv_text(r.raw(), 16, libc::MSG_DONTWAIT);
    let second = recv_text(r.raw(), 16, libc::MSG_DONTWAIT);
    Ok(format!("first={first} second={second}"))
}

fn msg_trunc() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    let big = [b'z'; 100];
    sendto(t.raw(), &big, 0, &raddr).ctx("sendto")?;
    sendto(t.raw(), &big, 0, &raddr).ctx("sendto")?;
    sendto(t.raw(), b"next", 0, &raddr).ctx("sendto")?;
    let mut small = [0u8; 10];
    let plain = show(recv(r.raw(), &mut small, 0));
    let trunc = show(recv(r.raw(), &mut small, libc::MSG_TRUNC));
    Ok(format!(
        "recv(10)={plain} recv(10,MSG_TRUNC)={trunc} next={}",
        recv_text(r.raw(), 16, 0)
    ))
}

fn datagram_64k() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    let data: Vec<u8> = (0..65507u32).map(|i| (i * 7 % 256) as u8).collect();
    let sent = show(sendto(t.raw(), &data, 0, &raddr));
    let mut buf = vec![0u8; 70000];
    let n = recv(r.raw(), &mut buf, 0).ctx("recv")?;
    Ok(format!(
        "sendto={sent} recv={n} intact={}",
        buf[..n] == data[..]
    ))
}

fn too_big_emsgsize() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    let data = vec![0u8; 65508];
    let v4 = show(sendto(t.raw(), &data, 0, &raddr));
    let (_r6, r6addr) = udp_bound(libc::AF_INET6)?;
    let t6 = udp_socket(libc::AF_INET6).ctx("socket")?;
    let data6 = vec![0u8; 65528];
    let v6 = show(sendto(t6.raw(), &data6, 0, &r6addr));
    drop(r);
    Ok(format!("v4_65508={v4} v6_65528={v6}"))
}

fn boundaries_preserved() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    for msg in [&b"1"[..], b"22", b"333"] {
        sendto(t.raw(), msg, 0, &raddr).ctx("sendto")?;
    }
    let mut buf = [0u8; 64];
    let mut lens = Vec::new();
    for _ in 0..3 {
        lens.push(show(recv(r.raw(), &mut buf, 0)));
    }
    Ok(format!("recv_lens={}", lens.join(",")))
}

fn zero_length_datagram() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    let sent = show(sendto(t.raw(), &[], 0, &raddr));
    let ev = show(wait_for(r.raw(), libc::POLLIN).map(poll_names));
    let queued = show(fionread(r.raw()));
    let mut buf = [0u8; 8];
    let got = show(recv(r.raw(), &mut buf, libc::MSG_DONTWAIT));
    let after = show(recv(r.raw(), &mut buf, libc::MSG_DONTWAIT));
    Ok(format!(
        "sendto={sent} poll={ev} FIONREAD={queued} recv={got} then={after}"
    ))
}

fn nonblocking_eagain() -> Res {
    let (r, _) = udp_bound(libc::AF_INET)?;
    set_nonblocking(r.raw(), true).ctx("fcntl")?;
    let mut buf = [0u8; 8];
    let a = show(recv(r.raw(), &mut buf, 0));
    let b = show(recvfrom(r.raw(), &mut buf, 0).map(|(n, _)| n));
    Ok(format!("recv={a} recvfrom={b}"))
}

fn connected_icmp_refused() -> Res {
    let gone = crate::net::udp_bound(libc::AF_INET)?.1;
    let (t, _) = udp_bound(libc::AF_INET)?;
    connect(t.raw(), &gone).ctx("connect")?;
    let first = show(send(t.raw(), b"anyone?", 0));
    let ev = show(wait_for(t.raw(), libc::POLLERR).map(crate::flags::poll_names));
    let recv1 = recv_text(t.raw(), 8, libc::MSG_DONTWAIT);
    let recv2 = recv_text(t.raw(), 8, libc::MSG_DONTWAIT);
    Ok(format!("send={first} poll={ev} recv={recv1} then={recv2}"))
}

fn unconnected_no_icmp_error() -> Res {
    let gone = crate::net::udp_bound(libc::AF_INET)?.1;
    let (t, _) = udp_bound(libc::AF_INET)?;
    let first = show(sendto(t.raw(), b"anyone?", 0, &gone));
    sleep_ms(20);
    let second = show(sendto(t.raw(), b"again", 0, &gone));
    Ok(format!(
        "sendto={first} sendto_again={second} recv={} SO_ERROR={}",
        recv_text(t.raw(), 8, libc::MSG_DONTWAIT),
        crate::net::so_error(t.raw())
    ))
}

fn disconnect_af_unspec() -> Res {
    let (a, _) = udp_bound(libc::AF_INET)?;
    let (_b, baddr) = udp_bound(libc::AF_INET)?;
    connect(a.raw(), &baddr).ctx("connect")?;
    let before = show(peer_addr(a.raw()).map(|p| p.describe()));
    let mut unspec = Addr::empty();
    *unspec.len_mut() = size_of::<libc::sockaddr>() as libc::socklen_t;
    let r = show(connect(a.raw(), &unspec).map(|_| 0));
    let after = show(peer_addr(a.raw()).map(|p| p.describe()));
    let send_now = show(send(a.raw(), b"x", 0));
    Ok(format!(
        "peer={before} connect(AF_UNSPEC)={r} peer_after={after} send={send_now}"
    ))
}

fn fionread_next_datagram() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    sendto(t.raw(), b"five5", 0, &raddr).ctx("sendto")?;
    sendto(t.raw(), b"nine99999", 0, &raddr).ctx("sendto")?;
    wait_for(r.raw(), libc::POLLIN).ctx("poll")?;
    sleep_ms(10);
    Ok(format!("FIONREAD={}", show(fionread(r.raw()))))
}

fn peek_then_recv() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    sendto(t.raw(), b"peekaboo", 0, &raddr).ctx("sendto")?;
    let peek = recv_text(r.raw(), 4, libc::MSG_PEEK);
    let full = recv_text(r.raw(), 16, 0);
    let empty = recv_text(r.raw(), 16, libc::MSG_DONTWAIT);
    Ok(format!("peek={peek} recv={full} then={empty}"))
}

fn send_unconnected_edestaddrreq() -> Res {
    let (a, _) = udp_bound(libc::AF_INET)?;
    let s = show(send(a.raw(), b"x", 0));
    let w = show(sys!(libc::write(a.raw(), b"x".as_ptr().cast(), 1)));
    Ok(format!("send={s} write={w}"))
}

fn bind_any_receives_loopback() -> Res {
    let r = udp_socket(libc::AF_INET).ctx("socket")?;
    bind(r.raw(), &Addr::any(libc::AF_INET, 0)).ctx("bind")?;
    let local = local_addr(r.raw()).ctx("getsockname")?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    sendto(
        t.raw(),
        b"to-any",
        0,
        &Addr::loopback(libc::AF_INET, local.port()),
    )
    .ctx("sendto")?;
    Ok(format!(
        "local={} got={}",
        local.describe(),
        recv_text(r.raw(), 16, 0)
    ))
}

fn autobind_on_sendto() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let t = udp_socket(libc::AF_INET).ctx("socket")?;
    let before = show(local_addr(t.raw()).map(|a| a.describe()));
    sendto(t.raw(), b"x", 0, &raddr).ctx("sendto")?;
    let after = show(local_addr(t.raw()).map(|a| a.describe()));
    let mut buf = [0u8; 4];
    let (_, from) = recvfrom(r.raw(), &mut buf, 0).ctx("recvfrom")?;
    Ok(format!(
        "before={before} after={after} receiver_saw={}",
        from.describe()
    ))
}

fn burst_in_order() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    for i in 0..32u8 {
        sendto(t.raw(), &[i; 100], 0, &raddr).ctx("sendto")?;
    }
    let mut buf = [0u8; 128];
    let mut in_order = true;
    let mut count = 0;
    while count < 32 && poll1(r.raw(), libc::POLLIN, 2000).ctx("poll")? != 0 {
        let n = recv(r.raw(), &mut buf, 0).ctx("recv")?;
        in_order &= n == 100 && buf[0] == count;
        count += 1;
    }
    Ok(format!("received={count} in_order={in_order}"))
}
