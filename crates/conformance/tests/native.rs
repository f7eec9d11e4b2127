//! The suite run natively must be clean and deterministic: exit 0, at least 110 cases,
//! no TIMEOUT/CRASH/PANIC/ERROR line, and byte-identical output run after run and in a
//! fresh network namespace. Otherwise comparing it with a run under ferry means nothing.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-conformance");

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run ferry-conformance")
}

/// Checks one run and returns its stdout.
fn clean(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let bad: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            [": TIMEOUT", ": CRASH(", ": PANIC(", ": ERROR("]
                .iter()
                .any(|m| l.contains(m))
        })
        .collect();
    assert!(bad.is_empty(), "{what}: failing cases:\n{}", bad.join("\n"));
    let cases = stdout.lines().filter(|l| l.contains(": ")).count();
    assert!(cases >= 110, "{what}: only {cases} cases");
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(last, format!("{cases} cases"), "{what}: bad summary line");
    stdout
}

/// Line-by-line differences, for a readable failure.
fn diff(a: &str, b: &str) -> String {
    a.lines()
        .zip(b.lines())
        .filter(|(x, y)| x != y)
        .map(|(x, y)| format!("- {x}\n+ {y}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn native_runs_are_clean_and_identical() {
    let first = clean(&run(&mut Command::new(BIN)), "first run");
    let second = clean(&run(&mut Command::new(BIN)), "second run");
    assert!(first == second, "runs differ:\n{}", diff(&first, &second));
}

#[test]
fn list_and_selection() {
    let list = run(Command::new(BIN).arg("--list"));
    assert!(list.status.success());
    let names = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(names.lines().count() >= 110);
    assert!(names.lines().all(|n| !n.contains(' ') && n.contains('.')));

    let one =
        run(Command::new(BIN).args(["udp.boundaries_preserved", "fd.socket_gets_lowest_free"]));
    let text = String::from_utf8_lossy(&one.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("fd.socket_gets_lowest_free: "));
    assert!(lines[1].starts_with("udp.boundaries_preserved: "));
    assert_eq!(lines[2], "2 cases");

    let filtered = run(Command::new(BIN).args(["--list", "--filter", "epoll."]));
    let f = String::from_utf8_lossy(&filtered.stdout).into_owned();
    assert!(
        f.lines().count() >= 10 && f.lines().all(|n| n.contains("epoll.")),
        "{f}"
    );

    let unknown = run(Command::new(BIN).arg("no.such_case"));
    assert_eq!(unknown.status.code(), Some(2));
}

/// The sandbox gives the program a network namespace with only `lo`: results there must
/// be the same as on the host. Needs `unshare -n` (root or user namespaces).
#[test]
fn fresh_network_namespace_matches_host() {
    let works = |flag: &str| {
        Command::new("unshare")
            .args([flag, "sh", "-c", "ip link set lo up"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let (prefix, how): (&[&str], &str) = if works("-n") {
        (&["-n"], "unshare -n")
    } else if works("-rn") {
        (&["-rn"], "unshare -rn")
    } else {
        eprintln!("skipped: cannot create a network namespace with `ip` here");
        return;
    };
    let host = clean(&run(&mut Command::new(BIN)), "host");
    let ns = run(Command::new("unshare").args(prefix).args([
        "sh",
        "-c",
        "ip link set lo up && exec \"$0\"",
        BIN,
    ]));
    let ns = clean(&ns, how);
    assert!(host == ns, "host vs {how}:\n{}", diff(&host, &ns));
}
