//! COMPAT 4 — signals: a handler without `SA_RESTART` interrupts blocking socket calls
//! with `EINTR`; with `SA_RESTART` they continue; `poll`/`epoll_wait`/`select` return
//! `EINTR` regardless; a handler may itself make socket calls; SIGURG and SIGIO arrive.
//!
//! Timing: the signal comes from a one-shot `ITIMER_REAL` 50 ms after the call starts,
//! and a peer (a forked process) that must be waited for acts at 150 ms, so there is
//! 100 ms of slack either way. The process is single-threaded, so SIGALRM always lands
//! on the thread in the call.

use std::sync::atomic::{AtomicI32, Ordering};

use libc::c_int;

use super::epoll::Ep;
use super::{Case, Res};
use crate::net::{
    accept, connect, fill_send_buffer, listener, recv_text, send, setsockopt, tcp_pair, tcp_socket,
    udp_bound, wait_for,
};
use crate::proc::{
    alarm_every_us, alarm_ms, alarm_us, count_signal, fork_with, mask_signal, on_signal,
    set_disposition, signal_count,
};
use crate::sys::{Ctx, Errno, show, sleep_ms, zeroed};

pub const CASES: &[Case] = &[
    Case::new("sig.recv_eintr_no_restart", recv_eintr_no_restart),
    Case::new("sig.recv_sa_restart_continues", recv_sa_restart_continues),
    Case::new("sig.accept_eintr_no_restart", accept_eintr_no_restart),
    Case::new(
        "sig.accept_sa_restart_continues",
        accept_sa_restart_continues,
    ),
    Case::new("sig.send_blocked_interrupted", send_blocked_interrupted),
    Case::new(
        "sig.send_interrupted_while_copying",
        send_interrupted_while_copying,
    ),
    Case::new("sig.poll_eintr_despite_restart", poll_eintr_despite_restart),
    Case::new(
        "sig.epoll_wait_eintr_despite_restart",
        epoll_wait_eintr_despite_restart,
    ),
    Case::new("sig.poll_eintr_at_once", poll_eintr_at_once),
    Case::new("sig.epoll_wait_eintr_at_once", epoll_wait_eintr_at_once),
    Case::new("sig.select_eintr_at_once", select_eintr_at_once),
    Case::new(
        "sig.select_eintr_despite_restart",
        select_eintr_despite_restart,
    ),
    Case::new("sig.ppoll_mask_lets_signal_in", ppoll_mask_lets_signal_in),
    Case::new("sig.rcvtimeo_not_restarted", rcvtimeo_not_restarted),
    Case::new("sig.handler_sends_other_socket", handler_sends_other_socket),
    Case::new("sig.handler_sends_same_socket", handler_sends_same_socket),
    Case::new("sig.sigurg_on_oob", sigurg_on_oob),
    Case::new("sig.sigio_o_async", sigio_o_async),
    Case::new("sig.vfork_child_resets_handler", vfork_child_resets_handler),
];

const RESTART: c_int = libc::SA_RESTART;

fn counted(r: String) -> String {
    format!("{r} handler_ran={}", signal_count())
}

fn recv_eintr_no_restart() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    on_signal(libc::SIGALRM, count_signal, 0).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    Ok(counted(format!("recv={}", recv_text(s.raw(), 16, 0))))
}

fn recv_sa_restart_continues() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    on_signal(libc::SIGALRM, count_signal, RESTART).ctx("sigaction")?;
    let peer = fork_with(|| {
        sleep_ms(150);
        send(c.raw(), b"late", 0).map_or(1, |_| 0)
    })?;
    alarm_ms(50).ctx("setitimer")?;
    let r = recv_text(s.raw(), 16, 0);
    Ok(counted(format!("recv={r} peer={}", peer.wait())))
}

fn accept_eintr_no_restart() -> Res {
    let (l, _) = listener(libc::AF_INET)?;
    on_signal(libc::SIGALRM, count_signal, 0).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    Ok(counted(format!(
        "accept={}",
        show(accept(l.raw()).map(|_| 0))
    )))
}

fn accept_sa_restart_continues() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    on_signal(libc::SIGALRM, count_signal, RESTART).ctx("sigaction")?;
    let peer = fork_with(|| {
        sleep_ms(150);
        let Ok(c) = tcp_socket(libc::AF_INET) else {
            return 1;
        };
        if connect(c.raw(), &addr).is_err() {
            return 2;
        }
        send(c.raw(), b"hi", 0).map_or(3, |_| 0)
    })?;
    alarm_ms(50).ctx("setitimer")?;
    let r = match accept(l.raw()) {
        Ok(a) => format!("accepted recv={}", recv_text(a.raw(), 8, 0)),
        Err(e) => e.to_string(),
    };
    Ok(counted(format!("accept={r} peer={}", peer.wait())))
}

fn send_blocked_interrupted() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    fill_send_buffer(c.raw())?;
    sleep_ms(20);
    fill_send_buffer(c.raw())?;
    on_signal(libc::SIGALRM, count_signal, 0).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    let big = vec![0u8; 1 << 20];
    // EINTR if nothing was sent before the signal, else the short count.
    let r = match send(c.raw(), &big, libc::MSG_NOSIGNAL) {
        Err(e) if e.0 == libc::EINTR => "interrupted".to_string(),
        Ok(n) if n < big.len() => "interrupted".to_string(),
        other => show(other),
    };
    Ok(counted(format!("send={r}")))
}

// A signal 200 µs into a large blocking send, while ferry's shim is still copying the
// first bytes into its free buffers rather than waiting for room: the send ends as soon
// as it has to wait (a short count), as natively, not when the next signal comes a
// second later. On a busy machine the timer may fire before the send has begun (then it
// waits for the next one, natively too): up to three tries, the first quick one ends them.
fn send_interrupted_while_copying() -> Res {
    on_signal(libc::SIGALRM, count_signal, 0).ctx("sigaction")?;
    let big = vec![1u8; 64 << 20];
    let mut got = String::new();
    for _ in 0..3 {
        let (c, _s) = tcp_pair(libc::AF_INET)?;
        let before = signal_count();
        let t0 = std::time::Instant::now();
        alarm_every_us(200, 1_000_000).ctx("setitimer")?;
        let r = match send(c.raw(), &big, libc::MSG_NOSIGNAL) {
            Err(e) if e.0 == libc::EINTR => "interrupted".to_string(),
            Ok(n) if n < big.len() => "interrupted".to_string(),
            other => show(other),
        };
        let quick = t0.elapsed() < std::time::Duration::from_millis(500);
        alarm_us(0).ctx("disarm")?;
        got = format!(
            "send={r} within_500ms={quick} handler_ran={}",
            signal_count() - before
        );
        if quick {
            break;
        }
    }
    Ok(got)
}

fn poll_eintr_despite_restart() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    on_signal(libc::SIGALRM, count_signal, RESTART).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    let mut p = libc::pollfd {
        fd: s.raw(),
        events: libc::POLLIN,
        revents: 0,
    };
    Ok(counted(format!(
        "poll={}",
        show(sys!(libc::poll(&mut p, 1, 3000)))
    )))
}

fn epoll_wait_eintr_despite_restart() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), libc::EPOLLIN as u32, 1)?;
    on_signal(libc::SIGALRM, count_signal, RESTART).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    Ok(counted(format!(
        "epoll_wait={}",
        show(ep.wait(4, 3000).map(|v| v.len()))
    )))
}

// A signal 100 µs into the wait: ferry's wait is still spinning before it sleeps (S0's
// SBW) and must end with EINTR all the same, not sleep out its timeout. A first wait
// without a timeout gets the socket's set-up (its first watch) out of the way. On a busy
// machine the timer may fire before the wait has begun (then the wait times out, natively
// too): up to five tries, the first EINTR ends them.
fn eintr_at_once(what: &str, wait: impl Fn(c_int) -> String) -> Res {
    on_signal(libc::SIGALRM, count_signal, RESTART).ctx("sigaction")?;
    wait(0);
    let mut got = String::new();
    for _ in 0..5 {
        alarm_us(100).ctx("setitimer")?;
        got = wait(300);
        if got == "EINTR" {
            break;
        }
    }
    Ok(format!("{what}={got}"))
}

fn poll_eintr_at_once() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    eintr_at_once("poll", |ms| {
        let mut p = libc::pollfd {
            fd: s.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        show(sys!(libc::poll(&mut p, 1, ms)))
    })
}

fn epoll_wait_eintr_at_once() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), libc::EPOLLIN as u32, 1)?;
    eintr_at_once("epoll_wait", |ms| show(ep.wait(4, ms).map(|v| v.len())))
}

/// `select` for `fd` to become readable, waiting at most `ms` milliseconds.
fn select_readable(fd: c_int, ms: c_int) -> Result<c_int, Errno> {
    let mut rd: libc::fd_set = zeroed();
    // SAFETY: `rd` is a live local `fd_set`; the libc crate's FD_SET indexes its bit
    // array with a bounds check (an fd beyond FD_SETSIZE panics, it is never written past).
    unsafe { libc::FD_SET(fd, &mut rd) };
    let mut tv = libc::timeval {
        tv_sec: libc::time_t::from(ms / 1000),
        tv_usec: libc::suseconds_t::from(ms % 1000) * 1000,
    };
    let null = std::ptr::null_mut();
    sys!(libc::select(fd + 1, &mut rd, null, null, &mut tv))
}

fn select_eintr_at_once() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    eintr_at_once("select", |ms| show(select_readable(s.raw(), ms)))
}

fn select_eintr_despite_restart() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    on_signal(libc::SIGALRM, count_signal, RESTART).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    let r = show(select_readable(s.raw(), 3000));
    Ok(counted(format!("select={r}")))
}

fn ppoll_mask_lets_signal_in() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    on_signal(libc::SIGALRM, count_signal, RESTART).ctx("sigaction")?;
    mask_signal(libc::SIGALRM, true).ctx("sigmask")?;
    alarm_ms(50).ctx("setitimer")?;
    sleep_ms(80);
    let blocked_meanwhile = signal_count();
    let mut p = libc::pollfd {
        fd: s.raw(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: 3,
        tv_nsec: 0,
    };
    let mut empty: libc::sigset_t = zeroed();
    // SAFETY: `empty` is a live local sigset for sigemptyset to write.
    unsafe { libc::sigemptyset(&mut empty) };
    let r = show(sys!(libc::ppoll(&mut p, 1, &ts, &empty)));
    Ok(counted(format!(
        "ran_while_blocked={blocked_meanwhile} ppoll={r}"
    )))
}

fn rcvtimeo_not_restarted() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let tv = libc::timeval {
        tv_sec: 3,
        tv_usec: 0,
    };
    setsockopt(s.raw(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv).ctx("setsockopt")?;
    on_signal(libc::SIGALRM, count_signal, RESTART).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    Ok(counted(format!("recv={}", recv_text(s.raw(), 16, 0))))
}

/// The fd the sending handlers write to.
static HANDLER_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn send_from_handler(_sig: c_int) {
    let fd = HANDLER_FD.load(Ordering::SeqCst);
    let msg = b"from-handler";
    // SAFETY: `msg` is a static byte string read for its length; `send` is
    // async-signal-safe, so calling it from a handler is allowed.
    unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) };
}

fn handler_sends_other_socket() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    HANDLER_FD.store(c.raw(), Ordering::SeqCst);
    on_signal(libc::SIGALRM, send_from_handler, RESTART).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    Ok(format!("recv_in_main={}", recv_text(s.raw(), 32, 0)))
}

fn handler_sends_same_socket() -> Res {
    let (u, addr) = udp_bound(libc::AF_INET)?;
    connect(u.raw(), &addr).ctx("connect")?;
    HANDLER_FD.store(u.raw(), Ordering::SeqCst);
    on_signal(libc::SIGALRM, send_from_handler, RESTART).ctx("sigaction")?;
    alarm_ms(50).ctx("setitimer")?;
    Ok(format!("recv_same_socket={}", recv_text(u.raw(), 32, 0)))
}

fn sigurg_on_oob() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    on_signal(libc::SIGURG, count_signal, RESTART).ctx("sigaction")?;
    let own = show(sys!(libc::fcntl(s.raw(), libc::F_SETOWN, libc::getpid())));
    send(c.raw(), b"!", libc::MSG_OOB).ctx("send")?;
    wait_for(s.raw(), libc::POLLPRI).ctx("poll")?;
    sleep_ms(10);
    let oob = recv_text(s.raw(), 1, libc::MSG_OOB);
    Ok(counted(format!("F_SETOWN={own} oob={oob}")))
}

fn sigio_o_async() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    on_signal(libc::SIGIO, count_signal, RESTART).ctx("sigaction")?;
    let own = show(sys!(libc::fcntl(s.raw(), libc::F_SETOWN, libc::getpid())));
    let fl = sys!(libc::fcntl(s.raw(), libc::F_GETFL)).ctx("F_GETFL")?;
    let set = show(sys!(libc::fcntl(
        s.raw(),
        libc::F_SETFL,
        fl | libc::O_ASYNC
    )));
    let before = signal_count();
    send(c.raw(), b"x", 0).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    sleep_ms(10);
    Ok(format!(
        "F_SETOWN={own} O_ASYNC={set} sigio_after_send={}",
        signal_count() > before
    ))
}

/// A `vfork` child (`CLONE_VM | CLONE_VFORK`, as Python's `subprocess` makes) that
/// resets a handler before it would exec changes its own disposition only: the parent's
/// handler still runs afterwards.
fn vfork_child_resets_handler() -> Res {
    extern "C" fn child(_: *mut libc::c_void) -> c_int {
        let _ = set_disposition(libc::SIGUSR1, libc::SIG_DFL);
        0
    }
    on_signal(libc::SIGUSR1, count_signal, RESTART).ctx("sigaction")?;
    let before = signal_count();
    let mut stack = vec![0u8; 256 * 1024];
    // SAFETY: the child runs `child` on its own stack (the top of `stack`, which
    // outlives it: CLONE_VFORK suspends this thread until the child exits) and makes
    // only a sigaction call; it shares this process's memory, as a vfork child does.
    let pid = unsafe {
        libc::clone(
            child,
            stack.as_mut_ptr().add(stack.len() - 64).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::null_mut(),
        )
    };
    if pid < 0 {
        return Err("clone failed".into());
    }
    let mut status = 0;
    sys!(libc::waitpid(pid, &mut status, 0)).ctx("waitpid")?;
    sys!(libc::kill(libc::getpid(), libc::SIGUSR1)).ctx("kill")?;
    sleep_ms(10);
    let ran = signal_count() - before;
    set_disposition(libc::SIGUSR1, libc::SIG_DFL).ctx("reset")?;
    Ok(format!("child_status={status} parent_handler_ran={ran}"))
}
