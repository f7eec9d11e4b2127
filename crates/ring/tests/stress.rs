//! Multi-threaded stress: millions of records and hundreds of thousands of checksummed
//! buffers between two threads, with a spinning and a sleep-happy policy. Anything lost,
//! duplicated, reordered or corrupted fails an assertion in `common`.

#![cfg(not(loom))]

mod common;

use std::thread;

use common::*;
use ferry_ring::SpinPolicy;

fn records(n: u64, slots: u32, policy: SpinPolicy) {
    let (_r, mut a, mut b) = endpoints(layout(slots, 4, 64));
    let t = thread::spawn(move || {
        send_records(&mut a, n, policy);
        a
    });
    // A sleepy policy must take the futex path: stall the consumer now and then.
    let stall_every = if policy == SLEEPY { 50_000 } else { 0 };
    recv_records(&mut b, n, policy, stall_every);
    let a = t.join().unwrap();
    let (tx, rx) = (a.tx.stats(), b.rx.stats());
    eprintln!("records {n}: producer {tx:?}\n  consumer {rx:?}");
    // Every assertion prints all four sides' counters: a failure under load is then
    // diagnosable from the CI log alone.
    let all = format!(
        "A.tx {tx:?}\nA.rx {:?}\nB.tx {:?}\nB.rx {rx:?}",
        a.rx.stats(),
        b.tx.stats()
    );
    assert!(
        tx.wakes_sent + tx.wakes_avoided > 0,
        "no notification counted\n{all}"
    );
    if policy == SLEEPY {
        assert!(
            tx.sleeps + rx.sleeps > 0,
            "the futex path was not exercised\n{all}"
        );
        assert!(
            tx.wakes_sent + b.tx.stats().wakes_sent + rx.wakes_sent > 0,
            "sleeps without a wake\n{all}"
        );
    }
}

fn buffers(n: u64, policy: SpinPolicy) {
    let (_r, mut a, mut b) = endpoints(layout(128, 64, 1024));
    let t = thread::spawn(move || {
        send_buffers(&mut a, n, policy);
        a
    });
    recv_buffers(&mut b, n, policy, 64);
    let a = t.join().unwrap();
    eprintln!("buffers {n}: A {:?}\n  B {:?}", a.rx.stats(), b.rx.stats());
}

#[test]
fn threads_records_spinning() {
    records(2_000_000, 256, SPINNY);
}

#[test]
fn threads_records_sleeping() {
    records(500_000, 16, SLEEPY);
}

#[test]
fn threads_buffers_spinning() {
    buffers(200_000, SPINNY);
}

#[test]
fn threads_buffers_sleeping() {
    buffers(100_000, SLEEPY);
}
