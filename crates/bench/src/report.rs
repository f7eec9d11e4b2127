//! What a run leaves behind: `results.csv`, the terminal table, and `report.md` (date,
//! machine, method, one section per experiment with its table, its plot and the paper's
//! own figures, headline ratios, skipped configurations and failed runs).

use std::fmt::Write as _;
use std::path::Path;

use crate::config::{Ready, Skipped};
use crate::experiments::Experiment;
use crate::plan::Row;

/// Everything the report is made from.
#[derive(Debug)]
pub struct Results {
    /// Experiments that ran, in order.
    pub experiments: Vec<Experiment>,
    /// Every (case, metric).
    pub rows: Vec<Row>,
    /// Configurations that passed their smoke check, with MTUs.
    pub ready: Vec<Ready>,
    /// Configurations skipped, with reasons.
    pub skipped: Vec<Skipped>,
    /// The machine.
    pub machine: Machine,
    /// Measured repetitions per case.
    pub runs: usize,
    /// `--quick`.
    pub quick: bool,
    /// Wall time of the whole run, seconds.
    pub seconds: f64,
    /// The command line.
    pub command: String,
    /// The veth MTU.
    pub veth_mtu: u32,
    /// What was measured: the binaries' build times and the source tree's git state.
    pub build: String,
}

/// The machine the numbers come from.
#[derive(Clone, Debug)]
pub struct Machine {
    /// UTC date and time.
    pub date: String,
    /// `uname -r`.
    pub kernel: String,
    /// CPU model name.
    pub cpu: String,
    /// Online CPUs.
    pub cores: usize,
}

impl Machine {
    /// Reads the date, kernel and CPU of this machine.
    pub fn probe() -> Machine {
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned();
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        Machine {
            date,
            kernel,
            cpu,
            cores: crate::topology::cpus(),
        }
    }
}

/// A number in 4 significant digits, or "failed".
pub(crate) fn num(v: Option<f64>) -> String {
    match v {
        None => "failed".into(),
        Some(0.0) => "0".into(),
        Some(v) if v.abs() >= 1000.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 100.0 => format!("{v:.1}"),
        Some(v) if v.abs() >= 1.0 => format!("{v:.2}"),
        Some(v) if v.abs() >= 0.01 => format!("{v:.3}"),
        Some(v) => format!("{v:.2e}"),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// `results.csv`: experiment, config, param, metric, unit, median, min, max, runs
/// (successful measured runs; median/min/max are empty when every run failed).
pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from("experiment,config,param,metric,unit,median,min,max,runs\n");
    let f = |v: Option<f64>| v.map(|v| format!("{v}")).unwrap_or_default();
    for r in rows {
        let fields = [
            r.experiment.clone(),
            r.config.clone(),
            r.param.label.clone(),
            r.metric.clone(),
            r.unit.clone(),
            f(r.median()),
            f(r.min()),
            f(r.max()),
            r.samples.len().to_string(),
        ];
        let line: Vec<String> = fields.iter().map(|x| csv_field(x)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}

/// A fixed-width table of one experiment's rows, for the terminal.
pub fn table(e: Experiment, rows: &[Row]) -> String {
    let mut out = format!("\n{} — {}\n", e.id(), e.title());
    let _ = writeln!(
        out,
        "{:<16} {:<18} {:<16} {:>10} {:>10} {:>10} {:>5}  unit",
        "config", "param", "metric", "median", "min", "max", "runs"
    );
    for r in rows.iter().filter(|r| r.experiment == e.id()) {
        let _ = write!(
            out,
            "{:<16} {:<18} {:<16} {:>10} {:>10} {:>10} {:>2}/{:<2}  {}",
            r.config,
            r.param.label,
            r.metric,
            num(r.median()),
            num(r.min()),
            num(r.max()),
            r.samples.len(),
            r.planned,
            r.unit
        );
        if r.samples.len() < r.planned
            && let Some(f) = r.failures.first()
        {
            let _ = write!(out, "  ({f})");
        }
        out.push('\n');
    }
    out
}

fn md_table(e: Experiment, rows: &[Row]) -> String {
    let mut out = String::from("| config | param | metric | median | min | max | runs | unit |\n");
    out.push_str("|---|---|---|--:|--:|--:|--:|---|\n");
    for r in rows
        .iter()
        .filter(|r| r.experiment == e.id())
        .filter(|r| e != Experiment::E5 || crate::nic_report::e5_in_table(r))
    {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {}/{} | {} |",
            r.config,
            r.param.label,
            r.metric,
            num(r.median()),
            num(r.min()),
            num(r.max()),
            r.samples.len(),
            r.planned,
            r.unit
        );
    }
    out
}

/// The paper's own figure for comparison, per experiment.
fn paper(e: Experiment) -> &'static str {
    match e {
        Experiment::E1 => {
            "S0 (Hnet, UML on GbE), fig. 1 and 6–9: original UML 31 MB/s vs host 117 MB/s; Hnet \
             alone 71 MB/s receive; **Hnet + SBW reached the host's bandwidth (117 MB/s)**; DMHU \
             (no guest copy) +18% at 512-byte buffers."
        }
        Experiment::E2 => {
            "S0 tables 1, 3, 4, 6: burst ping-pong RTT **146 µs host**, 427 µs original UML, 264 \
             Hnet, ~226 with SBW, **205 µs best** (with DMHU). Table 4, over 200,000 round trips: \
             polling span 0 → **199,983** notifications (292 µs), 1 jiffy → **565** (226 µs), 10 \
             jiffies → **1** (228 µs); one sleep costs ~32 µs."
        }
        Experiment::E3 => {
            "S0 table 5: FLOPS process alone **554 MFlops**; beside a 10 MB/s transfer, original \
             UML leaves **380**, SBW 0/1/10 jiffies leave **491**/489/475 — 1 jiffy keeps nearly \
             all of the gain for little CPU."
        }
        Experiment::E4 => {
            "S1 figs. 3, 5 (KVM, emulated PCnet32, iperf): send 58 → 318 Mbit/s, **5.5× at 30 \
             batched operations**; receive 127 → 303 Mbit/s (2.4×) at 6; RTT did **not** grow \
             with the batch size (the idle flush sends the queue as soon as the guest waits)."
        }
        Experiment::E5 => {
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
        Experiment::E6 => {
            "S3 (modules run next to the data): a 2,322-byte HTTP response served faster by \
             a module than by the application's own read/write path, and header + file \
             through a module at the application's sendfile throughput. Goals here: module \
             start p50 ≤ 10 µs (server means per response: `module_start` makes the \
             instance, `module_init` runs init, `module_write` is the data: header + \
             file; `bind_p50`: the program's bind call, queued on the ring without \
             waiting, naming the file it registered once), module \
             throughput ≥ 0.95× ferry sendfile (`x_sendfile`), and at 2,322 B module latency \
             below ferry read/write (`x_rw_latency` < 1). `module` binds per response, as \
             S3's server did; `module kept` binds once per kept-alive connection (http_file's \
             `lines` mode: the program sends the module each request line, S3's proposed \
             \"pass arguments directly\"), so no instance is made per response. Every way \
             opens its file once (read/write: `pread` at offset 0, sendfile: with an \
             offset, modules: `register_file`), so none pays an open/close per response."
        }
        Experiment::E7 => {
            "S4 (protocol and NIC servers on a multiprocessor): two processes sending 1024-byte \
             messages; the proposed arrangement (two protocol servers, two NIC paths) took \
             **15–27% less time** per send+recv than the conventional one (one server, one \
             path), and spreading the servers over cores took **0.55×** the time of running \
             everything on one core. Here a \"path\" is a veth pair to the remote (the second \
             process talks to the remote's address on its own pair), and wake-ups per request \
             count the hand-offs between cores that needed a wake."
        }
        Experiment::R1 => {
            "No paper figure: real, unmodified clients, native vs ferry (socket and nic \
             mode) vs peers."
        }
    }
}

fn method(r: &Results) -> String {
    format!(
        "Every configuration runs the **same client binary** against servers in a \"remote\" \
         network namespace joined to the host by a veth pair (MTU {mtu}). Each case (a \
         configuration at a parameter value) gets one warm-up run, then {runs} measured runs; \
         within each repetition the cases alternate (A B C … A B C …), so slow drifts of this \
         shared 2-vCPU machine hit every configuration alike. Tables give the median with \
         min/max over the successful runs; `runs` is successful/planned. A run is killed after \
         its duration plus a margin; a case whose warm-up fails is not repeated, and a client \
         program whose warm-ups time out twice under a configuration is not tried again \
         under it in that experiment (the Failures section says so). ferry's counters come from `ferry run --stats-json` of the same \
         run; wakes = server wake-ups sent + doorbells rung + the program's sleeps in the \
         kernel on the pair receive path (each ends in a kernel wake-up), summed over \
         channels, divided by \
         the messages sockperf received over the whole run (its warm-up included, as the \
         counters are). E3 runs each whole configuration (client, burner, ferry's server, \
         slirp4netns, pasta) on CPU 0 with the remote's iperf3 server on CPU 1. Nothing is \
         asserted about times.{quick}",
        mtu = r.veth_mtu,
        runs = r.runs,
        quick = if r.quick {
            " **This was a `--quick` run: short runs and few points; indicative only.**"
        } else {
            ""
        }
    )
}

fn find<'a>(rows: &'a [Row], e: &str, config: &str, param: &str, metric: &str) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.experiment == e && r.config == config && r.param.label == param && r.metric == metric
    })
}

/// Headline ratios: ferry against native, slirp4netns and pasta, for throughput and RTT.
fn headlines(rows: &[Row]) -> String {
    // (label, experiment, metric, param, ferry's config name, param of the others)
    let mut picks: Vec<(String, &str, String, String, &str, String)> = Vec::new();
    let e1_sizes: Vec<String> = rows
        .iter()
        .filter(|r| r.experiment == "E1" && r.config == "native")
        .map(|r| r.param.label.clone())
        .collect();
    for size in ["64", "4K", "64K", "256K"] {
        if e1_sizes.iter().any(|s| s == size) {
            picks.push((
                format!("E1 bandwidth, {size} buffers (Gbit/s)"),
                "E1",
                "bandwidth".into(),
                size.into(),
                "ferry",
                size.into(),
            ));
        }
    }
    if rows.iter().any(|r| r.experiment == "E2") {
        picks.push((
            "E2 RTT p50, ferry at default spin 200us (µs)".into(),
            "E2",
            "rtt_p50".into(),
            "200us".into(),
            "ferry-spin200us",
            "-".into(),
        ));
    }
    for r in rows
        .iter()
        .filter(|r| r.experiment == "R1" && r.config == "native")
    {
        picks.push((
            format!("R1 {} ({})", r.metric, r.unit),
            "R1",
            r.metric.clone(),
            r.param.label.clone(),
            "ferry",
            r.param.label.clone(),
        ));
    }
    if picks.is_empty() {
        return "No experiment of this run has a ferry-vs-peers headline (E1, E2, R1); see \
                the sections below.\n"
            .into();
    }
    let mut out = String::from(
        "| measure | ferry | native | slirp4netns | pasta | ferry/native | ferry/slirp4netns | ferry/pasta |\n|---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for (label, e, metric, fparam, fconfig, oparam) in picks {
        let ferry = find(rows, e, fconfig, &fparam, &metric).and_then(Row::median);
        let other = |c: &str| find(rows, e, c, &oparam, &metric).and_then(Row::median);
        let (n, s, p) = (other("native"), other("slirp4netns"), other("pasta"));
        let ratio = |o: Option<f64>| match (ferry, o) {
            (Some(f), Some(o)) if o != 0.0 => format!("{:.2}×", f / o),
            _ => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} | {} | {} | {} | {} |",
            num(ferry),
            num(n),
            num(s),
            num(p),
            ratio(n),
            ratio(s),
            ratio(p)
        );
    }
    out.push_str(
        "\nRatios are of medians. For throughput, above 1× means ferry is faster; for times \
         in µs (RTT, CPU per request), above 1× means ferry is slower or costs more. \
         \"failed\" means no run succeeded (see Failures).\n",
    );
    out
}

/// `report.md`.
pub fn markdown(r: &Results) -> String {
    let m = &r.machine;
    let mut out = format!(
        "# ferry bench — results\n\nDate: {}  \nCommand: `{}`  \nWall time: {:.0} s\n\n## Machine\n\n\
         - kernel: {}\n- CPU: {} ({} online CPUs)\n- ferry measured: {}\n- MTU per configuration:\n",
        m.date, r.command, r.seconds, m.kernel, m.cpu, m.cores, r.build
    );
    for ready in &r.ready {
        let _ = writeln!(out, "  - {}: {}", ready.config.name, ready.mtu);
    }
    let _ = write!(
        out,
        "\n## Method\n\n{}\n\n## Headline ratios\n\n{}\n",
        method(r),
        headlines(&r.rows)
    );
    for &e in &r.experiments {
        let summary = match e {
            Experiment::E5 => crate::nic_report::e5_summary(&r.rows),
            Experiment::R1 => crate::nic_report::r1_nic_goals(&r.rows),
            _ => String::new(),
        };
        let _ = write!(
            out,
            "## {} — {}\n\n{summary}{}\n![{}]({}.png)\n\n**Paper, for comparison:** {}\n\n",
            e.id(),
            e.title(),
            md_table(e, &r.rows),
            e.id(),
            e.id().to_lowercase(),
            paper(e)
        );
    }
    out.push_str("## Skipped configurations\n\n");
    if r.skipped.is_empty() {
        out.push_str("None: every configuration passed its smoke check.\n");
    }
    for s in &r.skipped {
        let _ = writeln!(out, "- **{}**: {} — fix: `{}`", s.name, s.reason, s.fix);
    }
    out.push_str("\n## Failures\n\n");
    let mut any = false;
    let mut seen = std::collections::BTreeSet::new();
    for row in r.rows.iter().filter(|x| x.samples.len() < x.planned) {
        let key = (
            row.experiment.clone(),
            row.config.clone(),
            row.param.label.clone(),
        );
        if !seen.insert(key) {
            continue;
        }
        any = true;
        let _ = writeln!(
            out,
            "- {} {} {}: {}/{} runs succeeded — {}",
            row.experiment,
            row.config,
            row.param.label,
            row.samples.len(),
            row.planned,
            row.failures.join("; ")
        );
    }
    if !any {
        out.push_str("None.\n");
    }
    out
}

/// Writes `results.csv` and `report.md` into `dir`.
pub fn write(dir: &Path, r: &Results) -> std::io::Result<()> {
    std::fs::write(dir.join("results.csv"), csv(&r.rows))?;
    std::fs::write(dir.join("report.md"), markdown(r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Param;

    fn row(config: &str, samples: Vec<f64>) -> Row {
        Row {
            experiment: "E1".into(),
            config: config.into(),
            param: Param::new("64K", 65536.0),
            metric: "bandwidth".into(),
            unit: "Gbit/s".into(),
            samples,
            planned: 2,
            failures: vec!["warm-up timed out after 9 s".into()],
        }
    }

    #[test]
    fn csv_has_header_and_empty_fields_for_failures() {
        let c = csv(&[row("native", vec![2.0, 4.0]), row("ferry, odd", vec![])]);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(
            lines[0],
            "experiment,config,param,metric,unit,median,min,max,runs"
        );
        assert_eq!(lines[1], "E1,native,64K,bandwidth,Gbit/s,3,2,4,2");
        assert_eq!(lines[2], "E1,\"ferry, odd\",64K,bandwidth,Gbit/s,,,,0");
    }

    #[test]
    fn headline_ratio() {
        let rows = [row("native", vec![4.0]), row("ferry", vec![2.0])];
        let h = headlines(&rows);
        assert!(
            h.contains("| E1 bandwidth, 64K buffers (Gbit/s) | 2.00 | 4.00 |"),
            "{h}"
        );
        assert!(h.contains("0.50×"), "{h}");
        assert!(
            table(Experiment::E1, &rows).contains("failed")
                || table(Experiment::E1, &rows).contains("2.00")
        );
    }
}
