//! `ferry bench`: ferry's benchmark harness. It owns the benchmark topology (a "remote"
//! namespace over two veth pairs with iperf3, sockperf (TCP and UDP), redis and nginx
//! servers), the configurations that run the same client binary (native, ferry with its
//! knobs, ferry in nic mode, slirp4netns, Debian's pasta and the newest one built by
//! scripts/build-peers.sh) and their smoke checks, the experiments
//! of the team's BENCHMARKS.md (E1 bandwidth vs buffer size, E2 RTT and wakes vs spin
//! span, E3 CPU interference, E4 batching, E5 nic mode's per-packet overhead by stage,
//! its MTU and its NIC servers, E6 file → socket with data-path modules, E7 several
//! protocol servers and paths, E8 VM guests (scripts/guest-image.sh's, booted by the
//! `ferry-e8` helper), R1 real clients, nic mode among them, R2 short
//! connections, CPU and system calls per request, start-up, C1 containers (ferry as
//! Docker's runtime against runc, the host network, Podman's slirp4netns; its own
//! dockerd and Podman, on a bridge of its own); one file each behind
//! the [`Experiment`] trait), the method (warm-up, alternating
//! repetitions, medians with min/max, per-run timeouts, failures recorded and shown),
//! and the outputs: terminal table, `results.csv`, one PNG per experiment, `report.md`.
//!
//! It measures and reports; it never asserts a time. The `ferry-burner` binary (the
//! FLOPS process of E3) lives here too, and R2's C client (`c/shortconn.c`, compiled
//! when R2 runs). The CLI front end is `ferry bench` in
//! `crates/ferry`.
#![deny(unsafe_code)]

pub mod config;
pub mod exec;
pub mod experiments;
pub mod guest;
pub mod parse;
pub mod plan;
pub mod plot;
pub mod report;
pub mod soak;
pub mod topology;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use config::{Config, Env, Ready, Skipped};
use exec::{ExecError, Interrupt};
pub use experiments::Experiment;
use plan::Bench;
use report::{Machine, Results, Section};
use topology::{Testbed, TopologyError};

/// What to run and where to write.
#[derive(Clone, Debug)]
pub struct Options {
    /// Experiments, in order.
    pub experiments: Vec<&'static dyn Experiment>,
    /// Short runs and fewer points.
    pub quick: bool,
    /// Output directory (created).
    pub out: PathBuf,
    /// Measured repetitions per case.
    pub runs: usize,
    /// The ferry binary (`ferry-burner` is looked up next to it).
    pub ferry: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// R1 also runs ferry with `--unconfined` beside it (the cost of the servers'
    /// seccomp filter and dropped capabilities).
    pub unconfined_too: bool,
    /// R1, R2 and E2 also run ferry from another build (`ferry-base`; E8 its `ferry vm`,
    /// `ferry-vm-base`): before/after.
    pub baseline: Option<PathBuf>,
    /// The newest pasta (scripts/build-peers.sh), run as `pasta-2026` beside Debian's
    /// `pasta`; None: that configuration is skipped, and the report says how to build it.
    pub pasta_2026: Option<PathBuf>,
}

/// Why the harness stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The remote namespace needs root.
    #[error("needs root to create the remote namespace (veth); try `sudo ferry bench`")]
    NotRoot,
    /// The topology could not be built.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file or directory.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// A client could not be started at all.
    #[error(transparent)]
    Exec(ExecError),
    /// Ctrl-C or SIGTERM: everything was torn down (every process the harness started
    /// has exited and been reaped, the remote namespace is deleted); results so far are
    /// in the output directory.
    #[error("interrupted; the remote namespace and its servers were removed")]
    Interrupted,
    /// Processes the harness started were still running after the teardown and SIGKILL.
    #[error("processes {0:?} did not exit after SIGKILL")]
    Leftover(Vec<u32>),
}

impl From<ExecError> for Error {
    fn from(e: ExecError) -> Error {
        match e {
            ExecError::Interrupted => Error::Interrupted,
            e => Error::Exec(e),
        }
    }
}

/// What a finished run produced.
#[derive(Debug)]
pub struct Summary {
    /// Terminal tables, one per experiment.
    pub tables: String,
    /// The output directory.
    pub out: PathBuf,
    /// Configurations skipped.
    pub skipped: Vec<Skipped>,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Plots that could not be drawn, with why.
    pub plot_errors: Vec<String>,
}

pub(crate) fn output_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Output {
        path: path.to_owned(),
        source,
    }
}

/// Runs the experiments and writes every output. Prints progress and the smoke checks
/// on the terminal; the caller prints [`Summary::tables`].
///
/// When it returns (done, failed or [`Error::Interrupted`]) the teardown is complete:
/// the remote namespace is deleted and every process it started, and every orphan of
/// theirs, has exited and been reaped (the harness is their subreaper).
pub fn run(o: &Options) -> Result<Summary, Error> {
    if !ferry_sandbox::testbed::is_root() {
        return Err(Error::NotRoot);
    }
    if let Err(e) = exec::adopt_orphans() {
        println!("warning: cannot become the subreaper of the runs' processes: {e}");
    }
    let result = run_all(o);
    // The testbed is gone; what its runs and servers left behind is reaped here, so
    // "torn down" is true when the caller says it.
    let left = exec::reap_all(Duration::from_secs(5));
    match result {
        Err(Error::Interrupted) if !left.is_empty() => Err(Error::Leftover(left)),
        r => {
            if !left.is_empty() {
                println!("warning: processes {left:?} did not exit after SIGKILL");
            }
            r
        }
    }
}

fn run_all(o: &Options) -> Result<Summary, Error> {
    let start = Instant::now();
    std::fs::create_dir_all(&o.out).map_err(output_err(&o.out))?;
    let stop = Interrupt::new();
    // A second installation (another run in the same process) keeps the first handler.
    let _ = stop.install();
    let mut bed = Testbed::up()?;
    let runs_dir = bed.scratch().join("runs");
    std::fs::create_dir_all(&runs_dir).map_err(output_err(&runs_dir))?;
    // Other people may rebuild target/release while this runs: measure one fixed copy.
    let (ferry, build) = snapshot(&o.ferry, &bed.scratch().join("bin"))?;
    let env = Env {
        ferry,
        runs_dir,
        stop: stop.clone(),
    };
    let remote = bed.remote_ip().to_string();
    println!(
        "remote: namespace {} at {remote} (host side {}), veth MTU {}; servers: iperf3, sockperf (TCP, UDP), redis-server, nginx",
        bed.name(),
        bed.host_ip(),
        bed.mtu
    );
    let pasta_2026 = match &o.pasta_2026 {
        Some(p) => Some(copy_exec(p, &bed.scratch().join("bin").join("pasta-2026"))?),
        None => None,
    };
    let (ready, skipped) = check_all(&remote, bed.mtu, pasta_2026.as_deref(), &env)?;
    let settings = experiments::Settings {
        quick: o.quick,
        remote,
        remote2: bed.remote_ip2().to_string(),
        remote_ns: bed.name().to_owned(),
        host_ip: bed.host_ip().to_string(),
        burner: env.ferry.with_file_name("ferry-burner"),
        e6_bin: env.ferry.with_file_name("ferry-e6"),
        shortconn: env.ferry.with_file_name("ferry-shortconn"),
        e6_dir: bed.scratch().join("e6"),
        unconfined_too: o.unconfined_too,
        baseline: o.baseline.clone(),
    };
    for e in &o.experiments {
        e.prepare(&settings, &mut bed)?;
    }
    let configs: Vec<Config> = ready.iter().map(|r| r.config.clone()).collect();
    let plans: Vec<(&'static dyn Experiment, Vec<plan::Case>)> = o
        .experiments
        .iter()
        .map(|&e| (e, e.cases(&settings, &configs)))
        .collect();
    let total: usize = plans.iter().map(|(_, c)| c.len() * (o.runs + 1)).sum();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} runs, eta {eta}  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let mut results = Results {
        sections: Vec::new(),
        ready,
        skipped,
        machine: Machine::probe(),
        runs: o.runs,
        quick: o.quick,
        seconds: 0.0,
        command: o.command.clone(),
        veth_mtu: bed.mtu,
        build,
    };
    let mut plot_errors = Vec::new();
    for (e, cases) in &plans {
        let mut bench = Bench {
            env: &env,
            bed: &mut bed,
            bar: &bar,
            runs: o.runs,
        };
        let rows = e.run(&mut bench, cases)?;
        say(&bar, &report::table(*e, &rows));
        // Written after every experiment, so an interrupted run leaves what it measured.
        if let Err(why) = plot::draw(&o.out, *e, &rows) {
            plot_errors.push(format!("{}: {why}", e.id()));
        }
        results.sections.push(Section {
            experiment: *e,
            rows,
        });
        results.seconds = start.elapsed().as_secs_f64();
        report::write(&o.out, &results).map_err(output_err(&o.out))?;
    }
    bar.finish_and_clear();
    drop(bed);
    results.seconds = start.elapsed().as_secs_f64();
    report::write(&o.out, &results).map_err(output_err(&o.out))?;
    let tables = results
        .sections
        .iter()
        .map(|s| report::table(s.experiment, &s.rows))
        .collect();
    Ok(Summary {
        tables,
        out: o.out.clone(),
        skipped: results.skipped,
        seconds: results.seconds,
        plot_errors,
    })
}

/// Copies ferry, its shim and ferry-burner (from next to `ferry`) into `dir`, where
/// `ferry run` finds the shim next to itself; returns the copy of ferry and a line
/// naming what was copied (modification times, git state).
fn snapshot(ferry: &Path, dir: &Path) -> Result<(PathBuf, String), Error> {
    std::fs::create_dir_all(dir).map_err(output_err(dir))?;
    let src = ferry.parent().unwrap_or(Path::new("."));
    let mut parts = Vec::new();
    for name in [
        "ferry",
        "libferry_preload.so",
        "ferry-burner",
        "ferry-e6",
        "ferry-e8",
    ] {
        let from = if name == "ferry" {
            ferry.to_owned()
        } else {
            src.join(name)
        };
        let Ok(meta) = std::fs::metadata(&from) else {
            parts.push(format!("{name}: missing"));
            continue;
        };
        let to = dir.join(name);
        std::fs::copy(&from, &to).map_err(output_err(&to))?;
        let built = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| utc(d.as_secs()))
            .unwrap_or_default();
        parts.push(format!("{name} built {built}"));
    }
    let git = std::process::Command::new("git")
        .args([
            "-C",
            &src.to_string_lossy(),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let line = format!(
        "{} (copied at start); source tree: git {git}",
        parts.join(", ")
    );
    Ok((dir.join("ferry"), line))
}

/// Copies the executable `from` to `to` (mode 0755: pasta runs it as an unprivileged
/// user, who may not reach the build tree).
fn copy_exec(from: &Path, to: &Path) -> Result<PathBuf, Error> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::copy(from, to).map_err(output_err(to))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).map_err(output_err(to))?;
    Ok(to.to_owned())
}

/// `YYYY-MM-DD HH:MM UTC` of a Unix time (civil-from-days, proleptic Gregorian).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02} UTC")
}

/// Prints above the progress bar, or plainly when the bar is hidden (not a terminal).
pub fn say(bar: &ProgressBar, msg: &str) {
    if bar.is_hidden() {
        println!("{msg}");
    } else {
        bar.println(msg);
    }
}

/// Smoke-checks native, ferry (socket and nic mode), slirp4netns, pasta and the newest
/// pasta (`pasta_2026`: skipped, saying how to build it, when None); prints each verdict.
fn check_all(
    remote: &str,
    mtu: u32,
    pasta_2026: Option<&Path>,
    env: &Env,
) -> Result<(Vec<Ready>, Vec<Skipped>), Error> {
    let mut ready = Vec::new();
    let mut skipped = Vec::new();
    let mut configs = vec![
        Config::native(),
        Config::ferry(),
        Config::ferry_nic("ferry-nic", &[]),
        Config::slirp(),
        Config::pasta(),
    ];
    match pasta_2026 {
        Some(p) => configs.push(Config::pasta_build("pasta-2026", p)),
        None => {
            let s = Skipped {
                name: "pasta-2026".into(),
                reason: "no newest pasta built (target/peers/pasta beside target/release, or \
                         FERRY_PASTA_2026 / --pasta-2026)"
                    .into(),
                fix: "FERRY_PASTA_SRC=DIR scripts/build-peers.sh, DIR a passt source tree".into(),
            };
            println!(
                "configuration {:<12} SKIPPED: {} (fix: {})",
                s.name, s.reason, s.fix
            );
            skipped.push(s);
        }
    }
    for c in configs {
        match c.check(remote, mtu, env)? {
            Ok(r) => {
                println!("configuration {:<12} ready ({})", r.config.name, r.mtu);
                ready.push(r);
            }
            Err(s) => {
                println!(
                    "configuration {:<12} SKIPPED: {} (fix: {})",
                    s.name, s.reason, s.fix
                );
                skipped.push(s);
            }
        }
    }
    Ok((ready, skipped))
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(super::utc(1_795_000_000), "2026-11-18 11:06 UTC");
    }
}
