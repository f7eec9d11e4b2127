//! One side's view of a region: a [`Producer`] for its outgoing ring, a [`Consumer`] for
//! its incoming ring, its [`BufPool`] and the [`Buffers`].
//!
//! Records are copied between local memory and the slots with volatile 8-byte accesses
//! (records are a multiple of 8 bytes, slots 8-aligned): no reference into shared memory
//! is ever handed out, so a peer that rewrites a slot concurrently can only change the
//! bytes of the copy, which the caller validates.

use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use bytemuck::Pod;

use crate::error::Error;
use crate::layout::Side;
use crate::pool::{BufPool, Buffers};
use crate::region::{Claim, Region};
use crate::ring::{ConsIdx, ProdIdx};
use crate::sys;
use crate::wait::{self, AWAKE, Futex, SLEEP_DOORBELL, SpinPolicy, WaitResult, WaitStats};

/// One side's view. At most one `Endpoint` per (region, side) per process: a second
/// [`Endpoint::new`] for the same side returns [`Error::SideClaimed`] until every part
/// of the first one has been dropped.
#[derive(Debug)]
pub struct Endpoint<Tx: Pod, Rx: Pod> {
    /// Records to the peer.
    pub tx: Producer<Tx>,
    /// Records from the peer.
    pub rx: Consumer<Rx>,
    /// This side's own buffers (process-local free list).
    pub pool: BufPool,
    /// Access to all buffer memory (validated spans).
    pub bufs: Buffers,
}

impl<Tx: Pod, Rx: Pod> Endpoint<Tx, Rx> {
    /// Attach to `side` of `region`. `size_of::<Tx>()` and `size_of::<Rx>()` must equal
    /// `layout.record_size` ([`Error::RecordSize`]). The rings' indices are taken from
    /// shared memory (0 for a fresh region) and must be consistent.
    pub fn new(region: Arc<Region>, side: Side) -> Result<Self, Error> {
        let layout = region.layout();
        let (tx, rx) = (size_of::<Tx>(), size_of::<Rx>());
        if tx != layout.record_size as usize || rx != layout.record_size as usize {
            return Err(Error::RecordSize {
                expected: layout.record_size,
                tx,
                rx,
            });
        }
        let claim = Arc::new(region.claim(side)?);
        let cap = layout.ring_slots;
        let tx = Producer {
            idx: ProdIdx::attach(region.ring_ctl(side), cap)?,
            slots: region.slots(side),
            side,
            stats: WaitStats::default(),
            doorbell: None,
            _claim: claim.clone(),
            region: region.clone(),
            _rec: PhantomData,
        };
        let rx = Consumer {
            idx: ConsIdx::attach(region.ring_ctl(side.peer()), cap)?,
            slots: region.slots(side.peer()),
            side,
            stats: WaitStats::default(),
            _claim: claim.clone(),
            region: region.clone(),
            _rec: PhantomData,
        };
        Ok(Endpoint {
            tx,
            rx,
            pool: BufPool::new(&layout, side, claim),
            bufs: Buffers::new(region),
        })
    }
}

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
        // checked in Endpoint::new) bytes lie inside the ring; the ring is 128-aligned
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
        match wait::sleeper(cell) {
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

    /// `commit` then `notify`.
    pub fn send(&mut self) -> bool {
        self.commit();
        self.notify()
    }

    /// With a doorbell, `notify` writes 1 to this eventfd when the consumer armed it
    /// ([`Consumer::arm_sleep`]) instead of futex-waking; `None` removes it.
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
        // SAFETY: `slot < ring_slots`, so its `record_size` (== size_of::<T>()) bytes
        // lie inside the ring, 8-aligned (see `push`). The producer published it (tail
        // loaded with Acquire) and will not reuse it before we release it.
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
        if wait::sleeper(cell) == AWAKE {
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
        let ctl = self.region.ring_ctl(self.side.peer());
        let cell = &ctl.cons_wait.0;
        cell.sleeping
            .store(SLEEP_DOORBELL, crate::sync::Ordering::Relaxed);
        // Dekker [F1] as in `wait::sleep_once`: the flag must be visible before we
        // re-read the tail; pairs with the producer's fence in `notify`.
        crate::sync::fence(crate::sync::Ordering::SeqCst);
        let ready = self
            .idx
            .available(ctl)
            .map(|n| n > 0 || self.region.any_closed());
        if !matches!(ready, Ok(false)) {
            cell.sleeping.store(AWAKE, crate::sync::Ordering::Relaxed);
            return ready.map(|_| false);
        }
        self.stats.sleeps += 1;
        Ok(true)
    }

    /// Clear the sleeping flag after waking (from epoll or otherwise).
    pub fn disarm(&mut self) {
        let ctl = self.region.ring_ctl(self.side.peer());
        ctl.cons_wait
            .0
            .sleeping
            .store(AWAKE, crate::sync::Ordering::Relaxed);
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

/// Copy a record into a slot, 8 bytes at a time, volatile.
///
/// # Safety
/// `dst` must be 8-aligned and valid for writes of `src.len()` bytes, a multiple of 8.
unsafe fn copy_in(dst: *mut u8, src: &[u8]) {
    debug_assert!(src.len() & 7 == 0 && dst.addr() & 7 == 0);
    for (i, chunk) in src.chunks_exact(8).enumerate() {
        let w = u64::from_ne_bytes(chunk.try_into().unwrap_or_default());
        // SAFETY: `i * 8 + 8 <= src.len()`, inside `dst`'s valid range, 8-aligned (caller).
        unsafe { dst.cast::<u64>().add(i).write_volatile(w) };
    }
}

/// Copy a record out of a slot, 8 bytes at a time, volatile.
///
/// # Safety
/// `src` must be 8-aligned and valid for reads of `dst.len()` bytes, a multiple of 8.
unsafe fn copy_out(src: *const u8, dst: &mut [u8]) {
    debug_assert!(dst.len() & 7 == 0 && src.addr() & 7 == 0);
    for (i, chunk) in dst.chunks_exact_mut(8).enumerate() {
        // SAFETY: `i * 8 + 8 <= dst.len()`, inside `src`'s valid range, 8-aligned (caller).
        let w = unsafe { src.cast::<u64>().add(i).read_volatile() };
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;

    type Rec = [u64; 4];

    fn pair(slots: u32) -> (Endpoint<Rec, Rec>, Endpoint<Rec, Rec>) {
        let layout = Layout {
            ring_slots: slots,
            record_size: 32,
            bufs_a: 2,
            bufs_b: 2,
            buf_size: 64,
        };
        let r = Arc::new(Region::create("ferry-endpoint-test", layout).unwrap());
        (
            Endpoint::new(r.clone(), Side::A).unwrap(),
            Endpoint::new(r, Side::B).unwrap(),
        )
    }

    #[test]
    fn batch_push_commit_pop_release_both_ways() {
        let (mut a, mut b) = pair(8);
        assert_eq!(a.tx.capacity(), 8);
        let recs: Vec<Rec> = (0..10u64).map(|i| [i, !i, i * 3, 7]).collect();
        assert_eq!(a.tx.push_slice(&recs).unwrap(), 8);
        assert_eq!(a.tx.pending(), 8);
        assert_eq!(b.rx.available().unwrap(), 0);
        a.tx.commit();
        assert!(!a.tx.notify(), "nobody sleeps");
        assert_eq!(a.tx.stats().wakes_avoided, 1);
        let mut out = [[0; 4]; 5];
        assert_eq!(b.rx.pop_into(&mut out).unwrap(), 5);
        assert_eq!(&out[..], &recs[..5]);
        assert_eq!(a.tx.free().unwrap(), 0, "popped but not released");
        b.rx.release();
        assert_eq!(b.rx.unreleased(), 0);
        assert_eq!(a.tx.free().unwrap(), 5);
        b.tx.push(&[9; 4]).unwrap();
        b.tx.send();
        assert_eq!(a.rx.pop().unwrap(), Some([9; 4]));
        assert_eq!(a.rx.pop().unwrap(), None);
    }

    #[test]
    fn record_size_and_side_claims() {
        let layout = Layout {
            ring_slots: 4,
            record_size: 32,
            bufs_a: 0,
            bufs_b: 0,
            buf_size: 64,
        };
        let r = Arc::new(Region::create("ferry-claim-test", layout).unwrap());
        let e = Endpoint::<[u8; 16], Rec>::new(r.clone(), Side::A).unwrap_err();
        assert!(matches!(
            e,
            Error::RecordSize {
                expected: 32,
                tx: 16,
                rx: 32
            }
        ));
        let a = Endpoint::<Rec, Rec>::new(r.clone(), Side::A).unwrap();
        let e = Endpoint::<Rec, Rec>::new(r.clone(), Side::A).unwrap_err();
        assert!(matches!(e, Error::SideClaimed(Side::A)));
        // The claim is per memfd, not per Region object.
        let dup = r.fd().try_clone_to_owned().unwrap();
        let r2 = Arc::new(Region::open(dup).unwrap());
        assert!(matches!(
            Endpoint::<Rec, Rec>::new(r2.clone(), Side::A),
            Err(Error::SideClaimed(Side::A))
        ));
        let Endpoint { tx, rx, pool, bufs } = a;
        drop((tx, rx, bufs));
        assert!(
            Endpoint::<Rec, Rec>::new(r2.clone(), Side::A).is_err(),
            "pool still holds it"
        );
        drop(pool);
        Endpoint::<Rec, Rec>::new(r2, Side::A).unwrap();
    }

    #[test]
    fn producer_waits_for_space_and_is_woken_by_release() {
        let (mut a, mut b) = pair(2);
        a.tx.push(&[1; 4]).unwrap();
        a.tx.push(&[2; 4]).unwrap();
        assert!(!a.tx.push(&[3; 4]).unwrap());
        let t = std::thread::spawn(move || {
            let r =
                a.tx.wait_space(SpinPolicy::SLEEP, Some(Duration::from_secs(10)))
                    .unwrap();
            (r, a)
        });
        assert_eq!(
            b.rx.wait(SpinPolicy::SPIN, None).unwrap(),
            WaitResult::Ready,
            "wait_space commits"
        );
        std::thread::sleep(Duration::from_millis(50));
        b.rx.pop().unwrap().unwrap();
        b.rx.release();
        let (r, a) = t.join().unwrap();
        assert_eq!(r, WaitResult::Ready);
        assert_eq!(a.tx.stats().sleeps + a.tx.stats().ready_in_spin, 1);
        assert_eq!(b.rx.stats().wakes_sent, a.tx.stats().sleeps);
    }

    #[test]
    fn wait_reports_timeout_close_and_extra() {
        let (a, mut b) = pair(4);
        let p = SpinPolicy::new(Duration::from_micros(50), Duration::from_micros(5));
        let r = b.rx.wait(p, Some(Duration::from_millis(5))).unwrap();
        assert_eq!(r, WaitResult::TimedOut);
        assert_eq!(b.rx.wait_with(p, None, || true).unwrap(), WaitResult::Ready);
        let region = a.tx.region.clone();
        let t =
            std::thread::spawn(move || b.rx.wait(SpinPolicy::SLEEP, Some(Duration::from_secs(10))));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!region.is_closed(Side::A));
        region.close(Side::A);
        assert!(region.is_closed(Side::A));
        assert_eq!(t.join().unwrap().unwrap(), WaitResult::PeerClosed);
    }

    #[test]
    fn doorbell_rings_only_when_armed() {
        let (mut a, mut b) = pair(4);
        // SAFETY: plain syscall; the result is checked before it is owned.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0);
        // SAFETY: eventfd returned a fresh descriptor that nothing else owns.
        let efd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(efd) };
        let reader = efd.try_clone().unwrap();
        a.tx.set_doorbell(Some(efd));
        let count = || {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a local u64.
            let n = unsafe {
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&reader),
                    (&raw mut v).cast(),
                    8,
                )
            };
            if n == 8 { v } else { 0 }
        };
        assert!(b.rx.arm_sleep().unwrap());
        assert_eq!(b.rx.stats().sleeps, 1);
        a.tx.push(&[5; 4]).unwrap();
        assert!(a.tx.send());
        assert_eq!(count(), 1);
        b.rx.disarm();
        assert!(!b.rx.arm_sleep().unwrap(), "record pending: not armed");
        assert!(!a.tx.send());
        assert_eq!(count(), 0);
        assert_eq!(b.rx.pop().unwrap(), Some([5; 4]));
        assert!(b.rx.arm_sleep().unwrap());
        a.tx.region.close(Side::A);
        assert_eq!(count(), 1, "close rings the doorbell");
        assert!(!b.rx.arm_sleep().unwrap(), "closed: not armed");
    }
}
