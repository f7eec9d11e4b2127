//! COMPAT 3 (part 2) — blocking sockets: reads return what is there, EOF is 0,
//! `MSG_PEEK`, `MSG_WAITALL`, `SO_RCVTIMEO`/`SO_SNDTIMEO`, refused connects, `EPIPE` with
//! and without SIGPIPE, resets.

use std::time::{Duration, Instant};

use libc::c_int;

use super::{Case, Res};
use crate::net::{
    closed_port, connect, fill_send_buffer, fionread, recv, recv_text, send, setsockopt, so_error,
    tcp_pair, tcp_socket, wait_for,
};
use crate::proc::{count_signal, fork_with, on_signal, set_disposition, signal_count};
use crate::sys::{Ctx, Fd, show, sleep_ms, zeroed};

pub const CASES: &[Case] = &[
    Case::new("blk.recv_returns_available", recv_returns_available),
    Case::new("blk.recv_waits_for_data", recv_waits_for_data),
    Case::new("blk.eof_returns_zero", eof_returns_zero),
    Case::new("blk.msg_peek", msg_peek),
    Case::new("blk.msg_waitall", msg_waitall),
    Case::new("blk.msg_waitall_short_on_eof", msg_waitall_short_on_eof),
    Case::new("blk.so_rcvtimeo_eagain", so_rcvtimeo_eagain),
    Case::new("blk.so_sndtimeo_set_get", so_sndtimeo_set_get),
    Case::new("blk.so_sndtimeo_times_out", so_sndtimeo_times_out),
    Case::new("blk.connect_refused", connect_refused),
    Case::new("blk.epipe_after_shutdown_wr", epipe_after_shutdown_wr),
    Case::new("blk.epipe_after_peer_close", epipe_after_peer_close),
    Case::new("blk.msg_nosignal", msg_nosignal),
    Case::new("blk.sigpipe_default_kills", sigpipe_default_kills),
    Case::new("blk.sigpipe_ignored", sigpipe_ignored),
    Case::new("blk.unread_close_econnreset", unread_close_econnreset),
    Case::new("blk.linger_zero_rst", linger_zero_rst),
    Case::new("blk.send_to_a_peer_that_closes", send_to_a_peer_that_closes),
];

fn recv_returns_available() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"0123456789", 0).ctx("send")?;
    let mut buf = [0u8; 4096];
    Ok(format!("recv(4096)={}", show(recv(s.raw(), &mut buf, 0))))
}

fn recv_waits_for_data() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let peer = fork_with(|| {
        sleep_ms(50);
        send(c.raw(), b"late", 0).map_or(1, |_| 0)
    })?;
    let got = recv_text(s.raw(), 16, 0);
    Ok(format!("recv={got} peer={}", peer.wait()))
}

fn eof_returns_zero() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"bye", 0).ctx("send")?;
    drop(c);
    let a = recv_text(s.raw(), 16, 0);
    Ok(format!(
        "{a} {} {}",
        recv_text(s.raw(), 16, 0),
        recv_text(s.raw(), 16, 0)
    ))
}

fn msg_peek() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"hello world", 0).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    let peek = recv_text(s.raw(), 5, libc::MSG_PEEK);
    let queued = show(fionread(s.raw()));
    let all = recv_text(s.raw(), 64, 0);
    Ok(format!("peek={peek} FIONREAD={queued} recv={all}"))
}

fn msg_waitall() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let peer = fork_with(|| {
        for _ in 0..3 {
            sleep_ms(20);
            if send(c.raw(), &[9u8; 100], 0).is_err() {
                return 1;
            }
        }
        0
    })?;
    let mut buf = [0u8; 300];
    let n = show(recv(s.raw(), &mut buf, libc::MSG_WAITALL));
    Ok(format!("recv(300,WAITALL)={n} peer={}", peer.wait()))
}

fn msg_waitall_short_on_eof() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), &[1u8; 100], 0).ctx("send")?;
    drop(c);
    let mut buf = [0u8; 300];
    let n = show(recv(s.raw(), &mut buf, libc::MSG_WAITALL));
    Ok(format!(
        "recv(300,WAITALL)={n} then={}",
        recv_text(s.raw(), 8, 0)
    ))
}

fn timeval_ms(ms: i64) -> libc::timeval {
    libc::timeval {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_usec: ((ms % 1000) * 1000) as _,
    }
}

fn get_timeout(fd: c_int, opt: c_int) -> String {
    let mut tv: libc::timeval = zeroed();
    let mut len = size_of::<libc::timeval>() as libc::socklen_t;
    match sys!(libc::getsockopt(
        fd,
        libc::SOL_SOCKET,
        opt,
        (&raw mut tv).cast(),
        &mut len
    )) {
        Ok(_) => format!("{}ms", tv.tv_sec * 1000 + tv.tv_usec / 1000),
        Err(e) => e.to_string(),
    }
}

fn so_rcvtimeo_eagain() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let default = get_timeout(s.raw(), libc::SO_RCVTIMEO);
    setsockopt(
        s.raw(),
        libc::SOL_SOCKET,
        libc::SO_RCVTIMEO,
        &timeval_ms(100),
    )
    .ctx("set")?;
    let got = get_timeout(s.raw(), libc::SO_RCVTIMEO);
    let start = Instant::now();
    let r = recv_text(s.raw(), 16, 0);
    let waited = start.elapsed() >= Duration::from_millis(90);
    Ok(format!(
        "default={default} get={got} recv={r} waited_timeout={waited}"
    ))
}

fn so_sndtimeo_set_get() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let default = get_timeout(s.raw(), libc::SO_SNDTIMEO);
    let set = show(
        setsockopt(
            s.raw(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &timeval_ms(2500),
        )
        .map(|_| 0),
    );
    Ok(format!(
        "default={default} set={set} get={}",
        get_timeout(s.raw(), libc::SO_SNDTIMEO)
    ))
}

fn so_sndtimeo_times_out() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    fill_send_buffer(c.raw())?;
    sleep_ms(20);
    fill_send_buffer(c.raw())?;
    setsockopt(
        c.raw(),
        libc::SOL_SOCKET,
        libc::SO_SNDTIMEO,
        &timeval_ms(100),
    )
    .ctx("set")?;
    let big = vec![1u8; 1 << 20];
    let start = Instant::now();
    let r = send(c.raw(), &big, libc::MSG_NOSIGNAL);
    let waited = start.elapsed() >= Duration::from_millis(90);
    // Linux returns EAGAIN if nothing fit, else the short count: both mean "timed out".
    let outcome = match r {
        Err(e) if e.0 == libc::EAGAIN => "timed_out".to_string(),
        Ok(n) if n < big.len() => "timed_out".to_string(),
        other => show(other),
    };
    Ok(format!("send={outcome} waited_timeout={waited}"))
}

fn connect_refused() -> Res {
    let addr = closed_port(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    let r = show(connect(c.raw(), &addr).map(|_| 0));
    Ok(format!("connect={r} SO_ERROR_after={}", so_error(c.raw())))
}

/// Sends one byte with `flags` and reports the result and SIGPIPE count.
fn send_counting(fd: c_int, flags: c_int) -> String {
    let before = signal_count();
    let r = show(send(fd, b"x", flags));
    format!("send={r} sigpipe={}", signal_count() - before)
}

fn epipe_after_shutdown_wr() -> Res {
    on_signal(libc::SIGPIPE, count_signal, 0).ctx("sigaction")?;
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    sys!(libc::shutdown(c.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    Ok(send_counting(c.raw(), 0))
}

/// A pair whose peer has closed and answered one more byte with a reset.
fn reset_by_peer() -> Result<Fd, String> {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    drop(s);
    wait_for(c.raw(), libc::POLLRDHUP).ctx("poll")?;
    send(c.raw(), b"y", libc::MSG_NOSIGNAL).ctx("send")?;
    wait_for(c.raw(), libc::POLLHUP).ctx("poll")?;
    Ok(c)
}

fn epipe_after_peer_close() -> Res {
    on_signal(libc::SIGPIPE, count_signal, 0).ctx("sigaction")?;
    let c = reset_by_peer()?;
    Ok(send_counting(c.raw(), 0))
}

fn msg_nosignal() -> Res {
    on_signal(libc::SIGPIPE, count_signal, 0).ctx("sigaction")?;
    let c = reset_by_peer()?;
    let (c2, _s2) = tcp_pair(libc::AF_INET)?;
    sys!(libc::shutdown(c2.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    Ok(format!(
        "reset: {}; shut_wr: {}",
        send_counting(c.raw(), libc::MSG_NOSIGNAL),
        send_counting(c2.raw(), libc::MSG_NOSIGNAL)
    ))
}

fn sigpipe_default_kills() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    sys!(libc::shutdown(c.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    let child = fork_with(|| {
        let _ = set_disposition(libc::SIGPIPE, libc::SIG_DFL);
        let _ = send(c.raw(), b"x", 0);
        0
    })?;
    Ok(format!("child={}", child.wait()))
}

fn sigpipe_ignored() -> Res {
    set_disposition(libc::SIGPIPE, libc::SIG_IGN).ctx("sigaction")?;
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    sys!(libc::shutdown(c.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    Ok(format!("send={} alive", show(send(c.raw(), b"x", 0))))
}

fn unread_close_econnreset() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"unread", 0).ctx("send")?;
    // Closing with unread data (not a FIN) is what makes the reset.
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    drop(s);
    wait_for(c.raw(), libc::POLLHUP).ctx("poll")?;
    let first = recv_text(c.raw(), 16, 0);
    Ok(format!(
        "recv={first} then={} SO_ERROR={}",
        recv_text(c.raw(), 16, 0),
        so_error(c.raw())
    ))
}

fn linger_zero_rst() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    setsockopt(s.raw(), libc::SOL_SOCKET, libc::SO_LINGER, &lg).ctx("setsockopt")?;
    drop(s);
    wait_for(c.raw(), libc::POLLHUP).ctx("poll")?;
    Ok(format!(
        "peer_recv={} then={}",
        recv_text(c.raw(), 16, 0),
        recv_text(c.raw(), 16, 0)
    ))
}

/// A send's outcome: all of it, or not (a short count or a broken connection).
fn completeness(r: Result<usize, crate::sys::Errno>, len: usize) -> String {
    match r {
        Ok(n) if n == len => "complete".into(),
        Ok(_) => "incomplete".into(),
        Err(e) if e.0 == libc::EPIPE || e.0 == libc::ECONNRESET => "incomplete".into(),
        Err(e) => e.to_string(),
    }
}

// A blocking send of more than the connection can hold, to a peer that reads 1 KiB and
// closes: the send cannot complete, and must not say it did (natively a short count,
// through ferry the error; before, ferry's channel took all of it and said so), and the
// next send fails.
fn send_to_a_peer_that_closes() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let peer = fork_with(|| {
        sleep_ms(200);
        let mut b = [0u8; 1024];
        let _ = recv(s.raw(), &mut b, 0);
        0
    })?;
    drop(s);
    let big = vec![7u8; 64 << 20];
    let first = completeness(send(c.raw(), &big, libc::MSG_NOSIGNAL), big.len());
    let second = match send(c.raw(), b"more", libc::MSG_NOSIGNAL) {
        Err(e) if e.0 == libc::EPIPE || e.0 == libc::ECONNRESET => "broken".to_string(),
        other => show(other),
    };
    Ok(format!(
        "first={first} second={second} peer={}",
        peer.wait()
    ))
}
