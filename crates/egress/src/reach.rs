//! The address rules of docs/SECURITY.md ("Addresses"), declared once: what an address
//! means to a sandbox whichever path its traffic takes. [`crate::admit`] applies them;
//! a path does not test address classes itself.
//!
//! * **Local** ([`is_local`]: loopback, the unspecified addresses, the rest of
//!   0.0.0.0/8, and their v4-mapped forms) means the machine itself: for a sandbox its
//!   own loopback; on the host the host's own, never reachable from a sandbox.
//! * **IPv4 link-local** (169.254.0.0/16: the host's link, cloud metadata at
//!   169.254.169.254) is reached only through an `--allow` inside that range
//!   ([`crate::Policy::check_sandbox`]).
//! * **IPv6 link-local** (fe80::/10), **multicast** and **broadcast** need an interface
//!   or a link of their own: a path that carries a sandbox's frames refuses them.
//! * **The sandbox's own link** ([`OwnLink`]: its subnets, the gateway, their broadcast)
//!   has nothing ferry serves on it.
//! * **Host addresses** ([`HostAddrs`]): what a socket on the host may bind to, and the
//!   only sources ([`source_refused`]) a datagram on the host may name.
//!
//! v4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are classed as the IPv4 address they
//! carry: the kernel sends them as IPv4.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

/// What an address is, as far as the rules care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The machine itself ([`is_local`]).
    Local,
    /// 169.254.0.0/16.
    LinkLocalV4,
    /// fe80::/10.
    LinkLocalV6,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// Anything else: an address on some network, which the policy judges.
    Remote,
}

/// The class of `ip` (v4-mapped: of the IPv4 address it carries).
pub fn class(ip: IpAddr) -> Class {
    if is_local(ip) {
        return Class::Local;
    }
    match ip.to_canonical() {
        IpAddr::V4(a) if a.is_link_local() => Class::LinkLocalV4,
        IpAddr::V4(a) if a.is_multicast() => Class::Multicast,
        IpAddr::V4(a) if a.is_broadcast() => Class::Broadcast,
        IpAddr::V6(a) if a.is_unicast_link_local() => Class::LinkLocalV6,
        IpAddr::V6(a) if a.is_multicast() => Class::Multicast,
        _ => Class::Remote,
    }
}

/// Whether `ip` means the local machine: loopback (127.0.0.0/8, ::1), the unspecified
/// addresses (a `connect` to 0.0.0.0 or :: reaches the local host), and the rest of
/// 0.0.0.0/8 ("this network"), each also in v4-mapped form. For a sandbox they mean its
/// own loopback; on the host they would mean the host's.
pub fn is_local(ip: IpAddr) -> bool {
    let v4 = match ip {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) if a.is_loopback() || a.is_unspecified() => return true,
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => v4,
            None => return false,
        },
    };
    v4.is_loopback() || v4.octets()[0] == 0
}

/// Whether `ip` is IPv4 link-local (169.254.0.0/16, v4-mapped forms included).
pub fn is_link_local_v4(ip: IpAddr) -> bool {
    class(ip) == Class::LinkLocalV4
}

/// Whether the first `prefix` bits of `a` and `b` (addresses of one family, as
/// octets; `prefix` at most their length in bits) are equal.
pub(crate) fn within(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    if a[..full] != b[..full] {
        return false;
    }
    let rem = prefix % 8;
    rem == 0 || (a[full] ^ b[full]) >> (8 - rem) == 0
}

/// The link between a sandbox and ferry when ferry terminates it (nic mode's TAP; a VM
/// guest's queue): the sandbox's addresses and their subnets, where only ferry's
/// gateway is, and which it serves nothing on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnLink {
    /// The sandbox's IPv4 address, on a /`prefix4`.
    pub v4: Ipv4Addr,
    pub prefix4: u8,
    /// The sandbox's IPv6 address, on a /`prefix6`.
    pub v6: Ipv6Addr,
    pub prefix6: u8,
}

impl OwnLink {
    /// Whether `ip` (v4-mapped: the IPv4 address it carries) is on the link: the
    /// sandbox's subnets (the gateway, the sandbox, their neighbours, the subnet's
    /// broadcast).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip.to_canonical() {
            IpAddr::V4(a) => within(&a.octets(), &self.v4.octets(), self.prefix4.min(32)),
            IpAddr::V6(a) => within(&a.octets(), &self.v6.octets(), self.prefix6.min(128)),
        }
    }
}

/// How often the host's addresses may be read again when an address is not among them.
const REFRESH: Duration = Duration::from_millis(100);

/// The host namespace's addresses, read from the kernel when one is asked for and not
/// known (at most every `REFRESH`, 100 ms: a sandbox asking for addresses the host does not
/// have costs one dump per interval at most).
#[derive(Debug, Default)]
pub struct HostAddrs {
    addrs: Vec<IpAddr>,
    read_at: Option<Instant>,
}

impl HostAddrs {
    /// Whether `ip` (v4-mapped counts as IPv4) is an address of the host's interfaces
    /// other than a local one.
    pub fn owns(&mut self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if is_local(ip) {
            return false;
        }
        if self.addrs.contains(&ip) {
            return true;
        }
        if self.read_at.is_some_and(|t| t.elapsed() < REFRESH) {
            return false;
        }
        self.read_at = Some(Instant::now());
        match ferry_sys::interface_addresses() {
            Ok(list) => self.addrs = list.into_iter().map(|(_, a)| a.to_canonical()).collect(),
            Err(e) => tracing::warn!("cannot read the host's addresses: {e}"),
        }
        self.addrs.contains(&ip)
    }
}

/// Why a datagram sent on the host may not name source `ip` on interface `index`
/// (`IP_PKTINFO`/`IPV6_PKTINFO`, per message or sticky), if it may not: the source must
/// be unspecified (the kernel picks) or an address the host owns, with no interface
/// chosen (a sandbox does not pick the host's interfaces, as it may not bind to a
/// device).
pub fn source_refused(hosts: &mut HostAddrs, index: u32, ip: IpAddr) -> Option<String> {
    if index != 0 {
        return Some(format!(
            "it chooses host interface {index} (a sandbox may not pick the host's interfaces)"
        ));
    }
    if ip.is_unspecified() || ip.to_canonical().is_unspecified() || hosts.owns(ip) {
        return None;
    }
    Some(format!("source {ip} is not an address of the host"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn local_addresses() {
        for s in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "0.1.2.3",
            "::1",
            "::",
            "::ffff:0.0.0.0",
            "::ffff:127.0.0.1",
            "::ffff:0.0.0.7",
        ] {
            assert!(is_local(ip(s)), "{s}");
            assert_eq!(class(ip(s)), Class::Local, "{s}");
        }
        for s in [
            "10.0.0.1",
            "1.0.0.0",
            "2001:db8::1",
            "::ffff:10.0.0.1",
            "::2",
        ] {
            assert!(!is_local(ip(s)), "{s}");
        }
    }

    #[test]
    fn every_class_in_both_families_and_mapped() {
        let cases = [
            ("169.254.169.254", Class::LinkLocalV4),
            ("169.254.0.0", Class::LinkLocalV4),
            ("::ffff:169.254.1.1", Class::LinkLocalV4),
            ("169.253.255.255", Class::Remote),
            ("169.255.0.1", Class::Remote),
            ("fe80::1", Class::LinkLocalV6),
            ("febf::1", Class::LinkLocalV6),
            ("fec0::1", Class::Remote),
            ("224.0.0.1", Class::Multicast),
            ("239.255.255.250", Class::Multicast),
            ("::ffff:224.0.0.251", Class::Multicast),
            ("ff02::1", Class::Multicast),
            ("255.255.255.255", Class::Broadcast),
            ("::ffff:255.255.255.255", Class::Broadcast),
            ("8.8.8.8", Class::Remote),
            ("2001:db8::1", Class::Remote),
            ("::ffff:8.8.8.8", Class::Remote),
        ];
        for (s, want) in cases {
            assert_eq!(class(ip(s)), want, "{s}");
        }
        assert!(is_link_local_v4(ip("::ffff:169.254.169.254")));
        assert!(!is_link_local_v4(ip("fe80::1")));
    }

    #[test]
    fn the_own_link_is_the_sandboxs_subnets() {
        let link = OwnLink {
            v4: Ipv4Addr::new(10, 0, 4, 100),
            prefix4: 24,
            v6: "fd00:0:0:4::100".parse().unwrap(),
            prefix6: 64,
        };
        for on in [
            "10.0.4.2",
            "10.0.4.55",
            "10.0.4.255",
            "10.0.4.0",
            "::ffff:10.0.4.2",
            "fd00:0:0:4::2",
            "fd00:0:0:4::55",
        ] {
            assert!(link.contains(ip(on)), "{on}");
        }
        for off in ["10.0.5.1", "10.0.3.255", "8.8.8.8", "fd00:0:0:5::2", "::1"] {
            assert!(!link.contains(ip(off)), "{off}");
        }
        // Odd prefixes.
        let odd = OwnLink {
            prefix4: 23,
            prefix6: 127,
            ..link
        };
        assert!(odd.contains(ip("10.0.5.1")));
        assert!(!odd.contains(ip("10.0.6.1")));
        assert!(odd.contains(ip("fd00:0:0:4::101")));
        assert!(!odd.contains(ip("fd00:0:0:4::102")));
    }

    #[test]
    fn the_host_owns_none_of_the_local_addresses() {
        let mut h = HostAddrs::default();
        for s in ["127.0.0.1", "0.0.0.0", "::1", "::", "::ffff:127.0.0.1"] {
            assert!(!h.owns(ip(s)), "{s}");
        }
        // Not an address of any machine.
        assert!(!h.owns(ip("192.0.2.77")));
    }

    #[test]
    fn the_host_owns_its_interfaces_addresses() {
        let Some((_, own)) = ferry_sys::interface_addresses()
            .unwrap()
            .into_iter()
            .find(|(_, a)| !is_local(*a))
        else {
            eprintln!("skipped: this namespace has no address but loopback");
            return;
        };
        let mut h = HostAddrs::default();
        assert!(h.owns(own), "{own}");
        assert!(source_refused(&mut h, 0, own).is_none());
    }

    #[test]
    fn sources_need_a_host_address_and_no_interface() {
        let mut h = HostAddrs::default();
        assert!(source_refused(&mut h, 0, ip("0.0.0.0")).is_none());
        assert!(source_refused(&mut h, 0, ip("::")).is_none());
        assert!(source_refused(&mut h, 0, ip("::ffff:0.0.0.0")).is_none());
        assert!(source_refused(&mut h, 2, ip("0.0.0.0")).is_some());
        assert!(source_refused(&mut h, 0, ip("::1")).is_some());
        assert!(source_refused(&mut h, 0, ip("2001:db8::99")).is_some());
    }
}
