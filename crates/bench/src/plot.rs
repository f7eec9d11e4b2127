//! One PNG per experiment, each drawn by its [`Experiment::plot`] (shaped like the
//! paper's figure) with the helpers here: series of a metric per configuration, lines
//! with min–max whiskers, reference lines, grouped and labelled bars, legends.
//! Pure-Rust bitmap backend; text in DejaVu Sans.

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

/// Writes `<dir>/<id>.png`: experiment `e`'s figure of its `rows`.
pub fn draw(dir: &Path, e: &dyn Experiment, rows: &[Row]) -> Result<(), String> {
    font()?;
    let path = dir.join(format!("{}.png", e.id().to_lowercase()));
    let root = BitMapBackend::new(&path, e.plot_size()).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    e.plot(&root, rows)?;
    root.present().map_err(err)
}

pub(crate) const COLORS: [RGBColor; 10] = [
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

pub(crate) type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

pub(crate) fn err<E: std::fmt::Display>(e: E) -> String {
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
pub(crate) type Series = Vec<(String, Vec<Pt>)>;

/// One point: x, median, min, max.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pt {
    pub(crate) x: f64,
    pub(crate) med: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

/// Series of `metric` among one experiment's rows, per configuration in first-seen
/// order; a configuration with no successful run has an empty series.
pub(crate) fn series(rows: &[Row], metric: &str) -> Series {
    let mut out: Series = Vec::new();
    for r in rows {
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

pub(crate) fn max_of(s: &Series) -> f64 {
    s.iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.max))
        .fold(0.0, f64::max)
}

pub(crate) fn label(name: &str, pts: &[Pt]) -> String {
    if pts.is_empty() {
        format!("{name} (failed)")
    } else {
        name.to_owned()
    }
}

pub(crate) type Chart<'a, 'b, X, Y> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<X, Y>>;

/// A line with dots and min–max whiskers.
pub(crate) fn lines<X, Y>(
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

pub(crate) fn legend<'a, 'b: 'a, X, Y>(
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
pub(crate) fn positions(rows: &[Row]) -> (BTreeMap<u64, usize>, Vec<String>) {
    let mut xs: Vec<(f64, String)> = rows
        .iter()
        .filter(|r| !r.param.x.is_nan())
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

pub(crate) fn reindex(pts: &[Pt], map: &BTreeMap<u64, usize>) -> Vec<Pt> {
    pts.iter()
        .filter_map(|p| map.get(&p.x.to_bits()).map(|&i| Pt { x: i as f64, ..*p }))
        .collect()
}

/// Reference configurations (no parameter) as horizontal lines across the x range.
pub(crate) fn reference<X, Y>(
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

/// Vertical bars at integer x with min–max whiskers and a text above each.
pub(crate) fn bars<Y>(
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
pub(crate) fn category_chart<'a, 'b>(
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
pub(crate) fn bar_slot(gi: usize, ci: usize, k: usize) -> (f64, f64) {
    let w = 0.8 / k.max(1) as f64;
    (gi as f64 - 0.4 + w * (ci as f64 + 0.5), w * 0.9)
}

/// A legend entry (a coloured square) per configuration, in bar order.
pub(crate) fn config_legend<'a, 'b: 'a>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::{E3, E5, E7, R1};
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
                Param::new(crate::experiments::e5::E5_TCP, 0.0),
                "rtt_p50",
                "us",
            ),
            row(
                "E5",
                "ferry-nic-timed",
                Param::new(crate::experiments::e5::E5_TCP, 0.0),
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
        for e in [&E3 as &dyn Experiment, &E5, &E7, &R1] {
            let mine: Vec<Row> = rows
                .iter()
                .filter(|r| r.experiment == e.id())
                .cloned()
                .collect();
            draw(&dir, e, &mine).unwrap();
            let png = dir.join(format!("{}.png", e.id().to_lowercase()));
            let len = std::fs::metadata(&png).unwrap().len();
            assert!(len > 10_000, "{} is {len} bytes", png.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
