//! C1: ferry as a container runtime (issue 27's goals). Clients run in long-lived
//! containers of the bench's own engines (a dockerd with `ferry oci` registered, and
//! rootful Podman), started by the container's first process (a runner reading command
//! lines from a FIFO), against servers in the remote namespace, which
//! C1 puts on the engines' bridge: iperf3 both ways and `redis-benchmark GET -P 1`;
//! and `wrk` on the host against nginx in the container, published with `-p`.
//! Configurations, alternating: `docker --runtime ferry` (default options), runc on
//! Docker's default bridge, `--network host`, Podman with `--network slirp4netns` and
//! `--network pasta` (user-mode networking; for a Podman older than 4.4, which has no
//! pasta, the bench attaches the system's pasta to the container's namespace as Podman
//! 4.4 does), and `ferry run`
//! and native on the host for reference. CPU per request is the client side: the
//! container's cgroup plus what serves its network outside it (ferry's network side,
//! slirp4netns, pasta) — for `ferry run` and native, R2's getrusage of the reaped
//! processes. Start-up: `docker run --rm IMAGE true`, 20 per round with ferry and runc
//! (and `--baseline`'s build, as runtime `ferry-base`), alternating. Skipped with a note when docker or podman is missing.

pub mod core;
mod engine;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use self::core::{
    BRIDGE, DOWN, FERRY, FERRY_BASE, FERRY_RUN, HOST, PASTA, REDIS, SLIRP, STARTUP, UP, WRK,
    derived, goals, goals_table, startup_stats,
};
use self::engine::{
    BASE_RUNTIME, Ctr, Docker, IMAGE, Lan, NormalPolicy, PUBLISH, PUBLISHING, Podman, Redis,
    UserNet, free_port,
};
use super::{Experiment, Settings, pick, strings};
use crate::config::{Config, Kind, RunOut, which};
use crate::exec::ExecError;
use crate::parse;
use crate::plan::{Bench, Case, Extract, Metrics, Param, Row};
use crate::plot::{Area, COLORS, Pt, bars, category_chart};
use crate::topology::IPERF_PORT;

/// In clients' argv: the remote's address on C1's bridge (known once it is made).
const REMOTE: &str = "{remote}";
/// In clients' argv: the host port where the configuration's nginx is reached.
const PORT: &str = "{port}";
/// nginx's port in the containers (published with `-p 127.0.0.1:FREE:NGINX_PORT`).
const NGINX_PORT: u16 = 8080;
/// The file wrk fetches.
const WRK_FILE: (&str, usize) = ("file-16k.bin", 16 << 10);
/// C1's redis-server (the testbed's binds its veth address only).
const REDIS_PORT: u16 = 6380;
/// Start-up runs per configuration per round (the 20).
const STARTUP_RUNS: usize = 20;
/// The container configurations, in their alternation order.
const CONTAINERS: [&str; 5] = [FERRY, BRIDGE, HOST, SLIRP, PASTA];

/// C1 (see the module's header).
#[derive(Debug)]
pub struct C1;

impl Experiment for C1 {
    fn id(&self) -> &'static str {
        "C1"
    }

    fn title(&self) -> &'static str {
        "containers: ferry as Docker's runtime vs runc's bridge, host network, slirp4netns, ferry run"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("result", "-")
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
        // Every configuration at the same (normal) policy: containers cannot have the
        // bench's real-time one.
        let normal = NormalPolicy::enter(bench.bed.name());
        // The baseline build's `ferry`, when its start-up is measured.
        let base = start.iter().find_map(|c| match &c.config.kind {
            Kind::Ferry { bin, .. } => bin.clone(),
            _ => None,
        });
        let setup = Setup::up(bench, base.as_deref());
        let mut rows = measure(bench, timed, &setup)?;
        rows.extend(startup(bench, start, &setup)?);
        drop(setup);
        drop(normal);
        rows.extend(derived(&rows));
        Ok(rows)
    }

    fn paper(&self) -> &'static str {
        "gVisor's runsc is the anchor for start-up: its create + start take 81–280 ms in \
         published measurements; slirp4netns and pasta are what rootless engines use."
    }

    fn summary(&self, rows: &[Row]) -> String {
        format!(
            "Clients run in long-lived containers of the bench's own dockerd (Debian's \
             docker.io, `--iptables=false`, containers on a bridge of C1's with the remote \
             namespace on it, no forwarding or NAT) and rootful Podman (vfs, cgroupfs, \
             its own storage); each client is started by the container's first process (a \
             shell reading command lines from a FIFO), as the container's own processes \
             are (`docker exec`'s processes are refused by ferry's servers: not in the \
             sandbox); the image is scripts/oci-image.sh's `bench` (Debian's iperf3, \
             redis-benchmark, nginx). Servers \
             outside: the remote's iperf3 and a redis-server of C1's on the bridge. `wrk` \
             (1 thread, 4 connections, 16 KiB file) runs on the host against nginx in the \
             container, published with `-p 127.0.0.1:PORT:8080` (Docker's userland proxy, \
             `--iptables=false`; Podman's rootlessport; pasta's own forwarding); Podman \
             older than 4.4 has no `--network pasta`: `podman-pasta`'s container then joins \
             a namespace the bench attached pasta to as Podman 4.4 does (`--config-net`, \
             the port as `-t 127.0.0.1/PORT:8080`; Debian's pasta, which Debian's Podman \
             would run); ferry's container runs under the \
             runtime `{PUBLISHING}`: ferry with the preset `{PUBLISH}` (ferry publishes the \
             port in the engine's namespace; Debian's dockerd has no `--annotation`), its \
             defaults otherwise; on the host network nginx listens on the host port itself; its \
             CPU per request is the container's side only (nginx and what serves its \
             network, not wrk nor the engines' proxies). CPU \
             per request is the client side: the container's cgroup (cpuacct) plus what \
             serves its network from outside it (ferry's network side with its servers, \
             slirp4netns, pasta; runc's bridge and host network: the kernel only); \
             `ferry` and `native` run on the host, CPU by getrusage as \
             in R2. Every process of C1 (clients, servers, engines, ferry) runs at the \
             normal scheduling policy whatever the bench's: an engine's cgroup refuses a \
             real-time container. Start-up: per round {STARTUP_RUNS} `docker run --rm \
             {IMAGE} true` per runtime (`--baseline`'s build too, as runtime \
             `{BASE_RUNTIME}`: the same run's before), alternating; p50, min and max.\n\n\
             Goals (issue 27):\n\n{}\n",
            goals_table(&goals(rows))
        )
    }

    fn in_table(&self, row: &Row) -> bool {
        !row.samples.is_empty() || !row.failures.is_empty()
    }

    fn plot_size(&self) -> (u32, u32) {
        (1800, 650)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        let (left, right) = root.split_horizontally(1300);
        let shown: Vec<Row> = rows
            .iter()
            .filter(|r| {
                r.param.label != STARTUP
                    && matches!(r.metric.as_str(), "bandwidth" | "rate" | "CPU/req")
            })
            .cloned()
            .collect();
        super::r1::relative_plot(
            &left,
            &shown,
            "C1 — relative to native on the host (higher is better)",
            &|t: &str, m: &str| format!("{t} {m}"),
        )?;
        startup_plot(&right, rows)
    }
}

/// Start-up: bars of the p50 with min–max whiskers, ms.
fn startup_plot(area: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let get = |c: &str, m: &str| crate::plan::median(rows, c, STARTUP, m);
    // The same colours as the left plot's (docker-ferry first, docker-bridge second).
    let mut configs = vec![FERRY, BRIDGE];
    let mut names: Vec<String> = ["ferry", "runc"].map(str::to_owned).into();
    if get(FERRY_BASE, "p50").is_some() {
        configs.push(FERRY_BASE);
        names.push("ferry (baseline)".into());
    }
    let mut items = Vec::new();
    let mut ymax: f64 = 10.0;
    for (i, c) in configs.iter().enumerate() {
        let pt = get(c, "p50").map(|med| Pt {
            x: i as f64,
            med,
            min: get(c, "min").unwrap_or(med),
            max: get(c, "max").unwrap_or(med),
        });
        if let Some(p) = pt {
            ymax = ymax.max(p.max * 1.15);
        }
        let text = pt.map(|p| format!("{:.0} ms", p.med)).unwrap_or_default();
        items.push((i as f64, 0.5, pt, COLORS[i % COLORS.len()], text));
    }
    let title = "docker run --rm IMAGE true (p50, min–max)";
    let mut chart = category_chart(area, title, 18, &names, ymax, "ms")?;
    bars(&mut chart, &items)
}

/// A test: its label, its client (with [`REMOTE`]), its metrics, its run time.
struct Test {
    label: &'static str,
    client: Vec<String>,
    extract: fn(&RunOut, f64) -> Result<Metrics, String>,
    requests: f64,
    secs: u32,
    /// The client runs on the host against the container's published port (its
    /// server is in the container); only the containers run it.
    on_host: bool,
}

fn iperf(r: &RunOut, _: f64) -> Result<Metrics, String> {
    let bps = parse::iperf3_bps(&r.outcome.stdout)?;
    Ok(vec![("bandwidth", "Gbit/s", bps / 1e9)])
}

fn redis(r: &RunOut, n: f64) -> Result<Metrics, String> {
    let mut v = vec![("rate", "req/s", parse::redis_rps(&r.outcome.stdout, "GET")?)];
    let client = r.cpu_children.ok_or("no CPU time of the client side")?;
    v.push(("CPU/req", "us", client.as_secs_f64() * 1e6 / n));
    if let Some(server) = r.server_cpu {
        v.push(("CPU/req server", "us", server.as_secs_f64() * 1e6 / n));
    }
    Ok(v)
}

fn wrk(r: &RunOut, _: f64) -> Result<Metrics, String> {
    let n = parse::wrk_requests(&r.outcome.stdout)? as f64;
    let mut v = vec![("rate", "req/s", parse::wrk_rps(&r.outcome.stdout)?)];
    let server = r
        .cpu_children
        .ok_or("no CPU time of the container's side")?;
    v.push(("CPU/req", "us", server.as_secs_f64() * 1e6 / n));
    Ok(v)
}

fn tests(s: &Settings) -> Vec<Test> {
    let secs = s.secs(5);
    let iperf3 = |extra: &[&str]| super::iperf3_to(REMOTE, IPERF_PORT, secs, extra);
    let n = if s.quick { "20000" } else { "100000" };
    let redis_client = super::redis_benchmark_to(REMOTE, REDIS_PORT, "get", n, "1");
    vec![
        Test {
            label: UP,
            client: iperf3(&[]),
            extract: iperf,
            requests: 0.0,
            secs,
            on_host: false,
        },
        Test {
            label: DOWN,
            client: iperf3(&["-R"]),
            extract: iperf,
            requests: 0.0,
            secs,
            on_host: false,
        },
        Test {
            label: REDIS,
            client: redis_client,
            extract: redis,
            requests: n.parse().unwrap_or(f64::NAN),
            secs: 30,
            on_host: false,
        },
        Test {
            label: WRK,
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
                &format!("http://127.0.0.1:{PORT}/{}", WRK_FILE.0),
            ]),
            extract: wrk,
            requests: 0.0,
            secs,
            on_host: true,
        },
    ]
}

/// A container configuration's name on a host configuration (the engine runs it).
fn container_config(name: &str) -> Config {
    Config {
        name: name.to_owned(),
        ..Config::native()
    }
}

fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let mut configs: Vec<Config> = CONTAINERS.iter().map(|c| container_config(c)).collect();
    configs.extend(pick(ready, &[FERRY_RUN, "native"]));
    let mut out = Vec::new();
    for (i, t) in tests(s).into_iter().enumerate() {
        let (extract, n) = (t.extract, t.requests);
        let containers_only = t.on_host;
        for c in configs
            .iter()
            .filter(|c| !containers_only || CONTAINERS.contains(&c.name.as_str()))
        {
            out.push(Case {
                config: c.clone(),
                param: Param::new(t.label, i as f64),
                client: t.client.clone(),
                timeout: s.timeout(t.secs + 15),
                pin: None,
                servers: Vec::new(),
                extract: Box::new(move |r: &RunOut| extract(r, n)) as Extract,
            });
        }
    }
    // Start-up last: C1::run times these itself. The baseline's `ferry-oci` (beside its
    // `ferry`) is registered as runtime `ferry-base` for it.
    let base = s
        .baseline
        .as_ref()
        .map(|b| Config::ferry_build(FERRY_BASE, b));
    for config in [FERRY, BRIDGE]
        .map(container_config)
        .into_iter()
        .chain(base)
    {
        out.push(Case {
            config,
            param: Param::new(STARTUP, 99.0),
            client: Vec::new(),
            timeout: Duration::from_secs(30),
            pin: None,
            servers: Vec::new(),
            extract: Box::new(|_: &RunOut| Err("timed by C1's start-up loop".into())),
        });
    }
    out
}

/// The pasta Podman's `--network pasta` runs: the system's (what this distribution's
/// Podman runs; the newest build collapses on upload here, R1's `pasta-2026`), else the
/// newest build.
fn system_pasta(b: &Bench<'_>) -> Result<std::path::PathBuf, String> {
    let built = b.bed.scratch().join("bin").join("pasta-2026");
    which("pasta")
        .or_else(|| built.exists().then_some(built))
        .ok_or_else(|| "pasta is not installed (scripts/install-deps.sh installs passt)".into())
}

/// C1's network, servers, engines and containers, torn down on drop in field order
/// (containers, engines, redis, the bridge).
struct Setup {
    containers: BTreeMap<&'static str, Result<Ctr, String>>,
    /// Where each container's nginx is reached on the host, or why not.
    nginx: BTreeMap<&'static str, Result<u16, String>>,
    _podman: Result<Podman, String>,
    docker: Result<Docker, String>,
    redis: Result<Redis, String>,
    remote: String,
    _lan: Result<Lan, String>,
}

impl Setup {
    fn up(b: &mut Bench<'_>, base: Option<&std::path::Path>) -> Setup {
        let dir = b.bed.scratch().join("c1");
        let ns = b.bed.name().to_owned();
        crate::say(
            b.bar,
            "C1: bridge, redis-server, dockerd, podman, containers",
        );
        let lan = Lan::make(&ns);
        let remote = lan.as_ref().map(Lan::remote_ip).unwrap_or_default();
        let redis = lan
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|_| Redis::start(&ns, &remote, REDIS_PORT, b.bed.scratch()));
        let docker = match (&lan, which("dockerd").and(which("docker"))) {
            (Err(e), _) => Err(e.clone()),
            (_, None) => {
                Err("docker is not installed (scripts/install-deps.sh installs docker.io)".into())
            }
            (Ok(l), Some(_)) => Docker::start(&dir.join("docker"), &b.env.ferry, base, l.bridge()),
        };
        let podman = match which("podman") {
            None => Err("podman is not installed (scripts/install-deps.sh installs it)".into()),
            Some(_) => Podman::start(&dir.join("pm")),
        };
        let pasta = system_pasta(b);
        let mut containers = BTreeMap::new();
        let mut ports = BTreeMap::new();
        for name in CONTAINERS {
            let port = free_port();
            let at = dir.join(name);
            let publish = port
                .as_ref()
                .map(|p| format!("127.0.0.1:{p}:{NGINX_PORT}"))
                .unwrap_or_default();
            let c = match name {
                SLIRP | PASTA => podman.as_ref().map_err(Clone::clone).and_then(|p| {
                    let net = if name == SLIRP {
                        UserNet::Slirp4netns
                    } else {
                        UserNet::Pasta(pasta.clone()?)
                    };
                    p.container(name, &net, &publish, &at)
                        .map_err(|e| format!("{} ({net:?}): {e}", p.version()))
                }),
                _ => {
                    let opts = match name {
                        // ferry publishes the port in the engine's namespace.
                        FERRY => vec!["--runtime", PUBLISHING, "-p", &publish],
                        HOST => vec!["--network", "host"],
                        _ => vec!["-p", &publish],
                    };
                    docker
                        .as_ref()
                        .map_err(Clone::clone)
                        .and_then(|d| d.container(name, &opts, &at))
                }
            };
            // On the host's network nginx listens on the free port itself.
            let inner = if name == HOST {
                port.clone().unwrap_or(NGINX_PORT)
            } else {
                NGINX_PORT
            };
            let served = match (&c, &port) {
                (Ok(ctr), Ok(p)) => ctr.start_nginx(inner, &[WRK_FILE]).map(|()| *p),
                (Err(e), _) | (_, Err(e)) => Err(e.clone()),
            };
            containers.insert(name, c);
            ports.insert(name, served);
        }
        for (name, c) in &containers {
            if let Err(e) = c {
                crate::say(b.bar, &format!("C1: {name} is left out: {e}"));
            }
        }
        for (name, p) in &ports {
            if let (Err(e), Some(Ok(_))) = (p, containers.get(name)) {
                crate::say(b.bar, &format!("C1: {name}'s nginx is left out: {e}"));
            }
        }
        Setup {
            containers,
            nginx: ports,
            _podman: podman,
            docker,
            redis,
            remote,
            _lan: lan,
        }
    }
}

/// One run of a case: its metrics or why it failed.
fn once(
    b: &mut Bench<'_>,
    case: &Case,
    setup: &Setup,
) -> Result<Result<Metrics, String>, ExecError> {
    let on_host = case.param.label == WRK;
    let port = match setup.nginx.get(case.config.name.as_str()) {
        Some(Ok(p)) => p.to_string(),
        Some(Err(e)) if on_host => return Ok(Err(e.clone())),
        _ => String::new(),
    };
    let client: Vec<String> = case
        .client
        .iter()
        .map(|a| a.replace(REMOTE, &setup.remote).replace(PORT, &port))
        .collect();
    let ctr = match setup.containers.get(case.config.name.as_str()) {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => return Ok(Err(e.clone())),
        None => None,
    };
    let redis = match &setup.redis {
        Ok(r) => r,
        Err(e) => return Ok(Err(e.clone())),
    };
    let server0 = redis.cpu();
    let cpu0 = ctr.and_then(Ctr::cpu);
    let mut out = match ctr {
        Some(_) if on_host => RunOut {
            cpu_children: None,
            ..case.config.run(&client, case.timeout, None, b.env)?
        },
        Some(c) => {
            let out = in_container(c, &client, case.timeout, b)?;
            RunOut {
                cpu_children: cpu0.zip(c.cpu()).map(|(a, z)| z.saturating_sub(a)),
                ..out
            }
        }
        None => case.config.run(&client, case.timeout, None, b.env)?,
    };
    if let (Some(c), true) = (ctr, on_host) {
        out.cpu_children = cpu0.zip(c.cpu()).map(|(a, z)| z.saturating_sub(a));
    }
    out.server_cpu = Some(redis.cpu().saturating_sub(server0));
    if !out.outcome.success() {
        // An iperf3 server whose client was killed can stay busy: a fresh one.
        if let Err(e) = b.bed.restart(IPERF_PORT) {
            crate::say(b.bar, &format!("warning: restarting iperf3: {e}"));
        }
        return Ok(Err(out.outcome.failure()));
    }
    Ok((case.extract)(&out))
}

/// Runs `client` by the container's runner, as [`Config::run`] would on the host.
fn in_container(
    c: &Ctr,
    client: &[String],
    timeout: Duration,
    b: &Bench<'_>,
) -> Result<RunOut, ExecError> {
    use std::os::unix::process::ExitStatusExt as _;
    let t0 = Instant::now();
    let stop = || b.env.stop.is_set();
    let ran = c.run(client, t0 + timeout, &stop);
    if stop() {
        return Err(ExecError::Interrupted);
    }
    let (code, stdout, stderr) = match ran {
        Ok(r) => (r.code, r.stdout, r.stderr),
        Err(e) => (None, String::new(), e),
    };
    Ok(RunOut {
        outcome: crate::exec::Outcome {
            status: code.map(|c| std::process::ExitStatus::from_raw((c & 0xff) << 8)),
            timed_out: code.is_none() && t0.elapsed() >= timeout,
            stdout,
            stderr,
            elapsed: t0.elapsed(),
        },
        stats: None,
        cpu_busy: None,
        cpu_children: None,
        server_cpu: None,
        syscalls: None,
    })
}

/// Per-case samples and failures.
#[derive(Default)]
struct Tally {
    metrics: Vec<(&'static str, &'static str, Vec<f64>)>,
    failures: Vec<String>,
    dead: bool,
}

impl Tally {
    fn add(&mut self, values: Metrics) {
        for (name, unit, v) in values {
            match self.metrics.iter_mut().find(|m| m.0 == name) {
                Some(m) => m.2.push(v),
                None => self.metrics.push((name, unit, vec![v])),
            }
        }
    }

    fn fail(&mut self, why: String) {
        if self.failures.len() < 3 && !self.failures.contains(&why) {
            self.failures.push(why);
        }
    }
}

/// plan::measure's method with C1's runs: a warm-up per case (a failed one is not
/// repeated), then `runs` rounds of every case in turn, odd rounds in reverse
/// ([`crate::plan::rep_order`]).
fn measure(b: &mut Bench<'_>, cases: &[Case], setup: &Setup) -> Result<Vec<Row>, ExecError> {
    let mut tallies: Vec<Tally> = cases.iter().map(|_| Tally::default()).collect();
    for (case, t) in cases.iter().zip(&mut tallies) {
        let what = format!("C1 {} {} (warm-up)", case.config.name, case.param.label);
        crate::say(b.bar, &what);
        if let Err(why) = once(b, case, setup)? {
            t.fail(format!("warm-up {why}"));
            t.dead = true;
            b.bar.inc(b.runs as u64);
        }
        b.bar.inc(1);
    }
    for rep in 0..b.runs {
        for i in crate::plan::rep_order(rep, cases.len()) {
            let (case, t) = (&cases[i], &mut tallies[i]);
            if t.dead {
                continue;
            }
            match once(b, case, setup)? {
                Ok(v) => t.add(v),
                Err(why) => t.fail(why),
            }
            b.bar.inc(1);
        }
    }
    let mut rows = Vec::new();
    for (case, t) in cases.iter().zip(tallies) {
        let row = |metric: &str, unit: &str, samples: Vec<f64>| Row {
            experiment: "C1".into(),
            config: case.config.name.clone(),
            param: case.param.clone(),
            metric: metric.into(),
            unit: unit.into(),
            samples,
            planned: b.runs,
            failures: t.failures.clone(),
        };
        if t.metrics.is_empty() {
            rows.push(row("result", "-", Vec::new()));
        }
        for (name, unit, samples) in &t.metrics {
            rows.push(row(name, unit, samples.clone()));
        }
    }
    Ok(rows)
}

/// Start-up: a warm-up each, then per round [`STARTUP_RUNS`] timed `docker run --rm`
/// of each runtime, alternating; a round's p50, min and max (ms) are its samples.
fn startup(b: &mut Bench<'_>, cases: &[Case], setup: &Setup) -> Result<Vec<Row>, ExecError> {
    let k = cases.len();
    let mut samples: Vec<[Vec<f64>; 3]> = vec![Default::default(); k];
    let mut failed: Vec<Option<String>> = vec![None; k];
    let docker = setup.docker.as_ref();
    let argv = |c: &Case| {
        let d = docker.ok()?;
        let mut v = d.argv();
        v.extend(strings(&["run", "--rm"]));
        match c.config.name.as_str() {
            FERRY => v.extend(strings(&["--runtime", "ferry"])),
            FERRY_BASE => v.extend(strings(&["--runtime", BASE_RUNTIME])),
            _ => {}
        }
        v.extend(strings(&[IMAGE, "true"]));
        Some(v)
    };
    let once = |b: &Bench<'_>, c: &Case| -> Result<Result<f64, String>, ExecError> {
        let Some(v) = argv(c) else {
            return Ok(Err(docker.err().cloned().unwrap_or_default()));
        };
        let t = Config::native().time_once(&v, c.timeout, b.env);
        if b.env.stop.is_set() {
            return Err(ExecError::Interrupted);
        }
        Ok(t.map(|d| d.as_secs_f64() * 1e3))
    };
    for (i, c) in cases.iter().enumerate() {
        crate::say(b.bar, &format!("C1 {} start-up (warm-up)", c.config.name));
        if let Err(e) = once(b, c)? {
            failed[i] = Some(format!("warm-up {e}"));
        }
        b.bar.inc(1);
    }
    for _ in 0..b.runs {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); k];
        let t0 = Instant::now();
        for _ in 0..STARTUP_RUNS {
            for (i, c) in cases.iter().enumerate() {
                if failed[i].is_some() {
                    continue;
                }
                match once(b, c)? {
                    Ok(ms) => times[i].push(ms),
                    Err(e) => failed[i] = Some(e),
                }
            }
        }
        for (i, t) in times.iter().enumerate() {
            if let (None, Some((p50, min, max))) = (&failed[i], startup_stats(t)) {
                samples[i][0].push(p50);
                samples[i][1].push(min);
                samples[i][2].push(max);
            }
            b.bar.inc(1);
        }
        crate::say(
            b.bar,
            &format!("C1 start-up round: {:.0} s", t0.elapsed().as_secs_f64()),
        );
    }
    let mut rows = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        for (m, metric) in ["p50", "min", "max"].into_iter().enumerate() {
            let mut r =
                self::core::row(&c.config.name, STARTUP, metric, "ms", samples[i][m].clone());
            r.param = c.param.clone();
            r.planned = b.runs;
            r.failures = failed[i].iter().cloned().collect();
            rows.push(r);
        }
    }
    Ok(rows)
}
