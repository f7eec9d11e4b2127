//! Programs the shim cannot serve are told of: every process that makes an inet socket
//! through the kernel (a static or Go program, a process without the shim, raw and ICMP
//! sockets) gets one line on ferry's stderr; the sockets the shim relays, and libc's own
//! (its resolver), get none; a flood of them gets a bounded number of lines, promptly.

mod common;
use common::*;

use std::time::{Duration, Instant};

/// Python that names its process `$NAME` and makes `$COUNT` IPv4 TCP sockets with a
/// `syscall` instruction of its own (as a static or Go program does: no libc, no shim),
/// in `$PROCS` processes (forked) at once.
const DIRECT: &str = r#"
import ctypes, mmap, os
libc = ctypes.CDLL(None)
libc.prctl(15, os.environ["NAME"].encode(), 0, 0, 0)
code = bytes([0xb8, 41, 0, 0, 0, 0x0f, 0x05, 0xc3])  # mov eax, SYS_socket; syscall; ret
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
sock = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)(addr)
kids = []
for _ in range(int(os.environ.get("PROCS", "1"))):
    pid = os.fork()
    if pid == 0:
        for _ in range(int(os.environ.get("COUNT", "1"))):
            fd = sock(2, 1, 0)
            assert fd >= 0, fd
            os.close(fd)
        os._exit(0)
    kids.append(pid)
for k in kids:
    assert os.waitpid(k, 0)[1] == 0
"#;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The watch's lines in `err` (one per process told).
fn told(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.starts_with("ferry: pid ") && l.contains("): made an "))
        .collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn processes_the_shim_cannot_serve_are_told_once_each() {
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    // Two processes bypass the shim, each with several sockets: one with code of its
    // own, one started without LD_PRELOAD. One makes an ICMP socket through the shim
    // (which passes it on). The shim serves the TCP and UDP sockets of the last two;
    // the last one's resolver (libc's own code, which the shim cannot interpose) makes
    // its query sockets through the kernel, and must not be told either.
    let script = r#"
NAME=direct-code COUNT=3 python3 -c "$DIRECT" &&
env -u LD_PRELOAD python3 -c 'import ctypes, socket
ctypes.CDLL(None).prctl(15, b"no-shim", 0, 0, 0)
socket.socket(); socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)' &&
python3 -c 'import ctypes, socket
ctypes.CDLL(None).prctl(15, b"raw-icmp", 0, 0, 0)
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
except OSError as e:
    print("raw", e.errno)' &&
python3 -c 'import ctypes, socket
ctypes.CDLL(None).prctl(15, b"served", 0, 0, 0)
socket.socket(); socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)' &&
python3 -c 'import ctypes, socket
ctypes.CDLL(None).prctl(15, b"resolver", 0, 0, 0)
for _ in range(3):
    try:
        socket.getaddrinfo("ferry-watch-test.invalid", 80)
    except OSError:
        pass
print("resolved")'
"#;
    let mut cmd = ferry();
    cmd.args([
        "run", "--net", "socket", "--dns", "off", "--", "sh", "-c", script,
    ])
    .env("DIRECT", DIRECT);
    let o = output_within(cmd, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("resolved"));
    let lines = told(&err);
    let named = |name: &str| {
        lines
            .iter()
            .filter(|l| l.contains(&format!(" ({name}): ")))
            .copied()
            .collect::<Vec<_>>()
    };
    let direct = named("direct-code");
    assert_eq!(direct.len(), 1, "{err}");
    assert!(
        direct[0].ends_with(
            "made an IPv4 socket without ferry's shim (a static or Go program?): it sees only the sandbox's loopback (--net nic or both serves it)"
        ),
        "{err}"
    );
    let no_shim = named("no-shim");
    assert_eq!(no_shim.len(), 1, "{err}");
    assert!(
        no_shim[0].contains("IPv4 socket without ferry's shim"),
        "{err}"
    );
    let icmp = named("raw-icmp");
    assert_eq!(icmp.len(), 1, "{err}");
    assert!(
        icmp[0].contains("made an IPv4 ICMP socket: ICMP (ping) is not relayed in socket mode"),
        "{err}"
    );
    // Different processes, each named by its own pid.
    let pid = |l: &str| l.split_whitespace().nth(2).unwrap().to_owned();
    assert_ne!(pid(direct[0]), pid(no_shim[0]));
    assert_eq!(
        lines.len(),
        3,
        "the served and the resolver were told: {err}"
    );
}

#[test]
fn ping_is_told_that_icmp_is_not_relayed() {
    if !have("ping") {
        eprintln!("skipped: ping is not installed (iputils-ping; scripts/install-deps.sh)");
        return;
    }
    for dest in ["127.0.0.1", "192.0.2.1"] {
        let mut cmd = ferry();
        cmd.args(["run", "--net", "socket", "--", "ping", "-c1", "-W1", dest]);
        let o = output_within(cmd, Duration::from_secs(30));
        let err = stderr(&o);
        let lines = told(&err);
        assert_eq!(lines.len(), 1, "{dest}: {err}");
        assert!(
            lines[0].contains(" (ping): made an IPv4 ICMP socket: ICMP (ping) is not relayed in socket mode, so it reaches only the sandbox's loopback (--net nic or both serves it)"),
            "{dest}: {err}"
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_flood_of_direct_sockets_is_told_in_bounded_lines_and_served_promptly() {
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    // 5,000 sockets from 50 processes at once: each call waits for the init's answer.
    let mut cmd = ferry();
    cmd.args(["run", "--net", "socket", "--", "python3", "-c", DIRECT])
        .env("NAME", "flood")
        .env("PROCS", "50")
        .env("COUNT", "100");
    let t = Instant::now();
    let o = output_within(cmd, Duration::from_secs(60));
    let secs = t.elapsed().as_secs_f64();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(secs < 20.0, "5,000 watched sockets took {secs:.1} s");
    let shown = told(&err).len();
    let hidden: usize = err
        .lines()
        .filter_map(|l| l.strip_prefix("ferry: … and "))
        .map(|l| l.split(' ').next().unwrap().parse::<usize>().unwrap())
        .sum();
    // Every process counted once, shown or not; at most 20 lines a second.
    assert_eq!(shown + hidden, 50, "{err}");
    assert!(shown >= 20, "{err}");
    assert!(
        shown as f64 <= 20.0 * (secs.ceil() + 1.0),
        "{shown} lines in {secs:.1} s"
    );
    assert!(
        err.lines().count() <= shown + secs.ceil() as usize + 1,
        "{err}"
    );
    eprintln!("{shown} lines shown, {hidden} counted, in {secs:.2} s");
}
