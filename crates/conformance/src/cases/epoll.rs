//! COMPAT 2 (readiness, part 2) — epoll: level and edge triggered, `EPOLLONESHOT`,
//! `EPOLLRDHUP`, `EPOLLEXCLUSIVE`, `data.u64`, sockets mixed with pipes, eventfds and
//! timerfds, kernel fds not starved, registration tied to the open file description.

use libc::c_int;

use super::{Case, Res};
use crate::flags::epoll_names;
use crate::net::{
    closed_port, connect, drain, fill_until_unwritable, listener, send, so_error, tcp_pair,
    tcp_socket, wait_for,
};
use crate::sys::{Ctx, Errno, Fd, dev_null, pipe, set_nonblocking, show, zeroed};

pub const CASES: &[Case] = &[
    Case::new("epoll.level_triggered", level_triggered),
    Case::new("epoll.edge_triggered", edge_triggered),
    Case::new("epoll.oneshot_rearm", oneshot_rearm),
    Case::new("epoll.rdhup_on_peer_shutdown", rdhup_on_peer_shutdown),
    Case::new("epoll.exclusive_accepted", exclusive_accepted),
    Case::new("epoll.data_u64_preserved", data_u64_preserved),
    Case::new("epoll.epollout_after_connect", epollout_after_connect),
    Case::new("epoll.mixed_kernel_fds", mixed_kernel_fds),
    Case::new("epoll.kernel_fd_not_starved", kernel_fd_not_starved),
    Case::new("epoll.listener_ready", listener_ready),
    Case::new("epoll.ctl_errors", ctl_errors),
    Case::new("epoll.close_removes", close_removes),
    Case::new("epoll.dup_keeps_registration", dup_keeps_registration),
    Case::new("epoll.pwait_with_mask", pwait_with_mask),
    Case::new("epoll.hup_both_shut", hup_both_shut),
    Case::new("epoll.nested_epoll", nested_epoll),
    Case::new("epoll.refused_epollerr", refused_epollerr),
    Case::new("epoll.mod_changes_events", mod_changes_events),
    Case::new(
        "epoll.et_writer_eagain_then_epollout",
        et_writer_eagain_then_epollout,
    ),
];

const IN: u32 = libc::EPOLLIN as u32;
const OUT: u32 = libc::EPOLLOUT as u32;

/// An epoll instance.
pub struct Ep(Fd);

impl Ep {
    pub fn new() -> Result<Ep, String> {
        Ok(Ep(Fd::new(
            sys!(libc::epoll_create1(libc::EPOLL_CLOEXEC)).ctx("epoll_create1")?,
        )))
    }

    pub fn raw(&self) -> c_int {
        self.0.raw()
    }

    pub fn ctl(&self, op: c_int, fd: c_int, events: u32, data: u64) -> Result<(), Errno> {
        let mut ev = libc::epoll_event { events, u64: data };
        sys!(libc::epoll_ctl(self.raw(), op, fd, &mut ev)).map(drop)
    }

    pub fn add(&self, fd: c_int, events: u32, data: u64) -> Result<(), String> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, data)
            .ctx("epoll_ctl")
    }

    /// `epoll_wait`; returns (events, data) pairs sorted by data.
    pub fn wait(&self, max: usize, timeout_ms: c_int) -> Result<Vec<(u32, u64)>, Errno> {
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; max];
        let n = sys!(libc::epoll_wait(
            self.raw(),
            evs.as_mut_ptr(),
            max as c_int,
            timeout_ms
        ))?;
        let mut out: Vec<(u32, u64)> = evs[..n as usize]
            .iter()
            .map(|e| (e.events, e.u64))
            .collect();
        out.sort_by_key(|e| e.1);
        Ok(out)
    }

    /// [`Ep::wait`] shown as `n=1 [7:EPOLLIN]`.
    pub fn show(&self, max: usize, timeout_ms: c_int) -> String {
        match self.wait(max, timeout_ms) {
            Ok(v) => {
                let items: Vec<String> = v
                    .iter()
                    .map(|(e, d)| format!("{d}:{}", epoll_names(*e)))
                    .collect();
                format!("n={} [{}]", v.len(), items.join(" "))
            }
            Err(e) => e.to_string(),
        }
    }
}

fn level_triggered() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), IN, 1)?;
    let idle = ep.show(8, 0);
    send(c.raw(), b"data", 0).ctx("send")?;
    let first = ep.show(8, 2000);
    let again = ep.show(8, 0);
    Ok(format!("idle: {idle}; first: {first}; again: {again}"))
}

fn edge_triggered() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), IN | libc::EPOLLET as u32, 1)?;
    send(c.raw(), b"aaaa", 0).ctx("send")?;
    let first = ep.show(8, 2000);
    let mut buf = [0u8; 2];
    crate::net::recv(s.raw(), &mut buf, 0).ctx("recv")?;
    let after_partial_read = ep.show(8, 0);
    send(c.raw(), b"b", 0).ctx("send")?;
    let new_data = ep.show(8, 2000);
    Ok(format!(
        "first: {first}; after_partial_read: {after_partial_read}; new_data: {new_data}"
    ))
}

fn oneshot_rearm() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    let flags = IN | libc::EPOLLONESHOT as u32;
    ep.add(s.raw(), flags, 1)?;
    send(c.raw(), b"x", 0).ctx("send")?;
    let first = ep.show(8, 2000);
    let disarmed = ep.show(8, 0);
    let rearm = show(ep.ctl(libc::EPOLL_CTL_MOD, s.raw(), flags, 2).map(|_| 0));
    let rearmed = ep.show(8, 2000);
    Ok(format!(
        "first: {first}; disarmed: {disarmed}; mod={rearm}; rearmed: {rearmed}"
    ))
}

fn rdhup_on_peer_shutdown() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), IN | libc::EPOLLRDHUP as u32, 1)?;
    sys!(libc::shutdown(c.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    let ev = ep.show(8, 2000);
    let back = show(send(s.raw(), b"still", 0));
    Ok(format!(
        "{ev}; reverse_send={back} peer_got={}",
        crate::net::recv_text(c.raw(), 16, 0)
    ))
}

fn exclusive_accepted() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let (ep1, ep2) = (Ep::new()?, Ep::new()?);
    let excl = IN | libc::EPOLLEXCLUSIVE as u32;
    let a1 = show(ep1.ctl(libc::EPOLL_CTL_ADD, l.raw(), excl, 1).map(|_| 0));
    let a2 = show(ep2.ctl(libc::EPOLL_CTL_ADD, l.raw(), excl, 2).map(|_| 0));
    let m = show(ep1.ctl(libc::EPOLL_CTL_MOD, l.raw(), excl, 1).map(|_| 0));
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let w1 = ep1.show(8, 2000);
    Ok(format!("add1={a1} add2={a2} mod_exclusive={m} wait1: {w1}"))
}

fn data_u64_preserved() -> Res {
    let ep = Ep::new()?;
    let tags = [0u64, 0xdead_beef_cafe_f00d, u64::MAX];
    let mut keep = Vec::new();
    for &tag in &tags {
        let (c, s) = tcp_pair(libc::AF_INET)?;
        send(c.raw(), b"x", 0).ctx("send")?;
        wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
        ep.add(s.raw(), IN, tag)?;
        keep.push((c, s));
    }
    let got = ep.wait(8, 2000).ctx("epoll_wait")?;
    let tags: Vec<String> = got.iter().map(|(_, d)| format!("{d:#x}")).collect();
    Ok(format!("n={} data=[{}]", got.len(), tags.join(",")))
}

fn epollout_after_connect() -> Res {
    let (_l, addr) = listener(libc::AF_INET)?;
    let c = crate::net::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)
        .ctx("socket")?;
    let r = show(connect(c.raw(), &addr).map(|_| 0));
    let ep = Ep::new()?;
    ep.add(c.raw(), OUT | libc::EPOLLET as u32, 9)?;
    let ev = ep.show(8, 2000);
    Ok(format!("connect={r} {ev} SO_ERROR={}", so_error(c.raw())))
}

fn mixed_kernel_fds() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (pr, pw) = pipe(0).ctx("pipe")?;
    let efd = Fd::new(sys!(libc::eventfd(0, 0)).ctx("eventfd")?);
    let tfd = Fd::new(sys!(libc::timerfd_create(libc::CLOCK_MONOTONIC, 0)).ctx("timerfd")?);
    let ep = Ep::new()?;
    ep.add(s.raw(), IN, 1)?;
    ep.add(pr.raw(), IN, 2)?;
    ep.add(efd.raw(), IN, 3)?;
    ep.add(tfd.raw(), IN, 4)?;
    let mut spec: libc::itimerspec = zeroed();
    spec.it_value.tv_nsec = 5_000_000;
    sys!(libc::timerfd_settime(
        tfd.raw(),
        0,
        &spec,
        std::ptr::null_mut()
    ))
    .ctx("settime")?;
    send(c.raw(), b"x", 0).ctx("send")?;
    sys!(libc::write(pw.raw(), b"p".as_ptr().cast(), 1)).ctx("write")?;
    let one: u64 = 1;
    sys!(libc::write(efd.raw(), (&raw const one).cast(), 8)).ctx("write")?;
    for fd in [s.raw(), pr.raw(), efd.raw(), tfd.raw()] {
        wait_for(fd, libc::POLLIN).ctx("poll")?;
    }
    Ok(ep.show(8, 2000))
}

fn kernel_fd_not_starved() -> Res {
    let ep = Ep::new()?;
    let mut keep = Vec::new();
    for i in 0..8 {
        let (c, s) = tcp_pair(libc::AF_INET)?;
        send(c.raw(), b"always-readable", 0).ctx("send")?;
        wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
        ep.add(s.raw(), IN, 100 + i)?;
        keep.push((c, s));
    }
    let efd = Fd::new(sys!(libc::eventfd(1, 0)).ctx("eventfd")?);
    ep.add(efd.raw(), IN, 1)?;
    let mut seen_at = None;
    let mut sockets_seen = std::collections::BTreeSet::new();
    for round in 1..=4 {
        for (_, d) in ep.wait(4, 2000).ctx("epoll_wait")? {
            if d == 1 && seen_at.is_none() {
                seen_at = Some(round);
            }
            sockets_seen.insert(d);
        }
    }
    let seen = seen_at.is_some_and(|r| r <= 3);
    Ok(format!(
        "eventfd_within_3_waits={seen} distinct_ready_seen={}",
        sockets_seen.len()
    ))
}

fn listener_ready() -> Res {
    let (l, addr) = listener(libc::AF_INET6)?;
    let ep = Ep::new()?;
    ep.add(l.raw(), IN, 5)?;
    let idle = ep.show(8, 0);
    let c = tcp_socket(libc::AF_INET6).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    Ok(format!("idle: {idle}; pending: {}", ep.show(8, 2000)))
}

fn ctl_errors() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    let r = |res: Result<(), Errno>| show(res.map(|_| 0));
    let add = r(ep.ctl(libc::EPOLL_CTL_ADD, s.raw(), IN, 0));
    let again = r(ep.ctl(libc::EPOLL_CTL_ADD, s.raw(), IN, 0));
    let (_c2, s2) = tcp_pair(libc::AF_INET)?;
    let mod_unknown = r(ep.ctl(libc::EPOLL_CTL_MOD, s2.raw(), IN, 0));
    let del_unknown = r(ep.ctl(libc::EPOLL_CTL_DEL, s2.raw(), 0, 0));
    let del = r(ep.ctl(libc::EPOLL_CTL_DEL, s.raw(), 0, 0));
    let file = dev_null().ctx("open")?;
    let regular = r(ep.ctl(libc::EPOLL_CTL_ADD, file.raw(), IN, 0));
    let closed = file.raw();
    drop(file);
    let badf = r(ep.ctl(libc::EPOLL_CTL_ADD, closed, IN, 0));
    let itself = r(ep.ctl(libc::EPOLL_CTL_ADD, ep.raw(), IN, 0));
    Ok(format!(
        "add={add} add_again={again} mod_unknown={mod_unknown} del_unknown={del_unknown} \
         del={del} dev_null={regular} closed={badf} self={itself}"
    ))
}

fn close_removes() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), IN, 1)?;
    send(c.raw(), b"x", 0).ctx("send")?;
    crate::sys::sleep_ms(10);
    drop(s);
    Ok(format!("after_close: {}", ep.show(8, 50)))
}

fn dup_keeps_registration() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), IN, 7)?;
    let d = Fd::new(sys!(libc::dup(s.raw())).ctx("dup")?);
    drop(s);
    send(c.raw(), b"x", 0).ctx("send")?;
    let ev = ep.show(8, 2000);
    let del = show(ep.ctl(libc::EPOLL_CTL_DEL, d.raw(), 0, 0).map(|_| 0));
    drop(d);
    Ok(format!("after_close_original: {ev}; del_via_dup={del}"))
}

fn pwait_with_mask() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), IN, 3)?;
    send(c.raw(), b"x", 0).ctx("send")?;
    let mut mask: libc::sigset_t = zeroed();
    // SAFETY: `mask` is a live local sigset for sigfillset to write.
    unsafe { libc::sigfillset(&mut mask) };
    let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
    let n = show(sys!(libc::epoll_pwait(
        ep.raw(),
        ev.as_mut_ptr(),
        4,
        2000,
        &mask
    )));
    let data = ev[0].u64;
    Ok(format!(
        "n={n} data={data} events={}",
        epoll_names(ev[0].events)
    ))
}

fn hup_both_shut() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    let all = IN | OUT | libc::EPOLLRDHUP as u32;
    ep.add(s.raw(), all, 1)?;
    drop(c);
    crate::net::wait_for(s.raw(), libc::POLLRDHUP).ctx("poll")?;
    let half = ep.show(8, 2000);
    sys!(libc::shutdown(s.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    crate::net::wait_for(s.raw(), libc::POLLHUP).ctx("poll")?;
    Ok(format!("peer_closed: {half}; both: {}", ep.show(8, 2000)))
}

fn nested_epoll() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let inner = Ep::new()?;
    inner.add(s.raw(), IN, 1)?;
    let outer = Ep::new()?;
    outer.add(inner.raw(), IN, 2)?;
    let idle = outer.show(8, 0);
    send(c.raw(), b"x", 0).ctx("send")?;
    let ready = outer.show(8, 2000);
    Ok(format!(
        "idle: {idle}; ready: {ready}; inner: {}",
        inner.show(8, 0)
    ))
}

fn refused_epollerr() -> Res {
    let addr = closed_port(libc::AF_INET)?;
    let c = crate::net::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)
        .ctx("socket")?;
    let r = show(connect(c.raw(), &addr).map(|_| 0));
    let ep = Ep::new()?;
    ep.add(c.raw(), IN | OUT, 1)?;
    let ev = ep.show(8, 2000);
    Ok(format!("connect={r} {ev} SO_ERROR={}", so_error(c.raw())))
}

fn mod_changes_events() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), IN, 1)?;
    let before = ep.show(8, 0);
    let m = show(ep.ctl(libc::EPOLL_CTL_MOD, s.raw(), OUT, 2).map(|_| 0));
    Ok(format!(
        "in_only: {before}; mod={m}; out: {}",
        ep.show(8, 2000)
    ))
}

/// An edge-triggered writer: one `EPOLLOUT` at first; `EAGAIN` once the send buffer is
/// full, and no event while it stays full; one new `EPOLLOUT` edge after the peer has
/// read everything (a writer that waits for that edge would hang without it).
fn et_writer_eagain_then_epollout() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    set_nonblocking(c.raw(), true).ctx("fcntl")?;
    let ep = Ep::new()?;
    ep.add(c.raw(), IN | OUT | libc::EPOLLET as u32, 1)?;
    let first = ep.show(8, 2000);
    let total = fill_until_unwritable(c.raw())?;
    let full = ep.show(8, 0);
    set_nonblocking(s.raw(), true).ctx("fcntl")?;
    let mut drained = 0;
    while drained < total {
        wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
        let n = drain(s.raw())?;
        if n == 0 {
            break;
        }
        drained += n;
    }
    let edge = ep.show(8, 2000);
    let more = show(send(c.raw(), b"more", 0));
    Ok(format!(
        "first: {first}; full: {full}; drained_all={}; edge: {edge}; send={more}",
        drained == total
    ))
}
