//! The sending half of a ring: batch push/commit, and the waker's side of the sleep
//! handshake (`notify`) plus the producer's own wait for space.

use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use bytemuck::Pod;

use crate::endpoint::copy_in;
use crate::error::Error;
use crate::layout::Side;
use crate::region::{Claim, Region};
use crate::ring::ProdIdx;
use crate::sys;
use crate::wait::{self, AWAKE, Futex, SLEEP_DOORBELL, SpinPolicy, WaitResult, WaitStats};

/// The sending half of one ring. Push records, then `commit` them as one batch, then
/// `notify` the consumer (a system call only if it sleeps).
pub struct Producer<T> {
    idx: ProdIdx,
    slots: NonNull<u8>,
    /// The side this producer belongs to (the ring it produces is `side -> peer`).
    side: Side,
    stats: WaitStats,
    doorbell: Option<Arc<OwnedFd>>,
    _claim: Arc<Claim>,
    region: Arc<Region>,
    _rec: PhantomData<fn(T) -> T>,
}

// SAFETY: `slots` points into the mapping owned by `region`, which the producer keeps
// alive; all other fields are Send. The producer is the only writer of its slots and
// its tail in this process (the side claim), wherever it runs.
unsafe impl<T> Send for Producer<T> {}

impl<T: Pod> Producer<T> {
    /// The producer of the ring `side -> peer`, attached at the shared indices.
    pub(crate) fn new(region: Arc<Region>, side: Side, claim: Arc<Claim>) -> Result<Self, Error> {
        // The slot stride is record_size; copies are size_of::<T>() long. Endpoint::new
        // reports a mismatch in full; this keeps the invariant local to the copies.
        let layout = region.layout();
        crate::layout::check_record_size::<T>(&layout)?;
        Ok(Producer {
            idx: ProdIdx::attach(region.ring_ctl(side), layout.ring_slots)?,
            slots: region.slots(side),
            side,
            stats: WaitStats::default(),
            doorbell: None,
            _claim: claim,
            region,
            _rec: PhantomData,
        })
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> usize {
        self.region.layout().ring_slots as usize
    }

    /// Free slots; reloads the consumer's index unless the cached one shows the ring
    /// empty.
    pub fn free(&mut self) -> Result<usize, Error> {
        let ctl = self.region.ring_ctl(self.side);
        Ok(self.idx.free(ctl)? as usize)
    }

    /// Copy `rec` into the next slot. `Ok(false)` = the ring is full. Not visible to
    /// the consumer until [`Producer::commit`].
    pub fn push(&mut self, rec: &T) -> Result<bool, Error> {
        let ctl = self.region.ring_ctl(self.side);
        let Some(slot) = self.idx.next_slot(ctl)? else {
            return Ok(false);
        };
        let src = bytemuck::bytes_of(rec);
        // SAFETY: `slot < ring_slots`, so the slot's `record_size` (== size_of::<T>(),
        // checked in `new`) bytes lie inside the ring; the ring is 128-aligned
        // and record_size a multiple of 8, so the slot is 8-aligned. The slot is ours
        // until committed: `next_slot` checked it is free.
        unsafe { copy_in(self.slots.as_ptr().add(slot * src.len()), src) };
        self.idx.advance();
        Ok(true)
    }

    /// Push records from the front of `recs` until the ring is full; returns how many.
    pub fn push_slice(&mut self, recs: &[T]) -> Result<usize, Error> {
        for (i, r) in recs.iter().enumerate() {
            if !self.push(r)? {
                return Ok(i);
            }
        }
        Ok(recs.len())
    }

    /// Pushed, not committed.
    pub fn pending(&self) -> usize {
        self.idx.pending() as usize
    }

    /// Publish the pushed batch: one Release store of the tail (nothing if empty).
    pub fn commit(&mut self) {
        let ctl = self.region.ring_ctl(self.side);
        self.idx.commit(ctl);
    }

    /// Wake the consumer only if it announced that it sleeps; returns whether a wake
    /// was sent. Call after `commit`.
    pub fn notify(&mut self) -> bool {
        let ctl = self.region.ring_ctl(self.side);
        let cell = &ctl.cons_wait.0;
        match wait::claim_sleeper(cell) {
            AWAKE => {
                self.stats.wakes_avoided += 1;
                false
            }
            how => {
                self.stats.wakes_sent += 1;
                match &self.doorbell {
                    Some(fd) if how == SLEEP_DOORBELL => {
                        wait::bump(cell);
                        let _ = sys::eventfd_ring(fd.as_fd());
                    }
                    _ => wait::wake(cell, &Futex),
                }
                true
            }
        }
    }

    /// Wake the consumer whether or not it announced sleep (a futex wake, or a doorbell
    /// write if one is set). For shutdown paths, and to measure what the flag saves.
    pub fn wake(&mut self) {
        let ctl = self.region.ring_ctl(self.side);
        let cell = &ctl.cons_wait.0;
        self.stats.wakes_sent += 1;
        match &self.doorbell {
            Some(fd) => {
                wait::bump(cell);
                let _ = sys::eventfd_ring(fd.as_fd());
            }
            None => wait::wake(cell, &Futex),
        }
    }

    /// `commit` then `notify`.
    pub fn send(&mut self) -> bool {
        self.commit();
        self.notify()
    }

    /// With a doorbell, `notify` writes 1 to this eventfd when the consumer armed it
    /// ([`crate::Consumer::arm_sleep`]) instead of futex-waking; `None` removes it.
    pub fn set_doorbell(&mut self, efd: Option<OwnedFd>) {
        self.doorbell = efd.map(Arc::new);
        self.region.set_doorbell(self.side, self.doorbell.clone());
    }

    /// Wait until at least one slot is free. Commits and notifies pending records first
    /// (the consumer cannot free slots it cannot see).
    pub fn wait_space(
        &mut self,
        p: SpinPolicy,
        timeout: Option<Duration>,
    ) -> Result<WaitResult, Error> {
        if self.pending() > 0 {
            self.send();
        }
        let Producer {
            idx,
            region,
            side,
            stats,
            ..
        } = self;
        let ctl = region.ring_ctl(*side);
        wait::wait_until(&ctl.prod_wait.0, &Futex, p, timeout, stats, || {
            if idx.free(ctl)? > 0 {
                Ok(Some(WaitResult::Ready))
            } else {
                Ok(region.any_closed().then_some(WaitResult::PeerClosed))
            }
        })
    }

    /// Counters of this producer's waits and wakes.
    pub fn stats(&self) -> WaitStats {
        self.stats
    }
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("side", &self.side)
            .field("idx", &self.idx)
            .finish_non_exhaustive()
    }
}
