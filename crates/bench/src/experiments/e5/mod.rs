//! E5 (S2's figures 2–3): what nic mode adds per packet, by stage of the NIC server's
//! frame path, against the kernel's own path; its MTU; 2 NIC servers vs 1. The report's
//! stage tables are in `report.rs`, the figure in `plot.rs`.

use super::{Experiment, Settings, iperf_extract, pick, strings};
use crate::config::{Config, RunOut};
use crate::parse;
use crate::plan::{Case, Extract, Param, Row, median};
use crate::plot::Area;
use crate::topology::{
    IPERF_PORT, SOCKPERF_CPU0_PORT, SOCKPERF_CPU0_UDP_PORT, SOCKPERF_PORT, SOCKPERF_UDP_PORT,
};

mod plot;
pub mod report;

/// E5 (see the module's header).
#[derive(Debug)]
pub struct E5;

impl Experiment for E5 {
    fn id(&self) -> &'static str {
        "E5"
    }

    fn title(&self) -> &'static str {
        "nic mode: per-packet overhead by stage vs the kernel's veth path; MTU; NIC servers"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("rtt_p50", "us")
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn derived(&self, rows: &[Row]) -> Vec<Row> {
        ratios(rows)
    }

    fn summary(&self, rows: &[Row]) -> String {
        report::summary(rows)
    }

    fn in_table(&self, row: &Row) -> bool {
        report::in_table(row)
    }

    fn paper(&self) -> &'static str {
        "S2 figs. 2–3 (a pseudo-NIC: the guest's NIC served by a process outside it, \
         relaying to host sockets): per packet, **+11.98 µs transmit and +9.9 µs \
         receive** over the host's own path, broken down by stage (receive, hand-off, \
         wake-up, server pick-up). Here the baseline is the kernel's own path (native \
         sockets over the veth to the remote namespace); the stages are the NIC \
         server's own (TAP read, classify + stack, host socket send/receive, stack \
         egress, TAP write, wake → pick-up); what the server cannot see (the sandbox \
         kernel's TAP driver, thread hand-offs and wake-ups) is the rest of the RTT \
         difference. MTU and NIC-server counts have no paper figure: goals are that \
         the default MTU (65520) is the measured best and that 2 servers help \
         `-P 4`."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1800, 1100)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot::plot(root, rows)
    }
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
fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
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

/// The derived rows: 2 NIC servers' bandwidth over 1 server's (median) for iperf3 -P 4,
/// each way.
fn ratios(rows: &[Row]) -> Vec<Row> {
    let mut out = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.config == "ferry-nic 2 servers")
        .filter(|r| r.metric == "bandwidth")
    {
        let one =
            median(rows, "ferry-nic 1 server", &r.param.label, "bandwidth").filter(|m| *m > 0.0);
        if let Some(one) = one {
            out.push(Row {
                metric: "x_1_server".into(),
                unit: "× 1 server".into(),
                samples: r.samples.iter().map(|v| v / one).collect(),
                ..r.clone()
            });
        }
    }
    out
}
