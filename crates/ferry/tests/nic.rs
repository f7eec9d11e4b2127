//! nic mode (`--net nic|both`): programs the shim cannot reach — a static Go program
//! built here, busybox-static, ping — and ordinary ones, through the sandbox's TAP
//! against a remote namespace, compared with the same program run natively; and the
//! address rules of docs/SECURITY.md at L3/L4.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout[..o.stdout.len().min(4096)]),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A remote nginx serving `files` (name, length, pattern seed) on `port`.
fn remote_files(tag: &str, port: u16, files: &[(&str, usize)]) -> (Remote, TempDir, Guard) {
    let r = remote(tag);
    let dir = TempDir::new(tag);
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    for (i, (name, len)) in files.iter().enumerate() {
        std::fs::write(root.join(name), pattern(*len, i as u32 + 1)).unwrap();
    }
    let nginx = remote_nginx(&r, dir.path(), &root, port);
    (r, dir, nginx)
}

#[test]
fn a_static_go_program_fetches_the_same_bytes_as_natively() {
    if !can_run(&["go", "nginx", "ip"]) {
        return;
    }
    let files = [
        ("small.bin", 1_000usize),
        ("medium.bin", 300_000),
        ("large.bin", 30 << 20),
    ];
    let (r, _dir, _nginx) = remote_files("go", 8080, &files);
    let go = netprobe();
    let urls: Vec<String> = files
        .iter()
        .map(|(n, _)| format!("http://{}:8080/{n}", r.remote_ip()))
        .collect();
    let native = Command::new(&go).arg("get").args(&urls).output().unwrap();
    assert!(native.status.success(), "native: {}", text(&native));
    let expected: usize = files.iter().map(|(_, l)| l).sum();
    assert_eq!(native.stdout.len(), expected);
    let mut args = vec![go.to_str().unwrap(), "get"];
    args.extend(urls.iter().map(String::as_str));
    // Socket mode: the shim cannot reach a static Go program; it sees only loopback.
    let socket = ferry_run(&["--net", "socket"], &args);
    assert!(
        !socket.status.success(),
        "socket mode cannot serve Go: {}",
        text(&socket)
    );
    let nic = ferry_run(&["--net", "nic"], &args);
    assert!(nic.status.success(), "nic mode: {}", text(&nic));
    assert!(
        nic.stdout == native.stdout,
        "nic mode got {} bytes, native {}",
        nic.stdout.len(),
        native.stdout.len()
    );
}

/// Under `--handoff` every `connect`, `bind` and `listen` of the command is the guard's
/// to make (host_guard.rs): a static Go program (non-blocking connects, epoll, threads)
/// and busybox's `wget` (a blocking connect, kept by the guard until it completes) fetch
/// the same bytes (their connects to the rule's destination are handed off: handoff.rs
/// tests that).
#[test]
fn static_programs_fetch_the_same_bytes_under_the_handoff_guard() {
    if !can_run(&["go", "busybox", "nginx", "ip"]) {
        return;
    }
    let files = [("small.bin", 1_000usize), ("large.bin", 8 << 20)];
    let (r, _dir, _nginx) = remote_files("guarded", 8080, &files);
    let urls: Vec<String> = files
        .iter()
        .map(|(n, _)| format!("http://{}:8080/{n}", r.remote_ip()))
        .collect();
    let go = netprobe();
    let mut args = vec![go.to_str().unwrap(), "get"];
    args.extend(urls.iter().map(String::as_str));
    let rule = format!("--handoff={}/32", r.remote_ip());
    let o = ferry_run(&["--net", "nic", &rule], &args);
    assert!(o.status.success(), "go: {}", text(&o));
    let want: Vec<u8> = [pattern(1_000, 1), pattern(8 << 20, 2)].concat();
    assert!(o.stdout == want, "go got {} bytes", o.stdout.len());
    let o = ferry_run(
        &["--net", "nic", &rule],
        &["busybox", "wget", "-q", "-O", "-", &urls[1]],
    );
    assert!(o.status.success(), "busybox wget: {}", text(&o));
    assert!(
        o.stdout == pattern(8 << 20, 2),
        "wget got {} bytes",
        o.stdout.len()
    );
}

#[test]
fn busybox_static_wget_and_ping_work_in_nic_mode() {
    if !can_run(&["busybox", "nginx", "ip", "ping"]) {
        return;
    }
    let (r, _dir, _nginx) = remote_files("bbox", 8080, &[("f.bin", 500_000)]);
    let url = format!("http://{}:8080/f.bin", r.remote_ip());
    let o = ferry_run(
        &["--net", "nic"],
        &["busybox", "wget", "-q", "-O", "-", &url],
    );
    assert!(o.status.success(), "busybox wget: {}", text(&o));
    assert!(
        o.stdout == pattern(500_000, 1),
        "wget got {} bytes",
        o.stdout.len()
    );
    let ip = r.remote_ip().to_string();
    let o = ferry_run(
        &["--net", "nic"],
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", &ip],
    );
    assert!(o.status.success(), "ping: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("3 received"), "{out}");
    assert!(out.contains(&format!("bytes from {ip}")), "{out}");
}

#[test]
fn ping_to_a_denied_address_is_refused_at_once() {
    if !can_run(&["ip", "ping"]) {
        return;
    }
    let r = remote("pingdeny");
    let ip = r.remote_ip().to_string();
    let t = Instant::now();
    let o = ferry_run(
        &["--net", "nic", "--deny", &format!("{ip}/32")],
        &["ping", "-c", "1", "-W", "5", &ip],
    );
    assert!(!o.status.success(), "denied ping succeeded: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("filtered") || out.contains("Prohibited"),
        "{out}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "refused, not timed out: {:?}",
        t.elapsed()
    );
}

fn remote_iperf3(r: &Remote, port: u16) -> Guard {
    let g = Guard(
        quiet(&mut r.command("iperf3"))
            .args(["-s", "-p", &port.to_string()])
            .spawn()
            .unwrap(),
    );
    wait_port(r.remote_ip(), port);
    g
}

fn json_number(s: &str, section: &str, key: &str) -> f64 {
    let Some(at) = s.find(section) else {
        return 0.0;
    };
    let rest = &s[at..];
    let Some(k) = rest.find(key) else { return 0.0 };
    rest[k + key.len()..]
        .trim_start_matches([':', ' ', '\t', '"'])
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '+' || c == '-'))
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn iperf3_tcp_and_udp_both_directions_in_nic_mode() {
    if !can_run(&["iperf3", "ip"]) {
        return;
    }
    let r = remote("nicperf");
    let _srv = remote_iperf3(&r, 5201);
    let ip = r.remote_ip().to_string();
    for udp in [false, true] {
        for reverse in [false, true] {
            let mut args = vec!["iperf3", "-c", &ip, "-p", "5201", "-t", "2", "-J"];
            if udp {
                args.extend(["-u", "-b", "200M"]);
            }
            if reverse {
                args.push("-R");
            }
            let o = ferry_run(&["--net", "nic"], &args);
            assert!(
                o.status.success(),
                "iperf3 udp={udp} reverse={reverse}: {}",
                text(&o)
            );
            let out = String::from_utf8_lossy(&o.stdout);
            let (section, min) = if udp {
                ("\"sum\"", 5e7)
            } else {
                ("\"sum_received\"", 5e8)
            };
            let bps = json_number(&out, section, "\"bits_per_second\"");
            assert!(bps > min, "udp={udp} reverse={reverse}: {bps} bit/s\n{out}");
        }
    }
}

#[test]
fn one_gib_both_ways_is_byte_identical() {
    if !can_run(&["socat", "sha256sum", "head", "ip"]) {
        return;
    }
    let r = remote("gib");
    let dir = TempDir::new("gib");
    // socat parses its address itself: a path without quotes or parentheses.
    let file = std::env::temp_dir().join(format!("ferry-nic-gib-{}.bin", std::process::id()));
    let _remove = RemoveFile(file.clone());
    write_one_gib(&file);
    let native = Command::new("sha256sum").arg(&file).output().unwrap();
    let want = sha256_of(&native);
    let f = file.to_str().unwrap();
    let got_up = dir.path().join("up.sha");
    let _remote_ends = remote_gib_ends(&r, f, &got_up);
    wait_port(r.remote_ip(), 7001);
    let ip = r.remote_ip();
    let down = ferry_run(
        &["--net", "nic"],
        &["sh", "-c", &format!("socat -u TCP:{ip}:7001 - | sha256sum")],
    );
    assert!(down.status.success(), "download: {}", text(&down));
    assert_eq!(
        sha256_of(&down),
        want,
        "1 GiB remote → sandbox: {}",
        text(&down)
    );
    let up = ferry_run(
        &["--net", "nic"],
        &[
            "socat",
            "-u",
            &format!("FILE:{f}"),
            &format!("TCP:{ip}:7002"),
        ],
    );
    assert!(up.status.success(), "upload: {}", text(&up));
    remote_hashed_the_upload(&got_up, &want);
}

/// A file removed when this is dropped.
struct RemoveFile(PathBuf);

impl Drop for RemoveFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes 1 GiB to `file`: a 1 MiB pattern repeated (sha256 over the stream catches any
/// lost, repeated or reordered byte).
fn write_one_gib(file: &std::path::Path) {
    use std::io::Write;
    let mib = pattern(1 << 20, 77);
    let mut f = std::io::BufWriter::new(std::fs::File::create(file).unwrap());
    for _ in 0..1024 {
        f.write_all(&mib).unwrap();
    }
}

/// The hash `sha256sum` printed first in `o`'s stdout.
fn sha256_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// The remote's two ends: on 7001 it sends file `f` to each connection (remote →
/// sandbox); on 7002 it hashes what it receives into `got_up` (sandbox → remote).
fn remote_gib_ends(r: &Remote, f: &str, got_up: &std::path::Path) -> [Guard; 2] {
    let send = Guard(
        quiet(&mut r.command("socat"))
            .args(["TCP-LISTEN:7001,reuseaddr,fork", &format!("SYSTEM:cat {f}")])
            .spawn()
            .unwrap(),
    );
    let recv = Guard(
        quiet(&mut r.command("sh"))
            .args([
                "-c",
                &format!(
                    "socat -u TCP-LISTEN:7002,reuseaddr - | sha256sum > '{}'",
                    got_up.display()
                ),
            ])
            .spawn()
            .unwrap(),
    );
    [send, recv]
}

/// Checks that the remote's hash of the upload (in `got_up`, within 20 s) is `want`.
fn remote_hashed_the_upload(got_up: &std::path::Path, want: &str) {
    let t = Instant::now();
    loop {
        let s = std::fs::read_to_string(got_up).unwrap_or_default();
        if s.len() >= 64 {
            assert_eq!(&s[..64], want, "1 GiB sandbox → remote");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the remote never finished hashing"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ipv6_reaches_the_remote_in_nic_mode() {
    if !can_run(&["ip", "go", "curl"]) {
        return;
    }
    let r = remote("v6");
    let pid = std::process::id() % 0xffff;
    let (host6, remote6) = (format!("fd66:{pid:x}::1"), format!("fd66:{pid:x}::2"));
    let path = &r.paths()[0];
    let ip = |args: &[&str]| {
        let o = Command::new("ip").args(args).output().unwrap();
        assert!(o.status.success(), "ip {args:?}: {}", text(&o));
    };
    ip(&[
        "-6",
        "addr",
        "add",
        &format!("{host6}/64"),
        "dev",
        &path.host_if,
        "nodad",
    ]);
    ip(&[
        "netns",
        "exec",
        r.name(),
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{remote6}/64"),
        "dev",
        &path.remote_if,
        "nodad",
    ]);
    let go = netprobe();
    let _srv = Guard(
        quiet(&mut r.command(go.to_str().unwrap()))
            .args(["serve", "[::]:8080", "over IPv6"])
            .spawn()
            .unwrap(),
    );
    let url = format!("http://[{remote6}]:8080/six");
    let t = Instant::now();
    while !Command::new("curl")
        .args(["-sf", "-o", "/dev/null", &url])
        .status()
        .unwrap()
        .success()
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "remote IPv6 never came up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let go = netprobe();
    let o = ferry_run(&["--net", "nic"], &[go.to_str().unwrap(), "get", &url]);
    assert!(o.status.success(), "IPv6 fetch: {}", text(&o));
    // The sandbox's own addresses: IPv6 on eth0, default routes both ways.
    let o = ferry_run(&["--net", "nic"], &["ip", "-6", "route"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("default via"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_go_server_in_the_sandbox_is_published_with_p() {
    if !can_run(&["go", "curl"]) {
        return;
    }
    let go = netprobe();
    let mut c = ferry();
    c.args(["run", "--net", "nic", "-p", "127.0.0.1:18391:8000", "--"])
        .arg(&go)
        .args(["serve", ":8000", "hello from go"]);
    let _srv = Guard(quiet(&mut c).spawn().unwrap());
    wait_port("127.0.0.1".parse().unwrap(), 18391);
    for _ in 0..3 {
        let o = Command::new("curl")
            .args(["-sS", "-m", "5", "http://127.0.0.1:18391/x"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "hello from go",
            "{}",
            text(&o)
        );
    }
}

#[test]
fn nothing_reaches_the_sandbox_without_p() {
    if !can_run(&["go", "curl"]) {
        return;
    }
    // A server inside listens on every address; nothing is published. Neither the
    // host's addresses nor the sandbox's (not routed on the host) reach it.
    let go = netprobe();
    let mut c = ferry();
    c.args(["run", "--net", "nic", "--"])
        .arg(&go)
        .args(["serve", ":18392", "inside"]);
    let _srv = Guard(quiet(&mut c).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(800));
    for url in ["http://127.0.0.1:18392/", "http://10.0.2.100:18392/"] {
        let o = Command::new("curl")
            .args(["-sS", "-m", "2", url])
            .output()
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("inside"),
            "{url}: {}",
            text(&o)
        );
    }
}

#[test]
fn policy_and_address_rules_hold_in_nic_mode() {
    if !can_run(&["go", "nginx", "ip", "curl"]) {
        return;
    }
    let (r, _dir, _nginx) = remote_files("nicpol", 8080, &[("p.bin", 1000)]);
    // A second port on the remote, for the per-port rules.
    let dir2 = TempDir::new("nicpol2");
    let root2 = dir2.path().join("www");
    std::fs::create_dir_all(&root2).unwrap();
    std::fs::write(root2.join("p.bin"), pattern(1000, 1)).unwrap();
    let _nginx2 = remote_nginx(&r, dir2.path(), &root2, 8081);
    // A service on the host's loopback the sandbox must never reach.
    let host_lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let lo_port = host_lo.local_addr().unwrap().port();
    let go = netprobe();
    let go = go.to_str().unwrap();
    let ip = r.remote_ip().to_string();
    let get = |opts: &[&str], url: &str| {
        let t = Instant::now();
        let mut all = vec!["--net", "nic"];
        all.extend_from_slice(opts);
        let o = ferry_run(&all, &[go, "get", url]);
        (o, t.elapsed())
    };
    let ok = |opts: &[&str], port: u16| {
        let (o, _) = get(opts, &format!("http://{ip}:{port}/p.bin"));
        assert!(
            o.status.success(),
            "{opts:?} port {port} should pass: {}",
            text(&o)
        );
    };
    let refused = |opts: &[&str], url: &str| {
        let (o, took) = get(opts, url);
        assert!(
            !o.status.success(),
            "{opts:?} {url} should be refused: {}",
            text(&o)
        );
        assert!(
            took < Duration::from_secs(5),
            "{opts:?} {url}: refused at once, not after {took:?}"
        );
    };
    ok(&[], 8080);
    // Denied CIDR, denied port, an allow-list.
    refused(
        &["--deny", &format!("{ip}/32")],
        &format!("http://{ip}:8080/p.bin"),
    );
    refused(
        &["--deny", &format!("{ip}/32:8080")],
        &format!("http://{ip}:8080/p.bin"),
    );
    ok(&["--deny", &format!("{ip}/32:8080")], 8081);
    refused(
        &["--allow", &format!("{ip}/32:8081")],
        &format!("http://{ip}:8080/p.bin"),
    );
    ok(&["--allow", &format!("{ip}/32:8081")], 8081);
    // The host's loopback: not through the sandbox's own loopback, not through the
    // gateway, not through the unspecified address.
    // Nor does the sandbox's own link lead anywhere but to the gateway.
    for host in ["127.0.0.1", "10.0.2.2", "0.0.0.0", "10.0.2.55"] {
        refused(&[], &format!("http://{host}:{lo_port}/"));
    }
    // UDP to a denied destination: refused at once (ICMP prohibited → ECONNREFUSED).
    let t = Instant::now();
    let o = ferry_run(
        &["--net", "nic", "--deny", &format!("{ip}/32")],
        &[go, "udp", &format!("{ip}:9"), "x"],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "UDP refused at once, took {:?}",
        t.elapsed()
    );
    drop(host_lo);
}

#[test]
fn both_mode_runs_a_shim_program_and_a_go_program_side_by_side() {
    if !can_run(&["go", "nginx", "ip", "curl", "sh"]) {
        return;
    }
    let (r, dir, _nginx) = remote_files("both", 8080, &[("a.bin", 2 << 20), ("b.bin", 3 << 20)]);
    let go = netprobe();
    let ip = r.remote_ip();
    let stats = dir.path().join("stats.json");
    let script = format!(
        "curl -sS --fail -o '{d}/a.out' http://{ip}:8080/a.bin & \
         '{go}' get http://{ip}:8080/b.bin > '{d}/b.out' & \
         wait %1 && wait %2",
        d = dir.path().display(),
        go = go.display()
    );
    let o = ferry_run(
        &["--net", "both", "--stats-json", stats.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    assert!(o.status.success(), "both: {}", text(&o));
    assert!(std::fs::read(dir.path().join("a.out")).unwrap() == pattern(2 << 20, 1));
    assert!(std::fs::read(dir.path().join("b.out")).unwrap() == pattern(3 << 20, 2));
    // curl went through the shim (the protocol server made its socket), Go through
    // the TAP (a NIC server's TCP flow).
    let json = std::fs::read_to_string(&stats).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["sockets_created"].as_u64().unwrap_or(0) >= 1, "{json}");
    assert!(
        v["nic"][0]["tcp_flows"].as_u64().unwrap_or(0) >= 1,
        "{json}"
    );
}

#[test]
fn a_go_program_resolves_names_through_the_dns_forwarder() {
    if !can_run(&["go", "nginx", "ip"]) {
        return;
    }
    let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    if !conf
        .lines()
        .any(|l| l.trim_start().starts_with("nameserver"))
    {
        eprintln!("skipped: no nameserver in /etc/resolv.conf for the sandbox's resolver to use");
        return;
    }
    let r = remote("nicdns");
    remote_nameserver(&r);
    let dir = TempDir::new("nicdns");
    std::fs::write(dir.path().join("hello.txt"), "resolved").unwrap();
    let _nginx = remote_nginx(&r, dir.path(), dir.path(), 8084);
    let upstream = format!("{}:53", r.remote_ip());
    let go = netprobe();
    // Go's own resolver (no libc) asks the nameserver of /etc/resolv.conf: in nic mode
    // its query reaches the forwarder inside the sandbox like glibc's does.
    let o = ferry_run(
        &["--net", "nic", "--dns", &upstream],
        &[
            go.to_str().unwrap(),
            "get",
            "http://web.ferry.test:8084/hello.txt",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "resolved",
        "{}",
        text(&o)
    );
}

#[test]
fn an_unprivileged_user_runs_a_go_program_in_nic_mode() {
    if !can_run(&["go", "nginx", "ip", "runuser"]) || !have_test_user() {
        return;
    }
    let (r, _dir, _nginx) = remote_files("nicuser", 8080, &[("u.bin", 200_000)]);
    let go = netprobe();
    // Only ferry itself: nic mode needs no shim.
    let bin = TempDir::new("nicuser-bin");
    let exe = ferry_for_any_user(bin.path());
    std::fs::remove_file(bin.path().join("libferry_preload.so")).unwrap();
    let url = format!("http://{}:8080/u.bin", r.remote_ip());
    let go = go.to_str().unwrap();
    let o = as_test_user(&exe, &["run", "--net", "nic", "--", go, "get", &url]);
    assert!(o.status.success(), "as ferrytest: {}", text(&o));
    assert!(
        o.stdout == pattern(200_000, 1),
        "got {} bytes",
        o.stdout.len()
    );
}

#[test]
fn the_demo_fetches_the_same_bytes_natively_through_socket_mode_and_nic_mode() {
    if !can_run(&["curl", "ip"]) {
        return;
    }
    let o = ferry().args(["demo", "--size-mb", "8"]).output().unwrap();
    assert!(o.status.success(), "demo: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for row in ["native", "ferry", "ferry-nic"] {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(row))
            .unwrap_or_else(|| panic!("no {row} row: {out}"));
        assert!(line.contains(" true ") && line.ends_with("true"), "{line}");
        assert!(line.contains(&(8u64 << 20).to_string()), "{line}");
    }
}

#[test]
fn a_udp_server_without_the_shim_is_published_with_p() {
    if !can_run(&["socat"]) {
        return;
    }
    // UDP ports keep socket mode's flows (sockets made inside the sandbox): they reach
    // a program the shim does not serve too.
    let mut c = ferry();
    c.args([
        "run",
        "--net",
        "nic",
        "-p",
        "127.0.0.1:18393:5353/udp",
        "--",
        "socat",
        "UDP4-RECVFROM:5353,fork",
        "SYSTEM:cat",
    ]);
    let _srv = Guard(quiet(&mut c).spawn().unwrap());
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        sock.send_to(b"echo me", "127.0.0.1:18393").unwrap();
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            assert_eq!(&buf[..n], b"echo me");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no answer through the published UDP port"
        );
    }
}

#[test]
fn ipv4_link_local_is_refused_unless_allowed_explicitly() {
    if !can_run(&["ip", "python3", "ping"]) {
        return;
    }
    // A remote on 169.254.N.2, reachable from the host as a metadata service is.
    let (_r, ip, tport, uport) = link_local_remote("nicll");
    let ip = ip.to_string();
    let reach = |opts: &[&str]| {
        let o = run_reach("nic", opts, &ip, tport, uport);
        assert!(o.status.success(), "{opts:?}: {}", text(&o));
        let mut all = vec!["--net", "nic"];
        all.extend_from_slice(opts);
        let p = ferry_run(&all, &["ping", "-c", "1", "-W", "2", &ip]);
        let mut lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        lines.push(format!(
            "ping {}",
            if p.status.success() { "ok" } else { "failed" }
        ));
        lines
    };
    let all_ok = ["tcp ok hello", "udp ok pong", "sendto ok pong", "ping ok"];
    // Only an allow of its own reaches it (the rest stays open with 0.0.0.0/0).
    let allowed = format!("--allow={ip}/32");
    assert_eq!(reach(&[&allowed, "--allow=0.0.0.0/0"]), all_ok);
    // Not by default, nor with an allow that merely covers it.
    for opts in [&[][..], &["--allow=0.0.0.0/0"][..]] {
        let got = reach(opts);
        eprintln!("{opts:?}: {got:?}");
        assert_eq!(got.len(), 4, "{got:?}");
        for (line, ok) in got.iter().zip(all_ok) {
            assert_ne!(line, ok, "{opts:?}: {got:?}");
        }
        assert_eq!(got[0], "tcp ECONNREFUSED", "{opts:?}: reset at once");
    }
}

#[test]
fn busybox_ping_works_in_nic_and_both_mode_for_every_identity() {
    if !can_run(&["busybox", "ip", "runuser"]) {
        return;
    }
    // busybox's ping makes a raw ICMP socket only (no fallback to a ping socket): the
    // sandbox's init makes it for the command, whatever identity the sandbox runs as.
    let r = remote("bbping");
    let ip = r.remote_ip().to_string();
    let ping = ["busybox", "ping", "-c", "2", "-W", "2", &ip];
    let check = |who: &str, o: &Output| {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("2 packets received"),
            "{who}: {}",
            text(o)
        );
    };
    for net in ["nic", "both"] {
        check(net, &ferry_run(&["--net", net], &ping));
    }
    check(
        "--userns never",
        &ferry_run(&["--net", "nic", "--userns", "never"], &ping),
    );
    if have_test_user() {
        let bin = TempDir::new("bbping-bin");
        let exe = ferry_for_any_user(bin.path());
        let mut args = vec!["run", "--"];
        args.extend_from_slice(&ping);
        check("as ferrytest", &as_test_user(&exe, &args));
    }
}

/// GETs `url` with curl (5 s at most); its body.
fn curl(url: &str) -> String {
    let o = Command::new("curl")
        .args(["-sS", "-m", "5", url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn servers_the_shim_cannot_serve_are_published_with_p_in_both_mode() {
    if !can_run(&["busybox", "curl", "python3", "go"]) {
        return;
    }
    let dir = TempDir::new("bothpub");
    std::fs::write(dir.path().join("index.html"), "static hello").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.path().join("index.html"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    published_static_tcp_server_answers(&dir);
    published_shimmed_server_stays_the_shims(&dir);
    published_port_without_a_listener_resets_and_says_why(&dir);
    published_static_udp_server_answers();
}

/// A static server (busybox-static: not shimmed) in the default mode: the published
/// port finds no listener of the shim's and goes to the TAP.
fn published_static_tcp_server_answers(dir: &TempDir) {
    let mut c = ferry();
    c.args(["run", "-p", "127.0.0.1:18394:8080", "--"])
        .args(["busybox", "httpd", "-f", "-p", "8080", "-h"])
        .arg(dir.path());
    let _httpd = Guard(quiet(&mut c).spawn().unwrap());
    wait_port("127.0.0.1".parse().unwrap(), 18394);
    for _ in 0..3 {
        assert_eq!(curl("http://127.0.0.1:18394/index.html"), "static hello");
    }
}

/// A shimmed server published the same way is still the shim's: once it listens, its
/// clients keep their address (through the TAP they would be the gateway's).
fn published_shimmed_server_stays_the_shims(dir: &TempDir) {
    let log = dir.path().join("http.log");
    let mut c = ferry();
    c.args(["run", "-p", "127.0.0.1:18395:8000", "--"])
        .args([system_python(), "-m", "http.server", "-d"])
        .arg(dir.path())
        .arg("8000")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let _py = Guard(c.spawn().unwrap());
    wait_port("127.0.0.1".parse().unwrap(), 18395);
    // The first fetch may race the server's start (then the TAP asks until it listens).
    assert_eq!(curl("http://127.0.0.1:18395/index.html"), "static hello");
    let before = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    for _ in 0..3 {
        assert_eq!(curl("http://127.0.0.1:18395/index.html"), "static hello");
    }
    std::thread::sleep(Duration::from_millis(200));
    let text = std::fs::read_to_string(&log).unwrap();
    let served: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("GET /index.html"))
        .collect();
    assert!(served.len() >= 4, "{text}");
    for l in text.lines().skip(before).filter(|l| l.contains("GET")) {
        assert!(
            l.starts_with("127.0.0.1 "),
            "not through the shim: {l}\n{text}"
        );
    }
}

/// Nothing listening at all: the client is reset after the grace, and told why.
fn published_port_without_a_listener_resets_and_says_why(dir: &TempDir) {
    let log = dir.path().join("none.log");
    let mut c = ferry();
    c.args(["run", "-p", "127.0.0.1:18397:9999", "--", "sleep", "20"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let _none = Guard(c.spawn().unwrap());
    wait_port("127.0.0.1".parse().unwrap(), 18397);
    let t = Instant::now();
    assert_eq!(curl("http://127.0.0.1:18397/"), "");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(200));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("nothing in the sandbox listens on port 9999 (neither a listener of the shim's nor one on eth0)"),
        "{text}"
    );
}

/// UDP: a static (Go) server, the same.
fn published_static_udp_server_answers() {
    let go = netprobe();
    let mut c = ferry();
    c.args(["run", "-p", "127.0.0.1:18396:5353/udp", "--"])
        .arg(&go)
        .args(["udpecho", ":5353"]);
    let _udp = Guard(quiet(&mut c).spawn().unwrap());
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        sock.send_to(b"echo me", "127.0.0.1:18396").unwrap();
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            assert_eq!(&buf[..n], b"echo me");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no answer through the published UDP port"
        );
    }
}
