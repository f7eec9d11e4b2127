//! Frames the sandbox writes into its TAP, sorted before anything acts on them, and the
//! frames a NIC server writes back that the TCP/IP stack does not make itself (UDP
//! datagrams, echo replies, unreachables).
//!
//! Everything here is a pure function of bytes: no descriptors, no state. A frame is read
//! with length checks only — checksums are not verified (with checksum offload on, the
//! sandbox's kernel leaves them partial; a wrong one can only hurt the sandbox itself).
//! Must not: panic or allocate on any input (the `frame` fuzz target feeds it anything).

use std::net::{IpAddr, SocketAddr};

use smoltcp::phy::{Checksum, ChecksumCapabilities};
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, Icmpv4DstUnreachable,
    Icmpv4Packet, Icmpv4Repr, Icmpv6DstUnreachable, Icmpv6Packet, Icmpv6Repr, IpAddress,
    IpProtocol, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, TcpPacket, UdpPacket, UdpRepr,
};

/// Ethernet header length.
pub const ETH_LEN: usize = 14;

/// What a frame from the sandbox is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// For the TCP/IP stack as it is: ARP, neighbour discovery and other ICMPv6.
    Stack,
    /// A TCP segment; `syn`: it opens a connection (SYN without ACK); `rst`: it resets
    /// one.
    Tcp {
        src: SocketAddr,
        dst: SocketAddr,
        syn: bool,
        rst: bool,
    },
    /// A UDP datagram.
    Udp {
        src: SocketAddr,
        dst: SocketAddr,
        payload: &'a [u8],
    },
    /// An ICMP or ICMPv6 echo request.
    Echo {
        src: IpAddr,
        dst: IpAddr,
        ident: u16,
        seq: u16,
        data: &'a [u8],
    },
    /// Not served; why.
    Drop(Why),
}

/// Why a frame was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Too short, lengths that do not add up, an unknown ether type.
    Malformed,
    /// An IPv4 fragment (the sandbox's MTU makes them unnecessary; reassembly would
    /// hold memory for the sandbox).
    Fragment,
    /// A protocol ferry does not relay (SCTP, raw IP, ICMP other than echo…).
    Unsupported,
}

/// The IP packet inside `frame`, or why it cannot be read.
fn classify_ip(ty: EthernetProtocol, ip: &[u8]) -> Result<Inbound<'_>, Why> {
    let (src, dst, proto, payload) = match ty {
        EthernetProtocol::Ipv4 => {
            let p = Ipv4Packet::new_checked(ip).map_err(|_| Why::Malformed)?;
            if p.more_frags() || p.frag_offset() != 0 {
                return Err(Why::Fragment);
            }
            let src = IpAddr::V4(p.src_addr());
            let dst = IpAddr::V4(p.dst_addr());
            (src, dst, p.next_header(), payload_v4(ip, &p)?)
        }
        EthernetProtocol::Ipv6 => {
            let p = Ipv6Packet::new_checked(ip).map_err(|_| Why::Malformed)?;
            let len = usize::from(p.payload_len());
            let payload = ip.get(40..40 + len).ok_or(Why::Malformed)?;
            (
                IpAddr::V6(p.src_addr()),
                IpAddr::V6(p.dst_addr()),
                p.next_header(),
                payload,
            )
        }
        EthernetProtocol::Arp => return Ok(Inbound::Stack),
        _ => return Err(Why::Malformed),
    };
    match proto {
        IpProtocol::Tcp => {
            let t = TcpPacket::new_checked(payload).map_err(|_| Why::Malformed)?;
            Ok(Inbound::Tcp {
                src: SocketAddr::new(src, t.src_port()),
                dst: SocketAddr::new(dst, t.dst_port()),
                syn: t.syn() && !t.ack(),
                rst: t.rst(),
            })
        }
        IpProtocol::Udp => {
            let u = UdpPacket::new_checked(payload).map_err(|_| Why::Malformed)?;
            let len = usize::from(u.len());
            let data = payload.get(8..len).ok_or(Why::Malformed)?;
            Ok(Inbound::Udp {
                src: SocketAddr::new(src, u.src_port()),
                dst: SocketAddr::new(dst, u.dst_port()),
                payload: data,
            })
        }
        IpProtocol::Icmp => {
            let i = Icmpv4Packet::new_checked(payload).map_err(|_| Why::Malformed)?;
            if i.msg_type() != smoltcp::wire::Icmpv4Message::EchoRequest || i.msg_code() != 0 {
                return Err(Why::Unsupported);
            }
            Ok(Inbound::Echo {
                src,
                dst,
                ident: i.echo_ident(),
                seq: i.echo_seq_no(),
                data: payload.get(8..).ok_or(Why::Malformed)?,
            })
        }
        IpProtocol::Icmpv6 => {
            let i = Icmpv6Packet::new_checked(payload).map_err(|_| Why::Malformed)?;
            if i.msg_type() != smoltcp::wire::Icmpv6Message::EchoRequest {
                return Ok(Inbound::Stack);
            }
            Ok(Inbound::Echo {
                src,
                dst,
                ident: i.echo_ident(),
                seq: i.echo_seq_no(),
                data: payload.get(8..).ok_or(Why::Malformed)?,
            })
        }
        _ => Err(Why::Unsupported),
    }
}

/// An IPv4 packet's payload by its own lengths (header length, total length).
fn payload_v4<'a>(ip: &'a [u8], p: &Ipv4Packet<&[u8]>) -> Result<&'a [u8], Why> {
    let start = usize::from(p.header_len());
    let end = usize::from(p.total_len());
    ip.get(start..end).ok_or(Why::Malformed)
}

/// Sorts a frame from the sandbox (without its `virtio_net_hdr`).
pub fn classify(frame: &[u8]) -> Inbound<'_> {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Inbound::Drop(Why::Malformed);
    };
    classify_ip(eth.ethertype(), &frame[ETH_LEN..]).unwrap_or_else(Inbound::Drop)
}

/// The sender's hardware address of a frame (the sandbox's interface).
pub fn source_mac(frame: &[u8]) -> Option<EthernetAddress> {
    EthernetFrame::new_checked(frame).ok().map(|e| e.src_addr())
}

/// Checksums as a NIC server emits them: all but TCP's, which [`offload_tcp`] leaves
/// to the offload (a segment is up to 64 KiB: summing it twice, here and in the
/// sandbox's kernel, would be the largest per-byte cost of the path). None is checked
/// on what arrives (`Tx`: computed when sending only), so the stack uses these too.
pub fn tx_checksums() -> ChecksumCapabilities {
    let mut c = ChecksumCapabilities::default();
    c.ipv4 = Checksum::Tx;
    c.udp = Checksum::Tx;
    c.tcp = Checksum::None;
    c.icmpv4 = Checksum::Tx;
    c.icmpv6 = Checksum::Tx;
    c
}

/// Prepares a frame for the TAP with a partial TCP checksum: when `frame` is a TCP
/// segment, writes the pseudo-header's sum into its checksum field and returns
/// (`csum_start`, `csum_offset`) for a `virtio_net_hdr` with `NEEDS_CSUM` (the kernel
/// then takes the segment as checksummed: `CHECKSUM_PARTIAL`). `None`: not TCP, or too
/// short to be one; its checksums are complete.
pub fn offload_tcp(frame: &mut [u8]) -> Option<(u16, u16)> {
    let ty = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let (start, len, sum) = match ty {
        0x0800 => {
            let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]));
            if *frame.get(23)? != 6 || ihl < 20 || total < ihl {
                return None;
            }
            (ETH_LEN + ihl, total - ihl, sum16(frame.get(26..34)?))
        }
        0x86dd => {
            let len = usize::from(u16::from_be_bytes([*frame.get(18)?, *frame.get(19)?]));
            if *frame.get(20)? != 6 {
                return None;
            }
            (ETH_LEN + 40, len, sum16(frame.get(22..54)?))
        }
        _ => return None,
    };
    if frame.len() < start + 20 || frame.len() < start + len {
        return None;
    }
    let mut sum = sum + 6 + len as u32;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[start + 16..start + 18].copy_from_slice(&(sum as u16).to_be_bytes());
    Some((u16::try_from(start).ok()?, 16))
}

/// Completes a partial checksum as the receiver of a `NEEDS_CSUM` frame does: the
/// ones' complement of the sum from `start` to the frame's end (the field at
/// `start + offset` holding the pseudo-header's sum) goes into the field. Nothing when
/// the offsets fall outside the frame.
pub fn complete_partial(frame: &mut [u8], (start, offset): (u16, u16)) {
    let (start, at) = (usize::from(start), usize::from(start) + usize::from(offset));
    if start > frame.len() || at + 2 > frame.len() {
        return;
    }
    let mut sum = sum16(&frame[start..]);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[at..at + 2].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// The ones' complement sum (unfolded) of `b`'s 16-bit big-endian words.
fn sum16(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum()
}

/// Link-layer ends of frames to the sandbox.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    /// The gateway's (ferry's) hardware address.
    pub ours: EthernetAddress,
    /// The sandbox interface's hardware address.
    pub theirs: EthernetAddress,
}

/// Writes into `out` a frame carrying an IP packet from `src` to `dst` whose payload
/// (`payload_len` bytes) `fill` writes; returns the frame's length, or `None` when
/// `out` is too small.
pub(crate) fn ip_frame(
    out: &mut [u8],
    link: Link,
    src: IpAddr,
    dst: IpAddr,
    proto: IpProtocol,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    let (ethertype, ip_len) = match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => (EthernetProtocol::Ipv4, 20),
        (IpAddr::V6(_), IpAddr::V6(_)) => (EthernetProtocol::Ipv6, 40),
        _ => return None,
    };
    let total = ETH_LEN + ip_len + payload_len;
    if total > out.len() || ip_len + payload_len > usize::from(u16::MAX) {
        return None;
    }
    let out = &mut out[..total];
    let eth = EthernetRepr {
        src_addr: link.ours,
        dst_addr: link.theirs,
        ethertype,
    };
    eth.emit(&mut EthernetFrame::new_unchecked(&mut out[..]));
    let caps = tx_checksums();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let repr = Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                next_header: proto,
                payload_len,
                hop_limit: 64,
            };
            repr.emit(&mut Ipv4Packet::new_unchecked(&mut out[ETH_LEN..]), &caps);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let repr = Ipv6Repr {
                src_addr: s,
                dst_addr: d,
                next_header: proto,
                payload_len,
                hop_limit: 64,
            };
            repr.emit(&mut Ipv6Packet::new_unchecked(&mut out[ETH_LEN..]));
        }
        _ => return None,
    }
    fill(&mut out[ETH_LEN + ip_len..]);
    Some(total)
}

/// A UDP datagram `from` → `to` (the sandbox) carrying `payload`.
pub fn udp(
    out: &mut [u8],
    link: Link,
    from: SocketAddr,
    to: SocketAddr,
    payload: &[u8],
) -> Option<usize> {
    let repr = UdpRepr {
        src_port: from.port(),
        dst_port: to.port(),
    };
    let (s, d) = (IpAddress::from(from.ip()), IpAddress::from(to.ip()));
    ip_frame(
        out,
        link,
        from.ip(),
        to.ip(),
        IpProtocol::Udp,
        8 + payload.len(),
        |b| {
            repr.emit(
                &mut UdpPacket::new_unchecked(b),
                &s,
                &d,
                payload.len(),
                |p| p.copy_from_slice(payload),
                &tx_checksums(),
            )
        },
    )
}

/// An echo reply `from` → `to` (the sandbox).
pub fn echo_reply(
    out: &mut [u8],
    link: Link,
    from: IpAddr,
    to: IpAddr,
    ident: u16,
    seq: u16,
    data: &[u8],
) -> Option<usize> {
    let caps = tx_checksums();
    match (from, to) {
        (IpAddr::V4(_), IpAddr::V4(_)) => {
            let repr = Icmpv4Repr::EchoReply {
                ident,
                seq_no: seq,
                data,
            };
            ip_frame(
                out,
                link,
                from,
                to,
                IpProtocol::Icmp,
                repr.buffer_len(),
                |b| repr.emit(&mut Icmpv4Packet::new_unchecked(b), &caps),
            )
        }
        (IpAddr::V6(f), IpAddr::V6(t)) => {
            let repr = Icmpv6Repr::EchoReply {
                ident,
                seq_no: seq,
                data,
            };
            ip_frame(
                out,
                link,
                from,
                to,
                IpProtocol::Icmpv6,
                repr.buffer_len(),
                |b| repr.emit(&f, &t, &mut Icmpv6Packet::new_unchecked(b), &caps),
            )
        }
        _ => None,
    }
}

/// A TCP segment `from` → `to` (the sandbox) with no flag and no data: a connection in
/// SYN-SENT discards it, a port with no connection answers it with a reset (RFC 9293,
/// 3.10.7.1 and 3.10.7.3). Asks the sandbox's kernel whether the connect waiting for
/// `from` still exists, without disturbing it. Its checksum is left to the offload
/// ([`offload_tcp`]).
pub fn probe(out: &mut [u8], link: Link, from: SocketAddr, to: SocketAddr) -> Option<usize> {
    ip_frame(out, link, from.ip(), to.ip(), IpProtocol::Tcp, 20, |b| {
        b.fill(0);
        b[0..2].copy_from_slice(&from.port().to_be_bytes());
        b[2..4].copy_from_slice(&to.port().to_be_bytes());
        b[12] = 5 << 4;
        b[14..16].copy_from_slice(&1024u16.to_be_bytes());
    })
}

/// "Administratively prohibited" from the gateway `gw` about `frame` (a frame of the
/// sandbox's, IPv4 or IPv6 of the same family as `gw`): what a refused datagram or echo
/// gets at once.
pub fn prohibited(out: &mut [u8], link: Link, gw: IpAddr, frame: &[u8]) -> Option<usize> {
    let ip = frame.get(ETH_LEN..)?;
    let caps = tx_checksums();
    match gw {
        IpAddr::V4(_) => {
            let p = Ipv4Packet::new_checked(ip).ok()?;
            let header = Ipv4Repr::parse(&p, &ChecksumCapabilities::ignored()).ok()?;
            let quoted = payload_v4(ip, &p).ok()?;
            let data = &quoted[..quoted.len().min(8)];
            let repr = Icmpv4Repr::DstUnreachable {
                reason: Icmpv4DstUnreachable::CommProhibited,
                header,
                data,
            };
            let to = IpAddr::V4(header.src_addr);
            ip_frame(
                out,
                link,
                gw,
                to,
                IpProtocol::Icmp,
                repr.buffer_len(),
                |b| repr.emit(&mut Icmpv4Packet::new_unchecked(b), &caps),
            )
        }
        IpAddr::V6(g) => {
            let p = Ipv6Packet::new_checked(ip).ok()?;
            let header = Ipv6Repr::parse(&p).ok()?;
            let quoted = ip.get(40..)?;
            let data = &quoted[..quoted.len().min(8)];
            let repr = Icmpv6Repr::DstUnreachable {
                reason: Icmpv6DstUnreachable::AdminProhibit,
                header,
                data,
            };
            let to = header.src_addr;
            ip_frame(
                out,
                link,
                gw,
                IpAddr::V6(to),
                IpProtocol::Icmpv6,
                repr.buffer_len(),
                |b| repr.emit(&g, &to, &mut Icmpv6Packet::new_unchecked(b), &caps),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: Link = Link {
        ours: EthernetAddress([2, 0, 0, 0, 0, 1]),
        theirs: EthernetAddress([2, 0, 0, 0, 0, 2]),
    };

    #[test]
    fn a_udp_frame_it_writes_reads_back_the_same() {
        let mut buf = [0u8; 256];
        let from: SocketAddr = "10.1.2.3:53".parse().unwrap();
        let to: SocketAddr = "10.0.2.100:4000".parse().unwrap();
        let n = udp(&mut buf, LINK, from, to, b"hello").unwrap();
        assert_eq!(
            classify(&buf[..n]),
            Inbound::Udp {
                src: from,
                dst: to,
                payload: b"hello"
            }
        );
        let from6: SocketAddr = "[fd00::1]:53".parse().unwrap();
        let to6: SocketAddr = "[fd00::100]:4000".parse().unwrap();
        let n = udp(&mut buf, LINK, from6, to6, b"").unwrap();
        assert_eq!(
            classify(&buf[..n]),
            Inbound::Udp {
                src: from6,
                dst: to6,
                payload: b""
            }
        );
        // Mixed families, or no room: nothing written.
        assert_eq!(udp(&mut buf, LINK, from, to6, b"x"), None);
        assert_eq!(udp(&mut buf[..40], LINK, from, to, b"x"), None);
    }

    #[test]
    fn a_probe_is_a_bare_segment_with_its_checksum_left_to_the_offload() {
        let mut buf = [0u8; 128];
        for (from, to) in [
            ("10.1.2.3:80", "10.0.2.100:40000"),
            ("[fd00::1]:443", "[fd00::100]:40001"),
        ] {
            let (from, to): (SocketAddr, SocketAddr) = (from.parse().unwrap(), to.parse().unwrap());
            let n = probe(&mut buf, LINK, from, to).unwrap();
            assert_eq!(
                classify(&buf[..n]),
                Inbound::Tcp {
                    src: from,
                    dst: to,
                    syn: false,
                    rst: false
                }
            );
            let ip = if from.is_ipv4() { 20 } else { 40 };
            assert_eq!(n, ETH_LEN + ip + 20);
            // No flag at all (not even ACK): SYN-SENT drops it, a closed port resets.
            assert_eq!(buf[ETH_LEN + ip + 13], 0);
            assert!(offload_tcp(&mut buf[..n]).is_some());
        }
    }

    #[test]
    fn truncated_and_fragmented_frames_are_dropped() {
        let mut buf = [0u8; 256];
        let from: SocketAddr = "10.1.2.3:53".parse().unwrap();
        let to: SocketAddr = "10.0.2.100:4000".parse().unwrap();
        let n = udp(&mut buf, LINK, from, to, b"hello").unwrap();
        for cut in 0..n {
            assert!(
                matches!(classify(&buf[..cut]), Inbound::Drop(_)),
                "cut at {cut}"
            );
        }
        buf[ETH_LEN + 6] |= 0x20; // more fragments
        assert_eq!(classify(&buf[..n]), Inbound::Drop(Why::Fragment));
    }

    #[test]
    fn an_echo_request_is_answered_and_a_prohibited_quotes_it() {
        let mut req = [0u8; 128];
        let (a, b): (IpAddr, IpAddr) = ("10.0.2.100".parse().unwrap(), "10.9.9.9".parse().unwrap());
        // Build a request by hand: an echo reply frame with its type set to request.
        let n = echo_reply(&mut req, LINK, a, b, 7, 9, b"ping").unwrap();
        req[ETH_LEN + 20] = 8;
        assert_eq!(
            classify(&req[..n]),
            Inbound::Echo {
                src: a,
                dst: b,
                ident: 7,
                seq: 9,
                data: b"ping"
            }
        );
        let mut out = [0u8; 256];
        let m = prohibited(&mut out, LINK, "10.0.2.2".parse().unwrap(), &req[..n]).unwrap();
        let p = Ipv4Packet::new_checked(&out[ETH_LEN..m]).unwrap();
        assert_eq!(IpAddr::V4(p.dst_addr()), a);
        assert_eq!(p.next_header(), IpProtocol::Icmp);
        let i = Icmpv4Packet::new_checked(p.payload()).unwrap();
        assert_eq!(i.msg_type(), smoltcp::wire::Icmpv4Message::DstUnreachable);
    }
}
