//! The request dispatcher: what each ring request and control message does. Who may
//! act on a socket, the order of operations within a pass over the rings, and the
//! completions that answer a request are decided here; the socket-level work is done
//! by `connect.rs` (where a socket lives, whom it talks to), `tx.rs` (the way out) and
//! `rx.rs` (the way in). Must not: call the kernel other than through the seam
//! (`seam.rs`), or trust a field of a record the decoder has not checked.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use ferry_proto::{Call, Cmp, CmpKind, Ctl, CtlKind, ProtoError, WireAddr, cmsg};
use ferry_ring::BufId;
use tracing::{debug, warn};

use crate::connect::in_family;
use crate::server::Server;
use crate::sock::{Conn, Place, Token};
use crate::sockopt;

/// Most operations one channel may have waiting on one socket (a shim has one).
pub(crate) const MAX_PARKED_PER_CHANNEL: usize = 4;

/// A kernel error code (`errno`, positive): what the server's operations fail with.
/// It turns into a negative number only in a record ([`Answer`]), where the protocol
/// carries a result as a value `>= 0` or a negated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Errno(pub(crate) i32);

impl Errno {
    /// The error of a failed system call (`EIO` when it carries none).
    pub(crate) fn of(e: &io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// As a record's result.
    pub(crate) fn wire(self) -> i32 {
        -self.0
    }
}

/// A result as a record carries it: a value `>= 0`, or a negated [`Errno`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Answer(pub(crate) i32);

impl From<i32> for Answer {
    fn from(v: i32) -> Answer {
        debug_assert!(v >= 0, "an error answered without an Errno: {v}");
        Answer(v)
    }
}

impl From<Errno> for Answer {
    fn from(e: Errno) -> Answer {
        Answer(e.wire())
    }
}

impl From<Result<(), Errno>> for Answer {
    fn from(r: Result<(), Errno>) -> Answer {
        Answer(r.map_or_else(Errno::wire, |()| 0))
    }
}

impl From<Result<i32, Errno>> for Answer {
    fn from(r: Result<i32, Errno>) -> Answer {
        Answer(r.unwrap_or_else(Errno::wire))
    }
}

/// A socket id as a control reply's result (`>= 0`). Ids fit until 2^27 sockets have
/// been made; past that the socket is refused (`ENFILE`) rather than answered with a
/// negative number the shim would read as an error code.
pub(crate) fn reply_id(id: u32) -> Result<i32, Errno> {
    i32::try_from(id).map_err(|_| Errno(libc::ENFILE))
}

pub(crate) fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Server {
    /// Queues a completion on channel `ch` (dropped if the channel is gone). A buffer
    /// coming back is room for the channel's next send: sockets waiting for it become
    /// writable again.
    pub(crate) fn complete(&mut self, ch: u32, c: Cmp) {
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

    /// Answers request `tag` of socket `sock` with `result`; an untagged request's
    /// error is reported on the program's next call (`AsyncError`).
    pub(crate) fn done(&mut self, ch: u32, sock: u32, tag: u32, result: impl Into<Answer>) {
        let Answer(result) = result.into();
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
                Ok((id, theirs)) => self.ctl_reply_fd(ch, Server::new_reply(reply_id(id)), theirs),
                Err(e) => self.ctl_reply(ch, Server::new_reply(e)),
            },
            CtlKind::Accept if self.may_use(ch, msg.sock) => self.accept(ch, msg.sock, msg.a != 0),
            CtlKind::Accept => self.ctl_reply(ch, Server::new_reply(Errno(libc::EBADF))),
            CtlKind::Claim => {
                let result = match fds.pop() {
                    Some(fd) if fds.is_empty() => self.claim(ch, msg.sock, fd),
                    _ => Err(Errno(libc::EINVAL)),
                };
                self.ctl_reply(ch, Server::new_reply(result));
            }
            CtlKind::Renew => {
                let renewed = match fds.pop() {
                    Some(fd) if fds.is_empty() => match self.claim(ch, msg.sock, fd) {
                        Ok(()) => self.renew_pair(msg.sock),
                        Err(e) => Err(e),
                    },
                    _ => Err(Errno(libc::EINVAL)),
                };
                match renewed {
                    Ok(theirs) => self.ctl_reply_fd(ch, Server::new_reply(0), theirs),
                    Err(e) => self.ctl_reply(ch, Server::new_reply(e)),
                }
            }
            CtlKind::Handoff => {
                let taken = match fds.pop() {
                    Some(fd) if fds.is_empty() => match self.claim(ch, msg.sock, fd) {
                        Ok(()) => self.take_handoff(msg.sock),
                        Err(e) => Err(e),
                    },
                    _ => Err(Errno(libc::EINVAL)),
                };
                match taken {
                    Ok(host) => self.ctl_reply_fd(ch, Server::new_reply(0), host),
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
    fn claim(&mut self, ch: u32, id: u32, fd: OwnedFd) -> Result<(), Errno> {
        let io = self.io;
        let Some(owner) = self.chan(ch).map(|c| c.owner) else {
            return Err(Errno(libc::EBADF));
        };
        let Some(s) = self.socks.get_mut(&id) else {
            return Err(Errno(libc::EBADF));
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
            return Err(Errno(libc::EBADF));
        }
        s.add_holder(owner);
        Ok(())
    }

    /// One decoded ring request. `Err` means the channel broke the protocol.
    pub(crate) fn handle(&mut self, ch: u32, call: Call) -> Result<(), ProtoError> {
        match call {
            Call::BufReturn { buf, .. } => return self.buffer_returned(ch, buf),
            Call::SendCtl { offset, bytes, .. } => {
                return self.send_ctl(ch, offset, bytes.as_bytes());
            }
            _ => {}
        }
        let id = call.sock();
        if !self.socks.contains_key(&id) && ferry_proto::server_of(id) == self.index {
            // Handed over by another server, maybe not taken yet.
            self.drain_inbox();
        }
        match call {
            Call::Send {
                buf,
                offset,
                flags,
                dest,
                ..
            } => return self.send(ch, id, buf, offset, flags, dest),
            Call::Order { tag, .. } => {
                self.take_earlier_records(ch);
                self.done(ch, id, tag, 0);
                return Ok(());
            }
            Call::BindModule {
                tag,
                binding,
                files,
                ..
            } => {
                // Ordered with the sends before it; they go out before the module's output.
                self.flush_pending();
                return self.bind_module_req(ch, id, tag, binding, files);
            }
            _ => {}
        }
        // Program order across sockets: what this pass queued goes out before an
        // operation that may observe it (a recv on the loopback peer, a connect…).
        self.flush_pending();
        if let Call::Release { tag, .. } = call {
            // Closed already, or closing now: either way `close` may return.
            if self.app_gone(id) {
                self.app_closed(id);
                self.settle_dirty();
            }
            self.done(ch, id, tag, 0);
            return Ok(());
        }
        if !self.may_use(ch, id) {
            self.not_holder(ch, id);
            self.done(ch, id, call.tag(), Errno(libc::EBADF));
            return Ok(());
        }
        let Some(s) = self.sock(id) else {
            self.done(ch, id, call.tag(), Errno(libc::EBADF));
            return Ok(());
        };
        s.stats.calls += 1;
        s.last_ch = ch;
        if !s.txq.is_empty() {
            // Operations on a socket happen in order: sends queued earlier in this pass
            // go out before, say, a getsockname that must see the port they bound.
            self.flush_tx(id);
        }
        self.socket_call(ch, id, call);
        Ok(())
    }

    /// A request about socket `id`, which channel `ch`'s process holds.
    fn socket_call(&mut self, ch: u32, id: u32, call: Call) {
        match call {
            Call::Disconnect { tag, .. } => {
                let res = self.disconnect(id);
                self.done(ch, id, tag, res);
            }
            Call::Connect {
                tag,
                addr,
                nonblock,
                filled,
                ..
            } => {
                self.connect(ch, id, tag, addr, nonblock);
                if filled {
                    self.connect_filled(id, nonblock);
                }
            }
            Call::Bind { tag, addr, .. } => {
                let res = self.bind(id, addr.to_std());
                self.done(ch, id, tag, res);
            }
            Call::Listen { tag, backlog, .. } => {
                let res = self.listen(id, backlog);
                self.done(ch, id, tag, res);
            }
            Call::Recv {
                tag,
                max,
                flags,
                nonblock,
                ..
            } => self.recv(ch, id, tag, max, flags, nonblock),
            Call::Shutdown { tag, how, .. } => self.shutdown_call(ch, id, tag, how),
            Call::SetOpt {
                tag,
                level,
                name,
                value,
                ..
            } => {
                let res = self.setopt(id, level, name, value.as_bytes());
                self.done(ch, id, tag, res);
            }
            Call::GetOpt {
                tag,
                level,
                name,
                len,
                ..
            } => self.getopt(ch, id, tag, level, name, len),
            Call::SockName { tag, .. } => self.name(ch, id, tag, false),
            Call::PeerName { tag, .. } => self.name(ch, id, tag, true),
            Call::Pending { tag, .. } => {
                let res = self.socks.get(&id).map_or(Err(Errno(libc::EBADF)), |s| {
                    self.io
                        .pending_bytes(s.fd.as_fd())
                        .map_err(|e| Errno::of(&e))
                });
                self.done(ch, id, tag, res);
            }
            Call::WantToken { .. } => self.token_moves(id, Token::Unwanted),
            Call::TokenDrained { .. } => self.token_moves(id, Token::Out { extra: 0 }),
            Call::WantRoom { returns_seen, .. } => self.want_room(ch, id, returns_seen),
            Call::Cancel { parked, .. } => self.cancel(ch, id, parked),
            // Taken by `handle` before it looks the socket up.
            Call::Send { .. }
            | Call::SendCtl { .. }
            | Call::BufReturn { .. }
            | Call::Release { .. }
            | Call::Order { .. }
            | Call::BindModule { .. } => {}
        }
    }

    /// `WantToken` (from `Unwanted`) or `TokenDrained` (from `Out`, whatever its extra
    /// count): socket `id`'s token is wanted and not in the pair; one is written if the
    /// host socket is readable (see [`Token`]).
    fn token_moves(&mut self, id: u32, from: Token) {
        if let Some(s) = self.sock(id)
            && std::mem::discriminant(&s.token) == std::mem::discriminant(&from)
        {
            s.token = Token::Wanted;
        }
        self.maybe_token(id);
    }

    /// `Cancel`: the shim gave up the request `parked` of channel `ch` waits on socket
    /// `id` for (a signal, a timeout); it is answered `EINTR` if it still waits.
    fn cancel(&mut self, ch: u32, id: u32, parked: u32) {
        if let Some(p) = self.unpark(id, |p| p.owner() == (ch, parked)) {
            debug!("socket {id}: cancelled {p:?}");
            self.done(ch, id, parked, Errno(libc::EINTR));
        }
    }

    /// `BufReturn`: the shim gives back server buffer `buf` of channel `ch`.
    fn buffer_returned(&mut self, ch: u32, buf: u32) -> Result<(), ProtoError> {
        match self.chan_mut(ch) {
            Some(chan) => chan
                .ep
                .pool
                .free(BufId(buf))
                .map_err(|_| ProtoError::BadBuffer(buf)),
            None => Ok(()),
        }
    }

    /// `SendCtl`: control bytes kept for the next `Send` from channel `ch` (the shim
    /// sends them in a row, right before it).
    fn send_ctl(&mut self, ch: u32, offset: u32, bytes: &[u8]) -> Result<(), ProtoError> {
        let Some(chan) = self.chan_mut(ch) else {
            return Ok(());
        };
        let have = chan.send_ctl.len();
        if offset as usize != have || have + bytes.len() > cmsg::MAX_CONTROL {
            return Err(ProtoError::ControlOffset { offset, have });
        }
        chan.send_ctl.extend_from_slice(bytes);
        Ok(())
    }

    /// `connect(AF_UNSPEC)` on socket `id`: a datagram socket's association dissolves;
    /// a stream cannot (`EAFNOSUPPORT`, as the kernel's TCP says).
    fn disconnect(&mut self, id: u32) -> Result<(), Errno> {
        match self.socks.get(&id) {
            Some(s) if !s.is_stream() => self
                .io
                .connect_unspec(s.fd.as_fd())
                .map_err(|e| Errno::of(&e)),
            Some(_) => Err(Errno(libc::EAFNOSUPPORT)),
            None => Err(Errno(libc::EBADF)),
        }
    }

    /// `REQ_FILLED` with a connect of socket `id`: the shim filled the program's end of
    /// the pair, so that the fd polls unwritable while connecting, as the kernel's
    /// socket does. The filler goes when the connect ends (now, or at its completion).
    fn connect_filled(&mut self, id: u32, nonblock: bool) {
        match self.socks.get_mut(&id).map(|s| &mut s.conn) {
            Some(Conn::Connecting { filled, .. }) if nonblock => *filled = true,
            _ => self.drain_filler(id),
        }
    }

    /// `shutdown(how)` of socket `id`. Writing ends after what the program sent: its
    /// queued sends, its own bytes in the pair, a module's output (its input ends here).
    fn shutdown_call(&mut self, ch: u32, id: u32, tag: u32, how: i32) {
        let io = self.io;
        let module = self.modules.is_bound(id);
        if how != libc::SHUT_RD {
            // What the program wrote into the pair itself goes before the FIN.
            self.pair_input(id);
        }
        // Sends other threads queued before this call go out before the FIN.
        let fence = if how == libc::SHUT_RD {
            Default::default()
        } else {
            self.channels.fence(Some(ch))
        };
        let Some(s) = self.socks.get_mut(&id) else {
            self.done(ch, id, tag, Errno(libc::EBADF));
            return;
        };
        let shut = |how| io.shutdown(s.fd.as_fd(), how).map_err(|e| Errno::of(&e));
        let fenced = !fence.is_clear();
        if fenced {
            s.fence = fence;
            self.dirty.push(id);
        }
        let writes_wait = !s.txq.is_empty() || s.pair_in_wait || module || fenced;
        let res = if (how == libc::SHUT_WR || how == libc::SHUT_RDWR) && writes_wait {
            s.shut_wr_pending = true;
            if how == libc::SHUT_RDWR {
                shut(libc::SHUT_RD)
            } else {
                Ok(())
            }
        } else {
            shut(how)
        };
        self.done(ch, id, tag, res);
        if module {
            self.flush_tx(id);
        }
    }

    /// `setsockopt` on socket `id`: refused (`EPERM`) where it would let the sandbox
    /// reach what it may not (`sockopt.rs`, `reach.rs`); a value set is kept for a move.
    fn setopt(&mut self, id: u32, level: i32, name: i32, value: &[u8]) -> Result<(), Errno> {
        let Some(s) = self.socks.get_mut(&id) else {
            return Err(Errno(libc::EBADF));
        };
        let sticky_source =
            (level, name) == (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) && s.place != Place::Sandbox;
        let refused = sockopt::refused(level, name, value).map(str::to_owned);
        let refused = match cmsg::in6_pktinfo(value).filter(|_| sticky_source) {
            Some((index, ip)) if refused.is_none() => {
                ferry_egress::reach::source_refused(&mut self.host_addrs, index, ip)
            }
            _ => refused,
        };
        if let Some(why) = refused {
            if (level, name) == (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) {
                // Tried by every `curl --interface` (it falls back to the interface's
                // address, as for an unprivileged user): refused quietly.
                debug!("socket {id}: SO_BINDTODEVICE refused: {why}");
            } else {
                warn!("socket {id}: setsockopt({level}, {name}) refused: {why}");
            }
            return Err(Errno(libc::EPERM));
        }
        match self.io.setsockopt(s.fd.as_fd(), level, name, value) {
            Ok(()) => {
                // Kept for a move (one value per option: bounded).
                s.opts.retain(|(l, n, _)| (*l, *n) != (level, name));
                s.opts.push((level, name, value.to_vec()));
                if (level, name) == (libc::SOL_SOCKET, libc::SO_RCVBUF) {
                    bound_pair(self.io, s, value);
                }
                Ok(())
            }
            Err(e) => Err(Errno::of(&e)),
        }
    }

    /// `getsockname` (`peer` false) or `getpeername` of socket `id`, as a socket of its
    /// family shows it.
    fn name(&mut self, ch: u32, id: u32, tag: u32, peer: bool) {
        let Some(s) = self.socks.get(&id) else {
            self.done(ch, id, tag, Errno(libc::EBADF));
            return;
        };
        let c = match self.io.sock_addr(s.fd.as_fd(), peer) {
            Ok(Some(a)) => {
                let a = in_family(s.domain, a);
                Cmp::new(CmpKind::Done, id, tag, 0).with_addr(&WireAddr::from(a))
            }
            Ok(None) => Cmp::new(CmpKind::Done, id, tag, Errno(libc::EINVAL).wire()),
            Err(e) => Cmp::new(CmpKind::Done, id, tag, Errno::of(&e).wire()),
        };
        self.complete(ch, c);
    }

    /// A channel named a socket its process does not hold: refused (`EBADF`), logged.
    pub(crate) fn not_holder(&mut self, ch: u32, id: u32) {
        let pid = self.chan(ch).map_or(0, |c| c.owner.pid);
        if let Some(n) = self.strangers.tick() {
            warn!(
                "socket {id}: pid {pid} does not hold it (never made, accepted or claimed it); refused ({n} such requests since the last line)"
            );
        }
        self.stats.denied += 1;
    }

    fn getopt(&mut self, ch: u32, id: u32, tag: u32, level: i32, name: i32, len: u32) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id) else {
            self.done(ch, id, tag, Errno(libc::EBADF));
            return;
        };
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
                    self.done(ch, id, tag, Errno(libc::ENOBUFS));
                    return;
                };
                let span = chan.ep.bufs.span(
                    b.0,
                    0,
                    u32::try_from(n.min(chan.ep.bufs.buf_size())).unwrap_or(0),
                );
                let Ok(span) = span else {
                    let _ = chan.ep.pool.free(b);
                    self.done(ch, id, tag, Errno(libc::ENOBUFS));
                    return;
                };
                chan.ep.bufs.write(span, &val[..n]);
                let mut data = Cmp::new(CmpKind::Data, id, tag, 0);
                data.buf = b.0;
                data.len = span.len();
                chan.complete(data);
                let mut fin = Cmp::new(CmpKind::Done, id, tag, 0);
                fin.a = u32::try_from(n).unwrap_or(u32::MAX);
                chan.complete(fin);
            }
            Err(e) => self.done(ch, id, tag, Errno::of(&e)),
        }
    }
}

/// The program set `SO_RCVBUF` on stream `s` (to `value`, a C int): with the pair
/// receive path, received bytes wait in the pair as well as in the host socket, so the
/// pair's buffer (our end's send buffer, which is what bounds a unix stream) gets the
/// same size. A receiver that made its buffer small then holds as little as natively,
/// and a sender's writes meet the back-pressure (or the reset of a receiver that closes
/// with bytes unread) as early as they would.
pub(crate) fn bound_pair(io: &dyn crate::seam::Io, s: &crate::sock::Sock, value: &[u8]) {
    if s.rx_pair && value.len() >= 4 {
        let _ = io.setsockopt(
            s.pair.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &value[..4],
        );
    }
}
