//! COMPAT 1 — a real fd per socket, numbered like any other: lowest free number, no
//! offsets, no extra fds, below FD_SETSIZE, visible to `fstat`/`fcntl`/`/proc`.
//!
//! These are the cases allowed to print fd numbers, and then only as relations ("the
//! fd `/dev/null` would get") or where the number is forced (fd 0 after closing stdin).

use libc::c_int;

use super::{Case, Res};
use crate::net::{accept, connect, listener, recv_text, send, tcp_pair, tcp_socket, udp_socket};
use crate::sys::{Ctx, Fd, cloexec_state, dev_null, fd_count, lowest_free_fd, pipe, show, zeroed};

pub const CASES: &[Case] = &[
    Case::new("fd.socket_gets_lowest_free", socket_gets_lowest_free),
    Case::new("fd.consecutive_and_reused", consecutive_and_reused),
    Case::new("fd.interleaved_with_pipe", interleaved_with_pipe),
    Case::new("fd.accept_fills_hole", accept_fills_hole),
    Case::new("fd.socket_in_stdin_slot", socket_in_stdin_slot),
    Case::new("fd.one_fd_per_socket", one_fd_per_socket),
    Case::new("fd.past_1024_no_gaps", past_1024_no_gaps),
    Case::new("fd.fstat_is_socket", fstat_is_socket),
    Case::new("fd.proc_link_is_socket", proc_link_is_socket),
    Case::new("fd.fcntl_flags", fcntl_flags),
    Case::new("fd.double_close_ebadf", double_close_ebadf),
];

fn socket_gets_lowest_free() -> Res {
    let expect = lowest_free_fd().ctx("open")?;
    let tcp = tcp_socket(libc::AF_INET).ctx("socket")?;
    let udp = udp_socket(libc::AF_INET6).ctx("socket")?;
    Ok(format!(
        "tcp=lowest:{} udp6=next:{} below_FD_SETSIZE={}",
        tcp.raw() == expect,
        udp.raw() == expect + 1,
        (udp.raw() as usize) < libc::FD_SETSIZE
    ))
}

fn consecutive_and_reused() -> Res {
    let s1 = tcp_socket(libc::AF_INET).ctx("socket")?;
    let s2 = tcp_socket(libc::AF_INET).ctx("socket")?;
    let n1 = s1.raw();
    let after_s2 = s2.raw() - n1;
    s1.close().ctx("close")?;
    let s3 = udp_socket(libc::AF_INET).ctx("socket")?;
    Ok(format!(
        "s2=s1+{after_s2} s3_after_close_s1=s1+{}",
        s3.raw() - n1
    ))
}

fn interleaved_with_pipe() -> Res {
    let (p0, p1) = pipe(0).ctx("pipe")?;
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let rel = s.raw() - p0.raw();
    let p0n = p0.raw();
    drop(p0);
    let s2 = tcp_socket(libc::AF_INET).ctx("socket")?;
    let (q0, _q1) = pipe(0).ctx("pipe")?;
    Ok(format!(
        "pipe=p,p+1 socket=p+{rel} socket_after_close_p=p+{} next_pipe=p+{} (write end p+{})",
        s2.raw() - p0n,
        q0.raw() - p0n,
        p1.raw() - p0n
    ))
}

fn accept_fills_hole() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let hole = dev_null().ctx("open")?;
    let _plug = dev_null().ctx("open")?;
    let hole_n = hole.raw();
    drop(hole);
    let a = accept(l.raw()).ctx("accept")?;
    Ok(format!("accepted_into_hole={}", a.raw() == hole_n))
}

fn socket_in_stdin_slot() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    // SAFETY: an integer; the case runs alone in its own child process, which owns its
    // stdin and does not use it (freeing the slot is the point of the case).
    unsafe { libc::close(0) };
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let fd = s.raw();
    connect(fd, &addr).ctx("connect")?;
    let a = accept(l.raw()).ctx("accept")?;
    send(a.raw(), b"via-fd0", 0).ctx("send")?;
    Ok(format!("fd={fd} recv={}", recv_text(fd, 32, 0)))
}

fn one_fd_per_socket() -> Res {
    crate::net::warm_up()?;
    let before = fd_count()?;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (l, _) = listener(libc::AF_INET6)?;
    let u = udp_socket(libc::AF_INET).ctx("socket")?;
    let during = fd_count()?;
    drop((c, s, l, u));
    let after = fd_count()?;
    Ok(format!(
        "4 sockets: +{} fds, after close: +{}",
        during - before,
        after - before
    ))
}

/// Programs that open more than 1024 sockets (VMA broke there): fds keep coming in order.
fn past_1024_no_gaps() -> Res {
    let mut rl: libc::rlimit = zeroed();
    sys!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl)).ctx("getrlimit")?;
    if rl.rlim_max < 2048 {
        // Same answer natively and under ferry on such a machine; says why it did nothing.
        return Ok("skipped: hard RLIMIT_NOFILE < 2048".into());
    }
    if rl.rlim_cur < 2048 {
        rl.rlim_cur = 2048;
        sys!(libc::setrlimit(libc::RLIMIT_NOFILE, &rl)).ctx("setrlimit")?;
    }
    let open_before: Vec<c_int> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut socks = Vec::new();
    for _ in 0..1100 {
        socks.push(tcp_socket(libc::AF_INET).ctx("socket")?);
    }
    let first = socks[0].raw();
    let last = socks[socks.len() - 1].raw();
    let ascending = socks.windows(2).all(|w| w[0].raw() < w[1].raw());
    let foreign = open_before
        .iter()
        .filter(|&&fd| fd > first && fd < last)
        .count();
    let no_gaps = (last - first + 1) as usize == socks.len() + foreign;
    Ok(format!(
        "1100 sockets ascending={ascending} no_gaps={no_gaps} past_1024={}",
        last >= 1024
    ))
}

fn fstat_is_socket() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let u = udp_socket(libc::AF_INET6).ctx("socket")?;
    let kind = |fd: c_int| {
        let mut st: libc::stat = zeroed();
        match sys!(libc::fstat(fd, &mut st)) {
            Ok(_) if st.st_mode & libc::S_IFMT == libc::S_IFSOCK => "S_IFSOCK".to_string(),
            Ok(_) => format!("mode={:o}", st.st_mode & libc::S_IFMT),
            Err(e) => e.to_string(),
        }
    };
    Ok(format!(
        "client={} accepted={} udp6={}",
        kind(c.raw()),
        kind(s.raw()),
        kind(u.raw())
    ))
}

fn proc_link_is_socket() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let link = |fd: &Fd| match std::fs::read_link(format!("/proc/self/fd/{}", fd.raw())) {
        Ok(p) => {
            let p = p.to_string_lossy().into_owned();
            if p.starts_with("socket:[") {
                "socket:[..]".to_string()
            } else {
                p
            }
        }
        Err(e) => format!("readlink: {e}"),
    };
    Ok(format!("client={} accepted={}", link(&c), link(&s)))
}

fn fcntl_flags() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let fl = sys!(libc::fcntl(s.raw(), libc::F_GETFL)).ctx("F_GETFL")?;
    let acc = match fl & libc::O_ACCMODE {
        libc::O_RDWR => "O_RDWR",
        libc::O_RDONLY => "O_RDONLY",
        _ => "O_WRONLY",
    };
    let plain = cloexec_state(s.raw());
    let set = show(sys!(libc::fcntl(s.raw(), libc::F_SETFD, libc::FD_CLOEXEC)));
    let ce = crate::net::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
        .ctx("socket")?;
    Ok(format!(
        "access={acc} nonblock={} plain={plain} F_SETFD={set} then={} SOCK_CLOEXEC={}",
        fl & libc::O_NONBLOCK != 0,
        cloexec_state(s.raw()),
        cloexec_state(ce.raw())
    ))
}

fn double_close_ebadf() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let fd = s.into_raw();
    let first = show(sys!(libc::close(fd)));
    let second = show(sys!(libc::close(fd)));
    let getfd = show(sys!(libc::fcntl(fd, libc::F_GETFD)));
    Ok(format!(
        "close={first} close_again={second} F_GETFD={getfd}"
    ))
}
