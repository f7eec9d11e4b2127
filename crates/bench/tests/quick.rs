//! CI check of the harness: `ferry bench --quick E1 E2` runs end to end and every output
//! exists and parses. Never checks a time. Skips (with a message) when not root or when
//! `target/release/ferry` has not been built.

use std::path::{Path, PathBuf};
use std::process::Command;

fn ferry_binary() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let bin = target.join("release/ferry");
    bin.is_file().then_some(bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Removes the output directory even when an assertion fails.
struct TempOut(PathBuf);

impl Drop for TempOut {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn quick_e1_e2_writes_every_output() {
    if !is_root() {
        eprintln!("SKIP quick_e1_e2_writes_every_output: needs root (remote namespace)");
        return;
    }
    let Some(ferry) = ferry_binary() else {
        eprintln!(
            "SKIP quick_e1_e2_writes_every_output: target/release/ferry missing (cargo build --release --workspace)"
        );
        return;
    };
    let out =
        TempOut(std::env::temp_dir().join(format!("ferry-bench-test-{}", std::process::id())));
    let run = Command::new(&ferry)
        .args(["bench", "--quick", "E1", "E2", "--out"])
        .arg(&out.0)
        .output()
        .expect("run ferry bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "ferry bench failed\n{stdout}\n{stderr}"
    );

    // Configurations that passed their smoke check, as the harness announced them.
    let ready: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("configuration "))
        .filter(|l| l.contains(" ready ("))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert!(
        ready.iter().any(|c| c == "native"),
        "native must always be ready:\n{stdout}"
    );

    let csv = std::fs::read_to_string(out.0.join("results.csv")).expect("results.csv");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("experiment,config,param,metric,unit,median,min,max,runs")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(!rows.is_empty(), "results.csv has no rows");
    for r in &rows {
        assert!(r.len() >= 9, "short CSV row {r:?}");
        let runs: usize = r[r.len() - 1].parse().expect("runs is a number");
        for v in &r[r.len() - 4..r.len() - 1] {
            assert!(
                v.is_empty() || v.parse::<f64>().is_ok(),
                "bad number {v:?} in {r:?}"
            );
        }
        assert!(runs <= 2, "quick makes 2 runs: {r:?}");
    }
    for exp in ["E1", "E2"] {
        for c in &ready {
            assert!(
                rows.iter()
                    .any(|r| r[0] == exp && r[1].starts_with(c.as_str())),
                "no {exp} row for configuration {c}\n{csv}"
            );
        }
        let png = std::fs::read(out.0.join(format!("{}.png", exp.to_lowercase()))).expect("png");
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{exp}.png is not a PNG"
        );
    }
    let report = std::fs::read_to_string(out.0.join("report.md")).expect("report.md");
    for needle in [
        "## Machine",
        "## Method",
        "## Headline ratios",
        "## E1",
        "## E2",
        "## Skipped",
    ] {
        assert!(report.contains(needle), "report.md lacks {needle}");
    }
}

/// R2 end to end: the C client is built and its server started, every configuration
/// that is ready gets its rates, CPU per request, start-up and (with perf) system calls
/// per request, and the report has the table of ratios to native.
#[test]
fn quick_r2_measures_every_row() {
    if !is_root() {
        eprintln!("SKIP quick_r2_measures_every_row: needs root (remote namespace)");
        return;
    }
    let Some(ferry) = ferry_binary() else {
        eprintln!(
            "SKIP quick_r2_measures_every_row: target/release/ferry missing (cargo build --release --workspace)"
        );
        return;
    };
    let out =
        TempOut(std::env::temp_dir().join(format!("ferry-bench-r2-test-{}", std::process::id())));
    let run = Command::new(&ferry)
        .args(["bench", "--quick", "--runs", "1", "R2", "--out"])
        .arg(&out.0)
        .output()
        .expect("run ferry bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "ferry bench failed\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let csv = std::fs::read_to_string(out.0.join("results.csv")).expect("results.csv");
    let has = |config: &str, param: &str, metric: &str| {
        csv.lines().any(|l| {
            let c = csv_fields(l);
            c.len() >= 9
                && c[1] == config
                && c[2] == param
                && c[3] == metric
                && c[5].parse::<f64>().is_ok_and(|v| v > 0.0)
        })
    };
    let perf = Command::new("perf").arg("--version").output().is_ok();
    for config in ["native", "ferry"] {
        for (param, metric) in [
            ("short conn (C)", "rate"),
            ("short conn (C)", "CPU/req client side"),
            ("short conn (C)", "CPU/req server side"),
            ("wrk Connection: close", "rate"),
            ("redis GET -P 1", "CPU/req total"),
            ("start-up", "p50"),
            ("start-up", "p90"),
        ] {
            assert!(
                has(config, param, metric),
                "no {config} {param} {metric}\n{csv}"
            );
        }
        if perf {
            assert!(
                has(config, "redis GET -P 1, syscalls", "syscalls/req program"),
                "no {config} system calls\n{csv}"
            );
        }
    }
    if perf {
        assert!(has(
            "ferry",
            "short conn (C), syscalls",
            "syscalls/req ferry servers"
        ));
    }
    let report = std::fs::read_to_string(out.0.join("report.md")).expect("report.md");
    assert!(
        report.contains("| test | metric | unit | native | ferry |"),
        "{report}"
    );
    let png = std::fs::read(out.0.join("r2.png")).expect("r2.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "r2.png is not a PNG");
}

/// The fields of a CSV line (a field in double quotes may hold commas; `""` is a quote).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        match (ch, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                if let Some(f) = out.last_mut() {
                    f.push('"');
                }
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(String::new()),
            (ch, _) => {
                if let Some(f) = out.last_mut() {
                    f.push(ch);
                }
            }
        }
    }
    out
}
