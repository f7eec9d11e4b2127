//! `--publish-auto`'s UDP ports: every UDP port a program in the sandbox receives on
//! (a bound, unconnected socket on the wildcard or the TAP's address) gets a host socket
//! on the same port where ferry runs, and its datagrams reach the program through one
//! *flow* per client, as `-p PORT/udp` does in the protocol server (`udp_publish.rs`
//! there): a UDP socket made in the sandbox's namespace, bound to its loopback and
//! connected to the port (on loopback for a wildcard listener, else on the address it is
//! bound to). The program sees each client as a loopback source; its answers reach the
//! flow, which sends them to the client from the published port.
//!
//! Owns ([`UdpPorts`]): the host sockets, the flows (in [`ferry_egress::FlowTable`]: at
//! most [`MAX_FLOWS`] a port, the one idle longest making room, closed after
//! [`FLOW_IDLE`]). Must not: send anything a flow receives anywhere but to its client,
//! or publish a loopback receiver. The caller's thread polls; the tokens are
//! [`port_token`] and [`flow_token`].

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use ferry_egress::{FlowTable, Limits};
use ferry_sandbox::SocketFactory;
use tracing::{debug, warn};

/// Most flows per published UDP port.
pub(crate) const MAX_FLOWS: usize = 256;
/// A flow that carries nothing either way for this long is closed.
pub(crate) const FLOW_IDLE: Duration = Duration::from_secs(60);
/// Most datagrams taken from one socket per wake-up.
const BATCH: usize = 64;
/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;

/// A UDP port's host socket's epoll token (TCP ports' are the port itself).
const UDP: u64 = 1 << 16;
/// A flow's epoll token: this bit and the flow's id.
const FLOW: u64 = 1 << 33;

pub(crate) fn port_token(port: u16) -> u64 {
    UDP | u64::from(port)
}

pub(crate) fn flow_token(id: u64) -> u64 {
    FLOW | id
}

/// What an epoll token of [`UdpPorts`] names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Token {
    Port(u16),
    Flow(u64),
}

impl Token {
    pub(crate) fn of(token: u64) -> Option<Token> {
        if token & FLOW != 0 {
            Some(Token::Flow(token & !FLOW))
        } else if token & !0xffff == UDP {
            u16::try_from(token & 0xffff).ok().map(Token::Port)
        } else {
            None
        }
    }
}

/// Where a flow for a receiver bound to `bound` (port `port`) connects: loopback of
/// its family for the wildcard, else the address itself.
pub(crate) fn target(bound: IpAddr, port: u16) -> SocketAddr {
    let ip = match bound {
        IpAddr::V4(a) if a.is_unspecified() => Ipv4Addr::LOCALHOST.into(),
        IpAddr::V6(a) if a.is_unspecified() => Ipv6Addr::LOCALHOST.into(),
        other => other,
    };
    SocketAddr::new(ip, port)
}

/// One client of a published UDP port.
struct Flow {
    port: u16,
    client: SocketAddr,
    fd: OwnedFd,
}

/// A published UDP port: its host socket and where its flows connect in the sandbox.
struct Port {
    fd: OwnedFd,
    to: SocketAddr,
}

/// The published UDP ports and their flows.
pub(crate) struct UdpPorts {
    factory: SocketFactory,
    ports: BTreeMap<u16, Port>,
    flows: FlowTable<(u16, SocketAddr), Flow>,
    next_id: u64,
    buf: Vec<u8>,
    drops: ferry_server::LogThrottle,
}

impl UdpPorts {
    /// No ports yet; flows' sockets are made by `factory` (the sandbox's namespace).
    pub(crate) fn new(factory: SocketFactory) -> UdpPorts {
        UdpPorts {
            factory,
            ports: BTreeMap::new(),
            flows: FlowTable::new(Limits {
                idle: |_| FLOW_IDLE,
                cap: MAX_FLOWS,
                group: |k: &(u16, SocketAddr)| usize::from(k.0),
            }),
            next_id: 0,
            buf: vec![0; MAX_DATAGRAM],
            drops: ferry_server::LogThrottle::default(),
        }
    }

    /// The ports published now.
    pub(crate) fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports.keys().copied()
    }

    /// Publishes `port`, whose flows go to `to` in the sandbox; false when its host
    /// socket cannot be made (said in the log).
    pub(crate) fn publish(&mut self, epoll: &ferry_sys::Epoll, port: u16, to: SocketAddr) -> bool {
        let at = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
        let made = ferry_server::host_listener(at, true).and_then(|(fd, _)| {
            epoll
                .add(fd.as_fd(), libc::EPOLLIN as u32, port_token(port))
                .map(|()| fd)
        });
        match made {
            Ok(fd) => {
                debug!("--publish-auto: port {port}/udp published");
                self.ports.insert(port, Port { fd, to });
                true
            }
            Err(e) => {
                warn!("--publish-auto: port {port}/udp: {e}: not published");
                false
            }
        }
    }

    /// Withdraws `port` and closes its flows.
    pub(crate) fn withdraw(&mut self, epoll: &ferry_sys::Epoll, port: u16) {
        if let Some(p) = self.ports.remove(&port) {
            let _ = epoll.delete(p.fd.as_fd());
            debug!("--publish-auto: port {port}/udp withdrawn (nothing receives there)");
        }
        let ids: Vec<u64> = self
            .flows
            .iter()
            .filter(|(_, f)| f.port == port)
            .map(|(id, _)| id)
            .collect();
        for id in ids {
            self.close(epoll, id);
        }
    }

    /// Closes the flows idle for [`FLOW_IDLE`].
    pub(crate) fn sweep(&mut self, epoll: &ferry_sys::Epoll) {
        for (_, _, f) in self.flows.expire(Instant::now()) {
            let _ = epoll.delete(f.fd.as_fd());
        }
    }

    fn close(&mut self, epoll: &ferry_sys::Epoll, id: u64) {
        if let Some((_, f)) = self.flows.remove(id) {
            let _ = epoll.delete(f.fd.as_fd());
        }
    }

    /// Datagrams on `port`'s host socket: each goes into the sandbox through its
    /// client's flow (made on its first datagram).
    pub(crate) fn inbound(&mut self, epoll: &ferry_sys::Epoll, port: u16) {
        for _ in 0..BATCH {
            let Some(p) = self.ports.get(&port) else {
                return;
            };
            let (n, client) = match ferry_sys::recv_from(p.fd.as_fd(), &mut self.buf) {
                Ok((n, Some(from))) => (n, from),
                Ok((_, None)) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => continue,
            };
            let id = match self.flows.find(&(port, client)) {
                Some(id) => Some(id),
                None => self.new_flow(epoll, port, client),
            };
            let Some(f) = id.and_then(|id| self.flows.active(id, Instant::now())) else {
                continue;
            };
            if let Err(e) = ferry_sys::send_nosignal(f.fd.as_fd(), &self.buf[..n]) {
                self.dropped(port, &e);
            }
        }
    }

    /// A flow's socket is readable: the program's answers go to the flow's client.
    pub(crate) fn outbound(&mut self, id: u64) {
        for _ in 0..BATCH {
            let Some(f) = self.flows.active(id, Instant::now()) else {
                return;
            };
            let (port, client) = (f.port, f.client);
            let n = match ferry_sys::recv(f.fd.as_fd(), &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // ECONNREFUSED: nothing receives on the port (yet).
                    self.dropped(port, &e);
                    continue;
                }
            };
            let Some(p) = self.ports.get(&port) else {
                return;
            };
            if let Err(e) = ferry_sys::send_to(p.fd.as_fd(), &self.buf[..n], &client) {
                self.dropped(port, &e);
            }
        }
    }

    fn new_flow(&mut self, epoll: &ferry_sys::Epoll, port: u16, client: SocketAddr) -> Option<u64> {
        let to = self.ports.get(&port)?.to;
        let fd = match self.flow_socket(to) {
            Ok(fd) => fd,
            Err(e) => {
                self.dropped(port, &e);
                return None;
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = epoll.add(fd.as_fd(), libc::EPOLLIN as u32, flow_token(id)) {
            self.dropped(port, &e);
            return None;
        }
        let flow = Flow { port, client, fd };
        for (_, _, gone) in self.flows.insert(id, (port, client), flow, Instant::now()) {
            let _ = epoll.delete(gone.fd.as_fd());
        }
        Some(id)
    }

    /// A socket in the sandbox's namespace, bound to its loopback and connected to `to`.
    fn flow_socket(&self, to: SocketAddr) -> io::Result<OwnedFd> {
        let (domain, lo): (i32, IpAddr) = if to.is_ipv4() {
            (libc::AF_INET, Ipv4Addr::LOCALHOST.into())
        } else {
            (libc::AF_INET6, Ipv6Addr::LOCALHOST.into())
        };
        let ty = libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        let fd = self.factory.socket(domain, ty, 0)?;
        // A TAP address is reached from the sandbox's own side: bind loopback only for
        // loopback targets (the kernel picks the TAP address for the others).
        if to.ip().is_loopback() {
            ferry_sys::bind(fd.as_fd(), &SocketAddr::new(lo, 0))?;
        }
        ferry_sys::connect(fd.as_fd(), &to)?;
        Ok(fd)
    }

    fn dropped(&mut self, port: u16, e: &io::Error) {
        if let Some(n) = self.drops.tick() {
            warn!(
                "--publish-auto: port {port}/udp: a datagram dropped: {e} ({n} since the last line)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_ports_and_flows_apart_from_tcp_ports() {
        assert_eq!(Token::of(port_token(53)), Some(Token::Port(53)));
        assert_eq!(Token::of(port_token(0xffff)), Some(Token::Port(0xffff)));
        assert_eq!(Token::of(flow_token(7)), Some(Token::Flow(7)));
        assert_eq!(Token::of(80), None, "a TCP port's token");
        assert_eq!(Token::of(1 << 32), None, "the stop token");
    }

    #[test]
    fn flows_connect_to_loopback_for_the_wildcard_else_the_bound_address() {
        let v4: IpAddr = Ipv4Addr::UNSPECIFIED.into();
        let v6: IpAddr = Ipv6Addr::UNSPECIFIED.into();
        let tap: IpAddr = Ipv4Addr::new(10, 0, 2, 100).into();
        assert_eq!(target(v4, 53), "127.0.0.1:53".parse().unwrap());
        assert_eq!(target(v6, 53), "[::1]:53".parse().unwrap());
        assert_eq!(target(tap, 53), "10.0.2.100:53".parse().unwrap());
    }
}
