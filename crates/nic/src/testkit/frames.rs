//! Frames for the harness: what a sandbox writes, built with complete checksums
//! ([`udp`], [`echo`], [`tcp`]), and what the server wrote, read back ([`decode`]).

use std::net::{IpAddr, SocketAddr};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, Icmpv4DstUnreachable, Icmpv4Message, Icmpv4Packet, Icmpv4Repr,
    Icmpv6DstUnreachable, Icmpv6Message, Icmpv6Packet, Icmpv6Repr, IpProtocol, Ipv4Packet,
    Ipv6Packet, TcpPacket,
};

use super::SANDBOX_MAC;
use crate::frame::{self, ETH_LEN, Link};
use crate::server::GATEWAY_MAC;

/// The link as the sandbox writes frames: to the gateway.
const TO_GATEWAY: Link = Link {
    ours: SANDBOX_MAC,
    theirs: GATEWAY_MAC,
};

/// Room for any frame these build.
const ROOM: usize = ETH_LEN + 40 + 60 + 65_536;

fn build(f: impl FnOnce(&mut [u8]) -> Option<usize>) -> Vec<u8> {
    let mut out = vec![0; ROOM];
    let n = f(&mut out).expect("a frame the builders can make");
    out.truncate(n);
    out
}

/// A UDP datagram `src` → `dst` carrying `payload`.
pub fn udp(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    build(|out| frame::udp(out, TO_GATEWAY, src, dst, payload))
}

/// An echo request `src` → `dst` (ICMP or ICMPv6 by the family).
pub fn echo(src: IpAddr, dst: IpAddr, ident: u16, seq: u16, data: &[u8]) -> Vec<u8> {
    let caps = ChecksumCapabilities::default();
    build(|out| match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => {
            let repr = Icmpv4Repr::EchoRequest {
                ident,
                seq_no: seq,
                data,
            };
            let len = repr.buffer_len();
            frame::ip_frame(out, TO_GATEWAY, src, dst, IpProtocol::Icmp, len, |b| {
                repr.emit(&mut Icmpv4Packet::new_unchecked(b), &caps)
            })
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let repr = Icmpv6Repr::EchoRequest {
                ident,
                seq_no: seq,
                data,
            };
            let len = repr.buffer_len();
            frame::ip_frame(out, TO_GATEWAY, src, dst, IpProtocol::Icmpv6, len, |b| {
                repr.emit(&s, &d, &mut Icmpv6Packet::new_unchecked(b), &caps)
            })
        }
        _ => None,
    })
}

/// TCP flags.
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;
pub const FIN: u8 = 0x01;

/// A TCP segment `src` → `dst` with `flags`, sequence number `seq` (acknowledging
/// `ack` when `flags` has [`ACK`]), options `opts` (padded to 4 bytes) and `payload`.
pub fn tcp(
    src: SocketAddr,
    dst: SocketAddr,
    (flags, seq, ack): (u8, u32, u32),
    opts: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let opt_len = opts.len().div_ceil(4) * 4;
    let hdr = 20 + opt_len;
    let mut f = build(|out| {
        frame::ip_frame(
            out,
            TO_GATEWAY,
            src.ip(),
            dst.ip(),
            IpProtocol::Tcp,
            hdr + payload.len(),
            |b| {
                b[..hdr].fill(0);
                b[0..2].copy_from_slice(&src.port().to_be_bytes());
                b[2..4].copy_from_slice(&dst.port().to_be_bytes());
                b[4..8].copy_from_slice(&seq.to_be_bytes());
                b[8..12].copy_from_slice(&ack.to_be_bytes());
                b[12] = ((hdr / 4) as u8) << 4;
                b[13] = flags;
                b[14..16].copy_from_slice(&65_535u16.to_be_bytes());
                b[20..20 + opts.len()].copy_from_slice(opts);
                b[hdr..].copy_from_slice(payload);
            },
        )
    });
    if let Some(p) = frame::offload_tcp(&mut f) {
        frame::complete_partial(&mut f, p);
    }
    f
}

/// A SYN `src` → `dst` with an MSS option.
pub fn syn(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    tcp(src, dst, (SYN, 1000, 0), &[2, 4, 0x05, 0xb4], b"")
}

/// A frame the server wrote, read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Tcp {
        src: SocketAddr,
        dst: SocketAddr,
        /// The flags byte ([`SYN`], [`ACK`], [`RST`], [`FIN`]…).
        flags: u8,
        seq: u32,
        ack: u32,
        payload: Vec<u8>,
    },
    Udp {
        src: SocketAddr,
        dst: SocketAddr,
        payload: Vec<u8>,
    },
    EchoReply {
        src: IpAddr,
        dst: IpAddr,
        ident: u16,
        seq: u16,
        data: Vec<u8>,
    },
    /// "Communication administratively prohibited" from `src` to `dst`.
    Prohibited { src: IpAddr, dst: IpAddr },
    /// Anything else (ARP, neighbour discovery).
    Other,
}

impl Seen {
    /// Whether it is a TCP segment with every flag of `flags`.
    pub fn is_tcp(&self, flags: u8) -> bool {
        matches!(self, Seen::Tcp { flags: f, .. } if f & flags == flags)
    }
}

/// The IP packet of an Ethernet frame: (source, destination, protocol, payload).
fn ip(f: &[u8]) -> Option<(IpAddr, IpAddr, IpProtocol, &[u8])> {
    let eth = EthernetFrame::new_checked(f).ok()?;
    let ip = &f[ETH_LEN..];
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let p = Ipv4Packet::new_checked(ip).ok()?;
            let body = ip.get(usize::from(p.header_len())..usize::from(p.total_len()))?;
            Some((
                p.src_addr().into(),
                p.dst_addr().into(),
                p.next_header(),
                body,
            ))
        }
        EthernetProtocol::Ipv6 => {
            let p = Ipv6Packet::new_checked(ip).ok()?;
            let body = ip.get(40..40 + usize::from(p.payload_len()))?;
            Some((
                p.src_addr().into(),
                p.dst_addr().into(),
                p.next_header(),
                body,
            ))
        }
        _ => None,
    }
}

/// Reads a frame the server wrote.
pub fn decode(f: &[u8]) -> Seen {
    let Some((src, dst, proto, body)) = ip(f) else {
        return Seen::Other;
    };
    match proto {
        IpProtocol::Tcp => match TcpPacket::new_checked(body) {
            Ok(t) => Seen::Tcp {
                src: SocketAddr::new(src, t.src_port()),
                dst: SocketAddr::new(dst, t.dst_port()),
                flags: body[13],
                seq: u32::from_be_bytes([body[4], body[5], body[6], body[7]]),
                ack: u32::from_be_bytes([body[8], body[9], body[10], body[11]]),
                payload: t.payload().to_vec(),
            },
            Err(_) => Seen::Other,
        },
        IpProtocol::Udp => match frame::classify(f) {
            frame::Inbound::Udp { src, dst, payload } => Seen::Udp {
                src,
                dst,
                payload: payload.to_vec(),
            },
            _ => Seen::Other,
        },
        IpProtocol::Icmp => icmp4(src, dst, body),
        IpProtocol::Icmpv6 => icmp6(src, dst, body),
        _ => Seen::Other,
    }
}

fn icmp4(src: IpAddr, dst: IpAddr, body: &[u8]) -> Seen {
    let Ok(i) = Icmpv4Packet::new_checked(body) else {
        return Seen::Other;
    };
    match i.msg_type() {
        Icmpv4Message::EchoReply => Seen::EchoReply {
            src,
            dst,
            ident: i.echo_ident(),
            seq: i.echo_seq_no(),
            data: body[8..].to_vec(),
        },
        Icmpv4Message::DstUnreachable
            if i.msg_code() == u8::from(Icmpv4DstUnreachable::CommProhibited) =>
        {
            Seen::Prohibited { src, dst }
        }
        _ => Seen::Other,
    }
}

fn icmp6(src: IpAddr, dst: IpAddr, body: &[u8]) -> Seen {
    let Ok(i) = Icmpv6Packet::new_checked(body) else {
        return Seen::Other;
    };
    match i.msg_type() {
        Icmpv6Message::EchoReply => Seen::EchoReply {
            src,
            dst,
            ident: i.echo_ident(),
            seq: i.echo_seq_no(),
            data: body[8..].to_vec(),
        },
        Icmpv6Message::DstUnreachable
            if i.msg_code() == u8::from(Icmpv6DstUnreachable::AdminProhibit) =>
        {
            Seen::Prohibited { src, dst }
        }
        _ => Seen::Other,
    }
}

/// Whether the sandbox's stack takes `f`: ARP, TCP, neighbour discovery (what a
/// kernel's stack would answer; datagrams and echo replies are the test's to read).
pub fn for_the_stack(f: &[u8]) -> bool {
    if let Ok(eth) = EthernetFrame::new_checked(f)
        && eth.ethertype() == EthernetProtocol::Arp
    {
        return true;
    }
    match ip(f) {
        Some((_, _, IpProtocol::Tcp, _)) => true,
        Some((_, _, IpProtocol::Icmpv6, body)) => {
            matches!(body.first(), Some(133..=137))
        }
        _ => false,
    }
}
