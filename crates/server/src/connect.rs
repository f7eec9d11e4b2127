//! Where a socket lives and whom it talks to: making and accepting sockets, placing
//! them (provisional, then the host's namespace or the sandbox's), bind, listen,
//! connect and the end of a connect in progress (the [`Conn`] table in `sock.rs`),
//! with the policy and reachability rules each applies (docs/SECURITY.md). Must not:
//! move data (`tx.rs`, `rx.rs`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use ferry_proto::{CMP_HANDOFF, CMP_RENEW_PAIR, Cmp, CmpKind, Ctl, WireAddr, cmsg};
use tracing::{debug, warn};

use ferry_egress::{Decision, Origin, Reason, What, admit, reach};

use crate::ops::{Errno, reply_id, would_block};
use crate::server::Server;
use crate::sock::{Conn, Parked, Place};

/// `a` as a socket of family `domain` shows it. A connection accepted on a dual-stack
/// published port is an IPv6 socket on the host, handed to the sandbox's listener: for an
/// IPv4 listener an IPv4 client's ::ffff:a.b.c.d is a.b.c.d, and an IPv6 client (which
/// an IPv4 listener could not have natively) shows as 0.0.0.0 with its port — never as a
/// loopback address a program might trust.
pub(crate) fn in_family(domain: i32, a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) if domain == libc::AF_INET => {
            let v4 = v6
                .ip()
                .to_ipv4_mapped()
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
            SocketAddr::new(v4.into(), v6.port())
        }
        _ => a,
    }
}

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

/// A hash key for a peer address (the hash assignment of accepted connections).
fn addr_key(a: &SocketAddr) -> u64 {
    let ip = match a.ip() {
        std::net::IpAddr::V4(v4) => u64::from(u32::from(v4)),
        std::net::IpAddr::V6(v6) => {
            let b = v6.octets();
            let half = |h: &[u8]| u64::from_be_bytes(h.try_into().expect("8 bytes"));
            half(&b[..8]) ^ half(&b[8..])
        }
    };
    ip << 16 | u64::from(a.port())
}

/// A connection taken for a listener of the sandbox.
pub(crate) struct Accepted {
    conn: OwnedFd,
    peer: Option<SocketAddr>,
    /// The published port it came through (a connection of the host's side).
    published: Option<u16>,
}

/// A socket counted against the sandbox's cap (`Config::max_sockets`) whose making may
/// still fail: dropping it gives the count back, unless [`SocketSlot::keep`] said the
/// socket was made (then `settle_dirty` gives it back when the socket goes).
struct SocketSlot(Option<std::sync::Arc<crate::group::Shared>>);

impl SocketSlot {
    /// The socket was made: its count stays taken. (Not `mem::forget`, which would
    /// leak the slot's reference to the group's shared state, and with it the state.)
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        if let Some(shared) = &self.0 {
            shared.socket_closed();
        }
    }
}

impl Server {
    /// The server a socket made through channel `ch` goes to (`key` for the hash mode).
    fn assign(&self, ch: u32, key: u64) -> usize {
        let routes = self.chan(ch).is_some_and(|c| c.routes);
        if routes {
            self.shared.pick(key)
        } else {
            self.index
        }
    }

    /// Makes a socket for channel `ch`: its id and the program's end of its pair.
    pub(crate) fn create_socket(
        &mut self,
        ch: u32,
        domain: i32,
        ty: i32,
        protocol: i32,
    ) -> Result<(u32, OwnedFd), Errno> {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return Err(Errno(libc::EAFNOSUPPORT));
        }
        if ty != libc::SOCK_STREAM && ty != libc::SOCK_DGRAM {
            return Err(Errno(libc::EPROTONOSUPPORT));
        }
        let owner = self.chan(ch).ok_or(Errno(libc::EBADF))?.owner;
        let slot = self.socket_slot()?;
        let fd = self
            .io
            .socket(domain, ty, protocol)
            .map_err(|e| Errno::of(&e))?;
        let key = self
            .chan(ch)
            .map_or(0, |c| u64::from(c.stats.pid) << 32 | u64::from(c.stats.tid));
        let server = self.assign(ch, key);
        let (mut sock, theirs) = self
            .new_sock(
                server,
                fd,
                (domain, ty, protocol),
                Place::Provisional,
                owner,
            )
            .map_err(|e| Errno::of(&e))?;
        sock.rx_pair = ty == libc::SOCK_STREAM && self.chan(ch).is_some_and(|c| c.rx_pair);
        let id = self.place_sock(sock).map_err(|e| Errno::of(&e))?;
        slot.keep();
        self.stats.sockets_created += 1;
        Ok((id, theirs))
    }

    /// One of the sandbox's sockets (`Config::max_sockets`), given back when the guard
    /// drops unless it is forgotten (the socket was made: `settle_dirty` gives it back
    /// when the socket goes).
    fn socket_slot(&mut self) -> Result<SocketSlot, Errno> {
        if self.shared.take_socket(self.cfg.max_sockets) {
            return Ok(SocketSlot(Some(self.shared.clone())));
        }
        if let Some(n) = self.refusals.tick() {
            warn!(
                "the sandbox has {} sockets open (--max-sockets): a new one is refused with ENFILE ({n} since the last line)",
                self.cfg.max_sockets
            );
        }
        self.stats.denied += 1;
        Err(Errno(libc::ENFILE))
    }

    pub(crate) fn accept(&mut self, ch: u32, id: u32, nonblock: bool) {
        let Some(s) = self.sock(id) else {
            self.ctl_reply(ch, Server::new_reply(Errno(libc::EBADF)));
            return;
        };
        if !s.listening() {
            self.ctl_reply(ch, Server::new_reply(Errno(libc::EINVAL)));
            return;
        }
        match self.try_accept(id) {
            Ok(a) => self.finish_accept(ch, id, a),
            Err(e) if would_block(&e) && !nonblock => {
                self.park(id, Parked::Accept { ch });
            }
            Err(e) => {
                let mut r = Server::new_reply(Errno::of(&e));
                if would_block(&e) {
                    r.c = self.drain_token(id);
                }
                self.ctl_reply(ch, r);
            }
        }
    }

    /// A connection waiting on listener `id`: one its host socket accepted, else one
    /// of a published port that feeds it (then the port comes too).
    pub(crate) fn try_accept(&mut self, id: u32) -> io::Result<Accepted> {
        let s = self
            .socks
            .get(&id)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        match self.io.accept(s.fd.as_fd()) {
            Ok((conn, peer)) => Ok(Accepted {
                conn,
                peer,
                published: None,
            }),
            Err(e) if would_block(&e) => match self.take_published(id) {
                // A published port listens on both families: an IPv4 client shows as
                // ::ffff:a.b.c.d, which an IPv4 listener's program must see as a.b.c.d
                // (`finish_accept` makes it so).
                Some((conn, port)) => Ok(Accepted {
                    peer: self.io.sock_addr(conn.as_fd(), true).ok().flatten(),
                    conn,
                    published: Some(port),
                }),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    pub(crate) fn finish_accept(&mut self, ch: u32, listener: u32, accepted: Accepted) {
        let Accepted {
            conn,
            peer,
            published,
        } = accepted;
        let (domain, place) = match self.socks.get(&listener) {
            Some(s) => (s.domain, s.place),
            None => (libc::AF_INET, Place::Sandbox),
        };
        let peer = peer.map(|p| in_family(domain, p));
        let Some(owner) = self.chan(ch).map(|c| c.owner) else {
            return;
        };
        let slot = match self.socket_slot() {
            Ok(slot) => slot,
            Err(e) => {
                // The connection is dropped (its peer sees it closed), as when a
                // program's accept fails for lack of descriptors.
                self.ctl_reply(ch, Server::new_reply(e));
                return;
            }
        };
        let server = self.server_for_accepted(ch, peer, published);
        let made = self.new_sock(server, conn, (domain, libc::SOCK_STREAM, 0), place, owner);
        let (mut sock, theirs) = match made {
            Ok(made) => made,
            Err(e) => {
                self.ctl_reply(ch, Server::new_reply(Errno::of(&e)));
                return;
            }
        };
        sock.conn = Conn::Connected;
        sock.rx_pair = self.chan(ch).is_some_and(|c| c.rx_pair);
        // An accepted socket has its listener's receive buffer (the kernel's rule).
        if let Some((_, _, v)) = self.socks.get(&listener).and_then(|l| {
            l.opts
                .iter()
                .find(|(lv, n, _)| (*lv, *n) == (libc::SOL_SOCKET, libc::SO_RCVBUF))
        }) {
            crate::ops::bound_pair(self.io, &sock, v);
        }
        if server == self.index {
            sock.last_ch = ch;
        }
        match self.place_sock(sock) {
            Ok(new) => {
                slot.keep();
                let r = self.accept_reply(listener, new, peer);
                if let Some(port) = published {
                    self.module_on_accept(new, port);
                }
                self.ctl_reply_fd(ch, r, theirs);
            }
            Err(e) => self.ctl_reply(ch, Server::new_reply(Errno::of(&e))),
        }
    }

    /// The server a connection accepted through channel `ch` goes to. One from a
    /// published port with a module rule stays here: the rule is applied by this
    /// server, right after the accept.
    fn server_for_accepted(
        &self,
        ch: u32,
        peer: Option<SocketAddr>,
        published: Option<u16>,
    ) -> usize {
        let module_port = published.is_some_and(|p| self.modules.has_port_rule(p));
        match self.shared.accepted {
            crate::Accepted::Listener => self.index,
            _ if module_port => self.index,
            crate::Accepted::Assign => self.assign(ch, peer.map_or(0, |p| addr_key(&p))),
        }
    }

    /// The reply to an accept on `listener` that made socket `new` for `peer`: its id,
    /// the peer's address, and whether the shim takes the listener's token back.
    fn accept_reply(&mut self, listener: u32, new: u32, peer: Option<SocketAddr>) -> Ctl {
        let mut r = Server::new_reply(reply_id(new));
        if let Some(p) = peer {
            r.addr_len = u32::try_from(WireAddr::from(p).encode(&mut r.addr)).unwrap_or(0);
        }
        if let Some(s) = self.sock(listener) {
            s.stats.calls += 1;
        }
        r.c = self.drain_if_empty(listener);
        r
    }

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
            .find_map(|(index, ip)| reach::source_refused(&mut self.host_addrs, index, ip))
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
        if s.place != Place::Sandbox || s.conn != Conn::Idle {
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
        self.replace_host_fd(id, fd, Place::Host)
            .map_err(|e| Errno::of(&e))?;
        let s = self.sock(id).ok_or(Errno(libc::EBADF))?;
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
            self.replace_host_fd(id, fd, Place::Sandbox)
                .map_err(|e| Errno::of(&e))?;
        } else if let Some(s) = self.sock(id) {
            s.place = Place::Host;
        }
        Ok(())
    }

    pub(crate) fn connect(&mut self, ch: u32, id: u32, tag: u32, addr: WireAddr, nonblock: bool) {
        if let Some(Conn::Failed { reported }) = self.socks.get(&id).map(|s| s.conn) {
            self.connect_after_failure(ch, id, tag, reported);
            return;
        }
        let handoff = match self.route_connect(id, addr) {
            Ok(h) => h,
            Err(e) => {
                self.done(ch, id, tag, e);
                return;
            }
        };
        let to = addr.to_std();
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        let connected = self.io.connect(s.fd.as_fd(), &to);
        if handoff && tag != 0 {
            match connected {
                Ok(()) => return self.hand_off(ch, id, tag, 0),
                Err(ref e) if e.raw_os_error() == Some(libc::EINPROGRESS) && nonblock => {
                    return self.hand_off(ch, id, tag, Errno(libc::EINPROGRESS).wire());
                }
                // Blocking: parked below, handed off once connected (`connect_ended`).
                Err(ref e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                    s.handoff_when_connected = true;
                }
                Err(_) => {}
            }
        }
        match connected {
            Ok(()) => {
                if s.is_stream() {
                    s.conn = Conn::Connected;
                }
                self.done(ch, id, tag, 0);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                s.conn = Conn::Connecting { to, filled: false };
                if nonblock {
                    self.done(ch, id, tag, Errno(libc::EINPROGRESS));
                } else {
                    self.park(id, Parked::Connect { ch, tag });
                }
            }
            Err(e) => self.done(ch, id, tag, Errno::of(&e)),
        }
        self.module_on_connect(id, to);
    }

    /// Stream `id`, connected or connecting (`result`: 0 or `-EINPROGRESS`) to a
    /// `--handoff` destination, leaves the loop; the connect is answered with
    /// `CMP_HANDOFF`, and the program takes the host socket ([`Server::take_handoff`]).
    fn hand_off(&mut self, ch: u32, id: u32, tag: u32, result: i32) {
        if let Some(s) = self.socks.get_mut(&id) {
            let _ = self.epoll.delete(s.fd.as_fd());
            s.handing_off = true;
            debug!("socket {id}: handed off");
        }
        let mut c = Cmp::new(CmpKind::Done, id, tag, result);
        c.flags |= CMP_HANDOFF;
        self.complete(ch, c);
    }

    /// `CtlKind::Handoff`: the host socket of stream `id` being handed off, for the
    /// program (the proof of holding it was checked); the server forgets the socket.
    pub(crate) fn take_handoff(&mut self, id: u32) -> Result<OwnedFd, Errno> {
        if !self.socks.get(&id).is_some_and(|s| s.handing_off) {
            return Err(Errno(libc::EINVAL));
        }
        let host = self
            .socks
            .get(&id)
            .ok_or(Errno(libc::EBADF))?
            .fd
            .try_clone()
            .map_err(|e| Errno::of(&e))?;
        let s = self.socks.remove(&id).ok_or(Errno(libc::EBADF))?;
        let _ = self.epoll.delete(s.pair.as_fd());
        self.shared.socket_closed();
        self.stats.closed_socket(s.stats);
        // Dropping `s` closes our copy (and its pair end); a bond's lease counts the
        // connection as ended (its bytes are the kernel's now).
        Ok(host)
    }

    /// A connect of stream `id` after a non-blocking one failed (see [`Conn`]): the
    /// first reports the failure (its error, or `ECONNABORTED` once `SO_ERROR` has taken
    /// it) and the kernel puts the socket back to unconnected; later ones ask the shim
    /// to renew the program's end of the pair first.
    fn connect_after_failure(&mut self, ch: u32, id: u32, tag: u32, reported: bool) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if reported {
            let mut c = Cmp::new(CmpKind::Done, id, tag, Errno(libc::ECONNABORTED).wire());
            c.flags |= CMP_RENEW_PAIR;
            self.complete(ch, c);
            return;
        }
        s.conn = Conn::Failed { reported: true };
        let e = match std::mem::take(&mut s.so_error) {
            0 => libc::ECONNABORTED,
            e => e,
        };
        let _ = io.connect_unspec(s.fd.as_fd());
        self.done(ch, id, tag, Errno(e));
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
        if let Some(c) = self.sock(id).and_then(|s| s.contacted.as_mut()) {
            remember(c, to);
        }
        Ok(decision == Decision::Handoff)
    }

    /// [`Server::route_to`] for a connect: besides, a stream bound inside the sandbox has
    /// no route out, and an egress bond picks the source. `Ok(true)`: hand the
    /// connection to the program.
    fn route_connect(&mut self, id: u32, addr: WireAddr) -> Result<bool, Errno> {
        let handoff = self.route_to(id, addr, What::Connect)?;
        let s = self.sock(id).ok_or(Errno(libc::EBADF))?;
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

    /// Stream `id`'s connect in progress (to `to`, the program's end of the pair
    /// `filled` meanwhile) has ended: its outcome (`SO_ERROR`) goes to the connect that
    /// waits for it, else is kept for the program's `SO_ERROR`; see [`Conn`]'s table.
    pub(crate) fn connect_ended(&mut self, id: u32, to: SocketAddr, filled: bool) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        let err = io
            .getsockopt_int(s.fd.as_fd(), libc::SOL_SOCKET, libc::SO_ERROR)
            .unwrap_or(libc::EIO);
        // The error is reported once: to the first waiter, else kept for SO_ERROR.
        let mut waiters = Vec::new();
        s.parked.retain(|p| match *p {
            Parked::Connect { ch, tag } => {
                waiters.push((ch, tag));
                false
            }
            _ => true,
        });
        let reported = !waiters.is_empty();
        if reported && err == 0 {
            // The program's connect blocked until done: finish the kernel's side too, so
            // that a second connect says EISCONN (after EINPROGRESS the kernel wants one
            // more connect call).
            let _ = io.connect(s.fd.as_fd(), &to);
        } else if reported {
            // A blocking connect failed: the kernel puts the program's socket back to
            // unconnected, so that it may connect again (ours, connected without
            // blocking, would say ECONNABORTED): dissolve it.
            let _ = io.connect_unspec(s.fd.as_fd());
        }
        s.so_error = if reported { 0 } else { err };
        s.conn = if err == 0 {
            Conn::Connected
        } else {
            Conn::Idle
        };
        let outcome = match err {
            0 => Ok(()),
            e => Err(Errno(e)),
        };
        let handoff = std::mem::take(&mut s.handoff_when_connected) && reported && err == 0;
        if handoff && let Some(&(ch, tag)) = waiters.first() {
            self.hand_off(ch, id, tag, 0);
            return;
        }
        for (ch, tag) in waiters {
            self.done(ch, id, tag, outcome);
        }
        if filled && err != 0 && !reported {
            // A non-blocking connect failed: POLLERR|POLLHUP, as the kernel's.
            self.detach_pair(id);
        } else if filled {
            // The connect has ended: the program's end polls writable again.
            self.drain_filler(id);
        }
    }

    pub(crate) fn bind(&mut self, id: u32, addr: SocketAddr) -> Result<(), Errno> {
        let io = self.io;
        let local = reach::is_local(addr.ip());
        if !local {
            if !self.host_addrs.owns(addr.ip()) {
                debug!("socket {id}: bind to {addr}: not an address of the host");
                return Err(Errno(libc::EADDRNOTAVAIL));
            }
            if self.socks.get(&id).is_some_and(|s| !s.is_stream()) && addr.port() != 0 {
                warn!(
                    "socket {id}: bind to {addr} refused: a datagram socket with a fixed port on a host address would receive from the network (publish it with -p HOST_PORT:PORT/udp)"
                );
                self.stats.denied += 1;
                return Err(Errno(libc::EACCES));
            }
        }
        self.place_for(id, local)?;
        let wild = WireAddr::from(addr).is_unspecified().then_some(addr.port());
        let s = self.sock(id).ok_or(Errno(libc::EBADF))?;
        match io.bind(s.fd.as_fd(), &addr) {
            Ok(()) => {
                s.bound_wild = wild;
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && self.reap_closed() > 0 => {
                // A socket the sandbox already closed may still hold the port: the hang-up
                // of its readiness pair was not processed yet. Now it is; try again.
                let s = self.sock(id).ok_or(Errno(libc::EBADF))?;
                io.bind(s.fd.as_fd(), &addr).map_err(|e| Errno::of(&e))
            }
            Err(e) => Err(Errno::of(&e)),
        }
    }

    /// Closes, right now, every socket whose program side is gone (its readiness pair has
    /// hung up) and whose sends are done; returns how many.
    pub(crate) fn reap_closed(&mut self) -> usize {
        let open: Vec<u32> = self
            .socks
            .values()
            .filter(|s| !s.app_closed)
            .map(|s| s.id)
            .collect();
        for id in open {
            if self.app_gone(id) {
                self.app_closed(id);
            }
        }
        let before = self.socks.len();
        self.settle_dirty();
        before - self.socks.len()
    }

    pub(crate) fn listen(&mut self, id: u32, backlog: i32) -> Result<(), Errno> {
        let io = self.io;
        if self.on_host(id) {
            warn!(
                "socket {id}: listen refused: the socket is bound to a host address, and only -p publishes a port"
            );
            self.stats.denied += 1;
            return Err(Errno(libc::EACCES));
        }
        self.place_for(id, true)?;
        let shared = self.shared.clone();
        let s = self.sock(id).ok_or(Errno(libc::EBADF))?;
        match io.listen(s.fd.as_fd(), backlog) {
            Ok(()) => {
                if !s.listening()
                    && let Ok(Some(a)) = io.sock_addr(s.fd.as_fd(), false)
                    && shared.listener_up(a.port())
                {
                    s.published_listener = Some(a.port());
                }
                s.conn = Conn::Listening;
                if self.has_published(id) {
                    self.host_event(id, libc::EPOLLIN as u32);
                }
                Ok(())
            }
            Err(e) => Err(Errno::of(&e)),
        }
    }
}
