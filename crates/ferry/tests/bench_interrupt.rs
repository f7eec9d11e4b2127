//! `ferry bench` on SIGTERM: when it says "interrupted; everything was torn down",
//! that must already be true: no process it started (nor an orphan of one) is alive,
//! and its remote namespace is gone. The signal is sent the moment a client run under
//! `ferry run` starts (before that `ferry run` forwards signals: SIGTERM ends it at
//! once and leaves its sandbox to the harness).

mod common;
mod figures;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use figures::*;

/// Every process whose command line mentions `needle`, as `pid: cmdline`.
fn processes_naming(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().into_owned();
            if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
                return None;
            }
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(needle).then(|| format!("{pid}: {cmd}"))
        })
        .collect()
}

/// Children of `pid` (every thread's).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn cmdline(pid: u32) -> String {
    let c = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&c).replace('\0', " ")
}

#[test]
fn sigterm_tears_everything_down_before_saying_so() {
    if !can_run(&["ip", "iperf3"]) {
        return;
    }
    let out = TempDir::new("bench-term");
    let mut bench = Guard(
        ferry()
            .args(["bench", "--quick", "--runs", "1", "E1", "--out"])
            .arg(out.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = bench.0.id();
    let said = Lines::new("bench", bench.0.stdout.take().unwrap());
    // "remote: namespace NAME at IP (host side …)"
    let remote = said.wait_for("remote: namespace ", Duration::from_secs(60));
    let mut words = remote.split_whitespace().skip(2);
    let (ns, ip) = (
        words.next().unwrap().to_owned(),
        words.nth(1).unwrap().to_owned(),
    );
    let end = Instant::now() + Duration::from_secs(120);
    let run = loop {
        if let Some(c) = children_of(pid)
            .into_iter()
            .find(|&c| cmdline(c).contains(" run "))
        {
            break c;
        }
        assert!(Instant::now() < end, "no client run under ferry started");
        std::thread::sleep(Duration::from_micros(200));
    };
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    eprintln!("SIGTERM sent while {run} ({}) started", cmdline(run));
    let stderr = BufReader::new(bench.0.stderr.take().unwrap());
    let mut seen = Vec::new();
    let mut message = None;
    for line in stderr.lines() {
        let line = line.unwrap();
        if line.contains("interrupted") {
            message = Some(line);
            break;
        }
        seen.push(line);
    }
    // Checked as soon as the message is read: whatever is alive now was alive when it
    // was printed.
    let kids: Vec<String> = children_of(pid)
        .into_iter()
        .map(|c| format!("{c}: {}", cmdline(c)))
        .collect();
    let naming_remote = processes_naming(&ip);
    let naming_bench = processes_naming(&format!("ferry-bench-{pid}"));
    let ns_left = std::path::Path::new("/run/netns").join(&ns).exists();
    let message = message.unwrap_or_else(|| panic!("no message; stderr:\n{}", seen.join("\n")));
    assert!(
        message.contains("everything was torn down"),
        "{message}\n{}",
        seen.join("\n")
    );
    assert!(kids.is_empty(), "children still alive: {kids:?}");
    assert!(
        naming_remote.is_empty() && naming_bench.is_empty(),
        "processes of the bench still alive: {naming_remote:?} {naming_bench:?}"
    );
    assert!(!ns_left, "namespace {ns} is still there");
    let status = wait_until(&mut bench.0, Duration::from_secs(10)).expect("bench exits");
    assert_eq!(status.code(), Some(130), "{}", said.all());
}
