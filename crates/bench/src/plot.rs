//! One PNG per experiment, shaped like the paper's figure: E1 bandwidth vs buffer size
//! (log x, one line per configuration), E2 RTT and wakes per round trip vs spin span
//! (the event-loop configurations as reference lines),
//! E3 bars of MFlops, E4 throughput / RTT / crossings vs batch, E5 nic mode's per-packet
//! stages (stacked, beside S2's figures), RTT, MTU and NIC servers, R1 grouped bars
//! normalized to native, E6 latency per response and throughput vs file size. Pure-Rust
//! bitmap backend; text in DejaVu Sans.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::experiments::Experiment;
use crate::plan::Row;

/// The font every label is drawn in (Debian's fonts-dejavu-core).
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Registers DejaVu Sans as "sans-serif" (once per process).
fn font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = std::fs::read(FONT).map_err(|e| {
            format!("cannot read {FONT} ({e}): install fonts-dejavu-core (scripts/install-deps.sh)")
        })?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT} is not a usable font"))
    })
    .clone()
}

/// Per configuration, its points.
type Series = Vec<(String, Vec<Pt>)>;

/// One point: x, median, min, max.
#[derive(Clone, Copy, Debug)]
struct Pt {
    x: f64,
    med: f64,
    min: f64,
    max: f64,
}

/// Series of `metric` in experiment `e`, per configuration in first-seen order; a
/// configuration with no successful run has an empty series.
fn series(rows: &[Row], e: Experiment, metric: &str) -> Series {
    let mut out: Series = Vec::new();
    for r in rows.iter().filter(|r| r.experiment == e.id()) {
        let idx = match out.iter().position(|(n, _)| *n == r.config) {
            Some(i) => i,
            None => {
                out.push((r.config.clone(), Vec::new()));
                out.len() - 1
            }
        };
        if r.metric != metric {
            continue;
        }
        if let (Some(med), Some(min), Some(max)) = (r.median(), r.min(), r.max()) {
            out[idx].1.push(Pt {
                x: r.param.x,
                med,
                min,
                max,
            });
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
    }
    out
}

fn max_of(s: &Series) -> f64 {
    s.iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.max))
        .fold(0.0, f64::max)
}

fn label(name: &str, pts: &[Pt]) -> String {
    if pts.is_empty() {
        format!("{name} (failed)")
    } else {
        name.to_owned()
    }
}

/// Writes `<dir>/<e>.png` for experiment `e`.
pub fn draw(dir: &Path, e: Experiment, rows: &[Row]) -> Result<(), String> {
    font()?;
    let path = dir.join(format!("{}.png", e.id().to_lowercase()));
    let size = match e {
        Experiment::E1 | Experiment::E3 => (1000, 650),
        Experiment::E2 => (1400, 600),
        Experiment::E4 => (1600, 560),
        Experiment::E5 => (1800, 1100),
        Experiment::E6 => (1500, 620),
        Experiment::E7 => (1600, 620),
        Experiment::R1 => (1400, 650),
    };
    let root = BitMapBackend::new(&path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    match e {
        Experiment::E1 => e1(&root, rows)?,
        Experiment::E2 => e2(&root, rows)?,
        Experiment::E3 => e3(&root, rows)?,
        Experiment::E4 => e4(&root, rows)?,
        Experiment::E5 => e5(&root, rows)?,
        Experiment::E6 => e6(&root, rows)?,
        Experiment::E7 => e7(&root, rows)?,
        Experiment::R1 => r1(&root, rows)?,
    }
    root.present().map_err(err)
}

fn size_label(x: f64) -> String {
    if x >= 1024.0 {
        format!("{}K", (x / 1024.0).round())
    } else {
        format!("{}", x.round())
    }
}

fn e1(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let s = series(rows, Experiment::E1, "bandwidth");
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
        .x_label_formatter(&|x| size_label(*x))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in s.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        lines(&mut chart, pts, c, &label(name, pts))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

type Chart<'a, 'b, X, Y> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<X, Y>>;

/// A line with dots and min–max whiskers.
fn lines<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    pts: &[Pt],
    c: RGBColor,
    name: &str,
) -> Result<(), String>
where
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|p| (p.x, p.med)),
            c.stroke_width(2),
        ))
        .map_err(err)?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    chart
        .draw_series(pts.iter().map(|p| Circle::new((p.x, p.med), 4, c.filled())))
        .map_err(err)?;
    chart
        .draw_series(
            pts.iter()
                .map(|p| PathElement::new(vec![(p.x, p.min), (p.x, p.max)], c.stroke_width(1))),
        )
        .map_err(err)?;
    Ok(())
}

fn legend<'a, 'b: 'a, X, Y>(
    chart: &mut Chart<'a, 'b, X, Y>,
    pos: SeriesLabelPosition,
) -> Result<(), String>
where
    X: plotters::coord::ranged1d::Ranged,
    Y: plotters::coord::ranged1d::Ranged,
{
    chart
        .configure_series_labels()
        .position(pos)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// Maps sorted distinct parameter values to 0, 1, 2 … (for axes like spin spans that
/// include 0), with their labels.
fn positions(rows: &[Row], e: Experiment) -> (BTreeMap<u64, usize>, Vec<String>) {
    let mut xs: Vec<(f64, String)> = rows
        .iter()
        .filter(|r| r.experiment == e.id() && !r.param.x.is_nan())
        .map(|r| (r.param.x, r.param.label.clone()))
        .collect();
    xs.sort_by(|a, b| a.0.total_cmp(&b.0));
    xs.dedup_by(|a, b| a.0 == b.0);
    let map = xs
        .iter()
        .enumerate()
        .map(|(i, (x, _))| (x.to_bits(), i))
        .collect();
    (map, xs.into_iter().map(|(_, l)| l).collect())
}

fn reindex(pts: &[Pt], map: &BTreeMap<u64, usize>) -> Vec<Pt> {
    pts.iter()
        .filter_map(|p| map.get(&p.x.to_bits()).map(|&i| Pt { x: i as f64, ..*p }))
        .collect()
}

/// Reference configurations (no parameter) as horizontal lines across the x range.
fn reference<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    s: &Series,
    x0: f64,
    x1: f64,
    suffix: &str,
) -> Result<(), String>
where
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    for (i, (name, pts)) in s.iter().enumerate() {
        let Some(p) = pts.first().filter(|p| p.x.is_nan()) else {
            continue;
        };
        let c = COLORS[(i + 3) % COLORS.len()];
        let y = p.med;
        chart
            .draw_series(LineSeries::new([(x0, y), (x1, y)], c.stroke_width(2)))
            .map_err(err)?
            .label(format!("{name}{suffix}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    Ok(())
}

/// E6: latency per response (log y) and throughput, per way, against the file size.
fn e6(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let (map, labels) = positions(rows, Experiment::E6);
    let n = labels.len().max(1) as f64;
    let panels = root.split_evenly((1, 2));
    for (k, (metric, title, unit)) in [
        (
            "latency_p50",
            "E6 — latency per response, p50",
            "µs (log scale)",
        ),
        ("throughput", "E6 — throughput (header + file)", "MB/s"),
    ]
    .into_iter()
    .enumerate()
    {
        let s: Series = series(rows, Experiment::E6, metric)
            .into_iter()
            .map(|(name, pts)| (name, reindex(&pts, &map)))
            .collect();
        let ymax = (max_of(&s) * 1.3).max(1.0);
        let ymin = s
            .iter()
            .flat_map(|(_, p)| p.iter().map(|p| p.min))
            .fold(f64::INFINITY, f64::min)
            .clamp(0.1, ymax / 2.0)
            * 0.7;
        let area = &panels[k];
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70);
        let lbl = labels.clone();
        let fmt = move |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                lbl.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        if k == 0 {
            let mut chart = builder
                .build_cartesian_2d(-0.3f64..(n - 0.7), (ymin..ymax).log_scale())
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(RGBColor(238, 238, 238))
                .x_desc("file size")
                .y_desc(unit)
                .x_labels(labels.len().max(2))
                .x_label_formatter(&fmt)
                .draw()
                .map_err(err)?;
            for (i, (name, pts)) in s.iter().enumerate() {
                lines(&mut chart, pts, COLORS[i % COLORS.len()], &label(name, pts))?;
            }
            legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        } else {
            let mut chart = builder
                .build_cartesian_2d(-0.3f64..(n - 0.7), 0f64..ymax)
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(RGBColor(238, 238, 238))
                .x_desc("file size")
                .y_desc(unit)
                .x_labels(labels.len().max(2))
                .x_label_formatter(&fmt)
                .draw()
                .map_err(err)?;
            for (i, (name, pts)) in s.iter().enumerate() {
                lines(&mut chart, pts, COLORS[i % COLORS.len()], &label(name, pts))?;
            }
            legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        }
    }
    Ok(())
}

fn e2(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let (map, labels) = positions(rows, Experiment::E2);
    let n = labels.len().max(1) as f64;
    let (left, right) = root.split_horizontally(720);
    let p50 = series(rows, Experiment::E2, "rtt_p50");
    let p99 = series(rows, Experiment::E2, "rtt_p99");
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

    let wakes = series(rows, Experiment::E2, "wakes_per_rt");
    let sleeps = series(rows, Experiment::E2, "sleeps_per_rt");
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

/// Vertical bars at integer x with min–max whiskers and a text above each.
fn bars<Y>(
    chart: &mut Chart<'_, '_, RangedCoordf64, Y>,
    bars: &[(f64, f64, Option<Pt>, RGBColor, String)],
) -> Result<(), String>
where
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    for (x, w, pt, c, text) in bars {
        let (x, w, c) = (*x, *w, *c);
        match pt {
            Some(p) => {
                chart
                    .draw_series([Rectangle::new(
                        [(x - w / 2.0, 0.0), (x + w / 2.0, p.med)],
                        c.filled(),
                    )])
                    .map_err(err)?;
                chart
                    .draw_series([PathElement::new(
                        vec![(x, p.min), (x, p.max)],
                        BLACK.stroke_width(1),
                    )])
                    .map_err(err)?;
                chart
                    .draw_series([Text::new(
                        text.clone(),
                        (x - w / 2.0, p.max),
                        ("sans-serif", 13),
                    )])
                    .map_err(err)?;
            }
            None => {
                chart
                    .draw_series([Text::new(
                        "failed".to_owned(),
                        (x - w / 2.0, 0.0),
                        ("sans-serif", 13).into_font().color(&RED),
                    )])
                    .map_err(err)?;
            }
        }
    }
    Ok(())
}

/// A chart with one category per integer x (labelled with `names`) from 0 to `ymax`,
/// its mesh drawn: the frame of every grouped-bar plot.
fn category_chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    caption_size: u32,
    names: &[String],
    ymax: f64,
    ydesc: &str,
) -> Result<Chart<'a, 'b, RangedCoordf64, RangedCoordf64>, String> {
    let n = names.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", caption_size))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(-0.5f64..(n - 0.5), 0f64..ymax)
        .map_err(err)?;
    let fmt = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 0.01 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .disable_x_mesh()
        .x_labels(names.len() + 1)
        .x_label_formatter(&fmt)
        .y_desc(ydesc)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// Where bar `ci` of `k` in group `gi` stands, and its width.
fn bar_slot(gi: usize, ci: usize, k: usize) -> (f64, f64) {
    let w = 0.8 / k.max(1) as f64;
    (gi as f64 - 0.4 + w * (ci as f64 + 0.5), w * 0.9)
}

/// A legend entry (a coloured square) per configuration, in bar order.
fn config_legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b, RangedCoordf64, RangedCoordf64>,
    configs: &[String],
    pos: SeriesLabelPosition,
) -> Result<(), String> {
    for (ci, c) in configs.iter().enumerate() {
        let col = COLORS[ci % COLORS.len()];
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(err)?
            .label(c.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], col.filled()));
    }
    legend(chart, pos)
}

fn e3(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let s = series(rows, Experiment::E3, "mflops");
    let kept = series(rows, Experiment::E3, "kept");
    let ymax = (max_of(&s) * 1.2).max(1.0);
    let names: Vec<String> = s.iter().map(|(n, _)| n.clone()).collect();
    let mut chart = category_chart(
        root,
        "E3 — MFlops of a burner beside a 10 MB/s transfer (one CPU)",
        22,
        &names,
        ymax,
        "MFlops (median; whiskers min–max)",
    )?;
    let items: Vec<_> = s
        .iter()
        .enumerate()
        .map(|(i, (name, pts))| {
            let k = kept
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, p)| p.first())
                .map(|p| format!("{:.0}%", p.med))
                .unwrap_or_default();
            let text = pts
                .first()
                .map(|p| format!("{:.0} {k}", p.med))
                .unwrap_or_default();
            (
                i as f64,
                0.6,
                pts.first().copied(),
                COLORS[i % COLORS.len()],
                text,
            )
        })
        .collect();
    bars(&mut chart, &items)
}

/// An E4 panel: title, (metric, legend) pairs, y unit, log scale.
type Panel = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
    bool,
);

fn e4(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
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
            .map(|(m, l)| ((*l).to_owned(), series(rows, Experiment::E4, m)))
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

/// E5: nic mode's per-packet overhead by stage (stacked, per direction) beside the RTT
/// difference to native halved and S2's published figures, as placed and on one core;
/// RTT p50 per configuration; bulk TCP by MTU; 2 NIC servers vs 1.
fn e5(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    use crate::experiments::{E5_MTUS, E5_TCP, E5_TCP_ONE, E5_UDP, E5_UDP_ONE};
    let (top, bottom) = root.split_vertically(560);
    let up = top.split_evenly((1, 2));
    let down = bottom.split_evenly((1, 3));
    stacked(
        &up[0],
        rows,
        E5_TCP,
        E5_UDP,
        "E5 — per packet by stage, as placed (ferry-nic-timed)",
    )?;
    stacked(
        &up[1],
        rows,
        E5_TCP_ONE,
        E5_UDP_ONE,
        "E5 — per packet by stage, one core (ferry-nic-timed)",
    )?;
    let configs: Vec<String> = ["native", "ferry", "ferry-nic", "ferry-nic-timed"]
        .iter()
        .filter(|c| rows.iter().any(|r| r.experiment == "E5" && r.config == **c))
        .map(|c| (*c).to_owned())
        .collect();
    grouped(
        &down[0],
        rows,
        "rtt_p50",
        &[
            (E5_TCP, "TCP"),
            (E5_UDP, "UDP"),
            (E5_TCP_ONE, "TCP, 1 core"),
            (E5_UDP_ONE, "UDP, 1 core"),
        ],
        &configs,
        "E5 — RTT p50, 64 B ping-pong (lower is better)",
        "µs",
    )?;
    let mtus: Vec<String> = E5_MTUS
        .iter()
        .map(|m| format!("ferry-nic mtu{m}"))
        .collect();
    grouped(
        &down[1],
        rows,
        "bandwidth",
        &[("iperf3 TCP send", "send"), ("iperf3 TCP recv", "recv")],
        &mtus,
        "E5 — bulk TCP through nic mode by MTU",
        "Gbit/s",
    )?;
    let servers = ["ferry-nic 1 server", "ferry-nic 2 servers"].map(str::to_owned);
    grouped(
        &down[2],
        rows,
        "bandwidth",
        &[
            ("iperf3 -P 4 send", "-P 4 send"),
            ("iperf3 -P 4 recv", "-P 4 recv"),
        ],
        &servers,
        "E5 — iperf3 -P 4: 2 NIC servers vs 1",
        "Gbit/s",
    )
}

/// E5's stacked stages of one placement: TCP and UDP, tx and rx, with ferry-nic's RTT
/// difference to native halved as a mark, and S2's figures.
fn stacked(area: &Area<'_>, rows: &[Row], tcp: &str, udp: &str, title: &str) -> Result<(), String> {
    use crate::experiments::E5_STAGES;
    use crate::nic_report::{S2_RX_US, S2_TX_US, half_diff, median};
    let bars_of: [(&str, &str, &str); 4] = [
        ("TCP tx", tcp, "tx"),
        ("TCP rx", tcp, "rx"),
        ("UDP tx", udp, "tx"),
        ("UDP rx", udp, "rx"),
    ];
    let mut names: Vec<String> = bars_of.iter().map(|b| b.0.to_owned()).collect();
    names.extend(["S2 tx".to_owned(), "S2 rx".to_owned()]);
    // Per bar: (stage index, bottom, top).
    let mut stacks: Vec<Vec<(usize, f64, f64)>> = Vec::new();
    let mut marks: Vec<Option<f64>> = Vec::new();
    let mut ymax: f64 = S2_TX_US * 1.9;
    for (_, w, dir) in bars_of {
        let mut y = 0.0;
        let mut stack = Vec::new();
        for (si, st) in E5_STAGES.iter().enumerate() {
            let share = match st.dir {
                d if d == dir => 1.0,
                "both" => 0.5,
                _ => 0.0,
            };
            if let Some(v) = median(rows, "E5", "ferry-nic-timed", w, st.us) {
                let h = v * share;
                if h > 0.0 {
                    stack.push((si, y, y + h));
                    y += h;
                }
            }
        }
        let mark = half_diff(rows, w, "ferry-nic");
        // Room above the bars for the legend.
        ymax = ymax.max(y * 1.9).max(mark.unwrap_or(0.0) * 1.9);
        stacks.push(stack);
        marks.push(mark);
    }
    let mut chart = category_chart(area, title, 20, &names, ymax, "µs per packet")?;
    for (bi, stack) in stacks.iter().enumerate() {
        let x = bi as f64;
        for &(si, lo, hi) in stack {
            let c = COLORS[si % COLORS.len()];
            chart
                .draw_series([Rectangle::new([(x - 0.3, lo), (x + 0.3, hi)], c.filled())])
                .map_err(err)?;
        }
        // A negative difference (faster than native) is drawn at 0, labelled.
        if let Some(m) = marks[bi] {
            let y = m.max(0.0);
            chart
                .draw_series([PathElement::new(
                    vec![(x - 0.4, y), (x + 0.4, y)],
                    BLACK.stroke_width(3),
                )])
                .map_err(err)?;
            chart
                .draw_series([Text::new(
                    format!("{m:.1}"),
                    (x + 0.3, y),
                    ("sans-serif", 13),
                )])
                .map_err(err)?;
        }
    }
    let grey = RGBColor(170, 170, 170);
    for (i, v) in [S2_TX_US, S2_RX_US].into_iter().enumerate() {
        let x = 4.0 + i as f64;
        chart
            .draw_series([Rectangle::new(
                [(x - 0.3, 0.0), (x + 0.3, v)],
                grey.filled(),
            )])
            .map_err(err)?;
        chart
            .draw_series([Text::new(format!("{v}"), (x - 0.3, v), ("sans-serif", 13))])
            .map_err(err)?;
    }
    for (si, st) in E5_STAGES.iter().enumerate() {
        if st.dir == "poll" {
            continue;
        }
        let c = COLORS[si % COLORS.len()];
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(err)?
            .label(st.label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], c.filled()));
    }
    chart
        .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
        .map_err(err)?
        .label("ferry-nic: (RTT − native) / 2")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLACK.stroke_width(3)));
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// Grouped bars of E5's `metric`: one group per parameter (its label, its name on the
/// axis), one bar per configuration.
fn grouped(
    area: &Area<'_>,
    rows: &[Row],
    metric: &str,
    groups: &[(&str, &str)],
    configs: &[String],
    title: &str,
    ydesc: &str,
) -> Result<(), String> {
    let mut items = Vec::new();
    let mut ymax: f64 = 0.1;
    for (gi, (g, _)) in groups.iter().enumerate() {
        for (ci, c) in configs.iter().enumerate() {
            let (x, w) = bar_slot(gi, ci, configs.len());
            let pt = rows
                .iter()
                .find(|r| {
                    r.experiment == "E5"
                        && r.config == *c
                        && r.param.label == *g
                        && r.metric == metric
                })
                .and_then(|r| {
                    Some(Pt {
                        x,
                        med: r.median()?,
                        min: r.min()?,
                        max: r.max()?,
                    })
                });
            if let Some(p) = pt {
                ymax = ymax.max(p.max * 1.35);
            }
            let text = pt
                .map(|p| {
                    if p.med >= 100.0 {
                        format!("{:.0}", p.med)
                    } else {
                        format!("{:.1}", p.med)
                    }
                })
                .unwrap_or_default();
            items.push((x, w, pt, COLORS[ci % COLORS.len()], text));
        }
    }
    let names: Vec<String> = groups.iter().map(|(_, n)| (*n).to_owned()).collect();
    let mut chart = category_chart(area, title, 18, &names, ymax, ydesc)?;
    bars(&mut chart, &items)?;
    config_legend(&mut chart, configs, SeriesLabelPosition::UpperRight)
}

/// E7: time per operation (grouped bars per placement, lower is better) for the send
/// and the send+recv workloads, and K-connection throughput by number of servers.
fn e7(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let panels = root.split_evenly((1, 3));
    e7_bars(
        &panels[0],
        rows,
        "send,",
        "E7 — send, 2 × 1 KiB streams",
        "µs per message",
    )?;
    e7_bars(
        &panels[1],
        rows,
        "send+recv,",
        "E7 — send+recv, 2 × 1 KiB ping-pong",
        "µs per round trip",
    )?;
    let right = &panels[2];
    let s: Series = series(rows, Experiment::E7, "k_bandwidth")
        .into_iter()
        .filter(|(_, pts)| !pts.is_empty())
        .map(|(name, pts)| {
            let pts = pts
                .into_iter()
                .map(|p| Pt {
                    x: p.x - 100.0,
                    ..p
                })
                .collect();
            (name, pts)
        })
        .collect();
    let ymax = (max_of(&s) * 1.2).max(0.1);
    let xmax = s
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.x))
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(right)
        .caption(
            "E7 — K parallel connections (iperf3 -P K)",
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(0.5f64..(xmax + 0.5), 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc("connections")
        .y_desc("Gbit/s")
        .x_label_formatter(&|x| format!("{}", x.round()))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in s.iter().enumerate() {
        lines(&mut chart, pts, COLORS[i % COLORS.len()], name)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// Grouped bars of E7's `time_per_op` for the parameters starting with `prefix`.
fn e7_bars(
    area: &Area<'_>,
    rows: &[Row],
    prefix: &str,
    title: &str,
    ydesc: &str,
) -> Result<(), String> {
    let r: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.experiment == "E7" && r.metric == "time_per_op" && r.param.label.starts_with(prefix)
        })
        .collect();
    let mut groups: Vec<String> = Vec::new();
    let mut configs: Vec<String> = Vec::new();
    for row in &r {
        if !groups.contains(&row.param.label) {
            groups.push(row.param.label.clone());
        }
        if !configs.contains(&row.config) {
            configs.push(row.config.clone());
        }
    }
    let mut items = Vec::new();
    let mut ymax: f64 = 0.1;
    for (gi, g) in groups.iter().enumerate() {
        for (ci, c) in configs.iter().enumerate() {
            let (x, w) = bar_slot(gi, ci, configs.len());
            let pt = r
                .iter()
                .find(|row| row.config == *c && row.param.label == *g)
                .and_then(|row| {
                    Some(Pt {
                        x,
                        med: row.median()?,
                        min: row.min()?,
                        max: row.max()?,
                    })
                });
            if let Some(p) = pt {
                ymax = ymax.max(p.max * 1.3);
            }
            let text = pt.map(|p| format!("{:.1}", p.med)).unwrap_or_default();
            items.push((x, w, pt, COLORS[ci % COLORS.len()], text));
        }
    }
    let caption = format!("{title} (lower is better)");
    let mut chart = category_chart(area, &caption, 18, &groups, ymax, ydesc)?;
    bars(&mut chart, &items)?;
    config_legend(&mut chart, &configs, SeriesLabelPosition::UpperLeft)
}

fn r1(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let r: Vec<&Row> = rows.iter().filter(|r| r.experiment == "R1").collect();
    let mut groups: Vec<(String, String, String)> = Vec::new();
    let mut configs: Vec<String> = Vec::new();
    for row in &r {
        let g = (
            row.param.label.clone(),
            row.metric.clone(),
            row.unit.clone(),
        );
        if row.config == "native" && !groups.contains(&g) {
            groups.push(g);
        }
        if !configs.contains(&row.config) {
            configs.push(row.config.clone());
        }
    }
    let value = |config: &str, g: &(String, String, String)| {
        r.iter()
            .find(|x| x.config == config && x.param.label == g.0 && x.metric == g.1)
            .and_then(|x| Some((x.median()?, x.min()?, x.max()?)))
    };
    let mut items = Vec::new();
    let mut ymax: f64 = 1.2;
    for (gi, g) in groups.iter().enumerate() {
        let Some((base, _, _)) = value("native", g) else {
            continue;
        };
        let lower_better = g.2 == "us";
        for (ci, c) in configs.iter().enumerate() {
            let (x, w) = bar_slot(gi, ci, configs.len());
            let pt = value(c, g).map(|(m, lo, hi)| {
                let f = |v: f64| if lower_better { base / v } else { v / base };
                let (a, b) = (f(lo), f(hi));
                Pt {
                    x,
                    med: f(m),
                    min: a.min(b),
                    max: a.max(b),
                }
            });
            if let Some(p) = pt {
                ymax = ymax.max(p.max * 1.15);
            }
            let text = pt.map(|p| format!("{:.2}", p.med)).unwrap_or_default();
            items.push((x, w, pt, COLORS[ci % COLORS.len()], text));
        }
    }
    let names: Vec<String> = groups.iter().map(|g| g.1.clone()).collect();
    let mut chart = category_chart(
        root,
        "R1 — real clients, relative to native (higher is better)",
        22,
        &names,
        ymax,
        "× native (throughput: x/native; µs: native/x)",
    )?;
    bars(&mut chart, &items)?;
    config_legend(&mut chart, &configs, SeriesLabelPosition::UpperRight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Param;

    fn row(e: &str, config: &str, param: Param, metric: &str, unit: &str) -> Row {
        Row {
            experiment: e.into(),
            config: config.into(),
            param,
            metric: metric.into(),
            unit: unit.into(),
            samples: vec![1.0, 2.0, 3.0],
            planned: 3,
            failures: Vec::new(),
        }
    }

    /// The grouped-bar plots (E3, E5, E7, R1) draw from rows, with a failed configuration too.
    #[test]
    fn grouped_bar_plots_are_drawn() {
        if font().is_err() {
            eprintln!("skipped: {FONT} missing (scripts/install-deps.sh)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ferry-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let none = Param::none;
        let mut failed = row(
            "R1",
            "pasta",
            Param::new("redis -P 1", 0.0),
            "GET -P 1",
            "req/s",
        );
        failed.samples.clear();
        let rows = vec![
            row("E3", "native", none(), "mflops", "MFlops"),
            row("E3", "ferry", none(), "kept", "%"),
            row(
                "E7",
                "native",
                Param::new("send, one core", 0.0),
                "time_per_op",
                "us",
            ),
            row(
                "E7",
                "proposed",
                Param::new("send+recv, spread", 3.0),
                "time_per_op",
                "us",
            ),
            row(
                "E7",
                "1 server",
                Param::new("1 conns", 101.0),
                "k_bandwidth",
                "Gbit/s",
            ),
            row(
                "R1",
                "native",
                Param::new("redis -P 1", 0.0),
                "GET -P 1",
                "req/s",
            ),
            row(
                "R1",
                "ferry",
                Param::new("redis -P 1", 0.0),
                "GET -P 1",
                "req/s",
            ),
            failed,
            row(
                "E5",
                "native",
                Param::new(crate::experiments::E5_TCP, 0.0),
                "rtt_p50",
                "us",
            ),
            row(
                "E5",
                "ferry-nic-timed",
                Param::new(crate::experiments::E5_TCP, 0.0),
                "stage tap_read",
                "us/RT",
            ),
            row(
                "E5",
                "ferry-nic 2 servers",
                Param::new("iperf3 -P 4 send", 20.0),
                "bandwidth",
                "Gbit/s",
            ),
        ];
        for e in [
            Experiment::E3,
            Experiment::E5,
            Experiment::E7,
            Experiment::R1,
        ] {
            draw(&dir, e, &rows).unwrap();
            let png = dir.join(format!("{}.png", e.id().to_lowercase()));
            let len = std::fs::metadata(&png).unwrap().len();
            assert!(len > 10_000, "{} is {len} bytes", png.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
