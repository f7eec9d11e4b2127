//! The way in: receives into channel buffers (the ring path), host bytes pumped into
//! pairs (the pair path: copied or spliced, urgent data at its mark, the end of the
//! stream and the hang-up, the [`PairEnd`] table in `sock.rs`), readiness tokens (the
//! [`Token`] table), and host readiness events (a connect's end, parked operations).
//! Must not: send on host sockets itself (a writable host socket is `tx.rs`'s).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use ferry_egress::{Origin, What, admit};
use ferry_proto::{CMP_DRAIN_TOKEN, Cmp, CmpKind, NO_BUF, WireAddr, cmsg};
use ferry_ring::{BufId, BufSpan, Buffers};
use ferry_sys::Received;

use crate::Config;
use crate::channel::Channel;
use crate::channel::Channels;
use crate::group::Shared;
use crate::modules::Modules;
use crate::ops::{Errno, would_block};
use crate::recv_side::{EndEvent, PathEvent, UrgentEvent};
use crate::seam::Io;
use crate::server::Server;
use crate::sock::{Conn, PairEnd, Parked, Place, Sock, Token, TokenEvent};
use crate::stats::ServerStats;
use crate::table::SockTable;
use crate::token::{T_PAIR, pair_room_events, token};
use crate::tx::Tx;
use ferry_sys::Epoll;
use tracing::debug;

/// Most buffers one receive fills.
const MAX_RECV_BUFS: usize = 4;

/// `rx_pair`: the server's buffer for host bytes on their way into a pair.
const RX_SCRATCH: usize = 64 * 1024;

/// `rx_pair`: bytes per splice of a bulk stream (host socket → pipe → pair). What the
/// pair does not take waits in the pipe (see [`RxScratch`]).
const RX_SPLICE: usize = 256 * 1024;

/// `rx_pair`: the send buffer asked for a bulk stream's pair (its end's `SO_SNDBUF`,
/// which bounds a unix stream; the kernel caps it at `net.core.wmem_max` and doubles
/// it). The default (`wmem_default`, 208 KiB) holds about three 64 KiB splices: the
/// pair filled up after most splices, and the program got less per read.
const RX_PAIR_BULK: i32 = 1 << 20;

/// `rx_pair`: a splice that moves less than this ends a stream's bulk mode.
const SPLICE_MIN: usize = 16 * 1024;

/// `rx_pair`: the server's pipe (pages, not bytes, are what a splice fills: room for
/// many small segments).
const RX_PIPE: usize = 1 << 20;

/// One splice of bulk stream `s`: host socket → the pipe (read end, write end) → pair.
/// What the pair does not take stays in the pipe for the next pump (`s.rx`'s piped
/// bytes): the pipe is then `s`'s until they are through.
fn splice_bulk(io: &dyn Io, s: &mut Sock, (pr, pw): &(OwnedFd, OwnedFd)) -> io::Result<usize> {
    let r = io.splice(s.fd.as_fd(), pw.as_fd(), RX_SPLICE);
    let Ok(n @ 1..) = r else {
        return r;
    };
    let moved = io.splice(pr.as_fd(), s.pair.as_fd(), n).unwrap_or(0);
    s.rx.set_piped(n - moved.min(n));
    s.rx.move_path(if n >= SPLICE_MIN {
        PathEvent::FullRead
    } else {
        PathEvent::ShortRead
    });
    r
}

/// A bulk stream's program has read enough of what its full pair kept waiting: the
/// pair may hold more (see [`RX_PAIR_BULK`] and `RecvSide::widen_due`).
fn widen_pair(io: &dyn Io, s: &mut Sock) {
    if s.rx.widen_due() {
        let v = RX_PAIR_BULK.to_ne_bytes();
        let _ = io.setsockopt(s.pair.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &v);
    }
}

/// Buffers of `chan` lent to one receive of `len` bytes: up to [`MAX_RECV_BUFS`] for a
/// stream, one for a datagram; none when the shim holds them all.
fn lend_buffers(chan: &mut Channel, stream: bool, len: u32) -> Vec<(BufId, BufSpan)> {
    let bs = chan.ep.bufs.buf_size();
    let want = (len as usize).max(1);
    let nbufs = if stream {
        want.div_ceil(bs).min(MAX_RECV_BUFS)
    } else {
        1
    };
    let mut lent = Vec::with_capacity(nbufs);
    let mut left = want;
    for _ in 0..nbufs {
        let Some(b) = chan.ep.pool.alloc() else { break };
        let take = left.min(bs);
        let span = chan
            .ep
            .bufs
            .span(b.0, 0, u32::try_from(take).unwrap_or(u32::MAX))
            .expect("own buffer, in range");
        lent.push((b, span));
        left -= take;
    }
    lent
}

/// What a receive on the host may let through, and where it counts what it drops.
struct Arrivals<'a> {
    policy: &'a ferry_egress::Policy,
    stats: &'a mut crate::stats::ServerStats,
}

impl Arrivals<'_> {
    /// One receive of `s` into `spans`. A datagram on the host from a source the
    /// sandbox may not talk to (the policy's, the host's own, or not one a socket with a
    /// chosen port contacted) is dropped, as a firewall would, and the next one read.
    fn recv(
        self,
        io: &dyn Io,
        s: &Sock,
        bufs: &Buffers,
        spans: &[BufSpan],
        flags: i32,
        control: &mut [u8],
    ) -> io::Result<Received> {
        let filter = !s.is_stream() && s.place != Place::Sandbox;
        let contacted = s.contacted.as_deref();
        let refused = |f: SocketAddr| {
            !admit(self.policy, What::Arrival, Origin::Host, f).admitted()
                || contacted.is_some_and(|c| !c.contains(&f))
        };
        loop {
            let got = io.recv_spans(
                s.fd.as_fd(),
                bufs,
                spans,
                flags & (libc::MSG_PEEK | libc::MSG_TRUNC | libc::MSG_OOB),
                (!s.is_stream()).then_some(&mut *control),
            );
            self.stats.data_syscalls += 1;
            match got {
                Ok(got) if filter && got.from.is_some_and(refused) => {
                    if flags & libc::MSG_PEEK != 0 {
                        let _ = io.recv(s.fd.as_fd(), &mut [0u8; 1], libc::MSG_DONTWAIT);
                    }
                    self.stats.dropped_arrivals += 1;
                }
                other => return other,
            }
        }
    }
}

/// Answers receive `tag` of socket `s` that got `got` into `lent`: a `Data` record per
/// buffer with bytes (the others go back to the pool), the control bytes in `Control`
/// records, and `Done` (with the sender of a datagram, and the token's drain when the
/// host socket is now empty). Returns the bytes placed.
#[allow(clippy::too_many_arguments)]
fn answer_recv(
    io: &dyn Io,
    chan: &mut Channel,
    s: &mut Sock,
    tag: u32,
    flags: i32,
    lent: Vec<(BufId, BufSpan)>,
    got: Received,
    control: &[u8],
) -> u64 {
    let id = s.id;
    let room: usize = lent.iter().map(|(_, sp)| sp.len() as usize).sum();
    let placed = got.len.min(room);
    s.stats.bytes_in += placed as u64;
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
        c.len = u32::try_from(n).unwrap_or(u32::MAX);
        chan.complete(c);
    }
    for (i, chunk) in control.chunks(cmsg::CHUNK).enumerate() {
        let mut c = Cmp::new(CmpKind::Control, id, tag, 0).with_bytes(chunk);
        c.a = u32::try_from(i * cmsg::CHUNK).unwrap_or(u32::MAX);
        chan.complete(c);
    }
    let mut fin = Cmp::new(
        CmpKind::Done,
        id,
        tag,
        i32::try_from(got.len).unwrap_or(i32::MAX),
    );
    fin.a = got.flags.cast_unsigned();
    if let Some(from) = got.from.filter(|_| !s.is_stream()) {
        fin = fin.with_addr(&WireAddr::from(from));
    }
    fin.buf = NO_BUF;
    // A polled socket: if the host socket is now empty, take the token back (a token
    // left behind would make the next poll report data that is not there). A short
    // stream read means empty without asking the kernel; if data arrived meanwhile,
    // `TokenDrained`'s re-check writes a fresh token. Short of the buffers lent, not of
    // the length asked for: a read of more than MAX_RECV_BUFS buffers (or with fewer
    // free) that fills them all may have left data behind, and the host socket,
    // edge-triggered, brings no new edge for it. Nor after a hang-up (`RecvSide::ending`): its
    // edge came before this read, and the end of the stream is still to read.
    let short = s.is_stream() && placed < room && !s.rx.ending();
    if short && flags & (libc::MSG_PEEK | libc::MSG_OOB) == 0 {
        s.rx.found_empty();
    }
    if s.token_out()
        && flags & libc::MSG_PEEK == 0
        && (short || io.poll_now(s.fd.as_fd(), libc::POLLIN).unwrap_or(0) == 0)
    {
        fin.flags |= CMP_DRAIN_TOKEN;
    }
    chan.complete(fin);
    placed as u64
}

/// Where host bytes land on their way into pairs (the pair path): the server's buffer,
/// and the pipe bulk streams are spliced through. Made at the first pump.
///
/// The pipe holds at most one stream's bytes, those its pair did not take (`held`:
/// the socket and their count, the same as its `rx.piped()`); the next pumps of that
/// stream move them on before it reads again, and other bulk streams are copied
/// meanwhile. A holder that went (its count no longer matches) leaves its bytes to
/// no one: the pipe is closed and made anew.
#[derive(Debug, Default)]
pub(crate) struct RxScratch {
    buf: Vec<u8>,
    pipe: Option<(OwnedFd, OwnedFd)>,
    held: Option<(u32, usize)>,
}

impl RxScratch {
    fn ready(&mut self, io: &dyn Io) {
        if self.buf.is_empty() {
            self.buf = vec![0u8; RX_SCRATCH];
        }
        if self.pipe.is_none() {
            // Without a pipe (out of descriptors), bulk streams are copied too.
            self.pipe = io.rx_pipe(RX_PIPE);
        }
    }

    /// Forgets the pipe's bytes when their stream is gone (see the type).
    fn check_holder(&mut self, socks: &SockTable) {
        if let Some((id, n)) = self.held
            && socks.get(&id).is_none_or(|s| s.rx.piped() != n)
        {
            self.held = None;
            self.pipe = None;
        }
    }

    /// Moves `s`'s bytes waiting in the pipe into its pair; false while some are left.
    fn pipe_into_pair(&mut self, io: &dyn Io, s: &mut Sock) -> bool {
        let n = s.rx.piped();
        if n == 0 {
            return true;
        }
        let Some((pr, _)) = self.pipe.as_ref() else {
            // (Not expected: the pipe goes only with its holder.) The bytes are lost:
            // the stream ends with EIO.
            s.rx.set_piped(0);
            s.so_error = libc::EIO;
            s.mirror_eof(io);
            return false;
        };
        let moved = io.splice(pr.as_fd(), s.pair.as_fd(), n).unwrap_or(0);
        s.rx.set_piped(n - moved.min(n));
        self.note(s);
        s.rx.piped() == 0
    }

    /// Records who holds the pipe after a splice of `s`.
    fn note(&mut self, s: &Sock) {
        self.held = (s.rx.piped() > 0).then_some((s.id, s.rx.piped()));
    }

    /// One read of `s`'s host socket into its pair: spliced in bulk mode while the pipe
    /// is free, else copied (what the pair does not take is kept in `s.rx`'s pending
    /// bytes).
    fn read_into_pair(&mut self, io: &dyn Io, s: &mut Sock) -> io::Result<usize> {
        if let Some(pipe) = self
            .pipe
            .as_ref()
            .filter(|_| s.rx.bulk() && self.held.is_none())
        {
            let r = splice_bulk(io, s, pipe);
            self.note(s);
            return r;
        }
        let buf = &mut self.buf;
        let got = io.recv(s.fd.as_fd(), buf, libc::MSG_DONTWAIT);
        if let Ok(n @ 1..) = got {
            let sent = io.send(s.pair.as_fd(), &buf[..n]).unwrap_or(0);
            s.rx.pending_mut().extend_from_slice(&buf[sent..n]);
            // A splice into a socket blocks unless the socket's own file is
            // non-blocking: the server's end of the pair becomes so.
            let full = n == RX_SCRATCH
                && self.pipe.is_some()
                && io.set_nonblocking(s.pair.as_fd(), true).is_ok();
            s.rx.move_path(if full {
                PathEvent::FullRead
            } else {
                PathEvent::ShortRead
            });
        }
        got
    }

    /// The pump of [`Rx::pump`] for stream `s`: host socket → pair.
    fn pump(&mut self, io: &dyn Io, s: &mut Sock, stats: &mut ServerStats) {
        if !s.reads_pair() || s.pair_end() != PairEnd::Open {
            return;
        }
        self.ready(io);
        loop {
            let waiting = s.rx.queued_len();
            let all = pending_into_pair(io, s) && self.pipe_into_pair(io, s);
            // What the pair took of what it had kept waiting, the program read.
            s.rx.took_waiting(waiting - s.rx.queued_len());
            widen_pair(io, s);
            if !all {
                return;
            }
            if !s.urgent_first(io) {
                return;
            }
            if !s.rx.maybe() {
                // No input edge since the queue was found empty (e.g. an edge that only
                // said the socket is writable again): nothing to read.
                return;
            }
            // A splice can stop short with the pipe full (its slots hold segments, not
            // bytes): only a copying read that stopped short proves the queue empty.
            let was_bulk = s.rx.bulk();
            match self.read_into_pair(io, s) {
                Ok(0) => {
                    s.mirror_eof(io);
                    return;
                }
                Ok(n) => {
                    s.stats.bytes_in += n as u64;
                    stats.bytes_in += n as u64;
                    stats.data_syscalls += 1;
                    // A read that did not fill the buffer emptied the queue: bytes that
                    // come later bring a new edge (the host socket is edge-triggered),
                    // so the read that would say EAGAIN is skipped, unless the end has
                    // been reported (it brings no further edge).
                    // (A read also stops short at an urgent mark.)
                    let drained =
                        !was_bulk && n < RX_SCRATCH && !s.rx.ending() && !s.rx.urgent_due();
                    if drained {
                        s.rx.found_empty();
                    }
                    if s.rx.queued() || drained {
                        return;
                    }
                }
                Err(e) if would_block(&e) => {
                    s.rx.found_empty();
                    stats.empty_reads += 1;
                    return;
                }
                Err(e) => {
                    s.so_error = e.raw_os_error().unwrap_or(libc::EIO);
                    s.mirror_eof(io);
                    return;
                }
            }
        }
    }
}

/// After a pump of `s`: bytes (or an urgent byte) left waiting for room in the pair
/// need its `EPOLLOUT`, watched from now on (see `token::pair_events`). Changing the
/// registration polls the pair at once, so room made before the change is reported too.
fn watch_room(epoll: &Epoll, s: &mut Sock) {
    if s.pair_room_watched || !(s.rx.queued() || s.rx.urgent_held().is_some()) {
        return;
    }
    match epoll.modify(s.pair.as_fd(), pair_room_events(), token(T_PAIR, s.id)) {
        Ok(()) => s.pair_room_watched = true,
        // Not in the loop (the program closed it): nobody reads the pair any more.
        Err(e) => debug!("socket {}: watching room in the pair: {e}", s.id),
    }
}

/// Moves what `s`'s pair did not take before into it; false while some is left.
fn pending_into_pair(io: &dyn Io, s: &mut Sock) -> bool {
    if s.rx.pending().is_empty() {
        return true;
    }
    match io.send(s.pair.as_fd(), s.rx.pending()) {
        Ok(n) => {
            s.rx.pending_mut().drain(..n);
            s.rx.pending().is_empty()
        }
        Err(_) => false,
    }
}

/// What the way in works on: the seam, the sockets, the channels (their buffers, the
/// answers), the receive scratch, the policy (a datagram's sender is checked), the
/// sandbox's shared state (published connections waiting), the wait count (see
/// `RecvSide::mark`) and the counters; the event loop and the modules only for the
/// answers' way out ([`Rx::tx`]). Borrowed from [`Server::rx`].
pub(crate) struct Rx<'a> {
    pub io: &'static dyn Io,
    pub epoll: &'a Epoll,
    pub socks: &'a mut SockTable,
    pub channels: &'a mut Channels,
    pub modules: &'a mut Modules,
    pub stats: &'a mut ServerStats,
    pub scratch: &'a mut RxScratch,
    pub cfg: &'a Config,
    pub shared: &'a Shared,
    pub waits: u64,
}

impl Server {
    /// The parts the way in works on.
    pub(crate) fn rx(&mut self) -> Rx<'_> {
        Rx {
            io: self.io,
            epoll: &self.epoll,
            socks: &mut self.socks,
            channels: &mut self.channels,
            modules: &mut self.modules,
            stats: &mut self.stats,
            scratch: &mut self.scratch,
            cfg: &self.cfg,
            shared: &self.shared,
            waits: self.waits,
        }
    }

    /// Host readiness: finish connects, flush sends, retry parked operations, tokens.
    pub(crate) fn host_event(&mut self, id: u32, events: u32) {
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        let input =
            libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLRDHUP | libc::EPOLLERR | libc::EPOLLHUP;
        if events & input.cast_unsigned() != 0 {
            s.rx.input_edge();
        }
        if events & libc::EPOLLPRI as u32 != 0 && s.reads_pair() {
            s.rx.urgent_moves(UrgentEvent::Edge);
        }
        // Plain new input that no receive can have taken: none since the wait before the
        // one that reported it (an edge reported now may be that old), and no parked one
        // will run before the token check.
        let fresh_input = events
            & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLERR | libc::EPOLLHUP) as u32
            == libc::EPOLLIN as u32
            && s.rx.mark() + 1 < self.waits
            && !s.parked.iter().any(|p| matches!(p, Parked::Recv { .. }));
        let out = events & (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        if let Conn::Connecting { to, filled } = s.conn()
            && out
        {
            self.connects().connect_ended(id, to, filled);
        }
        if out {
            self.tx().flush_tx(id);
        }
        self.retry_parked(id);
        self.rx().report_hangup(id, events);
        if let Some(s) = self.socks.get_mut(&id) {
            s.edge_token(self.io, events);
        }
        if let Some(s) = self.socks.get_mut(&id)
            && s.connected()
            && events & (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0
        {
            // (A stream not yet connected reports EPOLLHUP: that is not an ending.)
            s.rx.end_moves(if events & libc::EPOLLHUP as u32 != 0 && s.reads_pair() {
                EndEvent::HungUp
            } else {
                EndEvent::Ended
            });
        }
        self.rx().mirror_hup(id);
        self.rx().maybe_token_known(id, fresh_input);
        if self.socks.get(&id).is_some_and(|s| s.app_closed) {
            self.socks.mark_dirty(id);
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
            // Still waiting (would block): back to the front, the rest behind it.
            match p {
                Parked::Recv {
                    ch,
                    tag,
                    len,
                    flags,
                } => match self.rx().try_recv(ch, id, tag, len, flags) {
                    Ok(()) => continue,
                    Err(e) if would_block(&e) => {
                        self.socks.park_front(id, p);
                        return;
                    }
                    Err(e) => self.tx().done(ch, id, tag, Errno::of(&e)),
                },
                Parked::Accept { ch } => match self.connects().try_accept(id) {
                    Ok(a) => self.connects().finish_accept(ch, id, a),
                    Err(e) if would_block(&e) => {
                        self.socks.park_front(id, p);
                        return;
                    }
                    Err(e) => self.channels.answer(self.io, ch, Errno::of(&e)),
                },
                Parked::Connect { .. } => {
                    self.socks.park_front(id, p);
                    return;
                }
            }
        }
    }
}

impl Rx<'_> {
    /// The way out, for answers.
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

    /// A `Recv` from channel `ch` on socket `id`: answered now, or parked until the
    /// host socket has input; `false` when the channel parked more blocking requests on
    /// the socket than it may (it broke the protocol).
    pub(crate) fn recv(
        &mut self,
        ch: u32,
        id: u32,
        tag: u32,
        len: u32,
        flags: i32,
        nonblock: bool,
    ) -> bool {
        if flags & libc::MSG_OOB == 0
            && let Some(res) = self.socks.get_mut(&id).and_then(Sock::stream_end)
        {
            // The stream's bytes went through the pair: the shim asks only what ended it.
            self.tx().done(ch, id, tag, res);
            return true;
        }
        match self.try_recv(ch, id, tag, len, flags) {
            Ok(()) => {}
            Err(e) if would_block(&e) && !nonblock => {
                if !self.socks.park(
                    id,
                    Parked::Recv {
                        ch,
                        tag,
                        len,
                        flags,
                    },
                ) {
                    return false;
                }
            }
            Err(e) => {
                let mut c = Cmp::new(CmpKind::Done, id, tag, Errno::of(&e).wire());
                if would_block(&e) && self.socks.get(&id).is_some_and(Sock::token_out) {
                    c.flags |= CMP_DRAIN_TOKEN;
                }
                self.tx().complete(ch, c);
            }
        }
        true
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
        let lent = lend_buffers(chan, s.is_stream(), len);
        if lent.is_empty() {
            // The shim holds every buffer: treat as "not yet" (it returns them soon).
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        let spans: Vec<BufSpan> = lent.iter().map(|(_, sp)| *sp).collect();
        s.rx.set_mark(self.waits);
        // A datagram's control messages (those its options ask for) go to the shim.
        let mut control = [0u8; cmsg::MAX_CONTROL];
        let arrivals = Arrivals {
            policy: &self.cfg.policy,
            stats: &mut *self.stats,
        };
        match arrivals.recv(io, s, &chan.ep.bufs, &spans, flags, &mut control) {
            Ok(got) => {
                let control = &control[..got.control_len.min(cmsg::MAX_CONTROL)];
                self.stats.bytes_in += answer_recv(io, chan, s, tag, flags, lent, got, control);
                Ok(())
            }
            Err(e) => {
                for (b, _) in lent {
                    let _ = chan.ep.pool.free(b);
                }
                if !would_block(&e) {
                    s.so_error = 0;
                } else {
                    self.stats.empty_reads += 1;
                    if flags & (libc::MSG_PEEK | libc::MSG_OOB) == 0 {
                        s.rx.found_empty();
                    }
                }
                Err(e)
            }
        }
    }

    /// Writes a readiness token if the shim wants one and the host socket is readable.
    pub(crate) fn maybe_token(&mut self, id: u32) {
        self.maybe_token_known(id, false);
    }

    /// [`Rx::maybe_token`]; `readable` = the host socket just reported input and
    /// nothing has received since, so a stream needs no `ppoll` to know.
    fn maybe_token_known(&mut self, id: u32, readable: bool) {
        let io = self.io;
        if self.socks.get(&id).is_some_and(Sock::reads_pair) {
            self.pump(id);
            return;
        }
        let published = self.socks.has_published(self.io, self.shared, id);
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        if s.token() != Token::Wanted {
            return;
        }
        let tracked = s.is_stream() && !s.listening() && !published;
        // An ended stream stays readable (0, or the error) with no edge to come: ask.
        if tracked && !s.rx.maybe() && !s.rx.ending() {
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
            s.rx.found_empty();
        }
        if (readable || published) && io.send(s.pair.as_fd(), &[1]).is_ok() {
            s.token_moves(TokenEvent::Written);
            s.stats.tokens += 1;
        }
        if rev & (libc::POLLRDHUP | libc::POLLHUP) != 0 && !s.listening() {
            s.mirror_eof(io);
        }
    }

    /// With `rx_pair`: moves what the host socket has received into the readiness pair
    /// (the program's fd) until either would block; what the pair does not take waits
    /// for its `EPOLLOUT` (and the host socket waits meanwhile: TCP's window is the
    /// flow control). The end of the stream (EOF or an error, kept for the shim's
    /// question) shuts the pair's write side. A stream whose last read filled the 64 KiB
    /// scratch buffer is moved with `splice` through the server's pipe instead (pages
    /// change hands, the bytes are not copied in the server) until a splice moves less
    /// than [`SPLICE_MIN`]. A hang-up due follows the end of the stream ([`Rx::mirror_hup`]).
    pub(crate) fn pump(&mut self, id: u32) {
        self.scratch.check_holder(self.socks);
        if let Some(s) = self.socks.get_mut(&id) {
            self.scratch.pump(self.io, s, self.stats);
            watch_room(self.epoll, s);
        }
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
        if let Some(c) = self.channels.get_mut(ch) {
            c.flush();
        }
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        s.pair_end_moves(PairEnd::Hup);
        let _ = io.shutdown(s.pair.as_fd(), libc::SHUT_RD);
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
        self.tx().complete(
            ch,
            Cmp::new(CmpKind::AsyncError, id, 0, Errno(libc::EPIPE).wire()),
        );
    }

    /// `WantToken` (from `Unwanted`) or `TokenDrained` (from `Out`, whatever its extra
    /// count): socket `id`'s token is wanted and not in the pair; one is written if the
    /// host socket is readable (see [`Token`]).
    pub(crate) fn token_moves(&mut self, id: u32, ev: TokenEvent) {
        if let Some(s) = self.socks.get_mut(&id) {
            s.token_moves(ev);
        }
        self.maybe_token(id);
    }

    /// Our end of socket `id`'s readiness pair reported `events`: the program closed
    /// its last descriptor (a hang-up not of our making), wrote into its end (input), or
    /// made room (a pump with bytes waiting for it goes on).
    pub(crate) fn pair_event(&mut self, id: u32, events: u32) {
        // A pair of the pair path is watched for EPOLLPRI (`token::pair_events`).
        let pri_asked = self.socks.get(&id).is_some_and(|s| s.rx.pair());
        if events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0
            && let Some(how) = self.socks.gone_by(self.io, id, events, pri_asked)
        {
            self.tx().app_closed(id, how);
            return;
        }
        if events & libc::EPOLLIN as u32 != 0 {
            // (Sends the program queued before it wrote into the pair go first:
            // `pair_input` defers to the end of the next pass over the rings.)
            self.tx().pair_input(id);
        }
        // Room in a pair: only a socket with bytes waiting for it needs a pump (the
        // others hear of new bytes from their host socket).
        if events & libc::EPOLLOUT as u32 != 0
            && self
                .socks
                .get(&id)
                .is_some_and(|s| s.rx.queued() || s.rx.urgent_held().is_some())
        {
            self.pump(id);
        }
    }
}
