//! Integrity soak through ferry: `ferry-soak` moves random streams both ways over many
//! connections, with random message sizes (1 B … 1 MiB), calls, interleavings and
//! endings, and both ends check every byte and compare SHA-256 digests. Outbound (the
//! driver in the sandbox, the verifier in a remote namespace) and inbound (the verifier
//! in the sandbox behind `-p`, the driver in the remote namespace), on both receive
//! paths. Any bad byte, digest mismatch, failed or stalled connection fails the test,
//! and so does a socket still open when ferry stops.
//!
//! The end cases (`ferry-soak ends`, the driver in the sandbox, its peer in a remote
//! namespace; socket, both and nic mode): sends racing a close or shutdown from
//! another thread, sends into connections the peer reset or closed, `sendfile` with a
//! 4 KiB `SO_SNDBUF` to a peer that closes mid-transfer, with two busy processes
//! beside the driver. Each run goes natively first (the cases' own check: natively
//! every case passes) and then through ferry; any lost, added or altered byte, any
//! send into a dead connection, any error that does not stick, fails the test.
//!
//! CI moves a few hundred MB per integrity case and 32 MB, 300 + 300 connections per
//! end case. The figures in docs/SECURITY.md are the same tests at full size:
//! `FERRY_SOAK_BYTES=10G cargo test --release -p ferry --test soak -- --nocapture --test-threads 1`
//! (`FERRY_SOAK_SEED` changes the seed, `FERRY_SOAK_MAX_CONN` the largest connection;
//! inbound cases move half of the outbound size) and
//! `FERRY_SOAK_ENDS_BYTES=10G FERRY_SOAK_ENDS_CONNS=20000 cargo test --release -p ferry
//! --test soak -- --nocapture --test-threads 1 soak_ends`.

mod common;
mod figures;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use figures::*;

const PORT: u16 = 7400;
/// The end cases' peer (and the next port, for the sendfile case).
const ENDS_PORT: u16 = 7600;

fn seed() -> u64 {
    num_env("FERRY_SOAK_SEED", 20_240_601)
}

/// Largest payload of one connection each way (`FERRY_SOAK_MAX_CONN`): small enough
/// that even CI's run makes hundreds of connections.
fn max_conn() -> String {
    size_env("FERRY_SOAK_MAX_CONN", "4Mi").to_string()
}

/// Generous for CI's sizes; a full run gets time in proportion.
fn deadline(bytes: u64) -> Duration {
    Duration::from_secs(120 + bytes / 20_000_000)
}

fn closing_line(out: &str) -> &str {
    out.lines()
        .find(|l| l.starts_with("soak: "))
        .unwrap_or_else(|| panic!("no closing line from the driver:\n{out}"))
}

fn outbound(rx: &str) {
    if !can_run(&["ip"]) {
        return;
    }
    let Some(bin) = soak_bin() else { return };
    let bytes = size_env("FERRY_SOAK_BYTES", "400M");
    let r = remote(&format!("soak-o{rx}"));
    let listen = format!("{}:{PORT}", r.remote_ip());
    let mut verifier = Guard(
        r.spawn(
            Command::new(&bin)
                .args(["verify", "--listen", &listen, "--progress", "10"])
                .stdout(Stdio::piped()),
        )
        .unwrap(),
    );
    let lines = Lines::new("verifier", verifier.0.stdout.take().unwrap());
    lines.wait_for("listening on", Duration::from_secs(10));
    let dir = TempDir::new(&format!("soak-o{rx}"));
    let js = dir.path().join("stats.json");
    let mut driver = Guard(
        ferry()
            .args([
                "run",
                "--rx",
                rx,
                "--stats-json",
                js.to_str().unwrap(),
                "--",
            ])
            .arg(&bin)
            .args(["drive", "--connect", &listen, "--progress", "10"])
            .args(["--bytes", &bytes.to_string(), "--seed", &seed().to_string()])
            .args(["--max-conn", &max_conn()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = Lines::new(&format!("driver {rx}"), driver.0.stdout.take().unwrap());
    let status = wait_until(&mut driver.0, deadline(bytes)).expect("driver finished in time");
    let summary = out.wait_for("soak: ", Duration::from_secs(5));
    assert!(status.success(), "driver: {status}\n{}", out.all());
    assert!(summary.starts_with("soak: OK "), "{summary}");
    let v = wait_until(&mut verifier.0, Duration::from_secs(30)).expect("verifier ends");
    assert!(v.success(), "verifier: {v}\n{}", lines.all());
    let stats = stats(&js);
    assert_eq!(stat(&stats, "open_at_stop"), 0, "{stats}");
    assert!(
        stat(&stats, "bytes_in") + stat(&stats, "bytes_out") >= bytes,
        "ferry moved the bytes: {stats}"
    );
    eprintln!("soak outbound --rx {rx}: {}", closing_line(&out.all()));
}

fn inbound(rx: &str) {
    if !can_run(&["ip"]) {
        return;
    }
    let Some(bin) = soak_bin() else { return };
    let bytes = size_env("FERRY_SOAK_BYTES", "400M") / 2;
    let r = remote(&format!("soak-i{rx}"));
    let published = format!("{}:{PORT}", r.host_ip());
    let dir = TempDir::new(&format!("soak-i{rx}"));
    let js = dir.path().join("stats.json");
    let mut sandbox = Guard(
        ferry()
            .args(["run", "--rx", rx, "--stats-json", js.to_str().unwrap()])
            .args(["-p", &format!("{published}:{PORT}"), "--"])
            .arg(&bin)
            .args(["verify", "--listen", &format!("0.0.0.0:{PORT}")])
            .args(["--progress", "10"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = Lines::new(&format!("verifier {rx}"), sandbox.0.stdout.take().unwrap());
    lines.wait_for("listening on", Duration::from_secs(10));
    let driver = r
        .spawn(
            Command::new(&bin)
                .args(["drive", "--connect", &published, "--progress", "10"])
                .args(["--bytes", &bytes.to_string()])
                .args(["--seed", &(seed() + 1).to_string()])
                .args(["--max-conn", &max_conn()])
                .stdout(Stdio::piped()),
        )
        .unwrap();
    let mut driver = Guard(driver);
    let out = Lines::new("driver", driver.0.stdout.take().unwrap());
    let status = wait_until(&mut driver.0, deadline(bytes)).expect("driver finished in time");
    let summary = out.wait_for("soak: ", Duration::from_secs(5));
    assert!(status.success(), "driver: {status}\n{}", out.all());
    assert!(summary.starts_with("soak: OK "), "{summary}");
    let v = wait_until(&mut sandbox.0, Duration::from_secs(30)).expect("sandbox ends");
    assert!(v.success(), "verifier in the sandbox: {v}\n{}", lines.all());
    let stats = stats(&js);
    assert_eq!(stat(&stats, "open_at_stop"), 0, "{stats}");
    eprintln!("soak inbound --rx {rx}: {}", closing_line(&out.all()));
}

#[test]
fn soak_outbound_rx_pair() {
    outbound("pair");
}

#[test]
fn soak_outbound_rx_ring() {
    outbound("ring");
}

#[test]
fn soak_inbound_rx_pair() {
    inbound("pair");
}

#[test]
fn soak_inbound_rx_ring() {
    inbound("ring");
}

/// The end cases' driver with `args`, natively (`mode` None) or through ferry in `mode`
/// (`--stats-json` to `stats`); returns its case lines once it has exited.
fn ends_driver(
    bin: &std::path::Path,
    args: &[String],
    mode: Option<(&str, &str)>,
    limit: Duration,
    last: &str,
) -> (bool, Vec<String>) {
    let mut cmd = match mode {
        None => Command::new(bin),
        Some((mode, stats)) => {
            let mut c = ferry();
            c.args(["run", "--net", mode, "--stats-json", stats, "--"])
                .arg(bin);
            c
        }
    };
    let tag = mode.map_or("native".to_owned(), |(m, _)| format!("--net {m}"));
    let mut driver = Guard(cmd.args(args).stdout(Stdio::piped()).spawn().unwrap());
    let out = Lines::new(&format!("ends {tag}"), driver.0.stdout.take().unwrap());
    let status = wait_until(&mut driver.0, limit)
        .unwrap_or_else(|| panic!("ends {tag}: still running after {limit:?}:\n{}", out.all()));
    // The last case's line (the pipe's last lines may still be on their way).
    out.wait_for(&format!("{last}: "), Duration::from_secs(5));
    let lines: Vec<String> = out.all().lines().map(str::to_owned).collect();
    (status.success(), lines)
}

/// One mode's end cases: the peer in a remote namespace, the same driver run natively
/// and then through ferry with `--net mode`; every case must pass both times.
fn ends(mode: &str) {
    if !can_run(&["ip"]) {
        return;
    }
    let Some(bin) = soak_bin() else { return };
    let bytes = size_env("FERRY_SOAK_ENDS_BYTES", "32M");
    let conns = num_env("FERRY_SOAK_ENDS_CONNS", 300);
    let r = remote(&format!("ends-{mode}"));
    let listen = format!("{}:{ENDS_PORT}", r.remote_ip());
    let mut peer = Guard(
        r.spawn(
            Command::new(&bin)
                .args(["ends-peer", "--listen", &listen])
                .stdout(Stdio::piped()),
        )
        .unwrap(),
    );
    let peer_lines = Lines::new("ends peer", peer.0.stdout.take().unwrap());
    peer_lines.wait_for("listening on", Duration::from_secs(10));
    // nic mode runs the race and dead cases: its user-space TCP stack acknowledges
    // what the sandbox's kernel sends up to its receive window (512 KiB) before the
    // destination's reset can be known, so a 4 KiB SO_SNDBUF does not bound what a
    // sendfile reports sent there (docs/SECURITY.md, "The end of a connection").
    let which = if mode == "nic" {
        "race,dead"
    } else {
        "race,dead,sendfile"
    };
    let ncases = which.split(',').count();
    let last = which.rsplit(',').next().unwrap_or(which);
    let args: Vec<String> = ["ends", "--connect", &listen, "--progress", "10"]
        .into_iter()
        .chain(["--cases", which])
        .map(str::to_owned)
        .chain(["--bytes".into(), bytes.to_string()])
        .chain(["--conns".into(), conns.to_string()])
        .chain(["--seed".into(), seed().to_string()])
        .collect();
    // Generous for CI's sizes (a failing build's dead connections take 2 s each).
    let limit = Duration::from_secs(300 + bytes / 5_000_000 + conns / 10);
    let (native_ok, native) = ends_driver(&bin, &args, None, limit, last);
    let dir = TempDir::new(&format!("ends-{mode}"));
    let js = dir.path().join("stats.json");
    let stats_path = js.to_str().unwrap();
    let (ok, lines) = ends_driver(&bin, &args, Some((mode, stats_path)), limit, last);
    let cases = |l: &[String]| -> Vec<String> {
        l.iter()
            .filter(|l| {
                ["race: ", "dead: ", "sendfile: "]
                    .iter()
                    .any(|c| l.starts_with(c))
            })
            .cloned()
            .collect()
    };
    let (native, lines) = (cases(&native), cases(&lines));
    for (n, f) in native.iter().zip(&lines) {
        eprintln!("ends natively:      {n}\nends with --net {mode}: {f}");
    }
    // The cases' own check: natively every case passes.
    assert!(native_ok && native.len() == ncases, "natively: {native:#?}");
    assert!(
        native.iter().all(|l| l.contains(": OK ")),
        "natively: {native:#?}"
    );
    assert_eq!(
        lines.len(),
        ncases,
        "a line per case through ferry: {lines:#?}"
    );
    let bad: Vec<&String> = lines.iter().filter(|l| !l.contains(": OK ")).collect();
    assert!(
        bad.is_empty() && ok,
        "--net {mode}: lost bytes or sends into dead connections: {bad:#?}"
    );
    let stats = stats(&js);
    assert_eq!(stat(&stats, "open_at_stop"), 0, "{stats}");
}

#[test]
fn soak_ends_socket() {
    ends("socket");
}

#[test]
fn soak_ends_both() {
    ends("both");
}

#[test]
fn soak_ends_nic() {
    ends("nic");
}
