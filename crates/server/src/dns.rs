//! A DNS forwarder for the sandbox.
//!
//! glibc's resolver sends its queries through libc-internal socket calls that the shim
//! cannot interpose, so they go to the kernel inside the sandbox, which has only `lo`.
//! The forwarder makes them work anyway: each nameserver address of the host's
//! `/etc/resolv.conf` is added to the sandbox's `lo`, a UDP socket bound to
//! `NAMESERVER:53` inside the sandbox receives the queries, and the server relays them
//! from the host namespace to the upstream servers (the same nameservers, or `--dns`),
//! with the query id rewritten so answers find their way back; a query that gets no
//! answer is forgotten after [`QUERY_TTL`]. What a datagram becomes is decided by
//! [`Forwarder`] (`ferry-egress`'s `dns.rs`), a pure core behind the [`Wire`] seam; this file owns the
//! sockets and the TCP relays.
//!
//! DNS over TCP (glibc retries a truncated UDP answer over TCP, and `options use-vc`
//! asks for it) has a listener on the same addresses: each connection is relayed byte
//! for byte to the first upstream that accepts one, on a thread of its own (it is rare,
//! and a blocking relay keeps it out of the event loop), at most [`MAX_TCP`] at once,
//! until either side closes or it idles for [`TCP_IDLE`].
//!
//! A sandboxed program may send anything to these sockets, at any rate (a static binary
//! skips the shim). Bounds: at most [`MAX_PENDING`] queries in flight (the oldest gives
//! way, counted); only queries go upstream (responses and runts are dropped, counted);
//! each event reads at most a batch of datagrams or accepts at most [`ACCEPT_BATCH`]
//! connections, so the server's other work goes on during a flood; log lines about
//! either at most once a second.
//!
//! Must not: keep state per query without bound, loop on anything the sandbox fills, or
//! let an answer reach anyone but the socket that asked.

/// The forwarder's pure core, shared with nic mode's guests (`ferry-egress`).
pub use ferry_egress::dns as forward;

use std::hash::BuildHasher;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

pub use forward::{Counts, Forwarder, MAX_MSG, MAX_PENDING, QUERY_TTL, Wire};

use crate::{LogThrottle, ServerStats};

/// Most DNS-over-TCP connections relayed at once; more are closed at once.
pub const MAX_TCP: usize = 16;
/// Most connections one call accepts (the rest wait for the next turn).
const ACCEPT_BATCH: usize = 16;
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

/// The forwarder's sockets, its UDP state ([`Forwarder`]) and its TCP relays.
#[derive(Debug)]
pub struct Dns {
    /// UDP sockets inside the sandbox, bound to `NAMESERVER:53`.
    pub inside: Vec<OwnedFd>,
    /// TCP listeners inside the sandbox, on the same addresses.
    pub inside_tcp: Vec<OwnedFd>,
    /// UDP socket in the host namespace that talks to the upstream servers.
    pub outside: OwnedFd,
    forwarder: Forwarder,
    upstream: Arc<[SocketAddr]>,
    /// TCP relays running now.
    tcp_live: Arc<AtomicUsize>,
    /// TCP connections relayed, and closed at once because [`MAX_TCP`] were.
    tcp_connections: u64,
    tcp_refused: u64,
    /// Log lines about evicted queries and refused TCP connections.
    evictions: LogThrottle,
    refusals: LogThrottle,
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
        // Where the sequence of ids starts: not guessable from outside the host.
        let [a, b, ..] = std::collections::hash_map::RandomState::new()
            .hash_one(0u8)
            .to_le_bytes();
        let seed = u16::from_le_bytes([a, b]);
        Ok(Dns {
            inside,
            inside_tcp,
            outside,
            forwarder: Forwarder::new(upstream.clone(), seed),
            upstream: upstream.into(),
            tcp_live: Arc::new(AtomicUsize::new(0)),
            tcp_connections: 0,
            tcp_refused: 0,
            evictions: LogThrottle::default(),
            refusals: LogThrottle::default(),
        })
    }

    /// Connections arrived on inside TCP listener `i`: each gets a relay thread while
    /// fewer than [`MAX_TCP`] run, else it is closed. At most [`ACCEPT_BATCH`] a call.
    pub fn accept_tcp(&mut self, i: usize) {
        let Some(l) = self.inside_tcp.get(i) else {
            return;
        };
        for _ in 0..ACCEPT_BATCH {
            let Ok((conn, _)) = ferry_sys::accept4(l.as_fd(), libc::SOCK_CLOEXEC) else {
                return;
            };
            if self.tcp_live.load(Ordering::Relaxed) >= MAX_TCP {
                self.tcp_refused += 1;
                if let Some(n) = self.refusals.tick() {
                    warn!(
                        "DNS over TCP: {MAX_TCP} connections relayed already; new ones are closed ({n} since the last line)"
                    );
                }
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

    /// Queries arrived on inside socket `i`: relay them upstream (a batch; the rest
    /// wait for the next turn, as the socket stays readable).
    pub fn from_sandbox(&mut self, i: usize) {
        let evicted = self.forwarder.counts().evicted;
        let mut wire = SysWire {
            inside: &self.inside,
            outside: self.outside.as_fd(),
        };
        self.forwarder.from_sandbox(&mut wire, i, Instant::now());
        let now_evicted = self.forwarder.counts().evicted;
        if now_evicted > evicted && self.evictions.tick().is_some() {
            warn!(
                "DNS: {MAX_PENDING} queries wait for an answer: the oldest are forgotten ({now_evicted} so far)"
            );
        }
    }

    /// Answers arrived from upstream: hand each back to the client that asked (a batch).
    pub fn from_upstream(&mut self) {
        let mut wire = SysWire {
            inside: &self.inside,
            outside: self.outside.as_fd(),
        };
        self.forwarder.from_upstream(&mut wire);
    }

    /// Adds the forwarder's counters to a server's.
    pub fn count_into(&self, stats: &mut ServerStats) {
        let c = self.forwarder.counts();
        stats.dns_queries = c.queries;
        stats.dns_answers = c.answers;
        stats.dns_dropped = c.dropped;
        stats.dns_evicted = c.evicted;
        stats.dns_stray = c.stray;
        stats.dns_tcp = self.tcp_connections;
        stats.dns_tcp_refused = self.tcp_refused;
    }
}

/// The forwarder's datagram calls on its real sockets.
struct SysWire<'a> {
    inside: &'a [OwnedFd],
    outside: BorrowedFd<'a>,
}

impl Wire for SysWire<'_> {
    fn recv_inside(&mut self, inside: usize, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        let sock = self.inside.get(inside)?;
        match ferry_sys::recv_from(sock.as_fd(), buf) {
            Ok((n, Some(from))) => Some((n, from)),
            _ => None,
        }
    }

    fn send_inside(&mut self, inside: usize, msg: &[u8], to: &SocketAddr) -> bool {
        self.inside
            .get(inside)
            .is_some_and(|s| ferry_sys::send_to(s.as_fd(), msg, to).is_ok())
    }

    fn recv_upstream(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        match ferry_sys::recv_from(self.outside, buf) {
            Ok((n, Some(from))) => Some((n, from)),
            _ => None,
        }
    }

    fn send_upstream(&mut self, msg: &[u8], to: &SocketAddr) -> bool {
        ferry_sys::send_to(self.outside, msg, to).is_ok()
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
