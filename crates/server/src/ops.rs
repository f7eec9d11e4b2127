//! The request dispatcher: what each ring request and control message does. Who may
//! act on a socket, the order of operations within a pass over the rings, and the
//! completions that answer a request are decided here; the socket-level work is done
//! by `connect.rs` (where a socket lives, whom it talks to), `tx.rs` (the way out) and
//! `rx.rs` (the way in). Must not: call the kernel other than through the seam
//! (`seam.rs`), or trust a field of a record the decoder has not checked.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use ferry_proto::{Call, Cmp, CmpKind, Ctl, CtlKind, ProtoError, WireAddr};
use tracing::{debug, warn};

use crate::connect::in_family;
use crate::send_side::SendEvent;
use crate::server::Server;
use crate::sock::{ConnEvent, Sock, TokenEvent};
use crate::tx::Tx;

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
/// The reply to a control request: `result` (0, a value, or a negated errno).
pub(crate) fn reply(result: impl Into<Answer>) -> Ctl {
    Ctl {
        result: result.into().0,
        ..Ctl::new(ferry_proto::CtlKind::Reply, 0)
    }
}

pub(crate) fn reply_id(id: u32) -> Result<i32, Errno> {
    i32::try_from(id).map_err(|_| Errno(libc::ENFILE))
}

pub(crate) fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Server {
    /// A control message (socket creation, accept, claim). Errors here go back to the
    /// shim. Descriptors a message does not carry are closed.
    pub(crate) fn control(&mut self, ch: u32, msg: Ctl, mut fds: Vec<OwnedFd>) {
        let Some(kind) = msg.kind() else {
            self.bad_channel(ch, "control message of an unknown kind");
            return;
        };
        match kind {
            CtlKind::Socket => match self.connects().create_socket(ch, msg.a, msg.b, msg.c) {
                Ok((id, theirs)) => {
                    self.channels
                        .send_reply(self.io, ch, reply(reply_id(id)), &[theirs.as_fd()])
                }
                Err(e) => self.channels.answer(self.io, ch, e),
            },
            CtlKind::Accept if self.socks.may_use(&self.channels, ch, msg.sock) => {
                self.accept(ch, msg.sock, msg.a != 0)
            }
            CtlKind::Accept => self.channels.answer(self.io, ch, Errno(libc::EBADF)),
            CtlKind::Claim => {
                let result = match fds.pop() {
                    Some(fd) if fds.is_empty() => self.claim(ch, msg.sock, fd),
                    _ => Err(Errno(libc::EINVAL)),
                };
                self.channels.answer(self.io, ch, result);
            }
            CtlKind::Renew => {
                let renewed = match fds.pop() {
                    Some(fd) if fds.is_empty() => match self.claim(ch, msg.sock, fd) {
                        Ok(()) => self.socks.renew_pair(self.io, &self.epoll, msg.sock),
                        Err(e) => Err(e),
                    },
                    _ => Err(Errno(libc::EINVAL)),
                };
                match renewed {
                    Ok(theirs) => {
                        self.channels
                            .send_reply(self.io, ch, reply(0), &[theirs.as_fd()])
                    }
                    Err(e) => self.channels.answer(self.io, ch, e),
                }
            }
            CtlKind::Handoff => self.bad_channel(ch, "hand-off sent by the sandbox"),
            CtlKind::Reply => self.bad_channel(ch, "reply sent by the sandbox"),
            CtlKind::BindModule
            | CtlKind::Files
            | CtlKind::RegisterFile
            | CtlKind::UnregisterFile => {
                unreachable!("routed to the modules by ctl_readable")
            }
        }
    }

    /// `CtlKind::Claim`: channel `ch`'s process shows `fd` to prove it holds socket `id`.
    /// The proof holds when `fd` is a unix stream socket of the server's own network
    /// namespace (the sandbox cannot make one) bound to the socket's name (which only
    /// the program's end of its pair has: names are never used twice). Then the process
    /// may act on the socket from now on.
    fn claim(&mut self, ch: u32, id: u32, fd: OwnedFd) -> Result<(), Errno> {
        let io = self.io;
        let Some(owner) = self.channels.get(ch).map(|c| c.owner) else {
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
        s.holders.add(owner);
        Ok(())
    }

    /// One decoded ring request. `Err` means the channel broke the protocol.
    pub(crate) fn handle(&mut self, ch: u32, call: Call) -> Result<(), ProtoError> {
        match call {
            Call::BufReturn { buf, .. } => return self.channels.buffer_returned(ch, buf),
            Call::SendCtl { offset, bytes, .. } => {
                return self.channels.send_ctl(ch, offset, bytes.as_bytes());
            }
            _ => {}
        }
        let id = call.sock();
        if !self.socks.contains(id) && ferry_proto::server_of(id) == self.index {
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
                self.tx().done(ch, id, tag, 0);
                return Ok(());
            }
            Call::BindModule {
                tag,
                binding,
                files,
                ..
            } => {
                // Ordered with the sends before it; they go out before the module's output.
                self.tx().flush_pending();
                return self.tx().bind_module_req(ch, id, tag, binding, files);
            }
            _ => {}
        }
        // Program order across sockets: what this pass queued goes out before an
        // operation that may observe it (a recv on the loopback peer, a connect…).
        self.tx().flush_pending();
        if let Call::Release { tag, .. } = call {
            // Closed already, or closing now: either way `close` may return. (A close
            // the pair's hang-up showed first needs no second look.)
            if self.socks.get(&id).is_some_and(|s| !s.app_closed)
                && let Some(how) = self.socks.app_gone(self.io, id)
            {
                self.tx().app_closed(id, how);
                self.settle_dirty();
            }
            self.tx().done(ch, id, tag, 0);
            return Ok(());
        }
        if !self.socks.may_use(&self.channels, ch, id) {
            self.not_holder(ch, id);
            self.tx().done(ch, id, call.tag(), Errno(libc::EBADF));
            return Ok(());
        }
        let Some(s) = self.socks.get_mut(&id) else {
            self.tx().done(ch, id, call.tag(), Errno(libc::EBADF));
            return Ok(());
        };
        s.stats.calls += 1;
        s.last_ch = ch;
        if !s.txq.is_empty() {
            // Operations on a socket happen in order: sends queued earlier in this pass
            // go out before, say, a getsockname that must see the port they bound.
            self.tx().flush_tx(id);
        }
        self.socket_call(ch, id, call);
        Ok(())
    }

    /// A request about socket `id`, which channel `ch`'s process holds.
    fn socket_call(&mut self, ch: u32, id: u32, call: Call) {
        match call {
            Call::Disconnect { tag, .. } => self.tx().disconnect(ch, id, tag),
            Call::Connect {
                tag,
                addr,
                nonblock,
                filled,
                ..
            } => {
                if !self.connects().connect(ch, id, tag, addr, nonblock) {
                    self.bad_channel(ch, "too many blocking requests on one socket");
                }
                if filled {
                    self.tx().connect_filled(id, nonblock);
                }
            }
            Call::Bind { tag, addr, .. } => {
                let res = self.bind(id, addr.to_std());
                self.tx().done(ch, id, tag, res);
            }
            Call::Listen { tag, backlog, .. } => {
                let res = self.connects().listen(id, backlog);
                if matches!(res, Ok(true)) {
                    self.host_event(id, libc::EPOLLIN as u32);
                }
                self.tx().done(ch, id, tag, res.map(|_| ()));
            }
            Call::Recv {
                tag,
                max,
                flags,
                nonblock,
                ..
            } => {
                if !self.rx().recv(ch, id, tag, max, flags, nonblock) {
                    self.bad_channel(ch, "too many blocking requests on one socket");
                }
            }
            Call::Shutdown { tag, how, .. } => {
                let res = self.tx().shutdown_call(ch, id, how);
                if how != libc::SHUT_WR
                    && res.is_ok()
                    && self.socks.get(&id).is_some_and(Sock::reads_pair)
                {
                    // The host socket now reads its end (the kernel's epoll says so in a
                    // later turn): take it before the answer, so that the shim, which
                    // shuts its end's read side next and asks how the stream ended,
                    // hears of the end (it heard EAGAIN when it asked first).
                    self.host_event(id, (libc::EPOLLIN | libc::EPOLLRDHUP).cast_unsigned());
                }
                let mut tx = self.tx();
                tx.done(ch, id, tag, res);
                if tx.modules.is_bound(id) {
                    tx.flush_tx(id);
                }
            }
            Call::SetOpt {
                tag,
                level,
                name,
                value,
                ..
            } => {
                let (io, addrs) = (self.io, &mut self.host_addrs);
                let res = self
                    .socks
                    .get_mut(&id)
                    .map(|s| s.setopt(io, addrs, (level, name), value.as_bytes()));
                self.tx()
                    .done(ch, id, tag, res.unwrap_or(Err(Errno(libc::EBADF))));
            }
            Call::GetOpt {
                tag,
                level,
                name,
                len,
                ..
            } => self.tx().getopt(ch, id, tag, level, name, len),
            Call::SockName { tag, .. } => self.tx().name(ch, id, tag, false),
            Call::PeerName { tag, .. } => self.tx().name(ch, id, tag, true),
            Call::Pending { tag, .. } => self.tx().pending(ch, id, tag),
            Call::WantToken { .. } => self.rx().token_moves(id, TokenEvent::Want),
            Call::TokenDrained { .. } => self.rx().token_moves(id, TokenEvent::Drained),
            Call::WantRoom { returns_seen, .. } => self.tx().want_room(ch, id, returns_seen),
            Call::Cancel { parked, .. } => self.tx().cancel(ch, id, parked),
            // Taken by `handle` before it looks the socket up.
            Call::Send { .. }
            | Call::SendCtl { .. }
            | Call::BufReturn { .. }
            | Call::Release { .. }
            | Call::Order { .. }
            | Call::BindModule { .. } => {}
        }
    }

    /// A channel named a socket its process does not hold: refused (`EBADF`), logged.
    pub(crate) fn not_holder(&mut self, ch: u32, id: u32) {
        let pid = self.channels.get(ch).map_or(0, |c| c.owner.pid);
        if let Some(n) = self.strangers.tick() {
            warn!(
                "socket {id}: pid {pid} does not hold it (never made, accepted or claimed it); refused ({n} such requests since the last line)"
            );
        }
        self.stats.denied += 1;
    }
}

/// A socket's requests that are answered at once, through the way out.
impl Tx<'_> {
    /// `connect(AF_UNSPEC)` of socket `id`.
    pub(crate) fn disconnect(&mut self, ch: u32, id: u32, tag: u32) {
        let res = self.socks.get(&id).map(|s| s.disconnect(self.io));
        self.done(ch, id, tag, res.unwrap_or(Err(Errno(libc::EBADF))));
    }

    /// `FIONREAD` of socket `id`: the bytes its host socket holds.
    pub(crate) fn pending(&mut self, ch: u32, id: u32, tag: u32) {
        let res = self.socks.get(&id).map_or(Err(Errno(libc::EBADF)), |s| {
            self.io
                .pending_bytes(s.fd.as_fd())
                .map_err(|e| Errno::of(&e))
        });
        self.done(ch, id, tag, res);
    }

    /// `Cancel`: the shim gave up the request `parked` of channel `ch` waits on socket
    /// `id` for (a signal, a timeout); it is answered `EINTR` if it still waits.
    pub(crate) fn cancel(&mut self, ch: u32, id: u32, parked: u32) {
        if let Some(p) = self.socks.unpark(id, |p| p.owner() == (ch, parked)) {
            debug!("socket {id}: cancelled {p:?}");
            self.done(ch, id, parked, Errno(libc::EINTR));
        }
    }

    /// `REQ_FILLED` with a connect of socket `id`: the shim filled the program's end of
    /// the pair, so that the fd polls unwritable while connecting, as the kernel's
    /// socket does. The filler goes when the connect ends (now, or at its completion).
    pub(crate) fn connect_filled(&mut self, id: u32, nonblock: bool) {
        let filled = nonblock
            && self
                .socks
                .get_mut(&id)
                .is_some_and(|s| s.conn_moves(ConnEvent::Filled));
        if !filled {
            self.drain_filler(id);
        }
    }

    /// `shutdown(how)` of socket `id` for channel `ch` (the caller answers). Writing ends
    /// after what the program sent: its queued sends, its own bytes in the pair, a
    /// module's output (its input ends here; the caller flushes it after the answer).
    pub(crate) fn shutdown_call(&mut self, ch: u32, id: u32, how: i32) -> Result<(), Errno> {
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
            return Err(Errno(libc::EBADF));
        };
        let shut = |how| io.shutdown(s.fd.as_fd(), how).map_err(|e| Errno::of(&e));
        let fenced = !fence.is_clear();
        if fenced {
            s.fence = fence;
        }
        let writes_wait = !s.txq.is_empty() || s.send.pair_waits() || module || fenced;
        let res = if (how == libc::SHUT_WR || how == libc::SHUT_RDWR) && writes_wait {
            s.send.moves(SendEvent::ShutWrWaits);
            if how == libc::SHUT_RDWR {
                shut(libc::SHUT_RD)
            } else {
                Ok(())
            }
        } else {
            shut(how)
        };
        if fenced {
            self.socks.mark_dirty(id);
        }
        res
    }

    /// `getsockname` (`peer` false) or `getpeername` of socket `id`, as a socket of its
    /// family shows it.
    pub(crate) fn name(&mut self, ch: u32, id: u32, tag: u32, peer: bool) {
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

    pub(crate) fn getopt(&mut self, ch: u32, id: u32, tag: u32, level: i32, name: i32, len: u32) {
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
                let Some(chan) = self.channels.get_mut(ch) else {
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
/// (A pair so bounded is not widened for bulk: `rx.rs`'s `widen_pair`.)
pub(crate) fn bound_pair(io: &dyn crate::seam::Io, s: &mut crate::sock::Sock, value: &[u8]) {
    if s.rx.pair() && value.len() >= 4 {
        s.rx.bound();
        let _ = io.setsockopt(
            s.pair.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &value[..4],
        );
    }
}
