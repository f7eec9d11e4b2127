//! E6 (S3): a file to a socket from a program in the sandbox — its own read/write loop,
//! `sendfile`, or a data-path module bound per response or once — natively and through
//! ferry.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use super::{Experiment, Settings, pick};
use crate::config::{Config, RunOut};
use crate::parse;
use crate::plan::{Case, Param, Row, median};
use crate::plot::{
    Area, COLORS, Series, err, label, legend, lines, max_of, positions, reindex, series,
};
use crate::topology::{E6_PORT, Testbed};

/// E6 (see the module's header).
#[derive(Debug)]
pub struct E6;

impl Experiment for E6 {
    fn id(&self) -> &'static str {
        "E6"
    }

    fn title(&self) -> &'static str {
        "file → socket from a program in the sandbox: read/write vs sendfile vs module"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("latency_p50", "us")
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn prepare(&self, s: &Settings, bed: &mut Testbed) -> Result<(), crate::Error> {
        write_files(&s.e6_dir)?;
        bed.start_e6(&s.e6_bin)?;
        Ok(())
    }

    fn derived(&self, rows: &[Row]) -> Vec<Row> {
        ratios(rows)
    }

    fn paper(&self) -> &'static str {
        "S3 (modules run next to the data): a 2,322-byte HTTP response served faster by \
         a module than by the application's own read/write path, and header + file \
         through a module at the application's sendfile throughput. Goals here: module \
         start p50 ≤ 10 µs (server means per response: `module_start` makes the \
         instance, `module_init` runs init, `module_write` is the data: header + \
         file; `bind_p50`: the program's bind call, queued on the ring without \
         waiting, naming the file it registered once), module \
         throughput ≥ 0.95× ferry sendfile (`x_sendfile`), and at 2,322 B module latency \
         below ferry read/write (`x_rw_latency` < 1). `module` binds per response, as \
         S3's server did; `module kept` binds once per kept-alive connection (http_file's \
         `lines` mode: the program sends the module each request line, S3's proposed \
         \"pass arguments directly\"), so no instance is made per response. Every way \
         opens its file once (read/write: `pread` at offset 0, sendfile: with an \
         offset, modules: `register_file`), so none pays an open/close per response."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1500, 620)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot(root, rows)
    }
}

/// E6's file sizes (bytes): S3's 2,322-byte response and 1–6 MB.
pub const E6_SIZES: [u64; 5] = [2322, 1 << 20, 2 << 20, 4 << 20, 6 << 20];

/// E6's sizes with `--quick`.
const E6_QUICK: [u64; 3] = [2322, 1 << 20, 6 << 20];

/// The name of E6's file of `size` bytes in [`Settings::e6_dir`].
pub fn e6_file(size: u64) -> String {
    format!("e6-{size}.bin")
}

/// The label of an E6 size: "2322 B", "1 MB", …
fn e6_label(size: u64) -> String {
    if size >= 1 << 20 {
        format!("{} MB", size >> 20)
    } else {
        format!("{size} B")
    }
}

/// A program in the sandbox serves a file to E6's requester (remote) four ways: its own
/// 64 KiB pread/send loop, `sendfile`, a module bound per response (http_file through
/// the native API, the file registered with the server once and bound by handle: S3's
/// way), or the same module bound once for the kept-alive connection (its `lines` mode:
/// the program sends it each request line). Each way opens the file once and sends it
/// from offset 0 per response (see `ferry-e6`). Natively only the first two exist.
/// Metrics: latency per response (request sent → last byte in, at the requester),
/// throughput, and for the modules the program's bind call and, per response in the
/// server (means): making the instance (`module_start`), its `init` (`module_init`),
/// writing header and file (`module_write`: send, sendfile; the only one of the three
/// that a module bound once pays per response).
fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let sizes: &[u64] = if s.quick { &E6_QUICK } else { &E6_SIZES };
    let mut ways: Vec<(Config, &str)> = Vec::new();
    for c in pick(ready, &["native", "ferry"]) {
        let mut ws = vec![("read/write", "rw"), ("sendfile", "sendfile")];
        if c.is_ferry() {
            ws.push(("module", "module"));
            ws.push(("module kept", "module-keep"));
        }
        for (label, way) in ws {
            let mut cfg = c.clone();
            cfg.name = format!("{} {label}", c.name);
            ways.push((cfg, way));
        }
    }
    let mut out = Vec::new();
    for &size in sizes {
        let responses = match (size < 1 << 20, s.quick) {
            (true, true) => 2000,
            (true, false) => 20_000,
            (false, true) => 30,
            (false, false) => 200,
        };
        for (c, way) in &ways {
            let file = s.e6_dir.join(e6_file(size));
            // Bound per response: the server's times are per instance; bound once: the
            // write time is spread over the responses.
            let per_instance = *way == "module";
            out.push(Case {
                config: c.clone(),
                param: Param::new(e6_label(size), size as f64),
                client: vec![
                    s.e6_bin.display().to_string(),
                    "serve".into(),
                    "--way".into(),
                    (*way).into(),
                    "--file".into(),
                    file.display().to_string(),
                    "--connect".into(),
                    format!("{}:{E6_PORT}", s.remote),
                    "--responses".into(),
                    responses.to_string(),
                ],
                timeout: Duration::from_secs(if s.quick { 20 } else { 60 }),
                pin: None,
                servers: vec![E6_PORT],
                extract: Box::new(move |r: &RunOut| {
                    let (p50, p99, mbps, bind) = parse::e6(&r.outcome.stdout)?;
                    let mut v = vec![
                        ("latency_p50", "us", p50),
                        ("latency_p99", "us", p99),
                        ("throughput", "MB/s", mbps),
                    ];
                    if let Some(b) = bind {
                        v.push(("bind_p50", "us", b));
                    }
                    if let Some(st) = r.stats.as_ref().filter(|st| st.modules_started > 0) {
                        let per = |ns: u64, n: u64| ns as f64 / n.max(1) as f64 / 1e3;
                        if per_instance {
                            let n = st.modules_started;
                            v.push(("module_start", "us", per(st.module_start_ns, n)));
                            v.push(("module_init", "us", per(st.module_init_ns, n)));
                            v.push(("module_write", "us", per(st.module_write_ns, n)));
                        } else {
                            v.push(("module_write", "us", per(st.module_write_ns, responses)));
                        }
                    }
                    Ok(v)
                }),
            });
        }
    }
    out
}

/// The derived rows: each ferry way's throughput over ferry sendfile's (median) at the
/// same size, and its latency over ferry read/write's.
fn ratios(rows: &[Row]) -> Vec<Row> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.config.starts_with("ferry")) {
        let (base, metric, unit) = match r.metric.as_str() {
            "throughput" => ("ferry sendfile", "x_sendfile", "× ferry sendfile"),
            "latency_p50" => ("ferry read/write", "x_rw_latency", "× ferry read/write"),
            _ => continue,
        };
        let Some(b) = median(rows, base, &r.param.label, &r.metric).filter(|b| *b > 0.0) else {
            continue;
        };
        out.push(Row {
            metric: metric.into(),
            unit: unit.into(),
            samples: r.samples.iter().map(|v| v / b).collect(),
            ..r.clone()
        });
    }
    out
}

/// Writes E6's files (readable by the sandbox's users): every size of
/// [`E6_SIZES`], bytes `a..z` repeating (what `ferry-e6 requester` checks).
fn write_files(dir: &Path) -> Result<(), crate::Error> {
    std::fs::create_dir_all(dir).map_err(crate::output_err(dir))?;
    for size in E6_SIZES {
        let body: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
        let path = dir.join(e6_file(size));
        std::fs::write(&path, body).map_err(crate::output_err(&path))?;
    }
    Ok(())
}

/// E6: latency per response (log y) and throughput, per way, against the file size.
fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let (map, labels) = positions(rows);
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
        let s: Series = series(rows, metric)
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
