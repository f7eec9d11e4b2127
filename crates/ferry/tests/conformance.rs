//! The conformance suite: every case runs natively and through ferry; the two outputs
//! must be identical, line for line.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::process::Command;

fn suite() -> std::path::PathBuf {
    // Built by the workspace build, next to the ferry binary.
    sandbox_exe("ferry-conformance")
}

/// Cases where ferry is known to differ from the kernel today, each with the reason. A
/// case listed here may differ; every other case must match exactly.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    (
        "epoll.refused_epollerr",
        "EPOLLOUT may come a moment after EPOLLERR|EPOLLHUP (the kernel wakes the pair's \
         end before it frees what kept it unwritable)",
    ),
    (
        "unix.epoll_mixed_with_tcp",
        "a poll that spins can see bytes the server just wrote into the pair a moment \
         before the kernel has told epoll of them (about 1 run in 60)",
    ),
    (
        "poll.reset_pollerr",
        "a reset shows POLLHUP without POLLERR: a unix socket raises POLLERR only when its \
         peer closes with bytes unread, and the server's end has none",
    ),
    (
        "udp.connected_icmp_refused",
        "a datagram socket's ICMP error raises no POLLERR on the readiness pair",
    ),
    (
        "nb.partial_write",
        "ferry's channel buffers add to the socket's send buffer: right after a partial \
         send, buffers the server has meanwhile moved into the host socket can take more \
         (with --rx pair the pair's buffer also adds to the receiver's; about 1 run in 10 \
         with --rx ring)",
    ),
    (
        "blk.so_sndtimeo_times_out",
        "ferry's channel buffers add to the socket's send buffer",
    ),
    (
        "sig.send_blocked_interrupted",
        "ferry's channel buffers add to the socket's send buffer",
    ),
    (
        "err.bind_nonlocal",
        "IP_FREEBIND is refused (EPERM): on the host it would let a socket bind to or send \
         from addresses the host does not own (docs/SECURITY.md)",
    ),
    (
        "poll.oob_pollpri",
        "the pair (a unix socket) reports POLLIN beside POLLPRI for an urgent byte alone",
    ),
];

/// More known differences when received TCP bytes come through the program's fd
/// (`--rx pair`, the default).
const KNOWN_WITH_RX_PAIR: &[(&str, &str)] = &[(
    "opt.so_rcvlowat",
    "poll on the readiness pair does not apply SO_RCVLOWAT",
)];

fn parse(out: &[u8]) -> BTreeMap<String, String> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| {
            l.split_once(": ")
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

#[test]
fn every_case_matches_native() {
    compare(&[], KNOWN_WITH_RX_PAIR);
}

/// More known differences when every read is a request to the server (`--rx ring`).
const KNOWN_WITH_RX_RING: &[(&str, &str)] = &[
    (
        "io.stdio_fdopen",
        "stdio reads and writes sockets through libc-internal calls the shim cannot see; \
         only with --rx pair do they reach the server (through the pair)",
    ),
    (
        "io.stdio_mixed_with_send",
        "stdio reads and writes sockets through libc-internal calls the shim cannot see; \
         only with --rx pair do they reach the server (through the pair)",
    ),
    (
        "io.stdio_header_then_sendfile",
        "stdio reads and writes sockets through libc-internal calls the shim cannot see; \
         only with --rx pair do they reach the server (through the pair)",
    ),
    (
        "select.oob_exceptfds",
        "out-of-band data reaches the pair only with --rx pair",
    ),
    (
        "sig.sigurg_on_oob",
        "out-of-band data reaches the pair only with --rx pair",
    ),
    (
        "poll.oob_mark_in_stream",
        "out-of-band data reaches the pair only with --rx pair",
    ),
    (
        "poll.both_shut_pollhup",
        "POLLHUP is mirrored onto the readiness pair only with --rx pair",
    ),
    (
        "epoll.hup_both_shut",
        "EPOLLHUP is mirrored onto the readiness pair only with --rx pair",
    ),
    (
        "epoll.rdhup_on_peer_shutdown",
        "the readiness token and the mirrored end of input are two writes into the pair \
         (the token must go first: nothing can be written after the shutdown), and an \
         epoll_wait can return between them: EPOLLIN without EPOLLRDHUP (seen in one of \
         seven full test runs, in none of 20 runs of the case alone)",
    ),
];

#[test]
fn every_case_matches_native_with_the_ring_receive_path() {
    compare(&["--rx", "ring"], KNOWN_WITH_RX_RING);
}

/// Runs the suite natively and through `ferry run OPTS`; fails on any difference not
/// listed in [`KNOWN_DIFFERENCES`] or `more_known`.
fn compare(opts: &[&str], more_known: &[(&str, &str)]) {
    // One suite at a time: its timing-sensitive cases (a send after a partial one, a
    // blocked call and a signal) should not share the 2 CPUs with another suite.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let bin = suite();
    if !bin.is_file() {
        eprintln!(
            "skipped: {} not built (run `cargo build --workspace --release`)",
            bin.display()
        );
        return;
    }
    if !is_root() && !ferry_sandbox::userns_available() {
        eprintln!("skipped: no user namespaces");
        return;
    }
    // Natively, in a fresh network namespace like the sandbox's (only lo).
    let native = Command::new("unshare")
        .args([
            "-rn",
            "sh",
            "-c",
            "ip link set lo up && exec \"$0\"",
            bin.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let ferry = ferry_run(opts, &[bin.to_str().unwrap()]);
    let (n, f) = (parse(&native.stdout), parse(&ferry.stdout));
    assert!(
        n.len() >= 100,
        "native run has {} cases: {}",
        n.len(),
        String::from_utf8_lossy(&native.stderr)
    );
    let mut diffs = Vec::new();
    let mut same = 0;
    for (case, want) in &n {
        let known = KNOWN_DIFFERENCES
            .iter()
            .chain(more_known)
            .find(|(k, _)| k == case);
        match (f.get(case), known) {
            (Some(got), _) if got == want => {
                same += 1;
                if let Some((_, why)) = known {
                    eprintln!("note: {case} now matches native (listed as known: {why})");
                }
            }
            (_, Some((_, why))) => eprintln!("known difference: {case}: {why}"),
            (got, None) => diffs.push(format!(
                "{case}: native `{want}`, ferry `{}`",
                got.map_or("<missing>", |s| s.as_str())
            )),
        }
    }
    eprintln!(
        "{same} of {} cases identical natively and through ferry {}",
        n.len(),
        opts.join(" ")
    );
    assert!(
        diffs.is_empty(),
        "{} of {} cases differ:\n{}",
        diffs.len(),
        n.len(),
        diffs.join("\n")
    );
    assert!(same >= 100, "only {same} cases identical");
}
