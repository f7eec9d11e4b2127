//! COMPAT 11 — threads: many threads calling at once on one socket and on their own,
//! a thread blocked in `recv`/`epoll_wait`/`poll` while another thread works on the same
//! socket or wakes it through a kernel fd.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use libc::c_int;

use super::epoll::Ep;
use super::{Case, Res};
use crate::net::{
    accept, connect, listener, recv, recv_exact, recv_text, send, send_all, tcp_pair, tcp_socket,
};
use crate::proc::{gettid, settle_blocked};
use crate::sys::{Ctx, fd_count, pipe, show};

pub const CASES: &[Case] = &[
    Case::new("thr.concurrent_send_one_socket", concurrent_send_one_socket),
    Case::new(
        "thr.recv_blocked_while_other_sends",
        recv_blocked_while_other_sends,
    ),
    Case::new(
        "thr.many_threads_own_connections",
        many_threads_own_connections,
    ),
    Case::new("thr.concurrent_accept", concurrent_accept),
    Case::new("thr.open_close_in_threads", open_close_in_threads),
    Case::new("thr.full_duplex_two_threads", full_duplex_two_threads),
    Case::new("thr.epoll_wait_in_thread_wakes", epoll_wait_in_thread_wakes),
    Case::new(
        "thr.poll_in_thread_kernel_fd_wakes",
        poll_in_thread_kernel_fd_wakes,
    ),
];

fn join<T>(h: thread::JoinHandle<T>) -> Result<T, String> {
    h.join().map_err(|_| "thread panicked".to_string())
}

fn concurrent_send_one_socket() -> Res {
    const THREADS: u8 = 4;
    const RECORDS: usize = 500;
    const SIZE: usize = 64;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let fd = c.raw();
    let senders: Vec<_> = (0..THREADS)
        .map(|t| {
            thread::spawn(move || {
                let rec = [t; SIZE];
                (0..RECORDS).all(|_| send(fd, &rec, 0) == Ok(SIZE))
            })
        })
        .collect();
    let total = usize::from(THREADS) * RECORDS * SIZE;
    let data = recv_exact(s.raw(), total)?;
    let mut all_sent = true;
    for h in senders {
        all_sent &= join(h)?;
    }
    let mut per_thread = [0usize; THREADS as usize];
    let mut intact = true;
    for rec in data.chunks(SIZE) {
        intact &= rec.iter().all(|&b| b == rec[0]) && rec[0] < THREADS;
        if let Some(n) = per_thread.get_mut(usize::from(rec[0])) {
            *n += 1;
        }
    }
    Ok(format!(
        "sends_ok={all_sent} received={} records_intact={intact} per_thread={per_thread:?}",
        data.len()
    ))
}

fn recv_blocked_while_other_sends() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (sfd, cfd) = (s.raw(), c.raw());
    let echo = thread::spawn(move || {
        let mut buf = [0u8; 64];
        match recv(sfd, &mut buf, 0) {
            Ok(n) if n > 0 => send(sfd, &buf[..n], 0).is_ok(),
            _ => false,
        }
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = thread::spawn(move || {
        let _ = tx.send(gettid());
        recv_text(cfd, 64, 0)
    });
    let tid = rx.recv().map_err(|e| e.to_string())?;
    settle_blocked(tid);
    let sent = show(send(cfd, b"ping-from-main", 0));
    let got = join(reader)?;
    Ok(format!(
        "send={sent} reader_got={got} echo_ok={}",
        join(echo)?
    ))
}

fn many_threads_own_connections() -> Res {
    const CLIENTS: usize = 16;
    let (l, addr) = listener(libc::AF_INET)?;
    let lfd = l.raw();
    let server = thread::spawn(move || {
        let mut handlers = Vec::new();
        for _ in 0..CLIENTS {
            let Ok(a) = accept(lfd) else { break };
            handlers.push(thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match recv(a.raw(), &mut buf, 0) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if send_all(a.raw(), &buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
            }));
        }
        handlers
            .into_iter()
            .map(|h| h.join().is_ok())
            .filter(|&ok| ok)
            .count()
    });
    let ok = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let ok = Arc::clone(&ok);
            thread::spawn(move || {
                let run = || -> Result<bool, String> {
                    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
                    connect(c.raw(), &addr).ctx("connect")?;
                    let msg: Vec<u8> = (0..10_000).map(|j| ((i * 31 + j) % 256) as u8).collect();
                    send_all(c.raw(), &msg)?;
                    Ok(recv_exact(c.raw(), msg.len())? == msg)
                };
                if run() == Ok(true) {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for h in clients {
        join(h)?;
    }
    let handlers = join(server)?;
    Ok(format!(
        "clients_ok={} handlers_done={handlers}",
        ok.load(Ordering::SeqCst)
    ))
}

fn concurrent_accept() -> Res {
    const N: usize = 4;
    let (l, addr) = listener(libc::AF_INET)?;
    let lfd = l.raw();
    let acceptors: Vec<_> = (0..N)
        .map(|_| thread::spawn(move || accept(lfd).and_then(|a| send(a.raw(), b"hi", 0)).is_ok()))
        .collect();
    let mut greeted = 0;
    for _ in 0..N {
        let c = tcp_socket(libc::AF_INET).ctx("socket")?;
        connect(c.raw(), &addr).ctx("connect")?;
        if recv_text(c.raw(), 8, 0) == "\"hi\"" {
            greeted += 1;
        }
    }
    let accepted = acceptors
        .into_iter()
        .map(join)
        .filter(|r| r == &Ok(true))
        .count();
    Ok(format!("accepted={accepted} clients_greeted={greeted}"))
}

fn open_close_in_threads() -> Res {
    crate::net::warm_up()?;
    let before = fd_count()?;
    let workers: Vec<_> = (0..8)
        .map(|i| {
            thread::spawn(move || {
                (0..200).all(|_| {
                    let family = if i % 2 == 0 {
                        libc::AF_INET
                    } else {
                        libc::AF_INET6
                    };
                    tcp_socket(family).is_ok()
                })
            })
        })
        .collect();
    let all_ok = workers.into_iter().map(join).all(|r| r == Ok(true));
    let after = fd_count()?;
    Ok(format!(
        "all_opened={all_ok} fd_delta={}",
        after as i64 - before as i64
    ))
}

/// Sends `len` pseudo-random bytes seeded by `seed`; returns their checksum.
pub fn send_pattern(fd: c_int, len: usize, seed: u32) -> Result<u64, String> {
    let mut x = seed;
    let mut sum = 0u64;
    let mut buf = vec![0u8; 65536];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len());
        for b in &mut buf[..n] {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
            sum = sum.wrapping_mul(31).wrapping_add(u64::from(*b));
        }
        send_all(fd, &buf[..n])?;
        left -= n;
    }
    Ok(sum)
}

/// Receives exactly `len` bytes; returns their checksum (same function as the sender).
pub fn recv_checksum(fd: c_int, len: usize) -> Result<u64, String> {
    let mut sum = 0u64;
    let mut buf = vec![0u8; 65536];
    let mut left = len;
    while left > 0 {
        let n = recv(fd, &mut buf[..left.min(65536)], 0).ctx("recv")?;
        if n == 0 {
            return Err(format!("EOF with {left} bytes missing"));
        }
        for &b in &buf[..n] {
            sum = sum.wrapping_mul(31).wrapping_add(u64::from(b));
        }
        left -= n;
    }
    Ok(sum)
}

fn full_duplex_two_threads() -> Res {
    const LEN: usize = 2 << 20;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (cfd, sfd) = (c.raw(), s.raw());
    let c_send = thread::spawn(move || send_pattern(cfd, LEN, 1));
    let s_send = thread::spawn(move || send_pattern(sfd, LEN, 2));
    let c_recv = thread::spawn(move || recv_checksum(cfd, LEN));
    let s_got = recv_checksum(sfd, LEN)?;
    let c_sent = join(c_send)??;
    let s_sent = join(s_send)??;
    let c_got = join(c_recv)??;
    Ok(format!(
        "c->s_match={} s->c_match={}",
        c_sent == s_got,
        s_sent == c_got
    ))
}

fn epoll_wait_in_thread_wakes() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let ep = Ep::new()?;
    ep.add(s.raw(), libc::EPOLLIN as u32, 42)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = thread::spawn(move || {
        let _ = tx.send(gettid());
        ep.show(4, 3000)
    });
    let tid = rx.recv().map_err(|e| e.to_string())?;
    settle_blocked(tid);
    send(c.raw(), b"wake", 0).ctx("send")?;
    Ok(format!("waiter_saw: {}", join(waiter)?))
}

fn poll_in_thread_kernel_fd_wakes() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let (pr, pw) = pipe(0).ctx("pipe")?;
    let (sfd, prfd) = (s.raw(), pr.raw());
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = thread::spawn(move || {
        let _ = tx.send(gettid());
        let mut set = [
            libc::pollfd {
                fd: sfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: prfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let n = show(sys!(libc::poll(set.as_mut_ptr(), 2, 3000)));
        format!(
            "n={n} sock={} pipe={}",
            crate::flags::poll_names(set[0].revents),
            crate::flags::poll_names(set[1].revents)
        )
    });
    let tid = rx.recv().map_err(|e| e.to_string())?;
    settle_blocked(tid);
    sys!(libc::write(pw.raw(), b"w".as_ptr().cast(), 1)).ctx("write")?;
    Ok(format!("waiter_saw: {}", join(waiter)?))
}
