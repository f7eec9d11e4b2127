//! One side's view of a region: a [`Producer`] for its outgoing ring, a [`Consumer`] for
//! its incoming ring, its [`BufPool`] and the [`Buffers`]; and the record copies both
//! halves use.
//!
//! Records are copied between local memory and the slots with volatile 8-byte accesses
//! (records are a multiple of 8 bytes, slots 8-aligned): no reference into shared memory
//! is ever handed out, so a peer that rewrites a slot concurrently can only change the
//! bytes of the copy, which the caller validates.

use std::sync::Arc;

use bytemuck::Pod;

use crate::consumer::Consumer;
use crate::error::Error;
use crate::layout::Side;
use crate::pool::{BufPool, Buffers};
use crate::producer::Producer;
use crate::region::Region;

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
        let tx = Producer::new(region.clone(), side, claim.clone())?;
        let rx = Consumer::new(region.clone(), side, claim.clone())?;
        Ok(Endpoint {
            tx,
            rx,
            pool: BufPool::new(&layout, side, claim),
            bufs: Buffers::new(region),
        })
    }
}

/// Copy a record into a slot, 8 bytes at a time, volatile.
///
/// # Safety
/// `dst` must be 8-aligned and valid for writes of `src.len()` bytes, a multiple of 8.
pub(crate) unsafe fn copy_in(dst: *mut u8, src: &[u8]) {
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
pub(crate) unsafe fn copy_out(src: *const u8, dst: &mut [u8]) {
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
    use crate::wait::{SpinPolicy, WaitResult};
    use std::os::fd::OwnedFd;
    use std::time::Duration;

    type Rec = [u64; 4];

    fn pair(slots: u32) -> (Arc<Region>, Endpoint<Rec, Rec>, Endpoint<Rec, Rec>) {
        let layout = Layout {
            ring_slots: slots,
            record_size: 32,
            bufs_a: 2,
            bufs_b: 2,
            buf_size: 64,
        };
        let r = Arc::new(Region::create("ferry-endpoint-test", layout).unwrap());
        (
            r.clone(),
            Endpoint::new(r.clone(), Side::A).unwrap(),
            Endpoint::new(r, Side::B).unwrap(),
        )
    }

    #[test]
    fn thread_safety_markers() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Region>();
        send_sync::<Buffers>();
        send::<BufPool>();
        send::<Endpoint<Rec, Rec>>();
    }

    #[test]
    fn batch_push_commit_pop_release_both_ways() {
        let (_r, mut a, mut b) = pair(8);
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
        let (_r, mut a, mut b) = pair(2);
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
    fn outside_sleeps_are_counted_per_side_and_leave_the_closed_flags_alone() {
        let (region, _a, _b) = pair(4);
        region.count_outside_sleep(Side::A);
        region.count_outside_sleep(Side::A);
        assert_eq!(region.outside_sleep_count(Side::A), 2);
        assert_eq!(region.outside_sleep_count(Side::B), 0);
        assert!(!region.is_closed(Side::A) && !region.is_closed(Side::B));
        region.close(Side::A);
        assert_eq!(region.outside_sleep_count(Side::A), 2);
    }

    #[test]
    fn wait_reports_timeout_close_and_extra() {
        let (region, _a, mut b) = pair(4);
        let p = SpinPolicy::new(Duration::from_micros(50), Duration::from_micros(5));
        let r = b.rx.wait(p, Some(Duration::from_millis(5))).unwrap();
        assert_eq!(r, WaitResult::TimedOut);
        assert_eq!(b.rx.wait_with(p, None, || true).unwrap(), WaitResult::Ready);
        let t =
            std::thread::spawn(move || b.rx.wait(SpinPolicy::SLEEP, Some(Duration::from_secs(10))));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!region.is_closed(Side::A));
        region.close(Side::A);
        assert!(region.is_closed(Side::A));
        assert_eq!(t.join().unwrap().unwrap(), WaitResult::PeerClosed);
    }

    /// An eventfd as `e`'s doorbell; its reading end.
    fn doorbell(e: &mut Endpoint<Rec, Rec>) -> OwnedFd {
        // SAFETY: integers only (initial value and flags); the result is checked before
        // it is owned.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0);
        // SAFETY: eventfd returned a fresh descriptor that nothing else owns.
        let efd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(efd) };
        let reader = efd.try_clone().unwrap();
        e.tx.set_doorbell(Some(efd));
        reader
    }

    /// The doorbell's rings since the last look (0: none).
    fn rings(reader: &OwnedFd) -> u64 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a local u64.
        let n = unsafe {
            libc::read(
                std::os::fd::AsRawFd::as_raw_fd(reader),
                (&raw mut v).cast(),
                8,
            )
        };
        if n == 8 { v } else { 0 }
    }

    #[test]
    fn doorbell_rings_only_when_armed() {
        let (_r, mut a, mut b) = pair(4);
        let reader = doorbell(&mut a);
        let count = || rings(&reader);
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
        _r.close(Side::A);
        assert_eq!(count(), 1, "close rings the doorbell");
        assert!(!b.rx.arm_sleep().unwrap(), "closed: not armed");
    }

    #[test]
    fn doorbell_rings_once_per_sleep() {
        let (_r, mut a, mut b) = pair(4);
        let reader = doorbell(&mut a);
        let count = || rings(&reader);
        // A burst of sends to one sleep: the first rings, the rest find the wake claimed.
        assert!(b.rx.arm_sleep().unwrap());
        for v in 1..=3u64 {
            a.tx.push(&[v; 4]).unwrap();
            assert_eq!(a.tx.send(), v == 1, "send {v}");
        }
        assert_eq!(count(), 1);
        b.rx.disarm();
        for v in 1..=3u64 {
            assert_eq!(b.rx.pop().unwrap(), Some([v; 4]));
        }
        // The next sleep is rung again.
        assert!(b.rx.arm_sleep().unwrap());
        a.tx.push(&[4; 4]).unwrap();
        assert!(a.tx.send());
        assert_eq!(count(), 1);
    }
}
