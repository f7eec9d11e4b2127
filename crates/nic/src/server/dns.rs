//! A guest's resolver (`ferry vm --dns`): a VM guest has no sandbox `lo` for the
//! protocol server's forwarder to listen on, so its NIC servers answer UDP to the
//! gateway's port 53 themselves. A query datagram is handed to the forwarder's pure core
//! ([`Forwarder`], `ferry-egress`'s `dns.rs`: the id rewritten, at most
//! [`MAX_PENDING`](ferry_egress::dns::MAX_PENDING) in flight, only queries up and only
//! answers under an id in flight back) and relayed from the host's namespace to every
//! upstream nameserver on a connected UDP socket of its own; an answer goes back to the
//! guest as a datagram from the gateway. DNS over TCP to the gateway's port 53 is a TCP
//! flow like any other whose host connection goes to the first upstream (`pending.rs`;
//! the flow cap applies). The same bounds as socket mode's forwarder,
//! whatever the guest sends: the core's table, one datagram per frame (the device's
//! batch bounds a turn), at most a batch of answers read per event.
//!
//! Owns: the upstream sockets and the [`Wire`] over them and the port. Must not: relay
//! anything but DNS to the gateway's port 53, or keep state beyond the core's.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::Instant;

use ferry_egress::dns::{Forwarder, MAX_MSG, Wire};

use super::stack::Port;
use super::{NicServer, connect_host};
use crate::frame::{self, Link};
use crate::hostio::HostIo;
use crate::{NicStats, Plan};

/// The port the guest's resolver asks the gateway on.
pub(crate) const DNS_PORT: u16 = 53;

/// A NIC server's forwarder for its guest.
#[derive(Debug)]
pub(crate) struct GuestDns {
    forwarder: Forwarder,
    /// One connected UDP socket per upstream nameserver (the kernel drops datagrams
    /// from anyone else), beside its address.
    upstream: Vec<(OwnedFd, SocketAddr)>,
}

impl GuestDns {
    /// The forwarder for `upstream` (none: `None`), its sockets made through `io`;
    /// `seed` starts its sequence of ids.
    pub fn new(io: &dyn HostIo, upstream: &[SocketAddr], seed: u16) -> io::Result<Option<Self>> {
        if upstream.is_empty() {
            return Ok(None);
        }
        let upstream = upstream
            .iter()
            .map(|up| {
                connect_host(io, None, (libc::SOCK_DGRAM, 0), *up).map(|(fd, _, _)| (fd, *up))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Some(GuestDns {
            forwarder: Forwarder::new(upstream.iter().map(|(_, a)| *a).collect(), seed),
            upstream,
        }))
    }

    /// The upstream sockets, for the server's epoll.
    pub fn sockets(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> {
        self.upstream.iter().map(|(fd, _)| fd.as_fd())
    }

    /// The upstream DNS over TCP goes to (the first).
    pub fn tcp_upstream(&self) -> Option<SocketAddr> {
        self.upstream.first().map(|(_, a)| *a)
    }

    /// Whether `fd` is one of the upstream sockets.
    pub fn has(&self, fd: RawFd) -> bool {
        self.upstream.iter().any(|(s, _)| s.as_raw_fd() == fd)
    }

    /// Adds the core's counters to `stats`.
    pub fn count_into(&self, stats: &mut NicStats) {
        let c = self.forwarder.counts();
        stats.dns_queries = c.queries;
        stats.dns_answers = c.answers;
        stats.dns_dropped = c.dropped;
        stats.dns_evicted = c.evicted;
        stats.dns_stray = c.stray;
    }
}

/// The core's datagram calls for a guest: "inside" is the guest's link (one datagram
/// from the frame at hand; answers framed from the gateway), "upstream" the sockets.
struct GuestWire<'a> {
    query: Option<(&'a [u8], SocketAddr)>,
    upstream: &'a [(OwnedFd, SocketAddr)],
    io: &'a dyn HostIo,
    port: &'a mut Port,
    link: Link,
    plan: &'a Plan,
}

impl Wire for GuestWire<'_> {
    fn recv_inside(&mut self, _: usize, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        let (msg, from) = self.query.take()?;
        let n = msg.len().min(buf.len());
        buf[..n].copy_from_slice(&msg[..n]);
        Some((n, from))
    }

    fn send_inside(&mut self, _: usize, msg: &[u8], to: &SocketAddr) -> bool {
        let gw = SocketAddr::new(self.plan.gateway_for(to.ip()), DNS_PORT);
        let link = self.link;
        self.port.queue(|out| frame::udp(out, link, gw, *to, msg))
    }

    fn recv_upstream(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        self.upstream
            .iter()
            .find_map(|(fd, up)| self.io.recv(fd.as_fd(), buf).ok().map(|n| (n, *up)))
    }

    fn send_upstream(&mut self, msg: &[u8], to: &SocketAddr) -> bool {
        self.upstream
            .iter()
            .find(|(_, up)| up == to)
            .is_some_and(|(fd, _)| self.io.send(fd.as_fd(), msg).is_ok())
    }
}

impl NicServer {
    /// Whether `dst` is the guest's resolver (the gateway's port 53, `--dns` on).
    pub(super) fn is_resolver(&self, dst: SocketAddr) -> bool {
        self.dns.is_some()
            && dst.port() == DNS_PORT
            && dst.ip() == self.cfg.plan.gateway_for(dst.ip())
    }

    /// Where a TCP connection to `dst` goes instead, when `dst` is the guest's resolver
    /// (DNS over TCP, relayed byte for byte as any TCP flow: to the first upstream).
    pub(super) fn tcp_resolver(&self, dst: SocketAddr) -> Option<SocketAddr> {
        if !self.is_resolver(dst) {
            return None;
        }
        self.dns.as_ref()?.tcp_upstream()
    }

    /// A datagram from the guest's `src` to its resolver: relayed upstream if a query.
    pub(super) fn dns_query(&mut self, src: SocketAddr, payload: &[u8], now: Instant) {
        let Some(dns) = self.dns.as_mut() else {
            return;
        };
        let mut wire = GuestWire {
            query: Some((&payload[..payload.len().min(MAX_MSG)], src)),
            upstream: &dns.upstream,
            io: &*self.io,
            port: &mut self.port,
            link: self.link,
            plan: &self.cfg.plan,
        };
        dns.forwarder.from_sandbox(&mut wire, 0, now);
    }

    /// Answers arrived on the upstream sockets: each to the guest's client that asked
    /// (a batch; the sockets stay readable for the rest).
    pub(super) fn dns_answers(&mut self) {
        let Some(dns) = self.dns.as_mut() else {
            return;
        };
        let mut wire = GuestWire {
            query: None,
            upstream: &dns.upstream,
            io: &*self.io,
            port: &mut self.port,
            link: self.link,
            plan: &self.cfg.plan,
        };
        dns.forwarder.from_upstream(&mut wire);
    }
}
