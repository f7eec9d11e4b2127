//! `--handoff CIDR[:PORT]` (issue 26 item 2, docs/DESIGN.md "Hand-off"): a TCP connect
//! to a trusted destination gives the program the host's own connected socket, at its
//! fd number, and the program cannot re-aim that socket.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

/// An echo service in the remote namespace on `port`: each connection's bytes come
/// back until it shuts down; `bytes` counts what it echoed.
fn remote_echo(r: &Remote, port: u16) -> Arc<AtomicUsize> {
    let ip = r.remote_ip();
    let l = r.run_in(|| TcpListener::bind((ip, port)).unwrap()).unwrap();
    let bytes = Arc::new(AtomicUsize::new(0));
    let b = bytes.clone();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = c.read(&mut buf) {
                    if c.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    b.fetch_add(n, Ordering::SeqCst);
                }
            });
        }
    });
    bytes
}

/// The host namespace's TCP sockets (`/proc/net/tcp`): (inode, remote address, port).
fn host_tcp_sockets() -> Vec<(u64, Ipv4Addr, u16)> {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, port) = f.get(2)?.split_once(':')?;
            let ip = u32::from_str_radix(addr, 16).ok()?;
            let ip = Ipv4Addr::from(u32::from_be(ip));
            let port = u16::from_str_radix(port, 16).ok()?;
            Some((f.get(9)?.parse().ok()?, ip, port))
        })
        .collect()
}

const CLIENT: &str = r#"
import errno, os, select, socket, sys, threading
ip, port = sys.argv[1], int(sys.argv[2])
N = 4 << 20
def transfer(s):
    data = os.urandom(N)
    def send():
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=send)
    t.start()
    got = bytearray()
    while True:
        b = s.recv(1 << 16)
        if not b:
            break
        got += b
    t.join()
    return got == data
a = socket.socket()
a.connect((ip, port))
b = socket.socket()
b.setblocking(False)
r = b.connect_ex((ip, port))
print("nonblocking", errno.errorcode.get(r, r), flush=True)
select.select([], [b], [], 5)
print("so_error", b.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), flush=True)
b.setblocking(True)
# An epoll registration made before the connect still reports on the handed-off socket.
c = socket.socket()
c.setblocking(False)
ep = select.epoll()
ep.register(c.fileno(), select.EPOLLOUT)
c.connect_ex((ip, port))
print("epoll", [fd for fd, ev in ep.poll(5) if ev & select.EPOLLOUT] == [c.fileno()], flush=True)
print("inodes", os.fstat(a.fileno()).st_ino, os.fstat(b.fileno()).st_ino, flush=True)
sys.stdin.readline()
print("peer", a.getpeername() == (ip, port), b.getpeername() == (ip, port), flush=True)
print("echo", transfer(a), transfer(b), flush=True)
"#;

/// Runs [`CLIENT`] through ferry with `opts` against the remote's echo on `port`;
/// returns whether each of its two sockets is a host TCP socket connected to the
/// remote (found by inode while the program holds them), and the program's lines.
fn run_client(opts: &[&str], r: &Remote, port: u16) -> (bool, bool, String) {
    let mut cmd = ferry();
    cmd.arg("run")
        .args(opts)
        .args(["--", system_python(), "-c", CLIENT])
        .arg(r.remote_ip().to_string())
        .arg(port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn ferry");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = String::new();
    let mut line = String::new();
    let inodes: Vec<u64> = loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let o = child.wait_with_output().unwrap();
            panic!("no inodes: {lines}\n{}", String::from_utf8_lossy(&o.stderr));
        }
        lines.push_str(&line);
        if let Some(rest) = line.strip_prefix("inodes ") {
            break rest
                .split_whitespace()
                .map(|n| n.parse().unwrap())
                .collect();
        }
    };
    let host = host_tcp_sockets();
    let connected = |ino: u64| host.contains(&(ino, r.remote_ip(), port));
    let found = (connected(inodes[0]), connected(inodes[1]));
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    out.read_to_string(&mut lines).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{lines}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    (found.0, found.1, lines)
}

#[test]
fn a_handed_off_connection_is_the_hosts_kernel_socket_and_carries_the_bytes() {
    if !can_run(&["python3"]) {
        return;
    }
    let r = remote("handoff");
    let port = 5301;
    let echoed = remote_echo(&r, port);
    let rule = format!("--handoff={}/32", r.remote_ip());
    let (blocking, nonblocking, lines) = run_client(&[&rule], &r, port);
    assert!(blocking && nonblocking, "not the host's sockets: {lines}");
    for want in [
        "nonblocking EINPROGRESS",
        "so_error 0",
        "epoll True",
        "peer True True",
        "echo True True",
    ] {
        assert!(lines.contains(want), "{want}: {lines}");
    }
    assert_eq!(echoed.load(Ordering::SeqCst), 2 * (4 << 20));

    // A rule for another port: the same connects are served (the program's fds are
    // its readiness pairs, not host sockets), and the bytes are the same.
    let other = format!("--handoff={}/32:{}", r.remote_ip(), port + 1);
    let (blocking, nonblocking, lines) = run_client(&[&other], &r, port);
    assert!(!blocking && !nonblocking, "handed off: {lines}");
    assert!(lines.contains("echo True True"), "{lines}");
}

/// A host-loopback TCP service that counts connections: a sandbox never reaches it.
fn host_loopback() -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for _ in l.incoming().flatten() {
            h.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, hits)
}

const RE_AIM: &str = r#"
import ctypes, socket, struct, sys
ip, port, lport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
s = socket.socket()
s.connect((ip, port))
fd = s.fileno()
def attempt(what, f):
    try:
        f()
        print(what, "ok")
    except OSError as e:
        print(what, e.errno)
def unspec():
    sa = struct.pack("=H14x", 0)
    if libc.connect(fd, sa, len(sa)) != 0:
        raise OSError(ctypes.get_errno(), "connect AF_UNSPEC")
attempt("unspec", unspec)
attempt("loopback", lambda: s.connect(("127.0.0.1", lport)))
attempt("bind", lambda: s.bind(("0.0.0.0", 0)))
attempt("listen", lambda: s.listen(1))
attempt("fastopen", lambda: s.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", lport)))
attempt("ip_options", lambda: s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, b"\x01\x01\x01\x00"))
attempt("send", lambda: s.sendall(b"still here"))
print("echo", s.recv(100).decode())
# A refused blocking connect leaves the socket the program's to connect again (natively
# it may): the refusal is answered before any hand-off.
r = socket.socket()
for i in range(2):
    attempt("refused", lambda: r.connect((ip, port + 1)))
attempt("again", lambda: r.connect((ip, port)))
attempt("send-again", lambda: r.sendall(b"again"))
print("echo-again", r.recv(100).decode())
"#;

#[test]
fn a_handed_off_socket_cannot_be_re_aimed() {
    if !can_run(&["python3"]) {
        return;
    }
    let r = remote("handoff-aim");
    let port = 5302;
    remote_echo(&r, port);
    let (lport, hits) = host_loopback();
    let rule = format!("--handoff={}/32", r.remote_ip());
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["run", &rule, "--", system_python(), "-c", RE_AIM])
        .arg(r.remote_ip().to_string())
        .arg(port.to_string())
        .arg(lport.to_string())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (eperm, refused) = (libc::EPERM, libc::ECONNREFUSED);
    assert_eq!(
        out.trim(),
        format!(
            "unspec {eperm}\nloopback {eperm}\nbind {eperm}\nlisten {eperm}\nfastopen {eperm}\n\
             ip_options {eperm}\nsend ok\necho still here\nrefused {refused}\nrefused {refused}\n\
             again ok\nsend-again ok\necho-again again"
        )
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(hits.load(Ordering::SeqCst), 0, "host loopback reached");
}

/// Two threads race the guard: one swaps the handed-off socket and a unix socket at one
/// fd number, the other calls `connect(AF_UNSPEC)` on that number. The guard looks at
/// the unix socket and lets the call proceed; the kernel then disconnects the host
/// socket (the first step of a re-aim). Python wins this within seconds today.
const RACE: &str = r#"
import ctypes, socket, struct, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
h = socket.socket()
h.connect((sys.argv[1], int(sys.argv[2])))
H = h.fileno()
d = libc.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0)
N = 100
unspec = struct.pack("=H14x", 0)
won = []
stop = time.time() + 8
def swapper():
    while time.time() < stop and not won:
        libc.dup2(d, N)
        libc.dup2(H, N)
def caller():
    while time.time() < stop and not won:
        if libc.connect(N, unspec, len(unspec)) == 0:
            try:
                h.getpeername()
            except OSError:
                won.append(1)
t = [threading.Thread(target=swapper), threading.Thread(target=caller)]
[x.start() for x in t]
[x.join() for x in t]
print("disconnected", bool(won))
"#;

#[test]
#[ignore = "known hole (docs/DESIGN.md, Hand-off): the guard's CONTINUE races a dup2"]
fn racing_the_guard_with_dup2_does_not_disconnect_a_handed_off_socket() {
    if !can_run(&["python3"]) {
        return;
    }
    let r = remote("handoff-race");
    let port = 5303;
    remote_echo(&r, port);
    let rule = format!("--handoff={}/32", r.remote_ip());
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["run", &rule, "--", system_python(), "-c", RACE])
        .arg(r.remote_ip().to_string())
        .arg(port.to_string())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.trim(),
        "disconnected False",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
