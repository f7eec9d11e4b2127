//! `ferry-nic` owns nic mode (S2): the sandbox gets a TAP device (`eth0`) and ferry's NIC
//! servers, outside the sandbox, own its queues. Each NIC server reads the frames its
//! queue carries, terminates the sandbox's TCP in a user-space TCP/IP stack (smoltcp),
//! relays UDP datagrams and ICMP echo itself, and carries every flow on a host socket —
//! under the same rules as socket mode, from `ferry-egress`: one admission function
//! (`ferry_egress::admit`, as a link: the egress policy, never the host's loopback or an
//! unspecified address, nor the sandbox's own subnets), inbound only through `-p` (its
//! host listener), the egress bond, the store of its flow table (UDP and echo flows' idle
//! expiry); sources the sandbox owns only (docs/SECURITY.md, "nic mode"). It does not
//! depend on `ferry-server`.
//!
//! ```text
//!   sandbox kernel ── eth0 (TAP, one queue per NIC server, vnet header, csum offload)
//!        │ batches of frames (FrameDevice: TapQueue)
//!   NIC server nic-K: frame::classify ─┬─ TCP  → smoltcp socket ⇄ host TCP socket
//!                     (Gate::admit     ├─ UDP  → flow table    ⇄ host UDP socket
//!                      for every new   ├─ echo → flow table    ⇄ host ping socket
//!                      flow)           └─ ARP/ND → smoltcp (answers as the gateway)
//!                                            host sockets through HostIo (Sys)
//! ```
//!
//! It owns: the sandbox's addressing ([`Plan`]), setting up the TAP inside the sandbox's
//! namespace ([`setup`]), the frame path ([`frame`]: pure functions), the frame device
//! a server serves ([`device`]: the [`FrameDevice`](device::FrameDevice) trait, the TAP
//! queue its first implementation), the host I/O seam ([`hostio`]: every call on a host
//! socket), the NIC server loop ([`NicServer`]: one flow table, TCP, datagram, echo and
//! published flows in files of their own, one admission check) and its in-process
//! harness ([`testkit`]: the real server over a fake device, fake host sockets, a held
//! clock; `tests/flows.rs`), and a VM guest's resolver on the gateway (`server/dns.rs`:
//! the DNS forwarder's core from `ferry-egress` over upstream sockets of the server's
//! own; [`NicConfig::dns`]). It must not: parse command lines, know about the shim's
//! channels, or trust any byte a frame carries (lengths are checked, checksums are not
//! needed: whatever a frame says, a server neither crashes nor stalls nor holds memory
//! for it beyond its caps).

#![deny(unsafe_code)]

pub mod device;
pub mod frame;
pub mod hostio;
mod server;
mod setup;
mod stats;
pub mod testkit;
mod timing;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

pub use server::{NicServer, StopHandle};
pub use setup::{Tap, setup};
pub use stats::{NicLive, NicStats, nic_json};
pub use timing::{Stage, StageTotal, Timing};

/// The sandbox's addressing in nic mode: its interface, the gateway (ferry) beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The sandbox's IPv4 address (`/prefix4`).
    pub v4: Ipv4Addr,
    /// The gateway's IPv4 address, on the same subnet.
    pub gw4: Ipv4Addr,
    pub prefix4: u8,
    /// The sandbox's IPv6 address (`/prefix6`).
    pub v6: Ipv6Addr,
    /// The gateway's IPv6 address.
    pub gw6: Ipv6Addr,
    pub prefix6: u8,
    /// The interface's MTU.
    pub mtu: u32,
    /// The interface's name inside the sandbox.
    pub ifname: String,
}

/// The MTU nic mode gives the sandbox's interface: the largest an Ethernet TAP takes
/// (as slirp4netns and pasta do); measured against 1500 and 9000 in `ferry bench E5`.
pub const DEFAULT_MTU: u32 = 65520;

impl Plan {
    /// The default plan (10.0.2.100/24 via 10.0.2.2, fd00::100/64 via fd00::2), moved to
    /// the first of 10.0.2.0/24 … 10.0.254.0/24 that none of `host` is in, so that the
    /// host's own networks stay reachable.
    pub fn avoiding(host: &[IpAddr]) -> Plan {
        let third = (2u8..=254)
            .find(|&t| {
                !host.iter().any(|ip| match ip {
                    IpAddr::V4(a) => a.octets()[..3] == [10, 0, t],
                    IpAddr::V6(_) => false,
                })
            })
            .unwrap_or(2);
        Plan {
            v4: Ipv4Addr::new(10, 0, third, 100),
            gw4: Ipv4Addr::new(10, 0, third, 2),
            prefix4: 24,
            v6: Ipv6Addr::new(0xfd00, 0, 0, u16::from(third), 0, 0, 0, 0x100),
            gw6: Ipv6Addr::new(0xfd00, 0, 0, u16::from(third), 0, 0, 0, 2),
            prefix6: 64,
            mtu: DEFAULT_MTU,
            ifname: "eth0".into(),
        }
    }

    /// Whether `ip` is the sandbox's own address (the only source it may send from).
    pub fn is_sandbox(&self, ip: IpAddr) -> bool {
        ip == IpAddr::V4(self.v4) || ip == IpAddr::V6(self.v6)
    }

    /// The sandbox's own link, as the admission rules see it.
    pub fn own_link(&self) -> ferry_egress::OwnLink {
        ferry_egress::OwnLink {
            v4: self.v4,
            prefix4: self.prefix4,
            v6: self.v6,
            prefix6: self.prefix6,
        }
    }

    /// Whether `ip` is on the sandbox's own link (its subnets: the gateway, the sandbox,
    /// their neighbours, the subnet's broadcast). Nothing but the gateway is there.
    pub fn on_link(&self, ip: IpAddr) -> bool {
        self.own_link().contains(ip)
    }

    /// The gateway address of `ip`'s family.
    pub fn gateway_for(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => IpAddr::V4(self.gw4),
            IpAddr::V6(_) => IpAddr::V6(self.gw6),
        }
    }

    /// The sandbox's address of `ip`'s family.
    pub fn sandbox_for(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => IpAddr::V4(self.v4),
            IpAddr::V6(_) => IpAddr::V6(self.v6),
        }
    }
}

/// A published TCP port in nic mode: connections to `host` are made to the sandbox's
/// address on `sandbox_port`.
#[derive(Clone, Copy, Debug)]
pub struct NicPublish {
    pub host: SocketAddr,
    pub sandbox_port: u16,
}

/// What every NIC server of a sandbox shares.
#[derive(Debug)]
pub struct NicConfig {
    pub plan: Plan,
    /// The egress policy (the same as the protocol servers').
    pub policy: ferry_egress::Policy,
    /// Egress bonding: where new host sockets leave from.
    pub egress: Option<Arc<ferry_egress::Bond>>,
    /// How long a server's loop spins for work before it sleeps (SBW).
    pub spin: Duration,
    /// Most flows (TCP, UDP and echo together) a NIC server carries at once.
    pub max_flows: usize,
    /// Each TCP flow's buffer in the stack, each way (bounds the memory a flow holds).
    pub tcp_buffer: usize,
    /// Upstream nameservers a guest's queries to the gateway's port 53 are relayed to
    /// (`ferry vm --dns`; empty: none, the port is refused as any on the gateway is).
    pub dns: Vec<SocketAddr>,
    /// Per-stage timing of the frame path (`ferry bench E5`; [`Stage`]), in the
    /// counters: two clock reads per stage when on.
    pub timing: bool,
}

impl NicConfig {
    /// Defaults for `plan`: no policy rules, no bond, 200 µs spin, 4,096 flows a server,
    /// 512 KiB a TCP direction, no timing, no resolver.
    pub fn new(plan: Plan) -> NicConfig {
        NicConfig {
            plan,
            policy: ferry_egress::Policy::default(),
            egress: None,
            spin: Duration::from_micros(200),
            max_flows: 4096,
            tcp_buffer: 512 * 1024,
            timing: false,
            dns: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_avoids_the_hosts_networks_and_knows_its_link() {
        let p = Plan::avoiding(&["10.0.2.15".parse().unwrap(), "10.0.3.1".parse().unwrap()]);
        assert_eq!(p.v4, Ipv4Addr::new(10, 0, 4, 100));
        assert_eq!(p.gw4, Ipv4Addr::new(10, 0, 4, 2));
        for on in [
            "10.0.4.2",
            "10.0.4.55",
            "10.0.4.255",
            "fd00:0:0:4::2",
            "fd00:0:0:4::55",
        ] {
            assert!(p.on_link(on.parse().unwrap()), "{on}");
        }
        for off in ["10.0.5.1", "10.0.2.15", "8.8.8.8", "fd00:0:0:5::2", "::1"] {
            assert!(!p.on_link(off.parse().unwrap()), "{off}");
        }
    }
}
