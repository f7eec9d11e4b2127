//! With `FERRY_SOCKET` unset the shim is inert: every call goes to libc. With it set but
//! unreachable, non-inet descriptors still work and inet sockets fail cleanly.

mod support;

use std::time::Duration;

use support::{have, py, python, run, shimmed};

#[test]
fn shell_runs_under_the_inert_shim() {
    let mut c = shimmed("sh", None);
    c.args(["-c", "echo ok; echo err >&2; cat /dev/null | wc -c"]);
    let out = run(c, Duration::from_secs(10));
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n0\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
}

#[test]
fn curl_version_runs_under_the_inert_shim() {
    if !have("curl") {
        eprintln!("skipped: no curl");
        return;
    }
    let mut c = shimmed("curl", None);
    c.arg("--version");
    let out = run(c, Duration::from_secs(10));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("curl "));
}

const NATIVE_SOCKETS: &str = r#"
import socket, threading
# AF_UNIX, and inet over the kernel's loopback: the inert shim must not interfere.
a, b = socket.socketpair()
a.sendall(b"unix"); assert b.recv(4) == b"unix"
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
def serve():
    c, _ = l.accept(); c.sendall(c.recv(5)); c.close()
t = threading.Thread(target=serve); t.start()
s = socket.create_connection(l.getsockname())
s.sendall(b"hello"); assert s.recv(5) == b"hello"
s.close(); t.join()
print("native ok")
"#;

#[test]
fn sockets_are_native_when_inert() {
    if python().is_none() {
        eprintln!("skipped: no python3");
        return;
    }
    assert_eq!(py(NATIVE_SOCKETS, None, &[]), "native ok\n");
}

#[test]
fn unreachable_server_fails_inet_only() {
    if python().is_none() {
        eprintln!("skipped: no python3");
        return;
    }
    let script = r#"
import errno, socket
a, b = socket.socketpair()
a.sendall(b"x"); assert b.recv(1) == b"x"
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    print("created")
except OSError as e:
    print(errno.errorcode[e.errno])
# Raw and other families are never relayed.
u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); u.close()
"#;
    let out = py(
        script,
        Some(std::path::Path::new("/nonexistent/ferry.sock")),
        &[],
    );
    assert_eq!(out, "ENETDOWN\n");
}
