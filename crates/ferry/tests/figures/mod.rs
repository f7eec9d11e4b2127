//! Shared by the soak, load and fault tests: the `ferry-soak` binary, sizes from the
//! environment (CI runs small ones; the figures in docs/SECURITY.md come from the same
//! tests at full size), lines read from a child with a deadline, and processes measured
//! through /proc (descriptors, resident memory).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `ferry-soak`, built next to the ferry binary (`cargo build --release --workspace`);
/// `None`, after saying so, when it is missing.
pub fn soak_bin() -> Option<PathBuf> {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ferry")).with_file_name("ferry-soak");
    if bin.is_file() {
        // Where the sandbox's (unprivileged) programs can run it.
        Some(crate::common::sandbox_exe("ferry-soak"))
    } else {
        eprintln!(
            "skipped: {} is missing (cargo build --release --workspace builds it)",
            bin.display()
        );
        None
    }
}

/// A size from environment variable `name` (`300M`, `10G`…), else `default`.
pub fn size_env(name: &str, default: &str) -> u64 {
    let v = std::env::var(name).unwrap_or_else(|_| default.to_owned());
    ferry_bench::soak::parse_size(&v).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A number from environment variable `name`, else `default`.
pub fn num_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

/// The lines a child prints, collected by a thread (and echoed to stderr with a tag,
/// so a long run shows its progress under `--nocapture`).
pub struct Lines {
    rx: mpsc::Receiver<String>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Lines {
    /// Starts reading `pipe`.
    pub fn new(tag: &str, pipe: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, tag) = (seen.clone(), tag.to_owned());
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                eprintln!("[{tag}] {line}");
                s.lock().unwrap().push(line.clone());
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen }
    }

    /// The next line that starts with `prefix` (earlier ones are skipped); panics with
    /// every line seen if none comes within `timeout` or the pipe ends.
    pub fn wait_for(&self, prefix: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => {}
                Err(e) => panic!(
                    "no line starting with {prefix:?} ({e:?}); lines so far:\n{}",
                    self.all()
                ),
            }
        }
    }

    /// Every line so far.
    pub fn all(&self) -> String {
        self.seen.lock().unwrap().join("\n")
    }
}

/// Waits for `child` up to `timeout`; `None` (the child still runs) after it.
pub fn wait_until(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Open descriptors of process `pid`.
pub fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Resident memory of process `pid`, KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// What each open descriptor of `pid` points at (`socket:[…]`, `anon_inode:[eventfd]`…),
/// sorted, with inode numbers left out.
pub fn fd_kinds(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|t| {
                    let t = t.to_string_lossy().into_owned();
                    t.split(":[").next().unwrap_or(&t).to_owned()
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The first descendant of `pid` running `program` (the file name of its `argv[0]`)
/// with `arg` as its first argument (as seen from the host: the sandbox's processes
/// are ferry's grandchildren; the sandbox's init still has ferry's own command line).
pub fn descendant(pid: u32, program: &str, arg: &str) -> Option<u32> {
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task")).ok()?;
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids
                .split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok())
            {
                let cmd = std::fs::read(format!("/proc/{k}/cmdline")).unwrap_or_default();
                let argv: Vec<String> = cmd
                    .split(|&b| b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                let name = argv[0].rsplit('/').next().unwrap_or("");
                if name == program && argv.get(1).is_some_and(|a| a == arg) {
                    return Some(k);
                }
                queue.push(k);
            }
        }
    }
    None
}

/// Polls [`descendant`] for up to 10 s.
pub fn find_descendant(pid: u32, program: &str, arg: &str) -> u32 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(p) = descendant(pid, program, arg) {
            return p;
        }
        assert!(
            Instant::now() < end,
            "no process {program} {arg} under {pid}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--stats-json`'s file, parsed.
pub fn stats(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// A top-level number of the stats.
pub fn stat(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in the stats: {v}"))
}
