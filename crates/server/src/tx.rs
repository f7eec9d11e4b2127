//! The way out: sends queued from the rings (S1 on the host side: one vectored call
//! per socket per pass), bytes the program wrote straight into its pair, the shim's
//! filler (`WantRoom`, `REQ_FILLED`), and what waits for the sends to end (a pending
//! `SHUT_WR`, a closed socket). Owns the order rule: a send queued in the ring goes out
//! before pair bytes written after it. Must not: read host sockets.

use std::os::fd::AsFd;

use ferry_proto::{Cmp, CmpKind, Request, WireAddr, cmsg};
use tracing::{debug, warn};

use crate::connect::remember;
use crate::ops::{errno, would_block};
use crate::policy::Verdict;
use crate::seam::Io;
use crate::server::Server;
use crate::sock::{Sock, TxItem};

/// Most bytes the program wrote into its pair that one host send takes.
const PAIR_INPUT_CHUNK: usize = 64 * 1024;

impl Server {
    /// `WantRoom`: the shim filled socket `id`'s readiness pair after finding no free
    /// buffer in channel `ch`, having seen `seen` of its `BufReturn`s by then. Empties
    /// the pair at once if a buffer has come back since (the shim will find it), else
    /// at the channel's next `BufReturn`. So no wake-up is lost whichever comes first.
    pub(crate) fn want_room(&mut self, ch: u32, id: u32, seen: u32) {
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

    pub(crate) fn send(&mut self, ch: u32, req: Request) -> Result<(), String> {
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
}
