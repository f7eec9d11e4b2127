//! The experiments of `docs/BENCHMARKS.md` as lists of cases: which configurations, which
//! parameter values, which client command, which metrics. E1 bandwidth vs buffer size,
//! E2 ping-pong RTT and wakes per round trip vs spin span, E3 CPU interference, E4
//! batching, E5 nic mode's per-packet overhead by stage (and its MTU, and 2 NIC servers
//! vs 1), E6 file → socket (read/write vs sendfile vs a module), E7 distribution over
//! several protocol servers and paths, R1 real clients (nic mode among the
//! configurations).
//! Every case of an experiment runs the same client binary.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{Config, RunOut};
use crate::parse;
use crate::plan::{Case, Extract, Param};
use crate::topology::{
    E6_PORT, HTTP_FILE, HTTP_PORT, IPERF_E3_PORT, IPERF_PORT, REDIS_PORT, SOCKPERF_CPU0_PORT,
    SOCKPERF_CPU0_UDP_PORT, SOCKPERF_E7A_PORT, SOCKPERF_E7B_PORT, SOCKPERF_PORT, SOCKPERF_UDP_PORT,
};

/// An experiment this harness knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Experiment {
    /// One-way burst bandwidth vs buffer size.
    E1,
    /// Ping-pong RTT and wakes per round trip vs spin span.
    E2,
    /// CPU interference: MFlops kept beside a 10 MB/s transfer.
    E3,
    /// Batching: throughput, RTT and crossings vs batch threshold.
    E4,
    /// nic mode: per-packet overhead by stage vs the kernel's veth path; MTU; NIC servers.
    E5,
    /// File → socket from a program in the sandbox: read/write vs sendfile vs module.
    E6,
    /// Distribution over several protocol servers and paths (S4).
    E7,
    /// Real clients: iperf3, sockperf, redis-benchmark, wrk.
    R1,
}

impl Experiment {
    /// Every experiment available, in order.
    pub const ALL: [Experiment; 8] = [
        Experiment::E1,
        Experiment::E2,
        Experiment::E3,
        Experiment::E4,
        Experiment::E5,
        Experiment::E6,
        Experiment::E7,
        Experiment::R1,
    ];

    /// Parses "E1" … "R1" (any case).
    pub fn parse(s: &str) -> Result<Experiment, String> {
        let up = s.to_ascii_uppercase();
        Experiment::ALL
            .into_iter()
            .find(|e| e.id() == up)
            .ok_or_else(|| format!("unknown experiment `{s}` (E1, E2, E3, E4, E5, E6, E7, R1)"))
    }

    /// "E1", …
    pub fn id(self) -> &'static str {
        match self {
            Experiment::E1 => "E1",
            Experiment::E2 => "E2",
            Experiment::E3 => "E3",
            Experiment::E4 => "E4",
            Experiment::E5 => "E5",
            Experiment::E6 => "E6",
            Experiment::E7 => "E7",
            Experiment::R1 => "R1",
        }
    }

    /// One-line title.
    pub fn title(self) -> &'static str {
        match self {
            Experiment::E1 => "one-way burst bandwidth vs buffer size",
            Experiment::E2 => "ping-pong RTT and wakes per round trip vs spin span",
            Experiment::E3 => "CPU interference: MFlops kept beside a 10 MB/s transfer",
            Experiment::E4 => "batching: throughput, RTT and crossings vs batch threshold",
            Experiment::E5 => {
                "nic mode: per-packet overhead by stage vs the kernel's veth path; MTU; NIC servers"
            }
            Experiment::E6 => {
                "file → socket from a program in the sandbox: read/write vs sendfile vs module"
            }
            Experiment::E7 => {
                "distribution: several protocol servers and paths, one core vs spread"
            }
            Experiment::R1 => "real clients, unmodified",
        }
    }

    /// The metric a case that never succeeded is reported under.
    pub fn main_metric(self) -> (&'static str, &'static str) {
        match self {
            Experiment::E1 => ("bandwidth", "Gbit/s"),
            Experiment::E2 => ("rtt_p50", "us"),
            Experiment::E3 => ("mflops", "MFlops"),
            Experiment::E4 => ("throughput", "Mbit/s"),
            Experiment::E5 => ("rtt_p50", "us"),
            Experiment::E6 => ("latency_p50", "us"),
            Experiment::E7 => ("time_per_op", "us"),
            Experiment::R1 => ("result", "-"),
        }
    }
}

/// Durations and sizes: full, or `--quick`.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Short runs, fewer points.
    pub quick: bool,
    /// The remote's address.
    pub remote: String,
    /// The remote's address on the second path.
    pub remote2: String,
    /// The remote's network namespace (E7 runs a client there against a published port).
    pub remote_ns: String,
    /// The host side's address (what the remote reaches published ports at).
    pub host_ip: String,
    /// The ferry-burner binary.
    pub burner: PathBuf,
    /// The ferry-e6 binary.
    pub e6_bin: PathBuf,
    /// Where E6's files are (see [`E6_SIZES`]).
    pub e6_dir: PathBuf,
    /// R1 also runs `ferry-unconfined` (`--unconfined`).
    pub unconfined_too: bool,
    /// R1 and E2 also run ferry from this other build (`ferry-base`), alternating with
    /// the one measured: a before/after comparison in one run.
    pub baseline: Option<PathBuf>,
}

impl Settings {
    /// Seconds per run: `full`, or 1 with `--quick`.
    fn secs(&self, full: u32) -> u32 {
        if self.quick { 1 } else { full }
    }

    fn timeout(&self, secs: u32) -> Duration {
        Duration::from_secs(u64::from(secs) + if self.quick { 4 } else { 12 })
    }

    fn iperf3(&self, port: u16, secs: u32, extra: &[&str]) -> Vec<String> {
        let mut v = strings(&["iperf3", "-c", &self.remote, "-p", &port.to_string()]);
        v.extend(strings(&[
            "-t",
            &secs.to_string(),
            "-J",
            "--connect-timeout",
            "3000",
        ]));
        v.extend(strings(extra));
        v
    }

    /// sockperf over UDP against the remote's UDP server on `port`.
    fn sockperf_udp(&self, mode: &str, port: u16, secs: u32, extra: &[&str]) -> Vec<String> {
        let mut v = strings(&["sockperf", mode, "-i", &self.remote]);
        v.extend(strings(&["-p", &port.to_string(), "-t", &secs.to_string()]));
        v.extend(strings(extra));
        v
    }

    fn sockperf(&self, mode: &str, secs: u32, extra: &[&str]) -> Vec<String> {
        let mut v = strings(&["sockperf", mode, "--tcp", "-i", &self.remote]);
        v.extend(strings(&[
            "-p",
            &SOCKPERF_PORT.to_string(),
            "-t",
            &secs.to_string(),
        ]));
        v.extend(strings(extra));
        v
    }
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| (*x).to_owned()).collect()
}

/// The configurations of an experiment, by name, among those that passed their check.
fn pick(ready: &[Config], names: &[&str]) -> Vec<Config> {
    names
        .iter()
        .filter_map(|n| ready.iter().find(|c| c.name == *n).cloned())
        .collect()
}

/// ferry at a spin span (named `ferry-spin<label>`), if ferry itself is ready.
fn ferry_variant(
    ready: &[Config],
    name: &str,
    spin: Option<&str>,
    batch: Option<u32>,
) -> Option<Config> {
    ready
        .iter()
        .any(|c| c.name == "ferry")
        .then(|| Config::ferry_with(name, spin, batch))
}

fn size_label(bytes: u64) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}K", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

fn iperf_extract() -> Extract {
    Box::new(|r: &RunOut| {
        let bps = parse::iperf3_bps(&r.outcome.stdout)?;
        Ok(vec![("bandwidth", "Gbit/s", bps / 1e9)])
    })
}

/// Builds the cases of `e`, configurations alternating fastest.
pub fn cases(e: Experiment, s: &Settings, ready: &[Config]) -> Vec<Case> {
    match e {
        Experiment::E1 => e1(s, ready),
        Experiment::E2 => e2(s, ready),
        Experiment::E3 => e3(s, ready),
        Experiment::E4 => e4(s, ready),
        Experiment::E5 => e5(s, ready),
        Experiment::E6 => e6(s, ready),
        Experiment::E7 => e7(s, ready),
        Experiment::R1 => r1(s, ready),
    }
}

fn e1(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let mut configs = pick(
        ready,
        &["native", "ferry", "ferry-nic", "slirp4netns", "pasta"],
    );
    configs.extend(ferry_variant(ready, "ferry-spin0", Some("0"), None));
    configs.extend(ferry_variant(ready, "ferry-spin1ms", Some("1ms"), None));
    let sizes: &[u64] = if s.quick {
        &[64, 4096, 262_144]
    } else {
        &[64, 256, 1024, 4096, 16_384, 65_536, 262_144]
    };
    let secs = s.secs(3);
    let mut out = Vec::new();
    for &size in sizes {
        for c in &configs {
            out.push(Case {
                config: c.clone(),
                param: Param::new(size_label(size), size as f64),
                client: s.iperf3(IPERF_PORT, secs, &["-l", &size.to_string()]),
                timeout: s.timeout(secs),
                pin: None,
                servers: vec![IPERF_PORT],
                extract: iperf_extract(),
            });
        }
    }
    out
}

/// sockperf ping-pong (`--full-rtt`): RTT p50/p99, round trips measured, and under
/// ferry the wake-ups (server wakes, doorbells, the reader's kernel sleeps on the pair
/// path) and server sleeps per round trip over
/// the whole run (sockperf's own warm-up included, as in ferry's counters).
fn pingpong_extract() -> Extract {
    Box::new(|r: &RunOut| {
        let p = parse::sockperf_pp(&r.outcome.stdout)?;
        let mut v = vec![("rtt_p50", "us", p.p50), ("rtt_p99", "us", p.p99)];
        v.push(("round_trips", "count", p.observations as f64));
        if let Some(st) = &r.stats {
            let rts = p.total_received.max(1) as f64;
            v.push(("wakes_per_rt", "per RT", st.wakes() as f64 / rts));
            v.push(("sleeps_per_rt", "per RT", st.sleeps as f64 / rts));
        }
        Ok(v)
    })
}

/// Spin spans of E2, in µs.
const SPINS_US: [u32; 10] = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500];

fn e2(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(5);
    let client = s.sockperf("ping-pong", secs, &["-m", "64", "--full-rtt"]);
    let mut out = Vec::new();
    let spins: &[u32] = if s.quick { &[0, 50, 200] } else { &SPINS_US };
    // nic mode is a reference line like the peers (its NIC server's spin is
    // `--server-spin`, not the shim's `--spin`).
    let mut plain = pick(ready, &["native", "ferry-nic", "slirp4netns", "pasta"]);
    if let Some(base) = s
        .baseline
        .as_ref()
        .filter(|_| ready.iter().any(|c| c.name == "ferry"))
    {
        // ferry at its defaults, and the same from the baseline build, side by side.
        plain.push(Config::ferry_args("ferry", &[]));
        plain.push(Config::ferry_build("ferry-base", base));
    }
    for c in plain {
        out.push(Case {
            config: c,
            param: Param::none(),
            client: client.clone(),
            timeout: s.timeout(secs),
            pin: None,
            servers: vec![SOCKPERF_PORT],
            extract: pingpong_extract(),
        });
    }
    for &us in spins {
        let spin = format!("{us}us");
        if !ready.iter().any(|c| c.name == "ferry") {
            break;
        }
        // The default (pair) receive path: a reader that spun out sleeps in the kernel,
        // and the shim counts those sleeps for the server's stats (`pair_sleeps`, part
        // of `wakes`), beside the server's wakes and the doorbells.
        let c = Config::ferry_args(&format!("ferry-spin{spin}"), &["--spin", &spin]);
        out.push(Case {
            config: c,
            param: Param::new(spin.clone(), f64::from(us)),
            client: client.clone(),
            timeout: s.timeout(secs),
            pin: None,
            servers: vec![SOCKPERF_PORT],
            extract: pingpong_extract(),
        });
    }
    // An event loop: sockperf waiting in `epoll_wait` (its `-F` wants a file naming the
    // connection), natively and through ferry at its defaults, where the shim's wait
    // spins before it sleeps too.
    let script = format!(
        "f=$(mktemp) || exit 1; echo T:{ip}:{SOCKPERF_PORT} > \"$f\"; \
         sockperf ping-pong -f \"$f\" -F epoll -t {secs} -m 64 --full-rtt; r=$?; \
         rm -f \"$f\"; exit $r",
        ip = s.remote
    );
    let epoll_client = vec!["sh".to_owned(), "-c".to_owned(), script];
    let mut native = pick(ready, &["native"]);
    for c in &mut native {
        c.name = "native-epoll".into();
    }
    if ready.iter().any(|c| c.name == "ferry") {
        native.push(Config::ferry_args("ferry-epoll", &[]));
    }
    for c in native {
        out.push(Case {
            config: c,
            param: Param::none(),
            client: epoll_client.clone(),
            timeout: s.timeout(secs),
            pin: None,
            servers: vec![SOCKPERF_PORT],
            extract: pingpong_extract(),
        });
    }
    out
}

fn e3(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = if s.quick { 2 } else { 8 };
    let burner = s.burner.display().to_string();
    // The burner and a 10 MB/s transfer side by side, the whole configuration on CPU 0
    // (the remote's iperf3 server is on CPU 1: the "other machine").
    let script = format!(
        "{burner} {secs} & b=$!; r=0; iperf3 -c {ip} -p {IPERF_E3_PORT} -b 80M -t {secs} \
         --connect-timeout 3000 >&2 || r=$?; wait $b; \
         if [ $r -ne 0 ]; then echo \"the 10 MB/s transfer failed (iperf3 exit $r)\" >&2; exit 1; fi",
        ip = s.remote
    );
    let beside = vec!["sh".to_owned(), "-c".to_owned(), script];
    let extract = || -> Extract {
        Box::new(|r: &RunOut| {
            Ok(vec![(
                "mflops",
                "MFlops",
                parse::burner_mflops(&r.outcome.stdout)?,
            )])
        })
    };
    let mut alone = Config::native();
    alone.name = "burner alone".into();
    let mut out = vec![Case {
        config: alone,
        param: Param::none(),
        client: vec![burner.clone(), secs.to_string()],
        timeout: s.timeout(secs),
        pin: Some(0),
        servers: vec![],
        extract: extract(),
    }];
    let mut configs = pick(ready, &["native", "ferry"]);
    configs.extend(ferry_variant(ready, "ferry-spin0", Some("0"), None));
    configs.extend(ferry_variant(ready, "ferry-spin1ms", Some("1ms"), None));
    configs.extend(pick(ready, &["slirp4netns", "pasta"]));
    for c in configs {
        out.push(Case {
            config: c,
            param: Param::none(),
            client: beside.clone(),
            timeout: s.timeout(secs),
            pin: Some(0),
            servers: vec![IPERF_E3_PORT],
            extract: extract(),
        });
    }
    out
}

fn stream_extract() -> Extract {
    Box::new(|r: &RunOut| {
        let (rate, mbps) = parse::sockperf_tp(&r.outcome.stdout)?;
        let mut v = vec![("throughput", "Mbit/s", mbps), ("messages", "msg/s", rate)];
        if let Some(st) = &r.stats {
            let ops = st.requests.max(1) as f64;
            v.push(("wakes_per_op", "per request", st.wakes() as f64 / ops));
            v.push((
                "syscalls_per_op",
                "per request",
                st.data_syscalls as f64 / ops,
            ));
        }
        Ok(v)
    })
}

fn e4(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(3);
    let batches: &[u32] = if s.quick {
        &[1, 8, 64]
    } else {
        &[1, 2, 4, 8, 16, 32, 64]
    };
    let stream = s.sockperf("throughput", secs, &["-m", "1024"]);
    let pp = s.sockperf("ping-pong", secs, &["-m", "64", "--full-rtt"]);
    let mut out = Vec::new();
    let mut push = |c: Config, param: Param| {
        for (client, extract) in [
            (stream.clone(), stream_extract()),
            (pp.clone(), pingpong_extract()),
        ] {
            out.push(Case {
                config: c.clone(),
                param: param.clone(),
                client,
                timeout: s.timeout(secs),
                pin: None,
                servers: vec![SOCKPERF_PORT],
                extract,
            });
        }
    };
    for c in pick(ready, &["native"]) {
        push(c, Param::none());
    }
    for &n in batches {
        if let Some(c) = ferry_variant(ready, &format!("ferry-batch{n}"), None, Some(n)) {
            push(c, Param::new(format!("batch {n}"), f64::from(n)));
        }
    }
    out
}

/// A stage of a NIC server's frame path as E5 reports it: its name in ferry's counters
/// (`ferry run --nic-timing`), its label, the direction its work belongs to (`tx`:
/// sandbox → network, `rx`: network → sandbox, `both`: half each, `poll`: neither, the
/// server looking for work), and its three metric names (µs per round trip, calls per
/// round trip, ns per call).
#[derive(Clone, Copy, Debug)]
pub struct E5Stage {
    /// Name in `--stats-json`'s `"timing"`.
    pub name: &'static str,
    /// Label in tables and plots.
    pub label: &'static str,
    /// tx, rx, both or poll.
    pub dir: &'static str,
    /// Metric: µs of the stage per round trip.
    pub us: &'static str,
    /// Metric: calls of the stage per round trip.
    pub calls: &'static str,
    /// Metric: ns per call.
    pub ns: &'static str,
}

const fn stage(
    name: &'static str,
    label: &'static str,
    dir: &'static str,
    [us, calls, ns]: [&'static str; 3],
) -> E5Stage {
    E5Stage {
        name,
        label,
        dir,
        us,
        calls,
        ns,
    }
}

/// E5's stages, in the order of a packet's path (tx, then rx), then the polling.
pub const E5_STAGES: [E5Stage; 10] = [
    stage(
        "tap_read",
        "TAP read (syscall)",
        "tx",
        ["stage tap_read", "calls tap_read", "ns/call tap_read"],
    ),
    stage(
        "ingress",
        "classify + stack ingress",
        "tx",
        ["stage ingress", "calls ingress", "ns/call ingress"],
    ),
    stage(
        "host_send",
        "host socket send",
        "tx",
        ["stage host_send", "calls host_send", "ns/call host_send"],
    ),
    stage(
        "pump",
        "stack buffers ⇄ host sockets",
        "both",
        ["stage pump", "calls pump", "ns/call pump"],
    ),
    stage(
        "wake",
        "wake → pick-up",
        "both",
        ["stage wake", "calls wake", "ns/call wake"],
    ),
    stage(
        "host_recv",
        "host socket recv",
        "rx",
        ["stage host_recv", "calls host_recv", "ns/call host_recv"],
    ),
    stage(
        "egress",
        "stack egress (framing)",
        "rx",
        ["stage egress", "calls egress", "ns/call egress"],
    ),
    stage(
        "tap_write",
        "TAP write (syscall)",
        "rx",
        ["stage tap_write", "calls tap_write", "ns/call tap_write"],
    ),
    stage(
        "tap_read_empty",
        "empty TAP reads (polling)",
        "poll",
        [
            "stage tap_read_empty",
            "calls tap_read_empty",
            "ns/call tap_read_empty",
        ],
    ),
    stage(
        "idle_poll",
        "idle turns (pump, egress: nothing moved)",
        "poll",
        ["stage idle_poll", "calls idle_poll", "ns/call idle_poll"],
    ),
];

/// E5's ping-pong workloads (parameter labels): as the scheduler places them.
pub const E5_TCP: &str = "TCP ping-pong 64 B";
/// The UDP one.
pub const E5_UDP: &str = "UDP ping-pong 64 B";
/// TCP with everything (the client, ferry, the remote's server) on CPU 0.
pub const E5_TCP_ONE: &str = "TCP ping-pong 64 B, one core";
/// UDP on CPU 0.
pub const E5_UDP_ONE: &str = "UDP ping-pong 64 B, one core";
/// E5's MTUs of nic mode.
pub const E5_MTUS: [u32; 3] = [1500, 9000, 65520];

/// sockperf ping-pong as E5 reads it: RTT p50/p99 and, from a nic-mode run, frames and
/// sleeps per round trip and, when timed, every stage's µs and calls per round trip and
/// ns per call (round trips: every message sockperf received, its warm-up included, as
/// the counters are).
fn e5_pingpong_extract() -> Extract {
    Box::new(|r: &RunOut| {
        let p = parse::sockperf_pp(&r.outcome.stdout)?;
        let mut v = vec![("rtt_p50", "us", p.p50), ("rtt_p99", "us", p.p99)];
        let Some(n) = r.stats.as_ref().and_then(|st| st.nic.as_ref()) else {
            return Ok(v);
        };
        let rts = p.total_received.max(1) as f64;
        v.push(("frames_in_per_rt", "per RT", n.frames_in as f64 / rts));
        v.push(("frames_out_per_rt", "per RT", n.frames_out as f64 / rts));
        v.push(("sleeps_per_rt", "per RT", n.sleeps as f64 / rts));
        if n.stages.is_empty() {
            return Ok(v);
        }
        for st in E5_STAGES {
            let c = n.stage(st.name);
            v.push((st.us, "us/RT", c.ns as f64 / 1e3 / rts));
            v.push((st.calls, "per RT", c.calls as f64 / rts));
            if c.calls > 0 {
                v.push((st.ns, "ns", c.ns as f64 / c.calls as f64));
            }
        }
        Ok(v)
    })
}

/// E5 (S2 figs. 2–3): what nic mode adds per packet, by stage. A 64-byte ping-pong
/// (sockperf, TCP and UDP) natively over the veth to the remote (the kernel's path, the
/// baseline), through ferry's socket mode, through nic mode, and through nic mode with
/// the NIC server timing its stages (`--nic-timing`; its RTT shows what the timing
/// costs); each as the scheduler places it, and with everything on CPU 0 (the client,
/// ferry, a sockperf server of the remote pinned there: no wake-up crosses CPUs, which
/// on these virtual machines costs tens of µs when the other CPU is idle). Then bulk TCP
/// (iperf3, both ways) through nic mode at MTU 1500, 9000 and 65520, and iperf3 -P 4
/// with 2 NIC servers vs 1.
fn e5(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let mut out = Vec::new();
    let nic_ok = ready.iter().any(|c| c.name == "ferry-nic");
    let mut configs = pick(ready, &["native", "ferry", "ferry-nic"]);
    if nic_ok {
        configs.push(Config::ferry_nic("ferry-nic-timed", &["--nic-timing"]));
    }
    let secs = s.secs(5);
    let pp = ["-m", "64", "--full-rtt"];
    let tcp_one = {
        let mut v = strings(&["sockperf", "ping-pong", "--tcp", "-i", &s.remote]);
        v.extend(strings(&["-p", &SOCKPERF_CPU0_PORT.to_string()]));
        v.extend(strings(&["-t", &secs.to_string()]));
        v.extend(strings(&pp));
        v
    };
    for (x, label, client, port, pin) in [
        (
            0.0,
            E5_TCP,
            s.sockperf("ping-pong", secs, &pp),
            SOCKPERF_PORT,
            None,
        ),
        (
            1.0,
            E5_UDP,
            s.sockperf_udp("ping-pong", SOCKPERF_UDP_PORT, secs, &pp),
            SOCKPERF_UDP_PORT,
            None,
        ),
        (2.0, E5_TCP_ONE, tcp_one, SOCKPERF_CPU0_PORT, Some(0)),
        (
            3.0,
            E5_UDP_ONE,
            s.sockperf_udp("ping-pong", SOCKPERF_CPU0_UDP_PORT, secs, &pp),
            SOCKPERF_CPU0_UDP_PORT,
            Some(0),
        ),
    ] {
        for c in &configs {
            out.push(Case {
                config: c.clone(),
                param: Param::new(label, x),
                client: client.clone(),
                timeout: s.timeout(secs),
                pin,
                servers: vec![port],
                extract: e5_pingpong_extract(),
            });
        }
    }
    if !nic_ok {
        return out;
    }
    let bulk = [
        ("iperf3 TCP send", s.iperf3(IPERF_PORT, secs, &[])),
        ("iperf3 TCP recv", s.iperf3(IPERF_PORT, secs, &["-R"])),
    ];
    for (i, (label, client)) in bulk.iter().enumerate() {
        for mtu in E5_MTUS {
            let m = mtu.to_string();
            out.push(Case {
                config: Config::ferry_nic(&format!("ferry-nic mtu{mtu}"), &["--mtu", &m]),
                param: Param::new(*label, 10.0 + i as f64),
                client: client.clone(),
                timeout: s.timeout(secs),
                pin: None,
                servers: vec![IPERF_PORT],
                extract: iperf_extract(),
            });
        }
    }
    let parallel = [
        ("iperf3 -P 4 send", s.iperf3(IPERF_PORT, secs, &["-P", "4"])),
        (
            "iperf3 -P 4 recv",
            s.iperf3(IPERF_PORT, secs, &["-P", "4", "-R"]),
        ),
    ];
    for (i, (label, client)) in parallel.iter().enumerate() {
        for (name, n) in [("ferry-nic 1 server", "1"), ("ferry-nic 2 servers", "2")] {
            out.push(Case {
                config: Config::ferry_nic(name, &["--nic-servers", n]),
                param: Param::new(*label, 20.0 + i as f64),
                client: client.clone(),
                timeout: s.timeout(secs),
                pin: None,
                servers: vec![IPERF_PORT],
                extract: iperf_extract(),
            });
        }
    }
    out
}

/// E5's derived rows: 2 NIC servers' bandwidth over 1 server's (median) for iperf3 -P 4,
/// each way.
pub fn e5_ratios(rows: &[crate::plan::Row]) -> Vec<crate::plan::Row> {
    let mut out = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.experiment == "E5" && r.config == "ferry-nic 2 servers")
        .filter(|r| r.metric == "bandwidth")
    {
        let one = rows
            .iter()
            .find(|o| {
                o.experiment == "E5"
                    && o.config == "ferry-nic 1 server"
                    && o.param.label == r.param.label
                    && o.metric == "bandwidth"
            })
            .and_then(crate::plan::Row::median)
            .filter(|m| *m > 0.0);
        if let Some(one) = one {
            out.push(crate::plan::Row {
                metric: "x_1_server".into(),
                unit: "× 1 server".into(),
                samples: r.samples.iter().map(|v| v / one).collect(),
                ..r.clone()
            });
        }
    }
    out
}

/// E7's two workloads: two processes each sending 1024-byte messages (sockperf
/// throughput: time per message = 1 / the two rates summed) or each doing send+recv
/// (sockperf ping-pong: time per operation = the mean of the two median round trips);
/// plus, under ferry, wake-ups per request (the hand-offs between cores that needed a
/// wake).
fn two_process_extract(pingpong: bool) -> Extract {
    Box::new(move |r: &RunOut| {
        let out = &r.outcome.stdout;
        let per_op = if pingpong {
            let p50s = parse::sockperf_pp_all(out);
            if p50s.len() != 2 {
                return Err(format!("{} of 2 sockperf ping-pong results", p50s.len()));
            }
            p50s.iter().sum::<f64>() / 2.0
        } else {
            let rates = parse::sockperf_tp_all(out);
            if rates.len() != 2 {
                return Err(format!("{} of 2 sockperf throughput results", rates.len()));
            }
            1e6 / rates.iter().sum::<f64>().max(1.0)
        };
        let mut v = vec![("time_per_op", "us", per_op)];
        if let Some(st) = &r.stats {
            let ops = st.requests.max(1) as f64;
            v.push(("wakes_per_op", "per request", st.wakes() as f64 / ops));
        }
        Ok(v)
    })
}

/// The host port E7 publishes a sandbox server on.
const E7_PUBLISHED: u16 = 15301;

/// E7's arrangements: (name, ferry options, two paths?). `None` options: native.
const E7_CONFIGS: [(&str, Option<&[&str]>, bool); 4] = [
    ("native", None, true),
    (
        "conventional (1 server, 1 path)",
        Some(&["--servers", "1"]),
        false,
    ),
    (
        "bonding (1 server, 2 paths)",
        Some(&["--servers", "1"]),
        true,
    ),
    (
        "proposed (2 servers, 2 paths)",
        Some(&["--servers", "2", "--assign", "rr"]),
        true,
    ),
];

fn e7(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(3);
    let ferry_ok = ready.iter().any(|c| c.name == "ferry");
    let native_ok = ready.iter().any(|c| c.name == "native");
    let mut out = Vec::new();
    // Two processes at once; each has its own remote server, over path 1 or path 2.
    let two = |mode: &str, two_paths: bool| {
        let dest_b = if two_paths { &s.remote2 } else { &s.remote };
        let one = |ip: &str, port: u16| {
            let extra = if mode == "ping-pong" {
                " --full-rtt"
            } else {
                ""
            };
            format!("sockperf {mode} --tcp -i {ip} -p {port} -t {secs} -m 1024{extra}")
        };
        let script = format!(
            "{} & a=$!; r=0; {} || r=$?; wait $a || r=$?; exit $r",
            one(&s.remote, SOCKPERF_E7A_PORT),
            one(dest_b, SOCKPERF_E7B_PORT)
        );
        vec!["sh".to_owned(), "-c".to_owned(), script]
    };
    let placements: [(&str, Option<usize>, &str); 2] =
        [("one core", Some(0), "0"), ("spread", None, "0,1")];
    let mut x = 0.0;
    for (mode, label) in [("throughput", "send"), ("ping-pong", "send+recv")] {
        for (place, pin, cpus) in placements {
            let param = Param::new(format!("{label}, {place}"), x);
            x += 1.0;
            for (name, opts, two_paths) in E7_CONFIGS {
                let config = match opts {
                    None if native_ok => Config::native(),
                    Some(o) if ferry_ok => {
                        let mut args = o.to_vec();
                        args.extend(["--cpus", cpus]);
                        Config::ferry_args(name, &args)
                    }
                    _ => continue,
                };
                out.push(Case {
                    config,
                    param: param.clone(),
                    client: two(mode, two_paths),
                    timeout: s.timeout(secs),
                    pin,
                    servers: vec![SOCKPERF_E7A_PORT, SOCKPERF_E7B_PORT],
                    extract: two_process_extract(mode == "ping-pong"),
                });
            }
        }
    }
    // Where accepted connections go: iperf3 -s inside the sandbox, published, receiving 4
    // connections from the remote; accepted sockets assigned over 2 servers, kept on the
    // listener's server, or 1 server.
    let conns = if s.quick { 2 } else { 4 };
    let script = format!(
        "iperf3 -s -1 -p 5301 -J & s=$!; sleep 0.5; \
         env -u LD_PRELOAD ip netns exec {ns} iperf3 -c {host} -p {E7_PUBLISHED} -P {conns} -t {secs} \
         --connect-timeout 3000 >/dev/null; r=$?; wait $s || r=$?; exit $r",
        ns = s.remote_ns,
        host = s.host_ip,
    );
    let publish = format!("{E7_PUBLISHED}:5301");
    let param = Param::new(format!("published, {conns} conns"), 200.0);
    for (name, opts) in [
        (
            "accepted: assign",
            &["--servers", "2", "--assign", "rr", "--accepted", "assign"][..],
        ),
        (
            "accepted: listener",
            &["--servers", "2", "--assign", "rr", "--accepted", "listener"][..],
        ),
        ("accepted: 1 server", &["--servers", "1"][..]),
    ] {
        if !ferry_ok {
            break;
        }
        let mut args = opts.to_vec();
        args.extend(["-p", &publish]);
        out.push(Case {
            config: Config::ferry_args(name, &args),
            param: param.clone(),
            client: vec!["sh".to_owned(), "-c".to_owned(), script.clone()],
            timeout: s.timeout(secs + 1),
            pin: None,
            servers: vec![],
            extract: Box::new(|r: &RunOut| {
                let bps = parse::iperf3_bps(&r.outcome.stdout)?;
                Ok(vec![("accepted_bandwidth", "Gbit/s", bps / 1e9)])
            }),
        });
    }
    // Throughput of K parallel connections vs the number of servers.
    let ks: &[u32] = if s.quick { &[1, 4] } else { &[1, 2, 4, 8] };
    for &k in ks {
        let param = Param::new(format!("{k} conns"), 100.0 + f64::from(k));
        let mut configs = Vec::new();
        if native_ok {
            configs.push(Config::native());
        }
        if ferry_ok {
            configs.push(Config::ferry_args("1 server", &["--servers", "1"]));
            configs.push(Config::ferry_args(
                "2 servers",
                &["--servers", "2", "--assign", "rr"],
            ));
        }
        for config in configs {
            out.push(Case {
                config,
                param: param.clone(),
                client: s.iperf3(IPERF_PORT, secs, &["-P", &k.to_string()]),
                timeout: s.timeout(secs),
                pin: None,
                servers: vec![IPERF_PORT],
                extract: Box::new(move |r: &RunOut| {
                    let bps = parse::iperf3_bps(&r.outcome.stdout)?;
                    Ok(vec![("k_bandwidth", "Gbit/s", bps / 1e9)])
                }),
            });
        }
    }
    out
}

/// One R1 test: label, client, servers to restart on failure, metrics, seconds it runs.
type R1Test = (&'static str, Vec<String>, Vec<u16>, Extract, u32);

fn r1(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(3);
    // nic mode (`--net nic`) after ferry's socket-mode variants, before the peers.
    let mut configs = pick(
        ready,
        &["native", "ferry", "ferry-nic", "slirp4netns", "pasta"],
    );
    // The ring receive path (`--rx ring`) beside the default pair path, in the same run.
    if let Some(at) = configs.iter().position(|c| c.name == "ferry") {
        configs.insert(at + 1, Config::ferry_args("ferry-ring", &["--rx", "ring"]));
        if s.unconfined_too {
            // The servers without their seccomp filter and with their capabilities.
            configs.insert(
                at + 1,
                Config::ferry_args("ferry-unconfined", &["--unconfined"]),
            );
        }
        if let Some(base) = &s.baseline {
            configs.insert(at + 1, Config::ferry_build("ferry-base", base));
        }
    }
    // Enough requests that each test lasts seconds: the machine's CPU time per request
    // is measured over the whole run, start-up included.
    let (n1, n16) = if s.quick {
        ("5000", "50000")
    } else {
        ("100000", "1000000")
    };
    let url = format!("http://{}:{HTTP_PORT}/{HTTP_FILE}", s.remote);
    let redis = |n: &str, p: &str| {
        strings(&[
            "redis-benchmark",
            "-h",
            &s.remote,
            "-p",
            &REDIS_PORT.to_string(),
        ])
        .into_iter()
        .chain(strings(&["-t", "get,set", "-n", n, "-P", p, "--csv", "-q"]))
        .collect::<Vec<_>>()
    };
    // Requests per second of GET and SET, and the whole machine's busy CPU µs per
    // request (both tests): on 2 CPUs that both of them saturate, throughput follows it.
    let redis_extract = |p: &'static str, n: &str| -> Extract {
        let requests = 2.0 * n.parse::<f64>().unwrap_or(f64::NAN);
        Box::new(move |r: &RunOut| {
            let (get, set, cpu) = match p {
                "1" => ("GET -P 1", "SET -P 1", "CPU per request -P 1"),
                _ => ("GET -P 16", "SET -P 16", "CPU per request -P 16"),
            };
            Ok(vec![
                (get, "req/s", parse::redis_rps(&r.outcome.stdout, "GET")?),
                (set, "req/s", parse::redis_rps(&r.outcome.stdout, "SET")?),
                (cpu, "us", r.cpu_us_per(requests)?),
            ])
        })
    };
    let tput = |metric: &'static str| -> Extract {
        Box::new(move |r: &RunOut| {
            Ok(vec![(
                metric,
                "Gbit/s",
                parse::iperf3_bps(&r.outcome.stdout)? / 1e9,
            )])
        })
    };
    let tests: Vec<R1Test> = vec![
        (
            "iperf3 TCP send",
            s.iperf3(IPERF_PORT, secs, &[]),
            vec![IPERF_PORT],
            tput("TCP send"),
            secs,
        ),
        (
            "iperf3 TCP recv",
            s.iperf3(IPERF_PORT, secs, &["-R"]),
            vec![IPERF_PORT],
            tput("TCP recv"),
            secs,
        ),
        (
            "iperf3 UDP",
            s.iperf3(IPERF_PORT, secs, &["-u", "-b", "1G", "-l", "1400"]),
            vec![IPERF_PORT],
            tput("UDP 1G offered"),
            secs,
        ),
        (
            "sockperf ping-pong",
            s.sockperf("ping-pong", secs, &["-m", "64", "--full-rtt"]),
            vec![SOCKPERF_PORT],
            Box::new(|r: &RunOut| {
                Ok(vec![(
                    "RTT p50",
                    "us",
                    parse::sockperf_pp(&r.outcome.stdout)?.p50,
                )])
            }),
            secs,
        ),
        (
            "redis -P 1",
            redis(n1, "1"),
            vec![REDIS_PORT],
            redis_extract("1", n1),
            30,
        ),
        (
            "redis -P 16",
            redis(n16, "16"),
            vec![REDIS_PORT],
            redis_extract("16", n16),
            30,
        ),
        (
            "wrk nginx 16K",
            strings(&[
                "wrk",
                "-t",
                "2",
                "-c",
                "16",
                "-d",
                &format!("{secs}s"),
                "--timeout",
                "5s",
                &url,
            ]),
            vec![HTTP_PORT],
            Box::new(|r: &RunOut| {
                Ok(vec![(
                    "HTTP 16K",
                    "req/s",
                    parse::wrk_rps(&r.outcome.stdout)?,
                )])
            }),
            secs,
        ),
    ];
    let mut out = Vec::new();
    for (i, (label, client, servers, extract, secs)) in tests.into_iter().enumerate() {
        let secs: u32 = secs;
        let extract: std::rc::Rc<Extract> = std::rc::Rc::new(extract);
        for c in &configs {
            let ex = extract.clone();
            out.push(Case {
                config: c.clone(),
                param: Param::new(label, i as f64),
                client: client.clone(),
                timeout: s.timeout(secs),
                pin: None,
                servers: servers.clone(),
                extract: Box::new(move |r: &RunOut| ex(r)),
            });
        }
    }
    out
}

/// E6's file sizes (bytes): S3's 2,322-byte response and 1–6 MB.
pub const E6_SIZES: [u64; 5] = [2322, 1 << 20, 2 << 20, 4 << 20, 6 << 20];
/// E6's sizes with `--quick`.
const E6_QUICK: [u64; 3] = [2322, 1 << 20, 6 << 20];

/// The name of E6's file of `size` bytes in [`Settings::e6_dir`].
pub fn e6_file(size: u64) -> String {
    format!("e6-{size}.bin")
}

/// The label of an E6 size: "2322 B", "1 MB", …
fn e6_label(size: u64) -> String {
    if size >= 1 << 20 {
        format!("{} MB", size >> 20)
    } else {
        format!("{size} B")
    }
}

/// A program in the sandbox serves a file to E6's requester (remote) four ways: its own
/// 64 KiB pread/send loop, `sendfile`, a module bound per response (http_file through
/// the native API, the file registered with the server once and bound by handle: S3's
/// way), or the same module bound once for the kept-alive connection (its `lines` mode:
/// the program sends it each request line). Each way opens the file once and sends it
/// from offset 0 per response (see `ferry-e6`). Natively only the first two exist.
/// Metrics: latency per response (request sent → last byte in, at the requester),
/// throughput, and for the modules the program's bind call and, per response in the
/// server (means): making the instance (`module_start`), its `init` (`module_init`),
/// writing header and file (`module_write`: send, sendfile; the only one of the three
/// that a module bound once pays per response).
fn e6(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let sizes: &[u64] = if s.quick { &E6_QUICK } else { &E6_SIZES };
    let mut ways: Vec<(Config, &str)> = Vec::new();
    for c in pick(ready, &["native", "ferry"]) {
        let mut ws = vec![("read/write", "rw"), ("sendfile", "sendfile")];
        if c.is_ferry() {
            ws.push(("module", "module"));
            ws.push(("module kept", "module-keep"));
        }
        for (label, way) in ws {
            let mut cfg = c.clone();
            cfg.name = format!("{} {label}", c.name);
            ways.push((cfg, way));
        }
    }
    let mut out = Vec::new();
    for &size in sizes {
        let responses = match (size < 1 << 20, s.quick) {
            (true, true) => 2000,
            (true, false) => 20_000,
            (false, true) => 30,
            (false, false) => 200,
        };
        for (c, way) in &ways {
            let file = s.e6_dir.join(e6_file(size));
            // Bound per response: the server's times are per instance; bound once: the
            // write time is spread over the responses.
            let per_instance = *way == "module";
            out.push(Case {
                config: c.clone(),
                param: Param::new(e6_label(size), size as f64),
                client: vec![
                    s.e6_bin.display().to_string(),
                    "serve".into(),
                    "--way".into(),
                    (*way).into(),
                    "--file".into(),
                    file.display().to_string(),
                    "--connect".into(),
                    format!("{}:{E6_PORT}", s.remote),
                    "--responses".into(),
                    responses.to_string(),
                ],
                timeout: Duration::from_secs(if s.quick { 20 } else { 60 }),
                pin: None,
                servers: vec![E6_PORT],
                extract: Box::new(move |r: &RunOut| {
                    let (p50, p99, mbps, bind) = parse::e6(&r.outcome.stdout)?;
                    let mut v = vec![
                        ("latency_p50", "us", p50),
                        ("latency_p99", "us", p99),
                        ("throughput", "MB/s", mbps),
                    ];
                    if let Some(b) = bind {
                        v.push(("bind_p50", "us", b));
                    }
                    if let Some(st) = r.stats.as_ref().filter(|st| st.modules_started > 0) {
                        let per = |ns: u64, n: u64| ns as f64 / n.max(1) as f64 / 1e3;
                        if per_instance {
                            let n = st.modules_started;
                            v.push(("module_start", "us", per(st.module_start_ns, n)));
                            v.push(("module_init", "us", per(st.module_init_ns, n)));
                            v.push(("module_write", "us", per(st.module_write_ns, n)));
                        } else {
                            v.push(("module_write", "us", per(st.module_write_ns, responses)));
                        }
                    }
                    Ok(v)
                }),
            });
        }
    }
    out
}

/// E6's derived rows: each ferry way's throughput over ferry sendfile's (median) at the
/// same size, and its latency over ferry read/write's.
pub fn e6_ratios(rows: &[crate::plan::Row]) -> Vec<crate::plan::Row> {
    let median = |config: &str, param: &str, metric: &str| {
        rows.iter()
            .find(|r| {
                r.experiment == "E6"
                    && r.config == config
                    && r.param.label == param
                    && r.metric == metric
            })
            .and_then(crate::plan::Row::median)
    };
    let mut out = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.experiment == "E6" && r.config.starts_with("ferry"))
    {
        let (base, metric, unit) = match r.metric.as_str() {
            "throughput" => ("ferry sendfile", "x_sendfile", "× ferry sendfile"),
            "latency_p50" => ("ferry read/write", "x_rw_latency", "× ferry read/write"),
            _ => continue,
        };
        let Some(b) = median(base, &r.param.label, &r.metric).filter(|b| *b > 0.0) else {
            continue;
        };
        out.push(crate::plan::Row {
            metric: metric.into(),
            unit: unit.into(),
            samples: r.samples.iter().map(|v| v / b).collect(),
            ..r.clone()
        });
    }
    out
}
