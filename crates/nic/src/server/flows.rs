//! A NIC server's flows: one table ([`FlowTable`]) of every flow it carries — TCP ones
//! (pending while the host connects, then open), UDP ones, echo ones — by id (each
//! flow's epoll token), and one key map from what the sandbox opened ([`Key`]) to the
//! flow carrying it. Published connections have no key (the sandbox did not open them).
//!
//! Owns: ids, the key map kept in step with the flows, which flows are over
//! ([`FlowTable::ended`]). Must not: make or close host sockets, or touch the stack (the
//! server does, given the ids).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

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
    flows: HashMap<u64, Flow>,
    keys: HashMap<Key, u64>,
    last_id: u64,
}

impl FlowTable {
    /// An empty table whose ids start above `first` (ids below are other tokens).
    pub fn new(first: u64) -> FlowTable {
        FlowTable {
            flows: HashMap::new(),
            keys: HashMap::new(),
            last_id: first,
        }
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// Whether any TCP flow is open (not pending): what a draining server waits for.
    pub fn tcp_open(&self) -> bool {
        self.flows.values().any(|f| matches!(f, Flow::Tcp(_)))
    }

    /// A new id (for a flow about to be inserted: its epoll token).
    pub fn new_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// The flow carrying `key`.
    pub fn find(&self, key: &Key) -> Option<u64> {
        self.keys.get(key).copied()
    }

    pub fn get(&self, id: u64) -> Option<&Flow> {
        self.flows.get(&id)
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut Flow> {
        self.flows.get_mut(&id)
    }

    /// Inserts `flow` as `id`, with its key.
    pub fn insert(&mut self, id: u64, flow: Flow) {
        if let Some(k) = flow.key() {
            self.keys.insert(k, id);
        }
        self.flows.insert(id, flow);
    }

    /// Removes flow `id` and its key (unless the key carries another flow now).
    pub fn remove(&mut self, id: u64) -> Option<Flow> {
        let flow = self.flows.remove(&id)?;
        if let Some(k) = flow.key()
            && self.keys.get(&k) == Some(&id)
        {
            self.keys.remove(&k);
        }
        Some(flow)
    }

    pub fn values(&self) -> impl Iterator<Item = &Flow> {
        self.flows.values()
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Flow> {
        self.flows.values_mut()
    }

    /// The flow whose host socket is `fd` (tests deliver events by descriptor).
    pub fn by_fd(&self, fd: RawFd) -> Option<u64> {
        self.flows
            .iter()
            .find(|(_, f)| f.host().as_raw_fd() == fd)
            .map(|(id, _)| *id)
    }

    /// The pending flows not asked within [`PROBE_EVERY`] whether the sandbox's connect
    /// still waits, each as (remote, sandbox end) for its probe; they count as asked at
    /// `now`.
    pub fn probe_due(&mut self, now: Instant) -> Vec<(SocketAddr, SocketAddr)> {
        let mut due = Vec::new();
        for f in self.flows.values_mut() {
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
        self.flows.values().fold((0, 0), |(o, i), f| match f {
            Flow::Tcp(t) => (o + t.bytes_out, i + t.bytes_in),
            _ => (o, i),
        })
    }

    /// The flows over at `now`: TCP flows whose stack socket `done` says is over
    /// (every call), datagram flows idle past their time (when `sweep`).
    pub fn ended(
        &self,
        now: Instant,
        sweep: bool,
        done: impl Fn(SocketHandle) -> bool,
    ) -> Vec<u64> {
        let idle = |d: &Dgram, after| sweep && now.duration_since(d.last) >= after;
        self.flows
            .iter()
            .filter(|(_, f)| match f {
                Flow::Tcp(t) => done(t.handle),
                Flow::Udp(d) => idle(d, UDP_IDLE),
                Flow::Echo(d) => idle(d, ECHO_IDLE),
                Flow::Pending(_) => false,
            })
            .map(|(id, _)| *id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgram(remote: &str, last: Instant) -> Dgram {
        Dgram {
            host: ferry_sys::eventfd().unwrap(),
            sandbox: "10.0.2.100:4000".parse().unwrap(),
            remote: remote.parse().unwrap(),
            last,
            _lease: None,
        }
    }

    #[test]
    fn keys_follow_their_flows() {
        let now = Instant::now();
        let mut t = FlowTable::new(100);
        let a = t.new_id();
        assert!(a > 100);
        t.insert(a, Flow::Udp(dgram("192.0.2.1:53", now)));
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
        // A key that carries a newer flow stays when an older flow with it goes.
        let b = t.new_id();
        t.insert(b, Flow::Udp(dgram("192.0.2.1:53", now)));
        assert_eq!(t.find(&key), Some(b));
        assert!(t.remove(a).is_some());
        assert_eq!(t.find(&key), Some(b));
        assert!(t.remove(b).is_some());
        assert_eq!(t.find(&key), None);
        assert!(t.remove(b).is_none());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn idle_datagram_flows_end_on_a_sweep_only_and_by_their_kind() {
        let start = Instant::now();
        let mut t = FlowTable::new(0);
        let (u, e) = (t.new_id(), t.new_id());
        t.insert(u, Flow::Udp(dgram("192.0.2.1:53", start)));
        t.insert(e, Flow::Echo(dgram("192.0.2.1:0", start)));
        let never = |_| false;
        assert!(t.ended(start + ECHO_IDLE, false, never).is_empty());
        assert!(t.ended(start + ECHO_IDLE / 2, true, never).is_empty());
        assert_eq!(t.ended(start + ECHO_IDLE, true, never), vec![e]);
        let mut both = t.ended(start + UDP_IDLE, true, never);
        both.sort_unstable();
        assert_eq!(both, vec![u, e]);
        assert!(!t.tcp_open());
    }
}
