//! The UDP half of the DNS forwarder without I/O: which queries are in flight under which
//! id, and what each datagram from the sandbox or from an upstream becomes. It reads and
//! sends through a [`Wire`] (the real ones are the protocol server's, `ferry-server`'s
//! `dns.rs`, and a NIC server's for a VM guest, `ferry-nic`'s `server/dns.rs`; the `dns`
//! fuzz target and the tests script one) and takes the time as an argument. Both paths
//! share it, so they share its bounds.
//!
//! Bounds, whatever the sandbox sends: at most [`MAX_PENDING`] queries are in flight
//! (a new one evicts the oldest, counted); finding a free id takes at most
//! `MAX_PENDING + 1` steps; one call reads at most [`BATCH`] datagrams (the rest wait
//! for the next turn of the event loop, so a flood cannot starve the server's other
//! work); a query is forgotten after [`QUERY_TTL`]. Only queries (QR = 0) go upstream;
//! only responses (QR = 1) from an upstream, under an id in flight, come back, each to
//! the client that asked, with its own id.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Most queries in flight at once; a new one evicts the oldest.
pub const MAX_PENDING: usize = 4096;
/// How long an unanswered query is remembered.
pub const QUERY_TTL: Duration = Duration::from_secs(10);
/// Most datagrams one call reads from one socket.
pub const BATCH: usize = 64;
/// Largest DNS message over UDP ferry relays (EDNS0 sizes included).
pub const MAX_MSG: usize = 4096;
/// A DNS header: id, flags, four counts.
pub const HEADER: usize = 12;

/// The datagram calls the forwarder makes: each socket is non-blocking.
pub trait Wire {
    /// One datagram waiting on inside socket `inside`, into `buf`: its length (at most
    /// `buf.len()`) and sender; `None` when none waits or the socket failed.
    fn recv_inside(&mut self, inside: usize, buf: &mut [u8]) -> Option<(usize, SocketAddr)>;
    /// Sends `msg` from inside socket `inside` to `to`; whether it went.
    fn send_inside(&mut self, inside: usize, msg: &[u8], to: &SocketAddr) -> bool;
    /// One datagram waiting on the upstream socket, as [`Wire::recv_inside`].
    fn recv_upstream(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr)>;
    /// Sends `msg` from the upstream socket to `to`; whether it went.
    fn send_upstream(&mut self, msg: &[u8], to: &SocketAddr) -> bool;
}

/// What the forwarder did, for the server's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Queries relayed to at least one upstream.
    pub queries: u64,
    /// Answers delivered to the client that asked.
    pub answers: u64,
    /// Datagrams from the sandbox that are not queries (shorter than a header, or
    /// QR = 1), dropped.
    pub dropped: u64,
    /// Queries in flight forgotten to make room for newer ones.
    pub evicted: u64,
    /// Datagrams on the upstream socket that answer nothing in flight (not from an
    /// upstream, not a response, too short, a later upstream's answer), dropped.
    pub stray: u64,
}

/// Where an answer goes: the inside socket that took the query and the client that
/// sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asker {
    pub inside: usize,
    pub client: SocketAddr,
}

#[derive(Debug)]
struct Pending {
    asker: Asker,
    /// The client's own id.
    id: u16,
    since: Instant,
    /// Tells this entry from an earlier one under the same id in `order`.
    serial: u64,
}

/// The forwarder's UDP state: the upstreams, the queries in flight, the counters.
#[derive(Debug)]
pub struct Forwarder {
    upstream: Vec<SocketAddr>,
    pending: HashMap<u16, Pending>,
    /// Ids in the order their queries came (oldest first), with their entry's serial;
    /// entries answered since stay until they reach the front or a compaction.
    order: VecDeque<(u16, u64)>,
    next_id: u16,
    serial: u64,
    /// Most queries in flight ([`MAX_PENDING`] but in tests).
    limit: usize,
    counts: Counts,
}

impl Forwarder {
    /// A forwarder relaying to `upstream`; `seed` picks where its sequence of ids starts.
    pub fn new(upstream: Vec<SocketAddr>, seed: u16) -> Forwarder {
        Forwarder::with_limit(upstream, seed, MAX_PENDING)
    }

    /// The same with at most `limit` queries in flight (1 to [`MAX_PENDING`]): a small
    /// table lets tests and the fuzzer reach its bound with a few queries.
    pub fn with_limit(upstream: Vec<SocketAddr>, seed: u16, limit: usize) -> Forwarder {
        Forwarder {
            upstream,
            pending: HashMap::new(),
            order: VecDeque::new(),
            next_id: seed,
            serial: 0,
            limit: limit.clamp(1, MAX_PENDING),
            counts: Counts::default(),
        }
    }

    /// Most queries in flight at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The upstream servers.
    pub fn upstream(&self) -> &[SocketAddr] {
        &self.upstream
    }

    /// The counters so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Queries in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Datagrams waiting on inside socket `inside`: each query goes to every upstream
    /// under a fresh id. Reads at most [`BATCH`]; returns how many it read.
    pub fn from_sandbox(&mut self, wire: &mut impl Wire, inside: usize, now: Instant) -> usize {
        self.expire(now);
        let mut buf = [0u8; MAX_MSG];
        let mut read = 0;
        while read < BATCH {
            let Some((n, client)) = wire.recv_inside(inside, &mut buf) else {
                break;
            };
            read += 1;
            let msg = &mut buf[..n.min(MAX_MSG)];
            let Some(id) = self.query(Asker { inside, client }, msg, now) else {
                continue;
            };
            let mut sent = false;
            for up in &self.upstream {
                sent |= wire.send_upstream(msg, up);
            }
            self.relayed(id, sent);
        }
        read
    }

    /// Datagrams waiting on the upstream socket: each answer goes back to the client
    /// that asked. Reads at most [`BATCH`]; returns how many it read.
    pub fn from_upstream(&mut self, wire: &mut impl Wire) -> usize {
        let mut buf = [0u8; MAX_MSG];
        let mut read = 0;
        while read < BATCH {
            let Some((n, from)) = wire.recv_upstream(&mut buf) else {
                break;
            };
            read += 1;
            let msg = &mut buf[..n.min(MAX_MSG)];
            if let Some(to) = self.answer(from, msg)
                && wire.send_inside(to.inside, msg, &to.client)
            {
                self.counts.answers += 1;
            }
        }
        read
    }

    /// A datagram `asker` sent: a query is remembered under a fresh id, which replaces
    /// its own in `msg`, and the id is returned (the caller sends `msg` upstream and
    /// says how that went with [`Forwarder::relayed`]); anything else is dropped.
    pub fn query(&mut self, asker: Asker, msg: &mut [u8], now: Instant) -> Option<u16> {
        if msg.len() < HEADER || is_response(msg) {
            self.counts.dropped += 1;
            return None;
        }
        while self.pending.len() >= self.limit {
            self.evict_oldest();
        }
        let Some(new_id) = self.fresh_id() else {
            // Unreachable while the table holds fewer than `limit` ids (see
            // `fresh_id`); dropped rather than trusted.
            self.counts.dropped += 1;
            return None;
        };
        let id = u16::from_be_bytes([msg[0], msg[1]]);
        msg[..2].copy_from_slice(&new_id.to_be_bytes());
        self.serial += 1;
        self.pending.insert(
            new_id,
            Pending {
                asker,
                id,
                since: now,
                serial: self.serial,
            },
        );
        self.order.push_back((new_id, self.serial));
        self.compact();
        Some(new_id)
    }

    /// Query `id` went to at least one upstream (`sent`), or to none: then it is
    /// forgotten.
    pub fn relayed(&mut self, id: u16, sent: bool) {
        if sent {
            self.counts.queries += 1;
        } else {
            self.pending.remove(&id);
        }
    }

    /// A datagram `from` sent to the upstream socket: the answer to a query in flight
    /// gets the client's id back in `msg` and the query is done (the first answer wins);
    /// returns where it goes. Anything else is counted as stray.
    pub fn answer(&mut self, from: SocketAddr, msg: &mut [u8]) -> Option<Asker> {
        let ours = msg.len() >= HEADER && is_response(msg) && self.upstream.contains(&from);
        let p = ours
            .then(|| self.pending.remove(&u16::from_be_bytes([msg[0], msg[1]])))
            .flatten();
        let Some(p) = p else {
            self.counts.stray += 1;
            return None;
        };
        msg[..2].copy_from_slice(&p.id.to_be_bytes());
        Some(p.asker)
    }

    /// Forgets the queries older than [`QUERY_TTL`].
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(id, serial)) = self.order.front() {
            match self.pending.get(&id) {
                Some(p) if p.serial == serial => {
                    if now.saturating_duration_since(p.since) < QUERY_TTL {
                        return;
                    }
                    self.pending.remove(&id);
                }
                _ => {} // answered, unsent or evicted already
            }
            self.order.pop_front();
        }
    }

    /// Forgets the oldest query in flight.
    fn evict_oldest(&mut self) {
        while let Some((id, serial)) = self.order.pop_front() {
            if self.pending.get(&id).is_some_and(|p| p.serial == serial) {
                self.pending.remove(&id);
                self.counts.evicted += 1;
                return;
            }
        }
        // `order` lists every entry of `pending`: this is not reached while it is
        // not empty, but an empty `order` must not leave the caller looping.
        self.pending.clear();
    }

    /// Drops the entries of `order` whose queries are done, once they are as many as
    /// the live ones: each query costs O(1) amortised, and `order` stays under
    /// `2 × limit + 1`.
    fn compact(&mut self) {
        if self.order.len() <= 2 * self.limit {
            return;
        }
        let pending = &self.pending;
        self.order
            .retain(|(id, serial)| pending.get(id).is_some_and(|p| p.serial == *serial));
    }

    /// An id no query in flight has. The ids follow a full-period sequence modulo 2^16,
    /// so any `limit + 1` in a row (≤ 2^16) are distinct and one of them is free while
    /// fewer than `limit` are in flight: the search is bounded.
    fn fresh_id(&mut self) -> Option<u16> {
        for _ in 0..=self.limit {
            let id = self.next_id;
            self.next_id = next_in_sequence(id);
            if !self.pending.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }
}

/// The id after `id`: a linear congruential sequence with a ≡ 1 (mod 4) and c odd, so
/// of period 2^16 (Hull–Dobell).
fn next_in_sequence(id: u16) -> u16 {
    id.wrapping_mul(25173).wrapping_add(13849)
}

/// Whether a DNS message's QR bit says it is a response (`msg` holds a header).
fn is_response(msg: &[u8]) -> bool {
    msg[2] & 0x80 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted wire: datagrams waiting per socket, and what was sent.
    #[derive(Default)]
    struct Script {
        inside: VecDeque<(Vec<u8>, SocketAddr)>,
        upstream: VecDeque<(Vec<u8>, SocketAddr)>,
        to_sandbox: Vec<(Vec<u8>, SocketAddr)>,
        to_upstream: Vec<(Vec<u8>, SocketAddr)>,
        upstream_refuses: bool,
    }

    impl Wire for Script {
        fn recv_inside(&mut self, _: usize, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
            let (m, from) = self.inside.pop_front()?;
            buf[..m.len()].copy_from_slice(&m);
            Some((m.len(), from))
        }
        fn send_inside(&mut self, _: usize, msg: &[u8], to: &SocketAddr) -> bool {
            self.to_sandbox.push((msg.to_vec(), *to));
            true
        }
        fn recv_upstream(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
            let (m, from) = self.upstream.pop_front()?;
            buf[..m.len()].copy_from_slice(&m);
            Some((m.len(), from))
        }
        fn send_upstream(&mut self, msg: &[u8], to: &SocketAddr) -> bool {
            self.to_upstream.push((msg.to_vec(), *to));
            !self.upstream_refuses
        }
    }

    fn up() -> SocketAddr {
        "192.0.2.53:53".parse().unwrap()
    }

    fn client(port: u16) -> SocketAddr {
        SocketAddr::new("10.255.255.1".parse().unwrap(), port)
    }

    /// A message with id `id`, a query or a response, and a recognisable body.
    fn msg(id: u16, response: bool) -> Vec<u8> {
        let mut m = id.to_be_bytes().to_vec();
        m.extend_from_slice(&[
            if response { 0x81 } else { 0x01 },
            0,
            0,
            1,
            0,
            0,
            0,
            0,
            0,
            0,
        ]);
        m.extend_from_slice(b"\x03www\x00\x00\x01\x00\x01");
        m
    }

    fn id_of(m: &[u8]) -> u16 {
        u16::from_be_bytes([m[0], m[1]])
    }

    #[test]
    fn an_answer_goes_back_to_the_client_that_asked_with_its_id() {
        let mut f = Forwarder::new(vec![up()], 7);
        let mut w = Script::default();
        let now = Instant::now();
        w.inside.push_back((msg(0x1111, false), client(1000)));
        w.inside.push_back((msg(0x1111, false), client(2000)));
        assert_eq!(f.from_sandbox(&mut w, 0, now), 2);
        assert_eq!(w.to_upstream.len(), 2);
        let (a, b) = (id_of(&w.to_upstream[0].0), id_of(&w.to_upstream[1].0));
        assert_ne!(a, b, "two clients' equal ids travel under different ones");
        assert_eq!(w.to_upstream[0].0[2..], msg(0x1111, false)[2..]);
        // The second client's answer first; a copy from a stranger is stray.
        let mut ans = msg(b, true);
        w.upstream
            .push_back((ans.clone(), "192.0.2.99:53".parse().unwrap()));
        w.upstream.push_back((ans.clone(), up()));
        w.upstream.push_back((ans.clone(), up())); // a second answer: the first won
        assert_eq!(f.from_upstream(&mut w), 3);
        ans[..2].copy_from_slice(&0x1111u16.to_be_bytes());
        assert_eq!(w.to_sandbox, vec![(ans, client(2000))]);
        let c = f.counts();
        assert_eq!((c.queries, c.answers, c.stray), (2, 1, 2));
        assert_eq!(f.in_flight(), 1);
    }

    #[test]
    fn responses_and_short_messages_from_the_sandbox_are_dropped() {
        let mut f = Forwarder::new(vec![up()], 7);
        let mut w = Script::default();
        w.inside.push_back((msg(1, true), client(1)));
        w.inside.push_back((vec![0; HEADER - 1], client(1)));
        f.from_sandbox(&mut w, 0, Instant::now());
        assert!(w.to_upstream.is_empty());
        assert_eq!(f.counts().dropped, 2);
        assert_eq!(f.in_flight(), 0);
        // Nor does a query coming back from upstream count as an answer.
        w.inside.push_back((msg(1, false), client(1)));
        f.from_sandbox(&mut w, 0, Instant::now());
        let mut echoed = w.to_upstream[0].0.clone();
        assert!(f.answer(up(), &mut echoed).is_none());
        assert_eq!(f.in_flight(), 1);
    }

    #[test]
    fn a_full_table_evicts_the_oldest_and_every_id_stays_unique() {
        let mut f = Forwarder::new(vec![up()], 0);
        let now = Instant::now();
        let mut ids = Vec::new();
        for i in (0u16..).take(3 * MAX_PENDING + 5) {
            let mut m = msg(0, false);
            let id = f.query(
                Asker {
                    inside: 0,
                    client: client(i),
                },
                &mut m,
                now,
            );
            let id = id.expect("a query always gets an id");
            f.relayed(id, true);
            ids.push(id);
            assert!(f.in_flight() <= MAX_PENDING);
            assert!(f.order.len() <= 2 * MAX_PENDING + 1);
        }
        assert_eq!(f.counts().evicted, 2 * MAX_PENDING as u64 + 5);
        // The newest MAX_PENDING are the ones in flight, each under its own id.
        let live: std::collections::HashSet<u16> =
            ids[ids.len() - MAX_PENDING..].iter().copied().collect();
        assert_eq!(live.len(), MAX_PENDING);
        assert!(live.iter().all(|id| f.pending.contains_key(id)));
    }

    #[test]
    fn an_evicted_query_gets_no_answer_and_the_others_do() {
        let mut f = Forwarder::with_limit(vec![up()], 5, 2);
        let mut w = Script::default();
        for port in 1..=3 {
            w.inside.push_back((msg(port, false), client(port)));
        }
        f.from_sandbox(&mut w, 0, Instant::now());
        assert_eq!((f.in_flight(), f.counts().evicted), (2, 1));
        for (m, _) in &w.to_upstream {
            w.upstream.push_back((msg(id_of(m), true), up()));
        }
        f.from_upstream(&mut w);
        let to: Vec<SocketAddr> = w.to_sandbox.iter().map(|(_, c)| *c).collect();
        assert_eq!(to, vec![client(2), client(3)]);
        assert_eq!(f.counts().stray, 1);
    }

    #[test]
    fn one_call_reads_a_bounded_batch() {
        let mut f = Forwarder::new(vec![up()], 0);
        let mut w = Script::default();
        for i in (0u16..).take(3 * BATCH) {
            w.inside.push_back((msg(i, i % 2 == 0), client(5)));
        }
        assert_eq!(f.from_sandbox(&mut w, 0, Instant::now()), BATCH);
        assert_eq!(w.inside.len(), 2 * BATCH);
        for _ in 0..3 * BATCH {
            w.upstream.push_back((msg(0, true), up()));
        }
        assert_eq!(f.from_upstream(&mut w), BATCH);
    }

    #[test]
    fn unanswered_and_unsent_queries_are_forgotten() {
        let mut f = Forwarder::new(vec![up()], 3);
        let mut w = Script::default();
        let t0 = Instant::now();
        w.inside.push_back((msg(9, false), client(9)));
        f.from_sandbox(&mut w, 0, t0);
        assert_eq!(f.in_flight(), 1);
        f.expire(t0 + QUERY_TTL / 2);
        assert_eq!(f.in_flight(), 1);
        f.expire(t0 + QUERY_TTL);
        assert_eq!(f.in_flight(), 0);
        assert!(f.order.is_empty());
        // No upstream took it: not in flight, not counted as relayed.
        w.upstream_refuses = true;
        w.inside.push_back((msg(9, false), client(9)));
        f.from_sandbox(&mut w, 0, t0);
        assert_eq!((f.in_flight(), f.counts().queries), (0, 1));
    }

    #[test]
    fn the_id_sequence_has_full_period() {
        let mut seen = vec![false; 1 << 16];
        let mut id = 1;
        for _ in 0..1 << 16 {
            assert!(!seen[usize::from(id)]);
            seen[usize::from(id)] = true;
            id = next_in_sequence(id);
        }
    }
}
