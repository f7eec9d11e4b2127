//! E5's part of the report: the per-packet table by stage beside S2's published figures,
//! the MTU and NIC-server tables. Every ratio is of medians; nothing here judges a time
//! beyond saying whether a stated goal was met in this run.

use std::fmt::Write as _;

use super::{E5_MTUS, E5_STAGES, E5_TCP, E5_TCP_ONE, E5_UDP, E5_UDP_ONE, E5Stage};
use crate::plan::{Row, find, median};

/// S2's published per-packet overhead of its pseudo-NIC path: (tx, rx) µs.
pub const S2_TX_US: f64 = 11.98;

/// S2, receive.
pub const S2_RX_US: f64 = 9.9;

fn f(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(v) => format!("{v:.digits$}"),
        None => "–".into(),
    }
}

/// The share of a stage that counts in direction `dir` (tx or rx): all of its own
/// direction's, half of a `both` stage, none of the polling.
fn share(st: &E5Stage, dir: &str) -> f64 {
    match st.dir {
        d if d == dir => 1.0,
        "both" => 0.5,
        _ => 0.0,
    }
}

/// Whether a stage is a system call (its time includes the kernel's own work: for a
/// host send over the veth, delivering the packet to the remote's socket and waking
/// its reader; for a TAP write, the same inside the sandbox).
pub fn is_syscall(st: &E5Stage) -> bool {
    matches!(
        st.name,
        "tap_read" | "host_send" | "host_recv" | "tap_write"
    )
}

/// Sum of the timed stages' µs per round trip in direction `dir` (tx or rx) for one
/// workload, from the medians; `None` when the timed run has no stage rows.
pub fn stage_sum(rows: &[Row], workload: &str, dir: &str) -> Option<f64> {
    stage_sum_of(rows, workload, dir, |_| true)
}

/// [`stage_sum`] of the stages `pick` takes.
pub fn stage_sum_of(
    rows: &[Row],
    workload: &str,
    dir: &str,
    pick: impl Fn(&E5Stage) -> bool,
) -> Option<f64> {
    let mut any = false;
    let mut sum = 0.0;
    for st in E5_STAGES.iter().filter(|st| pick(st)) {
        if let Some(v) = median(rows, "ferry-nic-timed", workload, st.us) {
            any = true;
            sum += v * share(st, dir);
        }
    }
    any.then_some(sum)
}

/// (RTT p50 of `config` − native's) / 2: what `config` adds per packet per direction.
pub fn half_diff(rows: &[Row], workload: &str, config: &str) -> Option<f64> {
    let n = median(rows, "native", workload, "rtt_p50")?;
    let c = median(rows, config, workload, "rtt_p50")?;
    Some((c - n) / 2.0)
}

/// The per-stage table and the per-direction comparison of one placement's TCP and
/// UDP workloads.
fn per_packet(rows: &[Row], tcp: &str, udp: &str) -> String {
    let mut out = String::new();
    out.push_str(
        "| stage | dir | TCP calls/RT | TCP ns/call | TCP µs/RT | UDP calls/RT | UDP ns/call | UDP µs/RT |\n\
         |---|---|--:|--:|--:|--:|--:|--:|\n",
    );
    let cell = |w: &str, metric: &str, d: usize| f(median(rows, "ferry-nic-timed", w, metric), d);
    for st in &E5_STAGES {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            st.label,
            st.dir,
            cell(tcp, st.calls, 2),
            cell(tcp, st.ns, 0),
            cell(tcp, st.us, 2),
            cell(udp, st.calls, 2),
            cell(udp, st.ns, 0),
            cell(udp, st.us, 2),
        );
    }
    for (what, metric) in [
        ("frames read from the TAP", "frames_in_per_rt"),
        ("frames written to the TAP", "frames_out_per_rt"),
        ("server sleeps", "sleeps_per_rt"),
    ] {
        let _ = writeln!(
            out,
            "| {what} (per RT) | | {} | | | {} | | |",
            cell(tcp, metric, 2),
            cell(udp, metric, 2)
        );
    }
    out.push_str(
        "\n| per packet, each direction (µs) | TCP tx | TCP rx | UDP tx | UDP rx |\n\
         |---|--:|--:|--:|--:|\n",
    );
    let _ = writeln!(
        out,
        "| **S2, published** (pseudo-NIC, per packet) | {S2_TX_US} | {S2_RX_US} | {S2_TX_US} | {S2_RX_US} |"
    );
    let both = |label: &str, tcp: Option<f64>, udp: Option<f64>| {
        format!(
            "| {label} | {} | {} | {} | {} |\n",
            f(tcp, 2),
            f(tcp, 2),
            f(udp, 2),
            f(udp, 2)
        )
    };
    out.push_str(&both(
        "ferry-nic: (RTT p50 − native's) / 2",
        half_diff(rows, tcp, "ferry-nic"),
        half_diff(rows, udp, "ferry-nic"),
    ));
    out.push_str(&both(
        "ferry-nic-timed: (RTT p50 − native's) / 2",
        half_diff(rows, tcp, "ferry-nic-timed"),
        half_diff(rows, udp, "ferry-nic-timed"),
    ));
    let dirs = [(tcp, "tx"), (tcp, "rx"), (udp, "tx"), (udp, "rx")];
    for (label, pick) in [
        (
            "NIC server's time per packet (sum of its stages, timed)",
            (|_: &E5Stage| true) as fn(&E5Stage) -> bool,
        ),
        (
            "… of which system calls (TAP read/write, host send/recv)",
            is_syscall,
        ),
        (
            "… of which ferry's own code (classify + stack, pump, egress, wake)",
            |st| !is_syscall(st),
        ),
    ] {
        let v: Vec<String> = dirs
            .iter()
            .map(|(w, d)| f(stage_sum_of(rows, w, d, pick), 2))
            .collect();
        let _ = writeln!(out, "| {label} | {} |", v.join(" | "));
    }
    out.push_str(&both(
        "socket mode (ferry), for comparison: (RTT p50 − native's) / 2",
        half_diff(rows, tcp, "ferry"),
        half_diff(rows, udp, "ferry"),
    ));
    let _ = writeln!(
        out,
        "\nRTT p50 (µs): native {} / ferry {} / ferry-nic {} / ferry-nic-timed {} (TCP); \
         {} / {} / {} / {} (UDP). The RTT difference is split evenly between the \
         directions (a round trip crosses the path once each way).\n",
        f(median(rows, "native", tcp, "rtt_p50"), 1),
        f(median(rows, "ferry", tcp, "rtt_p50"), 1),
        f(median(rows, "ferry-nic", tcp, "rtt_p50"), 1),
        f(median(rows, "ferry-nic-timed", tcp, "rtt_p50"), 1),
        f(median(rows, "native", udp, "rtt_p50"), 1),
        f(median(rows, "ferry", udp, "rtt_p50"), 1),
        f(median(rows, "ferry-nic", udp, "rtt_p50"), 1),
        f(median(rows, "ferry-nic-timed", udp, "rtt_p50"), 1),
    );
    out
}

/// The section's text: the stage table, the per-direction comparison with S2, MTU, servers.
pub fn summary(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(
        "### Per-packet overhead by stage (S2 figs. 2–3)\n\n\
         A 64-byte ping-pong carries one packet each way per round trip (RT), so µs per RT \
         of a stage is its cost per packet in its direction. Stages are timed in the NIC \
         server by `ferry run --nic-timing` (two clock reads each; outer stages exclude the \
         system calls inside them) and divided by every message sockperf received \
         (medians over runs of `ferry-nic-timed`). Direction: tx = sandbox → network (TAP \
         read, classify + smoltcp ingress, host send), rx = network → sandbox (host recv, \
         egress: smoltcp or datagram framing, TAP write); `both` stages count half in each \
         sum; empty TAP reads and idle turns are the server polling while it spins, in \
         neither. TCP frames include the ACKs (frames per RT below); UDP has exactly one \
         frame each way. A system call's time includes the kernel's work it sets off: a \
         host send over the veth delivers the packet to the remote's socket and wakes its \
         reader, a TAP write does the same inside the sandbox — work the native path does \
         in its own send too, so the server's time per packet is not all overhead; the \
         overhead is the RTT difference. On these virtual machines a wake-up of a thread \
         on an idle CPU costs tens of µs, so a ping-pong whose ends sleep has two modes \
         (a native round trip of ~6 µs or of ~70 µs, as the processes happen to be placed) \
         and a spinning server (ferry's) keeps its CPU out of the costly idle state: the \
         RTT differences as placed mostly measure wake-ups. With everything on one core \
         no wake-up crosses CPUs: the difference there is the path's own cost, the \
         closest to S2's per-packet figures.\n\n",
    );
    let _ = write!(
        out,
        "#### As the scheduler places them\n\n{}\n\
         #### Everything on one core (CPU 0: the client, ferry, the remote's server)\n\n{}\n",
        per_packet(rows, E5_TCP, E5_UDP),
        per_packet(rows, E5_TCP_ONE, E5_UDP_ONE)
    );

    out.push_str(
        "### MTU of the sandbox's TAP, by measurement\n\n\
         iperf3 bulk TCP (one connection) through nic mode at each `--mtu`; the host \
         sockets go over the veth either way. Median (min–max), Gbit/s.\n\n\
         | MTU | TCP send | TCP recv |\n|--:|--:|--:|\n",
    );
    let range = |config: &str, param: &str, metric: &str| match find(rows, config, param, metric)
        .and_then(|r| Some((r.median()?, r.min()?, r.max()?)))
    {
        Some((m, lo, hi)) => format!("{m:.2} ({lo:.2}–{hi:.2})"),
        None => "–".into(),
    };
    for mtu in E5_MTUS {
        let c = format!("ferry-nic mtu{mtu}");
        let _ = writeln!(
            out,
            "| {mtu} | {} | {} |",
            range(&c, "iperf3 TCP send", "bandwidth"),
            range(&c, "iperf3 TCP recv", "bandwidth")
        );
    }
    let best = E5_MTUS
        .iter()
        .filter_map(|m| {
            let c = format!("ferry-nic mtu{m}");
            let s = median(rows, &c, "iperf3 TCP send", "bandwidth")?;
            let r = median(rows, &c, "iperf3 TCP recv", "bandwidth")?;
            Some((*m, s + r))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((m, _)) = best {
        let _ = writeln!(
            out,
            "\nHighest send + recv (medians) at MTU **{m}**{}.\n",
            if m == 65520 {
                ": the default, 65520, is the measured best"
            } else {
                ": not the default (65520)"
            }
        );
    } else {
        out.push('\n');
    }

    out.push_str(
        "### 2 NIC servers vs 1 (iperf3 -P 4)\n\n\
         `--nic-servers 2`: two TAP queues, one NIC server thread each; the sandbox's \
         kernel spreads the four connections over the queues. Median (min–max), Gbit/s; \
         ratio of medians.\n\n\
         | test | 1 server | 2 servers | 2 / 1 |\n|---|--:|--:|--:|\n",
    );
    for t in ["iperf3 -P 4 send", "iperf3 -P 4 recv"] {
        let one = median(rows, "ferry-nic 1 server", t, "bandwidth");
        let two = median(rows, "ferry-nic 2 servers", t, "bandwidth");
        let ratio = match (one, two) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.2}×", b / a),
            _ => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {t} | {} | {} | {ratio} |",
            range("ferry-nic 1 server", t, "bandwidth"),
            range("ferry-nic 2 servers", t, "bandwidth")
        );
    }
    out.push_str(
        "\nThe full table below leaves out the per-stage rows shown above (they are in \
         `results.csv`: metrics `stage …` µs/RT, `calls …` per RT, `ns/call …`).\n\n",
    );
    out
}

/// Whether the generic table shows this row (the stage rows are in the summary).
pub fn in_table(r: &Row) -> bool {
    !(r.metric.starts_with("stage ")
        || r.metric.starts_with("calls ")
        || r.metric.starts_with("ns/call "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Param;

    fn row(config: &str, param: &str, metric: &str, v: f64) -> Row {
        Row {
            experiment: "E5".into(),
            config: config.into(),
            param: Param::new(param, 0.0),
            metric: metric.into(),
            unit: "us".into(),
            samples: vec![v],
            planned: 1,
            failures: Vec::new(),
        }
    }

    #[test]
    fn stage_sums_and_half_differences() {
        let rows = vec![
            row("native", E5_TCP, "rtt_p50", 20.0),
            row("ferry-nic-timed", E5_TCP, "rtt_p50", 60.0),
            row("ferry-nic-timed", E5_TCP, "stage tap_read", 1.0),
            row("ferry-nic-timed", E5_TCP, "stage pump", 2.0),
            row("ferry-nic-timed", E5_TCP, "stage tap_write", 3.0),
            row("ferry-nic-timed", E5_TCP, "stage tap_read_empty", 50.0),
        ];
        assert_eq!(stage_sum(&rows, E5_TCP, "tx"), Some(2.0));
        assert_eq!(stage_sum(&rows, E5_TCP, "rx"), Some(4.0));
        assert_eq!(stage_sum(&rows, E5_UDP, "tx"), None);
        assert_eq!(half_diff(&rows, E5_TCP, "ferry-nic-timed"), Some(20.0));
        let s = summary(&rows);
        assert!(
            s.contains("(sum of its stages, timed) | 2.00 | 4.00 | – | – |"),
            "{s}"
        );
        assert!(
            s.contains("system calls (TAP read/write, host send/recv) | 1.00 | 3.00 |"),
            "{s}"
        );
        assert!(s.contains("| 20.00 | 20.00 | – | – |"), "{s}");
    }
}
