//! C1's pure cores: where a container's CPU time is accounted (its cgroup), start-up
//! statistics, the derived ratios and the issue's goals, judged from the rows.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::plan::{Param, Row, median};

/// The docker container run by `ferry oci` (default options).
pub const FERRY: &str = "docker-ferry";
/// The start-up test's `docker run --rm` under the baseline build's `ferry-oci`
/// (`--baseline`; runtime `ferry-base`).
pub const FERRY_BASE: &str = "docker-ferry-base";
/// The docker container run by runc on the engine's default bridge.
pub const BRIDGE: &str = "docker-bridge";
/// The docker container on the host's network (`--network host`, runc).
pub const HOST: &str = "docker-host";
/// Rootful Podman with `--network slirp4netns` (user-mode networking).
pub const SLIRP: &str = "podman-slirp4netns";
/// Rootful Podman with `--network pasta` (or, for a Podman without it, in a namespace
/// pasta serves as Podman 4.4 makes it).
pub const PASTA: &str = "podman-pasta";
/// `ferry run` on the host, outside any container.
pub const FERRY_RUN: &str = "ferry";
/// The start-up test's label.
pub const STARTUP: &str = "start-up";

/// The file holding the cumulative CPU time of the cgroup a process is in, from its
/// `/proc/PID/cgroup`: cgroup v1's `cpuacct.usage` (ns) where the cpuacct controller
/// is mounted, else cgroup v2's `cpu.stat` (`usage_usec`). `v1_root` and `v2_root`
/// are where the hierarchies are mounted.
pub fn cgroup_cpu_file(proc_cgroup: &str, v1_root: &str, v2_root: &str) -> Option<CpuFile> {
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        if ctrls.split(',').any(|c| c == "cpuacct") {
            let dir = format!("{v1_root}/{ctrls}{path}");
            return Some(CpuFile::V1(PathBuf::from(dir).join("cpuacct.usage")));
        }
        if ctrls.is_empty() {
            v2 = Some(CpuFile::V2(
                PathBuf::from(format!("{v2_root}{path}")).join("cpu.stat"),
            ));
        }
    }
    v2
}

/// Where a cgroup's CPU time is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuFile {
    /// `cpuacct.usage`: nanoseconds.
    V1(PathBuf),
    /// `cpu.stat`: its `usage_usec` line.
    V2(PathBuf),
}

impl CpuFile {
    /// Nanoseconds of CPU in the file's text.
    pub fn parse_ns(&self, text: &str) -> Option<u64> {
        match self {
            CpuFile::V1(_) => text.trim().parse().ok(),
            CpuFile::V2(_) => text
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|us| us * 1000),
        }
    }

    /// The file.
    pub fn path(&self) -> &std::path::Path {
        match self {
            CpuFile::V1(p) | CpuFile::V2(p) => p,
        }
    }
}

/// p50 (nearest rank), min and max of start-up times.
pub fn startup_stats(ms: &[f64]) -> Option<(f64, f64, f64)> {
    let p50 = super::super::r2::percentile(ms, 50.0)?;
    let min = ms.iter().copied().reduce(f64::min)?;
    let max = ms.iter().copied().reduce(f64::max)?;
    Some((p50, min, max))
}

fn ratio_row(of: &Row, metric: &str, value: f64) -> Row {
    Row {
        experiment: of.experiment.clone(),
        config: of.config.clone(),
        param: of.param.clone(),
        metric: metric.to_owned(),
        unit: "×".to_owned(),
        samples: vec![value],
        planned: 1,
        failures: Vec::new(),
    }
}

/// The ratios the goals are about, as rows of one sample (ratios of medians): every
/// bandwidth against podman-slirp4netns's, every CPU per request against
/// docker-bridge's, docker-ferry's rate and CPU per request against `ferry run`'s,
/// and the start-up time ferry (and the baseline build's, `--baseline`) adds to runc's (per round:
/// p50 minus p50).
pub fn derived(rows: &[Row]) -> Vec<Row> {
    let mut out = Vec::new();
    for r in rows {
        let (Some(v), test) = (r.median(), r.param.label.as_str()) else {
            continue;
        };
        let against = |config: &str| median(rows, config, test, &r.metric).filter(|b| *b > 0.0);
        if r.metric == "bandwidth"
            && r.config != SLIRP
            && let Some(b) = against(SLIRP)
        {
            out.push(ratio_row(r, "bandwidth vs slirp4netns", v / b));
        }
        if r.metric == "CPU/req"
            && r.config != BRIDGE
            && let Some(b) = against(BRIDGE)
        {
            out.push(ratio_row(r, "CPU/req vs bridge", v / b));
        }
        if r.config == FERRY
            && (r.metric == "rate" || r.metric == "CPU/req" || r.metric == "bandwidth")
            && let Some(b) = against(FERRY_RUN)
        {
            out.push(ratio_row(r, &format!("{} vs ferry run", r.metric), v / b));
        }
        if (r.config == FERRY || r.config == FERRY_BASE) && test == STARTUP && r.metric == "p50" {
            let runc = rows
                .iter()
                .find(|x| x.config == BRIDGE && x.param.label == STARTUP && x.metric == "p50");
            if let Some(runc) = runc {
                let added: Vec<f64> = r
                    .samples
                    .iter()
                    .zip(&runc.samples)
                    .map(|(f, c)| f - c)
                    .collect();
                out.push(Row {
                    metric: "added p50".into(),
                    unit: "ms".into(),
                    planned: r.planned,
                    samples: added,
                    ..r.clone()
                });
            }
        }
    }
    out
}

/// One goal of the issue: what it asks, the figure measured, whether it is met.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    /// The goal, in words.
    pub what: String,
    /// The figure (None: not measured).
    pub value: Option<f64>,
    /// The figure's unit.
    pub unit: &'static str,
    /// Met when the figure is at least (true) or at most (false) `bound`.
    pub at_least: bool,
    /// The bound.
    pub bound: f64,
}

impl Goal {
    /// "met", "missed" or "not measured".
    pub fn verdict(&self) -> &'static str {
        match self.value {
            None => "not measured",
            Some(v)
                if (self.at_least && v >= self.bound) || (!self.at_least && v <= self.bound) =>
            {
                "met"
            }
            Some(_) => "missed",
        }
    }
}

/// The issue's goals, judged from C1's rows (derived rows included).
pub fn goals(rows: &[Row]) -> Vec<Goal> {
    let get = |test: &str, metric: &str| median(rows, FERRY, test, metric);
    let goal = |what: &str, value, unit, at_least, bound| Goal {
        what: what.to_owned(),
        value,
        unit,
        at_least,
        bound,
    };
    let mut g = Vec::new();
    for test in [UP, DOWN] {
        g.push(goal(
            &format!("{test}: ferry ≥ 3× slirp4netns"),
            get(test, "bandwidth vs slirp4netns"),
            "×",
            true,
            3.0,
        ));
    }
    g.push(goal(
        &format!("{REDIS}: CPU/req ≤ 1.2× the bridge's"),
        get(REDIS, "CPU/req vs bridge"),
        "×",
        false,
        1.2,
    ));
    g.push(goal(
        &format!("{REDIS}: rate within 5% of ferry run (≥ 0.95×)"),
        get(REDIS, "rate vs ferry run"),
        "×",
        true,
        0.95,
    ));
    g.push(goal(
        &format!("{REDIS}: CPU/req within 5% of ferry run (≤ 1.05×)"),
        get(REDIS, "CPU/req vs ferry run"),
        "×",
        false,
        1.05,
    ));
    for test in [UP, DOWN] {
        g.push(goal(
            &format!("{test}: within 5% of ferry run (≥ 0.95×)"),
            get(test, "bandwidth vs ferry run"),
            "×",
            true,
            0.95,
        ));
    }
    g.push(goal(
        "start-up: p50 of `docker run --rm IMAGE true` ≤ 30 ms added to runc's",
        get(STARTUP, "added p50"),
        "ms",
        false,
        30.0,
    ));
    g
}

/// The goals as a Markdown table.
pub fn goals_table(goals: &[Goal]) -> String {
    let mut out = String::from("| goal | measured | verdict |\n|---|--:|---|\n");
    for g in goals {
        let v = g
            .value
            .map(|v| format!("{v:.2} {}", g.unit))
            .unwrap_or_else(|| "–".into());
        let _ = writeln!(out, "| {} | {v} | {} |", g.what, g.verdict());
    }
    out
}

/// iperf3 from the container to the remote.
pub const UP: &str = "iperf3 up";
/// iperf3 -R: the remote sends.
pub const DOWN: &str = "iperf3 -R down";
/// redis-benchmark GET, no pipelining.
pub const REDIS: &str = "redis GET -P 1";
/// wrk against nginx in the container, published with `-p`.
pub const WRK: &str = "wrk nginx -p";

/// `argv` as one `sh` command line, every word single-quoted.
pub fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A row of C1 (for tests and the start-up loop).
pub fn row(config: &str, test: &str, metric: &str, unit: &str, samples: Vec<f64>) -> Row {
    Row {
        experiment: "C1".into(),
        config: config.into(),
        param: Param::new(test, 0.0),
        metric: metric.into(),
        unit: unit.into(),
        planned: samples.len(),
        samples,
        failures: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v1_cpuacct_and_v2_files() {
        let v1 = "3:cpuset:/docker/ab\n2:cpuacct:/docker/ab\n1:cpu:/docker/ab\n";
        assert_eq!(
            cgroup_cpu_file(v1, "/sys/fs/cgroup", "/sys/fs/cgroup/unified"),
            Some(CpuFile::V1(
                "/sys/fs/cgroup/cpuacct/docker/ab/cpuacct.usage".into()
            ))
        );
        // Co-mounted controllers name their directory together.
        let both = "4:cpu,cpuacct:/libpod_parent/libpod-x\n0::/\n";
        assert_eq!(
            cgroup_cpu_file(both, "/c", "/u"),
            Some(CpuFile::V1(
                "/c/cpu,cpuacct/libpod_parent/libpod-x/cpuacct.usage".into()
            ))
        );
        let v2 = "0::/system.slice/docker-ab.scope\n";
        let f = cgroup_cpu_file(v2, "/c", "/sys/fs/cgroup").unwrap();
        assert_eq!(
            f,
            CpuFile::V2("/sys/fs/cgroup/system.slice/docker-ab.scope/cpu.stat".into())
        );
        assert_eq!(
            f.parse_ns("usage_usec 1500\nuser_usec 1000\n"),
            Some(1_500_000)
        );
        assert_eq!(CpuFile::V1("x".into()).parse_ns("123456\n"), Some(123456));
        assert_eq!(f.parse_ns("nothing"), None);
        assert_eq!(cgroup_cpu_file("garbage", "/c", "/u"), None);
    }

    #[test]
    fn words_are_quoted_for_sh() {
        let argv = ["iperf3", "-c", "a b", "it's"].map(str::to_owned);
        assert_eq!(shell_words(&argv), r#"'iperf3' '-c' 'a b' 'it'\''s'"#);
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("printf '%s|' {}", shell_words(&argv))])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "iperf3|-c|a b|it's|");
    }

    #[test]
    fn startup_p50_min_max() {
        assert_eq!(
            startup_stats(&[30.0, 10.0, 20.0, 40.0]),
            Some((20.0, 10.0, 40.0))
        );
        assert_eq!(startup_stats(&[]), None);
    }

    #[test]
    fn ratios_against_slirp_bridge_and_ferry_run() {
        let rows = vec![
            row(FERRY, UP, "bandwidth", "Gbit/s", vec![9.0]),
            row(SLIRP, UP, "bandwidth", "Gbit/s", vec![3.0]),
            row(FERRY_RUN, UP, "bandwidth", "Gbit/s", vec![10.0]),
            row(FERRY, REDIS, "CPU/req", "us", vec![36.0]),
            row(BRIDGE, REDIS, "CPU/req", "us", vec![30.0]),
            row(FERRY_RUN, REDIS, "CPU/req", "us", vec![40.0]),
            row(FERRY, STARTUP, "p50", "ms", vec![520.0, 530.0]),
            row(BRIDGE, STARTUP, "p50", "ms", vec![500.0, 490.0]),
            row(FERRY_BASE, STARTUP, "p50", "ms", vec![540.0, 530.0]),
        ];
        let d = derived(&rows);
        let find = |c: &str, t: &str, m: &str| median(&d, c, t, m);
        assert_eq!(find(FERRY, UP, "bandwidth vs slirp4netns"), Some(3.0));
        assert_eq!(
            find(FERRY_RUN, UP, "bandwidth vs slirp4netns"),
            Some(10.0 / 3.0)
        );
        assert_eq!(find(SLIRP, UP, "bandwidth vs slirp4netns"), None);
        assert_eq!(find(FERRY, UP, "bandwidth vs ferry run"), Some(0.9));
        assert_eq!(find(FERRY, REDIS, "CPU/req vs bridge"), Some(1.2));
        assert_eq!(find(FERRY, REDIS, "CPU/req vs ferry run"), Some(0.9));
        assert_eq!(find(FERRY, STARTUP, "added p50"), Some(30.0));
        assert_eq!(find(FERRY_BASE, STARTUP, "added p50"), Some(40.0));
        let mut all = rows.clone();
        all.extend(d);
        let g = goals(&all);
        let verdict = |what: &str| {
            g.iter()
                .find(|x| x.what.starts_with(what))
                .map(|x| x.verdict())
        };
        assert_eq!(verdict("iperf3 up: ferry ≥ 3×"), Some("met"));
        assert_eq!(verdict("iperf3 -R down: ferry ≥ 3×"), Some("not measured"));
        assert_eq!(verdict("redis GET -P 1: CPU/req ≤ 1.2×"), Some("met"));
        assert_eq!(verdict("iperf3 up: within 5%"), Some("missed"));
        assert_eq!(verdict("start-up"), Some("met"));
        let t = goals_table(&g);
        assert!(
            t.contains("| iperf3 up: within 5% of ferry run (≥ 0.95×) | 0.90 × | missed |"),
            "{t}"
        );
    }
}
