//! Attacks a sandboxed program can try, and what each now gets (docs/SECURITY.md keeps
//! the table): every test here failed on the build before the fix it names.
//!
//! The address rules: a sandbox reaches only what the egress policy allows and never the
//! host's own loopback, whatever it binds first; it cannot listen on the host's
//! addresses (only `-p` publishes); it cannot send from addresses the host does not own.

mod common;

use std::net::{Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// A host-loopback-only TCP service that counts the connections it gets, and a UDP one
/// that counts datagrams: neither may ever hear from a sandbox.
struct HostLoopback {
    tcp_port: u16,
    udp_port: u16,
    tcp_hits: Arc<AtomicUsize>,
    udp_hits: Arc<AtomicUsize>,
}

impl HostLoopback {
    fn start(v6: bool) -> HostLoopback {
        let ip = if v6 { "[::1]:0" } else { "127.0.0.1:0" };
        let l = TcpListener::bind(ip).unwrap();
        let u = UdpSocket::bind(ip).unwrap();
        let (tcp_port, udp_port) = (
            l.local_addr().unwrap().port(),
            u.local_addr().unwrap().port(),
        );
        let tcp_hits = Arc::new(AtomicUsize::new(0));
        let udp_hits = Arc::new(AtomicUsize::new(0));
        let t = tcp_hits.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                t.fetch_add(1, Ordering::SeqCst);
                use std::io::Write;
                let _ = c.write_all(b"HOST-LOOPBACK-SECRET\n");
            }
        });
        let h = udp_hits.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            while u.recv_from(&mut b).is_ok() {
                h.fetch_add(1, Ordering::SeqCst);
            }
        });
        HostLoopback {
            tcp_port,
            udp_port,
            tcp_hits,
            udp_hits,
        }
    }

    fn assert_untouched(&self, what: &str) {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            self.tcp_hits.load(Ordering::SeqCst),
            0,
            "{what}: TCP reached host loopback"
        );
        assert_eq!(
            self.udp_hits.load(Ordering::SeqCst),
            0,
            "{what}: UDP reached host loopback"
        );
    }
}

/// Runs a Python script with `args` natively in a fresh network namespace (only `lo`,
/// as a sandbox without ferry) and through ferry; returns both outputs.
fn native_and_ferry(opts: &[&str], script: &str, args: &[String]) -> (String, String) {
    let mut native = Command::new("unshare");
    native.args([
        "--net",
        "sh",
        "-c",
        "ip link set lo up && exec python3 -c \"$0\" \"$@\"",
    ]);
    native.arg(script).args(args);
    let n = native.output().expect("unshare");
    let mut cmd = vec!["python3", "-c", script];
    cmd.extend(args.iter().map(String::as_str));
    let f = ferry_run(opts, &cmd);
    assert!(
        f.status.success(),
        "ferry: {}",
        String::from_utf8_lossy(&f.stderr)
    );
    (stdout(&n), stdout(&f))
}

const BIND_THEN_LOOPBACK: &str = r#"
import socket, sys, time
host, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def attempt(what, f):
    try:
        f()
        print(what, "ok")
    except OSError as e:
        print(what, e.errno)
s = socket.socket()
attempt("bind", lambda: s.bind((host, 0)))
attempt("connect", lambda: s.connect(("127.0.0.1", tport)))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp-bind", lambda: u.bind((host, 0)))
attempt("udp-sendto", lambda: u.sendto(b"x", ("127.0.0.1", uport)))
time.sleep(0.2)
attempt("udp-again", lambda: u.sendto(b"x", ("127.0.0.1", uport)))
"#;

#[test]
fn a_socket_bound_to_a_host_address_cannot_reach_host_loopback() {
    if !can_run(&["python3", "unshare"]) {
        return;
    }
    let r = remote("sec-bind");
    let lo = HostLoopback::start(false);
    let args = [
        r.host_ip().to_string(),
        lo.tcp_port.to_string(),
        lo.udp_port.to_string(),
    ];
    let allow = format!("--allow={}/32", r.remote_ip());
    let (native, ferry) = native_and_ferry(&[&allow], BIND_THEN_LOOPBACK, &args);
    // Natively the sandbox has no such address; through ferry the bind may succeed
    // (sockets are served by the host's stack), but loopback is then refused.
    let eaddrnotavail = libc::EADDRNOTAVAIL;
    assert!(
        native.starts_with(&format!("bind {eaddrnotavail}")),
        "{native}"
    );
    let eacces = libc::EACCES;
    assert_eq!(
        ferry,
        format!("bind ok\nconnect {eacces}\nudp-bind ok\nudp-sendto {eacces}\nudp-again {eacces}")
    );
    lo.assert_untouched("bound socket");
}

const CONNECTED_UDP_THEN_LOOPBACK: &str = r#"
import socket, sys, time
remote, uport = sys.argv[1], int(sys.argv[2])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect((remote, 9))
for i in range(2):
    try:
        u.sendto(b"x", ("127.0.0.1", uport))
        print("sent")
    except OSError as e:
        print("error", e.errno)
    time.sleep(0.2)
"#;

#[test]
fn a_connected_datagram_socket_cannot_send_to_host_loopback() {
    if !can_run(&["python3"]) {
        return;
    }
    let r = remote("sec-udpc");
    let lo = HostLoopback::start(false);
    let o = ferry_run(
        &[],
        &[
            "python3",
            "-c",
            CONNECTED_UDP_THEN_LOOPBACK,
            &r.remote_ip().to_string(),
            &lo.udp_port.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Natively sendto on a connected UDP socket goes where it is told (Linux). Through
    // ferry the first datagram to a destination waits for the verdict, so each refused
    // send fails itself (not the call after it).
    assert_eq!(stdout(&o), format!("error {0}\nerror {0}", libc::EACCES));
    lo.assert_untouched("connected UDP");
}

const UNSPECIFIED: &str = r#"
import socket, sys
tport, uport, fam = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for dest in (["0.0.0.0", "::ffff:0.0.0.0"] if fam == "4" else ["::"]):
    f = socket.AF_INET if ":" not in dest else socket.AF_INET6
    s = socket.socket(f)
    s.settimeout(2)
    try:
        s.connect((dest, tport))
        print(dest, "connected", s.recv(64))
    except OSError as e:
        print(dest, "error", e.errno)
    u = socket.socket(f, socket.SOCK_DGRAM)
    u.sendto(b"x", (dest, uport))
"#;

#[test]
fn unspecified_destinations_are_the_sandboxs_own_loopback() {
    if !can_run(&["python3", "unshare", "curl"]) {
        return;
    }
    for v6 in [false, true] {
        let lo = HostLoopback::start(v6);
        let args = [
            lo.tcp_port.to_string(),
            lo.udp_port.to_string(),
            if v6 { "6" } else { "4" }.to_string(),
        ];
        let (native, ferry) = native_and_ferry(&["--deny=10.0.0.0/8"], UNSPECIFIED, &args);
        // Natively (an empty namespace) 0.0.0.0 is the namespace's own loopback, where
        // nothing listens: refused. Through ferry the same, never the host's service.
        assert_eq!(ferry, native, "v6={v6}");
        assert!(
            native.contains(&format!("error {}", libc::ECONNREFUSED)),
            "{native}"
        );
        lo.assert_untouched("unspecified destination");
    }
    // The curl of the report.
    let lo = HostLoopback::start(false);
    let url = format!("http://0.0.0.0:{}/", lo.tcp_port);
    let o = ferry_run(&["--deny", "10.0.0.0/8"], &["curl", "-sS", "-m", "3", &url]);
    assert!(!o.status.success());
    assert!(!stdout(&o).contains("SECRET"));
    lo.assert_untouched("curl http://0.0.0.0");
}

const LISTEN_ON_HOST: &str = r#"
import socket, sys
host = sys.argv[1]
def attempt(what, f):
    try:
        r = f()
        print(what, "ok")
        return r
    except OSError as e:
        print(what, e.errno)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
attempt("bind", lambda: s.bind((host, 0)))
attempt("listen", lambda: s.listen())
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp-bind-port", lambda: u.bind((host, 45999)))
attempt("udp-bind-any-port", lambda: u.bind((host, 0)))
"#;

#[test]
fn listening_on_a_host_address_is_refused() {
    if !can_run(&["python3", "unshare"]) {
        return;
    }
    let r = remote("sec-listen");
    let (native, ferry) = native_and_ferry(&[], LISTEN_ON_HOST, &[r.host_ip().to_string()]);
    let (na, ea) = (libc::EADDRNOTAVAIL, libc::EACCES);
    // Natively: no such address. Through ferry: the bind may succeed, the listen not.
    assert!(native.starts_with(&format!("bind {na}")), "{native}");
    assert_eq!(
        ferry,
        format!("bind ok\nlisten {ea}\nudp-bind-port {ea}\nudp-bind-any-port ok")
    );
    // Nothing listens for the network on the host address.
    assert!(
        std::net::TcpStream::connect_timeout(
            &SocketAddr::from((r.host_ip(), 45999)),
            Duration::from_millis(300)
        )
        .is_err()
    );
}

const SPOOF6: &str = r#"
import socket, struct, sys, time
remote, spoof = sys.argv[1], sys.argv[2]
def attempt(what, f):
    try:
        f()
        print(what, "ok")
    except OSError as e:
        print(what, e.errno)
u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
attempt("IPV6_FREEBIND", lambda: u.setsockopt(socket.IPPROTO_IPV6, 78, 1))
v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("IP_FREEBIND", lambda: v.setsockopt(socket.IPPROTO_IP, 15, 1))
info = socket.inet_pton(socket.AF_INET6, spoof) + struct.pack("I", 0)
attempt("sticky-pktinfo", lambda: u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, info))
attempt("sendmsg-pktinfo", lambda: u.sendmsg([b"spoofed"], [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, info)], 0, (remote, 9999)))
time.sleep(0.2)
attempt("next-send", lambda: u.sendto(b"honest", (remote, 9999)))
time.sleep(0.2)
"#;

#[test]
fn a_datagram_cannot_leave_with_a_source_the_host_does_not_own() {
    if !can_run(&["python3", "ip"]) {
        return;
    }
    let r = remote("sec-spoof");
    let (host6, remote6): (Ipv6Addr, Ipv6Addr) =
        ("fd7e:f0::1".parse().unwrap(), "fd7e:f0::2".parse().unwrap());
    let path = &r.paths()[0];
    let ok = |c: &mut Command| assert!(c.status().unwrap().success());
    ok(Command::new("ip").args([
        "-6",
        "addr",
        "add",
        &format!("{host6}/64"),
        "dev",
        &path.host_if,
        "nodad",
    ]));
    ok(Command::new("ip").args([
        "-n",
        r.name(),
        "-6",
        "addr",
        "add",
        &format!("{remote6}/64"),
        "dev",
        &path.remote_if,
        "nodad",
    ]));
    let sink = r
        .run_in(|| UdpSocket::bind((remote6, 9999)).unwrap())
        .unwrap();
    sink.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let o = ferry_run(
        &[],
        &[
            "python3",
            "-c",
            SPOOF6,
            &remote6.to_string(),
            "2001:db8::bad",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ep = libc::EPERM;
    assert_eq!(
        stdout(&o),
        format!(
            "IPV6_FREEBIND {ep}\nIP_FREEBIND {ep}\nsticky-pktinfo {ep}\nsendmsg-pktinfo {ep}\nnext-send ok"
        )
    );
    // Only datagrams from the host's own address ever arrive: the spoofed one fails its
    // own call, the honest one after it goes (none spoofed).
    let mut b = [0u8; 64];
    sink.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    while let Ok((n, from)) = sink.recv_from(&mut b) {
        assert_eq!(from.ip(), std::net::IpAddr::V6(host6), "{:?}", &b[..n]);
    }
    let _ = Command::new("ip")
        .args([
            "-6",
            "addr",
            "del",
            &format!("{host6}/64"),
            "dev",
            &path.host_if,
        ])
        .status();
}

const ARRIVALS: &str = r#"
import socket, sys
remote = sys.argv[1]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"hello", (remote, 9))
print(u.getsockname()[1], flush=True)
u.settimeout(3)
try:
    while True:
        data, src = u.recvfrom(64)
        print(data.decode(), src[0], flush=True)
        if data == b"last":
            break
except OSError as e:
    print("error", e.errno)
"#;

#[test]
fn datagrams_from_sources_the_sandbox_may_not_reach_are_dropped() {
    if !can_run(&["python3"]) {
        return;
    }
    use std::io::BufRead;
    let r = remote("sec-arrive");
    let deny = format!("--deny={}/32:7", r.remote_ip());
    let mut child = ferry()
        .args([
            "run",
            &deny,
            "--",
            "python3",
            "-c",
            ARRIVALS,
            &r.remote_ip().to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let port: u16 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    // The sandbox's socket lives on the host, unbound to any address: host loopback
    // and a denied remote port can address it; neither may get through.
    let lo = UdpSocket::bind("127.0.0.1:0").unwrap();
    lo.send_to(b"from-host-loopback", ("127.0.0.1", port))
        .unwrap();
    let rip = r.remote_ip();
    let (denied, allowed) = r
        .run_in(|| {
            (
                UdpSocket::bind((rip, 7)).unwrap(),
                UdpSocket::bind((rip, 8)).unwrap(),
            )
        })
        .unwrap();
    let to = (r.host_ip(), port);
    denied.send_to(b"from-denied-port", to).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    allowed.send_to(b"allowed", to).unwrap();
    allowed.send_to(b"last", to).unwrap();
    let got: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(child.wait().unwrap().success());
    assert_eq!(got, [format!("allowed {rip}"), format!("last {rip}")]);
}

// ---- Attacks on the server, bypassing the shim (`ferry-attack`) ----------------------

fn attack_bin() -> std::path::PathBuf {
    // Built by the workspace build, next to the ferry binary.
    sandbox_exe("ferry-attack")
}

/// Runs `script` under `sh -c` through ferry with `$ATTACK` set to the attack binary.
fn ferry_sh(opts: &[&str], script: &str) -> std::process::Output {
    let mut c = ferry();
    c.arg("run").args(opts).arg("--").args(["sh", "-c", script]);
    c.env("ATTACK", attack_bin());
    c.output().expect("spawn ferry")
}

/// A remote TCP service that sends `len` bytes to each client and keeps the connection
/// open until the client closes it.
fn remote_sender(r: &Remote, port: u16, len: usize) {
    let ip = r.remote_ip();
    let l = r.run_in(|| TcpListener::bind((ip, port)).unwrap()).unwrap();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let _ = c.write_all(&pattern(len, 9));
                let _ = c.read(&mut [0u8; 1]);
            });
        }
    });
}

const VICTIM: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
time.sleep(1.5)
got = b""
s.settimeout(5)
while len(got) < int(sys.argv[3]):
    b = s.recv(65536)
    if not b:
        break
    got += b
print("victim got", len(got), flush=True)
"#;

#[test]
fn a_process_cannot_act_on_sockets_it_does_not_hold() {
    if !can_run(&["python3"]) {
        return;
    }
    let r = remote("sec-ids");
    remote_sender(&r, 7101, 100_000);
    for rx in ["pair", "ring"] {
        let script = format!(
            "python3 -c '{VICTIM}' {} 7101 100000 & sleep 0.7; \"$ATTACK\" ids 64; wait",
            r.remote_ip()
        );
        let o = ferry_sh(&["--rx", rx], &script);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // Every guessed id is refused (EBADF), nothing is stolen, no forged proof
        // passes, and the victim gets every byte.
        assert_eq!(
            stdout(&o),
            "answered 0 stolen 0 claimed 0\nvictim got 100000",
            "--rx {rx}"
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("does not hold it") || err.contains("not the socket's"),
            "{err}"
        );
    }
}

#[test]
fn squatting_the_pair_names_does_not_stop_new_sockets() {
    if !can_run(&["python3"]) {
        return;
    }
    let script = "\"$ATTACK\" squat 64 3 & sleep 0.7; \
                  python3 -c 'import socket; s=[socket.socket() for i in range(40)]; print(\"made\", len(s))'; wait";
    let o = ferry_sh(&[], script);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    assert!(out.starts_with("squatting "), "{out}");
    assert!(out.contains("made 40"), "{out}");
}

#[test]
fn a_pair_end_handed_to_the_server_cannot_stall_it() {
    if !can_run(&[]) {
        return;
    }
    let mut c = ferry();
    c.args(["run", "--"]).arg(attack_bin()).arg("hang");
    let o = common::output_within(c, Duration::from_secs(20));
    assert_eq!(
        stdout(&o),
        "served",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn completions_never_read_do_not_grow_the_server() {
    if !can_run(&[]) {
        return;
    }
    let mut child = ferry()
        .args(["run", "--"])
        .arg(attack_bin())
        .args(["backlog", "6"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(1500));
    let early = rss_kib(pid);
    let mut peak = early;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = child.wait_with_output().unwrap();
    let out = stdout(&o);
    // Linear growth was 15 MB a second before back-pressure.
    assert!(
        peak < early + 16 * 1024,
        "server grew from {early} to {peak} KiB: {out}"
    );
    // The server stopped taking requests once the completions backed up.
    let stuck: u64 = out
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(stuck > 3000, "{out}");
}

#[test]
fn connections_that_never_say_hello_do_not_lock_out_channels() {
    if !can_run(&["python3", "prlimit"]) {
        return;
    }
    let r = remote("sec-hello");
    remote_sender(&r, 7102, 10);
    let victim = format!(
        "import socket; s=socket.create_connection(('{}', 7102)); print('victim', len(s.recv(64)))",
        r.remote_ip()
    );
    // ferry with a small descriptor limit (the sandbox gets the same), so that holding
    // connections could exhaust the server's: before the Hello timeouts and caps, the
    // victims then failed with ENETDOWN.
    let script = format!(
        "\"$ATTACK\" hellos 590 5 & sleep 1.5; for i in 1 2 3; do python3 -c \"{victim}\"; done; wait"
    );
    let mut c = Command::new("prlimit");
    c.arg("--nofile=600:600")
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .args(["run", "--", "sh", "-c", &script])
        .env("ATTACK", attack_bin());
    let o = c.output().unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        out.lines().filter(|l| *l == "victim 10").count(),
        3,
        "{out}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("waiting for their Hello"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_admin_socket_is_out_of_the_sandboxs_reach() {
    if !can_run(&[]) {
        return;
    }
    let mut c = ferry();
    c.args(["run", "--"]).arg(attack_bin()).arg("admin");
    let o = c.output().unwrap();
    assert_eq!(
        stdout(&o),
        "admin unreachable",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

// ---- Escape attempts: the sandbox's identity ----------------------------------------

/// Each attempt prints `NAME ok` when it worked and `NAME no` when it did not. Arguments:
/// a host-loopback TCP port, a root-owned file, a root-owned directory, the SHA-256 of the
/// host's /etc/shadow (root's sandbox sees a substitute without secrets there: reading
/// it is no escape, reading the host's is).
const ESCAPES: &str = r#"
t() { if (eval "$2") >/dev/null 2>&1; then echo "$1 ok"; else echo "$1 no"; fi; }
me=$(readlink /proc/self/ns/net)
others=0
for n in /proc/[0-9]*/ns/net; do [ "$(readlink $n 2>/dev/null)" = "$me" ] || [ ! -e "$n" ] || others=1; done
echo "other-netns-visible $others"
t nsenter-host-loopback "nsenter --net=/proc/1/ns/net python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", $1), timeout=1)'"
t umount-proc "umount /proc || umount -l /proc"
t shadow "umount /etc/shadow 2>/dev/null; [ \"\$(sha256sum </etc/shadow | cut -c1-64)\" = $4 ]"
t append-root-file "echo x >> $2"
t create-in-root-dir "touch $3/new"
t veth-to-host "ip link add fe0 type veth peer name fe1 && ip link set fe1 netns 1"
t ferry-mem "for p in /proc/[0-9]*; do grep -q ferry-servers $p/task/*/comm 2>/dev/null && head -c1 $p/mem; done | grep -q ."
"#;

/// The host's /etc/shadow's SHA-256 (hex), or a dummy where there is none.
fn host_shadow_digest() -> String {
    let o = Command::new("sha256sum")
        .arg("/etc/shadow")
        .output()
        .unwrap();
    let hex = stdout(&o);
    hex.get(..64).unwrap_or("no-shadow-on-this-host").to_owned()
}

fn escape_attempts(run_as: Option<&str>, opts: &[&str]) -> String {
    let lo = HostLoopback::start(false);
    let dir = TempDir::new("escape");
    let root_file = dir.path().join("root-owned");
    std::fs::write(&root_file, "root\n").unwrap();
    let root_dir = dir.path().join("root-dir");
    std::fs::create_dir(&root_dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&root_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let args = [
        lo.tcp_port.to_string(),
        root_file.display().to_string(),
        root_dir.display().to_string(),
        host_shadow_digest(),
    ];
    let ferry_exe = match run_as {
        None => std::path::PathBuf::from(env!("CARGO_BIN_EXE_ferry")),
        Some(_) => {
            // The user needs to reach the binaries.
            let bin = dir.path().join("bin");
            std::fs::create_dir(&bin).unwrap();
            ferry_for_any_user(&bin)
        }
    };
    let mut cmd = match run_as {
        None => Command::new(&ferry_exe),
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--"]).arg(&ferry_exe);
            c
        }
    };
    cmd.arg("run")
        .args(opts)
        .args(["--", "sh", "-c", ESCAPES, "sh"])
        .args(&args)
        .current_dir("/");
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{:?}: {} {}",
        o.status,
        stdout(&o),
        String::from_utf8_lossy(&o.stderr)
    );
    lo.assert_untouched("escape attempts");
    assert_eq!(std::fs::read_to_string(&root_file).unwrap(), "root\n");
    assert!(!root_dir.join("new").exists());
    stdout(&o)
}

const NO_ESCAPE: &str = "other-netns-visible 0\nnsenter-host-loopback no\numount-proc no\nshadow no\n\
                         append-root-file no\ncreate-in-root-dir no\nveth-to-host no\nferry-mem no";

#[test]
fn the_sandbox_cannot_leave_its_namespaces_or_act_as_host_root() {
    if !can_run(&["python3", "nsenter", "ip"]) {
        return;
    }
    assert_eq!(escape_attempts(None, &[]), NO_ESCAPE);
}

#[test]
fn nor_can_it_when_an_ordinary_user_runs_ferry() {
    if !can_run(&["python3", "nsenter", "ip", "runuser"]) {
        return;
    }
    if !have_test_user() {
        return;
    }
    // As that user the sandbox may of course touch that user's files; root's stay out
    // of reach.
    assert_eq!(escape_attempts(Some("ferrytest"), &[]), NO_ESCAPE);
}

// ---- Volumes: root's files shared as the sandbox's own, and nothing else ---------------

#[test]
fn system_directories_are_never_volumes() {
    if !can_run(&[]) {
        return;
    }
    let dir = TempDir::new("volrefuse");
    let marker = dir.path().join("ran");
    // A path that leads to /etc another way is /etc all the same. (A symbolic link,
    // never a bind mount: removing the scratch directory would then empty the real
    // /etc if anything failed before the unmount.)
    let etc_bind = dir.path().join("etc-link");
    let bound = std::os::unix::fs::symlink("/etc", &etc_bind).is_ok();
    let mut refused = vec![
        "/",
        "/etc",
        "/usr",
        "/usr:ro",
        "/usr/local",
        "/var/lib",
        "/proc/self",
        "/tmp/../etc",
        "/sys",
    ];
    let etc_bind_s = etc_bind.display().to_string();
    if bound {
        refused.push(&etc_bind_s);
    }
    for v in &refused {
        let o = ferry_run(&["--volume", v], &["touch", marker.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--volume {v}: {err}");
        let shown = v.trim_end_matches(":ro");
        assert!(
            err.contains("never shared") && err.contains(shown),
            "--volume {v}: {err}"
        );
        assert!(!marker.exists(), "--volume {v} ran the program");
    }
}

/// Each attempt prints `NAME ok` or `NAME no`; run in a root-owned 0700 directory that
/// holds `vol` (shared), `ro` (shared read-only), `outside` (root's file), `sibling`
/// (root's 0700 directory), `vol/suid-host` (a set-user-id root program of the host's).
const VOLUME_ATTEMPTS: &str = r#"
t() { if (eval "$2") >/dev/null 2>&1; then echo "$1 ok"; else echo "$1 no"; fi; }
t vol-read "grep -q in-vol vol/secret"
t vol-write "echo new > vol/new"
t ro-read "grep -q ro-file ro/r"
t ro-write "touch ro/x"
t ro-remount "mount -o remount,rw ro || mount -o remount,bind,rw ro; touch ro/y"
t ro-rebind "mkdir vol/m && mount --bind ro vol/m && touch vol/m/z"
t ro-umount "umount ro; touch ro/w"
t outside-append "echo x >> outside"
t outside-create "touch new"
t outside-dotdot "echo x >> vol/../outside"
t sibling-read "ls sibling"
t skeleton-remount "mount -o remount,rw . || mount -o remount,bind,rw .; touch new2"
t suid-chmod "cp /bin/true vol/t && chmod u+s vol/t && test -u vol/t"
t suid-create "python3 -c 'import os; os.close(os.open(\"vol/t2\", os.O_CREAT | os.O_WRONLY, 0o4755))' && test -u vol/t2"
t file-caps "python3 -c 'import os, struct; os.setxattr(\"vol/t\", \"security.capability\", struct.pack(\"<5I\", 0x02000001, 1 << 13, 0, 0, 0))'"
t device-node "mknod vol/null c 1 3"
t keep-host-suid "cat /bin/true > vol/suid-host && test -u vol/suid-host"
"#;

const VOLUME_EXPECTED: &str = "vol-read ok\nvol-write ok\nro-read ok\nro-write no\nro-remount no\n\
                               ro-rebind no\nro-umount no\noutside-append no\noutside-create no\n\
                               outside-dotdot no\nsibling-read no\nskeleton-remount no\n\
                               suid-chmod no\nsuid-create no\nfile-caps no\ndevice-node no\n\
                               keep-host-suid no";

#[test]
fn a_volume_opens_only_itself() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !can_run(&["python3"]) {
        return;
    }
    let top = TempDir::new("volonly");
    let closed = top.path().join("closed");
    let mode = |p: &std::path::Path, m| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    for d in ["", "vol", "ro", "sibling"] {
        std::fs::create_dir_all(closed.join(d)).unwrap();
        mode(&closed.join(d), 0o700);
    }
    mode(&closed.join("ro"), 0o755);
    std::fs::write(closed.join("vol/secret"), "in-vol\n").unwrap();
    mode(&closed.join("vol/secret"), 0o600);
    std::fs::write(closed.join("ro/r"), "ro-file\n").unwrap();
    std::fs::write(closed.join("outside"), "outside\n").unwrap();
    mode(&closed.join("outside"), 0o644);
    std::fs::write(closed.join("sibling/s"), "s\n").unwrap();
    std::fs::copy("/bin/true", closed.join("vol/suid-host")).unwrap();
    mode(&closed.join("vol/suid-host"), 0o4755);
    let vol = closed.join("vol").display().to_string();
    let ro = format!("{}:ro", closed.join("ro").display());
    let o = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "run",
            "--volume",
            &vol,
            "--volume",
            &ro,
            "--",
            "sh",
            "-c",
            VOLUME_ATTEMPTS,
        ])
        .current_dir(&closed)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{} {}",
        stdout(&o),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        stdout(&o),
        VOLUME_EXPECTED,
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // What the sandbox made in the volume is root's; nothing else changed.
    assert_eq!(std::fs::metadata(closed.join("vol/new")).unwrap().uid(), 0);
    assert_eq!(
        std::fs::read_to_string(closed.join("outside")).unwrap(),
        "outside\n"
    );
    for gone in ["new", "new2", "ro/x", "ro/y", "ro/w", "vol/null", "vol/t2"] {
        assert!(!closed.join(gone).exists(), "{gone} was made");
    }
    for f in ["vol/t", "vol/suid-host"] {
        let m = std::fs::metadata(closed.join(f)).unwrap().mode();
        assert_eq!(m & 0o6000, 0, "{f} is set-id: {m:o}");
    }
    let caps = Command::new("getfattr")
        .args(["-n", "security.capability"])
        .arg(closed.join("vol/t"))
        .output();
    if let Ok(caps) = caps {
        assert!(!caps.status.success(), "vol/t has file capabilities");
    }
}

#[test]
fn the_escapes_still_fail_beside_volumes() {
    if !can_run(&["python3", "nsenter", "ip"]) {
        return;
    }
    let vols = TempDir::new("volescape");
    let (rw, ro) = (vols.path().join("rw"), vols.path().join("ro"));
    std::fs::create_dir(&rw).unwrap();
    std::fs::create_dir(&ro).unwrap();
    let ro = format!("{}:ro", ro.display());
    let rw = rw.display().to_string();
    assert_eq!(
        escape_attempts(None, &["--volume", &rw, "--volume", &ro]),
        NO_ESCAPE
    );
}

// ---- The servers' own confinement -------------------------------------------------------

#[test]
fn every_thread_of_the_servers_is_confined() {
    if !can_run(&[]) {
        return;
    }
    let confined = |extra: &[&str]| {
        let mut child = ferry()
            .arg("run")
            .args(extra)
            .args(["--", "sleep", "1.5"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(700));
        let threads = thread_confinement(child.id());
        assert!(child.wait().unwrap().success());
        threads
    };
    let threads = confined(&[]);
    assert!(threads.len() >= 3, "{threads:?}");
    assert_confined(&threads);
    // The opt-out really is one (as root, every capability stays).
    let open = confined(&["--unconfined"]);
    assert_unconfined(&open);
}

/// The tests' own scratch directories are removed without reaching through a mount
/// left inside them: a bind mount of a directory that holds files must keep its files
/// (a test that bound /etc and failed before unmounting once emptied /etc this way).
#[test]
fn removing_a_scratch_directory_never_crosses_a_mount() {
    if !common::is_root() {
        return;
    }
    let precious = TempDir::new("precious");
    std::fs::write(precious.path().join("keep"), b"keep").unwrap();
    let scratch = TempDir::new("scratch");
    let inner = scratch.path().join("a/bound");
    std::fs::create_dir_all(&inner).unwrap();
    let bound = Command::new("mount")
        .arg("--bind")
        .arg(precious.path())
        .arg(&inner)
        .status()
        .is_ok_and(|s| s.success());
    assert!(bound, "mount --bind");
    assert!(inner.join("keep").exists());
    drop(scratch);
    assert_eq!(
        std::fs::read(precious.path().join("keep")).unwrap(),
        b"keep"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(inner.to_str().unwrap()),
        "the bind mount is still there"
    );
}

#[test]
fn ipv4_link_local_is_refused_unless_allowed_explicitly() {
    if !can_run(&["ip", "python3"]) {
        return;
    }
    // A remote on 169.254.N.2, reachable from the host as a metadata service is.
    let (_r, ip, tport, uport) = link_local_remote("secll");
    let ip = ip.to_string();
    let reach = |opts: &[&str]| {
        let o = run_reach("socket", opts, &ip, tport, uport);
        assert!(
            o.status.success(),
            "{opts:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        (stdout(&o), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    // Only an allow of its own reaches it (the rest stays open with 0.0.0.0/0).
    let allowed = format!("--allow={ip}/32");
    let (out, _) = reach(&[&allowed, "--allow=0.0.0.0/0"]);
    assert_eq!(out, "tcp ok hello\nudp ok pong\nsendto ok pong");
    // Not by default, nor with an allow that merely covers it: connects fail at once,
    // a datagram sent with sendto goes nowhere (no answer), and the log says why.
    for opts in [&[][..], &["--allow=0.0.0.0/0"][..]] {
        let (out, err) = reach(opts);
        let out: Vec<&str> = out.lines().collect();
        assert_eq!(out[..2], ["tcp EACCES", "udp EACCES"], "{opts:?}");
        assert!(
            ["sendto EACCES", "sendto timeout"].contains(&out[2]),
            "{opts:?}: {out:?}"
        );
        assert!(err.contains("IPv4 link-local"), "{opts:?}: {err}");
    }
}

#[test]
fn a_raw_icmp_socket_the_init_makes_carries_icmp_only() {
    if !can_run(&["python3"]) {
        return;
    }
    // In nic mode the init makes raw ICMP sockets for the command (busybox's ping): the
    // command gets that and nothing more of CAP_NET_RAW.
    let script = r#"
import socket
def attempt(what, f):
    try:
        f()
        print(what, "ok")
    except OSError as e:
        print(what, e.errno)
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
attempt("hdrincl", lambda: s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1))
attempt("icmp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6))
attempt("raw-tcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
attempt("raw-ip", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
"#;
    let o = ferry_run(&["--net", "nic"], &[system_python(), "-c", script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        stdout(&o),
        "hdrincl 1\nicmp6 ok\nraw-tcp 1\nraw-ip 1\npacket 1",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
