//! The DNS forwarder against a hostile program (docs/SECURITY.md, "Attacks"): a program
//! that skips the shim floods the sandbox's nameserver address while the upstream never
//! answers. Before the forwarder's bounds, its table of query ids filled, the protocol
//! server looped for good looking for a free id (every shimmed program stalled) and ferry
//! ignored SIGTERM once the program had gone.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// The flooder, run without the shim: DNS messages to the first nameserver of
/// `/etc/resolv.conf` (the forwarder's address in the sandbox) for `argv[1]` seconds,
/// every other one a response (QR = 1), as fast as the socket takes them; prints how
/// many went.
const FLOOD: &str = r#"
import socket, sys, time
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.split()[:1] == ['nameserver']][0]
s = socket.socket(socket.AF_INET6 if ':' in ns else socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
query = b'\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05flood\x05ferry\x04test\x00\x00\x01\x00\x01'
answer = b'\x81\x80' + query[2:]
end, n = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    try:
        s.sendto((n & 0xffff).to_bytes(2, 'big') + (answer if n & 1 else query), (ns, 53))
        n += 1
    except BlockingIOError:
        time.sleep(0.0002)
print('flood', n, flush=True)
"#;

/// The sandbox's program (through the shim): starts the flooder without the shim, and
/// once the flood has run for a while (the old forwarder's 65,536 ids were taken by
/// then) times TCP echoes to the remote until the flood is over; then waits for a
/// signal.
const PROGRAM: &str = r#"
import socket, subprocess, sys, time
ip, port, flood, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
f = subprocess.Popen(['env', '-u', 'LD_PRELOAD', sys.executable, '-c', flood, seconds],
                     stdout=subprocess.PIPE, text=True)
time.sleep(float(seconds) / 2)
n, worst = 0, 0.0
while f.poll() is None or n < 10:
    t = time.time()
    s = socket.create_connection((ip, port), timeout=10)
    s.sendall(b'echo %d' % n)
    assert s.recv(64) == b'echo %d' % n
    s.close()
    worst = max(worst, time.time() - t)
    n += 1
    time.sleep(0.05)
print('echoes', n, 'worst', round(worst, 3), flush=True)
print(f.stdout.read().strip(), flush=True)
print('idle', flush=True)
time.sleep(600)
"#;

/// How long the flood lasts.
const FLOOD_SECONDS: u32 = 8;

/// The first nameserver of the host's `resolv.conf` (the sandbox's too).
fn nameserver() -> Option<String> {
    let conf = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    conf.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("nameserver")).then(|| w.next().map(str::to_owned))?
    })
}

/// A UDP socket in the remote that reads every datagram and answers none; counts them
/// and the responses (QR = 1) among them.
fn silent_upstream(r: &Remote, port: u16) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
    let ip = r.remote_ip();
    let sock = r.run_in(|| UdpSocket::bind((ip, port))).unwrap().unwrap();
    let (all, responses) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (a, resp) = (all.clone(), responses.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut buf) {
            a.fetch_add(1, Ordering::Relaxed);
            if n >= 3 && buf[2] & 0x80 != 0 {
                resp.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    (all, responses)
}

/// A TCP echo service in the remote (one read, echoed, per connection).
fn remote_echo(r: &Remote, port: u16) {
    let ip = r.remote_ip();
    let l = r.run_in(|| TcpListener::bind((ip, port))).unwrap().unwrap();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 64];
            if let Ok(n) = c.read(&mut buf) {
                let _ = c.write_all(&buf[..n]);
            }
        }
    });
}

/// CPU time of process `pid` (all threads), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15, the 12th and 13th after the comm.
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

/// The descendants of `pid` (by `/proc/*/stat`'s parent).
fn descendants(pid: u32) -> Vec<u32> {
    let parent = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![pid];
    let mut grew = true;
    while grew {
        grew = false;
        for &p in &all {
            if !found.contains(&p) && parent(p).is_some_and(|pp| found.contains(&pp)) {
                found.push(p);
                grew = true;
            }
        }
    }
    found.retain(|&p| p != pid);
    found
}

/// ferry's private directories (`ferry-PID-…` in the temporary directory).
fn ferry_dirs(pid: u32) -> Vec<std::path::PathBuf> {
    let prefix = format!("ferry-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Lines of `out`, each as it comes.
fn lines(out: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

#[test]
fn a_flood_at_the_nameserver_neither_stalls_the_server_nor_keeps_ferry_alive() {
    if !can_run(&["python3", "env"]) {
        return;
    }
    if nameserver().is_none() {
        eprintln!("skipped: no nameserver in /etc/resolv.conf for the forwarder to listen on");
        return;
    }
    let r = remote("dnsflood");
    let (upstream_got, upstream_responses) = silent_upstream(&r, 5353);
    remote_echo(&r, 7301);
    let dir = TempDir::new("dnsflood");
    let stats = dir.path().join("stats.json");
    let mut ferry = spawn_flooding_program(&r, &stats);
    let pid = ferry.0.id();
    let out = lines(ferry.0.stdout.take().unwrap());
    let err = lines(ferry.0.stderr.take().unwrap());

    let (echoes, flood) = echoes_served_during_the_flood(&out, &err, pid);
    let share = cpu_share_after_the_flood(pid);
    let t = sigterm_ends_ferry_leaving_nothing(ferry, &err);

    // No response reached the upstream; queries did, and the forwarder counted what it
    // dropped and what it forgot to make room.
    assert_eq!(upstream_responses.load(Ordering::Relaxed), 0);
    assert!(upstream_got.load(Ordering::Relaxed) > 0);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    for counter in ["dns_queries", "dns_dropped", "dns_evicted"] {
        assert!(json[counter].as_u64().unwrap_or(0) > 0, "{counter}: {json}");
    }
    assert_eq!(json["dns_answers"], 0, "{json}");
    eprintln!(
        "{echoes}; {flood}; CPU after it {share:.3}; exit {:?} after SIGTERM; dropped {}, evicted {}, relayed {}",
        t.elapsed(),
        json["dns_dropped"],
        json["dns_evicted"],
        json["dns_queries"]
    );
}

/// ferry running [`PROGRAM`] (which starts [`FLOOD`]) with the remote's port 5353 as its
/// DNS upstream and its counters written to `stats`; stdout and stderr piped.
fn spawn_flooding_program(r: &Remote, stats: &std::path::Path) -> Guard {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.arg("run")
        .args(["--dns", &format!("{}:5353", r.remote_ip())])
        .arg("--stats-json")
        .arg(stats)
        .args(["--", "python3", "-c", PROGRAM])
        .arg(r.remote_ip().to_string())
        .args(["7301", FLOOD, &FLOOD_SECONDS.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Guard(c.spawn().expect("spawn ferry"))
}

/// What has come on ferry's stderr so far, for a failure's message.
fn stderr_so_far(err: &mpsc::Receiver<String>) -> String {
    err.try_iter().collect::<Vec<_>>().join("\n")
}

/// Checks that the shimmed program's echoes were served during the flood, each promptly,
/// that the flood was thick and that the program went idle after it; returns the
/// program's `echoes` and `flood` lines.
fn echoes_served_during_the_flood(
    out: &mpsc::Receiver<String>,
    err: &mpsc::Receiver<String>,
    pid: u32,
) -> (String, String) {
    let limit = Duration::from_secs(u64::from(FLOOD_SECONDS) + 15);
    let Ok(echoes) = out.recv_timeout(limit) else {
        panic!(
            "the shimmed program's echoes stalled during the flood (ferry at {} ticks of CPU): {}",
            cpu_ticks(pid),
            stderr_so_far(err)
        );
    };
    let worst: f64 = echoes
        .rsplit(' ')
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::MAX);
    assert!(
        echoes.starts_with("echoes ") && worst < 1.0,
        "{echoes}: {}",
        stderr_so_far(err)
    );
    let flood = out.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    let sent: u64 = flood
        .strip_prefix("flood ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        sent > 100_000,
        "the flood was too thin to mean anything: {flood}"
    );
    assert_eq!(
        out.recv_timeout(Duration::from_secs(5)).as_deref(),
        Ok("idle")
    );
    (echoes, flood)
}

/// With the flood over, the server sleeps: checks that ferry (`pid`) uses under a
/// quarter of a CPU over 2 s, and returns the share it used.
fn cpu_share_after_the_flood(pid: u32) -> f64 {
    std::thread::sleep(Duration::from_millis(500));
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_secs(2));
    let ticks_per_s = 100.0; // USER_HZ
    let share = (cpu_ticks(pid) - c0) as f64 / ticks_per_s / t0.elapsed().as_secs_f64();
    assert!(share < 0.25, "ferry used {share:.2} CPU after the flood");
    share
}

/// SIGTERM ends ferry (through the program) promptly, leaving nothing behind: checks
/// that, reaping ferry; returns when the signal went.
fn sigterm_ends_ferry_leaving_nothing(mut ferry: Guard, err: &mpsc::Receiver<String>) -> Instant {
    let pid = ferry.0.id();
    let left = descendants(pid);
    assert!(!left.is_empty(), "the sandbox's processes are not there");
    assert!(!ferry_dirs(pid).is_empty(), "ferry's directories not found");
    // SAFETY: a signal to our own child, not reaped yet.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let t = Instant::now();
    let status = loop {
        if let Some(s) = ferry.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "ferry still runs {:?} after SIGTERM: {}",
            t.elapsed(),
            stderr_so_far(err)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // (Reaped: the guard must not signal its pid again.)
    std::mem::forget(ferry);
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        stderr_so_far(err)
    );
    let alive: Vec<u32> = left
        .into_iter()
        .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        .collect();
    assert!(alive.is_empty(), "left running: {alive:?}");
    assert!(
        ferry_dirs(pid).is_empty(),
        "left behind: {:?}",
        ferry_dirs(pid)
    );
    t
}

// ---- A server thread that never returns ---------------------------------------------

/// The id of `pid`'s thread named `name`, once it exists (or panics after 10 s).
fn thread_named(pid: u32, name: &str) -> i32 {
    let t = Instant::now();
    loop {
        let found = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| {
                std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .and_then(|e| e.file_name().to_str()?.parse().ok());
        if let Some(tid) = found {
            return tid;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no thread {name}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops thread `tid` alone (its process runs on) until this thread of the test exits
/// or the thread's process ends: `PTRACE_SEIZE` and `PTRACE_INTERRUPT`, as a thread stuck
/// in a loop, from ferry's point of view, is a thread that never comes back.
/// `Err` when this machine forbids ptrace (a container's seccomp profile, Yama).
fn freeze_thread(tid: i32) -> Result<(), std::io::Error> {
    // SAFETY: ptrace requests on a thread id, with null address and data.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    let interrupted = unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) };
    assert_eq!(interrupted, 0, "{}", std::io::Error::last_os_error());
    let mut status = 0;
    // SAFETY: waits for our tracee; `status` is a valid out-pointer.
    let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
    assert_eq!(got, tid, "{}", std::io::Error::last_os_error());
    Ok(())
}

/// Waits up to `limit` for `child` to end, reaping the traced thread `tid` too (a
/// traced thread's exit waits for its tracer, and its process's with it); its status.
fn exit_within(
    child: &mut std::process::Child,
    tid: i32,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < limit {
        let mut status = 0;
        // SAFETY: as in `freeze_thread`, without waiting.
        unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// ferry with its protocol server's thread frozen: SIGTERM to ferry ends the program,
/// and then `second` (a signal sent while ferry waits for the servers) or, without one,
/// the stop's bound ends ferry, its directories removed. Returns how long ferry took
/// after the last signal, its status and its stderr; `None` when ptrace is forbidden.
fn stop_with_a_frozen_server(second: Option<i32>) -> Option<(Duration, Option<i32>, String)> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.args(["run", "--", "sleep", "600"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut ferry = Guard(c.spawn().expect("spawn ferry"));
    let pid = ferry.0.id();
    let err = lines(ferry.0.stderr.take().unwrap());
    let tid = thread_named(pid, "ferry-proto-0");
    // Up: the program runs in its sandbox.
    let t = Instant::now();
    while descendants(pid).len() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the sandbox never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Err(e) = freeze_thread(tid) {
        eprintln!("skipped: cannot stop a thread with ptrace here ({e})");
        return None;
    }
    // SAFETY: signals to our own child, not reaped yet.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let mut t = Instant::now();
    if let Some(sig) = second {
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            ferry.0.try_wait().unwrap().is_none(),
            "ferry did not wait for its servers"
        );
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, sig) };
        t = Instant::now();
    }
    let status = exit_within(&mut ferry.0, tid, Duration::from_secs(15));
    let took = t.elapsed();
    let stderr: Vec<String> = err.try_iter().collect();
    let Some(status) = status else {
        // Reaped here, traced thread included: the guard's wait would never return.
        let _ = ferry.0.kill();
        exit_within(&mut ferry.0, tid, Duration::from_secs(10));
        std::mem::forget(ferry);
        for d in ferry_dirs(pid) {
            let _ = std::fs::remove_dir_all(d);
        }
        panic!(
            "ferry still runs {took:?} after the signals: {}",
            stderr.join("\n")
        );
    };
    std::mem::forget(ferry); // reaped
    assert!(
        ferry_dirs(pid).is_empty(),
        "left behind: {:?}",
        ferry_dirs(pid)
    );
    Some((took, status.code(), stderr.join("\n")))
}

#[test]
fn a_server_thread_that_never_returns_does_not_keep_ferry_alive() {
    if !can_run(&["sleep"]) {
        return;
    }
    // SIGINT (or SIGTERM) once the program has gone ends ferry at once.
    let Some((took, code, stderr)) = stop_with_a_frozen_server(Some(libc::SIGINT)) else {
        return;
    };
    assert!(took < Duration::from_secs(1), "{took:?}: {stderr}");
    assert_eq!(code, Some(128 + libc::SIGINT), "{stderr}");
    assert!(stderr.contains("exiting now"), "{stderr}");
    // Without a second signal, the bound on the stop does, with the program's status.
    let Some((took, code, stderr)) = stop_with_a_frozen_server(None) else {
        return;
    };
    assert!(
        took > Duration::from_secs(9) && took < Duration::from_secs(12),
        "{took:?}: {stderr}"
    );
    assert_eq!(code, Some(128 + libc::SIGTERM), "{stderr}");
    assert!(stderr.contains("did not stop within"), "{stderr}");
}
