//! E4: batching (S1's figures 3 and 5): sockperf throughput, RTT and crossings per
//! operation vs ferry's `--batch` threshold.

use plotters::prelude::*;

use super::{Experiment, Settings, ferry_variant, pick, pingpong_extract};
use crate::config::{Config, RunOut};
use crate::parse;
use crate::plan::{Case, Extract, Param, Row};
use crate::plot::{Area, COLORS, Pt, Series, err, label, legend, lines, max_of, reference, series};
use crate::topology::SOCKPERF_PORT;

/// E4 (see the module's header).
#[derive(Debug)]
pub struct E4;

impl Experiment for E4 {
    fn id(&self) -> &'static str {
        "E4"
    }

    fn title(&self) -> &'static str {
        "batching: throughput, RTT and crossings vs batch threshold"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("throughput", "Mbit/s")
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn paper(&self) -> &'static str {
        "S1 figs. 3, 5 (KVM, emulated PCnet32, iperf): send 58 → 318 Mbit/s, **5.5× at 30 \
         batched operations**; receive 127 → 303 Mbit/s (2.4×) at 6; RTT did **not** grow \
         with the batch size (the idle flush sends the queue as soon as the guest waits)."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1600, 560)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot(root, rows)
    }
}

fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(3);
    let batches: &[u32] = if s.quick {
        &[1, 8, 64]
    } else {
        &[1, 2, 4, 8, 16, 32, 64]
    };
    let stream = s.sockperf("throughput", secs, &["-m", "1024"]);
    let pp = s.sockperf("ping-pong", secs, &["-m", "64", "--full-rtt"]);
    let mut out = Vec::new();
    let mut push = |c: Config, param: Param| {
        for (client, extract) in [
            (stream.clone(), stream_extract()),
            (pp.clone(), pingpong_extract()),
        ] {
            out.push(Case {
                config: c.clone(),
                param: param.clone(),
                client,
                timeout: s.timeout(secs),
                pin: None,
                servers: vec![SOCKPERF_PORT],
                extract,
            });
        }
    };
    for c in pick(ready, &["native"]) {
        push(c, Param::none());
    }
    for &n in batches {
        if let Some(c) = ferry_variant(ready, &format!("ferry-batch{n}"), None, Some(n)) {
            push(c, Param::new(format!("batch {n}"), f64::from(n)));
        }
    }
    out
}

fn stream_extract() -> Extract {
    Box::new(|r: &RunOut| {
        let (rate, mbps) = parse::sockperf_tp(&r.outcome.stdout)?;
        let mut v = vec![("throughput", "Mbit/s", mbps), ("messages", "msg/s", rate)];
        if let Some(st) = &r.stats {
            let ops = st.requests.max(1) as f64;
            v.push(("wakes_per_op", "per request", st.wakes() as f64 / ops));
            v.push((
                "syscalls_per_op",
                "per request",
                st.data_syscalls as f64 / ops,
            ));
        }
        Ok(v)
    })
}

/// An E4 panel: title, (metric, legend) pairs, y unit, log scale.
type Panel = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
    bool,
);

fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let panels = root.split_evenly((1, 3));
    let specs: [Panel; 3] = [
        (
            "throughput, 1 KiB messages",
            &[("throughput", "sockperf stream")],
            "Mbit/s",
            false,
        ),
        (
            "RTT p50 (64 B ping-pong)",
            &[("rtt_p50", "ping-pong p50")],
            "µs",
            false,
        ),
        (
            "crossings per operation",
            &[
                ("wakes_per_op", "wakes+doorbells / request (stream)"),
                ("syscalls_per_op", "server syscalls / request (stream)"),
                ("wakes_per_rt", "wakes+doorbells / round trip"),
            ],
            "per operation (log)",
            true,
        ),
    ];
    for (area, (title, metrics, unit, log)) in panels.iter().zip(specs) {
        let all: Vec<(String, Series)> = metrics
            .iter()
            .map(|(m, l)| ((*l).to_owned(), series(rows, m)))
            .collect();
        let ymax = all.iter().map(|(_, s)| max_of(s)).fold(0.0, f64::max) * 1.2;
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(format!("E4 — {title}"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65);
        let xr = (0.8f64..80f64).log_scale();
        let fmt = |x: &f64| format!("{}", x.round());
        if log {
            let mut chart = builder
                .build_cartesian_2d(xr, (1e-3f64..ymax.max(2.0)).log_scale())
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(RGBColor(238, 238, 238))
                .light_line_style(RGBColor(238, 238, 238))
                .x_label_formatter(&fmt)
                .x_desc("--batch (log)")
                .y_desc(unit)
                .draw()
                .map_err(err)?;
            for (i, (l, s)) in all.iter().enumerate() {
                let pts: Vec<Pt> = s
                    .iter()
                    .flat_map(|(_, p)| p.iter().filter(|p| !p.x.is_nan()).copied())
                    .map(|p| Pt {
                        med: p.med.max(1e-3),
                        min: p.min.max(1e-3),
                        max: p.max.max(1e-3),
                        ..p
                    })
                    .collect();
                lines(&mut chart, &pts, COLORS[i + 2], &label(l, &pts))?;
            }
            legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        } else {
            let mut chart = builder
                .build_cartesian_2d(xr, 0f64..ymax.max(1.0))
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(RGBColor(238, 238, 238))
                .light_line_style(RGBColor(238, 238, 238))
                .x_label_formatter(&fmt)
                .x_desc("--batch (log)")
                .y_desc(unit)
                .draw()
                .map_err(err)?;
            for (l, s) in &all {
                let pts: Vec<Pt> = s
                    .iter()
                    .flat_map(|(_, p)| p.iter().filter(|p| !p.x.is_nan()).copied())
                    .collect();
                lines(
                    &mut chart,
                    &pts,
                    COLORS[0],
                    &label(&format!("ferry {l}"), &pts),
                )?;
                reference(&mut chart, s, 0.8, 80.0, "")?;
            }
            legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        }
    }
    Ok(())
}
