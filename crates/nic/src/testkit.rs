//! The in-process harness: a real [`NicServer`] over a fake frame device
//! ([`FakeDevice`]: frames are byte vectors), the fake host sockets ([`FakeHost`]) and a
//! clock the test holds, with the sandbox's side played by a TCP/IP stack of its own
//! ([`Sandbox`]) or by frames the test writes ([`frames`]). No threads, no kernel
//! sockets, no waiting: a test says what happens and when, then [`Harness::run`] lets
//! the server and the sandbox exchange frames, and host events be delivered, until
//! nothing more happens.
//!
//! Owns: the fakes and the harness API. Must not: change what the server decides (the
//! server under test is the real one; only its device, its host calls and its clock are
//! the harness's), or be used outside tests and the fuzz target.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::socket::tcp;

use crate::server::{Clock, InProcess, Parts};
use crate::{NicConfig, NicPublish, NicStats, Plan};

pub mod frames;
mod host;
mod sandbox;
mod wire;

pub use frames::Seen;
pub use host::{FakeHost, HostSock, HostView};
pub use sandbox::{Conn, SANDBOX_MAC, Sandbox};
pub use wire::{FakeDevice, SharedWire, Wire};

/// Most exchanges [`Harness::run`] makes before it calls the server stuck.
const SETTLE_MAX: usize = 20_000;

/// A NIC server driven by hand (see the module's header).
pub struct Harness {
    srv: InProcess,
    wire: SharedWire,
    host: Arc<FakeHost>,
    sandbox: Sandbox,
    plan: Plan,
    /// Frames the server wrote, not taken by the test yet.
    seen: Vec<Vec<u8>>,
    start: Instant,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("srv", &self.srv)
            .finish_non_exhaustive()
    }
}

impl Default for Harness {
    fn default() -> Harness {
        Harness::new()
    }
}

impl Harness {
    /// A server with the default configuration (no policy rules: every destination the
    /// address rules allow) and no published port.
    pub fn new() -> Harness {
        Harness::with_config(NicConfig::new(Plan::avoiding(&[])), &[])
    }

    /// A server with `cfg`, listening for `publish` (on fake host listeners).
    pub fn with_config(cfg: NicConfig, publish: &[NicPublish]) -> Harness {
        let wire = SharedWire::default();
        let host = Arc::new(FakeHost::default());
        let start = Instant::now();
        let sandbox = Sandbox::new(&cfg.plan);
        let plan = cfg.plan.clone();
        let dev = FakeDevice::new(wire.clone(), cfg.plan.mtu as usize).expect("an eventfd");
        let parts = Parts {
            index: 0,
            dev: Box::new(dev),
            io: host.clone(),
            clock: Clock::Manual(start),
            seed: 0x0066_6572_7279,
        };
        let srv = InProcess::new(parts, Arc::new(cfg), publish).expect("an in-process server");
        Harness {
            srv,
            wire,
            host,
            sandbox,
            plan,
            seen: Vec::new(),
            start,
        }
    }

    /// The server's host sockets.
    pub fn host(&self) -> &FakeHost {
        &self.host
    }

    /// The sandbox's stack.
    pub fn sandbox(&mut self) -> &mut Sandbox {
        &mut self.sandbox
    }

    /// The sandbox writes `frame` (read by the server at its next turn).
    pub fn send_frame(&mut self, frame: Vec<u8>) {
        wire::lock(&self.wire).to_server.push_back(frame);
    }

    /// The frames the server wrote since the last look, decoded.
    pub fn take_frames(&mut self) -> Vec<Seen> {
        std::mem::take(&mut self.seen)
            .iter()
            .map(|f| frames::decode(f))
            .collect()
    }

    /// The frames the server wrote since the last look, as bytes.
    pub fn take_raw_frames(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.seen)
    }

    /// One exchange: a turn of the server, the host's news delivered, the frames both
    /// ways moved and the sandbox's stack polled. Whether anything happened.
    pub fn turn(&mut self) -> bool {
        let mut busy = self.srv.step();
        for (fd, events) in self.host.take_events() {
            busy |= self.srv.host_event(fd, events);
        }
        let out: Vec<Vec<u8>> = wire::lock(&self.wire).from_server.drain(..).collect();
        busy |= !out.is_empty();
        for f in out {
            if frames::for_the_stack(&f) {
                self.sandbox.deliver(f.clone());
            }
            self.seen.push(f);
        }
        let back = self.sandbox.poll(self.stack_now());
        busy |= !back.is_empty();
        wire::lock(&self.wire).to_server.extend(back);
        busy
    }

    /// Exchanges until nothing more happens (panics if that never comes).
    pub fn run(&mut self) {
        for _ in 0..SETTLE_MAX {
            if !self.turn() {
                return;
            }
        }
        panic!("the server and the sandbox are still busy after {SETTLE_MAX} exchanges");
    }

    /// Time passes (for the server and the sandbox's stack); then [`Harness::run`].
    pub fn advance(&mut self, by: Duration) {
        self.srv.advance(by);
        self.run();
    }

    fn stack_now(&self) -> smoltcp::time::Instant {
        let t = self.srv.now().saturating_duration_since(self.start);
        smoltcp::time::Instant::from_micros(t.as_micros() as i64)
    }

    /// The sandbox opens a TCP connection to `to` (sent at the next exchange).
    pub fn connect(&mut self, to: SocketAddr) -> Conn {
        self.sandbox.connect(to)
    }

    /// A program in the sandbox listens on TCP `port`.
    pub fn listen(&mut self, port: u16) -> Conn {
        self.sandbox.listen(port)
    }

    /// The state of the sandbox's socket `c`.
    pub fn state(&mut self, c: Conn) -> tcp::State {
        self.sandbox.tcp(c).state()
    }

    /// The sandbox writes `bytes` on `c`; how many its socket took.
    pub fn write(&mut self, c: Conn, bytes: &[u8]) -> usize {
        self.sandbox.tcp(c).send_slice(bytes).unwrap_or(0)
    }

    /// What arrived on the sandbox's socket `c` since the last read.
    pub fn read(&mut self, c: Conn) -> Vec<u8> {
        let s = self.sandbox.tcp(c);
        let mut out = Vec::new();
        while s.can_recv() {
            let _ = s.recv(|b| {
                out.extend_from_slice(b);
                (b.len(), ())
            });
        }
        out
    }

    /// Whether the sandbox's socket `c` has seen the end of the stream (its peer's FIN).
    pub fn eof(&mut self, c: Conn) -> bool {
        let s = self.sandbox.tcp(c);
        !s.may_recv() && !s.can_recv()
    }

    /// The sandbox closes `c` (a FIN after what it wrote).
    pub fn close(&mut self, c: Conn) {
        self.sandbox.tcp(c).close();
    }

    /// The sandbox resets `c`.
    pub fn abort(&mut self, c: Conn) {
        self.sandbox.tcp(c).abort();
    }

    /// The server's counters now.
    pub fn counters(&self) -> NicStats {
        self.srv.counters()
    }

    /// Flows the server holds, and those of them pending.
    pub fn flows(&self) -> (usize, usize) {
        self.srv.flows()
    }

    /// Whether the server's last turn left a TCP flow backlogged (an idle loop then
    /// sleeps without spinning).
    pub fn backlogged(&self) -> bool {
        self.srv.backlogged()
    }

    /// Stack sockets the server holds.
    pub fn stack_sockets(&self) -> usize {
        self.srv.stack_sockets()
    }

    /// The program has exited: the server is asked to drain.
    pub fn drain(&mut self) {
        self.srv.drain();
    }

    /// Whether the server's loop would end now.
    pub fn finished(&mut self) -> bool {
        self.srv.finished()
    }

    /// The device goes away (the sandbox's namespace is gone).
    pub fn device_gone(&mut self) {
        wire::lock(&self.wire).gone = true;
    }

    /// The device's queue towards the sandbox takes `frames` more (`None`: any number).
    pub fn device_room(&mut self, frames: Option<usize>) {
        wire::lock(&self.wire).room = frames;
    }

    /// The sandbox's addressing.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The sandbox's address of `ip`'s family, port `port`.
    pub fn sandbox_addr(&self, ip: IpAddr, port: u16) -> SocketAddr {
        SocketAddr::new(self.plan.sandbox_for(ip), port)
    }
}
