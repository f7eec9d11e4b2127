//! `ferry-conformance`: the socket conformance suite.
//!
//! Every case exercises one behaviour real programs rely on (see `docs/COMPAT.md`) with
//! direct libc calls and prints one deterministic line `NAME: RESULT`. The suite is run
//! once natively and once as `ferry run -- ferry-conformance`; the two outputs must be
//! identical. Results never contain ports, pids, timings or other per-run values.
//!
//! Usage: `ferry-conformance [--list] [--filter SUBSTR] [--timeout-ms MS] [NAME…]`.
//! The exit status is 0 unless a case timed out or crashed; `--timeout-ms` overrides
//! every case's deadline (for debugging a slow shim).

// The crate is under the workspace's unsafe lints like every other: each `unsafe` block
// says why it is sound. Most libc calls go through `sys!`, whose one SAFETY comment
// states the contract every use keeps (pointers to memory the calling case owns and
// keeps alive, lengths of those very buffers); a call that relies on anything more
// (fork and clone, pointers into foreign memory, casts between struct types) is in an
// `unsafe` block of its own, inside `sys!` or not, with its own comment.

#[macro_use]
mod sys;
mod cases;
mod exec_child;
mod flags;
mod net;
mod proc;
mod runner;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child-exec-case") {
        return exec_child::main(&args[1..]);
    }
    let all = cases::all();
    let mut filter: Option<String> = None;
    let mut names: Vec<String> = Vec::new();
    let mut list = false;
    let mut timeout_ms: Option<u32> = None;
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--list" => list = true,
            "--filter" => match it.next() {
                Some(f) => filter = Some(f),
                None => return usage("--filter needs an argument"),
            },
            "--timeout-ms" => match it.next().and_then(|t| t.parse().ok()) {
                Some(t) => timeout_ms = Some(t),
                None => return usage("--timeout-ms needs a number"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            s if s.starts_with('-') => return usage(&format!("unknown option {s}")),
            _ => names.push(arg),
        }
    }
    for name in &names {
        if !all.iter().any(|c| c.name == name) {
            return usage(&format!("no case named {name}"));
        }
    }
    let selected: Vec<cases::Case> = all
        .into_iter()
        .filter(|c| names.is_empty() || names.iter().any(|n| n == c.name))
        .filter(|c| filter.as_ref().is_none_or(|f| c.name.contains(f.as_str())))
        .map(|c| match timeout_ms {
            Some(t) => cases::Case { timeout_ms: t, ..c },
            None => c,
        })
        .collect();
    if list {
        for c in &selected {
            println!("{}", c.name);
        }
        return ExitCode::SUCCESS;
    }
    if runner::run_all(&selected) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

const USAGE: &str = "usage: ferry-conformance [--list] [--filter SUBSTR] [--timeout-ms MS] [NAME…]";

fn usage(msg: &str) -> ExitCode {
    eprintln!("ferry-conformance: {msg}");
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
