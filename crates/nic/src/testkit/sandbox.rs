//! [`Sandbox`]: the sandbox's side of the wire in the harness — a TCP/IP stack of its
//! own (smoltcp, as a kernel would be: the sandbox's addresses, a default route via the
//! gateway, checksums computed and verified) whose TCP sockets the tests open, write,
//! read, close and reset as a program would.

use std::collections::VecDeque;
use std::net::SocketAddr;

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpListenEndpoint};

use crate::Plan;

/// The sandbox interface's hardware address in the harness.
pub const SANDBOX_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x64]);

/// A TCP socket of the sandbox's stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conn(SocketHandle);

#[derive(Debug, Default)]
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: Vec<Vec<u8>>,
    mtu: usize,
}

struct RxT(Vec<u8>);
struct TxT<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for RxT {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxT<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut b = vec![0; len];
        let r = f(&mut b);
        self.0.push(b);
        r
    }
}

impl phy::Device for Queues {
    type RxToken<'a> = RxT;
    type TxToken<'a> = TxT<'a>;

    fn receive(
        &mut self,
        _: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let f = self.rx.pop_front()?;
        Some((RxT(f), TxT(&mut self.tx)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(TxT(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = self.mtu + crate::frame::ETH_LEN;
        c
    }
}

/// The sandbox's stack (see the module's header).
pub struct Sandbox {
    iface: Interface,
    sockets: SocketSet<'static>,
    dev: Queues,
    next_port: u16,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").finish_non_exhaustive()
    }
}

/// Each sandbox socket's buffer, each way.
const BUFFER: usize = 256 * 1024;

impl Sandbox {
    /// The sandbox of `plan`.
    pub fn new(plan: &Plan) -> Sandbox {
        let mut dev = Queues {
            mtu: plan.mtu as usize,
            ..Queues::default()
        };
        let mut config = Config::new(HardwareAddress::Ethernet(SANDBOX_MAC));
        config.random_seed = 0x5a4d_b0c5;
        let mut iface = Interface::new(config, &mut dev, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(plan.v4), plan.prefix4));
            let _ = a.push(IpCidr::new(IpAddress::Ipv6(plan.v6), plan.prefix6));
        });
        let _ = iface.routes_mut().add_default_ipv4_route(plan.gw4);
        let _ = iface.routes_mut().add_default_ipv6_route(plan.gw6);
        Sandbox {
            iface,
            sockets: SocketSet::new(Vec::new()),
            dev,
            next_port: 40_000,
        }
    }

    /// Takes a frame from the gateway.
    pub fn deliver(&mut self, frame: Vec<u8>) {
        self.dev.rx.push_back(frame);
    }

    /// Lets the stack work at `now` (time since the harness started); the frames it
    /// wrote.
    pub fn poll(&mut self, now: smoltcp::time::Instant) -> Vec<Vec<u8>> {
        let _ = self.iface.poll(now, &mut self.dev, &mut self.sockets);
        std::mem::take(&mut self.dev.tx)
    }

    /// A socket that acknowledges at once (a delayed ACK would wait for time the
    /// harness only lets pass when a test says so).
    fn socket() -> tcp::Socket<'static> {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; BUFFER]),
            tcp::SocketBuffer::new(vec![0; BUFFER]),
        );
        s.set_ack_delay(None);
        s
    }

    /// A socket connecting to `to` from a port of its own.
    pub fn connect(&mut self, to: SocketAddr) -> Conn {
        let mut s = Sandbox::socket();
        self.next_port += 1;
        s.connect(
            self.iface.context(),
            (IpAddress::from(to.ip()), to.port()),
            self.next_port,
        )
        .expect("a connect the sandbox's stack takes");
        Conn(self.sockets.add(s))
    }

    /// A socket listening on `port` (any of the sandbox's addresses).
    pub fn listen(&mut self, port: u16) -> Conn {
        let mut s = Sandbox::socket();
        s.listen(IpListenEndpoint { addr: None, port })
            .expect("a port to listen on");
        Conn(self.sockets.add(s))
    }

    pub fn tcp(&mut self, c: Conn) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(c.0)
    }

    /// Removes socket `c` without a word on the wire (a kernel whose program closed a
    /// socket still connecting sends nothing).
    pub fn forget(&mut self, c: Conn) {
        self.sockets.remove(c.0);
    }
}
