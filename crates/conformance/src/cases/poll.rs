//! COMPAT 2 (readiness, part 1) — `poll`, `ppoll`, `select`, `pselect` over sockets,
//! alone and mixed with kernel fds (pipes, eventfds) in the same set.

use libc::c_int;

use super::{Case, Res};
use crate::flags::poll_names;
use crate::net::{
    accept, at_mark, closed_port, connect, listener, poll1, recv, recv_text, send, tcp_pair,
    tcp_socket, wait_for,
};
use crate::sys::{Ctx, Fd, pipe, set_nonblocking, show, zeroed};

pub const CASES: &[Case] = &[
    Case::new("poll.pollin_after_send", pollin_after_send),
    Case::new("poll.pollout_when_connected", pollout_when_connected),
    Case::new("poll.mixed_with_pipe", mixed_with_pipe),
    Case::new("poll.timeout_no_events", timeout_no_events),
    Case::new("poll.peer_close_rdhup", peer_close_rdhup),
    Case::new("poll.both_shut_pollhup", both_shut_pollhup),
    Case::new("poll.reset_pollerr", reset_pollerr),
    Case::new("poll.listener_pending", listener_pending),
    Case::new("poll.listener_after_accept", poll_listener_after_accept),
    Case::new("poll.closed_fd_pollnval", closed_fd_pollnval),
    Case::new("poll.negative_fd_ignored", negative_fd_ignored),
    Case::new("poll.refused_pollerr", refused_pollerr),
    Case::new("poll.many_sockets_subset", many_sockets_subset),
    Case::new("poll.oob_pollpri", oob_pollpri),
    Case::new("poll.oob_mark_in_stream", oob_mark_in_stream),
    Case::new("ppoll.timeout_then_ready", ppoll_timeout_then_ready),
    Case::new("select.read_write_sets", select_read_write_sets),
    Case::new("select.mixed_with_eventfd", select_mixed_with_eventfd),
    Case::new("select.timeout", select_timeout),
    Case::new("select.listener_after_accept", select_listener_after_accept),
    Case::new(
        "select.listener_and_stream_loop",
        select_listener_and_stream_loop,
    ),
    Case::new("select.oob_exceptfds", select_oob_exceptfds),
    Case::new("select.writer_loop_no_spin", select_writer_loop_no_spin),
    Case::new("select.closed_fd_ebadf", select_closed_fd_ebadf),
    Case::new("pselect.ready_with_mask", pselect_ready_with_mask),
    Case::new("poll.invalid_timeouts_einval", invalid_timeouts_einval),
];

const IN: i16 = libc::POLLIN;
const OUT: i16 = libc::POLLOUT;

fn pollin_after_send() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let before = poll1(s.raw(), IN, 0);
    send(c.raw(), b"ping", 0).ctx("send")?;
    let after = wait_for(s.raw(), IN);
    Ok(format!(
        "before={} after={}",
        show(before.map(poll_names)),
        show(after.map(poll_names))
    ))
}

fn pollout_when_connected() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let rc = poll1(c.raw(), OUT, 0).map(poll_names);
    let rs = poll1(s.raw(), IN | OUT, 0).map(poll_names);
    Ok(format!("client={} server={}", show(rc), show(rs)))
}

fn mixed_with_pipe() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (pr, pw) = pipe(0).ctx("pipe")?;
    let mut set = [
        libc::pollfd {
            fd: s.raw(),
            events: IN,
            revents: 0,
        },
        libc::pollfd {
            fd: pr.raw(),
            events: IN,
            revents: 0,
        },
    ];
    let round = |set: &mut [libc::pollfd; 2]| {
        let n = show(sys!(libc::poll(set.as_mut_ptr(), 2, 2000)));
        format!(
            "n={n} sock={} pipe={}",
            poll_names(set[0].revents),
            poll_names(set[1].revents)
        )
    };
    sys!(libc::write(pw.raw(), b"p".as_ptr().cast(), 1)).ctx("write")?;
    let first = round(&mut set);
    send(c.raw(), b"s", 0).ctx("send")?;
    wait_for(s.raw(), IN).ctx("poll")?;
    let second = round(&mut set);
    Ok(format!("pipe_only: {first}; both: {second}"))
}

fn timeout_no_events() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let mut p = libc::pollfd {
        fd: s.raw(),
        events: IN,
        revents: 0,
    };
    let n = show(sys!(libc::poll(&mut p, 1, 30)));
    Ok(format!("n={n} revents={}", poll_names(p.revents)))
}

fn peer_close_rdhup() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    drop(c);
    wait_for(s.raw(), libc::POLLRDHUP).ctx("poll")?;
    let all = poll1(s.raw(), IN | OUT | libc::POLLRDHUP, 0).map(poll_names);
    Ok(format!("revents={}", show(all)))
}

fn both_shut_pollhup() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    drop(c);
    wait_for(s.raw(), libc::POLLRDHUP).ctx("poll")?;
    sys!(libc::shutdown(s.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    let r = wait_for(s.raw(), libc::POLLHUP).map(poll_names);
    let all = poll1(s.raw(), IN | OUT | libc::POLLRDHUP, 0).map(poll_names);
    Ok(format!("hup={} revents={}", show(r), show(all)))
}

/// A reset connection (the peer closed with SO_LINGER 0) polls POLLERR|POLLHUP beside
/// whatever is still readable; the bytes that came before it are read first.
fn reset_pollerr() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(s.raw(), b"before", 0).ctx("send")?;
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    crate::net::setsockopt(s.raw(), libc::SOL_SOCKET, libc::SO_LINGER, &lg).ctx("linger")?;
    drop(s);
    let hup = wait_for(c.raw(), libc::POLLHUP).map(poll_names);
    let all = poll1(c.raw(), IN | OUT | libc::POLLRDHUP, 0).map(poll_names);
    let first = recv_text(c.raw(), 16, 0);
    let then = recv_text(c.raw(), 16, 0);
    let after = poll1(c.raw(), IN | OUT | libc::POLLRDHUP, 0).map(poll_names);
    Ok(format!(
        "hup={} revents={} recv={first} then={then} revents_after={}",
        show(hup),
        show(all),
        show(after)
    ))
}

fn listener_pending() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let before = poll1(l.raw(), IN | OUT, 0).map(poll_names);
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let after = wait_for(l.raw(), IN).map(poll_names);
    Ok(format!("idle={} pending={}", show(before), show(after)))
}

/// A listener whose only pending connection was accepted is no longer readable (a
/// program that calls a blocking `accept` whenever its listener polls readable would
/// hang otherwise).
fn poll_listener_after_accept() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let idle = poll1(l.raw(), IN, 0).map(poll_names);
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let pending = wait_for(l.raw(), IN).map(poll_names);
    let _s = accept(l.raw()).ctx("accept")?;
    let after = poll1(l.raw(), IN, 0).map(poll_names);
    Ok(format!(
        "idle={} pending={} accepted={}",
        show(idle),
        show(pending),
        show(after)
    ))
}

fn closed_fd_pollnval() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let fd = s.raw();
    drop(s);
    let mut p = libc::pollfd {
        fd,
        events: IN,
        revents: 0,
    };
    let n = show(sys!(libc::poll(&mut p, 1, 0)));
    Ok(format!("n={n} revents={}", poll_names(p.revents)))
}

fn negative_fd_ignored() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"x", 0).ctx("send")?;
    wait_for(s.raw(), IN).ctx("poll")?;
    let mut set = [
        libc::pollfd {
            fd: -1,
            events: IN,
            revents: 0x7,
        },
        libc::pollfd {
            fd: s.raw(),
            events: IN,
            revents: 0,
        },
    ];
    let n = show(sys!(libc::poll(set.as_mut_ptr(), 2, 0)));
    Ok(format!(
        "n={n} neg={} sock={}",
        poll_names(set[0].revents),
        poll_names(set[1].revents)
    ))
}

fn refused_pollerr() -> Res {
    let addr = closed_port(libc::AF_INET)?;
    let s = crate::net::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)
        .ctx("socket")?;
    let r = show(connect(s.raw(), &addr).map(|_| 0));
    let ev = wait_for(s.raw(), OUT).map(poll_names);
    Ok(format!("connect={r} revents={}", show(ev)))
}

fn many_sockets_subset() -> Res {
    let mut pairs = Vec::new();
    for _ in 0..40 {
        pairs.push(tcp_pair(libc::AF_INET)?);
    }
    for (c, s) in pairs.iter().step_by(2) {
        send(c.raw(), b"x", 0).ctx("send")?;
        wait_for(s.raw(), IN).ctx("poll")?;
    }
    let mut set: Vec<libc::pollfd> = pairs
        .iter()
        .map(|(_, s)| libc::pollfd {
            fd: s.raw(),
            events: IN,
            revents: 0,
        })
        .collect();
    let n = show(sys!(libc::poll(
        set.as_mut_ptr(),
        set.len() as libc::nfds_t,
        0
    )));
    let ready: Vec<usize> = (0..set.len()).filter(|&i| set[i].revents != 0).collect();
    let evens = ready.iter().all(|i| i % 2 == 0);
    Ok(format!("n={n} ready={} all_even={evens}", ready.len()))
}

fn oob_pollpri() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"!", libc::MSG_OOB).ctx("send")?;
    let pri = wait_for(s.raw(), libc::POLLPRI).map(poll_names);
    let all = poll1(s.raw(), IN | libc::POLLPRI, 0).map(poll_names);
    Ok(format!("wait={} revents={}", show(pri), show(all)))
}

/// Urgent data between ordinary bytes: a read stops at the mark, `SIOCATMARK` says so,
/// the urgent byte is read apart, and the bytes after it follow.
fn oob_mark_in_stream() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"ab", 0).ctx("send")?;
    send(c.raw(), b"c", libc::MSG_OOB).ctx("send")?;
    send(c.raw(), b"de", 0).ctx("send")?;
    let pri = wait_for(s.raw(), libc::POLLPRI).map(|r| r & libc::POLLPRI != 0);
    let before = recv_text(s.raw(), 2, libc::MSG_WAITALL);
    let mark = show(at_mark(s.raw()));
    let oob = recv_text(s.raw(), 1, libc::MSG_OOB);
    let after = recv_text(s.raw(), 2, libc::MSG_WAITALL);
    let again = recv_text(s.raw(), 1, libc::MSG_OOB);
    Ok(format!(
        "pri={} before={before} mark={mark} oob={oob} after={after} again={again} mark={}",
        show(pri),
        show(at_mark(s.raw()))
    ))
}

fn ppoll_timeout_then_ready() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let mut p = libc::pollfd {
        fd: s.raw(),
        events: IN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 30_000_000,
    };
    let mut mask: libc::sigset_t = zeroed();
    // SAFETY: `mask` is a live local sigset for sigemptyset to write.
    unsafe { libc::sigemptyset(&mut mask) };
    let first = show(sys!(libc::ppoll(&mut p, 1, &ts, &mask)));
    send(c.raw(), b"x", 0).ctx("send")?;
    let long = libc::timespec {
        tv_sec: 2,
        tv_nsec: 0,
    };
    let second = show(sys!(libc::ppoll(&mut p, 1, &long, &mask)));
    Ok(format!(
        "idle={first} ready={second} revents={}",
        poll_names(p.revents)
    ))
}

/// Runs `select` on the given read/write/except fds; shows `n` and which fds are set.
fn select(rd: &[c_int], wr: &[c_int], ex: &[c_int], timeout_ms: i64) -> String {
    let mut sets: [libc::fd_set; 3] = [zeroed(), zeroed(), zeroed()];
    let mut max = -1;
    for (set, fds) in sets.iter_mut().zip([rd, wr, ex]) {
        // SAFETY: `set` is an element of the live local array `sets`.
        unsafe { libc::FD_ZERO(set) };
        for &fd in fds {
            // SAFETY: the set is a live local `fd_set`; the libc crate's FD_* macros index its bit
            // array with a bounds check (an fd beyond FD_SETSIZE panics, it is never written past).
            unsafe { libc::FD_SET(fd, set) };
            max = max.max(fd);
        }
    }
    let mut tv = libc::timeval {
        tv_sec: (timeout_ms / 1000) as libc::time_t,
        tv_usec: ((timeout_ms % 1000) * 1000) as libc::suseconds_t,
    };
    let [r, w, e] = &mut sets;
    let n = match sys!(libc::select(max + 1, r, w, e, &mut tv)) {
        Ok(n) => n,
        // The sets are unspecified after an error.
        Err(err) => return format!("select={err}"),
    };
    let set_idx = |set: &libc::fd_set, fds: &[c_int]| -> String {
        let idx: Vec<String> = (0..fds.len())
            // SAFETY: `set` is one of the live local sets; FD_ISSET reads it with a
            // bounds check on the fd.
            .filter(|&i| unsafe { libc::FD_ISSET(fds[i], set) })
            .map(|i| i.to_string())
            .collect();
        format!("[{}]", idx.join(","))
    };
    format!(
        "n={n} r={} w={} e={}",
        set_idx(r, rd),
        set_idx(w, wr),
        set_idx(e, ex)
    )
}

/// A `select`-driven writer against a slow reader: it blocks on a full buffer, and every
/// time `select` says writable its next send moves bytes (told "writable" and then
/// refused, such a writer would spin).
fn select_writer_loop_no_spin() -> Res {
    const TOTAL: usize = 16 << 20;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    set_nonblocking(c.raw(), true).ctx("fcntl")?;
    let fd = s.raw();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut got = 0usize;
        let mut since_pause = 0usize;
        while got < TOTAL {
            match recv(fd, &mut buf, 0) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got += n;
                    since_pause += n;
                }
            }
            if since_pause >= 256 << 10 {
                since_pause = 0;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        got
    });
    let chunk = vec![0x6bu8; 65536];
    let (mut sent, mut refused, mut blocked) = (0usize, 0, 0);
    let mut err = None;
    'outer: while sent < TOTAL {
        let r = select(&[], &[c.raw()], &[], 5000);
        if !r.starts_with("n=1 ") {
            err = Some(format!("select: {r}"));
            break;
        }
        let mut moved = false;
        while sent < TOTAL {
            let n = chunk.len().min(TOTAL - sent);
            match send(c.raw(), &chunk[..n], libc::MSG_NOSIGNAL) {
                Ok(k) => {
                    sent += k;
                    moved = true;
                }
                Err(e) if e.0 == libc::EAGAIN => {
                    blocked += 1;
                    if !moved {
                        refused += 1;
                    }
                    break;
                }
                Err(e) => {
                    err = Some(format!("send={e}"));
                    break 'outer;
                }
            }
        }
    }
    drop(c);
    let got = reader.join().map_err(|_| "reader panicked".to_string())?;
    drop(s);
    Ok(format!(
        "sent_all={} received_all={} blocked={} writable_then_eagain={refused} error={}",
        sent == TOTAL,
        got == TOTAL,
        blocked > 0,
        err.unwrap_or_else(|| "none".into())
    ))
}

fn select_read_write_sets() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"x", 0).ctx("send")?;
    wait_for(s.raw(), IN).ctx("poll")?;
    Ok(select(&[c.raw(), s.raw()], &[c.raw()], &[], 1000))
}

fn select_mixed_with_eventfd() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let efd = Fd::new(sys!(libc::eventfd(0, 0)).ctx("eventfd")?);
    let one: u64 = 1;
    sys!(libc::write(efd.raw(), (&raw const one).cast(), 8)).ctx("write")?;
    let first = select(&[s.raw(), efd.raw()], &[], &[], 1000);
    send(c.raw(), b"x", 0).ctx("send")?;
    wait_for(s.raw(), IN).ctx("poll")?;
    let second = select(&[s.raw(), efd.raw()], &[], &[], 1000);
    Ok(format!("eventfd_only: {first}; both: {second}"))
}

fn select_timeout() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    Ok(select(&[s.raw()], &[], &[s.raw()], 30))
}

/// As `poll.listener_after_accept`, with `select` and the accepted socket in the set.
fn select_listener_after_accept() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let idle = select(&[l.raw()], &[], &[], 0);
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let pending = select(&[l.raw()], &[], &[], 2000);
    let s = accept(l.raw()).ctx("accept")?;
    let after = select(&[l.raw(), s.raw()], &[], &[], 0);
    Ok(format!(
        "idle: {idle}; pending: {pending}; accepted: {after}"
    ))
}

/// iperf3's pattern, both ends in one process: one `select` loop reads the listener and
/// the accepted socket and writes 128 KiB blocks on the non-blocking client. The
/// listener must not look readable once its connection is taken (iperf3's blocking
/// `accept` then hangs and nothing is ever read), and the accepted socket must not look
/// readable while it is empty.
fn select_listener_and_stream_loop() -> Res {
    const BLOCK: usize = 128 << 10;
    const TOTAL: usize = 4 << 20;
    let (l, addr) = listener(libc::AF_INET)?;
    select(&[l.raw()], &[], &[], 0);
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    select(&[l.raw()], &[], &[], 2000);
    let s = accept(l.raw()).ctx("accept")?;
    for fd in [l.raw(), c.raw(), s.raw()] {
        set_nonblocking(fd, true).ctx("fcntl")?;
    }
    let block = vec![0x5au8; BLOCK];
    let mut buf = vec![0u8; BLOCK];
    let (mut sent, mut got, mut ghost_conns, mut empty_reads) = (0, 0, 0, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(4);
    while got < TOTAL && std::time::Instant::now() < deadline {
        let mut rd: libc::fd_set = zeroed();
        let mut wr: libc::fd_set = zeroed();
        // SAFETY: the set is a live local `fd_set`; the libc crate's FD_* macros index its bit
        // array with a bounds check (an fd beyond FD_SETSIZE panics, it is never written past).
        unsafe {
            libc::FD_ZERO(&mut rd);
            libc::FD_ZERO(&mut wr);
            libc::FD_SET(l.raw(), &mut rd);
            libc::FD_SET(s.raw(), &mut rd);
            if sent < TOTAL {
                libc::FD_SET(c.raw(), &mut wr);
            }
        }
        let mut tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        let null = std::ptr::null_mut();
        let max = l.raw().max(c.raw()).max(s.raw());
        sys!(libc::select(max + 1, &mut rd, &mut wr, null, &mut tv)).ctx("select")?;
        // SAFETY: `rd` and `wr` are live local sets; FD_ISSET reads them with a bounds
        // check on the fd (here and below).
        if unsafe { libc::FD_ISSET(l.raw(), &rd) } {
            match accept(l.raw()) {
                Err(e) if e.0 == libc::EAGAIN => ghost_conns += 1,
                other => return Err(format!("unexpected accept: {}", show(other.map(|_| 0)))),
            }
        }
        // SAFETY: as above.
        if unsafe { libc::FD_ISSET(c.raw(), &wr) } {
            let n = BLOCK.min(TOTAL - sent);
            match send(c.raw(), &block[..n], libc::MSG_NOSIGNAL) {
                Ok(n) => sent += n,
                Err(e) if e.0 == libc::EAGAIN => {}
                Err(e) => return Err(format!("send={e}")),
            }
        }
        // SAFETY: as above.
        if unsafe { libc::FD_ISSET(s.raw(), &rd) } {
            match recv(s.raw(), &mut buf, 0) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.0 == libc::EAGAIN => empty_reads += 1,
                Err(e) => return Err(format!("recv={e}")),
            }
        }
    }
    Ok(format!(
        "received={got} readable_listener_without_connection={ghost_conns} \
         readable_socket_without_data={empty_reads}"
    ))
}

fn select_oob_exceptfds() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"!", libc::MSG_OOB).ctx("send")?;
    wait_for(s.raw(), libc::POLLPRI).ctx("poll")?;
    Ok(select(&[], &[], &[s.raw()], 1000))
}

fn select_closed_fd_ebadf() -> Res {
    let s = tcp_socket(libc::AF_INET).ctx("socket")?;
    let fd = s.raw();
    drop(s);
    Ok(select(&[fd], &[], &[], 0))
}

fn pselect_ready_with_mask() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET6)?;
    send(c.raw(), b"x", 0).ctx("send")?;
    let mut rd: libc::fd_set = zeroed();
    // SAFETY: the set is a live local `fd_set`; the libc crate's FD_* macros index its bit
    // array with a bounds check (an fd beyond FD_SETSIZE panics, it is never written past).
    unsafe {
        libc::FD_ZERO(&mut rd);
        libc::FD_SET(s.raw(), &mut rd);
    }
    let ts = libc::timespec {
        tv_sec: 2,
        tv_nsec: 0,
    };
    let mut mask: libc::sigset_t = zeroed();
    // SAFETY: `mask` is a live local sigset for sigfillset to write.
    unsafe { libc::sigfillset(&mut mask) };
    let null = std::ptr::null_mut();
    let n = show(sys!(libc::pselect(
        s.raw() + 1,
        &mut rd,
        null,
        null,
        &ts,
        &mask
    )));
    // SAFETY: `rd` is a live local set; FD_ISSET reads it with a bounds check on the fd.
    let set = unsafe { libc::FD_ISSET(s.raw(), &rd) };
    Ok(format!("n={n} readable={set}"))
}

/// Bad timeouts on a socket waited on for input: the kernel's EINVAL, at once (ferry's
/// waits spin before they sleep, and must not turn a bad timeout into a good one).
fn invalid_timeouts_einval() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let mut p = libc::pollfd {
        fd: s.raw(),
        events: IN,
        revents: 0,
    };
    let bad_ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 2_000_000_000,
    };
    let ppoll = show(sys!(libc::ppoll(&mut p, 1, &bad_ts, std::ptr::null())));
    let neg_ts = libc::timespec {
        tv_sec: -1,
        tv_nsec: 0,
    };
    let mut rd: libc::fd_set = zeroed();
    // SAFETY: the set is a live local `fd_set`; the libc crate's FD_* macros index its bit
    // array with a bounds check (an fd beyond FD_SETSIZE panics, it is never written past).
    unsafe { libc::FD_SET(s.raw(), &mut rd) };
    let null = std::ptr::null_mut();
    let pselect = show(sys!(libc::pselect(
        s.raw() + 1,
        &mut rd,
        null,
        null,
        &neg_ts,
        std::ptr::null()
    )));
    // -1 ms: a negative `tv_usec`.
    let select = select(&[s.raw()], &[], &[], -1);
    Ok(format!("ppoll={ppoll} pselect={pselect} {select}"))
}
