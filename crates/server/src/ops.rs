//! What each request does to a host socket, and what host readiness does to parked
//! requests and readiness tokens.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use ferry_proto::{
    CMP_DRAIN_TOKEN, CMP_RENEW_PAIR, Cmp, CmpKind, Ctl, CtlKind, NO_BUF, Op, REQ_FILLED,
    REQ_NONBLOCK, Request, WireAddr, cmsg,
};
use ferry_ring::BufId;
use tracing::{debug, warn};

use crate::policy::Verdict;
use crate::seam::Io;
use crate::server::Server;
use crate::sock::{Conn, PairEnd, Parked, Place, Sock, Token, TxItem};
use crate::sockopt;

/// Most operations one channel may have waiting on one socket (a shim has one).
const MAX_PARKED_PER_CHANNEL: usize = 4;

/// Most buffers one receive fills.
const MAX_RECV_BUFS: usize = 4;

pub(crate) fn errno(e: &io::Error) -> i32 {
    -e.raw_os_error().unwrap_or(libc::EIO)
}

/// `a` as a socket of family `domain` shows it. A connection accepted on a dual-stack
/// published port is an IPv6 socket on the host, handed to the sandbox's listener: for an
/// IPv4 listener an IPv4 client's ::ffff:a.b.c.d is a.b.c.d, and an IPv6 client (which
/// an IPv4 listener could not have natively) shows as 0.0.0.0 with its port — never as a
/// loopback address a program might trust.
fn in_family(domain: i32, a: SocketAddr) -> SocketAddr {
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
            let x = u128::from(v6);
            (x as u64) ^ (x >> 64) as u64
        }
    };
    ip << 16 | u64::from(a.port())
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// `rx_pair`: the server's buffer for host bytes on their way into a pair.
const RX_SCRATCH: usize = 64 * 1024;
/// `rx_pair`: bytes per splice of a bulk stream (host socket → pipe → pair). Not more
/// than a pair usually takes at once: what it does not take is copied out of the pipe.
const RX_SPLICE: usize = 64 * 1024;
/// `rx_pair`: a splice that moves less than this ends a stream's bulk mode.
const SPLICE_MIN: usize = 16 * 1024;
/// Most bytes the program wrote into its pair that one host send takes.
const PAIR_INPUT_CHUNK: usize = 64 * 1024;
/// `rx_pair`: the server's pipe (pages, not bytes, are what a splice fills: room for
/// many small segments).
const RX_PIPE: usize = 1 << 20;

/// One splice of bulk stream `s`: host socket → `pipe` (read end, write end) → pair.
/// What the pair does not take is read out of the pipe (through `buf`) into
/// `s.rx_pending`, so the pipe is empty for the next socket; `true` when that failed
/// (not expected: the pipe holds those bytes) — the stream has lost them (`EIO`) and
/// the pipe must not serve another.
fn splice_bulk(
    io: &dyn Io,
    s: &mut Sock,
    (pr, pw): &(OwnedFd, OwnedFd),
    buf: &mut [u8],
) -> (io::Result<usize>, bool) {
    let r = io.splice(s.fd.as_fd(), pw.as_fd(), RX_SPLICE);
    let Ok(n @ 1..) = r else {
        return (r, false);
    };
    let moved = io.splice(pr.as_fd(), s.pair.as_fd(), n).unwrap_or(0);
    let mut rest = n - moved.min(n);
    while rest > 0 {
        match io.read(pr.as_fd(), &mut buf[..rest.min(RX_SCRATCH)]) {
            Ok(k @ 1..) => {
                s.rx_pending.extend_from_slice(&buf[..k]);
                rest -= k;
            }
            _ => return (Err(io::Error::from_raw_os_error(libc::EIO)), true),
        }
    }
    s.rx_bulk = n >= SPLICE_MIN;
    (r, false)
}

impl Server {
    /// Queues a completion on channel `ch` (dropped if the channel is gone). A buffer
    /// coming back is room for the channel's next send: sockets waiting for it become
    /// writable again.
    fn complete(&mut self, ch: u32, c: Cmp) {
        let Some(chan) = self.chan_mut(ch) else {
            return;
        };
        chan.complete(c);
        if c.kind == CmpKind::BufReturn as u16 && !chan.room_wait.is_empty() {
            // Published before the fd turns writable: the woken program must find it.
            chan.flush();
            for id in std::mem::take(&mut chan.room_wait) {
                self.drain_filler(id);
            }
        }
    }

    /// `WantRoom`: the shim filled socket `id`'s readiness pair after finding no free
    /// buffer in channel `ch`, having seen `seen` of its `BufReturn`s by then. Empties
    /// the pair at once if a buffer has come back since (the shim will find it), else
    /// at the channel's next `BufReturn`. So no wake-up is lost whichever comes first.
    fn want_room(&mut self, ch: u32, id: u32, seen: u32) {
        let Some(chan) = self.chan_mut(ch) else {
            return;
        };
        if chan.returns != seen {
            chan.flush();
            self.drain_filler(id);
        } else if !chan.room_wait.contains(&id) {
            // At most one entry per socket of this server: bounded.
            chan.room_wait.push(id);
        }
    }

    /// Reads and discards the filler the shim wrote into socket `id`'s readiness pair,
    /// so that the program's end is writable again. On a connected stream of the pair
    /// path, the program's own bytes before the filler's marker go out first
    /// ([`Server::pair_input`]), which drains the filler when it reaches the mark. One
    /// read, larger than the filler the shim writes: a loop of reads could also take the
    /// filler of the program's *next* `EAGAIN` (written as soon as the first read makes
    /// the fd writable) and leave the fd writable with no room behind it (a read also
    /// stops at the next filler's marker). Bounded work: a sandbox that enlarged its
    /// end's send buffer keeps its own fd unwritable, nothing more.
    pub(crate) fn drain_filler(&mut self, id: u32) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if s.takes_pair_input(io) && !io.at_mark(s.pair.as_fd()).unwrap_or(false) {
            // The program's own bytes stand before the filler: they go first.
            s.filler_due = true;
            self.pair_input(id);
            return;
        }
        Self::drain_filler_now(io, s);
    }

    fn drain_filler_now(io: &dyn Io, s: &mut Sock) {
        let mut buf = [0u8; 16 << 10];
        let _ = io.discard(s.pair.as_fd(), &mut buf);
        s.stats.room_waits += 1;
    }

    fn done(&mut self, ch: u32, sock: u32, tag: u32, result: i32) {
        if tag != 0 {
            self.complete(ch, Cmp::new(CmpKind::Done, sock, tag, result));
        } else if result < 0 {
            self.complete(ch, Cmp::new(CmpKind::AsyncError, sock, 0, result));
        }
    }

    /// A control message (socket creation, accept, claim). Errors here go back to the
    /// shim. Descriptors a message does not carry are closed.
    pub(crate) fn control(&mut self, ch: u32, msg: Ctl, mut fds: Vec<OwnedFd>) {
        let Some(kind) = msg.kind() else {
            self.bad_channel(ch, "control message of an unknown kind");
            return;
        };
        match kind {
            CtlKind::Socket => match self.create_socket(ch, msg.a, msg.b, msg.c) {
                Ok((id, theirs)) => self.ctl_reply_fd(ch, Server::new_reply(id as i32), theirs),
                Err(e) => self.ctl_reply(ch, Server::new_reply(e)),
            },
            CtlKind::Accept if self.may_use(ch, msg.sock) => self.accept(ch, msg.sock, msg.a != 0),
            CtlKind::Accept => self.ctl_reply(ch, Server::new_reply(-libc::EBADF)),
            CtlKind::Claim => {
                let result = match fds.pop() {
                    Some(fd) if fds.is_empty() => self.claim(ch, msg.sock, fd),
                    _ => -libc::EINVAL,
                };
                self.ctl_reply(ch, Server::new_reply(result));
            }
            CtlKind::Renew => {
                let renewed = match fds.pop() {
                    Some(fd) if fds.is_empty() => match self.claim(ch, msg.sock, fd) {
                        0 => self.renew_pair(msg.sock),
                        e => Err(e),
                    },
                    _ => Err(-libc::EINVAL),
                };
                match renewed {
                    Ok(theirs) => self.ctl_reply_fd(ch, Server::new_reply(0), theirs),
                    Err(e) => self.ctl_reply(ch, Server::new_reply(e)),
                }
            }
            CtlKind::Reply => self.bad_channel(ch, "reply sent by the sandbox"),
            CtlKind::BindModule
            | CtlKind::Files
            | CtlKind::RegisterFile
            | CtlKind::UnregisterFile => {
                unreachable!("routed to the modules by ctl_readable")
            }
        }
    }

    /// Whether channel `ch`'s process may act on socket `id` (it made, accepted or
    /// claimed it). An unknown socket counts as usable here: the operation then finds
    /// no socket and says `EBADF` itself.
    pub(crate) fn may_use(&self, ch: u32, id: u32) -> bool {
        let (Some(c), Some(s)) = (self.chan(ch), self.socks.get(&id)) else {
            return true;
        };
        s.held_by(c.owner)
    }

    /// `CtlKind::Claim`: channel `ch`'s process shows `fd` to prove it holds socket `id`.
    /// The proof holds when `fd` is a unix stream socket of the server's own network
    /// namespace (the sandbox cannot make one) bound to the socket's name (which only
    /// the program's end of its pair has: names are never used twice). Then the process
    /// may act on the socket from now on.
    fn claim(&mut self, ch: u32, id: u32, fd: OwnedFd) -> i32 {
        let io = self.io;
        let Some(owner) = self.chan(ch).map(|c| c.owner) else {
            return -libc::EBADF;
        };
        let Some(s) = self.socks.get_mut(&id) else {
            return -libc::EBADF;
        };
        let mut name = [0u8; 107];
        let named = io
            .abstract_name(fd.as_fd(), &mut name)
            .ok()
            .flatten()
            .is_some_and(|n| name[..n] == s.name.0[..s.name.1]);
        let ours = match (io.netns_cookie(fd.as_fd()), io.netns_cookie(s.pair.as_fd())) {
            (Ok(a), Ok(b)) => a == b,
            // Kernels before 5.14: the name alone (made in a namespace the sandbox
            // cannot bind in, but a program that saw it could bind it in its own).
            _ => true,
        };
        let stream = io
            .getsockopt_int(fd.as_fd(), libc::SOL_SOCKET, libc::SO_TYPE)
            .is_ok_and(|t| t == libc::SOCK_STREAM);
        if !(named && ours && stream) {
            if let Some(n) = self.strangers.tick() {
                warn!(
                    "socket {id}: pid {} claimed it with a descriptor that is not the socket's; refused ({n} such requests since the last line)",
                    owner.pid
                );
            }
            self.stats.denied += 1;
            return -libc::EBADF;
        }
        s.add_holder(owner);
        0
    }

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
    fn create_socket(
        &mut self,
        ch: u32,
        domain: i32,
        ty: i32,
        protocol: i32,
    ) -> Result<(u32, OwnedFd), i32> {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return Err(-libc::EAFNOSUPPORT);
        }
        if ty != libc::SOCK_STREAM && ty != libc::SOCK_DGRAM {
            return Err(-libc::EPROTONOSUPPORT);
        }
        let owner = self.chan(ch).ok_or(-libc::EBADF)?.owner;
        let _slot = self.socket_slot()?;
        let fd = self
            .io
            .socket(domain, ty, protocol)
            .map_err(|e| errno(&e))?;
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
            .map_err(|e| errno(&e))?;
        sock.rx_pair = ty == libc::SOCK_STREAM && self.chan(ch).is_some_and(|c| c.rx_pair);
        let id = self.place_sock(sock).map_err(|e| errno(&e))?;
        std::mem::forget(_slot);
        self.stats.sockets_created += 1;
        Ok((id, theirs))
    }

    /// One of the sandbox's sockets (`Config::max_sockets`), given back when the guard
    /// drops unless it is forgotten (the socket was made: `settle_dirty` gives it back
    /// when the socket goes).
    fn socket_slot(&mut self) -> Result<SocketSlot, i32> {
        if self.shared.take_socket(self.cfg.max_sockets) {
            return Ok(SocketSlot(self.shared.clone()));
        }
        if let Some(n) = self.refusals.tick() {
            warn!(
                "the sandbox has {} sockets open (--max-sockets): a new one is refused with ENFILE ({n} since the last line)",
                self.cfg.max_sockets
            );
        }
        self.stats.denied += 1;
        Err(-libc::ENFILE)
    }

    fn accept(&mut self, ch: u32, id: u32, nonblock: bool) {
        let Some(s) = self.sock(id) else {
            self.ctl_reply(ch, Server::new_reply(-libc::EBADF));
            return;
        };
        if !s.listening() {
            self.ctl_reply(ch, Server::new_reply(-libc::EINVAL));
            return;
        }
        match self.try_accept(id) {
            Ok(a) => self.finish_accept(ch, id, a),
            Err(e) if would_block(&e) && !nonblock => {
                self.park(id, Parked::Accept { ch });
            }
            Err(e) => {
                let mut r = Server::new_reply(errno(&e));
                if would_block(&e) {
                    r.c = self.drain_token(id);
                }
                self.ctl_reply(ch, r);
            }
        }
    }

    /// A connection waiting on listener `id`: one its host socket accepted, else one
    /// of a published port that feeds it (then the port comes too).
    fn try_accept(&mut self, id: u32) -> io::Result<Accepted> {
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

    fn finish_accept(&mut self, ch: u32, listener: u32, accepted: Accepted) {
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
        // A connection from a published port with a module rule stays here: the rule is
        // applied by this server, right after the accept.
        let module_port = published.is_some_and(|p| self.modules.has_port_rule(p));
        let server = match self.shared.accepted {
            crate::Accepted::Listener => self.index,
            _ if module_port => self.index,
            crate::Accepted::Assign => self.assign(ch, peer.map_or(0, |p| addr_key(&p))),
        };
        let made = self.new_sock(server, conn, (domain, libc::SOCK_STREAM, 0), place, owner);
        let (mut sock, theirs) = match made {
            Ok(made) => made,
            Err(e) => {
                self.ctl_reply(ch, Server::new_reply(errno(&e)));
                return;
            }
        };
        sock.conn = Conn::Connected;
        sock.rx_pair = self.chan(ch).is_some_and(|c| c.rx_pair);
        if server == self.index {
            sock.last_ch = ch;
        }
        match self.place_sock(sock) {
            Ok(new) => {
                std::mem::forget(slot);
                let mut r = Server::new_reply(new as i32);
                if let Some(p) = peer {
                    r.addr_len = WireAddr::from(p).encode(&mut r.addr) as u32;
                }
                if let Some(s) = self.sock(listener) {
                    s.stats.calls += 1;
                }
                r.c = self.drain_if_empty(listener);
                if let Some(port) = published {
                    self.module_on_accept(new, port);
                }
                self.ctl_reply_fd(ch, r, theirs);
            }
            Err(e) => self.ctl_reply(ch, Server::new_reply(errno(&e))),
        }
    }

    /// One validated ring request. `Err` means the channel broke the protocol.
    pub(crate) fn handle(&mut self, ch: u32, req: Request) -> Result<(), String> {
        let io = self.io;
        let r = req.raw;
        if req.op == Op::BufReturn {
            let chan = self.chan_mut(ch).ok_or("no channel")?;
            return chan.ep.pool.free(BufId(r.buf)).map_err(|e| e.to_string());
        }
        if !self.socks.contains_key(&r.sock) && ferry_proto::server_of(r.sock) == self.index {
            // Handed over by another server, maybe not taken yet.
            self.drain_inbox();
        }
        if req.op == Op::SendCtl {
            // Kept for the next `Send` from this channel (the shim sends them in a row).
            let chan = self.chan_mut(ch).ok_or("no channel")?;
            let bytes = req.value();
            if r.a as usize != chan.send_ctl.len()
                || chan.send_ctl.len() + bytes.len() > cmsg::MAX_CONTROL
            {
                return Err(format!(
                    "control bytes at offset {} after {}",
                    r.a,
                    chan.send_ctl.len()
                ));
            }
            chan.send_ctl.extend_from_slice(bytes);
            return Ok(());
        }
        if req.op == Op::Send {
            return self.send(ch, req);
        }
        if req.op == Op::BindModule {
            // Ordered with the sends before it; they go out before the module's output.
            self.flush_pending();
            return self.bind_module_req(ch, req);
        }
        // Program order across sockets: what this pass queued goes out before an
        // operation that may observe it (a recv on the loopback peer, a connect…).
        self.flush_pending();
        if req.op == Op::Release {
            // Closed already, or closing now: either way `close` may return.
            if self.app_gone(r.sock) {
                self.app_closed(r.sock);
                self.settle_dirty();
            }
            self.done(ch, r.sock, r.tag, 0);
            return Ok(());
        }
        if !self.may_use(ch, r.sock) {
            self.not_holder(ch, r.sock);
            self.done(ch, r.sock, r.tag, -libc::EBADF);
            return Ok(());
        }
        let Some(s) = self.sock(r.sock) else {
            self.done(ch, r.sock, r.tag, -libc::EBADF);
            return Ok(());
        };
        s.stats.calls += 1;
        s.last_ch = ch;
        if !s.txq.is_empty() {
            // Operations on a socket happen in order: sends queued earlier in this pass
            // go out before, say, a getsockname that must see the port they bound.
            self.flush_tx(r.sock);
        }
        let nonblock = r.flags & REQ_NONBLOCK != 0;
        let id = r.sock;
        match req.op {
            Op::Disconnect => {
                let s = self.sock(id).expect("checked above");
                let res = if s.is_stream() {
                    -libc::EAFNOSUPPORT
                } else {
                    io.connect_unspec(s.fd.as_fd())
                        .map_or_else(|e| errno(&e), |()| 0)
                };
                self.done(ch, id, r.tag, res);
            }
            Op::Connect => {
                let addr = req
                    .addr()
                    .map_err(|e| e.to_string())?
                    .ok_or("connect without address")?;
                self.connect(ch, id, r.tag, addr, nonblock);
                if r.flags & REQ_FILLED != 0 {
                    // Unwritable while connecting, as the kernel's socket: the filler
                    // goes when the connect ends (now, or at its completion).
                    match self.socks.get_mut(&id).map(|s| &mut s.conn) {
                        Some(Conn::Connecting { filled, .. }) if nonblock => *filled = true,
                        _ => self.drain_filler(id),
                    }
                }
            }
            Op::Bind => {
                let addr = req
                    .addr()
                    .map_err(|e| e.to_string())?
                    .ok_or("bind without address")?;
                let res = self.bind(id, addr.to_std());
                self.done(ch, id, r.tag, res);
            }
            Op::Listen => {
                let res = self.listen(id, r.a as i32);
                self.done(ch, id, r.tag, res);
            }
            Op::Recv => self.recv(ch, id, r.tag, r.a, r.b as i32, nonblock),
            Op::Shutdown => {
                let how = r.a as i32;
                // A module's output goes before the FIN; its input ends here.
                let module = self.modules.is_bound(id);
                if how != libc::SHUT_RD {
                    // What the program wrote into the pair itself goes before the FIN.
                    self.pair_input(id);
                }
                let s = self.sock(id).expect("checked above");
                let res = if (how == libc::SHUT_WR || how == libc::SHUT_RDWR)
                    && (!s.txq.is_empty() || s.pair_in_wait || module)
                {
                    s.shut_wr_pending = true;
                    if how == libc::SHUT_RDWR {
                        io.shutdown(s.fd.as_fd(), libc::SHUT_RD)
                            .map_or_else(|e| errno(&e), |()| 0)
                    } else {
                        0
                    }
                } else {
                    io.shutdown(s.fd.as_fd(), how)
                        .map_or_else(|e| errno(&e), |()| 0)
                };
                self.done(ch, id, r.tag, res);
                if module {
                    self.flush_tx(id);
                }
            }
            Op::SetOpt => {
                let s = self.sock(id).expect("checked above");
                let (level, name) = (r.a as i32, r.b as i32);
                let value = req.value().to_vec();
                let sticky_source = (level, name) == (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                    && s.place != Place::Sandbox;
                let refused = sockopt::refused(level, name, &value).map(str::to_owned);
                let refused = match cmsg::in6_pktinfo(&value).filter(|_| sticky_source) {
                    Some((index, ip)) if refused.is_none() => {
                        crate::reach::source_refused(&mut self.host_addrs, index, ip)
                    }
                    _ => refused,
                };
                let s = self.sock(id).expect("checked above");
                let res = if let Some(why) = refused {
                    if (level, name) == (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) {
                        // Tried by every `curl --interface` (it falls back to the
                        // interface's address, as for an unprivileged user): refused
                        // quietly.
                        debug!("socket {id}: SO_BINDTODEVICE refused: {why}");
                    } else {
                        warn!("socket {id}: setsockopt({level}, {name}) refused: {why}");
                    }
                    -libc::EPERM
                } else {
                    io.setsockopt(s.fd.as_fd(), level, name, &value)
                        .map_or_else(|e| errno(&e), |()| 0)
                };
                if res == 0 {
                    // Kept for a move (one value per option: bounded).
                    s.opts.retain(|(l, n, _)| (*l, *n) != (level, name));
                    s.opts.push((level, name, value));
                }
                self.done(ch, id, r.tag, res);
            }
            Op::GetOpt => self.getopt(ch, id, r.tag, r.a as i32, r.b as i32, r.len),
            Op::SockName | Op::PeerName => {
                let s = self.sock(id).expect("checked above");
                let domain = s.domain;
                let c = match io.sock_addr(s.fd.as_fd(), req.op == Op::PeerName) {
                    Ok(Some(a)) => {
                        let a = in_family(domain, a);
                        Cmp::new(CmpKind::Done, id, r.tag, 0).with_addr(&WireAddr::from(a))
                    }
                    Ok(None) => Cmp::new(CmpKind::Done, id, r.tag, -libc::EINVAL),
                    Err(e) => Cmp::new(CmpKind::Done, id, r.tag, errno(&e)),
                };
                self.complete(ch, c);
            }
            Op::Pending => {
                let s = self.sock(id).expect("checked above");
                let res = io.pending_bytes(s.fd.as_fd()).unwrap_or_else(|e| errno(&e));
                self.done(ch, id, r.tag, res);
            }
            Op::WantToken => {
                let s = self.sock(id).expect("checked above");
                if s.token == Token::Unwanted {
                    s.token = Token::Wanted;
                }
                self.maybe_token(id);
            }
            Op::TokenDrained => {
                let s = self.sock(id).expect("checked above");
                if s.token_out() {
                    s.token = Token::Wanted;
                }
                self.maybe_token(id);
            }
            Op::WantRoom => self.want_room(ch, id, r.a),
            Op::Cancel => {
                let tag = r.a;
                if let Some(p) = self.unpark(id, |p| p.owner() == (ch, tag)) {
                    debug!("socket {id}: cancelled {p:?}");
                    self.done(ch, id, tag, -libc::EINTR);
                }
            }
            Op::Send | Op::SendCtl | Op::BufReturn | Op::Release | Op::BindModule => {
                unreachable!("handled above")
            }
        }
        Ok(())
    }

    /// A channel named a socket its process does not hold: refused (`EBADF`), logged.
    fn not_holder(&mut self, ch: u32, id: u32) {
        let pid = self.chan(ch).map_or(0, |c| c.owner.pid);
        if let Some(n) = self.strangers.tick() {
            warn!(
                "socket {id}: pid {pid} does not hold it (never made, accepted or claimed it); refused ({n} such requests since the last line)"
            );
        }
        self.stats.denied += 1;
    }

    /// Whether socket `id` lives on the host already (bound to a host address, or
    /// connected or sent from before): local destinations would be the host's own.
    fn on_host(&self, id: u32) -> bool {
        self.socks.get(&id).is_some_and(|s| s.place == Place::Host)
    }

    fn host_loopback_refused(&mut self, id: u32, what: &str, to: WireAddr) {
        warn!(
            "socket {id}: {what} to {} refused: the socket is on the host, where that address is the host's own (never reachable from a sandbox)",
            to.to_std()
        );
        self.stats.denied += 1;
    }

    /// Why a datagram's control messages may not go out from socket `id`, if they may
    /// not: on the host, a source must be one of the host's addresses, with no
    /// interface chosen (`reach.rs`). Inside the sandbox its own kernel judges.
    fn source_refused(&mut self, id: u32, control: &[u8]) -> Option<String> {
        if control.is_empty() || self.socks.get(&id)?.place == Place::Sandbox {
            return None;
        }
        cmsg::sources(control)
            .find_map(|(index, ip)| crate::reach::source_refused(&mut self.host_addrs, index, ip))
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
    fn move_to_host(&mut self, id: u32) -> Result<(), i32> {
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
            .map_err(|e| errno(&e))?;
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
            io.bind(fd.as_fd(), &any(0)).map_err(|e| errno(&e))?;
            debug!("socket {id}: port {had} is taken on the host; another one is used");
        }
        self.replace_host_fd(id, fd, Place::Host)
            .map_err(|e| errno(&e))?;
        let s = self.sock(id).expect("looked up above");
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
    fn place_for(&mut self, id: u32, local: bool) -> Result<(), i32> {
        let io = self.io;
        let s = self.socks.get(&id).ok_or(-libc::EBADF)?;
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
                .map_err(|e| errno(&e))?;
            io.set_nonblocking(fd.as_fd(), true)
                .map_err(|e| errno(&e))?;
            self.replace_host_fd(id, fd, Place::Sandbox)
                .map_err(|e| errno(&e))?;
        } else if let Some(s) = self.sock(id) {
            s.place = Place::Host;
        }
        Ok(())
    }

    fn connect(&mut self, ch: u32, id: u32, tag: u32, addr: WireAddr, nonblock: bool) {
        let io = self.io;
        if let Some(s) = self.sock(id)
            && let Conn::Failed { reported } = s.conn
        {
            if !reported {
                s.conn = Conn::Failed { reported: true };
                // The connect after a failed non-blocking one reports the failure (its
                // error, or ECONNABORTED once SO_ERROR has taken it), and the kernel puts
                // the socket back to unconnected.
                let e = match std::mem::take(&mut s.so_error) {
                    0 => libc::ECONNABORTED,
                    e => e,
                };
                let _ = io.connect_unspec(s.fd.as_fd());
                self.done(ch, id, tag, -e);
            } else {
                // Connecting again: the program's end of the pair must be renewed first.
                let mut c = Cmp::new(CmpKind::Done, id, tag, -libc::ECONNABORTED);
                c.flags |= CMP_RENEW_PAIR;
                self.complete(ch, c);
            }
            return;
        }
        let local = addr.is_local();
        if local && self.on_host(id) {
            self.host_loopback_refused(id, "connect", addr);
            self.done(ch, id, tag, -libc::EACCES);
            return;
        }
        if !local && self.cfg.policy.check(&addr.to_std()) == Verdict::Deny {
            warn!("socket {id}: connect to {} denied by policy", addr.to_std());
            self.stats.denied += 1;
            self.done(ch, id, tag, -libc::EACCES);
            return;
        }
        if !local && let Err(e) = self.move_to_host(id) {
            self.done(ch, id, tag, e);
            return;
        }
        if let Err(e) = self.place_for(id, local) {
            self.done(ch, id, tag, e);
            return;
        }
        let s = self.sock(id).expect("placed above");
        if let Some(c) = s.contacted.as_mut() {
            remember(c, addr.to_std());
        }
        if s.place == Place::Sandbox && !local && s.ty == libc::SOCK_STREAM {
            // Bound inside the sandbox, now asked to leave it: the sandbox has no route.
            self.done(ch, id, tag, -libc::ENETUNREACH);
            return;
        }
        if let Err(e) = self.bond_source(id, addr.to_std()) {
            self.done(ch, id, tag, e);
            return;
        }
        let s = self.sock(id).expect("placed above");
        match io.connect(s.fd.as_fd(), &addr.to_std()) {
            Ok(()) => {
                if s.is_stream() {
                    s.conn = Conn::Connected;
                }
                self.done(ch, id, tag, 0);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                s.conn = Conn::Connecting {
                    to: addr.to_std(),
                    filled: false,
                };
                if nonblock {
                    self.done(ch, id, tag, -libc::EINPROGRESS);
                } else {
                    self.park(id, Parked::Connect { ch, tag });
                }
            }
            Err(e) => self.done(ch, id, tag, errno(&e)),
        }
        self.module_on_connect(id, addr.to_std());
    }

    fn bind(&mut self, id: u32, addr: SocketAddr) -> i32 {
        let io = self.io;
        let local = WireAddr::from(addr).is_local();
        if !local {
            if !self.host_addrs.owns(addr.ip()) {
                debug!("socket {id}: bind to {addr}: not an address of the host");
                return -libc::EADDRNOTAVAIL;
            }
            if self.socks.get(&id).is_some_and(|s| !s.is_stream()) && addr.port() != 0 {
                warn!(
                    "socket {id}: bind to {addr} refused: a datagram socket with a fixed port on a host address would receive from the network (publish it with -p HOST_PORT:PORT/udp)"
                );
                self.stats.denied += 1;
                return -libc::EACCES;
            }
        }
        if let Err(e) = self.place_for(id, local) {
            return e;
        }
        let wild = WireAddr::from(addr).is_unspecified().then_some(addr.port());
        let s = self.sock(id).expect("placed above");
        match io.bind(s.fd.as_fd(), &addr) {
            Ok(()) => {
                s.bound_wild = wild;
                0
            }
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && self.reap_closed() > 0 => {
                // A socket the sandbox already closed may still hold the port: the hang-up
                // of its readiness pair was not processed yet. Now it is; try again.
                let s = self.sock(id).expect("placed above");
                io.bind(s.fd.as_fd(), &addr)
                    .map_or_else(|e| errno(&e), |()| 0)
            }
            Err(e) => errno(&e),
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

    fn listen(&mut self, id: u32, backlog: i32) -> i32 {
        let io = self.io;
        if self.on_host(id) {
            warn!(
                "socket {id}: listen refused: the socket is bound to a host address, and only -p publishes a port"
            );
            self.stats.denied += 1;
            return -libc::EACCES;
        }
        if let Err(e) = self.place_for(id, true) {
            return e;
        }
        let shared = self.shared.clone();
        let s = self.sock(id).expect("placed above");
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
                0
            }
            Err(e) => errno(&e),
        }
    }

    fn getopt(&mut self, ch: u32, id: u32, tag: u32, level: i32, name: i32, len: u32) {
        let io = self.io;
        let s = self.sock(id).expect("caller checked");
        if level == libc::SOL_SOCKET && name == libc::SO_ERROR {
            // While a connect is in progress the answer is 0, as the kernel's: the
            // host socket's error is taken by the server when the connect ends (and
            // kept here for this call), and only then does the fd poll writable.
            let err = std::mem::take(&mut s.so_error);
            let err = if err != 0 || s.connecting() {
                err
            } else {
                io.getsockopt_int(s.fd.as_fd(), level, name).unwrap_or(0)
            };
            let c = Cmp::new(CmpKind::Done, id, tag, 0).with_bytes(&err.to_ne_bytes());
            self.complete(ch, c);
            return;
        }
        let mut val = vec![0u8; (len as usize).clamp(1, 1024)];
        match io.getsockopt(s.fd.as_fd(), level, name, &mut val) {
            Ok(n) if n <= 32 => {
                let c = Cmp::new(CmpKind::Done, id, tag, 0).with_bytes(&val[..n]);
                self.complete(ch, c);
            }
            Ok(n) => {
                // Too long for the record: lend a buffer (TCP_INFO and the like).
                let Some(chan) = self.chan_mut(ch) else {
                    return;
                };
                let Some(b) = chan.ep.pool.alloc() else {
                    self.done(ch, id, tag, -libc::ENOBUFS);
                    return;
                };
                let span = chan
                    .ep
                    .bufs
                    .span(b.0, 0, n.min(chan.ep.bufs.buf_size()) as u32);
                let Ok(span) = span else {
                    let _ = chan.ep.pool.free(b);
                    self.done(ch, id, tag, -libc::ENOBUFS);
                    return;
                };
                chan.ep.bufs.write(span, &val[..n]);
                let mut data = Cmp::new(CmpKind::Data, id, tag, 0);
                data.buf = b.0;
                data.len = span.len();
                chan.complete(data);
                let mut fin = Cmp::new(CmpKind::Done, id, tag, 0);
                fin.a = n as u32;
                chan.complete(fin);
            }
            Err(e) => self.done(ch, id, tag, errno(&e)),
        }
    }

    fn send(&mut self, ch: u32, req: Request) -> Result<(), String> {
        let r = req.raw;
        let chan = self.chan_mut(ch).ok_or("no channel")?;
        let span = chan
            .ep
            .bufs
            .span(r.buf, r.b, r.len)
            .map_err(|e| e.to_string())?;
        let bufs = chan.ep.bufs.clone();
        let ctl = std::mem::take(&mut chan.send_ctl);
        let to = req.addr().map_err(|e| e.to_string())?;
        let give_back = |srv: &mut Server, res: i32| {
            let mut c = Cmp::new(CmpKind::BufReturn, r.sock, 0, res);
            c.buf = r.buf;
            srv.complete(ch, c);
        };
        if !self.may_use(ch, r.sock) {
            self.not_holder(ch, r.sock);
        }
        let Some(s) = self.socks.get(&r.sock).filter(|_| self.may_use(ch, r.sock)) else {
            give_back(self, -libc::EBADF);
            self.done(ch, r.sock, 0, -libc::EBADF);
            return Ok(());
        };
        if let Some(dest) = to
            && !s.is_stream()
        {
            {
                let local = dest.is_local();
                if local && self.on_host(r.sock) {
                    self.host_loopback_refused(r.sock, "datagram", dest);
                    give_back(self, 0);
                    self.done(ch, r.sock, 0, -libc::EACCES);
                    return Ok(());
                }
                if !local && self.cfg.policy.check(&dest.to_std()) == Verdict::Deny {
                    warn!(
                        "socket {}: datagram to {} denied by policy",
                        r.sock,
                        dest.to_std()
                    );
                    self.stats.denied += 1;
                    give_back(self, 0);
                    self.done(ch, r.sock, 0, -libc::EACCES);
                    return Ok(());
                }
                if !local && let Err(e) = self.move_to_host(r.sock) {
                    give_back(self, 0);
                    self.done(ch, r.sock, 0, e);
                    return Ok(());
                }
                if let Some(c) = self.sock(r.sock).and_then(|s| s.contacted.as_mut()) {
                    remember(c, dest.to_std());
                }
                if let Err(e) = self.place_for(r.sock, local) {
                    give_back(self, 0);
                    self.done(ch, r.sock, 0, e);
                    return Ok(());
                }
            }
        }
        let control = match &ctl {
            c if c.is_empty() || self.socks.get(&r.sock).is_none_or(Sock::is_stream) => Vec::new(),
            c => match cmsg::sanitize_send(c) {
                Ok(v) => v,
                Err(e) => {
                    warn!("socket {}: datagram refused: {e}", r.sock);
                    give_back(self, 0);
                    self.done(ch, r.sock, 0, -e.errno());
                    return Ok(());
                }
            },
        };
        if let Some(why) = self.source_refused(r.sock, &control) {
            warn!("socket {}: datagram refused: {why}", r.sock);
            self.stats.denied += 1;
            give_back(self, 0);
            self.done(ch, r.sock, 0, -libc::EPERM);
            return Ok(());
        }
        let s = self.sock(r.sock).expect("checked above");
        s.stats.calls += 1;
        s.txq.push_back(TxItem {
            ch,
            bufs,
            span,
            sent: 0,
            to: to.filter(|_| !s.is_stream()).map(WireAddr::to_std),
            flags: (r.a as i32) & (libc::MSG_MORE | libc::MSG_OOB | libc::MSG_EOR),
            control,
        });
        if s.txq.len() == 1 {
            // Sent once the rings are drained: every send of this turn in one call.
            self.tx_pending.push(r.sock);
        }
        Ok(())
    }

    /// Sends what the sockets queued during this pass of the rings (S1 on the host
    /// side: one vectored call per socket rather than one per record).
    pub(crate) fn flush_pending(&mut self) {
        for id in std::mem::take(&mut self.tx_pending) {
            self.flush_tx(id);
        }
    }

    /// Sends queued data until the host socket is full; returns finished buffers.
    pub(crate) fn flush_tx(&mut self, id: u32) {
        let io = self.io;
        if self.modules.is_bound(id) && self.module_flush(id) {
            return;
        }
        loop {
            let Some(s) = self.socks.get_mut(&id) else {
                return;
            };
            if s.txq.is_empty() {
                break;
            }
            // S1 on the server side: consecutive stream sends go out in one vectored
            // call (a datagram is always one call of its own). Urgent data ends a batch:
            // `MSG_OOB` marks the last byte of the call that carries it.
            let batch = if s.is_stream() {
                let n = s.txq.len().min(crate::hostio::MAX_IOV);
                s.txq
                    .iter()
                    .take(n)
                    .position(|i| i.flags & libc::MSG_OOB != 0)
                    .map_or(n, |p| p + 1)
            } else {
                1
            };
            let res = io.send_items(s.fd.as_fd(), s.txq.range(..batch));
            self.stats.data_syscalls += 1;
            match res {
                Ok(mut n) => {
                    s.stats.bytes_out += n as u64;
                    self.stats.bytes_out += n as u64;
                    let stream = s.is_stream();
                    let mut done = Vec::new();
                    while let Some(item) = s.txq.front_mut() {
                        let left = item.span.len() as usize - item.sent;
                        if n < left && stream {
                            item.sent += n;
                            break;
                        }
                        n = n.saturating_sub(left);
                        done.push(s.txq.pop_front().expect("front exists"));
                        if !stream
                            || n == 0
                                && s.txq
                                    .front()
                                    .is_some_and(|i| i.span.len() as usize > i.sent)
                        {
                            break;
                        }
                    }
                    for item in done {
                        let mut c = Cmp::new(CmpKind::BufReturn, id, 0, 0);
                        c.buf = item.span.id().0;
                        self.complete(item.ch, c);
                    }
                }
                Err(e) if would_block(&e) => return,
                Err(e) => {
                    // The connection is broken: give every buffer back, report once.
                    let items: Vec<TxItem> = s.txq.drain(..).collect();
                    let code = errno(&e);
                    let mut reported = false;
                    for item in items {
                        let mut c = Cmp::new(CmpKind::BufReturn, id, 0, 0);
                        c.buf = item.span.id().0;
                        self.complete(item.ch, c);
                        if !reported {
                            self.complete(item.ch, Cmp::new(CmpKind::AsyncError, id, 0, code));
                            reported = true;
                        }
                    }
                    break;
                }
            }
        }
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if !s.txq.is_empty() {
            return;
        }
        if s.pair_in_wait {
            // The program's own bytes in the pair came after these sends (once they are
            // out, `pair_input` finishes what waited for them).
            self.pair_input(id);
        } else {
            self.after_sends(id);
        }
    }

    /// Once everything the program sent is out (queued sends and its own bytes in the
    /// pair): a pending `shutdown` for writing happens, a closed socket can go.
    fn after_sends(&mut self, id: u32) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if !s.txq.is_empty() || s.pair_in_wait {
            return;
        }
        if s.shut_wr_pending {
            s.shut_wr_pending = false;
            let _ = io.shutdown(s.fd.as_fd(), libc::SHUT_WR);
        }
        if s.app_closed {
            self.dirty.push(id);
        }
    }

    /// Bytes the program wrote straight into its end of socket `id`'s pair, with calls
    /// the shim cannot see (stdio's, a shell's builtins, a raw `write` system call),
    /// go out on the host socket after the sends queued before them. The shim's filler
    /// ([`Op::WantRoom`]) starts with an out-of-band marker byte and a read stops at
    /// the mark, so what lies before it is the program's data and what follows it is
    /// filler, taken only when due (`filler_due`). The bytes are peeked, sent, and then
    /// taken as far as the host socket accepted them: nothing is lost when it is full
    /// (its `EPOLLOUT` resumes this, and the program's end fills up meanwhile, as a
    /// full socket's would).
    pub(crate) fn pair_input(&mut self, id: u32) {
        let io = self.io;
        let mut buf = Vec::new();
        loop {
            let Some(s) = self.socks.get_mut(&id) else {
                return;
            };
            if !s.takes_pair_input(io) {
                return;
            }
            if !s.txq.is_empty() {
                s.pair_in_wait = true;
                return;
            }
            let pair = s.pair.as_fd();
            let at_mark = |fd| io.at_mark(fd).unwrap_or(false);
            let marked = at_mark(pair);
            let n = if marked {
                0
            } else {
                buf.resize(PAIR_INPUT_CHUNK, 0);
                match io.recv(pair, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
                    Ok(n) => n,
                    Err(e) => {
                        // Kept for `app_closed`, which would have read it as SO_ERROR.
                        s.pair_reset |= e.raw_os_error() == Some(libc::ECONNRESET);
                        0
                    }
                }
            };
            if n > 0 && at_mark(pair) {
                // A filler's marker came first after all: the peek saw filler.
                continue;
            }
            if n == 0 {
                // At a filler's marker, or empty (then no filler is coming: a drain
                // asked of an unfilled pair).
                let was_waiting = std::mem::take(&mut s.pair_in_wait);
                if std::mem::take(&mut s.filler_due) && marked {
                    Self::drain_filler_now(io, s);
                }
                if was_waiting {
                    self.after_sends(id);
                }
                return;
            }
            // Looked at after the bytes: a send the program queued before writing them
            // is in a ring by now, and goes first (at the end of this pass over the
            // rings).
            if self.rings_pending() {
                let s = self.socks.get_mut(&id).expect("looked up above");
                s.pair_in_wait = true;
                self.pair_resume.push(id);
                return;
            }
            let s = self.socks.get_mut(&id).expect("looked up above");
            s.pair_in_wait = false;
            let pair = s.pair.as_fd();
            match io.send(s.fd.as_fd(), &buf[..n]) {
                Ok(k) => {
                    let _ = io.recv(pair, &mut buf[..k], libc::MSG_DONTWAIT);
                    s.stats.bytes_out += k as u64;
                    self.stats.bytes_out += k as u64;
                    if k < n {
                        s.pair_in_wait = true;
                        return;
                    }
                }
                Err(e) if would_block(&e) => {
                    s.pair_in_wait = true;
                    return;
                }
                Err(e) => {
                    // The connection is broken; the program's write had already
                    // succeeded, so these bytes are dropped as a kernel socket's unsent
                    // ones would be.
                    debug!("socket {id}: bytes from the pair not sent: {e}");
                    let _ = io.recv(pair, &mut buf[..n], libc::MSG_DONTWAIT);
                    return;
                }
            }
        }
    }

    /// Whether a channel has records the server has not taken yet.
    fn rings_pending(&mut self) -> bool {
        self.channels.rings_pending()
    }

    fn recv(&mut self, ch: u32, id: u32, tag: u32, len: u32, flags: i32, nonblock: bool) {
        if flags & libc::MSG_OOB == 0
            && let Some(res) = self.pair_stream_end(id)
        {
            // The stream's bytes went through the pair: the shim asks only what ended it.
            self.done(ch, id, tag, res);
            return;
        }
        match self.try_recv(ch, id, tag, len, flags) {
            Ok(()) => {}
            Err(e) if would_block(&e) && !nonblock => {
                self.park(
                    id,
                    Parked::Recv {
                        ch,
                        tag,
                        len,
                        flags,
                    },
                );
            }
            Err(e) => {
                let mut c = Cmp::new(CmpKind::Done, id, tag, errno(&e));
                if would_block(&e) && self.drain_token(id) != 0 {
                    c.flags |= CMP_DRAIN_TOKEN;
                }
                self.complete(ch, c);
            }
        }
    }

    /// One non-blocking receive into the channel's buffers; completes on success.
    fn try_recv(&mut self, ch: u32, id: u32, tag: u32, len: u32, flags: i32) -> io::Result<()> {
        let io = self.io;
        let chan = self
            .channels
            .get_mut(ch)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EPIPE))?;
        let s = self
            .socks
            .get_mut(&id)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let bs = chan.ep.bufs.buf_size();
        let want = (len as usize).max(1);
        let nbufs = if s.is_stream() {
            want.div_ceil(bs).min(MAX_RECV_BUFS)
        } else {
            1
        };
        let mut lent: Vec<(BufId, ferry_ring::BufSpan)> = Vec::with_capacity(nbufs);
        let mut left = want;
        for _ in 0..nbufs {
            let Some(b) = chan.ep.pool.alloc() else { break };
            let take = left.min(bs);
            let span = chan
                .ep
                .bufs
                .span(b.0, 0, take as u32)
                .expect("own buffer, in range");
            lent.push((b, span));
            left -= take;
        }
        if lent.is_empty() {
            // The shim holds every buffer: treat as "not yet" (it returns them soon).
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        let spans: Vec<ferry_ring::BufSpan> = lent.iter().map(|(_, sp)| *sp).collect();
        s.recv_mark = self.waits;
        // A datagram's control messages (those its options ask for) go to the shim.
        let mut control = [0u8; cmsg::MAX_CONTROL];
        let filter = !s.is_stream() && s.place != Place::Sandbox;
        let contacted = s.contacted.as_deref();
        let res = loop {
            let res = io.recv_spans(
                s.fd.as_fd(),
                &chan.ep.bufs,
                &spans,
                flags & (libc::MSG_PEEK | libc::MSG_TRUNC | libc::MSG_OOB),
                (!s.is_stream()).then_some(&mut control[..]),
            );
            self.stats.data_syscalls += 1;
            match &res {
                // A datagram on the host from a source the sandbox may not talk to
                // (the policy's, or the host's own): dropped, as a firewall would.
                Ok(got)
                    if filter
                        && got.from.is_some_and(|f| {
                            !crate::reach::arrival_allowed(&self.cfg.policy, f)
                                || contacted.is_some_and(|c| !c.contains(&f))
                        }) =>
                {
                    if flags & libc::MSG_PEEK != 0 {
                        let _ = io.recv(s.fd.as_fd(), &mut [0u8; 1], libc::MSG_DONTWAIT);
                    }
                    self.stats.dropped_arrivals += 1;
                }
                _ => break res,
            }
        };
        let got = match res {
            Ok(got) => got,
            Err(e) => {
                for (b, _) in lent {
                    let _ = chan.ep.pool.free(b);
                }
                if !would_block(&e) {
                    s.so_error = 0;
                } else {
                    self.stats.empty_reads += 1;
                    if flags & (libc::MSG_PEEK | libc::MSG_OOB) == 0 {
                        s.rx_maybe = false;
                    }
                }
                return Err(e);
            }
        };
        let room: usize = spans.iter().map(|sp| sp.len() as usize).sum();
        let placed = got.len.min(room);
        s.stats.bytes_in += placed as u64;
        self.stats.bytes_in += placed as u64;
        let mut left = placed;
        for (b, span) in lent {
            let n = left.min(span.len() as usize);
            if n == 0 {
                let _ = chan.ep.pool.free(b);
                continue;
            }
            left -= n;
            let mut c = Cmp::new(CmpKind::Data, id, tag, 0);
            c.buf = b.0;
            c.len = n as u32;
            chan.complete(c);
        }
        let control = &control[..got.control_len.min(cmsg::MAX_CONTROL)];
        for (i, chunk) in control.chunks(cmsg::CHUNK).enumerate() {
            let mut c = Cmp::new(CmpKind::Control, id, tag, 0).with_bytes(chunk);
            c.a = (i * cmsg::CHUNK) as u32;
            chan.complete(c);
        }
        let mut fin = Cmp::new(CmpKind::Done, id, tag, got.len as i32);
        fin.a = got.flags as u32;
        if let Some(from) = got.from.filter(|_| !s.is_stream()) {
            fin = fin.with_addr(&WireAddr::from(from));
        }
        fin.buf = NO_BUF;
        // A polled socket: if the host socket is now empty, take the token back (a token
        // left behind would make the next poll report data that is not there). A short
        // stream read means empty without asking the kernel; if data arrived meanwhile,
        // `TokenDrained`'s re-check writes a fresh token. Short of the buffers lent, not
        // of the length asked for: a read of more than MAX_RECV_BUFS buffers (or with
        // fewer free) that fills them all may have left data behind, and the host socket,
        // edge-triggered, brings no new edge for it. Nor after a hang-up (`rx_ending`):
        // its edge came before this read, and the end of the stream is still to read.
        let short = s.is_stream() && placed < room && !s.rx_ending;
        if short && flags & (libc::MSG_PEEK | libc::MSG_OOB) == 0 {
            s.rx_maybe = false;
        }
        if s.token_out()
            && flags & libc::MSG_PEEK == 0
            && (short || io.poll_now(s.fd.as_fd(), libc::POLLIN).unwrap_or(0) == 0)
        {
            fin.flags |= CMP_DRAIN_TOKEN;
        }
        chan.complete(fin);
        Ok(())
    }

    /// After a successful accept: whether the shim should take the listener's token
    /// back (1) because no connection is left to accept. A token left behind would make
    /// the next poll report a connection that is not there, and a blocking `accept`
    /// after it would hang. If a connection arrives meanwhile, `TokenDrained`'s re-check
    /// writes a fresh token.
    fn drain_if_empty(&mut self, listener: u32) -> i32 {
        let io = self.io;
        let published = self.has_published(listener);
        match self.socks.get(&listener) {
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

    /// Whether the shim should drain its token now (1) or not (0).
    fn drain_token(&mut self, id: u32) -> i32 {
        match self.sock(id) {
            Some(s) if s.token_out() => 1,
            _ => 0,
        }
    }

    /// Writes a readiness token if the shim wants one and the host socket is readable.
    fn maybe_token(&mut self, id: u32) {
        self.maybe_token_known(id, false);
    }

    /// [`Server::maybe_token`]; `readable` = the host socket just reported input and
    /// nothing has received since, so a stream needs no `ppoll` to know.
    fn maybe_token_known(&mut self, id: u32, readable: bool) {
        let io = self.io;
        if self.socks.get(&id).is_some_and(Sock::reads_pair) {
            self.pump(id);
            return;
        }
        let published = self.has_published(id);
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if s.token != Token::Wanted {
            return;
        }
        let tracked = s.is_stream() && !s.listening() && !published;
        // An ended stream stays readable (0, or the error) with no edge to come: ask.
        if tracked && !s.rx_maybe && !s.rx_ending {
            return;
        }
        let rev = if tracked && readable {
            libc::POLLIN
        } else {
            io.poll_now(s.fd.as_fd(), libc::POLLIN | libc::POLLRDHUP)
                .unwrap_or(0)
        };
        let readable = rev & (libc::POLLIN | libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0;
        if tracked && !readable {
            s.rx_maybe = false;
        }
        if (readable || published) && io.send(s.pair.as_fd(), &[1]).is_ok() {
            s.token = Token::Out { extra: 0 };
            s.stats.tokens += 1;
        }
        if rev & (libc::POLLRDHUP | libc::POLLHUP) != 0 && !s.listening() {
            s.mirror_eof(io);
        }
    }

    /// With `rx_pair`, the answer to a receive on a connected stream whose bytes go
    /// through the pair: how the stream ended (0, or the error that ended it, reported
    /// once) or `EAGAIN` while it has not. `None`: not such a socket.
    fn pair_stream_end(&mut self, id: u32) -> Option<i32> {
        let s = self.socks.get_mut(&id).filter(|s| s.reads_pair())?;
        if s.pair_end == PairEnd::Open {
            return Some(-libc::EAGAIN);
        }
        Some(-std::mem::take(&mut s.so_error))
    }

    /// With `rx_pair`: moves what the host socket has received into the readiness pair
    /// (the program's fd) until either would block; what the pair does not take waits
    /// for its `EPOLLOUT` (and the host socket waits meanwhile: TCP's window is the
    /// flow control). The end of the stream (EOF or an error, kept for the shim's
    /// question) shuts the pair's write side. A stream whose last read filled the 64 KiB
    /// scratch buffer is moved with `splice` through the server's pipe instead (pages
    /// change hands, the bytes are not copied in the server) until a splice moves less
    /// than [`SPLICE_MIN`]. A hang-up due follows the end of the stream ([`Server::mirror_hup`]).
    pub(crate) fn pump(&mut self, id: u32) {
        self.pump_pair(id);
        self.mirror_hup(id);
    }

    /// A hang-up of socket `id`'s host socket (both directions shut, or a reset: the
    /// kernel's `POLLHUP`) reaches the program's end of the pair once the end of the
    /// stream has: our end shuts its read side too, which shuts the program end's write
    /// side, and a unix stream socket whose directions are both shut reports `POLLHUP`.
    /// Sends go through the channel, never the pair, so nothing the program writes is
    /// lost (the shim's filler meets `EPIPE`; the kernel's socket polls writable after a
    /// hang-up too). The channel's completions go out first: a program that sees the
    /// hang-up and sends must find the error reported with it.
    pub(crate) fn mirror_hup(&mut self, id: u32) {
        let io = self.io;
        let Some(s) = self.socks.get(&id).filter(|s| s.hup_to_mirror()) else {
            return;
        };
        let ch = s.last_ch;
        if let Some(c) = self.chan_mut(ch) {
            c.flush();
        }
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        s.pair_end = PairEnd::Hup;
        let _ = io.shutdown(s.pair.as_fd(), libc::SHUT_RD);
    }

    fn pump_pair(&mut self, id: u32) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if !s.reads_pair() || s.pair_end != PairEnd::Open {
            return;
        }
        if self.rx_scratch.is_empty() {
            self.rx_scratch = vec![0u8; RX_SCRATCH];
            // Without a pipe (out of descriptors), bulk streams are copied too.
            self.rx_pipe = self.io.rx_pipe(RX_PIPE);
        }
        let buf = &mut self.rx_scratch;
        let mut pipe_broken = false;
        loop {
            if !s.rx_pending.is_empty() {
                match io.send(s.pair.as_fd(), &s.rx_pending) {
                    Ok(n) => {
                        s.rx_pending.drain(..n);
                        if !s.rx_pending.is_empty() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
            if !s.urgent_first(io) {
                return;
            }
            if !s.rx_maybe {
                // No input edge since the queue was found empty (e.g. an edge that only
                // said the socket is writable again): nothing to read.
                return;
            }
            let got = match &self.rx_pipe {
                Some(pipe) if s.rx_bulk => {
                    let (r, broken) = splice_bulk(io, s, pipe, buf);
                    pipe_broken = broken;
                    r
                }
                _ => io
                    .recv(s.fd.as_fd(), buf, libc::MSG_DONTWAIT)
                    .inspect(|&n| {
                        if n > 0 {
                            // Straight into the pair; only what it does not take is kept.
                            let sent = io.send(s.pair.as_fd(), &buf[..n]).unwrap_or(0);
                            s.rx_pending.extend_from_slice(&buf[sent..n]);
                            // A splice into a socket blocks unless the socket's own file
                            // is non-blocking: the server's end of the pair becomes so.
                            s.rx_bulk = n == RX_SCRATCH
                                && self.rx_pipe.is_some()
                                && io.set_nonblocking(s.pair.as_fd(), true).is_ok();
                        }
                    }),
            };
            match got {
                Ok(0) => {
                    s.mirror_eof(io);
                    return;
                }
                Ok(n) => {
                    s.stats.bytes_in += n as u64;
                    self.stats.bytes_in += n as u64;
                    self.stats.data_syscalls += 1;
                    // A read that did not fill the buffer emptied the queue: bytes that
                    // come later bring a new edge (the host socket is edge-triggered),
                    // so the read that would say EAGAIN is skipped, unless the end has
                    // been reported (it brings no further edge).
                    // (A read also stops short at an urgent mark.)
                    let drained = !s.rx_bulk && n < RX_SCRATCH && !s.rx_ending && !s.oob_due;
                    if drained {
                        s.rx_maybe = false;
                    }
                    if !s.rx_pending.is_empty() || drained {
                        return;
                    }
                }
                Err(e) if would_block(&e) => {
                    s.rx_maybe = false;
                    self.stats.empty_reads += 1;
                    return;
                }
                Err(e) => {
                    s.so_error = e.raw_os_error().unwrap_or(libc::EIO);
                    s.mirror_eof(io);
                    if pipe_broken {
                        warn!("socket {id}: the receive pipe lost bytes; the stream ends with EIO");
                        let _ = io.linger_reset(s.fd.as_fd());
                        self.rx_pipe = None;
                    }
                    return;
                }
            }
        }
    }

    /// Host readiness: finish connects, flush sends, retry parked operations, tokens.
    pub(crate) fn host_event(&mut self, id: u32, events: u32) {
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        let input =
            libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLRDHUP | libc::EPOLLERR | libc::EPOLLHUP;
        if events & input as u32 != 0 {
            s.rx_maybe = true;
        }
        if events & libc::EPOLLPRI as u32 != 0 && s.reads_pair() {
            s.oob_due = true;
        }
        // Plain new input that no receive can have taken: none since the wait before the
        // one that reported it (an edge reported now may be that old), and no parked one
        // will run before the token check.
        let fresh_input = events
            & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLERR | libc::EPOLLHUP) as u32
            == libc::EPOLLIN as u32
            && s.recv_mark + 1 < self.waits
            && !s.parked.iter().any(|p| matches!(p, Parked::Recv { .. }));
        let out = events & (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        if let Conn::Connecting { to, filled } = s.conn
            && out
        {
            self.connect_ended(id, to, filled);
        }
        if out {
            self.flush_tx(id);
        }
        self.retry_parked(id);
        self.report_hangup(id, events);
        self.edge_token(id, events);
        if let Some(s) = self.socks.get_mut(&id)
            && s.connected()
            && events & (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0
        {
            // (A stream not yet connected reports EPOLLHUP: that is not an ending.)
            s.rx_ending = true;
            if events & libc::EPOLLHUP as u32 != 0 && s.reads_pair() {
                s.hup_due = true;
            }
        }
        self.mirror_hup(id);
        self.maybe_token_known(id, fresh_input);
        if self.socks.get(&id).is_some_and(|s| s.app_closed) {
            self.dirty.push(id);
        }
    }

    /// Stream `id`'s connect in progress (to `to`, the program's end of the pair
    /// `filled` meanwhile) has ended: its outcome (`SO_ERROR`) goes to the connect that
    /// waits for it, else is kept for the program's `SO_ERROR`; see [`Conn`]'s table.
    fn connect_ended(&mut self, id: u32, to: SocketAddr, filled: bool) {
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
        for (ch, tag) in waiters {
            self.done(ch, id, tag, -err);
        }
        if filled && err != 0 && !reported {
            // A non-blocking connect failed: POLLERR|POLLHUP, as the kernel's.
            self.detach_pair(id);
        } else if filled {
            // The connect has ended: the program's end polls writable again.
            self.drain_filler(id);
        }
    }

    /// A reset or hang-up of a connected stream: the program's next send fails with
    /// EPIPE (as with the kernel), even when it has nothing queued right now.
    fn report_hangup(&mut self, id: u32, events: u32) {
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 == 0
            || !s.connected()
            || s.hup_reported
        {
            return;
        }
        s.hup_reported = true;
        let ch = s.last_ch;
        self.complete(ch, Cmp::new(CmpKind::AsyncError, id, 0, -libc::EPIPE));
    }

    /// Edge-triggered epoll wants an edge for every arrival of new data, even while the
    /// socket is already readable: add a token byte per new-data edge (a few at most
    /// between two drains).
    fn edge_token(&mut self, id: u32, events: u32) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        let Token::Out { extra } = s.token else {
            return;
        };
        if events & libc::EPOLLIN as u32 == 0 || s.listening() || extra >= 8 {
            return;
        }
        if io.send(s.pair.as_fd(), &[1]).is_ok() {
            s.token = Token::Out { extra: extra + 1 };
            s.stats.tokens += 1;
        }
    }

    fn retry_parked(&mut self, id: u32) {
        loop {
            let Some(s) = self.socks.get_mut(&id) else {
                return;
            };
            let Some(p) = s.parked.pop_front() else {
                return;
            };
            match p {
                Parked::Recv {
                    ch,
                    tag,
                    len,
                    flags,
                } => match self.try_recv(ch, id, tag, len, flags) {
                    Ok(()) => continue,
                    Err(e) if would_block(&e) => {
                        self.park_front(
                            id,
                            Parked::Recv {
                                ch,
                                tag,
                                len,
                                flags,
                            },
                        );
                        return;
                    }
                    Err(e) => self.done(ch, id, tag, errno(&e)),
                },
                Parked::Accept { ch } => match self.try_accept(id) {
                    Ok(a) => self.finish_accept(ch, id, a),
                    Err(e) if would_block(&e) => {
                        self.park_front(id, Parked::Accept { ch });
                        return;
                    }
                    Err(e) => self.ctl_reply(ch, Server::new_reply(errno(&e))),
                },
                other => {
                    self.park_front(id, other);
                    return;
                }
            }
        }
    }

    /// Parks a blocking operation of socket `id` until its host socket is ready. A
    /// shim's thread has one request in flight at a time: a channel with more than a
    /// few parked on one socket breaks the protocol (and would grow the queue without
    /// bound), so it is closed.
    fn park(&mut self, id: u32, p: Parked) {
        let ch = p.owner().0;
        let Some(s) = self.sock(id) else {
            return;
        };
        if s.parked.iter().filter(|q| q.owner().0 == ch).count() >= MAX_PARKED_PER_CHANNEL {
            self.bad_channel(ch, "too many blocking requests on one socket");
            return;
        }
        s.parked.push_back(p);
    }

    fn park_front(&mut self, id: u32, p: Parked) {
        if let Some(s) = self.sock(id) {
            s.parked.push_front(p);
        }
    }
}

/// A connection taken for a listener of the sandbox.
struct Accepted {
    conn: OwnedFd,
    peer: Option<SocketAddr>,
    /// The published port it came through (a connection of the host's side).
    published: Option<u16>,
}

/// A socket counted against the sandbox's cap (`Config::max_sockets`) whose making may
/// still fail: dropping it gives the count back.
struct SocketSlot(std::sync::Arc<crate::group::Shared>);

impl Drop for SocketSlot {
    fn drop(&mut self) {
        self.0.socket_closed();
    }
}
