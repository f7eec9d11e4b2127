//! The index protocol of one SPSC ring, independent of where the ring lives.
//!
//! [`RingCtl`] is the shared control block (in the region, or on the heap under loom);
//! [`ProdIdx`] and [`ConsIdx`] are each side's process-local state. The local state is
//! the source of truth for a side's own index: it is only ever *written* to shared
//! memory, never read back. The peer's index is read with `Acquire`, checked against
//! what the protocol allows, and rejected with [`Error::CorruptIndex`] otherwise, so a
//! bad peer can never make a side touch a slot it does not own.
//!
//! Indices are free-running `u32`s that wrap; a slot is `index & (cap - 1)`.
//! Invariants kept by the local state (all arithmetic wrapping):
//! - producer: `head <= committed <= tail` and `tail - head <= cap`;
//! - consumer: `released <= head <= tail` and `tail - released <= cap`.

use crate::error::Error;
use crate::layout::LINE;
use crate::sync::{AtomicU32, Ordering};
use crate::wait::WaitCell;

/// A value alone on its own `LINE` (128 bytes), so that words written by different
/// parties never share a cache line.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub(crate) struct Pad<T>(pub(crate) T);

const _: () = assert!(core::mem::align_of::<Pad<u8>>() == LINE);

/// The control block at the start of every ring, as laid out in shared memory.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct RingCtl {
    /// Next index the producer will write; stored (Release) only by the producer.
    pub(crate) tail: Pad<AtomicU32>,
    /// Next index the consumer will read; stored (Release) only by the consumer.
    pub(crate) head: Pad<AtomicU32>,
    /// The consumer sleeps here waiting for records; the producer wakes it.
    pub(crate) cons_wait: Pad<WaitCell>,
    /// The producer sleeps here waiting for space; the consumer wakes it.
    pub(crate) prod_wait: Pad<WaitCell>,
}

const _: () = assert!(core::mem::size_of::<RingCtl>() == crate::layout::RING_CTL_LEN);

/// The producer's process-local indices.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProdIdx {
    cap: u32,
    /// Next index to write (pushed, maybe not committed).
    tail: u32,
    /// Last tail stored to shared memory.
    committed: u32,
    /// Cached consumer head: a lower bound of the real one.
    head: u32,
}

impl ProdIdx {
    /// Attach to a ring whose shared indices are `tail` and `head` now. Fails when they
    /// are further apart than `cap` (a fresh ring has both at 0).
    pub(crate) fn attach(ctl: &RingCtl, cap: u32) -> Result<ProdIdx, Error> {
        let tail = ctl.tail.0.load(Ordering::Acquire);
        let head = ctl.head.0.load(Ordering::Acquire);
        check(head, tail.wrapping_sub(cap), tail, "consumer head")?;
        Ok(ProdIdx {
            cap,
            tail,
            committed: tail,
            head,
        })
    }

    /// Free slots according to the cache (never more than the truth).
    fn free_cached(&self) -> u32 {
        self.cap - self.tail.wrapping_sub(self.head)
    }

    /// Reload the consumer's head: it may only move forward, up to what we committed.
    fn reload(&mut self, ctl: &RingCtl) -> Result<(), Error> {
        // Acquire: the consumer's reads of the slots it released happen before our
        // writes into them.
        let head = ctl.head.0.load(Ordering::Acquire);
        check(head, self.head, self.committed, "consumer head")?;
        self.head = head;
        Ok(())
    }

    /// Free slots, reloading the peer's index unless the cache says the ring is empty.
    pub(crate) fn free(&mut self, ctl: &RingCtl) -> Result<u32, Error> {
        if self.free_cached() < self.cap {
            self.reload(ctl)?;
        }
        Ok(self.free_cached())
    }

    /// The slot for the next push, reloading the peer's index only when the cache says
    /// full; `None` when the ring really is full. Follow with [`ProdIdx::advance`].
    pub(crate) fn next_slot(&mut self, ctl: &RingCtl) -> Result<Option<usize>, Error> {
        if self.free_cached() == 0 {
            self.reload(ctl)?;
            if self.free_cached() == 0 {
                return Ok(None);
            }
        }
        Ok(Some((self.tail & (self.cap - 1)) as usize))
    }

    /// The slot returned by `next_slot` has been written.
    pub(crate) fn advance(&mut self) {
        debug_assert!(self.free_cached() > 0);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Pushed but not yet committed.
    pub(crate) fn pending(&self) -> u32 {
        self.tail.wrapping_sub(self.committed)
    }

    /// Publish everything pushed with one Release store; false if there was nothing.
    pub(crate) fn commit(&mut self, ctl: &RingCtl) -> bool {
        if self.tail == self.committed {
            return false;
        }
        // Release: the slot writes before it are visible to a consumer that loads this
        // tail with Acquire.
        ctl.tail.0.store(self.tail, Ordering::Release);
        self.committed = self.tail;
        true
    }
}

/// The consumer's process-local indices.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConsIdx {
    cap: u32,
    /// Next index to read (popped, maybe not released).
    head: u32,
    /// Last head stored to shared memory.
    released: u32,
    /// Cached producer tail: a lower bound of the real one.
    tail: u32,
}

impl ConsIdx {
    /// Attach to a ring whose shared indices are `tail` and `head` now.
    pub(crate) fn attach(ctl: &RingCtl, cap: u32) -> Result<ConsIdx, Error> {
        let head = ctl.head.0.load(Ordering::Acquire);
        let tail = ctl.tail.0.load(Ordering::Acquire);
        check(tail, head, head.wrapping_add(cap), "producer tail")?;
        Ok(ConsIdx {
            cap,
            head,
            released: head,
            tail,
        })
    }

    /// Reload the producer's tail: forward only, at most `cap` past what we released.
    fn reload(&mut self, ctl: &RingCtl) -> Result<(), Error> {
        // Acquire: pairs with the producer's Release store in `commit`, so the slots
        // below the new tail are fully written when we copy them.
        let tail = ctl.tail.0.load(Ordering::Acquire);
        check(
            tail,
            self.tail,
            self.released.wrapping_add(self.cap),
            "producer tail",
        )?;
        self.tail = tail;
        Ok(())
    }

    /// Records published and not yet popped (always reloads the producer's tail).
    pub(crate) fn available(&mut self, ctl: &RingCtl) -> Result<u32, Error> {
        self.reload(ctl)?;
        Ok(self.tail.wrapping_sub(self.head))
    }

    /// The slot of the next record, reloading the peer's index only when the cache
    /// says empty; `None` when the ring really is empty. Follow with `advance`.
    pub(crate) fn next_slot(&mut self, ctl: &RingCtl) -> Result<Option<usize>, Error> {
        if self.head == self.tail {
            self.reload(ctl)?;
            if self.head == self.tail {
                return Ok(None);
            }
        }
        Ok(Some((self.head & (self.cap - 1)) as usize))
    }

    /// The slot returned by `next_slot` has been copied out.
    pub(crate) fn advance(&mut self) {
        debug_assert!(self.head != self.tail);
        self.head = self.head.wrapping_add(1);
    }

    /// Popped but not yet released.
    pub(crate) fn unreleased(&self) -> u32 {
        self.head.wrapping_sub(self.released)
    }

    /// Hand the popped slots back with one Release store; false if there was nothing.
    pub(crate) fn release(&mut self, ctl: &RingCtl) -> bool {
        if self.head == self.released {
            return false;
        }
        // Release: our copies out of the slots complete before the producer, loading
        // this head with Acquire, may overwrite them.
        ctl.head.0.store(self.head, Ordering::Release);
        self.released = self.head;
        true
    }
}

/// `found` must lie in the circular interval `lo..=hi` of wrapping u32 indices.
fn check(found: u32, lo: u32, hi: u32, which: &'static str) -> Result<(), Error> {
    if found.wrapping_sub(lo) <= hi.wrapping_sub(lo) {
        Ok(())
    } else {
        Err(Error::CorruptIndex {
            which,
            found,
            lo,
            hi,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn push(p: &mut ProdIdx, ctl: &RingCtl) -> Option<usize> {
        let s = p.next_slot(ctl).unwrap()?;
        p.advance();
        Some(s)
    }

    fn pop(c: &mut ConsIdx, ctl: &RingCtl) -> Option<usize> {
        let s = c.next_slot(ctl).unwrap()?;
        c.advance();
        Some(s)
    }

    #[test]
    fn fill_drain_wraps_and_batches() {
        let ctl = RingCtl::default();
        let start = u32::MAX - 5; // exercise the wrap of the free-running indices
        ctl.tail.0.store(start, Ordering::Relaxed);
        ctl.head.0.store(start, Ordering::Relaxed);
        let mut p = ProdIdx::attach(&ctl, 4).unwrap();
        let mut c = ConsIdx::attach(&ctl, 4).unwrap();
        for round in 0..5u32 {
            let slots: Vec<_> = (0..4).map(|_| push(&mut p, &ctl).unwrap()).collect();
            assert_eq!(push(&mut p, &ctl), None, "full");
            assert_eq!(p.pending(), 4);
            assert_eq!(pop(&mut c, &ctl), None, "nothing visible before commit");
            assert!(p.commit(&ctl));
            assert!(!p.commit(&ctl));
            assert_eq!(c.available(&ctl).unwrap(), 4);
            let got: Vec<_> = (0..4).map(|_| pop(&mut c, &ctl).unwrap()).collect();
            assert_eq!(slots, got, "round {round}");
            assert_eq!(p.free(&ctl).unwrap(), 0, "not released yet");
            assert!(c.release(&ctl));
            assert_eq!(c.unreleased(), 0);
            assert_eq!(p.free(&ctl).unwrap(), 4);
        }
    }

    #[test]
    fn producer_rejects_bad_heads() {
        let ctl = RingCtl::default();
        let mut p = ProdIdx::attach(&ctl, 4).unwrap();
        for _ in 0..4 {
            push(&mut p, &ctl).unwrap();
        }
        p.commit(&ctl);
        ctl.head.0.store(5, Ordering::Relaxed); // beyond the committed tail (4)
        let e = p.next_slot(&ctl).unwrap_err();
        assert!(matches!(
            e,
            Error::CorruptIndex {
                which: "consumer head",
                found: 5,
                lo: 0,
                hi: 4
            }
        ));
        ctl.head.0.store(3, Ordering::Relaxed);
        assert_eq!(p.free(&ctl).unwrap(), 3);
        ctl.head.0.store(1, Ordering::Relaxed); // backwards
        assert!(matches!(
            p.free(&ctl),
            Err(Error::CorruptIndex {
                found: 1,
                lo: 3,
                ..
            })
        ));
    }

    #[test]
    fn consumer_rejects_bad_tails() {
        let ctl = RingCtl::default();
        let mut c = ConsIdx::attach(&ctl, 4).unwrap();
        ctl.tail.0.store(5, Ordering::Relaxed); // more than cap ahead of the head
        assert!(matches!(
            c.available(&ctl),
            Err(Error::CorruptIndex {
                which: "producer tail",
                found: 5,
                lo: 0,
                hi: 4
            })
        ));
        ctl.tail.0.store(3, Ordering::Relaxed);
        assert_eq!(c.available(&ctl).unwrap(), 3);
        ctl.tail.0.store(2, Ordering::Relaxed); // backwards
        assert!(c.next_slot(&ctl).is_ok(), "cache not empty: no reload");
        assert!(matches!(
            c.available(&ctl),
            Err(Error::CorruptIndex { found: 2, .. })
        ));
        ctl.tail.0.store(u32::MAX, Ordering::Relaxed); // "negative" distance
        assert!(c.available(&ctl).is_err());
    }

    #[test]
    fn attach_checks_distance() {
        let ctl = RingCtl::default();
        ctl.tail.0.store(9, Ordering::Relaxed);
        assert!(ProdIdx::attach(&ctl, 8).is_err());
        assert!(ConsIdx::attach(&ctl, 8).is_err());
        ctl.head.0.store(1, Ordering::Relaxed);
        let mut p = ProdIdx::attach(&ctl, 8).unwrap();
        assert_eq!(p.free(&ctl).unwrap(), 0);
        let mut c = ConsIdx::attach(&ctl, 8).unwrap();
        assert_eq!(c.available(&ctl).unwrap(), 8);
    }
}
