//! The admission of flows: [`Gate::admit`] is the one check every flow the sandbox
//! opens passes (TCP, UDP, echo): [`ferry_egress::admit`] decides for nic mode's link
//! (the rules are ferry-egress's, not this file's), then the flow cap;
//! [`Gate::room`] is the cap alone (published connections, which the sandbox does not
//! open). A refusal is counted and logged with its reason (at most once a second).
//!
//! Owns: the cap, asking the rules, the refusals' count and log. Must not: hold an
//! address rule of its own, make sockets or answer the sandbox (the caller resets or
//! answers "prohibited").

use std::net::SocketAddr;
use std::sync::Arc;

use ferry_egress::{Decision, LogThrottle, Origin, What};
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

    /// Whether the sandbox may open a flow of kind `what` to `to` while the server holds
    /// `held` flows: [`ferry_egress::admit`] for the sandbox's link (docs/SECURITY.md,
    /// nic mode: never a local address, the sandbox's own subnets, a multicast,
    /// broadcast or IPv6 link-local one; the policy for the rest), then the cap. A
    /// refusal is counted in `stats` (`denied`, `over_cap`).
    pub fn admit(&mut self, what: What, to: SocketAddr, held: usize, stats: &mut NicStats) -> bool {
        let from = Origin::Link(self.cfg.plan.own_link());
        if let Decision::Refused(why) = ferry_egress::admit(&self.cfg.policy, what, from, to) {
            stats.denied += 1;
            if let Some(n) = self.refusals.tick() {
                warn!(
                    "{}: {what} to {to} {why} ({n} since the last line)",
                    self.id
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Plan;
    use ferry_egress::{Policy, Rule, Verdict};

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
            assert!(
                !g.admit(What::Connect, to.parse().unwrap(), 0, &mut st),
                "{to}"
            );
        }
        assert_eq!(st.denied, 12);
        for to in ["198.51.100.1:80", "[2001:db8::1]:443"] {
            assert!(
                g.admit(What::Datagram, to.parse().unwrap(), 0, &mut st),
                "{to}"
            );
        }
        assert_eq!((st.denied, st.over_cap), (12, 0));
    }

    #[test]
    fn the_cap_counts_every_held_flow() {
        let mut g = gate(&[], 2);
        let mut st = NicStats::default();
        let to = "198.51.100.1:80".parse().unwrap();
        assert!(g.admit(What::Connect, to, 1, &mut st));
        assert!(!g.admit(What::Connect, to, 2, &mut st));
        assert!(!g.room(3, &mut st));
        assert!(g.room(1, &mut st));
        assert_eq!((st.denied, st.over_cap), (0, 2));
    }
}
