//! `ferry-egress` owns the rules at a sandbox's edge with the host's network, declared
//! once for every path that carries a sandbox's traffic (socket mode's protocol servers,
//! nic mode's NIC servers, and the paths to come: containers, VM guests):
//!
//! * [`admit`] (`admit.rs`): the one admission function. Every path asks it whether the
//!   sandbox may reach an address (or receive from one) and obeys its [`Decision`],
//!   whose [`Reason`] its log line and counters name.
//! * the egress policy ([`Policy`], `policy.rs`: `--allow`/`--deny`, the IPv4
//!   link-local rule);
//! * the address rules ([`reach`]: local addresses, link-local, multicast and
//!   broadcast, the sandbox's own link, the host's addresses and the sources a datagram
//!   may name);
//! * egress bonding ([`Bond`], [`Lease`], `bond.rs`);
//! * the throttled log of refusals ([`LogThrottle`], `throttle.rs`);
//! * published ports' host side (`published.rs`): the listener every path makes
//!   ([`host_listener`]: `[::]` for both families, or 0.0.0.0 without IPv6), and the
//!   hand-off of published connections from socket mode to nic mode ([`TapHandoff`]);
//! * the flow table of datagram paths ([`FlowTable`], `flows.rs`: by id and key, idle
//!   expiry, a cap per group with the idle-longest evicted): socket mode's published UDP
//!   flows, and a NIC server's one table of flows (its UDP and echo flows expire).
//! * the DNS forwarder's pure core ([`dns::Forwarder`], `dns.rs`: query ids rewritten,
//!   queries in flight bounded), which socket mode's forwarder and a NIC server's (for
//!   a VM guest) drive through their own sockets.
//!
//! It must not: do I/O beyond reading the host's addresses and making published ports'
//! host sockets, know about channels, frames or a server's loop, or depend on a server
//! (the servers depend on it; nothing here pulls in wasmtime).
#![deny(unsafe_code)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod admit;
mod bond;
pub mod dns;
pub mod flows;
mod policy;
mod published;
pub mod reach;
mod throttle;

pub use admit::{Decision, Origin, Reason, What, admit};
pub use bond::{Bond, EgressStats, Lease, Mode};
pub use flows::{FlowTable, Limits};
pub use policy::{Policy, Rule, RuleError, Verdict};
pub use published::{BACKLOG, HANDOFF_MAX, TapHandoff, host_listener};
pub use reach::{HostAddrs, OwnLink};
pub use throttle::LogThrottle;
