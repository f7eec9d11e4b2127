//! The way out: sends queued from the rings (S1 on the host side: one vectored call
//! per socket per pass), bytes the program wrote straight into its pair, the shim's
//! filler (`WantRoom`, `REQ_FILLED`), and what waits for the sends to end (a pending
//! `SHUT_WR`, a closed socket). Owns the order rule: a send queued in the ring goes out
//! before pair bytes written after it. Must not: read host sockets.

use std::os::fd::AsFd;

use ferry_proto::{BufRef, Cmp, CmpKind, ProtoError, WireAddr, cmsg};
use tracing::{debug, warn};

use crate::channel::Channels;
use crate::modules::{Around, ModuleTarget, Modules};
use crate::ops::{Answer, Errno, would_block};
use crate::seam::Io;
use crate::send_side::SendEvent;
use crate::server::Server;
use crate::sock::ConnEvent;
use crate::sock::{Sock, TxItem};
use crate::stats::ServerStats;
use crate::table::{Gone, SockTable};
use ferry_sys::Epoll;

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
    if s.app_closed && s.pair_unmarked {
        // Final and without a marker: one peek (a small one first, as it is most often
        // empty).
        if peek_pair(io, s, &mut [0u8; 1]) == 0 {
            return Peeked::Nothing { marked: false };
        }
        buf.resize(PAIR_INPUT_CHUNK, 0);
        return match peek_pair(io, s, buf) {
            0 => Peeked::Nothing { marked: false },
            n => Peeked::Bytes(n),
        };
    }
    if io.pending_bytes(s.pair.as_fd()).is_ok_and(|n| n == 0) {
        // Nothing queued (a close with nothing written, most often): no mark, no bytes,
        // in one call (a pending error stays for `app_closed`'s question).
        return Peeked::Nothing { marked: false };
    }
    let at_mark = |s: &Sock| io.at_mark(s.pair.as_fd()).unwrap_or(false);
    if at_mark(s) {
        return Peeked::Nothing { marked: true };
    }
    buf.resize(PAIR_INPUT_CHUNK, 0);
    match peek_pair(io, s, buf) {
        0 => Peeked::Nothing { marked: false },
        _ if at_mark(s) => Peeked::Filler,
        n => Peeked::Bytes(n),
    }
}

/// Peeks at `s`'s pair into `buf`: the bytes seen, 0 for none or an error. A reset of
/// the pair is kept for `app_closed`, which would have read it as `SO_ERROR`.
fn peek_pair(io: &dyn Io, s: &mut Sock, buf: &mut [u8]) -> usize {
    match io.recv(s.pair.as_fd(), buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(n) => n,
        Err(e) => {
            if e.raw_os_error() == Some(libc::ECONNRESET) {
                s.send.moves(SendEvent::PairReset);
            }
            0
        }
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
    s.send.moves(SendEvent::PairGoes);
    match io.send(s.fd.as_fd(), bytes) {
        Ok(k) => {
            let _ = io.recv(pair, &mut bytes[..k], libc::MSG_DONTWAIT);
            s.stats.bytes_out += k as u64;
            s.send.moves(if k < n {
                SendEvent::PairWaits
            } else {
                SendEvent::PairGoes
            });
            (k, k == n)
        }
        Err(e) if would_block(&e) => {
            s.send.moves(SendEvent::PairWaits);
            (0, false)
        }
        Err(e) => {
            debug!("socket {}: bytes from the pair not sent: {e}", s.id);
            let _ = io.recv(pair, bytes, libc::MSG_DONTWAIT);
            (0, false)
        }
    }
}

/// What the way out works on: the seam, the event loop (a closed socket's pair leaves
/// it), the sockets, the channels (answers, buffers given back), the modules (a bound
/// socket's sends go through its module) and the counters; never the control
/// connections, published ports or the other servers. Borrowed from [`Server::tx`].
pub(crate) struct Tx<'a> {
    pub io: &'static dyn Io,
    pub epoll: &'a Epoll,
    pub socks: &'a mut SockTable,
    pub channels: &'a mut Channels,
    pub modules: &'a mut Modules,
    pub stats: &'a mut ServerStats,
}

impl Server {
    /// The parts the way out works on.
    pub(crate) fn tx(&mut self) -> Tx<'_> {
        Tx {
            io: self.io,
            epoll: &self.epoll,
            socks: &mut self.socks,
            channels: &mut self.channels,
            modules: &mut self.modules,
            stats: &mut self.stats,
        }
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
        let Some(chan) = self.channels.get_mut(ch) else {
            return Ok(());
        };
        let span = chan.lent_span(buf.id, offset, buf.len)?;
        let bufs = chan.ep.bufs.clone();
        let ctl = std::mem::take(&mut chan.send_ctl);
        let stream = match self.socks.get(&id) {
            Some(s) if self.socks.may_use(&self.channels, ch, id) => s.is_stream(),
            found => {
                if found.is_some() {
                    self.not_holder(ch, id);
                }
                self.tx().refuse_unknown_send(ch, id, buf.id);
                return Ok(());
            }
        };
        let to = to.filter(|_| !stream);
        let checked = match to {
            Some(dest) => self
                .connects()
                .placing()
                .route_to(id, dest, ferry_egress::What::Datagram)
                .map(drop),
            None => Ok(()),
        }
        .and_then(|()| self.send_control(id, stream, &ctl));
        let control = match checked {
            Ok(control) => control,
            Err(e) => {
                self.tx().refuse_send(ch, id, buf.id, 0, e);
                return Ok(());
            }
        };
        let Some(s) = self.socks.get_mut(&id) else {
            self.tx().refuse_unknown_send(ch, id, buf.id);
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
            self.socks.queue_tx(id);
        }
        Ok(())
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
        if let Some(why) = self.connects().placing().source_refused(id, &control) {
            warn!("socket {id}: datagram refused: {why}");
            self.stats.denied += 1;
            return Err(Errno(libc::EPERM));
        }
        Ok(control)
    }
}

impl Tx<'_> {
    /// The modules and the parts their data path works on.
    pub(crate) fn module_parts(&mut self) -> (&mut Modules, Around<'_>) {
        let around = Around {
            io: self.io,
            socks: &mut *self.socks,
            channels: &mut *self.channels,
            stats: &mut *self.stats,
        };
        (&mut *self.modules, around)
    }

    /// Queues a completion on channel `ch` (dropped if the channel is gone). A buffer
    /// coming back is room for the channel's next send: sockets waiting for it become
    /// writable again.
    pub(crate) fn complete(&mut self, ch: u32, c: Cmp) {
        let Some(chan) = self.channels.get_mut(ch) else {
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

    /// A non-blocking connect of socket `id` failed: the kernel's socket now reports
    /// `POLLERR|POLLHUP` beside `POLLOUT` until `SO_ERROR` is read, then `POLLHUP`. A
    /// unix socket reports `POLLERR` only when its peer went away with bytes unread, so
    /// our end, still holding the shim's filler (`REQ_FILLED`), is closed: the program's
    /// end gets `ECONNRESET` as its error (`POLLERR`, cleared by the shim when the
    /// program reads `SO_ERROR`, which the host socket answers) and both directions shut
    /// (`POLLHUP`). `POLLOUT` may come a moment later: the kernel wakes the program's
    /// end before it frees the filler, which is what kept it unwritable (a program
    /// polling then sees `POLLERR|POLLHUP` alone; taking the filler out first would
    /// instead show `POLLOUT` alone for a moment, which looks like a connect that
    /// succeeded). A placeholder whose peer is gone takes our end's place; from now on
    /// the pair's name says whether the program still holds the fd (checked when it
    /// closes one, when a channel goes, and at the end). A failed socket cannot connect
    /// again (Linux says `ECONNABORTED`), so the pair is not needed any more.
    pub(crate) fn detach_pair(&mut self, id: u32) {
        let Ok(placeholder) = self.io.orphan() else {
            self.drain_filler(id);
            return;
        };
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        let _ = self.epoll.delete(s.pair.as_fd());
        s.conn_moves(ConnEvent::Detached);
        drop(std::mem::replace(&mut s.pair, placeholder));
    }

    pub(crate) fn app_closed(&mut self, id: u32, how: Gone) {
        let io = self.io;
        if self.socks.get(&id).is_none_or(|s| s.app_closed) {
            return;
        }
        // Sends another thread queued before the close are still to come.
        let fence = self.channels.fence(None);
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        s.app_closed = true;
        s.fence = fence;
        let mut reset = false;
        if s.rx.pair() && s.connected() {
            // Closed with bytes unread (the kernel marks our end ECONNRESET when the
            // program's end goes with data queued): the peer gets a reset, as from a
            // kernel socket closed with unread data.
            reset = s.send.pair_reset()
                || s.rx.queued()
                || match how {
                    // The readiness that showed the close showed the error too.
                    Gone::Seen { reset } => reset,
                    Gone::Probed => io
                        .getsockopt_int(s.pair.as_fd(), libc::SOL_SOCKET, libc::SO_ERROR)
                        .is_ok_and(|e| e == libc::ECONNRESET),
                };
            if reset {
                let _ = io.linger_reset(s.fd.as_fd());
            }
        }
        // Out of the event loop at the end of this turn (or by its close, sooner).
        s.pair_listed = true;
        self.socks.mark_dirty(id);
        if !reset {
            // What the program wrote into its end before closing it still goes out.
            self.pair_input(id);
        }
    }

    /// Socket `id` was just accepted from a published port or is connecting to a
    /// destination (`target`): binds that target's configured module, if any.
    pub(crate) fn apply_rule(&mut self, id: u32, target: ModuleTarget) {
        let (m, mut a) = self.module_parts();
        match m.attach_rule(&mut a, id, target) {
            Some(Ok(())) => self.flush_tx(id),
            Some(Err(e)) => warn!(
                "socket {id}: configured module for {target} not bound (errno {})",
                e.0
            ),
            None => {}
        }
    }

    /// `WantRoom`: the shim filled socket `id`'s readiness pair after finding no free
    /// buffer in channel `ch`, having seen `seen` of its `BufReturn`s by then. Empties
    /// the pair at once if a buffer has come back since (the shim will find it), else
    /// at the channel's next `BufReturn`. So no wake-up is lost whichever comes first.
    pub(crate) fn want_room(&mut self, ch: u32, id: u32, seen: u32) {
        let Some(chan) = self.channels.get_mut(ch) else {
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
    /// ([`Tx::pair_input`]), which drains the filler when it reaches the mark. One
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
            s.send.moves(SendEvent::FillerBehind);
            self.pair_input(id);
            return;
        }
        s.drain_filler(io);
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

    /// Sends what the sockets queued during this pass of the rings (S1 on the host
    /// side: one vectored call per socket rather than one per record).
    pub(crate) fn flush_pending(&mut self) {
        for id in self.socks.take_tx_pending() {
            self.flush_tx(id);
        }
    }

    /// Sends queued data until the host socket is full; returns finished buffers.
    pub(crate) fn flush_tx(&mut self, id: u32) {
        let io = self.io;
        if self.modules.is_bound(id) && {
            let (m, mut a) = self.module_parts();
            m.flush(&mut a, id)
        } {
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
            Some(s) if s.txq.is_empty() && s.send.pair_waits() => {
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
        if !s.txq.is_empty() || s.send.pair_waits() {
            return;
        }
        if !s.fence.is_clear() {
            // Another thread's sends are still in its ring: `settle_dirty` comes back.
            self.socks.mark_dirty(id);
            return;
        }
        if s.send.moves(SendEvent::ShutWrGoes) {
            let _ = io.shutdown(s.fd.as_fd(), libc::SHUT_WR);
        }
        if s.app_closed {
            self.socks.mark_dirty(id);
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
                s.send.moves(SendEvent::PairWaits);
                return;
            }
            let n = match peek_program_bytes(io, s, &mut buf) {
                Peeked::Filler => continue,
                Peeked::Bytes(n) => n,
                Peeked::Nothing { marked } => {
                    // At a filler's marker, or empty (then no filler is coming: a drain
                    // asked of an unfilled pair).
                    let was_waiting = s.send.moves(SendEvent::PairGoes);
                    if s.send.moves(SendEvent::FillerReached) && marked {
                        s.drain_filler(io);
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
                s.send.moves(SendEvent::PairWaits);
                self.socks.resume_pair_input(id);
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
