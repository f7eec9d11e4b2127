//! Which NIC server a frame the guest sent belongs to, with several queue pairs. A
//! guest picks a transmit queue per packet (its vCPU, a hash) and may move a flow
//! between queues (a SYN on one, the rest on another); a NIC server that does not know
//! a flow resets it. So frames go to their flow's server whatever queue carried them:
//! a hash of the flow's far end and ports; a published TCP port's flows (the first
//! server's listeners) to the first; ARP, neighbour discovery and anything without
//! ports to every server (each answers for the gateway and learns the guest's address).
//! Pure: it reads only the frame's bytes, lengths checked.

/// Where a frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    One(usize),
    All,
}

const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

/// The owner of `frame` among `servers`; `published`: the guest's published TCP ports.
pub(crate) fn owner(frame: &[u8], servers: usize, published: &[u16]) -> Owner {
    if servers <= 1 {
        return Owner::One(0);
    }
    let Some(key) = flow(frame) else {
        return Owner::All;
    };
    if key.proto == TCP && published.contains(&key.sport) {
        return Owner::One(0);
    }
    // FNV-1a over the far end, the protocol and the ports.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key
        .far
        .iter()
        .chain(&[key.proto])
        .chain(&key.sport.to_be_bytes())
        .chain(&key.dport.to_be_bytes())
    {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    // FNV's low bits follow the inputs' low bits (Linux gives connects even ports):
    // the high half, mixed, picks the server.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    Owner::One(((h >> 32) % servers as u64) as usize)
}

/// What names a flow from the guest's side.
struct Key<'a> {
    far: &'a [u8],
    proto: u8,
    sport: u16,
    dport: u16,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The flow of an IPv4 or IPv6 frame with ports (TCP, UDP) or an echo id; `None` for
/// the rest (ARP, neighbour discovery, fragments after the first, other protocols).
fn flow(frame: &[u8]) -> Option<Key<'_>> {
    let (proto, far, l4) = match u16_at(frame, 12)? {
        0x0800 => {
            let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
            let frag_offset = u16_at(frame, 20)? & 0x1fff;
            if ihl < 20 || frag_offset != 0 {
                return None;
            }
            (*frame.get(23)?, frame.get(30..34)?, 14 + ihl)
        }
        0x86dd => (*frame.get(20)?, frame.get(38..54)?, 54),
        _ => return None,
    };
    let (sport, dport) = match proto {
        TCP | UDP => (u16_at(frame, l4)?, u16_at(frame, l4 + 2)?),
        // Echo requests: the id; ICMPv6 echo only (neighbour discovery goes to all).
        ICMP if *frame.get(l4)? == 8 => (u16_at(frame, l4 + 4)?, 0),
        ICMPV6 if *frame.get(l4)? == 128 => (u16_at(frame, l4 + 4)?, 0),
        _ => return None,
    };
    Some(Key {
        far,
        proto,
        sport,
        dport,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet + IPv4 frame of `proto` to `dst` with L4 bytes `l4`.
    fn v4(proto: u8, dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[23] = proto;
        f[26..30].copy_from_slice(&[10, 0, 2, 100]);
        f[30..34].copy_from_slice(&dst);
        f.extend_from_slice(l4);
        f
    }

    fn ports(s: u16, d: u16) -> Vec<u8> {
        let mut p = s.to_be_bytes().to_vec();
        p.extend_from_slice(&d.to_be_bytes());
        p.extend_from_slice(&[0; 16]);
        p
    }

    #[test]
    fn a_flows_frames_have_one_owner_and_flows_spread() {
        let syn = v4(TCP, [192, 0, 2, 7], &ports(40000, 80));
        let o = owner(&syn, 4, &[]);
        assert!(matches!(o, Owner::One(k) if k < 4));
        // Any frame of the flow: the same owner, whatever else it carries.
        let mut data = syn.clone();
        data.extend_from_slice(b"GET / HTTP/1.0");
        assert_eq!(owner(&data, 4, &[]), o);
        let mut seen = [false; 4];
        for p in 40000..40064 {
            if let Owner::One(k) = owner(&v4(TCP, [192, 0, 2, 7], &ports(p, 80)), 4, &[]) {
                seen[k] = true;
            }
        }
        assert_eq!(seen, [true; 4], "64 flows reach every server");
        // Even ports only (Linux's connects): still both of two servers.
        let mut two = [0; 2];
        for p in (40000..40064).step_by(2) {
            if let Owner::One(k) = owner(&v4(TCP, [1, 1, 1, 1], &ports(p, 80)), 2, &[]) {
                two[k] += 1;
            }
        }
        assert!(two[0] >= 6 && two[1] >= 6, "{two:?}");
        assert_eq!(owner(&syn, 1, &[]), Owner::One(0));
    }

    #[test]
    fn published_ports_arp_and_malformed_frames_are_placed() {
        // The guest's side of a published connection: from its port 80.
        let reply = v4(TCP, [192, 0, 2, 9], &ports(80, 51000));
        assert_eq!(owner(&reply, 4, &[80]), Owner::One(0));
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(owner(&arp, 4, &[]), Owner::All);
        for cut in 0..40 {
            let _ = owner(&reply[..cut], 4, &[]);
        }
        let mut frag = v4(UDP, [192, 0, 2, 7], &ports(5000, 53));
        frag[20..22].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(owner(&frag, 4, &[]), Owner::All);
        let echo = v4(ICMP, [192, 0, 2, 7], &[8, 0, 0, 0, 0x12, 0x34, 0, 1]);
        assert!(matches!(owner(&echo, 4, &[]), Owner::One(_)));
    }
}
