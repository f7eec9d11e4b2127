//! The TCP/IP stack's side of a NIC server: smoltcp's interface and sockets
//! ([`Stack`]), and the frame device as smoltcp sees it ([`Port`]: the device, the batch
//! of frames to write, what was written, the stage timing).
//!
//! The stack only ever receives the frame the server hands it ([`Stack::feed`]); what
//! it sends is queued in the port's batch and written at the end of each step of a turn
//! ([`Port::flush`]), or sooner when the batch is full.

use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::phy::{self, Checksum, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpListenEndpoint};

use crate::Plan;
use crate::device::{DeviceCaps, FrameDevice, Frames};
use crate::frame;
use crate::timing::Timing;

/// Most frames queued before the port writes them out.
const TX_BATCH: usize = 64;

/// What the device has written, as counted by the port.
#[derive(Debug, Default)]
pub(crate) struct TxCount {
    pub frames: u64,
    pub bytes: u64,
    pub full: u64,
}

/// The frame device, its batch of frames to write, and the timing (see the module's
/// header).
#[derive(Debug)]
pub(crate) struct Port {
    dev: Box<dyn FrameDevice>,
    caps: DeviceCaps,
    tx: Frames,
    pub count: TxCount,
    pub timing: Timing,
}

impl Port {
    pub fn new(dev: Box<dyn FrameDevice>, timing: bool) -> Port {
        Port {
            caps: dev.caps(),
            dev,
            tx: Frames::new(),
            count: TxCount::default(),
            timing: Timing::new(timing),
        }
    }

    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.dev.wake_fd()
    }

    /// Reads up to `max` frames into `into`.
    pub fn recv(&mut self, into: &mut Frames, max: usize) -> io::Result<usize> {
        self.dev.recv(into, max, &mut self.timing)
    }

    /// Queues a frame `fill` writes into an MTU's room (its length; `None`: nothing).
    /// A TCP segment's checksum is left to the offload, or completed here for a device
    /// without one. Whether there was a frame.
    pub fn queue(&mut self, fill: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
        let room = self.caps.mtu + frame::ETH_LEN;
        if self
            .tx
            .push_with(room, |b| fill(b).map(|n| (0, n)))
            .is_none()
        {
            return false;
        }
        if let Some((f, csum)) = self.tx.last_mut()
            && let Some(p) = frame::offload_tcp(f)
        {
            if self.caps.partial_csum {
                *csum = Some(p);
            } else {
                frame::complete_partial(f, p);
            }
        }
        self.flush_if_full();
        true
    }

    /// Queues a frame the stack makes (`len` bytes, written by `f`): its checksums are
    /// the stack's, but for TCP's on a device that completes it.
    fn queue_stack<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let r = f(self.tx.append(len));
        if self.caps.partial_csum
            && let Some((f, csum)) = self.tx.last_mut()
        {
            *csum = frame::offload_tcp(f);
        }
        self.flush_if_full();
        r
    }

    fn flush_if_full(&mut self) {
        if self.tx.len() >= TX_BATCH || self.tx.full() {
            self.flush();
        }
    }

    /// Writes the queued frames.
    pub fn flush(&mut self) {
        if self.tx.is_empty() {
            return;
        }
        let sent = self.dev.send(&self.tx, &mut self.timing);
        self.count.frames += sent.frames;
        self.count.bytes += sent.bytes;
        self.count.full += sent.lost;
        self.tx.clear();
    }

    /// The device as smoltcp sees it: checksums as [`frame::tx_checksums`] says (TCP's
    /// computed by the stack when the device does not complete them).
    fn stack_caps(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = self.caps.mtu + frame::ETH_LEN;
        c.checksum = frame::tx_checksums();
        if !self.caps.partial_csum {
            c.checksum.tcp = Checksum::Tx;
        }
        c
    }
}

/// The port lent to smoltcp for one poll, with the one frame it may receive.
struct Feed<'a> {
    port: &'a mut Port,
    rx: Option<&'a [u8]>,
}

struct Rx<'a>(&'a [u8]);

struct Tx<'a>(&'a mut Port);

impl phy::RxToken for Rx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        self.0.queue_stack(len, f)
    }
}

impl phy::Device for Feed<'_> {
    type RxToken<'a>
        = Rx<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = Tx<'a>
    where
        Self: 'a;

    fn receive(
        &mut self,
        _: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let frame = self.rx.take()?;
        Some((Rx(frame), Tx(self.port)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(Tx(self.port))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.port.stack_caps()
    }
}

/// One NIC server's smoltcp interface (the gateway, answering for every address) and
/// its TCP sockets.
pub(crate) struct Stack {
    iface: Interface,
    sockets: SocketSet<'static>,
    /// smoltcp's time zero.
    epoch: Instant,
    /// Each socket's buffer, each way.
    buffer: usize,
    /// Closed sockets kept for the next flows (at most [`Stack::SPARE`]): a new socket's
    /// two buffers are zeroed and faulted in page by page, which made a short
    /// connection's CPU in nic mode mostly `memset`.
    spare: Vec<tcp::Socket<'static>>,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("sockets", &self.sockets.iter().count())
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// The gateway of `plan` with hardware address `mac`, over `port`; `seed`: the
    /// stack's randomness (initial sequence numbers, ports); `buffer`: each socket's
    /// buffer each way.
    pub fn new(
        port: &mut Port,
        plan: &Plan,
        mac: EthernetAddress,
        seed: u64,
        buffer: usize,
        epoch: Instant,
    ) -> Stack {
        let mut config = Config::new(HardwareAddress::Ethernet(mac));
        config.random_seed = seed;
        let mut feed = Feed { port, rx: None };
        let mut iface = Interface::new(config, &mut feed, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(plan.gw4), plan.prefix4));
            let _ = a.push(IpCidr::new(IpAddress::Ipv6(plan.gw6), plan.prefix6));
        });
        // Any destination is ours to answer for ("any IP" through a default route via
        // our own address): the stack terminates every connection the sandbox opens.
        iface.set_any_ip(true);
        let _ = iface.routes_mut().add_default_ipv4_route(plan.gw4);
        let _ = iface.routes_mut().add_default_ipv6_route(plan.gw6);
        Stack {
            iface,
            sockets: SocketSet::new(Vec::new()),
            epoch,
            buffer,
            spare: Vec::new(),
        }
    }

    /// Closed sockets kept for reuse.
    const SPARE: usize = 16;

    fn at(&self, now: Instant) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(
            now.saturating_duration_since(self.epoch).as_micros() as i64
        )
    }

    /// Hands `frame` to the stack (what it answers is queued on `port`).
    pub fn feed(&mut self, port: &mut Port, frame: &[u8], now: Instant) {
        let at = self.at(now);
        let mut feed = Feed {
            port,
            rx: Some(frame),
        };
        let _ = self
            .iface
            .poll_ingress_single(at, &mut feed, &mut self.sockets);
    }

    /// Lets the stack send what it has; whether a socket's state changed.
    pub fn egress(&mut self, port: &mut Port, now: Instant) -> bool {
        let at = self.at(now);
        let mut feed = Feed { port, rx: None };
        self.iface.poll_egress(at, &mut feed, &mut self.sockets) == PollResult::SocketStateChanged
    }

    /// How long until the stack has something to do (a timer).
    pub fn delay(&mut self, now: Instant) -> Option<Duration> {
        let at = self.at(now);
        self.iface
            .poll_delay(at, &self.sockets)
            .map(|d| Duration::from_micros(d.total_micros()))
    }

    /// A closed socket: a spare one, else a new one. (smoltcp's `listen` and `connect`
    /// reset a closed socket's state, timers and buffers; the options set here are not
    /// reset and are the same for every socket.)
    fn socket(&mut self) -> tcp::Socket<'static> {
        if let Some(s) = self.spare.pop() {
            return s;
        }
        let n = self.buffer;
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; n]),
            tcp::SocketBuffer::new(vec![0; n]),
        );
        s.set_ack_delay(None);
        s.set_nagle_enabled(false);
        s
    }

    /// A socket listening on exactly `dst` (takes the one SYN to it); `None` when the
    /// address cannot be listened on (port 0).
    pub fn listen(&mut self, dst: SocketAddr) -> Option<SocketHandle> {
        let mut s = self.socket();
        s.listen(IpListenEndpoint {
            addr: Some(dst.ip().into()),
            port: dst.port(),
        })
        .ok()?;
        Some(self.sockets.add(s))
    }

    /// A socket connecting from `from` to `to` (the sandbox).
    pub fn connect(&mut self, from: SocketAddr, to: SocketAddr) -> Option<SocketHandle> {
        let mut s = self.socket();
        let local = IpListenEndpoint {
            addr: Some(from.ip().into()),
            port: from.port(),
        };
        s.connect(
            self.iface.context(),
            (IpAddress::from(to.ip()), to.port()),
            local,
        )
        .ok()?;
        Some(self.sockets.add(s))
    }

    pub fn get_mut(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(h)
    }

    pub fn state(&self, h: SocketHandle) -> tcp::State {
        self.sockets.get::<tcp::Socket>(h).state()
    }

    pub fn remove(&mut self, h: SocketHandle) {
        if let smoltcp::socket::Socket::Tcp(mut s) = self.sockets.remove(h)
            && self.spare.len() < Self::SPARE
        {
            // Out of the set nothing it would send goes anywhere.
            s.abort();
            self.spare.push(s);
        }
    }

    /// Stack sockets open (for tests: a pending flow has none).
    pub fn sockets(&self) -> usize {
        self.sockets.iter().count()
    }
}
