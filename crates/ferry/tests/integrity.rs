//! No byte lost, no send that lies, as CPython programs met it (issue "no byte lost"):
//! each script runs natively and through ferry (`--net socket` and the default `both`)
//! and must print the same, with two busy processes beside it (the races show only
//! when the CPUs are contended). The conformance suite has C-level cases for the same
//! rules (`int.*`); these are the interpreter's shapes that found them.

mod common;

use std::process::{Child, Command, Stdio};

use common::{TempDir, can_run, ferry, ferry_run};

/// Two processes that burn a CPU each while a test runs.
struct Busy(Vec<Child>);

impl Busy {
    fn start() -> Busy {
        let spin = || {
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdout(Stdio::null())
                .spawn()
                .expect("sh")
        };
        Busy(vec![spin(), spin()])
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `script` natively and through ferry with each of `modes`; returns the outputs.
fn native_and_ferry(script: &str, args: &[&str]) -> (String, Vec<(String, String)>) {
    let native = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3");
    assert!(native.status.success(), "native: {native:?}");
    let native = String::from_utf8_lossy(&native.stdout).into_owned();
    let mut through = Vec::new();
    for mode in ["socket", "both"] {
        let mut cmd = vec!["python3", "-c", script];
        cmd.extend_from_slice(args);
        let out = ferry_run(&["--net", mode], &cmd);
        assert!(
            out.status.success(),
            "--net {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        through.push((
            mode.to_string(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ));
    }
    (native, through)
}

fn same_as_native(script: &str, args: &[&str], want: &str) {
    let _busy = Busy::start();
    let (native, through) = native_and_ferry(script, args);
    assert_eq!(native, want, "native run");
    for (mode, out) in through {
        assert_eq!(out, native, "--net {mode} differs from native");
    }
}

/// A worker thread of a pool (it stays alive, as asyncio's `to_thread` pool does)
/// sends 160 KiB, blocking or not, with `send` or `sendfile`; the main thread then
/// closes the socket or shuts it down. CPython's test_os `TestSendfile` shape.
const SEND_THEN_CLOSE: &str = r#"
import os, socket, sys, tempfile, threading, time
from concurrent.futures import ThreadPoolExecutor
N = 160 * 1024
data = os.urandom(N)
f = tempfile.TemporaryFile(); f.write(data); f.flush()
pool = ThreadPoolExecutor(1)
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(8)
results = []
for way in ("send", "send-nb", "sendfile", "sendfile-nb"):
    for end in ("close", "shutdown"):
        whole = 0
        for trial in range(8):
            cli = socket.create_connection(srv.getsockname())
            peer, _ = srv.accept()
            got = []
            def reader():
                buf = bytearray()
                while True:
                    b = peer.recv(65536)
                    if not b:
                        break
                    buf += b
                got.append(bytes(buf))
            rt = threading.Thread(target=reader); rt.start()
            if way.endswith("-nb"):
                cli.setblocking(False)
            def work():
                time.sleep(0.02)
                off = 0
                while off < N:
                    try:
                        if way.startswith("sendfile"):
                            off += os.sendfile(cli.fileno(), f.fileno(), off, N - off)
                        else:
                            off += cli.send(data[off:])
                    except BlockingIOError:
                        time.sleep(0.0005)
                return off
            sent = pool.submit(work).result()
            if end == "shutdown":
                cli.shutdown(socket.SHUT_WR)
            cli.close()
            rt.join(); peer.close()
            whole += sent == N and got[0] == data
        results.append("%s/%s %d/8" % (way, end, whole))
print(" ".join(results))
"#;

#[test]
fn a_send_in_one_thread_and_a_close_in_another_lose_nothing() {
    if !can_run(&["python3"]) {
        return;
    }
    same_as_native(
        SEND_THEN_CLOSE,
        &[],
        "send/close 8/8 send/shutdown 8/8 send-nb/close 8/8 send-nb/shutdown 8/8 \
         sendfile/close 8/8 sendfile/shutdown 8/8 sendfile-nb/close 8/8 \
         sendfile-nb/shutdown 8/8\n",
    );
}

/// One process, one connection after another whose peer resets it: each must see
/// its sends fail (asyncio's test_streams `test_drain_raises` spun forever once ~64
/// connections had failed before).
const SENDS_AFTER_RESET: &str = r#"
import socket, struct, sys, threading, time
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(128)
def acceptor():
    while True:
        c, _ = srv.accept()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
threading.Thread(target=acceptor, daemon=True).start()
conns = int(sys.argv[1]); failed = 0; silent = 0
for i in range(conns):
    if silent == 3:
        break
    c = socket.create_connection(srv.getsockname())
    time.sleep(0.002)
    t0 = time.time()
    while time.time() - t0 < 2:
        try:
            c.send(b"x" * 100)
        except (BrokenPipeError, ConnectionResetError):
            failed += 1
            break
    else:
        silent += 1
    c.close()
print("connections=%d failed=%d" % (conns, failed))
"#;

#[test]
fn sends_into_a_reset_connection_fail_however_many_failed_before() {
    if !can_run(&["python3"]) {
        return;
    }
    same_as_native(SENDS_AFTER_RESET, &["300"], "connections=300 failed=300\n");
}

/// CPython's asyncio suites that found the rest: a sendfile into a 4 KiB send buffer
/// whose peer closes after 1 KiB must fail (test_sendfile, 3 event loops), and an
/// epoll registration made during a refused non-blocking connect must report the
/// next attempt (test_sock_lowlevel `test_sock_client_connect_racing`).
#[test]
fn cpython_asyncio_sendfile_and_connect_racing_pass() {
    if !can_run(&["python3"])
        || !std::path::Path::new("/usr/lib/python3.11/test/test_asyncio").is_dir()
    {
        eprintln!("skipped: CPython's test package (libpython3.11-testsuite) is missing");
        return;
    }
    let cases = [
        "test.test_asyncio.test_sendfile.EPollEventLoopTests.test_sendfile_close_peer_in_the_middle_of_receiving",
        "test.test_asyncio.test_sendfile.PollEventLoopTests.test_sendfile_close_peer_in_the_middle_of_receiving",
        "test.test_asyncio.test_sendfile.SelectEventLoopTests.test_sendfile_close_peer_in_the_middle_of_receiving",
        "test.test_asyncio.test_sock_lowlevel.EPollEventLoopTests.test_sock_client_connect_racing",
    ];
    // The suite writes its scratch files in the working directory: one the sandbox's
    // identity may write.
    let dir = TempDir::new("cpython");
    let out = ferry()
        .current_dir(dir.path())
        .args(["run", "--", "python3", "-m", "unittest"])
        .args(cases)
        .output()
        .expect("spawn ferry");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("Ran 4 tests"), "{err}");
}
