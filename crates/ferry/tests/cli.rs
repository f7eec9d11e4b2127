//! Bad input gets a clear message and the right exit status.

mod common;
use common::*;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn unknown_option_is_a_usage_error() {
    let o = ferry()
        .args(["run", "--no-such-flag", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--no-such-flag"), "{}", stderr(&o));
}

#[test]
fn missing_command_is_a_usage_error() {
    let o = ferry().args(["run"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("CMD"), "{}", stderr(&o));
}

#[test]
fn bad_values_are_refused_with_their_reason() {
    for (args, want) in [
        (
            vec!["run", "--spin", "fast", "--", "true"],
            "not a time span",
        ),
        (vec!["run", "--batch", "0", "--", "true"], "--batch"),
        (vec!["run", "-p", "80", "--", "true"], "HOST_PORT:PORT"),
        (
            vec!["run", "--deny", "10.0.0.0/40", "--", "true"],
            "prefix /40",
        ),
        (
            vec!["run", "--handoff", "10.0.0.0/8:http", "--", "true"],
            "--handoff 10.0.0.0/8:http: `http` is not a port number",
        ),
    ] {
        let o = ferry().args(&args).output().unwrap();
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn exit_status_passes_through() {
    let o = ferry_run(&[], &["sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
}

#[test]
fn missing_program_exits_127() {
    let o = ferry_run(&[], &["no-such-program-ferry"]);
    assert_eq!(o.status.code(), Some(127));
    assert!(
        stderr(&o).contains("no-such-program-ferry"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn sandbox_sees_only_loopback_and_its_tap() {
    let ifaces = |net: &str| {
        let o = ferry_run(
            &["--net", net],
            &[
                "sh",
                "-c",
                "tail -n +3 /proc/self/net/dev | cut -d: -f1 | tr -d ' ' | sort",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(ifaces("socket"), "lo");
    // nic and both (the default): the TAP ferry's NIC servers own, where /dev/net/tun is.
    if std::path::Path::new("/dev/net/tun").exists() {
        assert_eq!(ifaces("nic"), "eth0 lo");
        assert_eq!(ifaces("both"), "eth0 lo");
    }
}

/// The server may run as root: options that need privilege over the host's network, or
/// whose value points into memory, are refused with EPERM (and a log line); ordinary
/// options still reach the host socket.
#[test]
fn privileged_socket_options_are_refused() {
    let script = r#"
import socket, struct
s = socket.socket()
for name, level, opt, val in [
    ("IP_TRANSPARENT", socket.SOL_IP, 19, struct.pack("i", 1)),
    ("SO_MARK", socket.SOL_SOCKET, 36, struct.pack("i", 7)),
    ("SO_BINDTODEVICE", socket.SOL_SOCKET, 25, b"lo\0"),
    ("SO_PRIORITY_7", socket.SOL_SOCKET, 12, struct.pack("i", 7)),
    ("SO_PRIORITY_3", socket.SOL_SOCKET, 12, struct.pack("i", 3)),
    ("SO_KEEPALIVE", socket.SOL_SOCKET, 9, struct.pack("i", 1)),
]:
    try:
        s.setsockopt(level, opt, val)
        print(name, "ok")
    except OSError as e:
        print(name, e.errno)
print("keepalive", s.getsockopt(socket.SOL_SOCKET, 9), "priority", s.getsockopt(socket.SOL_SOCKET, 12))
"#;
    let o = ferry_run(&[], &["python3", "-c", script]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let eperm = libc::EPERM;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!(
            "IP_TRANSPARENT {eperm}\nSO_MARK {eperm}\nSO_BINDTODEVICE {eperm}\n\
             SO_PRIORITY_7 {eperm}\nSO_PRIORITY_3 ok\nSO_KEEPALIVE ok\nkeepalive 1 priority 3"
        )
    );
    assert!(
        stderr(&o).contains("needs privilege over the host's network"),
        "{}",
        stderr(&o)
    );
    // `curl --interface` tries SO_BINDTODEVICE on every run: refused without a line.
    assert!(
        !stderr(&o).contains(&format!(
            "setsockopt({}, {})",
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE
        )),
        "{}",
        stderr(&o)
    );
}
