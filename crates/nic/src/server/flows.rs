//! A NIC server's flows: one table ([`FlowTable`]) of every flow it carries — TCP ones
//! (pending while the host connects, then open), UDP ones, echo ones — by id (each
//! flow's epoll token), and one key map from what the sandbox opened ([`Key`]) to the
//! flow carrying it. Published connections, which the sandbox did not open, sit in the
//! map under their own id ([`Slot::Published`]).
//!
//! The store is ferry-egress's flow table of datagram paths
//! ([`ferry_egress::FlowTable`]): UDP flows idle [`UDP_IDLE`] and echo flows idle
//! [`ECHO_IDLE`] expire there (swept at most once a second), as socket mode's
//! published UDP flows do; TCP flows never expire by idleness (they end with their
//! stack socket). No cap of the table's own: the server's ([`super::gate::Gate::room`])
//! counts every flow.
//!
//! Owns: ids, the slots, which flows are over ([`FlowTable::reap`]). Must not: make or
//! close host sockets, or touch the stack (the server does, given the flows).

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use ferry_egress::Limits;
use smoltcp::iface::SocketHandle;

use super::dgram::Dgram;
use super::pending::{PROBE_EVERY, Pending};
use super::tcp::TcpFlow;

/// A UDP flow idle this long is closed.
pub(crate) const UDP_IDLE: Duration = Duration::from_secs(60);
/// An echo flow idle this long is closed.
pub(crate) const ECHO_IDLE: Duration = Duration::from_secs(10);

/// What a keyed flow carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Proto {
    Tcp,
    Udp,
    Echo,
}

/// A flow the sandbox opened: its protocol, its end, the remote end. An echo flow's
/// sandbox end carries the request's identifier as its port, its remote end port 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub proto: Proto,
    pub sandbox: SocketAddr,
    pub remote: SocketAddr,
}

/// Where a flow sits in the key map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    /// What the sandbox opened.
    Opened(Key),
    /// A published connection: its own id (nothing else finds it).
    Published(u64),
}

/// How long a flow in `slot` may carry nothing: UDP and echo flows their time, TCP
/// flows for ever.
fn idle(slot: &Slot) -> Duration {
    match slot {
        Slot::Opened(Key {
            proto: Proto::Udp, ..
        }) => UDP_IDLE,
        Slot::Opened(Key {
            proto: Proto::Echo, ..
        }) => ECHO_IDLE,
        Slot::Opened(_) | Slot::Published(_) => Duration::MAX,
    }
}

/// One flow.
#[derive(Debug)]
pub(crate) enum Flow {
    /// A TCP flow whose host connect is under way (its SYN kept, no stack socket).
    Pending(Pending),
    Tcp(TcpFlow),
    Udp(Dgram),
    Echo(Dgram),
}

impl Flow {
    /// Its host socket.
    pub fn host(&self) -> BorrowedFd<'_> {
        match self {
            Flow::Pending(p) => p.host.as_fd(),
            Flow::Tcp(t) => t.host.as_fd(),
            Flow::Udp(d) | Flow::Echo(d) => d.host.as_fd(),
        }
    }

    /// What the sandbox opened, for flows it opened.
    pub fn key(&self) -> Option<Key> {
        match self {
            Flow::Pending(p) => Some(p.key),
            Flow::Tcp(t) => t.key,
            Flow::Udp(d) => Some(d.key(Proto::Udp)),
            Flow::Echo(d) => Some(d.key(Proto::Echo)),
        }
    }
}

/// Every flow of a server (see the module's header).
#[derive(Debug)]
pub(crate) struct FlowTable {
    table: ferry_egress::FlowTable<Slot, Flow>,
    last_id: u64,
}

impl FlowTable {
    /// An empty table whose ids start above `first` (ids below are other tokens).
    pub fn new(first: u64) -> FlowTable {
        FlowTable {
            table: ferry_egress::FlowTable::new(Limits::uncapped(idle)),
            last_id: first,
        }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether any TCP flow is open (not pending): what a draining server waits for.
    pub fn tcp_open(&self) -> bool {
        self.table.iter().any(|(_, f)| matches!(f, Flow::Tcp(_)))
    }

    /// A new id (for a flow about to be inserted: its epoll token).
    pub fn new_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// The flow carrying `key`.
    pub fn find(&self, key: &Key) -> Option<u64> {
        self.table.find(&Slot::Opened(*key))
    }

    pub fn get(&self, id: u64) -> Option<&Flow> {
        self.table.get(id)
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut Flow> {
        self.table.get_mut(id)
    }

    /// Flow `id` carried something at `now` (a datagram flow's idle time starts again).
    pub fn active(&mut self, id: u64, now: Instant) -> Option<&mut Flow> {
        self.table.active(id, now)
    }

    /// Inserts `flow` as `id`, active at `now`. Returns the flows it displaced (one
    /// that had its key or its id; none when the caller looked the key up first), for
    /// the caller to end.
    #[must_use]
    pub fn insert(&mut self, id: u64, flow: Flow, now: Instant) -> Vec<Flow> {
        let slot = flow.key().map_or(Slot::Published(id), Slot::Opened);
        let gone = self.table.insert(id, slot, flow, now);
        gone.into_iter().map(|(_, _, f)| f).collect()
    }

    /// Removes flow `id` and its key.
    pub fn remove(&mut self, id: u64) -> Option<Flow> {
        self.table.remove(id).map(|(_, f)| f)
    }

    pub fn values(&self) -> impl Iterator<Item = &Flow> {
        self.table.iter().map(|(_, f)| f)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Flow> {
        self.table.iter_mut().map(|(_, f)| f)
    }

    /// The flow whose host socket is `fd` (tests deliver events by descriptor).
    pub fn by_fd(&self, fd: RawFd) -> Option<u64> {
        self.table
            .iter()
            .find(|(_, f)| f.host().as_raw_fd() == fd)
            .map(|(id, _)| id)
    }

    /// The pending flows not asked within [`PROBE_EVERY`] whether the sandbox's connect
    /// still waits, each as (remote, sandbox end) for its probe; they count as asked at
    /// `now`.
    pub fn probe_due(&mut self, now: Instant) -> Vec<(SocketAddr, SocketAddr)> {
        let mut due = Vec::new();
        for f in self.values_mut() {
            if let Flow::Pending(p) = f
                && now.duration_since(p.probed) >= PROBE_EVERY
            {
                p.probed = now;
                due.push((p.key.remote, p.key.sandbox));
            }
        }
        due
    }

    /// Bytes the open TCP flows have moved (out, in).
    pub fn open_bytes(&self) -> (u64, u64) {
        self.table.iter().fold((0, 0), |(o, i), (_, f)| match f {
            Flow::Tcp(t) => (o + t.bytes_out, i + t.bytes_in),
            _ => (o, i),
        })
    }

    /// Takes out the flows over at `now`, for the caller to end: TCP flows whose stack
    /// socket `done` says is over, datagram flows idle past their time (at most one
    /// sweep a second, the egress table's).
    pub fn reap(&mut self, now: Instant, done: impl Fn(SocketHandle) -> bool) -> Vec<Flow> {
        let over: Vec<u64> = self
            .table
            .iter()
            .filter(|(_, f)| matches!(f, Flow::Tcp(t) if done(t.handle)))
            .map(|(id, _)| id)
            .collect();
        let mut gone: Vec<Flow> = over.into_iter().filter_map(|id| self.remove(id)).collect();
        gone.extend(self.table.expire(now).into_iter().map(|(_, _, f)| f));
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgram(remote: &str) -> Dgram {
        Dgram {
            host: ferry_sys::eventfd().unwrap(),
            sandbox: "10.0.2.100:4000".parse().unwrap(),
            remote: remote.parse().unwrap(),
            _lease: None,
        }
    }

    #[test]
    fn keys_follow_their_flows() {
        let now = Instant::now();
        let mut t = FlowTable::new(100);
        let a = t.new_id();
        assert!(a > 100);
        assert!(
            t.insert(a, Flow::Udp(dgram("192.0.2.1:53")), now)
                .is_empty()
        );
        let key = t.get(a).unwrap().key().unwrap();
        assert_eq!(key.proto, Proto::Udp);
        assert_eq!(t.find(&key), Some(a));
        // The same ends as echo are another flow.
        let echo = Key {
            proto: Proto::Echo,
            ..key
        };
        assert_eq!(t.find(&echo), None);
        let fd = t.get(a).unwrap().host().as_raw_fd();
        assert_eq!(t.by_fd(fd), Some(a));
        // A flow inserted under a key in use displaces the older one, handed back.
        let b = t.new_id();
        let gone = t.insert(b, Flow::Udp(dgram("192.0.2.1:53")), now);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].host().as_raw_fd(), fd);
        assert_eq!((t.find(&key), t.len()), (Some(b), 1));
        assert!(t.remove(a).is_none());
        assert!(t.remove(b).is_some());
        assert_eq!(t.find(&key), None);
        assert!(t.remove(b).is_none());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn idle_datagram_flows_end_by_their_kind_at_most_one_sweep_a_second() {
        let start = Instant::now();
        let mut t = FlowTable::new(0);
        let (u, e) = (t.new_id(), t.new_id());
        assert!(
            t.insert(u, Flow::Udp(dgram("192.0.2.1:53")), start)
                .is_empty()
        );
        assert!(
            t.insert(e, Flow::Echo(dgram("192.0.2.1:0")), start)
                .is_empty()
        );
        let never = |_| false;
        assert!(t.reap(start + ECHO_IDLE / 2, never).is_empty());
        // Within a second of that sweep: not looked at.
        assert!(
            t.reap(start + ECHO_IDLE / 2 + Duration::from_millis(500), never)
                .is_empty()
        );
        let gone = t.reap(start + ECHO_IDLE, never);
        assert!(matches!(gone[..], [Flow::Echo(_)]));
        // The UDP flow carried something since: its idle time started again.
        assert!(t.active(u, start + ECHO_IDLE).is_some());
        assert!(t.reap(start + UDP_IDLE, never).is_empty());
        assert_eq!(t.reap(start + ECHO_IDLE + UDP_IDLE, never).len(), 1);
        assert_eq!(t.len(), 0);
        assert!(!t.tcp_open());
    }

    #[test]
    fn tcp_and_published_flows_never_expire_by_idleness() {
        let k = Key {
            proto: Proto::Tcp,
            sandbox: "10.0.2.100:4000".parse().unwrap(),
            remote: "192.0.2.1:80".parse().unwrap(),
        };
        assert_eq!(idle(&Slot::Opened(k)), Duration::MAX);
        assert_eq!(idle(&Slot::Published(7)), Duration::MAX);
        let udp = Slot::Opened(Key {
            proto: Proto::Udp,
            ..k
        });
        let echo = Slot::Opened(Key {
            proto: Proto::Echo,
            ..k
        });
        assert_eq!((idle(&udp), idle(&echo)), (UDP_IDLE, ECHO_IDLE));
    }
}
