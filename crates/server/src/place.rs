//! Where a socket lives: placing a provisional socket (the host's namespace or the
//! sandbox's), moving one bound to the wildcard to the host for a peer outside, the
//! rules a destination and a source must pass ([`ferry_egress::admit`], `reach`), and
//! an egress bond's source address (the bond itself is `ferry_egress`'s). Must not:
//! answer requests (its callers in `connect.rs` and `tx.rs` do) or move data.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use ferry_egress::{Decision, HostAddrs, Origin, Reason, What, admit, reach};
use ferry_proto::{WireAddr, cmsg};
use ferry_sys::Epoll;
use tracing::{debug, warn};

use crate::Config;
use crate::group::Shared;
use crate::ops::Errno;
use crate::seam::Io;
use crate::server::Server;
use crate::sock::{Conn, Place};
use crate::stats::ServerStats;
use crate::table::SockTable;

/// `IP_BIND_ADDRESS_NO_PORT` (linux/in.h): bind the address now, the port at connect,
/// so a bonded source address does not use up a port per destination.
const IP_BIND_ADDRESS_NO_PORT: i32 = 24;

/// Most peers a datagram socket with a chosen host port remembers (`Sock::contacted`).
const CONTACTED: usize = 64;

/// Adds `peer` to `list` (the most recent last), forgetting the oldest beyond [`CONTACTED`].
fn remember(list: &mut Vec<SocketAddr>, peer: SocketAddr) {
    list.retain(|p| *p != peer);
    if list.len() >= CONTACTED {
        list.remove(0);
    }
    list.push(peer);
}

/// What placing a socket works on: the seam, the event loop (a moved socket's new host
/// socket joins it), the sockets, the sandbox's socket factory, the configuration
/// (policy, bond), the host's addresses and the counters.
pub(crate) struct Placing<'a> {
    pub io: &'static dyn Io,
    pub epoll: &'a Epoll,
    pub socks: &'a mut SockTable,
    pub shared: &'a Shared,
    pub cfg: &'a Config,
    pub host_addrs: &'a mut HostAddrs,
    pub stats: &'a mut ServerStats,
}

impl Placing<'_> {
    /// Whether socket `id` lives on the host already (bound to a host address, or
    /// connected or sent from before): local destinations would be the host's own.
    pub(crate) fn on_host(&self, id: u32) -> bool {
        self.socks.get(&id).is_some_and(|s| s.place == Place::Host)
    }

    pub(crate) fn host_loopback_refused(&mut self, id: u32, what: What, to: WireAddr) {
        warn!(
            "socket {id}: {what} to {} refused: the socket is on the host, where that address is the host's own (never reachable from a sandbox)",
            to.to_std()
        );
        self.stats.denied += 1;
    }

    /// Why a datagram's control messages may not go out from socket `id`, if they may
    /// not: on the host, a source must be one of the host's addresses, with no
    /// interface chosen (`reach.rs`). Inside the sandbox its own kernel judges.
    pub(crate) fn source_refused(&mut self, id: u32, control: &[u8]) -> Option<String> {
        if control.is_empty() || self.socks.get(&id)?.place == Place::Sandbox {
            return None;
        }
        cmsg::sources(control)
            .find_map(|(index, ip)| reach::source_refused(self.host_addrs, index, ip))
    }

    /// A socket the program bound to the wildcard address (so it was made in the sandbox)
    /// and now connects or sends elsewhere — a client choosing its port, as `curl
    /// --local-port`, dig, `nc -u -p` or libuv do — moves to the host: a host socket with
    /// its options, bound to the wildcard and the same port (the port it had in the
    /// sandbox when the program asked for any; another when the host has that one taken),
    /// takes its place. A datagram socket that
    /// keeps a port the program chose admits only the peers it contacts (it must not be
    /// a way to publish a port). Nothing happens to other sockets, or once a socket has
    /// a peer or listens.
    pub(crate) fn move_to_host(&mut self, id: u32) -> Result<(), Errno> {
        let io = self.io;
        let Some(s) = self.socks.get(&id) else {
            return Ok(());
        };
        let Some(asked) = s.bound_wild else {
            return Ok(());
        };
        if s.place != Place::Sandbox || s.conn() != Conn::Idle {
            return Ok(());
        }
        let had = io
            .sock_addr(s.fd.as_fd(), false)
            .ok()
            .flatten()
            .map_or(0, |a| a.port());
        let (domain, ty, protocol) = (s.domain, s.ty, s.protocol);
        let fd = self
            .io
            .socket(domain, ty, protocol)
            .map_err(|e| Errno::of(&e))?;
        for (level, name, value) in &s.opts {
            let _ = io.setsockopt(fd.as_fd(), *level, *name, value);
        }
        let any = |port| {
            let ip: std::net::IpAddr = if domain == libc::AF_INET6 {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            };
            SocketAddr::new(ip, port)
        };
        // The port is free in the sandbox, where the program bound it, but may be taken on
        // the host (by another program, or a connection in TIME_WAIT): the program cannot
        // try another one now, as it would after a failed bind, so the host picks one.
        let kept = io.bind(fd.as_fd(), &any(had)).is_ok();
        if !kept {
            io.bind(fd.as_fd(), &any(0)).map_err(|e| Errno::of(&e))?;
            debug!("socket {id}: port {had} is taken on the host; another one is used");
        }
        self.socks
            .replace_host_fd(self.io, self.epoll, id, fd, Place::Host)
            .map_err(|e| Errno::of(&e))?;
        let s = self.socks.get_mut(&id).ok_or(Errno(libc::EBADF))?;
        s.bound_wild = None;
        if !s.is_stream() && asked != 0 && kept {
            s.contacted = Some(Vec::new());
        }
        debug!(
            "socket {id}: bound to the wildcard, moved to the host for a peer outside the sandbox"
        );
        Ok(())
    }

    /// Moves a provisional socket to where `dest` says it belongs.
    pub(crate) fn place_for(&mut self, id: u32, local: bool) -> Result<(), Errno> {
        let io = self.io;
        let s = self.socks.get(&id).ok_or(Errno(libc::EBADF))?;
        if s.place != Place::Provisional {
            return Ok(());
        }
        let (domain, ty, protocol) = (s.domain, s.ty, s.protocol);
        if local {
            let fd = self
                .shared
                .sandbox_socket(
                    domain,
                    ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    protocol,
                )
                .map_err(|e| Errno::of(&e))?;
            io.set_nonblocking(fd.as_fd(), true)
                .map_err(|e| Errno::of(&e))?;
            self.socks
                .replace_host_fd(self.io, self.epoll, id, fd, Place::Sandbox)
                .map_err(|e| Errno::of(&e))?;
        } else if let Some(s) = self.socks.get_mut(&id) {
            s.place = Place::Host;
        }
        Ok(())
    }

    /// Whether socket `id` may reach `dest` (`what`: a connect or a datagram), and from
    /// where, as [`ferry_egress::admit`] decides: the host's own addresses are never
    /// reachable from the host side; the policy. Then a socket bound to the wildcard in
    /// the sandbox moves to the host for a peer outside it, a provisional one is placed;
    /// a socket that keeps a port the program chose remembers the peer. `Ok(true)`: the
    /// connection is to be handed to the program ([`Decision::Handoff`]).
    pub(crate) fn route_to(&mut self, id: u32, dest: WireAddr, what: What) -> Result<bool, Errno> {
        let to = dest.to_std();
        let from = if self.on_host(id) {
            Origin::Host
        } else {
            Origin::Sandbox
        };
        let decision = admit(&self.cfg.policy, what, from, to);
        let local = match decision {
            Decision::Inside => true,
            Decision::Outside | Decision::Handoff => false,
            Decision::Refused(Reason::HostLocal) => {
                self.host_loopback_refused(id, what, dest);
                return Err(Errno(libc::EACCES));
            }
            Decision::Refused(why) => {
                warn!("socket {id}: {what} to {to} {why}");
                self.stats.denied += 1;
                return Err(Errno(libc::EACCES));
            }
        };
        if !local {
            self.move_to_host(id)?;
        }
        self.place_for(id, local)?;
        if let Some(c) = self.socks.get_mut(&id).and_then(|s| s.contacted.as_mut()) {
            remember(c, to);
        }
        Ok(decision == Decision::Handoff)
    }

    /// [`Placing::route_to`] for a connect: besides, a stream bound inside the sandbox has
    /// no route out, and an egress bond picks the source. `Ok(true)`: the connection is
    /// to be handed to the program ([`Decision::Handoff`]).
    pub(crate) fn route_connect(&mut self, id: u32, addr: WireAddr) -> Result<bool, Errno> {
        let handoff = self.route_to(id, addr, What::Connect)?;
        let s = self.socks.get_mut(&id).ok_or(Errno(libc::EBADF))?;
        if s.place == Place::Sandbox
            && !reach::is_local(addr.to_std().ip())
            && s.ty == libc::SOCK_STREAM
        {
            // Bound inside the sandbox, now asked to leave it: the sandbox has no route.
            return Err(Errno(libc::ENETUNREACH));
        }
        self.bond_source(id, addr.to_std())?;
        Ok(handoff && self.socks.get(&id).is_some_and(|s| s.is_stream()))
    }

    /// Before connecting host socket `id` to `dst`: when there is a bond and the
    /// program has not bound the socket itself, binds it to the bond's source address
    /// for `dst`. `Err` is the errno for the program's connect.
    pub(crate) fn bond_source(&mut self, id: u32, dst: SocketAddr) -> Result<(), Errno> {
        let io = self.io;
        let Some(bond) = self.cfg.egress.clone() else {
            return Ok(());
        };
        let Some(s) = self.socks.get_mut(&id) else {
            return Ok(());
        };
        if s.place != Place::Host || s.egress.is_some() {
            return Ok(());
        }
        // Bound by the program, or by an earlier sendto/connect (a UDP socket that
        // connects again keeps its address): leave it.
        if let Ok(Some(local)) = io.sock_addr(s.fd.as_fd(), false)
            && (local.port() != 0 || !local.ip().is_unspecified())
        {
            return Ok(());
        }
        let Some(lease) = bond.lease(dst) else {
            return Ok(());
        };
        let src = match (lease.addr(), s.domain) {
            (IpAddr::V4(v4), libc::AF_INET6) => IpAddr::V6(v4.to_ipv6_mapped()),
            (ip, _) => ip,
        };
        let fd = s.fd.as_fd();
        let bound = io
            .setsockopt(
                fd,
                libc::IPPROTO_IP,
                IP_BIND_ADDRESS_NO_PORT,
                &1i32.to_ne_bytes(),
            )
            .and_then(|()| io.bind(fd, &SocketAddr::new(src, 0)));
        match bound {
            Ok(()) => {
                s.egress = Some(lease);
                Ok(())
            }
            Err(e) => {
                warn!("socket {id}: cannot use egress source {src} for {dst}: {e}");
                Err(Errno::of(&e))
            }
        }
    }
}

impl Server {}
