//! Loom models of the two protocols, on a heap-allocated ring (run by `loom.sh`:
//! `RUSTFLAGS="--cfg loom" cargo test -p ferry-ring --release loom`).
//!
//! - index protocol: a producer and a consumer move items through a capacity-2 ring;
//!   slot contents live in `loom::cell::UnsafeCell`s, so loom also checks that the
//!   Release/Acquire pairs order the slot accesses (a data race fails the model);
//! - sleep/wake handshake: waiters block in a mutex/condvar that has the futex's
//!   compare-and-block semantics and no timeout, so a lost wake-up is a deadlock, which
//!   loom reports.

use std::time::Duration;

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use crate::error::Error;
use crate::ring::{ConsIdx, ProdIdx, RingCtl};
use crate::sync::{AtomicU32, Ordering};
use crate::wait::{self, AWAKE, Park, Parked, SpinPolicy, WaitResult, WaitStats};

const CAP: u32 = 2;

struct Ring {
    ctl: RingCtl,
    slots: [UnsafeCell<u32>; CAP as usize],
}

impl Ring {
    fn new() -> Arc<Ring> {
        Arc::new(Ring {
            ctl: RingCtl::default(),
            slots: [UnsafeCell::new(0), UnsafeCell::new(0)],
        })
    }
}

/// A futex stand-in: `park` blocks only while the word still holds `expected`,
/// checked under the same lock `unpark` takes after the word was bumped.
#[derive(Default)]
struct CondPark {
    lock: Mutex<()>,
    cv: Condvar,
}

impl Park for CondPark {
    fn park(&self, word: &AtomicU32, expected: u32, _: Option<Duration>) -> Result<Parked, Error> {
        let g = self.lock.lock().unwrap();
        if word.load(Ordering::Acquire) == expected {
            drop(self.cv.wait(g).unwrap());
        }
        Ok(Parked::Woken)
    }

    fn unpark(&self, _: &AtomicU32) {
        let _g = self.lock.lock().unwrap();
        self.cv.notify_all();
    }
}

fn push(p: &mut ProdIdx, r: &Ring, v: u32) -> bool {
    match p.next_slot(&r.ctl).unwrap() {
        Some(s) => {
            // SAFETY: the index protocol gives the producer exclusive use of a free slot.
            r.slots[s].with_mut(|x| unsafe { *x = v });
            p.advance();
            true
        }
        None => false,
    }
}

fn pop(c: &mut ConsIdx, r: &Ring) -> Option<u32> {
    let s = c.next_slot(&r.ctl).unwrap()?;
    // SAFETY: the slot was published by the producer and is ours until released.
    let v = r.slots[s].with(|x| unsafe { *x });
    c.advance();
    Some(v)
}

#[test]
fn loom_ring_cap2_three_items_in_order() {
    loom::model(|| {
        let ring = Ring::new();
        let r2 = ring.clone();
        let producer = thread::spawn(move || {
            let mut p = ProdIdx::attach(&r2.ctl, CAP).unwrap();
            let mut next = 1;
            while next <= 3 {
                // Batch: push as many as fit, publish them with one commit.
                while next <= 3 && push(&mut p, &r2, next) {
                    next += 1;
                }
                if !p.commit(&r2.ctl) {
                    thread::yield_now();
                }
            }
        });
        let mut c = ConsIdx::attach(&ring.ctl, CAP).unwrap();
        let mut want = 1;
        while want <= 3 {
            match pop(&mut c, &ring) {
                Some(v) => {
                    assert_eq!(v, want);
                    want += 1;
                }
                None => {
                    c.release(&ring.ctl);
                    thread::yield_now();
                }
            }
        }
        c.release(&ring.ctl);
        producer.join().unwrap();
    });
}

/// Consumer sleeps for records (no spinning); the producer wakes only when the flag
/// says it sleeps. Two rounds, so a stale flag or futex word from round one is covered.
#[test]
fn loom_no_lost_wakeup_for_records() {
    loom::model(|| {
        let ring = Ring::new();
        let park = Arc::new(CondPark::default());
        let (r2, p2) = (ring.clone(), park.clone());
        let producer = thread::spawn(move || {
            let mut p = ProdIdx::attach(&r2.ctl, CAP).unwrap();
            for v in 1..=2 {
                assert!(push(&mut p, &r2, v));
                p.commit(&r2.ctl);
                let cell = &r2.ctl.cons_wait.0;
                if wait::claim_sleeper(cell) != AWAKE {
                    wait::wake(cell, &*p2);
                }
            }
        });
        let mut c = ConsIdx::attach(&ring.ctl, CAP).unwrap();
        let mut stats = WaitStats::default();
        for v in 1..=2 {
            let r = wait::wait_until(
                &ring.ctl.cons_wait.0,
                &*park,
                SpinPolicy::SLEEP,
                None,
                &mut stats,
                || Ok((c.available(&ring.ctl)? > 0).then_some(WaitResult::Ready)),
            );
            assert_eq!(r.unwrap(), WaitResult::Ready);
            assert_eq!(pop(&mut c, &ring), Some(v));
        }
        producer.join().unwrap();
    });
}

/// Producer sleeps for space in a full ring; the consumer's release wakes it only when
/// the flag says it sleeps.
#[test]
fn loom_no_lost_wakeup_for_space() {
    loom::model(|| {
        let ring = Ring::new();
        let park = Arc::new(CondPark::default());
        let mut p = ProdIdx::attach(&ring.ctl, CAP).unwrap();
        assert!(push(&mut p, &ring, 1) && push(&mut p, &ring, 2));
        p.commit(&ring.ctl);
        let (r2, p2) = (ring.clone(), park.clone());
        let consumer = thread::spawn(move || {
            let mut c = ConsIdx::attach(&r2.ctl, CAP).unwrap();
            assert_eq!(pop(&mut c, &r2), Some(1));
            c.release(&r2.ctl);
            let cell = &r2.ctl.prod_wait.0;
            if wait::claim_sleeper(cell) != AWAKE {
                wait::wake(cell, &*p2);
            }
        });
        let mut stats = WaitStats::default();
        let r = wait::wait_until(
            &ring.ctl.prod_wait.0,
            &*park,
            SpinPolicy::SLEEP,
            None,
            &mut stats,
            || Ok((p.free(&ring.ctl)? > 0).then_some(WaitResult::Ready)),
        );
        assert_eq!(r.unwrap(), WaitResult::Ready);
        assert!(push(&mut p, &ring, 3));
        consumer.join().unwrap();
    });
}
