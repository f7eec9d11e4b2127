//! What a run leaves behind: `results.csv`, the terminal table, and `report.md` (date,
//! machine, method, one section per experiment with its table, its plot and the paper's
//! own figures, headline ratios, skipped configurations and failed runs).

use std::fmt::Write as _;
use std::path::Path;

use crate::config::{Ready, Skipped};
use crate::experiments::Experiment;
use crate::plan::{Row, median};

/// One experiment that ran, with its rows.
#[derive(Debug)]
pub struct Section {
    /// The experiment.
    pub experiment: &'static dyn Experiment,
    /// Every (case, metric) of it, derived rows last.
    pub rows: Vec<Row>,
}

/// Everything the report is made from.
#[derive(Debug)]
pub struct Results {
    /// The experiments that ran, in order, with their rows.
    pub sections: Vec<Section>,
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
pub fn csv<'a>(rows: impl IntoIterator<Item = &'a Row>) -> String {
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
pub fn table(e: &dyn Experiment, rows: &[Row]) -> String {
    let mut out = format!("\n{} — {}\n", e.id(), e.title());
    let _ = writeln!(
        out,
        "{:<16} {:<18} {:<16} {:>10} {:>10} {:>10} {:>5}  unit",
        "config", "param", "metric", "median", "min", "max", "runs"
    );
    for r in rows {
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

fn md_table(e: &dyn Experiment, rows: &[Row]) -> String {
    let mut out = String::from("| config | param | metric | median | min | max | runs | unit |\n");
    out.push_str("|---|---|---|--:|--:|--:|--:|---|\n");
    for r in rows.iter().filter(|r| e.in_table(r)) {
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

fn method(r: &Results) -> String {
    format!(
        "Every configuration runs the **same client binary** against servers in a \"remote\" \
         network namespace joined to the host by a veth pair (MTU {mtu}). Each case (a \
         configuration at a parameter value) gets one warm-up run, then {runs} measured runs; \
         within each repetition the cases alternate, odd repetitions in reverse (A B C …, … C B \
         A), so slow drifts of this shared 2-vCPU machine hit every configuration alike and \
         no configuration always runs right after the same other one. Tables give the median with \
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

/// Headline ratios: ferry against native, slirp4netns and pasta, for throughput and RTT
/// (the lines each experiment names, [`Experiment::headlines`]).
fn headlines(sections: &[Section]) -> String {
    let lines: Vec<(&Section, crate::experiments::Headline)> = sections
        .iter()
        .flat_map(|s| {
            s.experiment
                .headlines(&s.rows)
                .into_iter()
                .map(move |h| (s, h))
        })
        .collect();
    if lines.is_empty() {
        return "No experiment of this run has a ferry-vs-peers headline (E1, E2, R1); see \
                the sections below.\n"
            .into();
    }
    let mut out = String::from(
        "| measure | ferry | native | slirp4netns | pasta | ferry/native | ferry/slirp4netns | ferry/pasta |\n|---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for (s, h) in lines {
        let (fconfig, fparam) = &h.ferry;
        let ferry = median(&s.rows, fconfig, fparam, &h.metric);
        let other = |c: &str| median(&s.rows, c, &h.others, &h.metric);
        let (n, sl, p) = (other("native"), other("slirp4netns"), other("pasta"));
        let ratio = |o: Option<f64>| match (ferry, o) {
            (Some(f), Some(o)) if o != 0.0 => format!("{:.2}×", f / o),
            _ => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            h.label,
            num(ferry),
            num(n),
            num(sl),
            num(p),
            ratio(n),
            ratio(sl),
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
        headlines(&r.sections)
    );
    for s in &r.sections {
        let e = s.experiment;
        let _ = write!(
            out,
            "## {} — {}\n\n{}{}\n![{}]({}.png)\n\n**Paper, for comparison:** {}\n\n",
            e.id(),
            e.title(),
            e.summary(&s.rows),
            md_table(e, &s.rows),
            e.id(),
            e.id().to_lowercase(),
            e.paper()
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
    let rows = r.sections.iter().flat_map(|s| &s.rows);
    for row in rows.filter(|x| x.samples.len() < x.planned) {
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
    let rows = r.sections.iter().flat_map(|s| &s.rows);
    std::fs::write(dir.join("results.csv"), csv(rows))?;
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
        let rows = vec![row("native", vec![4.0]), row("ferry", vec![2.0])];
        let sections = [Section {
            experiment: &crate::experiments::E1,
            rows: rows.clone(),
        }];
        let h = headlines(&sections);
        assert!(
            h.contains("| E1 bandwidth, 64K buffers (Gbit/s) | 2.00 | 4.00 |"),
            "{h}"
        );
        assert!(h.contains("0.50×"), "{h}");
        assert!(
            table(&crate::experiments::E1, &rows).contains("failed")
                || table(&crate::experiments::E1, &rows).contains("2.00")
        );
    }
}
