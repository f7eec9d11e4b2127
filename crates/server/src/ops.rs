//! The request dispatcher: what each ring request and control message does. Who may
//! act on a socket, the order of operations within a pass over the rings, and the
//! completions that answer a request are decided here; the socket-level work is done
//! by `connect.rs` (where a socket lives, whom it talks to), `tx.rs` (the way out) and
//! `rx.rs` (the way in). Must not: call the kernel other than through the seam
//! (`seam.rs`), or trust a field of a record the decoder has not checked.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use ferry_proto::{
    Cmp, CmpKind, Ctl, CtlKind, Op, REQ_FILLED, REQ_NONBLOCK, Request, WireAddr, cmsg,
};
use ferry_ring::BufId;
use tracing::{debug, warn};

use crate::connect::in_family;
use crate::server::Server;
use crate::sock::{Conn, Place, Token};
use crate::sockopt;

/// Most operations one channel may have waiting on one socket (a shim has one).
pub(crate) const MAX_PARKED_PER_CHANNEL: usize = 4;

pub(crate) fn errno(e: &io::Error) -> i32 {
    -e.raw_os_error().unwrap_or(libc::EIO)
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

    pub(crate) fn done(&mut self, ch: u32, sock: u32, tag: u32, result: i32) {
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
}
