//! COMPAT 6 — the dup family: `dup`, `dup2`, `dup3`, `F_DUPFD(_CLOEXEC)`, duplicates
//! sharing one open file description, passing sockets over `SCM_RIGHTS`, and `close` or
//! `shutdown` racing a `recv` blocked in another thread.

use std::sync::mpsc;

use libc::c_int;

use super::{Case, Res};
use crate::flags::socktype_name;
use crate::net::{
    accept, connect, get_int, listener, local_addr, recv, recv_text, send, tcp_pair, tcp_socket,
};
use crate::proc::{fork_with, gettid, settle_blocked};
use crate::sys::{
    Ctx, Errno, Fd, cloexec_state, dev_null, lowest_free_fd, nonblock_state, pipe, set_nonblocking,
    show, zeroed,
};

pub const CASES: &[Case] = &[
    Case::new("dup.dup_shares_socket", dup_shares_socket),
    Case::new("dup.dup2_onto_open_pipe", dup2_onto_open_pipe),
    Case::new("dup.dup2_same_fd", dup2_same_fd),
    Case::new("dup.dup3_cloexec", dup3_cloexec),
    Case::new("dup.f_dupfd_min", f_dupfd_min),
    Case::new("dup.f_dupfd_cloexec", f_dupfd_cloexec),
    Case::new("dup.close_original_use_dup", close_original_use_dup),
    Case::new("dup.shared_status_flags", shared_status_flags),
    Case::new("dup.shutdown_via_dup", shutdown_via_dup),
    Case::new("dup.dup2_over_socket_closes_it", dup2_over_socket_closes_it),
    Case::new("dup.scm_rights_to_child", scm_rights_to_child),
    Case::new(
        "dup.scm_rights_listener_to_child",
        scm_rights_listener_to_child,
    ),
    Case::new("dup.scm_rights_self", scm_rights_self),
    Case::new("dup.close_while_recv_blocked", close_while_recv_blocked),
    Case::new(
        "dup.shutdown_wakes_blocked_recv",
        shutdown_wakes_blocked_recv,
    ),
];

fn dup_fd(fd: c_int) -> Result<Fd, String> {
    Ok(Fd::new(sys!(libc::dup(fd)).ctx("dup")?))
}

fn dup_shares_socket() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let expect = lowest_free_fd().ctx("open")?;
    let d = dup_fd(c.raw())?;
    let same_port = local_addr(d.raw()).ctx("getsockname")?.port()
        == local_addr(c.raw()).ctx("getsockname")?.port();
    send(d.raw(), b"via-dup", 0).ctx("send")?;
    Ok(format!(
        "dup=lowest:{} same_local_addr={same_port} peer_got={}",
        d.raw() == expect,
        recv_text(s.raw(), 16, 0)
    ))
}

fn dup2_onto_open_pipe() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (p0, _p1) = pipe(0).ctx("pipe")?;
    let target = p0.into_raw();
    let r = sys!(libc::dup2(c.raw(), target)).ctx("dup2")?;
    let t = Fd::new(target);
    let ty = get_int(t.raw(), libc::SOL_SOCKET, libc::SO_TYPE).map(socktype_name);
    send(t.raw(), b"via-dup2", 0).ctx("send")?;
    Ok(format!(
        "dup2=target:{} SO_TYPE={} peer_got={}",
        r == target,
        show(ty),
        recv_text(s.raw(), 16, 0)
    ))
}

fn dup2_same_fd() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let same = sys!(libc::dup2(s.raw(), s.raw())).map(|r| r == s.raw());
    let d3 = sys!(libc::dup3(s.raw(), s.raw(), 0)).map(|r| r == s.raw());
    Ok(format!(
        "dup2(fd,fd)=fd:{} dup3(fd,fd)={}",
        show(same),
        show(d3)
    ))
}

fn dup3_cloexec() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let target = dev_null().ctx("open")?.into_raw();
    let r = sys!(libc::dup3(c.raw(), target, libc::O_CLOEXEC)).ctx("dup3")?;
    let t = Fd::new(r);
    let bad = show(sys!(libc::dup3(c.raw(), target, libc::O_NONBLOCK)));
    send(t.raw(), b"via-dup3", 0).ctx("send")?;
    Ok(format!(
        "new={} original={} bad_flags={bad} peer_got={}",
        cloexec_state(t.raw()),
        cloexec_state(c.raw()),
        recv_text(s.raw(), 16, 0)
    ))
}

fn f_dupfd_min() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let a = Fd::new(sys!(libc::fcntl(s.raw(), libc::F_DUPFD, 100)).ctx("F_DUPFD")?);
    let b = Fd::new(sys!(libc::fcntl(s.raw(), libc::F_DUPFD, 100)).ctx("F_DUPFD")?);
    let ty = get_int(b.raw(), libc::SOL_SOCKET, libc::SO_TYPE).map(socktype_name);
    Ok(format!(
        "F_DUPFD(100)={} again={} {} SO_TYPE={}",
        a.raw(),
        b.raw(),
        cloexec_state(a.raw()),
        show(ty)
    ))
}

fn f_dupfd_cloexec() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let expect = lowest_free_fd().ctx("open")?;
    let d = Fd::new(sys!(libc::fcntl(c.raw(), libc::F_DUPFD_CLOEXEC, 0)).ctx("fcntl")?);
    send(d.raw(), b"x", 0).ctx("send")?;
    Ok(format!(
        "lowest={} {} original={} peer_got={}",
        d.raw() == expect,
        cloexec_state(d.raw()),
        cloexec_state(c.raw()),
        recv_text(s.raw(), 8, 0)
    ))
}

fn close_original_use_dup() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let d = dup_fd(c.raw())?;
    c.close().ctx("close")?;
    let no_eof = crate::net::poll1(s.raw(), libc::POLLIN, 30).ctx("poll")? == 0;
    send(d.raw(), b"dup-lives", 0).ctx("send")?;
    let got = recv_text(s.raw(), 16, 0);
    send(s.raw(), b"back", 0).ctx("send")?;
    let back = recv_text(d.raw(), 16, 0);
    drop(d);
    Ok(format!(
        "no_eof={no_eof} got={got} back={back} after_last_close={}",
        recv_text(s.raw(), 8, 0)
    ))
}

fn shared_status_flags() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    let d = dup_fd(c.raw())?;
    set_nonblocking(d.raw(), true).ctx("fcntl")?;
    sys!(libc::fcntl(d.raw(), libc::F_SETFD, libc::FD_CLOEXEC)).ctx("F_SETFD")?;
    Ok(format!(
        "original_after_dup_set_nonblock={} original_fd_flags={} recv_original={}",
        nonblock_state(c.raw()),
        cloexec_state(c.raw()),
        recv_text(c.raw(), 8, 0)
    ))
}

fn shutdown_via_dup() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let d = dup_fd(c.raw())?;
    sys!(libc::shutdown(d.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    let eof = recv_text(s.raw(), 8, 0);
    let send_original = show(send(c.raw(), b"x", libc::MSG_NOSIGNAL));
    Ok(format!("peer={eof} send_on_original={send_original}"))
}

fn dup2_over_socket_closes_it() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let null = dev_null().ctx("open")?;
    sys!(libc::dup2(null.raw(), c.raw())).ctx("dup2")?;
    let peer = recv_text(s.raw(), 8, 0);
    let now = get_int(c.raw(), libc::SOL_SOCKET, libc::SO_TYPE);
    Ok(format!("peer={peer} fd_now_getsockopt={}", show(now)))
}

/// Sends `fd` as `SCM_RIGHTS` with one byte of data.
pub fn send_fd(via: c_int, fd: c_int) -> Result<(), Errno> {
    let mut byte = *b"F";
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
    let space = unsafe { libc::CMSG_SPACE(size_of::<c_int>() as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut msg: libc::msghdr = zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `cbuf` is 8-aligned and holds CMSG_SPACE(one int) bytes, so CMSG_FIRSTHDR
    // is non-null and the header and its int (written unaligned) lie inside it.
    unsafe {
        let cm = libc::CMSG_FIRSTHDR(&msg);
        (*cm).cmsg_level = libc::SOL_SOCKET;
        (*cm).cmsg_type = libc::SCM_RIGHTS;
        (*cm).cmsg_len = libc::CMSG_LEN(size_of::<c_int>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<c_int>(), fd);
    }
    sys!(libc::sendmsg(via, &msg, 0)).map(drop)
}

/// Receives one fd sent by [`send_fd`].
pub fn recv_fd(via: c_int, flags: c_int) -> Result<Fd, String> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
    let space = unsafe { libc::CMSG_SPACE(size_of::<c_int>() as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut msg: libc::msghdr = zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    sys!(libc::recvmsg(via, &mut msg, flags)).ctx("recvmsg")?;
    // SAFETY: CMSG_FIRSTHDR is null unless the returned `msg_controllen` holds a whole
    // header, which then lies in `cbuf`; `cbuf` has room for one int after it however
    // short the kernel's message, so the unaligned read stays inside `cbuf`.
    unsafe {
        let cm = libc::CMSG_FIRSTHDR(&msg);
        if cm.is_null() || (*cm).cmsg_type != libc::SCM_RIGHTS {
            return Err("no SCM_RIGHTS".into());
        }
        Ok(Fd::new(std::ptr::read_unaligned(
            libc::CMSG_DATA(cm).cast::<c_int>(),
        )))
    }
}

fn unix_pair() -> Result<(Fd, Fd), String> {
    let mut sv = [0; 2];
    sys!(libc::socketpair(
        libc::AF_UNIX,
        libc::SOCK_STREAM,
        0,
        sv.as_mut_ptr()
    ))
    .ctx("socketpair")?;
    Ok((Fd::new(sv[0]), Fd::new(sv[1])))
}

fn scm_rights_to_child() -> Res {
    let (ua, ub) = unix_pair()?;
    let child = fork_with(|| {
        let Ok(fd) = recv_fd(ub.raw(), 0) else {
            return 1;
        };
        let ok = send(fd.raw(), b"via-scm-rights", 0).is_ok();
        let reply = recv_text(fd.raw(), 16, 0);
        if ok && reply == "\"ack\"" { 0 } else { 2 }
    })?;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send_fd(ua.raw(), c.raw()).ctx("sendmsg")?;
    drop(c);
    let got = recv_text(s.raw(), 32, 0);
    send(s.raw(), b"ack", 0).ctx("send")?;
    let status = child.wait();
    Ok(format!(
        "peer_got={got} child={status} then={}",
        recv_text(s.raw(), 8, 0)
    ))
}

fn scm_rights_listener_to_child() -> Res {
    let (ua, ub) = unix_pair()?;
    let child = fork_with(|| {
        let Ok(l) = recv_fd(ub.raw(), libc::MSG_CMSG_CLOEXEC) else {
            return 1;
        };
        match accept(l.raw()) {
            Ok(a) => send(a.raw(), b"accepted-by-child", 0).map_or(2, |_| 0),
            Err(_) => 3,
        }
    })?;
    let (l, addr) = listener(libc::AF_INET)?;
    send_fd(ua.raw(), l.raw()).ctx("sendmsg")?;
    drop(l);
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    Ok(format!(
        "client_got={} child={}",
        recv_text(c.raw(), 32, 0),
        child.wait()
    ))
}

fn scm_rights_self() -> Res {
    let (ua, ub) = unix_pair()?;
    let (c, s) = tcp_pair(libc::AF_INET6)?;
    send_fd(ua.raw(), c.raw()).ctx("sendmsg")?;
    let expect = lowest_free_fd().ctx("open")?;
    let got = recv_fd(ub.raw(), libc::MSG_CMSG_CLOEXEC)?;
    let ty = get_int(got.raw(), libc::SOL_SOCKET, libc::SO_TYPE).map(socktype_name);
    send(got.raw(), b"x", 0).ctx("send")?;
    Ok(format!(
        "received=lowest:{} {} SO_TYPE={} peer_got={}",
        got.raw() == expect,
        cloexec_state(got.raw()),
        show(ty),
        recv_text(s.raw(), 8, 0)
    ))
}

/// Starts a thread blocked in `recv(fd)`; returns its result channel once it sleeps.
fn blocked_reader(fd: c_int) -> Result<mpsc::Receiver<String>, String> {
    let (tid_tx, tid_rx) = mpsc::channel();
    let (res_tx, res_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tid_tx.send(gettid());
        let mut buf = [0u8; 16];
        let first = match recv(fd, &mut buf, 0) {
            Ok(0) => "EOF".to_string(),
            Ok(n) => format!("{:?}", String::from_utf8_lossy(&buf[..n])),
            Err(e) => e.to_string(),
        };
        let second = show(recv(fd, &mut buf, libc::MSG_DONTWAIT));
        let _ = res_tx.send(format!("recv={first} next={second}"));
    });
    let tid = tid_rx.recv().map_err(|e| e.to_string())?;
    settle_blocked(tid);
    Ok(res_rx)
}

fn close_while_recv_blocked() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let fd = s.into_raw();
    let res = blocked_reader(fd)?;
    let closed = show(sys!(libc::close(fd)));
    send(c.raw(), b"after-close", 0).ctx("send")?;
    let out = res.recv_timeout(std::time::Duration::from_secs(3));
    Ok(format!(
        "close={closed} thread: {}",
        out.unwrap_or_else(|_| "still blocked".into())
    ))
}

fn shutdown_wakes_blocked_recv() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let res = blocked_reader(s.raw())?;
    let r = show(sys!(libc::shutdown(s.raw(), libc::SHUT_RDWR)));
    let out = res.recv_timeout(std::time::Duration::from_secs(3));
    Ok(format!(
        "shutdown={r} thread: {}",
        out.unwrap_or_else(|_| "still blocked".into())
    ))
}
