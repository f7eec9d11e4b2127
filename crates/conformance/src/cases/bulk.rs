//! Large transfers with checksums: 1 MB and 16 MB over loopback TCP (the latter in
//! both directions at once), IPv6, many small writes, a forked peer, a unix stream.

use std::thread;

use super::threads::{recv_checksum, send_pattern};
use super::{Case, Res};
use crate::net::{recv, send, set_int, tcp_pair};
use crate::proc::fork_with;
use crate::sys::{Ctx, Fd};

pub const CASES: &[Case] = &[
    Case::new("bulk.tcp_1mb_checksum", tcp_1mb_checksum).slow(),
    Case::new("bulk.tcp_16mb_both_directions", tcp_16mb_both_directions).slow(),
    Case::new("bulk.tcp6_4mb_checksum", tcp6_4mb_checksum).slow(),
    Case::new("bulk.many_small_writes", many_small_writes).slow(),
    Case::new("bulk.forked_peer_4mb", forked_peer_4mb).slow(),
    Case::new("bulk.unix_stream_4mb", unix_stream_4mb).slow(),
];

fn join<T>(h: thread::JoinHandle<T>) -> Result<T, String> {
    h.join().map_err(|_| "thread panicked".to_string())
}

/// Sends `len` bytes from `tx` in a thread while this thread receives them on `rx`.
fn one_way(tx: &Fd, rx: &Fd, len: usize, seed: u32) -> Res {
    let fd = tx.raw();
    let sender = thread::spawn(move || send_pattern(fd, len, seed));
    let got = recv_checksum(rx.raw(), len)?;
    let sent = join(sender)??;
    Ok(format!("bytes={len} checksum_match={}", sent == got))
}

fn tcp_1mb_checksum() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    one_way(&c, &s, 1 << 20, 7)
}

fn tcp_16mb_both_directions() -> Res {
    const LEN: usize = 16 << 20;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (cfd, sfd) = (c.raw(), s.raw());
    let c_send = thread::spawn(move || send_pattern(cfd, LEN, 11));
    let s_send = thread::spawn(move || send_pattern(sfd, LEN, 13));
    let c_recv = thread::spawn(move || recv_checksum(cfd, LEN));
    let s_got = recv_checksum(sfd, LEN)?;
    let c_sent = join(c_send)??;
    let s_sent = join(s_send)??;
    let c_got = join(c_recv)??;
    Ok(format!(
        "bytes_each_way={LEN} c->s_match={} s->c_match={}",
        c_sent == s_got,
        s_sent == c_got
    ))
}

fn tcp6_4mb_checksum() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET6)?;
    one_way(&s, &c, 4 << 20, 17)
}

fn many_small_writes() -> Res {
    const WRITES: usize = 20_000;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    set_int(c.raw(), libc::IPPROTO_TCP, libc::TCP_NODELAY, 1).ctx("TCP_NODELAY")?;
    let fd = c.raw();
    let sender = thread::spawn(move || (0..WRITES).all(|_| send(fd, b"7 bytes", 0) == Ok(7)));
    let mut total = 0;
    let mut buf = [0u8; 65536];
    while total < WRITES * 7 {
        match recv(s.raw(), &mut buf, 0).ctx("recv")? {
            0 => break,
            n => total += n,
        }
    }
    Ok(format!("writes_ok={} received={total}", join(sender)?))
}

fn forked_peer_4mb() -> Res {
    const LEN: usize = 4 << 20;
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let child = fork_with(|| {
        let sent = send_pattern(c.raw(), LEN, 19).is_ok();
        // Stay until the parent has read everything and acknowledged.
        let acked = crate::net::recv_exact(c.raw(), 3).is_ok_and(|v| v == b"ack");
        if sent && acked { 0 } else { 1 }
    })?;
    drop(c);
    let got = recv_checksum(s.raw(), LEN)?;
    send(s.raw(), b"ack", 0).ctx("send")?;
    Ok(format!(
        "bytes={LEN} checksum_match={} child={}",
        got == expected_checksum(LEN, 19),
        child.wait()
    ))
}

/// The checksum [`send_pattern`] produces, computed without sending.
fn expected_checksum(len: usize, seed: u32) -> u64 {
    let mut x = seed;
    let mut sum = 0u64;
    for _ in 0..len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        sum = sum.wrapping_mul(31).wrapping_add(u64::from(x as u8));
    }
    sum
}

fn unix_stream_4mb() -> Res {
    let mut sv = [0; 2];
    sys!(libc::socketpair(
        libc::AF_UNIX,
        libc::SOCK_STREAM,
        0,
        sv.as_mut_ptr()
    ))
    .ctx("socketpair")?;
    let (a, b) = (Fd::new(sv[0]), Fd::new(sv[1]));
    one_way(&a, &b, 4 << 20, 23)
}
