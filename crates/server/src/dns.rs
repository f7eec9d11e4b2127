//! A DNS forwarder for the sandbox.
//!
//! glibc's resolver sends its queries through libc-internal socket calls that the shim
//! cannot interpose, so they go to the kernel inside the sandbox, which has only `lo`.
//! The forwarder makes them work anyway: each nameserver address of the host's
//! `/etc/resolv.conf` is added to the sandbox's `lo`, a UDP socket bound to
//! `NAMESERVER:53` inside the sandbox receives the queries, and the server relays them
//! from the host namespace to the upstream servers (the same nameservers, or `--dns`),
//! with the query id rewritten so answers find their way back. UDP only; a query that
//! gets no answer is forgotten after a few seconds.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

/// Largest DNS message over UDP ferry relays (EDNS0 sizes included).
const MAX_MSG: usize = 4096;
/// How long an unanswered query is remembered.
const QUERY_TTL: Duration = Duration::from_secs(10);

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
    /// UDP socket in the host namespace that talks to the upstream servers.
    pub outside: OwnedFd,
    upstream: Vec<SocketAddr>,
    pending: HashMap<u16, Pending>,
    next_id: u16,
    /// Queries relayed and answers delivered.
    pub queries: u64,
    pub answers: u64,
}

impl Dns {
    pub fn new(inside: Vec<OwnedFd>, upstream: Vec<SocketAddr>) -> io::Result<Dns> {
        let v6 = upstream.iter().any(SocketAddr::is_ipv6);
        let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        let outside = ferry_sys::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )?;
        Ok(Dns {
            inside,
            outside,
            upstream,
            pending: HashMap::new(),
            next_id: 1,
            queries: 0,
            answers: 0,
        })
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
            for up in &self.upstream {
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
