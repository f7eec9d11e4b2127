//! Published TCP ports (`-p`): the host listeners (the first server's, made by
//! [`ferry_egress::host_listener`]), the connections they accept waiting for a listener
//! of the sandbox, refused when none comes in time or when too many wait, and which
//! listener of the sandbox a port feeds. With a TAP beside the shim (`--net both`), a
//! connection to a port no listener of the shim's is on goes to nic mode instead
//! ([`ferry_egress::TapHandoff`]): a server the shim cannot serve (static, Go) is
//! published too. Ports published while the sandbox runs (`--publish-auto` in socket
//! mode) come and go through [`Inbound`], at most [`Config::auto_publish`]; every
//! connection to any published port is admitted by [`Shared::admit`] alone. Must not:
//! serve the connection (it becomes an accepted socket of the
//! sandbox, `connect.rs`, or a NIC server's flow).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use ferry_sys::Epoll;
use tracing::{debug, warn};

use crate::group::{Msg, Shared, lock};
use crate::seam::Io;
use crate::server::Server;
use crate::stats::ServerStats;
use crate::table::SockTable;
use crate::token::{T_PUBLISH, index_u32, token};
use crate::udp_publish::Flows;
use crate::{Config, Error, LogThrottle};

/// Most connections of one published port that wait for the sandbox to accept them;
/// more are refused.
pub(crate) const MAX_WAITING: usize = 8192;
/// How long a connection to a published port waits for a listener in the sandbox when
/// there is none (the program may still be starting) before it is refused.
pub(crate) const UNSERVED_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A server's published ports: the host listeners (the first server's only) and the
/// sandbox port each feeds, whether connections wait with no listener in the sandbox,
/// the flows of the UDP ones (`udp_publish.rs`), and their counters.
#[derive(Debug, Default)]
pub(crate) struct PublishedPorts {
    listeners: Vec<(OwnedFd, u16)>,
    /// Connections wait with no listener in the sandbox ([`PublishedPorts::expire_unserved`]).
    unserved: bool,
    /// Flows of the published UDP ports.
    pub(crate) flows: Flows,
    /// Log lines about refused connections and dropped datagrams, at most one a second.
    pub(crate) refusals: LogThrottle,
    /// Connections refused (too many waiting, no listener in time, the listener went).
    refused: u64,
}

/// What one accept on a published port's host listener came to.
pub(crate) enum Arrival {
    /// A connection now waits for the sandbox's listener on this port.
    Waiting(u16),
    /// None for the shim (refused, or handed to the TAP): try the next.
    Gone,
    /// None left for now.
    Empty,
    /// The port is a UDP one: its datagrams are read instead.
    Datagrams,
}

impl PublishedPorts {
    /// Binds the host listeners of `cfg`'s published ports and adds them to `epoll`.
    pub(crate) fn bind(cfg: &Config, epoll: &Epoll) -> Result<PublishedPorts, Error> {
        let mut listeners = Vec::new();
        for (i, p) in cfg.publish.iter().enumerate() {
            let (fd, _) =
                ferry_egress::host_listener(p.host, p.udp).map_err(|source| Error::Publish {
                    addr: p.host,
                    source,
                })?;
            epoll
                .add(
                    fd.as_fd(),
                    libc::EPOLLIN as u32,
                    token(T_PUBLISH, index_u32(i)),
                )
                .map_err(Error::EventLoop)?;
            listeners.push((fd, p.sandbox_port));
        }
        Ok(PublishedPorts {
            listeners,
            ..PublishedPorts::default()
        })
    }

    /// Takes one connection from published port `i`'s host listener: it waits in
    /// `shared`'s queue for the sandbox's listener (the servers other than `me` hear of
    /// it), goes to the TAP, or is refused when too many wait.
    pub(crate) fn accept(&mut self, i: usize, cfg: &Config, shared: &Shared, me: usize) -> Arrival {
        let (fd, port) = &self.listeners[i];
        let port = *port;
        let conn = match ferry_sys::accept4(fd.as_fd(), libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) {
            Ok((conn, peer)) => {
                debug!("published port {port}: connection from {peer:?}");
                conn
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Arrival::Empty,
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Arrival::Datagrams,
            Err(e) => {
                // Out of descriptors, say: the connection stays queued. The listener is
                // level-triggered, so the next turn tries again; the log says so once a
                // second at most.
                if let Some(n) = self.refusals.tick() {
                    warn!("published port {port}: accept: {e} ({n} since the last line)");
                }
                return Arrival::Empty;
            }
        };
        let Some(conn) = hand_to_tap(cfg, shared, conn, port) else {
            return Arrival::Gone;
        };
        if !shared.has_listener(port) {
            // Nothing in the sandbox listens there through ferry (yet): the connection
            // waits at most `UNSERVED_GRACE` for a listener.
            self.unserved = true;
        }
        match shared.admit(port, conn, Some(me)) {
            Ok(()) => {}
            Err(Refused::Full(conn)) => {
                let _ = ferry_sys::linger_reset(conn.as_fd());
                self.refused += 1;
                if let Some(n) = self.refusals.tick() {
                    warn!(
                        "published port {port}: {MAX_WAITING} connections already wait for the sandbox to accept them: one more refused ({n} since the last line)"
                    );
                }
                return Arrival::Gone;
            }
            // A UDP port's listener accepts nothing; a TCP one's queue is always there.
            Err(Refused::NotPublished(_)) => return Arrival::Gone,
        }
        Arrival::Waiting(port)
    }

    /// The last listener on published `port` went: the connections waiting for it are
    /// reset (the kernel does the same to a closed listener's queue).
    pub(crate) fn refuse_waiting(&mut self, shared: &Shared, port: u16) {
        let waiting: Vec<(OwnedFd, Instant)> = lock(&shared.published)
            .iter_mut()
            .filter(|(p, _)| *p == port)
            .flat_map(|(_, q)| q.drain(..))
            .collect();
        for (conn, _) in waiting {
            let _ = ferry_sys::linger_reset(conn.as_fd());
            self.refused += 1;
        }
    }

    /// Connections wait on a published port with no listener in the sandbox.
    pub(crate) fn unserved(&self) -> bool {
        self.unserved
    }

    /// Resets connections that waited [`UNSERVED_GRACE`] on a published port where
    /// nothing in the sandbox listens through ferry (a program ferry cannot serve may
    /// listen there: the client gets a refusal instead of a connection that hangs).
    pub(crate) fn expire_unserved(&mut self, shared: &Shared) {
        let now = Instant::now();
        let mut refused = Vec::new();
        let mut still = false;
        for (port, q) in lock(&shared.published).iter_mut() {
            if q.is_empty() || shared.has_listener(*port) {
                continue;
            }
            while let Some((_, at)) = q.front() {
                if now.duration_since(*at) < UNSERVED_GRACE {
                    still = true;
                    break;
                }
                let (conn, _) = q.pop_front().expect("front exists");
                refused.push((*port, conn));
            }
        }
        self.unserved = still;
        for (port, conn) in refused {
            let peer = ferry_sys::sock_addr(conn.as_fd(), true).ok().flatten();
            let _ = ferry_sys::linger_reset(conn.as_fd());
            self.refused += 1;
            if let Some(n) = self.refusals.tick() {
                warn!(
                    "published port {port}: nothing in the sandbox listens on port {port} through ferry (a program the shim cannot serve, static or Go, is reachable with --net nic or both): connection from {} refused ({n} since the last line)",
                    peer.map_or_else(|| "?".into(), |p| p.to_string())
                );
            }
        }
    }

    /// The host socket of published port `i`.
    pub(crate) fn fd(&self, i: usize) -> BorrowedFd<'_> {
        self.listeners[i].0.as_fd()
    }

    /// The sandbox port published port `i` feeds.
    pub(crate) fn port(&self, i: usize) -> u16 {
        self.listeners[i].1
    }

    /// Adds this part's counters to `stats`.
    pub(crate) fn count_into(&self, stats: &mut ServerStats) {
        stats.published_refused += self.refused;
        stats.udp_published_in = self.flows.inbound;
        stats.udp_published_out = self.flows.outbound;
        stats.udp_published_dropped = self.flows.dropped;
    }
}

/// Why [`Shared::admit`] gave a connection back.
#[derive(Debug)]
pub enum Refused {
    /// [`MAX_WAITING`] connections already wait on the port.
    Full(OwnedFd),
    /// The port is not published (any more).
    NotPublished(OwnedFd),
}

impl Refused {
    /// The connection given back.
    pub fn into_conn(self) -> OwnedFd {
        match self {
            Refused::Full(c) | Refused::NotPublished(c) => c,
        }
    }
}

impl Shared {
    /// The one way in for a connection to a published port, `-p`'s and those
    /// [`Inbound`] publishes alike: `conn` waits on sandbox port `port`'s queue for the
    /// sandbox's listener, and the servers other than `me` hear of it; given back when
    /// `port` is not published or too many wait.
    pub(crate) fn admit(&self, port: u16, conn: OwnedFd, me: Option<usize>) -> Result<(), Refused> {
        let mut queue = lock(&self.published);
        match queue.iter_mut().find(|(p, _)| *p == port) {
            Some(q) if q.1.len() >= MAX_WAITING => return Err(Refused::Full(conn)),
            Some(q) => q.1.push_back((conn, Instant::now())),
            None => return Err(Refused::NotPublished(conn)),
        }
        drop(queue);
        // The sandbox's listener may be served by any server.
        for (k, inbox) in self.inbox.iter().enumerate() {
            if Some(k) != me {
                inbox.send(Msg::Published(port));
            }
        }
        Ok(())
    }
}

/// Publishes TCP ports while the sandbox runs (`--publish-auto` in socket mode: a port
/// a program listens on): the host listener is its owner's, each connection it accepts
/// comes in through [`Inbound::admit`] as a `-p` port's does. At most
/// [`Config::auto_publish`] ports: a hostile sandbox cannot make the servers hold more.
/// Must not: bind host sockets or decide which ports a sandbox may publish.
#[derive(Clone)]
pub struct Inbound {
    shared: std::sync::Arc<Shared>,
}

impl std::fmt::Debug for Inbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbound").finish_non_exhaustive()
    }
}

impl Inbound {
    pub(crate) fn new(shared: std::sync::Arc<Shared>) -> Inbound {
        Inbound { shared }
    }

    /// Publishes sandbox TCP port `port` (a `-p` port is already: nothing changes);
    /// false when [`Config::auto_publish`] ports are published already.
    pub fn open(&self, port: u16) -> bool {
        // Lock order: `published`, then `auto`.
        let mut queues = lock(&self.shared.published);
        let mut auto = lock(&self.shared.auto);
        if queues.iter().any(|(p, _)| *p == port) {
            return true;
        }
        if auto.len() >= self.shared.auto_max {
            return false;
        }
        auto.push(port);
        queues.push((port, std::collections::VecDeque::new()));
        true
    }

    /// Withdraws port `port` if [`Inbound::open`] published it (a `-p` port stays):
    /// the connections waiting on it are reset, as a closed listener's queue is.
    pub fn close(&self, port: u16) {
        let mut queues = lock(&self.shared.published);
        let mut auto = lock(&self.shared.auto);
        let Some(at) = auto.iter().position(|p| *p == port) else {
            return;
        };
        auto.swap_remove(at);
        drop(auto);
        let waiting = queues
            .iter()
            .position(|(p, _)| *p == port)
            .map(|i| queues.swap_remove(i).1);
        drop(queues);
        for (conn, _) in waiting.into_iter().flatten() {
            let _ = ferry_sys::linger_reset(conn.as_fd());
        }
    }

    /// The ports a program of the sandbox listens on through ferry on the wildcard
    /// address (not loopback: the sandbox's own, as with runc).
    pub fn listening(&self) -> Vec<u16> {
        self.shared.wildcard_listeners()
    }

    /// `conn`, accepted on published `port`'s host listener, waits for the sandbox's
    /// listener ([`Shared::admit`]).
    pub fn admit(&self, port: u16, conn: OwnedFd) -> Result<(), Refused> {
        self.shared.admit(port, conn, None)
    }
}

/// Hands `conn` to nic mode's TAP when no listener of the shim's is on `port` and no
/// module is bound to it (modules sit on the shim's path); gives it back otherwise.
fn hand_to_tap(cfg: &Config, shared: &Shared, conn: OwnedFd, port: u16) -> Option<OwnedFd> {
    let Some(tap) = cfg.tap.as_ref() else {
        return Some(conn);
    };
    let moduled = cfg
        .modules
        .rules
        .iter()
        .any(|r| matches!(r.target, crate::ModuleTarget::Port(p) if p == port));
    if moduled || shared.has_listener(port) {
        return Some(conn);
    }
    match tap.send(conn, port) {
        Ok(()) => {
            debug!("published port {port}: no listener of the shim's there: to the TAP");
            None
        }
        Err(conn) => Some(conn),
    }
}

/// A connection that waits on published `port` for the sandbox's listener, taken.
fn take_waiting(shared: &Shared, port: u16) -> Option<OwnedFd> {
    lock(&shared.published)
        .iter_mut()
        .find(|(p, q)| *p == port && !q.is_empty())?
        .1
        .pop_front()
        .map(|(fd, _)| fd)
}

impl Server {
    /// Published port `i`'s host listener is readable.
    pub(crate) fn publish_event(&mut self, i: usize) {
        loop {
            match self
                .published
                .accept(i, &self.cfg, &self.shared, self.index)
            {
                Arrival::Waiting(port) => {
                    if let Some(id) = self.socks.listener_for(self.io, port) {
                        self.host_event(id, libc::EPOLLIN as u32);
                    }
                }
                Arrival::Gone => {}
                Arrival::Empty => return,
                Arrival::Datagrams => {
                    self.published.datagrams(i, &self.epoll, &self.shared);
                    return;
                }
            }
        }
    }
}

/// Which sandbox listener a published port feeds, and the connections waiting for it.
impl SockTable {
    /// The sandbox listener a published port feeds.
    pub(crate) fn listener_for(&self, io: &dyn Io, port: u16) -> Option<u32> {
        self.values()
            .find(|s| {
                s.listening()
                    && io
                        .sock_addr(s.fd.as_fd(), false)
                        .ok()
                        .flatten()
                        .is_some_and(|a| a.port() == port)
            })
            .map(|s| s.id)
    }

    /// A connection accepted on a published port that waits for `listener`.
    pub(crate) fn take_published(
        &self,
        io: &dyn Io,
        shared: &Shared,
        listener: u32,
    ) -> Option<(OwnedFd, u16)> {
        let port = io
            .sock_addr(self.get(&listener)?.fd.as_fd(), false)
            .ok()
            .flatten()?
            .port();
        Some((take_waiting(shared, port)?, port))
    }

    /// Whether a connection accepted on a published port waits for `listener`.
    pub(crate) fn has_published(&self, io: &dyn Io, shared: &Shared, listener: u32) -> bool {
        // Asked on every token check: no getsockname when nothing is published.
        if !shared.any_published {
            return false;
        }
        let Some(s) = self.get(&listener) else {
            return false;
        };
        let Some(port) = io
            .sock_addr(s.fd.as_fd(), false)
            .ok()
            .flatten()
            .map(|a| a.port())
        else {
            return false;
        };
        lock(&shared.published)
            .iter()
            .any(|(p, q)| *p == port && !q.is_empty())
    }

    /// After a successful accept: whether the shim should take the listener's token
    /// back (1) because no connection is left to accept. A token left behind would make
    /// the next poll report a connection that is not there, and a blocking `accept`
    /// after it would hang. If a connection arrives meanwhile, `TokenDrained`'s re-check
    /// writes a fresh token.
    pub(crate) fn drain_if_empty(&self, io: &dyn Io, shared: &Shared, listener: u32) -> i32 {
        let published = self.has_published(io, shared, listener);
        match self.get(&listener) {
            Some(s)
                if s.token_out()
                    && !published
                    && io.poll_now(s.fd.as_fd(), libc::POLLIN).unwrap_or(0) == 0 =>
            {
                1
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn inbound(max: usize, publish: &[u16]) -> (Inbound, Arc<Shared>) {
        let mut cfg = Config::new("/nonexistent".into());
        cfg.servers = 2;
        cfg.auto_publish = max;
        cfg.publish = publish
            .iter()
            .map(|p| crate::Publish {
                host: std::net::SocketAddr::from(([127, 0, 0, 1], *p)),
                sandbox_port: *p,
                udp: false,
            })
            .collect();
        let shared = Arc::new(Shared::new(&cfg, Box::new(ferry_sys::socket)).unwrap());
        (Inbound::new(shared.clone()), shared)
    }

    fn conn() -> OwnedFd {
        ferry_sys::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0).unwrap()
    }

    #[test]
    fn only_open_ports_admit_and_at_most_the_configured_number() {
        let (inb, shared) = inbound(2, &[80]);
        assert!(shared.any_published);
        assert!(matches!(
            inb.admit(8080, conn()),
            Err(Refused::NotPublished(_))
        ));
        assert!(inb.open(8080));
        assert!(inb.open(8081));
        assert!(inb.open(8080), "open twice is one port");
        assert!(!inb.open(8082), "beyond the bound");
        // A `-p` port is published already and takes no room.
        assert!(inb.open(80));
        inb.admit(8080, conn()).unwrap();
        // Every server but none hears of it (the caller is no server).
        for i in &shared.inbox {
            assert!(matches!(i.take()[..], [Msg::Published(8080)]));
        }
        // Closing resets the waiting connection and frees the room; `-p` stays.
        inb.close(8080);
        inb.close(80);
        assert!(matches!(
            inb.admit(8080, conn()),
            Err(Refused::NotPublished(_))
        ));
        assert!(inb.admit(80, conn()).is_ok());
        assert!(inb.open(8082));
        assert!(!inb.open(8083));
    }

    #[test]
    fn wildcard_listeners_are_the_ones_listed() {
        let (inb, shared) = inbound(1, &[]);
        shared.listener_up(8080, true);
        shared.listener_up(8080, false);
        shared.listener_up(9000, false);
        assert_eq!(inb.listening(), [8080]);
        assert!(shared.has_listener(9000));
        assert_eq!(shared.listener_down(8080, true), 1);
        assert!(inb.listening().is_empty());
        assert_eq!(shared.listener_down(8080, false), 0);
        assert!(!shared.has_listener(8080));
    }
}
