//! The same workloads between two processes: the test re-executes its own binary as the
//! peer (side B), handing it the region's memfd (see `common::spawn_child`). Also checks
//! that a waiter asleep in the other process is woken, by records and by a close.

#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferry_ring::{Region, Side, SpinPolicy, WaitResult};

fn records(test: &str, n: u64, slots: u32, policy: SpinPolicy) {
    if let Some(region) = child_region(test) {
        let mut b = Ep::new(region, Side::B).unwrap();
        recv_records(&mut b, n, policy, 0);
        eprintln!("child {test}: consumer {:?}", b.rx.stats());
        return;
    }
    let region = std::sync::Arc::new(Region::create(test, layout(slots, 4, 64)).unwrap());
    let child = spawn_child(test, region.fd());
    let mut a = Ep::new(region, Side::A).unwrap();
    send_records(&mut a, n, policy);
    eprintln!("parent {test}: producer {:?}", a.tx.stats());
    child.wait_ok();
}

fn buffers(test: &str, n: u64, policy: SpinPolicy) {
    if let Some(region) = child_region(test) {
        let mut b = Ep::new(region, Side::B).unwrap();
        recv_buffers(&mut b, n, policy, 64);
        return;
    }
    let region = std::sync::Arc::new(Region::create(test, layout(128, 64, 1024)).unwrap());
    let child = spawn_child(test, region.fd());
    let mut a = Ep::new(region, Side::A).unwrap();
    send_buffers(&mut a, n, policy);
    child.wait_ok();
}

#[test]
fn procs_records_spinning() {
    records("procs_records_spinning", 2_000_000, 256, SPINNY);
}

#[test]
fn procs_records_sleeping() {
    records("procs_records_sleeping", 300_000, 16, SLEEPY);
}

#[test]
fn procs_buffers_spinning() {
    buffers("procs_buffers_spinning", 200_000, SPINNY);
}

#[test]
fn procs_buffers_sleeping() {
    buffers("procs_buffers_sleeping", 50_000, SLEEPY);
}

/// Poll (from the outside) until the consumer of ring A->B has announced sleep.
fn until_asleep(region: &Region) {
    let raw = region.raw_for_tests();
    let t0 = Instant::now();
    while raw.read_u32(raw.cons_sleeping_off(Side::A)) == 0 {
        assert!(t0.elapsed() < STUCK, "child never went to sleep");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn procs_sleeper_is_woken_by_records_and_by_close() {
    const TEST: &str = "procs_sleeper_is_woken_by_records_and_by_close";
    if let Some(region) = child_region(TEST) {
        let mut b = Ep::new(region, Side::B).unwrap();
        for round in 0..3 {
            let r = b.rx.wait(SpinPolicy::SLEEP, Some(STUCK)).unwrap();
            assert_eq!(r, WaitResult::Ready);
            assert_eq!(b.rx.pop().unwrap(), Some(record(round)));
            assert_eq!(b.rx.stats().sleeps, round + 1, "slept each time");
            b.tx.push(&record(round)).unwrap();
            b.tx.send();
        }
        let r = b.rx.wait(SpinPolicy::SLEEP, Some(STUCK)).unwrap();
        assert_eq!(r, WaitResult::PeerClosed);
        return;
    }
    let region = std::sync::Arc::new(Region::create(TEST, layout(8, 4, 64)).unwrap());
    let child = spawn_child(TEST, region.fd());
    let mut a = Ep::new(region.clone(), Side::A).unwrap();
    for round in 0..3 {
        until_asleep(&region);
        a.tx.push(&record(round)).unwrap();
        a.tx.commit();
        assert!(a.tx.notify(), "the sleeping child needs a wake");
        let r = a.rx.wait(SpinPolicy::default(), Some(STUCK)).unwrap();
        assert_eq!(r, WaitResult::Ready);
        assert_eq!(a.rx.pop().unwrap(), Some(record(round)));
    }
    until_asleep(&region);
    region.close(Side::A);
    child.wait_ok();
    assert_eq!(a.tx.stats().wakes_sent, 3);
}
