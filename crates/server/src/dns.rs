//! A DNS forwarder for the sandbox.
//!
//! glibc's resolver sends its queries through libc-internal socket calls that the shim
//! cannot interpose, so they go to the kernel inside the sandbox, which has only `lo`.
//! The forwarder makes them work anyway: each nameserver address of the host's
//! `/etc/resolv.conf` is added to the sandbox's `lo`, a UDP socket bound to
//! `NAMESERVER:53` inside the sandbox receives the queries, and the server relays them
//! from the host namespace to the upstream servers (the same nameservers, or `--dns`),
//! with the query id rewritten so answers find their way back; a query that gets no
//! answer is forgotten after a few seconds.
//!
//! DNS over TCP (glibc retries a truncated UDP answer over TCP, and `options use-vc`
//! asks for it) has a listener on the same addresses: each connection is relayed byte
//! for byte to the first upstream that accepts one, on a thread of its own (it is rare,
//! and a blocking relay keeps it out of the event loop), at most [`MAX_TCP`] at once,
//! until either side closes or it idles for [`TCP_IDLE`].
//!
//! Must not: keep state per query without bound, or let an answer reach anyone but the
//! socket that asked.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

/// Largest DNS message over UDP ferry relays (EDNS0 sizes included).
const MAX_MSG: usize = 4096;
/// How long an unanswered query is remembered.
const QUERY_TTL: Duration = Duration::from_secs(10);
/// Most DNS-over-TCP connections relayed at once; more are closed at once.
pub const MAX_TCP: usize = 16;
/// A relayed TCP connection that carries nothing for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// How long a relay tries each upstream's TCP port.
const TCP_CONNECT: Duration = Duration::from_secs(3);

/// Nameserver addresses listed in a `resolv.conf` text.
pub fn nameservers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| {
            rest.split_whitespace()
                .next()?
                .split('%')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[derive(Debug)]
struct Pending {
    inside: usize,
    client: SocketAddr,
    id: u16,
    since: Instant,
}

/// The forwarder's sockets and its table of queries in flight.
#[derive(Debug)]
pub struct Dns {
    /// UDP sockets inside the sandbox, bound to `NAMESERVER:53`.
    pub inside: Vec<OwnedFd>,
    /// TCP listeners inside the sandbox, on the same addresses.
    pub inside_tcp: Vec<OwnedFd>,
    /// UDP socket in the host namespace that talks to the upstream servers.
    pub outside: OwnedFd,
    upstream: Arc<[SocketAddr]>,
    /// TCP relays running now.
    tcp_live: Arc<AtomicUsize>,
    pending: HashMap<u16, Pending>,
    next_id: u16,
    /// Queries relayed and answers delivered (UDP).
    pub queries: u64,
    pub answers: u64,
    /// TCP connections relayed.
    pub tcp_connections: u64,
}

impl Dns {
    pub fn new(
        inside: Vec<OwnedFd>,
        inside_tcp: Vec<OwnedFd>,
        upstream: Vec<SocketAddr>,
    ) -> io::Result<Dns> {
        let v6 = upstream.iter().any(SocketAddr::is_ipv6);
        let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        let outside = ferry_sys::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )?;
        Ok(Dns {
            inside,
            inside_tcp,
            outside,
            upstream: upstream.into(),
            tcp_live: Arc::new(AtomicUsize::new(0)),
            pending: HashMap::new(),
            next_id: 1,
            queries: 0,
            answers: 0,
            tcp_connections: 0,
        })
    }

    /// Connections arrived on inside TCP listener `i`: each gets a relay thread.
    pub fn accept_tcp(&mut self, i: usize) {
        let Some(l) = self.inside_tcp.get(i) else {
            return;
        };
        while let Ok((conn, _)) = ferry_sys::accept4(l.as_fd(), libc::SOCK_CLOEXEC) {
            if self.tcp_live.load(Ordering::Relaxed) >= MAX_TCP {
                warn!("DNS over TCP: {MAX_TCP} connections relayed already; one refused");
                continue;
            }
            self.tcp_live.fetch_add(1, Ordering::Relaxed);
            self.tcp_connections += 1;
            let (up, live) = (self.upstream.clone(), self.tcp_live.clone());
            let spawned = std::thread::Builder::new()
                .name("ferry-dns-tcp".into())
                .spawn(move || {
                    if let Err(e) = relay_tcp(conn, &up) {
                        debug!("DNS over TCP: {e}");
                    }
                    live.fetch_sub(1, Ordering::Relaxed);
                });
            if let Err(e) = spawned {
                warn!("DNS over TCP: no relay thread: {e}");
                self.tcp_live.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Queries arrived on inside socket `i`: relay them upstream.
    pub fn from_sandbox(&mut self, i: usize) {
        let mut buf = [0u8; MAX_MSG];
        let now = Instant::now();
        self.pending
            .retain(|_, p| now.duration_since(p.since) < QUERY_TTL);
        loop {
            let Some(sock) = self.inside.get(i) else {
                return;
            };
            let (n, from) = match ferry_sys::recv_from(sock.as_fd(), &mut buf) {
                Ok((n, Some(from))) if n >= 12 => (n, from),
                Ok(_) => continue,
                Err(_) => return,
            };
            let id = u16::from_be_bytes([buf[0], buf[1]]);
            let new_id = self.fresh_id();
            buf[..2].copy_from_slice(&new_id.to_be_bytes());
            let mut sent = false;
            for up in self.upstream.iter() {
                sent |= ferry_sys::send_to(self.outside.as_fd(), &buf[..n], up).is_ok();
            }
            if sent {
                self.queries += 1;
                self.pending.insert(
                    new_id,
                    Pending {
                        inside: i,
                        client: from,
                        id,
                        since: now,
                    },
                );
            }
        }
    }

    /// Answers arrived from upstream: hand each back to the client that asked.
    pub fn from_upstream(&mut self) {
        let mut buf = [0u8; MAX_MSG];
        loop {
            let (n, from) = match ferry_sys::recv_from(self.outside.as_fd(), &mut buf) {
                Ok((n, Some(from))) if n >= 12 => (n, from),
                Ok(_) => continue,
                Err(_) => return,
            };
            if !self
                .upstream
                .iter()
                .any(|u| u.ip() == from.ip() && u.port() == from.port())
            {
                continue; // not from a server we asked
            }
            let new_id = u16::from_be_bytes([buf[0], buf[1]]);
            // The first answer wins; later ones (other upstreams) find no entry.
            let Some(p) = self.pending.remove(&new_id) else {
                continue;
            };
            buf[..2].copy_from_slice(&p.id.to_be_bytes());
            if let Some(sock) = self.inside.get(p.inside)
                && ferry_sys::send_to(sock.as_fd(), &buf[..n], &p.client).is_ok()
            {
                self.answers += 1;
            }
        }
    }

    fn fresh_id(&mut self) -> u16 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_mul(25173).wrapping_add(13849);
            if !self.pending.contains_key(&id) {
                return id;
            }
        }
    }
}

/// Relays one DNS-over-TCP connection (blocking) to the first upstream that accepts.
fn relay_tcp(client: OwnedFd, upstream: &[SocketAddr]) -> io::Result<()> {
    let client = TcpStream::from(client);
    let up = upstream
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, TCP_CONNECT).ok())
        .ok_or_else(|| io::Error::other("no upstream accepted a TCP connection"))?;
    for s in [&client, &up] {
        s.set_read_timeout(Some(TCP_IDLE))?;
        s.set_write_timeout(Some(TCP_IDLE))?;
        s.set_nodelay(true)?;
    }
    std::thread::scope(|t| {
        t.spawn(|| copy_then_shut(&client, &up));
        copy_then_shut(&up, &client);
    });
    Ok(())
}

/// Copies `from` → `to` until EOF, an error or the idle timeout, then passes the end on.
fn copy_then_shut(from: &TcpStream, to: &TcpStream) {
    let _ = io::copy(&mut &*from, &mut &*to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_resolv_conf() {
        let text = "# comment\nnameserver 10.0.0.2\nsearch example\nnameserver ::1\nnameserver fe80::1%eth0\noptions ndots:1\n";
        let want: Vec<IpAddr> = vec![
            "10.0.0.2".parse().unwrap(),
            "::1".parse().unwrap(),
            "fe80::1".parse().unwrap(),
        ];
        assert_eq!(nameservers(text), want);
        assert!(nameservers("").is_empty());
    }
}
