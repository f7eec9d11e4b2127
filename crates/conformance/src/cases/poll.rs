//! COMPAT 2 (readiness, part 1) — `poll`, `ppoll`, `select`, `pselect` over sockets,
//! alone and mixed with kernel fds (pipes, eventfds) in the same set.

use libc::c_int;

use super::{Case, Res};
use crate::flags::poll_names;
use crate::net::{closed_port, connect, listener, poll1, send, tcp_pair, tcp_socket, wait_for};
use crate::sys::{Ctx, Fd, pipe, show, zeroed};

pub const CASES: &[Case] = &[
    Case::new("poll.pollin_after_send", pollin_after_send),
    Case::new("poll.pollout_when_connected", pollout_when_connected),
    Case::new("poll.mixed_with_pipe", mixed_with_pipe),
    Case::new("poll.timeout_no_events", timeout_no_events),
    Case::new("poll.peer_close_rdhup", peer_close_rdhup),
    Case::new("poll.both_shut_pollhup", both_shut_pollhup),
    Case::new("poll.listener_pending", listener_pending),
    Case::new("poll.closed_fd_pollnval", closed_fd_pollnval),
    Case::new("poll.negative_fd_ignored", negative_fd_ignored),
    Case::new("poll.refused_pollerr", refused_pollerr),
    Case::new("poll.many_sockets_subset", many_sockets_subset),
    Case::new("poll.oob_pollpri", oob_pollpri),
    Case::new("ppoll.timeout_then_ready", ppoll_timeout_then_ready),
    Case::new("select.read_write_sets", select_read_write_sets),
    Case::new("select.mixed_with_eventfd", select_mixed_with_eventfd),
    Case::new("select.timeout", select_timeout),
    Case::new("select.oob_exceptfds", select_oob_exceptfds),
    Case::new("select.closed_fd_ebadf", select_closed_fd_ebadf),
    Case::new("pselect.ready_with_mask", pselect_ready_with_mask),
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

fn listener_pending() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let before = poll1(l.raw(), IN | OUT, 0).map(poll_names);
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let after = wait_for(l.raw(), IN).map(poll_names);
    Ok(format!("idle={} pending={}", show(before), show(after)))
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
        unsafe { libc::FD_ZERO(set) };
        for &fd in fds {
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
    unsafe {
        libc::FD_ZERO(&mut rd);
        libc::FD_SET(s.raw(), &mut rd);
    }
    let ts = libc::timespec {
        tv_sec: 2,
        tv_nsec: 0,
    };
    let mut mask: libc::sigset_t = zeroed();
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
    let set = unsafe { libc::FD_ISSET(s.raw(), &rd) };
    Ok(format!("n={n} readable={set}"))
}
