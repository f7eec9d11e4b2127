//! VM guests (`ferry vm`): a QEMU guest (TCG) whose virtio-net device is ferry's
//! vhost-user backend fetches files from a remote namespace through ferry's NIC server
//! (bytes compared with the files), is refused a denied address at once; and a frontend
//! that dies leaves ferry clean. The guest is scripts/guest-image.sh's (a Debian cloud
//! kernel, a busybox initramfs), built once into the target directory.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const QEMU: &str = "qemu-system-x86_64";

/// The guest's kernel and initramfs (`None`, said why, when they cannot be built here).
fn guest_image() -> Option<&'static (PathBuf, PathBuf)> {
    static IMAGE: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    IMAGE
        .get_or_init(|| guest_dir().map(|dir| (dir.join("vmlinuz"), dir.join("initrd.img"))))
        .as_ref()
}

/// Whether a guest can run here (root, QEMU, the image); says why not.
fn can_boot() -> bool {
    can_run(&[QEMU, "busybox", "nginx", "md5sum"]) && guest_image().is_some()
}

/// `ferry vm` serving `sock` with `opts`, and the guest addressing it announced
/// (`ip=…`, `gw=…`), once the socket listens.
fn ferry_vm(sock: &Path, opts: &[&str]) -> (Guard, String, String) {
    let (ferry, line) = ferry_vm_line(sock, opts);
    (ferry, field(&line, "ip="), field(&line, "gw="))
}

/// The value of `key` (`ip=`, say) in `ferry vm`'s announcement `line`.
fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        .to_string()
}

/// `ferry vm` serving `sock` with `opts`, and the line it announced the guest with,
/// once the socket listens.
fn ferry_vm_line(sock: &Path, opts: &[&str]) -> (Guard, String) {
    ferry_vm_on("--vhost-user", sock, opts)
}

/// `ferry vm DEVICE sock` (`--vhost-user`, `--stream`) with `opts`, and its
/// announcement, once the socket listens.
fn ferry_vm_on(device: &str, sock: &Path, opts: &[&str]) -> (Guard, String) {
    let mut c = ferry();
    c.args(["vm", device])
        .arg(sock)
        .args(opts)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn ferry vm");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // Announced once it listens: a frontend started now is never refused (the socket
    // file exists a moment before the socket listens; QEMU's stream netdev, refused,
    // runs on without a network).
    assert!(sock.exists(), "{} listens once announced", sock.display());
    (Guard(child), line)
}

/// QEMU (TCG, 2 vCPUs) with a virtio-net device of 2 queue pairs on `sock`, booting the
/// guest that runs `script`.
fn qemu(sock: &Path, ip: &str, gw: &str, script: &str) -> Command {
    let net = [
        "-object".to_string(),
        "memory-backend-memfd,id=mem,size=256M,share=on".into(),
        "-numa".into(),
        "node,memdev=mem".into(),
        "-chardev".into(),
        format!("socket,id=c0,path={}", sock.display()),
        "-netdev".into(),
        "vhost-user,id=n0,chardev=c0,queues=2".into(),
        "-device".into(),
        "virtio-net-pci,netdev=n0,mq=on,vectors=6".into(),
    ];
    guest(&net, ip, gw, script)
}

/// QEMU (TCG, 2 vCPUs) with the network arguments `net` (a device `n0`), booting the
/// guest that runs `script`.
fn guest(net: &[String], ip: &str, gw: &str, script: &str) -> Command {
    use std::io::Write;
    let (kernel, initrd) = guest_image().unwrap();
    let mut b64 = Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    b64.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let run = String::from_utf8(b64.wait_with_output().unwrap().stdout).unwrap();
    let mut c = Command::new(QEMU);
    c.args(["-accel", "tcg", "-smp", "2", "-m", "256", "-nodefaults"])
        .args(["-display", "none", "-serial", "stdio", "-no-reboot"])
        .args(net)
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet ferry.ip={ip} ferry.gw={gw} ferry.mtu=65520 ferry.run={run}"
        ))
        .stdin(Stdio::null());
    c
}

/// The value after `key ` on the guest's console.
fn said<'a>(console: &'a str, key: &str) -> Option<&'a str> {
    console
        .lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(' '))
}

fn md5(path: &Path) -> String {
    let o = Command::new("md5sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_guest_fetches_through_ferry_over_two_queue_pairs_and_is_refused_a_denied_address() {
    if !can_boot() {
        return;
    }
    let remote = remote("vm");
    let dir = TempDir::new("vm");
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("small"), pattern(100_000, 7)).unwrap();
    std::fs::write(root.join("big"), pattern(16 << 20, 8)).unwrap();
    let _nginx = remote_nginx(&remote, dir.path(), &root, 8080);
    let sock = dir.path().join("vu.sock");
    // 192.0.2.1 (TEST-NET-1) leads nowhere: only ferry's refusal answers at once.
    let opts = ["--deny", "192.0.2.1/32", "--stats", "--nic-servers", "2"];
    let (mut ferry, ip, gw) = ferry_vm(&sock, &opts);
    let r = remote.remote_ip();
    let script = format!(
        "up() {{ cut -d' ' -f1 /proc/uptime; }}\n\
         echo SMALL $(wget -q -O - http://{r}:8080/small | md5sum | cut -d' ' -f1)\n\
         n=0; for i in 1 2 3 4 5 6 7 8; do for c in 1 2; do\n\
           taskset $c wget -q -O /dev/null http://{r}:8080/small && n=$((n + 1)); done; done\n\
         echo FETCHED $n\n\
         t0=$(up); nc -w 5 192.0.2.1 80 </dev/null; rc=$?; t1=$(up)\n\
         echo DENIED $rc $(awk \"BEGIN {{ print int(($t1 - $t0) * 1000) }}\")\n\
         t0=$(up); echo BIG $(wget -q -O - http://{r}:8080/big | md5sum | cut -d' ' -f1)\n\
         t1=$(up); echo BIGMS $(awk \"BEGIN {{ print int(($t1 - $t0) * 1000) }}\")\n\
         echo RXERR $(sed -n 's/.*eth0://p' /proc/net/dev | awk '{{ print $3 + $4 + $6 }}')\n"
    );
    let t = Instant::now();
    let out = output_within(qemu(&sock, &ip, &gw, &script), Duration::from_secs(120));
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "guest ran {:?}:\n{console}\nQEMU said: {}",
        t.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said(&console, "FERRY-GUEST-EXIT").is_some(),
        "the guest did not finish"
    );
    assert_eq!(
        said(&console, "SMALL"),
        Some(md5(&root.join("small")).as_str())
    );
    assert_eq!(said(&console, "BIG"), Some(md5(&root.join("big")).as_str()));
    let denied: Vec<u64> = said(&console, "DENIED")
        .expect("the denied connect's result")
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect();
    assert_ne!(denied[0], 0, "a connect to a denied address failed");
    assert!(
        denied[1] < 1000,
        "refused at once, not by a timeout: {denied:?}"
    );
    // Frames over several merged buffers reach the guest whole: none dropped as
    // malformed (a used index moved before all of a frame's buffers were there did).
    assert_eq!(
        said(&console, "RXERR"),
        Some("0"),
        "the guest's receive errors"
    );
    let ms: u64 = said(&console, "BIGMS").unwrap().parse().unwrap();
    eprintln!(
        "16 MiB guest fetch through ferry vm (TCG): {} ms, {:.0} Mbit/s",
        ms,
        (16u64 << 23) as f64 / ms.max(1) as f64 / 1000.0
    );
    // The guest powered off: QEMU closed the connection, ferry reports and exits.
    let code = wait_exit(&mut ferry.0, Duration::from_secs(5));
    let mut err = String::new();
    std::io::Read::read_to_string(ferry.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(code, Some(0), "ferry vm's exit: {err}");
    assert!(err.contains("denied 1"), "the refusal is counted: {err}");
    assert!(err.contains("refused: tx chains 0, rx chains 0"), "{err}");
    // 19 flows from two vCPUs: each queue pair's server carried some (a flow's frames go
    // to its server whatever queue the guest sends them on; a frame on the wrong server
    // would reset its flow, and FETCHED would fall short).
    assert_eq!(said(&console, "FETCHED"), Some("16"));
    for id in ["nic-0", "nic-1"] {
        let flows: u64 = err
            .lines()
            .find(|l| l.starts_with(&format!("server {id}:")))
            .and_then(|l| l.split("tcp flows ").nth(1))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no counters of {id}: {err}"));
        assert!(flows >= 1, "{id} carried a flow: {err}");
    }
    assert!(!sock.exists(), "the socket is removed");
}

/// Waits up to `limit` for `child` to exit; its status code.
fn wait_exit(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(s)) = child.try_wait() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn a_frontend_killed_leaves_ferry_clean_within_a_second() {
    if !can_run(&[QEMU]) {
        return;
    }
    let dir = TempDir::new("vm-kill");
    let sock = dir.path().join("vu.sock");
    let (mut ferry, ..) = ferry_vm(&sock, &[]);
    let mut qemu = qemu_connected(&sock);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        ferry.0.try_wait().unwrap().is_none(),
        "ferry serves while QEMU lives"
    );
    qemu.kill().unwrap();
    let _ = qemu.wait();
    let t = Instant::now();
    let code = wait_exit(&mut ferry.0, Duration::from_secs(3));
    assert_eq!(
        code,
        Some(0),
        "ferry vm ends cleanly when its frontend dies"
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "within a second: {:?}",
        t.elapsed()
    );
}

#[test]
fn every_thread_of_ferry_vm_serving_a_frontend_is_confined() {
    if !can_run(&[QEMU]) {
        return;
    }
    let serving = |extra: &[&str]| {
        let dir = TempDir::new("vm-confined");
        let sock = dir.path().join("vu.sock");
        let mut opts = vec!["--nic-servers", "2"];
        opts.extend_from_slice(extra);
        let (mut ferry, _) = ferry_vm_line(&sock, &opts);
        let mut qemu = qemu_connected(&sock);
        std::thread::sleep(Duration::from_millis(300));
        let threads = thread_confinement(ferry.0.id());
        assert!(ferry.0.try_wait().unwrap().is_none(), "ferry serves");
        qemu.kill().unwrap();
        let _ = qemu.wait();
        assert_eq!(wait_exit(&mut ferry.0, Duration::from_secs(3)), Some(0));
        threads
    };
    let threads = serving(&[]);
    // The main thread, the signal thread, two NIC servers, the daemon's and the relay's.
    assert!(threads.len() >= 5, "{threads:?}");
    assert_confined(&threads);
    let open = serving(&["--unconfined"]);
    assert_unconfined(&open);
}

/// QEMU with a virtio-net device on `sock`, its guest not started (-S: QEMU connects
/// and sets the device up at start), once ferry has taken the connection (it removes
/// the socket file then).
fn qemu_connected(sock: &Path) -> std::process::Child {
    let mut q = Command::new(QEMU);
    q.args([
        "-accel",
        "tcg",
        "-m",
        "64",
        "-nodefaults",
        "-display",
        "none",
        "-S",
    ])
    .args(["-object", "memory-backend-memfd,id=mem,size=64M,share=on"])
    .args(["-numa", "node,memdev=mem"])
    .arg("-chardev")
    .arg(format!("socket,id=c0,path={}", sock.display()))
    .args(["-netdev", "vhost-user,id=n0,chardev=c0"])
    .args(["-device", "virtio-net-pci,netdev=n0"]);
    let qemu = q
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while sock.exists() {
        // ferry removes the path once the frontend is connected.
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "QEMU never connected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    qemu
}

/// Sends `sig` to `ferry vm`; its exit code within a second (`None`: still running),
/// and what it wrote on stderr.
fn signal_and_wait(ferry: &mut Guard, sig: i32) -> (Option<i32>, Duration, String) {
    let pid = i32::try_from(ferry.0.id()).unwrap();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    let t = Instant::now();
    let code = wait_exit(&mut ferry.0, Duration::from_secs(3));
    let took = t.elapsed();
    let mut err = String::new();
    if code.is_some() {
        std::io::Read::read_to_string(ferry.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    }
    (code, took, err)
}

#[test]
fn a_signal_before_the_frontend_connects_ends_ferry_and_removes_its_socket() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let dir = TempDir::new("vm-sig");
        let sock = dir.path().join("vu.sock");
        let (mut ferry, _) = ferry_vm_line(&sock, &["--stats"]);
        let (code, took, err) = signal_and_wait(&mut ferry, sig);
        assert_eq!(code, Some(128 + sig), "signal {sig}: {err}");
        assert!(took < Duration::from_secs(1), "at once: {took:?}");
        assert!(!sock.exists(), "the socket file is removed");
        assert!(
            err.contains(&format!("ferry vm: signal {sig}: stopped")),
            "{err}"
        );
        assert!(
            err.contains("server nic-0:"),
            "the counters are reported: {err}"
        );
    }
}

#[test]
fn a_signal_while_a_frontend_is_served_ends_the_connection_and_ferry() {
    if !can_run(&[QEMU]) {
        return;
    }
    let dir = TempDir::new("vm-sig-serving");
    let sock = dir.path().join("vu.sock");
    let (mut ferry, _) = ferry_vm_line(&sock, &["--stats"]);
    let mut qemu = qemu_connected(&sock);
    std::thread::sleep(Duration::from_millis(300));
    let (code, took, err) = signal_and_wait(&mut ferry, libc::SIGTERM);
    let _ = qemu.kill();
    let _ = qemu.wait();
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert!(took < Duration::from_secs(1), "at once: {took:?}");
    assert!(!sock.exists());
    assert!(
        err.contains("server nic-0:"),
        "the counters are reported: {err}"
    );
}

/// The addresses `nslookup NAME SERVER` printed in `console` after `key` (busybox's
/// `Address: IP` lines; the server's own line carries `:53`).
const LOOKUP: &str = "nslookup $1 $2 2>&1 | sed -n 's/^Address: *\\([0-9.]*\\)$/\\1/p' | head -n1";

/// A DNS-over-TCP query for `vm.ferry.test` (A), behind its 2-byte length, for the
/// guest's `printf` (octal escapes): 31 bytes; the test's nameserver answers 47.
const TCP_QUERY: &str = "\\000\\037\\022\\064\\001\\000\\000\\001\\000\\000\\000\\000\\000\\000\\002vm\\005ferry\\004test\\000\\000\\001\\000\\001";

#[test]
fn a_guest_resolves_through_the_gateway_and_a_denied_upstream_is_left_out() {
    if !can_boot() {
        return;
    }
    let remote = remote("vmdns");
    remote_nameserver(&remote);
    let r = remote.remote_ip();
    let dir = TempDir::new("vm-dns");
    let sock = dir.path().join("vu.sock");
    // Two upstreams, one the policy denies: it is left out, the other answers.
    let dns = format!("{r},192.0.2.9");
    let opts = [
        "--dns",
        &dns,
        "--deny",
        "192.0.2.9/32",
        "--stats",
        "--nic-servers",
        "2",
    ];
    let (mut ferry, line) = ferry_vm_line(&sock, &opts);
    let (ip, gw) = (field(&line, "ip="), field(&line, "gw="));
    assert_eq!(
        field(&line, "dns="),
        gw,
        "the resolver is announced: {line}"
    );
    // Two lookups (A and AAAA queries each, from several ports: both servers relay).
    let script = format!(
        "look() {{ {LOOKUP}; }}\n\
         echo RESOLVED $(look vm.ferry.test {gw})\n\
         echo AGAIN $(look again.ferry.test {gw})\n\
         printf '{TCP_QUERY}' | timeout 5 nc {gw} 53 >/tcp.out; echo TCP $(wc -c </tcp.out)\n"
    );
    let out = output_within(qemu(&sock, &ip, &gw, &script), Duration::from_secs(120));
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("guest:\n{console}");
    let code = wait_exit(&mut ferry.0, Duration::from_secs(5));
    let mut err = String::new();
    std::io::Read::read_to_string(ferry.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    let r = r.to_string();
    assert_eq!(said(&console, "RESOLVED"), Some(r.as_str()), "{err}");
    assert_eq!(said(&console, "AGAIN"), Some(r.as_str()), "{err}");
    assert_eq!(
        said(&console, "TCP"),
        Some("49"),
        "an answer over TCP: {err}"
    );
    assert_eq!(code, Some(0), "ferry vm's exit: {err}");
    let count = |key: &str| -> u64 {
        err.lines()
            .filter_map(|l| l.split(&format!("{key} ")).nth(1))
            .filter_map(|v| v.split(',').next()?.trim().parse::<u64>().ok())
            .sum()
    };
    assert!(count("DNS answers") >= 2, "{err}");
    assert_eq!(count("DNS dropped") + count("DNS stray"), 0, "{err}");
}

#[test]
fn with_every_upstream_denied_the_guest_has_no_resolver_and_is_told() {
    let dir = TempDir::new("vm-dns-off");
    let sock = dir.path().join("vu.sock");
    let opts = ["--dns", "192.0.2.9:53", "--deny", "192.0.2.9/32"];
    let (mut vm, line) = ferry_vm_line(&sock, &opts);
    assert_eq!(field(&line, "dns="), "off", "{line}");
    let _ = vm.0.kill();
    let _ = vm.0.wait();
    let mut err = String::new();
    std::io::Read::read_to_string(vm.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("DNS forwarding is off: the egress policy denies every upstream nameserver"),
        "{err}"
    );
    // A malformed --dns is refused before anything starts.
    let o = ferry()
        .args(["vm", "--vhost-user"])
        .arg(&sock)
        .args(["--dns", "nameserver"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--dns: `nameserver` is not IP[:PORT]"));
}

#[test]
fn a_guest_on_qemus_stream_netdev_fetches_through_ferry() {
    if !can_boot() {
        return;
    }
    let remote = remote("vmstream");
    let dir = TempDir::new("vm-stream");
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("small"), pattern(100_000, 9)).unwrap();
    std::fs::write(root.join("big"), pattern(8 << 20, 10)).unwrap();
    let _nginx = remote_nginx(&remote, dir.path(), &root, 8080);
    let sock = dir.path().join("stream.sock");
    let (mut ferry, line) = ferry_vm_on("--stream", &sock, &["--stats", "--deny", "192.0.2.1/32"]);
    let (ip, gw) = (field(&line, "ip="), field(&line, "gw="));
    let r = remote.remote_ip();
    let script = format!(
        "echo SMALL $(wget -q -O - http://{r}:8080/small | md5sum | cut -d' ' -f1)\n\
         nc -w 5 192.0.2.1 80 </dev/null; echo DENIED $?\n\
         echo BIG $(wget -q -O - http://{r}:8080/big | md5sum | cut -d' ' -f1)\n"
    );
    let net = [
        "-netdev".to_string(),
        format!(
            "stream,id=n0,server=off,addr.type=unix,addr.path={}",
            sock.display()
        ),
        "-device".into(),
        "virtio-net-pci,netdev=n0".into(),
    ];
    let t = Instant::now();
    let out = output_within(guest(&net, &ip, &gw, &script), Duration::from_secs(120));
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "guest ran {:?}:\n{console}\nQEMU said: {}",
        t.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    let code = wait_exit(&mut ferry.0, Duration::from_secs(5));
    let mut err = String::new();
    if code.is_some() {
        std::io::Read::read_to_string(ferry.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    }
    eprintln!(
        "QEMU's {}; ferry vm's exit {code:?}, it said:\n{err}",
        out.status
    );
    assert_eq!(
        said(&console, "SMALL"),
        Some(md5(&root.join("small")).as_str()),
        "{err}"
    );
    assert_eq!(
        said(&console, "BIG"),
        Some(md5(&root.join("big")).as_str()),
        "{err}"
    );
    assert_ne!(said(&console, "DENIED"), Some("0"), "{err}");
    assert_eq!(code, Some(0), "ferry vm ends with its peer: {err}");
    assert!(err.contains("denied 1"), "{err}");
    assert!(
        err.contains("stream: refused lengths 0 (0 bytes skipped), lost towards the peer"),
        "{err}"
    );
    assert!(!sock.exists());
}

#[test]
fn a_stream_peer_with_hostile_lengths_is_refused_counted_and_its_end_ends_ferry() {
    use std::io::Write;
    let dir = TempDir::new("vm-stream-hostile");
    let sock = dir.path().join("stream.sock");
    let (mut ferry, _) = ferry_vm_on("--stream", &sock, &["--stats"]);
    let mut peer = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    // A zero length; a length of 4 GiB - 1 followed by 100,000 bytes (skipped as they
    // come: the skip is still under way when the peer goes).
    let mut bytes = vec![0, 0, 0, 0];
    bytes.extend_from_slice(&u32::MAX.to_be_bytes());
    bytes.extend_from_slice(&vec![0xab; 100_000]);
    peer.write_all(&bytes).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(ferry.0.try_wait().unwrap().is_none(), "ferry serves on");
    drop(peer);
    let t = Instant::now();
    let code = wait_exit(&mut ferry.0, Duration::from_secs(3));
    let mut err = String::new();
    std::io::Read::read_to_string(ferry.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(
        err.contains("stream: refused lengths 2 (100000 bytes skipped)"),
        "{err}"
    );
    assert!(!sock.exists());
}
