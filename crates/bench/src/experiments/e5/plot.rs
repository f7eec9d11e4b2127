//! E5's figure: per-packet stages (stacked, per direction) beside S2's figures, RTT,
//! MTU and NIC servers.

use plotters::prelude::*;

use super::report::{S2_RX_US, S2_TX_US, half_diff};
use super::{E5_MTUS, E5_STAGES, E5_TCP, E5_TCP_ONE, E5_UDP, E5_UDP_ONE};
use crate::plan::{Row, find, median};
use crate::plot::{Area, COLORS, Pt, bar_slot, bars, category_chart, config_legend, err, legend};

/// E5: nic mode's per-packet overhead by stage (stacked, per direction) beside the RTT
/// difference to native halved and S2's published figures, as placed and on one core;
/// RTT p50 per configuration; bulk TCP by MTU; 2 NIC servers vs 1.
pub(super) fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
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
        .filter(|c| rows.iter().any(|r| r.config == **c))
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
            if let Some(v) = median(rows, "ferry-nic-timed", w, st.us) {
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

/// Grouped bars of `metric`: one group per parameter (its label, its name on the
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
            let pt = find(rows, c, g, metric).and_then(|r| {
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
