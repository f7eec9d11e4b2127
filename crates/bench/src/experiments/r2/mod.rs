//! R2: what users feel beyond bulk (docs: the team's BENCHMARKS.md). Short connections
//! per second (`ferry-shortconn`, a C client built from `crates/bench/c/shortconn.c`
//! when R2 runs, against the same program as a server in the remote, which closes
//! first so that no TIME_WAIT piles up where every configuration connects from, the
//! client timing each connection's phases — `socket`, `connect`, the first exchange,
//! the end of stream, `close` — itself; the same client pausing 2 ms after each
//! connection, so that each is made after the network side went idle, as a program
//! that connects now and then makes them (`sporadic conn`: a connection's time, by
//! phase); and `wrk -H 'Connection: close'` against nginx); pgbench's select-only
//! transactions against PostgreSQL (4 clients); CPU per request (the client side —
//! the program, ferry with its servers, or the peer — from `getrusage` of the reaped
//! processes, plus the remote's server from `/proc/<pid>/stat`); system calls per
//! request (a short fixed run under `perf record -e raw_syscalls:sys_enter`, split into
//! the program, ferry's servers and the peer); start-up (`CMD -- true` p50/p90, native
//! being `unshare -rn true`). Every configuration of the run, both pastas among them.

mod core;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{Experiment, Settings, insert_handoff, pick, redis_benchmark, strings};
use crate::config::{Config, RunOut};
use crate::exec::ExecError;
use crate::parse;
use crate::plan::{self, Bench, Case, Extract, Metrics, Param, Row};
use crate::plot::Area;
use crate::topology::{
    HTTP_PORT, PG_DB, PG_PORT, PG_USER, REDIS_PORT, SHORTCONN_PORT, Testbed, postgres_bin,
};

pub use self::core::{Split, percentile, ratio_table, split_syscalls, us_per};

/// The C source of `ferry-shortconn`, compiled when R2 runs.
const SHORTCONN_C: &str = include_str!("../../../c/shortconn.c");

/// The start-up test's label (its cases are timed by [`startup`], not by the plan).
const STARTUP: &str = "start-up";

/// R2 (see the module's header).
#[derive(Debug)]
pub struct R2;

impl Experiment for R2 {
    fn id(&self) -> &'static str {
        "R2"
    }

    fn title(&self) -> &'static str {
        "short connections, CPU and system calls per request, start-up"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("result", "-")
    }

    fn prepare(&self, s: &Settings, bed: &mut Testbed) -> Result<(), crate::Error> {
        match build_shortconn(&s.shortconn) {
            Ok(()) => bed.start_shortconn(&s.shortconn)?,
            Err(why) => println!("R2: the C short-connection client is left out: {why}"),
        }
        match pg_tools() {
            Ok(bin) => bed.start_postgres(&bin)?,
            Err(why) => println!("R2: pgbench is left out: {why}"),
        }
        Ok(())
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn run(&self, bench: &mut Bench<'_>, cases: &[Case]) -> Result<Vec<Row>, ExecError> {
        let at = cases
            .iter()
            .position(|c| c.param.label == STARTUP)
            .unwrap_or(cases.len());
        let (timed, start) = cases.split_at(at);
        let mut rows = plan::measure(bench, self.id(), timed, self.main_metric())?;
        let k = if bench.runs <= 2 { 10 } else { 30 };
        rows.extend(startup(bench, start, k)?);
        Ok(rows)
    }

    fn paper(&self) -> &'static str {
        "S4 measures connect/close cost and S1 crossings per operation; no figure is \
         reproduced as such: R2 is what a user of a sandbox feels."
    }

    fn summary(&self, rows: &[Row]) -> String {
        format!(
            "Medians of the rounds (configurations alternating), with the ratio to native's \
             median where native has the metric. CPU per request: `client side` is every \
             process the harness reaped during the run (the program; ferry with its servers \
             and sandbox; slirp4netns; pasta with `runuser`), from getrusage; `server side` \
             is the remote's server (ferry-shortconn, nginx with its worker, redis-server, \
             PostgreSQL with its backends; a pgbench transaction is a request), \
             from its threads' run times in /proc (ns). System calls: a separate short run \
             of the same client under `perf record -e raw_syscalls:sys_enter`, split into \
             the program, ferry's server threads and the peer (pasta, slirp4netns); `total` \
             is their sum; `other` (wrappers and start-up: runuser, unshare, ferry's main \
             thread, the sandbox's init) is in results.csv. A short connection's phases \
             (`socket()`, `connect()`, `1st exchange` = the request's write and the reply's \
             read, `end of stream` = the read that finds it, `close()`) are the C client's \
             own mean times in µs, as the program sees them; `sporadic conn` is the same \
             client pausing 2 ms after each connection (its `connection` is the sum of the \
             phases: what one connection made now and then costs). Under pasta the program's own \
             calls escape perf's inheritance and are not counted: only pasta's are shown. \
             Start-up: each round times 30 runs of `CMD -- true` (10 with --runs 2 or \
             fewer) and keeps their p50 and p90; native is `unshare -rn true`; both pastas \
             run through `runuser -u ferrytest` (pasta refuses root; runuser alone takes a \
             few ms).\n\n{}\n",
            ratio_table(rows)
        )
    }

    fn in_table(&self, row: &Row) -> bool {
        !row.metric.contains("other")
    }

    fn plot_size(&self) -> (u32, u32) {
        (1800, 700)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        let shown: Vec<Row> = rows
            .iter()
            .filter(|r| {
                r.metric == "rate"
                    || r.metric == "CPU/req total"
                    || r.metric == "syscalls/req total"
                    || r.param.label == STARTUP
                    || (r.param.label == SPORADIC && r.metric == "connection")
            })
            .cloned()
            .collect();
        super::r1::relative_plot(
            root,
            &shown,
            "R2 — relative to native (higher is better)",
            &short_name,
        )
    }
}

/// A plot group's name: the test and the metric, short.
fn short_name(test: &str, metric: &str) -> String {
    let test = test
        .replace("short conn (C)", "short C")
        .replace(SPORADIC, "sporadic C")
        .replace("wrk Connection: close", "wrk close")
        .replace(", syscalls", "")
        .replace("redis GET ", "GET ")
        .replace("pgbench -S -c 4", "pgbench");
    let metric = match metric {
        "rate" => "rate",
        "CPU/req total" => "CPU",
        "syscalls/req total" => "syscalls",
        m => m,
    };
    format!("{test} {metric}")
}

/// Writes the C source next to `bin` and compiles it (`cc -O2`).
fn build_shortconn(bin: &Path) -> Result<(), String> {
    let src = bin.with_extension("c");
    std::fs::write(&src, SHORTCONN_C)
        .map_err(|e| format!("cannot write {}: {e}", src.display()))?;
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(bin)
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run cc ({e}); scripts/install-deps.sh installs it"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The C client's mean time of each phase of a connection (µs), one metric each.
fn phase_metrics(stdout: &str) -> Result<Metrics, String> {
    let phases = parse::shortconn_phases(stdout)?;
    Ok(parse::SHORTCONN_PHASES
        .iter()
        .zip(phases)
        .map(|((_, metric), us)| (*metric, "us", us))
        .collect())
}

/// CPU per request: client side, server side, total.
fn cpu_metrics(r: &RunOut, requests: f64) -> Result<Metrics, String> {
    let client = us_per(r.cpu_children, requests, "the client side")?;
    let server = us_per(r.server_cpu, requests, "the remote's server")?;
    Ok(vec![
        ("CPU/req client side", "us", client),
        ("CPU/req server side", "us", server),
        ("CPU/req total", "us", client + server),
    ])
}

/// System calls per request of a traced run, split by who made them.
fn syscall_metrics(r: &RunOut, program: &str, requests: f64) -> Result<Metrics, String> {
    let counts = match &r.syscalls {
        Some(Ok(c)) => c,
        Some(Err(e)) => return Err(e.clone()),
        None => return Err("the run was not traced".into()),
    };
    let s = split_syscalls(counts, program);
    let per = |n: u64| n as f64 / requests;
    let mut v = Vec::new();
    // Under pasta the program escapes perf's inheritance (nothing of it is recorded):
    // no program and no total rather than a false 0.
    if s.program > 0 {
        v.push(("syscalls/req program", "per req", per(s.program)));
    }
    if s.servers > 0 {
        v.push(("syscalls/req ferry servers", "per req", per(s.servers)));
    }
    if s.peer > 0 {
        v.push(("syscalls/req peer", "per req", per(s.peer)));
    }
    if s.program > 0 {
        v.push(("syscalls/req total", "per req", per(s.work())));
    }
    v.push(("syscalls/req other", "per req", per(s.other)));
    Ok(v)
}

/// One R2 test: label, client, remote servers it uses, metrics, seconds, traced.
struct Test {
    label: &'static str,
    client: Vec<String>,
    servers: Vec<u16>,
    extract: Extract,
    secs: u32,
    traced: bool,
}

/// The test of sporadic connections (the C client pausing between them).
const SPORADIC: &str = "sporadic conn (C)";

/// `sporadic conn (C)`: the client's pause after each connection (µs): long enough
/// for ferry's servers to end their spin and sleep (their default spin span is 200 µs).
const SPORADIC_PAUSE_US: u32 = 2000;

fn shortconn_tests(s: &Settings, secs: u32, trace_secs: &str) -> Vec<Test> {
    if !s.shortconn.is_file() {
        return Vec::new();
    }
    let bin = s.shortconn.to_string_lossy().into_owned();
    let client =
        |secs: &str| strings(&[&bin, "client", &s.remote, &SHORTCONN_PORT.to_string(), secs]);
    let mut sporadic = client(&secs.to_string());
    sporadic.push(SPORADIC_PAUSE_US.to_string());
    vec![
        Test {
            label: "short conn (C)",
            client: client(&secs.to_string()),
            servers: vec![SHORTCONN_PORT],
            extract: Box::new(|r: &RunOut| {
                let (n, t) = parse::shortconn(&r.outcome.stdout)?;
                let mut v = vec![("rate", "conn/s", n as f64 / t)];
                v.extend(cpu_metrics(r, n as f64)?);
                // Where a connection's time goes, as the program sees it.
                v.extend(phase_metrics(&r.outcome.stdout)?);
                Ok(v)
            }),
            secs,
            traced: false,
        },
        Test {
            label: SPORADIC,
            client: sporadic,
            servers: vec![SHORTCONN_PORT],
            extract: Box::new(|r: &RunOut| {
                let phases = phase_metrics(&r.outcome.stdout)?;
                let whole = phases.iter().map(|(_, _, us)| us).sum();
                Ok(std::iter::once(("connection", "us", whole))
                    .chain(phases)
                    .collect())
            }),
            secs,
            traced: false,
        },
        Test {
            label: "short conn (C), syscalls",
            client: client(trace_secs),
            servers: vec![SHORTCONN_PORT],
            extract: Box::new(|r: &RunOut| {
                let (n, _) = parse::shortconn(&r.outcome.stdout)?;
                syscall_metrics(r, "ferry-shortconn", n as f64)
            }),
            secs: 2,
            traced: true,
        },
    ]
}

fn redis_tests(s: &Settings) -> Vec<Test> {
    let redis = |n: &str, p: &str| redis_benchmark(s, "get", n, p);
    let rate_cpu = |n: &str| -> Extract {
        let requests: f64 = n.parse().unwrap_or(f64::NAN);
        Box::new(move |r: &RunOut| {
            let mut v = vec![("rate", "req/s", parse::redis_rps(&r.outcome.stdout, "GET")?)];
            v.extend(cpu_metrics(r, requests)?);
            Ok(v)
        })
    };
    let (n1, n16, nt) = if s.quick {
        ("10000", "100000", "5000")
    } else {
        ("100000", "1000000", "20000")
    };
    let requests: f64 = nt.parse().unwrap_or(f64::NAN);
    vec![
        Test {
            label: "redis GET -P 1",
            client: redis(n1, "1"),
            servers: vec![REDIS_PORT],
            extract: rate_cpu(n1),
            secs: 30,
            traced: false,
        },
        Test {
            label: "redis GET -P 16",
            client: redis(n16, "16"),
            servers: vec![REDIS_PORT],
            extract: rate_cpu(n16),
            secs: 30,
            traced: false,
        },
        Test {
            label: "redis GET -P 1, syscalls",
            client: redis(nt, "1"),
            servers: vec![REDIS_PORT],
            extract: Box::new(move |r: &RunOut| syscall_metrics(r, "redis-benchmark", requests)),
            secs: 20,
            traced: true,
        },
    ]
}

/// The directory of PostgreSQL's programs (the server's and pgbench, there itself and
/// not through Debian's Perl wrapper, whose start-up would count in the client's CPU),
/// with the server's user, or what is missing.
fn pg_tools() -> Result<std::path::PathBuf, String> {
    let missing = "(scripts/install-deps.sh installs postgresql)";
    let bin = postgres_bin().ok_or(format!("no PostgreSQL server found {missing}"))?;
    if !bin.join("pgbench").is_file() {
        return Err(format!("no pgbench in {} {missing}", bin.display()));
    }
    let user = Command::new("id").arg(PG_USER).output();
    if !user.is_ok_and(|o| o.status.success()) {
        return Err(format!("no user `{PG_USER}` {missing}"));
    }
    Ok(bin)
}

/// pgbench's select-only transactions (one prepared `SELECT` a round trip), 4 clients
/// on one thread: a libpq program waiting in `poll`.
fn pgbench(s: &Settings, secs: u32, bin: &Path) -> Test {
    Test {
        label: "pgbench -S -c 4",
        client: strings(&[
            &bin.join("pgbench").to_string_lossy(),
            "-h",
            &s.remote,
            "-p",
            &PG_PORT.to_string(),
            "-U",
            PG_USER,
            "-n",
            "-S",
            "-M",
            "prepared",
            "-c",
            "4",
            "-j",
            "1",
            "-T",
            &secs.to_string(),
            PG_DB,
        ]),
        servers: vec![PG_PORT],
        extract: Box::new(|r: &RunOut| {
            let (n, tps) = parse::pgbench(&r.outcome.stdout)?;
            let mut v = vec![("rate", "tx/s", tps)];
            v.extend(cpu_metrics(r, n as f64)?);
            Ok(v)
        }),
        secs,
        traced: false,
    }
}

fn wrk_close(s: &Settings, secs: u32) -> Test {
    let url = format!("http://{}:{HTTP_PORT}/index.html", s.remote);
    Test {
        label: "wrk Connection: close",
        client: strings(&[
            "wrk",
            "-t",
            "1",
            "-c",
            "4",
            "-d",
            &format!("{secs}s"),
            "--timeout",
            "5s",
            "-H",
            "Connection: close",
            &url,
        ]),
        servers: vec![HTTP_PORT],
        extract: Box::new(|r: &RunOut| {
            let n = parse::wrk_requests(&r.outcome.stdout)?;
            let mut v = vec![("rate", "req/s", parse::wrk_rps(&r.outcome.stdout)?)];
            v.extend(cpu_metrics(r, n as f64)?);
            Ok(v)
        }),
        secs,
        traced: false,
    }
}

/// R2's configurations: those of R1 (the baseline build and the hand-off among them)
/// and both pastas.
fn configs(s: &Settings, ready: &[Config]) -> Vec<Config> {
    let mut configs = pick(
        ready,
        &[
            "native",
            "ferry",
            "ferry-nic",
            "slirp4netns",
            "pasta",
            "pasta-2026",
        ],
    );
    let at = configs.iter().position(|c| c.name == "ferry");
    if let Some(at) = at {
        insert_handoff(&mut configs, at + 1, s);
    }
    if let (Some(base), Some(at)) = (&s.baseline, at) {
        configs.insert(at + 1, Config::ferry_build("ferry-base", base));
    }
    configs
}

fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(3);
    let trace_secs = if s.quick { "0.5" } else { "1" };
    let configs = configs(s, ready);
    let mut tests = shortconn_tests(s, secs, trace_secs);
    tests.push(wrk_close(s, secs));
    tests.extend(redis_tests(s));
    if let Ok(bin) = pg_tools() {
        tests.push(pgbench(s, secs, &bin));
    }
    if crate::config::which("perf").is_none() {
        println!(
            "R2: system calls per request are left out: `perf` not found \
             (scripts/install-deps.sh installs linux-perf)"
        );
        tests.retain(|t| !t.traced);
    }
    let mut out = Vec::new();
    for (i, t) in tests.into_iter().enumerate() {
        let extract = std::rc::Rc::new(t.extract);
        for c in &configs {
            let ex = extract.clone();
            out.push(Case {
                config: if t.traced { c.traced() } else { c.clone() },
                param: Param::new(t.label, i as f64),
                client: t.client.clone(),
                // Slack for a loaded machine: pasta alone takes ~0.2 s to start.
                timeout: s.timeout(t.secs + 10),
                pin: None,
                servers: t.servers.clone(),
                extract: Box::new(move |r: &RunOut| ex(r)),
            });
        }
    }
    // Start-up last: R2::run times these cases itself.
    for c in &configs {
        let client = if c.name == "native" {
            strings(&["unshare", "-rn", "true"])
        } else {
            strings(&["true"])
        };
        out.push(Case {
            config: c.clone(),
            param: Param::new(STARTUP, 99.0),
            client,
            timeout: Duration::from_secs(10),
            pin: None,
            servers: Vec::new(),
            extract: Box::new(|_: &RunOut| Err("timed by R2's start-up loop".into())),
        });
    }
    out
}

/// Start-up: one warm-up run per case, then per round `k` timed runs of each case in
/// turn; a round's p50 and p90 (ms) are its samples.
fn startup(b: &mut Bench<'_>, cases: &[Case], k: usize) -> Result<Vec<Row>, ExecError> {
    let mut p50: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut p90: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut failed: Vec<Option<String>> = vec![None; cases.len()];
    let once = |b: &Bench<'_>, c: &Case| {
        let t = c.config.time_once(&c.client, c.timeout, b.env);
        if b.env.stop.is_set() {
            return Err(ExecError::Interrupted);
        }
        Ok(t.map(|d| d.as_secs_f64() * 1e3))
    };
    for (i, c) in cases.iter().enumerate() {
        crate::say(b.bar, &format!("R2 {} start-up (warm-up)", c.config.name));
        if let Err(e) = once(b, c)? {
            failed[i] = Some(format!("warm-up {e}"));
        }
        b.bar.inc(1);
    }
    for _ in 0..b.runs {
        for (i, c) in cases.iter().enumerate() {
            b.bar.inc(1);
            if failed[i].is_some() {
                continue;
            }
            let mut t = Vec::with_capacity(k);
            for _ in 0..k {
                match once(b, c)? {
                    Ok(ms) => t.push(ms),
                    Err(e) => {
                        failed[i] = Some(e);
                        break;
                    }
                }
            }
            if let (Some(a), Some(z)) = (percentile(&t, 50.0), percentile(&t, 90.0)) {
                p50[i].push(a);
                p90[i].push(z);
            }
        }
    }
    let mut rows = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        for (metric, samples) in [("p50", &p50[i]), ("p90", &p90[i])] {
            rows.push(Row {
                experiment: "R2".into(),
                config: c.config.name.clone(),
                param: c.param.clone(),
                metric: metric.into(),
                unit: "ms".into(),
                samples: samples.clone(),
                planned: b.runs,
                failures: failed[i].iter().cloned().collect(),
            });
        }
    }
    Ok(rows)
}
