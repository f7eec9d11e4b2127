//! E1: one-way burst bandwidth vs buffer size (S0's figures 1 and 6–9): iperf3 at each
//! buffer size under every configuration, ferry at three spin spans among them.

use plotters::prelude::*;

use super::{Experiment, Headline, Settings, ferry_variant, iperf_extract, pick};
use crate::config::Config;
use crate::plan::{Case, Param, Row};
use crate::plot::{Area, COLORS, err, label, legend, lines, max_of, series};
use crate::topology::IPERF_PORT;

/// E1 (see the module's header).
#[derive(Debug)]
pub struct E1;

impl Experiment for E1 {
    fn id(&self) -> &'static str {
        "E1"
    }

    fn title(&self) -> &'static str {
        "one-way burst bandwidth vs buffer size"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("bandwidth", "Gbit/s")
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn headlines(&self, rows: &[Row]) -> Vec<Headline> {
        let sizes: Vec<&str> = rows
            .iter()
            .filter(|r| r.config == "native")
            .map(|r| r.param.label.as_str())
            .collect();
        ["64", "4K", "64K", "256K"]
            .into_iter()
            .filter(|size| sizes.contains(size))
            .map(|size| Headline {
                label: format!("E1 bandwidth, {size} buffers (Gbit/s)"),
                metric: "bandwidth".into(),
                ferry: ("ferry", size.into()),
                others: size.into(),
            })
            .collect()
    }

    fn paper(&self) -> &'static str {
        "S0 (Hnet, UML on GbE), fig. 1 and 6–9: original UML 31 MB/s vs host 117 MB/s; Hnet \
         alone 71 MB/s receive; **Hnet + SBW reached the host's bandwidth (117 MB/s)**; DMHU \
         (no guest copy) +18% at 512-byte buffers."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1000, 650)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot(root, rows)
    }
}

fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
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
    configs.extend(ferry_variant(ready, "ferry-spin0", Some("0"), None));
    configs.extend(ferry_variant(ready, "ferry-spin1ms", Some("1ms"), None));
    let sizes: &[u64] = if s.quick {
        &[64, 4096, 262_144]
    } else {
        &[64, 256, 1024, 4096, 16_384, 65_536, 262_144]
    };
    let secs = s.secs(3);
    let mut out = Vec::new();
    for &size in sizes {
        for c in &configs {
            out.push(Case {
                config: c.clone(),
                param: Param::new(size_label(size), size as f64),
                client: s.iperf3(IPERF_PORT, secs, &["-l", &size.to_string()]),
                timeout: s.timeout(secs),
                pin: None,
                servers: vec![IPERF_PORT],
                extract: iperf_extract(),
            });
        }
    }
    out
}

fn size_label(bytes: u64) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}K", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let s = series(rows, "bandwidth");
    let ymax = (max_of(&s) * 1.1).max(0.1);
    let mut chart = ChartBuilder::on(root)
        .caption(
            "E1 — one-way burst bandwidth vs buffer size (iperf3)",
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((48f64..350_000f64).log_scale(), 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc("buffer size (bytes, log scale)")
        .y_desc("Gbit/s")
        .x_label_formatter(&|x| tick(*x))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in s.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        lines(&mut chart, pts, c, &label(name, pts))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// An x-axis label: bytes, or KiB above 1024.
fn tick(x: f64) -> String {
    if x >= 1024.0 {
        format!("{}K", (x / 1024.0).round())
    } else {
        format!("{}", x.round())
    }
}
