//! Data transfer: sends (and `sendfile`, `splice` into a socket) are copied into this
//! side's buffers and queued fire-and-forget (`Op::Send`, tag 0; the buffer comes back
//! with `BufReturn`), each as look up, reserve, copy, publish; a receive on an
//! `rx_pair` stream is the kernel's own call on the program's fd (the server is asked
//! only how the stream ended), any other is a tagged request answered with `Data`
//! records (server buffers, copied out and returned) and a final `Done`. The waits on
//! the rings (for room, a buffer, an answer) are [`crate::chan`]'s: this module never
//! touches the rings itself.

use std::ffi::c_int;
use std::time::Instant;

use ferry_proto::{BufRef, CMP_DRAIN_TOKEN, Call, Cmp, WireAddr, cmsg, server_of};
use libc::{off_t, sockaddr, socklen_t};

use crate::addr::read_sockaddr;
use crate::chan::{Channel, Slot, Wait, kernel_budget, kernel_waited, spin_for, spin_pays};
use crate::errno::{Errno, Res};
use crate::fdtable::{F_SHUT_WR, Sock, TABLE};
use crate::iov::{IoCursor, MAX_RW};
use crate::log::{self, Once};
use crate::ops::{drain_token, typed};
use crate::pending::PENDING;
use crate::signals;
use crate::tls::with_channel_to;

/// What a receive got.
#[derive(Clone, Copy, Debug)]
pub struct Got {
    /// The call's return value.
    pub len: usize,
    /// The sender (datagram sockets), kernel layout.
    pub from: [u8; 32],
    /// Valid bytes in `from`.
    pub from_len: usize,
    /// `msg_flags`.
    pub flags: c_int,
    /// A datagram's control messages (the kernel's layout).
    pub control: [u8; cmsg::MAX_CONTROL],
    /// Valid bytes in `control`.
    pub control_len: usize,
}

impl Default for Got {
    fn default() -> Got {
        Got {
            len: 0,
            from: [0; 32],
            from_len: 0,
            flags: 0,
            control: [0; cmsg::MAX_CONTROL],
            control_len: 0,
        }
    }
}

impl Got {
    /// The sender's address bytes (empty for streams).
    pub fn from(&self) -> &[u8] {
        &self.from[..self.from_len]
    }

    /// The datagram's control messages.
    pub fn control(&self) -> &[u8] {
        &self.control[..self.control_len]
    }

    /// A datagram of `len` bytes (the call's value) from `from`, with `control`.
    fn datagram(&mut self, from: &[u8], control: &[u8], len: usize) {
        self.from[..from.len()].copy_from_slice(from);
        self.from_len = from.len();
        self.control[..control.len()].copy_from_slice(control);
        self.control_len = control.len();
        self.len = len;
    }
}

/// An error reported on a send: `EPIPE` raises `SIGPIPE` unless `MSG_NOSIGNAL`.
fn send_error(e: c_int, flags: c_int) -> Errno {
    if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
        signals::sigpipe();
    }
    Errno(e)
}

/// [`send_error`] for socket `id`: once a broken connection (`EPIPE`, `ECONNRESET`) has
/// been reported, every later send fails with `EPIPE` at once, as the kernel's does.
fn send_failed(id: u32, e: c_int, flags: c_int) -> Errno {
    if e == libc::EPIPE || e == libc::ECONNRESET {
        TABLE.update_id(id, F_SHUT_WR, 0);
    }
    send_error(e, flags)
}

/// The largest UDP payload: 65535 less the IPv4 and UDP headers, or less the UDP header
/// for IPv6.
fn max_datagram(s: &Sock) -> usize {
    if s.inet6() { 65_527 } else { 65_507 }
}

/// A buffer for the next record of a send on `s` that has moved `sent` bytes so far;
/// `None` means stop (return `sent`).
fn next_buf(ch: &mut Channel, s: &Sock, nonblock: bool, w: Wait, sent: usize) -> Res<Option<Slot>> {
    next_slot(ch, s, usize::MAX, nonblock, w, sent)
}

/// Room for the next piece of a send on `s` (see [`Channel::alloc_slot`]). A
/// non-blocking send that finds none makes `s`'s fd unwritable until room comes back
/// (as the kernel's socket is, with a full send buffer), whether it returns `EAGAIN`
/// or a partial count.
fn next_slot(
    ch: &mut Channel,
    s: &Sock,
    want: usize,
    nonblock: bool,
    w: Wait,
    sent: usize,
) -> Res<Option<Slot>> {
    let w = if sent > 0 { w.partial() } else { w };
    if sent > 0 && !s.dgram() && PENDING.has(s.id) {
        // The connection failed meanwhile: what is not queued yet never will be.
        return Ok(None);
    }
    let budget = TABLE.send_budget(s.fd);
    let mut room = usize::MAX;
    if budget > 0 && !s.dgram() {
        match ch.send_room(s.id, budget, nonblock, w) {
            Ok(Some(r)) => room = r,
            Ok(None) => return no_room(ch, s, sent),
            Err(e) if sent > 0 && e != Errno::DOWN => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    if room < usize::MAX && sent > 0 && PENDING.has(s.id) {
        // (It failed while this waited for room.)
        return Ok(None);
    }
    match ch.alloc_slot(want.min(room), nonblock, w) {
        Ok(Some(slot)) if room < usize::MAX => Ok(Some(Slot {
            cap: slot.cap.min(room),
            ..slot
        })),
        Ok(Some(slot)) => Ok(Some(slot)),
        Ok(None) => no_room(ch, s, sent),
        // Interrupted or timed out after a partial send: report the partial count.
        Err(e) if sent > 0 && e != Errno::DOWN => Ok(None),
        Err(e) => Err(e),
    }
}

/// A non-blocking send on `s` found no room (no free buffer, or its send buffer is
/// full): the fd polls unwritable until room comes back; the send reports what it
/// moved, or `EAGAIN`.
fn no_room(ch: &mut Channel, s: &Sock, sent: usize) -> Res<Option<Slot>> {
    if !still_filled(s.fd) {
        ch.want_room(s.fd, s.id)?;
    }
    if sent > 0 {
        Ok(None)
    } else {
        Err(Errno::EAGAIN)
    }
}

/// Whether `fd` (the program's end of a ferry socket) still polls unwritable from the
/// filler an earlier send that found no room left there: the server takes that filler
/// out when room comes back (its `WantRoom`, pushed with the filler, is still due), so
/// a send that finds no room again says so at the cost of one `ppoll` instead of a
/// second filler and request. A writer that retries in a loop before it polls
/// (iperf3 tries up to ten writes per `select`) made ~4 of each per `select`: some 30
/// system calls between the shim and the server. A hang-up or an error on the fd (no
/// filler to rely on) takes the usual way.
fn still_filled(fd: c_int) -> bool {
    // SAFETY: `fd` is the program's end of a ferry socket, borrowed for this `ppoll`
    // only (crate docs, Borrowed descriptors).
    let b = unsafe { ferry_sys::borrow(fd) };
    let out = libc::POLLOUT | libc::POLLERR | libc::POLLHUP;
    ferry_sys::poll_now(b, out).is_ok_and(|r| r & out == 0)
}

/// `send`/`sendto`/`sendmsg`/`write`/`writev`; `control` = `sendmsg`'s control
/// messages (a datagram's go to the server if [`cmsg::sanitize_send`] allows them, else
/// `EINVAL`; a stream's are ignored, logged once).
///
/// Look up (the socket, its destination, what goes with it), then for each record:
/// reserve a slot, copy into it, publish it. The rare cases are the look-up's
/// (`sender`, `ready_to_send`) and the slot's (`next_slot`); a blocking stream send of
/// `SYNC_SEND` bytes or more then waits for its bytes to be the kernel's.
///
/// # Safety
/// `cur`'s buffers readable (`IoCursor::new`'s contract); `dest` readable for `dest_len`
/// bytes (or null).
pub unsafe fn send(
    s: Sock,
    cur: &mut IoCursor,
    dest: *const sockaddr,
    dest_len: socklen_t,
    flags: c_int,
    control: &[u8],
) -> Res<usize> {
    with_channel_to(server_of(s.id), |ch| {
        // Look up.
        let s = sender(ch, s, flags)?;
        // SAFETY: `dest` null or readable for `dest_len` bytes (# Safety), as
        // `destination` asks.
        let dest = unsafe { destination(&s, dest, dest_len) }?;
        let control = send_control(&s, control)?;
        let nonblock = s.nonblock() || flags & libc::MSG_DONTWAIT != 0;
        let w = ready_to_send(ch, &s, nonblock)?;
        let total = cur.remaining();
        let bs = ch.buf_size();
        if s.dgram() && total > bs.min(max_datagram(&s)) {
            return Err(Errno(libc::EMSGSIZE));
        }
        if !s.dgram() && total == 0 {
            return Ok(0);
        }
        let mut sent = 0usize;
        let mark = OutMark::take(ch, &s);
        // Reserve.
        while let Some(slot) = next_slot(ch, &s, total - sent, nonblock, w, sent)? {
            // Copy.
            let n = (total - sent).min(slot.cap).min(bs);
            // SAFETY: this slot was just given to this send (`next_slot`) and is
            // published only below.
            let got = unsafe { copy_in(ch, slot, cur, n) }?;
            // Publish.
            let record = send_record(&s, slot, got, flags, dest);
            ch.push_send(record, &control, !s.dgram())?;
            sent += got;
            if sent >= total || got == 0 {
                break;
            }
        }
        if !s.dgram() && !nonblock && sent >= SYNC_SEND {
            sent = sent_or_failed(ch, &s, w, flags, mark, sent)?;
        }
        if let Some(d) = dest.filter(|_| s.dgram()) {
            admitted(ch, &s, d, flags)?;
        }
        if sent > 0 {
            TABLE.sent(s.fd, &s);
        }
        Ok(sent)
    })
    .map_err(|e| e.down_as(libc::EPIPE))
}

/// The first datagram `s` sends to a destination (one other than the last it was
/// admitted to) waits for the server's verdict, so that a destination the rules refuse
/// fails this very call (`EACCES`, `EPERM`), as a `connect` to it does, rather than the
/// next one: a program sending one datagram and waiting for an answer learns at once.
/// Later datagrams to the same destination stay fire-and-forget.
fn admitted(ch: &mut Channel, s: &Sock, dest: WireAddr, flags: c_int) -> Res<()> {
    let digest = dest_digest(dest);
    if TABLE.dest_admitted(s.fd, digest) {
        return Ok(());
    }
    ch.call(
        Call::Order { sock: s.id, tag: 0 },
        Wait::FOREVER,
        &mut |_, _| {},
    )?;
    match PENDING.take(s.id, |_| true) {
        Some(e) => Err(send_error(e, flags)),
        None => {
            TABLE.admit_dest(s.fd, digest);
            Ok(())
        }
    }
}

/// A digest of a destination (never 0).
fn dest_digest(dest: WireAddr) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dest.to_std().hash(&mut h);
    h.finish() | 1
}

/// Copies the next `n` bytes of `cur` into `slot`; how many it had.
///
/// # Safety
/// `slot` is this call's, not published yet (the server does not read it meanwhile).
unsafe fn copy_in(ch: &mut Channel, slot: Slot, cur: &mut IoCursor, n: usize) -> Res<usize> {
    let mem = ch.slot_mem(slot, n)?;
    // SAFETY: `slot_mem` checked the span against the region, so `n` bytes at `mem` are
    // inside the shim's mapping, which the program's buffers are not; the slot is this
    // call's and unpublished (# Safety), so the server does not read it meanwhile.
    Ok(unsafe { cur.read_into(mem, n) })
}

/// The send record of `len` bytes in `slot` on `s`, to `dest` if given.
fn send_record(s: &Sock, slot: Slot, len: usize, flags: c_int, dest: Option<WireAddr>) -> Call {
    Call::Send {
        sock: s.id,
        buf: BufRef {
            id: slot.buf.0,
            len: len as u32,
        },
        offset: slot.off,
        flags,
        dest,
    }
}

/// The look-up every send (and `sendfile`, `splice`) starts with: the completions that
/// came meanwhile (an error an earlier send left pending is this one's), the socket's
/// type and peer (asked of the server once, for a socket known only by its name: see
/// [`typed`]), and whether it may send at all (`EPIPE` once shut or broken).
fn sender(ch: &mut Channel, s: Sock, flags: c_int) -> Res<Sock> {
    ch.reap()?;
    if let Some(e) = PENDING.take(s.id, |_| true) {
        return Err(send_failed(s.id, e, flags));
    }
    let s = typed(ch, s)?;
    if s.shut_wr() || (!s.dgram() && !s.has_peer()) {
        return Err(send_error(libc::EPIPE, flags));
    }
    if !s.dgram() {
        after_other_senders(ch, &s)?;
    }
    Ok(s)
}

/// Records this thread as the last to queue records about stream `s`; when another
/// thread did, asks for order first (`Op::Order`): what that thread queued in its own
/// ring (sends, an unanswered option) goes first.
pub(crate) fn after_other_senders(ch: &mut Channel, s: &Sock) -> Res<()> {
    if TABLE.sender_changed(s.fd, ch.tid) {
        ch.call(
            Call::Order { sock: s.id, tag: 0 },
            Wait::FOREVER,
            &mut |_, _| {},
        )?;
    }
    Ok(())
}

/// Where a datagram goes: the address given (`None` for a stream, or none given), or
/// the socket's peer (`EDESTADDRREQ` without one).
///
/// # Safety
/// `dest` readable for `dest_len` bytes (or null).
unsafe fn destination(
    s: &Sock,
    dest: *const sockaddr,
    dest_len: socklen_t,
) -> Res<Option<WireAddr>> {
    let dest = if s.dgram() && !dest.is_null() && dest_len > 0 {
        // SAFETY: `dest` is non-null here and readable for `dest_len` bytes (# Safety),
        // as `read_sockaddr` asks.
        Some(unsafe { read_sockaddr(dest, dest_len) }?)
    } else {
        None
    };
    if s.dgram() && dest.is_none() && !s.has_peer() {
        return Err(Errno(libc::EDESTADDRREQ));
    }
    Ok(dest)
}

/// The control messages that go with a send: a datagram's, checked
/// ([`cmsg::sanitize_send`], `EINVAL`); a stream's are ignored (logged once).
fn send_control(s: &Sock, control: &[u8]) -> Res<Vec<u8>> {
    if control.is_empty() {
        Ok(Vec::new())
    } else if s.dgram() {
        cmsg::sanitize_send(control).map_err(|e| {
            log::once(Once::Cmsg, format_args!("sendmsg refused: {e}"));
            Errno(e.errno())
        })
    } else {
        log::once(
            Once::Cmsg,
            format_args!("control messages on a stream are ignored"),
        );
        Ok(Vec::new())
    }
}

/// The send's wait (its `SO_SNDTIMEO`, and the signals from now on), once bytes the
/// program wrote into the fd itself have gone first ([`pair_taken`]).
fn ready_to_send(ch: &mut Channel, s: &Sock, nonblock: bool) -> Res<Wait> {
    let w = Wait::after(TABLE.timeouts(s.fd).1, Errno::EAGAIN);
    if s.reads_pair() && s.direct() {
        pair_taken(ch, s, nonblock, w)?;
    }
    Ok(w)
}

/// A blocking stream send of at least this much returns once its bytes are the
/// kernel's ([`sent_or_failed`]); smaller ones stay fire-and-forget (S1), so that a
/// stream of small writes keeps the server busy while the program writes on (their
/// errors come on the next call, as before).
const SYNC_SEND: usize = 16 * 1024;

/// The end of a blocking stream send: waits until its bytes are the kernel's
/// ([`Channel::wait_sent`]); an error that came meanwhile is this call's.
///
/// When the connection broke under the call, the call still reports the bytes of it
/// the host socket took, if any (the error waits for the next call), as the kernel's
/// blocking send reports what it copied before an error: a program must not be told
/// that bytes failed which its peer then receives.
fn sent_or_failed(
    ch: &mut Channel,
    s: &Sock,
    w: Wait,
    flags: c_int,
    mark: OutMark,
    sent: usize,
) -> Res<usize> {
    ch.wait_sent(s.id, w)?;
    match PENDING.take(s.id, |_| true) {
        Some(e) => match mark.of_this_call(ch, s) {
            0 => Err(send_failed(s.id, e, flags)),
            took => {
                PENDING.put(s.id, e);
                Ok(took.min(sent))
            }
        },
        None => Ok(sent),
    }
}

/// Where stream `s`'s bytes stood on this channel as a send began: the bytes of
/// earlier sends still out, and the running count of bytes that went out. The server
/// gives records back in order, so what goes out after it is first the earlier sends',
/// then this call's.
#[derive(Clone, Copy, Debug)]
struct OutMark {
    earlier: u64,
    out: u64,
}

impl OutMark {
    fn take(ch: &Channel, s: &Sock) -> OutMark {
        OutMark {
            earlier: ch.queued(s.id),
            out: ch.sent_out(s.id),
        }
    }

    /// Bytes of this call that went out (once every record is back).
    fn of_this_call(self, ch: &Channel, s: &Sock) -> usize {
        let since = ch.sent_out(s.id).saturating_sub(self.out);
        usize::try_from(since.saturating_sub(self.earlier)).unwrap_or(usize::MAX)
    }
}

/// Before a send on an `rx_pair` stream the program may write directly (`F_DIRECT`):
/// bytes the program wrote into the fd itself,
/// with calls the shim does not see (stdio, a shell's builtins, a raw system call), are
/// still in the pair; the server sends them out in order after the sends queued
/// before them. This send must follow them, so it waits until the server has taken
/// them (one `ioctl` when there are none, the usual case), or fails with `EAGAIN` on a
/// non-blocking socket. A filler left in the pair (the fd polls unwritable) is taken
/// when the server has room again, so a blocking send waits for that too.
fn pair_taken(ch: &mut Channel, s: &Sock, nonblock: bool, w: Wait) -> Res<()> {
    if !ferry_sys::unix_oob_works() {
        // The server cannot tell such bytes from filler there, and never reads them.
        return Ok(());
    }
    let empty = || crate::sys::outq(s.fd).map_or(true, |n| n == 0);
    if empty() {
        return Ok(());
    }
    if nonblock {
        return Err(Errno::EAGAIN);
    }
    ch.flush();
    loop {
        let spin = std::time::Duration::from_millis(1);
        if spin_for(ch.spin_policy(), spin, || empty().then_some(())).is_some() {
            return Ok(());
        }
        ch.check_alive()?;
        if w.since.is_some_and(|start| w.interrupted(start, false)) {
            return Err(Errno::EINTR);
        }
        if w.passed() {
            return Err(w.expired);
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
        if empty() {
            return Ok(());
        }
    }
}

/// `recv`/`recvfrom`/`recvmsg`/`read`/`readv`.
///
/// # Safety
/// `cur`'s buffers writable.
pub unsafe fn recv(s: Sock, cur: &mut IoCursor, flags: c_int) -> Res<Got> {
    if flags & libc::MSG_ERRQUEUE != 0 {
        // No error queue is relayed: it is always empty.
        return Err(Errno::EAGAIN);
    }
    let got = with_channel_to(server_of(s.id), |ch| {
        let s = receiver(ch, s)?;
        if s.reads_pair() && flags & libc::MSG_OOB != 0 {
            // The server moves urgent data into the pair as its own out-of-band byte;
            // one not there yet is asked of the host socket (below), as TCP lets a
            // program read it before the bytes ahead of it.
            if let Some(r) = pair_recv_oob(&s, cur, flags) {
                return r;
            }
        } else if s.reads_pair() {
            ch.flush();
            return pair_recv(ch, &s, cur, flags);
        }
        ring_recv(ch, &s, cur, flags)
    })
    .map_err(|e| e.down_as(libc::ECONNRESET));
    if got.as_ref().is_ok_and(|g| g.len > 0) && flags & libc::MSG_PEEK == 0 {
        TABLE.received(s.fd);
    }
    got
}

/// The look-up every receive starts with: the completions that came meanwhile (an
/// error an earlier send left pending is this one's, but for `EPIPE`, which only sends
/// report) and the socket's type and peer ([`typed`]).
fn receiver(ch: &mut Channel, s: Sock) -> Res<Sock> {
    ch.reap()?;
    if let Some(e) = PENDING.take(s.id, |e| e != libc::EPIPE) {
        return Err(Errno(e));
    }
    typed(ch, s)
}

/// How a receive through the ring asks the server, from its flags.
#[derive(Clone, Copy, Debug)]
struct RingRecv {
    /// A stream receive of 0 bytes: it waits for data (or EOF) like any other, and
    /// returns 0, so it asks for one byte without taking it.
    probe_only: bool,
    /// `MSG_TRUNC` on a stream: it discards what it receives.
    discard: bool,
    /// `MSG_WAITALL` on a blocking stream (not peeking): it asks again until it has
    /// all it asked for, or the stream ends.
    waitall: bool,
    /// `MSG_DONTWAIT`, or a non-blocking socket.
    nonblock: bool,
    /// The flags that go to the server.
    wire: c_int,
}

impl RingRecv {
    /// How a receive on `s` with `flags` into `cap` bytes asks.
    fn new(s: &Sock, cap: usize, flags: c_int) -> RingRecv {
        let probe_only = !s.dgram() && cap == 0;
        let nonblock = s.nonblock() || flags & libc::MSG_DONTWAIT != 0;
        RingRecv {
            probe_only,
            discard: !s.dgram() && flags & libc::MSG_TRUNC != 0,
            waitall: flags & libc::MSG_WAITALL != 0
                && !s.dgram()
                && !nonblock
                && flags & libc::MSG_PEEK == 0,
            nonblock,
            wire: if probe_only {
                libc::MSG_PEEK | (flags & libc::MSG_OOB)
            } else {
                flags & (libc::MSG_PEEK | libc::MSG_TRUNC | libc::MSG_OOB)
            },
        }
    }

    /// The request for at most `room` more bytes on `s`.
    fn request(&self, s: &Sock, room: usize) -> Call {
        Call::Recv {
            sock: s.id,
            tag: 0,
            max: if self.probe_only {
                1
            } else {
                room.min(u32::MAX as usize) as u32
            },
            flags: self.wire,
            nonblock: self.nonblock,
        }
    }

    /// One request for at most `room` bytes, its `Data` copied into `cur` (unless it
    /// probes or discards): the answer, and how many bytes were copied.
    fn call(
        &self,
        ch: &mut Channel,
        s: &Sock,
        cur: &mut IoCursor,
        room: usize,
        w: Wait,
    ) -> (Res<Cmp>, usize) {
        let mut copied = 0usize;
        let r = ch.call(self.request(s, room), w, &mut |bufs, span| {
            if self.probe_only || self.discard {
                return;
            }
            // SAFETY: `span` was checked against the region (`Buffers::span`), so its
            // `len` bytes at that pointer are inside the shim's mapping, which the
            // program's buffers are not; the buffer is lent to us until this call
            // returns it (a server writing it meanwhile changes only the bytes copied).
            copied += unsafe { cur.write_from(bufs.as_mut_ptr(span), span.len() as usize) };
        });
        (r, copied)
    }
}

/// A receive the server answers on the ring (datagrams, `--rx ring`, urgent data not
/// in the pair): tagged `Recv` requests whose `Data` records are copied into `cur`,
/// asked again for `MSG_WAITALL`; an error after some bytes returns those.
fn ring_recv(ch: &mut Channel, s: &Sock, cur: &mut IoCursor, flags: c_int) -> Res<Got> {
    let cap = cur.remaining();
    let how = RingRecv::new(s, cap, flags);
    let w = Wait::after(TABLE.timeouts(s.fd).0, Errno::EAGAIN);
    let mut got = Got::default();
    loop {
        let (r, copied) = how.call(ch, s, cur, cap - got.len, w);
        let done = match r {
            Ok(d) => d,
            Err(e) if got.len > 0 && e != Errno::DOWN => break,
            Err(e) => return Err(e),
        };
        if done.flags & CMP_DRAIN_TOKEN != 0 {
            drain_token(ch, s)?;
        }
        let n = match Errno::check(done.result) {
            Ok(n) => n as usize,
            Err(_) if got.len > 0 => break,
            Err(e) => return Err(e),
        };
        got.flags = done.a as c_int;
        if s.dgram() {
            let len = if flags & libc::MSG_TRUNC != 0 {
                n
            } else {
                copied
            };
            got.datagram(done.bytes(), ch.control(), len);
            break;
        }
        if how.probe_only {
            break;
        }
        if how.discard {
            got.len += n;
            break;
        }
        got.len += copied;
        if n == 0 || !how.waitall || got.len >= cap {
            break;
        }
    }
    Ok(got)
}

/// A receive on a connected stream whose bytes the server moves into the program's fd
/// (`rx_pair`): the kernel's own receive on the fd, so blocking, `MSG_WAITALL`,
/// `MSG_PEEK`, `SO_RCVTIMEO` (applied to the fd too), signals and a `close` by another
/// thread behave as the kernel's. At the end of the stream the server says how it ended
/// (EOF, or the reset, once).
fn pair_recv(ch: &mut Channel, s: &Sock, cur: &mut IoCursor, flags: c_int) -> Res<Got> {
    let cap = cur.remaining();
    let nonblock = s.nonblock() || flags & libc::MSG_DONTWAIT != 0;
    let mut got = Got::default();
    if cap == 0 {
        pair_probe(ch, s, nonblock)?;
        return Ok(got);
    }
    let kflags = flags & (libc::MSG_PEEK | libc::MSG_WAITALL)
        | if nonblock { libc::MSG_DONTWAIT } else { 0 };
    let n = if flags & libc::MSG_TRUNC != 0 {
        pair_discard(s.fd, cap, kflags)?
    } else {
        pair_read(ch, s.fd, cur, nonblock, kflags)?
    };
    got.len = if n == 0 { pair_ended(ch, s)? } else { n };
    Ok(got)
}

/// A stream's `MSG_TRUNC` receive from the pair: up to `cap` bytes (at most 1 MiB)
/// taken and dropped; how many.
fn pair_discard(fd: c_int, cap: usize, kflags: c_int) -> Res<usize> {
    let mut scratch = vec![0u8; cap.min(1 << 20)];
    let iov = libc::iovec {
        iov_base: scratch.as_mut_ptr().cast(),
        iov_len: scratch.len(),
    };
    // SAFETY: `iov` names `scratch`, a live local vector, for its own length.
    unsafe { crate::sys::recv_iov(fd, &iov, 1, kflags) }
}

/// A receive from the pair `fd` into the program's buffers, untouched so far: a
/// blocking one without `MSG_WAITALL` spins first ([`pair_spin`]), then sleeps in the
/// kernel's receive.
fn pair_read(
    ch: &Channel,
    fd: c_int,
    cur: &mut IoCursor,
    nonblock: bool,
    kflags: c_int,
) -> Res<usize> {
    let (iov, n) = cur.untouched().ok_or(Errno::EINVAL)?;
    if nonblock {
        // SAFETY: `iov` names the program's `n` buffers, untouched so far and writable
        // (`IoCursor::new`'s contract).
        return unsafe { crate::sys::recv_iov(fd, iov, n, kflags) };
    }
    let t0 = Instant::now();
    if kflags & libc::MSG_WAITALL == 0 && spin_pays() {
        // SAFETY: `iov` names the program's `n` buffers, untouched so far and
        // writable (`IoCursor::new`'s contract), as `pair_spin` asks.
        if let Some(k) = unsafe { pair_spin(ch, fd, iov, n, kflags) }? {
            kernel_waited(ch.spin_policy().span, t0);
            return Ok(k);
        }
    }
    // Asleep in the kernel until the server writes: counted for the server's wake
    // statistics (it cannot see this wake-up).
    ch.count_kernel_sleep();
    // SAFETY: `iov` names the program's `n` buffers, untouched so far and writable
    // (`IoCursor::new`'s contract).
    let got = unsafe { crate::sys::recv_iov(fd, iov, n, kflags) };
    kernel_waited(ch.spin_policy().span, t0);
    got
}

/// The end of an `rx_pair` stream: asks the server how it ended (a `Recv` of `max` 0:
/// nothing to take): 0 for EOF, or the reset's error (once).
fn pair_ended(ch: &mut Channel, s: &Sock) -> Res<usize> {
    let req = Call::Recv {
        sock: s.id,
        tag: 0,
        max: 0,
        flags: 0,
        nonblock: false,
    };
    let done = ch.call(req, Wait::FOREVER, &mut |_, _| {})?;
    Ok(Errno::check(done.result)? as usize)
}

/// `recv(MSG_OOB)` on an `rx_pair` stream from the pair, which never blocks (nor does
/// TCP's); `None` when the pair has no urgent byte (`EINVAL`).
fn pair_recv_oob(s: &Sock, cur: &mut IoCursor, flags: c_int) -> Option<Res<Got>> {
    let (iov, n) = match cur.untouched() {
        Some(v) => v,
        None => return Some(Err(Errno::EINVAL)),
    };
    let kflags = flags & (libc::MSG_OOB | libc::MSG_PEEK) | libc::MSG_DONTWAIT;
    // SAFETY: `iov` names the program's `n` buffers, untouched so far and writable
    // (`IoCursor::new`'s contract).
    match unsafe { crate::sys::recv_iov(s.fd, iov, n, kflags) } {
        Err(e) if e == Errno::EINVAL => None,
        r => Some(r.map(|len| Got {
            len,
            ..Got::default()
        })),
    }
}

/// S0's spin-before-sleep for a blocking receive on an `rx_pair` stream: the server's
/// write usually lands within the spin span, and a reader already asleep in the kernel
/// would pay a wake-up. Polls with non-blocking receives (a pure spin first, then
/// `sched_yield` between tries); `None` when the span passed without data.
///
/// # Safety
/// `iov` must point at `n` readable iovecs whose buffers are writable for their lengths.
unsafe fn pair_spin(
    ch: &Channel,
    fd: c_int,
    iov: *const libc::iovec,
    n: usize,
    kflags: c_int,
) -> Res<Option<usize>> {
    let p = ch.spin_policy();
    spin_for(p, kernel_budget(p.span), || {
        // SAFETY: `iov` names `n` writable buffers (# Safety), as `recv_iov` asks.
        match unsafe { crate::sys::recv_iov(fd, iov, n, kflags | libc::MSG_DONTWAIT) } {
            Err(Errno::EAGAIN) => None,
            r => Some(r),
        }
    })
    .transpose()
}

/// A zero-byte receive on an `rx_pair` stream: waits (unless non-blocking) for data or
/// the end, as TCP's does; never takes anything.
fn pair_probe(ch: &mut Channel, s: &Sock, nonblock: bool) -> Res<()> {
    let w = Wait::after(TABLE.timeouts(s.fd).0, Errno::EAGAIN);
    let start = signals::counts();
    loop {
        // SAFETY: the program's end of `s`, for this poll only (crate docs, Borrowed
        // descriptors).
        let fd = unsafe { ferry_sys::borrow(s.fd) };
        if ferry_sys::poll_now(fd, libc::POLLIN).map_err(|e| Errno::from_io(&e))? != 0 {
            return Ok(());
        }
        if nonblock {
            return Err(Errno::EAGAIN);
        }
        crate::ops::wait_readable(ch, s.fd, w, start)?;
    }
}

/// `splice(fd_in, off_in, ferry socket, NULL, len, flags)`: one read from `fd_in` (a
/// pipe, or a file at `off_in`) straight into a channel buffer, queued like a send.
///
/// # Safety
/// `off_in` null or a readable and writable `off_t`.
pub unsafe fn splice_in(
    s: Sock,
    fd_in: c_int,
    off_in: *mut off_t,
    len: usize,
    flags: u32,
) -> Res<usize> {
    let nonblock = flags & libc::SPLICE_F_NONBLOCK != 0;
    if nonblock {
        // SAFETY: `fd_in` is the program's descriptor, for this poll only (crate docs,
        // Borrowed descriptors).
        let b = unsafe { ferry_sys::borrow(fd_in) };
        if ferry_sys::poll_now(b, libc::POLLIN).map_err(Errno::from)? == 0 {
            return Err(Errno::EAGAIN);
        }
    }
    // SAFETY: `off_in` null or a readable, writable off_t (# Safety), as `feed` asks.
    unsafe { feed(s, fd_in, off_in, len, true, nonblock) }
}

/// `splice(ferry socket, NULL, fd_out, off_out, len, flags)`: one receive, written to
/// `fd_out` (a pipe).
///
/// # Safety
/// `off_out` null or a readable and writable `off_t`.
pub unsafe fn splice_out(
    s: Sock,
    fd_out: c_int,
    off_out: *mut off_t,
    len: usize,
    flags: u32,
) -> Res<usize> {
    let mut buf = vec![0u8; len.min(1 << 16)];
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `iov` (a local that outlives the cursor) names `buf`, a live local vector,
    // for its own length.
    let mut cur = unsafe { IoCursor::new(&iov, 1) }?;
    let rflags = if flags & libc::SPLICE_F_NONBLOCK != 0 {
        libc::MSG_DONTWAIT
    } else {
        0
    };
    // SAFETY: the cursor's one buffer is `buf`, writable (above).
    let got = unsafe { recv(s, &mut cur, rflags) }?;
    // SAFETY: `off_out` null or a readable, writable off_t (# Safety); the reference
    // lives until this returns and nothing else touches it meanwhile.
    let off = unsafe { off_out.as_mut() };
    let mut done = 0;
    while done < got.len {
        let rest = &buf[done..got.len];
        let at = off.as_deref().map(|o| *o + done as off_t);
        // SAFETY: `rest` is a live slice of `buf`, readable for its length.
        match unsafe { crate::sys::write_from(fd_out, rest.as_ptr(), rest.len(), at) } {
            Ok(n) => done += n,
            Err(e) if done == 0 => return Err(e.into()),
            Err(_) => break,
        }
    }
    if let Some(o) = off {
        *o += done as off_t;
    }
    Ok(done)
}

/// `sendfile(ferry socket, in_fd, offset, count)`: the file is read straight into the
/// channel's buffers, which are then queued like any send.
///
/// # Safety
/// `offset` null or a readable and writable `off_t`.
pub unsafe fn sendfile(s: Sock, in_fd: c_int, offset: *mut off_t, count: usize) -> Res<usize> {
    // SAFETY: `offset` null or a readable, writable off_t (# Safety), as `feed` asks.
    unsafe { feed(s, in_fd, offset, count, false, s.nonblock()) }
}

/// Reads `in_fd` (at `offset` if non-null) straight into channel buffers and queues
/// them as sends; `once`: stop after the first read (`splice` moves what is there).
///
/// # Safety
/// `offset` null or a readable and writable `off_t`.
unsafe fn feed(
    s: Sock,
    in_fd: c_int,
    offset: *mut off_t,
    count: usize,
    once: bool,
    nonblock: bool,
) -> Res<usize> {
    with_channel_to(server_of(s.id), |ch| {
        let s = sender(ch, s, 0)?;
        let w = ready_to_send(ch, &s, nonblock)?;
        let count = count.min(MAX_RW);
        let bs = ch.buf_size();
        // SAFETY: `offset` is non-null in this closure (`then`), so a readable off_t
        // (# Safety).
        let mut off = (!offset.is_null()).then(|| unsafe { offset.read() });
        let mut sent = 0usize;
        let mark = OutMark::take(ch, &s);
        while sent < count {
            let Some(slot) = next_buf(ch, &s, nonblock, w, sent)? else {
                break;
            };
            let n = (count - sent).min(bs).min(slot.cap);
            // SAFETY: this slot was just given to this send (`next_buf`) and is
            // published only below.
            let Some(k) = (unsafe { read_in(ch, slot, in_fd, n, off, sent) })? else {
                break;
            };
            if let Some(o) = off.as_mut() {
                *o += k as off_t;
            }
            ch.push_send(send_record(&s, slot, k, 0, None), &[], !s.dgram())?;
            sent += k;
            if once {
                break;
            }
        }
        if !s.dgram() && !nonblock && sent >= SYNC_SEND {
            sent = sent_or_failed(ch, &s, w, 0, mark, sent)?;
        }
        if let Some(o) = off {
            // SAFETY: `off` is `Some` only when `offset` is non-null, then a writable
            // off_t (# Safety).
            unsafe { offset.write(o) };
        }
        Ok(sent)
    })
    .map_err(|e| e.down_as(libc::EPIPE))
}

/// The next piece of a `sendfile`/`splice`: reads at most `n` bytes of `in_fd` (at
/// `off` if given) into `slot`; how many. `None` means stop (the end of the input, or a
/// read error after `sent` bytes: the call returns those), the slot given back.
///
/// # Safety
/// `slot` is this call's, not published yet (the server does not read it meanwhile).
unsafe fn read_in(
    ch: &mut Channel,
    slot: Slot,
    in_fd: c_int,
    n: usize,
    off: Option<off_t>,
    sent: usize,
) -> Res<Option<usize>> {
    let p = ch.slot_mem(slot, n)?;
    // SAFETY: `p` is the start of `slot`'s span, checked against the region
    // (`slot_mem`), so `n` bytes are inside the shim's mapping; the slot is this call's
    // and unpublished (# Safety).
    match unsafe { crate::sys::read_into(in_fd, p, n, off) } {
        Ok(k) if k > 0 => Ok(Some(k)),
        r => {
            ch.unalloc(slot.buf);
            match r {
                Err(e) if sent == 0 => Err(e.into()),
                _ => Ok(None),
            }
        }
    }
}
