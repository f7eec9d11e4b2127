//! Egress bonding end to end: a remote reached over two veth paths, nginx on a service
//! address of the remote's `lo`, curl through `ferry run --egress H0,H1 --bond MODE`, and
//! the remote's own interface counters to tell which path carried what.
//!
//! Routing: the host reaches the service address only by policy routing, one table per
//! path: `ip rule add from H_i table T_i` and `ip route add SERVICE via R_i table T_i`.
//! So a connection from H_i goes out over path i, and the remote's answers to H_i come
//! back over it too (H_i's subnet is path i's connected route there). A connection that
//! is not bound to one of the two addresses has no route at all.
//!
//! This is done in the test process's own namespace rather than in a dedicated "host"
//! namespace because the testbed's veths and ferry's protocol server both live in the
//! caller's namespace; the rules touch only packets from this test's own addresses (fresh
//! /30s no interface had), the tables are numbered per process and per test, and
//! [`PolicyRoutes`] deletes rules and tables on drop, also when an assertion fails.
//! (Deleting the veths would remove the routes anyway; the rules are what could stay.)

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::common::*;
use crate::text;
use ferry_server::{Bond, Mode};

/// Size of the file each fetch downloads.
const FILE_LEN: usize = 2 << 20;

/// `ip rule`s and routing tables, removed on drop.
struct PolicyRoutes {
    rules: Vec<(Ipv4Addr, u32)>,
}

impl PolicyRoutes {
    /// Routes `service` via `path.remote_ip` for packets from `path.host_ip`, per path.
    fn add(paths: &[ferry_sandbox::testbed::Path], service: Ipv4Addr) -> PolicyRoutes {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let mut routes = PolicyRoutes { rules: Vec::new() };
        for p in paths {
            // 0x4000_0000 + pid·64 + n: no other table, no other test of this process.
            let table = 0x4000_0000
                + (std::process::id() % 0x0100_0000) * 64
                + NEXT.fetch_add(1, Ordering::Relaxed) % 64;
            let (from, t) = (p.host_ip.to_string(), table.to_string());
            // Recorded first, so that a failure below still cleans up.
            routes.rules.push((p.host_ip, table));
            ip(&[
                "route",
                "add",
                &format!("{service}/32"),
                "via",
                &p.remote_ip.to_string(),
                "table",
                &t,
            ]);
            ip(&["rule", "add", "from", &from, "table", &t]);
        }
        routes
    }
}

impl Drop for PolicyRoutes {
    fn drop(&mut self) {
        for (from, table) in &self.rules {
            let t = table.to_string();
            let _ = Command::new("ip")
                .args(["rule", "del", "from", &from.to_string(), "table", &t])
                .output();
            let _ = Command::new("ip")
                .args(["route", "flush", "table", &t])
                .output();
        }
    }
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("run ip");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), text(&o));
}

/// nginx, stopped with SIGTERM on drop so that its master takes its workers along
/// (SIGKILL would leave them running in the deleted namespace).
struct Nginx(std::process::Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

/// A remote with two paths, nginx on `service:port` serving `big.bin`. (Fields drop in
/// order: nginx first, the namespace last.)
struct TwoPaths {
    _nginx: Nginx,
    _routes: PolicyRoutes,
    remote: Remote,
    service: Ipv4Addr,
    port: u16,
    dir: TempDir,
}

impl TwoPaths {
    fn new(tag: &str, port: u16) -> TwoPaths {
        let mut r = remote(tag);
        let (h1, r1) = free_subnet().expect("free subnet");
        r.add_path(h1, r1).expect("second path");
        // An address of a third fresh /30 as the service, on the remote's lo.
        let (_, service) = free_subnet().expect("free subnet");
        ip(&[
            "-n",
            r.name(),
            "addr",
            "add",
            &format!("{service}/32"),
            "dev",
            "lo",
        ]);
        let routes = PolicyRoutes::add(r.paths(), service);
        let dir = TempDir::new(tag);
        std::fs::write(dir.path().join("big.bin"), pattern(FILE_LEN, 7)).unwrap();
        let conf = nginx_conf(dir.path(), dir.path(), port);
        let nginx = Nginx(
            quiet(&mut r.command("nginx"))
                .args(["-c", conf.to_str().unwrap()])
                .spawn()
                .unwrap(),
        );
        let paths = TwoPaths {
            _nginx: nginx,
            _routes: routes,
            remote: r,
            service,
            port,
            dir,
        };
        // Reachable from each source address (each over its own path).
        for h in paths.sources() {
            wait_port_from(h, service, port);
        }
        paths
    }

    fn sources(&self) -> [Ipv4Addr; 2] {
        [
            self.remote.paths()[0].host_ip,
            self.remote.paths()[1].host_ip,
        ]
    }

    fn url(&self) -> String {
        format!("http://{}:{}/big.bin", self.service, self.port)
    }

    /// Bytes (received, sent) so far by each path's remote end.
    fn counters(&self) -> [(u64, u64); 2] {
        let read = |p: &ferry_sandbox::testbed::Path, what: &str| -> u64 {
            let f = format!("/sys/class/net/{}/statistics/{what}", p.remote_if);
            let o = self.remote.command("cat").arg(&f).output().unwrap();
            assert!(o.status.success(), "{f}: {}", text(&o));
            String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
        };
        let ps = self.remote.paths();
        [0, 1].map(|i| (read(&ps[i], "rx_bytes"), read(&ps[i], "tx_bytes")))
    }

    /// `--egress` naming the two host addresses.
    fn addrs(&self) -> String {
        let [h0, h1] = self.sources();
        format!("{h0},{h1}")
    }

    /// `--egress` naming the two host interfaces.
    fn interfaces(&self) -> String {
        let p = self.remote.paths();
        format!("{},{}", p[0].host_if, p[1].host_if)
    }

    /// Runs `script` under `ferry run --egress EGRESS --bond mode`; returns what each path
    /// carried meanwhile, (received, sent) by the remote, and the stats JSON.
    fn run(&self, egress: &str, mode: &str, script: &str) -> ([(u64, u64); 2], String) {
        self.run_with(&[], egress, mode, script)
    }

    /// [`TwoPaths::run`] with more options of `ferry run` (`--net nic`).
    fn run_with(
        &self,
        more: &[&str],
        egress: &str,
        mode: &str,
        script: &str,
    ) -> ([(u64, u64); 2], String) {
        let stats = self.dir.path().join(format!("stats-{mode}.json"));
        let before = self.counters();
        let mut opts = vec![
            "--egress",
            egress,
            "--bond",
            mode,
            "--stats-json",
            stats.to_str().unwrap(),
        ];
        opts.extend_from_slice(more);
        let o = ferry_run(&opts, &["bash", "-c", script]);
        assert!(o.status.success(), "--bond {mode}: {}", text(&o));
        let after = self.counters();
        let json = std::fs::read_to_string(&stats).unwrap();
        eprintln!("--bond {mode}: before {before:?} after {after:?}\n{json}");
        let delta = [0, 1].map(|i| (after[i].0 - before[i].0, after[i].1 - before[i].1));
        (delta, json)
    }

    /// `n` sequential fetches, each checked for the whole file.
    fn fetches(&self, n: usize) -> String {
        format!(
            "for i in $(seq {n}); do test \"$(curl -sS --fail {} | wc -c)\" = {FILE_LEN} || exit 1; done",
            self.url()
        )
    }
}

/// Waits until `to:port` accepts a TCP connection from source address `from`.
fn wait_port_from(from: Ipv4Addr, to: Ipv4Addr, port: u16) {
    let mut last = String::new();
    for _ in 0..100 {
        let o = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "--interface", &from.to_string()])
            .arg(format!("http://{to}:{port}/"))
            .output()
            .unwrap();
        if o.status.success() {
            return;
        }
        last = text(&o);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{to}:{port} not reachable from {from}: {last}");
}

/// Each path's share of the bytes the remote sent, and of those it received.
fn shares(d: &[(u64, u64); 2]) -> [(f64, f64); 2] {
    let rx = (d[0].0 + d[1].0).max(1) as f64;
    let tx = (d[0].1 + d[1].1).max(1) as f64;
    [0, 1].map(|i| (d[i].0 as f64 / rx, d[i].1 as f64 / tx))
}

/// The `connections` of each address in the stats JSON's `egress` list.
fn connections(json: &str) -> Vec<u64> {
    egress_counter(json, "connections")
}

/// One counter of each address in the stats JSON's `egress` list.
fn egress_counter(json: &str, key: &str) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_str(json).expect("stats are JSON");
    v["egress"]
        .as_array()
        .expect("egress in stats")
        .iter()
        .map(|e| e[key].as_u64().expect("a counter"))
        .collect()
}

#[test]
fn rr_spreads_connections_over_both_paths() {
    if !can_run(&["curl", "nginx", "ip", "bash"]) {
        return;
    }
    let t = TwoPaths::new("bondrr", 8091);
    let (d, json) = t.run(&t.addrs(), "rr", &t.fetches(8));
    let s = shares(&d);
    eprintln!("rr: per path (rx, tx) bytes {d:?}, shares {s:?}");
    for (i, (rx, tx)) in s.iter().enumerate() {
        assert!(
            *tx >= 0.25 && *rx >= 0.25,
            "path {i} carried too little: shares {s:?}, bytes {d:?}"
        );
    }
    // Both directions of every connection stayed on one path: the downloads (the
    // remote's tx) add up to 8 files, 4 per path.
    for (i, (_, tx)) in d.iter().enumerate() {
        assert!(*tx >= 4 * FILE_LEN as u64, "path {i} sent {tx}");
    }
    assert_eq!(connections(&json), [4, 4], "{json}");
    // ferry's own per-address byte counts agree: 4 files received over each.
    for (i, n) in egress_counter(&json, "bytes_in").iter().enumerate() {
        assert!(
            *n >= 4 * FILE_LEN as u64,
            "address {i} received {n}: {json}"
        );
    }
}

#[test]
fn nic_mode_bonds_its_flows_like_socket_mode() {
    if !can_run(&["curl", "nginx", "ip", "bash"]) {
        return;
    }
    // curl without the shim: its connections are the NIC server's flows, which take
    // their source from the same bond.
    let t = TwoPaths::new("bondnic", 8094);
    let (d, json) = t.run_with(&["--net", "nic"], &t.addrs(), "rr", &t.fetches(8));
    for (i, (_, tx)) in d.iter().enumerate() {
        assert!(*tx >= 4 * FILE_LEN as u64, "path {i} sent {tx}");
    }
    assert_eq!(connections(&json), [4, 4], "{json}");
    for (i, n) in egress_counter(&json, "bytes_in").iter().enumerate() {
        assert!(
            *n >= 4 * FILE_LEN as u64,
            "address {i} received {n}: {json}"
        );
    }
}

#[test]
fn xor_keeps_one_destination_on_one_path() {
    if !can_run(&["curl", "nginx", "ip", "bash"]) {
        return;
    }
    let t = TwoPaths::new("bondxor", 8092);
    // Interface names this time: each stands for its (one IPv4) address.
    let (d, json) = t.run(&t.interfaces(), "xor", &t.fetches(6));
    let s = shares(&d);
    eprintln!("xor: per path (rx, tx) bytes {d:?}, shares {s:?}");
    // The path is the one the bond's hash names for this destination.
    let [h0, h1] = t.sources();
    let bond = Bond::new(Mode::Xor, vec![IpAddr::V4(h0), IpAddr::V4(h1)]);
    let dst = SocketAddr::new(IpAddr::V4(t.service), t.port);
    let want = usize::from(bond.pick(dst) == Some(IpAddr::V4(h1)));
    assert!(
        s[want].1 >= 0.95 && s[want].0 >= 0.9,
        "path {want} should carry all: shares {s:?}, bytes {d:?}"
    );
    let mut conns = vec![0, 0];
    conns[want] = 6;
    assert_eq!(connections(&json), conns, "{json}");
}

#[test]
fn least_avoids_the_path_with_an_open_connection() {
    if !can_run(&["curl", "nginx", "ip", "bash"]) {
        return;
    }
    let t = TwoPaths::new("bondleast", 8093);
    // An idle connection held open on the first address (all equal: the first wins),
    // then fetches one at a time: each finds the second address emptier.
    let script = format!(
        "exec 3<>/dev/tcp/{}/{} || exit 1; {}; exec 3<&-",
        t.service,
        t.port,
        t.fetches(4)
    );
    let (d, json) = t.run(&t.addrs(), "least", &script);
    let s = shares(&d);
    eprintln!("least: per path (rx, tx) bytes {d:?}, shares {s:?}");
    assert!(
        s[1].1 >= 0.95 && s[1].0 >= 0.9,
        "path 1 should carry the fetches: shares {s:?}, bytes {d:?}"
    );
    assert_eq!(connections(&json), [1, 4], "{json}");
    // The same script with rr alternates: the fetches use both paths.
    let (d, json) = t.run(&t.addrs(), "rr", &script);
    assert_eq!(connections(&json), [3, 2], "{json}");
    assert!(d[0].1 >= 2 * FILE_LEN as u64, "rr: {d:?}");
}

#[test]
fn a_socket_the_program_bound_keeps_its_address() {
    if !can_run(&["curl", "nginx", "ip", "bash"]) {
        return;
    }
    let t = TwoPaths::new("bondown", 8096);
    let [_, h1] = t.sources();
    // rr would alternate; curl binds every socket to the second address itself.
    let script = format!(
        "for i in 1 2 3 4; do test \"$(curl -sS --fail --interface {h1} {} | wc -c)\" = {FILE_LEN} || exit 1; done",
        t.url()
    );
    let (d, json) = t.run(&t.addrs(), "rr", &script);
    let s = shares(&d);
    assert!(
        s[1].1 >= 0.95,
        "path 1 should carry all: shares {s:?}, bytes {d:?}"
    );
    assert_eq!(connections(&json), [0, 0], "the bond was not asked: {json}");
}

#[test]
fn rr_bonds_connected_udp_too() {
    if !can_run(&["iperf3", "nginx", "ip", "ss", "bash"]) {
        return;
    }
    let t = TwoPaths::new("bondudp", 8095);
    // Bound to the service address: a wildcard UDP socket would answer from the
    // path's own address (the source a route lookup picks), which a connected client
    // socket ignores.
    let service = t.service.to_string();
    let _iperf = Guard(
        quiet(&mut t.remote.command("iperf3"))
            .args(["-s", "-p", "5211", "-B", &service])
            .spawn()
            .unwrap(),
    );
    // Listening? (Asked inside the remote: a probe connection would disturb iperf3.)
    let t0 = std::time::Instant::now();
    loop {
        let o = t
            .remote
            .command("ss")
            .args(["-Hltn", "sport = :5211"])
            .output()
            .unwrap();
        if !o.stdout.is_empty() {
            break;
        }
        assert!(t0.elapsed().as_secs() < 10, "iperf3 never listened");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // iperf3's control connection (TCP) comes first and takes the first address; its
    // data stream, a connected UDP socket, takes the second.
    let script = format!("iperf3 -u -c {} -p 5211 -b 40M -t 1 -l 1400", t.service);
    let (d, json) = t.run(&t.addrs(), "rr", &script);
    let s = shares(&d);
    eprintln!("udp: per path (rx, tx) bytes {d:?}, shares {s:?}");
    assert!(
        d[1].0 >= 2 << 20 && s[1].0 >= 0.9,
        "the datagrams went over path 1: shares {s:?}, bytes {d:?}"
    );
    assert_eq!(connections(&json), [1, 1], "{json}");
}

#[test]
fn an_egress_address_gone_from_the_host_fails_that_connect() {
    if !can_run(&["curl", "nginx", "ip", "bash"]) {
        return;
    }
    let t = TwoPaths::new("bondgone", 8094);
    let [h0, _] = t.sources();
    let fifo = t.dir.path().join("go");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let ready = t.dir.path().join("ready");
    let mut child = spawn_two_connects_on_go(&t, &ready, &fifo);
    let t0 = std::time::Instant::now();
    while !ready.exists() {
        assert!(t0.elapsed().as_secs() < 10, "the program never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let prefix = format!("{h0}/30");
    ip(&["addr", "del", &prefix, "dev", &t.remote.paths()[0].host_if]);
    // Opened read-write, a FIFO never blocks: no hang if ferry is already gone.
    let mut go = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    std::io::Write::write_all(&mut go, b"go\n").unwrap();
    let o = output_once_ended(&mut child);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {}", o.status, text(&o));
    assert!(
        out.contains("first=7"),
        "curl could not connect: {}",
        text(&o)
    );
    assert!(
        out.contains("second=0"),
        "the other address works: {}",
        text(&o)
    );
    assert!(
        err.contains(&format!("cannot use egress source {h0}"))
            && err.contains("Cannot assign requested address"),
        "a log line says why: {}",
        text(&o)
    );
}

/// ferry (`--egress` both paths' addresses, `--bond rr`) running a program that (ferry
/// has checked its --egress by then) creates `ready`, waits for a line on the FIFO
/// `fifo` (sent once the first address is gone), then connects twice (rr: the first
/// connection is given that address, the second the other one). Its stdout and stderr
/// are piped; the guard kills it if the test fails before it ends.
fn spawn_two_connects_on_go(
    t: &TwoPaths,
    ready: &std::path::Path,
    fifo: &std::path::Path,
) -> Guard {
    let script = format!(
        ": > '{}'; read go < '{}'; curl -sS -o /dev/null {url}; echo first=$?; curl -sS -o /dev/null {url}; echo second=$?",
        ready.display(),
        fifo.display(),
        url = t.url()
    );
    let mut c = ferry();
    c.args([
        "run",
        "--egress",
        &t.addrs(),
        "--bond",
        "rr",
        "--",
        "bash",
        "-c",
        &script,
    ]);
    Guard(
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// `child`'s status and output, once it ends.
fn output_once_ended(child: &mut Guard) -> std::process::Output {
    let status = child.0.wait().unwrap();
    let mut o = std::process::Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    // A few lines each: they fit in the pipes, so reading after the wait is fine.
    std::io::Read::read_to_end(&mut child.0.stdout.take().unwrap(), &mut o.stdout).unwrap();
    std::io::Read::read_to_end(&mut child.0.stderr.take().unwrap(), &mut o.stderr).unwrap();
    o
}

#[test]
fn an_egress_address_not_on_the_host_is_refused() {
    let o = ferry_run(&["--egress", "198.51.100.77"], &["true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("--egress 198.51.100.77: no such address on this host"),
        "{}",
        text(&o)
    );
    let o = ferry_run(&["--bond", "xor"], &["true"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--bond without --egress: {}",
        text(&o)
    );
    let o = ferry_run(&["--egress", "127.0.0.1", "--bond", "random"], &["true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
