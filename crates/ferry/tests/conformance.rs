//! The conformance suite: every case runs natively and through ferry; the two outputs
//! must be identical, line for line.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::process::Command;

fn suite() -> std::path::PathBuf {
    // Built by the workspace build, next to the ferry binary.
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_ferry"));
    exe.with_file_name("ferry-conformance")
}

fn parse(out: &[u8]) -> BTreeMap<String, String> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| {
            l.split_once(": ")
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

#[test]
fn every_case_matches_native() {
    let bin = suite();
    if !bin.is_file() {
        eprintln!(
            "skipped: {} not built (run `cargo build --workspace --release`)",
            bin.display()
        );
        return;
    }
    if !is_root() && !ferry_sandbox::userns_available() {
        eprintln!("skipped: no user namespaces");
        return;
    }
    // Natively, in a fresh network namespace like the sandbox's (only lo).
    let native = Command::new("unshare")
        .args([
            "-rn",
            "sh",
            "-c",
            "ip link set lo up && exec \"$0\"",
            bin.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let ferry = ferry_run(&[], &[bin.to_str().unwrap()]);
    let (n, f) = (parse(&native.stdout), parse(&ferry.stdout));
    assert!(
        n.len() >= 100,
        "native run has {} cases: {}",
        n.len(),
        String::from_utf8_lossy(&native.stderr)
    );
    let mut diffs = Vec::new();
    for (case, want) in &n {
        match f.get(case) {
            Some(got) if got == want => {}
            got => diffs.push(format!(
                "{case}: native `{want}`, ferry `{}`",
                got.map_or("<missing>", |s| s.as_str())
            )),
        }
    }
    assert!(
        diffs.is_empty(),
        "{} of {} cases differ:\n{}",
        diffs.len(),
        n.len(),
        diffs.join("\n")
    );
}
