//! Target `frame`: a NIC server (`ferry_nic::NicServer`), in this process, over the
//! in-process harness of `ferry_nic::testkit`: frames whose every byte comes from the
//! input, as a hostile program in a `--net nic` sandbox writes them into its TAP, beside
//! the sandbox's own TCP/IP stack (which opens, writes, closes and resets connections
//! and listens, as the input says), and host sockets the input answers (connects that
//! succeed or fail, bytes, datagrams, ends, resets, a full socket, connections to a
//! published port), while time passes as the input says. Nothing leaves the process:
//! the host's sockets are the harness's model. No root needed. Each input gets a fresh
//! harness (so a failure replays from its input alone). And the frame path's pure
//! functions (`classify`, `offload_tcp`, `prohibited`, the crafted `udp` and
//! `echo_reply`) on each frame.
//!
//! The policy allows 198.51.100.0/24 and 2001:db8:1::/48 and denies everything else:
//! flows to those carry data, every other flow is refused (TCP gets a reset from the
//! stack, UDP and echo "administratively prohibited"). At most [`MAX_FLOWS`] flows.
//!
//! Input: at most [`MAX_RECORDS`] records `flags: u8, len: u16 (LE), bytes[len]`.
//! Flags: bit 0, the harness makes an exchange after this record (a turn of the server,
//! the host's news, frames both ways); bit 1, the bytes are an operation ([`op`]:
//! `op, selector, argument…`), else a frame the sandbox writes; bit 2, exchanges follow
//! until nothing more happens. At the end every
//! connection is reset from both sides and time passes until every flow must be over.
//!
//! Properties, besides no panic (ferry's crates keep debug assertions and overflow
//! checks; the fake device checks every partial checksum lies inside its frame): every
//! frame the server writes reads back as neither malformed nor a fragment; the flows
//! never exceed the cap; every host socket the server opens is one flow's (none leaks,
//! none is shared) and every connected one reaches an allowed destination or comes from
//! a published port's client; what a host socket received of a sandbox connection is a
//! prefix of what the sandbox wrote on it, and what the sandbox read a prefix of what
//! the host sent (no byte lost, changed or reordered); an input of frames alone gets at
//! most [`OUT_PER_IN`] frames back per frame in plus [`OUT_SLACK`]; at the end no flow,
//! stack socket or host socket but the published listener is left.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use ferry_egress::{Policy, Rule, Verdict};
use ferry_nic::frame::{self, ETH_LEN, Inbound, Link, Why};
use ferry_nic::testkit::{Conn, Harness, HostSock};
use ferry_nic::{NicConfig, NicPublish, Plan};
use smoltcp::wire::EthernetAddress;

use crate::input::Input;

/// Most records of one input.
pub const MAX_RECORDS: usize = 256;
/// Most flows the server carries.
pub const MAX_FLOWS: usize = 6;
/// An input of frames alone gets at most this many frames back per frame in…
pub const OUT_PER_IN: u64 = 2;
/// … plus these.
pub const OUT_SLACK: u64 = 4;
/// The published port's listener on the host, and the sandbox's port it reaches.
const PUBLISHED: &str = "127.0.0.1:8080";
const SANDBOX_PORT: u16 = 80;

/// The link ends the target checks crafted frames with.
const LINK: Link = Link {
    ours: EthernetAddress([0x02, 0, 0, 0, 0, 0x02]),
    theirs: EthernetAddress([0x02, 0, 0, 0, 0, 0x64]),
};

/// The policy of every input: the two allowed networks, nothing else.
fn policy() -> Policy {
    static LOG: OnceLock<()> = OnceLock::new();
    LOG.get_or_init(|| {
        // FERRY_FUZZ_LOG=debug (an env filter) shows the server's log, to replay a failure.
        if let Ok(filter) = std::env::var("FERRY_FUZZ_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
    });
    let rule = |v, r| Rule::parse(v, r).expect("literal rule");
    Policy::new(vec![
        rule(Verdict::Allow, "198.51.100.0/24"),
        rule(Verdict::Allow, "2001:db8:1::/48"),
        rule(Verdict::Deny, "0.0.0.0/0"),
        rule(Verdict::Deny, "::/0"),
    ])
}

/// Whether `ip` is one the policy allows.
fn allowed(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.octets()[..3] == [198, 51, 100],
        IpAddr::V6(a) => a.segments()[..3] == [0x2001, 0xdb8, 1],
    }
}

/// A sandbox socket the input opened (a connection to `to`, or a listener), and what
/// went through it.
struct Opened {
    conn: Conn,
    to: Option<SocketAddr>,
    written: Vec<u8>,
    read: Vec<u8>,
}

/// One input's harness and what the target knows of it.
struct Rig {
    h: Harness,
    conns: Vec<Opened>,
    /// Bytes the input made each host socket receive.
    host_in: Vec<(HostSock, Vec<u8>)>,
    /// Clients of the published port.
    clients: Vec<SocketAddr>,
}

impl Rig {
    fn new() -> Rig {
        let mut cfg = NicConfig::new(Plan::avoiding(&[]));
        cfg.policy = policy();
        cfg.max_flows = MAX_FLOWS;
        cfg.tcp_buffer = 32 * 1024;
        let publish = [NicPublish {
            host: PUBLISHED.parse().expect("literal address"),
            sandbox_port: SANDBOX_PORT,
        }];
        Rig {
            h: Harness::with_config(cfg, &publish),
            conns: Vec::new(),
            host_in: Vec::new(),
            clients: Vec::new(),
        }
    }

    /// One exchange, then every check.
    fn exchange(&mut self) {
        self.h.turn();
        self.check();
    }

    /// Exchanges until nothing more happens.
    fn settle(&mut self) {
        self.h.run();
        self.check();
    }

    fn host_sock(&self, sel: u8) -> Option<HostSock> {
        let all = self.h.host().all();
        (!all.is_empty()).then(|| all[usize::from(sel) % all.len()])
    }

    fn conn(&mut self, sel: u8) -> Option<&mut Opened> {
        let n = self.conns.len();
        (n > 0).then(|| &mut self.conns[usize::from(sel) % n])
    }

    /// The properties that hold between any two steps (see the module's header).
    fn check(&mut self) {
        for f in self.h.take_raw_frames() {
            assert!(
                !matches!(
                    frame::classify(&f),
                    Inbound::Drop(Why::Malformed | Why::Fragment)
                ),
                "the server wrote {:?}: {f:02x?}",
                frame::classify(&f)
            );
        }
        let (flows, _) = self.h.flows();
        assert!(flows <= MAX_FLOWS, "{flows} flows");
        // One host socket a flow, and the listener.
        assert_eq!(
            self.h.host().open().len(),
            flows + 1,
            "host sockets leaked or shared"
        );
        for s in self.h.host().all() {
            let v = self.h.host().view(s);
            if let Some(p) = v.peer {
                assert!(
                    allowed(p.ip()) || self.clients.contains(&p),
                    "a host socket to {p}"
                );
            }
        }
        for o in &mut self.conns {
            o.read.extend(self.h.read(o.conn));
            let Some(dst) = o.to else {
                continue;
            };
            let to: Vec<_> = self
                .h
                .host()
                .all()
                .into_iter()
                .filter(|s| self.h.host().view(*s).peer == Some(dst))
                .collect();
            let [s] = to[..] else {
                continue;
            };
            let sent = self.h.host().view(s).sent;
            assert!(o.written.starts_with(&sent), "bytes to the host changed");
            if let Some((_, given)) = self.host_in.iter().find(|(h, _)| *h == s) {
                assert!(given.starts_with(&o.read), "bytes to the sandbox changed");
            }
        }
    }

    /// Resets every connection from both sides and lets time pass: nothing may be left.
    fn finish(&mut self) {
        self.h.device_room(None);
        for o in &self.conns {
            self.h.abort(o.conn);
        }
        for s in self.h.host().open() {
            self.h.host().reset(s);
        }
        self.settle();
        for _ in 0..70 {
            self.h.advance(Duration::from_secs(2));
            self.check();
        }
        let st = self.h.counters();
        assert_eq!(self.h.flows(), (0, 0), "flows left: {st:?}");
        assert_eq!(self.h.stack_sockets(), 0, "stack sockets left");
        assert_eq!(self.h.host().open().len(), 1, "host sockets left");
    }
}

/// An operation of the input (`bytes`: op, selector, argument).
fn op(rig: &mut Rig, bytes: &[u8]) {
    let (&op, rest) = bytes.split_first().unwrap_or((&0, &[]));
    let (&sel, arg) = rest.split_first().unwrap_or((&0, &[]));
    let host = rig.host_sock(sel);
    let h = rig.h.host();
    match (op % 16, host) {
        (0, Some(s)) => h.connect_done(s, 0),
        (1, Some(s)) => h.connect_done(s, libc::ECONNREFUSED),
        (2, Some(s)) => {
            h.data(s, arg);
            match rig.host_in.iter_mut().find(|(x, _)| *x == s) {
                Some((_, given)) => given.extend_from_slice(arg),
                None => rig.host_in.push((s, arg.to_vec())),
            }
        }
        (3, Some(s)) => h.datagram(s, arg),
        (4, Some(s)) => h.fin(s),
        (5, Some(s)) => h.reset(s),
        (6, Some(s)) => h.room(s, Some(arg.len())),
        (7, Some(s)) => h.room(s, None),
        (8, _) => rig.h.advance(Duration::from_millis(u64::from(sel) * 50)),
        (9, _) => {
            let port = 1024 + u16::from(sel);
            let client = if arg.first().is_some_and(|b| b & 1 == 1) {
                SocketAddr::new([198, 51, 100, 250].into(), port)
            } else {
                SocketAddr::new([127, 0, 0, 1].into(), port)
            };
            let at = PUBLISHED.parse().expect("literal address");
            let s = rig.h.host().incoming(at, client);
            rig.clients.push(client);
            rig.host_in.push((s, Vec::new()));
        }
        (10, _) => {
            let i = rig.conns.len() as u16;
            let to = if sel & 1 == 0 {
                SocketAddr::new([198, 51, 100, 1 + (sel >> 1) % 8].into(), 1000 + i)
            } else {
                let ip = std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, u16::from(sel));
                SocketAddr::new(ip.into(), 1000 + i)
            };
            if let Some(&p) = arg.first() {
                rig.h
                    .host()
                    .script_connect(to, if p & 1 == 1 { 0 } else { libc::EINPROGRESS });
            }
            let conn = rig.h.connect(to);
            rig.conns.push(Opened {
                conn,
                to: Some(to),
                written: Vec::new(),
                read: Vec::new(),
            });
        }
        (11, _) => {
            if let Some(o) = rig.conn(sel) {
                let c = o.conn;
                let n = rig.h.write(c, arg);
                if let Some(o) = rig.conn(sel) {
                    o.written.extend_from_slice(&arg[..n]);
                }
            }
        }
        (12, _) => {
            if let Some(c) = rig.conn(sel).map(|o| o.conn) {
                rig.h.close(c);
            }
        }
        (13, _) => {
            if let Some(c) = rig.conn(sel).map(|o| o.conn) {
                rig.h.abort(c);
            }
        }
        (14, _) => {
            let conn = rig.h.listen(SANDBOX_PORT + u16::from(sel % 2));
            rig.conns.push(Opened {
                conn,
                to: None,
                written: Vec::new(),
                read: Vec::new(),
            });
        }
        (15, _) => rig
            .h
            .device_room((sel != 0).then_some(usize::from(sel % 4))),
        _ => {}
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let _ = script(data);
}

/// Runs one input; the server's counters at the end.
pub fn script(data: &[u8]) -> ferry_nic::NicStats {
    let mut inp = Input::new(data);
    let mut rig = Rig::new();
    let mut out = vec![0u8; ETH_LEN + 65_536];
    let mut ops = false;
    for _ in 0..MAX_RECORDS {
        if inp.is_empty() {
            break;
        }
        let flags = inp.u8();
        let bytes = inp.bytes16();
        if flags & 2 == 0 {
            pure(bytes, &mut out);
            rig.h.send_frame(bytes.to_vec());
        } else {
            ops = true;
            op(&mut rig, bytes);
        }
        if flags & 4 != 0 {
            rig.settle();
        } else if flags & 1 != 0 {
            rig.exchange();
        }
    }
    rig.settle();
    let s = rig.h.counters();
    if !ops {
        // Frames alone (and the sandbox's stack's answers): no amplification.
        assert!(
            s.frames_out + s.tap_full <= OUT_PER_IN * s.frames_in + OUT_SLACK,
            "{} frames in, {} out ({} lost to a full queue)",
            s.frames_in,
            s.frames_out,
            s.tap_full
        );
    }
    rig.finish();
    s
}

/// The frame path's pure functions on `f` (`out`: room for any frame).
fn pure(f: &[u8], out: &mut [u8]) {
    let inbound = frame::classify(f);
    // `offload_tcp`: at most the checksum field it names, inside the frame.
    let mut copy = f.to_vec();
    match frame::offload_tcp(&mut copy) {
        Some((start, off)) => {
            let (start, off) = (usize::from(start), usize::from(off));
            assert_eq!(off, 16);
            assert!(
                start >= ETH_LEN + 20 && start + 20 <= f.len(),
                "start {start}"
            );
            for (i, (a, b)) in f.iter().zip(&copy).enumerate() {
                assert!(
                    a == b || (start + off..start + off + 2).contains(&i),
                    "byte {i}"
                );
            }
        }
        None => assert_eq!(f, &copy[..]),
    }
    // `prohibited`: a well-formed unreachable to the frame's source, within the buffer.
    let src = match inbound {
        Inbound::Tcp { src, .. } | Inbound::Udp { src, .. } => Some(src.ip()),
        Inbound::Echo { src, .. } => Some(src),
        _ => None,
    };
    let plan = &Plan::avoiding(&[]);
    for gw in [IpAddr::V4(plan.gw4), IpAddr::V6(plan.gw6)] {
        for room in [out.len(), 64, 100] {
            let Some(n) = frame::prohibited(&mut out[..room], LINK, gw, f) else {
                continue;
            };
            assert!(n <= room);
            let answer = &out[..n];
            assert!(
                !matches!(
                    frame::classify(answer),
                    Inbound::Drop(Why::Malformed | Why::Fragment)
                ),
                "prohibited wrote {answer:02x?}"
            );
            if let Some(src) = src.filter(|s| s.is_ipv4() == gw.is_ipv4()) {
                assert_eq!(ip_dst(answer), Some(src), "prohibited to another address");
            }
        }
    }
    // A datagram answered the other way reads back as itself reversed.
    match inbound {
        Inbound::Udp { src, dst, payload } => match frame::udp(out, LINK, dst, src, payload) {
            Some(n) => assert_eq!(
                frame::classify(&out[..n]),
                Inbound::Udp {
                    src: dst,
                    dst: src,
                    payload
                }
            ),
            None => assert!(payload.len() > 65_000, "{} bytes not framed", payload.len()),
        },
        Inbound::Echo {
            src,
            dst,
            ident,
            seq,
            data,
        } => match frame::echo_reply(out, LINK, dst, src, ident, seq, data) {
            Some(n) => {
                let reply = &out[..n];
                assert_eq!(ip_dst(reply), Some(src));
                let want = if src.is_ipv4() {
                    Inbound::Drop(Why::Unsupported)
                } else {
                    Inbound::Stack
                };
                assert_eq!(frame::classify(reply), want, "{reply:02x?}");
            }
            None => assert!(data.len() > 65_000, "{} bytes not framed", data.len()),
        },
        _ => {}
    }
}

/// The destination address of an IPv4 or IPv6 frame.
fn ip_dst(f: &[u8]) -> Option<IpAddr> {
    match u16::from_be_bytes([*f.get(12)?, *f.get(13)?]) {
        0x0800 => {
            let b: [u8; 4] = f.get(ETH_LEN + 16..ETH_LEN + 20)?.try_into().ok()?;
            Some(IpAddr::from(b))
        }
        0x86dd => {
            let b: [u8; 16] = f.get(ETH_LEN + 24..ETH_LEN + 40)?.try_into().ok()?;
            Some(IpAddr::from(b))
        }
        _ => None,
    }
}

/// Frames a program in the sandbox could write, for the seeds and tests: Ethernet,
/// IPv4/IPv6, TCP, UDP, ICMP, ARP, neighbour discovery, with correct checksums.
pub mod craft {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    /// The sandbox interface's hardware address in these frames.
    pub const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
    /// The gateway's (a NIC server's) hardware address.
    pub const GATEWAY: [u8; 6] = [0x02, 0x66, 0x65, 0x72, 0x72, 0x79];
    /// Broadcast.
    pub const BROADCAST: [u8; 6] = [0xff; 6];

    /// An Ethernet frame.
    pub fn eth(dst: [u8; 6], ty: u16, body: &[u8]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&MAC);
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    /// The Internet checksum of `b` starting from `sum`.
    pub fn checksum(sum: u32, b: &[u8]) -> u16 {
        let mut s = sum
            + b.chunks(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
                .sum::<u32>();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    /// An IP packet `src` → `dst` (one family) of protocol `proto` in a frame to `mac`;
    /// `l4`'s checksum (at `csum`, when given) is filled in with the pseudo-header's.
    pub fn ip(
        mac: [u8; 6],
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
        mut l4: Vec<u8>,
        csum: Option<usize>,
    ) -> Vec<u8> {
        let len = l4.len();
        let mut pseudo = Vec::new();
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                pseudo.extend_from_slice(&s.octets());
                pseudo.extend_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                pseudo.extend_from_slice(&s.octets());
                pseudo.extend_from_slice(&d.octets());
            }
            _ => panic!("mixed families"),
        }
        if let Some(at) = csum {
            let sum = u32::from(proto) + len as u32;
            let c = checksum(sum + u32::from(checksum(0, &pseudo) ^ 0xffff), &l4);
            l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        match (src, dst) {
            (IpAddr::V4(_), _) => {
                let mut h = vec![0x45, 0];
                h.extend_from_slice(&((20 + len) as u16).to_be_bytes());
                h.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
                h.extend_from_slice(&pseudo);
                let c = checksum(0, &h);
                h[10..12].copy_from_slice(&c.to_be_bytes());
                h.extend_from_slice(&l4);
                eth(mac, 0x0800, &h)
            }
            _ => {
                let mut h = vec![0x60, 0, 0, 0];
                h.extend_from_slice(&(len as u16).to_be_bytes());
                h.extend_from_slice(&[proto, 64]);
                h.extend_from_slice(&pseudo);
                h.extend_from_slice(&l4);
                eth(mac, 0x86dd, &h)
            }
        }
    }

    /// A TCP segment with `flags` (SYN 0x02, ACK 0x10, …), sequence number 1000.
    pub fn tcp(mac: [u8; 6], src: IpAddr, dst: IpAddr, ports: (u16, u16), flags: u8) -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(&ports.0.to_be_bytes());
        t.extend_from_slice(&ports.1.to_be_bytes());
        t.extend_from_slice(&1000u32.to_be_bytes());
        t.extend_from_slice(&0u32.to_be_bytes());
        t.extend_from_slice(&[0x60, flags, 0xff, 0xff, 0, 0, 0, 0]);
        t.extend_from_slice(&[2, 4, 0x05, 0xb4]); // MSS 1460
        ip(mac, src, dst, 6, t, Some(16))
    }

    /// A UDP datagram carrying `payload`.
    pub fn udp(
        mac: [u8; 6],
        src: IpAddr,
        dst: IpAddr,
        ports: (u16, u16),
        payload: &[u8],
    ) -> Vec<u8> {
        let mut u = Vec::new();
        u.extend_from_slice(&ports.0.to_be_bytes());
        u.extend_from_slice(&ports.1.to_be_bytes());
        u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        ip(mac, src, dst, 17, u, Some(6))
    }

    /// An echo request (ICMP or ICMPv6 by the addresses' family).
    pub fn echo(
        mac: [u8; 6],
        src: IpAddr,
        dst: IpAddr,
        ident: u16,
        seq: u16,
        data: &[u8],
    ) -> Vec<u8> {
        let v4 = src.is_ipv4();
        let mut m = vec![if v4 { 8 } else { 128 }, 0, 0, 0];
        m.extend_from_slice(&ident.to_be_bytes());
        m.extend_from_slice(&seq.to_be_bytes());
        m.extend_from_slice(data);
        if v4 {
            let c = checksum(0, &m);
            m[2..4].copy_from_slice(&c.to_be_bytes());
            ip(mac, src, dst, 1, m, None)
        } else {
            ip(mac, src, dst, 58, m, Some(2))
        }
    }

    /// An ARP request from `sender` for `target`'s hardware address (broadcast).
    pub fn arp_request(sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
        let mut a = vec![0, 1, 0x08, 0x00, 6, 4, 0, 1];
        a.extend_from_slice(&MAC);
        a.extend_from_slice(&sender.octets());
        a.extend_from_slice(&[0; 6]);
        a.extend_from_slice(&target.octets());
        eth(BROADCAST, 0x0806, &a)
    }

    /// A neighbour solicitation from `sender` for `target` (to its solicited-node
    /// multicast address), with the source link-layer address option.
    pub fn neighbour_solicit(sender: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
        let t = target.octets();
        let group = Ipv6Addr::new(
            0xff02,
            0,
            0,
            0,
            0,
            1,
            0xff00 | u16::from(t[13]),
            u16::from_be_bytes([t[14], t[15]]),
        );
        let g = group.octets();
        let mac = [0x33, 0x33, g[12], g[13], g[14], g[15]];
        let mut m = vec![135, 0, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&t);
        m.extend_from_slice(&[1, 1]);
        m.extend_from_slice(&MAC);
        let mut f = ip(mac, IpAddr::V6(sender), IpAddr::V6(group), 58, m, Some(2));
        f[ETH_HOP] = 255; // neighbour discovery wants hop limit 255
        f
    }

    /// Offset of the IPv6 hop limit in a frame.
    const ETH_HOP: usize = 14 + 7;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(name: &str) -> Vec<u8> {
        crate::seeds::frames()
            .into_iter()
            .find(|(n, _)| n == name)
            .expect("a seed of that name")
            .1
    }

    #[test]
    fn each_seed_is_answered_as_a_denied_flow_or_by_the_stack() {
        for (name, want_out) in [("arp", 1), ("ndp", 1)] {
            let s = script(&seed(name));
            assert_eq!(
                (s.frames_in, s.frames_out, s.denied),
                (1, want_out, 0),
                "{name}: {s:?}"
            );
        }
        for name in ["udp4", "udp6", "echo4", "echo6"] {
            let s = script(&seed(name));
            assert_eq!(s.frames_in, 1, "{name}: {s:?}");
            assert_eq!(s.denied, 1, "{name}: {s:?}");
            assert_eq!(s.frames_out, 1, "{name}: one answer: {s:?}");
        }
        // A SYN (no ARP before it): the stack asks for the sandbox's hardware address
        // first (its reset is lost, as a kernel's is), the sandbox's stack answers.
        for name in ["syn4", "syn6"] {
            let s = script(&seed(name));
            assert_eq!(
                (s.frames_in, s.denied, s.frames_out),
                (2, 1, 1),
                "{name}: {s:?}"
            );
            assert_eq!(s.tcp_flows, 0, "{name}: {s:?}");
        }
        let s = script(&seed("big"));
        assert_eq!((s.frames_in, s.denied, s.frames_out), (2, 2, 2), "{s:?}");
        let s = script(&seed("session"));
        assert_eq!(s.frames_in, 12, "{s:?}");
        assert_eq!((s.spoofed, s.fragments, s.malformed), (1, 1, 1), "{s:?}");
        assert_eq!(s.denied, 6, "{s:?}");
    }

    #[test]
    fn the_flows_seed_moves_data_through_every_kind_of_flow() {
        let s = script(&seed("flows"));
        assert_eq!(
            (s.tcp_flows, s.udp_flows, s.echo_flows, s.published_flows),
            (1, 1, 1, 1),
            "{s:?}"
        );
        assert_eq!(s.denied, 0, "{s:?}");
        // TCP "hello" out, "world" in; the datagram's query and answer; the published
        // connection's "hi" in, "yo" out.
        assert_eq!((s.bytes_out, s.bytes_in), (5 + 5 + 2, 5 + 6 + 2), "{s:?}");
    }
}
