//! The NIC server's real loop (`NicServer::run`, its thread, epoll) over a frame queue
//! that is one end of an `AF_UNIX` `SOCK_SEQPACKET` pair, as a TAP queue carries frames:
//! what spinning costs, that a frame is read whether the server spins or sleeps, and that
//! a spin gives way to a thread waiting for its CPU.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use ferry_nic::{NicConfig, NicServer, NicStats, Plan, Stage};

/// A frame the server reads and drops as malformed: a `virtio_net_hdr` and too few bytes
/// for an Ethernet header.
const RUNT: [u8; 16] = [0; 16];

/// Runs a server on a queue pair with `spin`; `during` gets the sandbox's end of the
/// queue while the server runs; the server's counters once stopped.
fn serve(spin: Duration, during: impl FnOnce(&OwnedFd)) -> NicStats {
    let (queue, sandbox) = ferry_sys::socketpair(
        libc::AF_UNIX,
        libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
    )
    .unwrap();
    let mut cfg = NicConfig::new(Plan::avoiding(&[]));
    cfg.spin = spin;
    cfg.timing = true;
    let srv = NicServer::new(0, queue, Arc::new(cfg), &[]).unwrap();
    let stop = srv.stop_handle();
    let t = thread::spawn(move || srv.run());
    during(&sandbox);
    stop.stop();
    t.join().unwrap()
}

fn calls(s: &NicStats, stage: Stage) -> u64 {
    let timing = s.timing.as_ref().expect("timing was on");
    timing.iter().find(|(st, _)| *st == stage).unwrap().1.calls
}

#[test]
fn a_spinning_server_asks_epoll_not_the_device_and_still_reads_a_frame() {
    let s = serve(Duration::from_secs(5), |sandbox| {
        thread::sleep(Duration::from_millis(30));
        ferry_sys::send_nosignal(sandbox.as_fd(), &RUNT).unwrap();
        thread::sleep(Duration::from_millis(30));
    });
    assert_eq!((s.frames_in, s.malformed), (1, 1), "{s:?}");
    assert!(s.spin_turns > 20, "the server spun: {s:?}");
    assert_eq!(s.sleeps, 0, "{s:?}");
    // A read that finds nothing: the first turn's, the one that ends the frame's batch,
    // the one after that busy turn. A spin turn does not read the device (before: one
    // read a spin turn, as many as `spin_turns`).
    let empty = calls(&s, Stage::TapReadEmpty);
    assert!(
        empty <= 4,
        "{empty} empty reads over {} spins",
        s.spin_turns
    );
    assert_eq!(calls(&s, Stage::TapRead), 1);
}

#[test]
fn a_sleeping_server_wakes_for_a_frame() {
    let s = serve(Duration::ZERO, |sandbox| {
        thread::sleep(Duration::from_millis(30));
        ferry_sys::send_nosignal(sandbox.as_fd(), &RUNT).unwrap();
        thread::sleep(Duration::from_millis(30));
    });
    assert_eq!((s.frames_in, s.malformed), (1, 1), "{s:?}");
    assert!(s.sleeps >= 2, "it slept before and after the frame: {s:?}");
    assert!(calls(&s, Stage::TapReadEmpty) <= 4, "{s:?}");
}

/// Frames `n` times, `gap` apart, then waits `gap` more.
fn frames_apart(n: usize, gap: Duration) -> impl FnOnce(&OwnedFd) {
    move |sandbox| {
        for _ in 0..n {
            thread::sleep(gap);
            ferry_sys::send_nosignal(sandbox.as_fd(), &RUNT).unwrap();
        }
        thread::sleep(gap);
    }
}

#[test]
fn a_peer_slower_than_the_spin_stops_the_server_spinning() {
    // A frame every 12 ms against a 2 ms spin: no spin catches the next one. One frame
    // measures what the server spins anyway (at start, then after the frame); twenty
    // cost hardly more, where each used to cost a whole spin (twenty spins, ten times
    // one frame's).
    let spin = Duration::from_millis(2);
    let gap = Duration::from_millis(12);
    let one = serve(spin, frames_apart(1, gap));
    let many = serve(spin, frames_apart(20, gap));
    assert_eq!(many.frames_in, 20, "{many:?}");
    // Each frame finds the server asleep; on a loaded machine the writer's 12 ms sleeps
    // may stretch or bunch, and a frame now and then lands inside a spin (seen: 19).
    assert!(many.sleeps >= 15, "{many:?}");
    assert!(one.spin_turns > 0, "{one:?}");
    assert!(
        many.spin_turns < 4 * one.spin_turns,
        "twenty frames spun {} turns, one {}",
        many.spin_turns,
        one.spin_turns
    );
}

/// Makes the calling thread SCHED_FIFO at `prio`; false when not allowed (not root).
fn fifo(prio: i32) -> bool {
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: `p` is a valid sched_param for the call's duration; 0 is this thread.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0 }
}

#[test]
fn a_spinning_server_gives_way_to_a_thread_of_its_priority_on_its_cpu() {
    // The server spins on CPU `cpu` at SCHED_FIFO, as under `chrt -f` (the benchmarks'
    // way): a thread of the same priority moved onto that CPU — the sandbox's program,
    // the peer — runs at once, not when the spin ends (before: a whole second here,
    // the spin's window; in bulk transfers the spin kept the program off its CPU).
    if !fifo(1) {
        eprintln!("skipped: SCHED_FIFO is not allowed here (run as root)");
        return;
    }
    let normal = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in `fifo`; back to the default policy for the rest of this thread.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &normal) };
    let cpu = ferry_sys::allowed_cpus().unwrap()[0];
    let (queue, _sandbox) = ferry_sys::socketpair(
        libc::AF_UNIX,
        libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
    )
    .unwrap();
    let mut cfg = NicConfig::new(Plan::avoiding(&[]));
    cfg.spin = Duration::from_secs(1);
    let srv = NicServer::new(0, queue, Arc::new(cfg), &[]).unwrap();
    let stop = srv.stop_handle();
    let server = thread::spawn(move || {
        ferry_sys::pin_thread(0, cpu).unwrap();
        assert!(fifo(10));
        srv.run()
    });
    // Spinning since its first turn (nothing to do).
    thread::sleep(Duration::from_millis(50));
    let waited = thread::spawn(move || {
        assert!(fifo(10));
        let t0 = std::time::Instant::now();
        // Returns once this thread runs on the server's CPU.
        ferry_sys::pin_thread(0, cpu).unwrap();
        t0.elapsed()
    })
    .join()
    .unwrap();
    stop.stop();
    let s = server.join().unwrap();
    assert!(s.spin_turns > 0, "{s:?}");
    assert!(
        waited < Duration::from_millis(300),
        "a thread waited {waited:?} for the spinning server's CPU"
    );
}
