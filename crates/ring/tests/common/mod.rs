//! Workloads shared by the thread and process stress tests, and the child-process
//! plumbing: a test re-executes its own binary (filtered to itself) with the region's
//! memfd inherited as fd `CHILD_FD`, and `child_role` tells the copy what to do.

#![allow(dead_code)]

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use ferry_ring::{BufId, Endpoint, Layout, Region, Side, SpinPolicy, WaitResult};

/// The record both directions carry (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Msg {
    pub seq: u64,
    pub buf: u32,
    pub len: u32,
    pub sum: u64,
    pub pad: [u64; 5],
}

pub type Ep = Endpoint<Msg, Msg>;

/// Give up on any single wait after this (a hung peer fails the test, not the run).
pub const STUCK: Duration = Duration::from_secs(30);

/// Spins, yielding after 20 µs, never sleeps for practical purposes.
pub const SPINNY: SpinPolicy = SpinPolicy::new(Duration::from_secs(1), Duration::from_micros(20));
/// Spins 1 µs then sleeps: exercises the futex path constantly.
pub const SLEEPY: SpinPolicy = SpinPolicy::new(Duration::from_micros(1), Duration::ZERO);

pub fn layout(ring_slots: u32, bufs_a: u32, buf_size: u32) -> Layout {
    Layout {
        ring_slots,
        record_size: 64,
        bufs_a,
        bufs_b: 4,
        buf_size,
    }
}

fn mix(x: u64) -> u64 {
    let x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    let x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

pub fn record(seq: u64) -> Msg {
    Msg {
        seq,
        buf: u32::MAX,
        len: 0,
        sum: mix(seq),
        pad: [seq; 5],
    }
}

/// Checksum of a payload (8 bytes at a time, the last chunk zero-padded).
pub fn checksum(data: &[u8]) -> u64 {
    data.chunks(8).fold(data.len() as u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x100_0000_01b3)
            .rotate_left(17)
    })
}

/// The payload of message `seq`: 1..=buf_size pseudo-random bytes.
pub fn payload(seq: u64, buf_size: usize, out: &mut Vec<u8>) {
    let len = 1 + (mix(seq) % buf_size as u64) as usize;
    out.clear();
    let mut x = mix(seq ^ 0x5eed);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
}

/// Send records `0..n` in batches of up to 32 (commit + notify per batch), waiting for
/// space with `policy` when the ring is full.
pub fn send_records(ep: &mut Ep, n: u64, policy: SpinPolicy) {
    let mut seq = 0;
    while seq < n {
        let mut batch = 0;
        while seq < n && batch < 32 && ep.tx.push(&record(seq)).unwrap() {
            seq += 1;
            batch += 1;
        }
        ep.tx.commit();
        ep.tx.notify();
        if batch == 0 {
            assert_eq!(
                ep.tx.wait_space(policy, Some(STUCK)).unwrap(),
                WaitResult::Ready
            );
        }
    }
}

/// Receive `n` records, checking each is the next in sequence and intact. With
/// `stall_every` > 0 the consumer stops for 200 µs after every that many records, so a
/// producer with a short spin span surely fills the ring and sleeps (two threads in
/// lockstep may otherwise never wait longer than a spin).
pub fn recv_records(ep: &mut Ep, n: u64, policy: SpinPolicy, stall_every: u64) {
    let mut want = 0;
    while want < n {
        match ep.rx.pop().unwrap() {
            Some(m) => {
                assert_eq!(m, record(want), "lost, duplicated, reordered or torn");
                want += 1;
                if want & 63 == 0 {
                    ep.rx.release();
                }
                if stall_every > 0 && want % stall_every == 0 {
                    ep.rx.release();
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
            None => {
                let r = ep.rx.wait(policy, Some(STUCK)).unwrap();
                assert_eq!(r, WaitResult::Ready, "after {want} records");
            }
        }
    }
    ep.rx.release();
}

/// Side A: send `n` buffers with checksummed payloads (id, len, checksum in the record)
/// and free each id the peer returns. Pool size <= ring capacity, so the ring never
/// fills while a buffer is free: the only thing to wait for is a returned id.
pub fn send_buffers(ep: &mut Ep, n: u64, policy: SpinPolicy) {
    assert!(ep.pool.total() <= ep.tx.capacity());
    let buf_size = ep.bufs.buf_size();
    let mut data = Vec::with_capacity(buf_size);
    let (mut sent, mut acked) = (0, 0);
    while acked < n {
        while let Some(ack) = ep.rx.pop().unwrap() {
            assert_eq!(ack.seq, acked, "acks in order");
            ep.pool.free(BufId(ack.buf)).unwrap();
            acked += 1;
        }
        ep.rx.release();
        let mut progress = false;
        while sent < n {
            let Some(id) = ep.pool.alloc() else { break };
            payload(sent, buf_size, &mut data);
            let span = ep.bufs.span(id.0, 0, data.len() as u32).unwrap();
            assert_eq!(ep.bufs.write(span, &data), data.len());
            let m = Msg {
                seq: sent,
                buf: id.0,
                len: data.len() as u32,
                sum: checksum(&data),
                pad: [0; 5],
            };
            assert!(ep.tx.push(&m).unwrap(), "ring full with a buffer free");
            sent += 1;
            progress = true;
            if sent & 15 == 0 {
                ep.tx.send();
            }
        }
        ep.tx.send();
        if !progress && acked < n {
            assert_eq!(ep.rx.wait(policy, Some(STUCK)).unwrap(), WaitResult::Ready);
        }
    }
    assert_eq!(
        ep.pool.available(),
        ep.pool.total(),
        "every buffer came back"
    );
}

/// Side B: receive `n` buffers, verify each payload, return the id.
pub fn recv_buffers(ep: &mut Ep, n: u64, policy: SpinPolicy, owner_bufs: u32) {
    let mut data = vec![0u8; ep.bufs.buf_size()];
    let mut want = 0;
    while want < n {
        match ep.rx.pop().unwrap() {
            Some(m) => {
                assert_eq!(m.seq, want, "buffers in order");
                assert!(m.buf < owner_bufs, "a buffer of side A");
                let span = ep.bufs.span(m.buf, 0, m.len).unwrap();
                let got = ep.bufs.read(span, &mut data);
                assert_eq!(checksum(&data[..got]), m.sum, "payload of {want} intact");
                let ack = Msg {
                    seq: want,
                    buf: m.buf,
                    ..Msg::default()
                };
                assert!(
                    ep.tx.push(&ack).unwrap(),
                    "ack ring has room for every buffer"
                );
                want += 1;
                if want & 15 == 0 {
                    ep.rx.release();
                    ep.tx.send();
                }
            }
            None => {
                ep.tx.send();
                let r = ep.rx.wait(policy, Some(STUCK)).unwrap();
                assert_eq!(r, WaitResult::Ready, "after {want} buffers");
            }
        }
    }
    ep.rx.release();
    ep.tx.send();
}

pub fn endpoints(layout: Layout) -> (Arc<Region>, Ep, Ep) {
    let r = Arc::new(Region::create("ferry-ring-test", layout).unwrap());
    let a = Ep::new(r.clone(), Side::A).unwrap();
    let b = Ep::new(r.clone(), Side::B).unwrap();
    (r, a, b)
}

/// Where a child finds the region's memfd.
pub const CHILD_FD: i32 = 100;
const ROLE_ENV: &str = "FERRY_RING_TEST_CHILD";

/// In a child started by `spawn_child(test, ...)`, the region; `None` in the parent.
pub fn child_region(test: &str) -> Option<Arc<Region>> {
    if std::env::var(ROLE_ENV).ok()? != test {
        return None;
    }
    // SAFETY: the parent dup2'ed the memfd to CHILD_FD without CLOEXEC just for us;
    // nothing else in this process owns that descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(CHILD_FD) };
    Some(Arc::new(Region::open(fd).unwrap()))
}

/// A child process that is killed if the parent test fails first.
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    pub fn wait_ok(mut self) {
        let status = self.0.take().unwrap().wait().unwrap();
        assert!(status.success(), "child failed: {status}");
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Re-execute this test binary, running only `test`, as its child, with `fd` inherited
/// as `CHILD_FD`.
pub fn spawn_child(test: &str, fd: BorrowedFd<'_>) -> ChildGuard {
    let raw = fd.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, test);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // calls (dup2, fcntl) on descriptors it was given by value.
    unsafe {
        cmd.pre_exec(move || {
            if raw == CHILD_FD {
                // dup2 onto itself keeps CLOEXEC: clear it by hand.
                if libc::fcntl(raw, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, CHILD_FD) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    ChildGuard(Some(cmd.spawn().unwrap()))
}
