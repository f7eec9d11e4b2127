//! Connection load through ferry: one sandboxed program holds thousands of TCP
//! connections at once (outbound to a remote namespace, and inbound through a `-p`
//! port to a server in the sandbox); each carries a request checked by its SHA-256
//! answer; then all close, and nothing may stay open: ferry's descriptors come back to
//! their baseline, and `--stats-json` says `open_at_stop` 0.
//!
//! ferry is started with a soft `RLIMIT_NOFILE` of 1,024 (as a login shell has it), so
//! the test also checks that ferry raises its own (it holds two descriptors per
//! connection) while the program keeps the limit it was given (it raises its own).
//!
//! CI holds `FERRY_LOAD_CONNS` (default 5,000) connections each way; the figures in
//! docs/SECURITY.md are `FERRY_LOAD_CONNS=5000 cargo test --release -p ferry --test load
//! -- --nocapture --test-threads 1`.

mod common;
mod figures;

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use common::*;
use figures::*;

const PORT: u16 = 7500;
const PHASE: Duration = Duration::from_secs(180);

fn conns() -> usize {
    num_env("FERRY_LOAD_CONNS", 5000) as usize
}

/// `ferry ARGS…` with the soft descriptor limit at 1,024 (the hard one unchanged).
fn ferry_low_limit(args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", "ulimit -S -n 1024 && exec \"$@\"", "sh"])
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .args(args);
    c
}

/// One line on stdin: the paused side goes on.
fn go(stdin: &mut ChildStdin) {
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
}

/// What the ferry process and the sandboxed program hold at one moment.
#[derive(Clone, Debug)]
struct Sample {
    ferry_fds: usize,
    ferry_rss_kib: u64,
    program_fds: usize,
    /// What ferry's descriptors are (for a message on a leak).
    ferry_kinds: Vec<String>,
}

impl Sample {
    fn take(ferry: u32, program: u32) -> Sample {
        Sample {
            ferry_fds: fds(ferry),
            ferry_rss_kib: rss_kib(ferry),
            program_fds: fds(program),
            ferry_kinds: fd_kinds(ferry),
        }
    }
}

/// Waits (up to 10 s) for ferry's descriptors to fall back to `base` (+ a little),
/// then samples.
fn settled(ferry: u32, program: u32, base: &Sample) -> Sample {
    for _ in 0..500 {
        if fds(ferry) <= base.ferry_fds + 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Sample::take(ferry, program)
}

/// Prints the figures and checks what a leak or a regression would change.
fn judge(way: &str, n: usize, base: &Sample, held: &Sample, after: &Sample) {
    let per = |a: usize, b: usize| (a as f64 - b as f64) / n as f64;
    let ferry_per = per(held.ferry_fds, base.ferry_fds);
    let program_per = per(held.program_fds, base.program_fds);
    eprintln!(
        "load {way}: {n} connections held; descriptors per connection: ferry {ferry_per:.2}, program {program_per:.2}; \
         ferry fds {} -> {} -> {}, program fds {} -> {} -> {}; ferry RSS {} -> {} -> {} KiB \
         (before, all held, all closed); under a 20,000 descriptor limit ferry can hold {:.0}",
        base.ferry_fds,
        held.ferry_fds,
        after.ferry_fds,
        base.program_fds,
        held.program_fds,
        after.program_fds,
        base.ferry_rss_kib,
        held.ferry_rss_kib,
        after.ferry_rss_kib,
        (20_000.0 - base.ferry_fds as f64) / ferry_per.max(0.01),
    );
    // Two per connection (host socket, ferry's end of the pair): more would be a leak.
    assert!(
        (1.9..=2.1).contains(&ferry_per),
        "ferry: {ferry_per} fds per connection"
    );
    assert!(
        (0.9..=1.1).contains(&program_per),
        "program: {program_per} fds per connection"
    );
    assert!(
        after.ferry_fds <= base.ferry_fds + 2,
        "ferry kept descriptors after every connection closed: {:?} -> {:?}",
        base.ferry_kinds,
        after.ferry_kinds
    );
    assert!(
        after.program_fds <= base.program_fds + 1,
        "the program kept descriptors: {} -> {}",
        base.program_fds,
        after.program_fds
    );
    // Memory may stay with the allocator, but must not grow once everything closed.
    assert!(
        after.ferry_rss_kib <= held.ferry_rss_kib + 4096,
        "ferry's memory grew after the close: {} -> {} -> {} KiB",
        base.ferry_rss_kib,
        held.ferry_rss_kib,
        after.ferry_rss_kib
    );
}

fn spawn_piped(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn thousands_of_outbound_connections_held_served_and_closed() {
    if !can_run(&["ip", "sh"]) {
        return;
    }
    let Some(bin) = soak_bin() else { return };
    let n = conns();
    let ns = n.to_string();
    let r = remote("load-out");
    let listen = format!("{}:{PORT}", r.remote_ip());
    let mut server = Guard(
        r.spawn(
            Command::new(&bin)
                .args(["hold-serve", "--listen", &listen, "--conns", &ns])
                .stdout(Stdio::piped()),
        )
        .unwrap(),
    );
    let served = Lines::new("remote server", server.0.stdout.take().unwrap());
    served.wait_for("listening", Duration::from_secs(10));
    let dir = TempDir::new("load-out");
    let js = dir.path().join("stats.json");
    let bin_s = bin.to_str().unwrap();
    let mut sandbox = Guard(spawn_piped(&mut ferry_low_limit(&[
        "run",
        "--stats-json",
        js.to_str().unwrap(),
        "--",
        bin_s,
        "hold",
        "--connect",
        &listen,
        "--conns",
        &ns,
        "--pause",
    ])));
    let mut stdin = sandbox.0.stdin.take().unwrap();
    let out = Lines::new("sandbox", sandbox.0.stdout.take().unwrap());
    out.wait_for("ready", PHASE);
    let ferry_pid = sandbox.0.id();
    let program = find_descendant(ferry_pid, "ferry-soak", "hold");
    let base = Sample::take(ferry_pid, program);
    go(&mut stdin);
    let held_line = out.wait_for("held ", PHASE);
    let held = Sample::take(ferry_pid, program);
    assert!(
        held_line.starts_with(&format!("held {n} served {n} bad 0")),
        "{held_line}"
    );
    go(&mut stdin);
    out.wait_for("closed ", PHASE);
    let after = settled(ferry_pid, program, &base);
    go(&mut stdin);
    let status = wait_until(&mut sandbox.0, PHASE).expect("ferry ends");
    assert!(status.success(), "ferry run: {status}\n{}", out.all());
    let v = wait_until(&mut server.0, Duration::from_secs(30)).expect("remote server ends");
    assert!(v.success(), "remote server: {v}\n{}", served.all());
    let stats = stats(&js);
    assert_eq!(stat(&stats, "open_at_stop"), 0, "{stats}");
    judge("outbound", n, &base, &held, &after);
}

#[test]
fn thousands_of_inbound_connections_through_a_published_port() {
    if !can_run(&["ip", "sh"]) {
        return;
    }
    let Some(bin) = soak_bin() else { return };
    let n = conns();
    let ns = n.to_string();
    let r = remote("load-in");
    let published = format!("{}:{PORT}", r.host_ip());
    let dir = TempDir::new("load-in");
    let js = dir.path().join("stats.json");
    let bin_s = bin.to_str().unwrap();
    let mut sandbox = Guard(spawn_piped(&mut ferry_low_limit(&[
        "run",
        "--stats-json",
        js.to_str().unwrap(),
        "-p",
        &format!("{published}:{PORT}"),
        "--",
        bin_s,
        "hold-serve",
        "--listen",
        &format!("0.0.0.0:{PORT}"),
        "--conns",
        &ns,
        "--pause",
    ])));
    let mut sandbox_in = sandbox.0.stdin.take().unwrap();
    let out = Lines::new("sandbox", sandbox.0.stdout.take().unwrap());
    out.wait_for("listening", PHASE);
    let ferry_pid = sandbox.0.id();
    let program = find_descendant(ferry_pid, "ferry-soak", "hold-serve");
    let base = Sample::take(ferry_pid, program);
    let mut client = Guard(
        r.spawn(
            Command::new(&bin)
                .args(["hold", "--connect", &published, "--conns", &ns, "--pause"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
        )
        .unwrap(),
    );
    let mut client_in = client.0.stdin.take().unwrap();
    let said = Lines::new("remote client", client.0.stdout.take().unwrap());
    said.wait_for("ready", PHASE);
    go(&mut client_in);
    let held_line = said.wait_for("held ", PHASE);
    let held = Sample::take(ferry_pid, program);
    assert!(
        held_line.starts_with(&format!("held {n} served {n} bad 0")),
        "{held_line}"
    );
    go(&mut client_in);
    said.wait_for("closed ", PHASE);
    let closed = out.wait_for("closed ", PHASE);
    assert_eq!(closed, format!("closed {n} served {n} bad 0"));
    let after = settled(ferry_pid, program, &base);
    go(&mut sandbox_in);
    go(&mut client_in);
    let status = wait_until(&mut sandbox.0, PHASE).expect("ferry ends");
    assert!(status.success(), "ferry run: {status}\n{}", out.all());
    let c = wait_until(&mut client.0, Duration::from_secs(30)).expect("remote client ends");
    assert!(c.success(), "remote client: {c}\n{}", said.all());
    let stats = stats(&js);
    assert_eq!(stat(&stats, "open_at_stop"), 0, "{stats}");
    judge("inbound", n, &base, &held, &after);
}
