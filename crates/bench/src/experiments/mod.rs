//! The experiments of `docs/BENCHMARKS.md`, one file each behind the [`Experiment`]
//! trait: its cases (which configurations, which parameter values, which client
//! command, which metrics), the rows derived from what was measured, its part of the
//! report and its figure. E1 bandwidth vs buffer size, E2 ping-pong RTT and wakes per
//! round trip vs spin span, E3 CPU interference, E4 batching, E5 nic mode's per-packet
//! overhead by stage (and its MTU, and 2 NIC servers vs 1), E6 file → socket
//! (read/write vs sendfile vs a module), E7 distribution over several protocol servers
//! and paths, E8 VM guests (ferry vm against passt, QEMU user and vhost-net), R1 real
//! clients (nic mode among the configurations), R2 short connections, CPU and system
//! calls per request, start-up, C1 containers (ferry as Docker's runtime against runc,
//! slirp4netns and `ferry run`). Every case of an
//! experiment runs the same client binary. The harness, the report and the plots know
//! an experiment only through the trait: [`ALL`] lists them, and each is given only its
//! own rows.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{Config, RunOut};
use crate::exec::ExecError;
use crate::parse;
use crate::plan::{self, Bench, Case, Extract, Row};
use crate::plot::Area;
use crate::topology::{REDIS_PORT, SOCKPERF_PORT, Testbed};

pub mod c1;
pub mod e1;
pub mod e2;
pub mod e3;
pub mod e4;
pub mod e5;
pub mod e6;
pub mod e7;
pub mod e8;
pub mod r1;
pub mod r2;

pub use c1::C1;
pub use e1::E1;
pub use e2::E2;
pub use e3::E3;
pub use e4::E4;
pub use e5::E5;
pub use e6::E6;
pub use e7::E7;
pub use e8::E8;
pub use r1::R1;
pub use r2::R2;

/// One experiment: what it measures, what it derives, how it is reported and drawn.
/// Every method that takes rows is given the experiment's own rows only.
pub trait Experiment: std::fmt::Debug + Sync {
    /// "E1", …: its name on the command line, in `results.csv`, the report and the
    /// figure's file name.
    fn id(&self) -> &'static str;

    /// One-line title.
    fn title(&self) -> &'static str;

    /// The metric a case that never succeeded is reported under.
    fn main_metric(&self) -> (&'static str, &'static str);

    /// What must be in place before its cases run (files, a server in the remote).
    fn prepare(&self, _s: &Settings, _bed: &mut Testbed) -> Result<(), crate::Error> {
        Ok(())
    }

    /// Its cases, configurations alternating fastest.
    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case>;

    /// Rows derived from the measured ones (ratios, shares), added after them.
    fn derived(&self, _rows: &[Row]) -> Vec<Row> {
        Vec::new()
    }

    /// Measures `cases` ([`plan::measure`]) and adds the [`derived`](Self::derived) rows.
    fn run(&self, bench: &mut Bench<'_>, cases: &[Case]) -> Result<Vec<Row>, ExecError> {
        let mut rows = plan::measure(bench, self.id(), cases, self.main_metric())?;
        let derived = self.derived(&rows);
        rows.extend(derived);
        Ok(rows)
    }

    /// The paper's own figure, for comparison (the report's section ends with it).
    fn paper(&self) -> &'static str;

    /// What its report section says before the table (empty: nothing).
    fn summary(&self, _rows: &[Row]) -> String {
        String::new()
    }

    /// Whether the report's table shows `row` (the rest stay in `results.csv`).
    fn in_table(&self, _row: &Row) -> bool {
        true
    }

    /// Its lines of the report's headline ratios (ferry against native and the peers).
    fn headlines(&self, _rows: &[Row]) -> Vec<Headline> {
        Vec::new()
    }

    /// Its figure's size in pixels.
    fn plot_size(&self) -> (u32, u32);

    /// Draws its figure.
    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String>;
}

/// One line of the report's headline ratios: ferry's median against the same metric of
/// native, slirp4netns and pasta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Headline {
    /// What the line says, with its unit.
    pub label: String,
    /// The metric.
    pub metric: String,
    /// ferry's configuration and parameter.
    pub ferry: (&'static str, String),
    /// The others' parameter.
    pub others: String,
}

/// Every experiment available, in order.
pub static ALL: [&dyn Experiment; 11] = [&E1, &E2, &E3, &E4, &E5, &E6, &E7, &E8, &R1, &R2, &C1];

/// Parses "E1" … "R2" (any case).
pub fn parse(s: &str) -> Result<&'static dyn Experiment, String> {
    let up = s.to_ascii_uppercase();
    ALL.iter().copied().find(|e| e.id() == up).ok_or_else(|| {
        format!("unknown experiment `{s}` (E1, E2, E3, E4, E5, E6, E7, E8, R1, R2, C1)")
    })
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
    /// R2's short-connection client and server (`ferry-shortconn`, compiled by R2).
    pub shortconn: PathBuf,
    /// Where E6's files are (see [`E6_SIZES`]).
    pub e6_dir: PathBuf,
    /// R1 also runs `ferry-unconfined` (`--unconfined`).
    pub unconfined_too: bool,
    /// R1, R2 and E2 also run ferry from this other build (`ferry-base`; R1 and R2 its
    /// hand-off too, `ferry-base-handoff`; E8 its `ferry vm`, `ferry-vm-base`),
    /// alternating with the one measured: a before/after comparison in one run.
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
        iperf3_to(&self.remote, port, secs, extra)
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

/// An iperf3 client of `host:port` for `secs`, JSON out (C1 gives its own `host`).
fn iperf3_to(host: &str, port: u16, secs: u32, extra: &[&str]) -> Vec<String> {
    let mut v = strings(&["iperf3", "-c", host, "-p", &port.to_string()]);
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

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| (*x).to_owned()).collect()
}

/// `redis-benchmark` against the remote's redis: `tests` (e.g. `get,set`), `n` requests,
/// `pipeline` deep, CSV out (R1, R2).
fn redis_benchmark(s: &Settings, tests: &str, n: &str, pipeline: &str) -> Vec<String> {
    redis_benchmark_to(&s.remote, REDIS_PORT, tests, n, pipeline)
}

/// [`redis_benchmark`] against `host:port` (C1 runs a redis of its own).
fn redis_benchmark_to(host: &str, port: u16, tests: &str, n: &str, pipeline: &str) -> Vec<String> {
    let port = port.to_string();
    strings(&[
        "redis-benchmark",
        "-h",
        host,
        "-p",
        &port,
        "-t",
        tests,
        "-n",
        n,
        "-P",
        pipeline,
        "--csv",
        "-q",
    ])
}

/// The hand-off (`--handoff` for the remote: TCP to it gets the host's own socket, at
/// the kernel's speed), inserted at `at` (R1, R2); with `--baseline`, the baseline
/// build's hand-off (`ferry-base-handoff`) right after it.
fn insert_handoff(configs: &mut Vec<Config>, at: usize, s: &Settings) {
    let handoff = format!("--handoff={}", s.remote);
    if let Some(base) = &s.baseline {
        let c = Config::ferry_build_args("ferry-base-handoff", base, &[&handoff]);
        configs.insert(at, c);
    }
    configs.insert(at, Config::ferry_args("ferry-handoff", &[&handoff]));
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

fn iperf_extract() -> Extract {
    Box::new(|r: &RunOut| {
        let bps = parse::iperf3_bps(&r.outcome.stdout)?;
        Ok(vec![("bandwidth", "Gbit/s", bps / 1e9)])
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_back_in_any_case() {
        for e in ALL {
            assert_eq!(parse(&e.id().to_lowercase()).unwrap().id(), e.id());
            assert!(!e.title().is_empty() && !e.paper().is_empty());
        }
        assert!(parse("E9").unwrap_err().contains("unknown experiment `E9`"));
    }
}
