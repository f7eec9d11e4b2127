//! E2: ping-pong RTT and wake-ups per round trip vs ferry's spin span (S0's tables 1,
//! 3, 4 and 6): sockperf 64 B under ferry at each `--spin`, the other configurations and
//! an epoll event loop as reference lines.

use plotters::prelude::*;

use super::{Experiment, Headline, Settings, pick, pingpong_extract};
use crate::config::Config;
use crate::plan::{Case, Param, Row};
use crate::plot::{
    Area, COLORS, Pt, err, label, legend, lines, positions, reference, reindex, series,
};
use crate::topology::SOCKPERF_PORT;

/// E2 (see the module's header).
#[derive(Debug)]
pub struct E2;

impl Experiment for E2 {
    fn id(&self) -> &'static str {
        "E2"
    }

    fn title(&self) -> &'static str {
        "ping-pong RTT and wakes per round trip vs spin span"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("rtt_p50", "us")
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn headlines(&self, rows: &[Row]) -> Vec<Headline> {
        if rows.is_empty() {
            return Vec::new();
        }
        vec![Headline {
            label: "E2 RTT p50, ferry at default spin 200us (µs)".into(),
            metric: "rtt_p50".into(),
            ferry: ("ferry-spin200us", "200us".into()),
            others: "-".into(),
        }]
    }

    fn paper(&self) -> &'static str {
        "S0 tables 1, 3, 4, 6: burst ping-pong RTT **146 µs host**, 427 µs original UML, 264 \
         Hnet, ~226 with SBW, **205 µs best** (with DMHU). Table 4, over 200,000 round trips: \
         polling span 0 → **199,983** notifications (292 µs), 1 jiffy → **565** (226 µs), 10 \
         jiffies → **1** (228 µs); one sleep costs ~32 µs."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1400, 600)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot(root, rows)
    }
}

/// Spin spans of E2, in µs.
const SPINS_US: [u32; 10] = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500];

fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(5);
    let client = s.sockperf("ping-pong", secs, &["-m", "64", "--full-rtt"]);
    let mut out = Vec::new();
    let spins: &[u32] = if s.quick { &[0, 50, 200] } else { &SPINS_US };
    // nic mode is a reference line like the peers (its NIC server's spin is
    // `--server-spin`, not the shim's `--spin`).
    let mut plain = pick(
        ready,
        &["native", "ferry-nic", "slirp4netns", "pasta", "pasta-2026"],
    );
    if let Some(base) = s
        .baseline
        .as_ref()
        .filter(|_| ready.iter().any(|c| c.name == "ferry"))
    {
        // ferry at its defaults, and the same from the baseline build, side by side.
        plain.push(Config::ferry_args("ferry", &[]));
        plain.push(Config::ferry_build("ferry-base", base));
    }
    for c in plain {
        out.push(Case {
            config: c,
            param: Param::none(),
            client: client.clone(),
            timeout: s.timeout(secs),
            pin: None,
            servers: vec![SOCKPERF_PORT],
            extract: pingpong_extract(),
        });
    }
    for &us in spins {
        let spin = format!("{us}us");
        if !ready.iter().any(|c| c.name == "ferry") {
            break;
        }
        // The default (pair) receive path: a reader that spun out sleeps in the kernel,
        // and the shim counts those sleeps for the server's stats (`pair_sleeps`, part
        // of `wakes`), beside the server's wakes and the doorbells.
        let c = Config::ferry_args(&format!("ferry-spin{spin}"), &["--spin", &spin]);
        out.push(Case {
            config: c,
            param: Param::new(spin.clone(), f64::from(us)),
            client: client.clone(),
            timeout: s.timeout(secs),
            pin: None,
            servers: vec![SOCKPERF_PORT],
            extract: pingpong_extract(),
        });
    }
    // An event loop: sockperf waiting in `epoll_wait` (its `-F` wants a file naming the
    // connection), natively and through ferry at its defaults, where the shim's wait
    // spins before it sleeps too.
    let script = format!(
        "f=$(mktemp) || exit 1; echo T:{ip}:{SOCKPERF_PORT} > \"$f\"; \
         sockperf ping-pong -f \"$f\" -F epoll -t {secs} -m 64 --full-rtt; r=$?; \
         rm -f \"$f\"; exit $r",
        ip = s.remote
    );
    let epoll_client = vec!["sh".to_owned(), "-c".to_owned(), script];
    let mut native = pick(ready, &["native"]);
    for c in &mut native {
        c.name = "native-epoll".into();
    }
    if ready.iter().any(|c| c.name == "ferry") {
        native.push(Config::ferry_args("ferry-epoll", &[]));
    }
    for c in native {
        out.push(Case {
            config: c,
            param: Param::none(),
            client: epoll_client.clone(),
            timeout: s.timeout(secs),
            pin: None,
            servers: vec![SOCKPERF_PORT],
            extract: pingpong_extract(),
        });
    }
    out
}

fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let (map, labels) = positions(rows);
    let n = labels.len().max(1) as f64;
    let (left, right) = root.split_horizontally(720);
    let p50 = series(rows, "rtt_p50");
    let p99 = series(rows, "rtt_p99");
    let all: Vec<f64> = p50
        .iter()
        .chain(&p99)
        .flat_map(|(_, p)| p.iter().flat_map(|p| [p.min, p.max]))
        .collect();
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .clamp(0.1, 1e6)
        * 0.8;
    let hi = (all.iter().copied().fold(0.0, f64::max) * 1.3).max(lo * 10.0);
    let fmt = |x: &f64| labels.get(x.round() as usize).cloned().unwrap_or_default();
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "E2 — ping-pong RTT vs ferry's spin span",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(-0.3f64..(n - 0.7), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_labels(labels.len() + 1)
        .x_label_formatter(&fmt)
        .x_desc("spin span (sockperf 64 B, TCP, --full-rtt)")
        .y_desc("round trip, µs (log)")
        .y_labels(15)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    // Every ferry-spin* configuration is one point of one line.
    for (metric, s, c) in [("p50", &p50, COLORS[0]), ("p99", &p99, COLORS[1])] {
        let mut pts: Vec<Pt> = s
            .iter()
            .filter(|(n, _)| n.starts_with("ferry"))
            .flat_map(|(_, p)| reindex(p, &map))
            .collect();
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
        lines(
            &mut chart,
            &pts,
            c,
            &label(&format!("ferry RTT {metric}"), &pts),
        )?;
    }
    reference(&mut chart, &p50, -0.3, n - 0.7, " p50")?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;

    let wakes = series(rows, "wakes_per_rt");
    let sleeps = series(rows, "sleeps_per_rt");
    let mut chart = ChartBuilder::on(&right)
        .caption("wake-ups per round trip", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(-0.3f64..(n - 0.7), (1e-4f64..20f64).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_labels(labels.len() + 1)
        .x_label_formatter(&fmt)
        .x_desc("spin span")
        .y_desc("per round trip (log; 0 drawn at 1e-4)")
        .draw()
        .map_err(err)?;
    for (what, s, c) in [
        ("wake-ups (server, doorbell, kernel)", &wakes, COLORS[2]),
        ("server sleeps", &sleeps, COLORS[4]),
    ] {
        let pts: Vec<Pt> = s
            .iter()
            .flat_map(|(_, p)| reindex(p, &map))
            .map(|p| Pt {
                med: p.med.max(1e-4),
                min: p.min.max(1e-4),
                max: p.max.max(1e-4),
                ..p
            })
            .collect();
        lines(&mut chart, &pts, c, &label(what, &pts))?;
    }
    // ferry at its default spin under an epoll event loop (no spin parameter).
    reference(&mut chart, &wakes, -0.3, n - 0.7, " wake-ups")?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}
