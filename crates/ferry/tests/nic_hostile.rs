//! Hostile frames into a nic-mode sandbox's TAP (docs/SECURITY.md, "nic mode").
//!
//! Under `ferry run --net nic --userns never` the program is the host's root inside the
//! sandbox's network namespace, so it may open an `AF_PACKET` socket on `eth0` and write
//! any frame there, bypassing its own kernel's stack: truncated, garbage and oversized
//! frames, IPv4 fragments, wrong header and datagram lengths, wrong checksums, TCP with
//! every flag combination, spoofed sources, the host's loopback and unspecified
//! addresses as destinations, a flood of SYNs to a denied address. Then, in the same
//! sandbox, an ordinary TCP fetch from a server in a remote namespace must still get
//! every byte; the NIC server's counters (`--stats-json`, under `"nic"`) must show the
//! drops; nothing labelled hostile may reach the remote or the host's loopback; and
//! ferry exits with the program's status. A second test sends only spoofed SYNs and
//! datagrams towards the remote's listeners and checks that none arrives. A third writes
//! SYNs from the sandbox's own address, which its kernel resets at the SYN-ACK: each
//! flow must end, and the remote's connection with it, while the sandbox still runs. A
//! fourth opens 1, then 500 connects to a remote whose answers vanish: the NIC server
//! must spend next to no CPU on them while they wait, and they must end (their host
//! connects with them) once the program has closed its sockets.
//!
//! Root only (a remote namespace, `--userns never`); skipped with a message otherwise.

mod common;

use std::io::{ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// Frame crafting shared by the scripts: checksums, Ethernet/IPv4/IPv6/TCP/UDP, the
/// sandbox's own addresses and the gateway's, read from its kernel, and an `AF_PACKET`
/// socket on eth0.
const FRAMES_PY: &str = r#"
import fcntl, random, socket, struct, sys, time

IF = "eth0"
AF6 = socket.AF_INET6

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff

def ifreq(req):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    return fcntl.ioctl(s.fileno(), req, struct.pack("256s", IF.encode()))

MY4 = socket.inet_ntoa(ifreq(0x8915)[20:24])           # SIOCGIFADDR
MY_MAC = ifreq(0x8927)[18:24]                           # SIOCGIFHWADDR

def gw4():
    for line in open("/proc/net/route").read().splitlines()[1:]:
        f = line.split()
        if f[0] == IF and f[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<I", int(f[2], 16)))
    sys.exit("no IPv4 default route on " + IF)

def v6(field):
    return socket.inet_ntop(AF6, bytes.fromhex(field))

def my6():
    for line in open("/proc/net/if_inet6"):
        f = line.split()
        if f[5] == IF and f[3] == "00":
            return v6(f[0])
    sys.exit("no global IPv6 address on " + IF)

def gw6():
    for line in open("/proc/net/ipv6_route"):
        f = line.split()
        if f[9] == IF and f[1] == "00" and int(f[4], 16) != 0:
            return v6(f[4])
    sys.exit("no IPv6 default route on " + IF)

GW4, MY6, GW6 = gw4(), my6(), gw6()

def gateway_mac(legit):
    # The kernel resolves the gateway for an ordinary datagram (`legit` sends one).
    legit()
    for _ in range(500):
        for line in open("/proc/net/arp").read().splitlines()[1:]:
            f = line.split()
            if f[0] == GW4 and f[2] == "0x2":
                return bytes(int(x, 16) for x in f[3].split(":"))
        time.sleep(0.01)
    sys.exit("the gateway never answered ARP")

def packed(ip):
    return socket.inet_pton(AF6, ip) if ":" in ip else socket.inet_aton(ip)

def pseudo(src, dst, proto, n):
    if ":" in src:
        return packed(src) + packed(dst) + struct.pack("!IxxxB", n, proto)
    return packed(src) + packed(dst) + struct.pack("!xBH", proto, n & 0xffff)

def with_sum(h, at, src, dst, proto, bad):
    c = csum(pseudo(src, dst, proto, len(h)) + h) ^ (0x5555 if bad else 0)
    return h[:at] + struct.pack("!H", c) + h[at + 2:]

def tcp(src, dst, sport, dport, flags, payload=b"", bad=False):
    h = struct.pack("!HHIIBBHHH", sport, dport, 1000, 0, 5 << 4, flags, 65535, 0, 0) + payload
    return with_sum(h, 16, src, dst, 6, bad)

def udp(src, dst, sport, dport, payload, length=None, bad=False):
    n = (8 + len(payload) if length is None else length) & 0xffff
    return with_sum(struct.pack("!HHHH", sport, dport, n, 0) + payload, 6, src, dst, 17, bad)

def ip4(src, dst, proto, l4, frag=0x4000, ihl=5, total=None, bad=False, ver=4):
    total = 20 + len(l4) if total is None else total
    h = struct.pack("!BBHHHBBH4s4s", ver << 4 | ihl, 0, total & 0xffff, 1, frag, 64, proto, 0,
                    packed(src), packed(dst))
    c = csum(h) ^ (0x5555 if bad else 0)
    return h[:10] + struct.pack("!H", c) + h[12:] + l4

def ip6(src, dst, nh, l4, plen=None):
    plen = len(l4) if plen is None else plen
    return struct.pack("!IHBB16s16s", 0x60000000, plen, nh, 64, packed(src), packed(dst)) + l4

def eth(ty, body, dst=None):
    return (dst or GW_MAC) + MY_MAC + struct.pack("!H", ty) + body

def v4(src, dst, proto, l4, **kw):
    return eth(0x0800, ip4(src, dst, proto, l4, **kw))

def v6f(src, dst, nh, l4, **kw):
    return eth(0x86dd, ip6(src, dst, nh, l4, **kw))

def udp4(src, dst, dport, payload, sport=4000):
    return v4(src, dst, 17, udp(src, dst, sport, dport, payload))

def syn4(src, dst, dport, sport=4000):
    return v4(src, dst, 6, tcp(src, dst, sport, dport, 0x02))

PKT = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
PKT.bind((IF, 0))
SENT = [0, 0]

def put(f):
    try:
        PKT.send(f)
        SENT[0] += 1
    except OSError:
        SENT[1] += 1   # too short or too long for the kernel to send at all
"#;

/// The hostile frames, then an ordinary fetch. Arguments: remote IP, its TCP and UDP
/// ports, the host loopback's TCP and UDP sentinel ports, the file for the fetched bytes.
const HOSTILE_PY: &str = r#"
remote, tport, uport, lo_t, lo_u, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
GW_MAC = gateway_mac(lambda: u.sendto(b"legit-first", (remote, uport)))
rnd = random.Random(7)
DENIED = "198.51.100.7"
net = MY4.rsplit(".", 1)[0]

# Truncated: every cut of a datagram and of a SYN to the remote.
for f in (udp4(MY4, remote, uport, b"hostile-cut"), syn4(MY4, remote, tport)):
    for cut in range(len(f)):
        put(f[:cut])
# Garbage of every size up to a few KiB, then oversized (near the 65,520 MTU).
for _ in range(300):
    put(bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 3000))))
for ty in (0x0800, 0x86dd, 0x0806, 0x88cc):
    for _ in range(10):
        put(eth(ty, bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 200)))))
for n in (65000, 65506, 65520, 65600):
    put(eth(0x0800, bytes(rnd.getrandbits(8) for _ in range(n))))
    put(v4(MY4, remote, 17, udp(MY4, remote, 4000, uport, b"hostile-big".ljust(n, b"x")),
           total=0xffff))
# IPv4 fragments (first, middle, last).
for frag in (0x2000, 0x2000 | 185, 185):
    put(v4(MY4, remote, 17, udp(MY4, remote, 4000, uport, b"hostile-frag"), frag=frag))
# Wrong IP header lengths and total lengths; IPv6 payload lengths past the end.
l4 = udp(MY4, remote, 4000, uport, b"hostile-iplen")
for ihl in (0, 1, 4, 15):
    put(v4(MY4, remote, 17, l4, ihl=ihl))
for total in (0, 19, 20, 27, len(l4) + 21, len(l4) + 1000, 0xffff):
    put(v4(MY4, remote, 17, l4, total=total))
l6 = udp(MY6, "2001:db8::1", 4000, 53, b"hostile-ip6len")
for plen in (len(l6) + 1, 0xffff):
    put(v6f(MY6, "2001:db8::1", 17, l6, plen=plen))
# UDP lengths that do not add up (shorter than its header, longer than the packet).
for n in (0, 1, 7, 8 + 20, 8 + 200, 0xffff):
    put(v4(MY4, remote, 17, udp(MY4, remote, 4000, uport, b"hostile-udplen", length=n)))
# Wrong checksums: not verified (harmless: the sandbox may send this datagram anyway).
put(v4(MY4, remote, 17, udp(MY4, remote, 4000, uport, b"badsum", bad=True), bad=True))
put(v4(MY4, DENIED, 6, tcp(MY4, DENIED, 4001, 80, 0x02, bad=True), bad=True))
# TCP with every flag combination, to a denied address and to the host's loopback.
for flags in range(256):
    for dst, port in ((DENIED, 80), ("127.0.0.1", lo_t), ("0.0.0.0", lo_t)):
        put(v4(MY4, dst, 6, tcp(MY4, dst, 20000 + flags, port, flags)))
# Spoofed sources, to the remote's listeners.
for i, src in enumerate((net + ".55", "127.0.0.1", GW4, "0.0.0.0", remote, net + ".255")):
    put(udp4(src, remote, uport, b"hostile-spoof-" + src.encode()))
    put(syn4(src, remote, tport, sport=30000 + i))
for src in (MY6.rsplit(":", 1)[0] + ":55", "::1", GW6, "::"):
    put(v6f(src, "2001:db8::1", 17, udp(src, "2001:db8::1", 4000, 53, b"hostile-spoof")))
# The host's loopback and unspecified addresses, the gateway, broadcast, multicast.
for dst in ("127.0.0.1", "0.0.0.0", GW4, "224.0.0.1", "255.255.255.255"):
    put(udp4(MY4, dst, lo_u, b"hostile-local"))
    put(syn4(MY4, dst, lo_t))
for dst in ("::1", "::", GW6):
    put(v6f(MY6, dst, 17, udp(MY6, dst, 4000, lo_u, b"hostile-local")))
    put(v6f(MY6, dst, 6, tcp(MY6, dst, 4000, lo_t, 0x02)))
# Protocols ferry does not relay: SCTP, an ICMP timestamp request.
put(v4(MY4, remote, 132, b"\0" * 32))
put(v4(MY4, remote, 1, b"\x0d\x00\x00\x00" + b"\0" * 16))
# A SYN flood to a denied address.
for i in range(3000):
    put(syn4(MY4, DENIED, 80, sport=1024 + i))
    if i % 250 == 249:
        time.sleep(0.01)
print("sent", SENT[0], "refused by the kernel", SENT[1], flush=True)

# The same sandbox still works.
time.sleep(0.2)
u.sendto(b"legit-last", (remote, uport))
s = socket.create_connection((remote, tport), timeout=30)
data = bytearray()
while True:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    data += chunk
open(out, "wb").write(data)
print("fetched", len(data), flush=True)
sys.exit(7)
"#;

/// Spoofed SYNs and datagrams only, then one ordinary connection and datagram. Arguments:
/// remote IP, its TCP and UDP ports.
const SPOOFED_PY: &str = r#"
remote, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
GW_MAC = gateway_mac(lambda: u.sendto(b"legit", (remote, uport)))
net = MY4.rsplit(".", 1)[0]
sources = [net + ".55", net + ".1", net + ".101", GW4, "127.0.0.1", "0.0.0.0", remote,
           "10.99.99.99", "192.0.2.1"]
spoofed = 0
for rep in range(5):
    for i, src in enumerate(sources):
        put(udp4(src, remote, uport, b"spoof-" + src.encode(), sport=5000 + i))
        put(syn4(src, remote, tport, sport=6000 + 100 * rep + i))
        spoofed += 2
assert SENT[1] == 0, SENT
print("spoofed", spoofed, flush=True)
time.sleep(0.2)
s = socket.create_connection((remote, tport), timeout=30)
while s.recv(1 << 16):
    pass
print("done", flush=True)
"#;

/// SYNs from the sandbox's own address written raw: no socket of its kernel's owns
/// them, so the kernel answers each SYN-ACK with a reset. Arguments: remote IP, its
/// holding TCP port, its UDP port.
const RESET_HANDSHAKE_PY: &str = r#"
remote, hport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
GW_MAC = gateway_mac(lambda: u.sendto(b"legit", (remote, uport)))
for i in range(HANDSHAKES):
    put(syn4(MY4, remote, hport, sport=7000 + i))
print("syns", SENT, flush=True)
time.sleep(PAUSE)
"#;

/// Handshakes [`RESET_HANDSHAKE_PY`] opens.
const HANDSHAKES: usize = 10;

/// What the remote's listeners saw.
#[derive(Default)]
struct Seen {
    /// Peers of accepted TCP connections.
    conns: Vec<SocketAddr>,
    /// Datagrams: source and payload.
    dgrams: Vec<(SocketAddr, Vec<u8>)>,
}

/// A TCP listener (sends `payload` to each connection, then closes) and a UDP socket in
/// the remote namespace, served by threads of this process; their ports and a record of
/// what they saw.
fn listeners(r: &Remote, payload: Vec<u8>) -> (u16, u16, Arc<Mutex<Seen>>) {
    let ip = r.remote_ip();
    let (tcp, udp) = r
        .run_in(|| {
            (
                TcpListener::bind((ip, 0)).unwrap(),
                UdpSocket::bind((ip, 0)).unwrap(),
            )
        })
        .unwrap();
    let ports = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in tcp.incoming() {
            let Ok(mut c) = c else { continue };
            s.lock().unwrap().conns.push(c.peer_addr().unwrap());
            let _ = c.write_all(&payload);
        }
    });
    let s = seen.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            s.lock().unwrap().dgrams.push((from, buf[..n].to_vec()));
        }
    });
    (ports.0, ports.1, seen)
}

/// `ferry run --net nic --userns never --deny 198.51.100.0/24 --stats-json FILE --
/// python3 -c SCRIPT ARGS…`, output captured; returns it and the one NIC server's
/// counters.
fn run_nic(
    dir: &TempDir,
    script: &str,
    args: &[String],
) -> (std::process::Output, serde_json::Value) {
    let js = dir.path().join("stats.json");
    let mut cmd = ferry();
    cmd.args([
        "run",
        "--net",
        "nic",
        "--userns",
        "never",
        "--deny",
        "198.51.100.0/24",
        "--stats-json",
        js.to_str().unwrap(),
        "--",
        "python3",
        "-c",
    ]);
    cmd.arg(format!("{FRAMES_PY}\n{script}")).args(args);
    let out = output_within(cmd, Duration::from_secs(180));
    let text = std::fs::read_to_string(&js).unwrap_or_else(|e| {
        panic!(
            "no stats ({e}); ferry's stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let v: serde_json::Value = serde_json::from_str(&text).expect("stats JSON");
    let nic = v["nic"][0].clone();
    assert!(nic.is_object(), "no NIC server's counters in {text}");
    (out, nic)
}

fn count(nic: &serde_json::Value, key: &str) -> u64 {
    nic[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {nic}"))
}

fn texts(out: &std::process::Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn hostile_frames_are_dropped_and_the_sandbox_keeps_working() {
    if !can_run(&["python3"]) {
        return;
    }
    let r = remote("nic-hostile");
    let payload = pattern(1 << 20, 11);
    let (tport, uport, seen) = listeners(&r, payload.clone());
    // Sentinels on the host's loopback: nothing the sandbox sends may reach them.
    let lo_tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    lo_tcp.set_nonblocking(true).unwrap();
    let lo_udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    lo_udp.set_nonblocking(true).unwrap();
    let dir = TempDir::new("nic-hostile");
    let fetched = dir.path().join("fetched");
    let args = [
        r.remote_ip().to_string(),
        tport.to_string(),
        uport.to_string(),
        lo_tcp.local_addr().unwrap().port().to_string(),
        lo_udp.local_addr().unwrap().port().to_string(),
        fetched.to_str().unwrap().to_string(),
    ];
    let (out, nic) = run_nic(&dir, HOSTILE_PY, &args);
    let all = texts(&out);
    eprintln!("{all}\nnic: {nic}");
    assert_eq!(
        out.status.code(),
        Some(7),
        "ferry's status is the program's\n{all}"
    );
    let got = std::fs::read(&fetched).unwrap_or_default();
    assert!(
        got == payload,
        "the fetch got {} bytes, not the 1 MiB sent\n{all}",
        got.len()
    );

    std::thread::sleep(Duration::from_millis(300));
    remote_saw_only_the_legit_traffic(&seen.lock().unwrap(), IpAddr::V4(r.host_ip()));
    loopback_sentinels_were_not_reached(&lo_tcp, &lo_udp);
    nic_counted_the_hostile_frames(&nic);
}

/// Checks that the remote saw the one fetch and the legitimate datagrams (and the one
/// with wrong checksums), all from the `host` address, and no hostile datagram.
fn remote_saw_only_the_legit_traffic(seen: &Seen, host: IpAddr) {
    assert_eq!(
        seen.conns.len(),
        1,
        "connections the remote saw: {:?}",
        seen.conns
    );
    assert!(
        seen.conns.iter().all(|p| p.ip() == host),
        "{:?}",
        seen.conns
    );
    let payloads: Vec<String> = seen
        .dgrams
        .iter()
        .map(|(from, p)| {
            assert_eq!(from.ip(), host, "a datagram from {from}");
            String::from_utf8_lossy(p).into_owned()
        })
        .collect();
    for want in ["legit-first", "legit-last", "badsum"] {
        assert!(
            payloads.iter().any(|p| p == want),
            "{want} missing: {payloads:?}"
        );
    }
    assert!(
        !payloads.iter().any(|p| p.starts_with("hostile")),
        "hostile datagrams reached the remote: {payloads:?}"
    );
}

/// Checks that nothing reached the host's loopback sentinels.
fn loopback_sentinels_were_not_reached(lo_tcp: &TcpListener, lo_udp: &UdpSocket) {
    match lo_tcp.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host's loopback listener was reached: {other:?}"),
    }
    let mut buf = [0u8; 2048];
    match lo_udp.recv_from(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host's loopback UDP socket was reached: {other:?}"),
    }
}

/// Checks the NIC server's counters: every kind of hostile frame counted, and flows
/// opened only for the legitimate traffic.
fn nic_counted_the_hostile_frames(nic: &serde_json::Value) {
    for key in ["malformed", "fragments", "unsupported", "spoofed", "denied"] {
        assert!(count(nic, key) > 0, "{key} is 0: {nic}");
    }
    assert!(count(nic, "fragments") >= 3, "{nic}");
    assert!(count(nic, "spoofed") >= 10, "{nic}");
    // The flood alone is 3,000 SYNs to a denied address (the TAP's queue may drop some
    // when the server falls behind: what the server saw is at least most of them).
    assert!(count(nic, "denied") >= 1000, "{nic}");
    assert_eq!(count(nic, "over_cap"), 0, "{nic}");
    // The flows opened: the fetch; the kernel's datagram socket (legit-first and
    // legit-last) and the datagram with wrong checksums. Nothing hostile made one.
    assert_eq!(count(nic, "tcp_flows"), 1, "{nic}");
    assert_eq!(count(nic, "udp_flows"), 2, "{nic}");
    assert_eq!(count(nic, "connect_failed"), 0, "{nic}");
}

#[test]
fn spoofed_sources_never_reach_the_remote() {
    if !can_run(&["python3"]) {
        return;
    }
    let r = remote("nic-spoof");
    let (tport, uport, seen) = listeners(&r, b"hello".to_vec());
    let dir = TempDir::new("nic-spoof");
    let args = [
        r.remote_ip().to_string(),
        tport.to_string(),
        uport.to_string(),
    ];
    let (out, nic) = run_nic(&dir, SPOOFED_PY, &args);
    let all = texts(&out);
    assert!(out.status.success(), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done"), "{all}");
    let spoofed: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("spoofed "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(count(&nic, "spoofed"), spoofed, "{nic}");
    std::thread::sleep(Duration::from_millis(300));
    let seen = seen.lock().unwrap();
    let host = IpAddr::V4(r.host_ip());
    assert_eq!(
        seen.conns.len(),
        1,
        "connections the remote saw: {:?}",
        seen.conns
    );
    assert_eq!(seen.conns[0].ip(), host);
    let payloads: Vec<&[u8]> = seen.dgrams.iter().map(|(_, p)| &p[..]).collect();
    assert_eq!(payloads, [&b"legit"[..]], "datagrams the remote saw");
    assert_eq!(count(&nic, "tcp_flows"), 1, "{nic}");
    assert_eq!(count(&nic, "udp_flows"), 1, "{nic}");
}

/// A listener in the remote namespace that holds each connection until its peer ends
/// or resets it (as a server waiting for a request does); its port, and how many it
/// accepted and saw end.
fn holding_listener(r: &Remote) -> (u16, Arc<Mutex<(usize, usize)>>) {
    let ip = r.remote_ip();
    let l = r.run_in(|| TcpListener::bind((ip, 0)).unwrap()).unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new((0, 0)));
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            s.lock().unwrap().0 += 1;
            let s = s.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while matches!(std::io::Read::read(&mut c, &mut buf), Ok(n) if n > 0) {}
                s.lock().unwrap().1 += 1;
            });
        }
    });
    (port, seen)
}

#[test]
fn a_handshake_the_sandbox_resets_frees_its_flow() {
    if !can_run(&["python3"]) {
        return;
    }
    let r = remote("nic-rst");
    let (hport, seen) = holding_listener(&r);
    let (_, uport, _) = listeners(&r, Vec::new());
    let dir = TempDir::new("nic-rst");
    let js = dir.path().join("stats.json");
    let script = format!("{FRAMES_PY}\nHANDSHAKES = {HANDSHAKES}\nPAUSE = 4\n{RESET_HANDSHAKE_PY}");
    let mut cmd = ferry();
    cmd.args(["run", "--net", "nic", "--userns", "never", "--stats-json"])
        .arg(&js)
        .args(["--", "python3", "-c", &script])
        .args([
            r.remote_ip().to_string(),
            hport.to_string(),
            uport.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = Guard(cmd.spawn().expect("spawn ferry"));
    // Every connection the remote accepted must end while the sandbox still runs: the
    // reset handshake frees its flow and resets the host's connection.
    let t = std::time::Instant::now();
    let ended_in_time = loop {
        let (accepted, ended) = *seen.lock().unwrap();
        if accepted == HANDSHAKES && ended == HANDSHAKES {
            break true;
        }
        if t.elapsed() > Duration::from_secs(3) || matches!(child.0.try_wait(), Ok(Some(_))) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = child.0.wait().expect("ferry ends");
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut err);
    assert!(status.success(), "ferry: {status}\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&js).unwrap()).unwrap();
    let nic = &v["nic"][0];
    assert_eq!(count(nic, "tcp_flows"), HANDSHAKES as u64, "{nic}");
    assert!(
        ended_in_time,
        "the remote's connections (accepted, ended) {:?} were not reset while the sandbox ran; {nic}",
        *seen.lock().unwrap()
    );
    // Only the datagram flow is left.
    assert_eq!(count(nic, "open_at_stop"), 1, "{nic}");
}

/// Opens non-blocking connects to `ip:port` in steps (1, then 499 more), closes them
/// all, each step answered by a line on stdout and waiting for one on stdin.
const PENDING_PY: &str = r#"
import socket, sys
ip, port = sys.argv[1], int(sys.argv[2])
socks = []
def more(n):
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((ip, port))
        except BlockingIOError:
            pass
        socks.append(s)
for step in (1, 499):
    more(step)
    print(len(socks), flush=True)
    sys.stdin.readline()
for s in socks:
    s.close()
print("closed", flush=True)
sys.stdin.readline()
"#;

/// CPU time (user + system) the threads of `pid` named `name` have used.
fn thread_cpu(pid: u32, name: &str) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut ticks = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // After the name (in parentheses): state is field 3, utime and stime 14 and 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        ticks += f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    }
    Duration::from_millis(ticks * 1000 / hz)
}

/// The host's connections to `ip` still waiting for an answer to their SYN.
fn syn_sent_to(ip: std::net::Ipv4Addr) -> usize {
    let o = std::process::Command::new("ss")
        .args(["-Htn", "state", "syn-sent", "dst", &ip.to_string()])
        .output()
        .expect("run ss");
    String::from_utf8_lossy(&o.stdout).lines().count()
}

#[test]
fn pending_connects_cost_nothing_and_end_with_the_program_s_sockets() {
    if !can_run(&["python3", "ss"]) {
        return;
    }
    let r = remote("nic-pend");
    blackhole_the_remotes_answers(&r);
    let dir = TempDir::new("nic-pend");
    let js = dir.path().join("stats.json");
    let mut child = spawn_pending_connects(&r, &js);
    let pid = child.0.id();
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(child.0.stdout.take().unwrap()));
    let mut stdin = child.0.stdin.take().unwrap();
    let mut next = |want: &str| {
        let got = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(got, want, "the program's step");
    };
    next("1");
    nic_server_idles_with_pending_connects(pid, r.remote_ip(), 1);
    writeln!(stdin, "go").unwrap();
    next("500");
    nic_server_idles_with_pending_connects(pid, r.remote_ip(), 500);
    writeln!(stdin, "go").unwrap();
    // The program closed its sockets: the flows end, and their host connects with them,
    // while the sandbox still runs.
    next("closed");
    let t = std::time::Instant::now();
    while syn_sent_to(r.remote_ip()) > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "{} host connects outlived the program's sockets",
            syn_sent_to(r.remote_ip())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    writeln!(stdin, "go").unwrap();
    drop(stdin);
    let status = child.0.wait().expect("ferry ends");
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut err);
    assert!(status.success(), "ferry: {status}\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&js).unwrap()).unwrap();
    let nic = &v["nic"][0];
    assert_eq!(count(nic, "tcp_flows"), 500, "{nic}");
    assert_eq!(count(nic, "abandoned"), 500, "{nic}");
    assert_eq!(count(nic, "open_at_stop"), 0, "{nic}");
}

/// The remote's answers to the host vanish: SYNs arrive, nothing comes back, and the
/// host's connects wait (about two minutes: `tcp_syn_retries`).
fn blackhole_the_remotes_answers(r: &Remote) {
    let o = std::process::Command::new("ip")
        .args(["-n", r.name(), "route", "add", "blackhole"])
        .arg(format!("{}/32", r.host_ip()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", texts(&o));
}

/// ferry (`--net nic`, counters to `js`) running [`PENDING_PY`] against the remote's
/// port 80; stdin, stdout and stderr piped.
fn spawn_pending_connects(r: &Remote, js: &std::path::Path) -> Guard {
    let mut cmd = ferry();
    cmd.args(["run", "--net", "nic", "--stats-json"])
        .arg(js)
        .args(["--", system_python(), "-c", PENDING_PY])
        .args([r.remote_ip().to_string(), "80".into()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    Guard(cmd.spawn().expect("spawn ferry"))
}

/// What the NIC server (of ferry `pid`) spends in 3 s with `flows` connects to `ip`
/// waiting: checks it is under 300 ms of CPU.
fn nic_server_idles_with_pending_connects(pid: u32, ip: std::net::Ipv4Addr, flows: usize) {
    // Let the sandbox's SYNs arrive and their host connects start.
    let t = std::time::Instant::now();
    while syn_sent_to(ip) < flows {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{flows} host connects never started ({} did)",
            syn_sent_to(ip)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = thread_cpu(pid, "ferry-nic");
    std::thread::sleep(Duration::from_secs(3));
    let used = thread_cpu(pid, "ferry-nic") - before;
    eprintln!("{flows} pending connects: the NIC server used {used:?} of CPU in 3 s");
    assert!(
        used < Duration::from_millis(300),
        "with {flows} pending connects the NIC server used {used:?} of CPU in 3 s"
    );
}
