//! Egress bonding: the sandbox's new outgoing connections spread over several host source
//! addresses (`ferry run --egress ADDR,… --bond rr|xor|least`).
//!
//! This is Linux bonding's transmit policies applied per connection rather than per
//! packet: a connection keeps the source address it was given, so a stream never changes
//! paths mid-flight (no reordering, no broken NAT state), and the host's routing (e.g.
//! `ip rule from ADDR table …`) decides which path each source address takes.
//!
//! * `rr`: each new connection takes the next address in turn.
//! * `xor`: a hash of the destination (address and port, like bonding's `layer3+4`)
//!   picks the address, so one destination always leaves from the same one.
//! * `least`: the address with the fewest live connections (ties: the first listed).
//!
//! Only addresses of the destination's family are candidates; when there is none, the
//! socket is left alone (the kernel picks the source as usual). A [`Lease`] stands for
//! one connection placed on an address: the socket holds it, and dropping it (when the
//! server closes the socket) ends the connection for `least` and adds the socket's byte
//! counts to the address's counters.
//!
//! One [`Bond`] is shared (in an `Arc`) by every server thread of a sandbox, protocol
//! and NIC servers alike; its state is atomics plus one mutex that makes `least`'s
//! choose-and-count a single step. Binding a host socket to the lease's address is the
//! path's own (the protocol server through its seam, `IP_BIND_ADDRESS_NO_PORT`; a NIC
//! server before its connect).

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How a [`Bond`] picks a source address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Round robin over new connections.
    Rr,
    /// Hash of the destination address and port.
    Xor,
    /// Fewest live connections.
    Least,
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "rr" => Ok(Mode::Rr),
            "xor" => Ok(Mode::Xor),
            "least" => Ok(Mode::Least),
            other => Err(format!("unknown bond mode `{other}` (rr, xor or least)")),
        }
    }
}

/// Counters of one source address (`--stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EgressStats {
    /// The source address.
    pub addr: IpAddr,
    /// Connections given this address (also those whose bind or connect then failed).
    pub connections: u64,
    /// Of those, still open.
    pub live: u64,
    /// Bytes sent by its closed connections.
    pub bytes_out: u64,
    /// Bytes received by its closed connections.
    pub bytes_in: u64,
}

/// One source address and its counters.
#[derive(Debug)]
struct Slot {
    addr: IpAddr,
    connections: AtomicU64,
    live: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
}

/// A set of source addresses and the policy that spreads connections over them.
#[derive(Debug)]
pub struct Bond {
    mode: Mode,
    slots: Vec<Slot>,
    /// Round-robin positions, one per family (IPv4, IPv6), so that a mix of families
    /// still alternates within each.
    turn: [AtomicUsize; 2],
    /// Makes `least`'s "find the minimum, count one more" atomic across threads.
    least: Mutex<()>,
}

/// One connection placed on a bond's address; dropping it ends the connection.
#[derive(Debug)]
pub struct Lease {
    bond: Arc<Bond>,
    slot: usize,
    bytes_out: u64,
    bytes_in: u64,
}

impl Bond {
    /// A bond over `addrs` (in the order given; duplicates are kept, which weights them).
    pub fn new(mode: Mode, addrs: Vec<IpAddr>) -> Bond {
        Bond {
            mode,
            slots: addrs
                .into_iter()
                .map(|addr| Slot {
                    addr,
                    connections: AtomicU64::new(0),
                    live: AtomicU64::new(0),
                    bytes_out: AtomicU64::new(0),
                    bytes_in: AtomicU64::new(0),
                })
                .collect(),
            turn: [AtomicUsize::new(0), AtomicUsize::new(0)],
            least: Mutex::new(()),
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Picks the source address for a new connection to `dst` without counting it as
    /// live (`rr` still advances). `None`: no address of `dst`'s family.
    pub fn pick(&self, dst: SocketAddr) -> Option<IpAddr> {
        self.choose(dst).map(|i| self.slots[i].addr)
    }

    /// Picks the source address for a new connection to `dst` and counts the connection
    /// on it until the lease is dropped.
    pub fn lease(self: &Arc<Self>, dst: SocketAddr) -> Option<Lease> {
        let slot = if self.mode == Mode::Least {
            let _one_at_a_time = self.least.lock().unwrap_or_else(|p| p.into_inner());
            let slot = self.choose(dst)?;
            self.slots[slot].live.fetch_add(1, Ordering::Relaxed);
            slot
        } else {
            let slot = self.choose(dst)?;
            self.slots[slot].live.fetch_add(1, Ordering::Relaxed);
            slot
        };
        self.slots[slot].connections.fetch_add(1, Ordering::Relaxed);
        Some(Lease {
            bond: Arc::clone(self),
            slot,
            bytes_out: 0,
            bytes_in: 0,
        })
    }

    /// Each address's counters, in the order given.
    pub fn stats(&self) -> Vec<EgressStats> {
        self.slots
            .iter()
            .map(|s| EgressStats {
                addr: s.addr,
                connections: s.connections.load(Ordering::Relaxed),
                live: s.live.load(Ordering::Relaxed),
                bytes_out: s.bytes_out.load(Ordering::Relaxed),
                bytes_in: s.bytes_in.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The slot for a connection to `dst` under the bond's mode.
    fn choose(&self, dst: SocketAddr) -> Option<usize> {
        let (v4, ip) = match unmapped(dst.ip()) {
            ip @ IpAddr::V4(_) => (true, ip),
            ip => (false, ip),
        };
        let candidates: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].addr.is_ipv4() == v4)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let n = candidates.len();
        let k = match self.mode {
            Mode::Rr => self.turn[usize::from(!v4)].fetch_add(1, Ordering::Relaxed) % n,
            Mode::Xor => usize::try_from(flow_hash(ip, dst.port()) % n as u64).unwrap_or(0),
            Mode::Least => (0..n)
                .min_by_key(|&k| self.slots[candidates[k]].live.load(Ordering::Relaxed))
                .expect("candidates is not empty"),
        };
        Some(candidates[k])
    }
}

impl Lease {
    /// The source address.
    pub fn addr(&self) -> IpAddr {
        self.bond.slots[self.slot].addr
    }

    /// Records the connection's byte counts, added to the address's when it ends.
    pub fn set_bytes(&mut self, bytes_out: u64, bytes_in: u64) {
        self.bytes_out = bytes_out;
        self.bytes_in = bytes_in;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let slot = &self.bond.slots[self.slot];
        slot.bytes_out.fetch_add(self.bytes_out, Ordering::Relaxed);
        slot.bytes_in.fetch_add(self.bytes_in, Ordering::Relaxed);
        slot.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// FNV-1a over the destination's address bytes and port: deterministic across runs and
/// machines (unlike std's randomly keyed hasher), and it mixes every input byte.
fn flow_hash(ip: IpAddr, port: u16) -> u64 {
    let octets: Vec<u8> = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    octets
        .iter()
        .chain(port.to_be_bytes().iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn bond(mode: Mode) -> Arc<Bond> {
        Arc::new(Bond::new(
            mode,
            vec![
                ip("10.0.0.1"),
                ip("fd00::1"),
                ip("10.0.1.1"),
                ip("10.0.2.1"),
            ],
        ))
    }

    #[test]
    fn modes_parse() {
        assert_eq!("rr".parse::<Mode>(), Ok(Mode::Rr));
        assert_eq!("xor".parse::<Mode>(), Ok(Mode::Xor));
        assert_eq!("least".parse::<Mode>(), Ok(Mode::Least));
        assert!("balance-rr".parse::<Mode>().is_err());
    }

    #[test]
    fn rr_takes_turns_within_the_family() {
        let b = bond(Mode::Rr);
        let dst = sa("192.0.2.7:80");
        let picks: Vec<IpAddr> = (0..6).map(|_| b.pick(dst).unwrap()).collect();
        let want = ["10.0.0.1", "10.0.1.1", "10.0.2.1"].map(ip);
        assert_eq!(picks[..3], want);
        assert_eq!(picks[3..], want);
        // IPv6 has its own turn and only its own address.
        assert_eq!(b.pick(sa("[2001:db8::1]:80")), Some(ip("fd00::1")));
        assert_eq!(b.pick(sa("[2001:db8::1]:80")), Some(ip("fd00::1")));
        // A v4-mapped destination is IPv4.
        assert_eq!(b.pick(sa("[::ffff:192.0.2.7]:80")), Some(ip("10.0.0.1")));
    }

    #[test]
    fn no_address_of_the_family_means_no_choice() {
        let b = Arc::new(Bond::new(Mode::Rr, vec![ip("10.0.0.1")]));
        assert_eq!(b.pick(sa("[2001:db8::1]:443")), None);
        assert!(b.lease(sa("[2001:db8::1]:443")).is_none());
        assert_eq!(b.stats()[0].connections, 0);
    }

    #[test]
    fn xor_is_a_function_of_the_destination() {
        let b = bond(Mode::Xor);
        let dst = sa("192.0.2.7:443");
        let first = b.pick(dst).unwrap();
        assert!((0..20).all(|_| b.pick(dst) == Some(first)));
        // Different destinations (address or port) spread over every address.
        let mut seen = std::collections::HashSet::new();
        for port in 1000..1064 {
            seen.insert(b.pick(SocketAddr::new(ip("192.0.2.7"), port)).unwrap());
        }
        for last in 1..=64u8 {
            seen.insert(
                b.pick(SocketAddr::new(ip(&format!("198.51.100.{last}")), 80))
                    .unwrap(),
            );
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
        // Fixed: the same answer from a fresh bond (no per-process hashing key).
        assert_eq!(bond(Mode::Xor).pick(dst), Some(first));
    }

    #[test]
    fn least_follows_live_connections() {
        let b = bond(Mode::Least);
        let dst = sa("192.0.2.7:80");
        let a = b.lease(dst).unwrap();
        let c = b.lease(dst).unwrap();
        let d = b.lease(dst).unwrap();
        assert_eq!(
            [a.addr(), c.addr(), d.addr()],
            ["10.0.0.1", "10.0.1.1", "10.0.2.1"].map(ip)
        );
        // All equal: the first listed wins; then the one freed.
        let e = b.lease(dst).unwrap();
        assert_eq!(e.addr(), ip("10.0.0.1"));
        drop(c);
        assert_eq!(b.lease(dst).unwrap().addr(), ip("10.0.1.1"));
        // That lease was dropped at once: 10.0.1.1 is the least loaded again.
        assert_eq!(b.lease(dst).unwrap().addr(), ip("10.0.1.1"));
        let live: Vec<u64> = b.stats().iter().map(|s| s.live).collect();
        assert_eq!(live, [2, 0, 0, 1]);
        drop((a, d, e));
        assert!(b.stats().iter().all(|s| s.live == 0));
    }

    #[test]
    fn leases_count_connections_and_bytes() {
        let b = bond(Mode::Rr);
        let dst = sa("192.0.2.7:80");
        let mut one = b.lease(dst).unwrap();
        let two = b.lease(dst).unwrap();
        one.set_bytes(1000, 50);
        drop(one);
        let st = b.stats();
        assert_eq!(
            st[0],
            EgressStats {
                addr: ip("10.0.0.1"),
                connections: 1,
                live: 0,
                bytes_out: 1000,
                bytes_in: 50
            }
        );
        assert_eq!((st[2].connections, st[2].live), (1, 1));
        drop(two);
    }

    #[test]
    fn bond_is_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Bond>();
        let b = bond(Mode::Least);
        let dst = sa("192.0.2.7:80");
        let held: Vec<Lease> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|_| s.spawn(|| (0..10).map(|_| b.lease(dst).unwrap()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        // 30 connections over 3 addresses, chosen one at a time: exactly 10 each.
        let live: Vec<u64> = b.stats().iter().map(|s| s.live).collect();
        assert_eq!(live, [10, 0, 10, 10]);
        drop(held);
    }
}
