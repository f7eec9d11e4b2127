//! Published TCP ports (`-p`): the host listeners (the first server's, made by
//! [`ferry_egress::host_listener`]), the connections they accept waiting for a listener
//! of the sandbox, refused when none comes in time or when too many wait, and which
//! listener of the sandbox a port feeds. With a TAP beside the shim (`--net both`), a
//! connection to a port no listener of the shim's is on goes to nic mode instead
//! ([`ferry_egress::TapHandoff`]): a server the shim cannot serve (static, Go) is
//! published too. Must not: serve the connection (it becomes an accepted socket of the
//! sandbox, `connect.rs`, or a NIC server's flow).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use ferry_sys::Epoll;
use tracing::{debug, warn};

use crate::group::{Msg, lock};
use crate::server::{MAX_WAITING, Server, T_PUBLISH, UNSERVED_GRACE, index_u32, token};
use crate::{Config, Error};

impl Server {
    pub(crate) fn publish_ports(cfg: &Config, epoll: &Epoll) -> Result<Vec<(OwnedFd, u16)>, Error> {
        let mut published = Vec::new();
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
            published.push((fd, p.sandbox_port));
        }
        Ok(published)
    }

    pub(crate) fn publish_event(&mut self, i: usize) {
        loop {
            let (fd, port) = &self.published[i];
            match ferry_sys::accept4(fd.as_fd(), libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) {
                Ok((conn, peer)) => {
                    debug!("published port {port}: connection from {peer:?}");
                    let port = *port;
                    let Some(conn) = self.hand_to_tap(conn, port) else {
                        continue;
                    };
                    if !self.shared.has_listener(port) {
                        // Nothing in the sandbox listens there through ferry (yet): the
                        // connection waits at most `UNSERVED_GRACE` for a listener.
                        self.unserved = true;
                    }
                    let mut queue = lock(&self.shared.published);
                    match queue.iter_mut().find(|(p, _)| *p == port) {
                        Some(q) if q.1.len() >= MAX_WAITING => {
                            drop(queue);
                            let _ = ferry_sys::linger_reset(conn.as_fd());
                            self.stats.published_refused += 1;
                            if let Some(n) = self.refusals.tick() {
                                warn!(
                                    "published port {port}: {MAX_WAITING} connections already wait for the sandbox to accept them: one more refused ({n} since the last line)"
                                );
                            }
                            continue;
                        }
                        Some(q) => q.1.push_back((conn, Instant::now())),
                        None => {}
                    }
                    drop(queue);
                    // The sandbox's listener may be served by any server.
                    for (k, inbox) in self.shared.inbox.iter().enumerate() {
                        if k != self.index {
                            inbox.send(Msg::Published(port));
                        }
                    }
                    if let Some(id) = self.listener_for(port) {
                        self.host_event(id, libc::EPOLLIN as u32);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    self.published_datagrams(i);
                    return;
                }
                Err(e) => {
                    // Out of descriptors, say: the connection stays queued. The
                    // listener is level-triggered, so the next turn tries again; the
                    // log says so once a second at most.
                    if let Some(n) = self.refusals.tick() {
                        warn!("published port {port}: accept: {e} ({n} since the last line)");
                    }
                    return;
                }
            }
        }
    }

    /// Hands `conn` to nic mode's TAP when no listener of the shim's is on `port` and no
    /// module is bound to it (modules sit on the shim's path); gives it back otherwise.
    fn hand_to_tap(&self, conn: OwnedFd, port: u16) -> Option<OwnedFd> {
        let Some(tap) = self.cfg.tap.as_ref() else {
            return Some(conn);
        };
        let moduled = self
            .cfg
            .modules
            .rules
            .iter()
            .any(|r| matches!(r.target, crate::ModuleTarget::Port(p) if p == port));
        if moduled || self.shared.has_listener(port) {
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

    /// The last listener on published `port` went: the connections waiting for it are
    /// reset (the kernel does the same to a closed listener's queue).
    pub(crate) fn refuse_waiting(&mut self, port: u16) {
        let waiting: Vec<(OwnedFd, Instant)> = lock(&self.shared.published)
            .iter_mut()
            .filter(|(p, _)| *p == port)
            .flat_map(|(_, q)| q.drain(..))
            .collect();
        for (conn, _) in waiting {
            let _ = ferry_sys::linger_reset(conn.as_fd());
            self.stats.published_refused += 1;
        }
    }

    /// Resets connections that waited [`UNSERVED_GRACE`] on a published port where
    /// nothing in the sandbox listens through ferry (a program ferry cannot serve may
    /// listen there: the client gets a refusal instead of a connection that hangs).
    pub(crate) fn expire_unserved(&mut self) {
        let now = Instant::now();
        let mut refused = Vec::new();
        let mut still = false;
        for (port, q) in lock(&self.shared.published).iter_mut() {
            if q.is_empty() || self.shared.has_listener(*port) {
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
            self.stats.published_refused += 1;
            if let Some(n) = self.refusals.tick() {
                warn!(
                    "published port {port}: nothing in the sandbox listens on port {port} through ferry (a program the shim cannot serve, static or Go, is reachable with --net nic or both): connection from {} refused ({n} since the last line)",
                    peer.map_or_else(|| "?".into(), |p| p.to_string())
                );
            }
        }
    }

    /// The host socket of published port `i`.
    pub(crate) fn published_fd(&self, i: usize) -> std::os::fd::BorrowedFd<'_> {
        self.published[i].0.as_fd()
    }

    /// The sandbox port published port `i` feeds.
    pub(crate) fn published_port(&self, i: usize) -> u16 {
        self.published[i].1
    }

    /// The sandbox listener a published port feeds.
    pub(crate) fn listener_for(&self, port: u16) -> Option<u32> {
        let io = self.io;
        self.socks
            .values()
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
    pub(crate) fn take_published(&mut self, listener: u32) -> Option<(OwnedFd, u16)> {
        let io = self.io;
        let port = io
            .sock_addr(self.socks.get(&listener)?.fd.as_fd(), false)
            .ok()
            .flatten()?
            .port();
        let conn = lock(&self.shared.published)
            .iter_mut()
            .find(|(p, q)| *p == port && !q.is_empty())?
            .1
            .pop_front()
            .map(|(fd, _)| fd)?;
        Some((conn, port))
    }

    pub(crate) fn has_published(&self, listener: u32) -> bool {
        let io = self.io;
        // Asked on every token check: no getsockname when nothing is published.
        if !self.shared.any_published {
            return false;
        }
        let Some(s) = self.socks.get(&listener) else {
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
        lock(&self.shared.published)
            .iter()
            .any(|(p, q)| *p == port && !q.is_empty())
    }
}
