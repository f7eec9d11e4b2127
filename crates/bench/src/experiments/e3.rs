//! E3: CPU interference (S0's table 5): the MFlops a burner keeps beside a 10 MB/s
//! transfer, each whole configuration on one CPU.

use super::{Experiment, Settings, ferry_variant, pick};
use crate::config::{Config, RunOut};
use crate::parse;
use crate::plan::{Case, Extract, Param, Row};
use crate::plot::{Area, COLORS, bars, category_chart, max_of, series};
use crate::topology::{IPERF_E3_PORT, Testbed};

/// E3 (see the module's header).
#[derive(Debug)]
pub struct E3;

impl Experiment for E3 {
    fn id(&self) -> &'static str {
        "E3"
    }

    fn title(&self) -> &'static str {
        "CPU interference: MFlops kept beside a 10 MB/s transfer"
    }

    fn main_metric(&self) -> (&'static str, &'static str) {
        ("mflops", "MFlops")
    }

    fn cases(&self, s: &Settings, ready: &[Config]) -> Vec<Case> {
        cases(s, ready)
    }

    fn prepare(&self, s: &Settings, _bed: &mut Testbed) -> Result<(), crate::Error> {
        if !s.burner.is_file() {
            println!(
                "warning: {} not found (cargo build --release --workspace): E3 will fail",
                s.burner.display()
            );
        }
        Ok(())
    }

    fn derived(&self, rows: &[Row]) -> Vec<Row> {
        kept(rows)
    }

    fn paper(&self) -> &'static str {
        "S0 table 5: FLOPS process alone **554 MFlops**; beside a 10 MB/s transfer, original \
         UML leaves **380**, SBW 0/1/10 jiffies leave **491**/489/475 — 1 jiffy keeps nearly \
         all of the gain for little CPU."
    }

    fn plot_size(&self) -> (u32, u32) {
        (1000, 650)
    }

    fn plot(&self, root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
        plot(root, rows)
    }
}

fn cases(s: &Settings, ready: &[Config]) -> Vec<Case> {
    let secs = if s.quick { 2 } else { 8 };
    let burner = s.burner.display().to_string();
    // The burner and a 10 MB/s transfer side by side, the whole configuration on CPU 0
    // (the remote's iperf3 server is on CPU 1: the "other machine").
    let script = format!(
        "{burner} {secs} & b=$!; r=0; iperf3 -c {ip} -p {IPERF_E3_PORT} -b 80M -t {secs} \
         --connect-timeout 3000 >&2 || r=$?; wait $b; \
         if [ $r -ne 0 ]; then echo \"the 10 MB/s transfer failed (iperf3 exit $r)\" >&2; exit 1; fi",
        ip = s.remote
    );
    let beside = vec!["sh".to_owned(), "-c".to_owned(), script];
    let extract = || -> Extract {
        Box::new(|r: &RunOut| {
            Ok(vec![(
                "mflops",
                "MFlops",
                parse::burner_mflops(&r.outcome.stdout)?,
            )])
        })
    };
    let mut alone = Config::native();
    alone.name = "burner alone".into();
    let mut out = vec![Case {
        config: alone,
        param: Param::none(),
        client: vec![burner.clone(), secs.to_string()],
        timeout: s.timeout(secs),
        pin: Some(0),
        servers: vec![],
        extract: extract(),
    }];
    let mut configs = pick(ready, &["native", "ferry"]);
    configs.extend(ferry_variant(ready, "ferry-spin0", Some("0"), None));
    configs.extend(ferry_variant(ready, "ferry-spin1ms", Some("1ms"), None));
    configs.extend(pick(ready, &["slirp4netns", "pasta", "pasta-2026"]));
    for c in configs {
        out.push(Case {
            config: c,
            param: Param::none(),
            client: beside.clone(),
            timeout: s.timeout(secs),
            pin: Some(0),
            servers: vec![IPERF_E3_PORT],
            extract: extract(),
        });
    }
    out
}

/// E3's derived rows: MFlops kept, in % of the burner alone's median.
fn kept(rows: &[Row]) -> Vec<Row> {
    let Some(alone) = rows
        .iter()
        .find(|r| r.config == "burner alone" && r.metric == "mflops")
        .and_then(Row::median)
    else {
        return Vec::new();
    };
    rows.iter()
        .filter(|r| r.metric == "mflops")
        .map(|r| Row {
            metric: "kept".into(),
            unit: "%".into(),
            samples: r.samples.iter().map(|v| v / alone * 100.0).collect(),
            ..r.clone()
        })
        .collect()
}

fn plot(root: &Area<'_>, rows: &[Row]) -> Result<(), String> {
    let s = series(rows, "mflops");
    let kept = series(rows, "kept");
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
