//! Real, unmodified programs from Debian packages inside `ferry run`, against a remote
//! namespace, compared with the same program run natively.

mod bond;
mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

fn text(o: &std::process::Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn curl_fetches_the_same_bytes_from_nginx_as_natively() {
    if !can_run(&["curl", "nginx", "ip"]) {
        return;
    }
    let r = remote("curl");
    let dir = TempDir::new("curl");
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let files = [
        ("small.bin", 2322usize),
        ("medium.bin", 300_000),
        ("large.bin", 20 << 20),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        std::fs::write(root.join(name), pattern(*len, i as u32 + 1)).unwrap();
    }
    let _nginx = remote_nginx(&r, dir.path(), &root, 8080);
    for (name, len) in files {
        let url = format!("http://{}:8080/{name}", r.remote_ip());
        let native = Command::new("curl")
            .args(["-sS", "--fail", &url])
            .output()
            .unwrap();
        let ferry = ferry_run(&[], &["curl", "-sS", "--fail", &url]);
        assert!(native.status.success(), "native curl: {}", text(&native));
        assert!(ferry.status.success(), "ferry curl: {}", text(&ferry));
        assert_eq!(native.stdout.len(), len);
        assert!(
            ferry.stdout == native.stdout,
            "{name}: ferry got {} bytes, native {}",
            ferry.stdout.len(),
            len
        );
    }
}

#[test]
fn parallel_downloads_fast_and_slow_readers_get_every_byte() {
    // Bulk receives go host socket → the server's one pipe → the program's fd (splice);
    // several streams share that pipe, and a slow reader's fd fills up, so what it does
    // not take waits in the server. Every file must arrive whole and in order.
    if !can_run(&["curl", "nginx", "ip", "sh"]) {
        return;
    }
    let r = remote("parallel");
    let dir = TempDir::new("parallel");
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let data = pattern(12 << 20, 9);
    std::fs::write(root.join("big.bin"), &data).unwrap();
    let _nginx = remote_nginx(&r, dir.path(), &root, 8080);
    let url = format!("http://{}:8080/big.bin", r.remote_ip());
    let out = |i: usize| dir.path().join(format!("got{i}"));
    let script = format!(
        "curl -sS --fail -m 60 -o '{a}' {url} & curl -sS --fail -m 60 -o '{b}' {url} & \
         curl -sS --fail -m 60 --limit-rate 8M -o '{c}' {url} & \
         curl -sS --fail -m 60 --limit-rate 16M -o '{d}' {url} & wait",
        a = out(0).display(),
        b = out(1).display(),
        c = out(2).display(),
        d = out(3).display(),
    );
    let ferry = ferry_run(&[], &["sh", "-c", &script]);
    assert!(ferry.status.success(), "{}", text(&ferry));
    for i in 0..4 {
        let got = std::fs::read(out(i)).unwrap();
        assert_eq!(got.len(), data.len(), "download {i}");
        assert!(got == data, "download {i}: bytes differ");
    }
}

#[test]
fn a_download_after_one_killed_with_bytes_in_the_servers_pipe_gets_every_byte() {
    // What a bulk stream's fd does not take waits in the server's one pipe, which is
    // that stream's until it is through. A slow reader killed meanwhile leaves its bytes
    // there: they belong to no one, and the next bulk stream must get only its own.
    if !can_run(&["curl", "nginx", "ip", "sh", "timeout"]) {
        return;
    }
    let r = remote("held");
    let dir = TempDir::new("held");
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let data = pattern(24 << 20, 5);
    std::fs::write(root.join("big.bin"), &data).unwrap();
    let _nginx = remote_nginx(&r, dir.path(), &root, 8080);
    let url = format!("http://{}:8080/big.bin", r.remote_ip());
    let got = dir.path().join("got");
    let script = format!(
        "timeout -s KILL 2 curl -sS --limit-rate 2M -o /dev/null {url}; \
         curl -sS --fail -m 60 -o '{g}' {url}",
        g = got.display(),
    );
    let ferry = ferry_run(&[], &["sh", "-c", &script]);
    assert!(ferry.status.success(), "{}", text(&ferry));
    let got = std::fs::read(got).unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the second download's bytes differ");
}

#[test]
fn denied_destination_gets_a_clear_error() {
    if !can_run(&["curl", "nginx", "ip"]) {
        return;
    }
    let r = remote("deny");
    let dir = TempDir::new("deny");
    std::fs::write(dir.path().join("index.html"), "hello").unwrap();
    let _nginx = remote_nginx(&r, dir.path(), dir.path(), 8081);
    let url = format!("http://{}:8081/index.html", r.remote_ip());
    let deny = format!("{}/32", r.remote_ip());
    let o = ferry_run(&["--deny", &deny], &["curl", "-sS", &url]);
    assert_eq!(
        o.status.code(),
        Some(7),
        "curl's 'could not connect': {}",
        text(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("denied by policy"),
        "ferry logs the refusal: {err}"
    );
    let ok = ferry_run(&["--deny", "192.0.2.0/24"], &["curl", "-sS", &url]);
    assert_eq!(
        String::from_utf8_lossy(&ok.stdout),
        "hello",
        "{}",
        text(&ok)
    );
}

/// An iperf3 server in the remote namespace on `port`, accepting once this returns.
fn remote_iperf3_server(r: &Remote, port: u16) -> Guard {
    let srv = Guard(
        quiet(&mut r.command("iperf3"))
            .args(["-s", "-p", &port.to_string()])
            .spawn()
            .unwrap(),
    );
    wait_port(r.remote_ip(), port);
    srv
}

#[test]
fn iperf3_tcp_both_directions() {
    if !can_run(&["iperf3", "ip"]) {
        return;
    }
    let r = remote("iperf");
    let _srv = remote_iperf3_server(&r, 5201);
    let ip = r.remote_ip().to_string();
    for reverse in [false, true] {
        let mut args = vec!["iperf3", "-c", &ip, "-p", "5201", "-t", "2", "-J"];
        if reverse {
            args.push("-R");
        }
        let o = ferry_run(&[], &args);
        assert!(o.status.success(), "iperf3 reverse={reverse}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("\"sum_received\""), "{out}");
        let bps = json_number(&out, "\"sum_received\"", "\"bits_per_second\"");
        assert!(
            bps > 1e8,
            "iperf3 reverse={reverse} moved data: {bps} bit/s"
        );
    }
}

/// 64-byte blocking writes: one send record and one returned buffer each, faster than
/// the server publishes its completions. Before, the server's back-pressure (completions
/// backed up) kept the records it had taken unreleased and did not wake the program when
/// it published completions: the writer slept out 100 ms waits, or hung for good.
#[test]
fn iperf3_with_64_byte_writes_does_not_stall() {
    if !can_run(&["iperf3", "ip"]) {
        return;
    }
    let r = remote("iperf64");
    let _srv = remote_iperf3_server(&r, 5203);
    let ip = r.remote_ip().to_string();
    let mut cmd = ferry();
    cmd.args([
        "run", "--", "iperf3", "-c", &ip, "-p", "5203", "-t", "2", "-l", "64", "-J",
    ]);
    let o = output_within(cmd, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // The test runs its 2 s: no write waited seconds (the stall stretched it to 7-11 s).
    let secs = json_number(&out, "\"sum_sent\"", "\"seconds\"");
    assert!(secs < 3.5, "a 2 s test took {secs} s: {out}");
}

/// iperf3's client is a `select` loop around non-blocking writes. It must sleep while
/// ferry's buffers are all in flight, not spin: its fd is unwritable until a buffer comes
/// back. Counted with strace: natively ~1,000 `pselect6` calls in a 1 s run; with an
/// always-writable fd it made 4,000–37,000 per second (and starved the server).
#[test]
fn iperf3_client_sleeps_while_its_buffers_are_in_flight() {
    if !have("iperf3") || !have("strace") {
        eprintln!("skipped: needs iperf3 and strace");
        return;
    }
    if !is_root() && !ferry_sandbox::userns_available() {
        eprintln!("skipped: no user namespaces");
        return;
    }
    let out = std::env::temp_dir().join(format!("ferry-iperf-strace-{}", std::process::id()));
    let script = format!(
        "timeout 25 iperf3 -s -1 -p 5204 >/dev/null & sleep 1; \
         timeout 20 strace -f -c -e trace=pselect6 -o {} iperf3 -c 127.0.0.1 -p 5204 -t 2 -J; \
         rc=$?; wait; exit $rc",
        out.display()
    );
    let o = ferry_run(&[], &["sh", "-c", &script]);
    let summary = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    assert!(o.status.success(), "iperf3 under strace: {}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let bps = json_number(&stdout, "\"sum_received\"", "\"bits_per_second\"");
    assert!(bps > 1e8, "iperf3 moved {bps} bit/s");
    let calls: u64 = summary
        .lines()
        .find(|l| l.trim_end().ends_with("pselect6"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or_else(|| panic!("no pselect6 line in strace's summary:\n{summary}"));
    eprintln!("iperf3 client: {calls} pselect6 calls in 2 s, {bps:.0} bit/s");
    assert!(
        calls < 6_000,
        "iperf3's client spun: {calls} pselect6 calls in a 2 s run"
    );
}

/// Server and client both inside one sandbox, over its loopback: the server's listener
/// stays in its `select` set while the data connection runs, and it calls a blocking
/// `accept` whenever the listener looks readable (it used to hang there, with 0 bytes
/// received, while the client spun).
#[test]
fn iperf3_server_and_client_inside_one_sandbox() {
    if !have("iperf3") {
        eprintln!("skipped: iperf3 is not installed (run scripts/install-deps.sh)");
        return;
    }
    if !is_root() && !ferry_sandbox::userns_available() {
        eprintln!("skipped: no user namespaces");
        return;
    }
    let script = "timeout 25 iperf3 -s -1 -p 5203 >/dev/null & sleep 1; \
                  timeout 20 iperf3 -c 127.0.0.1 -p 5203 -t 2 -J; rc=$?; wait; exit $rc";
    let o = ferry_run(&[], &["sh", "-c", script]);
    assert!(
        o.status.success(),
        "iperf3 over the sandbox's loopback: {}",
        text(&o)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let bps = json_number(&out, "\"sum_received\"", "\"bits_per_second\"");
    assert!(
        bps > 1e8,
        "iperf3 over the sandbox's loopback moved {bps} bit/s"
    );
}

#[test]
fn iperf3_udp() {
    if !can_run(&["iperf3", "ip"]) {
        return;
    }
    let r = remote("iperfu");
    let _srv = remote_iperf3_server(&r, 5202);
    let ip = r.remote_ip().to_string();
    for reverse in [false, true] {
        let mut args = vec![
            "iperf3", "-c", &ip, "-p", "5202", "-u", "-b", "200M", "-t", "2", "-J",
        ];
        if reverse {
            args.push("-R");
        }
        let o = ferry_run(&[], &args);
        assert!(
            o.status.success(),
            "iperf3 -u reverse={reverse}: {}",
            text(&o)
        );
        let out = String::from_utf8_lossy(&o.stdout);
        let packets = json_number(&out, "\"sum\"", "\"packets\"");
        assert!(packets > 1000.0, "udp packets: {packets}");
    }
}

#[test]
fn sockperf_ping_pong() {
    if !can_run(&["sockperf", "ip"]) {
        return;
    }
    let r = remote("sockperf");
    let ip = r.remote_ip().to_string();
    let _srv = Guard(
        quiet(&mut r.command("sockperf"))
            .args(["server", "--tcp", "-i", &ip, "-p", "11111"])
            .spawn()
            .unwrap(),
    );
    wait_port(r.remote_ip(), 11111);
    let o = ferry_run(
        &[],
        &[
            "sockperf",
            "ping-pong",
            "--tcp",
            "-i",
            &ip,
            "-p",
            "11111",
            "-t",
            "2",
            "-m",
            "64",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("percentile 50.000"), "{out}");
}

#[test]
fn redis_benchmark_against_remote_redis() {
    if !can_run(&["redis-server", "redis-benchmark", "ip"]) {
        return;
    }
    let r = remote("redis");
    let ip = r.remote_ip().to_string();
    let _srv = Guard(
        quiet(&mut r.command("redis-server"))
            .args([
                "--bind",
                &ip,
                "--port",
                "6390",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ])
            .spawn()
            .unwrap(),
    );
    wait_port(r.remote_ip(), 6390);
    for pipeline in ["1", "16"] {
        let o = ferry_run(
            &[],
            &[
                "redis-benchmark",
                "-h",
                &ip,
                "-p",
                "6390",
                "-n",
                "20000",
                "-t",
                "get,set",
                "-P",
                pipeline,
                "-q",
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("SET:") && out.contains("GET:"), "{out}");
    }
}

/// Pulls the first `key` number after `section` out of iperf3's JSON.
fn json_number(s: &str, section: &str, key: &str) -> f64 {
    let at = s.rfind(section).unwrap_or(0);
    let rest = &s[at..];
    let k = rest.find(key).unwrap_or_else(|| panic!("{key} in {rest}"));
    rest[k + key.len()..]
        .trim_start_matches([':', ' ', '\t'])
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '+' || c == '-'))
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn published_nginx_and_redis_inside_the_sandbox_serve_the_host() {
    if !can_run(&["curl", "nginx", "redis-server", "redis-cli"]) {
        return;
    }
    let dir = TempDir::new("publish");
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let page = pattern(100_000, 9);
    std::fs::write(root.join("page.bin"), &page).unwrap();
    let conf = nginx_conf(dir.path(), &root, 80);
    let mut nginx = ferry();
    nginx.args([
        "run",
        "-p",
        "127.0.0.1:18181:80",
        "--",
        "nginx",
        "-c",
        conf.to_str().unwrap(),
    ]);
    let _nginx = Guard(quiet(&mut nginx).spawn().unwrap());
    let mut redis = ferry();
    redis.args([
        "run",
        "-p",
        "127.0.0.1:16399:6379",
        "--",
        "redis-server",
        "--save",
        "",
        "--appendonly",
        "no",
        "--port",
        "6379",
    ]);
    let _redis = Guard(quiet(&mut redis).spawn().unwrap());
    wait_port("127.0.0.1".parse().unwrap(), 18181);
    wait_port("127.0.0.1".parse().unwrap(), 16399);
    // The host port listens at once; until redis's own listener reaches ferry, a
    // connection goes to the TAP (`--net both`'s hand-off of ports the shim does not
    // serve) and arrives from the gateway, which redis's protected mode refuses
    // ("DENIED"). Wait for redis itself to answer through the port.
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let ping = Command::new("redis-cli")
            .args(["-p", "16399", "ping"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&ping.stdout).trim() == "PONG" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..3 {
        let o = Command::new("curl")
            .args([
                "-sS",
                "--fail",
                "-m",
                "10",
                "http://127.0.0.1:18181/page.bin",
            ])
            .output()
            .unwrap();
        assert!(o.stdout == page, "published nginx: {}", text(&o));
    }
    let set = Command::new("redis-cli")
        .args(["-p", "16399", "set", "k", "ferry"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&set.stdout).trim(),
        "OK",
        "{}",
        text(&set)
    );
    let get = Command::new("redis-cli")
        .args(["-p", "16399", "get", "k"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&get.stdout).trim(),
        "ferry",
        "{}",
        text(&get)
    );
}

#[test]
fn unprivileged_user_runs_curl_through_ferry() {
    if !can_run(&["curl", "nginx", "runuser"]) {
        return;
    }
    if !have_test_user() {
        return;
    }
    let r = remote("unpriv");
    let dir = TempDir::new("unpriv");
    std::fs::write(dir.path().join("x.bin"), pattern(500_000, 3)).unwrap();
    let _nginx = remote_nginx(&r, dir.path(), dir.path(), 8082);
    // The user needs to reach the binaries: copy them somewhere world-readable.
    let bin = TempDir::new("unpriv-bin");
    let ferry_exe = ferry_for_any_user(bin.path());
    Command::new("chmod")
        .args(["-R", "a+rX", dir.path().to_str().unwrap()])
        .status()
        .unwrap();
    let url = format!("http://{}:8082/x.bin", r.remote_ip());
    let o = as_test_user(&ferry_exe, &["run", "--", "curl", "-sS", "--fail", &url]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        o.stdout == pattern(500_000, 3),
        "unprivileged fetch differs ({} bytes)",
        o.stdout.len()
    );
}

#[test]
fn a_program_killed_mid_transfer_leaves_nothing_open() {
    if !can_run(&["curl", "nginx", "ip"]) {
        return;
    }
    let r = remote("kill");
    let dir = TempDir::new("kill");
    std::fs::write(dir.path().join("big.bin"), pattern(64 << 20, 5)).unwrap();
    let _nginx = remote_nginx(&r, dir.path(), dir.path(), 8083);
    let stats = dir.path().join("stats.json");
    let url = format!("http://{}:8083/big.bin", r.remote_ip());
    // curl is throttled so the transfer is surely under way when it is killed.
    let script = format!(
        "curl -s --limit-rate 4M -o /dev/null {url} & sleep 0.5; kill -9 $!; wait; sleep 0.2; curl -s -o /dev/null {url}"
    );
    let o = ferry_run(
        &["--stats-json", stats.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    assert!(o.status.success(), "{}", text(&o));
    let json = std::fs::read_to_string(&stats).unwrap();
    assert!(
        json.contains("\"open_at_stop\":0,"),
        "sockets left open: {json}"
    );
    assert!(json.contains("\"bad_channels\":0,"), "{json}");
    // Both fetches had their own socket, and the second one got the whole file.
    let ins: Vec<u64> = json
        .split("\"bytes_in\":")
        .skip(1)
        .filter_map(|t| t.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect();
    assert!(ins.len() >= 2, "{json}");
    assert!(ins.iter().any(|&n| n > 64 << 20), "{json}");
    assert!(
        ins.iter().any(|&n| n > 0 && n < 64 << 20),
        "the killed fetch was under way: {json}"
    );
}

#[test]
fn names_resolve_through_the_dns_forwarder() {
    if !can_run(&["getent", "curl", "nginx", "ip"]) {
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
    let r = remote("dns");
    let ip = r.remote_ip();
    remote_nameserver(&r);
    let dir = TempDir::new("dns");
    std::fs::write(dir.path().join("hello.txt"), "resolved").unwrap();
    let _nginx = remote_nginx(&r, dir.path(), dir.path(), 8084);
    let upstream = format!("{ip}:53");
    let stats = dir.path().join("stats.json");
    // `getent` (with `env` before it) resolves `name` to the responder's address, and
    // the server's counter `counter` is not 0.
    let resolves = |env: &[&str], name: &str, counter: &str| {
        let cmd: Vec<&str> = ["env"]
            .iter()
            .chain(env)
            .chain(&["getent", "ahostsv4", name])
            .copied()
            .collect();
        let o = ferry_run(
            &["--dns", &upstream, "--stats-json", stats.to_str().unwrap()],
            &cmd,
        );
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).starts_with(&format!("{ip} ")),
            "{}",
            text(&o)
        );
        let json = std::fs::read_to_string(&stats).unwrap();
        // The protocol servers' total (the NIC servers have DNS counters of their own).
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(v[counter].as_u64().unwrap_or(0) > 0, "{json}");
    };
    resolves(&[], "web.ferry.test", "dns_answers");
    // A real client by name, end to end.
    let url = "http://web.ferry.test:8084/hello.txt";
    let o = ferry_run(&["--dns", &upstream], &["curl", "-sS", "--fail", url]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "resolved",
        "{}",
        text(&o)
    );
    // Over TCP (glibc's `use-vc`, as for an answer too big for UDP).
    resolves(&["RES_OPTIONS=use-vc"], "tcp.ferry.test", "dns_tcp");
    // With DNS off the name does not resolve.
    let o = ferry_run(&["--dns", "off"], &["getent", "ahostsv4", "web.ferry.test"]);
    assert!(!o.status.success(), "{}", text(&o));
}

/// A small server for the sandbox: answers each of `count` HTTP requests on port 80
/// with the raw bytes of `file` (no header: a module adds one) in uneven pieces, then
/// closes the connection.
const RAW_SERVER: &str = r#"
import socket, sys
data = open(sys.argv[1], 'rb').read()
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('0.0.0.0', 80))
l.listen(8)
for _ in range(int(sys.argv[2])):
    c, _ = l.accept()
    req = b''
    while b'\r\n\r\n' not in req:
        got = c.recv(4096)
        if not got:
            break
        req += got
    for i in range(0, len(data), 50001):
        c.sendall(data[i:i + 50001])
    c.close()
"#;

fn example_module(name: &str) -> String {
    format!("{}/../modules/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn module_on_a_published_port_gzips_and_templates_a_programs_responses() {
    if !can_run(&["curl", "python3"]) {
        return;
    }
    let dir = TempDir::new("module");
    gzip_module_compresses_each_response(&dir);
    // template: {{name}} replaced on the way out, chunked.
    template_module_fills_in_the_names(&dir);
}

/// gzip: [`RAW_SERVER`] answers three requests on a published port with a page, the
/// gzip module compresses each; checks the bodies curl decompresses and the counters.
fn gzip_module_compresses_each_response(dir: &TempDir) {
    let mut page = Vec::new();
    for i in 0..30_000 {
        page.extend_from_slice(format!("{i}: ferry carries the module's bytes\n").as_bytes());
    }
    let file = dir.path().join("page.txt");
    std::fs::write(&file, &page).unwrap();
    let stats = dir.path().join("stats.json");
    let mut srv = raw_server_behind_gzip(&file, &stats);
    // The published port listens at once; the sandbox's listener may come later.
    for i in 0..3 {
        let o = Command::new("curl")
            .args(["-sS", "--fail", "--compressed", "-D", "-", "-o"])
            .arg(dir.path().join("got"))
            .args(["-m", "10", "--retry", "5", "--retry-connrefused"])
            .arg("http://127.0.0.1:18281/")
            .output()
            .unwrap();
        assert!(o.status.success(), "curl {i}: {}", text(&o));
        let head = String::from_utf8_lossy(&o.stdout);
        assert!(head.contains("Content-Encoding: gzip"), "{head}");
        let got = std::fs::read(dir.path().join("got")).unwrap();
        assert!(
            got == page,
            "curl {i}: decompressed body differs ({} bytes)",
            got.len()
        );
    }
    let status = srv.0.wait().unwrap();
    assert!(status.success());
    let json = std::fs::read_to_string(&stats).unwrap();
    assert!(json.contains("\"modules_started\":3"), "{json}");
    assert!(json.contains("\"modules_failed\":0"), "{json}");
    let wire: f64 = json
        .split("\"module_bytes_out\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next()?.parse().ok())
        .unwrap_or(0.0);
    assert!(
        wire > 0.0 && wire < page.len() as f64 / 3.0,
        "{wire} bytes on the wire"
    );
}

/// ferry running [`RAW_SERVER`] (three requests for `file`) with its port 80 published
/// on 127.0.0.1:18281 through the gzip module; counters to `stats`.
fn raw_server_behind_gzip(file: &std::path::Path, stats: &std::path::Path) -> Guard {
    let gz = format!(
        "80={},http=1,content-type=text/plain",
        example_module("gzip.wat")
    );
    let mut srv = ferry();
    srv.args([
        "run",
        "-p",
        "127.0.0.1:18281:80",
        // Not a test of the callback deadline (the module tests are): a loaded
        // machine must not stop the module.
        "--module-deadline",
        "1s",
        "--module",
        &gz,
        "--stats-json",
    ])
    .arg(stats)
    .args(["--", "python3", "-c", RAW_SERVER])
    .arg(file)
    .arg("3");
    Guard(quiet(&mut srv).spawn().unwrap())
}

/// template: [`RAW_SERVER`] answers one request with a template, the template module
/// fills in the names it was given and leaves the others; checks what curl gets.
fn template_module_fills_in_the_names(dir: &TempDir) {
    let tpl = dir.path().join("page.tpl");
    std::fs::write(
        &tpl,
        "Hello {{who}}, from {{where}} and {{nobody}}.\n".repeat(1000),
    )
    .unwrap();
    let spec = format!(
        "80={},http=1,who=curl,where=the sandbox",
        example_module("template.wat")
    );
    let mut srv = ferry();
    srv.args(["run", "-p", "127.0.0.1:18282:80", "--module-deadline", "1s"])
        .args(["--module", &spec, "--"])
        .args(["python3", "-c", RAW_SERVER])
        .arg(&tpl)
        .arg("1");
    let _srv = Guard(quiet(&mut srv).spawn().unwrap());
    let o = Command::new("curl")
        .args([
            "-sS",
            "--fail",
            "-m",
            "10",
            "--retry",
            "5",
            "--retry-connrefused",
        ])
        .arg("http://127.0.0.1:18282/")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let want = "Hello curl, from the sandbox and {{nobody}}.\n".repeat(1000);
    assert!(o.stdout == want.as_bytes(), "{}", text(&o));
}

#[test]
fn module_option_errors_are_clear() {
    let dir = TempDir::new("module-err");
    let bad = dir.path().join("bad.wat");
    std::fs::write(&bad, "(module (import \"env\" \"x\" (func)))").unwrap();
    let missing = dir.path().join("missing.wasm");
    for (spec, publish, want) in [
        (
            format!("80={}", missing.display()),
            "18283:80",
            "cannot read",
        ),
        (format!("80={}", bad.display()), "18283:80", "bad module"),
        (
            format!("81={}", example_module("gzip.wat")),
            "18283:80",
            "no TCP port 81 is published",
        ),
        ("80".to_string(), "18283:80", "PORT=FILE"),
    ] {
        let o = ferry_run(&["-p", publish, "--module", &spec], &["true"]);
        assert_eq!(
            o.status.code(),
            Some(if spec == "80" { 2 } else { 125 }),
            "{spec}: {}",
            text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(want),
            "{spec}: {}",
            text(&o)
        );
    }
}

#[test]
fn module_on_a_destination_gzips_what_the_program_sends() {
    if !can_run(&["python3", "gzip", "ip"]) {
        return;
    }
    let r = remote("module-dest");
    let l = r
        .run_in(|| std::net::TcpListener::bind((r.remote_ip(), 9400)).unwrap())
        .unwrap();
    let sink = std::thread::spawn(move || {
        use std::io::Read;
        let (mut c, _) = l.accept().unwrap();
        let mut all = Vec::new();
        c.read_to_end(&mut all).unwrap();
        all
    });
    let mut body = String::new();
    for i in 0..20_000 {
        body.push_str(&format!("{i} bytes leave the sandbox compressed\n"));
    }
    let dir = TempDir::new("module-dest");
    let file = dir.path().join("text");
    std::fs::write(&file, &body).unwrap();
    let spec = format!("{}:9400={}", r.remote_ip(), example_module("gzip.wat"));
    let script = "import socket, sys\n\
                  d = open(sys.argv[1], 'rb').read()\n\
                  s = socket.create_connection((sys.argv[2], 9400))\n\
                  s.sendall(d)\n\
                  s.shutdown(socket.SHUT_WR)\n\
                  s.recv(1)\n";
    let o = ferry_run(
        &["--module-deadline", "1s", "--module", &spec],
        &[
            "python3",
            "-c",
            script,
            file.to_str().unwrap(),
            &r.remote_ip().to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let wire = sink.join().unwrap();
    assert!(
        wire.len() < body.len() / 3,
        "{} bytes on the wire",
        wire.len()
    );
    let gz = dir.path().join("wire.gz");
    std::fs::write(&gz, &wire).unwrap();
    let plain = Command::new("gzip").arg("-dc").arg(&gz).output().unwrap();
    assert!(plain.status.success(), "gzip -d: {}", text(&plain));
    assert!(plain.stdout == body.as_bytes(), "decompressed bytes differ");
}

/// Writes the shim cannot see (stdio's, a shell's builtins) reach the fd itself, that
/// is the readiness pair; the server sends them on, in order with the program's other
/// sends. A shell script speaks HTTP over bash's `/dev/tcp` (its `printf` builtin writes
/// through stdio), and awk uploads 6.9 MB through stdio: both as natively.
#[test]
fn shell_and_stdio_writes_reach_the_peer() {
    if !can_run(&["bash", "awk", "nginx", "ip"]) {
        return;
    }
    let r = remote("stdio");
    let dir = TempDir::new("stdio");
    std::fs::write(dir.path().join("hello.txt"), "over /dev/tcp\n").unwrap();
    let _nginx = remote_nginx(&r, dir.path(), dir.path(), 8085);
    let ip = r.remote_ip();
    let script = format!(
        "exec 3<>/dev/tcp/{ip}/8085; printf 'GET /hello.txt HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3; \
         cat <&3"
    );
    let native = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    // Bounded: before the pair was read, this hung.
    let ferry = ferry_run(&[], &["timeout", "30", "bash", "-c", &script]);
    assert!(ferry.status.success(), "{}", text(&ferry));
    let body = |o: &std::process::Output| {
        let t = String::from_utf8_lossy(&o.stdout).into_owned();
        t.split("\r\n\r\n").nth(1).map(str::to_owned)
    };
    assert_eq!(
        body(&native).as_deref(),
        Some("over /dev/tcp\n"),
        "{}",
        text(&native)
    );
    assert_eq!(body(&ferry), body(&native), "{}", text(&ferry));

    // A sink in the remote namespace: the bytes of each connection, in order.
    let sink = r
        .run_in(|| std::net::TcpListener::bind((ip, 9185)))
        .unwrap()
        .unwrap();
    let got = std::thread::spawn(move || {
        use std::io::Read;
        let (mut c, _) = sink.accept().unwrap();
        let mut v = Vec::new();
        c.read_to_end(&mut v).unwrap();
        v
    });
    let awk = "BEGIN { for (i = 0; i < 1000000; i++) print i }";
    let upload = format!("exec 3<>/dev/tcp/{ip}/9185; awk '{awk}' >&3; echo end >&3");
    let o = ferry_run(&[], &["timeout", "60", "bash", "-c", &upload]);
    assert!(o.status.success(), "{}", text(&o));
    let got = got.join().unwrap();
    let mut want = std::process::Command::new("awk")
        .arg(awk)
        .output()
        .unwrap()
        .stdout;
    want.extend_from_slice(b"end\n");
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the uploaded bytes differ");
}

const PEER_ECHO: &str = r#"
import socket, sys
l = socket.socket(socket.AF_INET6 if sys.argv[1] == "6" else socket.AF_INET)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("::" if sys.argv[1] == "6" else "0.0.0.0", 8080))
l.listen()
print("ready", flush=True)
for _ in range(2):
    c, peer = l.accept()
    c.sendall((peer[0] + "\n").encode())
    c.close()
"#;

#[test]
fn a_port_published_without_an_address_serves_both_families() {
    if !can_run(&["python3"]) {
        return;
    }
    use std::io::{BufRead, Read};
    for (fam, port) in [("4", 18282u16), ("6", 18283)] {
        let mut server = ferry()
            .args([
                "run",
                "-p",
                &format!("{port}:8080"),
                "--",
                "python3",
                "-c",
                PEER_ECHO,
                fam,
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(server.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let mut seen = Vec::new();
        for host in ["127.0.0.1", "::1"] {
            let mut c = std::net::TcpStream::connect((host, port)).unwrap();
            let mut peer = String::new();
            c.read_to_string(&mut peer).unwrap();
            seen.push(peer.trim().to_owned());
        }
        assert!(server.wait().unwrap().success());
        // An IPv6 listener sees each client as it is; an IPv4 one sees the IPv4 client's
        // address and, for the IPv6 client (which it could not have natively), 0.0.0.0.
        let want = if fam == "6" {
            ["::ffff:127.0.0.1", "::1"]
        } else {
            ["127.0.0.1", "0.0.0.0"]
        };
        assert_eq!(seen, want, "listener family {fam}");
    }
}

#[test]
fn proc_is_the_sandboxs_own() {
    if !can_run(&["sh"]) {
        return;
    }
    // /proc follows the sandbox's PID namespace: $$ names this shell there (with the
    // host's /proc it named some host process: `kthreadd` for pid 2).
    let o = ferry_run(
        &[],
        &[
            "sh",
            "-c",
            "echo $$; cat /proc/$$/comm; cut -d' ' -f1 /proc/self/stat",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[1], "sh", "{out}");
    // `cut` runs as a child of the shell: its pid is above the shell's.
    let (shell, cut): (u32, u32) = (lines[0].parse().unwrap(), lines[2].parse().unwrap());
    assert!(cut > shell && cut < 100, "{out}");
}

const SUBPROCESS_THEN_SIGNALS: &str = r#"
import os, signal, subprocess, time
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append("usr1"))
signal.signal(signal.SIGCHLD, lambda *a: got.append("chld"))
subprocess.run(["true"])
got.clear()
os.kill(os.getpid(), signal.SIGUSR1)
p = subprocess.Popen(["sleep", "0.1"])
time.sleep(0.5)
p.wait()
try:
    signal.raise_signal(signal.SIGINT)
    time.sleep(0.1)
    print("no KeyboardInterrupt")
except KeyboardInterrupt:
    got.append("int")
print(sorted(set(got)))
"#;

#[test]
fn a_python_program_keeps_its_signal_handlers_after_subprocesses() {
    if !can_run(&["python3"]) {
        return;
    }
    // Python's subprocess resets signal handlers in its vfork child: before, that reset
    // the parent's handlers too (SIGUSR1 and SIGCHLD swallowed, Ctrl-C ignored).
    let native = Command::new("python3")
        .args(["-c", SUBPROCESS_THEN_SIGNALS])
        .output()
        .unwrap();
    let o = ferry_run(&[], &["python3", "-c", SUBPROCESS_THEN_SIGNALS]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&native.stdout)
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "['chld', 'int', 'usr1']"
    );
}

/// CPU time (user + system, in clock ticks) process `pid` has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let f = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    f(11) + f(12)
}

#[test]
fn a_published_udp_port_neither_spins_nor_floods_the_log() {
    if !can_run(&["sleep"]) {
        return;
    }
    // Before, a datagram on a published UDP port made ferry try accept() in a busy loop:
    // 100% CPU and a log line each time (354k lines in 2.5 s).
    let child = ferry()
        .args(["run", "-p", "15354:5353/udp", "--", "sleep", "2"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_ticks(pid);
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..1000 {
        let _ = u.send_to(b"query", "127.0.0.1:15354");
    }
    std::thread::sleep(Duration::from_millis(700));
    let used = cpu_ticks(pid) - before;
    let o = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    // 1.2 s at 100% would be ~120 ticks; taking 1,000 datagrams costs a few.
    assert!(used < 30, "ferry used {used} ticks: {log}");
    assert!(log.lines().count() <= 3, "{log}");
}

const WILDCARD_CLIENTS: &str = r#"
import socket, sys
remote, tport, uport, fixed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def tcp(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.settimeout(5)
    s.connect((remote, tport))
    got = b""
    while len(got) < 1000:
        b = s.recv(4096)
        if not b:
            break
        got += b
    print("tcp", "fixed" if port else "any", len(got), s.getsockname()[1] == port if port else "-")
    s.close()
def udp(port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    u.bind(("0.0.0.0", port))
    u.settimeout(3)
    u.sendto(b"ping", (remote, uport))
    data, src = u.recvfrom(64)
    print("udp", "fixed" if port else "any", data.decode(), src[1] == uport)
    if port:
        # Ask the echo to have a stranger (another port of the remote) write to us:
        # natively it arrives; through ferry a socket holding a port it chose admits
        # only the peers it contacted.
        u.sendto(b"stranger", (remote, uport))
        u.settimeout(1)
        try:
            while True:
                data, src = u.recvfrom(64)
                print("udp got", data.decode(), "from echo" if src[1] == uport else "from a stranger")
        except socket.timeout:
            print("udp quiet")
tcp(0)
tcp(fixed)
udp(0)
udp(fixed + 1)
"#;

#[test]
fn clients_that_bind_the_wildcard_first_reach_the_network() {
    if !can_run(&["python3", "curl", "nginx", "ip"]) {
        return;
    }
    let r = remote("wild");
    let rip = r.remote_ip();
    // A TCP service that sends 1,000 bytes; a UDP echo that, asked "stranger", also
    // writes from another port.
    let l = r
        .run_in(|| std::net::TcpListener::bind((rip, 7201)).unwrap())
        .unwrap();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            use std::io::Write;
            let _ = c.write_all(&[7u8; 1000]);
        }
    });
    let (echo, stranger) = r
        .run_in(|| {
            (
                std::net::UdpSocket::bind((rip, 7202)).unwrap(),
                std::net::UdpSocket::bind((rip, 7203)).unwrap(),
            )
        })
        .unwrap();
    std::thread::spawn(move || {
        let mut b = [0u8; 64];
        while let Ok((n, from)) = echo.recv_from(&mut b) {
            let _ = echo.send_to(&b[..n], from);
            if &b[..n] == b"stranger" {
                let _ = stranger.send_to(b"intruder", from);
            }
        }
    });
    let run = |fixed: u16, through_ferry: bool| {
        let args = [
            rip.to_string(),
            "7201".into(),
            "7202".into(),
            fixed.to_string(),
        ];
        let mut cmd = vec!["python3", "-c", WILDCARD_CLIENTS];
        cmd.extend(args.iter().map(String::as_str));
        let o = if through_ferry {
            ferry_run(&[], &cmd)
        } else {
            Command::new(cmd[0]).args(&cmd[1..]).output().unwrap()
        };
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // Fixed ports below the ephemeral range, so no other test's connection holds them.
    let native = run(21100, false);
    let ferry = run(21200, true);
    // Before, every client here failed with ENETUNREACH (TCP, connected UDP) or lost its
    // datagram (unconnected UDP).
    assert_eq!(
        native,
        "tcp any 1000 -\ntcp fixed 1000 True\nudp any ping True\nudp fixed ping True\n\
         udp got stranger from echo\nudp got intruder from a stranger\nudp quiet\n"
    );
    assert_eq!(
        ferry,
        "tcp any 1000 -\ntcp fixed 1000 True\nudp any ping True\nudp fixed ping True\n\
         udp got stranger from echo\nudp quiet\n",
        "the same as natively, but for the stranger"
    );
    // curl --local-port binds the wildcard and a port of the range, then connects.
    let dir = TempDir::new("wild");
    std::fs::write(dir.path().join("x.bin"), pattern(70_000, 4)).unwrap();
    let _nginx = remote_nginx(&r, dir.path(), dir.path(), 8084);
    let url = format!("http://{rip}:8084/x.bin");
    let o = ferry_run(
        &[],
        &["curl", "-sS", "--fail", "--local-port", "42000-42100", &url],
    );
    assert!(o.stdout == pattern(70_000, 4), "{}", text(&o));
}

/// A UDP echo in the remote namespace at `ip:port` (answers each datagram with itself).
fn remote_udp_echo(r: &Remote, port: u16) {
    let ip = r.remote_ip();
    let echo = r
        .run_in(|| std::net::UdpSocket::bind((ip, port)).unwrap())
        .unwrap();
    std::thread::spawn(move || {
        let mut b = [0u8; 2048];
        while let Ok((n, from)) = echo.recv_from(&mut b) {
            let _ = echo.send_to(&b[..n], from);
        }
    });
}

/// Runs `sh -c script` natively and through ferry; both must succeed with the same
/// output, which is returned.
fn same_natively_and_through_ferry(script: &str) -> String {
    let native = Command::new("sh").args(["-c", script]).output().unwrap();
    let ferry = ferry_run(&[], &["sh", "-c", script]);
    assert!(native.status.success(), "native: {}", text(&native));
    assert!(ferry.status.success(), "ferry: {}", text(&ferry));
    assert_eq!(
        String::from_utf8_lossy(&ferry.stdout),
        String::from_utf8_lossy(&native.stdout),
        "ferry: {}",
        text(&ferry)
    );
    String::from_utf8_lossy(&native.stdout).into_owned()
}

#[test]
fn dig_asks_a_remote_nameserver_directly() {
    // dig binds the wildcard (port 0) before it sends: before, its query was lost and it
    // timed out ("no servers could be reached").
    if !can_run(&["dig", "ip"]) {
        return;
    }
    let r = remote("dig");
    let ip = r.remote_ip();
    remote_nameserver(&r);
    let out = same_natively_and_through_ferry(&format!(
        "dig +short +tries=1 +time=3 @{ip} web.ferry.test A; \
         dig +short +tries=1 +time=3 +tcp @{ip} tcp.ferry.test A"
    ));
    assert_eq!(out, format!("{ip}\n{ip}\n"));
}

#[test]
fn udp_clients_that_choose_their_port_reach_a_remote_echo() {
    // nc -u -p, socat's bind= and node's dgram (libuv binds before it sends) all bind
    // the wildcard first: before, their datagrams were dropped or ENETUNREACH.
    if !can_run(&["nc", "socat", "ip"]) {
        return;
    }
    let r = remote("udpcli");
    let ip = r.remote_ip();
    remote_udp_echo(&r, 7301);
    // Ports below the ephemeral range, a different one natively and through ferry (both
    // runs may hold theirs for a moment after they end).
    let script = |p: u16| {
        format!(
            "echo nc-says-hi | nc -u -w 2 -p {p} {ip} 7301 | head -c 10; echo; \
             echo socat-says-hi | socat -t 2 - UDP:{ip}:7301,bind=0.0.0.0:{} | head -c 13; echo",
            p + 1
        )
    };
    let native = Command::new("sh")
        .args(["-c", &script(21300)])
        .output()
        .unwrap();
    let ferry = ferry_run(&[], &["sh", "-c", &script(21400)]);
    assert!(native.status.success(), "native: {}", text(&native));
    assert_eq!(
        String::from_utf8_lossy(&native.stdout),
        "nc-says-hi\nsocat-says-hi\n",
        "native: {}",
        text(&native)
    );
    assert_eq!(
        String::from_utf8_lossy(&ferry.stdout),
        String::from_utf8_lossy(&native.stdout),
        "ferry: {}",
        text(&ferry)
    );
    if !have("node") {
        eprintln!("skipped the node part: node is not installed");
        return;
    }
    let js = format!(
        "const d = require('dgram').createSocket('udp4'); \
         d.on('message', (m, r) => {{ console.log(m.toString(), r.port); d.close(); }}); \
         d.send('node-says-hi', 7301, '{ip}');"
    );
    let out = same_natively_and_through_ferry(&format!("node -e \"{js}\""));
    assert_eq!(out, "node-says-hi 7301\n");
}

/// A UDP echo server for the sandbox: answers each datagram with it in capitals and
/// the source it came from.
const UDP_ECHO_SERVER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', int(sys.argv[1])))
print('ready', flush=True)
while True:
    d, a = s.recvfrom(65535)
    s.sendto(d.upper() + b' via ' + a[0].encode(), a)
"#;

#[test]
fn a_udp_echo_server_published_with_p_answers_host_clients() {
    if !can_run(&["python3"]) {
        return;
    }
    let dir = TempDir::new("udppub");
    let stats = dir.path().join("stats.json");
    let mut child = ferry()
        .args(["run", "-p", "15356:5353/udp", "--stats-json"])
        .arg(&stats)
        .args(["--", "python3", "-c", UDP_ECHO_SERVER, "5353"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready, "ready\n");
    // More clients than a port keeps flows for (256): the oldest make room, and every
    // client gets its own answer, from the published address. Both families.
    let mut answered = 0;
    for i in 0..300u32 {
        let (bind, to) = if i % 2 == 0 {
            ("127.0.0.1:0", "127.0.0.1:15356")
        } else {
            ("[::1]:0", "[::1]:15356")
        };
        let c = std::net::UdpSocket::bind(bind).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let msg = format!("client {i}");
        c.send_to(msg.as_bytes(), to).unwrap();
        let mut b = [0u8; 128];
        let (n, from) = c.recv_from(&mut b).unwrap();
        assert_eq!(from.to_string(), to);
        assert_eq!(
            String::from_utf8_lossy(&b[..n]),
            format!("CLIENT {i} via 127.0.0.1")
        );
        answered += 1;
    }
    assert_eq!(answered, 300);
    // A large datagram both ways.
    let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let big = vec![b'x'; 60_000];
    c.send_to(&big, "127.0.0.1:15356").unwrap();
    let mut b = vec![0u8; 65_536];
    let (n, _) = c.recv_from(&mut b).unwrap();
    assert_eq!(n, 60_000 + " via 127.0.0.1".len());
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    let json = std::fs::read_to_string(&stats).unwrap_or_default();
    assert!(
        json.contains("\"udp_published_in\":301,") && json.contains("\"udp_published_out\":301,"),
        "{json} {}",
        text(&o)
    );
}

#[test]
fn a_published_port_that_nothing_in_the_sandbox_serves_refuses_instead_of_hanging() {
    // A server the shim cannot reach (here: a Python without it; a static or Go binary
    // alike) listens on the sandbox's port itself. Before, ferry accepted the host's
    // connection and held it forever, waiting for a listener of its own: the client hung.
    if !can_run(&["python3", "env"]) {
        return;
    }
    let server = "import socket\nl = socket.socket()\nl.bind(('127.0.0.1', 8080))\nl.listen()\nprint('ready', flush=True)\nwhile True:\n    l.accept()[0].send(b'unreachable')\n";
    let mut child = ferry()
        .args(["run", "-p", "127.0.0.1:18291:8080", "--"])
        .args(["env", "-u", "LD_PRELOAD", "python3", "-c", server])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready, "ready\n");
    let t = std::time::Instant::now();
    let mut c = std::net::TcpStream::connect("127.0.0.1:18291").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut b = [0u8; 16];
    let got = std::io::Read::read(&mut c, &mut b);
    let waited = t.elapsed();
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{got:?} after {waited:?}: {log}"
    );
    assert!(waited < Duration::from_secs(5), "refused after {waited:?}");
    assert!(
        log.contains("published port 8080: nothing in the sandbox listens on port 8080"),
        "{log}"
    );
}

/// A python HTTP server that also listens on loopback (private): serves until a line on
/// stdin, closes its listener, and exits at a second line. Arguments: root, port,
/// loopback port.
const HTTP_SERVER: &str = r#"
import functools, http.server, socket, sys, threading
root, port, lo = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
srv = http.server.ThreadingHTTPServer(("", port), h)
private = socket.socket()
private.bind(("127.0.0.1", lo))
private.listen()
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("up", flush=True)
sys.stdin.readline()
srv.shutdown()
srv.server_close()
print("closed", flush=True)
sys.stdin.readline()
"#;

/// GET `path` from the host's loopback on `port`: the body, or why not.
fn http_get(port: u16, path: &str) -> Result<Vec<u8>, String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(c, "GET {path} HTTP/1.0\r\n\r\n").map_err(|e| e.to_string())?;
    let mut all = Vec::new();
    c.read_to_end(&mut all).map_err(|e| e.to_string())?;
    let at = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no header in {} bytes", all.len()))?;
    if !all.starts_with(b"HTTP/1.0 200") {
        return Err(String::from_utf8_lossy(&all[..at]).into_owned());
    }
    Ok(all[at + 4..].to_vec())
}

/// A TCP port nothing on the host listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The server's stdout's next line (its own, not ferry's).
fn next_line(r: &mut impl std::io::BufRead) -> String {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    l.trim().to_owned()
}

/// A server script run under `pre` (empty: natively) that prints "up" once serving,
/// closes at a line on stdin (printing "closed") and exits at a second line.
struct Script {
    cmd: Vec<String>,
    proc: Guard,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Script {
    fn start(pre: &[&str], script: &str, args: &[String]) -> Script {
        use std::process::Stdio;
        let mut cmd: Vec<String> = pre.iter().map(|s| s.to_string()).collect();
        cmd.extend([system_python(), "-c", script].map(str::to_owned));
        cmd.extend(args.iter().cloned());
        let child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut proc = Guard(child);
        let mut out = std::io::BufReader::new(proc.0.stdout.take().unwrap());
        assert_eq!(next_line(&mut out), "up", "{cmd:?}");
        Script { cmd, proc, out }
    }

    /// Has the server close its sockets.
    fn close(&mut self) {
        use std::io::Write;
        writeln!(self.proc.0.stdin.as_mut().unwrap()).unwrap();
        assert_eq!(next_line(&mut self.out), "closed", "{:?}", self.cmd);
    }

    /// Has the server exit, which must be a success.
    fn end(mut self) {
        use std::io::Write;
        writeln!(self.proc.0.stdin.as_mut().unwrap()).unwrap();
        let status = self.proc.0.wait().unwrap();
        assert!(status.success(), "{:?}: {status}", self.cmd);
    }
}

/// Waits up to `within` for `done`, else fails saying `what`.
fn within(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what} after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loopback port of the server's: reached only natively (`r` then its answer),
/// refused through ferry, which publishes no loopback listener or receiver.
fn loopback_only_natively<T>(native: bool, r: std::io::Result<T>, what: &str) -> Option<T> {
    if native {
        return Some(r.unwrap_or_else(|e| panic!("{what}: {e}")));
    }
    let e = r
        .err()
        .unwrap_or_else(|| panic!("{what}: reached through ferry"));
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{what}");
    None
}

/// Runs [`HTTP_SERVER`] under `pre` (empty: natively): fetches `/blob` from the host
/// once it is up, then checks that the loopback port is reachable only natively and,
/// after the server closed its listener, that the port is withdrawn (refused within
/// 3 s).
fn serve_and_withdraw(pre: &[&str], root: &std::path::Path) -> Vec<u8> {
    let (port, lo) = (free_port(), free_port());
    let args = [root.display().to_string(), port.to_string(), lo.to_string()];
    let mut server = Script::start(pre, HTTP_SERVER, &args);
    let cmd = server.cmd.clone();
    let mut body = None;
    within(
        Duration::from_secs(10),
        &format!("{cmd:?}: port {port} never served from the host"),
        || {
            body = http_get(port, "/blob").ok();
            body.is_some()
        },
    );
    // Published within a scan: a loopback listener would have been too by now.
    std::thread::sleep(Duration::from_millis(600));
    let private = std::net::TcpStream::connect(("127.0.0.1", lo));
    loopback_only_natively(
        pre.is_empty(),
        private,
        &format!("{cmd:?}: loopback port {lo}"),
    );
    server.close();
    let closed = format!("{cmd:?}: port {port} still published after its listener closed");
    within(Duration::from_secs(3), &closed, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
    });
    server.end();
    body.unwrap()
}

/// `--net socket --publish-auto`: the port a shim's listener is on (python's http.server
/// on the wildcard) is served from the host as natively, a loopback listener is not
/// published, and the port is withdrawn once the listener closes.
#[test]
fn socket_mode_publishes_what_python_listens_on_and_withdraws_it() {
    if !can_run(&["ip"]) {
        return;
    }
    let dir = TempDir::new("autopub-socket");
    let blob = pattern(300_000, 7);
    std::fs::write(dir.path().join("blob"), &blob).unwrap();
    let native = serve_and_withdraw(&[], dir.path());
    assert_eq!(native, blob);
    let ferry = env!("CARGO_BIN_EXE_ferry");
    let through = serve_and_withdraw(
        &[ferry, "run", "--net", "socket", "--publish-auto", "--"],
        dir.path(),
    );
    assert_eq!(through.len(), native.len());
    assert!(
        through == native,
        "the bytes through ferry differ from native"
    );
}

/// A python UDP echo server on the wildcard and on loopback (private), each answering
/// every datagram to its sender: serves until a line on stdin, closes both sockets,
/// and exits at a second line. Arguments: port, loopback port.
const UDP_ECHO: &str = r#"
import socket, sys, threading
port, lo = int(sys.argv[1]), int(sys.argv[2])
stop = threading.Event()
def serve(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(addr)
    s.settimeout(0.05)
    def loop():
        while not stop.is_set():
            try:
                d, a = s.recvfrom(65535)
            except socket.timeout:
                continue
            s.sendto(b"echo " + d, a)
        s.close()
    t = threading.Thread(target=loop)
    t.start()
    return t
ts = [serve(("", port)), serve(("127.0.0.1", lo))]
print("up", flush=True)
sys.stdin.readline()
stop.set()
for t in ts:
    t.join()
print("closed", flush=True)
sys.stdin.readline()
"#;

/// Sends `msg` to the host's loopback `port` from a connected UDP socket: the answer,
/// or the error of the one receive (a port with no socket is refused).
fn udp_ask(port: u16, msg: &str) -> std::io::Result<Vec<u8>> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
    s.connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_millis(300)))?;
    s.send(msg.as_bytes())?;
    let mut b = [0u8; 256];
    let n = s.recv(&mut b)?;
    Ok(b[..n].to_vec())
}

/// A UDP port nothing on the host uses now.
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `--publish-auto` with UDP, in socket mode and with the TAP beside (`both`): the port
/// a program receives on (on the wildcard) answers from the host as natively, one on
/// loopback is not published, and the port is withdrawn (refused) once the socket is
/// closed.
#[test]
fn publish_auto_serves_what_a_udp_program_receives_on_and_withdraws_it() {
    if !can_run(&["ip"]) {
        return;
    }
    let ferry = env!("CARGO_BIN_EXE_ferry");
    let socket = [ferry, "run", "--net", "socket", "--publish-auto", "--"];
    let both = [ferry, "run", "--net", "both", "--publish-auto", "--"];
    for pre in [&[][..], &socket[..], &both[..]] {
        let (port, lo) = (free_udp_port(), free_udp_port());
        let mut server = Script::start(pre, UDP_ECHO, &[port.to_string(), lo.to_string()]);
        let what = format!("{pre:?}: UDP port {port}");
        let mut got = None;
        within(
            Duration::from_secs(10),
            &format!("{what} never answered"),
            || {
                got = udp_ask(port, "ping").ok();
                got.is_some()
            },
        );
        assert_eq!(got.unwrap(), b"echo ping", "{what}");
        // The same client address gets every answer, in order.
        for i in 0..20 {
            let m = format!("datagram {i}");
            let a = udp_ask(port, &m).unwrap_or_else(|e| panic!("{what}: {m}: {e}"));
            assert_eq!(a, format!("echo {m}").as_bytes(), "{what}");
        }
        // Published within a scan: a loopback receiver would have been too by now.
        std::thread::sleep(Duration::from_millis(600));
        let private = udp_ask(lo, "private");
        let what_lo = format!("{what}: loopback port {lo}");
        if let Some(a) = loopback_only_natively(pre.is_empty(), private, &what_lo) {
            assert_eq!(a, b"echo private");
        }
        server.close();
        let gone = format!("{what} still answers after its socket closed");
        within(
            Duration::from_secs(3),
            &gone,
            || matches!(udp_ask(port, "late"), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        );
        server.end();
    }
}
