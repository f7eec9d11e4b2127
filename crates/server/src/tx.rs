//! The way out: sends queued from the rings (S1 on the host side: one vectored call
//! per socket per pass), bytes the program wrote straight into its pair, the shim's
//! filler (`WantRoom`, `REQ_FILLED`), and what waits for the sends to end (a pending
//! `SHUT_WR`, a closed socket). Owns the order rule: a send queued in the ring goes out
//! before pair bytes written after it. Must not: read host sockets.

use std::os::fd::AsFd;

use ferry_proto::{BufRef, Cmp, CmpKind, ProtoError, WireAddr, cmsg};
use tracing::{debug, warn};

use crate::ops::{Errno, would_block};
use crate::seam::Io;
use crate::server::Server;
use crate::sock::{Sock, TxItem};

/// Most bytes the program wrote into its pair that one host send takes.
const PAIR_INPUT_CHUNK: usize = 64 * 1024;

/// What [`peek_program_bytes`] found in a pair.
enum Peeked {
    /// Bytes the program wrote, in the buffer.
    Bytes(usize),
    /// None: at a filler's marker (`marked`), or empty.
    Nothing { marked: bool },
    /// A filler's marker came first after all: the peek saw filler (look again).
    Filler,
}

/// Peeks at what the program wrote into `s`'s pair, up to the next filler marker.
fn peek_program_bytes(io: &dyn Io, s: &mut Sock, buf: &mut Vec<u8>) -> Peeked {
    let pair = s.pair.as_fd();
    let at_mark = |fd| io.at_mark(fd).unwrap_or(false);
    if at_mark(pair) {
        return Peeked::Nothing { marked: true };
    }
    buf.resize(PAIR_INPUT_CHUNK, 0);
    let n = match io.recv(pair, buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(n) => n,
        Err(e) => {
            // Kept for `app_closed`, which would have read it as SO_ERROR.
            s.pair_reset |= e.raw_os_error() == Some(libc::ECONNRESET);
            0
        }
    };
    match n {
        0 => Peeked::Nothing { marked: false },
        _ if at_mark(pair) => Peeked::Filler,
        n => Peeked::Bytes(n),
    }
}

/// Sends the program's bytes `bytes` (peeked from `s`'s pair) on the host socket and
/// takes out of the pair what it accepted. Returns the bytes sent and whether all went
/// (else `pair_in_wait`: the host socket's `EPOLLOUT` resumes). On a broken connection
/// the bytes are dropped, as a kernel socket's unsent ones would be (the program's
/// write had already succeeded).
fn forward_program_bytes(io: &dyn Io, s: &mut Sock, bytes: &mut [u8]) -> (usize, bool) {
    let n = bytes.len();
    let pair = s.pair.as_fd();
    s.pair_in_wait = false;
    match io.send(s.fd.as_fd(), bytes) {
        Ok(k) => {
            let _ = io.recv(pair, &mut bytes[..k], libc::MSG_DONTWAIT);
            s.stats.bytes_out += k as u64;
            s.pair_in_wait = k < n;
            (k, k == n)
        }
        Err(e) if would_block(&e) => {
            s.pair_in_wait = true;
            (0, false)
        }
        Err(e) => {
            debug!("socket {}: bytes from the pair not sent: {e}", s.id);
            let _ = io.recv(pair, bytes, libc::MSG_DONTWAIT);
            (0, false)
        }
    }
}

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

    /// A `Send` from channel `ch` on socket `id`: `len` bytes at `offset` in the shim's
    /// buffer (lent until the `BufReturn`), to `dest` (a datagram's), with `MSG_*`
    /// `flags`; the `SendCtl` bytes before it are its control messages.
    pub(crate) fn send(
        &mut self,
        ch: u32,
        id: u32,
        buf: BufRef,
        offset: u32,
        flags: i32,
        to: Option<WireAddr>,
    ) -> Result<(), ProtoError> {
        let Some(chan) = self.chan_mut(ch) else {
            return Ok(());
        };
        let span = chan.lent_span(buf.id, offset, buf.len)?;
        let bufs = chan.ep.bufs.clone();
        let ctl = std::mem::take(&mut chan.send_ctl);
        let stream = match self.socks.get(&id) {
            Some(s) if self.may_use(ch, id) => s.is_stream(),
            found => {
                if found.is_some() {
                    self.not_holder(ch, id);
                }
                self.refuse_unknown_send(ch, id, buf.id);
                return Ok(());
            }
        };
        let to = to.filter(|_| !stream);
        let checked = match to {
            Some(dest) => self
                .route_to(id, dest, ferry_egress::What::Datagram)
                .map(drop),
            None => Ok(()),
        }
        .and_then(|()| self.send_control(id, stream, &ctl));
        let control = match checked {
            Ok(control) => control,
            Err(e) => {
                self.refuse_send(ch, id, buf.id, 0, e);
                return Ok(());
            }
        };
        let Some(s) = self.socks.get_mut(&id) else {
            self.refuse_unknown_send(ch, id, buf.id);
            return Ok(());
        };
        s.stats.calls += 1;
        s.txq.push_back(TxItem {
            ch,
            bufs,
            span,
            sent: 0,
            to: to.map(WireAddr::to_std),
            flags: flags & (libc::MSG_MORE | libc::MSG_OOB | libc::MSG_EOR),
            control,
        });
        if s.txq.len() == 1 {
            // Sent once the rings are drained: every send of this turn in one call.
            self.tx_pending.push(id);
        }
        Ok(())
    }

    /// A send on a socket the channel's process does not have: its buffer goes back
    /// with `EBADF`, which is reported on the next call too.
    fn refuse_unknown_send(&mut self, ch: u32, id: u32, buf: u32) {
        self.refuse_send(ch, id, buf, Errno(libc::EBADF).wire(), Errno(libc::EBADF));
    }

    /// A send on socket `id` that does not go out: its buffer goes back (with
    /// `returned`, which the shim reads as the send's own result) and `error` is
    /// reported on the program's next call.
    fn refuse_send(&mut self, ch: u32, id: u32, buf: u32, returned: i32, error: Errno) {
        let mut c = Cmp::new(CmpKind::BufReturn, id, 0, returned);
        c.buf = buf;
        self.complete(ch, c);
        self.done(ch, id, 0, error);
    }

    /// The control messages of a datagram of socket `id` (`ctl`, from `SendCtl`
    /// records), checked: only those a sandbox may send, and a source only where the
    /// host may be a source (`reach.rs`). A stream sends none.
    fn send_control(&mut self, id: u32, stream: bool, ctl: &[u8]) -> Result<Vec<u8>, Errno> {
        if ctl.is_empty() || stream {
            return Ok(Vec::new());
        }
        let control = cmsg::sanitize_send(ctl).map_err(|e| {
            warn!("socket {id}: datagram refused: {e}");
            Errno(e.errno())
        })?;
        if let Some(why) = self.source_refused(id, &control) {
            warn!("socket {id}: datagram refused: {why}");
            self.stats.denied += 1;
            return Err(Errno(libc::EPERM));
        }
        Ok(control)
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
            let batch = s.tx_batch();
            let res = io.send_items(s.fd.as_fd(), s.txq.range(..batch));
            self.stats.data_syscalls += 1;
            match res {
                Ok(n) => {
                    s.stats.bytes_out += n as u64;
                    self.stats.bytes_out += n as u64;
                    for item in s.take_sent(n) {
                        self.return_buffer(item.ch, id, item.span.id().0, item.span.len());
                    }
                }
                Err(e) if would_block(&e) => return,
                Err(e) => {
                    // The connection is broken: give every buffer back, each saying the
                    // error and how much of it went out (a blocking send reports what
                    // of it the host took, as the kernel's does), and report once.
                    let items: Vec<TxItem> = s.txq.drain(..).collect();
                    let code = Errno::of(&e);
                    let mut report = Some(code);
                    for item in items {
                        let mut c = Cmp::new(CmpKind::BufReturn, id, 0, code.wire());
                        c.buf = item.span.id().0;
                        c.len = u32::try_from(item.sent).unwrap_or(u32::MAX);
                        self.complete(item.ch, c);
                        if let Some(code) = report.take() {
                            self.complete(
                                item.ch,
                                Cmp::new(CmpKind::AsyncError, id, 0, code.wire()),
                            );
                        }
                    }
                    break;
                }
            }
        }
        match self.socks.get(&id) {
            Some(s) if s.txq.is_empty() && s.pair_in_wait => {
                // The program's own bytes in the pair came after these sends (once they
                // are out, `pair_input` finishes what waited for them).
                self.pair_input(id);
            }
            Some(s) if s.txq.is_empty() => self.after_sends(id),
            _ => {}
        }
    }

    /// A send of socket `id` is finished: shim buffer `buf` goes back to channel `ch`.
    /// Its `len` says how many bytes the record carried (the shim counts a socket's
    /// bytes in flight against its `SO_SNDBUF`).
    fn return_buffer(&mut self, ch: u32, id: u32, buf: u32, len: u32) {
        let mut c = Cmp::new(CmpKind::BufReturn, id, 0, 0);
        c.buf = buf;
        c.len = len;
        self.complete(ch, c);
    }

    /// Once everything the program sent is out (queued sends and its own bytes in the
    /// pair): a pending `shutdown` for writing happens, a closed socket can go.
    pub(crate) fn after_sends(&mut self, id: u32) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if !s.txq.is_empty() || s.pair_in_wait {
            return;
        }
        if !s.fence.is_clear() {
            // Another thread's sends are still in its ring: `settle_dirty` comes back.
            self.dirty.push(id);
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
            let n = match peek_program_bytes(io, s, &mut buf) {
                Peeked::Filler => continue,
                Peeked::Bytes(n) => n,
                Peeked::Nothing { marked } => {
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
            };
            // Looked at after the bytes: a send the program queued before writing them
            // is in a ring by now, and goes first (at the end of this pass over the
            // rings).
            if self.channels.rings_pending() {
                s.pair_in_wait = true;
                self.pair_resume.push(id);
                return;
            }
            let (sent, all) = forward_program_bytes(io, s, &mut buf[..n]);
            self.stats.bytes_out += sent as u64;
            if !all {
                return;
            }
        }
    }
}
