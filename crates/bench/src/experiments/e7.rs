//! E7 (S4): two processes sending or ping-ponging over several protocol servers and
//! paths, on one core or spread; where accepted connections go; K parallel connections
//! vs the number of servers.

use plotters::prelude::*;

use super::{Experiment, Settings};
use crate::config::{Config, RunOut};
use crate::parse;
use crate::plan::{Case, Extract, Param, Row};
use crate::plot::{
    Area, COLORS, Pt, Series, bar_slot, bars, category_chart, config_legend, err, legend, lines,
    max_of, series,
};
use crate::topology::{IPERF_PORT, SOCKPERF_E7A_PORT, SOCKPERF_E7B_PORT};

/// E7 (see the module's header).
#[derive(Debug)]
pub struct E7;

impl Experiment for E7 {
    fn id(&self) -> &'static str {
        "E7"
    }

    fn title(&self) -> &'static str {
        "distribution: several protocol servers and paths, one core vs spread"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("time_per_op", "us")
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn paper(&self) -> &'static str {
        "S4 (protocol and NIC servers on a multiprocessor): two processes sending 1024-byte \
         messages; the proposed arrangement (two protocol servers, two NIC paths) took \
         **15–27% less time** per send+recv than the conventional one (one server, one \
         path), and spreading the servers over cores took **0.55×** the time of running \
         everything on one core. Here a \"path\" is a veth pair to the remote (the second \
         process talks to the remote's address on its own pair), and wake-ups per request \
         count the hand-offs between cores that needed a wake."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1600, 620)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot(root, rows)
    }
}

/// E7's two workloads: two processes each sending 1024-byte messages (sockperf
/// throughput: time per message = 1 / the two rates summed) or each doing send+recv
/// (sockperf ping-pong: time per operation = the mean of the two median round trips);
/// plus, under ferry, wake-ups per request (the hand-offs between cores that needed a
/// wake).
fn two_process_extract(pingpong: bool) -> Extract {
    Box::new(move |r: &RunOut| {
        let out = &r.outcome.stdout;
        let per_op = if pingpong {
            let p50s = parse::sockperf_pp_all(out);
            if p50s.len() != 2 {
                return Err(format!("{} of 2 sockperf ping-pong results", p50s.len()));
            }
            p50s.iter().sum::<f64>() / 2.0
        } else {
            let rates = parse::sockperf_tp_all(out);
            if rates.len() != 2 {
                return Err(format!("{} of 2 sockperf throughput results", rates.len()));
            }
            1e6 / rates.iter().sum::<f64>().max(1.0)
        };
        let mut v = vec![("time_per_op", "us", per_op)];
        if let Some(st) = &r.stats {
            let ops = st.requests.max(1) as f64;
            v.push(("wakes_per_op", "per request", st.wakes() as f64 / ops));
        }
        Ok(v)
    })
}

/// The host port E7 publishes a sandbox server on.
const E7_PUBLISHED: u16 = 15301;

/// E7's arrangements: (name, ferry options, two paths?). `None` options: native.
const E7_CONFIGS: [(&str, Option<&[&str]>, bool); 4] = [
    ("native", None, true),
    (
        "conventional (1 server, 1 path)",
        Some(&["--servers", "1"]),
        false,
    ),
    (
        "bonding (1 server, 2 paths)",
        Some(&["--servers", "1"]),
        true,
    ),
    (
        "proposed (2 servers, 2 paths)",
        Some(&["--servers", "2", "--assign", "rr"]),
        true,
    ),
];

fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = s.secs(3);
    let ferry_ok = ready.iter().any(|c| c.name == "ferry");
    let native_ok = ready.iter().any(|c| c.name == "native");
    let mut out = Vec::new();
    // Two processes at once; each has its own remote server, over path 1 or path 2.
    let two = |mode: &str, two_paths: bool| {
        let dest_b = if two_paths { &s.remote2 } else { &s.remote };
        let one = |ip: &str, port: u16| {
            let extra = if mode == "ping-pong" {
                " --full-rtt"
            } else {
                ""
            };
            format!("sockperf {mode} --tcp -i {ip} -p {port} -t {secs} -m 1024{extra}")
        };
        let script = format!(
            "{} & a=$!; r=0; {} || r=$?; wait $a || r=$?; exit $r",
            one(&s.remote, SOCKPERF_E7A_PORT),
            one(dest_b, SOCKPERF_E7B_PORT)
        );
        vec!["sh".to_owned(), "-c".to_owned(), script]
    };
    let placements: [(&str, Option<usize>, &str); 2] =
        [("one core", Some(0), "0"), ("spread", None, "0,1")];
    let mut x = 0.0;
    for (mode, label) in [("throughput", "send"), ("ping-pong", "send+recv")] {
        for (place, pin, cpus) in placements {
            let param = Param::new(format!("{label}, {place}"), x);
            x += 1.0;
            for (name, opts, two_paths) in E7_CONFIGS {
                let config = match opts {
                    None if native_ok => Config::native(),
                    Some(o) if ferry_ok => {
                        let mut args = o.to_vec();
                        args.extend(["--cpus", cpus]);
                        Config::ferry_args(name, &args)
                    }
                    _ => continue,
                };
                out.push(Case {
                    config,
                    param: param.clone(),
                    client: two(mode, two_paths),
                    timeout: s.timeout(secs),
                    pin,
                    servers: vec![SOCKPERF_E7A_PORT, SOCKPERF_E7B_PORT],
                    extract: two_process_extract(mode == "ping-pong"),
                });
            }
        }
    }
    // Where accepted connections go: iperf3 -s inside the sandbox, published, receiving 4
    // connections from the remote; accepted sockets assigned over 2 servers, kept on the
    // listener's server, or 1 server.
    let conns = if s.quick { 2 } else { 4 };
    let script = format!(
        "iperf3 -s -1 -p 5301 -J & s=$!; sleep 0.5; \
         env -u LD_PRELOAD ip netns exec {ns} iperf3 -c {host} -p {E7_PUBLISHED} -P {conns} -t {secs} \
         --connect-timeout 3000 >/dev/null; r=$?; wait $s || r=$?; exit $r",
        ns = s.remote_ns,
        host = s.host_ip,
    );
    let publish = format!("{E7_PUBLISHED}:5301");
    let param = Param::new(format!("published, {conns} conns"), 200.0);
    for (name, opts) in [
        (
            "accepted: assign",
            &["--servers", "2", "--assign", "rr", "--accepted", "assign"][..],
        ),
        (
            "accepted: listener",
            &["--servers", "2", "--assign", "rr", "--accepted", "listener"][..],
        ),
        ("accepted: 1 server", &["--servers", "1"][..]),
    ] {
        if !ferry_ok {
            break;
        }
        let mut args = opts.to_vec();
        args.extend(["-p", &publish]);
        out.push(Case {
            config: Config::ferry_args(name, &args),
            param: param.clone(),
            client: vec!["sh".to_owned(), "-c".to_owned(), script.clone()],
            timeout: s.timeout(secs + 1),
            pin: None,
            servers: vec![],
            extract: Box::new(|r: &RunOut| {
                let bps = parse::iperf3_bps(&r.outcome.stdout)?;
                Ok(vec![("accepted_bandwidth", "Gbit/s", bps / 1e9)])
            }),
        });
    }
    // Throughput of K parallel connections vs the number of servers.
    let ks: &[u32] = if s.quick { &[1, 4] } else { &[1, 2, 4, 8] };
    for &k in ks {
        let param = Param::new(format!("{k} conns"), 100.0 + f64::from(k));
        let mut configs = Vec::new();
        if native_ok {
            configs.push(Config::native());
        }
        if ferry_ok {
            configs.push(Config::ferry_args("1 server", &["--servers", "1"]));
            configs.push(Config::ferry_args(
                "2 servers",
                &["--servers", "2", "--assign", "rr"],
            ));
        }
        for config in configs {
            out.push(Case {
                config,
                param: param.clone(),
                client: s.iperf3(IPERF_PORT, secs, &["-P", &k.to_string()]),
                timeout: s.timeout(secs),
                pin: None,
                servers: vec![IPERF_PORT],
                extract: Box::new(move |r: &RunOut| {
                    let bps = parse::iperf3_bps(&r.outcome.stdout)?;
                    Ok(vec![("k_bandwidth", "Gbit/s", bps / 1e9)])
                }),
            });
        }
    }
    out
}

/// E7: time per operation (grouped bars per placement, lower is better) for the send
/// and the send+recv workloads, and K-connection throughput by number of servers.
fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
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
    let s: Series = series(rows, "k_bandwidth")
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

/// Grouped bars of `time_per_op` for the parameters starting with `prefix`.
fn e7_bars(
    area: &Area<'_>,
    rows: &[Row],
    prefix: &str,
    title: &str,
    ydesc: &str,
) -> Result<(), String> {
    let r: Vec<&Row> = rows
        .iter()
        .filter(|r| r.metric == "time_per_op" && r.param.label.starts_with(prefix))
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
