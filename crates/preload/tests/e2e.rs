//! The shim against ferry's protocol server (run in a thread of the test process, in the
//! host namespace), driven by real programs: Python's socket module and curl.

mod support;

use std::time::{Duration, Instant};

use support::{
    Running, have, http, py, python, run, serial, shimmed, tcp_echo, tcp_silent, udp_echo,
};

fn need_python() -> bool {
    if python().is_none() {
        eprintln!("skipped: no python3");
        return false;
    }
    true
}

const TCP_ECHO: &str = r#"
import socket, sys
port = int(sys.argv[1])
s = socket.socket()
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
assert s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM
s.connect(("127.0.0.1", port))
assert s.getpeername() == ("127.0.0.1", port), s.getpeername()
assert s.getsockname()[0] == "127.0.0.1"
data = bytes((i * 7 + i // 251) & 255 for i in range(1 << 20))
got = bytearray()
sent = 0
while sent < len(data):
    sent += s.send(data[sent:sent + 300000])
    while len(got) < sent - 200000:
        got += s.recv(65536)
while len(got) < len(data):
    chunk = s.recv(65536)
    assert chunk, "early EOF"
    got += chunk
assert got == data
s.shutdown(socket.SHUT_WR)
assert s.recv(10) == b""
s.close()
print("tcp ok")
"#;

#[test]
fn tcp_echo_round_trip() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("tcp", 1);
    let echo = tcp_echo();
    let out = py(TCP_ECHO, Some(&srv.path), &[echo.port().to_string()]);
    assert_eq!(out, "tcp ok\n");
    let stats = srv.stop();
    assert_eq!(stats.sockets.len(), 1, "{stats:?}");
    assert!(stats.sockets[0].bytes_out >= 1 << 20, "{stats:?}");
}

const UDP: &str = r#"
import socket, sys
port = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(20):
    msg = b"datagram %d " % i * (i + 1)
    s.sendto(msg, ("127.0.0.1", port))
    data, frm = s.recvfrom(65536)
    assert data == msg and frm == ("127.0.0.1", port), (data, frm)
# Connected UDP, a datagram larger than the buffer given: truncated, MSG_TRUNC reported.
s.connect(("127.0.0.1", port))
s.send(b"x" * 1000)
data, anc, flags, frm = s.recvmsg(10)
assert data == b"x" * 10 and flags & socket.MSG_TRUNC, (data, flags)
s.close()
print("udp ok")
"#;

#[test]
fn udp_datagrams() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("udp", 1);
    let echo = udp_echo();
    assert_eq!(
        py(UDP, Some(&srv.path), &[echo.port().to_string()]),
        "udp ok\n"
    );
}

const LISTENER: &str = r#"
import os, select, socket, threading
# A listener inside the sandbox (its own loopback), reached from the same program.
l = socket.socket(socket.AF_INET6 if False else socket.AF_INET)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0))
l.listen(8)
port = l.getsockname()[1]
assert port != 0
def client(i):
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"hi %d" % i)
    assert c.recv(100) == b"HI %d" % i
    c.close()
ts = [threading.Thread(target=client, args=(i,)) for i in range(4)]
for t in ts: t.start()
for _ in range(4):
    r, _, _ = select.select([l], [], [], 5)
    assert r == [l], "listener not readable"
    c, peer = l.accept()
    assert peer[0] == "127.0.0.1"
    msg = c.recv(100)
    c.sendall(msg.upper())
    assert c.recv(10) == b""   # the client closed
    c.close()
for t in ts: t.join()
# Non-blocking accept with nothing pending.
l.setblocking(False)
try:
    l.accept()
    raise SystemExit("accepted nothing?")
except BlockingIOError:
    pass
l.close()
print("listener ok")
"#;

#[test]
fn listener_inside_the_sandbox() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("listen", 1);
    assert_eq!(py(LISTENER, Some(&srv.path), &[]), "listener ok\n");
}

const NONBLOCKING: &str = r#"
import errno, select, socket, sys
port = int(sys.argv[1])
# Python's timeouts: O_NONBLOCK + connect (EINPROGRESS) + poll + SO_ERROR.
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(b"ping")
assert s.recv(4) == b"ping"
# poll and epoll report input when the echo arrives; nothing before.
s.setblocking(False)
try:
    s.recv(10)
    raise SystemExit("data from nowhere")
except BlockingIOError:
    pass
p = select.poll(); p.register(s, select.POLLIN)
assert p.poll(50) == []
s.send(b"pong")
ev = p.poll(5000)
assert ev and ev[0][1] & select.POLLIN, ev
assert s.recv(10) == b"pong"
ep = select.epoll(); ep.register(s.fileno(), select.EPOLLIN)
assert ep.poll(0.05) == []
s.send(b"again")
assert ep.poll(5)[0][1] & select.EPOLLIN
assert s.recv(10) == b"again"
assert ep.poll(0.05) == []
# A refused connection reports ECONNREFUSED via SO_ERROR after EINPROGRESS.
r = socket.socket(); r.setblocking(False)
e = r.connect_ex(("127.0.0.1", 1))
if e == errno.EINPROGRESS:
    select.select([], [r], [], 5)
    e = r.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
assert e == errno.ECONNREFUSED, errno.errorcode.get(e, e)
print("nonblocking ok")
"#;

#[test]
fn nonblocking_and_readiness() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("nb", 1);
    let echo = tcp_echo();
    assert_eq!(
        py(NONBLOCKING, Some(&srv.path), &[echo.port().to_string()]),
        "nonblocking ok\n"
    );
}

const FLAGS: &str = r#"
import socket, struct, sys, fcntl, termios, time, errno
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"abcdef")
assert s.recv(3, socket.MSG_PEEK | socket.MSG_WAITALL) == b"abc"
time.sleep(0.1)
n = struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
assert n == 6, n
assert s.recv(6, socket.MSG_WAITALL) == b"abcdef"
# WAITALL collects several sends.
s.sendall(b"12"); s.sendall(b"34")
assert s.recv(4, socket.MSG_WAITALL) == b"1234"
# SO_RCVTIMEO: a blocking recv gives up with EAGAIN.
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200000))
t0 = time.monotonic()
try:
    s.recv(10)
    raise SystemExit("data from nowhere")
except OSError as e:
    assert e.errno == errno.EAGAIN, e
assert 0.15 < time.monotonic() - t0 < 3
# readv / writev
import os
os.writev(s.fileno(), [b"ve", b"ct", b"or"])
a, b = bytearray(2), bytearray(4)
time.sleep(0.1)
assert os.readv(s.fileno(), [a, b]) == 6 and bytes(a + b) == b"vector"
# MSG_DONTWAIT on a blocking socket.
try:
    s.recv(1, socket.MSG_DONTWAIT)
    raise SystemExit("data from nowhere")
except BlockingIOError:
    pass
print("flags ok")
"#;

#[test]
fn flags_timeouts_and_vectors() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("flags", 1);
    let echo = tcp_echo();
    assert_eq!(
        py(FLAGS, Some(&srv.path), &[echo.port().to_string()]),
        "flags ok\n"
    );
}

const PROCESSES: &str = r#"
import os, socket, subprocess, sys
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
# fork: the child uses the inherited socket through its own channel.
pid = os.fork()
if pid == 0:
    s.sendall(b"from child")
    assert s.recv(10) == b"from child"
    os._exit(0)
_, st = os.waitpid(pid, 0)
assert st == 0, st
s.sendall(b"from parent")
assert s.recv(11) == b"from parent"
# dup: the duplicate is the same socket.
d = socket.socket(fileno=os.dup(s.fileno()))
d.sendall(b"dup")
assert s.recv(3) == b"dup"
d.close()
# exec: a new program finds the inherited socket by its name.
# Its receive timeout comes along (the new program asks the server for it).
import struct
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200000))
code = """if 1:
    import errno, os, socket, time
    s = socket.socket(fileno=int(os.environ['FD']))
    s.sendall(b'exec'); print(s.recv(4).decode())
    t0 = time.monotonic()
    try:
        s.recv(1)
    except OSError as e:
        print(errno.errorcode[e.errno], time.monotonic() - t0 < 3)
"""
fd = s.fileno()
out = subprocess.run([sys.executable, "-c", code], pass_fds=[fd], env=dict(os.environ, FD=str(fd)), capture_output=True, timeout=20)
assert out.stdout == b"exec\nEAGAIN True\n", out
# Closing "every other descriptor" spares the shim's own (the channel keeps working).
os.closerange(s.fileno() + 1, 1 << 20)
for fd in range(s.fileno() + 1, 4096):
    try:
        os.close(fd)
    except OSError:
        pass
s.sendall(b"still")
assert s.recv(5) == b"still"
s.close()
print("processes ok")
"#;

#[test]
fn fork_dup_and_exec_keep_sockets() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("proc", 1);
    let echo = tcp_echo();
    assert_eq!(
        py(PROCESSES, Some(&srv.path), &[echo.port().to_string()]),
        "processes ok\n"
    );
}

const SIGNALS: &str = r#"
import errno, signal, socket, sys, time
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
class Alarm(Exception): pass
def on_alarm(sig, frm): raise Alarm()
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.3)
t0 = time.monotonic()
try:
    s.recv(10)
    raise SystemExit("data from nowhere")
except Alarm:
    pass
assert time.monotonic() - t0 < 5
# The socket still works after the cancelled receive.
s2 = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
s2.sendall(b"alive")
assert s2.recv(5) == b"alive"
# A handler that uses another socket while the main flow is blocked in recv (Python
# runs it after the interrupted call returns EINTR, then retries the call: PEP 475).
def on_usr1(sig, frm):
    s2.sendall(b"nested")
    assert s2.recv(6) == b"nested"
    print("handler done", flush=True)
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGALRM, on_alarm)
import os, threading
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()
signal.setitimer(signal.ITIMER_REAL, 1.0)
try:
    s.recv(10)
    raise SystemExit("data from nowhere")
except Alarm:
    pass
print("signals ok")
"#;

#[test]
fn signals_interrupt_blocking_calls() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("sig", 1);
    let silent = tcp_silent();
    let echo = tcp_echo();
    let out = py(
        SIGNALS,
        Some(&srv.path),
        &[silent.port().to_string(), echo.port().to_string()],
    );
    assert_eq!(out, "handler done\nsignals ok\n");
}

const THREADS: &str = r#"
import socket, sys, threading
port = int(sys.argv[1])
errors = []
def worker(i):
    try:
        s = socket.create_connection(("127.0.0.1", port))
        for j in range(50):
            msg = b"%d-%d " % (i, j) * 100
            s.sendall(msg)
            got = b""
            while len(got) < len(msg):
                got += s.recv(65536)
            assert got == msg
        s.close()
    except Exception as e:
        errors.append(e)
ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
# One socket, a reader thread blocked in recv while the main thread sends.
s = socket.create_connection(("127.0.0.1", port))
got = []
r = threading.Thread(target=lambda: got.append(s.recv(5)))
r.start()
s.sendall(b"cross")
r.join(10)
assert got == [b"cross"], got
print("threads ok")
"#;

#[test]
fn many_threads_many_channels() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("thr", 1);
    let echo = tcp_echo();
    assert_eq!(
        py(THREADS, Some(&srv.path), &[echo.port().to_string()]),
        "threads ok\n"
    );
    let stats = srv.stop();
    assert!(
        stats.channels.len() >= 9,
        "one channel per thread: {}",
        stats.channels.len()
    );
}

#[test]
fn batched_doorbells_still_deliver() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("batch", 16);
    let echo = tcp_echo();
    assert_eq!(
        py(TCP_ECHO, Some(&srv.path), &[echo.port().to_string()]),
        "tcp ok\n"
    );
    assert_eq!(
        py(THREADS, Some(&srv.path), &[echo.port().to_string()]),
        "threads ok\n"
    );
}

const SENDFILE: &str = r#"
import os, socket, sys, tempfile
port = int(sys.argv[1])
data = os.urandom(300000)
with tempfile.TemporaryFile() as f:
    f.write(data); f.flush(); f.seek(0)
    s = socket.create_connection(("127.0.0.1", port))
    n = os.sendfile(s.fileno(), f.fileno(), 1000, len(data))
    assert n > 0
    total = n
    while total < len(data) - 1000:
        total += os.sendfile(s.fileno(), f.fileno(), 1000 + total, len(data))
    got = b""
    while len(got) < len(data) - 1000:
        got += s.recv(65536)
    assert got == data[1000:]
print("sendfile ok")
"#;

#[test]
fn sendfile_from_a_file() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("sf", 1);
    let echo = tcp_echo();
    assert_eq!(
        py(SENDFILE, Some(&srv.path), &[echo.port().to_string()]),
        "sendfile ok\n"
    );
}

#[test]
fn curl_fetches_through_the_server() {
    if !have("curl") {
        eprintln!("skipped: no curl");
        return;
    }
    let _g = serial();
    let srv = Running::start("curl", 1);
    let web = http("hello through ferry\n");
    let mut c = shimmed("curl", Some(&srv.path));
    c.args([
        "-sS",
        "--max-time",
        "10",
        &format!("http://127.0.0.1:{}/x", web.port()),
    ]);
    let out = run(c, Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello through ferry\n"
    );
    let stats = srv.stop();
    assert!(
        !stats.sockets.is_empty(),
        "curl's socket went through ferry: {stats:?}"
    );
}

const SERVER_DIES: &str = r#"
import errno, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
t0 = time.monotonic()
try:
    s.recv(10)
    print("no error")
except OSError as e:
    print(errno.errorcode[e.errno])
assert time.monotonic() - t0 < 10
"#;

#[test]
fn a_dead_server_fails_calls_instead_of_hanging() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("death", 1);
    let silent = tcp_silent();
    let mut c = shimmed(python().unwrap(), Some(&srv.path));
    c.arg("-c").arg(SERVER_DIES).arg(silent.port().to_string());
    let mut child = c
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The server stops once the program is connected (however long a loaded machine
    // takes to get there) and in its receive.
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut stdout = String::new();
    std::io::BufRead::read_line(&mut lines, &mut stdout).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    srv.stop();
    std::io::Read::read_to_string(&mut lines, &mut stdout).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        stdout,
        "connected\nECONNRESET\n",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
}

/// Compiles one of `tests/c/*.c` with the system C compiler (`None` if there is none).
fn compile_c(name: &str) -> Option<std::path::PathBuf> {
    if !have("cc") {
        eprintln!("skipped: no C compiler");
        return None;
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out = std::env::temp_dir().join(format!("ferry-preload-{name}-{}", std::process::id()));
    let st = std::process::Command::new("cc")
        .args(["-O1", "-Wall", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "cc {}", src.display());
    Some(out)
}

/// A kernel TCP peer on 127.0.0.1: a thread accepts one connection and hands it to
/// `serve`. Returns the port and the thread.
fn host_peer<T: Send + 'static>(
    serve: impl FnOnce(std::net::TcpStream) -> T + Send + 'static,
) -> (u16, std::thread::JoinHandle<T>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (
        port,
        std::thread::spawn(move || serve(l.accept().unwrap().0)),
    )
}

/// Answers `rounds` 4-byte pings on `c` with `pong`, each after `delay`.
fn answer_pings(c: &mut std::net::TcpStream, rounds: usize, delay: Duration) {
    use std::io::{Read, Write};
    let mut b = [0u8; 4];
    for _ in 0..rounds {
        c.read_exact(&mut b).unwrap();
        std::thread::sleep(delay);
        c.write_all(b"pong").unwrap();
    }
}

/// A kernel TCP server on 127.0.0.1 that closes every connection at once.
fn tcp_closing() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            drop(c);
        }
    });
    addr
}

#[test]
fn c_signal_semantics() {
    let Some(prog) = compile_c("signals") else {
        return;
    };
    let _g = serial();
    let srv = Running::start("csig", 1);
    let (silent, echo, closing) = (tcp_silent(), tcp_echo(), tcp_closing());
    let mut c = shimmed(&prog, Some(&srv.path));
    c.args([silent.port(), echo.port(), closing.port()].map(|p| p.to_string()));
    let out = run(c, Duration::from_secs(30));
    let _ = std::fs::remove_file(&prog);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "own yes\neintr yes nested yes\nrestart yes handler 1\nbroken yes nosignal-quiet yes\nsigpipe yes\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Development aid: `FERRY_DEBUG_SCRIPT=path cargo test -p ferry-preload --test e2e
/// debug_script -- --ignored --nocapture` runs a Python script under the shim with a
/// server and an echo port (argv[1]).
#[test]
#[ignore]
fn debug_script() {
    let path = std::env::var("FERRY_DEBUG_SCRIPT").expect("FERRY_DEBUG_SCRIPT");
    let script = std::fs::read_to_string(path).unwrap();
    let _g = serial();
    let srv = Running::start("debug", 1);
    let echo = tcp_echo();
    let mut c = shimmed(python().unwrap(), Some(&srv.path));
    c.arg("-c").arg(&script).arg(echo.port().to_string());
    let out = run(c, Duration::from_secs(60));
    println!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{:#?}", srv.stop());
}

const SEND_AND_EXIT: &str = r#"
import os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
data = bytes(range(256)) * 16384
s.sendall(data)
s.close()
if sys.argv[2] == "_exit":
    os._exit(0)   # no cleanup at all
"#;

/// A program that queues 4 MiB, closes and exits at once; returns what the peer got.
fn send_and_exit(how: &str) -> Vec<u8> {
    let _g = serial();
    let srv = Running::start("exit", 1);
    let (port, sink) = host_peer(|mut c| {
        use std::io::Read;
        let mut all = Vec::new();
        c.read_to_end(&mut all).unwrap();
        all
    });
    let out = py(
        SEND_AND_EXIT,
        Some(&srv.path),
        &[port.to_string(), how.to_string()],
    );
    assert_eq!(out, "");
    sink.join().unwrap()
}

fn check_pattern(got: &[u8]) {
    assert_eq!(got.len(), 256 * 16384);
    assert!(
        got.chunks(256)
            .all(|c| c.iter().enumerate().all(|(i, b)| *b == i as u8))
    );
}

#[test]
fn queued_data_survives_close_and_exit() {
    if !need_python() {
        return;
    }
    for _ in 0..5 {
        check_pattern(&send_and_exit("exit"));
    }
}

/// `_exit` skips every exit handler: the shim interposes it to let the server take the
/// queued records first. (A process killed outright still needs the server to drain a
/// channel whose control socket hung up before closing it.)
#[test]
fn queued_data_survives_close_and_abrupt_exit() {
    if !need_python() {
        return;
    }
    for _ in 0..5 {
        check_pattern(&send_and_exit("_exit"));
    }
}

const SLOW_READER: &str = r#"
import select, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
t0 = time.monotonic()
s.sendall(b"z" * (8 << 20))          # more than the channel's buffers: blocks for a while
assert time.monotonic() - t0 > 0.2
s.setblocking(False)
# The blocking send's last buffers may all be in flight still, so the first
# non-blocking send can find no room: it makes the fd poll unwritable until a buffer
# is back, so wait for that with select and go on, until sends are refused again.
n = 0
deadline = time.monotonic() + 5
while True:
    try:
        n += s.send(b"y" * 65536)
    except BlockingIOError:
        if n > 0:
            break
        assert time.monotonic() < deadline, "never writable again"
        select.select([], [s], [], 5)
assert n > 0
s.setblocking(True)
s.close()
print(n)
"#;

#[test]
fn back_pressure_blocks_then_would_block() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("slow", 1);
    let (port, sink) = host_peer(|mut c| {
        use std::io::Read;
        std::thread::sleep(Duration::from_millis(500));
        let mut first = vec![0u8; 8 << 20];
        c.read_exact(&mut first).unwrap();
        assert!(first.iter().all(|&b| b == b'z'));
        std::thread::sleep(Duration::from_millis(1000));
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.iter().all(|&b| b == b'y'));
        rest.len()
    });
    let out = py(SLOW_READER, Some(&srv.path), &[port.to_string()]);
    let n: usize = out.trim().parse().unwrap();
    assert_eq!(sink.join().unwrap(), n);
}

const RETRY_WITHOUT_POLL: &str = r#"
import select, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setblocking(False)
# Until the peer's and the host socket's buffers are full, then as many sends in a row
# as told, each refused: a writer that retries before it polls (iperf3 tries up to ten
# writes per select).
n = 0
refused = 0
while refused < int(sys.argv[2]):
    try:
        n += s.send(b"w" * 65536)
        refused = 0
    except BlockingIOError:
        refused += 1
# Still woken when room comes back, and sends go on.
r, w, x = select.select([], [s], [], 10)
assert w, "never writable again"
n += s.send(b"w" * 65536)
s.setblocking(True)
s.close()
print(n)
"#;

/// A non-blocking send that finds no room leaves a filler in the pair (the fd polls
/// unwritable) and asks the server for room (`WantRoom`); one that finds no room again
/// while that filler is still there must say `EAGAIN` without a second filler and
/// request (each cost ~7 system calls and a request record: iperf3's client made ~4 per
/// `select`), and the writer is still woken when room comes back, with every byte sent
/// delivered. On the old shim the server counted a request per retry (> 2,000 here).
#[test]
fn retried_sends_without_room_ask_for_room_once() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("retry", 1);
    let (port, sink) = host_peer(|mut c| {
        use std::io::Read;
        std::thread::sleep(Duration::from_millis(700));
        let mut all = Vec::new();
        c.read_to_end(&mut all).unwrap();
        assert!(all.iter().all(|&b| b == b'w'));
        all.len()
    });
    let retries = 3_000;
    let out = py(
        RETRY_WITHOUT_POLL,
        Some(&srv.path),
        &[port.to_string(), retries.to_string()],
    );
    let n: usize = out.trim().parse().unwrap();
    assert_eq!(sink.join().unwrap(), n);
    let stats = srv.stop();
    assert!(
        stats.requests < retries,
        "{} requests for {retries} retried sends: each asked for room again",
        stats.requests
    );
}

/// A control call spins for its reply (S0's SBW) before it sleeps in `poll`: `socket()`
/// used to sleep there every time, a wake-up per socket (the largest part of a short
/// connection's extra cost). Counted with strace, with a spin span long enough that a
/// loaded machine still answers within it: the old shim made one `ppoll` per socket.
#[test]
fn socket_calls_spin_for_the_reply_instead_of_sleeping() {
    if !need_python() || !have("strace") {
        eprintln!("skipped: needs python3 and strace");
        return;
    }
    let _g = serial();
    let srv = Running::start_with("ctlspin", |cfg| {
        cfg.shim_spin = Duration::from_millis(20);
    });
    let trace = std::env::temp_dir().join(format!("ferry-ctlspin-{}", std::process::id()));
    let sockets = 200;
    let mut c = shimmed("strace", Some(&srv.path));
    c.args(["-f", "-c", "-e", "trace=ppoll,poll", "-o"])
        .arg(&trace)
        .arg(python().unwrap())
        .args([
            "-c",
            "import socket\nfor _ in range(200): socket.socket().close()\nprint('ok')",
        ]);
    let out = run(c, Duration::from_secs(60));
    let summary = std::fs::read_to_string(&trace).unwrap_or_default();
    let _ = std::fs::remove_file(&trace);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{summary}");
    let sleeps: u64 = summary
        .lines()
        .filter(|l| l.trim_end().ends_with("poll"))
        .filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
        .sum();
    assert!(
        sleeps < sockets / 4,
        "{sleeps} sleeps in poll for {sockets} sockets:\n{summary}"
    );
    let stats = srv.stop();
    assert!(stats.sockets_created >= sockets, "{stats:?}");
}

const DETAILS: &str = r#"
import errno, os, select, socket, sys, time
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"x")
time.sleep(0.2)
# The first poll of a socket, without a timeout, already sees data that is there.
p = select.poll(); p.register(s, select.POLLIN)
assert p.poll(0), "no readiness on the first poll"
assert s.recv(1) == b"x"
# A zero-length receive waits for data and returns 0 without taking it.
s.sendall(b"y")
assert s.recv(0) == b""
assert s.recv(1) == b"y"
# splice: pipe -> socket, socket -> pipe.
r, w = os.pipe(); os.write(w, b"spliced")
assert os.splice(r, s.fileno(), 7) == 7
r2, w2 = os.pipe()
time.sleep(0.1)
assert os.splice(s.fileno(), w2, 64) == 7 and os.read(r2, 64) == b"spliced"
# After shutdown(SHUT_WR), sends fail at once.
s.shutdown(socket.SHUT_WR)
try:
    s.send(b"z", socket.MSG_NOSIGNAL)
    raise SystemExit("sent after SHUT_WR")
except BrokenPipeError:
    pass
# Datagram sockets: no destination, too large.
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for data, addr, want in ((b"q", None, errno.EDESTADDRREQ), (b"q" * 65508, ("127.0.0.1", 9), errno.EMSGSIZE)):
    try:
        u.send(data) if addr is None else u.sendto(data, addr)
        raise SystemExit("sent %d bytes" % len(data))
    except OSError as e:
        assert e.errno == want, e
print("details ok")
"#;

#[test]
fn first_poll_zero_reads_splice_and_send_errors() {
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start("details", 1);
    let echo = tcp_echo();
    assert_eq!(
        py(DETAILS, Some(&srv.path), &[echo.port().to_string()]),
        "details ok\n"
    );
}

const IPV6: &str = r#"
import socket
l = socket.socket(socket.AF_INET6)
l.bind(("::1", 0)); l.listen()
port = l.getsockname()[1]
c = socket.create_connection(("::1", port))
a, peer = l.accept()
assert peer[0] == "::1", peer
c.sendall(b"six"); assert a.recv(3) == b"six"
u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); u.bind(("::1", 0))
v = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
v.sendto(b"dgram6", u.getsockname())
data, frm = u.recvfrom(100)
assert data == b"dgram6" and frm[0] == "::1", (data, frm)
print("ipv6 ok")
"#;

#[test]
fn ipv6_loopback() {
    if !need_python() || std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback");
        return;
    }
    let _g = serial();
    let srv = Running::start("v6", 1);
    assert_eq!(py(IPV6, Some(&srv.path), &[]), "ipv6 ok\n");
}

const SLOW_REPLY: &str = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for i in range(3):
    s.sendall(b"ping")
    assert s.recv(16) == b"pong"
print("slow ok")
"#;

#[test]
fn a_reader_asleep_in_the_kernel_is_counted() {
    // On the pair receive path a blocking reader that spun out sleeps in the kernel,
    // where the server does not see it; the shim counts it for the server's stats.
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start_with("pair-sleeps", |cfg| cfg.rx_pair = true);
    // Much longer than the spin span: the reader goes to sleep.
    let (port, peer) = host_peer(|mut c| answer_pings(&mut c, 3, Duration::from_millis(100)));
    let out = py(SLOW_REPLY, Some(&srv.path), &[port.to_string()]);
    assert_eq!(out, "slow ok\n");
    peer.join().unwrap();
    let stats = srv.stop();
    let sleeps: u64 = stats.channels.iter().map(|c| c.pair_sleeps).sum();
    assert!((3..=6).contains(&sleeps), "pair sleeps {sleeps}: {stats:?}");
    assert!(stats.to_json().contains("\"pair_sleeps\":"));
}

const PING_PONG: &str = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for i in range(300):
    s.sendall(b"ping")
    assert s.recv(16) == b"pong"
s.close()
print("ping-pong ok")
"#;

#[test]
fn the_pair_path_reads_each_message_once() {
    // The host socket is edge-triggered: a read that did not fill the buffer emptied it,
    // so the server must not ask again (and find it empty) before the next edge; nor
    // read when an edge only says there is room to send.
    if !need_python() {
        return;
    }
    let _g = serial();
    let srv = Running::start_with("one-read", |cfg| cfg.rx_pair = true);
    let (port, peer) = host_peer(|mut c| {
        use std::io::Read;
        answer_pings(&mut c, 300, Duration::ZERO);
        // The end of the stream still arrives after the last short read.
        assert_eq!(c.read(&mut [0u8; 4]).unwrap(), 0);
    });
    let out = py(PING_PONG, Some(&srv.path), &[port.to_string()]);
    assert_eq!(out, "ping-pong ok\n");
    peer.join().unwrap();
    let stats = srv.stop();
    assert!(stats.bytes_in >= 1200, "{stats:?}");
    // Two reads per message (the second finding nothing) would be about 300.
    assert!(
        stats.empty_reads <= 30,
        "empty reads {}: {stats:?}",
        stats.empty_reads
    );
    assert!(stats.to_json().contains("\"empty_reads\":"));
}

const MANY_IN_FLIGHT: &str = r#"
import select, socket, sys
port, n, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
ep = select.epoll()
for s in socks:
    ep.register(s.fileno(), select.EPOLLIN)
by_fd = {s.fileno(): s for s in socks}
for _ in range(rounds):
    for s in socks:
        s.sendall(b"ping")
    left = n
    while left:
        for fd, _ in ep.poll(5):
            assert by_fd[fd].recv(16) == b"ping"
            left -= 1
print("many ok")
"#;

/// Runs MANY_IN_FLIGHT with `n` connections to an echo server for `rounds`; the shim's
/// counted kernel sleeps.
fn many_in_flight_sleeps(n: usize, rounds: usize) -> u64 {
    let srv = Running::start_with("many-in-flight", |cfg| cfg.rx_pair = true);
    let echo = tcp_echo();
    let args = [echo.port().to_string(), n.to_string(), rounds.to_string()];
    assert_eq!(py(MANY_IN_FLIGHT, Some(&srv.path), &args), "many ok\n");
    let stats = srv.stop();
    stats.channels.iter().map(|c| c.pair_sleeps).sum()
}

#[test]
fn a_wait_with_many_replies_coming_sleeps_at_once() {
    // With more than 16 exchanges in flight (connected sockets that sent and have
    // received nothing since) an event wait does not spin: it sleeps and wakes to a
    // batch of replies. So the waits of each round made while more than 16 of its 24
    // replies are still due sleep (about 10 a round); with the spin every wait caught a
    // reply (0 sleeps in 100 rounds, as for the single connection below).
    if !need_python() {
        return;
    }
    let _g = serial();
    let many = many_in_flight_sleeps(24, 100);
    assert!(many >= 100, "24 in flight: {many} sleeps in 100 rounds");
    // The single connection's spin needs the echo's reply within the spin: a test
    // running beside this one can take the CPU for a round, so the best of 3 runs.
    let mut one = many_in_flight_sleeps(1, 100);
    for _ in 0..2 {
        if one <= 50 {
            break;
        }
        one = one.min(many_in_flight_sleeps(1, 100));
    }
    assert!(one <= 50, "1 in flight: {one} sleeps in 100 rounds");
}

const EVENT_WAITS: &str = r#"
import select, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN)
pl = select.poll()
pl.register(s.fileno(), select.POLLIN)
def wait(i):
    if i % 3 == 0:
        assert ep.poll(5) != []
    elif i % 3 == 1:
        assert pl.poll(5000) != []
    else:
        assert select.select([s], [], [], 5)[0] == [s]
for i in range(int(sys.argv[2])):
    s.sendall(b"ping")
    wait(i)
    assert s.recv(16) == b"pong"
print("waits ok")
"#;

/// Runs EVENT_WAITS against a peer answering `rounds` pings after `delay`; the shim's
/// counted kernel sleeps.
fn event_wait_sleeps(rounds: usize, delay: Duration) -> u64 {
    let srv = Running::start_with("event-waits", |cfg| cfg.rx_pair = true);
    let (port, peer) = host_peer(move |mut c| {
        c.set_nodelay(true).unwrap();
        answer_pings(&mut c, rounds, delay);
    });
    let out = py(
        EVENT_WAITS,
        Some(&srv.path),
        &[port.to_string(), rounds.to_string()],
    );
    assert_eq!(out, "waits ok\n");
    peer.join().unwrap();
    let stats = srv.stop();
    stats.channels.iter().map(|c| c.pair_sleeps).sum()
}

#[test]
fn event_waits_spin_before_they_sleep_and_sleeps_are_counted() {
    // epoll_wait, poll and select on ferry sockets spin for the SBW span (200 µs) before
    // they sleep, and a wait that sleeps is counted like a blocking reader's.
    if !need_python() {
        return;
    }
    let _g = serial();
    // Replies long after the span: every wait sleeps (and the reads after them do not).
    let slow = event_wait_sleeps(6, Duration::from_millis(60));
    assert!((6..=12).contains(&slow), "slow replies: {slow} sleeps");
    // Immediate replies mostly land within the span (without the spin: one sleep each).
    let fast = event_wait_sleeps(300, Duration::ZERO);
    assert!(fast <= 150, "immediate replies: {fast} sleeps of 300 waits");
}
