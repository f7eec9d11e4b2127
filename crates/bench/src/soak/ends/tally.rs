//! Counting and judging: what each connection's sends came to (the driver's
//! [`Outcome`]), what the peer received ([`Record`]), the peer's verdict on a case
//! ([`judge`]) and the closing line that puts both together ([`Summary`]). Pure.

use std::collections::HashMap;

use super::wire::{VERDICT_MAGIC, words};
use super::{Case, CloseWay, Method};

/// How one connection's sends ended, as the driver saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every planned byte was reported sent (the race case's success; in the others,
    /// a send into a dead connection: the sendfile case's whole file).
    AllSent { sent: u64 },
    /// A send failed with EPIPE or ECONNRESET after the peer's stop.
    Refused {
        sent: u64,
        errno: i32,
        /// Bytes reported sent past the peer's stop, and how long after the stop was
        /// reached, until the error.
        after_bytes: u64,
        after_ms: u64,
        /// Whether every send tried after the error failed too.
        sticky: bool,
    },
    /// Sends kept succeeding past the bounds after the peer's stop.
    Dead { sent: u64 },
    /// No error and no progress within the bounds.
    Stalled { sent: u64, why: String },
    /// Anything else (an error before the stop, a connect that failed…).
    Failed { sent: u64, why: String },
}

impl Outcome {
    /// Bytes the sends reported.
    pub fn sent(&self) -> u64 {
        match self {
            Outcome::AllSent { sent }
            | Outcome::Refused { sent, .. }
            | Outcome::Dead { sent }
            | Outcome::Stalled { sent, .. }
            | Outcome::Failed { sent, .. } => *sent,
        }
    }
}

/// The driver's counts of one case.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Connections.
    pub conns: u64,
    /// Bytes the sends reported sent.
    pub sent: u64,
    /// Connections whose sends kept succeeding into a dead connection.
    pub dead_sends: u64,
    /// Connections where a send after the first error succeeded (or would block).
    pub not_sticky: u64,
    /// Connections that stalled.
    pub stalled: u64,
    /// Connections that failed otherwise.
    pub failed: u64,
    /// Connections refused with EPIPE / ECONNRESET.
    pub epipe: u64,
    /// See `epipe`.
    pub econnreset: u64,
    /// Most bytes / milliseconds between the peer's stop and the error.
    pub most_after_bytes: u64,
    /// See `most_after_bytes`.
    pub most_after_ms: u64,
    /// The first few failures, with why.
    pub failures: Vec<String>,
}

impl Tally {
    /// Adds connection `id`'s outcome.
    pub fn add(&mut self, case: Case, id: u64, o: &Outcome) {
        self.conns += 1;
        self.sent += o.sent();
        let why = match o {
            Outcome::AllSent { .. } if case == Case::Race => None,
            Outcome::AllSent { sent } | Outcome::Dead { sent } => {
                self.dead_sends += 1;
                Some(format!("sends kept succeeding ({sent} bytes)"))
            }
            Outcome::Refused {
                errno,
                after_bytes,
                after_ms,
                sticky,
                ..
            } => {
                match *errno {
                    libc::EPIPE => self.epipe += 1,
                    _ => self.econnreset += 1,
                }
                self.most_after_bytes = self.most_after_bytes.max(*after_bytes);
                self.most_after_ms = self.most_after_ms.max(*after_ms);
                self.not_sticky += u64::from(!sticky);
                (!sticky).then(|| "a send after the error did not fail".to_owned())
            }
            Outcome::Stalled { why, .. } => {
                self.stalled += 1;
                Some(format!("stalled: {why}"))
            }
            Outcome::Failed { why, .. } => {
                self.failed += 1;
                Some(why.clone())
            }
        };
        if let Some(w) = why.filter(|_| self.failures.len() < 20) {
            self.failures
                .push(format!("{} connection {id}: {w}", case.name()));
        }
    }

    /// Adds up another slot's counts.
    pub fn merge(&mut self, o: Tally) {
        self.conns += o.conns;
        self.sent += o.sent;
        self.dead_sends += o.dead_sends;
        self.not_sticky += o.not_sticky;
        self.stalled += o.stalled;
        self.failed += o.failed;
        self.epipe += o.epipe;
        self.econnreset += o.econnreset;
        self.most_after_bytes = self.most_after_bytes.max(o.most_after_bytes);
        self.most_after_ms = self.most_after_ms.max(o.most_after_ms);
        let room = 20usize.saturating_sub(self.failures.len());
        self.failures.extend(o.failures.into_iter().take(room));
    }
}

/// How a connection ended at the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerEnd {
    /// Still being read.
    Open,
    /// End of stream (FIN) from the driver.
    Eof,
    /// A read failed (the driver's side reset).
    Reset,
    /// The peer had its `stop` bytes and reset or closed, as told.
    Acted,
    /// No byte and no end for the peer's read timeout.
    Timeout,
}

/// What the peer received on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// The calls the driver sent by and how it closed (from the head).
    pub method: Method,
    /// See `method`.
    pub close: CloseWay,
    /// Payload bytes the peer read before it was to act.
    pub stop: u64,
    /// Payload bytes received.
    pub received: u64,
    /// Received bytes that differ from the stream.
    pub bad: u64,
    /// How it ended.
    pub end: PeerEnd,
}

/// The peer's verdict on one case of one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerVerdict {
    /// Connections the peer saw (of those the driver listed).
    pub conns: u64,
    /// Listed connections the peer never saw.
    pub missing: u64,
    /// Payload bytes received.
    pub received: u64,
    /// Bytes reported sent (up to the peer's stop) that never arrived.
    pub lost: u64,
    /// Bytes received beyond what was reported sent.
    pub extra: u64,
    /// Received bytes that differ from the stream.
    pub bad: u64,
    /// Connections still open (or timed out) at the verdict.
    pub unfinished: u64,
    /// Connections the driver's side reset where it should have ended the stream.
    pub resets: u64,
}

impl PeerVerdict {
    const WORDS: usize = 8;
    /// Length on the wire.
    pub const LEN: usize = 8 + 8 * Self::WORDS;

    fn fields(&self) -> [u64; Self::WORDS] {
        [
            self.conns,
            self.missing,
            self.received,
            self.lost,
            self.extra,
            self.bad,
            self.unfinished,
            self.resets,
        ]
    }

    /// The wire form.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&VERDICT_MAGIC);
        for (i, v) in self.fields().iter().enumerate() {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses the wire form.
    pub fn decode(b: &[u8; Self::LEN]) -> Option<PeerVerdict> {
        if b[..8] != VERDICT_MAGIC {
            return None;
        }
        let [
            conns,
            missing,
            received,
            lost,
            extra,
            bad,
            unfinished,
            resets,
        ] = words::<{ Self::WORDS }>(&b[8..]);
        Some(PeerVerdict {
            conns,
            missing,
            received,
            lost,
            extra,
            bad,
            unfinished,
            resets,
        })
    }

    /// Nothing lost, added, altered, missing, unfinished or reset.
    pub fn clean(&self) -> bool {
        [
            self.missing,
            self.lost,
            self.extra,
            self.bad,
            self.unfinished,
            self.resets,
        ] == [0; 6]
    }

    /// `conns=… missing=… …` (the figures not already on the driver's side).
    pub fn line(&self) -> String {
        format!(
            "peer: conns={} missing={} extra={} resets={} unfinished={}",
            self.conns, self.missing, self.extra, self.resets, self.unfinished
        )
    }
}

/// The peer's verdict on `case`: for each listed (id, bytes reported sent), what it
/// received of what it should have (everything in the race case; up to its stop in
/// the others).
pub fn judge(case: Case, sent: &[(u64, u64)], records: &HashMap<u64, Record>) -> PeerVerdict {
    let mut v = PeerVerdict::default();
    for &(id, n) in sent {
        let Some(r) = records.get(&id) else {
            v.missing += 1;
            if case == Case::Race {
                v.lost += n;
            }
            continue;
        };
        v.conns += 1;
        v.received += r.received;
        v.bad += r.bad;
        if matches!(r.end, PeerEnd::Open | PeerEnd::Timeout) {
            v.unfinished += 1;
            continue;
        }
        let due = n.min(r.stop);
        v.lost += due.saturating_sub(r.received);
        v.extra += r.received.saturating_sub(due);
        v.resets += u64::from(case == Case::Race && r.end == PeerEnd::Reset);
    }
    v
}

/// The connections that lost bytes (reported sent up to the peer's stop, not
/// received), as `(id, record, bytes reported sent)`, by id.
pub fn short(
    case: Case,
    sent: &[(u64, u64)],
    records: &HashMap<u64, Record>,
) -> Vec<(u64, Record, u64)> {
    sent.iter()
        .filter_map(|&(id, n)| {
            let r = records.get(&id)?;
            let due = if case == Case::Race { n } else { n.min(r.stop) };
            let ended = !matches!(r.end, PeerEnd::Open | PeerEnd::Timeout);
            (ended && r.received < due).then_some((id, *r, n))
        })
        .collect()
}

/// One case of one run, both ends' counts.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The case.
    pub case: Case,
    /// The driver's counts.
    pub tally: Tally,
    /// The peer's verdict.
    pub peer: PeerVerdict,
    /// Wall time of the case.
    pub seconds: f64,
}

impl Summary {
    /// Zero lost bytes and no send into a dead connection: no byte lost, added or
    /// altered, no dead send, every failure sticky, no stall or other failure, the
    /// peer saw every connection end, and (but in the race) each ended in EPIPE or
    /// ECONNRESET.
    pub fn ok(&self) -> bool {
        let t = &self.tally;
        let refused = self.case == Case::Race || t.epipe + t.econnreset == t.conns;
        refused
            && t.dead_sends == 0
            && t.not_sticky == 0
            && t.stalled == 0
            && t.failed == 0
            && self.peer.clean()
            && self.peer.conns == t.conns
    }

    /// `race: OK conns=… sent=… received=… lost=… bad_bytes=… dead_sends=… not_sticky=…
    /// stalled=… failed=… seconds=… | EPIPE=… ECONNRESET=… after_stop_max=…B/…ms | peer:
    /// …`.
    pub fn line(&self) -> String {
        let (t, p) = (&self.tally, &self.peer);
        format!(
            "{}: {} conns={} sent={} received={} lost={} bad_bytes={} dead_sends={} not_sticky={} stalled={} failed={} seconds={:.1} | EPIPE={} ECONNRESET={} after_stop_max={}B/{}ms | {}",
            self.case.name(),
            if self.ok() { "OK" } else { "BAD" },
            t.conns,
            t.sent,
            p.received,
            p.lost,
            p.bad,
            t.dead_sends,
            t.not_sticky,
            t.stalled,
            t.failed,
            self.seconds,
            t.epipe,
            t.econnreset,
            t.most_after_bytes,
            t.most_after_ms,
            p.line()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(stop: u64, received: u64, end: PeerEnd) -> Record {
        Record {
            method: Method::Send,
            close: CloseWay::Close,
            stop,
            received,
            bad: 0,
            end,
        }
    }

    #[test]
    fn a_short_stream_is_lost_bytes() {
        let mut m = HashMap::new();
        m.insert(0, rec(u64::MAX, 100, PeerEnd::Eof));
        m.insert(1, rec(u64::MAX, 60, PeerEnd::Eof));
        m.insert(2, rec(u64::MAX, 100, PeerEnd::Reset));
        let v = judge(Case::Race, &[(0, 100), (1, 100), (2, 100), (3, 7)], &m);
        assert_eq!((v.conns, v.missing, v.received), (3, 1, 260));
        assert_eq!((v.lost, v.extra, v.resets), (47, 0, 1));
        let s = short(Case::Race, &[(0, 100), (1, 100), (2, 100), (3, 7)], &m);
        assert_eq!(
            s.iter().map(|(id, _, n)| (*id, *n)).collect::<Vec<_>>(),
            [(1, 100)]
        );
        assert!(!v.clean());
        let clean = judge(Case::Race, &[(0, 100)], &m);
        assert!(clean.clean(), "{clean:?}");
    }

    #[test]
    fn past_the_stop_nothing_is_due() {
        let mut m = HashMap::new();
        m.insert(0, rec(1024, 1024, PeerEnd::Acted));
        m.insert(1, rec(4096, 10, PeerEnd::Eof));
        m.insert(2, rec(4096, 0, PeerEnd::Open));
        let v = judge(Case::Sendfile, &[(0, 139_264), (1, 10), (2, 9)], &m);
        assert_eq!((v.lost, v.extra, v.unfinished, v.resets), (0, 0, 1, 0));
        let v = judge(Case::Dead, &[(0, 100), (1, 10)], &m);
        assert_eq!((v.lost, v.extra), (0, 924));
    }

    #[test]
    fn verdict_round_trip() {
        let v = PeerVerdict {
            conns: 1,
            missing: 2,
            received: 3,
            lost: 4,
            extra: 5,
            bad: 6,
            unfinished: 7,
            resets: 8,
        };
        assert_eq!(PeerVerdict::decode(&v.encode()), Some(v));
        assert!(PeerVerdict::decode(&[0; PeerVerdict::LEN]).is_none());
    }

    #[test]
    fn dead_sends_and_lost_bytes_fail_a_case() {
        let refused = Outcome::Refused {
            sent: 10,
            errno: libc::ECONNRESET,
            after_bytes: 5,
            after_ms: 1,
            sticky: true,
        };
        let mut t = Tally::default();
        t.add(Case::Dead, 0, &refused);
        let peer = PeerVerdict {
            conns: 1,
            received: 5,
            ..PeerVerdict::default()
        };
        let s = |tally: &Tally, peer| Summary {
            case: Case::Dead,
            tally: tally.clone(),
            peer,
            seconds: 1.0,
        };
        assert!(s(&t, peer).ok(), "{}", s(&t, peer).line());
        assert!(!s(&t, PeerVerdict { lost: 1, ..peer }).ok());
        let mut dead = t.clone();
        dead.add(Case::Dead, 1, &Outcome::AllSent { sent: 5 });
        let peer2 = PeerVerdict { conns: 2, ..peer };
        assert!(!s(&dead, peer2).ok());
        assert_eq!(dead.dead_sends, 1);
        assert!(s(&dead, peer2).line().starts_with("dead: BAD conns=2 "));
        let mut loose = Tally::default();
        let loose_one = Outcome::Refused {
            sent: 10,
            errno: libc::EPIPE,
            after_bytes: 5,
            after_ms: 1,
            sticky: false,
        };
        loose.add(Case::Dead, 0, &loose_one);
        assert!(!s(&loose, peer).ok());
        // In the race every byte sent is the success.
        let mut race = Tally::default();
        race.add(Case::Race, 0, &Outcome::AllSent { sent: 5 });
        let r = Summary {
            case: Case::Race,
            tally: race,
            peer,
            seconds: 1.0,
        };
        assert!(r.ok(), "{}", r.line());
    }
}
