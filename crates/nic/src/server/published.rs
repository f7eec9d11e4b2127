//! Published TCP connections a NIC server carries: from its own listeners (nic mode)
//! or passed on by the protocol server's [`TapHandoff`] (`--net both`, a port no
//! listener of the shim's is on). Each becomes a stack connection to the sandbox's
//! address on the port; one the sandbox resets before answering (nothing listens yet)
//! is asked again every [`RETRY_EVERY`] until [`PUBLISH_GRACE`] has passed since it
//! came, as socket mode waits for a listener of the shim's, then reset with a log line.
//!
//! Owns ([`Published`]): the listeners, the handoff, the connections waiting to be
//! asked again. The server makes each connection a flow ([`NicServer::publish_conn`]).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::os::fd::BorrowedFd;

use ferry_egress::{LogThrottle, TapHandoff};
use tracing::warn;

use super::flows::Flow;
use super::phase::Phase;
use super::tcp::TcpFlow;
use super::{NicServer, TOKEN_HANDOFF, TOKEN_LISTEN, watch};
use crate::NicPublish;
use crate::hostio::HostIo;

/// How long a published connection the sandbox resets is asked again for.
pub(crate) const PUBLISH_GRACE: Duration = Duration::from_secs(2);
/// How often it is asked again meanwhile.
pub(crate) const RETRY_EVERY: Duration = Duration::from_millis(100);

/// A published connection not answered by the sandbox yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unanswered {
    pub client: SocketAddr,
    /// The sandbox's port.
    pub port: u16,
    /// When it came.
    pub since: Instant,
}

/// Where published connections come from, and those waiting to be asked again.
#[derive(Debug)]
pub(crate) struct Published {
    listeners: Vec<(OwnedFd, NicPublish)>,
    /// Where socket mode passes published connections no listener of the shim's is on.
    handoff: Option<Arc<TapHandoff>>,
    /// Connections to ask the sandbox again for, and when.
    retry: Vec<(Instant, OwnedFd, Unanswered)>,
    /// The server's id and the sandbox interface's name, for the log.
    id: String,
    ifname: String,
    resets: LogThrottle,
}

/// A connection to a published port: its client and the sandbox's port.
pub(crate) type Call = (SocketAddr, u16);

impl Published {
    /// Listeners on the host for `publish` (through `io`), registered in `epoll`; `id`
    /// and `ifname` name the server and the sandbox's interface in the log.
    pub fn listen(
        io: &dyn HostIo,
        epoll: &ferry_sys::Epoll,
        publish: &[NicPublish],
        id: &str,
        ifname: &str,
    ) -> io::Result<Published> {
        let mut listeners = Vec::new();
        for (i, p) in publish.iter().enumerate() {
            let l = io.listener(&p.host).map_err(|e| {
                io::Error::new(e.kind(), format!("-p {}:{}: {e}", p.host, p.sandbox_port))
            })?;
            epoll.add(l.as_fd(), libc::EPOLLIN as u32, TOKEN_LISTEN + i as u64)?;
            listeners.push((l, *p));
        }
        Ok(Published {
            listeners,
            handoff: None,
            retry: Vec::new(),
            id: id.to_string(),
            ifname: ifname.to_string(),
            resets: LogThrottle::default(),
        })
    }

    /// A connection waiting on listener `i` (nic mode), if any.
    pub fn accept(&self, io: &dyn HostIo, i: usize) -> Option<(OwnedFd, Call)> {
        let (l, p) = self.listeners.get(i)?;
        match io.accept(l.as_fd()) {
            Ok((host, Some(client))) => Some((host, (unmap(client), p.sandbox_port))),
            _ => None,
        }
    }

    /// The connections the handoff has for us (one whose client is unknown is reset).
    pub fn take_handoff(&self, io: &dyn HostIo) -> Vec<(OwnedFd, Call)> {
        let Some(h) = &self.handoff else {
            return Vec::new();
        };
        let mut calls = Vec::new();
        for (host, port) in h.take() {
            match io.peer(host.as_fd()) {
                Ok(Some(client)) => calls.push((host, (unmap(client), port))),
                _ => {
                    let _ = io.linger_reset(host.as_fd());
                }
            }
        }
        calls
    }

    /// A published connection the sandbox reset before its handshake (nothing listens
    /// there, yet): asked again [`RETRY_EVERY`] until [`PUBLISH_GRACE`] has passed
    /// since it came, then reset with a log line.
    pub fn unanswered(&mut self, io: &dyn HostIo, host: OwnedFd, u: Unanswered, now: Instant) {
        if now.duration_since(u.since) < PUBLISH_GRACE {
            self.retry.push((now + RETRY_EVERY, host, u));
            return;
        }
        if let Some(n) = self.resets.tick() {
            warn!(
                "{}: published port {}: nothing in the sandbox listens on port {} (neither a listener of the shim's nor one on {}): connection from {} reset ({n} since the last line)",
                self.id, u.port, u.port, self.ifname, u.client
            );
        }
        let _ = io.linger_reset(host.as_fd());
    }

    /// Takes the connections whose time to be asked again has come.
    pub fn due(&mut self, now: Instant) -> Vec<(OwnedFd, Unanswered)> {
        if self.retry.is_empty() {
            return Vec::new();
        }
        let (due, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retry)
            .into_iter()
            .partition(|(at, _, _)| *at <= now);
        self.retry = wait;
        due.into_iter().map(|(_, h, u)| (h, u)).collect()
    }

    /// Connections waiting to be asked again (each holds a host socket: a flow).
    pub fn waiting(&self) -> usize {
        self.retry.len()
    }

    /// How long until the next one is asked again.
    pub fn delay(&self, now: Instant) -> Option<Duration> {
        self.retry
            .iter()
            .map(|(at, _, _)| at.saturating_duration_since(now))
            .min()
    }

    /// Listener `i`'s descriptor (for tests).
    pub fn listener(&self, i: usize) -> Option<BorrowedFd<'_>> {
        self.listeners.get(i).map(|(l, _)| l.as_fd())
    }

    /// Closes the handoff (its waiting connections are reset).
    pub fn close(&self) {
        if let Some(h) = &self.handoff {
            h.set_open(false);
        }
    }
}

/// A v4-mapped IPv6 address as IPv4.
pub(crate) fn unmap(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        a => a,
    }
}

impl NicServer {
    /// Makes this server serve the connections `handoff` passes on (socket mode's
    /// published ports that no listener of the shim's is on, `--net both`).
    pub fn serve_handoff(&mut self, handoff: Arc<TapHandoff>) -> io::Result<()> {
        self.epoll
            .add(handoff.fd(), libc::EPOLLIN as u32, TOKEN_HANDOFF)?;
        handoff.set_open(true);
        self.published.handoff = Some(handoff);
        Ok(())
    }

    /// A connection from `client` to published port `port` (`host`, on the host): a
    /// stack connection to the sandbox's address on `port`, from the client's address
    /// (the gateway's for a client on the host's loopback, which the sandbox could not
    /// answer). `since`: when it came (a sandbox that resets it is asked again until
    /// [`PUBLISH_GRACE`] has passed).
    pub(super) fn publish_conn(&mut self, host: OwnedFd, (client, port): Call, since: Instant) {
        if !self.gate.room(self.held(), &mut self.stats) {
            let _ = self.io.linger_reset(host.as_fd());
            return;
        }
        let plan = &self.cfg.plan;
        let from_ip = if ferry_egress::reach::is_local(client.ip()) || plan.is_sandbox(client.ip())
        {
            plan.gateway_for(client.ip())
        } else {
            client.ip()
        };
        let to = SocketAddr::new(plan.sandbox_for(client.ip()), port);
        let from = SocketAddr::new(from_ip, client.port());
        let Some(handle) = self.stack.connect(from, to) else {
            return;
        };
        let _ = self.io.no_delay(host.as_fd());
        let id = self.flows.new_id();
        if watch(&self.epoll, host.as_fd(), id).is_err() {
            self.stack.remove(handle);
            return;
        }
        let phase = Phase::Calling(Unanswered {
            client,
            port,
            since,
        });
        let f = TcpFlow::new(handle, host, None, phase);
        self.add_flow(id, Flow::Tcp(f));
        self.stats.published_flows += 1;
    }
}
