//! One channel to the protocol server: a control socket, a shared-memory region with the
//! request/completion rings and buffers (this side is `Side::A`), and the server's
//! doorbell. See `docs/specs/socket-protocol.md` for the protocol and
//! `docs/specs/ring-api.md` for the rings.
//!
//! A channel is used by one thread at a time ([`crate::tls`] hands them out), so it has
//! exactly one tagged request in flight, and whoever waits on it also handles the
//! unsolicited completions that arrive meanwhile: returned send buffers
//! (`BufReturn`) go back to the pool, errors of fire-and-forget sends (`AsyncError`) go
//! to [`crate::pending`], buffers lent with `Data` records are copied out and given back.
//! Which completion is whose is [`ferry_proto::demux`]'s to say; what is done with it
//! (buffers, waits, errors) is this module's. Requests go out as typed
//! [`ferry_proto::Call`]s.
//!
//! Every wait on the rings is one loop (`Channel::wait_until`), told by what it waits
//! for (`Until`: room in the request ring, a free buffer, a call's answer, a stream's
//! sends given back) what ends it. Waits spin for the span the server asked for, then
//! sleep on the completion ring's futex in slices of [`SLICE`] (on the request ring, in
//! 1 ms slices taking completions meanwhile, while it is full); after a slice the
//! control socket is checked for EOF (the server died) so no call hangs on a dead
//! server. A signal handler that runs during the wait for a call's answer (see
//! [`crate::signals`] for how the shim knows) cancels the request (`Op::Cancel`) and
//! the call fails with `EINTR` if the server confirms, unless the handler has
//! `SA_RESTART` and the socket no timeout: then the wait simply goes on, as the
//! kernel's restart would. A receive or send timeout cancels it the same way.

use std::cell::Cell;
use std::ffi::c_int;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::demux::{Demux, Event};
use ferry_proto::{
    Call, Cmp, Ctl, CtlKind, HELLO_ROUTES, Hello, HelloReply, PROTO_VERSION, ProtoError, Req,
};
use ferry_ring::{
    AdaptiveSpin, BufId, BufSpan, Buffers, Endpoint, Region, Side, SpinPolicy, WaitResult,
    YieldPacer,
};

use crate::errno::{Errno, Res};
use crate::fdtable::TABLE;
use crate::log::{self, Once};
use crate::pending::PENDING;
use crate::signals::{self, Counts};
use crate::{config, tls};

/// Longest sleep between liveness checks.
pub const SLICE: Duration = Duration::from_millis(100);
/// How long the server may take to answer `Hello`.
const HELLO_TIMEOUT_MS: i32 = 10_000;
/// How long a closing channel waits for the server to take its last requests.
const DRAIN_WAIT: Duration = Duration::from_millis(100);

/// How long a tagged request may wait, and what its expiry means.
#[derive(Clone, Copy, Debug)]
pub struct Wait {
    /// When to give up (`SO_RCVTIMEO`/`SO_SNDTIMEO`); `None` = never.
    pub deadline: Option<Instant>,
    /// What a request abandoned at the deadline fails with.
    pub expired: Errno,
    /// This thread's handler counts when the call began (`None`: when the wait
    /// begins): a handler that ran while the call was copying, before it had to wait,
    /// interrupts the wait as the kernel's pending signal would.
    pub since: Option<Counts>,
    /// Any handler ends the wait, `SA_RESTART` or not: a blocking send that has moved
    /// some bytes returns their count when a signal comes (see [`Wait::partial`]).
    pub any_ends: bool,
}

impl Wait {
    /// No deadline.
    pub const FOREVER: Wait = Wait {
        deadline: None,
        expired: Errno::EAGAIN,
        since: None,
        any_ends: false,
    };

    /// A deadline `us` microseconds from now (0 = none), failing with `expired`.
    pub fn after(us: u64, expired: Errno) -> Wait {
        let deadline = (us > 0).then(|| Instant::now() + Duration::from_micros(us));
        Wait {
            deadline,
            expired,
            since: Some(signals::counts()),
            any_ends: false,
        }
    }

    /// This wait, for a send that has already moved some bytes: the kernel ends it
    /// with the partial count on any handled signal, restartable or not.
    pub fn partial(self) -> Wait {
        Wait {
            any_ends: true,
            ..self
        }
    }

    /// The next sleep: at most `SLICE`, at most until the deadline.
    pub fn slice(&self) -> Duration {
        match self.deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
            None => SLICE,
        }
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Whether handlers that ran since `start` make the call fail with `EINTR` (see
    /// [`signals`]); `futex_eintr`: the sleep itself was interrupted, possibly by a
    /// handler the shim did not wrap.
    pub fn interrupted(&self, start: Counts, futex_eintr: bool) -> bool {
        let timeout = self.deadline.is_some();
        let now = signals::counts();
        start.interrupts_since(now, timeout || self.any_ends)
            || (futex_eintr && now.any == start.any && (timeout || !signals::restartable()))
    }
}

/// One channel (see the module docs).
pub struct Channel {
    ep: Endpoint<Req, Cmp>,
    region: Arc<Region>,
    ctl: OwnedFd,
    spin: SpinPolicy,
    batch: u32,
    batch_delay: Duration,
    /// Fire-and-forget records committed since the last doorbell.
    unrung: u32,
    unrung_since: Option<Instant>,
    /// The fork generation this channel belongs to ([`tls::generation`]).
    pub fork_gen: u32,
    /// Failed: every call fails with [`Errno::DOWN`]; dropped at the next acquisition.
    pub dead: bool,
    /// The thread this channel is for (what a socket's last sender is recorded as).
    pub tid: u32,
    reg: Option<usize>,
    /// The buffer small sends are packed into, and how much of it is used.
    arena: Option<(BufId, u32)>,
    /// Outstanding references per buffer of ours: records in flight, plus one while a
    /// buffer is the arena. A buffer goes back to the pool when its count drops to 0.
    refs: Vec<u16>,
    /// Which completion is whose: the call in progress, completions held while waiting
    /// for ring space, its control bytes, the count of returned buffers.
    demux: Demux,
    /// Send records of this channel not yet given back, per stream socket (few: a
    /// linear list), so that a blocking send can wait until its bytes are the kernel's
    /// ([`Channel::wait_sent`]) and a socket's bytes in flight stay within the send
    /// buffer the program asked for ([`Channel::send_room`]).
    inflight: Vec<InFlight>,
}

/// A stream socket's send records out of one channel. Kept (with `records` 0) after
/// the last comes back, until the list grows, so that a wait can read `out`.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    sock: u32,
    /// Records not given back yet.
    records: u32,
    /// Their bytes (as far as the server says with each buffer it gives back; all
    /// of them are back when `records` is 0).
    bytes: u64,
    /// Bytes the server has said went out, since the entry was made (a running
    /// count: a wait compares two readings).
    out: u64,
}

/// Entries of sockets with nothing out are dropped once the list is longer than this.
const INFLIGHT_KEEP: usize = 16;

/// Sends smaller than this share buffers (several records in one buffer), so that a
/// stream of small writes is not limited by the number of buffers.
pub const SMALL_SEND: usize = 4096;

/// Room for one send record in a buffer of ours ([`Channel::alloc_slot`]).
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    /// The buffer.
    pub buf: BufId,
    /// Where the record's bytes start in it.
    pub off: u32,
    /// How many bytes fit.
    pub cap: usize,
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("ctl", &self.ctl)
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

/// Why a channel could not be opened (logged once).
#[derive(Debug)]
enum OpenError {
    /// A system call failed (which one).
    Io(&'static str, std::io::Error),
    /// The region could not be mapped (what of it).
    Ring(&'static str, ferry_ring::Error),
    /// The server did not answer `Hello` in time.
    NoAnswer,
    /// The server's answer broke the protocol.
    Proto(ProtoError),
}

impl From<ProtoError> for OpenError {
    fn from(e: ProtoError) -> OpenError {
        OpenError::Proto(e)
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io(what, e) => write!(f, "{what}: {e}"),
            OpenError::Ring(what, e) => write!(f, "{what}: {e}"),
            OpenError::NoAnswer => f.write_str("no answer to hello"),
            OpenError::Proto(e) => e.fmt(f),
        }
    }
}

impl Errno {
    /// The channel is unusable (server gone, or it broke the protocol). Each operation
    /// maps this to its own errno with [`Errno::down_as`]; anything left becomes
    /// `ECONNRESET` at the boundary.
    pub const DOWN: Errno = Errno(-1);

    /// `self`, with [`Errno::DOWN`] replaced by `e`.
    pub fn down_as(self, e: i32) -> Errno {
        if self == Errno::DOWN { Errno(e) } else { self }
    }
}

impl Channel {
    /// Connects to `$FERRY_SOCKET`, says `Hello` for protocol server `server`, maps the
    /// region it gets back.
    pub fn open(server: usize) -> Res<Channel> {
        let path = config::socket_path().ok_or(Errno::DOWN)?;
        Channel::connect(Path::new(path), server).map_err(|why| {
            log::once(
                Once::Open,
                format_args!(
                    "cannot open a channel to {}: {why}",
                    Path::new(path).display()
                ),
            );
            Errno::DOWN
        })
    }

    /// [`Channel::open`]'s work: the control socket, the hello, the region.
    fn connect(path: &Path, server: usize) -> Result<Channel, OpenError> {
        let ctl = connect_ctl(path)?;
        say_hello(&ctl, server)?;
        let (reply, [memfd, bell]) = hello_reply(&ctl)?;
        let floor = high_floor();
        let bell = move_high(bell, floor);
        let memfd = move_high(memfd, floor);
        let ctl = move_high(ctl, floor);
        Channel::mapped(ctl, memfd, bell, &reply)
    }

    /// The channel over the region `memfd` the server's hello `reply` came with: this
    /// side's endpoint, ringing `bell`; registered for `fork` and for the shim's own
    /// descriptors ([`tls::register`]), with the server's settings applied.
    fn mapped(
        ctl: OwnedFd,
        memfd: OwnedFd,
        bell: OwnedFd,
        reply: &HelloReply,
    ) -> Result<Channel, OpenError> {
        let region = Arc::new(Region::open(memfd).map_err(|e| OpenError::Ring("region", e))?);
        let mut ep = Endpoint::<Req, Cmp>::new(region.clone(), Side::A)
            .map_err(|e| OpenError::Ring("endpoint", e))?;
        let bell_raw = bell.as_raw_fd();
        ep.tx.set_doorbell(Some(bell));
        let reg = tls::register(ctl.as_raw_fd(), region.fd().as_raw_fd(), bell_raw);
        tls::install_hooks();
        let span = Duration::from_nanos(reply.spin_ns);
        crate::config::set_rx_pair(reply.flags & ferry_proto::HELLO_RX_PAIR != 0);
        crate::config::set_spin(span);
        let nbufs = region.layout().total_bufs() as usize;
        Ok(Channel {
            ep,
            region,
            ctl,
            spin: spin_policy_of(span),
            batch: reply.batch.max(1),
            batch_delay: Duration::from_micros(u64::from(reply.batch_delay_us)),
            unrung: 0,
            unrung_since: None,
            fork_gen: tls::generation(),
            dead: false,
            tid: ferry_sys::gettid(),
            reg,
            arena: None,
            refs: vec![0; nbufs],
            demux: Demux::new(),
            inflight: Vec::new(),
        })
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.ep.bufs.buf_size()
    }

    /// Access to buffer memory.
    pub fn bufs(&self) -> &Buffers {
        &self.ep.bufs
    }

    /// `Err(DOWN)` once the channel failed.
    pub fn usable(&self) -> Res<()> {
        if self.dead { Err(Errno::DOWN) } else { Ok(()) }
    }

    /// Marks the channel failed (logged once per process): `why` is a
    /// [`ProtoError`] when the server broke the protocol.
    pub fn fail(&mut self, why: impl fmt::Display) -> Errno {
        if !self.dead {
            log::once(Once::Channel, format_args!("channel failed: {why}"));
        }
        self.dead = true;
        Errno::DOWN
    }

    fn ring_error(&mut self, e: ferry_ring::Error) -> Errno {
        self.fail(e)
    }

    /// Queues one fire-and-forget request (see `push_record`: when the doorbell rings).
    pub fn push(&mut self, call: Call) -> Res<()> {
        self.push_record(&call.encode())
    }

    /// Queues one record and commits it. A tagged record rings the doorbell at once; a
    /// fire-and-forget one every `batch` records (or when the oldest unrung one is older
    /// than the batch delay).
    fn push_record(&mut self, r: &Req) -> Res<()> {
        self.usable()?;
        loop {
            match self.ep.tx.push(r) {
                Ok(true) => break,
                Ok(false) => self.wait_ring_space()?,
                Err(e) => return Err(self.ring_error(e)),
            }
        }
        self.ep.tx.commit();
        if r.tag != 0 {
            self.ring();
            return Ok(());
        }
        self.unrung += 1;
        if self.unrung >= self.batch {
            self.ring();
        } else if self.unrung == 1 {
            self.unrung_since = Some(Instant::now());
        } else if self
            .unrung_since
            .is_some_and(|t| t.elapsed() >= self.batch_delay)
        {
            self.ring();
        }
        Ok(())
    }

    /// Commits and rings the doorbell (a system call only if the server sleeps).
    pub fn ring(&mut self) {
        self.ep.tx.commit();
        self.ep.tx.notify();
        self.unrung = 0;
        self.unrung_since = None;
    }

    /// Rings the doorbell and waits (briefly) until the server has taken every request:
    /// before the channel, or the process, goes away.
    pub fn drain(&mut self) {
        if self.dead {
            return;
        }
        self.ring();
        let cap = self.ep.tx.capacity();
        let t0 = Instant::now();
        while matches!(self.ep.tx.free(), Ok(n) if n < cap) && t0.elapsed() < DRAIN_WAIT {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The spin-before-sleep policy the server gave this channel.
    pub fn spin_policy(&self) -> SpinPolicy {
        self.spin
    }

    /// Counts a sleep in the kernel outside the channel (a blocking receive on a
    /// readiness pair) where the server, which reports wake-ups, can read it.
    pub fn count_kernel_sleep(&self) {
        self.region.count_outside_sleep(Side::A);
    }

    /// Rings the doorbell if records wait for it (before anything that may block).
    pub fn flush(&mut self) {
        if !self.dead && (self.unrung > 0 || self.ep.tx.pending() > 0) {
            self.ring();
        }
    }

    /// The request ring is full: wait for the server to take records. The server stops
    /// taking a channel's records while too many of its completions wait for the shim
    /// (back-pressure), so completions are taken meanwhile: those of no call (buffers
    /// given back, errors) are handled, those of the call in progress (a `Cancel` is
    /// pushed while one waits) are held for it ([`Channel::next_cmp`]).
    fn wait_ring_space(&mut self) -> Res<()> {
        self.ring();
        self.wait_until(&mut Room {
            checked: Instant::now(),
        })
    }

    /// Takes every completion that is there: a call's are held for it, the rest handled
    /// ([`Demux::hold`]). Whether there were any.
    fn take_untagged(&mut self) -> Res<bool> {
        let mut any = false;
        loop {
            match self.ep.rx.pop() {
                Ok(Some(c)) => match self.demux.hold(c) {
                    Ok(Some(e)) => self.unsolicited(e)?,
                    Ok(None) => {}
                    Err(e) => return Err(self.fail(e)),
                },
                Ok(None) => break,
                Err(e) => return Err(self.ring_error(e)),
            }
            any = true;
        }
        self.ep.rx.release();
        Ok(any)
    }

    /// The next completion: one held by [`Channel::wait_ring_space`] first.
    fn next_cmp(&mut self) -> Res<Option<Cmp>> {
        if let Some(c) = self.demux.next_held() {
            return Ok(Some(c));
        }
        self.ep.rx.pop().map_err(|e| self.ring_error(e))
    }

    /// What completion `c` asks of us ([`Demux::take`]); a violation fails the channel.
    fn take(&mut self, c: Cmp) -> Res<Event> {
        self.demux.take(c).map_err(|e| self.fail(e))
    }

    /// Handles every completion that is already there (none of them awaited).
    pub fn reap(&mut self) -> Res<()> {
        self.usable()?;
        while let Some(c) = self.next_cmp()? {
            let e = self.take(c)?;
            self.unsolicited(e)?;
        }
        self.ep.rx.release();
        Ok(())
    }

    /// A completion that is not the call's answer.
    fn unsolicited(&mut self, e: Event) -> Res<()> {
        match e {
            Event::BufReturn {
                sock,
                buf,
                len,
                result,
            } => {
                if let Some(f) = self
                    .inflight
                    .iter_mut()
                    .find(|f| f.sock == sock && f.records > 0)
                {
                    f.records -= 1;
                    f.bytes = f.bytes.saturating_sub(u64::from(len));
                    f.out += u64::from(len);
                    if f.records == 0 {
                        f.bytes = 0;
                    }
                }
                if result < 0 {
                    // The connection broke under this record: every channel that lent
                    // one hears it (the `AsyncError` goes to one of them only).
                    self.pending_error(sock, result);
                }
                self.drop_ref(BufId(buf))
            }
            Event::AsyncError { sock, result } => {
                self.pending_error(sock, result);
                Ok(())
            }
            // A buffer lent for a request given up on: give it back.
            Event::Orphan { buf, .. } | Event::Data { buf, .. } => self.give_back(buf),
            // The answer to a request given up on.
            Event::Stale | Event::Control | Event::Done(_) => Ok(()),
        }
    }

    /// Keeps socket `sock`'s error (`result`, a negated errno) for its next call.
    fn pending_error(&self, sock: u32, result: i32) {
        if !PENDING.put_or_evict(sock, result.saturating_neg(), |id| TABLE.names(id)) {
            log::once(
                Once::ErrTable,
                format_args!("too many pending socket errors; one was dropped"),
            );
        }
    }

    /// Returns a server buffer.
    fn give_back(&mut self, buf: u32) -> Res<()> {
        self.push(Call::BufReturn { sock: 0, buf })
    }

    /// Sends a tagged request (its tag is the channel's to give) and waits for its
    /// `Done`; `sink` receives each `Data` record's span (the buffer goes back to the
    /// server afterwards).
    pub fn call(
        &mut self,
        call: Call,
        w: Wait,
        sink: &mut dyn FnMut(&Buffers, BufSpan),
    ) -> Res<Cmp> {
        self.usable()?;
        let tag = self.demux.begin();
        let done = self
            .push_record(&call.with_tag(tag).encode())
            .and_then(|()| self.wait_done(call.sock(), tag, w, sink));
        if done.is_err() {
            self.demux.abandon();
        }
        done
    }

    /// Publishes one send record (a [`Call::Send`] whose slot is filled), after its
    /// control bytes (checked, at most [`ferry_proto::cmsg::MAX_CONTROL`]; sent as
    /// [`Call::SendCtl`] records) if any. A stream's record is counted until its buffer
    /// comes back ([`Channel::wait_sent`]).
    pub fn push_send(&mut self, send: Call, control: &[u8], stream: bool) -> Res<()> {
        let sock = send.sock();
        for c in Call::send_ctl(sock, control) {
            self.push(c)?;
        }
        let len = match send {
            Call::Send { buf, .. } => u64::from(buf.len),
            _ => 0,
        };
        self.push(send)?;
        if stream {
            match self.inflight.iter_mut().find(|f| f.sock == sock) {
                Some(f) => {
                    f.records += 1;
                    f.bytes += len;
                }
                None => {
                    if self.inflight.len() >= INFLIGHT_KEEP {
                        self.inflight.retain(|f| f.records > 0);
                    }
                    self.inflight.push(InFlight {
                        sock,
                        records: 1,
                        bytes: len,
                        out: 0,
                    });
                }
            }
        }
        Ok(())
    }

    /// Bytes of stream `sock` this channel queued that the server has not sent yet.
    pub fn queued(&self, sock: u32) -> u64 {
        self.inflight
            .iter()
            .find(|f| f.sock == sock)
            .map_or(0, |f| f.bytes)
    }

    /// A running count of the bytes of stream `sock` the server has said went out
    /// from this channel (compare two readings taken while records were out).
    pub fn sent_out(&self, sock: u32) -> u64 {
        self.inflight
            .iter()
            .find(|f| f.sock == sock)
            .map_or(0, |f| f.out)
    }

    /// How many more bytes stream `sock` may queue when the program gave it a send
    /// buffer of `budget` bytes (`SO_SNDBUF`, as the kernel counts it): the kernel's
    /// socket takes no more than that before a send blocks or says `EAGAIN`, and a
    /// program that made its buffer small (to see a peer's reset early, to pace
    /// itself) must not find ferry's buffers holding far more. Takes the buffers that
    /// came back; then, with no room, `Ok(None)` if `nonblock`, else waits for room.
    pub fn send_room(
        &mut self,
        sock: u32,
        budget: u64,
        nonblock: bool,
        w: Wait,
    ) -> Res<Option<usize>> {
        let room = |ch: &Channel| budget.saturating_sub(ch.queued(sock)) as usize;
        if room(self) > 0 {
            return Ok(Some(room(self)));
        }
        self.reap()?;
        if room(self) > 0 {
            return Ok(Some(room(self)));
        }
        if nonblock {
            return Ok(None);
        }
        self.ring();
        let start = w.since.unwrap_or_else(signals::counts);
        self.wait_until(&mut BudgetRoom {
            sock,
            budget,
            w,
            start,
        })
        .map(Some)
    }

    /// A blocking send on stream `sock` returns once its bytes are the kernel's, as the
    /// kernel's own send does once they are in the socket's buffer: waits until every
    /// send record this channel pushed for `sock` has come back (the server gives a
    /// buffer back once the host socket took its bytes, or the connection failed, which
    /// leaves an error pending for the socket). Queued sends stay asynchronous for
    /// non-blocking sockets (S1); for a blocking one this makes the error of a send
    /// that cannot complete the error of that very call. A signal or the send timeout
    /// ends the wait early (the bytes stay queued, and count as sent).
    pub fn wait_sent(&mut self, sock: u32, w: Wait) -> Res<()> {
        self.reap()?;
        if !self.sending(sock) {
            return Ok(());
        }
        self.ring();
        let start = w.since.unwrap_or_else(signals::counts);
        self.wait_until(&mut Sent { sock, w, start })
    }

    /// Whether send records of stream `sock` are still out ([`Channel::wait_sent`]).
    fn sending(&self, sock: u32) -> bool {
        self.inflight
            .iter()
            .any(|f| f.sock == sock && f.records > 0)
    }

    /// The control bytes that came with the last [`Channel::call`]'s answer.
    pub fn control(&self) -> &[u8] {
        self.demux.control()
    }

    /// Waits for the answer to tagged request `tag` on `sock` (see [`Answer`]).
    fn wait_done(
        &mut self,
        sock: u32,
        tag: u32,
        w: Wait,
        sink: &mut dyn FnMut(&Buffers, BufSpan),
    ) -> Res<Cmp> {
        let mut answer = Answer {
            sock,
            tag,
            w,
            start: signals::counts(),
            cancelled: None,
            sink,
        };
        self.wait_until(&mut answer)
    }

    /// Asks the server to give up on request `tag` on `sock` (answered `-EINTR` if it did).
    fn cancel(&mut self, sock: u32, tag: u32) -> Res<()> {
        self.push(Call::Cancel { sock, parked: tag })?;
        self.ring();
        Ok(())
    }

    /// One of this side's buffers. When none is free: `Ok(None)` if `nonblock`, else
    /// waits for the server to return one (until `w`'s deadline, or a signal).
    pub fn alloc_buf(&mut self, nonblock: bool, w: Wait) -> Res<Option<BufId>> {
        let b = self.alloc_buf_inner(nonblock, w)?;
        if let Some(b) = b {
            self.refs[b.0 as usize] = 1;
        }
        Ok(b)
    }

    /// [`Channel::alloc_buf`], before the buffer's reference is counted.
    fn alloc_buf_inner(&mut self, nonblock: bool, w: Wait) -> Res<Option<BufId>> {
        if let Some(b) = self.ep.pool.alloc() {
            return Ok(Some(b));
        }
        self.reap()?;
        if let Some(b) = self.ep.pool.alloc() {
            return Ok(Some(b));
        }
        if nonblock {
            return Ok(None);
        }
        self.ring();
        let start = w.since.unwrap_or_else(signals::counts);
        self.wait_until(&mut FreeBuffer { w, start }).map(Some)
    }

    /// A non-blocking send on socket `id` (the program's fd `fd`) found no free buffer
    /// (`alloc_slot` said `None` after taking every returned buffer): make the fd poll
    /// unwritable, and ask the server to make it writable again when a buffer comes
    /// back to this channel (see `Op::WantRoom`).
    pub fn want_room(&mut self, fd: c_int, id: u32) -> Res<()> {
        // The count is taken before the pair is filled: a buffer returned from now on
        // differs from it, and the server then empties the pair at once.
        let seen = self.demux.returns_seen();
        fill_pair(fd);
        self.push(Call::WantRoom {
            sock: id,
            returns_seen: seen,
        })?;
        self.ring();
        Ok(())
    }

    /// Gives back a slot of ours that was never sent.
    pub fn unalloc(&mut self, b: BufId) {
        let _ = self.drop_ref(b);
    }

    /// Room for `want` bytes to send. Small sends are packed into a shared buffer (the
    /// arena); larger ones get a buffer of their own. When no buffer is free: `Ok(None)`
    /// if `nonblock`, else waits as `alloc_buf` does.
    pub fn alloc_slot(&mut self, want: usize, nonblock: bool, w: Wait) -> Res<Option<Slot>> {
        if want >= SMALL_SEND {
            return Ok(self.alloc_buf(nonblock, w)?.map(|buf| Slot {
                buf,
                off: 0,
                cap: self.buf_size(),
            }));
        }
        let need = (want.max(1) + 7) & !7;
        if let Some((b, used)) = self.arena {
            if used as usize + need <= self.buf_size() {
                self.arena = Some((b, used + need as u32));
                self.refs[b.0 as usize] += 1;
                return Ok(Some(Slot {
                    buf: b,
                    off: used,
                    cap: want,
                }));
            }
            self.arena = None;
            self.drop_ref(b)?;
        }
        let Some(b) = self.alloc_buf(nonblock, w)? else {
            return Ok(None);
        };
        // One reference for the record, one for being the arena.
        self.refs[b.0 as usize] += 1;
        self.arena = Some((b, need as u32));
        Ok(Some(Slot {
            buf: b,
            off: 0,
            cap: want,
        }))
    }

    /// The memory of the first `n` bytes of `slot`, to fill; a slot the region does not
    /// hold (the server broke the layout) is given back and fails the channel.
    pub fn slot_mem(&mut self, slot: Slot, n: usize) -> Res<*mut u8> {
        match self.ep.bufs.span(slot.buf.0, slot.off, n as u32) {
            Ok(span) => Ok(self.ep.bufs.as_mut_ptr(span)),
            Err(e) => {
                self.unalloc(slot.buf);
                Err(self.fail(e))
            }
        }
    }

    /// Drops one reference to a buffer of ours; the last one frees it.
    fn drop_ref(&mut self, b: BufId) -> Res<()> {
        match self.refs.get_mut(b.0 as usize) {
            Some(r) if *r > 0 => {
                *r -= 1;
                if *r == 0
                    && let Err(e) = self.ep.pool.free(b)
                {
                    return Err(self.ring_error(e));
                }
                Ok(())
            }
            _ => Err(self.fail(ProtoError::BadBuffer(b.0))),
        }
    }

    /// `Err(DOWN)` when the server is gone: its end of the control socket hung up or it
    /// closed the region.
    pub fn check_alive(&mut self) -> Res<()> {
        if self.region.is_closed(Side::B) {
            return Err(self.fail(format_args!("server closed the channel")));
        }
        let rev =
            ferry_sys::poll_now(self.ctl.as_fd(), libc::POLLIN | libc::POLLRDHUP).unwrap_or(0);
        if rev & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0 {
            return Err(self.fail(format_args!("server hung up")));
        }
        if rev & libc::POLLIN != 0 {
            let r =
                crate::sys::recv_byte(self.ctl.as_raw_fd(), libc::MSG_PEEK | libc::MSG_DONTWAIT);
            if matches!(r, Ok(0)) {
                return Err(self.fail(format_args!("server hung up")));
            }
        }
        Ok(())
    }

    /// `EMFILE` when this process has no free descriptor for a new socket, found before
    /// the server is asked (which would make the socket, or take a connection off the
    /// listener, for nothing): the kernel's `socket` and `accept` fail that way, and
    /// leave a pending connection where it was.
    pub fn room_for_fd(&self) -> Res<()> {
        match ferry_sys::dup_above(self.ctl.as_fd(), 0) {
            Ok(spare) => {
                close_quiet(spare);
                Ok(())
            }
            Err(e) => Err(Errno::from_io(&e)),
        }
    }

    /// A control request, carrying `fd` if given (the proof of a `Claim`); waits for
    /// the reply (without a deadline: a blocking `accept` waits here) and returns it
    /// with the descriptor it carries (the program's end of a new socket's pair), if
    /// one arrived: none when this process is out of descriptors (the kernel then
    /// closes it, and the server hears that the socket is gone).
    pub fn ctl_call(
        &mut self,
        msg: &Ctl,
        fd: Option<BorrowedFd<'_>>,
    ) -> Res<(Ctl, Option<OwnedFd>)> {
        self.ctl_call_as(msg, fd, true)
    }

    /// [`Channel::ctl_call`], the descriptor received close-on-exec or not (`cloexec`:
    /// a `socket()` without `SOCK_CLOEXEC` takes its fd as it is to stay).
    pub fn ctl_call_as(
        &mut self,
        msg: &Ctl,
        fd: Option<BorrowedFd<'_>>,
        cloexec: bool,
    ) -> Res<(Ctl, Option<OwnedFd>)> {
        self.usable()?;
        self.flush();
        let fds: &[BorrowedFd<'_>] = match &fd {
            Some(fd) => std::slice::from_ref(fd),
            None => &[],
        };
        if let Err(e) = ferry_sys::send_with_fds(self.ctl.as_fd(), bytemuck::bytes_of(msg), fds) {
            return Err(self.fail(format_args!("control send: {e}")));
        }
        self.ctl_take(cloexec, Expect::Reply)
    }

    /// The host socket of stream `id` that the server sends on this channel right
    /// after answering its `Connect` with `CMP_HANDOFF` (`CtlKind::Handoff`): waits for
    /// it, as for a reply. `None` when this process is out of descriptors (the kernel
    /// then closes it).
    pub fn take_handed_off(&mut self, id: u32) -> Res<Option<OwnedFd>> {
        self.usable()?;
        let (msg, fd) = self.ctl_take(true, Expect::Handoff(id))?;
        Errno::check(msg.result)?;
        Ok(fd)
    }

    /// Waits for the control message `expect` names (spinning first, then sleeping).
    fn ctl_take(&mut self, cloexec: bool, expect: Expect) -> Res<(Ctl, Option<OwnedFd>)> {
        if let Some(reply) = self.ctl_spin(cloexec, expect)? {
            return Ok(reply);
        }
        loop {
            self.ctl_readable()?;
            if let Some(reply) = self.ctl_reply(cloexec, expect)? {
                return Ok(reply);
            }
        }
    }

    /// S0's SBW for a control call: tries to take the reply for the channel's spin
    /// span before [`Channel::ctl_readable`] sleeps. A `socket`'s pair comes back from
    /// a spinning server in microseconds, and a sleep in `poll` costs a wake-up (tens
    /// of µs on a VM): short connections paid one per `socket`.
    fn ctl_spin(&mut self, cloexec: bool, expect: Expect) -> Res<Option<(Ctl, Option<OwnedFd>)>> {
        let mut failed = None;
        let got = spin_for(self.spin, self.spin.span, || {
            match self.ctl_reply(cloexec, expect) {
                Ok(None) => None,
                Ok(Some(reply)) => Some(Some(reply)),
                Err(e) => {
                    failed = Some(e);
                    Some(None)
                }
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(got.flatten()),
        }
    }

    /// Waits until the control socket has something to read, checking every [`SLICE`]
    /// that the server has not closed the channel.
    fn ctl_readable(&mut self) -> Res<()> {
        loop {
            match ferry_sys::poll_wait(self.ctl.as_fd(), libc::POLLIN, SLICE.as_millis() as i32) {
                Ok(0) => {
                    if self.region.is_closed(Side::B) {
                        return Err(self.fail(format_args!("server closed the channel")));
                    }
                }
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.fail(format_args!("control poll: {e}"))),
            }
        }
    }

    /// Reads the control message `expect` names, with the first descriptor it carries
    /// (any others are closed); `None` when there was nothing to read after all, or
    /// only a hand-off nobody waits for any more (a `Connect` given up at its
    /// `SO_SNDTIMEO`: its host socket is closed).
    fn ctl_reply(&mut self, cloexec: bool, expect: Expect) -> Res<Option<(Ctl, Option<OwnedFd>)>> {
        let mut buf = [0u8; size_of::<Ctl>()];
        let got =
            ferry_sys::recv_with_fds_as(self.ctl.as_fd(), &mut buf, libc::MSG_DONTWAIT, cloexec);
        match got {
            Ok((n, mut fds, _)) if n == buf.len() => {
                let c: Ctl = bytemuck::pod_read_unaligned(&buf);
                let wanted = match (c.kind(), expect) {
                    (Some(CtlKind::Reply), Expect::Reply) => true,
                    (Some(CtlKind::Handoff), Expect::Handoff(id)) => c.sock == id,
                    (Some(CtlKind::Handoff), Expect::Reply) => false,
                    _ => return Err(self.fail(ProtoError::CtlKind(c.kind))),
                };
                let first = fds.pop();
                for f in fds {
                    close_quiet(f);
                }
                if !wanted {
                    if let Some(f) = first {
                        close_quiet(f);
                    }
                    return Ok(None);
                }
                Ok(Some((c, first)))
            }
            Ok((0, _, _)) => Err(self.fail(format_args!("server hung up"))),
            Ok((n, _, _)) => Err(self.fail(ProtoError::CtlSize(n))),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(self.fail(format_args!("control receive: {e}"))),
        }
    }
}

/// The control message a channel waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// The reply to its request.
    Reply,
    /// The host socket of stream `id`, handed off (`CtlKind::Handoff`).
    Handoff(u32),
}

// The channel's waits: one loop (`Channel::wait_until`), and what ends each kind of wait
// (`Until`): room in the request ring (`Room`), a free buffer (`FreeBuffer`), a call's
// answer (`Answer`), a stream's sends given back (`Sent`).

/// What one sleep of [`Channel::wait_until`] waits on, and for how long at most.
#[derive(Clone, Copy, Debug)]
enum Sleep {
    /// A completion, or a handler running (this thread's signal counts changing).
    Completion(Duration),
    /// Room in the request ring.
    Room(Duration),
}

/// What ends a wait of [`Channel::wait_until`], and its part in each turn of the loop.
trait Until {
    /// What the wait gives when it ends well.
    type Out;

    /// The signal counts the first sleep on completions compares with (a handler that
    /// ran since then wakes it): by default, those when the loop begins.
    fn seen_at_start(&self) -> Counts {
        signals::counts()
    }

    /// Before each sleep: takes what arrived; `Some` ends the wait.
    fn before(&mut self, ch: &mut Channel) -> Res<Option<Self::Out>>;

    /// What the next sleep waits on.
    fn sleep(&self) -> Sleep;

    /// Right after each sleep (`futex_eintr`: a signal cut it short): what the handlers
    /// that ran meanwhile do to the wait. Nothing by default.
    fn signalled(&mut self, _ch: &mut Channel, _futex_eintr: bool) -> Res<()> {
        Ok(())
    }

    /// Whether a sleep that timed out is followed by [`Channel::check_alive`] (by
    /// default every one).
    fn alive_due(&mut self) -> bool {
        true
    }

    /// After a sleep that ended with `r` (never `PeerClosed`); `Some` ends the wait.
    fn woke(&mut self, ch: &mut Channel, r: WaitResult) -> Res<Option<Self::Out>>;
}

impl Channel {
    /// The one wait loop: until `end` ends it, takes what arrived, sleeps (spinning
    /// first) on what `end` names, lets `end` see the handlers that ran, checks that the
    /// server is alive after a sleep that timed out, and fails when the server closed the
    /// channel.
    // Inlined, with `Answer`'s steps, into `call` (every tagged request waits here), as
    // the loop it replaced was: without, a UDP ping-pong (its receives are calls) took
    // ~4% longer a round trip.
    #[inline]
    fn wait_until<U: Until>(&mut self, end: &mut U) -> Res<U::Out> {
        let mut seen = end.seen_at_start();
        loop {
            if let Some(out) = end.before(self)? {
                return Ok(out);
            }
            // A handler running while we spin or just before we sleep ends a sleep on
            // completions.
            let r = match end.sleep() {
                Sleep::Completion(slice) => self
                    .ep
                    .rx
                    .wait_with(self.spin, Some(slice), || signals::counts() != seen),
                Sleep::Room(slice) => self.ep.tx.wait_space(self.spin, Some(slice)),
            };
            end.signalled(self, matches!(r, Ok(WaitResult::Interrupted)))?;
            seen = signals::counts();
            let r = match r {
                Ok(WaitResult::PeerClosed) => {
                    return Err(self.fail(format_args!("server closed the channel")));
                }
                Ok(r) => r,
                Err(e) => return Err(self.ring_error(e)),
            };
            if matches!(r, WaitResult::TimedOut) && end.alive_due() {
                self.check_alive()?;
            }
            if let Some(out) = end.woke(self, r)? {
                return Ok(out);
            }
        }
    }
}

/// Room in the request ring ([`Channel::wait_ring_space`]), in 1 ms sleeps: completions
/// are taken meanwhile, and whether the server is alive checked every [`SLICE`].
/// Signals do not end it.
#[derive(Debug)]
struct Room {
    /// When the server was last found alive (or the wait began).
    checked: Instant,
}

impl Until for Room {
    type Out = ();

    fn before(&mut self, ch: &mut Channel) -> Res<Option<()>> {
        if ch.take_untagged()? {
            // The server may be waiting for room for its completions (see
            // `wait_ring_space`): tell it there is some.
            ch.ring();
        }
        Ok(None)
    }

    fn sleep(&self) -> Sleep {
        // Short sleeps: the server publishes completions (which it may be waiting for
        // us to take) without waking a producer that waits for room.
        Sleep::Room(Duration::from_millis(1))
    }

    fn alive_due(&mut self) -> bool {
        let due = self.checked.elapsed() >= SLICE;
        if due {
            self.checked = Instant::now();
        }
        due
    }

    fn woke(&mut self, _ch: &mut Channel, r: WaitResult) -> Res<Option<()>> {
        Ok(matches!(r, WaitResult::Ready).then_some(()))
    }
}

/// `EINTR` if a handler that ran since `start` interrupts wait `w` (as
/// [`Wait::interrupted`] says; `futex_eintr`: a signal cut the last sleep short).
fn interrupted(w: Wait, start: Counts, futex_eintr: bool) -> Res<()> {
    if w.interrupted(start, futex_eintr) {
        return Err(Errno::EINTR);
    }
    Ok(())
}

/// A buffer of ours free again ([`Channel::alloc_buf`]): a handler that interrupts (as
/// [`Wait::interrupted`] says) fails the wait with `EINTR`, the deadline with the
/// wait's own errno.
#[derive(Debug)]
struct FreeBuffer {
    w: Wait,
    /// The signal counts the wait's handlers are counted from.
    start: Counts,
}

impl Until for FreeBuffer {
    type Out = BufId;

    fn before(&mut self, _ch: &mut Channel) -> Res<Option<BufId>> {
        interrupted(self.w, self.start, false).map(|()| None)
    }

    fn sleep(&self) -> Sleep {
        Sleep::Completion(self.w.slice())
    }

    fn signalled(&mut self, _ch: &mut Channel, futex_eintr: bool) -> Res<()> {
        interrupted(self.w, self.start, futex_eintr)
    }

    fn woke(&mut self, ch: &mut Channel, r: WaitResult) -> Res<Option<BufId>> {
        match r {
            WaitResult::Ready => {
                ch.reap()?;
                Ok(ch.ep.pool.alloc())
            }
            WaitResult::TimedOut if self.w.passed() => Err(self.w.expired),
            _ => Ok(None),
        }
    }
}

/// The answer (`Done`) to tagged request `tag` on `sock` ([`Channel::call`]); its `Data`
/// records go to `sink` on the way. A handler that interrupts, or the deadline, cancels
/// the request (`Op::Cancel`) and the wait goes on for the answer, which is then the
/// interruption's errno if the server confirms (`-EINTR`).
struct Answer<'a> {
    sock: u32,
    tag: u32,
    w: Wait,
    /// The signal counts when the wait began: handlers are counted from there.
    start: Counts,
    /// Set once the request is cancelled: what a `-EINTR` answer then means.
    cancelled: Option<Errno>,
    sink: &'a mut dyn FnMut(&Buffers, BufSpan),
}

impl Until for Answer<'_> {
    type Out = Cmp;

    fn seen_at_start(&self) -> Counts {
        self.start
    }

    #[inline]
    fn before(&mut self, ch: &mut Channel) -> Res<Option<Cmp>> {
        while let Some(c) = ch.next_cmp()? {
            match ch.take(c)? {
                Event::Data { buf, len, .. } => {
                    let span = match ch.ep.bufs.span(buf, 0, len) {
                        Ok(s) => s,
                        Err(e) => return Err(ch.ring_error(e)),
                    };
                    (self.sink)(&ch.ep.bufs, span);
                    ch.give_back(buf)?;
                }
                // Kept by the demux, for `Channel::control`.
                Event::Control => {}
                Event::Done(c) => {
                    ch.ep.rx.release();
                    return match self.cancelled {
                        Some(e) if c.result == -libc::EINTR => Err(e),
                        _ => Ok(Some(c)),
                    };
                }
                e => ch.unsolicited(e)?,
            }
        }
        Ok(None)
    }

    fn sleep(&self) -> Sleep {
        Sleep::Completion(if self.cancelled.is_some() {
            SLICE
        } else {
            self.w.slice()
        })
    }

    #[inline]
    fn signalled(&mut self, ch: &mut Channel, futex_eintr: bool) -> Res<()> {
        if self.cancelled.is_none() && self.w.interrupted(self.start, futex_eintr) {
            ch.cancel(self.sock, self.tag)?;
            self.cancelled = Some(Errno::EINTR);
        }
        Ok(())
    }

    fn woke(&mut self, ch: &mut Channel, r: WaitResult) -> Res<Option<Cmp>> {
        if matches!(r, WaitResult::TimedOut) && self.cancelled.is_none() && self.w.passed() {
            ch.cancel(self.sock, self.tag)?;
            self.cancelled = Some(self.w.expired);
        }
        Ok(None)
    }
}

/// Every send record of stream `sock` given back ([`Channel::wait_sent`]). A handler
/// (any, as for a partial send), the deadline or an error pending for the socket ends
/// the wait early, without an error: the bytes stay queued.
#[derive(Debug)]
struct Sent {
    sock: u32,
    w: Wait,
    /// The signal counts the wait's handlers are counted from.
    start: Counts,
}

impl Until for Sent {
    type Out = ();

    fn before(&mut self, _ch: &mut Channel) -> Res<Option<()>> {
        let early = self.w.partial().interrupted(self.start, false)
            || self.w.passed()
            || PENDING.has(self.sock);
        Ok(early.then_some(()))
    }

    fn sleep(&self) -> Sleep {
        Sleep::Completion(self.w.slice())
    }

    fn woke(&mut self, ch: &mut Channel, _r: WaitResult) -> Res<Option<()>> {
        ch.reap()?;
        Ok((!ch.sending(self.sock)).then_some(()))
    }
}

/// Room under stream `sock`'s send budget ([`Channel::send_room`]): how many bytes.
/// A handler that interrupts fails the wait with `EINTR`, the deadline with the wait's
/// own errno, and an error pending for the socket ends it with room (the send then
/// reports the error).
#[derive(Debug)]
struct BudgetRoom {
    sock: u32,
    budget: u64,
    w: Wait,
    /// The signal counts the wait's handlers are counted from.
    start: Counts,
}

impl Until for BudgetRoom {
    type Out = usize;

    fn before(&mut self, _ch: &mut Channel) -> Res<Option<usize>> {
        interrupted(self.w, self.start, false)?;
        Ok(PENDING.has(self.sock).then_some(1))
    }

    fn sleep(&self) -> Sleep {
        Sleep::Completion(self.w.slice())
    }

    fn signalled(&mut self, _ch: &mut Channel, futex_eintr: bool) -> Res<()> {
        interrupted(self.w, self.start, futex_eintr)
    }

    fn woke(&mut self, ch: &mut Channel, r: WaitResult) -> Res<Option<usize>> {
        if matches!(r, WaitResult::TimedOut) && self.w.passed() {
            return Err(self.w.expired);
        }
        ch.reap()?;
        let room = self.budget.saturating_sub(ch.queued(self.sock)) as usize;
        Ok((room > 0).then_some(room))
    }
}

impl Drop for Channel {
    /// Rings the doorbell, gives the server a moment to take the last requests (a thread
    /// that sends and exits must not lose its data), marks this side closed.
    fn drop(&mut self) {
        if let Some(i) = self.reg.take() {
            tls::unregister(i);
        }
        self.drain();
        self.region.close(Side::A);
    }
}

/// Closes a descriptor of the shim's own without going through the exported `close`.
pub fn close_quiet(fd: OwnedFd) {
    let _ = ferry_sys::close_raw(fd.into_raw_fd());
}

/// The control socket, connected to the server's socket at `path`. Under the hand-off guard
/// ([`config::guarded`]) the connect is made by a thread with a descriptor table of its
/// own (a copy: the socket is in both, one open file): the guard lets such a call
/// proceed as made, whereas from a table other threads share it would have a stand-in
/// make it, and the server would see the stand-in's pid, not this process's.
fn connect_ctl(path: &Path) -> Result<OwnedFd, OpenError> {
    let ctl = ferry_sys::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0)
        .map_err(|e| OpenError::Io("socket", e))?;
    let connect = |fd: BorrowedFd<'_>| loop {
        match ferry_sys::connect_unix(fd, path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(OpenError::Io("connect", e)),
        }
    };
    if !config::guarded() {
        connect(ctl.as_fd())?;
        return Ok(ctl);
    }
    let raw = ctl.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare with an integer flag; it affects this thread only.
            if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
                return Err(OpenError::Io("unshare", std::io::Error::last_os_error()));
            }
            // SAFETY: `raw` names the same open socket in this thread's copy of the
            // table, which lives until the thread ends, after the connect.
            connect(unsafe { BorrowedFd::borrow_raw(raw) })
        })
        .join()
        .unwrap_or(Err(OpenError::Io(
            "connect",
            std::io::ErrorKind::Other.into(),
        )))
    })?;
    Ok(ctl)
}

/// Says `Hello` on `ctl` to protocol server `server`, for this thread.
fn say_hello(ctl: &OwnedFd, server: usize) -> Result<(), OpenError> {
    // SAFETY: no arguments; getpid touches no memory and cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let hello = Hello {
        version: PROTO_VERSION,
        pid,
        tid: ferry_sys::gettid(),
        server: server as u32
            | HELLO_ROUTES
            | ferry_proto::HELLO_READS_PAIR
            | ferry_proto::HELLO_TAKES_HANDOFF,
    };
    ferry_sys::send_with_fds(ctl.as_fd(), bytemuck::bytes_of(&hello), &[])
        .map_err(|e| OpenError::Io("hello", e))
}

/// The server's answer to the hello (within [`HELLO_TIMEOUT_MS`]), checked, with the
/// region's descriptor and the server's doorbell.
fn hello_reply(ctl: &OwnedFd) -> Result<(HelloReply, [OwnedFd; 2]), OpenError> {
    let mut waited = 0;
    loop {
        match ferry_sys::poll_wait(ctl.as_fd(), libc::POLLIN, 100) {
            Ok(0) if waited < HELLO_TIMEOUT_MS => waited += 100,
            Ok(0) => return Err(OpenError::NoAnswer),
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(OpenError::Io("poll", e)),
        }
    }
    let mut buf = [0u8; size_of::<HelloReply>()];
    let (n, fds) = ferry_sys::recv_with_fds(ctl.as_fd(), &mut buf, libc::MSG_DONTWAIT)
        .map_err(|e| OpenError::Io("hello reply", e))?;
    if n != buf.len() {
        return Err(ProtoError::HelloSize(n).into());
    }
    let reply: HelloReply = bytemuck::pod_read_unaligned(&buf);
    if reply.version != PROTO_VERSION {
        return Err(ProtoError::Refused(reply.version).into());
    }
    let fds = <[OwnedFd; 2]>::try_from(fds).map_err(|fds| ProtoError::HelloFds(fds.len()))?;
    Ok((reply, fds))
}

/// Where the shim's own descriptors go: near the top of `RLIMIT_NOFILE` (capped, so a
/// huge limit does not make the kernel grow the fd table to millions of entries).
fn high_floor() -> i32 {
    // SAFETY: an rlimit is two integers: all-zero is a valid value.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes one rlimit into `rl`, a live local.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur
    } else {
        1024
    };
    let top = cur.min(1 << 16) as i32;
    top - top / 8
}

/// A close-on-exec duplicate of `fd` at or above `floor` (the original is closed); `fd`
/// itself when that fails.
fn move_high(fd: OwnedFd, floor: i32) -> OwnedFd {
    if fd.as_raw_fd() >= floor {
        return fd;
    }
    match ferry_sys::dup_above(fd.as_fd(), floor) {
        Ok(high) => {
            close_quiet(fd);
            high
        }
        Err(_) => fd,
    }
}

/// Makes the program's end `fd` of a readiness pair poll unwritable until the server
/// reads from its end. The kernel reports a unix stream socket writable while what it
/// has sent and its peer has not read yet takes at most a quarter of its send buffer
/// (`unix_writable`), and a send fails with `EAGAIN` only once that reaches the whole
/// buffer; so the send buffer is made as small as the kernel allows (the program never
/// sees it: its `SO_SNDBUF` is the host socket's) and filled up, after an out-of-band
/// marker byte that tells the server where the filler starts. Used for a send that
/// found no room and, for good, for a listener (never writable in the kernel).
pub fn fill_pair(fd: c_int) {
    // SAFETY: `fd` is the program's end of a ferry socket, borrowed for the calls below
    // only (crate docs, Borrowed descriptors).
    let b = unsafe { ferry_sys::borrow(fd) };
    let _ = ferry_sys::setsockopt(b, libc::SOL_SOCKET, libc::SO_SNDBUF, &1i32.to_ne_bytes());
    // The marker: the server's reads stop at it, so the bytes before it are the
    // program's own writes (calls the shim cannot see), the bytes after it filler.
    let _ = ferry_sys::send_oob(b, 0);
    let filler = [0u8; 4096];
    // Two sends fill the smallest buffer; the bound is for an end whose buffer was
    // enlarged behind ferry's back.
    for _ in 0..8 {
        match ferry_sys::send_nosignal(b, &filler) {
            Ok(n) if n == filler.len() => {}
            _ => break,
        }
    }
}

/// The shim's spin-before-sleep policy for a span the server gave: the first 2 µs a
/// pure spin, then `sched_yield` between tries.
pub fn spin_policy_of(span: Duration) -> SpinPolicy {
    SpinPolicy::new(span, span.min(Duration::from_micros(2)))
}

thread_local! {
    // Const-initialised and without a destructor: plain thread-local memory, safe to
    // touch from a signal handler (one that waits meanwhile only skews the estimate).
    /// The spin budget of this thread's waits on the kernel (a pair receive, `poll`,
    /// `select`, `epoll_wait`): they wait for the network, which may be idle for long.
    static KERNEL_SPIN: Cell<Option<AdaptiveSpin>> = const { Cell::new(None) };
    /// When this thread's wait on the kernel that went to sleep began.
    static SLEPT_FROM: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Waits on the kernel in a row that outlast the span before a thread spins less: an
/// event loop (wrk's, nginx's) meets long waits between bursts of short ones, and a
/// budget halved by each of them cost wrk 11% of its requests a second (R1's 16 KiB
/// row) in sleeps and wake-ups.
const KERNEL_PATIENCE: u8 = 4;

/// How long this thread's next wait on the kernel may spin, of the server's `span`
/// ([`AdaptiveSpin`]: none after waits that outlasted the span, so an idle program
/// sleeps at once instead of burning the span on every wait).
pub fn kernel_budget(span: Duration) -> Duration {
    KERNEL_SPIN.with(|k| {
        k.get()
            .filter(|a| a.max() == span)
            .map_or(span, |a| a.budget())
    })
}

/// Exchanges in flight ([`crate::fdtable::FdTable::in_flight`]) above which a wait on
/// the kernel does not spin. With that many replies coming, one arrives every few
/// microseconds and a wait that sleeps wakes to a batch of them, while a spin returns
/// each alone and burns the gaps between them (redis-benchmark's 50 connections: the
/// program's CPU was busy all the time); a wait for one reply (ping-pong, a single
/// connection) or a few (wrk's 16) keeps the spin, where a sleep's wake-up adds to
/// every round trip.
pub const SPIN_IN_FLIGHT: u32 = 16;

/// Whether a wait on the kernel spins before it sleeps: unless the process has more
/// than [`SPIN_IN_FLIGHT`] exchanges in flight.
#[inline]
pub fn spin_pays() -> bool {
    TABLE.in_flight() <= SPIN_IN_FLIGHT
}

/// This thread's wait on the kernel that began at `t0` has ended (in its spin).
pub fn kernel_waited(span: Duration, t0: Instant) {
    KERNEL_SPIN.with(|k| {
        let mut a = k
            .get()
            .filter(|a| a.max() == span)
            .unwrap_or(AdaptiveSpin::patient(span, KERNEL_PATIENCE));
        a.waited(t0.elapsed());
        k.set(Some(a));
    });
}

/// This thread's wait on the kernel that began at `t0` goes to sleep now: [`kernel_woke`]
/// after the sleeping call counts how long it lasted.
pub fn kernel_sleeps(t0: Instant) {
    SLEPT_FROM.with(|s| s.set(Some(t0)));
}

/// The sleeping call after [`kernel_sleeps`] returned (a no-op when none slept).
pub fn kernel_woke() {
    if let Some(t0) = SLEPT_FROM.with(Cell::take) {
        kernel_waited(config::spin(), t0);
    }
}

/// Busy-wait hints between two tries of [`spin_for`] when it does not yield: about
/// half a microsecond, what a `sched_yield` with nothing else to run costs.
const PROBE_GAP_SPINS: u32 = 10;

/// S0's spin for a wait the kernel does (a receive, `poll`, `epoll_wait`…): tries `f`
/// until it gives an answer or `limit` has passed (`None`), spinning purely for the
/// policy's first part and yielding between tries after it.
pub fn spin_for<T>(p: SpinPolicy, limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t0 = Instant::now();
    let mut pacer = YieldPacer::new();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        let spent = t0.elapsed();
        if spent >= limit {
            return None;
        }
        if spent >= p.pure_spin {
            // `f` is a system call: between tries in a calm window, a pause about as
            // long as a yield instead of the yield.
            pacer.pause(PROBE_GAP_SPINS);
        } else {
            std::hint::spin_loop();
        }
    }
}
