//! The admission of flows: [`Gate::admit`] is the one check every flow the sandbox
//! opens passes (TCP, UDP, echo), [`Gate::room`] the flow cap alone (published
//! connections, which the sandbox does not open). A refusal is counted and logged (at
//! most once a second).
//!
//! Owns: the rules' application and the refusals' log. Must not: make sockets or
//! answer the sandbox (the caller resets or answers "prohibited").

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ferry_proto::WireAddr;
use ferry_server::{LogThrottle, Verdict};
use tracing::warn;

use crate::{NicConfig, NicStats};

/// The admission of flows (see the module's header).
#[derive(Debug)]
pub(crate) struct Gate {
    /// The server's id, for the log.
    id: String,
    cfg: Arc<NicConfig>,
    refusals: LogThrottle,
}

impl Gate {
    pub fn new(id: String, cfg: Arc<NicConfig>) -> Gate {
        Gate {
            id,
            cfg,
            refusals: LogThrottle::default(),
        }
    }

    /// Whether the sandbox may open a flow (`what`: "TCP", "UDP", "echo") to `to` while
    /// the server holds `held` flows: the rules ([`Gate::allowed`]), then the cap. A
    /// refusal is counted in `stats` (`denied`, `over_cap`).
    pub fn admit(&mut self, what: &str, to: SocketAddr, held: usize, stats: &mut NicStats) -> bool {
        if !self.allowed(to) {
            stats.denied += 1;
            if let Some(n) = self.refusals.tick() {
                warn!(
                    "{}: {what} to {to} denied{} ({n} since the last line)",
                    self.id,
                    ferry_server::policy::denial_hint(&to)
                );
            }
            return false;
        }
        self.room(held, stats)
    }

    /// Whether one more flow fits beside `held` under [`NicConfig::max_flows`]
    /// (`over_cap` counted when not).
    pub fn room(&self, held: usize, stats: &mut NicStats) -> bool {
        if held >= self.cfg.max_flows {
            stats.over_cap += 1;
            return false;
        }
        true
    }

    /// Whether the sandbox may reach `to` (docs/SECURITY.md, nic mode): never a local
    /// address (loopback, unspecified: the host's own), the sandbox's own subnets (the
    /// gateway included), a multicast, broadcast or IPv6 link-local one; the policy for
    /// the rest, IPv4 link-local only when an allow of its own decides
    /// ([`ferry_server::Policy::check_sandbox`]).
    fn allowed(&self, to: SocketAddr) -> bool {
        let ip = to.ip();
        let plan = &self.cfg.plan;
        let special = match ip {
            IpAddr::V4(a) => a.is_multicast() || a.is_broadcast(),
            IpAddr::V6(a) => a.is_multicast() || a.is_unicast_link_local(),
        };
        !(WireAddr::from(to).is_local()
            || special
            || plan.on_link(ip)
            || self.cfg.policy.check_sandbox(&to) == Verdict::Deny)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Plan;
    use ferry_server::{Policy, Rule};

    fn gate(deny: &[&str], max_flows: usize) -> Gate {
        let mut cfg = NicConfig::new(Plan::avoiding(&[]));
        cfg.policy = Policy::new(
            deny.iter()
                .map(|r| Rule::parse(Verdict::Deny, r).unwrap())
                .collect(),
        );
        cfg.max_flows = max_flows;
        Gate::new("nic-0".into(), Arc::new(cfg))
    }

    #[test]
    fn the_address_rules_and_the_policy_refuse_and_count() {
        let mut g = gate(&["192.0.2.0/24"], 10);
        let mut st = NicStats::default();
        for to in [
            "127.0.0.1:80",
            "0.0.0.0:80",
            "[::1]:80",
            "[::ffff:127.0.0.1]:80",
            "10.0.2.2:53",
            "10.0.2.77:80",
            "224.0.0.1:5353",
            "255.255.255.255:67",
            "[ff02::1]:5353",
            "[fe80::1]:80",
            "169.254.169.254:80",
            "192.0.2.9:443",
        ] {
            assert!(!g.admit("TCP", to.parse().unwrap(), 0, &mut st), "{to}");
        }
        assert_eq!(st.denied, 12);
        for to in ["198.51.100.1:80", "[2001:db8::1]:443"] {
            assert!(g.admit("UDP", to.parse().unwrap(), 0, &mut st), "{to}");
        }
        assert_eq!((st.denied, st.over_cap), (12, 0));
    }

    #[test]
    fn the_cap_counts_every_held_flow() {
        let mut g = gate(&[], 2);
        let mut st = NicStats::default();
        let to = "198.51.100.1:80".parse().unwrap();
        assert!(g.admit("TCP", to, 1, &mut st));
        assert!(!g.admit("TCP", to, 2, &mut st));
        assert!(!g.room(3, &mut st));
        assert!(g.room(1, &mut st));
        assert_eq!((st.denied, st.over_cap), (0, 2));
    }
}
