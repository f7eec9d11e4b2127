//! Where a socket lives and whom it talks to: making and accepting sockets, placing
//! them (provisional, then the host's namespace or the sandbox's), bind, listen,
//! connect and the end of a connect in progress (the [`Conn`] table in `sock.rs`),
//! with the policy and reachability rules each applies (docs/SECURITY.md). Must not:
//! move data (`tx.rs`, `rx.rs`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use ferry_proto::{CMP_HANDOFF, CMP_RENEW_PAIR, Cmp, CmpKind, Ctl, CtlKind, WireAddr};
use tracing::{debug, warn};

use ferry_egress::reach;

use crate::ModuleTarget;
use crate::ops::reply;
use crate::ops::{Errno, reply_id, would_block};
use crate::recv_side::PathEvent;
use std::sync::Arc;

use ferry_egress::HostAddrs;
use ferry_sys::Epoll;

use crate::channel::Channels;
use crate::group::{Msg, Shared};
use crate::modules::Modules;
use crate::place::Placing;
use crate::seam::Io;
use crate::server::Server;
use crate::sock::{Conn, ConnEvent, Handoff, Parked, Place, Sock};
use crate::sock::{NewPair, Owner};
use crate::stats::ServerStats;
use crate::table::SockTable;
use crate::tx::Tx;
use crate::{Config, LogThrottle};

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

/// A TCP socket made ahead for this server: its id, its host socket (provisional) and
/// its readiness pair, none of it given to any program yet; both of the server's fds
/// already in its event loop when `registered` (under the id's tokens, the pair for
/// the pair path: `SockTable::adopt_registered`).
#[derive(Debug)]
pub(crate) struct Spare {
    domain: i32,
    id: u32,
    fd: OwnedFd,
    pair: NewPair,
    registered: bool,
}

/// The socket a server makes ahead, in a turn with nothing to do, for the next TCP
/// `socket()` of the family its channels asked for last: a program that opens one
/// connection after another then waits for no `socket`, `socketpair`, `FIONBIO` or
/// `bind` of the pair's name, nor for the two `epoll_ctl` that add its host socket and
/// pair to the loop (they were made while it waited for its peer; an event of the
/// spare before it is taken names an id the table does not have yet, and is dropped,
/// as one for a socket gone). Only the server's own sockets (an id it serves); at most
/// one; nothing is made before a program asked for a TCP socket, and a spare counts
/// against `--max-sockets` only once a program takes it.
///
/// The next spare waits for the `connect` of the socket just taken (or for
/// [`CONNECT_GRACE`] without one, or for the server's going to sleep): a program's
/// `socket()` is followed by its `connect` within microseconds, and a spare made in
/// between (a `socket`, a `socketpair`, a `bind` and two `epoll_ctl`) delayed that
/// `connect` by all of them. Made after it, the spare falls where the server waits for
/// the peer (the handshake's end, the first reply) or, for a hand-off, has nothing
/// left to do for that connection.
#[derive(Debug, Default)]
pub(crate) struct Spares {
    /// The family of the last TCP socket made here: the next spare's.
    wanted: Option<i32>,
    ready: Option<Spare>,
    /// A TCP socket was taken and no `connect` has come since.
    connect_due: bool,
}

/// How long an idle server waits for the `connect` that follows a TCP `socket()`
/// before it makes the next spare anyway (a listener's socket never connects).
const CONNECT_GRACE: Duration = Duration::from_micros(50);

impl Spares {
    /// Whether a turn idle for `idle` should make one ([`Spares::make`]).
    pub(crate) fn due(&self, idle: Duration) -> bool {
        self.wanted.is_some()
            && self.ready.is_none()
            && (!self.connect_due || idle >= CONNECT_GRACE)
    }

    /// A `connect` came: the spare may be made.
    pub(crate) fn connect_came(&mut self) {
        self.connect_due = false;
    }

    /// Makes the spare [`Spares::due`] says is due, for server `index`. A failure (out of
    /// descriptors…) is not retried before a program makes another TCP socket.
    pub(crate) fn make(&mut self, io: &dyn Io, epoll: &Epoll, shared: &Shared, index: usize) {
        let Some(domain) = self.wanted.take() else {
            return;
        };
        let Ok(fd) = io.socket(domain, libc::SOCK_STREAM, 0) else {
            return;
        };
        let id = shared.new_id(index);
        if let Ok(pair) = io.new_pair(id) {
            // Not in the loop (a failure here): the socket is added when taken.
            let registered =
                SockTable::register(epoll, id, fd.as_fd(), pair.ours.as_fd(), true).is_ok();
            self.ready = Some(Spare {
                domain,
                id,
                fd,
                pair,
                registered,
            });
            self.wanted = Some(domain);
        }
    }

    /// The spare for a TCP socket of `domain`, if one is ready; the next one is wanted,
    /// of `domain` (one of the other family is closed).
    fn take(&mut self, domain: i32) -> Option<Spare> {
        self.wanted = Some(domain);
        self.connect_due = true;
        self.ready.take().filter(|s| s.domain == domain)
    }
}

/// Whether `socket(domain, ty, protocol)` (`ty` without its flags) makes a TCP socket.
fn is_tcp(domain: i32, ty: i32, protocol: i32) -> bool {
    (domain == libc::AF_INET || domain == libc::AF_INET6)
        && ty == libc::SOCK_STREAM
        && (protocol == 0 || protocol == libc::IPPROTO_TCP)
}

/// What making, accepting, placing and connecting a socket works on: the seam, the
/// event loop (a new socket joins it), the sockets, the channels (owners, replies),
/// the modules (a rule's module), the sandbox's shared state (ids, its socket count,
/// other servers' inboxes, published connections), the configuration, the host's
/// addresses and the counters; never the control connections, the published ports'
/// listeners or the receive scratch. Borrowed from [`Server::connects`].
pub(crate) struct Connects<'a> {
    pub io: &'static dyn Io,
    pub epoll: &'a Epoll,
    pub socks: &'a mut SockTable,
    pub channels: &'a mut Channels,
    pub modules: &'a mut Modules,
    pub stats: &'a mut ServerStats,
    pub shared: &'a Arc<Shared>,
    pub cfg: &'a Config,
    pub host_addrs: &'a mut HostAddrs,
    /// The socket made ahead for the next TCP `socket()`.
    pub spares: &'a mut Spares,
    /// Log lines about refused sockets, at most one a second.
    pub refusals: &'a mut LogThrottle,
    /// This server's index in its group.
    pub index: usize,
}

impl Server {
    /// The parts making and connecting sockets work on.
    pub(crate) fn connects(&mut self) -> Connects<'_> {
        Connects {
            io: self.io,
            epoll: &self.epoll,
            socks: &mut self.socks,
            channels: &mut self.channels,
            modules: &mut self.modules,
            stats: &mut self.stats,
            shared: &self.shared,
            cfg: &self.cfg,
            host_addrs: &mut self.host_addrs,
            spares: &mut self.spares,
            refusals: &mut self.refusals,
            index: self.index,
        }
    }

    pub(crate) fn accept(&mut self, ch: u32, id: u32, nonblock: bool) {
        let Some(s) = self.socks.get_mut(&id) else {
            self.channels.answer(self.io, ch, Errno(libc::EBADF));
            return;
        };
        if !s.listening() {
            self.channels.answer(self.io, ch, Errno(libc::EINVAL));
            return;
        }
        match self.connects().try_accept(id) {
            Ok(a) => self.connects().finish_accept(ch, id, a),
            Err(e) if would_block(&e) && !nonblock => {
                if !self.socks.park(id, Parked::Accept { ch }) {
                    self.bad_channel(ch, "too many blocking requests on one socket");
                }
            }
            Err(e) => {
                let mut r = reply(Errno::of(&e));
                if would_block(&e) {
                    r.c = i32::from(
                        self.socks
                            .get(&id)
                            .is_some_and(crate::sock::Sock::token_out),
                    );
                }
                self.channels.send_reply(self.io, ch, r, &[]);
            }
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
        self.connects().placing().place_for(id, local)?;
        let wild = WireAddr::from(addr).is_unspecified().then_some(addr.port());
        let s = self.socks.get_mut(&id).ok_or(Errno(libc::EBADF))?;
        match io.bind(s.fd.as_fd(), &addr) {
            Ok(()) => {
                s.bound_wild = wild;
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && self.reap_closed() > 0 => {
                // A socket the sandbox already closed may still hold the port: the hang-up
                // of its readiness pair was not processed yet. Now it is; try again.
                let s = self.socks.get_mut(&id).ok_or(Errno(libc::EBADF))?;
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
            if let Some(how) = self.socks.app_gone(self.io, id) {
                self.tx().app_closed(id, how);
            }
        }
        let before = self.socks.len();
        self.settle_dirty();
        // A port must be free now: nothing closed waits for an idle turn.
        self.closing.close_all();
        before - self.socks.len()
    }
}

impl Connects<'_> {
    /// The way out, for answers and a rule's module.
    pub(crate) fn tx(&mut self) -> Tx<'_> {
        Tx {
            io: self.io,
            epoll: self.epoll,
            socks: &mut *self.socks,
            channels: &mut *self.channels,
            modules: &mut *self.modules,
            stats: &mut *self.stats,
        }
    }

    /// The parts placing a socket works on.
    pub(crate) fn placing(&mut self) -> Placing<'_> {
        Placing {
            io: self.io,
            epoll: self.epoll,
            socks: &mut *self.socks,
            shared: self.shared,
            cfg: self.cfg,
            host_addrs: &mut *self.host_addrs,
            stats: &mut *self.stats,
        }
    }

    /// The server a socket made through channel `ch` goes to (`key` for the hash mode).
    fn assign(&self, ch: u32, key: u64) -> usize {
        let routes = self.channels.get(ch).is_some_and(|c| c.routes);
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
        let owner = self.channels.get(ch).ok_or(Errno(libc::EBADF))?.owner;
        let slot = self.socket_slot()?;
        let key = self
            .channels
            .get(ch)
            .map_or(0, |c| u64::from(c.stats.pid) << 32 | u64::from(c.stats.tid));
        let server = self.assign(ch, key);
        let kind = (domain, ty, protocol);
        let spare = if server == self.index && is_tcp(domain, ty, protocol) {
            self.spares.take(domain)
        } else {
            None
        };
        let mut registered = false;
        let (mut sock, theirs) = match spare {
            Some(Spare {
                id,
                fd,
                pair,
                registered: r,
                ..
            }) => {
                self.stats.sockets_made_ahead += 1;
                registered = r;
                let NewPair { ours, theirs, name } = pair;
                let sock = Sock::new(id, kind, fd, Place::Provisional, (ours, name), owner);
                (sock, theirs)
            }
            None => {
                let fd = self
                    .io
                    .socket(domain, ty, protocol)
                    .map_err(|e| Errno::of(&e))?;
                self.new_sock(server, fd, kind, Place::Provisional, owner)
                    .map_err(|e| Errno::of(&e))?
            }
        };
        if ty == libc::SOCK_STREAM && self.channels.get(ch).is_some_and(|c| c.rx_pair) {
            sock.rx.move_path(PathEvent::ToPair);
        }
        let id = if registered {
            // A spare is this server's own, already in its loop.
            self.socks
                .adopt_registered(self.epoll, sock)
                .map_err(|e| Errno::of(&e))?
        } else {
            self.place_sock(sock).map_err(|e| Errno::of(&e))?
        };
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
            Err(e) if would_block(&e) => {
                match self.socks.take_published(self.io, self.shared, id) {
                    // A published port listens on both families: an IPv4 client shows as
                    // ::ffff:a.b.c.d, which an IPv4 listener's program must see as a.b.c.d
                    // (`finish_accept` makes it so).
                    Some((conn, port)) => Ok(Accepted {
                        peer: self.io.sock_addr(conn.as_fd(), true).ok().flatten(),
                        conn,
                        published: Some(port),
                    }),
                    None => Err(e),
                }
            }
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
        let Some(owner) = self.channels.get(ch).map(|c| c.owner) else {
            return;
        };
        let slot = match self.socket_slot() {
            Ok(slot) => slot,
            Err(e) => {
                // The connection is dropped (its peer sees it closed), as when a
                // program's accept fails for lack of descriptors.
                self.channels.answer(self.io, ch, e);
                return;
            }
        };
        let server = self.server_for_accepted(ch, peer, published);
        let made = self.new_sock(server, conn, (domain, libc::SOCK_STREAM, 0), place, owner);
        let (mut sock, theirs) = match made {
            Ok(made) => made,
            Err(e) => {
                self.channels.answer(self.io, ch, Errno::of(&e));
                return;
            }
        };
        sock.conn_moves(ConnEvent::Connected);
        if self.channels.get(ch).is_some_and(|c| c.rx_pair) {
            sock.rx.move_path(PathEvent::ToPair);
        }
        // An accepted socket has its listener's receive buffer (the kernel's rule).
        if let Some((_, _, v)) = self.socks.get(&listener).and_then(|l| {
            l.opts
                .iter()
                .find(|(lv, n, _)| (*lv, *n) == (libc::SOL_SOCKET, libc::SO_RCVBUF))
        }) {
            crate::ops::bound_pair(self.io, &mut sock, v);
        }
        if server == self.index {
            sock.last_ch = ch;
        }
        match self.place_sock(sock) {
            Ok(new) => {
                slot.keep();
                let r = self.accept_reply(listener, new, peer);
                if let Some(port) = published {
                    self.tx().apply_rule(new, ModuleTarget::Port(port));
                }
                self.channels.send_reply(self.io, ch, r, &[theirs.as_fd()]);
            }
            Err(e) => self.channels.answer(self.io, ch, Errno::of(&e)),
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
        let mut r = reply(reply_id(new));
        if let Some(p) = peer {
            r.addr_len = u32::try_from(WireAddr::from(p).encode(&mut r.addr)).unwrap_or(0);
        }
        if let Some(s) = self.socks.get_mut(&listener) {
            s.stats.calls += 1;
        }
        r.c = self.socks.drain_if_empty(self.io, self.shared, listener);
        r
    }

    /// A `Connect` of socket `id` to `addr` (answered now, or parked until the host
    /// socket says how it ended); `false` when the channel parked more blocking
    /// requests on the socket than it may (it broke the protocol).
    pub(crate) fn connect(
        &mut self,
        ch: u32,
        id: u32,
        tag: u32,
        addr: WireAddr,
        nonblock: bool,
    ) -> bool {
        self.spares.connect_came();
        if let Some(c @ (Conn::Failed | Conn::FailReported)) = self.socks.get(&id).map(Sock::conn) {
            self.connect_after_failure(ch, id, tag, c == Conn::FailReported);
            return true;
        }
        let takes = self.channels.get(ch).is_some_and(|c| c.takes_handoff);
        let handoff = match self.placing().route_connect(id, addr) {
            Ok(h) => h && takes,
            Err(e) => {
                self.tx().done(ch, id, tag, e);
                return true;
            }
        };
        let to = addr.to_std();
        let mut fits = true;
        let Some(s) = self.socks.get_mut(&id) else {
            return true;
        };
        if s.is_stream() && s.conn() == Conn::Idle {
            // An unconnected stream has nothing to read (its first edge said EPOLLHUP):
            // input comes with an edge once it connects.
            s.rx.found_empty();
        }
        let r = self.io.connect(s.fd.as_fd(), &to);
        if handoff && tag != 0 {
            match r {
                Ok(()) => {
                    self.hand_off(ch, id, tag, 0);
                    return true;
                }
                Err(ref e) if e.raw_os_error() == Some(libc::EINPROGRESS) && nonblock => {
                    self.hand_off(ch, id, tag, Errno(libc::EINPROGRESS).wire());
                    return true;
                }
                // Blocking: parked below, handed off once connected (`end_connect`).
                Err(ref e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                    s.handoff = Handoff::WhenConnected;
                }
                Err(_) => {}
            }
        }
        match r {
            // The kernel gives the outcome of a connect in progress to whichever call
            // asks first: this one reports it, as a waiter of that connect would.
            Ok(()) | Err(_)
                if let Conn::Connecting { filled, .. } = s.conn()
                    && !already(&r) =>
            {
                fits = self.socks.park(id, Parked::Connect { ch, tag });
                self.end_connect(id, filled, r.err().map_or(0, |e| Errno::of(&e).0));
            }
            Ok(()) => {
                if s.is_stream() {
                    s.conn_moves(ConnEvent::Connected);
                }
                self.tx().done(ch, id, tag, 0);
            }
            Err(ref e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                s.conn_moves(ConnEvent::InProgress(to));
                if nonblock {
                    self.tx().done(ch, id, tag, Errno(libc::EINPROGRESS));
                } else {
                    fits = self.socks.park(id, Parked::Connect { ch, tag });
                }
            }
            Err(e) => self.tx().done(ch, id, tag, Errno::of(&e)),
        }
        if self.modules.has_rules() {
            self.tx().apply_rule(id, ModuleTarget::Dest(to));
        }
        fits
    }

    /// Stream `id`, connected or connecting (`result`: 0 or `-EINPROGRESS`) to a
    /// `--handoff` destination, leaves the server: the connect is answered with
    /// `CMP_HANDOFF`, and the host socket follows at once on the control socket of the
    /// same channel (`CtlKind::Handoff`; that channel's process holds the socket: it
    /// made the connect, `may_use`), where the shim takes it — one round trip. The
    /// server forgets the socket id; dropping it closes the server's descriptor and its
    /// pair end, and a bond's lease counts the connection as ended (its bytes are the
    /// kernel's now).
    fn hand_off(&mut self, ch: u32, id: u32, tag: u32, result: i32) {
        let mut c = Cmp::new(CmpKind::Done, id, tag, result);
        c.flags |= CMP_HANDOFF;
        self.tx().complete(ch, c);
        let Some(s) = self.socks.remove(&id) else {
            return;
        };
        // The host socket's file lives on in the program: out of the event loop by hand.
        // The pair's end is the server's alone, so closing it (below) takes it out.
        let _ = self.epoll.delete(s.fd.as_fd());
        self.shared.socket_closed();
        self.stats.closed_socket(s.stats);
        debug!("socket {id}: handed off");
        let msg = Ctl::new(CtlKind::Handoff, id);
        self.channels.send_reply(self.io, ch, msg, &[s.fd.as_fd()]);
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
            self.tx().complete(ch, c);
            return;
        }
        s.conn_moves(ConnEvent::Reported);
        let e = match std::mem::take(&mut s.so_error) {
            0 => libc::ECONNABORTED,
            e => e,
        };
        let _ = io.connect_unspec(s.fd.as_fd());
        self.tx().done(ch, id, tag, Errno(e));
    }

    /// Stream `id`'s connect in progress (to `to`, the program's end of the pair
    /// `filled` meanwhile) has ended: its outcome goes to the connect that waits for it,
    /// else is kept for the program's `SO_ERROR`; see [`Conn`]'s table.
    pub(crate) fn connect_ended(&mut self, id: u32, to: SocketAddr, filled: bool) {
        let io = self.io;
        let Some(s) = self.socks.get(&id) else {
            return;
        };
        let waited = s.parked.iter().any(|p| matches!(p, Parked::Connect { .. }));
        let err = if waited {
            // A blocking connect waits: one more connect gives its outcome and finishes
            // the kernel's side as the program's own call would (a second connect then
            // says EISCONN; a failed one leaves the socket unconnected, to connect
            // again), in one call where SO_ERROR, getpeername and a connect took three.
            match io.connect(s.fd.as_fd(), &to) {
                // An edge from before the connect: the next one ends it.
                ref r if already(r) => return,
                Ok(()) => 0,
                Err(e) => Errno::of(&e).0,
            }
        } else if matches!(io.sock_addr(s.fd.as_fd(), true), Ok(Some(_))) {
            // A peer is proof of a connection, in one call (the kernel names one from
            // the handshake's end until the connection is closed); an error that came
            // after it stays for the program's next call, as the kernel's would.
            0
        } else {
            match io.getsockopt_int(s.fd.as_fd(), libc::SOL_SOCKET, libc::SO_ERROR) {
                // No error kept is no proof of a failure's cause: another call (a
                // receive, a getsockopt) may have taken it. Without a peer the kernel's
                // next connect says ECONNABORTED, and so does this one's outcome.
                Ok(0) => libc::ECONNABORTED,
                Ok(e) => e,
                Err(_) => libc::EIO,
            }
        };
        self.end_connect(id, filled, err);
    }

    /// Stream `id`'s connect in progress has ended with `err` (0: connected), the
    /// kernel's side finished by the connect call that said so when one waits: see
    /// [`Self::connect_ended`].
    fn end_connect(&mut self, id: u32, filled: bool, err: i32) {
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
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
        s.so_error = if reported { 0 } else { err };
        s.conn_moves(if err == 0 {
            ConnEvent::Succeeded
        } else {
            ConnEvent::Refused
        });
        let outcome = match err {
            0 => Ok(()),
            e => Err(Errno(e)),
        };
        let handing = std::mem::take(&mut s.handoff) == Handoff::WhenConnected;
        if handing
            && err == 0
            && let Some(&(ch, tag)) = waiters.first()
        {
            self.hand_off(ch, id, tag, 0);
            return;
        }
        for (ch, tag) in waiters {
            self.tx().done(ch, id, tag, outcome);
        }
        if filled && err != 0 && !reported {
            // A non-blocking connect failed: POLLERR|POLLHUP, as the kernel's.
            self.tx().detach_pair(id);
        } else if filled {
            // The connect has ended: the program's end polls writable again.
            self.tx().drain_filler(id);
        }
    }

    /// A `Listen` on socket `id`; `Ok(true)` when connections of a published port
    /// already wait for it (the caller runs its input event).
    pub(crate) fn listen(&mut self, id: u32, backlog: i32) -> Result<bool, Errno> {
        let io = self.io;
        if self.placing().on_host(id) {
            warn!(
                "socket {id}: listen refused: the socket is bound to a host address, and only -p publishes a port"
            );
            self.stats.denied += 1;
            return Err(Errno(libc::EACCES));
        }
        self.placing().place_for(id, true)?;
        let shared = self.shared.clone();
        let s = self.socks.get_mut(&id).ok_or(Errno(libc::EBADF))?;
        match io.listen(s.fd.as_fd(), backlog) {
            Ok(()) => {
                if !s.listening()
                    && let Ok(Some(a)) = io.sock_addr(s.fd.as_fd(), false)
                {
                    let wildcard = a.ip().is_unspecified();
                    shared.listener_up(a.port(), wildcard);
                    s.listens_on = Some((a.port(), wildcard));
                }
                s.conn_moves(ConnEvent::Listen);
                Ok(self.socks.has_published(self.io, self.shared, id))
            }
            Err(e) => Err(Errno::of(&e)),
        }
    }

    /// A new socket served by server `server` (not registered anywhere yet), made by or
    /// for `owner`; `kind` is (domain, type, protocol). Makes its readiness pair: the
    /// program's end comes back beside the socket, for the reply that gives it to the
    /// program.
    pub(crate) fn new_sock(
        &self,
        server: usize,
        fd: OwnedFd,
        kind: (i32, i32, i32),
        place: Place,
        owner: Owner,
    ) -> io::Result<(Sock, OwnedFd)> {
        let id = self.shared.new_id(server);
        let NewPair { ours, theirs, name } = self.io.new_pair(id)?;
        let sock = Sock::new(id, kind, fd, place, (ours, name), owner);
        Ok((sock, theirs))
    }

    /// Serves `sock` here, or hands it to its server; returns its id. The hand-over
    /// happens before the caller tells the shim the id (see [`crate::group`]).
    pub(crate) fn place_sock(&mut self, sock: Sock) -> io::Result<u32> {
        let id = sock.id;
        let server = ferry_proto::server_of(id);
        if server == self.index {
            self.socks.install(self.epoll, sock)?;
        } else {
            self.stats.sockets_handed += 1;
            self.shared.inbox[server].send(Msg::Sock(Box::new(sock)));
        }
        Ok(id)
    }
}

/// The host's answer to a second connect while one is in progress says it still is.
fn already(r: &std::io::Result<()>) -> bool {
    r.as_ref()
        .is_err_and(|e| matches!(e.raw_os_error(), Some(libc::EALREADY | libc::EINPROGRESS)))
}
