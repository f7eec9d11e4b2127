//! COMPAT 3 (part 1) — non-blocking sockets: `O_NONBLOCK` via `fcntl`, `SOCK_NONBLOCK`,
//! `FIONBIO`, `MSG_DONTWAIT`, `connect` → `EINPROGRESS` → `SO_ERROR`, partial writes and
//! `EAGAIN` under a full send buffer.

use super::{Case, Res};
use crate::flags::poll_names;
use crate::net::{
    Addr, accept, bind, closed_port, connect, drain, fill_until_unwritable, listen, listener,
    local_addr, peer_addr, poll1, recv, recv_text, send, so_error, socket, tcp_pair, tcp_socket,
    wait_for,
};
use crate::sys::{Ctx, nonblock_state, set_nonblocking, show};

pub const CASES: &[Case] = &[
    Case::new("nb.fcntl_o_nonblock", fcntl_o_nonblock),
    Case::new("nb.sock_nonblock_flag", sock_nonblock_flag),
    Case::new("nb.fionbio", fionbio),
    Case::new("nb.msg_dontwait", msg_dontwait),
    Case::new("nb.accept_eagain", accept_eagain),
    Case::new("nb.connect_einprogress", connect_einprogress),
    Case::new("nb.connect_refused_so_error", connect_refused_so_error),
    Case::new(
        "nb.connect_in_progress_not_writable",
        connect_in_progress_not_writable,
    ),
    Case::new("nb.partial_write", partial_write),
    Case::new(
        "nb.full_buffer_eagain_then_pollout",
        full_buffer_eagain_then_pollout,
    ),
    Case::new("nb.recv_returns_available", recv_returns_available),
    Case::new("nb.eof_not_eagain", eof_not_eagain),
];

fn fcntl_o_nonblock() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    set_nonblocking(s.raw(), true).ctx("fcntl")?;
    let on = nonblock_state(s.raw());
    let empty = recv_text(s.raw(), 16, 0);
    send(c.raw(), b"hi", 0).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    let data = recv_text(s.raw(), 16, 0);
    set_nonblocking(s.raw(), false).ctx("fcntl")?;
    Ok(format!(
        "flag={on} empty_recv={empty} data={data} cleared={}",
        nonblock_state(s.raw())
    ))
}

fn sock_nonblock_flag() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0).ctx("socket")?;
    let conn = show(connect(c.raw(), &addr).map(|_| 0));
    wait_for(c.raw(), libc::POLLOUT).ctx("poll")?;
    let _a = accept(l.raw()).ctx("accept")?;
    Ok(format!(
        "flag={} connect={conn} recv={}",
        nonblock_state(c.raw()),
        recv_text(c.raw(), 16, 0)
    ))
}

fn fionbio() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let mut on: libc::c_int = 1;
    let set = show(sys!(libc::ioctl(s.raw(), libc::FIONBIO, &mut on)));
    let flag = nonblock_state(s.raw());
    let r = recv_text(s.raw(), 16, 0);
    let mut off: libc::c_int = 0;
    let clear = show(sys!(libc::ioctl(s.raw(), libc::FIONBIO, &mut off)));
    Ok(format!(
        "ioctl_on={set} flag={flag} recv={r} ioctl_off={clear} flag={}",
        nonblock_state(s.raw())
    ))
}

fn msg_dontwait() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let empty = recv_text(s.raw(), 16, libc::MSG_DONTWAIT);
    let flag = nonblock_state(s.raw());
    send(c.raw(), b"now", libc::MSG_DONTWAIT).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    Ok(format!(
        "empty={empty} flag_still={flag} data={}",
        recv_text(s.raw(), 16, libc::MSG_DONTWAIT)
    ))
}

fn accept_eagain() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    set_nonblocking(l.raw(), true).ctx("fcntl")?;
    let empty = show(accept(l.raw()).map(|_| 0));
    let c = socket(libc::AF_INET, libc::SOCK_STREAM, 0).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    wait_for(l.raw(), libc::POLLIN).ctx("poll")?;
    let a = accept(l.raw()).ctx("accept")?;
    Ok(format!(
        "empty={empty} accepted_flag={}",
        nonblock_state(a.raw())
    ))
}

fn connect_einprogress() -> Res {
    let (_l, addr) = listener(libc::AF_INET)?;
    let c = socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0).ctx("socket")?;
    let first = show(connect(c.raw(), &addr).map(|_| 0));
    let ev = wait_for(c.raw(), libc::POLLOUT).map(poll_names);
    let err = so_error(c.raw());
    let peer = peer_addr(c.raw()).map(|a| a.describe());
    let second = show(connect(c.raw(), &addr).map(|_| 0));
    let third = show(connect(c.raw(), &addr).map(|_| 0));
    Ok(format!(
        "connect={first} poll={} SO_ERROR={err} peer={} connect2={second} connect3={third}",
        show(ev),
        show(peer)
    ))
}

fn connect_refused_so_error() -> Res {
    let addr = closed_port(libc::AF_INET)?;
    let c = socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0).ctx("socket")?;
    let first = show(connect(c.raw(), &addr).map(|_| 0));
    wait_for(c.raw(), libc::POLLOUT).ctx("poll")?;
    let err = so_error(c.raw());
    let again = so_error(c.raw());
    Ok(format!(
        "connect={first} SO_ERROR={err} SO_ERROR_again={again}"
    ))
}

/// A connection that cannot complete yet (the listener's accept queue is full, so its
/// SYN is dropped until it is retried) does not poll writable; `SO_ERROR` is 0 and a
/// second `connect` says `EALREADY` meanwhile. Once the queue has room, the retried SYN
/// (after ~1 s) completes it.
fn connect_in_progress_not_writable() -> Res {
    let l = tcp_socket(libc::AF_INET).ctx("socket")?;
    bind(l.raw(), &Addr::loopback(libc::AF_INET, 0)).ctx("bind")?;
    listen(l.raw(), 0).ctx("listen")?;
    let addr = local_addr(l.raw()).ctx("getsockname")?;
    // Backlog 0 queues one connection: this one fills the queue.
    let first = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(first.raw(), &addr).ctx("connect")?;
    let c = socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0).ctx("socket")?;
    let started = show(connect(c.raw(), &addr).map(|_| 0));
    let during = show(poll1(c.raw(), libc::POLLOUT, 300).map(poll_names));
    let err = so_error(c.raw());
    let again = show(connect(c.raw(), &addr).map(|_| 0));
    let _taken = accept(l.raw()).ctx("accept")?;
    let after = show(poll1(c.raw(), libc::POLLOUT, 4000).map(poll_names));
    let err_after = so_error(c.raw());
    let last = show(connect(c.raw(), &addr).map(|_| 0));
    Ok(format!(
        "connect={started} poll_during={during} SO_ERROR={err} connect2={again} \
         poll_after_accept={after} SO_ERROR_after={err_after} connect3={last}"
    ))
}

fn partial_write() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    set_nonblocking(c.raw(), true).ctx("fcntl")?;
    let big = vec![7u8; 32 << 20];
    let n = send(c.raw(), &big, libc::MSG_NOSIGNAL).ctx("send")?;
    let next = show(send(c.raw(), &big, libc::MSG_NOSIGNAL));
    Ok(format!(
        "first_send_partial={} next={next}",
        n > 0 && n < big.len()
    ))
}

fn full_buffer_eagain_then_pollout() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    set_nonblocking(c.raw(), true).ctx("fcntl")?;
    // Until unwritable for a while, not just the first EAGAIN: bytes in flight (and,
    // through ferry, its buffers' move into the host socket) can make room just after.
    let total = fill_until_unwritable(c.raw())?;
    let full = poll1(c.raw(), libc::POLLOUT, 0).map(poll_names);
    set_nonblocking(s.raw(), true).ctx("fcntl")?;
    let mut drained = 0;
    while drained < total {
        wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
        drained += drain(s.raw())?;
    }
    let writable = wait_for(c.raw(), libc::POLLOUT).map(poll_names);
    let more = send(c.raw(), b"more", 0).map(|n| n.to_string());
    Ok(format!(
        "filled=EAGAIN total>0:{} poll_full={} drained_all={} poll_after={} send={}",
        total > 0,
        show(full),
        drained == total,
        show(writable),
        show(more)
    ))
}

fn recv_returns_available() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    set_nonblocking(s.raw(), true).ctx("fcntl")?;
    send(c.raw(), &[1u8; 10], 0).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    let mut buf = [0u8; 4096];
    let n = show(recv(s.raw(), &mut buf, 0));
    Ok(format!("recv(4096)={n} then={}", recv_text(s.raw(), 16, 0)))
}

fn eof_not_eagain() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    set_nonblocking(s.raw(), true).ctx("fcntl")?;
    let before = recv_text(s.raw(), 16, 0);
    drop(c);
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    Ok(format!(
        "before={before} after_close={} again={}",
        recv_text(s.raw(), 16, 0),
        recv_text(s.raw(), 16, 0)
    ))
}
