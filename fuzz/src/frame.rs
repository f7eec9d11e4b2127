//! Target `frame`: a NIC server (`ferry_nic::NicServer`), in this process, fed frames
//! whose every byte comes from the input, as a hostile program in a `--net nic` sandbox
//! writes them into its TAP; and the frame path's pure functions (`classify`,
//! `offload_tcp`, `prohibited`, the crafted `udp` and `echo_reply`) on each frame.
//!
//! The server's queue is one end of an `AF_UNIX` `SOCK_SEQPACKET` pair (one frame per
//! message, as on a TAP queue); the target holds the other end, writes the input's
//! frames behind a `virtio_net_hdr` and reads every frame the server writes back. The
//! server's policy denies every destination (0.0.0.0/0 and ::/0), so it never makes a
//! host socket: every flow is refused (TCP gets a reset from the stack, UDP and echo
//! "administratively prohibited") and nothing leaves the process. No root needed. Each
//! input gets a fresh server (so a failure replays from its input alone).
//!
//! Input: at most [`MAX_FRAMES`] records `flags: u8, len: u16 (LE), bytes[len]`. Flags:
//! bit 0, the server takes a turn after this frame (else frames queue up, up to a turn's
//! batch and beyond); bit 1, the bytes are written as they are, without a
//! `virtio_net_hdr` in front (the message may be shorter than one). At the end the
//! server takes turns until it has nothing left to do.
//!
//! Properties, besides no panic (ferry's crates keep debug assertions and overflow
//! checks): the server reads every frame written (`frames_in`), opens no flow (the
//! policy refuses them all), writes at most [`OUT_PER_IN`] frames per frame in plus
//! [`OUT_SLACK`] (an answer and a neighbour query each), each a whole frame behind a
//! valid header (`NEEDS_CSUM` offsets inside the frame) that reads back as neither
//! malformed nor a fragment; `frames_out` is what the target read. On each frame:
//! `offload_tcp` changes at most the two checksum bytes it names, inside the frame;
//! `prohibited` writes within its buffer a well-formed frame to the frame's source; a
//! classified UDP datagram or echo request answered with `udp`/`echo_reply` reads back
//! as the same datagram reversed or as a valid reply.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use ferry_nic::frame::{self, ETH_LEN, Inbound, Link, Why};
use ferry_nic::{NicConfig, NicServer, Plan};
use ferry_egress::{Policy, Rule, Verdict};
use smoltcp::wire::EthernetAddress;

use crate::input::Input;

/// Most frames of one input.
pub const MAX_FRAMES: usize = 256;
/// Most frames the server may write per frame it reads…
pub const OUT_PER_IN: u64 = 2;
/// … plus these.
pub const OUT_SLACK: u64 = 4;
/// The `virtio_net_hdr` in front of every frame on the queue.
const HDR: usize = ferry_sys::tun::VNET_HDR_LEN;
/// Largest message the server writes (and more).
const BUF: usize = 70_000;
/// Turns the server may take to drain its queue at the end (64 frames a turn).
const MAX_DRAIN: usize = MAX_FRAMES / 8 + 16;

/// The link ends the target checks crafted frames with.
const LINK: Link = Link {
    ours: EthernetAddress([0x02, 0, 0, 0, 0, 0x02]),
    theirs: EthernetAddress([0x02, 0, 0, 0, 0, 0x64]),
};

/// Every NIC server of the target shares this configuration: the default plan, a
/// policy that denies everything.
fn config() -> Arc<NicConfig> {
    static CFG: OnceLock<Arc<NicConfig>> = OnceLock::new();
    CFG.get_or_init(|| {
        // FERRY_FUZZ_LOG=debug (an env filter) shows the server's log, to replay a failure.
        if let Ok(filter) = std::env::var("FERRY_FUZZ_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
        let mut cfg = NicConfig::new(Plan::avoiding(&[]));
        cfg.policy = Policy::new(
            ["0.0.0.0/0", "::/0"]
                .iter()
                .map(|r| Rule::parse(Verdict::Deny, r).expect("literal rule"))
                .collect(),
        );
        Arc::new(cfg)
    })
    .clone()
}

/// A server on one end of a fresh pair, and the other end.
struct Rig {
    server: NicServer,
    tap: OwnedFd,
    buf: Vec<u8>,
    /// Frames written to the server, and read from it.
    written: u64,
    read: u64,
}

impl Rig {
    fn new() -> Rig {
        let (ours, theirs) = ferry_sys::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
        .expect("socketpair");
        let server = NicServer::new(0, theirs, config(), &[]).expect("NIC server");
        Rig {
            server,
            tap: ours,
            buf: vec![0; BUF],
            written: 0,
            read: 0,
        }
    }

    /// Writes one message into the queue, letting the server take turns while it is full.
    fn write(&mut self, msg: &[u8]) {
        for _ in 0..64 {
            match ferry_sys::send_nosignal(self.tap.as_fd(), msg) {
                Ok(_) => {
                    self.written += 1;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.step();
                }
                Err(e) => panic!("writing into the server's queue: {e}"),
            }
        }
        panic!("the server stopped reading its queue");
    }

    /// One turn of the server, then every frame it wrote read and checked.
    fn step(&mut self) -> bool {
        let busy = self.server.step();
        self.drain();
        busy
    }

    fn drain(&mut self) {
        let mtu = config().plan.mtu as usize;
        loop {
            let n = match ferry_sys::recv(self.tap.as_fd(), &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("reading the server's frames: {e}"),
            };
            self.read += 1;
            let msg = &self.buf[..n];
            assert!(
                n > HDR,
                "a message of {n} bytes: no frame behind the header"
            );
            let (hdr, f) = msg.split_at(HDR);
            assert!(f.len() <= mtu + ETH_LEN, "a frame of {} bytes", f.len());
            match hdr[0] {
                0 => assert_eq!(hdr, &[0; HDR], "header {hdr:?}"),
                ferry_sys::tun::VNET_NEEDS_CSUM => {
                    let start = usize::from(u16::from_le_bytes([hdr[6], hdr[7]]));
                    let off = usize::from(u16::from_le_bytes([hdr[8], hdr[9]]));
                    assert!(start + off + 2 <= f.len(), "checksum offsets {hdr:?}");
                }
                _ => panic!("header {hdr:?}"),
            }
            assert!(
                !matches!(
                    frame::classify(f),
                    Inbound::Drop(Why::Malformed | Why::Fragment)
                ),
                "the server wrote {:?}: {f:02x?}",
                frame::classify(f)
            );
        }
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
    let mut msg = Vec::with_capacity(HDR + usize::from(u16::MAX));
    let mut out = vec![0u8; ETH_LEN + 65_536];
    for _ in 0..MAX_FRAMES {
        if inp.is_empty() {
            break;
        }
        let flags = inp.u8();
        let bytes = inp.bytes16();
        pure(bytes, &mut out);
        msg.clear();
        if flags & 2 == 0 {
            msg.extend_from_slice(&[0; HDR]);
        }
        msg.extend_from_slice(bytes);
        rig.write(&msg);
        if flags & 1 != 0 {
            rig.step();
        }
    }
    let mut turns = 0;
    while rig.step() {
        turns += 1;
        assert!(
            turns < MAX_DRAIN,
            "the server is still busy after {turns} turns"
        );
    }
    let s = rig.server.counters();
    assert_eq!(s.frames_in, rig.written, "frames left in the queue");
    assert_eq!(s.frames_out, rig.read, "frames written but not read");
    assert_eq!(
        (s.tcp_flows, s.udp_flows, s.echo_flows, s.published_flows),
        (0, 0, 0, 0),
        "a flow opened under a policy that denies everything: {s:?}"
    );
    assert_eq!(s.open_at_stop, 0, "flows open: {s:?}");
    assert!(
        s.frames_out + s.tap_full <= OUT_PER_IN * s.frames_in + OUT_SLACK,
        "{} frames in, {} out ({} lost to a full queue)",
        s.frames_in,
        s.frames_out,
        s.tap_full
    );
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
    let plan = &config().plan;
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
        for name in ["syn4", "syn6", "udp4", "udp6", "echo4", "echo6"] {
            let s = script(&seed(name));
            assert_eq!(s.frames_in, 1, "{name}: {s:?}");
            assert_eq!(s.denied, 1, "{name}: {s:?}");
            assert_eq!(s.frames_out, 1, "{name}: one answer: {s:?}");
        }
        let s = script(&seed("big"));
        assert_eq!((s.frames_in, s.denied, s.frames_out), (2, 2, 2), "{s:?}");
        let s = script(&seed("session"));
        assert_eq!(s.frames_in, 12, "{s:?}");
        assert_eq!((s.spoofed, s.fragments, s.malformed), (1, 1, 1), "{s:?}");
        assert_eq!(s.denied, 6, "{s:?}");
    }
}
