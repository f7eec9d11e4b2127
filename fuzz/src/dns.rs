//! Target `dns`: the DNS forwarder's UDP handling (`ferry_server::dns::Forwarder`)
//! in-process, over a scripted [`Wire`]: datagrams a hostile program sends the
//! sandbox's nameserver addresses (queries, responses, runts, anything, up to the
//! relay's buffer and past it), datagrams on the upstream socket (answers to queries in
//! flight, strangers, echoes, late second answers), sends that fail, time passing
//! beyond the query lifetime, bursts past the table's bound, in any order. Or, when the
//! first byte says so, the rest of the input is parsed as a `resolv.conf`
//! (`dns::nameservers`). Deterministic, no sockets, no root.
//!
//! Input: a byte (bit 0: two upstreams, else one; bit 1: a `resolv.conf`; bit 2: a
//! table of 1 to 64 queries, from the next byte, instead of `MAX_PENDING`, so that its
//! bound is reached in a few steps), the id sequence's seed (2 bytes), then at most
//! [`MAX_STEPS`] steps, each an op byte and its arguments (see `step`).
//!
//! Properties, besides no panic (debug assertions and overflow checks on):
//! - each call reads at most `BATCH` datagrams, and exactly that many while more wait;
//! - at most `MAX_PENDING` (or the table's smaller bound) queries are in flight,
//!   whatever comes;
//! - only queries go upstream (QR = 0, a whole header), to every upstream, with the
//!   sandbox's bytes after the id unchanged;
//! - an answer reaches the sandbox only from an upstream's address, only as a response,
//!   only for the query last relayed under its id and only once, through the inside
//!   socket and to the client that asked, with that client's id and the upstream's bytes
//!   after it; while nothing was evicted, each such answer within the query's lifetime
//!   is delivered (unless the send into the sandbox fails);
//! - the counters add up: every datagram read from the sandbox is dropped, relayed or
//!   unsent; every one read from upstream is delivered, stray or lost on the send.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferry_server::dns::forward::{BATCH, HEADER, MAX_PENDING, QUERY_TTL};
use ferry_server::dns::{Counts, Forwarder, Wire, nameservers};

use crate::input::Input;

/// Most steps of one script.
pub const MAX_STEPS: usize = 128;
/// Most datagrams one script sends in all (bursts included): past `MAX_PENDING`.
pub const MAX_DATAGRAMS: usize = MAX_PENDING + MAX_PENDING / 2;
/// Inside sockets of the forwarder (the script also names one that does not exist).
const INSIDE: usize = 2;

/// A query the script saw relayed: where its answer must go.
#[derive(Clone, Copy, Debug)]
struct Relayed {
    inside: usize,
    client: SocketAddr,
    id: u16,
    at: Duration,
    answered: bool,
}

/// The scripted sockets, and the model the forwarder's sends are checked against.
#[derive(Debug, Default)]
struct Script {
    inside: [VecDeque<(Vec<u8>, SocketAddr)>; INSIDE],
    upstream: VecDeque<(Vec<u8>, SocketAddr)>,
    upstreams: Vec<SocketAddr>,
    /// Sends that fail: to upstream `i` (bit i), into the sandbox (bit 2).
    failing: u8,
    now: Duration,
    /// The datagram being handled: from the sandbox (its socket, client and bytes), or
    /// from upstream (its sender and bytes).
    current_query: Option<(usize, SocketAddr, Vec<u8>)>,
    current_answer: Option<(SocketAddr, Vec<u8>)>,
    /// Upstreams the current query went to, and whether one took it.
    sent_to: Vec<SocketAddr>,
    taken: bool,
    /// Queries relayed, by the id they travelled under (the last one under each id).
    relayed: HashMap<u16, Relayed>,
    /// Ids relayed, newest last (the script answers them).
    recent: Vec<u16>,
    read_inside: u64,
    read_upstream: u64,
    unsent: u64,
    lost: u64,
    delivered: u64,
}

impl Wire for Script {
    fn recv_inside(&mut self, inside: usize, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        self.finish_query();
        let (m, from) = self.inside.get_mut(inside)?.pop_front()?;
        // As the kernel does: a datagram longer than the buffer is cut.
        let n = m.len().min(buf.len());
        buf[..n].copy_from_slice(&m[..n]);
        self.read_inside += 1;
        self.current_query = Some((inside, from, m[..n].to_vec()));
        Some((n, from))
    }

    fn send_upstream(&mut self, msg: &[u8], to: &SocketAddr) -> bool {
        let Some((_, _, q)) = &self.current_query else {
            panic!("a send upstream with no query read");
        };
        assert!(
            msg.len() >= HEADER && msg[2] & 0x80 == 0,
            "not a query: {msg:02x?}"
        );
        assert_eq!(msg[2..], q[2..], "the query's bytes changed");
        assert!(self.upstreams.contains(to), "sent to {to}, not an upstream");
        assert!(!self.sent_to.contains(to), "sent twice to {to}");
        self.sent_to.push(*to);
        let i = self.upstreams.iter().position(|u| u == to).unwrap_or(0);
        let ok = self.failing & (1 << i) == 0;
        if ok && !self.taken {
            self.taken = true;
            let (inside, client, q) = self.current_query.clone().expect("checked above");
            let id = u16::from_be_bytes([msg[0], msg[1]]);
            let relayed = Relayed {
                inside,
                client,
                id: u16::from_be_bytes([q[0], q[1]]),
                at: self.now,
                answered: false,
            };
            self.relayed.insert(id, relayed);
            self.recent.push(id);
        }
        ok
    }

    fn recv_upstream(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        self.finish_query();
        let (m, from) = self.upstream.pop_front()?;
        let n = m.len().min(buf.len());
        buf[..n].copy_from_slice(&m[..n]);
        self.read_upstream += 1;
        self.current_answer = Some((from, m[..n].to_vec()));
        Some((n, from))
    }

    fn send_inside(&mut self, inside: usize, msg: &[u8], to: &SocketAddr) -> bool {
        let Some((from, a)) = self.current_answer.take() else {
            panic!("a send into the sandbox with no answer read");
        };
        assert!(self.upstreams.contains(&from), "delivered from {from}");
        assert!(
            a.len() >= HEADER && a[2] & 0x80 != 0,
            "not a response: {a:02x?}"
        );
        assert_eq!(msg[2..], a[2..], "the answer's bytes changed");
        let id = u16::from_be_bytes([a[0], a[1]]);
        let Some(r) = self.relayed.get_mut(&id) else {
            panic!("an answer under id {id}, which no relayed query had");
        };
        assert!(!r.answered, "a second answer to id {id} delivered");
        assert_eq!(
            (inside, *to),
            (r.inside, r.client),
            "delivered to another client"
        );
        assert_eq!(
            msg[..2],
            r.id.to_be_bytes(),
            "the client's id was not restored"
        );
        r.answered = true;
        let ok = self.failing & 4 == 0;
        if ok {
            self.delivered += 1;
        } else {
            self.lost += 1;
        }
        ok
    }
}

impl Script {
    /// The forwarder is done with the query read last: had it gone anywhere, it went
    /// to every upstream.
    fn finish_query(&mut self) {
        if self.current_query.take().is_some() && !self.sent_to.is_empty() {
            assert_eq!(
                self.sent_to.len(),
                self.upstreams.len(),
                "not every upstream"
            );
            if !self.taken {
                self.unsent += 1;
            }
        }
        self.sent_to.clear();
        self.taken = false;
        self.current_answer = None;
    }

    fn queued(&self) -> usize {
        self.inside.iter().map(VecDeque::len).sum::<usize>() + self.upstream.len()
    }
}

/// The forwarder, its script, and the clock.
struct Rig {
    fwd: Forwarder,
    wire: Script,
    epoch: Instant,
    sent: usize,
}

impl Rig {
    fn take_inside(&mut self, inside: usize) {
        let waiting = self.wire.inside.get(inside).map_or(0, VecDeque::len);
        let delivered = self.wire.delivered + self.wire.lost;
        let now = self.epoch + self.wire.now;
        let read = self.fwd.from_sandbox(&mut self.wire, inside, now);
        self.wire.finish_query();
        assert_eq!(read, waiting.min(BATCH), "read {read} of {waiting}");
        assert_eq!(delivered, self.wire.delivered + self.wire.lost);
        self.check();
    }

    fn take_upstream(&mut self) {
        let waiting = self.wire.upstream.len();
        // (Only when this call reads them all: the count is no bound otherwise.)
        let expected = if waiting <= BATCH {
            self.deliverable()
        } else {
            0
        };
        let before = self.wire.delivered + self.wire.lost;
        let read = self.fwd.from_upstream(&mut self.wire);
        self.wire.finish_query();
        assert_eq!(read, waiting.min(BATCH), "read {read} of {waiting}");
        if read == waiting {
            assert!(
                self.wire.delivered + self.wire.lost - before >= expected,
                "answers within their queries' lifetime were not delivered"
            );
        }
        self.check();
    }

    /// How many waiting upstream datagrams must be delivered: while nothing was evicted,
    /// each first well-formed answer from an upstream to a query relayed within the
    /// lifetime.
    fn deliverable(&self) -> u64 {
        if self.fwd.counts().evicted > 0 {
            return 0;
        }
        let mut seen = std::collections::HashSet::new();
        let w = &self.wire;
        w.upstream
            .iter()
            .filter(|(a, from)| {
                let Some(head) = a.get(..HEADER) else {
                    return false;
                };
                if head[2] & 0x80 == 0 || !w.upstreams.contains(from) {
                    return false;
                }
                let id = u16::from_be_bytes([head[0], head[1]]);
                w.relayed
                    .get(&id)
                    .is_some_and(|r| !r.answered && w.now.saturating_sub(r.at) < QUERY_TTL)
                    && seen.insert(id)
            })
            .count() as u64
    }

    fn check(&self) {
        let c = self.fwd.counts();
        let w = &self.wire;
        assert!(self.fwd.in_flight() <= self.fwd.limit());
        assert_eq!(
            w.read_inside,
            c.dropped + c.queries + w.unsent,
            "{c:?} {w:?}"
        );
        assert_eq!(w.read_upstream, c.answers + c.stray + w.lost, "{c:?}");
        assert_eq!(c.answers, w.delivered);
    }

    /// Queues a datagram from the sandbox, within the script's budget.
    fn queue_inside(&mut self, inside: usize, msg: Vec<u8>, client: SocketAddr) {
        if self.sent < MAX_DATAGRAMS {
            self.sent += 1;
            self.wire.inside[inside % INSIDE].push_back((msg, client));
        }
    }

    fn queue_upstream(&mut self, msg: Vec<u8>, from: SocketAddr) {
        if self.sent < MAX_DATAGRAMS {
            self.sent += 1;
            self.wire.upstream.push_back((msg, from));
        }
    }
}

fn client(k: u8) -> SocketAddr {
    match k % 4 {
        0 => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 40000),
        1 => SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 255, 255, 53)), 40001),
        2 => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 40000),
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 40002),
    }
}

/// A well-formed header and question with id `id`, a query or a response.
fn message(id: u16, response: bool) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend_from_slice(&[
        if response { 0x81 } else { 0x01 },
        0x80,
        0,
        1,
        0,
        0,
        0,
        0,
        0,
        0,
    ]);
    m.extend_from_slice(b"\x03www\x05ferry\x04test\x00\x00\x01\x00\x01");
    m
}

/// Bytes from the input, their QR bit forced by `flags` (bit 0 query, bit 1 response).
fn shaped(mut m: Vec<u8>, flags: u8) -> Vec<u8> {
    if let Some(b) = m.get_mut(2) {
        if flags & 1 != 0 {
            *b &= 0x7f;
        }
        if flags & 2 != 0 {
            *b |= 0x80;
        }
    }
    m
}

/// Runs one script.
pub fn run(data: &[u8]) {
    let _ = script(data);
}

/// Runs one script; the forwarder's counters at the end (`None` for a `resolv.conf`).
pub fn script(data: &[u8]) -> Option<Counts> {
    let mut inp = Input::new(data);
    let config = inp.u8();
    if config & 2 != 0 {
        let text = String::from_utf8_lossy(inp.rest());
        for ip in nameservers(&text) {
            assert!(text.contains("nameserver"), "{ip} from nothing");
        }
        return None;
    }
    let mut upstreams = vec![SocketAddr::from(([192, 0, 2, 53], 53))];
    if config & 1 != 0 {
        upstreams.push(SocketAddr::from(([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x53], 53)));
    }
    let limit = if config & 4 != 0 {
        1 + usize::from(inp.u8() % 64)
    } else {
        MAX_PENDING
    };
    let mut rig = Rig {
        fwd: Forwarder::with_limit(upstreams.clone(), inp.u16(), limit),
        wire: Script {
            upstreams: upstreams.clone(),
            ..Script::default()
        },
        epoch: Instant::now(),
        sent: 0,
    };
    for _ in 0..MAX_STEPS {
        if inp.is_empty() {
            break;
        }
        step(&mut rig, &mut inp, &upstreams);
    }
    // Whatever is still queued is read, a batch a call.
    for _ in 0..=MAX_DATAGRAMS / BATCH + 1 {
        if rig.wire.queued() == 0 {
            break;
        }
        for i in 0..INSIDE {
            rig.take_inside(i);
        }
        rig.take_upstream();
    }
    assert_eq!(rig.wire.queued(), 0, "datagrams left unread");
    Some(rig.fwd.counts())
}

/// One step: an op byte (modulo 8) and its arguments.
/// - 0: a datagram from the sandbox: socket, client, flags (bit 0 makes it a query,
///   bit 1 a response), bytes (u16 length);
/// - 1: a datagram on the upstream socket: sender (0–1 an upstream, 2 a stranger, 3 an
///   upstream's address with another port), flags (as for 0; bit 2: under the id of a
///   relayed query), which of those ids, bytes;
/// - 2: the forwarder reads inside socket `arg % 3` (2: one it does not have); 3: it
///   reads the upstream socket;
/// - 4: time passes (u16, milliseconds); 5: which sends fail (bits 0–1 the upstreams',
///   bit 2 into the sandbox);
/// - 6: a burst of `32 n + 1` queries on socket 0 (flags bit 0: every other one a
///   response);
/// - 7: well-formed answers to the newest `n` queries relayed.
fn step(rig: &mut Rig, inp: &mut Input<'_>, upstreams: &[SocketAddr]) {
    match inp.u8() % 8 {
        0 => {
            let (inside, who, flags) = (inp.u8(), inp.u8(), inp.u8());
            let m = shaped(inp.bytes16().to_vec(), flags);
            rig.queue_inside(usize::from(inside), m, client(who));
        }
        1 => {
            let (from, flags, pick) = (inp.u8(), inp.u8(), inp.u8());
            let mut m = shaped(inp.bytes16().to_vec(), flags);
            // Most often under an id in flight.
            if flags & 4 != 0 && m.len() >= 2 && !rig.wire.recent.is_empty() {
                let id = rig.wire.recent[usize::from(pick) % rig.wire.recent.len()];
                m[..2].copy_from_slice(&id.to_be_bytes());
            }
            let addr = match from % 4 {
                0 | 1 => upstreams[usize::from(from) % upstreams.len()],
                2 => SocketAddr::from(([198, 51, 100, 9], 53)),
                _ => SocketAddr::new(upstreams[0].ip(), 5353),
            };
            rig.queue_upstream(m, addr);
        }
        // Index INSIDE names a socket the forwarder does not have.
        2 => rig.take_inside(usize::from(inp.u8()) % (INSIDE + 1)),
        3 => rig.take_upstream(),
        4 => rig.wire.now += Duration::from_millis(u64::from(inp.u16())),
        5 => rig.wire.failing = inp.u8() & 7,
        6 => {
            // A burst of queries, past the table's bound if the budget allows.
            let (n, who, mix) = (usize::from(inp.u8()) * 32 + 1, inp.u8(), inp.u8() & 1);
            for k in (0u16..).take(n) {
                rig.queue_inside(0, message(k, mix == 1 && k % 2 == 1), client(who));
            }
        }
        _ => {
            // Well-formed answers to the newest queries relayed, from the first upstream.
            let n = usize::from(inp.u8());
            let ids: Vec<u16> = rig.wire.recent.iter().rev().take(n).copied().collect();
            for id in ids {
                rig.queue_upstream(message(id, true), upstreams[0]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(name: &str) -> Vec<u8> {
        crate::seeds::dns_scripts()
            .into_iter()
            .find(|(n, _)| n == name)
            .expect("a seed of that name")
            .1
    }

    #[test]
    fn each_seed_reaches_what_it_is_for() {
        let c = script(&seed("answered")).expect("a script");
        assert_eq!((c.queries, c.answers, c.stray), (1, 1, 2), "{c:?}");
        // A response and a runt dropped; a query too long cut and relayed; one relayed
        // while the first upstream fails; its answer too late.
        let c = script(&seed("hostile")).expect("a script");
        assert_eq!(
            (c.dropped, c.queries, c.answers, c.stray),
            (2, 2, 0, 1),
            "{c:?}"
        );
        let c = script(&seed("burst")).expect("a script");
        assert_eq!(c.queries, 32 * 150 + 1, "{c:?}");
        assert_eq!(c.evicted, c.queries - MAX_PENDING as u64, "{c:?}");
        assert_eq!(c.answers, 255, "{c:?}");
        let c = script(&seed("small")).expect("a script");
        assert!(c.evicted > 0 && c.answers > 0 && c.dropped > 0, "{c:?}");
        assert!(script(&seed("resolv")).is_none());
    }
}
