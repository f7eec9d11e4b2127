//! Cross-process channel benchmark: `cargo bench -p ferry-ring --bench channel [-- --quick]`.
//!
//! The binary re-executes itself as the peer process (side B), handing it the region's
//! memfd as fd `CHILD_FD`; with two or more CPUs the two processes are pinned to
//! different cores. Measures:
//! - ping-pong round trips (one record each way) under several wait policies:
//!   p50/p99/mean, wakes and sleeps per round trip;
//! - one-way throughput of batched records, and of 4 KiB and 64 KiB buffers (the
//!   producer fills buffers, the consumer copies them out and returns the ids);
//! - the CPU time an idle waiter burns while waiting 1 s for nothing.
//!
//! Prints a table; with `FERRY_BENCH_JSON=path` also writes a JSON array of
//! `{"name", "metric", "value"}` objects.

use std::fmt::Write as _;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_ring::{BufId, Endpoint, Layout, Region, Side, SpinPolicy, WaitResult, WaitStats};
use hdrhistogram::Histogram;

type Rec = [u64; 8];
type Ep = Endpoint<Rec, Rec>;

const CHILD_FD: i32 = 100;
const ROLE_ENV: &str = "FERRY_BENCH_CHILD";
/// The CPU the peer pins itself to (it inherits the parent's single-CPU mask).
const CPU_ENV: &str = "FERRY_BENCH_CPU";
static PEER_CPU: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
const STUCK: Option<Duration> = Some(Duration::from_secs(20));
/// Marks the last record of a run; the reply carries the peer's counters.
const END: u64 = u64::MAX;
/// In field 1 of the first counted ping-pong record: the peer restarts its counters.
const WARMUP_DONE: u64 = u64::MAX - 1;

/// A wait policy as the bench names it, passed to the child as text.
#[derive(Clone, Copy, Debug)]
struct Mode {
    name: &'static str,
    policy: SpinPolicy,
    /// Wake after every commit without looking at the sleeping flag.
    always_wake: bool,
}

const fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

const MODES: [Mode; 6] = [
    Mode {
        name: "spin",
        policy: SpinPolicy::SPIN,
        always_wake: false,
    },
    Mode {
        name: "futex-always",
        policy: SpinPolicy::SLEEP,
        always_wake: true,
    },
    Mode {
        name: "sbw-0us",
        policy: SpinPolicy::SLEEP,
        always_wake: false,
    },
    Mode {
        name: "sbw-1us",
        policy: SpinPolicy::new(us(1), us(1)),
        always_wake: false,
    },
    Mode {
        name: "sbw-10us",
        policy: SpinPolicy::new(us(10), us(2)),
        always_wake: false,
    },
    Mode {
        name: "sbw-100us",
        policy: SpinPolicy::new(us(100), us(2)),
        always_wake: false,
    },
];

fn mode(name: &str) -> Mode {
    *MODES.iter().find(|m| m.name == name).expect("known mode")
}

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        child(&role);
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let mut out = Report::default();
    // Before pinning: the peer needs to know the second CPU.
    let cpus = allowed_cpus();
    PEER_CPU.set(cpus.get(1).copied()).unwrap();
    if let Some(&c) = cpus.first() {
        pin(c);
    }
    println!(
        "ferry-ring channel bench ({} mode, {} CPUs allowed{})",
        if quick { "quick" } else { "full" },
        cpus.len(),
        if cpus.len() >= 2 {
            ", parent and peer pinned apart"
        } else {
            ""
        }
    );

    // FERRY_BENCH_ONLY=pingpong|throughput|idle runs one section.
    let only = std::env::var("FERRY_BENCH_ONLY").unwrap_or_default();
    let run = |section: &str| only.is_empty() || only == section;
    if run("pingpong") {
        pingpong_section(quick, &mut out);
    }
    if run("throughput") {
        throughput_section(quick, &mut out);
    }
    if run("idle") {
        idle_section(&mut out);
    }
    out.write_json();
}

fn pingpong_section(quick: bool, out: &mut Report) {
    println!("\nping-pong round trip, one 64-byte record each way");
    println!(
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "mode", "trips", "p50 µs", "p99 µs", "mean µs", "wakes/trip", "sleeps/trip"
    );
    for m in MODES {
        let n = match (quick, m.policy.span.is_zero()) {
            (true, true) => 2_000,
            (true, false) => 20_000,
            (false, true) => 100_000,
            (false, false) => 200_000,
        };
        pingpong(m, n, out);
    }
}

fn throughput_section(quick: bool, out: &mut Report) {
    println!("\none-way throughput (sbw-10us waits)");
    println!(
        "{:<14} {:>12} {:>14} {:>10} {:>10}",
        "payload", "items", "items/s", "GB/s", "secs"
    );
    let n = if quick { 2_000_000 } else { 20_000_000 };
    records_throughput(n, out);
    let n = if quick { 50_000 } else { 500_000 };
    buffers_throughput("buf-4k", 4096, 64, n, out);
    let n = if quick { 5_000 } else { 50_000 };
    buffers_throughput("buf-64k", 65536, 16, n, out);
}

fn idle_section(out: &mut Report) {
    println!("\nidle waiter: waits 1 s for records that never come");
    println!(
        "{:<14} {:>10} {:>12} {:>8}",
        "policy", "span µs", "CPU µs", "sleeps"
    );
    idle("sleep-only", SpinPolicy::SLEEP, out);
    idle("sbw-10us", SpinPolicy::new(us(10), us(2)), out);
    idle("default-50us", SpinPolicy::default(), out);
}

// ---------------------------------------------------------------- ping-pong

fn pingpong(m: Mode, n: u64, out: &mut Report) {
    let layout = Layout {
        ring_slots: 64,
        record_size: 64,
        bufs_a: 0,
        bufs_b: 0,
        buf_size: 64,
    };
    let (region, child) = spawn("pingpong", m.name, layout);
    let mut a = Ep::new(region, Side::A).unwrap();
    // Warm up for 10% of the trips and at least 200 ms, so that both vCPUs are awake
    // and caches and branch predictors are trained before counting.
    let mut warmup = u64::MAX;
    let started = Instant::now();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    let mut total = Duration::ZERO;
    let mut counted = (WaitStats::default(), WaitStats::default());
    let mut i = 0;
    while i < warmup.saturating_add(n) {
        if warmup == u64::MAX && i >= n / 10 && started.elapsed() >= Duration::from_millis(200) {
            warmup = i;
            counted = (a.tx.stats(), a.rx.stats());
        }
        let t0 = Instant::now();
        let mark = if i == warmup { WARMUP_DONE } else { i };
        a.tx.push(&[i, mark, 0, 0, 0, 0, 0, 0]).unwrap();
        send(&mut a, m);
        let r = recv(&mut a, m);
        let dt = t0.elapsed();
        assert_eq!(r[0], i);
        if i >= warmup {
            hist.record(dt.as_nanos().max(1) as u64).unwrap();
            total += dt;
        }
        i += 1;
    }
    let (tx, rx) = (diff(a.tx.stats(), counted.0), diff(a.rx.stats(), counted.1));
    let peer = finish(&mut a, m, child);
    // Only the counted trips: the peer reports its counters for those separately.
    let wakes = (tx.wakes_sent + peer[1]) as f64 / n as f64;
    let sleeps = (rx.sleeps + peer[2]) as f64 / n as f64;
    let p50 = hist.value_at_quantile(0.5) as f64 / 1e3;
    let p99 = hist.value_at_quantile(0.99) as f64 / 1e3;
    let mean = total.as_secs_f64() * 1e6 / n as f64;
    println!(
        "{:<14} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>11.4} {:>11.4}",
        m.name, n, p50, p99, mean, wakes, sleeps
    );
    let name = format!("pingpong/{}", m.name);
    out.add(&name, "round_trips", n as f64);
    out.add(&name, "p50_us", p50);
    out.add(&name, "p99_us", p99);
    out.add(&name, "mean_us", mean);
    out.add(&name, "wakes_per_trip", wakes);
    out.add(&name, "sleeps_per_trip", sleeps);
}

fn pingpong_peer(b: &mut Ep, m: Mode) {
    let mut counted = (b.tx.stats(), b.rx.stats());
    loop {
        let r = recv(b, m);
        if r[0] == END {
            let (tx, rx) = (diff(b.tx.stats(), counted.0), diff(b.rx.stats(), counted.1));
            b.tx.push(&[END, tx.wakes_sent, rx.sleeps, 0, 0, 0, 0, 0])
                .unwrap();
            send(b, m);
            return;
        }
        if r[1] == WARMUP_DONE {
            counted = (b.tx.stats(), b.rx.stats());
        }
        b.tx.push(&r).unwrap();
        send(b, m);
    }
}

fn send(ep: &mut Ep, m: Mode) {
    ep.tx.commit();
    if m.always_wake {
        ep.tx.wake();
    } else {
        ep.tx.notify();
    }
}

fn recv(ep: &mut Ep, m: Mode) -> Rec {
    loop {
        if let Some(r) = ep.rx.pop().unwrap() {
            ep.rx.release();
            return r;
        }
        assert_eq!(ep.rx.wait(m.policy, STUCK).unwrap(), WaitResult::Ready);
    }
}

/// Send END, collect the peer's reply (its counters), reap it.
fn finish(a: &mut Ep, m: Mode, child: ChildGuard) -> Rec {
    a.tx.push(&[END; 8]).unwrap();
    send(a, m);
    let r = recv(a, m);
    assert_eq!(r[0], END);
    child.wait_ok();
    r
}

fn diff(now: WaitStats, then: WaitStats) -> WaitStats {
    WaitStats {
        waits: now.waits - then.waits,
        spin_iters: now.spin_iters - then.spin_iters,
        ready_in_spin: now.ready_in_spin - then.ready_in_spin,
        sleeps: now.sleeps - then.sleeps,
        wakes_sent: now.wakes_sent - then.wakes_sent,
        wakes_avoided: now.wakes_avoided - then.wakes_avoided,
    }
}

// ---------------------------------------------------------------- throughput

const THROUGHPUT: Mode = Mode {
    name: "sbw-10us",
    policy: SpinPolicy::new(us(10), us(2)),
    always_wake: false,
};

fn records_throughput(n: u64, out: &mut Report) {
    let layout = Layout {
        ring_slots: 1024,
        record_size: 64,
        bufs_a: 0,
        bufs_b: 0,
        buf_size: 64,
    };
    let (region, child) = spawn("records", &n.to_string(), layout);
    let mut a = Ep::new(region, Side::A).unwrap();
    let t0 = Instant::now();
    let mut seq = 0;
    while seq < n {
        let mut batch = 0;
        while seq < n && batch < 256 && a.tx.push(&[seq; 8]).unwrap() {
            seq += 1;
            batch += 1;
        }
        a.tx.commit();
        a.tx.notify();
        if batch == 0 {
            a.tx.wait_space(THROUGHPUT.policy, STUCK).unwrap();
        }
    }
    let done = recv(&mut a, THROUGHPUT);
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(done[0], n);
    child.wait_ok();
    let (tx, sleeps) = (a.tx.stats(), a.tx.stats().sleeps + done[1]);
    throughput_row(
        "records-64B",
        n,
        64,
        secs,
        tx.wakes_sent + done[2],
        sleeps,
        out,
    );
}

fn records_peer(b: &mut Ep, n: u64) {
    let mut want = 0;
    while want < n {
        let mut got = 0;
        while let Some(r) = b.rx.pop().unwrap() {
            debug_assert_eq!(r[0], want);
            want += 1;
            got += 1;
            if got == 256 {
                break;
            }
        }
        b.rx.release();
        if got == 0 {
            b.rx.wait(THROUGHPUT.policy, STUCK).unwrap();
        }
    }
    let rx = b.rx.stats();
    b.tx.push(&[n, rx.sleeps, rx.wakes_sent, 0, 0, 0, 0, 0])
        .unwrap();
    send(b, THROUGHPUT);
}

fn buffers_throughput(name: &str, size: u32, bufs: u32, n: u64, out: &mut Report) {
    let layout = Layout {
        ring_slots: 256,
        record_size: 64,
        bufs_a: bufs,
        bufs_b: 0,
        buf_size: size,
    };
    let (region, child) = spawn("buffers", &n.to_string(), layout);
    let mut a = Ep::new(region, Side::A).unwrap();
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let t0 = Instant::now();
    let (mut sent, mut acked) = (0, 0);
    while acked < n {
        while let Some(r) = a.rx.pop().unwrap() {
            a.pool.free(BufId(r[1] as u32)).unwrap();
            acked += 1;
        }
        a.rx.release();
        let mut progress = false;
        while sent < n {
            let Some(id) = a.pool.alloc() else { break };
            let span = a.bufs.whole(id).unwrap();
            a.bufs.write(span, &src);
            a.tx.push(&[sent, id.0 as u64, size as u64, 0, 0, 0, 0, 0])
                .unwrap();
            sent += 1;
            progress = true;
            if sent & 7 == 0 {
                a.tx.send();
            }
        }
        a.tx.send();
        if !progress && acked < n {
            a.rx.wait(THROUGHPUT.policy, STUCK).unwrap();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    a.tx.push(&[END; 8]).unwrap();
    a.tx.send();
    let peer = recv(&mut a, THROUGHPUT);
    child.wait_ok();
    let (tx, rx) = (a.tx.stats(), a.rx.stats());
    let wakes = tx.wakes_sent + rx.wakes_sent + peer[2];
    throughput_row(name, n, size as u64, secs, wakes, rx.sleeps + peer[1], out);
}

fn buffers_peer(b: &mut Ep) {
    let mut dst = vec![0u8; b.bufs.buf_size()];
    let mut got = 0u64;
    loop {
        match b.rx.pop().unwrap() {
            Some(r) if r[0] == END => {
                let (tx, rx) = (b.tx.stats(), b.rx.stats());
                b.tx.push(&[END, rx.sleeps, tx.wakes_sent + rx.wakes_sent, 0, 0, 0, 0, 0])
                    .unwrap();
                b.tx.send();
                return;
            }
            Some(r) => {
                let span = b.bufs.span(r[1] as u32, 0, r[2] as u32).unwrap();
                b.bufs.read(span, &mut dst);
                std::hint::black_box(&dst);
                b.tx.push(&r).unwrap();
                got += 1;
                if got & 7 == 0 {
                    b.rx.release();
                    b.tx.send();
                }
            }
            None => {
                b.rx.release();
                b.tx.send();
                b.rx.wait(THROUGHPUT.policy, STUCK).unwrap();
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn throughput_row(
    name: &str,
    n: u64,
    bytes: u64,
    secs: f64,
    wakes: u64,
    sleeps: u64,
    out: &mut Report,
) {
    let rate = n as f64 / secs;
    let gbs = rate * bytes as f64 / 1e9;
    println!("{name:<14} {n:>12} {rate:>14.0} {gbs:>10.3} {secs:>10.3} {wakes:>8} {sleeps:>8}");
    let name = format!("throughput/{name}");
    out.add(&name, "items_per_s", rate);
    out.add(&name, "gb_per_s", gbs);
}

// ---------------------------------------------------------------- idle waiter

fn idle(name: &str, policy: SpinPolicy, out: &mut Report) {
    let layout = Layout {
        ring_slots: 64,
        record_size: 64,
        bufs_a: 0,
        bufs_b: 0,
        buf_size: 64,
    };
    let region = Arc::new(Region::create("ferry-bench-idle", layout).unwrap());
    let mut b = Ep::new(region, Side::B).unwrap();
    // A short wait first, so page faults on the fresh mapping are not counted.
    b.rx.wait(policy, Some(Duration::from_millis(1))).unwrap();
    let before = b.rx.stats().sleeps;
    let cpu0 = thread_cpu();
    let r = b.rx.wait(policy, Some(Duration::from_secs(1))).unwrap();
    let cpu = thread_cpu() - cpu0;
    assert_eq!(r, WaitResult::TimedOut);
    let cpu_us = cpu.as_secs_f64() * 1e6;
    let span = policy.span.as_secs_f64() * 1e6;
    println!(
        "{name:<14} {span:>10.0} {cpu_us:>12.1} {:>8}",
        b.rx.stats().sleeps - before
    );
    out.add(&format!("idle/{name}"), "cpu_us_per_s", cpu_us);
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

// ---------------------------------------------------------------- processes

/// Runs in the re-executed copy: `role` is "scenario:arg".
fn child(role: &str) {
    if let Some(cpu) = std::env::var(CPU_ENV).ok().and_then(|c| c.parse().ok()) {
        pin(cpu);
    }
    let (scenario, arg) = role.split_once(':').expect("role is scenario:arg");
    // SAFETY: the parent dup2'ed the memfd to CHILD_FD without CLOEXEC for us; nothing
    // else in this process owns that descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(CHILD_FD) };
    let region = Arc::new(Region::open(fd).unwrap());
    let mut b = Ep::new(region, Side::B).unwrap();
    match scenario {
        "pingpong" => pingpong_peer(&mut b, mode(arg)),
        "records" => records_peer(&mut b, arg.parse().unwrap()),
        "buffers" => buffers_peer(&mut b),
        _ => panic!("unknown scenario {scenario}"),
    }
}

struct ChildGuard(Option<Child>);

impl ChildGuard {
    fn wait_ok(mut self) {
        let status = self.0.take().unwrap().wait().unwrap();
        assert!(status.success(), "peer failed: {status}");
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

fn spawn(scenario: &str, arg: &str, layout: Layout) -> (Arc<Region>, ChildGuard) {
    let region = Arc::new(Region::create("ferry-bench", layout).unwrap());
    let child = spawn_with_fd(&format!("{scenario}:{arg}"), region.fd());
    (region, child)
}

fn spawn_with_fd(role: &str, fd: BorrowedFd<'_>) -> ChildGuard {
    let raw = fd.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(ROLE_ENV, role);
    if let Some(cpu) = PEER_CPU.get().copied().flatten() {
        cmd.env(CPU_ENV, cpu.to_string());
    }
    // SAFETY: runs between fork and exec, making only async-signal-safe calls (dup2,
    // fcntl) on descriptors passed by value.
    unsafe {
        cmd.pre_exec(move || {
            let r = if raw == CHILD_FD {
                libc::fcntl(raw, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, CHILD_FD)
            };
            if r == -1 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        })
    };
    ChildGuard(Some(cmd.spawn().unwrap()))
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET only reads `set`; every index is below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

fn pin(cpu: usize) {
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` came from `allowed_cpus`, below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed. Failure only costs accuracy.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
}

// ---------------------------------------------------------------- output

#[derive(Default)]
struct Report {
    rows: Vec<(String, &'static str, f64)>,
}

impl Report {
    fn add(&mut self, name: &str, metric: &'static str, value: f64) {
        self.rows.push((name.to_owned(), metric, value));
    }

    fn write_json(&self) {
        let Ok(path) = std::env::var("FERRY_BENCH_JSON") else {
            return;
        };
        let mut s = String::from("[\n");
        for (i, (name, metric, value)) in self.rows.iter().enumerate() {
            let sep = if i + 1 < self.rows.len() { "," } else { "" };
            let value = if value.is_finite() {
                format!("{value}")
            } else {
                "null".into()
            };
            let _ = writeln!(
                s,
                "  {{\"name\": \"{name}\", \"metric\": \"{metric}\", \"value\": {value}}}{sep}"
            );
        }
        s.push_str("]\n");
        std::fs::write(&path, s).unwrap();
        println!("\nwrote {path}");
    }
}
