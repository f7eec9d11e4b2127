//! What a sandbox's sockets may reach, besides the egress policy: the address rules of
//! `docs/SECURITY.md`, in one place.
//!
//! * **Local destinations** ([`WireAddr::is_local`]: loopback, the unspecified
//!   addresses, 0.0.0.0/8) mean the sandbox's own machine: a socket going there is made
//!   inside the sandbox's network namespace. A socket that already lives on the host
//!   (bound to a host address, or connected before) may not go there: on the host they
//!   would mean the host's own loopback, which is never reachable.
//! * **Binds**: a local address puts the socket in the sandbox; any other address must
//!   be one the host owns right now (with freebind refused and whatever the host's
//!   `ip_nonlocal_bind` says), and a datagram socket may not take a fixed port on the
//!   host: it would receive from the network, which only `-p` may arrange.
//! * **Listening** happens only inside the sandbox; inbound connections come only
//!   through published ports.
//! * **Sources** a datagram names with `IP_PKTINFO`/`IPV6_PKTINFO` (per message, or
//!   sticky) on the host are unspecified (the kernel picks) or an address the host owns,
//!   with no interface chosen: a sandbox does not pick the host's interfaces, as it may
//!   not bind to a device.
//! * **Arrivals**: a datagram socket on the host drops datagrams from sources the
//!   egress policy would not let it send to, and from local sources (the host's own).
//! * **IPv4 link-local** destinations (169.254.0.0/16, cloud metadata) are refused
//!   unless an `--allow` inside that range decides ([`Policy::check_sandbox`]).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use ferry_proto::WireAddr;

use crate::policy::{Policy, Verdict};

/// How often the host's addresses may be read again when an address is not among them.
const REFRESH: Duration = Duration::from_millis(100);

/// The host namespace's addresses, read from the kernel when one is asked for and not
/// known (at most every [`REFRESH`]: a sandbox asking for addresses the host does not
/// have costs one dump per interval at most).
#[derive(Debug, Default)]
pub(crate) struct HostAddrs {
    addrs: Vec<IpAddr>,
    read_at: Option<Instant>,
}

impl HostAddrs {
    /// Whether `ip` (v4-mapped counts as IPv4) is an address of the host's interfaces
    /// other than a local one.
    pub(crate) fn owns(&mut self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if WireAddr::from(SocketAddr::new(ip, 0)).is_local() {
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

/// Why a datagram's chosen source is refused, if it is.
pub(crate) fn source_refused(hosts: &mut HostAddrs, index: u32, ip: IpAddr) -> Option<String> {
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

/// Whether a datagram from `from` may reach a socket on the host.
pub(crate) fn arrival_allowed(policy: &Policy, from: SocketAddr) -> bool {
    !WireAddr::from(from).is_local() && policy.check_sandbox(&from) == Verdict::Allow
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Rule;

    #[test]
    fn the_host_owns_none_of_the_local_addresses() {
        let mut h = HostAddrs::default();
        for ip in ["127.0.0.1", "0.0.0.0", "::1", "::", "::ffff:127.0.0.1"] {
            assert!(!h.owns(ip.parse().unwrap()), "{ip}");
        }
        // Not an address of any machine.
        assert!(!h.owns("192.0.2.77".parse().unwrap()));
    }

    #[test]
    fn sources_need_a_host_address_and_no_interface() {
        let mut h = HostAddrs::default();
        assert!(source_refused(&mut h, 0, "0.0.0.0".parse().unwrap()).is_none());
        assert!(source_refused(&mut h, 0, "::".parse().unwrap()).is_none());
        assert!(source_refused(&mut h, 2, "0.0.0.0".parse().unwrap()).is_some());
        assert!(source_refused(&mut h, 0, "::1".parse().unwrap()).is_some());
        assert!(source_refused(&mut h, 0, "2001:db8::99".parse().unwrap()).is_some());
    }

    #[test]
    fn arrivals_follow_the_policy_and_never_come_from_local_sources() {
        let deny = Policy::new(vec![Rule::parse(Verdict::Deny, "10.9.0.0/16").unwrap()]);
        let ok = |p: &Policy, s: &str| arrival_allowed(p, s.parse().unwrap());
        assert!(ok(&deny, "10.1.0.1:53"));
        assert!(!ok(&deny, "10.9.1.1:53"));
        assert!(!ok(&deny, "127.0.0.1:53"));
        assert!(!ok(&Policy::default(), "[::1]:53"));
        assert!(!ok(&deny, "[::ffff:10.9.1.1]:53"));
    }
}
