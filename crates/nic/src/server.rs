//! A NIC server: one thread, one frame device (a TAP queue), one user-space TCP/IP
//! stack, its flows.
//!
//! Theory of operation. Each turn of the loop reads a batch of up to [`BATCH`] frames
//! from the device (S1: many frames per wake-up) and sorts each ([`frame::classify`]):
//!
//! * **TCP** (`pending.rs`, `tcp.rs`): a SYN opening a flow the rules allow makes a host
//!   socket and starts a non-blocking connect; the SYN waits beside it (a *pending* flow:
//!   no stack socket, nothing due) until the connect ends: replayed into a stack socket
//!   listening on the destination (the SYN-ACK leaves), or into none (a reset). A SYN the
//!   rules refuse goes to the stack with no socket to take it: a reset at once. Bytes
//!   then move between the stack socket's buffers and the host socket, and the flow's
//!   [`Phase`](phase::Phase) follows its ends.
//! * **UDP** and **echo** (`dgram.rs`) bypass the stack: each (source, destination) is a
//!   flow on a connected host UDP socket or ping socket; answers are framed back. A
//!   refused datagram or echo gets "administratively prohibited" at once.
//! * **ARP and neighbour discovery** go to the stack, which answers for the gateway.
//! * **DNS** to the gateway's port 53, when [`NicConfig::dns`] names upstreams (a VM
//!   guest's resolver, `dns.rs`): relayed by the forwarder's core, not a flow.
//!
//! Every flow is in one table (`flows.rs`), found by id (its epoll token) or by what the
//! sandbox opened; one [`NicServer::reap`] ends those that are over. Every flow the
//! sandbox opens passes one admission check, [`NicServer::admit`]. Published TCP
//! connections (this server's own listeners in nic mode; in both mode, those the
//! protocol server passes on through its [`TapHandoff`](ferry_egress::TapHandoff))
//! become stack connections to the sandbox (`published.rs`).
//!
//! Then the server moves bytes of every flow (host ⇄ stack), lets the stack send what
//! it can, and sleeps in epoll (device, host sockets, the stop eventfd, the stack's next
//! timer) only after spinning with nothing to do (SBW: up to [`NicConfig::spin`], for as
//! long as spinning has been paying, `spin.rs`). Frames to the sandbox are written in
//! batches (`stack.rs`, [`Port`](stack::Port)).
//!
//! Seams: the device is a [`FrameDevice`], the host sockets are reached through
//! [`HostIo`], time comes from a clock a test may hold: `testkit.rs` runs the real
//! server over fakes of all three.
//!
//! Must not: block (every descriptor is non-blocking), hold memory per flow beyond the
//! stack's two buffers (flows capped by [`NicConfig::max_flows`]), or let a frame from
//! the sandbox choose a source other than the sandbox's own addresses.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferry_egress::{Bond, Lease, LogThrottle};
use ferry_sys::{Epoll, Event};
use smoltcp::wire::EthernetAddress;
use tracing::{debug, warn};

use crate::device::{FrameDevice, Frames, TapQueue};
use crate::frame::{self, Inbound, Link, Why};
use crate::hostio::{HostIo, Sys};
use crate::stats::LIVE_EVERY;
use crate::timing::Stage;
use crate::{NicConfig, NicLive, NicPublish, NicStats};
use flows::{Flow, FlowTable, Key, Proto};
use gate::Gate;
use published::Published;
use spin::Spin;
use stack::{Port, Stack};

mod dgram;
mod dns;
mod flows;
mod gate;
mod pending;
mod phase;
mod published;
mod spin;
mod stack;
mod tcp;

/// Most frames read from the device per turn.
const BATCH: usize = 64;
/// How often pending flows are probed (idle datagram flows: the flow table's sweep).
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Largest datagram or echo message relayed.
const DGRAM_MAX: usize = 65_536 + frame::ETH_LEN;
/// The gateway's hardware address (locally administered).
pub(crate) const GATEWAY_MAC: EthernetAddress =
    EthernetAddress([0x02, 0x66, 0x65, 0x72, 0x72, 0x79]);

const TOKEN_DEVICE: u64 = 0;
const TOKEN_STOP: u64 = 1;
const TOKEN_HANDOFF: u64 = 2;
/// The guest resolver's upstream sockets (`dns.rs`).
const TOKEN_DNS: u64 = 3;
/// Tokens of published listeners start here; flows' above [`FIRST_FLOW`].
const TOKEN_LISTEN: u64 = 16;
const FIRST_FLOW: u64 = 1 << 20;

/// Longest a server drains its TCP flows after the sandbox's program has exited.
pub const DRAIN_MAX: Duration = Duration::from_secs(5);

/// Stops a running [`NicServer`] from another thread.
#[derive(Clone, Debug)]
pub struct StopHandle {
    flag: Arc<AtomicBool>,
    drain: Arc<AtomicBool>,
    efd: Arc<OwnedFd>,
}

impl StopHandle {
    /// Asks the server to stop; it returns from [`NicServer::run`] soon after.
    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = ferry_sys::eventfd_signal(self.efd.as_fd());
    }

    /// Asks the server to stop once its TCP flows have ended (the sandbox's kernel
    /// still sends what its exited programs wrote, and their FINs), the device is gone,
    /// or [`DRAIN_MAX`] has passed: what a program wrote before it exited arrives, as
    /// it would natively.
    pub fn drain(&self) {
        self.drain.store(true, Ordering::SeqCst);
        let _ = ferry_sys::eventfd_signal(self.efd.as_fd());
    }
}

/// Where a server's time comes from: the monotonic clock, or a test's hand.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Clock {
    Real,
    Manual(Instant),
}

impl Clock {
    pub(crate) fn now(&self) -> Instant {
        match self {
            Clock::Real => Instant::now(),
            Clock::Manual(t) => *t,
        }
    }
}

/// What a server is made of besides its configuration: its seams.
pub(crate) struct Parts {
    pub index: usize,
    pub dev: Box<dyn FrameDevice>,
    pub io: Arc<dyn HostIo>,
    pub clock: Clock,
    /// The stack's randomness (sequence numbers).
    pub seed: u64,
}

/// One NIC server (see the module docs).
pub struct NicServer {
    id: String,
    cfg: Arc<NicConfig>,
    io: Arc<dyn HostIo>,
    port: Port,
    stack: Stack,
    flows: FlowTable,
    published: Published,
    /// The batch of frames being handled.
    rx: Frames,
    epoll: Epoll,
    events: Vec<Event>,
    stop: StopHandle,
    clock: Clock,
    link: Link,
    /// A datagram or echo message on its way.
    buf: Vec<u8>,
    stats: NicStats,
    next_sweep: Instant,
    /// The admission of flows.
    gate: Gate,
    /// The guest's resolver, when [`NicConfig::dns`] names upstreams.
    dns: Option<dns::GuestDns>,
    /// Log lines of host sockets that could not be made.
    failures: LogThrottle,
    device_gone: bool,
    /// Whether the next turn reads the device: after a busy turn, or when epoll said it
    /// is readable (a spinning turn that found nothing asks epoll first, one system call
    /// instead of two).
    device_due: bool,
    /// How long an idle loop spins before it sleeps (`spin.rs`).
    spin: Spin,
    /// Whether the last pump left a TCP flow backlogged (`tcp::backlogged`): then an
    /// idle loop sleeps at once.
    backlogged: bool,
    live: Arc<NicLive>,
}

impl std::fmt::Debug for NicServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicServer")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Watches host socket `fd` of flow `id` (edge-triggered, both ways).
fn watch(epoll: &Epoll, fd: BorrowedFd<'_>, id: u64) -> io::Result<()> {
    let ev = libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET;
    epoll.add(fd, ev as u32, id)
}

/// A host socket of type `ty` and protocol `proto` to `to` (non-blocking, bound to the
/// bond's pick, if any), its connect started; whether the connect is done already.
fn connect_host(
    io: &dyn HostIo,
    bond: Option<&Arc<Bond>>,
    (ty, proto): (i32, i32),
    to: SocketAddr,
) -> io::Result<(OwnedFd, Option<Lease>, bool)> {
    let domain = if to.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let fd = io.socket(domain, ty, proto)?;
    let lease = bond.and_then(|b| b.lease(to));
    if let Some(l) = &lease {
        io.bind(fd.as_fd(), &SocketAddr::new(l.addr(), 0))?;
    }
    let done = match io.connect(fd.as_fd(), &to) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => false,
        Err(e) => return Err(e),
    };
    Ok((fd, lease, done))
}

/// Refreshes `live` from the counters (`stats`, and what the open flows hold).
fn refresh_live(live: &NicLive, stats: &NicStats, flows: usize, open_bytes: (u64, u64)) {
    let r = Ordering::Relaxed;
    live.cpu.store(ferry_sys::current_cpu(), r);
    live.flows.store(flows as u64, r);
    live.frames.store(stats.frames_in, r);
    live.bytes_out.store(stats.bytes_out + open_bytes.0, r);
    live.bytes_in.store(stats.bytes_in + open_bytes.1, r);
    live.sleeps.store(stats.sleeps, r);
}

impl NicServer {
    /// A NIC server `nic-{index}` on TAP queue `queue` (made non-blocking). `publish`: the
    /// published TCP ports this server listens for on the host (give them to one server).
    /// Any descriptor that carries one frame, behind its `virtio_net_hdr`, per `read` and
    /// per write serves as the queue ([`TapQueue`]).
    pub fn new(
        index: usize,
        queue: OwnedFd,
        cfg: Arc<NicConfig>,
        publish: &[NicPublish],
    ) -> io::Result<NicServer> {
        let dev = TapQueue::new(queue, cfg.plan.mtu as usize)?;
        NicServer::with_device(index, Box::new(dev), cfg, publish)
    }

    /// A NIC server `nic-{index}` on frame device `dev`.
    pub fn with_device(
        index: usize,
        dev: Box<dyn FrameDevice>,
        cfg: Arc<NicConfig>,
        publish: &[NicPublish],
    ) -> io::Result<NicServer> {
        let parts = Parts {
            index,
            dev,
            io: Arc::new(Sys),
            clock: Clock::Real,
            seed: ferry_sys::random_u64().unwrap_or(0x0066_6572_7279),
        };
        NicServer::build(parts, cfg, publish)
    }

    /// A NIC server over `parts`.
    pub(crate) fn build(
        parts: Parts,
        cfg: Arc<NicConfig>,
        publish: &[NicPublish],
    ) -> io::Result<NicServer> {
        let mut port = Port::new(parts.dev, cfg.timing);
        let start = parts.clock.now();
        let stack = Stack::new(
            &mut port,
            &cfg.plan,
            GATEWAY_MAC,
            parts.seed,
            cfg.tcp_buffer,
            start,
        );
        let spin = cfg.spin;
        let epoll = Epoll::new(256)?;
        epoll.add(port.wake_fd(), libc::EPOLLIN as u32, TOKEN_DEVICE)?;
        let efd = Arc::new(ferry_sys::eventfd()?);
        epoll.add(efd.as_fd(), libc::EPOLLIN as u32, TOKEN_STOP)?;
        let id = format!("nic-{}", parts.index);
        let published = Published::listen(&*parts.io, &epoll, publish, &id, &cfg.plan.ifname)?;
        let [a, b, ..] = parts.seed.to_le_bytes();
        let dns = dns::GuestDns::new(&*parts.io, &cfg.dns, u16::from_le_bytes([a, b]))?;
        for fd in dns.iter().flat_map(dns::GuestDns::sockets) {
            epoll.add(fd, libc::EPOLLIN as u32, TOKEN_DNS)?;
        }
        Ok(NicServer {
            stats: NicStats {
                id: id.clone(),
                ..Default::default()
            },
            gate: Gate::new(id.clone(), cfg.clone()),
            dns,
            published,
            id,
            cfg,
            io: parts.io,
            port,
            stack,
            flows: FlowTable::new(FIRST_FLOW),
            rx: Frames::new(),
            epoll,
            events: Vec::with_capacity(256),
            stop: StopHandle {
                flag: Arc::new(AtomicBool::new(false)),
                drain: Arc::new(AtomicBool::new(false)),
                efd,
            },
            clock: parts.clock,
            link: Link {
                ours: GATEWAY_MAC,
                theirs: EthernetAddress::BROADCAST,
            },
            buf: vec![0; DGRAM_MAX],
            next_sweep: start + SWEEP_EVERY,
            failures: LogThrottle::default(),
            device_gone: false,
            device_due: true,
            spin: Spin::new(spin),
            backlogged: false,
            live: Arc::new(NicLive {
                pinned: (-1).into(),
                cpu: (-1).into(),
                ..Default::default()
            }),
        })
    }

    /// This server's id (`nic-K`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its live counters (for `ferry ctl`).
    pub fn live(&self) -> Arc<NicLive> {
        self.live.clone()
    }

    /// A handle that stops [`NicServer::run`].
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Serves until stopped; returns the counters.
    pub fn run(mut self) -> NicStats {
        self.live
            .tid
            .store(ferry_sys::gettid().cast_signed(), Ordering::Release);
        let mut idle_since: Option<Instant> = None;
        let mut draining: Option<Instant> = None;
        while !self.finished(&mut draining) {
            self.stats.turns += 1;
            if self.stats.turns.is_multiple_of(LIVE_EVERY) {
                refresh_live(
                    &self.live,
                    &self.stats,
                    self.held(),
                    self.flows.open_bytes(),
                );
            }
            if self.turn() {
                idle_since = None;
                self.device_due = true;
                continue;
            }
            // Sleeping at once while a flow is backlogged is not the spin's to learn from.
            let learn = !self.backlogged;
            let timeout = self.idle_wait(&mut idle_since);
            if timeout.is_zero() {
                // A spin gives way to any thread waiting for this CPU (the sandbox's
                // program, the peer's: at SCHED_FIFO none would run until the spin
                // ended).
                std::thread::yield_now();
            }
            self.device_due = false;
            let slept = self.clock.now();
            if self.wait_events(timeout) {
                idle_since = None;
                if !timeout.is_zero() && learn {
                    self.spin.woke_after(self.clock.now().duration_since(slept));
                }
            }
        }
        self.published.close();
        self.counters()
    }

    /// Whether [`NicServer::run`] ends now: stopped, or draining (since `draining`) and
    /// every TCP flow ended, the device gone, or [`DRAIN_MAX`] passed.
    pub(crate) fn finished(&mut self, draining: &mut Option<Instant>) -> bool {
        if self.stop.flag.load(Ordering::SeqCst) {
            return true;
        }
        let now = self.clock.now();
        if draining.is_none() && self.stop.drain.load(Ordering::SeqCst) {
            *draining = Some(now);
        }
        draining.is_some_and(|t| {
            !self.flows.tcp_open() || self.device_gone || now.duration_since(t) >= DRAIN_MAX
        })
    }

    /// How long to wait in epoll after a turn with nothing to do (idle since
    /// `idle_since`): nothing while spinning, else until the stack's or a published
    /// connection's next timer (at most a second). A backlogged flow (bulk: the side
    /// that must move next has a buffer's worth to take) is no round trip a spin would
    /// catch sooner: the server sleeps at once, and the CPU it would spin on is free for
    /// that side (at `chrt -f`, a spinning server kept the sandbox's reader waiting for
    /// a CPU).
    fn idle_wait(&mut self, idle_since: &mut Option<Instant>) -> Duration {
        let now = self.clock.now();
        let since = *idle_since.get_or_insert(now);
        if !self.backlogged && now.duration_since(since) < self.spin.window() {
            self.stats.spin_turns += 1;
            return Duration::ZERO;
        }
        self.stats.sleeps += 1;
        refresh_live(
            &self.live,
            &self.stats,
            self.held(),
            self.flows.open_bytes(),
        );
        self.stack
            .delay(now)
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1))
            .min(self.published.delay(now).unwrap_or(Duration::MAX))
    }

    /// The counters as they stand (`open_at_stop`: the flows open now), as
    /// [`NicServer::run`] returns them when it stops. For tests and fuzzing.
    #[doc(hidden)]
    pub fn counters(&self) -> NicStats {
        let mut s = self.stats.clone();
        s.open_at_stop = self.held() as u64;
        s.frames_out = self.port.count.frames;
        s.frame_bytes_out = self.port.count.bytes;
        s.tap_full = self.port.count.full;
        s.timing = self.port.timing.totals();
        if let Some(d) = &self.dns {
            d.count_into(&mut s);
        }
        let (out, inn) = self.flows.open_bytes();
        s.bytes_out += out;
        s.bytes_in += inn;
        s
    }

    /// Waits up to `timeout` in epoll and handles what it reports; whether it reported
    /// anything.
    fn wait_events(&mut self, timeout: Duration) -> bool {
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        if let Err(e) = self.epoll.wait_for(timeout, &mut events) {
            warn!("{}: epoll: {e}", self.id);
        }
        if !events.is_empty() && !timeout.is_zero() {
            self.port.timing.woke();
        }
        for ev in &events {
            self.on_event(*ev);
        }
        self.port.flush();
        let any = !events.is_empty();
        self.events = events;
        any
    }

    /// One turn: frames in, flows pumped, the stack's output out, flows that are over
    /// ended. Whether anything moved.
    fn turn(&mut self) -> bool {
        let busy = self.ingress();
        let busy = self.pump_and_send() || busy;
        let now = self.clock.now();
        self.reap(now);
        for (host, u) in self.published.due(now) {
            self.publish_conn(host, (u.client, u.port), u.since);
        }
        self.port.flush();
        busy
    }

    /// Reads a batch of frames (when the device may have some) and handles each;
    /// whether there were any.
    fn ingress(&mut self) -> bool {
        if !self.device_due {
            return false;
        }
        let mut rx = std::mem::take(&mut self.rx);
        rx.clear();
        let n = match self.port.recv(&mut rx, BATCH) {
            Ok(n) => n,
            Err(e) => {
                // The sandbox's namespace is gone (its device with it).
                if !self.device_gone {
                    debug!("{}: reading the device: {e}", self.id);
                }
                self.device_gone = true;
                0
            }
        };
        for i in 0..n {
            let m = self.port.timing.mark();
            if let Some(f) = rx.get(i) {
                self.on_frame(f);
            }
            self.port.timing.end_outer(Stage::Ingress, m, true);
        }
        self.rx = rx;
        self.port.flush();
        n > 0
    }

    /// Moves bytes and lets the stack send until neither has more to do; whether
    /// anything moved.
    fn pump_and_send(&mut self) -> bool {
        let mut busy = false;
        for _ in 0..64 {
            let m = self.port.timing.mark();
            let tcp::Pumped { moved, backlogged } = tcp::pump_all(
                &mut self.flows,
                &mut self.stack,
                &*self.io,
                &mut self.port.timing,
            );
            self.backlogged = backlogged;
            self.port.timing.end_outer(Stage::Pump, m, moved);
            let now = self.clock.now();
            let (m, frames) = (self.port.timing.mark(), self.port.count.frames);
            let sent = self.stack.egress(&mut self.port, now);
            self.port.flush();
            let wrote = self.port.count.frames != frames;
            self.port.timing.end_outer(Stage::Egress, m, wrote);
            busy |= moved || sent;
            if !moved && !sent {
                break;
            }
        }
        busy
    }

    /// Ends the flows that are over at `now`: TCP flows whose stack socket is done
    /// (every turn), datagram flows idle past their time (the table sweeps at most once
    /// a second). Every [`SWEEP_EVERY`], asks the sandbox about its pending connects.
    fn reap(&mut self, now: Instant) {
        let sweep = now >= self.next_sweep;
        if sweep {
            self.next_sweep = now + SWEEP_EVERY;
        }
        let stack = &self.stack;
        for f in self.flows.reap(now, |h| tcp::done(stack.state(h))) {
            self.end_flow(f);
        }
        if sweep {
            let link = self.link;
            for (from, to) in self.flows.probe_due(now) {
                self.port.queue(|out| frame::probe(out, link, from, to));
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev.token {
            TOKEN_DEVICE => self.device_due = true,
            TOKEN_STOP => {}
            TOKEN_DNS => {
                self.dns_answers();
                self.port.flush();
            }
            TOKEN_HANDOFF => {
                for (host, to) in self.published.take_handoff(&*self.io) {
                    self.publish_conn(host, to, self.clock.now());
                }
            }
            t if (TOKEN_LISTEN..FIRST_FLOW).contains(&t) => {
                let i = (t - TOKEN_LISTEN) as usize;
                if let Some((host, to)) = self.published.accept(&*self.io, i) {
                    self.publish_conn(host, to, self.clock.now());
                }
            }
            t => self.flow_event(t, ev.events),
        }
    }

    /// Flow `id`'s host socket reported `events`.
    fn flow_event(&mut self, id: u64, events: u32) {
        let input = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;
        let output = (libc::EPOLLOUT | libc::EPOLLHUP | libc::EPOLLERR) as u32;
        match self.flows.get_mut(id) {
            Some(Flow::Tcp(f)) => {
                f.readable |= events & input != 0;
                f.writable |= events & output != 0;
            }
            Some(Flow::Pending(_)) if events & output != 0 => self.connected(id),
            Some(Flow::Udp(_) | Flow::Echo(_)) => {
                // Framing the datagrams counts as egress (no stack on this path).
                let (m, frames) = (self.port.timing.mark(), self.port.count.frames);
                self.host_dgram_ready(id);
                self.port.flush();
                let wrote = self.port.count.frames != frames;
                self.port.timing.end_outer(Stage::Egress, m, wrote);
            }
            _ => {}
        }
    }

    fn on_frame(&mut self, frame: &[u8]) {
        self.stats.frames_in += 1;
        self.stats.frame_bytes_in += frame.len() as u64;
        let inbound = frame::classify(frame);
        let src = match inbound {
            Inbound::Tcp { src, .. } | Inbound::Udp { src, .. } => Some(src.ip()),
            Inbound::Echo { src, .. } => Some(src),
            _ => None,
        };
        if let Some(src) = src {
            if !self.cfg.plan.is_sandbox(src) {
                // Only the sandbox's own addresses may be sources: a spoofed one would
                // make a flow answer someone else.
                self.stats.spoofed += 1;
                return;
            }
            if let Some(mac) = frame::source_mac(frame) {
                self.link.theirs = mac;
            }
        }
        match inbound {
            Inbound::Stack => self.stack.feed(&mut self.port, frame, self.clock.now()),
            Inbound::Tcp { src, dst, syn, rst } => self.tcp_segment((src, dst), syn, rst, frame),
            Inbound::Udp { src, dst, payload } => self.udp_out(src, dst, payload, frame),
            Inbound::Echo {
                src,
                dst,
                ident,
                seq,
                data,
            } => self.echo_out((src, dst), (ident, seq), data, frame),
            Inbound::Drop(Why::Malformed) => self.stats.malformed += 1,
            Inbound::Drop(Why::Fragment) => self.stats.fragments += 1,
            Inbound::Drop(Why::Unsupported) => self.stats.unsupported += 1,
        }
    }

    /// A TCP segment from the sandbox (`frame`): to its pending flow, to the stack, or
    /// (a SYN for a new flow) held while the host connects.
    fn tcp_segment(
        &mut self,
        (src, dst): (SocketAddr, SocketAddr),
        syn: bool,
        rst: bool,
        frame: &[u8],
    ) {
        let key = Key {
            proto: Proto::Tcp,
            sandbox: src,
            remote: dst,
        };
        let found = self.flows.find(&key);
        let pending = found
            .and_then(|id| self.flows.get(id))
            .is_some_and(|f| matches!(f, Flow::Pending(_)));
        match found.map(|id| (id, pending)) {
            Some((id, true)) => self.pending_segment(id, syn, rst, frame),
            // Held while the host connects.
            None if syn && self.open_tcp(src, dst, frame) => {}
            // A flow's, or refused (no socket takes it: a reset).
            _ => self.stack.feed(&mut self.port, frame, self.clock.now()),
        }
    }

    /// Ends `flow`, out of the table already: a TCP flow as [`NicServer::end_tcp`] says,
    /// any other by dropping its host socket.
    fn end_flow(&mut self, flow: Flow) {
        match flow {
            Flow::Tcp(f) => self.end_tcp(f),
            f => {
                let _ = self.epoll.delete(f.host());
            }
        }
    }

    /// Adds `flow` as `id`, active now; a flow it displaces (none when the key was
    /// looked up first) is ended.
    fn add_flow(&mut self, id: u64, flow: Flow) {
        let now = self.clock.now();
        for f in self.flows.insert(id, flow, now) {
            self.end_flow(f);
        }
    }

    /// Flows held: those in the table and published connections waiting to be asked
    /// again.
    fn held(&self) -> usize {
        self.flows.len() + self.published.waiting()
    }
}

/// A server as the in-process harness (`testkit.rs`) drives it: turns without
/// waiting, host events delivered by descriptor, its clock moved by hand.
#[derive(Debug)]
pub(crate) struct InProcess {
    srv: NicServer,
    /// When the program exited (the server was asked to drain).
    draining: Option<Instant>,
}

impl InProcess {
    /// A server over `parts` (its clock should be [`Clock::Manual`]).
    pub fn new(parts: Parts, cfg: Arc<NicConfig>, publish: &[NicPublish]) -> io::Result<InProcess> {
        Ok(InProcess {
            srv: NicServer::build(parts, cfg, publish)?,
            draining: None,
        })
    }

    /// One turn without waiting; whether anything moved.
    pub fn step(&mut self) -> bool {
        self.srv.stats.turns += 1;
        self.srv.turn()
    }

    /// Host socket `fd` reports `events`, as epoll would; whether the server has it.
    pub fn host_event(&mut self, fd: RawFd, events: u32) -> bool {
        use std::os::fd::AsRawFd;
        let srv = &mut self.srv;
        let token = srv.flows.by_fd(fd).or_else(|| {
            (0..)
                .map_while(|i| srv.published.listener(i).map(|l| (i, l)))
                .find(|(_, l)| l.as_raw_fd() == fd)
                .map(|(i, _)| TOKEN_LISTEN + i as u64)
        });
        let token = token.or_else(|| {
            srv.dns
                .as_ref()
                .is_some_and(|d| d.has(fd))
                .then_some(TOKEN_DNS)
        });
        let Some(token) = token else {
            return false;
        };
        srv.on_event(Event { token, events });
        srv.port.flush();
        true
    }

    /// Moves the held clock on by `by`.
    pub fn advance(&mut self, by: Duration) {
        if let Clock::Manual(t) = &mut self.srv.clock {
            *t += by;
        }
    }

    pub fn now(&self) -> Instant {
        self.srv.clock.now()
    }

    /// Whether the last turn left a TCP flow backlogged.
    pub fn backlogged(&self) -> bool {
        self.srv.backlogged
    }

    /// Stack sockets open.
    pub fn stack_sockets(&self) -> usize {
        self.srv.stack.sockets()
    }

    /// Flows held, and those of them pending.
    pub fn flows(&self) -> (usize, usize) {
        let pending = self
            .srv
            .flows
            .values()
            .filter(|f| matches!(f, Flow::Pending(_)))
            .count();
        (self.srv.held(), pending)
    }

    pub fn counters(&self) -> NicStats {
        self.srv.counters()
    }

    /// The program has exited: drain.
    pub fn drain(&self) {
        self.srv.stop.drain();
    }

    /// Whether the server's loop would end now.
    pub fn finished(&mut self) -> bool {
        self.srv.finished(&mut self.draining)
    }
}
