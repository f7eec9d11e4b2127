//! Faults: a sandboxed program stopped (SIGSTOP) while a remote sender streams into
//! it. ferry must not buffer what the program does not read (its memory stays
//! bounded: the pair's or the ring's buffers fill, then TCP's window closes), and after
//! SIGCONT every byte must still arrive, checked (`ferry-soak`, both receive paths).
//!
//! CI stops the program for `FERRY_FAULT_STOP_SECS` (default 5) seconds. With a stop of
//! 20 s or more and iperf3 installed, the test also measures another `ferry run`
//! sandbox's receive throughput (iperf3 -R, three runs of 5 s) before the stopped one
//! starts, during the stop, and once it has finished (same remote, same session). The figures in docs/SECURITY.md are
//! `FERRY_FAULT_STOP_SECS=30 cargo test --release -p ferry --test faults -- --nocapture
//! --test-threads 1`.

mod common;
mod figures;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use figures::*;

const PORT: u16 = 7600;
const IPERF_PORT: u16 = 7601;
/// The other sandbox's measurement: runs of this many seconds each.
const OTHER_SECS: u64 = 5;
const OTHER_RUNS: usize = 3;
/// Growth of ferry's resident memory allowed while the program is stopped. Unbounded
/// buffering would take ~300 MB per second of stop.
const RSS_BOUND_KIB: u64 = 32 << 10;

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// Receive throughput (Gbit/s) of `iperf3 -R` for `secs` in a sandbox of its own.
fn other_sandbox_gbps(r: &Remote, secs: u64) -> f64 {
    let o = ferry_run(
        &[],
        &[
            "iperf3",
            "-c",
            &r.remote_ip().to_string(),
            "-p",
            &IPERF_PORT.to_string(),
            "-R",
            "-t",
            &secs.to_string(),
            "-J",
        ],
    );
    assert!(o.status.success(), "iperf3 in the other sandbox failed");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("iperf3 -J");
    json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9
}

/// [`OTHER_RUNS`] runs of [`other_sandbox_gbps`], as `median (min–max)`.
fn other_sandbox(r: &Remote) -> String {
    let mut v: Vec<f64> = (0..OTHER_RUNS)
        .map(|_| other_sandbox_gbps(r, OTHER_SECS))
        .collect();
    v.sort_by(f64::total_cmp);
    format!(
        "{:.2} Gbit/s ({:.2}–{:.2}, {} runs of {} s)",
        v[v.len() / 2],
        v[0],
        v[v.len() - 1],
        v.len(),
        OTHER_SECS
    )
}

fn stopped_reader(rx: &str) {
    if !can_run(&["ip", "kill"]) {
        return;
    }
    let Some(bin) = soak_bin() else { return };
    let stop = Duration::from_secs(num_env("FERRY_FAULT_STOP_SECS", 5));
    // Three runs of the other sandbox fit in the stop from 20 s on.
    let compare = stop >= Duration::from_secs(20) && have("iperf3");
    let r = remote(&format!("fault-{rx}"));
    let listen = format!("{}:{PORT}", r.remote_ip());
    let (mut verifier, vlines) = remote_verifier(&r, &bin, &listen);
    let _iperf = compare.then(|| remote_iperf_server(&r));
    let other_before = compare.then(|| other_sandbox(&r));
    let dir = TempDir::new(&format!("fault-{rx}"));
    let js = dir.path().join("stats.json");
    let (mut sandbox, out) = start_driver(&bin, rx, &listen, &js);
    let ferry_pid = sandbox.0.id();
    let program = find_descendant(ferry_pid, "ferry-soak", "drive");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        wait_until(&mut sandbox.0, Duration::ZERO).is_none(),
        "the transfer ended before the stop: make it longer"
    );
    let before = rss_kib(ferry_pid);
    let (other_during, samples) = stop_program(program, ferry_pid, &r, stop, compare);
    let summary = every_byte_arrived(&mut sandbox, &out, &mut verifier, &vlines, &js);
    let max = samples.iter().copied().max().unwrap_or(0);
    let last = samples.last().copied().unwrap_or(0);
    let other_after = compare.then(|| other_sandbox(&r));
    eprintln!(
        "fault --rx {rx}: program stopped {} s while receiving; ferry RSS before {before} KiB, \
         during max {max} KiB, at the end of the stop {last} KiB ({} samples); other sandbox \
         iperf3 -R: before {}, during the stop {}, after {}; {summary}",
        stop.as_secs(),
        samples.len(),
        other_before.unwrap_or_else(|| "not measured".into()),
        other_during.unwrap_or_else(|| "not measured".into()),
        other_after.unwrap_or_else(|| "not measured".into()),
    );
    assert!(
        max <= before + RSS_BOUND_KIB,
        "ferry's memory grew by {} KiB while the program was stopped",
        max - before
    );
}

/// The soak verifier listening on `listen` in the remote, once it listens, and its
/// stdout.
fn remote_verifier(r: &Remote, bin: &std::path::Path, listen: &str) -> (Guard, Lines) {
    let mut verifier = Guard(
        r.spawn(
            Command::new(bin)
                .args(["verify", "--listen", listen, "--progress", "60"])
                .stdout(Stdio::piped()),
        )
        .unwrap(),
    );
    let vlines = Lines::new("verifier", verifier.0.stdout.take().unwrap());
    vlines.wait_for("listening on", Duration::from_secs(10));
    (verifier, vlines)
}

/// An iperf3 server on [`IPERF_PORT`] in the remote, once it listens.
fn remote_iperf_server(r: &Remote) -> Guard {
    let g = Guard(
        quiet(&mut r.command("iperf3"))
            .args(["-s", "-p", &IPERF_PORT.to_string()])
            .spawn()
            .unwrap(),
    );
    wait_port(r.remote_ip(), IPERF_PORT);
    g
}

/// ferry (`--rx rx`, counters to `js`) running the soak driver, which receives 2 GB
/// from the verifier at `listen`; and the driver's stdout.
fn start_driver(
    bin: &std::path::Path,
    rx: &str,
    listen: &str,
    js: &std::path::Path,
) -> (Guard, Lines) {
    let mut sandbox = Guard(
        ferry()
            .args([
                "run",
                "--rx",
                rx,
                "--stats-json",
                js.to_str().unwrap(),
                "--",
            ])
            .arg(bin)
            .args(["drive", "--connect", listen, "--direction", "down"])
            .args(["--bytes", "2G", "--parallel", "4", "--max-conn", "512Mi"])
            .args(["--progress", "2", "--stall", "600"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = Lines::new(&format!("driver {rx}"), sandbox.0.stdout.take().unwrap());
    (sandbox, out)
}

/// Stops `program` for `stop`, then continues it. Returns the other sandbox's
/// throughput in the middle of the stop (when `compare`) and ferry's memory sampled
/// meanwhile.
fn stop_program(
    program: u32,
    ferry_pid: u32,
    r: &Remote,
    stop: Duration,
    compare: bool,
) -> (Option<String>, Vec<u64>) {
    signal(program, "-STOP");
    let stopped = Instant::now();
    // The other sandbox runs in the middle of the stop, on a thread; ferry's memory is
    // sampled meanwhile.
    let during_other = compare.then(|| {
        std::thread::scope(|s| {
            let t = s.spawn(move || {
                std::thread::sleep(Duration::from_secs(2));
                other_sandbox(r)
            });
            let rss = sample_until(ferry_pid, stopped + stop);
            (t.join().unwrap(), rss)
        })
    });
    let (other_during, samples) = match during_other {
        Some((g, s)) => (Some(g), s),
        None => (None, sample_until(ferry_pid, stopped + stop)),
    };
    signal(program, "-CONT");
    (other_during, samples)
}

/// Checks that the driver and the verifier both end well (every byte arrived, checked)
/// and that no connection was open at ferry's stop; returns the driver's summary.
fn every_byte_arrived(
    sandbox: &mut Guard,
    out: &Lines,
    verifier: &mut Guard,
    vlines: &Lines,
    js: &std::path::Path,
) -> String {
    let status = wait_until(&mut sandbox.0, Duration::from_secs(300)).expect("driver ends");
    let summary = out.wait_for("soak: ", Duration::from_secs(5));
    assert!(status.success(), "driver: {status}\n{}", out.all());
    assert!(summary.starts_with("soak: OK "), "{summary}");
    let v = wait_until(&mut verifier.0, Duration::from_secs(30)).expect("verifier ends");
    assert!(v.success(), "verifier: {v}\n{}", vlines.all());
    let stats = stats(js);
    assert_eq!(stat(&stats, "open_at_stop"), 0, "{stats}");
    summary
}

/// ferry's resident memory every 200 ms until `end`, KiB.
fn sample_until(pid: u32, end: Instant) -> Vec<u64> {
    let mut v = Vec::new();
    while Instant::now() < end {
        v.push(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(200));
    }
    v
}

#[test]
fn stopped_reader_rx_pair_bounded_memory_and_every_byte() {
    stopped_reader("pair");
}

#[test]
fn stopped_reader_rx_ring_bounded_memory_and_every_byte() {
    stopped_reader("ring");
}
