//! UDP publishing (`-p [IP:]HOST_PORT:PORT/udp`).
//!
//! A datagram reaching a published host port is forwarded to the sandbox's port through
//! a *flow*: a UDP socket in the sandbox's network namespace, one per client address,
//! bound to the sandbox's loopback and connected to the published port there. The
//! program sees each client as a distinct loopback source (`127.0.0.1:E`); what it sends
//! back to that source reaches the flow, and the server sends it on to the client from
//! the published port, so the client sees its answers come from where it sent. (The
//! program sees a loopback source instead of the client's address, as with pasta's and
//! Podman's port forwarders; TCP connections keep theirs.)
//!
//! Bounds, since the clients are anyone who can reach the host port: at most
//! [`MAX_FLOWS`] flows per published port (a new client takes the place of the one idle
//! longest), a flow idle for [`FLOW_IDLE`] is closed, at most [`BATCH`] datagrams are
//! taken per wake-up from one socket, and each datagram is at most [`MAX_DATAGRAM`]
//! bytes (the largest UDP payload). Nothing the sandbox sends on a flow goes anywhere but
//! to that flow's client.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use ferry_egress::{FlowTable, Limits};
use tracing::{debug, warn};

/// Most flows per published port.
pub const MAX_FLOWS: usize = 256;
/// A flow that carries nothing either way for this long is closed.
pub const FLOW_IDLE: Duration = Duration::from_secs(60);
/// Most datagrams taken from one socket per wake-up (the socket is level-triggered: the
/// rest come at the next turn, after the other events).
const BATCH: usize = 64;
/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;

/// One client of a published UDP port.
#[derive(Debug)]
pub(crate) struct Flow {
    /// Index of the published port (`Server::published`).
    pub port: usize,
    pub client: SocketAddr,
    /// The flow's socket in the sandbox's namespace.
    pub fd: OwnedFd,
}

/// A flow's key: (published port index, client). A port's flows are one group.
type Key = (usize, SocketAddr);

/// The flows of a server's published UDP ports, by flow id (the event loop's token)
/// and by (port, client): at most [`MAX_FLOWS`] a port, closed after [`FLOW_IDLE`].
#[derive(Debug)]
pub(crate) struct Flows {
    table: FlowTable<Key, Flow>,
    next_id: u32,
    /// Room for one datagram, kept between wake-ups.
    buf: Vec<u8>,
    /// Datagrams forwarded into the sandbox, and back out.
    pub inbound: u64,
    pub outbound: u64,
    /// Datagrams dropped (no flow could be made, the sandbox refused them, a send failed).
    pub dropped: u64,
}

impl Default for Flows {
    fn default() -> Flows {
        Flows {
            table: FlowTable::new(Limits {
                idle: |_| FLOW_IDLE,
                cap: MAX_FLOWS,
                group: |k: &Key| k.0,
            }),
            next_id: 0,
            buf: Vec::new(),
            inbound: 0,
            outbound: 0,
            dropped: 0,
        }
    }
}

impl Flows {
    /// The flow of `client` on published port `port`, marked active now.
    fn find(&mut self, port: usize, client: SocketAddr) -> Option<u32> {
        let id = self.table.find(&(port, client))?;
        self.table.active(id, Instant::now());
        u32::try_from(id).ok()
    }

    fn get(&self, id: u32) -> Option<&Flow> {
        self.table.get(id.into())
    }

    /// Flow `id` carried a datagram now.
    fn active(&mut self, id: u32) {
        self.table.active(id.into(), Instant::now());
    }

    /// The datagram buffer (given back with [`Flows::put_buf`]).
    fn take_buf(&mut self) -> Vec<u8> {
        let mut b = std::mem::take(&mut self.buf);
        b.resize(MAX_DATAGRAM, 0);
        b
    }

    fn put_buf(&mut self, b: Vec<u8>) {
        self.buf = b;
    }

    /// Adds a flow; returns its id and the flows it displaced (when the port already
    /// had [`MAX_FLOWS`], the one idle longest), which the caller deregisters.
    fn add(&mut self, flow: Flow) -> (u32, Vec<Flow>) {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let key = (flow.port, flow.client);
        let gone = self.table.insert(id.into(), key, flow, Instant::now());
        (id, gone.into_iter().map(|(_, _, f)| f).collect())
    }

    fn remove(&mut self, id: u32) -> Option<Flow> {
        self.table.remove(id.into()).map(|(_, f)| f)
    }

    /// Flows idle for [`FLOW_IDLE`], taken out (at most once a second).
    fn expired(&mut self, now: Instant) -> Vec<Flow> {
        self.table
            .expire(now)
            .into_iter()
            .map(|(_, _, f)| f)
            .collect()
    }
}

impl crate::server::Server {
    /// Datagrams on published UDP port `i`: each goes into the sandbox through its
    /// client's flow (made on its first datagram).
    pub(crate) fn published_datagrams(&mut self, i: usize) {
        self.sweep_flows();
        let mut buf = self.udp_flows.take_buf();
        self.datagrams_in(i, &mut buf);
        self.udp_flows.put_buf(buf);
    }

    fn datagrams_in(&mut self, i: usize, buf: &mut [u8]) {
        for _ in 0..BATCH {
            let (n, from) = match ferry_sys::recv_from(self.published_fd(i), buf) {
                Ok((n, Some(from))) => (n, from),
                Ok((_, None)) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // An ICMP error for an earlier answer, say: nothing to take.
                    debug!("published port {}/udp: {e}", self.published_port(i));
                    continue;
                }
            };
            let flow = match self.udp_flows.find(i, from) {
                Some(id) => Some(id),
                None => self.new_flow(i, from),
            };
            let sent = flow
                .and_then(|id| self.udp_flows.get(id))
                .map(|f| ferry_sys::send_nosignal(f.fd.as_fd(), &buf[..n]));
            match sent {
                Some(Ok(_)) => self.udp_flows.inbound += 1,
                // ECONNREFUSED: an earlier datagram found nothing on the port.
                Some(Err(e)) => self.flow_dropped(i, &e.to_string()),
                None => self.udp_flows.dropped += 1,
            }
        }
    }

    /// A flow's socket is readable: the program's answers go to the flow's client.
    pub(crate) fn flow_event(&mut self, id: u32) {
        let mut buf = self.udp_flows.take_buf();
        self.datagrams_out(id, &mut buf);
        self.udp_flows.put_buf(buf);
    }

    fn datagrams_out(&mut self, id: u32, buf: &mut [u8]) {
        for _ in 0..BATCH {
            let Some(f) = self.udp_flows.get(id) else {
                return;
            };
            let (port, client) = (f.port, f.client);
            let n = match ferry_sys::recv(f.fd.as_fd(), buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // ECONNREFUSED: nothing in the sandbox receives on the port.
                    self.flow_dropped(port, &e.to_string());
                    continue;
                }
            };
            self.udp_flows.active(id);
            match ferry_sys::send_to(self.published_fd(port), &buf[..n], &client) {
                Ok(_) => self.udp_flows.outbound += 1,
                Err(e) => self.flow_dropped(port, &format!("to {client}: {e}")),
            }
        }
    }

    /// A flow for `client` of published UDP port `i`: a UDP socket in the sandbox,
    /// bound to its loopback and connected to the port there.
    fn new_flow(&mut self, i: usize, client: SocketAddr) -> Option<u32> {
        let port = self.published_port(i);
        let made = self
            .shared
            .sandbox_socket(
                libc::AF_INET,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
            .and_then(|fd| {
                ferry_sys::bind(fd.as_fd(), &SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0))?;
                ferry_sys::connect(
                    fd.as_fd(),
                    &SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port),
                )?;
                Ok(fd)
            });
        let fd = match made {
            Ok(fd) => fd,
            Err(e) => {
                self.flow_dropped(i, &format!("no flow for {client}: {e}"));
                return None;
            }
        };
        let flow = Flow {
            port: i,
            client,
            fd,
        };
        let (id, evicted) = self.udp_flows.add(flow);
        for old in evicted {
            let _ = self.epoll.delete(old.fd.as_fd());
        }
        let f = self.udp_flows.get(id).expect("just added");
        if let Err(e) = self.epoll.add(
            f.fd.as_fd(),
            libc::EPOLLIN as u32,
            crate::server::token(crate::server::T_UDP_FLOW, id),
        ) {
            self.udp_flows.remove(id);
            self.flow_dropped(i, &format!("no flow for {client}: {e}"));
            return None;
        }
        debug!("published port {port}/udp: flow {id} for {client}");
        Some(id)
    }

    /// Closes flows idle for [`FLOW_IDLE`].
    fn sweep_flows(&mut self) {
        if self.udp_flows.table.is_empty() {
            return;
        }
        for f in self.udp_flows.expired(Instant::now()) {
            let _ = self.epoll.delete(f.fd.as_fd());
        }
    }

    fn flow_dropped(&mut self, i: usize, why: &str) {
        self.udp_flows.dropped += 1;
        if let Some(n) = self.refusals.tick() {
            warn!(
                "published port {}/udp: datagram dropped: {why} ({n} since the last line)",
                self.published_port(i)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(port: usize, client_port: u16) -> Flow {
        let (fd, _) =
            ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC).unwrap();
        Flow {
            port,
            client: SocketAddr::new(Ipv4Addr::new(192, 0, 2, 9).into(), client_port),
            fd,
        }
    }

    /// The table's bounds are `ferry_egress::flows`'s (tested there); these are the
    /// published ports': a port's flows are one group of [`MAX_FLOWS`].
    #[test]
    fn a_full_port_gives_the_longest_idle_flow_s_place_to_a_new_client() {
        let mut flows = Flows::default();
        for k in 0..MAX_FLOWS {
            assert!(
                flows
                    .add(flow(0, u16::try_from(k).unwrap() + 1))
                    .1
                    .is_empty()
            );
        }
        // Another port's flows are not counted against this one.
        assert!(flows.add(flow(1, 7)).1.is_empty());
        // Client 1 was the first; it has been heard from since, so another goes.
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            flows
                .find(0, SocketAddr::new(Ipv4Addr::new(192, 0, 2, 9).into(), 1))
                .is_some()
        );
        let (_, evicted) = flows.add(flow(0, 60_000));
        let gone: Vec<(usize, u16)> = evicted.iter().map(|f| (f.port, f.client.port())).collect();
        assert!(matches!(gone[..], [(0, c)] if c != 1), "{gone:?}");
        assert_eq!(flows.table.len(), MAX_FLOWS + 1);
    }

    #[test]
    fn idle_flows_expire() {
        let mut flows = Flows::default();
        let (id, _) = flows.add(flow(0, 1));
        let t0 = Instant::now();
        assert!(flows.expired(t0).is_empty());
        let gone = flows.expired(t0 + FLOW_IDLE + Duration::from_secs(1));
        assert_eq!(
            gone.iter().map(|f| f.client.port()).collect::<Vec<_>>(),
            [1]
        );
        assert!(flows.get(id).is_none() && flows.remove(id).is_none());
    }
}
