//! The one admission point: whether a sandbox may exchange traffic with an address, for
//! every path that carries it — socket mode's shim (a `connect`, a datagram's
//! destination, a datagram arriving at a socket on the host), nic mode's frames (a TCP
//! SYN, a UDP datagram, an echo request), and the paths to come (a container's link, a VM
//! guest's queue: an [`Origin::Link`] like nic mode's). A path asks [`admit`] and obeys
//! the [`Decision`]; it does not test address classes or the policy itself, so a rule
//! fixed here is fixed for all of them.
//!
//! The table ([`admit`]; local, the own link, multicast and the rest are
//! [`crate::reach`]'s classes, the policy is [`crate::Policy::check_sandbox`]):
//!
//! | `to` is | [`Origin::Sandbox`] | [`Origin::Host`] | [`Origin::Link`] |
//! |---|---|---|---|
//! | local | [`Decision::Inside`] | [`Reason::HostLocal`] | [`Reason::HostLocal`] |
//! | on the sandbox's own link | — (policy) | — (policy) | [`Reason::OwnLink`] |
//! | multicast, broadcast | policy | policy | [`Reason::Multicast`], [`Reason::Broadcast`] |
//! | IPv6 link-local | policy | policy | [`Reason::LinkLocalV6`] |
//! | IPv4 link-local | an allow of its own, else [`Reason::LinkLocalV4`] | same | same |
//! | anything else | policy: [`Decision::Outside`] or [`Reason::Policy`] | same | same |
//!
//! Hand-off (`--handoff`, issue 26 item 2): a [`What::Connect`] from a socket the shim
//! serves ([`Origin::Sandbox`], [`Origin::Host`]) that the table admits to the outside
//! is [`Decision::Handoff`] when a hand-off rule of the policy matches `to`
//! ([`Policy::hands_off`]): the program gets the host's connected socket itself. A
//! hand-off rule never admits what the table refuses, never applies to datagrams,
//! multicast or broadcast, nor to a link (it carries frames, not sockets).
//!
//! A socket the shim serves may send multicast or broadcast, or name an IPv6 link-local
//! peer: the host's kernel then asks what it asks of any socket (`SO_BROADCAST`, a scope
//! id). A link carries the sandbox's frames, not its sockets: it has no such options to
//! pass on, so it refuses them. An [`What::Arrival`] is judged as a destination from
//! the host: datagrams arrive only at sockets on the host.

use std::fmt;
use std::net::SocketAddr;

use crate::policy::{Policy, Verdict};
use crate::reach::{Class, OwnLink, class};

/// What the sandbox asks for (for the table: only [`What::Arrival`] differs; for the
/// log line: what it names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// A connection to `to` (a TCP SYN, a socket's `connect`).
    Connect,
    /// A datagram to `to`.
    Datagram,
    /// An ICMP echo request to `to` (port 0).
    Echo,
    /// A datagram from `to` arriving at a socket on the host.
    Arrival,
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            What::Connect => "connect",
            What::Datagram => "datagram",
            What::Echo => "echo",
            What::Arrival => "arrival",
        })
    }
}

/// Where the sandbox's end of the traffic is: which path asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A socket the shim serves that is not on the host (made in the sandbox's network
    /// namespace, or not placed yet): a local address is the sandbox's own.
    Sandbox,
    /// A socket the shim serves that lives on the host already (bound to a host
    /// address, connected or sent from before): a local address is the host's own.
    Host,
    /// A link ferry terminates (nic mode's TAP; a VM guest's queue): frames the
    /// sandbox's kernel sent from its addresses on this link.
    Link(OwnLink),
}

/// What [`admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Reached from the host (a host socket).
    Outside,
    /// The sandbox's own machine: served inside its network namespace.
    Inside,
    /// Reached from the host, and the connected host socket is handed to the program
    /// (a `--handoff` destination). A path that cannot hand off treats it as
    /// [`Decision::Outside`].
    Handoff,
    /// Refused.
    Refused(Reason),
}

impl Decision {
    /// Whether it may go ahead (inside, outside or handed off).
    pub fn admitted(self) -> bool {
        !matches!(self, Decision::Refused(_))
    }
}

/// Why [`admit`] refused; its `Display` is what a log line says after the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A local address where it would be the host's own (loopback, unspecified).
    HostLocal,
    /// An address on the sandbox's own link (the gateway, its subnets).
    OwnLink,
    /// A multicast address on a link.
    Multicast,
    /// The broadcast address on a link.
    Broadcast,
    /// An IPv6 link-local address on a link (it needs an interface).
    LinkLocalV6,
    /// IPv4 link-local without an `--allow` inside 169.254.0.0/16 that decides.
    LinkLocalV4,
    /// The egress policy's rules (or an allow-list none of whose rules matched).
    Policy,
}

impl Reason {
    /// A short name (for counters and JSON keys).
    pub fn name(self) -> &'static str {
        match self {
            Reason::HostLocal => "host_local",
            Reason::OwnLink => "own_link",
            Reason::Multicast => "multicast",
            Reason::Broadcast => "broadcast",
            Reason::LinkLocalV6 => "link_local_v6",
            Reason::LinkLocalV4 => "link_local_v4",
            Reason::Policy => "policy",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::HostLocal => {
                "refused: on the host that address is the host's own (never reachable from a sandbox)"
            }
            Reason::OwnLink => {
                "refused: an address of the sandbox's own link (ferry serves nothing there)"
            }
            Reason::Multicast => "refused: multicast",
            Reason::Broadcast => "refused: broadcast",
            Reason::LinkLocalV6 => "refused: IPv6 link-local (it needs an interface)",
            Reason::LinkLocalV4 => {
                "denied by policy (IPv4 link-local: only an --allow inside 169.254.0.0/16 reaches it)"
            }
            Reason::Policy => "denied by policy",
        })
    }
}

/// Whether traffic of kind `what` between the sandbox's end `from` and `to` may go, and
/// where (the module's table). `to` is the far end: the destination of what leaves,
/// the source of an [`What::Arrival`].
pub fn admit(policy: &Policy, what: What, from: Origin, to: SocketAddr) -> Decision {
    let from = match (what, from) {
        (What::Arrival, Origin::Sandbox) => Origin::Host,
        (_, from) => from,
    };
    let class = class(to.ip());
    if class == Class::Local {
        return match from {
            Origin::Sandbox => Decision::Inside,
            Origin::Host | Origin::Link(_) => Decision::Refused(Reason::HostLocal),
        };
    }
    if let Origin::Link(link) = from
        && let Some(why) = link_refusal(&link, class, to)
    {
        return Decision::Refused(why);
    }
    match policy.check_sandbox(&to) {
        Verdict::Allow if hand_off(policy, what, from, class, to) => Decision::Handoff,
        Verdict::Allow => Decision::Outside,
        Verdict::Deny if class == Class::LinkLocalV4 => Decision::Refused(Reason::LinkLocalV4),
        Verdict::Deny => Decision::Refused(Reason::Policy),
    }
}

/// Whether an admitted `what` to `to` (of `class`) is handed off (the module's docs).
fn hand_off(policy: &Policy, what: What, from: Origin, class: Class, to: SocketAddr) -> bool {
    what == What::Connect
        && !matches!(from, Origin::Link(_))
        && !matches!(class, Class::Multicast | Class::Broadcast)
        && policy.hands_off(&to)
}

/// What a link refuses besides what every path does.
fn link_refusal(link: &OwnLink, class: Class, to: SocketAddr) -> Option<Reason> {
    if link.contains(to.ip()) {
        return Some(Reason::OwnLink);
    }
    match class {
        Class::Multicast => Some(Reason::Multicast),
        Class::Broadcast => Some(Reason::Broadcast),
        Class::LinkLocalV6 => Some(Reason::LinkLocalV6),
        Class::Local | Class::LinkLocalV4 | Class::Remote => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Rule;
    use std::net::Ipv4Addr;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn link() -> Origin {
        Origin::Link(OwnLink {
            v4: Ipv4Addr::new(10, 0, 2, 100),
            prefix4: 24,
            v6: "fd00:0:0:2::100".parse().unwrap(),
            prefix6: 64,
        })
    }

    fn policy(rules: &[(Verdict, &str)]) -> Policy {
        Policy::new(
            rules
                .iter()
                .map(|(v, s)| Rule::parse(*v, s).unwrap())
                .collect(),
        )
    }

    const OUT: Decision = Decision::Outside;
    const IN: Decision = Decision::Inside;
    const fn no(r: Reason) -> Decision {
        Decision::Refused(r)
    }

    /// Each address class × each path, under the open default: the module's table.
    #[test]
    fn the_table_under_the_open_default() {
        use Reason::{Broadcast, HostLocal, LinkLocalV4, LinkLocalV6, Multicast, OwnLink};
        let open = Policy::default();
        // (to, sandbox socket, host socket, link, arrival)
        let table = [
            (
                "127.0.0.1:80",
                IN,
                no(HostLocal),
                no(HostLocal),
                no(HostLocal),
            ),
            (
                "0.0.0.0:80",
                IN,
                no(HostLocal),
                no(HostLocal),
                no(HostLocal),
            ),
            (
                "0.1.2.3:80",
                IN,
                no(HostLocal),
                no(HostLocal),
                no(HostLocal),
            ),
            ("[::1]:80", IN, no(HostLocal), no(HostLocal), no(HostLocal)),
            ("[::]:80", IN, no(HostLocal), no(HostLocal), no(HostLocal)),
            (
                "[::ffff:127.0.0.1]:80",
                IN,
                no(HostLocal),
                no(HostLocal),
                no(HostLocal),
            ),
            ("10.0.2.2:53", OUT, OUT, no(OwnLink), OUT),
            ("10.0.2.255:53", OUT, OUT, no(OwnLink), OUT),
            ("[::ffff:10.0.2.2]:53", OUT, OUT, no(OwnLink), OUT),
            ("[fd00:0:0:2::2]:53", OUT, OUT, no(OwnLink), OUT),
            ("224.0.0.251:5353", OUT, OUT, no(Multicast), OUT),
            ("[::ffff:239.1.1.1]:5353", OUT, OUT, no(Multicast), OUT),
            ("[ff02::fb]:5353", OUT, OUT, no(Multicast), OUT),
            ("255.255.255.255:67", OUT, OUT, no(Broadcast), OUT),
            ("[fe80::1]:22", OUT, OUT, no(LinkLocalV6), OUT),
            (
                "169.254.169.254:80",
                no(LinkLocalV4),
                no(LinkLocalV4),
                no(LinkLocalV4),
                no(LinkLocalV4),
            ),
            (
                "[::ffff:169.254.1.1]:53",
                no(LinkLocalV4),
                no(LinkLocalV4),
                no(LinkLocalV4),
                no(LinkLocalV4),
            ),
            ("192.0.2.7:443", OUT, OUT, OUT, OUT),
            ("[2001:db8::7]:443", OUT, OUT, OUT, OUT),
        ];
        for (to, sandbox, host, on_link, arrival) in table {
            let to = sa(to);
            let got = [
                admit(&open, What::Connect, Origin::Sandbox, to),
                admit(&open, What::Datagram, Origin::Host, to),
                admit(&open, What::Connect, link(), to),
                admit(&open, What::Arrival, Origin::Sandbox, to),
            ];
            assert_eq!(got, [sandbox, host, on_link, arrival], "{to}");
            // The kind of traffic leaving changes nothing; arrivals are the host's.
            for what in [What::Connect, What::Datagram, What::Echo] {
                assert_eq!(admit(&open, what, link(), to), on_link, "{what} {to}");
                assert_eq!(admit(&open, what, Origin::Host, to), host, "{what} {to}");
            }
            assert_eq!(admit(&open, What::Arrival, Origin::Host, to), arrival);
        }
    }

    #[test]
    fn the_policy_decides_the_rest_on_every_path() {
        let p = policy(&[
            (Verdict::Deny, "192.0.2.0/24:22"),
            (Verdict::Allow, "192.0.2.0/24"),
            (Verdict::Allow, "[2001:db8::/32]:443"),
        ]);
        for from in [Origin::Sandbox, Origin::Host, link()] {
            for what in [What::Connect, What::Datagram, What::Arrival] {
                let ask = |to: &str| admit(&p, what, from, sa(to));
                assert_eq!(ask("192.0.2.7:80"), OUT, "{from:?} {what}");
                assert_eq!(ask("192.0.2.7:22"), no(Reason::Policy), "a deny first");
                assert_eq!(ask("[::ffff:192.0.2.7]:22"), no(Reason::Policy), "mapped");
                assert_eq!(ask("[2001:db8::1]:443"), OUT);
                assert_eq!(ask("[2001:db8::1]:80"), no(Reason::Policy), "port");
                assert_eq!(ask("198.51.100.1:80"), no(Reason::Policy), "allow-list");
            }
        }
        // Local destinations never reach the policy: the sandbox's own, or refused.
        let none = policy(&[(Verdict::Deny, "0.0.0.0/0"), (Verdict::Deny, "::/0")]);
        assert_eq!(
            admit(&none, What::Connect, Origin::Sandbox, sa("127.0.0.1:1")),
            IN
        );
        assert_eq!(
            admit(&none, What::Connect, Origin::Host, sa("127.0.0.1:1")),
            no(Reason::HostLocal)
        );
    }

    #[test]
    fn a_handoff_rule_changes_the_path_of_admitted_connects_only() {
        let handoff = |rules: &[(Verdict, &str)], h: &[&str]| {
            policy(rules).with_handoff(
                h.iter()
                    .map(|s| Rule::parse(Verdict::Allow, s).unwrap())
                    .collect(),
            )
        };
        let p = handoff(
            &[(Verdict::Deny, "192.0.2.9/32")],
            &["192.0.2.0/24", "[2001:db8::/32]:443", "224.0.0.0/4"],
        );
        let hand = Decision::Handoff;
        for from in [Origin::Sandbox, Origin::Host] {
            let c = |to: &str| admit(&p, What::Connect, from, sa(to));
            assert_eq!(c("192.0.2.7:80"), hand, "{from:?}");
            assert_eq!(c("[::ffff:192.0.2.7]:80"), hand, "mapped");
            assert_eq!(c("[2001:db8::1]:443"), hand);
            assert_eq!(c("[2001:db8::1]:80"), OUT, "another port: served");
            assert_eq!(c("198.51.100.1:80"), OUT, "no rule: served");
            assert_eq!(c("192.0.2.9:80"), no(Reason::Policy), "a deny still wins");
            assert_eq!(c("224.0.0.1:80"), OUT, "never multicast");
            for what in [What::Datagram, What::Echo, What::Arrival] {
                assert_eq!(admit(&p, what, from, sa("192.0.2.7:80")), OUT, "{what}");
            }
        }
        assert_eq!(
            admit(&p, What::Connect, Origin::Sandbox, sa("127.0.0.1:80")),
            IN,
            "local stays inside"
        );
        assert_eq!(
            admit(&p, What::Connect, link(), sa("192.0.2.7:80")),
            OUT,
            "a link has no socket to hand over"
        );
        // An allow-list without the destination refuses it, hand-off rule or not.
        let listed = handoff(&[(Verdict::Allow, "198.51.100.0/24")], &["192.0.2.0/24"]);
        assert_eq!(
            admit(&listed, What::Connect, Origin::Sandbox, sa("192.0.2.7:80")),
            no(Reason::Policy)
        );
        // IPv4 link-local keeps its own rule.
        let meta = handoff(&[], &["169.254.0.0/16"]);
        assert_eq!(
            admit(
                &meta,
                What::Connect,
                Origin::Sandbox,
                sa("169.254.169.254:80")
            ),
            no(Reason::LinkLocalV4)
        );
    }

    #[test]
    fn ipv4_link_local_takes_an_allow_of_its_own_on_every_path() {
        let wide = policy(&[(Verdict::Allow, "0.0.0.0/0")]);
        let own = policy(&[
            (Verdict::Allow, "169.254.169.254/32:80"),
            (Verdict::Allow, "0.0.0.0/0"),
        ]);
        let metadata = sa("169.254.169.254:80");
        for from in [Origin::Sandbox, Origin::Host, link()] {
            for what in [What::Connect, What::Datagram, What::Echo, What::Arrival] {
                assert_eq!(admit(&wide, what, from, metadata), no(Reason::LinkLocalV4));
                assert_eq!(admit(&own, what, from, metadata), OUT, "{from:?} {what}");
                assert_eq!(
                    admit(&own, what, from, sa("169.254.169.254:81")),
                    no(Reason::LinkLocalV4),
                    "another port"
                );
            }
        }
    }

    #[test]
    fn a_link_refuses_its_own_classes_whatever_the_policy_allows() {
        let all = policy(&[(Verdict::Allow, "0.0.0.0/0"), (Verdict::Allow, "::/0")]);
        for (to, why) in [
            ("10.0.2.2:80", Reason::OwnLink),
            ("[fd00:0:0:2::1]:80", Reason::OwnLink),
            ("224.0.0.1:80", Reason::Multicast),
            ("255.255.255.255:80", Reason::Broadcast),
            ("[fe80::1]:80", Reason::LinkLocalV6),
            ("127.0.0.1:80", Reason::HostLocal),
        ] {
            assert_eq!(admit(&all, What::Datagram, link(), sa(to)), no(why), "{to}");
        }
        assert_eq!(admit(&all, What::Datagram, link(), sa("10.0.3.2:80")), OUT);
    }

    #[test]
    fn reasons_read_as_log_lines() {
        assert_eq!(Reason::Policy.to_string(), "denied by policy");
        assert!(
            Reason::LinkLocalV4
                .to_string()
                .starts_with("denied by policy")
        );
        assert!(Reason::LinkLocalV4.to_string().contains("169.254.0.0/16"));
        assert_eq!(What::Datagram.to_string(), "datagram");
        let names: std::collections::HashSet<_> = [
            Reason::HostLocal,
            Reason::OwnLink,
            Reason::Multicast,
            Reason::Broadcast,
            Reason::LinkLocalV6,
            Reason::LinkLocalV4,
            Reason::Policy,
        ]
        .map(Reason::name)
        .into();
        assert_eq!(names.len(), 7);
        assert!(!no(Reason::Policy).admitted() && IN.admitted() && OUT.admitted());
    }
}
