//! R1: real, unmodified clients (iperf3, sockperf, redis-benchmark, wrk) natively,
//! through ferry (socket and nic mode) and through the peers; nic mode's goals against
//! them.

use std::fmt::Write as _;

use super::{Experiment, Headline, Settings, insert_handoff, pick, redis_benchmark, strings};
use crate::config::{Config, RunOut};
use crate::parse;
use crate::plan::{Case, Extract, Param, Row, median};
use crate::plot::{Area, COLORS, Pt, bar_slot, bars, category_chart, config_legend};
use crate::topology::{HTTP_FILE, HTTP_PORT, IPERF_PORT, REDIS_PORT, SOCKPERF_PORT};
use plotters::prelude::SeriesLabelPosition;

/// R1 (see the module's header).
#[derive(Debug)]
pub struct R1;

impl Experiment for R1 {
    fn id(&self) -> &'static str {
        "R1"
    }

    fn title(&self) -> &'static str {
        "real clients, unmodified"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("result", "-")
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn summary(&self, rows: &[Row]) -> String {
        nic_goals(rows)
    }

    fn headlines(&self, rows: &[Row]) -> Vec<Headline> {
        rows.iter()
            .filter(|r| r.config == "native")
            .map(|r| Headline {
                label: format!("R1 {} ({})", r.metric, r.unit),
                metric: r.metric.clone(),
                ferry: ("ferry", r.param.label.clone()),
                others: r.param.label.clone(),
            })
            .collect()
    }

    fn paper(&self) -> &'static str {
        "No paper figure: real, unmodified clients, native vs ferry (socket and nic \
         mode) vs peers."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1400, 650)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot(root, rows)
    }
}

/// One R1 test: label, client, servers to restart on failure, metrics, seconds it runs.
type R1Test = (&'static str, Vec<String>, Vec<u16>, Extract, u32);

fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(3);
    // nic mode (`--net nic`) after ferry's socket-mode variants, before the peers.
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
    // The ring receive path (`--rx ring`) beside the default pair path, in the same run.
    if let Some(at) = configs.iter().position(|c| c.name == "ferry") {
        configs.insert(at + 1, Config::ferry_args("ferry-ring", &["--rx", "ring"]));
        insert_handoff(&mut configs, at + 1, s);
        if s.unconfined_too {
            // The servers without their seccomp filter and with their capabilities.
            configs.insert(
                at + 1,
                Config::ferry_args("ferry-unconfined", &["--unconfined"]),
            );
        }
        if let Some(base) = &s.baseline {
            configs.insert(at + 1, Config::ferry_build("ferry-base", base));
        }
    }
    // Enough requests that each test lasts seconds: the machine's CPU time per request
    // is measured over the whole run, start-up included.
    let (n1, n16) = if s.quick {
        ("5000", "50000")
    } else {
        ("100000", "1000000")
    };
    let url = format!("http://{}:{HTTP_PORT}/{HTTP_FILE}", s.remote);
    let redis = |n: &str, p: &str| redis_benchmark(s, "get,set", n, p);
    // Requests per second of GET and SET, and the whole machine's busy CPU µs per
    // request (both tests): on 2 CPUs that both of them saturate, throughput follows it.
    let redis_extract = |p: &'static str, n: &str| -> Extract {
        let requests = 2.0 * n.parse::<f64>().unwrap_or(f64::NAN);
        Box::new(move |r: &RunOut| {
            let (get, set, cpu) = match p {
                "1" => ("GET -P 1", "SET -P 1", "CPU per request -P 1"),
                _ => ("GET -P 16", "SET -P 16", "CPU per request -P 16"),
            };
            Ok(vec![
                (get, "req/s", parse::redis_rps(&r.outcome.stdout, "GET")?),
                (set, "req/s", parse::redis_rps(&r.outcome.stdout, "SET")?),
                (cpu, "us", r.cpu_us_per(requests)?),
            ])
        })
    };
    let tput = |metric: &'static str| -> Extract {
        Box::new(move |r: &RunOut| {
            Ok(vec![(
                metric,
                "Gbit/s",
                parse::iperf3_bps(&r.outcome.stdout)? / 1e9,
            )])
        })
    };
    let tests: Vec<R1Test> = vec![
        (
            "iperf3 TCP send",
            s.iperf3(IPERF_PORT, secs, &[]),
            vec![IPERF_PORT],
            tput("TCP send"),
            secs,
        ),
        (
            "iperf3 TCP recv",
            s.iperf3(IPERF_PORT, secs, &["-R"]),
            vec![IPERF_PORT],
            tput("TCP recv"),
            secs,
        ),
        (
            "iperf3 UDP",
            s.iperf3(IPERF_PORT, secs, &["-u", "-b", "1G", "-l", "1400"]),
            vec![IPERF_PORT],
            tput("UDP 1G offered"),
            secs,
        ),
        (
            "sockperf ping-pong",
            s.sockperf("ping-pong", secs, &["-m", "64", "--full-rtt"]),
            vec![SOCKPERF_PORT],
            Box::new(|r: &RunOut| {
                Ok(vec![(
                    "RTT p50",
                    "us",
                    parse::sockperf_pp(&r.outcome.stdout)?.p50,
                )])
            }),
            secs,
        ),
        (
            "redis -P 1",
            redis(n1, "1"),
            vec![REDIS_PORT],
            redis_extract("1", n1),
            30,
        ),
        (
            "redis -P 16",
            redis(n16, "16"),
            vec![REDIS_PORT],
            redis_extract("16", n16),
            30,
        ),
        (
            "wrk nginx 16K",
            strings(&[
                "wrk",
                "-t",
                "2",
                "-c",
                "16",
                "-d",
                &format!("{secs}s"),
                "--timeout",
                "5s",
                &url,
            ]),
            vec![HTTP_PORT],
            Box::new(|r: &RunOut| {
                Ok(vec![(
                    "HTTP 16K",
                    "req/s",
                    parse::wrk_rps(&r.outcome.stdout)?,
                )])
            }),
            secs,
        ),
    ];
    let mut out = Vec::new();
    for (i, (label, client, servers, extract, secs)) in tests.into_iter().enumerate() {
        let secs: u32 = secs;
        let extract: std::rc::Rc<Extract> = std::rc::Rc::new(extract);
        for c in &configs {
            let ex = extract.clone();
            out.push(Case {
                config: c.clone(),
                param: Param::new(label, i as f64),
                client: client.clone(),
                timeout: s.timeout(secs),
                pin: None,
                servers: servers.clone(),
                extract: Box::new(move |r: &RunOut| ex(r)),
            });
        }
    }
    out
}

/// One goal: (what, ferry-nic's R1 param, metric, reference config, "≥" or "≤" or "<",
/// target ratio ferry-nic / reference).
type Goal = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    f64,
);

const GOALS: [Goal; 14] = [
    (
        "bulk TCP send",
        "iperf3 TCP send",
        "TCP send",
        "slirp4netns",
        "≥",
        2.0,
    ),
    (
        "bulk TCP send",
        "iperf3 TCP send",
        "TCP send",
        "pasta",
        "≥",
        1.0,
    ),
    (
        "bulk TCP send, stretch",
        "iperf3 TCP send",
        "TCP send",
        "native",
        "≥",
        0.85,
    ),
    (
        "bulk TCP recv",
        "iperf3 TCP recv",
        "TCP recv",
        "slirp4netns",
        "≥",
        2.0,
    ),
    (
        "bulk TCP recv",
        "iperf3 TCP recv",
        "TCP recv",
        "pasta",
        "≥",
        1.0,
    ),
    (
        "bulk TCP recv, stretch",
        "iperf3 TCP recv",
        "TCP recv",
        "native",
        "≥",
        0.85,
    ),
    (
        "sockperf RTT p50",
        "sockperf ping-pong",
        "RTT p50",
        "slirp4netns",
        "≤",
        1.0,
    ),
    (
        "sockperf RTT p50",
        "sockperf ping-pong",
        "RTT p50",
        "pasta",
        "≤",
        1.0,
    ),
    (
        "redis CPU per request -P 1",
        "redis -P 1",
        "CPU per request -P 1",
        "slirp4netns",
        "<",
        1.0,
    ),
    (
        "redis CPU per request -P 1",
        "redis -P 1",
        "CPU per request -P 1",
        "pasta",
        "<",
        1.0,
    ),
    (
        "redis CPU per request -P 16",
        "redis -P 16",
        "CPU per request -P 16",
        "slirp4netns",
        "<",
        1.0,
    ),
    (
        "redis CPU per request -P 16",
        "redis -P 16",
        "CPU per request -P 16",
        "pasta",
        "<",
        1.0,
    ),
    (
        "(for reference) redis GET -P 1",
        "redis -P 1",
        "GET -P 1",
        "pasta",
        "≥",
        1.0,
    ),
    (
        "(for reference) HTTP 16K req/s",
        "wrk nginx 16K",
        "HTTP 16K",
        "pasta",
        "≥",
        1.0,
    ),
];

/// nic mode's goals, when ferry-nic ran: each ratio of medians against its target.
pub fn nic_goals(rows: &[Row]) -> String {
    if !rows.iter().any(|r| r.config == "ferry-nic") {
        return String::new();
    }
    let mut out = String::from(
        "### nic mode's goals\n\n\
         `ferry-nic` is `ferry run --net nic`: the sandbox's TAP served by one NIC server. \
         Goals: bulk TCP ≥ 2× slirp4netns and ≥ pasta (stretch: ≥ 0.85× native), sockperf \
         p50 ≤ both, redis CPU per request below both. Ratios are ferry-nic's median over \
         the reference's median, in the same run.\n\n\
         | goal | ferry-nic | reference | reference's | ferry-nic / reference | target | met |\n\
         |---|--:|---|--:|--:|--:|---|\n",
    );
    for (what, param, metric, reference, op, target) in GOALS {
        let nic = median(rows, "ferry-nic", param, metric);
        let other = median(rows, reference, param, metric);
        let unit = rows
            .iter()
            .find(|r| r.metric == metric)
            .map(|r| r.unit.clone())
            .unwrap_or_default();
        let (ratio, met) = match (nic, other) {
            (Some(n), Some(o)) if o > 0.0 => {
                let x = n / o;
                let ok = match op {
                    "≥" => x >= target,
                    "≤" => x <= target,
                    _ => x < target,
                };
                (format!("{x:.2}×"), if ok { "yes" } else { "**no**" })
            }
            _ => ("–".into(), "not measured"),
        };
        let (target, met) = if what.starts_with("(for reference)") {
            ("–".to_owned(), "not a goal")
        } else {
            (format!("{op} {target}×"), met)
        };
        let _ = writeln!(
            out,
            "| {what} ({unit}) | {} | {reference} | {} | {ratio} | {target} | {met} |",
            crate::report::num(nic),
            crate::report::num(other),
        );
    }
    out.push('\n');
    out
}

fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    relative_plot(
        root,
        rows,
        "R1 — real clients, relative to native (higher is better)",
        &|_, metric| metric.to_owned(),
    )
}

/// Whether a smaller value of `unit` is better (times, CPU, system calls per request).
fn lower_better(unit: &str) -> bool {
    matches!(unit, "us" | "ms") || unit.starts_with("per ")
}

/// Bars of every configuration relative to native, one group per (test, metric) that
/// native measured, named by `name(test, metric)`: x/native, or native/x where lower
/// is better.
pub(super) fn relative_plot(
    root: &Area<'_>,
    rows: &[Row],
    title: &str,
    name: &dyn Fn(&str, &str) -> String,
) -> Result<(), String> {
    let r: Vec<&Row> = rows.iter().collect();
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
        let lower = lower_better(&g.2);
        for (ci, c) in configs.iter().enumerate() {
            let (x, w) = bar_slot(gi, ci, configs.len());
            let pt = value(c, g).map(|(m, lo, hi)| {
                let f = |v: f64| if lower { base / v } else { v / base };
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
            // A case that succeeded without this metric (pasta's program's system
            // calls are not seen) has no bar; "failed" is for cases that never succeeded.
            let ran = r
                .iter()
                .any(|x| x.config == *c && x.param.label == g.0 && !x.samples.is_empty());
            if pt.is_none() && ran {
                continue;
            }
            let text = pt.map(|p| format!("{:.2}", p.med)).unwrap_or_default();
            items.push((x, w, pt, COLORS[ci % COLORS.len()], text));
        }
    }
    let names: Vec<String> = groups.iter().map(|g| name(&g.0, &g.1)).collect();
    let mut chart = category_chart(
        root,
        title,
        22,
        &names,
        ymax,
        "× native (throughput: x/native; µs, ms, per request: native/x)",
    )?;
    bars(&mut chart, &items)?;
    config_legend(&mut chart, &configs, SeriesLabelPosition::UpperRight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Param;

    fn row(config: &str, param: &str, metric: &str, v: f64) -> Row {
        Row {
            experiment: "R1".into(),
            config: config.into(),
            param: Param::new(param, 0.0),
            metric: metric.into(),
            unit: "us".into(),
            samples: vec![v],
            planned: 1,
            failures: Vec::new(),
        }
    }

    #[test]
    fn goals_are_judged_on_medians() {
        let rows = vec![
            row("ferry-nic", "iperf3 TCP send", "TCP send", 10.0),
            row("slirp4netns", "iperf3 TCP send", "TCP send", 4.0),
            row("pasta", "iperf3 TCP send", "TCP send", 12.0),
            row("ferry-nic", "sockperf ping-pong", "RTT p50", 30.0),
            row("pasta", "sockperf ping-pong", "RTT p50", 40.0),
        ];
        let g = nic_goals(&rows);
        assert!(g.contains("| 2.50× | ≥ 2× | yes |"), "{g}");
        assert!(g.contains("| 0.83× | ≥ 1× | **no** |"), "{g}");
        assert!(g.contains("| 0.75× | ≤ 1× | yes |"), "{g}");
        assert!(g.contains("not measured"), "{g}");
        assert!(nic_goals(&rows[1..3]).is_empty());
    }
}
