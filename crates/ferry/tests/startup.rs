//! Start-up: `ferry run -- true` takes milliseconds in every `--net` mode, as root and as
//! an unprivileged user (no poll period or device teardown on its path), and
//! `FERRY_TIMING=1` names each step with its duration.

mod common;
use common::*;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Far above a run's few milliseconds on a loaded machine, far below the 100 ms the
/// signal thread's poll once added to every run (and the TAP's 17 ms teardown).
const BOUND: Duration = Duration::from_millis(60);

/// The fastest of `runs` runs of `cmd` (each must succeed).
fn fastest(mut cmd: impl FnMut() -> Command, runs: usize) -> Duration {
    (0..runs)
        .map(|_| {
            let mut c = cmd();
            let t = Instant::now();
            let o = c.output().expect("spawn ferry");
            let took = t.elapsed();
            assert!(
                o.status.success(),
                "{c:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            took
        })
        .min()
        .expect("at least one run")
}

/// The `--net` modes this host can make (nic mode needs `/dev/net/tun`).
fn modes() -> Vec<&'static str> {
    let mut m = vec!["both", "socket"];
    if Path::new("/dev/net/tun").exists() {
        m.push("nic");
    } else {
        eprintln!("--net nic skipped: no /dev/net/tun");
    }
    m
}

#[test]
fn ferry_run_true_takes_milliseconds_in_every_mode() {
    for net in modes() {
        let best = fastest(
            || {
                let mut c = ferry();
                c.args(["run", "--net", net, "--", "true"]);
                c
            },
            5,
        );
        assert!(
            best < BOUND,
            "--net {net}: the fastest of 5 runs took {best:?}"
        );
    }
}

#[test]
fn ferry_run_true_takes_milliseconds_for_an_unprivileged_user() {
    if !have_test_user() {
        return;
    }
    let dir = TempDir::new("startup");
    let exe = ferry_for_any_user(dir.path());
    for net in modes() {
        let best = fastest(
            || {
                let mut c = Command::new("runuser");
                c.args(["-u", "ferrytest", "--"]).arg(&exe);
                c.args(["run", "--net", net, "--", "true"]).current_dir("/");
                c
            },
            5,
        );
        assert!(
            best < BOUND,
            "ferrytest, --net {net}: the fastest of 5 runs took {best:?}"
        );
    }
}

#[test]
fn ferry_timing_names_each_step() {
    let o = ferry()
        .env("FERRY_TIMING", "1")
        .args(["run", "--", "sh", "-c", "exit 3"])
        .output()
        .expect("spawn ferry");
    assert_eq!(o.status.code(), Some(3), "the program's status passes on");
    let err = String::from_utf8_lossy(&o.stderr);
    let ms = |step: &str| -> f64 {
        let line = err
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(step))
            .unwrap_or_else(|| panic!("no `{step}` row in:\n{err}"));
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    };
    let steps = [
        "plan",
        "shim+dirs",
        "servers",
        "sandbox",
        "nic",
        "dns",
        "start",
        "confine",
        "serve",
        "wait",
        "drain",
        "signals",
        "report",
        "cleanup",
    ];
    let sum: f64 = steps.iter().map(|s| ms(s)).sum();
    let total = ms("total");
    assert!((sum - total).abs() < 0.01 * steps.len() as f64, "{err}");
    assert!(ms("sandbox") > 0.0, "{err}");
    let quiet = ferry().args(["run", "--", "true"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&quiet.stderr).contains("timing"),
        "off without FERRY_TIMING"
    );
}
