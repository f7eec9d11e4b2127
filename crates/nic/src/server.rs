//! A NIC server: one thread, one TAP queue, one user-space TCP/IP stack, its flows.
//!
//! Theory of operation. Each turn of the loop reads up to [`BATCH`] frames from the
//! queue (S1: many frames per wake-up) and sorts each ([`frame::classify`]):
//!
//! * **TCP**: a SYN opening a flow the rules allow makes a host socket and starts a
//!   non-blocking connect to the destination; the SYN waits beside it (a *pending*
//!   flow: no stack socket, no timer, nothing due until the host socket reports). When
//!   the connect succeeds, a stack socket listens on that destination and the SYN goes
//!   to it (the SYN-ACK leaves at once); when it fails, the SYN goes to the stack with no
//!   socket to take it (the sandbox gets a reset). A pending flow whose sandbox end is
//!   gone (a reset from it, or the answer to a [`frame::probe`] every [`PROBE_EVERY`])
//!   ends, and its host connect with it. A SYN the rules refuse goes to the stack with
//!   no socket to take it: a reset at once.
//!   Bytes then move between the stack socket's buffers and the host socket with no
//!   other copy; a full buffer on either side stops reading the other (back-pressure
//!   is the TCP window). An end of stream on one side is a FIN/shutdown on the other.
//! * **UDP** and **echo** bypass the stack: each (source, destination) is a flow on a
//!   connected host UDP socket or ping socket; answers are framed back here. A refused
//!   datagram or echo gets "administratively prohibited" at once.
//! * **ARP and neighbour discovery** go to the stack, which answers for the gateway.
//!
//! Published TCP connections (this server's own listeners in nic mode; in both mode,
//! those the protocol server passes on through its [`TapHandoff`] when no listener of
//! the shim's is on the port) become stack connections to the sandbox's address on the
//! port; one the sandbox resets before answering (nothing listens yet) is asked again
//! every 100 ms for 2 s (`published.rs`).
//!
//! Then the server moves bytes of every flow (host ⇄ stack), lets the stack send what
//! it can, and sleeps in epoll (TAP queue, host sockets, the stop eventfd, the stack's
//! next timer) only after spinning [`NicConfig::spin`] with nothing to do (SBW).
//!
//! Must not: block (every descriptor is non-blocking), hold memory per flow beyond the
//! stack's two buffers (flows capped by [`NicConfig::max_flows`]), or let a frame from
//! the sandbox choose a source other than the sandbox's own addresses.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferry_egress::{FlowTable, Lease, Limits, LogThrottle, Origin, TapHandoff, What, admit};
use ferry_sys::{Epoll, Event, tun};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpListenEndpoint};
use tracing::{debug, warn};

use crate::frame::{self, Inbound, Link, Why};
use crate::stats::LIVE_EVERY;
use crate::timing::{Stage, Timing};
use crate::{NicConfig, NicLive, NicPublish, NicStats};
use published::Unanswered;

/// Most frames read from the TAP per turn.
const BATCH: usize = 64;
/// Most datagrams read from one host socket per turn.
const DGRAM_BATCH: usize = 64;
/// A UDP flow idle this long is closed.
const UDP_IDLE: Duration = Duration::from_secs(60);
/// An echo flow idle this long is closed.
const ECHO_IDLE: Duration = Duration::from_secs(10);
/// How often a pending TCP flow asks the sandbox's kernel whether its connect still
/// waits ([`frame::probe`]).
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// Largest SYN a pending flow keeps (options make ~80 bytes; only data in the SYN, which
/// needs a Fast Open cookie ferry never gives, makes more): a larger one is reset.
const SYN_MAX: usize = 1024;
/// Largest frame (the TAP's MTU is at most 65535 plus the Ethernet header).
const FRAME_MAX: usize = 65_536 + frame::ETH_LEN;
/// The gateway's hardware address (locally administered).
const GATEWAY_MAC: EthernetAddress = EthernetAddress([0x02, 0x66, 0x65, 0x72, 0x72, 0x79]);

const TOKEN_TAP: u64 = 0;
const TOKEN_STOP: u64 = 1;
const TOKEN_HANDOFF: u64 = 2;
/// Tokens of published listeners start here; flows' start at [`FIRST_FLOW`].
const TOKEN_LISTEN: u64 = 16;
const FIRST_FLOW: u64 = 1 << 20;

mod published;

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
    /// still sends what its exited programs wrote, and their FINs), the TAP is gone,
    /// or [`DRAIN_MAX`] has passed: what a program wrote before it exited arrives, as
    /// it would natively.
    pub fn drain(&self) {
        self.drain.store(true, Ordering::SeqCst);
        let _ = ferry_sys::eventfd_signal(self.efd.as_fd());
    }
}

/// What the TAP queue has sent, as counted by the device.
#[derive(Debug, Default)]
struct TxCount {
    frames: u64,
    bytes: u64,
    full: u64,
}

/// The TAP queue as smoltcp's device: it receives only the frame the server hands it.
struct Device {
    fd: OwnedFd,
    rx: Vec<u8>,
    rx_len: usize,
    rx_ready: bool,
    tx: Vec<u8>,
    mtu: usize,
    count: TxCount,
    /// Per-stage timing (E5), off unless asked.
    timing: Timing,
}

impl Device {
    /// Reads one frame; `Ok(false)`: none waiting.
    fn read(&mut self) -> io::Result<bool> {
        let t0 = self.timing.start();
        let r = ferry_sys::read(self.fd.as_fd(), &mut self.rx);
        let stage = if r.is_ok() {
            Stage::TapRead
        } else {
            Stage::TapReadEmpty
        };
        self.timing.end(stage, t0, r.is_ok());
        match r {
            Ok(n) => {
                self.rx_len = n.saturating_sub(tun::VNET_HDR_LEN);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Where `part` (a slice of the frame just read) lies in the receive buffer, as
    /// (start, length): what the frame's handlers keep while they borrow the server.
    fn span(&self, part: &[u8]) -> (usize, usize) {
        (
            part.as_ptr() as usize - self.rx.as_ptr() as usize,
            part.len(),
        )
    }

    fn frame(&self) -> &[u8] {
        &self.rx[tun::VNET_HDR_LEN..tun::VNET_HDR_LEN + self.rx_len]
    }

    /// Writes a frame we made: complete, or a TCP segment with its checksum left to the
    /// offload ([`frame::offload_tcp`]).
    fn write(fd: BorrowedFd<'_>, count: &mut TxCount, timing: &mut Timing, frame: &mut [u8]) {
        let t0 = timing.start();
        let mut hdr = [0u8; tun::VNET_HDR_LEN];
        if let Some((start, offset)) = frame::offload_tcp(frame) {
            hdr[0] = tun::VNET_NEEDS_CSUM;
            hdr[6..8].copy_from_slice(&start.to_le_bytes());
            hdr[8..10].copy_from_slice(&offset.to_le_bytes());
        }
        let r = tun::write2(fd, &hdr, frame);
        timing.end(Stage::TapWrite, t0, r.is_ok());
        match r {
            Ok(_) => {
                count.frames += 1;
                count.bytes += frame.len() as u64;
            }
            // The queue towards the sandbox is full: the frame is lost, as on a wire
            // (TCP retransmits).
            Err(_) => count.full += 1,
        }
    }
}

struct Rx<'a>(&'a [u8]);

struct Tx<'a> {
    fd: BorrowedFd<'a>,
    buf: &'a mut Vec<u8>,
    count: &'a mut TxCount,
    timing: &'a mut Timing,
}

impl phy::RxToken for Rx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        let r = f(&mut self.buf[..len]);
        Device::write(self.fd, self.count, self.timing, &mut self.buf[..len]);
        r
    }
}

impl phy::Device for Device {
    type RxToken<'a> = Rx<'a>;
    type TxToken<'a> = Tx<'a>;

    fn receive(
        &mut self,
        _: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        if !self.rx_ready {
            return None;
        }
        self.rx_ready = false;
        let frame = &self.rx[tun::VNET_HDR_LEN..tun::VNET_HDR_LEN + self.rx_len];
        let tx = Tx {
            fd: self.fd.as_fd(),
            buf: &mut self.tx,
            count: &mut self.count,
            timing: &mut self.timing,
        };
        Some((Rx(frame), tx))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(Tx {
            fd: self.fd.as_fd(),
            buf: &mut self.tx,
            count: &mut self.count,
            timing: &mut self.timing,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = self.mtu + frame::ETH_LEN;
        // Nothing received is verified (`Tx`/`None`: see `frame`); sent as ferry's own.
        c.checksum = frame::tx_checksums();
        c
    }
}

/// A TCP flow: a stack socket (the sandbox's end) and a host socket.
struct TcpFlow {
    handle: SocketHandle,
    host: OwnedFd,
    /// (sandbox, destination) of a flow the sandbox opened; `None` for published ones.
    key: Option<(SocketAddr, SocketAddr)>,
    /// A published connection whose handshake with the sandbox has not completed.
    fresh: Option<Unanswered>,
    readable: bool,
    writable: bool,
    host_eof: bool,
    shut_wr: bool,
    lease: Option<Lease>,
    bytes_out: u64,
    bytes_in: u64,
}

/// A TCP flow whose host connect is under way: the sandbox's SYN waits with it.
struct Pending {
    host: OwnedFd,
    /// (sandbox, destination).
    key: (SocketAddr, SocketAddr),
    /// The SYN's frame (without its `virtio_net_hdr`), the latest the sandbox sent.
    syn: Vec<u8>,
    lease: Option<Lease>,
    /// When the sandbox was last asked whether the connect still waits.
    probed: Instant,
}

/// A UDP or echo flow.
struct DgramFlow {
    host: OwnedFd,
    /// The sandbox's end (for echo: its address and the request's identifier as port).
    sandbox: SocketAddr,
    /// The destination (for echo: its address, port 0).
    remote: SocketAddr,
    echo: bool,
    _lease: Option<Lease>,
}

/// Key of a datagram flow: (is echo, sandbox end, remote end).
type DgramKey = (bool, SocketAddr, SocketAddr);

/// How long a datagram flow may carry nothing.
fn dgram_idle(key: &DgramKey) -> Duration {
    if key.0 { ECHO_IDLE } else { UDP_IDLE }
}

/// One NIC server (see the module docs).
pub struct NicServer {
    id: String,
    cfg: Arc<NicConfig>,
    dev: Device,
    iface: Interface,
    sockets: SocketSet<'static>,
    epoll: Epoll,
    events: Vec<Event>,
    stop: StopHandle,
    tcp: HashMap<u64, TcpFlow>,
    pending: HashMap<u64, Pending>,
    /// Flows the sandbox opened, pending or not, by (sandbox, destination).
    tcp_keys: HashMap<(SocketAddr, SocketAddr), u64>,
    /// UDP and echo flows (by id and key, idle expiry).
    dgram: FlowTable<DgramKey, DgramFlow>,
    listeners: Vec<(OwnedFd, NicPublish)>,
    /// Where socket mode passes published connections no listener of the shim's is on.
    handoff: Option<Arc<TapHandoff>>,
    /// Published connections to ask the sandbox again for, and when.
    retry: Vec<(Instant, OwnedFd, Unanswered)>,
    next_id: u64,
    link: Link,
    out: Vec<u8>,
    buf: Vec<u8>,
    stats: NicStats,
    epoch: Instant,
    last_sweep: Instant,
    /// Log lines of refused flows, and of host sockets that could not be made.
    refusals: LogThrottle,
    failures: LogThrottle,
    tap_gone: bool,
    live: Arc<NicLive>,
}

impl std::fmt::Debug for NicServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicServer")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl NicServer {
    /// A NIC server `nic-{index}` on TAP queue `queue` (made non-blocking). `publish`: the
    /// published TCP ports this server listens for on the host (give them to one server).
    /// Any descriptor that carries one frame, behind its `virtio_net_hdr`, per `read` and
    /// per write serves as the queue: tests and the `frame` fuzz target give it one end
    /// of an `AF_UNIX` `SOCK_SEQPACKET` pair.
    pub fn new(
        index: usize,
        queue: OwnedFd,
        cfg: Arc<NicConfig>,
        publish: &[NicPublish],
    ) -> io::Result<NicServer> {
        ferry_sys::set_nonblocking(queue.as_fd(), true)?;
        let mtu = cfg.plan.mtu as usize;
        let mut dev = Device {
            fd: queue,
            rx: vec![0; FRAME_MAX + tun::VNET_HDR_LEN],
            rx_len: 0,
            rx_ready: false,
            tx: vec![0; mtu + frame::ETH_LEN],
            mtu,
            count: TxCount::default(),
            timing: Timing::new(cfg.timing),
        };
        let mut config = Config::new(HardwareAddress::Ethernet(GATEWAY_MAC));
        config.random_seed = ferry_sys::random_u64().unwrap_or(0x0066_6572_7279);
        let epoch = Instant::now();
        let mut iface = Interface::new(config, &mut dev, smoltcp::time::Instant::ZERO);
        let plan = &cfg.plan;
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(plan.gw4), plan.prefix4));
            let _ = a.push(IpCidr::new(IpAddress::Ipv6(plan.gw6), plan.prefix6));
        });
        // Any destination is ours to answer for ("any IP" through a default route via
        // our own address): the stack terminates every connection the sandbox opens.
        iface.set_any_ip(true);
        let _ = iface.routes_mut().add_default_ipv4_route(plan.gw4);
        let _ = iface.routes_mut().add_default_ipv6_route(plan.gw6);
        let epoll = Epoll::new(256)?;
        epoll.add(dev.fd.as_fd(), libc::EPOLLIN as u32, TOKEN_TAP)?;
        let efd = Arc::new(ferry_sys::eventfd()?);
        epoll.add(efd.as_fd(), libc::EPOLLIN as u32, TOKEN_STOP)?;
        let mut listeners = Vec::new();
        for (i, p) in publish.iter().enumerate() {
            let (l, _) = ferry_egress::host_listener(p.host, false).map_err(|e| {
                io::Error::new(e.kind(), format!("-p {}:{}: {e}", p.host, p.sandbox_port))
            })?;
            epoll.add(l.as_fd(), libc::EPOLLIN as u32, TOKEN_LISTEN + i as u64)?;
            listeners.push((l, *p));
        }
        let id = format!("nic-{index}");
        Ok(NicServer {
            stats: NicStats {
                id: id.clone(),
                ..Default::default()
            },
            id,
            cfg,
            dev,
            iface,
            sockets: SocketSet::new(Vec::new()),
            epoll,
            events: Vec::with_capacity(256),
            stop: StopHandle {
                flag: Arc::new(AtomicBool::new(false)),
                drain: Arc::new(AtomicBool::new(false)),
                efd,
            },
            tcp: HashMap::new(),
            pending: HashMap::new(),
            tcp_keys: HashMap::new(),
            dgram: FlowTable::new(Limits::uncapped(dgram_idle)),
            listeners,
            handoff: None,
            retry: Vec::new(),
            next_id: FIRST_FLOW,
            link: Link {
                ours: GATEWAY_MAC,
                theirs: EthernetAddress::BROADCAST,
            },
            out: vec![0; FRAME_MAX],
            buf: vec![0; FRAME_MAX],
            epoch,
            last_sweep: epoch,
            refusals: LogThrottle::default(),
            failures: LogThrottle::default(),
            tap_gone: false,
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

    /// Refreshes the live counters.
    fn publish_live(&self) {
        let l = &self.live;
        let r = Ordering::Relaxed;
        l.cpu.store(ferry_sys::current_cpu(), r);
        l.flows.store(self.flows() as u64, r);
        l.frames.store(self.stats.frames_in, r);
        let (out, inn) = self.open_bytes();
        l.bytes_out.store(self.stats.bytes_out + out, r);
        l.bytes_in.store(self.stats.bytes_in + inn, r);
        l.sleeps.store(self.stats.sleeps, r);
    }

    /// A handle that stops [`NicServer::run`].
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    /// Serves until stopped; returns the counters.
    pub fn run(mut self) -> NicStats {
        self.live
            .tid
            .store(ferry_sys::gettid().cast_signed(), Ordering::Release);
        let mut idle_since: Option<Instant> = None;
        let mut draining: Option<Instant> = None;
        while !self.stop.flag.load(Ordering::SeqCst) {
            if draining.is_none() && self.stop.drain.load(Ordering::SeqCst) {
                draining = Some(Instant::now());
            }
            if let Some(t) = draining
                && (self.tcp.is_empty() || self.tap_gone || t.elapsed() >= DRAIN_MAX)
            {
                break;
            }
            self.stats.turns += 1;
            if self.stats.turns.is_multiple_of(LIVE_EVERY) {
                self.publish_live();
            }
            let busy = self.turn();
            if busy {
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            let timeout = if since.elapsed() < self.cfg.spin {
                self.stats.spin_turns += 1;
                Duration::ZERO
            } else {
                self.stats.sleeps += 1;
                self.publish_live();
                let now = self.now();
                self.iface
                    .poll_delay(now, &self.sockets)
                    .map(|d| Duration::from_micros(d.total_micros()))
                    .unwrap_or(Duration::from_secs(1))
                    .min(Duration::from_secs(1))
                    .min(self.retry_delay().unwrap_or(Duration::MAX))
            };
            if self.wait_events(timeout) {
                idle_since = None;
            }
        }
        if let Some(h) = &self.handoff {
            h.set_open(false);
        }
        self.counters()
    }

    /// The counters as they stand (`open_at_stop`: the flows open now), as
    /// [`NicServer::run`] returns them when it stops. For tests and fuzzing.
    #[doc(hidden)]
    pub fn counters(&self) -> NicStats {
        let mut s = self.stats.clone();
        s.open_at_stop = self.flows() as u64;
        s.frames_out = self.dev.count.frames;
        s.frame_bytes_out = self.dev.count.bytes;
        s.tap_full = self.dev.count.full;
        s.timing = self.dev.timing.totals();
        let (out, inn) = self.open_bytes();
        s.bytes_out += out;
        s.bytes_in += inn;
        s
    }

    /// Bytes the open TCP flows have moved (out, in): a flow's are added to the
    /// server's counters when it closes.
    fn open_bytes(&self) -> (u64, u64) {
        self.tcp
            .values()
            .fold((0, 0), |(o, i), f| (o + f.bytes_out, i + f.bytes_in))
    }

    /// One turn of [`NicServer::run`] and the events already pending, never waiting;
    /// whether anything happened. For tests and the `frame` fuzz target, which drive a
    /// server step by step.
    #[doc(hidden)]
    pub fn step(&mut self) -> bool {
        self.stats.turns += 1;
        let busy = self.turn();
        self.wait_events(Duration::ZERO) || busy
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
            self.dev.timing.woke();
        }
        for ev in &events {
            self.on_event(*ev);
        }
        let any = !events.is_empty();
        self.events = events;
        any
    }

    /// One turn: frames in, flows pumped, the stack's output out. Whether anything moved.
    fn turn(&mut self) -> bool {
        let mut busy = false;
        for _ in 0..BATCH {
            match self.dev.read() {
                Ok(true) => {
                    busy = true;
                    let m = self.dev.timing.mark();
                    self.on_frame();
                    self.dev.timing.end_outer(Stage::Ingress, m, true);
                }
                Ok(false) => break,
                Err(e) => {
                    // The sandbox's namespace is gone (its device with it).
                    if !self.tap_gone {
                        debug!("{}: reading the TAP: {e}", self.id);
                    }
                    self.tap_gone = true;
                    break;
                }
            }
        }
        // Move bytes and let the stack send until neither has more to do.
        for _ in 0..64 {
            let m = self.dev.timing.mark();
            let moved = self.pump_tcp();
            self.dev.timing.end_outer(Stage::Pump, m, moved);
            let now = self.now();
            let (m, frames) = (self.dev.timing.mark(), self.dev.count.frames);
            let sent = self
                .iface
                .poll_egress(now, &mut self.dev, &mut self.sockets)
                == smoltcp::iface::PollResult::SocketStateChanged;
            let wrote = self.dev.count.frames != frames;
            self.dev.timing.end_outer(Stage::Egress, m, wrote);
            busy |= moved || sent;
            if !moved && !sent {
                break;
            }
        }
        self.reap();
        self.retry_published();
        if self.last_sweep.elapsed() >= Duration::from_secs(1) {
            self.sweep_dgram();
            self.probe_pending();
        }
        busy
    }

    fn on_event(&mut self, ev: Event) {
        match ev.token {
            TOKEN_TAP | TOKEN_STOP => {}
            TOKEN_HANDOFF => self.take_handoff(),
            t if (TOKEN_LISTEN..FIRST_FLOW).contains(&t) => {
                self.accept_published((t - TOKEN_LISTEN) as usize)
            }
            t => {
                if let Some(f) = self.tcp.get_mut(&t) {
                    if ev.events
                        & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR)
                            as u32
                        != 0
                    {
                        f.readable = true;
                    }
                    if ev.events & (libc::EPOLLOUT | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                        f.writable = true;
                    }
                } else if self.pending.contains_key(&t) {
                    if ev.events & (libc::EPOLLOUT | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                        self.connected(t);
                    }
                } else if self.dgram.contains(t) {
                    // Framing the datagrams counts as egress (no stack on this path).
                    let (m, frames) = (self.dev.timing.mark(), self.dev.count.frames);
                    self.host_dgram_ready(t);
                    let wrote = self.dev.count.frames != frames;
                    self.dev.timing.end_outer(Stage::Egress, m, wrote);
                }
            }
        }
    }

    /// Whether the sandbox may reach `to` with `what` (docs/SECURITY.md, nic mode), as
    /// [`ferry_egress::admit`] decides for a link: never a local address (the host's
    /// own), the sandbox's own subnets (the gateway included), a multicast, broadcast
    /// or IPv6 link-local one; the policy for the rest. A refusal is counted and
    /// logged, at most once a second.
    fn allowed(&mut self, what: What, to: SocketAddr) -> bool {
        let from = Origin::Link(self.cfg.plan.own_link());
        let ferry_egress::Decision::Refused(why) = admit(&self.cfg.policy, what, from, to) else {
            return true;
        };
        self.stats.denied += 1;
        if let Some(n) = self.refusals.tick() {
            warn!(
                "{}: {what} to {to} {why} ({n} since the last line)",
                self.id
            );
        }
        false
    }

    /// Hands the frame just read to the stack.
    fn feed_stack(&mut self) {
        self.dev.rx_ready = true;
        let now = self.now();
        let _ = self
            .iface
            .poll_ingress_single(now, &mut self.dev, &mut self.sockets);
        self.dev.rx_ready = false;
    }

    fn on_frame(&mut self) {
        self.stats.frames_in += 1;
        self.stats.frame_bytes_in += self.dev.rx_len as u64;
        // `classify` borrows the frame; copy out what the arms need first.
        let inbound = frame::classify(self.dev.frame());
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
            if let Some(mac) = frame::source_mac(self.dev.frame()) {
                self.link.theirs = mac;
            }
        }
        match inbound {
            Inbound::Stack => self.feed_stack(),
            Inbound::Tcp { src, dst, syn, rst } => match self.tcp_keys.get(&(src, dst)).copied() {
                Some(id) if self.pending.contains_key(&id) => self.pending_segment(id, syn, rst),
                Some(_) => self.feed_stack(),
                // Held while the host connects, or refused: to the stack (a reset).
                None if syn && self.open_tcp(src, dst) => {}
                None => self.feed_stack(),
            },
            Inbound::Udp { src, dst, payload } => {
                let (start, len) = self.dev.span(payload);
                self.udp_out(src, dst, start, len);
            }
            Inbound::Echo {
                src,
                dst,
                ident,
                seq,
                data,
            } => {
                let (start, len) = self.dev.span(data);
                self.echo_out(src, dst, ident, seq, start, len);
            }
            Inbound::Drop(Why::Malformed) => self.stats.malformed += 1,
            Inbound::Drop(Why::Fragment) => self.stats.fragments += 1,
            Inbound::Drop(Why::Unsupported) => self.stats.unsupported += 1,
        }
    }

    fn flows(&self) -> usize {
        self.tcp.len() + self.pending.len() + self.dgram.len() + self.retry.len()
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A host socket to `to` (non-blocking, bound to the bond's pick), connect started.
    fn host_socket(
        &self,
        ty: i32,
        proto: i32,
        to: SocketAddr,
    ) -> io::Result<(OwnedFd, Option<Lease>, bool)> {
        let domain = if to.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let fd = ferry_sys::socket(domain, ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, proto)?;
        let lease = self.cfg.egress.as_ref().and_then(|b| b.lease(to));
        if let Some(l) = &lease {
            ferry_sys::bind(fd.as_fd(), &SocketAddr::new(l.addr(), 0))?;
        }
        let done = match ferry_sys::connect(fd.as_fd(), &to) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => false,
            Err(e) => return Err(e),
        };
        Ok((fd, lease, done))
    }

    /// A SYN from the sandbox for a new flow (the frame just read): the host connect,
    /// and the SYN kept until it ends. Whether the SYN was taken; `false`: it goes to
    /// the stack now, to a stack socket when the connect has already succeeded, to none
    /// when refused (the stack then resets the connection).
    fn open_tcp(&mut self, src: SocketAddr, dst: SocketAddr) -> bool {
        if !self.allowed(What::Connect, dst) {
            return false;
        }
        if self.flows() >= self.cfg.max_flows {
            self.stats.over_cap += 1;
            return false;
        }
        if self.dev.frame().len() > SYN_MAX {
            self.stats.malformed += 1;
            return false;
        }
        let (host, lease, done) = match self.host_socket(libc::SOCK_STREAM, 0, dst) {
            Ok(x) => x,
            Err(e) => {
                debug!("{}: connect to {dst}: {e}", self.id);
                self.stats.connect_failed += 1;
                return false;
            }
        };
        let _ = ferry_sys::setsockopt(
            host.as_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &1i32.to_ne_bytes(),
        );
        let id = self.new_id();
        if self.watch(host.as_fd(), id).is_err() {
            return false;
        }
        self.stats.tcp_flows += 1;
        self.tcp_keys.insert((src, dst), id);
        if done {
            self.establish(id, (src, dst), host, lease);
            return false;
        }
        let syn = self.dev.frame().to_vec();
        self.pending.insert(
            id,
            Pending {
                host,
                key: (src, dst),
                syn,
                lease,
                probed: Instant::now(),
            },
        );
        true
    }

    /// Flow `id` (watched, keyed) connected on the host: a stack socket listening on
    /// its destination carries it from now on. Whether it could be made.
    fn establish(
        &mut self,
        id: u64,
        key: (SocketAddr, SocketAddr),
        host: OwnedFd,
        lease: Option<Lease>,
    ) -> bool {
        let mut s = self.stack_socket();
        let dst = key.1;
        if s.listen(IpListenEndpoint {
            addr: Some(dst.ip().into()),
            port: dst.port(),
        })
        .is_err()
        {
            self.stats.malformed += 1;
            self.forget(id, key, &host);
            return false;
        }
        let handle = self.sockets.add(s);
        self.tcp.insert(
            id,
            TcpFlow {
                handle,
                host,
                key: Some(key),
                fresh: None,
                readable: true,
                writable: true,
                host_eof: false,
                shut_wr: false,
                lease,
                bytes_out: 0,
                bytes_in: 0,
            },
        );
        true
    }

    /// Drops what the server keeps for flow `id` beside its host socket.
    fn forget(&mut self, id: u64, key: (SocketAddr, SocketAddr), host: &OwnedFd) {
        let _ = self.epoll.delete(host.as_fd());
        if self.tcp_keys.get(&key) == Some(&id) {
            self.tcp_keys.remove(&key);
        }
    }

    /// A segment from the sandbox for pending flow `id` (the frame just read): a
    /// retransmitted SYN replaces the one kept, a reset ends the flow (its host connect
    /// with it); anything else has nothing to take it yet.
    fn pending_segment(&mut self, id: u64, syn: bool, rst: bool) {
        if rst {
            if let Some(p) = self.pending.remove(&id) {
                self.forget(id, p.key, &p.host);
                self.stats.abandoned += 1;
            }
        } else if syn && self.dev.frame().len() <= SYN_MAX {
            let frame = self.dev.frame().to_vec();
            if let Some(p) = self.pending.get_mut(&id) {
                p.syn = frame;
            }
        }
    }

    /// Asks the sandbox's kernel, for each pending flow not asked within
    /// [`PROBE_EVERY`], whether its connect still waits: one bare segment each, which a
    /// connect in progress drops and a closed one answers with a reset
    /// ([`NicServer::pending_segment`]).
    fn probe_pending(&mut self) {
        let now = Instant::now();
        let dev = &mut self.dev;
        for p in self.pending.values_mut() {
            if now.duration_since(p.probed) < PROBE_EVERY {
                continue;
            }
            p.probed = now;
            let (sandbox, remote) = p.key;
            if let Some(n) = frame::probe(&mut self.out, self.link, remote, sandbox) {
                Device::write(
                    dev.fd.as_fd(),
                    &mut dev.count,
                    &mut dev.timing,
                    &mut self.out[..n],
                );
            }
        }
    }

    /// Hands `frame` (a SYN kept by a pending flow) to the stack as if just read.
    fn replay(&mut self, frame: &[u8]) {
        let at = tun::VNET_HDR_LEN;
        self.dev.rx[at..at + frame.len()].copy_from_slice(frame);
        self.dev.rx_len = frame.len();
        self.feed_stack();
    }

    fn stack_socket(&self) -> tcp::Socket<'static> {
        let n = self.cfg.tcp_buffer;
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; n]),
            tcp::SocketBuffer::new(vec![0; n]),
        );
        s.set_ack_delay(None);
        s.set_nagle_enabled(false);
        s
    }

    fn watch(&self, fd: BorrowedFd<'_>, id: u64) -> io::Result<()> {
        let ev = libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET;
        self.epoll.add(fd, ev as u32, id)
    }

    /// Pending flow `id`'s host connect has ended: its SYN goes to a stack socket (the
    /// SYN-ACK leaves), or to none (the sandbox gets a reset).
    fn connected(&mut self, id: u64) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        let err = ferry_sys::getsockopt_int(p.host.as_fd(), libc::SOL_SOCKET, libc::SO_ERROR)
            .unwrap_or(libc::EIO);
        if err == 0 {
            self.establish(id, p.key, p.host, p.lease);
        } else {
            debug!(
                "{}: connect to {}: {}",
                self.id,
                p.key.1,
                io::Error::from_raw_os_error(err)
            );
            self.stats.connect_failed += 1;
            self.forget(id, p.key, &p.host);
        }
        self.replay(&p.syn);
    }

    /// Moves bytes between every open TCP flow's two sockets; whether any moved.
    fn pump_tcp(&mut self) -> bool {
        let mut moved = false;
        for f in self.tcp.values_mut() {
            let s = self.sockets.get_mut::<tcp::Socket>(f.handle);
            moved |= pump(f, s, &mut self.dev.timing);
        }
        moved
    }

    /// Drops the flows whose stack socket has closed (or went back to listening).
    fn reap(&mut self) {
        let done: Vec<u64> = self
            .tcp
            .iter()
            .filter(|(_, f)| {
                let s = self.sockets.get::<tcp::Socket>(f.handle);
                // Listen: the stack never took the sandbox's SYN, or the sandbox reset the
                // handshake (smoltcp then listens again); nothing more will come of it.
                matches!(
                    s.state(),
                    tcp::State::Closed | tcp::State::TimeWait | tcp::State::Listen
                )
            })
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            if let Some(mut f) = self.tcp.remove(&id) {
                let _ = self.epoll.delete(f.host.as_fd());
                let closed = matches!(
                    self.sockets.get::<tcp::Socket>(f.handle).state(),
                    tcp::State::Closed | tcp::State::Listen
                );
                self.sockets.remove(f.handle);
                if let Some(u) = f.fresh {
                    if let Some(host) = self.unanswered(f.host, u) {
                        let _ = ferry_sys::linger_reset(host.as_fd());
                    }
                    continue;
                }
                // A reset from the sandbox (or one we sent) resets the host side too.
                if closed && !(f.host_eof && f.shut_wr) {
                    let _ = ferry_sys::linger_reset(f.host.as_fd());
                }
                if let Some(k) = f.key {
                    self.tcp_keys.remove(&k);
                }
                if let Some(l) = f.lease.as_mut() {
                    l.set_bytes(f.bytes_out, f.bytes_in);
                }
                self.stats.bytes_out += f.bytes_out;
                self.stats.bytes_in += f.bytes_in;
            }
        }
    }

    /// The datagram flow for `key`, made (host socket connected to `remote`) if new and
    /// allowed.
    fn dgram_flow(&mut self, key: DgramKey) -> Option<u64> {
        if let Some(id) = self.dgram.find(&key) {
            return Some(id);
        }
        let (echo, sandbox, remote) = key;
        if !self.allowed(if echo { What::Echo } else { What::Datagram }, remote) {
            return None;
        }
        if self.flows() >= self.cfg.max_flows {
            self.stats.over_cap += 1;
            return None;
        }
        let (ty, proto) = match (echo, remote.is_ipv4()) {
            (false, _) => (libc::SOCK_DGRAM, 0),
            (true, true) => (libc::SOCK_DGRAM, libc::IPPROTO_ICMP),
            (true, false) => (libc::SOCK_DGRAM, libc::IPPROTO_ICMPV6),
        };
        let (host, lease, _) = match self.host_socket(ty, proto, remote) {
            Ok(x) => x,
            Err(e) => {
                if let Some(n) = self.failures.tick() {
                    warn!(
                        "{}: cannot open a {} socket to {remote}: {e}{} ({n} since the last line)",
                        self.id,
                        if echo { "ping" } else { "UDP" },
                        if echo {
                            " (the host's net.ipv4.ping_group_range must include ferry's group)"
                        } else {
                            ""
                        }
                    );
                }
                return None;
            }
        };
        let id = self.new_id();
        if self
            .epoll
            .add(host.as_fd(), libc::EPOLLIN as u32, id)
            .is_err()
        {
            return None;
        }
        if echo {
            self.stats.echo_flows += 1;
        } else {
            self.stats.udp_flows += 1;
        }
        let flow = DgramFlow {
            host,
            sandbox,
            remote,
            echo,
            _lease: lease,
        };
        // No cap of the table's own (the server's covers every flow), ids never reused:
        // nothing is displaced.
        let _ = self.dgram.insert(id, key, flow, Instant::now());
        Some(id)
    }

    /// Answers the frame just read with "administratively prohibited".
    fn prohibit(&mut self, dst: IpAddr) {
        let gw = self.cfg.plan.gateway_for(dst);
        if let Some(n) = frame::prohibited(&mut self.out, self.link, gw, self.dev.frame()) {
            let dev = &mut self.dev;
            Device::write(
                dev.fd.as_fd(),
                &mut dev.count,
                &mut dev.timing,
                &mut self.out[..n],
            );
        }
    }

    /// A UDP datagram from the sandbox (payload at `rx[start..start + len]`).
    fn udp_out(&mut self, src: SocketAddr, dst: SocketAddr, start: usize, len: usize) {
        let Some(id) = self.dgram_flow((false, src, dst)) else {
            self.prohibit(dst.ip());
            return;
        };
        let f = self
            .dgram
            .active(id, Instant::now())
            .expect("flow just found");
        let t0 = self.dev.timing.start();
        let sent = ferry_sys::send_nosignal(f.host.as_fd(), &self.dev.rx[start..start + len]);
        self.dev.timing.end(Stage::HostSend, t0, sent.is_ok());
        if sent.is_ok() {
            self.stats.bytes_out += len as u64;
        }
    }

    /// An echo request from the sandbox (data at `rx[start..start + len]`).
    fn echo_out(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        ident: u16,
        seq: u16,
        start: usize,
        len: usize,
    ) {
        let key = (true, SocketAddr::new(src, ident), SocketAddr::new(dst, 0));
        let Some(id) = self.dgram_flow(key) else {
            self.prohibit(dst);
            return;
        };
        let f = self
            .dgram
            .active(id, Instant::now())
            .expect("flow just found");
        // The ping socket wants the ICMP message: type, code, checksum and identifier
        // are the kernel's to fill in; the sequence number and data are the sandbox's.
        let ty = if dst.is_ipv4() { 8 } else { 128 };
        let msg = &mut self.buf[..8 + len];
        msg[..8].copy_from_slice(&[ty, 0, 0, 0, 0, 0, (seq >> 8) as u8, seq as u8]);
        msg[8..].copy_from_slice(&self.dev.rx[start..start + len]);
        let t0 = self.dev.timing.start();
        let sent = ferry_sys::send_nosignal(f.host.as_fd(), msg);
        self.dev.timing.end(Stage::HostSend, t0, sent.is_ok());
    }

    /// Datagrams (or echo replies) arrived on flow `id`'s host socket: framed to the
    /// sandbox.
    fn host_dgram_ready(&mut self, id: u64) {
        let Some(f) = self.dgram.get_mut(id) else {
            return;
        };
        let mut got_any = false;
        for _ in 0..DGRAM_BATCH {
            let t0 = self.dev.timing.start();
            let got = ferry_sys::recv(f.host.as_fd(), &mut self.buf, libc::MSG_DONTWAIT);
            self.dev.timing.end(Stage::HostRecv, t0, got.is_ok());
            let n = match got {
                Ok(n) => n,
                Err(_) => break,
            };
            got_any = true;
            let framed = if f.echo {
                let reply = if f.remote.is_ipv4() { 0 } else { 129 };
                if n < 8 || self.buf[0] != reply {
                    continue;
                }
                let seq = u16::from_be_bytes([self.buf[6], self.buf[7]]);
                frame::echo_reply(
                    &mut self.out,
                    self.link,
                    f.remote.ip(),
                    f.sandbox.ip(),
                    f.sandbox.port(),
                    seq,
                    &self.buf[8..n],
                )
            } else {
                self.stats.bytes_in += n as u64;
                frame::udp(
                    &mut self.out,
                    self.link,
                    f.remote,
                    f.sandbox,
                    &self.buf[..n],
                )
            };
            if let Some(len) = framed {
                let dev = &mut self.dev;
                Device::write(
                    dev.fd.as_fd(),
                    &mut dev.count,
                    &mut dev.timing,
                    &mut self.out[..len],
                );
            }
        }
        if got_any {
            self.dgram.active(id, Instant::now());
        }
    }

    /// Closes idle datagram flows.
    fn sweep_dgram(&mut self) {
        let now = Instant::now();
        self.last_sweep = now;
        for (_, _, f) in self.dgram.expire(now) {
            let _ = self.epoll.delete(f.host.as_fd());
        }
    }
}

/// What one move between a host socket and a stack socket's buffer did.
enum Step {
    /// `n` bytes moved (0: the host side's end of stream).
    Moved(usize),
    /// The host socket would block.
    Blocked,
    /// The host socket failed: the connection is reset.
    Failed,
    /// The stack socket takes or gives nothing now.
    Stopped,
}

impl Step {
    fn of<E>(r: Result<io::Result<usize>, E>) -> Step {
        match r {
            Ok(Ok(n)) => Step::Moved(n),
            Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => Step::Blocked,
            Ok(Err(_)) => Step::Failed,
            Err(_) => Step::Stopped,
        }
    }
}

/// A host call's result as what a stack buffer's closure returns: bytes taken or given.
fn taken(r: io::Result<usize>) -> (usize, io::Result<usize>) {
    (*r.as_ref().unwrap_or(&0), r)
}

/// Moves what it can between flow `f`'s host socket and its stack socket `s`.
fn pump(f: &mut TcpFlow, s: &mut tcp::Socket<'_>, timing: &mut Timing) -> bool {
    let mut moved = false;
    if f.fresh.is_some() && s.may_send() {
        // The sandbox answered a published connection.
        f.fresh = None;
    }
    // Sandbox → host.
    while f.writable && s.can_recv() {
        let host = f.host.as_fd();
        let sent = s.recv(|b| {
            let t0 = timing.start();
            let r = ferry_sys::send_nosignal(host, b);
            timing.end(Stage::HostSend, t0, matches!(r, Ok(n) if n > 0));
            taken(r)
        });
        match Step::of(sent) {
            Step::Moved(n) => {
                f.bytes_out += n as u64;
                moved = true;
            }
            Step::Blocked => f.writable = false,
            Step::Failed => {
                s.abort();
                return true;
            }
            Step::Stopped => break,
        }
    }
    if !f.shut_wr
        && !s.can_recv()
        && matches!(
            s.state(),
            tcp::State::CloseWait
                | tcp::State::LastAck
                | tcp::State::Closing
                | tcp::State::TimeWait
        )
    {
        let _ = ferry_sys::shutdown(f.host.as_fd(), libc::SHUT_WR);
        f.shut_wr = true;
        moved = true;
    }
    // Host → sandbox.
    while f.readable && !f.host_eof && s.can_send() {
        let host = f.host.as_fd();
        let got = s.send(|b| {
            let t0 = timing.start();
            let r = ferry_sys::recv(host, b, libc::MSG_DONTWAIT);
            timing.end(Stage::HostRecv, t0, matches!(r, Ok(n) if n > 0));
            taken(r)
        });
        match Step::of(got) {
            Step::Moved(0) => {
                f.host_eof = true;
                s.close();
                moved = true;
            }
            Step::Moved(n) => {
                f.bytes_in += n as u64;
                moved = true;
            }
            Step::Blocked => f.readable = false,
            Step::Failed => {
                s.abort();
                return true;
            }
            Step::Stopped => break,
        }
    }
    moved
}

/// A v4-mapped IPv6 address as IPv4.
fn unmap(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        a => a,
    }
}
