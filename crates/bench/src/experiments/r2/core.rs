//! R2's pure cores: who made the system calls of a traced run, percentiles of start-up
//! times, CPU per request, and the report's table of medians with ratios to native.

use std::fmt::Write as _;
use std::time::Duration;

use crate::plan::{Row, median};

/// System calls of one traced run, by who made them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// The client program (its command name).
    pub program: u64,
    /// ferry's protocol and NIC servers (threads `ferry-*` but the sandbox's init, the
    /// signal and admin threads).
    pub servers: u64,
    /// The peer's process: pasta (any build), slirp4netns.
    pub peer: u64,
    /// Everything else: wrappers (runuser, unshare, sh, perf), ferry's main thread and
    /// the sandbox's init — mostly start-up and teardown.
    pub other: u64,
}

impl Split {
    /// Program, servers and peer: the work of the run (not its wrappers).
    pub fn work(&self) -> u64 {
        self.program + self.servers + self.peer
    }
}

/// ferry's threads that are not its servers.
const FERRY_NOT_SERVERS: [&str; 3] = ["ferry-init", "ferry-signals", "ferry-admin"];

/// Sorts per-command counts (`perf report --sort comm`) into [`Split`]. `program` is
/// the client's file name; the kernel keeps 15 bytes of a command name.
pub fn split_syscalls(counts: &[(String, u64)], program: &str) -> Split {
    let program: String = program.chars().take(15).collect();
    let mut s = Split::default();
    for (comm, n) in counts {
        let slot = if *comm == program {
            &mut s.program
        } else if comm.starts_with("ferry-") && !FERRY_NOT_SERVERS.contains(&comm.as_str()) {
            &mut s.servers
        } else if comm.starts_with("pasta") || comm.starts_with("passt") || comm == "slirp4netns" {
            &mut s.peer
        } else {
            &mut s.other
        };
        *slot += n;
    }
    s
}

/// The nearest-rank percentile `p` (0–100) of `v`; None when `v` is empty.
pub fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

/// µs of `cpu` per request, for `requests` requests.
pub fn us_per(cpu: Option<Duration>, requests: f64, what: &str) -> Result<f64, String> {
    let cpu = cpu.ok_or_else(|| format!("no CPU time of {what}"))?;
    if requests <= 0.0 || !requests.is_finite() {
        return Err(format!("no requests to divide {what}'s CPU time by"));
    }
    Ok(cpu.as_secs_f64() * 1e6 / requests)
}

/// Markdown: every (test, metric) measured, one column per configuration: the median
/// and, where native measured it too, its ratio to native's median (`×`).
pub fn ratio_table(rows: &[Row]) -> String {
    let mut configs: Vec<&str> = Vec::new();
    let mut groups: Vec<(&str, &str, &str)> = Vec::new();
    for r in rows {
        if !configs.contains(&r.config.as_str()) {
            configs.push(&r.config);
        }
        let g = (r.param.label.as_str(), r.metric.as_str(), r.unit.as_str());
        if r.median().is_some() && !groups.contains(&g) {
            groups.push(g);
        }
    }
    let mut out = format!(
        "| test | metric | unit | {} |\n|---|---|---|",
        configs.join(" | ")
    );
    out.push_str(&"--:|".repeat(configs.len()));
    out.push('\n');
    for (test, metric, unit) in groups {
        let native = median(rows, "native", test, metric);
        let _ = write!(out, "| {test} | {metric} | {unit} |");
        for c in &configs {
            let cell = match (median(rows, c, test, metric), native) {
                (Some(v), _) if *c == "native" => fmt(v),
                (Some(v), Some(n)) if n != 0.0 => format!("{} ({:.2}×)", fmt(v), v / n),
                (Some(v), _) => fmt(v),
                (None, _) => "–".into(),
            };
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}

/// A figure with 3 significant digits at most (no exponent).
fn fmt(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Param;

    fn counts(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect()
    }

    #[test]
    fn syscalls_are_split_by_who_made_them() {
        let c = counts(&[
            ("ferry-shortconn", 5000),
            ("ferry-servers", 3000),
            ("ferry-srv-1", 1000),
            ("ferry-nic", 700),
            ("ferry-init", 40),
            ("ferry-signals", 3),
            ("ferry", 900),
            ("runuser", 120),
            ("perf", 10),
        ]);
        let s = split_syscalls(&c, "ferry-shortconn");
        assert_eq!(
            s,
            Split {
                program: 5000,
                servers: 4700,
                peer: 0,
                other: 1073
            }
        );
        assert_eq!(s.work(), 9700);
        // The kernel's 15-byte command name still matches the program.
        let c = counts(&[
            ("redis-benchmark", 10),
            ("pasta.avx2", 7),
            ("slirp4netns", 2),
        ]);
        let s = split_syscalls(&c, "redis-benchmark-longer-name");
        assert_eq!((s.program, s.peer, s.other), (10, 9, 0));
        let s = split_syscalls(&c, "curl");
        assert_eq!((s.program, s.peer, s.other), (0, 9, 10));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 90.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn cpu_per_request() {
        let ms = Some(Duration::from_millis(30));
        assert_eq!(us_per(ms, 1000.0, "x"), Ok(30.0));
        assert!(
            us_per(None, 1000.0, "the client")
                .unwrap_err()
                .contains("the client")
        );
        assert!(us_per(ms, 0.0, "x").is_err());
    }

    fn row(config: &str, test: &str, metric: &str, samples: &[f64]) -> Row {
        Row {
            experiment: "R2".into(),
            config: config.into(),
            param: Param::new(test, 0.0),
            metric: metric.into(),
            unit: "conn/s".into(),
            samples: samples.to_vec(),
            planned: samples.len(),
            failures: Vec::new(),
        }
    }

    #[test]
    fn table_has_medians_and_ratios_to_native() {
        let rows = vec![
            row("native", "short", "rate", &[10000.0, 12000.0, 11000.0]),
            row("ferry", "short", "rate", &[5000.0, 5500.0, 6000.0]),
            row("pasta", "short", "rate", &[]),
            row("ferry", "only ferry", "rate", &[1.0]),
        ];
        let t = ratio_table(&rows);
        assert!(
            t.starts_with("| test | metric | unit | native | ferry | pasta |\n"),
            "{t}"
        );
        assert!(
            t.contains("| short | rate | conn/s | 11000 | 5500 (0.50×) | – |"),
            "{t}"
        );
        // What native did not measure (ferry's servers' calls) has its value, no ratio.
        assert!(
            t.contains("| only ferry | rate | conn/s | – | 1.00 | – |"),
            "{t}"
        );
        // A metric nobody measured has no line.
        let none = ratio_table(&[row("native", "dead", "rate", &[])]);
        assert!(!none.contains("| dead |"), "{none}");
    }
}
