//! Published TCP connections a NIC server carries: from its own listeners (nic mode)
//! or passed on by the protocol server's [`TapHandoff`] (`--net both`, a port no
//! listener of the shim's is on). Each becomes a stack connection to the sandbox's
//! address on the port; one the sandbox resets before answering (nothing listens yet)
//! is asked again every [`RETRY_EVERY`] until [`PUBLISH_GRACE`] has passed since it
//! came, as socket mode waits for a listener of the shim's, then reset with a log line.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_egress::TapHandoff;
use smoltcp::wire::{IpAddress, IpListenEndpoint};
use tracing::warn;

use super::{NicServer, TOKEN_HANDOFF, TcpFlow, unmap};

/// How long a published connection the sandbox resets is asked again for.
const PUBLISH_GRACE: Duration = Duration::from_secs(2);
/// How often it is asked again meanwhile.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// A published connection not answered by the sandbox yet.
#[derive(Clone, Copy)]
pub(super) struct Unanswered {
    pub(super) client: SocketAddr,
    /// The sandbox's port.
    pub(super) port: u16,
    /// When it came.
    pub(super) since: Instant,
}

impl NicServer {
    /// A connection to published listener `i` (nic mode).
    pub(super) fn accept_published(&mut self, i: usize) {
        let Some((l, p)) = self.listeners.get(i) else {
            return;
        };
        let port = p.sandbox_port;
        if let Ok((host, Some(client))) =
            ferry_sys::accept4(l.as_fd(), libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
        {
            self.publish_conn(host, unmap(client), port, Instant::now());
        }
    }

    /// Makes this server serve the connections `handoff` passes on (socket mode's
    /// published ports that no listener of the shim's is on, `--net both`).
    pub fn serve_handoff(&mut self, handoff: Arc<TapHandoff>) -> io::Result<()> {
        self.epoll
            .add(handoff.fd(), libc::EPOLLIN as u32, TOKEN_HANDOFF)?;
        handoff.set_open(true);
        self.handoff = Some(handoff);
        Ok(())
    }

    /// Takes the connections the handoff has for us.
    pub(super) fn take_handoff(&mut self) {
        let Some(h) = self.handoff.clone() else {
            return;
        };
        for (host, port) in h.take() {
            match ferry_sys::sock_addr(host.as_fd(), true) {
                Ok(Some(client)) => self.publish_conn(host, unmap(client), port, Instant::now()),
                _ => {
                    let _ = ferry_sys::linger_reset(host.as_fd());
                }
            }
        }
    }

    /// A connection from `client` to a published port (`host`, on the host): a stack
    /// connection to the sandbox's address on `port`, from the client's address (the
    /// gateway's for a client on the host's loopback, which the sandbox could not
    /// answer). `since`: when it came (a sandbox that resets it is asked again until
    /// [`PUBLISH_GRACE`] has passed).
    fn publish_conn(&mut self, host: OwnedFd, client: SocketAddr, port: u16, since: Instant) {
        if self.flows() >= self.cfg.max_flows {
            self.stats.over_cap += 1;
            let _ = ferry_sys::linger_reset(host.as_fd());
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
        let mut s = self.stack_socket();
        let cx = self.iface.context();
        let local = IpListenEndpoint {
            addr: Some(from_ip.into()),
            port: client.port(),
        };
        if s.connect(cx, (IpAddress::from(to.ip()), to.port()), local)
            .is_err()
        {
            return;
        }
        let _ = ferry_sys::setsockopt(
            host.as_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &1i32.to_ne_bytes(),
        );
        let handle = self.sockets.add(s);
        let id = self.new_id();
        if self.watch(host.as_fd(), id).is_err() {
            self.sockets.remove(handle);
            return;
        }
        self.stats.published_flows += 1;
        self.tcp.insert(
            id,
            TcpFlow {
                handle,
                host,
                key: None,
                fresh: Some(Unanswered {
                    client,
                    port,
                    since,
                }),
                readable: true,
                writable: true,
                host_eof: false,
                shut_wr: false,
                lease: None,
                bytes_out: 0,
                bytes_in: 0,
            },
        );
    }

    /// A published connection the sandbox reset before its handshake (nothing listens
    /// there, yet): asked again [`RETRY_EVERY`] until [`PUBLISH_GRACE`] has passed
    /// since it came, then reset. Whether it waits (the host socket is kept).
    pub(super) fn unanswered(&mut self, host: OwnedFd, u: Unanswered) -> Option<OwnedFd> {
        if u.since.elapsed() < PUBLISH_GRACE {
            self.retry.push((Instant::now() + RETRY_EVERY, host, u));
            return None;
        }
        if let Some(n) = self.refusals.tick() {
            warn!(
                "{}: published port {}: nothing in the sandbox listens on port {} (neither a listener of the shim's nor one on {}): connection from {} reset ({n} since the last line)",
                self.id, u.port, u.port, self.cfg.plan.ifname, u.client
            );
        }
        Some(host)
    }

    /// Asks the sandbox again for the published connections whose time has come.
    pub(super) fn retry_published(&mut self) {
        if self.retry.is_empty() {
            return;
        }
        let now = Instant::now();
        let (due, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retry)
            .into_iter()
            .partition(|(at, _, _)| *at <= now);
        self.retry = wait;
        for (_, host, u) in due {
            self.publish_conn(host, u.client, u.port, u.since);
        }
    }

    /// How long until the next published connection is asked again.
    pub(super) fn retry_delay(&self) -> Option<Duration> {
        let now = Instant::now();
        self.retry
            .iter()
            .map(|(at, _, _)| at.saturating_duration_since(now))
            .min()
    }
}
