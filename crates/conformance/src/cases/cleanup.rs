//! COMPAT 12 — cleanup: no fd leaks over thousands of sockets, `RLIMIT_NOFILE` honoured
//! for `socket` and `accept`, ports released on close, a peer that exits or is killed
//! leaves an EOF behind and nothing else, `close_range` closes sockets.

use libc::c_int;

use super::{Case, Res};
use crate::net::{
    Addr, accept, bind, connect, listen, listener, recv_text, send, tcp_pair, tcp_socket,
    udp_socket,
};
use crate::proc::{Child, fork_with, settle_blocked_process};
use crate::sys::{Ctx, fd_count, show, zeroed};

pub const CASES: &[Case] = &[
    Case::new("clean.open_close_2000_no_leak", open_close_2000_no_leak),
    Case::new("clean.rlimit_socket_emfile", rlimit_socket_emfile),
    Case::new("clean.rlimit_accept_emfile", rlimit_accept_emfile),
    Case::new("clean.port_released_on_close", port_released_on_close),
    Case::new("clean.exited_child_peer_eof", exited_child_peer_eof),
    Case::new("clean.killed_child_peer_eof", killed_child_peer_eof),
    Case::new(
        "clean.killed_child_port_released",
        killed_child_port_released,
    ),
    Case::new(
        "clean.close_range_closes_sockets",
        close_range_closes_sockets,
    ),
];

fn open_close_2000_no_leak() -> Res {
    crate::net::warm_up()?;
    let before = fd_count()?;
    let mut ok = 0;
    for i in 0..2000 {
        let family = if i % 2 == 0 {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let s = if i % 3 == 0 {
            udp_socket(family)
        } else {
            tcp_socket(family)
        };
        if s.and_then(|s| s.close()).is_ok() {
            ok += 1;
        }
    }
    for _ in 0..100 {
        drop(tcp_pair(libc::AF_INET)?);
    }
    let after = fd_count()?;
    Ok(format!(
        "closed_ok={ok} pairs=100 fd_delta={}",
        after as i64 - before as i64
    ))
}

/// Lowers the soft `RLIMIT_NOFILE` to `limit`; returns how many fds below it are free.
fn lower_nofile(limit: u64) -> Result<usize, String> {
    crate::net::warm_up()?;
    let free = (0..limit as c_int)
        .filter(|&fd| sys!(libc::fcntl(fd, libc::F_GETFD)).is_err())
        .count();
    let mut rl: libc::rlimit = zeroed();
    sys!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl)).ctx("getrlimit")?;
    rl.rlim_cur = limit;
    sys!(libc::setrlimit(libc::RLIMIT_NOFILE, &rl)).ctx("setrlimit")?;
    Ok(free)
}

fn rlimit_socket_emfile() -> Res {
    let free = lower_nofile(64)?;
    let mut socks = Vec::new();
    let err = loop {
        match tcp_socket(libc::AF_INET) {
            Ok(s) => socks.push(s),
            Err(e) => break e,
        }
        if socks.len() > 1000 {
            return Ok("no limit hit".into());
        }
    };
    let all_below = socks.iter().all(|s| s.raw() < 64);
    let filled = socks.len() == free;
    socks.pop();
    let again = show(tcp_socket(libc::AF_INET).map(|s| s.raw() < 64));
    Ok(format!(
        "error={err} filled_every_free_slot={filled} all_below_limit={all_below} after_close_one={again}"
    ))
}

fn rlimit_accept_emfile() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    lower_nofile(64)?;
    let mut fill = Vec::new();
    while let Ok(fd) = crate::sys::dev_null() {
        fill.push(fd);
    }
    let full = show(accept(l.raw()).map(|_| 0));
    fill.pop();
    let a = accept(l.raw());
    let ok = match &a {
        Ok(a) => {
            send(c.raw(), b"kept", 0).ctx("send")?;
            recv_text(a.raw(), 8, 0)
        }
        Err(e) => e.to_string(),
    };
    Ok(format!("accept_at_limit={full} after_free_one={ok}"))
}

fn port_released_on_close() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    drop(l);
    let again = tcp_socket(libc::AF_INET).ctx("socket")?;
    let r = show(bind(again.raw(), &addr).map(|_| 0));
    let (u, uaddr) = crate::net::udp_bound(libc::AF_INET6)?;
    drop(u);
    let u2 = udp_socket(libc::AF_INET6).ctx("socket")?;
    let ru = show(bind(u2.raw(), &uaddr).map(|_| 0));
    Ok(format!("tcp_rebind={r} udp6_rebind={ru}"))
}

fn exited_child_peer_eof() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let child = fork_with(|| {
        let mut keep = Vec::new();
        for _ in 0..5 {
            let Ok(c) = tcp_socket(libc::AF_INET) else {
                return 1;
            };
            if connect(c.raw(), &addr).is_err() {
                return 2;
            }
            let _ = send(c.raw(), b"x", 0);
            keep.push(c.into_raw());
        }
        0
    })?;
    let mut results = Vec::new();
    for _ in 0..5 {
        let a = accept(l.raw()).ctx("accept")?;
        let first = recv_text(a.raw(), 4, 0);
        results.push(format!("{first}+{}", recv_text(a.raw(), 4, 0)));
    }
    results.dedup();
    Ok(format!(
        "child={} peers={}",
        child.wait(),
        results.join(",")
    ))
}

fn killed_child_peer_eof() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let child = fork_with(|| {
        let Ok(c) = tcp_socket(libc::AF_INET) else {
            return 1;
        };
        if connect(c.raw(), &addr).is_err() {
            return 2;
        }
        let _ = send(c.raw(), b"hi", 0);
        let _ = recv_text(c.raw(), 4, 0);
        3
    })?;
    let a = accept(l.raw()).ctx("accept")?;
    let hi = recv_text(a.raw(), 4, 0);
    settle_blocked_process(child.pid());
    // SAFETY: integers only; `child` is not reaped yet (its `wait` follows), so its pid
    // still names it.
    unsafe { libc::kill(child.pid(), libc::SIGKILL) };
    let status = child.wait();
    Ok(format!(
        "got={hi} child={status} then={}",
        recv_text(a.raw(), 4, 0)
    ))
}

fn killed_child_port_released() -> Res {
    let (pr, pw) = crate::sys::pipe(0).ctx("pipe")?;
    let child: Child = fork_with(|| {
        let Ok((l, addr)) = listener(libc::AF_INET) else {
            return 1;
        };
        let port = addr.port().to_ne_bytes();
        // SAFETY: `port` is a live 2-byte array, read for its length.
        unsafe { libc::write(pw.raw(), port.as_ptr().cast(), 2) };
        let _ = accept(l.raw());
        0
    })?;
    let mut port = [0u8; 2];
    sys!(libc::read(pr.raw(), port.as_mut_ptr().cast(), 2)).ctx("read")?;
    let port = u16::from_ne_bytes(port);
    let busy = tcp_socket(libc::AF_INET).ctx("socket")?;
    let while_alive = show(bind(busy.raw(), &Addr::loopback(libc::AF_INET, port)).map(|_| 0));
    // SAFETY: integers only; `child` is not reaped yet (its `wait` follows), so its pid
    // still names it.
    unsafe { libc::kill(child.pid(), libc::SIGKILL) };
    let status = child.wait();
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let after = show(bind(s.raw(), &Addr::loopback(libc::AF_INET, port)).map(|_| 0));
    let lst = show(listen(s.raw(), 1).map(|_| 0));
    Ok(format!(
        "bind_while_alive={while_alive} child={status} bind_after_kill={after} listen={lst}"
    ))
}

fn close_range_closes_sockets() -> Res {
    let mut servers = Vec::new();
    let base: c_int = 120;
    for i in 0..10 {
        let (c, s) = tcp_pair(libc::AF_INET)?;
        let d = sys!(libc::fcntl(c.raw(), libc::F_DUPFD, base + i)).ctx("F_DUPFD")?;
        if d != base + i {
            return Err(format!("F_DUPFD gave {d}"));
        }
        drop(c);
        servers.push(s);
    }
    let r = show(sys!(libc::close_range(base as u32, (base + 9) as u32, 0)));
    let eofs = servers
        .iter()
        .filter(|s| recv_text(s.raw(), 4, 0) == "EOF")
        .count();
    let gone = (base..base + 10).all(|fd| sys!(libc::fcntl(fd, libc::F_GETFD)).is_err());
    Ok(format!("close_range={r} peers_eof={eofs} fds_gone={gone}"))
}
