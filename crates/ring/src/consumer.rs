//! The receiving half of a ring: copy-out pop, batch release, and the waiter's side of
//! the sleep handshake (spin-then-futex `wait`, or `arm_sleep` for an epoll sleeper).

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use bytemuck::Pod;

use crate::endpoint::copy_out;
use crate::error::Error;
use crate::layout::Side;
use crate::region::{Claim, Region};
use crate::ring::ConsIdx;
use crate::wait::{self, AWAKE, Futex, SLEEP_DOORBELL, SpinPolicy, WaitResult, WaitStats};

/// The receiving half of one ring. Pop records (copied out), then `release` them as one
/// batch.
pub struct Consumer<T> {
    idx: ConsIdx,
    slots: NonNull<u8>,
    /// The side this consumer belongs to (the ring it consumes is `peer -> side`).
    side: Side,
    stats: WaitStats,
    _claim: Arc<Claim>,
    region: Arc<Region>,
    _rec: PhantomData<fn(T) -> T>,
}

// SAFETY: as for Producer: `slots` points into the mapping kept alive by `region`, and
// the consumer is this process's only reader of its slots and writer of its head.
unsafe impl<T> Send for Consumer<T> {}

impl<T: Pod> Consumer<T> {
    /// The consumer of the ring `peer -> side`, attached at the shared indices.
    pub(crate) fn new(region: Arc<Region>, side: Side, claim: Arc<Claim>) -> Result<Self, Error> {
        // The slot stride is record_size; copies are size_of::<T>() long. Endpoint::new
        // reports a mismatch in full; this keeps the invariant local to the copies.
        let layout = region.layout();
        crate::layout::check_record_size::<T>(&layout)?;
        Ok(Consumer {
            idx: ConsIdx::attach(region.ring_ctl(side.peer()), layout.ring_slots)?,
            slots: region.slots(side.peer()),
            side,
            stats: WaitStats::default(),
            _claim: claim,
            region,
            _rec: PhantomData,
        })
    }

    /// Records published and not yet popped. Loads the producer's index (Acquire) and
    /// validates it.
    pub fn available(&mut self) -> Result<usize, Error> {
        let ctl = self.region.ring_ctl(self.side.peer());
        Ok(self.idx.available(ctl)? as usize)
    }

    /// Copy the next record out; `Ok(None)` = empty. The slot is not handed back to
    /// the producer until [`Consumer::release`].
    pub fn pop(&mut self) -> Result<Option<T>, Error> {
        let ctl = self.region.ring_ctl(self.side.peer());
        let Some(slot) = self.idx.next_slot(ctl)? else {
            return Ok(None);
        };
        let mut rec = T::zeroed();
        let dst = bytemuck::bytes_of_mut(&mut rec);
        // SAFETY: `slot < ring_slots`, so its `record_size` bytes (== size_of::<T>(),
        // checked in `new`) lie inside the ring; the ring is 128-aligned and record_size a
        // multiple of 8, so the slot is 8-aligned. The producer published it (tail loaded
        // with Acquire) and may not reuse it before we release it; if it does anyway, we
        // copy garbage, never out of bounds.
        unsafe { copy_out(self.slots.as_ptr().add(slot * dst.len()), dst) };
        self.idx.advance();
        Ok(Some(rec))
    }

    /// Pop into `out` until it is full or the ring is empty; returns how many.
    pub fn pop_into(&mut self, out: &mut [T]) -> Result<usize, Error> {
        for (i, o) in out.iter_mut().enumerate() {
            match self.pop()? {
                Some(r) => *o = r,
                None => return Ok(i),
            }
        }
        Ok(out.len())
    }

    /// Popped, not released.
    pub fn unreleased(&self) -> usize {
        self.idx.unreleased() as usize
    }

    /// Publish consumption (one Release store of the head), then wake the producer if
    /// it sleeps waiting for space. Nothing if nothing was popped.
    pub fn release(&mut self) {
        let ctl = self.region.ring_ctl(self.side.peer());
        if !self.idx.release(ctl) {
            return;
        }
        let cell = &ctl.prod_wait.0;
        if wait::claim_sleeper(cell) == AWAKE {
            self.stats.wakes_avoided += 1;
        } else {
            self.stats.wakes_sent += 1;
            wait::wake(cell, &Futex);
        }
    }

    /// Wait until a record is available (releases popped records first).
    pub fn wait(&mut self, p: SpinPolicy, timeout: Option<Duration>) -> Result<WaitResult, Error> {
        self.wait_with(p, timeout, || false)
    }

    /// Like `wait`, but also returns `Ready` when `extra()` is true (checked while
    /// spinning and at the re-check before sleeping; a sleeper is woken only by the
    /// producer, a close, or the timeout).
    pub fn wait_with(
        &mut self,
        p: SpinPolicy,
        timeout: Option<Duration>,
        mut extra: impl FnMut() -> bool,
    ) -> Result<WaitResult, Error> {
        self.release();
        let Consumer {
            idx,
            region,
            side,
            stats,
            ..
        } = self;
        let ctl = region.ring_ctl(side.peer());
        wait::wait_until(&ctl.cons_wait.0, &Futex, p, timeout, stats, || {
            if idx.available(ctl)? > 0 || extra() {
                Ok(Some(WaitResult::Ready))
            } else {
                Ok(region.any_closed().then_some(WaitResult::PeerClosed))
            }
        })
    }

    /// For a consumer that sleeps elsewhere (epoll on the producer's doorbell eventfd):
    /// release popped records, set the sleeping flag, SeqCst fence, re-check.
    /// `Ok(true)` = armed (go to sleep); `Ok(false)` = records arrived meanwhile or the
    /// channel is closed (flag cleared again).
    pub fn arm_sleep(&mut self) -> Result<bool, Error> {
        self.release();
        let Consumer {
            idx,
            region,
            side,
            stats,
            ..
        } = self;
        let ctl = region.ring_ctl(side.peer());
        let armed = wait::announce(&ctl.cons_wait.0, SLEEP_DOORBELL, &mut || {
            if idx.available(ctl)? > 0 {
                Ok(Some(WaitResult::Ready))
            } else {
                Ok(region.any_closed().then_some(WaitResult::PeerClosed))
            }
        })?
        .is_none();
        if armed {
            stats.sleeps += 1;
        }
        Ok(armed)
    }

    /// Clear the sleeping flag after waking (from epoll or otherwise).
    pub fn disarm(&mut self) {
        wait::disarm(&self.region.ring_ctl(self.side.peer()).cons_wait.0);
    }

    /// Counters of this consumer's waits and wakes.
    pub fn stats(&self) -> WaitStats {
        self.stats
    }
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("side", &self.side)
            .field("idx", &self.idx)
            .finish_non_exhaustive()
    }
}
