//! Shared set-up for end-to-end tests: the ferry binary, a remote namespace, real servers.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use ferry_sandbox::testbed::{Remote, free_subnet, is_root};

/// The ferry binary under test.
pub fn ferry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
}

/// `ferry run [opts] -- cmd…`, output captured.
pub fn ferry_run(opts: &[&str], cmd: &[&str]) -> Output {
    let mut c = ferry();
    c.arg("run").args(opts).arg("--").args(cmd);
    c.output().expect("spawn ferry")
}

/// Whether a program is installed.
pub fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

/// Returns false (after saying why) when the test cannot run here.
pub fn can_run(needs: &[&str]) -> bool {
    if !is_root() {
        eprintln!("skipped: needs root (remote namespace with veth)");
        return false;
    }
    for p in needs {
        if !have(p) {
            eprintln!("skipped: {p} is not installed (run scripts/install-deps.sh)");
            return false;
        }
    }
    true
}

/// A remote host on a fresh /30.
pub fn remote(tag: &str) -> Remote {
    let (h, r) = free_subnet().expect("free subnet");
    Remote::create(&format!("fe2e-{tag}-{}", std::process::id()), h, r, 30)
        .expect("remote namespace")
}

/// Waits until `ip:port` accepts TCP connections from the host (or panics after 10 s).
pub fn wait_port(ip: Ipv4Addr, port: u16) {
    let t = Instant::now();
    while std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_millis(200))
        .is_err()
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{ip}:{port} never came up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed (and reaped) on drop.
pub struct Guard(pub Child);

impl Drop for Guard {
    /// SIGTERM first, so that a master (nginx) takes its workers along and ferry cleans
    /// up its sandbox; SIGKILL after 2 s.
    fn drop(&mut self) {
        // A child already reaped (a test waited for it) is not signalled: its pid may be
        // another process's by now.
        if !matches!(self.0.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: a signal to our own child, which is not reaped yet.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "ferry-test-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        remove_tree(&p);
        std::fs::create_dir_all(&p).unwrap();
        // Sandboxed programs run as an unprivileged host user: they may write here.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        remove_tree(&self.0);
    }
}

/// Removes `dir` and what it holds, but never through a mount point: whatever a test
/// mounted below it (a bind mount of a system directory, say, left behind by a failed
/// assertion) is detached first, and if that fails nothing is removed. A recursive
/// removal that walked into a bind mount of /etc once emptied the machine's /etc.
pub fn remove_tree(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    // Deepest first, so that nested mounts go before the ones they sit on.
    let mut below: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect();
    below.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in &below {
        let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) else {
            return;
        };
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!(
                "not removing {}: cannot detach the mount at {}",
                dir.display(),
                m.display()
            );
            return;
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Deterministic pseudo-random bytes.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Writes an nginx configuration into `dir`: one worker serving `root` on `port`, its
/// pid and temporary files in `dir`, errors to stderr.
pub fn nginx_conf(dir: &Path, root: &Path, port: u16) -> PathBuf {
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log stderr warn;\nevents {{ worker_connections 256; }}\nhttp {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n fastcgi_temp_path {d}/fcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n server {{ listen {port}; root {r}; }}\n}}\n",
            d = dir.display(),
            r = root.display()
        ),
    )
    .unwrap();
    conf
}

/// nginx in `remote`, serving `root` on `port` (configuration and scratch in `dir`);
/// returns once the port accepts connections from the host.
pub fn remote_nginx(remote: &Remote, dir: &Path, root: &Path, port: u16) -> Guard {
    let conf = nginx_conf(dir, root, port);
    let nginx = Guard(
        quiet(&mut remote.command("nginx"))
            .args(["-c", conf.to_str().unwrap()])
            .spawn()
            .unwrap(),
    );
    wait_port(remote.remote_ip(), port);
    nginx
}

/// Spawns a command with output discarded.
pub fn quiet(cmd: &mut Command) -> &mut Command {
    cmd.stdout(Stdio::null()).stderr(Stdio::null())
}

/// Runs `cmd` and collects its output, killing it (and failing the test) if it runs
/// longer than `limit`.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // SAFETY: kill with integer arguments; our unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // What it said until then, to tell why it hung.
            let said = rx
                .recv_timeout(Duration::from_secs(5))
                .ok()
                .and_then(Result::ok);
            let (out, err) = said.map_or_else(Default::default, |o| {
                (
                    String::from_utf8_lossy(&o.stdout).into_owned(),
                    String::from_utf8_lossy(&o.stderr).into_owned(),
                )
            });
            panic!("{cmd:?} ran longer than {limit:?}; its stdout:\n{out}\nits stderr:\n{err}");
        }
    }
}

/// A binary built next to ferry (`name`), where the sandbox's programs can run it: their
/// host identity is an unprivileged one, so when a directory above the build output is
/// not searchable by everyone (a checkout under /root, say) the binary is copied once
/// into a world-readable directory.
pub fn sandbox_exe(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let built = PathBuf::from(env!("CARGO_BIN_EXE_ferry")).with_file_name(name);
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode()).ok();
    let open = built.canonicalize().ok().is_some_and(|full| {
        mode(&full).is_some_and(|m| m & 0o005 == 0o005)
            && full
                .ancestors()
                .skip(1)
                .all(|d| mode(d).is_some_and(|m| m & 0o001 != 0))
    });
    if open {
        return built;
    }
    let dir = std::env::temp_dir().join(format!("ferry-test-bin-{}", std::process::id()));
    let _ = std::fs::create_dir(&dir);
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
    let copy = dir.join(name);
    if !copy.exists() {
        let tmp = dir.join(format!(".{name}.{:?}", std::thread::current().id()));
        std::fs::copy(&built, &tmp).expect("copy a test binary");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _ = std::fs::rename(&tmp, &copy);
    }
    copy
}

/// Whether the unprivileged test user `ferrytest` exists (made by
/// scripts/install-deps.sh); says why the test is skipped when not.
pub fn have_test_user() -> bool {
    let there = Command::new("id")
        .arg("ferrytest")
        .output()
        .is_ok_and(|o| o.status.success());
    if !there {
        eprintln!("skipped: user ferrytest missing (run scripts/install-deps.sh)");
    }
    there
}

/// The ferry binary (and its shim beside it) copied into `dir`, where an unprivileged
/// user can run it; returns the copy's path.
pub fn ferry_for_any_user(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ferry"));
    for f in ["ferry", "libferry_preload.so"] {
        std::fs::copy(exe.with_file_name(f), dir.join(f)).unwrap();
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir.join("ferry")
}

/// Runs `exe ARGS…` as the test user `ferrytest` (from `/`, which it may enter), output
/// captured.
pub fn as_test_user(exe: &Path, args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", "ferrytest", "--"])
        .arg(exe)
        .args(args)
        .current_dir("/")
        .output()
        .expect("spawn runuser")
}

/// The answer to a DNS query: every A query gets `ip`; `None` for a malformed query.
pub fn dns_answer(q: &[u8], ip: std::net::Ipv4Addr) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    // End of the question: the name's labels, then type and class.
    let mut at = 12;
    while at < q.len() && q[at] != 0 {
        at += 1 + q[at] as usize;
    }
    let qend = at + 5;
    if qend > q.len() {
        return None;
    }
    let qtype = u16::from_be_bytes([q[at + 1], q[at + 2]]);
    let mut r = q[..qend].to_vec();
    r[2] = 0x81; // response, recursion desired
    r[3] = 0x80; // recursion available, no error
    r[6..8].copy_from_slice(&u16::from(qtype == 1).to_be_bytes()); // answers
    r[8..12].fill(0);
    if qtype == 1 {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        r.extend_from_slice(&ip.octets());
    }
    Some(r)
}

/// Answers every A query with `ip` (a stand-in for a real nameserver).
pub fn dns_responder(sock: std::net::UdpSocket, ip: std::net::Ipv4Addr) {
    let mut buf = [0u8; 1500];
    while let Ok((n, from)) = sock.recv_from(&mut buf) {
        if let Some(r) = dns_answer(&buf[..n], ip) {
            let _ = sock.send_to(&r, from);
        }
    }
}

/// The same over TCP (each message after its 2-byte length), one connection at a time.
pub fn dns_tcp_responder(l: std::net::TcpListener, ip: std::net::Ipv4Addr) {
    use std::io::{Read, Write};
    for mut c in l.incoming().flatten() {
        let mut len = [0u8; 2];
        while c.read_exact(&mut len).is_ok() {
            let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
            if c.read_exact(&mut q).is_err() {
                break;
            }
            let Some(r) = dns_answer(&q, ip) else { break };
            let _ = c.write_all(&(r.len() as u16).to_be_bytes());
            let _ = c.write_all(&r);
        }
    }
}

/// A nameserver in the remote namespace on its address, port 53, UDP and TCP: every A
/// query gets the remote's address.
pub fn remote_nameserver(r: &Remote) {
    let ip = r.remote_ip();
    let sock = r
        .run_in(|| std::net::UdpSocket::bind((ip, 53)))
        .unwrap()
        .unwrap();
    std::thread::spawn(move || dns_responder(sock, ip));
    let tcp = r
        .run_in(|| std::net::TcpListener::bind((ip, 53)))
        .unwrap()
        .unwrap();
    std::thread::spawn(move || dns_tcp_responder(tcp, ip));
}

/// The system's python3 (`/usr/bin/python3` when there): the sandbox's identity may not
/// search a user's own install (one under /root, say) that comes first on PATH.
pub fn system_python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// A remote namespace reachable on an IPv4 link-local address (as a cloud's metadata
/// service is): `remote(tag)` and a second veth pair, 169.254.N.1/30 on the host and
/// 169.254.N.2/30 in the remote (N unused on the host, below 169), with a TCP service
/// there answering `hello` to each connection and a UDP one answering `pong` to each
/// datagram. Returns the remote, its link-local address and the two ports.
pub fn link_local_remote(tag: &str) -> (Remote, Ipv4Addr, u16, u16) {
    let mut r = remote(tag);
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .expect("ip addr");
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    let start = std::process::id() % 150;
    let third = (0..150)
        .map(|i| 10 + ((start + i) % 150) as u8)
        .find(|o| !used.contains(&format!(" 169.254.{o}.")))
        .expect("a free 169.254.N.0/30");
    let (host, ip) = (
        Ipv4Addr::new(169, 254, third, 1),
        Ipv4Addr::new(169, 254, third, 2),
    );
    r.add_path(host, ip).expect("a link-local path");
    let (tcp, udp) = r
        .run_in(|| {
            (
                std::net::TcpListener::bind((ip, 0)).unwrap(),
                std::net::UdpSocket::bind((ip, 0)).unwrap(),
            )
        })
        .unwrap();
    let ports = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );
    std::thread::spawn(move || {
        for mut c in tcp.incoming().flatten() {
            let _ = std::io::Write::write_all(&mut c, b"hello");
        }
    });
    std::thread::spawn(move || {
        let mut b = [0u8; 64];
        while let Ok((_, from)) = udp.recv_from(&mut b) {
            let _ = udp.send_to(b"pong", from);
        }
    });
    (r, ip, ports.0, ports.1)
}

/// Python: TCP connect, UDP connect and send, UDP `sendto` to `sys.argv[1]` on ports
/// argv[2] (TCP) and argv[3] (UDP); prints one line each: `tcp ok hello`, `udp ok pong`,
/// `sendto ok pong`, or the error's name (`EACCES`, `ECONNREFUSED`, `timeout`).
pub const REACH_PY: &str = r#"
import errno, socket, sys
ip, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def attempt(what, f):
    try:
        print(what, "ok", f().decode(), flush=True)
    except socket.timeout:
        print(what, "timeout", flush=True)
    except OSError as e:
        print(what, errno.errorcode.get(e.errno, str(e)), flush=True)
def tcp():
    s = socket.create_connection((ip, tport), timeout=3)
    return s.recv(16)
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.connect((ip, uport))
    s.send(b"ping")
    return s.recv(16)
def sendto():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(b"ping", (ip, uport))
    return s.recvfrom(16)[0]
attempt("tcp", tcp)
attempt("udp", udp)
attempt("sendto", sendto)
"#;

/// Runs [`REACH_PY`] under `ferry run --net NET OPTS` against `ip`'s ports.
pub fn run_reach(net: &str, opts: &[&str], ip: &str, tport: u16, uport: u16) -> Output {
    let mut all = vec!["--net", net];
    all.extend_from_slice(opts);
    ferry_run(
        &all,
        &[
            system_python(),
            "-c",
            REACH_PY,
            ip,
            &tport.to_string(),
            &uport.to_string(),
        ],
    )
}

/// scripts/guest-image.sh's image in the target directory (`None`, said why, when it
/// cannot be built here).
pub fn guest_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("guest");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/guest-image.sh");
    let o = Command::new("bash").arg(script).arg(&dir).output().ok()?;
    if !o.status.success() {
        eprintln!(
            "skipped: scripts/guest-image.sh failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        return None;
    }
    Some(dir)
}

/// Per thread of process `pid`: (name, NoNewPrivs, Seccomp mode, CapEff).
pub fn thread_confinement(pid: u32) -> Vec<(String, String, String, u64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        out.push((
            comm.trim().to_owned(),
            field("NoNewPrivs:"),
            field("Seccomp:"),
            u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(u64::MAX),
        ));
    }
    out
}

/// Every thread of [`thread_confinement`]'s list in seccomp filter mode, with no new
/// privileges and at most CAP_KILL (1 << 5).
pub fn assert_confined(threads: &[(String, String, String, u64)]) {
    for (name, nnp, seccomp, caps) in threads {
        assert_eq!(
            (nnp.as_str(), seccomp.as_str()),
            ("1", "2"),
            "{name}: {threads:?}"
        );
        assert_eq!(caps & !(1 << 5), 0, "{name}: capabilities {caps:#x}");
    }
}

/// No thread of [`thread_confinement`]'s list under a seccomp filter (`--unconfined`).
pub fn assert_unconfined(threads: &[(String, String, String, u64)]) {
    assert!(
        threads.iter().all(|(_, _, seccomp, _)| seccomp == "0"),
        "{threads:?}"
    );
}

/// The Go test program (tests/go/netprobe.go), built once with `CGO_ENABLED=0` (static,
/// its own system calls: the shim cannot serve it).
pub fn netprobe() -> PathBuf {
    static BUILT: std::sync::OnceLock<(TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, exe) = BUILT.get_or_init(|| {
        let dir = TempDir::new("go");
        let exe = dir.path().join("netprobe");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go/netprobe.go");
        let o = Command::new("go")
            .args(["build", "-o"])
            .arg(&exe)
            .arg(src)
            .env("CGO_ENABLED", "0")
            .env("GOCACHE", dir.path().join("cache"))
            .env("GOPATH", dir.path().join("gopath"))
            .env("GOFLAGS", "-mod=mod")
            .env("GO111MODULE", "off")
            .output()
            .expect("run go build");
        assert!(
            o.status.success(),
            "go build: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, exe)
    });
    exe.clone()
}
