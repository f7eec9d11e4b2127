//! Configurations: where and how the *same* client binary runs. `native` (host
//! namespace), `ferry` (`ferry run -- client`, with its knobs), `ferry-nic`
//! (`ferry run --net nic -- client`: a TAP served by ferry's NIC servers), `slirp4netns` (its own
//! user+net namespace, `slirp4netns --configure --mtu=65520`), `pasta`
//! (`pasta --config-net -- client`, as the unprivileged `ferrytest` user) and
//! `pasta-2026` (the same with the newest pasta, built by scripts/build-peers.sh).
//! A configuration can be traced: its runs' system calls counted by `perf record`.
//!
//! Each configuration turns a client argv into a run; [`Config::check`] is the smoke
//! check (reach redis on the remote, read the sandbox's MTU) that decides whether the
//! configuration is used or skipped with a reason and the install command.

use std::ffi::OsString;
use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::exec::{self, Daemon, ExecError, Interrupt, Outcome};
use crate::parse::{self, FerryStats};
use crate::topology::REDIS_PORT;

/// The unprivileged user pasta runs as (created by scripts/install-deps.sh).
pub const PASTA_USER: &str = "ferrytest";

/// How a configuration runs its client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Plain kernel sockets in the host namespace.
    Native,
    /// `ferry run [--spin S] [--batch N] -- client`.
    Ferry {
        /// `--spin`, as given on ferry's command line (None: ferry's default).
        spin: Option<String>,
        /// `--batch` (None: ferry's default).
        batch: Option<u32>,
        /// More `ferry run` options (e.g. `--servers 2 --cpus 0,1`).
        extra: Vec<String>,
        /// Another build's ferry binary (its shim beside it) instead of the one
        /// measured: the baseline of a before/after comparison.
        bin: Option<PathBuf>,
    },
    /// User+net namespace with slirp4netns on a tap device.
    Slirp,
    /// `pasta --config-net`: Debian's (`bin` None, from PATH) or another build.
    Pasta {
        /// Another pasta binary (e.g. the newest, built by scripts/build-peers.sh).
        bin: Option<PathBuf>,
    },
}

/// A named configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Name in tables, CSV and plots (`native`, `ferry`, `ferry-spin0`, …).
    pub name: String,
    /// How it runs.
    pub kind: Kind,
    /// Each run is recorded by `perf record -e raw_syscalls:sys_enter` (the
    /// configuration's every process, slirp4netns too): [`RunOut::syscalls`] says who
    /// made how many system calls. Costs time: only for runs that count, not time.
    pub trace: bool,
}

/// What every configuration needs to run a client.
#[derive(Debug)]
pub struct Env {
    /// The ferry binary (`ferry run`).
    pub ferry: PathBuf,
    /// Directory for per-run files (ferry's counters).
    pub runs_dir: PathBuf,
    /// Ctrl-C flag.
    pub stop: Interrupt,
}

/// One finished run: the client's outcome and, under ferry, the server's counters.
#[derive(Debug)]
pub struct RunOut {
    /// Exit, output, time.
    pub outcome: Outcome,
    /// `--stats-json` of the ferry server (ferry configurations only).
    pub stats: Option<FerryStats>,
    /// Busy CPU time of the whole machine while the run lasted (every process: the
    /// client, ferry's server or a peer, the remote's server, softirq), when
    /// `/proc/stat` could be read.
    pub cpu_busy: Option<Duration>,
    /// CPU time of every process of the run the harness reaped while it lasted
    /// (`getrusage(RUSAGE_CHILDREN)`: the client, ferry with its servers and its
    /// sandbox, slirp4netns, pasta; not the remote's servers).
    pub cpu_children: Option<Duration>,
    /// CPU time of the remote's servers the case talks to, over the run (filled by
    /// the plan from `/proc/<pid>/stat`).
    pub server_cpu: Option<Duration>,
    /// System calls by command name (`comm`) over the run, when the configuration was
    /// [`traced`](Config::traced); an error says why they could not be counted.
    pub syscalls: Option<Result<Vec<(String, u64)>, String>>,
}

impl RunOut {
    /// Busy CPU µs of the whole machine per `ops` operations of the run.
    pub fn cpu_us_per(&self, ops: f64) -> Result<f64, String> {
        let busy = self.cpu_busy.ok_or("no CPU time (/proc/stat unreadable)")?;
        Ok(busy.as_secs_f64() * 1e6 / ops)
    }
}

/// User + system CPU time of this process's reaped descendants so far.
fn children_cpu() -> Option<Duration> {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).ok()?)
            .checked_add(Duration::from_micros(u64::try_from(t.tv_usec()).ok()?))
    };
    tv(u.user_time())?.checked_add(tv(u.system_time())?)
}

/// `perf record` of every system call entry of what follows, into `file`.
fn perf_record(file: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = [
        "perf",
        "record",
        "-q",
        // No build-id pass over the data at the end (it only slows the run's end).
        "--no-buildid",
        "--no-buildid-cache",
        "-m",
        "16M",
        "-e",
        "raw_syscalls:sys_enter",
        "-o",
    ]
    .map(OsString::from)
    .into();
    v.push(file.into());
    v.push("--".into());
    v
}

/// System calls by command name in the perf data files that exist (removed after).
fn syscall_counts(files: &[PathBuf]) -> Result<Vec<(String, u64)>, String> {
    let mut all: Vec<(String, u64)> = Vec::new();
    for f in files.iter().filter(|f| f.is_file()) {
        let out = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--sort",
                "comm",
                "-F",
                "sample,comm",
                "-i",
            ])
            .arg(f)
            .output();
        let _ = fs::remove_file(f);
        let out = out.map_err(|e| format!("perf report: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "perf report failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        all.extend(parse::perf_comm_counts(&String::from_utf8_lossy(
            &out.stdout,
        ))?);
    }
    if all.is_empty() {
        return Err("perf recorded nothing".into());
    }
    Ok(all)
}

/// The machine's busy CPU time so far (see [`parse::proc_stat_busy`]).
fn machine_busy() -> Option<Duration> {
    let ticks = parse::proc_stat_busy(&fs::read_to_string("/proc/stat").ok()?).ok()?;
    let hz = rustix::param::clock_ticks_per_second();
    (hz > 0).then(|| Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// A configuration that passed its smoke check, with the MTU its sandbox sees.
#[derive(Clone, Debug)]
pub struct Ready {
    /// The configuration.
    pub config: Config,
    /// The MTU on the client's path, in words (e.g. "tap0 65520 → veth 1500").
    pub mtu: String,
}

/// A configuration that is not used, and why.
#[derive(Clone, Debug)]
pub struct Skipped {
    /// Its name.
    pub name: String,
    /// What failed.
    pub reason: String,
    /// How to fix it.
    pub fix: String,
}

impl Config {
    /// Plain kernel sockets.
    pub fn native() -> Config {
        Config {
            name: "native".into(),
            kind: Kind::Native,
            trace: false,
        }
    }

    /// ferry with its default knobs.
    pub fn ferry() -> Config {
        Config::ferry_with("ferry", None, None)
    }

    /// ferry with `--spin` and/or `--batch`.
    pub fn ferry_with(name: &str, spin: Option<&str>, batch: Option<u32>) -> Config {
        Config {
            name: name.into(),
            kind: Kind::Ferry {
                spin: spin.map(str::to_owned),
                batch,
                extra: Vec::new(),
                bin: None,
            },
            trace: false,
        }
    }

    /// ferry with more `ferry run` options.
    pub fn ferry_args(name: &str, extra: &[&str]) -> Config {
        Config {
            name: name.into(),
            kind: Kind::Ferry {
                spin: None,
                batch: None,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                bin: None,
            },
            trace: false,
        }
    }

    /// ferry at its defaults from another build (`ferry` binary, with its shim beside
    /// it), named `name`: the "before" of a before/after comparison in the same run.
    pub fn ferry_build(name: &str, bin: &std::path::Path) -> Config {
        Config::ferry_build_args(name, bin, &[])
    }

    /// [`Config::ferry_build`] with more `ferry run` options (the baseline's hand-off).
    pub fn ferry_build_args(name: &str, bin: &std::path::Path, extra: &[&str]) -> Config {
        Config {
            name: name.into(),
            kind: Kind::Ferry {
                spin: None,
                batch: None,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                bin: Some(bin.to_owned()),
            },
            trace: false,
        }
    }

    /// ferry in nic mode (`--net nic`: the sandbox's TAP served by NIC servers) with more
    /// `ferry run` options (e.g. `--mtu 1500`, `--nic-servers 2`).
    pub fn ferry_nic(name: &str, extra: &[&str]) -> Config {
        let mut args = vec!["--net", "nic"];
        args.extend_from_slice(extra);
        Config::ferry_args(name, &args)
    }

    /// slirp4netns.
    pub fn slirp() -> Config {
        Config {
            name: "slirp4netns".into(),
            kind: Kind::Slirp,
            trace: false,
        }
    }

    /// pasta (Debian's, from PATH).
    pub fn pasta() -> Config {
        Config {
            name: "pasta".into(),
            kind: Kind::Pasta { bin: None },
            trace: false,
        }
    }

    /// pasta from another build (`bin`), with the same options as [`Config::pasta`].
    pub fn pasta_build(name: &str, bin: &Path) -> Config {
        Config {
            name: name.into(),
            kind: Kind::Pasta {
                bin: Some(bin.to_owned()),
            },
            trace: false,
        }
    }

    /// The same configuration with its runs' system calls counted (see [`Config::trace`]).
    pub fn traced(&self) -> Config {
        Config {
            trace: true,
            ..self.clone()
        }
    }

    /// Whether this is a ferry configuration (has counters).
    pub fn is_ferry(&self) -> bool {
        matches!(self.kind, Kind::Ferry { .. })
    }

    /// Whether this is ferry in nic mode (`--net nic` or `--net both`).
    pub fn is_nic(&self) -> bool {
        match &self.kind {
            Kind::Ferry { extra, .. } => extra
                .windows(2)
                .any(|w| w[0] == "--net" && (w[1] == "nic" || w[1] == "both")),
            _ => false,
        }
    }

    /// The argv that runs `client` in this configuration (`stats`: ferry's
    /// `--stats-json` file), without the slirp4netns helper and the tracer.
    fn argv(
        &self,
        client: &[String],
        pin: Option<usize>,
        stats: Option<&Path>,
        env: &Env,
    ) -> Vec<OsString> {
        let mut argv: Vec<OsString> = Vec::new();
        if let Some(cpu) = pin {
            argv.extend(["taskset".into(), "-c".into(), cpu.to_string().into()]);
        }
        match &self.kind {
            Kind::Native => {}
            Kind::Ferry {
                spin,
                batch,
                extra,
                bin,
            } => {
                argv.push(bin.as_ref().unwrap_or(&env.ferry).clone().into());
                argv.push("run".into());
                if let Some(f) = stats {
                    argv.extend(["--stats-json".into(), f.into()]);
                }
                if let Some(s) = spin {
                    argv.extend(["--spin".into(), s.into()]);
                }
                if let Some(b) = batch {
                    argv.extend(["--batch".into(), b.to_string().into()]);
                }
                argv.extend(extra.iter().map(OsString::from));
                argv.push("--".into());
            }
            Kind::Slirp => {
                argv.extend(
                    ["unshare", "--user", "--map-root-user", "--net", "--fork"].map(OsString::from),
                );
                argv.extend(["sh".into(), "-c".into(), WAIT_TAP.into(), "sh".into()]);
            }
            Kind::Pasta { bin } => {
                argv.extend(["runuser", "-u", PASTA_USER, "--"].map(OsString::from));
                argv.push(bin.as_ref().map_or_else(|| "pasta".into(), |b| b.into()));
                argv.extend(["--config-net", "-q", "--"].map(OsString::from));
            }
        }
        argv.extend(client.iter().map(OsString::from));
        argv
    }

    /// Runs `client` in this configuration, killed after `timeout`. `pin` runs the
    /// whole configuration (client, ferry's server, slirp4netns, pasta) on one CPU.
    pub fn run(
        &self,
        client: &[String],
        timeout: Duration,
        pin: Option<usize>,
        env: &Env,
    ) -> Result<RunOut, ExecError> {
        let stats_file = self
            .is_ferry()
            .then(|| stats_path(&env.runs_dir, "stats", "json"));
        let trace_files = self.trace.then(|| {
            let f = stats_path(&env.runs_dir, "syscalls", "data");
            (f.clone(), f.with_extension("slirp.data"))
        });
        let mut argv = self.argv(client, pin, stats_file.as_deref(), env);
        if let Some((f, _)) = &trace_files {
            argv.splice(0..0, perf_record(f));
        }
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        let busy_before = machine_busy();
        let children_before = children_cpu();
        let outcome = if self.kind == Kind::Slirp {
            let slirp_trace = trace_files.as_ref().map(|(_, s)| s.clone());
            exec::run_with(&mut cmd, timeout, &env.stop, |pid| {
                start_slirp(pid, pin, slirp_trace.as_deref(), &env.stop)
            })?
        } else {
            exec::run(&mut cmd, timeout, &env.stop)?
        };
        let stats = stats_file.and_then(|f| {
            let s = fs::read_to_string(&f).ok();
            let _ = fs::remove_file(&f);
            s.and_then(|s| parse::ferry_stats(&s).ok())
        });
        let syscalls = trace_files.map(|(main, slirp)| syscall_counts(&[main, slirp]));
        let cpu_busy = busy_before
            .zip(machine_busy())
            .map(|(a, b)| b.saturating_sub(a));
        let cpu_children = children_before
            .zip(children_cpu())
            .map(|(a, b)| b.saturating_sub(a));
        Ok(RunOut {
            outcome,
            stats,
            cpu_busy,
            cpu_children,
            server_cpu: None,
            syscalls,
        })
    }

    /// Wall time of one run of `client` (start-up: `true`) in this configuration, timed
    /// more finely than [`Config::run`] (a blocking wait, no output captured). Fails
    /// when the run fails or lasts beyond `timeout`.
    pub fn time_once(
        &self,
        client: &[String],
        timeout: Duration,
        env: &Env,
    ) -> Result<Duration, String> {
        let argv = self.argv(client, None, None, env);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .process_group(0);
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", argv[0]))?;
        let mut group = exec::Group::new(&child);
        let _slirp = (self.kind == Kind::Slirp)
            .then(|| start_slirp(child.id(), None, None, &env.stop))
            .flatten();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Ok(s),
                Ok(None) if start.elapsed() < timeout && !env.stop.is_set() => {
                    std::thread::sleep(Duration::from_micros(100));
                }
                Ok(None) => break Err("timed out or interrupted".to_owned()),
                Err(e) => break Err(format!("wait: {e}")),
            }
        };
        let took = start.elapsed();
        group.kill_now();
        let status = status?;
        if status.success() {
            return Ok(took);
        }
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read as _;
            let _ = e.read_to_string(&mut err);
        }
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        Err(format!("{status}: {}", last.trim()))
    }

    /// What this configuration lacks beyond the common tools: its pasta binary, or
    /// `perf` when traced; (why, how to fix).
    fn missing_tool(&self) -> Option<(String, &'static str)> {
        if let Kind::Pasta { bin } = &self.kind {
            let found = match bin {
                Some(b) => b.is_file(),
                None => which("pasta").is_some(),
            };
            if !found {
                return Some(match bin {
                    Some(b) => (
                        format!("{} not found", b.display()),
                        "FERRY_PASTA_SRC=DIR scripts/build-peers.sh (DIR: a passt source tree)",
                    ),
                    None => (
                        "`pasta` not found in PATH".to_owned(),
                        "scripts/install-deps.sh (or: apt-get install passt)",
                    ),
                });
            }
        }
        if self.trace && which("perf").is_none() {
            return Some((
                "`perf` not found (system calls are counted with perf record)".into(),
                "scripts/install-deps.sh (or: apt-get install linux-perf)",
            ));
        }
        None
    }

    /// Smoke check: the tools exist, the client reaches redis on the remote
    /// (`redis-cli ping`), and the sandbox's interface MTU is read. `veth_mtu` is the
    /// host path's MTU.
    pub fn check(
        &self,
        remote_ip: &str,
        veth_mtu: u32,
        env: &Env,
    ) -> Result<Result<Ready, Skipped>, ExecError> {
        let skip = |reason: String, fix: &str| {
            Ok(Err(Skipped {
                name: self.name.clone(),
                reason,
                fix: fix.to_owned(),
            }))
        };
        let tools: &[&str] = match self.kind {
            Kind::Native => &["redis-cli"],
            Kind::Ferry { .. } => &["redis-cli"],
            Kind::Slirp => &["redis-cli", "slirp4netns", "unshare", "ip"],
            Kind::Pasta { .. } => &["redis-cli", "runuser", "ip"],
        };
        if let Some((why, fix)) = self.missing_tool() {
            return skip(why, fix);
        }
        for t in tools {
            if which(t).is_none() {
                let fix = match *t {
                    "slirp4netns" => "scripts/install-deps.sh (or: apt-get install slirp4netns)",
                    _ => "scripts/install-deps.sh",
                };
                return skip(format!("`{t}` not found in PATH"), fix);
            }
        }
        if self.is_ferry() && !env.ferry.is_file() {
            return skip(
                format!("{} not found", env.ferry.display()),
                "cargo build --release --workspace",
            );
        }
        if matches!(self.kind, Kind::Pasta { .. }) {
            let user_ok = Command::new("id")
                .arg(PASTA_USER)
                .output()
                .is_ok_and(|o| o.status.success());
            if !user_ok {
                return skip(
                    format!("user {PASTA_USER} (pasta refuses to run as root) does not exist"),
                    "scripts/install-deps.sh",
                );
            }
        }
        let probe = format!(
            "ip -o link show 2>/dev/null | grep -v ' lo:' | head -n 1; redis-cli -h {remote_ip} -p {REDIS_PORT} ping"
        );
        let client = ["sh".to_owned(), "-c".to_owned(), probe];
        let run = self.run(&client, Duration::from_secs(20), None, env)?;
        let out = &run.outcome;
        if !out.success() || !out.stdout.contains("PONG") {
            let fix = match self.kind {
                Kind::Slirp => "scripts/install-deps.sh; unprivileged user namespaces must work",
                Kind::Pasta { .. } => {
                    "scripts/install-deps.sh (makes /dev/net/tun 0666, adds ferrytest)"
                }
                _ => "see the error; scripts/install-deps.sh",
            };
            let why = if out.success() {
                format!("smoke check got no PONG: {}", out.stdout.trim())
            } else {
                format!("smoke check failed: {}", out.failure())
            };
            return skip(why, fix);
        }
        let inner = parse::link_mtu(&out.stdout);
        let mtu = match (&self.kind, inner) {
            (Kind::Native, _) => format!("veth {veth_mtu}"),
            (Kind::Ferry { .. }, Some((ifname, m))) if self.is_nic() => format!(
                "{ifname} {m} in the sandbox (TAP, ferry's NIC servers); host sockets over veth {veth_mtu}"
            ),
            (Kind::Ferry { .. }, _) => {
                format!("sandbox has lo only; ferry's host sockets use veth {veth_mtu}")
            }
            (_, Some((ifname, m))) => {
                format!("{ifname} {m} in the sandbox; host sockets over veth {veth_mtu}")
            }
            (_, None) => format!("(sandbox MTU unknown); veth {veth_mtu}"),
        };
        Ok(Ok(Ready {
            config: self.clone(),
            mtu,
        }))
    }
}

/// Run inside slirp4netns's namespace before the client: wait for tap0 to be configured.
const WAIT_TAP: &str = "i=0; while ! ip -o -4 addr show dev tap0 2>/dev/null | grep -q inet; do \
    i=$((i+1)); if [ $i -gt 500 ]; then echo 'tap0 did not appear (slirp4netns failed?)' >&2; exit 99; fi; \
    sleep 0.01; done; exec \"$@\"";

/// Starts slirp4netns for the namespace of `pid` (the `unshare` process) once it exists.
/// `trace`: recorded by `perf record` into that file.
fn start_slirp(
    pid: u32,
    pin: Option<usize>,
    trace: Option<&Path>,
    stop: &Interrupt,
) -> Option<Daemon> {
    let me = fs::read_link("/proc/self/ns/net").ok()?;
    let end = Instant::now() + Duration::from_secs(5);
    // The run's first process in a namespace of its own (`unshare`, or its child when
    // `perf record` runs it).
    let pid = loop {
        let inside = exec::with_descendants(pid)
            .into_iter()
            .find(|p| fs::read_link(format!("/proc/{p}/ns/net")).is_ok_and(|ns| ns != me));
        match inside {
            Some(p) => break p,
            None if Instant::now() < end && !stop.is_set() => {
                std::thread::sleep(Duration::from_millis(2));
            }
            None => return None,
        }
    };
    let mut argv: Vec<OsString> = trace.map(perf_record).unwrap_or_default();
    if let Some(cpu) = pin {
        argv.extend(["taskset".into(), "-c".into(), cpu.to_string().into()]);
    }
    argv.push("slirp4netns".into());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .args(["--configure", "--mtu=65520", "--disable-host-loopback"])
        .arg(pid.to_string())
        .arg("tap0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    Daemon::spawn("slirp4netns", &mut cmd).ok()
}

/// A fresh file name in `dir`: `{prefix}-{n}.{ext}`.
fn stats_path(dir: &Path, prefix: &str, ext: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    dir.join(format!(
        "{prefix}-{}.{ext}",
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The full path of `program` in PATH (plus the sbin directories).
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
