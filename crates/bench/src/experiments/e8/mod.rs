//! E8: VM guests. A QEMU guest (scripts/guest-image.sh's: a Debian cloud kernel and a
//! busybox initramfs with iperf3 and sockperf) runs iperf3 TCP both ways (one stream,
//! and four), sockperf's 64 B TCP ping-pong and an ICMP ping against the remote's
//! servers, its virtio-net device served by `ferry vm --vhost-user` (1 queue pair, and
//! 2 over 2 NIC servers), passt 2026 `--vhost-user`, QEMU's `-netdev user` (libslirp)
//! and a TAP with the kernel's vhost-net (the limit; where /dev/vhost-net is missing,
//! the same TAP with QEMU's own virtio-net code, `tap-qemu`, in its place). The TAP
//! and its QEMU are in the remote namespace: the kernel alone carries the frames.
//! Each run boots its own guest (the `ferry-e8` helper, [`run`]); the accelerator (KVM
//! where a guest boots under it, TCG otherwise) is every row's parameter, and the
//! backend's own CPU time per byte (its process's threads; QEMU's main thread for the
//! user-mode stack, its vhost threads for vhost-net) stands beside the rates: an
//! emulated guest CPU bounds every rate under TCG, not what the backend costs. The
//! guest runs are scheduled normally (`chrt --other`) even under a real-time harness.
//! `ferry-vm-timed` runs the ping-pong alone with its NIC server timing its stages
//! (`ferry vm --nic-timing`): the per-packet cost by stage, as E5 has it for the TAP.
//! With `--baseline`, that build's `ferry vm` runs as `ferry-vm-base`.

pub mod run;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use plotters::prelude::SeriesLabelPosition;

use super::e5::E5_STAGES;
use super::{Experiment, Settings, strings};
use crate::config::{Config, Kind, RunOut, which};
use crate::guest::{Accel, Image, QEMU};
use crate::plan::{Case, Param, Row, median};
use crate::plot::{Area, COLORS, Pt, bar_slot, bars, category_chart, config_legend};
use crate::topology::{IPERF_PORT, SOCKPERF_PORT, Testbed};

/// E8's metrics: the helper's key, the metric's name and unit.
pub const METRICS: [(&str, &str, &str); 12] = [
    ("send", "TCP send", "Gbit/s"),
    ("recv", "TCP recv", "Gbit/s"),
    ("send4", "TCP send -P 4", "Gbit/s"),
    ("recv4", "TCP recv -P 4", "Gbit/s"),
    ("cpu_send", "backend CPU send", "ns/B"),
    ("cpu_recv", "backend CPU recv", "ns/B"),
    ("cpu_send4", "backend CPU send -P 4", "ns/B"),
    ("cpu_recv4", "backend CPU recv -P 4", "ns/B"),
    ("rtt50", "RTT p50 64 B", "us"),
    ("rtt99", "RTT p99 64 B", "us"),
    ("ping", "ICMP ping RTT", "us"),
    ("boot", "guest boot", "s"),
];

/// What [`E8::prepare`] found, for the cases and the report.
#[derive(Clone, Debug)]
struct Prep {
    image: Image,
    accel: Accel,
    accel_why: String,
    notes: Vec<String>,
}

/// Set by `prepare`: the image and accelerator, or why E8 cannot run here.
static PREP: Mutex<Option<Result<Prep, String>>> = Mutex::new(None);

fn prep() -> Option<Result<Prep, String>> {
    PREP.lock().ok().and_then(|p| p.clone())
}

/// E8 (see the module's header).
#[derive(Debug)]
pub struct E8;

impl Experiment for E8 {
    fn id(&self) -> &'static str {
        "E8"
    }

    fn title(&self) -> &'static str {
        "VM guests: vhost-user ferry vs passt, QEMU user, vhost-net"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("TCP send", "Gbit/s")
    }

    fn prepare(&self, _s: &Settings, _bed: &mut Testbed) -> Result<(), crate::Error> {
        let p = prepare_guest();
        if let Err(why) = &p {
            println!("E8: no guests: {why}");
        }
        if let Ok(mut slot) = PREP.lock() {
            *slot = Some(p);
        }
        Ok(())
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        match prep() {
            Some(Ok(p)) => cases(s, ready, &p),
            _ => Vec::new(),
        }
    }

    fn summary(&self, rows: &[Row]) -> String {
        summary(rows)
    }

    fn paper(&self) -> &'static str {
        "S1 batches a KVM guest's NIC operations through shared memory; the QEMU series' \
         own iperf3 figures (host→guest, KVM): -netdev user ~2 Gbit/s, passt over the \
         stream socket 3.9 Gbit/s, passt --vhost-user 32.1 Gbit/s."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1500, 600)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot(root, rows)
    }
}

/// QEMU, the image (built or reused in the target directory, or FERRY_GUEST_DIR), the
/// accelerator.
fn prepare_guest() -> Result<Prep, String> {
    if which(QEMU).is_none() {
        return Err(format!(
            "{QEMU} not found (scripts/install-deps.sh installs qemu-system-x86)"
        ));
    }
    let dir = std::env::var_os("FERRY_GUEST_DIR")
        .map(PathBuf::from)
        .or_else(Image::default_dir)
        .ok_or("no directory for the guest image (set FERRY_GUEST_DIR)")?;
    let image = Image::build(&Image::script(), &dir).map_err(|e| e.to_string())?;
    println!("E8: guest image in {}", dir.display());
    let (accel, accel_why) = Accel::detect(&image, Duration::from_secs(20));
    println!("E8: accelerator {} ({accel_why})", accel.name());
    let mut notes = Vec::new();
    if !Path::new("/dev/vhost-net").exists() {
        notes.push(
            "tap-vhost-net (the kernel's limit) skipped: /dev/vhost-net is missing \
             (modprobe vhost_net where the kernel has it); `tap-qemu` runs in its place: \
             the same TAP in the remote namespace, its frames moved by QEMU's own \
             virtio-net code (backend CPU: QEMU's main thread)"
                .to_owned(),
        );
    }
    Ok(Prep {
        image,
        accel,
        accel_why,
        notes,
    })
}

/// One guest configuration: its name, the helper's backend, queue pairs, and the
/// backend's binary (ferry's or passt's; QEMU's own for the others).
struct GuestConfig {
    name: &'static str,
    backend: &'static str,
    queues: u16,
    bin: Option<PathBuf>,
    /// The ping-pong alone, ferry's stages timed (`ferry-e8 --timed`).
    timed: bool,
}

impl GuestConfig {
    fn new(name: &'static str, backend: &'static str, queues: u16) -> GuestConfig {
        GuestConfig {
            name,
            backend,
            queues,
            bin: None,
            timed: false,
        }
    }

    fn with_bin(self, bin: PathBuf) -> GuestConfig {
        GuestConfig {
            bin: Some(bin),
            ..self
        }
    }
}

/// The configurations; with `--baseline`, that build's `ferry vm` (`ferry-vm-base`,
/// one queue pair) right after the measured one's: a before/after in one run.
fn configs(s: &Settings, ready: &[Config], p: &mut Prep) -> Vec<GuestConfig> {
    // The harness's copies: ferry's, and the newest pasta (passt and pasta are one
    // binary).
    let ferry = s.e6_bin.with_file_name("ferry");
    let mut v = vec![GuestConfig::new("ferry-vm", "ferry", 1).with_bin(ferry.clone())];
    if let Some(base) = &s.baseline {
        v.push(GuestConfig::new("ferry-vm-base", "ferry", 1).with_bin(base.clone()));
    }
    v.push(GuestConfig::new("ferry-vm-2q", "ferry", 2).with_bin(ferry.clone()));
    v.push(GuestConfig {
        timed: true,
        ..GuestConfig::new("ferry-vm-timed", "ferry", 1).with_bin(ferry)
    });
    if ready.iter().any(|c| c.name == "pasta-2026") {
        let passt = s.e6_bin.with_file_name("pasta-2026");
        v.push(GuestConfig::new("passt-2026", "passt", 1).with_bin(passt));
    } else if !p.notes.iter().any(|n| n.starts_with("passt-2026")) {
        p.notes.push(
            "passt-2026 skipped: no newest pasta/passt (FERRY_PASTA_SRC=DIR scripts/build-peers.sh)"
                .to_owned(),
        );
    }
    v.push(GuestConfig::new("qemu-user", "user", 1));
    if Path::new("/dev/vhost-net").exists() {
        v.push(GuestConfig::new("tap-vhost-net", "tap-vhost", 1));
    } else {
        v.push(GuestConfig::new("tap-qemu", "tap", 1));
    }
    v
}

fn cases(s: &Settings, ready: &[Config], p: &Prep) -> Vec<Case> {
    let mut p = p.clone();
    let list = configs(s, ready, &mut p);
    if let Ok(mut slot) = PREP.lock() {
        *slot = Some(Ok(p.clone()));
    }
    let secs: u32 = if s.quick { 2 } else { 5 };
    let helper = s.e6_bin.with_file_name("ferry-e8");
    list.into_iter()
        .map(|g| {
            // The guest's whole run at the normal policy: under `chrt -f`, TCG's vCPU
            // threads at a real-time priority never yield to the backend (or the
            // harness) at the same priority, and the run livelocks.
            let mut client = strings(&["chrt", "--other", "0"]);
            client.push(helper.to_string_lossy().into_owned());
            client.extend(strings(&[
                "--backend",
                g.backend,
                "--queues",
                &g.queues.to_string(),
                "--remote",
                &s.remote,
                "--remote-ns",
                &s.remote_ns,
                "--accel",
                p.accel.name(),
                "--secs",
                &secs.to_string(),
            ]));
            client.push("--kernel".into());
            client.push(p.image.kernel.to_string_lossy().into_owned());
            client.push("--initrd".into());
            client.push(p.image.initrd.to_string_lossy().into_owned());
            if let Some(b) = &g.bin {
                client.push("--bin".into());
                client.push(b.to_string_lossy().into_owned());
            }
            if g.timed {
                client.push("--timed".into());
            }
            Case {
                config: Config {
                    name: g.name.to_owned(),
                    kind: Kind::Native,
                    trace: false,
                },
                param: Param::new(p.accel.name(), 0.0),
                client,
                timeout: Duration::from_secs(u64::from(60 + 8 * secs)),
                pin: None,
                servers: vec![IPERF_PORT, SOCKPERF_PORT],
                extract: Box::new(extract),
            }
        })
        .collect()
}

/// A helper key's metric: [`METRICS`]', or a timed run's stage (`stage:NAME`, µs per
/// round trip; `calls:NAME`, calls per round trip; E5's metric names).
fn metric_of(key: &str) -> Option<(&'static str, &'static str)> {
    if let Some((_, name, unit)) = METRICS.iter().find(|(k, ..)| *k == key) {
        return Some((name, unit));
    }
    let (kind, stage) = key.split_once(':')?;
    let st = E5_STAGES.iter().find(|s| s.name == stage)?;
    match kind {
        "stage" => Some((st.us, "us/RT")),
        "calls" => Some((st.calls, "per RT")),
        _ => None,
    }
}

/// The helper's `E8 KEY VALUE` lines, as metrics.
fn extract(r: &RunOut) -> Result<crate::plan::Metrics, String> {
    let mut v = Vec::new();
    for line in r.outcome.stdout.lines() {
        let mut w = line.split_whitespace();
        if w.next() != Some("E8") {
            continue;
        }
        let (Some(key), Some(val)) = (w.next(), w.next()) else {
            continue;
        };
        let Some((name, unit)) = metric_of(key) else {
            continue;
        };
        let x: f64 = val.parse().map_err(|_| format!("bad value in {line:?}"))?;
        v.push((name, unit, x));
    }
    if v.is_empty() {
        return Err("the guest reported no metric".into());
    }
    Ok(v)
}

/// One goal: (what, metric, reference, op, target ratio ferry / reference, ferry's config).
type Goal = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    f64,
    &'static str,
);

const GOALS: [Goal; 8] = [
    (
        "bulk TCP send",
        "TCP send",
        "passt-2026",
        "≥",
        1.2,
        "ferry-vm",
    ),
    (
        "bulk TCP recv",
        "TCP recv",
        "passt-2026",
        "≥",
        1.2,
        "ferry-vm",
    ),
    (
        "bulk TCP send",
        "TCP send",
        "qemu-user",
        "≥",
        3.0,
        "ferry-vm",
    ),
    (
        "bulk TCP recv",
        "TCP recv",
        "qemu-user",
        "≥",
        3.0,
        "ferry-vm",
    ),
    (
        "RTT p50 64 B",
        "RTT p50 64 B",
        "passt-2026",
        "≤",
        1.0,
        "ferry-vm",
    ),
    (
        "2 queues, -P 4, send",
        "TCP send -P 4",
        "ferry-vm",
        ">",
        1.0,
        "ferry-vm-2q",
    ),
    (
        "2 queues, -P 4, recv",
        "TCP recv -P 4",
        "ferry-vm",
        ">",
        1.0,
        "ferry-vm-2q",
    ),
    (
        "backend CPU per byte, recv",
        "backend CPU recv",
        "passt-2026",
        "≤",
        1.0,
        "ferry-vm",
    ),
];

fn summary(rows: &[Row]) -> String {
    let mut out = String::new();
    match prep() {
        Some(Ok(p)) => {
            let _ = writeln!(
                out,
                "Accelerator: **{}** ({}). Every row's parameter is the accelerator. Under \
                 TCG the guest's CPU is emulated: it bounds every configuration's rate and \
                 RTT far below what the backends can do, so the rates rank the backends \
                 only loosely; the backend's own CPU time per byte moved (`backend CPU`, \
                 ns/B: its process's threads, QEMU's main thread for `qemu-user` and \
                 `tap-qemu`, QEMU's vhost threads for vhost-net) is what TCG does not distort. Guest MTU \
                 65520 (qemu-user: 1500, libslirp's). Each run boots its own guest. The guest's \
                 run (QEMU and the backend) is scheduled normally even when the harness \
                 runs under `chrt -f`: TCG's vCPU threads at a real-time priority starve \
                 the backend at the same priority.\n",
                p.accel.name(),
                p.accel_why
            );
            for n in &p.notes {
                let _ = writeln!(out, "- {n}");
            }
            out.push('\n');
        }
        Some(Err(why)) => {
            let _ = writeln!(out, "E8 did not run: {why}\n");
            return out;
        }
        None => {}
    }
    out.push_str(&goals(rows));
    out.push_str(&stages(rows));
    out
}

/// `ferry-vm-timed`'s per-packet cost by stage (µs per 64 B round trip; E5's stages,
/// the vhost-user queue's descriptor reads and writes in the TAP's rows), beside the
/// papers' figures.
fn stages(rows: &[Row]) -> String {
    const CONFIG: &str = "ferry-vm-timed";
    let Some(param) = rows
        .iter()
        .find(|r| r.config == CONFIG)
        .map(|r| r.param.label.clone())
    else {
        return String::new();
    };
    let mut out = String::from(
        "### Per packet, by stage (`ferry-vm-timed`)\n\n\
         The guest's 64 B TCP ping-pong alone, its NIC server timing its stages \
         (`ferry vm --nic-timing`, two clock reads a stage): µs per round trip (median of \
         the runs), calls per round trip. The vhost-user queue stands in for the TAP: its \
         descriptor reads are `TAP read`, its descriptor writes (and the guest's \
         notification) `TAP write`. Papers: S2 (a pseudo-NIC) adds 11.98 µs per packet \
         sent and 9.9 µs received over the host's path; S1 (batched I/O) cut the switches \
         per operation 5.5× (docs/SEEDS.md); E5 has the TAP's figures.\n\n\
         | stage | direction | µs per RT | calls per RT |\n|---|---|--:|--:|\n",
    );
    let mut total = 0.0;
    for st in E5_STAGES {
        let us = median(rows, CONFIG, &param, st.us);
        let calls = median(rows, CONFIG, &param, st.calls);
        total += us.unwrap_or(0.0);
        let cell = |v: Option<f64>| v.map_or("–".to_owned(), |x| crate::report::num(Some(x)));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            st.label,
            st.dir,
            cell(us),
            cell(calls)
        );
    }
    let rtt = median(rows, CONFIG, &param, "RTT p50 64 B");
    let _ = writeln!(
        out,
        "| **all stages** | | {} | |\n| RTT p50 (timed) | | {} | |\n",
        crate::report::num(Some(total)),
        crate::report::num(rtt)
    );
    out
}

fn goals(rows: &[Row]) -> String {
    let mut out = String::from(
        "| goal | ferry | reference | reference's | ferry / reference | target | met |\n\
         |---|--:|---|--:|--:|--:|---|\n",
    );
    for (what, metric, reference, op, target, ferry) in GOALS {
        let param = rows
            .iter()
            .find(|r| r.config == ferry)
            .map(|r| r.param.label.clone())
            .unwrap_or_default();
        let f = median(rows, ferry, &param, metric);
        let o = median(rows, reference, &param, metric);
        let unit = METRICS
            .iter()
            .find(|(_, n, _)| *n == metric)
            .map_or("", |m| m.2);
        let (ratio, met) = match (f, o) {
            (Some(a), Some(b)) if b > 0.0 => {
                let x = a / b;
                let ok = match op {
                    "≥" => x >= target,
                    "≤" => x <= target,
                    _ => x > target,
                };
                (format!("{x:.2}×"), if ok { "yes" } else { "**no**" })
            }
            _ => ("–".into(), "not measured"),
        };
        let _ = writeln!(
            out,
            "| {what} ({unit}) | {ferry} {} | {reference} | {} | {ratio} | {op} {target}× | {met} |",
            crate::report::num(f),
            crate::report::num(o),
        );
    }
    out.push('\n');
    out
}

/// Three panels: rates (Gbit/s), RTTs (µs), backend CPU per byte (ns/B); a bar per
/// configuration in each metric's group.
fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let panels = root.split_evenly((1, 3));
    let mut configs: Vec<String> = Vec::new();
    for r in rows {
        if !configs.contains(&r.config) {
            configs.push(r.config.clone());
        }
    }
    let groups: [(&str, &[&str]); 3] = [
        (
            "Gbit/s (higher is better)",
            &["TCP send", "TCP recv", "TCP send -P 4", "TCP recv -P 4"],
        ),
        (
            "µs (lower is better)",
            &["RTT p50 64 B", "RTT p99 64 B", "ICMP ping RTT"],
        ),
        (
            "backend CPU ns per byte (lower is better)",
            &[
                "backend CPU send",
                "backend CPU recv",
                "backend CPU send -P 4",
                "backend CPU recv -P 4",
            ],
        ),
    ];
    let accel = rows.first().map_or("", |r| r.param.label.as_str());
    for (i, (panel, (ydesc, metrics))) in panels.iter().zip(groups).enumerate() {
        let value = |c: &str, m: &str| {
            rows.iter()
                .find(|r| r.config == c && r.metric == m)
                .and_then(|r| Some((r.median()?, r.min()?, r.max()?)))
        };
        let mut items = Vec::new();
        let mut ymax: f64 = 0.0;
        for (gi, m) in metrics.iter().enumerate() {
            for (ci, c) in configs.iter().enumerate() {
                let (x, w) = bar_slot(gi, ci, configs.len());
                let pt = value(c, m).map(|(med, min, max)| Pt { x, med, min, max });
                if let Some(p) = pt {
                    ymax = ymax.max(p.max * 1.15);
                }
                let text = pt.map(|p| short(p.med)).unwrap_or_default();
                items.push((x, w, pt, COLORS[ci % COLORS.len()], text));
            }
        }
        let names: Vec<String> = metrics
            .iter()
            .map(|m| m.trim_start_matches("backend CPU ").to_owned())
            .collect();
        let title = if i == 0 {
            format!("E8 — VM guests ({accel})")
        } else {
            String::new()
        };
        let mut chart = category_chart(panel, &title, 20, &names, ymax.max(1e-3), ydesc)?;
        bars(&mut chart, &items)?;
        if i == 0 {
            config_legend(&mut chart, &configs, SeriesLabelPosition::UpperRight)?;
        }
    }
    Ok(())
}

/// A bar's label: three significant digits at most.
fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(config: &str, metric: &str, v: f64) -> Row {
        Row {
            experiment: "E8".into(),
            config: config.into(),
            param: Param::new("tcg", 0.0),
            metric: metric.into(),
            unit: "Gbit/s".into(),
            samples: vec![v],
            planned: 1,
            failures: Vec::new(),
        }
    }

    #[test]
    fn goals_compare_medians_in_the_same_run() {
        let rows = vec![
            row("ferry-vm", "TCP send", 3.0),
            row("passt-2026", "TCP send", 2.0),
            row("qemu-user", "TCP send", 1.5),
            row("ferry-vm", "TCP recv -P 4", 1.0),
            row("ferry-vm-2q", "TCP recv -P 4", 1.5),
        ];
        let g = goals(&rows);
        assert!(g.contains("| 1.50× | ≥ 1.2× | yes |"), "{g}");
        assert!(g.contains("| 2.00× | ≥ 3× | **no** |"), "{g}");
        assert!(g.contains("| 1.50× | > 1× | yes |"), "{g}");
        assert!(g.contains("not measured"), "{g}");
    }

    #[test]
    fn a_timed_runs_stages_become_e5s_metrics_and_a_table() {
        assert_eq!(metric_of("send"), Some(("TCP send", "Gbit/s")));
        assert_eq!(
            metric_of("stage:tap_write"),
            Some(("stage tap_write", "us/RT"))
        );
        assert_eq!(metric_of("calls:wake"), Some(("calls wake", "per RT")));
        assert_eq!(metric_of("stage:nonsense"), None);
        assert_eq!(metric_of("nonsense:tap_write"), None);
        assert!(stages(&[row("ferry-vm", "TCP send", 1.0)]).is_empty());
        let rows = vec![
            row("ferry-vm-timed", "stage tap_write", 2.5),
            row("ferry-vm-timed", "stage host_recv", 1.5),
            row("ferry-vm-timed", "calls tap_write", 1.0),
            row("ferry-vm-timed", "RTT p50 64 B", 300.0),
        ];
        let t = stages(&rows);
        assert!(
            t.contains("| TAP write (syscall) | rx | 2.50 | 1.00 |"),
            "{t}"
        );
        assert!(t.contains("| **all stages** | | 4.00 | |"), "{t}");
        assert!(t.contains("| RTT p50 (timed) | | 300.0 | |"), "{t}");
    }
}
