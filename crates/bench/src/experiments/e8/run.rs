//! One E8 run of one configuration (the `ferry-e8` helper, E8's client program): start
//! the backend (ferry vm, passt, nothing for QEMU's user-mode stack, a TAP in the
//! remote namespace), boot the guest that runs the tests against the remote's servers,
//! sample the backend's own CPU time whenever the guest marks the start or end of a
//! test on its console, and print one `E8 KEY VALUE` line per metric.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::guest::{Accel, Guest, Image, Net, said};
use crate::topology::{IPERF_PORT, SOCKPERF_PORT};

/// Which backend serves the guest's virtio-net device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `ferry vm --vhost-user` (its binary in `bin`).
    Ferry,
    /// `passt --vhost-user` (its binary in `bin`, run under the name passt).
    Passt,
    /// QEMU's `-netdev user` (libslirp, inside QEMU).
    User,
    /// A TAP in the remote namespace with the kernel's vhost-net.
    TapVhost,
    /// The same TAP, its frames moved by QEMU itself (no vhost-net).
    Tap,
}

impl Backend {
    /// Parses the `--backend` value.
    pub fn parse(s: &str) -> Option<Backend> {
        Some(match s {
            "ferry" => Backend::Ferry,
            "passt" => Backend::Passt,
            "user" => Backend::User,
            "tap-vhost" => Backend::TapVhost,
            "tap" => Backend::Tap,
            _ => return None,
        })
    }
}

/// What one run needs.
#[derive(Clone, Debug)]
pub struct Opts {
    /// The backend.
    pub backend: Backend,
    /// ferry's or passt's binary.
    pub bin: Option<PathBuf>,
    /// Queue pairs (ferry: one NIC server each).
    pub queues: u16,
    /// The remote's address (iperf3 and sockperf servers).
    pub remote: String,
    /// The remote's network namespace (where the TAP configurations run).
    pub remote_ns: String,
    /// The accelerator.
    pub accel: Accel,
    /// The guest's image.
    pub image: Image,
    /// Seconds per test.
    pub secs: u32,
    /// Only the ping-pong, with ferry's NIC servers timing their stages
    /// (`ferry vm --nic-timing`): the per-packet cost by stage.
    pub timed: bool,
}

/// Whose CPU time is the backend's.
#[derive(Clone, Debug)]
enum Cpu {
    /// Every thread of this process.
    All(u32),
    /// QEMU's main thread (its event loop: libslirp, QEMU's own TAP I/O).
    Main,
    /// The vhost worker threads of QEMU (`vhost-<pid>`).
    Vhost,
}

/// The ping-pong's lines the guest prints (`PP `): the percentiles and the totals.
const PP_LINES: &str = "grep -E 'percentile (50|99)\\.000 |Total '|sed 's/^/PP /'";

/// The guest's script: four iperf3 tests (each bracketed by `MARK` lines), sockperf's
/// 64 B ping-pong and an ICMP ping; `timed`: the ping-pong alone.
fn script(remote: &str, secs: u32, timed: bool) -> String {
    if timed {
        return format!(
            "sockperf ping-pong --tcp -i {remote} -p {SOCKPERF_PORT} -t {secs} -m 64 --full-rtt 2>&1|{PP_LINES}\n"
        );
    }
    format!(
        "r={remote};t={secs}\n\
         m(){{ echo MARK $1; }}\n\
         b(){{ m $1;iperf3 -c $r -p {IPERF_PORT} -t $t -f k --connect-timeout 3000 $2 2>&1|grep -E 'receiver|error'|tail -1|sed \"s/^/IPERF $1 /\";m $1.; }}\n\
         b s \"\";b r -R;b s4 \"-P 4\";b r4 \"-R -P 4\"\n\
         sockperf ping-pong --tcp -i $r -p {SOCKPERF_PORT} -t $t -m 64 --full-rtt 2>&1|{PP_LINES}\n\
         ping -c 5 -i 0.2 -W 2 $r|sed -n 's/.*= [0-9.]*\\/\\([0-9.]*\\)\\/.*/PING \\1/p'\n"
    )
}

/// A started backend: the process (none for QEMU's own), the guest's addressing.
struct Started {
    child: Option<Child>,
    addr: (String, String),
    mtu: u32,
    net: Net,
    cpu: Cpu,
    /// The TAP to delete afterwards: (namespace, name).
    tap: Option<(String, String)>,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            stop(c);
        }
        if let Some((ns, t)) = &self.tap {
            let _ = Command::new("ip")
                .args(["-n", ns, "link", "del", t])
                .status();
        }
    }
}

/// SIGTERM, up to 3 s to exit, then SIGKILL.
fn stop(c: &mut Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        if !matches!(c.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

fn wait_socket(sock: &Path, child: &mut Child) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        if !matches!(child.try_wait(), Ok(None)) || Instant::now() > end {
            return Err(format!("the backend never listened on {}", sock.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Where a timed run's `ferry vm` writes its counters (beside the socket).
fn stats_file(sock: &Path) -> PathBuf {
    sock.with_file_name("stats.json")
}

fn start_ferry(o: &Opts, bin: &Path, sock: &Path) -> Result<Started, String> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "vm",
        "--mtu",
        "65520",
        "--nic-servers",
        &o.queues.to_string(),
    ]);
    if o.timed {
        cmd.arg("--nic-timing")
            .arg("--stats-json")
            .arg(stats_file(sock));
    }
    let mut child = cmd
        .arg("--vhost-user")
        .arg(sock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .map(str::to_owned)
    };
    let (Some(ip), Some(gw)) = (field("ip="), field("gw=")) else {
        let mut c = child;
        stop(&mut c);
        return Err(format!("ferry vm announced no address: {line:?}"));
    };
    wait_socket(sock, &mut child)?;
    let pid = child.id();
    Ok(Started {
        child: Some(child),
        addr: (ip, gw),
        mtu: 65520,
        net: Net::VhostUser {
            socket: sock.to_owned(),
            queues: o.queues,
        },
        cpu: Cpu::All(pid),
        tap: None,
    })
}

fn start_passt(bin: &Path, sock: &Path) -> Result<Started, String> {
    use std::os::unix::process::CommandExt as _;
    // passt and pasta are one binary: the name it runs under picks the mode.
    let mut child = Command::new(bin)
        .arg0("passt")
        .args(["--vhost-user", "-f", "-q", "-1", "-m", "65520"])
        .args(["-a", "10.77.0.2", "-n", "24", "-g", "10.77.0.1", "-s"])
        .arg(sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    if let Err(e) = wait_socket(sock, &mut child) {
        stop(&mut child);
        return Err(e);
    }
    let pid = child.id();
    Ok(Started {
        child: Some(child),
        addr: ("10.77.0.2/24".into(), "10.77.0.1".into()),
        mtu: 65520,
        net: Net::VhostUser {
            socket: sock.to_owned(),
            queues: 1,
        },
        cpu: Cpu::All(pid),
        tap: None,
    })
}

/// A TAP in the remote namespace (QEMU runs there too): the guest reaches the remote's
/// servers through the kernel alone.
fn start_tap(o: &Opts) -> Result<Started, String> {
    let name = format!("e8tap{}", std::process::id() % 100_000);
    let ns = o.remote_ns.as_str();
    let steps: [&[&str]; 3] = [
        &["tuntap", "add", "dev", &name, "mode", "tap"],
        &["addr", "add", "10.79.0.1/24", "dev", &name],
        &["link", "set", &name, "mtu", "65520", "up"],
    ];
    for args in steps {
        let ok = Command::new("ip")
            .args(["-n", ns])
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("ip")
                .args(["-n", ns, "link", "del", &name])
                .status();
            return Err(format!("ip -n {ns} {} failed", args.join(" ")));
        }
    }
    let vhost = o.backend == Backend::TapVhost;
    Ok(Started {
        child: None,
        addr: ("10.79.0.2/24".into(), "10.79.0.1".into()),
        mtu: 65520,
        net: Net::Tap {
            ifname: name.clone(),
            vhost,
        },
        cpu: if vhost { Cpu::Vhost } else { Cpu::Main },
        tap: Some((ns.to_owned(), name)),
    })
}

fn start(o: &Opts, sock: &Path) -> Result<Started, String> {
    let bin = || o.bin.clone().ok_or("--bin is needed for this backend");
    match o.backend {
        Backend::Ferry => start_ferry(o, &bin()?, sock),
        Backend::Passt => start_passt(&bin()?, sock),
        Backend::User => Ok(Started {
            child: None,
            addr: ("10.0.2.15/24".into(), "10.0.2.2".into()),
            mtu: 1500,
            net: Net::User,
            cpu: Cpu::Main,
            tap: None,
        }),
        Backend::Tap | Backend::TapVhost => start_tap(o),
    }
}

/// Nanoseconds of CPU time (`/proc/<pid>/task/*/schedstat`) of the tasks `pid`'s
/// `which` selects.
fn cpu_ns(which: &Cpu, qemu: u32) -> u64 {
    let pid = match which {
        Cpu::All(p) => *p,
        Cpu::Main | Cpu::Vhost => qemu,
    };
    let pick = |tid: u32, comm: &str| match which {
        Cpu::All(_) => true,
        Cpu::Main => tid == qemu,
        Cpu::Vhost => comm.starts_with("vhost-"),
    };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            let tid = t.file_name().to_string_lossy().parse().unwrap_or(0);
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            pick(tid, comm.trim())
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| crate::parse::schedstat_run_ns(&s).ok())
        .sum()
}

/// What the guest printed and the backend's CPU time at each of its marks.
struct Console {
    text: String,
    marks: Vec<(String, u64)>,
    boot: Option<Duration>,
}

/// Boots the guest and reads its console to the end, sampling the backend's CPU.
fn boot(o: &Opts, s: &Started, dir: &Path) -> Result<Console, String> {
    let g = Guest {
        accel: o.accel,
        image: o.image.clone(),
        net: s.net.clone(),
        addr: Some(s.addr.clone()),
        mtu: Some(s.mtu),
        script: script(&o.remote, o.secs, o.timed),
        mem_mb: 256,
        smp: 2,
    };
    let q = g.command().map_err(|e| e.to_string())?;
    let mut cmd = if matches!(s.net, Net::Tap { .. }) {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &o.remote_ns]).arg(q.get_program());
        c.args(q.get_args()).stdin(Stdio::null());
        c
    } else {
        q
    };
    let err_log = dir.join("qemu.err");
    let err = std::fs::File::create(&err_log).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut qemu = cmd
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start QEMU: {e}"))?;
    let qpid = qemu.id();
    let mut c = Console {
        text: String::new(),
        marks: Vec::new(),
        boot: None,
    };
    let out = qemu.stdout.take().ok_or("no console")?;
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        let l = line.trim();
        if let Some(m) = l.strip_prefix("MARK ") {
            c.marks.push((m.to_owned(), cpu_ns(&s.cpu, qpid)));
        } else if l == "FERRY-GUEST-READY" {
            c.boot = Some(t0.elapsed());
        }
        c.text.push_str(l);
        c.text.push('\n');
    }
    let _ = qemu.wait();
    if said(&c.text, "FERRY-GUEST-EXIT").is_none() {
        let why = std::fs::read_to_string(&err_log).unwrap_or_default();
        let last = why.lines().last().unwrap_or("").trim().to_owned();
        return Err(format!("the guest did not finish (QEMU: {last})"));
    }
    Ok(c)
}

/// Rate (kbit/s) and seconds of iperf3's `receiver` line.
pub fn iperf_line(line: &str) -> Option<(f64, f64)> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let at = w.iter().position(|x| *x == "Kbits/sec")?;
    let kbps: f64 = w.get(at.checked_sub(1)?)?.parse().ok()?;
    let secs = w.iter().find_map(|x| {
        let (a, b) = x.split_once('-')?;
        Some(b.parse::<f64>().ok()? - a.parse::<f64>().ok()?)
    })?;
    Some((kbps, secs))
}

/// The metrics of a finished guest's console: (key, value), keys as [`super::METRICS`].
pub fn metrics(text: &str, marks: &[(String, u64)]) -> Vec<(&'static str, f64)> {
    let mark = |k: &str| marks.iter().find(|(m, _)| m == k).map(|(_, ns)| *ns);
    let mut v = Vec::new();
    for (t, key, cpu) in [
        ("s", "send", "cpu_send"),
        ("r", "recv", "cpu_recv"),
        ("s4", "send4", "cpu_send4"),
        ("r4", "recv4", "cpu_recv4"),
    ] {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("IPERF ")?.strip_prefix(t)?.strip_prefix(' '));
        let Some((kbps, secs)) = line.and_then(iperf_line) else {
            continue;
        };
        v.push((key, kbps / 1e6));
        let bytes = kbps * 1000.0 / 8.0 * secs;
        if let (Some(a), Some(b)) = (mark(t), mark(&format!("{t}.")))
            && bytes > 0.0
            && b >= a
        {
            v.push((cpu, (b - a) as f64 / bytes));
        }
    }
    for (p, key) in [("50.000", "rtt50"), ("99.000", "rtt99")] {
        let val = text.lines().find_map(|l| {
            let rest = l.strip_prefix("PP ")?;
            rest.contains(&format!("percentile {p} "))
                .then(|| rest.rsplit('=').next()?.trim().parse::<f64>().ok())?
        });
        if let Some(us) = val {
            v.push((key, us));
        }
    }
    if let Some(ms) = said(text, "PING").and_then(|x| x.parse::<f64>().ok()) {
        v.push(("ping", ms * 1000.0));
    }
    v
}

/// Runs the configuration; the metrics lines, or why it failed.
pub fn run(o: &Opts) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("ferry-e8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = run_in(o, &dir);
    // Our own directory: the socket, QEMU's log.
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(o: &Opts, dir: &Path) -> Result<String, String> {
    let sock = dir.join("vu.sock");
    let started = start(o, &sock)?;
    let console = boot(o, &started, dir)?;
    // (ferry vm writes its counters as it stops.)
    drop(started);
    if o.timed {
        return timed_metrics(&console.text, &stats_file(&sock));
    }
    let mut m = metrics(&console.text, &console.marks);
    if let Some(b) = console.boot {
        m.push(("boot", b.as_secs_f64()));
    }
    let missing: Vec<&str> = super::METRICS
        .iter()
        .map(|(k, ..)| *k)
        .filter(|k| !m.iter().any(|(x, _)| x == k))
        .collect();
    let mut out: String = m.iter().map(|(k, v)| format!("E8 {k} {v}\n")).collect();
    out.push_str(&format!("E8-ACCEL {}\n", o.accel.name()));
    if m.iter().any(|(k, _)| *k == "send") {
        if !missing.is_empty() {
            out.push_str(&format!("E8-MISSING {}\n", missing.join(" ")));
        }
        Ok(out)
    } else {
        let err = console
            .text
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or("no iperf3 result on the console");
        Err(format!("the guest measured nothing: {err}"))
    }
}

/// A timed run's lines: the RTT, and each stage of ferry's NIC servers per round trip
/// (`E8 stage:NAME µs`, `E8 calls:NAME n`; round trips: every message sockperf
/// received, its warm-up included, as the counters are).
fn timed_metrics(console: &str, stats: &Path) -> Result<String, String> {
    let pp: String = console
        .lines()
        .filter_map(|l| l.strip_prefix("PP "))
        .map(|l| format!("{l}\n"))
        .collect();
    let p = crate::parse::sockperf_pp(&pp).map_err(|e| format!("the guest's ping-pong: {e}"))?;
    let json = std::fs::read_to_string(stats)
        .map_err(|e| format!("ferry vm's counters ({}): {e}", stats.display()))?;
    let nic = crate::parse::nic_stats(&json)?;
    if nic.stages.is_empty() {
        return Err("ferry vm's counters have no stage timing".into());
    }
    Ok(stage_lines(p.p50, p.p99, p.total_received, &nic))
}

/// [`timed_metrics`]' lines from the ping-pong's figures and the servers' counters.
fn stage_lines(p50: f64, p99: f64, rts: u64, nic: &crate::parse::NicCounters) -> String {
    let rts = rts.max(1) as f64;
    let mut out = format!("E8 rtt50 {p50}\nE8 rtt99 {p99}\n");
    for st in crate::experiments::e5::E5_STAGES {
        let c = nic.stage(st.name);
        out.push_str(&format!(
            "E8 stage:{} {}\n",
            st.name,
            c.ns as f64 / 1e3 / rts
        ));
        out.push_str(&format!("E8 calls:{} {}\n", st.name, c.calls as f64 / rts));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf_receiver_lines_parse() {
        let l = "[SUM]   0.00-2.04   sec  40.9 MBytes  168654 Kbits/sec                  receiver";
        assert_eq!(iperf_line(l), Some((168_654.0, 2.04)));
        assert_eq!(iperf_line("iperf3: error - unable to connect"), None);
    }

    #[test]
    fn metrics_from_a_console() {
        let text = "FERRY-GUEST-READY\nMARK s\n\
            IPERF s [  5]   0.00-2.00   sec  40 MBytes  160000 Kbits/sec   receiver\n\
            MARK s.\nMARK r\nIPERF r iperf3: error - the server is busy\nMARK r.\n\
            PP sockperf: ---> percentile 99.000 = 3972.794\n\
            PP sockperf: ---> percentile 50.000 =  245.689\n\
            PING 1.739\nFERRY-GUEST-EXIT 0\n";
        let marks = vec![
            ("s".to_owned(), 1_000),
            ("s.".to_owned(), 40_001_000),
            ("r".to_owned(), 50_000_000),
            ("r.".to_owned(), 60_000_000),
        ];
        let m = metrics(text, &marks);
        let get = |k: &str| m.iter().find(|(x, _)| *x == k).map(|(_, v)| *v);
        assert_eq!(get("send"), Some(0.16));
        // 40 ms of CPU over 0.16 Gbit/s for 2 s (40 MB): 1 ns per byte.
        assert!((get("cpu_send").unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(get("recv"), None);
        assert_eq!(get("cpu_recv"), None);
        assert_eq!(get("rtt50"), Some(245.689));
        assert_eq!(get("rtt99"), Some(3972.794));
        assert!((get("ping").unwrap() - 1739.0).abs() < 1e-9);
    }

    #[test]
    fn a_timed_run_reports_each_stage_per_round_trip() {
        let nic = crate::parse::NicCounters {
            stages: vec![(
                "tap_write".to_owned(),
                crate::parse::StageCount {
                    calls: 2000,
                    hits: 1000,
                    ns: 3_000_000,
                },
            )],
            ..Default::default()
        };
        let out = stage_lines(250.0, 900.0, 1000, &nic);
        assert!(out.starts_with("E8 rtt50 250\nE8 rtt99 900\n"), "{out}");
        assert!(out.contains("E8 stage:tap_write 3\n"), "{out}");
        assert!(out.contains("E8 calls:tap_write 2\n"), "{out}");
        assert!(out.contains("E8 stage:wake 0\n"), "{out}");
        assert!(script("10.0.0.2", 2, true).starts_with("sockperf ping-pong"));
        assert!(script("10.0.0.2", 2, false).contains("iperf3"));
    }
}
