//! Several protocol servers (S4): sockets really land on different servers, every byte
//! arrives, and a server moved to another CPU mid-transfer loses nothing. The live
//! counters (`ferry ctl stats`) also show when a server lets a socket go.

mod common;
use common::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn text(o: &std::process::Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stats(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn servers(v: &Value) -> &Vec<Value> {
    v["servers"].as_array().expect("servers in the stats")
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// nginx in a remote namespace serving `files` (name, length, seed) on `port`.
fn nginx(r: &Remote, dir: &TempDir, port: u16, files: &[(&str, usize, u32)]) -> Guard {
    for (name, len, seed) in files {
        std::fs::write(dir.path().join(name), pattern(*len, *seed)).unwrap();
    }
    remote_nginx(r, dir.path(), dir.path(), port)
}

#[test]
fn round_robin_puts_sockets_on_every_server_and_the_bytes_match() {
    if !can_run(&["curl", "nginx", "ip"]) {
        return;
    }
    let r = remote("srv-rr");
    let dir = TempDir::new("srv-rr");
    let _nginx = nginx(&r, &dir, 8090, &[("a.bin", 1 << 20, 7)]);
    let url = format!("http://{}:8090/a.bin", r.remote_ip());
    // Six separate fetches: six sockets, assigned in turn.
    let script = format!("for i in 1 2 3 4 5 6; do curl -sS --fail {url}; done");
    let js = dir.path().join("stats.json");
    let o = ferry_run(
        &[
            "--servers",
            "2",
            "--assign",
            "rr",
            "--stats-json",
            js.to_str().unwrap(),
        ],
        &["sh", "-c", &script],
    );
    assert!(o.status.success(), "{}", text(&o));
    let want = pattern(1 << 20, 7).repeat(6);
    assert!(o.stdout == want, "got {} bytes", o.stdout.len());
    let v = stats(&js);
    let each = servers(&v);
    assert_eq!(each.len(), 2, "{v}");
    assert_eq!(num(&v, "open_at_stop"), 0, "{v}");
    for s in each {
        // Every server carried whole fetches: at least two of the six.
        assert!(num(s, "bytes_in") >= 2 << 20, "{s}");
        assert!(s["sockets"].as_array().unwrap().len() >= 2, "{s}");
    }
    // Sockets are created through the first server; those for the second are handed over.
    assert_eq!(num(&each[0], "sockets_created"), 6, "{v}");
    assert_eq!(
        num(&each[0], "sockets_handed"),
        num(&each[1], "sockets_adopted")
    );
    assert!(num(&each[1], "sockets_adopted") >= 2, "{v}");
    // A socket's id names its server (low bits), and each server reports only its own.
    for (k, s) in each.iter().enumerate() {
        for sock in s["sockets"].as_array().unwrap() {
            assert_eq!(num(sock, "id") % 16, k as u64, "{sock} on server {k}");
        }
    }
}

#[test]
fn parallel_connections_are_spread_by_least_outstanding() {
    if !can_run(&["iperf3", "ip"]) {
        return;
    }
    let r = remote("srv-least");
    let _srv = Guard(
        quiet(&mut r.command("iperf3"))
            .args(["-s", "-p", "5210"])
            .spawn()
            .unwrap(),
    );
    wait_port(r.remote_ip(), 5210);
    let dir = TempDir::new("srv-least");
    let js = dir.path().join("stats.json");
    let ip = r.remote_ip().to_string();
    let o = ferry_run(
        &["--servers", "2", "--stats-json", js.to_str().unwrap()],
        &[
            "iperf3", "-c", &ip, "-p", "5210", "-t", "1", "-P", "4", "-J",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let v = stats(&js);
    for s in servers(&v) {
        assert!(
            num(s, "bytes_out") > 1 << 20,
            "both servers carry data connections: {s}"
        );
    }
}

/// The admin socket of the `ferry run` with process id `pid`.
fn ctl(pid: u32, args: &[&str]) -> std::process::Output {
    ferry()
        .arg("ctl")
        .args(["--run", &pid.to_string()])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn moving_a_server_mid_transfer_loses_nothing() {
    if !can_run(&["curl", "nginx", "ip"]) {
        return;
    }
    let r = remote("srv-move");
    let dir = TempDir::new("srv-move");
    let len = 96 << 20;
    let _nginx = nginx(&r, &dir, 8091, &[("big.bin", len, 11)]);
    let url = format!("http://{}:8091/big.bin", r.remote_ip());
    let out = dir.path().join("got.bin");
    // Throttled so that the moves happen while bytes flow.
    let child = ferry()
        .args(["run", "--servers", "2", "--cpus", "0", "--"])
        .args(["curl", "-sS", "--fail", "--limit-rate", "48M", "-o"])
        .arg(&out)
        .arg(&url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut child = Guard(child);
    let start = Instant::now();
    let mut moves = 0;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    loop {
        if let Ok(Some(_)) = child.0.try_wait() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "transfer hangs");
        let o = ctl(
            pid,
            &[
                "move",
                &format!("proto-{}", moves % 2),
                &format!("{}", (moves / 2) % cpus),
            ],
        );
        if o.status.success() {
            assert!(
                String::from_utf8_lossy(&o.stdout).starts_with("ok: "),
                "{}",
                text(&o)
            );
            moves += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = child.0.wait().unwrap();
    assert!(status.success(), "curl through ferry failed");
    assert!(
        moves >= 10,
        "only {moves} moves happened during the transfer"
    );
    let got = std::fs::read(&out).unwrap();
    assert_eq!(got.len(), len);
    assert!(
        got == pattern(len, 11),
        "the bytes differ after {moves} moves"
    );
}

#[test]
fn ctl_shows_every_server_live_and_rejects_bad_requests() {
    if !can_run(&["ip"]) {
        return;
    }
    let child = ferry()
        .args([
            "run",
            "--servers",
            "3",
            "--nic-servers",
            "2",
            "--",
            "sleep",
            "5",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _child = Guard(child);
    // The admin socket appears once the servers run.
    let t = Instant::now();
    let table = loop {
        let o = ctl(pid, &["stats"]);
        if o.status.success() {
            break String::from_utf8(o.stdout).unwrap();
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{}", text(&o));
        std::thread::sleep(Duration::from_millis(50));
    };
    for k in 0..3 {
        assert!(table.contains(&format!("proto-{k} ")), "{table}");
    }
    // The NIC servers of the sandbox's TAP (--net both, the default) beside them.
    let nics = std::path::Path::new("/dev/net/tun").exists();
    for k in 0..2 {
        assert_eq!(table.contains(&format!("nic-{k} ")), nics, "{table}");
    }
    let o = ctl(pid, &["stats", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), if nics { 5 } else { 3 }, "{v}");
    if nics {
        let o = ctl(pid, &["move", "nic-1", "0"]);
        assert!(o.status.success(), "{}", text(&o));
        let o = ctl(pid, &["stats", "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v[4]["server"].as_str(), Some("nic-1"), "{v}");
        assert_eq!(v[4]["pinned"].as_i64(), Some(0), "{v}");
        let o = ctl(pid, &["move", "nic-7", "0"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    }
    let o = ctl(pid, &["move", "proto-7", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no server 7"),
        "{}",
        text(&o)
    );
    let o = ctl(pid, &["move", "proto-1", "4096"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not available"),
        "{}",
        text(&o)
    );
    let o = ctl(pid, &["move", "1", "0"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = ctl(pid, &["stats", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[1]["pinned"].as_i64(), Some(0), "{v}");
}

#[test]
fn bad_server_options_are_refused() {
    for (args, code, msg) in [
        (&["--servers", "0"][..], 2, "--servers"),
        (&["--servers", "17"][..], 2, "--servers"),
        (&["--cpus", "x"][..], 2, "not a CPU number"),
        (&["--cpus", "4000"][..], 2, "not a CPU number"),
        (&["--assign", "random"][..], 2, "least, rr or hash"),
        (&["--accepted", "x"][..], 2, "assign or listener"),
    ] {
        let o = ferry_run(args, &["true"]);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(msg),
            "{args:?}: {}",
            text(&o)
        );
    }
    if is_root() {
        let o = ferry_run(&["--cpus", "1000"], &["true"]);
        assert_eq!(o.status.code(), Some(125), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("CPU 1000 is not available"));
    }
    let o = ferry()
        .args(["ctl", "--run", "1", "stats"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no running `ferry run` with pid 1"));
    let _ = Command::new("true").status();
}

/// nginx inside the sandbox, published, two servers; eight fetches from the host. Returns
/// each server's counters.
fn published_nginx_fetches(tag: &str, host_port: u16, accepted: &str) -> Vec<Value> {
    let dir = TempDir::new(tag);
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    let page = pattern(200_000, 13);
    std::fs::write(root.join("page.bin"), &page).unwrap();
    let conf = nginx_conf(dir.path(), &root, 80);
    let js = dir.path().join("stats.json");
    let publish = format!("127.0.0.1:{host_port}:80");
    let mut nginx = ferry();
    nginx.args([
        "run",
        "--servers",
        "2",
        "--assign",
        "rr",
        "--accepted",
        accepted,
    ]);
    nginx.args(["-p", &publish, "--stats-json", js.to_str().unwrap(), "--"]);
    nginx.args(["nginx", "-c", conf.to_str().unwrap()]);
    let mut nginx = Guard(quiet(&mut nginx).spawn().unwrap());
    wait_port("127.0.0.1".parse().unwrap(), host_port);
    let url = format!("http://127.0.0.1:{host_port}/page.bin");
    for _ in 0..8 {
        let o = Command::new("curl")
            .args(["-sS", "--fail", "-m", "10", &url])
            .output()
            .unwrap();
        assert!(o.stdout == page, "published nginx: {}", text(&o));
    }
    // SIGTERM reaches nginx through ferry; ferry then writes its counters.
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(nginx.0.id() as i32, libc::SIGTERM) };
    let _ = nginx.0.wait();
    servers(&stats(&js)).clone()
}

#[test]
fn accepted_connections_are_assigned_or_kept_on_the_listeners_server() {
    if !can_run(&["curl", "nginx"]) {
        return;
    }
    let page = 200_000u64;
    // Assigned: the eight connections are spread, so both servers send pages.
    for s in published_nginx_fetches("srv-acc-a", 18281, "assign") {
        assert!(num(&s, "bytes_out") >= 2 * page, "{s}");
    }
    // Kept on the listener's server: one server sends every page.
    let each = published_nginx_fetches("srv-acc-l", 18282, "listener");
    let out: Vec<u64> = each.iter().map(|s| num(s, "bytes_out")).collect();
    assert!(
        out.iter().any(|&b| b >= 8 * page) && out.iter().any(|&b| b < page),
        "{out:?}"
    );
}

/// A stream both of whose directions are shut (the peer's FIN, then the program's
/// `SHUT_WR`), kept open, duplicated, closed once, then closed for good; the program
/// waits for a line on stdin between.
const HUNG_UP: &str = r#"
import select, socket, sys
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
c = socket.create_connection(l.getsockname()); s, _ = l.accept()
c.close()
p = select.poll(); p.register(s, select.POLLIN | select.POLLRDHUP)
assert p.poll(5000)
s.shutdown(socket.SHUT_WR)
p = select.poll(); p.register(s, select.POLLIN)
ev = p.poll(5000)
print("hup", bool(ev and ev[0][1] & select.POLLHUP), flush=True)
print("still", s.getsockname()[0], s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), flush=True)
sys.stdin.readline()
d = s.dup(); s.close()
print("one closed", flush=True)
sys.stdin.readline()
d.close(); l.close()
print("closed", flush=True)
sys.stdin.readline()
"#;

/// The sockets column of `ferry ctl stats` for the run `pid` (its one server).
fn live_sockets(pid: u32) -> u64 {
    let o = ctl(pid, &["stats"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let row = out
        .lines()
        .find(|l| l.starts_with("proto-0"))
        .unwrap_or_else(|| panic!("no proto-0 row: {out}"));
    row.split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sockets column: {out}"))
}

/// Waits up to 5 s for the run `pid` to hold `want` sockets.
fn await_live_sockets(pid: u32, want: u64, what: &str) {
    let t = Instant::now();
    while live_sockets(pid) != want {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{what}: {} sockets, not {want}",
            live_sockets(pid)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ferry run -- python3 -c SCRIPT`, stdin and stdout piped: the script prints a line
/// at each step and waits for a line on stdin before the next.
struct Scripted {
    child: Guard,
    pid: u32,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Scripted {
    fn start(script: &str) -> Scripted {
        let mut child = ferry();
        child
            .args(["run", "--", "python3", "-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = Guard(child.spawn().unwrap());
        let pid = child.0.id();
        let stdin = child.0.stdin.take().unwrap();
        let stdout = child.0.stdout.take().unwrap();
        let lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        Scripted {
            child,
            pid,
            stdin,
            lines,
        }
    }

    /// The script's next line.
    fn line(&mut self) -> String {
        self.lines.next().expect("a line").unwrap()
    }

    /// Lets the script take its next step.
    fn step(&mut self) {
        std::io::Write::write_all(&mut self.stdin, b"\n").unwrap();
    }

    /// Lets the script end; it must exit with status 0.
    fn finish(mut self) {
        self.step();
        assert!(self.child.0.wait().unwrap().success());
    }
}

#[test]
fn a_hung_up_stream_polls_pollhup_and_is_let_go_once_closed() {
    // The kernel reports POLLHUP once both directions of a stream are shut; ferry
    // mirrors it by shutting both directions of the readiness pair. Its server's own end
    // then hangs up as well, which until then meant "the program has closed it": the
    // socket must stay while the program holds it and go once it does not.
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let mut run = Scripted::start(HUNG_UP);
    let pid = run.pid;
    assert_eq!(run.line(), "hup True");
    assert_eq!(run.line(), "still 127.0.0.1 0");
    // The listener and the hung-up stream (its peer has been let go).
    await_live_sockets(pid, 2, "the listener and the hung-up stream");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(live_sockets(pid), 2, "the open stream was let go");
    // Closing one of two descriptors keeps it.
    run.step();
    assert_eq!(run.line(), "one closed");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(live_sockets(pid), 2, "let go while a duplicate is open");
    run.step();
    assert_eq!(run.line(), "closed");
    await_live_sockets(pid, 0, "held after the program closed them");
    run.finish();
}

/// Non-blocking connects refused: one socket duplicated and closed twice, one made by a
/// child that exits without closing it; the program waits for a line on stdin between.
const REFUSED: &str = r#"
import os, select, socket, sys, time
d = socket.socket(); d.bind(("127.0.0.1", 0)); closed = d.getsockname(); d.close()
def refused():
    s = socket.socket(); s.setblocking(False); s.connect_ex(closed)
    p = select.poll(); p.register(s, select.POLLOUT)
    ev = p.poll(5000)
    return s, (ev[0][1] if ev else 0) & (select.POLLERR | select.POLLHUP)
s, ev = refused()
err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
p = select.poll(); p.register(s, select.POLLOUT)
for _ in range(100):
    then = p.poll(0)[0][1]
    if then & select.POLLOUT:
        break
    time.sleep(0.01)
print("revents", ev, "then", then, "error", err, flush=True)
sys.stdin.readline()
d = s.dup(); s.close()
print("one closed", flush=True)
sys.stdin.readline()
d.close()
print("closed", flush=True)
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    s, ev = refused()
    print("child", ev, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("child gone", flush=True)
sys.stdin.readline()
"#;

#[test]
fn a_refused_connect_polls_pollerr_and_is_let_go_once_closed() {
    // The kernel's socket reports POLLOUT|POLLERR|POLLHUP after a refused non-blocking
    // connect, and POLLOUT|POLLHUP once SO_ERROR has been read. ferry closes its end of
    // the pair to raise POLLERR on the program's: the socket must then stay while the
    // program holds it, and go when it closes it or dies holding it.
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let mut run = Scripted::start(REFUSED);
    let pid = run.pid;
    // (POLLOUT may come a moment after the error: see `Server::detach_pair`.)
    let (pollerr, pollhup) = (libc::POLLERR | libc::POLLHUP, libc::POLLOUT | libc::POLLHUP);
    assert_eq!(
        run.line(),
        format!(
            "revents {pollerr} then {pollhup} error {}",
            libc::ECONNREFUSED
        )
    );
    await_live_sockets(pid, 1, "the refused socket");
    run.step();
    assert_eq!(run.line(), "one closed");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(live_sockets(pid), 1, "let go while a duplicate is open");
    run.step();
    assert_eq!(run.line(), "closed");
    await_live_sockets(pid, 0, "closed by the program");
    run.step();
    assert_eq!(run.line(), format!("child {pollerr}"));
    assert_eq!(run.line(), "child gone");
    await_live_sockets(pid, 0, "held by a process that exited");
    run.finish();
}

/// A program that connects without blocking, sets `TCP_NODELAY` and then waits in
/// `epoll` (wrk, nginx's upstreams, every event loop) makes one round trip to the
/// server a connection, its `connect`: a stream whose received bytes come through its
/// fd needs no readiness token, so the shim sends no barrier after asking (each such
/// connection cost one request and one completion more), and `TCP_NODELAY` goes out
/// unanswered (one completion more). Read back from another thread, the option is the
/// value set last all the same (`getsockopt` asks for order first).
#[test]
fn an_event_loops_new_connection_waits_for_no_token_barrier() {
    if !can_run(&["ip", "python3"]) {
        return;
    }
    const N: usize = 40;
    let r = remote("nobarrier");
    let ip = r.remote_ip();
    let l = r
        .run_in(|| std::net::TcpListener::bind((ip, 7431)))
        .unwrap()
        .unwrap();
    let answer = std::thread::spawn(move || {
        use std::io::{Read, Write};
        for _ in 0..N {
            let (mut c, _) = l.accept().unwrap();
            let mut b = [0u8; 1];
            c.read_exact(&mut b).unwrap();
            c.write_all(&b).unwrap();
        }
    });
    let script = "import socket, select, sys\n\
        ip, n = sys.argv[1], int(sys.argv[2])\n\
        ep = select.epoll()\n\
        for i in range(n):\n\
        \x20   s = socket.socket()\n\
        \x20   s.setblocking(False)\n\
        \x20   s.connect_ex((ip, 7431))\n\
        \x20   s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n\
        \x20   ep.register(s.fileno(), select.EPOLLIN | select.EPOLLOUT)\n\
        \x20   while not any(e & select.EPOLLOUT for _, e in ep.poll(5)):\n\
        \x20       pass\n\
        \x20   ep.modify(s.fileno(), select.EPOLLIN)\n\
        \x20   s.send(b'x')\n\
        \x20   ep.poll(5)\n\
        \x20   assert s.recv(1) == b'x'\n\
        \x20   ep.unregister(s.fileno())\n\
        \x20   s.close()\n\
        import threading\n\
        s = socket.socket()\n\
        for i in range(200 if sys.argv[3:] == ['threads'] else 0):\n\
        \x20   t = threading.Thread(target=s.setsockopt, args=(socket.IPPROTO_TCP, socket.TCP_NODELAY, i % 2))\n\
        \x20   t.start()\n\
        \x20   t.join()\n\
        \x20   got = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)\n\
        \x20   assert bool(got) == bool(i % 2), (i, got)\n\
        print('done', n)\n";
    let dir = TempDir::new("nobarrier");
    let js = dir.path().join("stats.json");
    let o = ferry_run(
        &["--stats-json", js.to_str().unwrap()],
        &[
            system_python(),
            "-c",
            script,
            &ip.to_string(),
            &N.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    answer.join().unwrap();
    let v = stats(&js);
    let ch = v["channels"]
        .as_array()
        .and_then(|c| c.iter().find(|c| num(c, "requests") > 0))
        .unwrap_or_else(|| panic!("no channel made requests: {v}"));
    // Per connection: the connect (answered), the option, the token ask, the send (its
    // buffer comes back), the release. A barrier, or an answered option, would add a
    // completion each.
    let (req, cmp) = (num(ch, "requests"), num(ch, "completions"));
    eprintln!("{N} connections: {req} requests, {cmp} completions");
    assert!(
        req <= 5 * N as u64 + 10 && cmp <= 2 * N as u64 + 10,
        "{req} requests and {cmp} completions for {N} connections: a round trip more \
         than needed each"
    );
    // The option set by a thread that ended, read by the main thread: 200 times.
    let o = ferry_run(&[], &[system_python(), "-c", script, "", "0", "threads"]);
    assert!(o.status.success(), "{}", text(&o));
}
