//! Target `ring`: the server's side of a channel whose shared memory a hostile peer
//! wrote.
//!
//! The first byte picks one of two scenarios:
//!
//! * **open** (even): a memfd with the size, seals and first 128 bytes (the header) the
//!   input gives, handed to [`Region::open`] as a sandbox would hand the server a region.
//!   It must be refused with an error unless the header describes exactly this file; an
//!   accepted region then goes on as in the second scenario.
//! * **run** (odd): a region made with a small layout the input picks, the server's
//!   [`Endpoint`] on side B, and a script of steps: the peer writes any word anywhere in
//!   the region (indices, wait cells, closed flags, slots, buffers), or pushes and pops
//!   through a real side-A endpoint; the server pops, validates ([`Request::decode`]),
//!   releases, pushes completions, frees buffer ids the peer sent back, reads spans the
//!   peer named, arms and waits.
//!
//! Properties: nothing panics or touches memory outside the mapping; every failure is
//! one of the typed errors a peer can cause ([`Error::CorruptIndex`], buffer errors);
//! counts stay within the ring's capacity and the pool's size.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::{Cmp, Req, Request};
use ferry_ring::{BufId, Endpoint, Error, Layout, Region, Side, SpinPolicy};
use rustix::fs::{MemfdFlags, SealFlags};

use crate::input::Input;

/// Largest memfd the open scenario makes (its pages are only touched by the header).
const MAX_FILE: u64 = 64 << 20;
/// Header bytes the open scenario writes.
const HEADER: usize = 128;
/// Most script steps run per input.
const MAX_STEPS: usize = 4096;

/// One input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let region = if input.u8() & 1 == 0 {
        match open(&mut input) {
            Some(r) => r,
            None => return,
        }
    } else {
        let layout = small_layout(&mut input);
        Arc::new(Region::create("ferry-fuzz", layout).expect("a valid layout"))
    };
    script(region, &mut input);
}

/// A layout with every parameter in range (small, so a script reaches every slot).
pub fn small_layout(input: &mut Input<'_>) -> Layout {
    let b = input.u8();
    Layout {
        ring_slots: 2 << (b & 3),
        record_size: ferry_proto::RECORD_SIZE as u32,
        bufs_a: u32::from(b >> 2 & 3),
        bufs_b: u32::from(b >> 4 & 3),
        buf_size: 64 << (b >> 6),
    }
}

/// A region as a hostile sandbox could build it.
fn open(input: &mut Input<'_>) -> Option<Arc<Region>> {
    let seal_bits = input.u8();
    let size = u64::from(input.u32()) % MAX_FILE;
    let header = input.take(HEADER);
    let sealable = seal_bits & 0x80 != 0;
    let flags = if sealable {
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING
    } else {
        MemfdFlags::CLOEXEC
    };
    let fd: OwnedFd = rustix::fs::memfd_create("ferry-fuzz-open", flags).expect("memfd_create");
    let mut at = 0;
    while at < header.len() {
        at += rustix::io::pwrite(&fd, &header[at..], at as u64).expect("pwrite to a memfd");
    }
    rustix::fs::ftruncate(&fd, size).expect("ftruncate of a memfd");
    if sealable {
        let all = [
            SealFlags::SHRINK,
            SealFlags::GROW,
            SealFlags::WRITE,
            SealFlags::FUTURE_WRITE,
            SealFlags::SEAL,
        ];
        let mut seals = SealFlags::empty();
        for (i, s) in all.into_iter().enumerate() {
            if seal_bits & (1 << i) != 0 {
                seals |= s;
            }
        }
        // SEAL and the rest at once: the kernel applies them together.
        rustix::fs::fcntl_add_seals(&fd, seals).expect("sealing a fresh memfd");
    }
    match Region::open(fd) {
        Ok(r) => {
            let l = r.layout();
            assert!(l.validate().is_ok(), "opened a region with layout {l:?}");
            assert_eq!(
                l.region_len() as u64,
                size,
                "opened a region of the wrong size"
            );
            Some(Arc::new(r))
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::MissingSeals { .. }
                        | Error::SizeMismatch { .. }
                        | Error::BadMagic { .. }
                        | Error::BadVersion { .. }
                        | Error::Layout(_)
                        | Error::LayoutMismatch { .. }
                        | Error::Mmap(_)
                ),
                "unexpected error opening a region: {e}"
            );
            None
        }
    }
}

/// Errors a hostile peer may cause on the server's side of a channel.
fn peer_caused(e: &Error) -> bool {
    matches!(
        e,
        Error::CorruptIndex { .. }
            | Error::BufferIndex { .. }
            | Error::BufferRange { .. }
            | Error::BufferNotOurs { .. }
            | Error::DoubleFree { .. }
    )
}

fn ok_or_peer<T>(r: Result<T, Error>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(peer_caused(&e), "error no peer should cause: {e}");
            None
        }
    }
}

/// The script: the peer scribbles and uses the channel, the server serves it.
fn script(region: Arc<Region>, input: &mut Input<'_>) {
    let layout = region.layout();
    let cap = layout.ring_slots as usize;
    let mut server = match Endpoint::<Cmp, Req>::new(region.clone(), Side::B) {
        Ok(ep) => ep,
        Err(e) => {
            // A region opened from hostile bytes may start with indices too far apart.
            assert!(matches!(e, Error::CorruptIndex { .. }), "{e}");
            return;
        }
    };
    let mut peer = Endpoint::<Req, Cmp>::new(region.clone(), Side::A).ok();
    let raw = region.raw_for_tests();
    let words = raw.region_len() / 4;
    let mut lent: Vec<BufId> = Vec::new();
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 16 {
            // The peer writes a word: mostly into the rings' control blocks and slots.
            0..=3 => {
                let w = input.u16() as usize;
                let v = input.u32();
                let off = if w & 0x8000 == 0 {
                    (raw.tail_off(Side::A) / 4 + (w & 0x7fff)) % words
                } else {
                    (w & 0x7fff) * 0x10001 % words
                };
                raw.write_u32(off * 4, v);
            }
            4 => {
                if let Some(Some(rec)) = ok_or_peer(server.rx.pop())
                    && let Ok(req) = Request::decode(rec)
                {
                    let _ = (req.addr(), req.value());
                }
            }
            5 => {
                let mut out = [Req::default(); 8];
                let want = (input.u8() as usize % 8) + 1;
                if let Some(n) = ok_or_peer(server.rx.pop_into(&mut out[..want])) {
                    assert!(n <= want);
                }
            }
            6 => {
                if let Some(n) = ok_or_peer(server.rx.available()) {
                    assert!(n <= cap, "{n} records available in a ring of {cap}");
                }
                assert!(server.rx.unreleased() <= cap);
                server.rx.release();
            }
            7 => {
                let c: Cmp = input.pod();
                let _ = ok_or_peer(server.tx.push(&c));
                assert!(server.tx.pending() <= cap);
            }
            8 => {
                server.tx.commit();
                server.tx.notify();
                if let Some(n) = ok_or_peer(server.tx.free()) {
                    assert!(n <= cap, "{n} free slots in a ring of {cap}");
                }
            }
            9 => {
                if let Some(b) = server.pool.alloc() {
                    assert!(server.pool.owns(b));
                    lent.push(b);
                }
                assert!(server.pool.available() <= server.pool.total());
            }
            10 => {
                // A buffer id the peer sent back: one we lent, or any.
                let pick = input.u32();
                let id = if pick & 1 == 0 && !lent.is_empty() {
                    lent.swap_remove((pick >> 1) as usize % lent.len())
                } else {
                    BufId(pick >> 1)
                };
                let _ = ok_or_peer(server.pool.free(id));
            }
            11 => {
                // A span the peer named (a Send's buf/off/len): read and write it.
                let (id, off, len) = (input.u32() % 16, input.u32(), input.u32());
                let off = if off & 1 == 0 { off % 2048 } else { off };
                let len = if len & 1 == 0 { len % 2048 } else { len };
                if let Some(s) = ok_or_peer(server.bufs.span(id, off, len)) {
                    assert!(
                        u64::from(s.off()) + u64::from(s.len()) <= server.bufs.buf_size() as u64
                    );
                    let mut tmp = vec![0u8; s.len() as usize];
                    assert_eq!(server.bufs.read(s, &mut tmp), tmp.len());
                    assert_eq!(server.bufs.write(s, &tmp), tmp.len());
                }
            }
            12 => {
                if ok_or_peer(server.rx.arm_sleep()).is_some() {
                    server.rx.disarm();
                }
            }
            13 => {
                let t = Some(Duration::from_micros(u64::from(input.u8() % 4)));
                let _ = ok_or_peer(server.rx.wait(SpinPolicy::SLEEP, t));
                let _ = ok_or_peer(server.tx.wait_space(SpinPolicy::SLEEP, t));
            }
            14 => {
                // The real peer pushes a request, or takes a completion.
                if let Some(p) = peer.as_mut() {
                    if input.u8() & 1 == 0 {
                        let r: Req = input.pod();
                        let _ = p.tx.push(&r);
                        p.tx.send();
                    } else {
                        let _ = p.rx.pop();
                        p.rx.release();
                    }
                }
            }
            _ => {
                let side = if input.u8() & 1 == 0 {
                    Side::A
                } else {
                    Side::B
                };
                if input.u8() & 1 == 0 {
                    region.close(side);
                }
                let _ = region.is_closed(side);
                let _ = region.outside_sleep_count(side);
            }
        }
    }
}
