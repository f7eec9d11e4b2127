//! Egress policy: which destinations a sandbox may reach (`--allow` / `--deny`).
//!
//! Rules are `CIDR[:PORT]` (IPv6 in brackets when a port is given: `[2001:db8::/32]:443`).
//! They are checked in the order given; the first that matches decides. When none
//! matches, the destination is allowed unless at least one `--allow` rule exists (an
//! allow-list). Loopback destinations never get here: they mean the sandbox's own
//! loopback and are served inside it.
//!
//! IPv4 link-local destinations (169.254.0.0/16: the host's own link, where cloud
//! metadata services answer, 169.254.169.254) are refused unless the rule that decides
//! is an `--allow` inside that range (`--allow 169.254.169.254/32`): neither the open
//! default nor a wider allow (`--allow 0.0.0.0/0`) reaches them
//! ([`Policy::check_sandbox`]). Paths do not call the policy themselves: they ask
//! [`crate::admit`], which applies the address rules first.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use crate::reach::{is_link_local_v4, within};

/// Allow or deny.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The destination may be reached.
    Allow,
    /// The destination is refused (EACCES to the program).
    Deny,
}

/// One `CIDR[:PORT]` rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Allow or deny.
    pub verdict: Verdict,
    net: IpAddr,
    prefix: u8,
    port: Option<u16>,
}

/// Why a rule did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    /// Not an address.
    #[error("`{0}` is not an IP address or CIDR")]
    Addr(String),
    /// Prefix longer than the address.
    #[error("prefix /{0} is too long for the address")]
    Prefix(u8),
    /// Port is not a number 0..65535.
    #[error("`{0}` is not a port number")]
    Port(String),
}

impl Rule {
    /// Parses `CIDR[:PORT]` for `verdict`.
    pub fn parse(verdict: Verdict, s: &str) -> Result<Rule, RuleError> {
        let (net, port) = split_port(s)?;
        let (ip, prefix) = match net.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (net, None),
        };
        let ip = IpAddr::from_str(ip).map_err(|_| RuleError::Addr(s.to_string()))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .map_err(|_| RuleError::Addr(s.to_string()))?,
            None => max,
        };
        if prefix > max {
            return Err(RuleError::Prefix(prefix));
        }
        Ok(Rule {
            verdict,
            net: ip,
            prefix,
            port,
        })
    }

    /// Whether this rule names IPv4 link-local addresses only (a range inside
    /// 169.254.0.0/16).
    fn within_link_local(&self) -> bool {
        match self.net {
            IpAddr::V4(n) => self.prefix >= 16 && is_link_local_v4(IpAddr::V4(n)),
            IpAddr::V6(_) => false,
        }
    }

    /// Whether this rule covers `dest`.
    pub fn matches(&self, dest: &SocketAddr) -> bool {
        if self.port.is_some_and(|p| p != dest.port()) {
            return false;
        }
        let ip = match dest.ip() {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => within(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => within(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn split_port(s: &str) -> Result<(&str, Option<u16>), RuleError> {
    let parse = |p: &str| p.parse::<u16>().map_err(|_| RuleError::Port(p.to_string()));
    if let Some(rest) = s.strip_prefix('[') {
        let (net, tail) = rest
            .split_once(']')
            .ok_or_else(|| RuleError::Addr(s.to_string()))?;
        return match tail.strip_prefix(':') {
            Some(p) => Ok((net, Some(parse(p)?))),
            None if tail.is_empty() => Ok((net, None)),
            None => Err(RuleError::Addr(s.to_string())),
        };
    }
    match s.rsplit_once(':') {
        // Exactly one colon: IPv4 with a port. More: a bare IPv6 address.
        Some((net, p)) if !net.contains(':') => Ok((net, Some(parse(p)?))),
        _ => Ok((s, None)),
    }
}

/// An ordered rule list, and the hand-off rules (`--handoff`).
#[derive(Clone, Debug, Default)]
pub struct Policy {
    rules: Vec<Rule>,
    handoff: Vec<Rule>,
}

impl Policy {
    /// A policy from rules in command-line order.
    pub fn new(rules: Vec<Rule>) -> Policy {
        Policy {
            rules,
            handoff: Vec::new(),
        }
    }

    /// This policy with `--handoff` rules (their verdicts are not read): a connect the
    /// rules admit to a destination one of them matches is handed off
    /// ([`crate::Decision::Handoff`]).
    pub fn with_handoff(mut self, handoff: Vec<Rule>) -> Policy {
        self.handoff = handoff;
        self
    }

    /// Whether a hand-off rule matches `dest` (whether the policy admits it is
    /// [`Policy::check_sandbox`]'s question).
    pub fn hands_off(&self, dest: &SocketAddr) -> bool {
        self.handoff.iter().any(|r| r.matches(dest))
    }

    /// Whether any hand-off rule is given (the command's filter then guards handed-off
    /// sockets).
    pub fn has_handoff(&self) -> bool {
        !self.handoff.is_empty()
    }

    /// The verdict for a (non-loopback) destination.
    pub fn check(&self, dest: &SocketAddr) -> Verdict {
        if let Some(r) = self.rules.iter().find(|r| r.matches(dest)) {
            return r.verdict;
        }
        if self.rules.iter().any(|r| r.verdict == Verdict::Allow) {
            Verdict::Deny
        } else {
            Verdict::Allow
        }
    }

    /// The verdict for a destination a sandbox names (non-local): [`Policy::check`],
    /// except that an IPv4 link-local one is allowed only when the rule that decides
    /// is an allow inside 169.254.0.0/16.
    pub fn check_sandbox(&self, dest: &SocketAddr) -> Verdict {
        if !is_link_local_v4(dest.ip()) {
            return self.check(dest);
        }
        match self.rules.iter().find(|r| r.matches(dest)) {
            Some(r) if r.verdict == Verdict::Allow && r.within_link_local() => Verdict::Allow,
            _ => Verdict::Deny,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_and_port_match() {
        let r = Rule::parse(Verdict::Deny, "10.77.0.0/16:5201").unwrap();
        assert!(r.matches(&sa("10.77.3.4:5201")));
        assert!(!r.matches(&sa("10.77.3.4:80")));
        assert!(!r.matches(&sa("10.78.0.1:5201")));
        let r = Rule::parse(Verdict::Deny, "10.77.0.2").unwrap();
        assert!(r.matches(&sa("10.77.0.2:1")));
        assert!(!r.matches(&sa("10.77.0.3:1")));
    }

    #[test]
    fn odd_prefixes_and_v6() {
        let r = Rule::parse(Verdict::Allow, "192.168.0.0/23").unwrap();
        assert!(r.matches(&sa("192.168.1.9:1")));
        assert!(!r.matches(&sa("192.168.2.9:1")));
        let r = Rule::parse(Verdict::Allow, "[2001:db8::/32]:443").unwrap();
        assert!(r.matches(&sa("[2001:db8:1::5]:443")));
        assert!(!r.matches(&sa("[2001:db9::5]:443")));
        let r = Rule::parse(Verdict::Allow, "fd00::1").unwrap();
        assert!(r.matches(&sa("[fd00::1]:9")));
        let r = Rule::parse(Verdict::Deny, "10.0.0.0/8").unwrap();
        assert!(
            r.matches(&sa("[::ffff:10.1.2.3]:9")),
            "v4-mapped destinations match v4 rules"
        );
    }

    #[test]
    fn bad_rules_are_refused() {
        assert_eq!(
            Rule::parse(Verdict::Allow, "10.0.0.0/33"),
            Err(RuleError::Prefix(33))
        );
        assert!(matches!(
            Rule::parse(Verdict::Allow, "nope"),
            Err(RuleError::Addr(_))
        ));
        assert!(matches!(
            Rule::parse(Verdict::Allow, "1.2.3.4:99999"),
            Err(RuleError::Port(_))
        ));
    }

    #[test]
    fn first_match_wins_and_allow_lists_close_the_rest() {
        let p = Policy::new(vec![
            Rule::parse(Verdict::Deny, "10.77.0.2:22").unwrap(),
            Rule::parse(Verdict::Allow, "10.77.0.0/24").unwrap(),
        ]);
        assert_eq!(p.check(&sa("10.77.0.2:22")), Verdict::Deny);
        assert_eq!(p.check(&sa("10.77.0.2:80")), Verdict::Allow);
        assert_eq!(p.check(&sa("8.8.8.8:53")), Verdict::Deny);
        let open = Policy::new(vec![Rule::parse(Verdict::Deny, "10.0.0.0/8").unwrap()]);
        assert_eq!(open.check(&sa("8.8.8.8:53")), Verdict::Allow);
        assert_eq!(open.check(&sa("10.1.1.1:53")), Verdict::Deny);
    }

    #[test]
    fn ipv4_link_local_needs_an_allow_of_its_own() {
        let metadata = sa("169.254.169.254:80");
        let rules = |r: &[(Verdict, &str)]| {
            Policy::new(r.iter().map(|(v, s)| Rule::parse(*v, s).unwrap()).collect())
        };
        let (allow, deny) = (Verdict::Allow, Verdict::Deny);
        // Open by default, and a wide allow: link-local stays refused, the rest not.
        for p in [
            Policy::default(),
            rules(&[(allow, "0.0.0.0/0")]),
            rules(&[(allow, "128.0.0.0/1")]),
        ] {
            assert_eq!(p.check_sandbox(&metadata), deny, "{p:?}");
            assert_eq!(p.check_sandbox(&sa("[::ffff:169.254.1.1]:53")), deny);
            assert_eq!(p.check_sandbox(&sa("169.253.255.255:80")), allow);
            assert_eq!(p.check_sandbox(&sa("169.255.0.1:80")), allow);
            assert_eq!(p.check(&metadata), allow, "check alone is the rules'");
        }
        // An allow inside 169.254.0.0/16 that decides: reached, on its port if it names one.
        let p = rules(&[(allow, "169.254.169.254/32:80"), (allow, "0.0.0.0/0")]);
        assert_eq!(p.check_sandbox(&metadata), allow);
        assert_eq!(p.check_sandbox(&sa("169.254.169.254:81")), deny);
        assert_eq!(p.check_sandbox(&sa("169.254.169.253:80")), deny);
        assert_eq!(p.check_sandbox(&sa("8.8.8.8:53")), allow);
        let p = rules(&[(allow, "169.254.0.0/16")]);
        assert_eq!(p.check_sandbox(&sa("169.254.3.4:1")), allow);
        assert_eq!(p.check_sandbox(&sa("8.8.8.8:53")), deny, "an allow-list");
        // A deny before it still wins.
        let p = rules(&[(deny, "169.254.169.254"), (allow, "169.254.0.0/16")]);
        assert_eq!(p.check_sandbox(&metadata), deny);
    }
}
