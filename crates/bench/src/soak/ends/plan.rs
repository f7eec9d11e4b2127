//! What each connection of a case does, drawn from the seed: payload, calls, how the
//! driver closes and what the peer does. Pure: the same seed gives the same plans.

use super::wire::{Head, MAGIC};
use super::{Act, Case, CloseWay, Method};
use crate::soak::{Rng, mix};

/// Length of the file the `sendfile` calls read (its bytes are the stream of the
/// file's key, so a range of it is checked like any other payload).
pub const FILE_LEN: u64 = 4 << 20;
/// The peer of the sendfile case stops after this many bytes (asyncio's test: 1 KiB).
pub const SENDFILE_STOP: u64 = 1024;
/// The sender's `SO_SNDBUF` in the sendfile case.
pub const SENDFILE_SNDBUF: i32 = 4096;

/// One connection's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnPlan {
    /// What opens the connection (payload key, offset, length; the calls and the
    /// way the driver closes; the peer's part).
    pub head: Head,
    /// Most bytes one call asks for.
    pub chunk: u64,
}

/// The stream key of the file of `run`.
pub fn file_key(run: u64) -> u64 {
    mix(run ^ 0x6669_6c65)
}

fn plan(run: u64, case: Case, id: u64, r: &mut Rng, method: Method) -> ConnPlan {
    let key = if method.from_file() {
        file_key(run)
    } else {
        mix(run ^ mix(id ^ (case as u64) << 56))
    };
    ConnPlan {
        head: Head {
            magic: MAGIC,
            run,
            id,
            case,
            act: Act::ToEof,
            key,
            start: r.below(1 << 32),
            stop: u64::MAX,
            len: u64::MAX,
            method,
            close: CloseWay::Close,
        },
        chunk: 1,
    }
}

/// One of `methods` (not empty) at random.
fn pick(r: &mut Rng, methods: &[Method]) -> Method {
    methods[r.below(methods.len() as u64) as usize]
}

/// The race case: connections of 64–256 KiB (160 KiB on average) until `bytes`, sent
/// by `methods` (not empty), closed every way.
pub fn race(run: u64, seed: u64, bytes: u64, methods: &[Method]) -> Vec<ConnPlan> {
    let mut r = Rng::new(seed ^ 0x7261_6365);
    let mut out = Vec::new();
    let mut left = bytes;
    while left > 0 {
        let method = pick(&mut r, methods);
        let mut p = plan(run, Case::Race, out.len() as u64, &mut r, method);
        let len = (64 << 10) + r.below(192 << 10);
        p.head.len = len.min(left);
        left -= p.head.len;
        if method.from_file() {
            p.head.start = r.below(FILE_LEN - p.head.len + 1);
        }
        // A third ask for everything in one call (`sendall`), the rest in pieces.
        p.chunk = if r.chance(1, 3) || method.from_file() {
            p.head.len
        } else {
            r.size(64 << 10)
        };
        p.head.close = match r.below(3) {
            0 => CloseWay::Close,
            1 => CloseWay::ShutClose,
            _ => CloseWay::ShutWait,
        };
        out.push(p);
    }
    out
}

/// The dead case: `conns` connections whose peer reads 0–256 KiB, then resets (two
/// thirds) or closes, while the driver sends on (by `methods`, not empty) until a send
/// fails.
pub fn dead(run: u64, seed: u64, conns: u64, methods: &[Method]) -> Vec<ConnPlan> {
    let mut r = Rng::new(seed ^ 0x6465_6164);
    (0..conns)
        .map(|id| {
            let method = pick(&mut r, methods);
            let mut p = plan(run, Case::Dead, id, &mut r, method);
            p.head.stop = if r.chance(1, 8) { 0 } else { r.size(256 << 10) };
            p.head.act = if r.chance(2, 3) {
                Act::Reset
            } else {
                Act::Close
            };
            if method.from_file() {
                p.head.start = r.below(FILE_LEN / 2);
            }
            p.chunk = r.size(256 << 10);
            p
        })
        .collect()
}

/// The sendfile case: `conns` connections that `sendfile` 128–256 KiB with a 4 KiB
/// `SO_SNDBUF` to a peer that reads 1 KiB and closes; blocking or not, as far as
/// `methods` has them (both when it has neither).
pub fn sendfile(run: u64, seed: u64, conns: u64, methods: &[Method]) -> Vec<ConnPlan> {
    let mut r = Rng::new(seed ^ 0x6669_6c65);
    let mut files: Vec<Method> = methods.iter().copied().filter(|m| m.from_file()).collect();
    if files.is_empty() {
        files = vec![Method::Sendfile, Method::SendfileNb];
    }
    (0..conns)
        .map(|id| {
            let method = pick(&mut r, &files);
            let mut p = plan(run, Case::Sendfile, id, &mut r, method);
            p.head.len = (128 << 10) + r.below((128 << 10) + 1);
            p.head.start = r.below(FILE_LEN - p.head.len + 1);
            p.head.stop = SENDFILE_STOP;
            p.head.act = Act::Close;
            p.chunk = p.head.len;
            p
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn race_adds_up_repeats_and_mixes() {
        let a = race(1, 2, 50 << 20, &Method::ALL);
        assert_eq!(a, race(1, 2, 50 << 20, &Method::ALL));
        assert_eq!(a.iter().map(|p| p.head.len).sum::<u64>(), 50 << 20);
        let mean = (50 << 20) / a.len() as u64;
        assert!((140 << 10..180 << 10).contains(&mean), "{mean}");
        for m in Method::ALL {
            assert!(a.iter().any(|p| p.head.method == m), "{m:?}");
        }
        for c in [CloseWay::Close, CloseWay::ShutClose, CloseWay::ShutWait] {
            assert!(a.iter().any(|p| p.head.close == c), "{c:?}");
        }
        for p in a.iter().filter(|p| p.head.method.from_file()) {
            assert_eq!(p.head.key, file_key(1));
            assert!(p.head.start + p.head.len <= FILE_LEN);
        }
        assert!(a.iter().all(|p| p.head.stop == u64::MAX && p.chunk >= 1));
    }

    #[test]
    fn dead_and_sendfile_peers_stop_early() {
        let d = dead(1, 2, 1000, &Method::ALL);
        assert!(
            d.iter()
                .all(|p| p.head.stop <= 256 << 10 && p.head.len == u64::MAX)
        );
        assert!(d.iter().any(|p| p.head.stop == 0));
        assert!(d.iter().any(|p| p.head.act == Act::Reset));
        assert!(d.iter().any(|p| p.head.act == Act::Close));
        assert!(
            d.iter()
                .all(|p| !p.head.method.from_file() || p.head.start < FILE_LEN / 2)
        );
        let s = sendfile(1, 2, 100, &Method::ALL);
        assert!(
            s.iter()
                .all(|p| p.head.method.from_file() && p.head.stop == SENDFILE_STOP)
        );
        assert!(s.iter().all(|p| p.head.start + p.head.len <= FILE_LEN));
        assert!(s.iter().any(|p| p.head.method == Method::SendfileNb));
        let only = sendfile(1, 2, 100, &[Method::Send, Method::Sendfile]);
        assert!(only.iter().all(|p| p.head.method == Method::Sendfile));
        let sends = race(1, 2, 10 << 20, &[Method::Send]);
        assert!(sends.iter().all(|p| p.head.method == Method::Send));
        let ids: Vec<u64> = s.iter().map(|p| p.head.id).collect();
        assert_eq!(ids, (0..100).collect::<Vec<_>>());
    }
}
