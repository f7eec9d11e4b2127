//! The event loop: control socket, channels, host sockets, readiness pairs.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ferry_proto::{Call, Ctl, CtlKind, HELLO_ROUTES, Hello, HelloReply, PROTO_VERSION, ProtoError};
use ferry_sys::{Epoll, Event};
use tracing::{debug, info, warn};

use crate::channel::{Channel, Channels, Next};
use crate::group::{Handle, Msg, Shared, lock, server_name};
use crate::ops::Errno;
use crate::seam::Io;
use crate::sock::{Conn, NewPair, Owner, PairEnd, Parked, Place, Sock};
use crate::stats::ServerStats;
use crate::{Config, Error, SandboxSocketFn};

/// Epoll token kinds (top byte of the token; the low 32 bits carry an index).
const T_LISTEN: u64 = 1;
const T_CTL: u64 = 2;
const T_DOORBELL: u64 = 3;
const T_HOST: u64 = 4;
const T_PAIR: u64 = 5;
const T_PUBLISH: u64 = 6;
const T_INBOX: u64 = 7;
const T_HELLO: u64 = 8;
const T_DNS_IN: u64 = 9;
const T_DNS_UP: u64 = 10;
const T_DNS_TCP: u64 = 11;
pub(crate) const T_UDP_FLOW: u64 = 12;
/// Most connections of one published port that wait for the sandbox to accept them;
/// more are refused.
const MAX_WAITING: usize = 8192;
/// How long a connection to a published port waits for a listener in the sandbox when
/// there is none (the program may still be starting) before it is refused.
const UNSERVED_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a control connection may take to say Hello before it is closed.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Most control connections waiting for their Hello at once (the oldest gives way).
const MAX_PENDING_HELLO: usize = 64;

/// A small index (of a published port, a DNS socket) as an epoll token's index.
fn index_u32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

pub(crate) fn token(kind: u64, idx: u32) -> u64 {
    kind << 56 | u64::from(idx)
}

/// A protocol server: one thread's event loop (one of a [`crate::Servers`] group, or a
/// group of its own from [`Server::new`]).
pub struct Server {
    pub(crate) cfg: Config,
    /// Every call on host sockets, pairs and control sockets (the seam, `seam.rs`).
    pub(crate) io: &'static dyn Io,
    /// This server's index in its group.
    pub(crate) index: usize,
    pub(crate) shared: Arc<Shared>,
    pub(crate) epoll: Epoll,
    /// The control socket (the first server only).
    listener: Option<OwnedFd>,
    pub(crate) channels: Channels,
    pub(crate) socks: HashMap<u32, Sock>,
    /// Host listeners of published ports (the first server only) and the sandbox port
    /// each feeds; the accepted connections wait in [`Shared::published`].
    published: Vec<(OwnedFd, u16)>,
    pub(crate) stats: ServerStats,
    /// Sockets whose state changed this turn (closing, tokens).
    pub(crate) dirty: Vec<u32>,
    /// `epoll_wait` calls returned so far: orders host events against receives (see
    /// `Sock::recv_mark`).
    pub(crate) waits: u64,
    /// `rx_pair`: where host bytes land on their way into a pair.
    pub(crate) rx: crate::rx::RxScratch,
    /// Sockets with sends queued during this pass of the rings.
    pub(crate) tx_pending: Vec<u32>,
    /// Control connections that have not said Hello yet: the connection, the process
    /// that made it, and when it came (it is closed after [`HELLO_TIMEOUT`]).
    pending_hello: HashMap<u32, (OwnedFd, Owner, Instant)>,
    next_hello: u32,
    /// Only this process and its descendants may open channels.
    init_pid: Option<i32>,
    /// The sandbox's DNS forwarder, when enabled.
    dns: Option<crate::dns::Dns>,
    /// Sockets whose program-written pair bytes wait for this pass over the rings
    /// (see `Server::pair_input`).
    pub(crate) pair_resume: Vec<u32>,
    /// Data-path modules bound to sockets (`modules.rs`).
    pub(crate) modules: crate::modules::Modules,
    /// An unbound unix socket of the server's namespace: binding it to a pair's name
    /// tells whether the program's end is still open (see `app_alive`).
    name_probe: Option<OwnedFd>,
    /// The host's own addresses, for the bind and source rules (`reach.rs`).
    pub(crate) host_addrs: crate::reach::HostAddrs,
    /// Log lines about refused control connections and sockets, at most one a second.
    pub(crate) refusals: LogThrottle,
    /// Connections to published ports wait with no listener in the sandbox
    /// ([`Server::expire_unserved`]).
    unserved: bool,
    /// Flows of the published UDP ports (the first server only).
    pub(crate) udp_flows: crate::udp_publish::Flows,
    /// Log lines about requests for sockets a process does not hold, likewise.
    pub(crate) strangers: LogThrottle,
}

/// At most one log line a second for an event a sandbox can repeat at will: `tick`
/// says when to write one, and how many events it covers.
#[derive(Debug, Default)]
pub(crate) struct LogThrottle {
    last: Option<Instant>,
    count: u64,
}

impl LogThrottle {
    /// Counts one event; `Some(events since the last line)` when a line is due.
    pub(crate) fn tick(&mut self) -> Option<u64> {
        self.count += 1;
        if self
            .last
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1))
        {
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.count))
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("cfg", &self.cfg)
            .field("sockets", &self.socks.len())
            .finish()
    }
}

impl Server {
    /// A single server: binds the control socket and the published ports. (For several
    /// servers with `cfg.servers`, use [`crate::Servers`].)
    pub fn new(mut cfg: Config, sandbox_socket: SandboxSocketFn) -> Result<Server, Error> {
        cfg.servers = 1;
        let shared = Arc::new(Shared::new(&cfg, sandbox_socket)?);
        Server::member(cfg, shared, 0)
    }

    /// Server `index` of a group; the first one binds the control socket and the
    /// published ports.
    pub(crate) fn member(cfg: Config, shared: Arc<Shared>, index: usize) -> Result<Server, Error> {
        let epoll = Epoll::new(256).map_err(Error::EventLoop)?;
        epoll
            .add(
                shared.inbox[index].efd.as_fd(),
                libc::EPOLLIN as u32,
                token(T_INBOX, 0),
            )
            .map_err(Error::EventLoop)?;
        let (listener, published) = if index == 0 {
            let listener = Server::control_socket(&cfg, &epoll)?;
            (Some(listener), Server::publish_ports(&cfg, &epoll)?)
        } else {
            (None, Vec::new())
        };
        Server::assemble(
            cfg,
            shared,
            index,
            epoll,
            listener,
            published,
            &crate::seam::SYS,
        )
    }

    /// A server of its own group that serves channels opened in-process
    /// ([`Server::open_channel`]) and makes every call through `io`: no control socket,
    /// no published ports (the harness of `testkit.rs`).
    pub(crate) fn in_process(mut cfg: Config, io: &'static dyn Io) -> Result<Server, Error> {
        cfg.servers = 1;
        let sandbox: SandboxSocketFn = Box::new(move |d, t, p| io.socket(d, t, p));
        let shared = Arc::new(Shared::new(&cfg, sandbox)?);
        let epoll = Epoll::new(256).map_err(Error::EventLoop)?;
        Server::assemble(cfg, shared, 0, epoll, None, Vec::new(), io)
    }

    fn assemble(
        cfg: Config,
        shared: Arc<Shared>,
        index: usize,
        epoll: Epoll,
        listener: Option<OwnedFd>,
        published: Vec<(OwnedFd, u16)>,
        io: &'static dyn Io,
    ) -> Result<Server, Error> {
        let modules = crate::modules::Modules::new(cfg.modules.clone())?;
        let stats = ServerStats {
            id: server_name(index),
            modules_loaded: cfg.modules.rules.len() as u64,
            ..ServerStats::default()
        };
        Ok(Server {
            cfg,
            io,
            index,
            shared,
            epoll,
            listener,
            channels: Channels::default(),
            socks: HashMap::new(),
            published,
            stats,
            dirty: Vec::new(),
            waits: 0,
            rx: Default::default(),
            tx_pending: Vec::new(),
            pending_hello: HashMap::new(),
            next_hello: 0,
            init_pid: None,
            dns: None,
            pair_resume: Vec::new(),
            modules,
            name_probe: None,
            host_addrs: Default::default(),
            refusals: LogThrottle::default(),
            udp_flows: Default::default(),
            unserved: false,
            strangers: LogThrottle::default(),
        })
    }

    fn control_socket(cfg: &Config, epoll: &Epoll) -> Result<OwnedFd, Error> {
        let listen_err = |source| Error::Listen {
            path: cfg.socket_path.clone(),
            source,
        };
        let listener = ferry_sys::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
        .map_err(listen_err)?;
        ferry_sys::bind_unix(listener.as_fd(), &cfg.socket_path).map_err(listen_err)?;
        ferry_sys::listen(listener.as_fd(), 128).map_err(listen_err)?;
        // Every user inside the sandbox may connect (servers drop privileges); who is
        // inside is checked per connection (`restrict_to_pidns`).
        ferry_sys::chmod(&cfg.socket_path, 0o666).map_err(listen_err)?;
        epoll
            .add(listener.as_fd(), libc::EPOLLIN as u32, token(T_LISTEN, 0))
            .map_err(Error::EventLoop)?;
        Ok(listener)
    }

    fn publish_ports(cfg: &Config, epoll: &Epoll) -> Result<Vec<(OwnedFd, u16)>, Error> {
        let mut published = Vec::new();
        for (i, p) in cfg.publish.iter().enumerate() {
            let perr = |source| Error::Publish {
                addr: p.host,
                source,
            };
            let ty = if p.udp {
                libc::SOCK_DGRAM
            } else {
                libc::SOCK_STREAM
            };
            let mut host = p.host;
            let fd = match ferry_sys::socket(
                if host.is_ipv4() {
                    libc::AF_INET
                } else {
                    libc::AF_INET6
                },
                ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            ) {
                // `[::]` (the default): both families, or IPv4 alone where IPv6 is off.
                Err(e)
                    if e.raw_os_error() == Some(libc::EAFNOSUPPORT)
                        && host.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) =>
                {
                    host = std::net::SocketAddr::new(
                        std::net::Ipv4Addr::UNSPECIFIED.into(),
                        host.port(),
                    );
                    ferry_sys::socket(
                        libc::AF_INET,
                        ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                        0,
                    )
                }
                other => other,
            }
            .map_err(perr)?;
            if host.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) {
                ferry_sys::setsockopt(
                    fd.as_fd(),
                    libc::IPPROTO_IPV6,
                    libc::IPV6_V6ONLY,
                    &0i32.to_ne_bytes(),
                )
                .map_err(perr)?;
            }
            ferry_sys::setsockopt(
                fd.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                &1i32.to_ne_bytes(),
            )
            .map_err(perr)?;
            ferry_sys::bind(fd.as_fd(), &host).map_err(perr)?;
            if !p.udp {
                ferry_sys::listen(fd.as_fd(), 511).map_err(perr)?;
            }
            epoll
                .add(
                    fd.as_fd(),
                    libc::EPOLLIN as u32,
                    token(T_PUBLISH, index_u32(i)),
                )
                .map_err(Error::EventLoop)?;
            published.push((fd, p.sandbox_port));
        }
        Ok(published)
    }

    /// Accepts channels only from `init` and its descendants (the sandbox's processes:
    /// `init` is the sandbox's pid 1, so orphans inside are re-parented to it). The
    /// control socket must be reachable by every user inside the sandbox (programs drop
    /// privileges), so this is what keeps other host processes out.
    pub fn restrict_to_descendants_of(&mut self, init: i32) {
        self.init_pid = Some(init);
    }

    /// The process at the other end of a new control connection, if it may open a
    /// channel: a process of the sandbox (once [`Server::restrict_to_descendants_of`]
    /// was called), with a pid and start time the kernel vouches for.
    fn peer_owner(&self, fd: &OwnedFd) -> Option<Owner> {
        let pid = match ferry_sys::peer_pid(fd.as_fd()) {
            Ok(pid) => pid,
            Err(e) => {
                warn!("control connection without credentials ({e}); refused");
                return None;
            }
        };
        if let Some(init) = self.init_pid
            && !descends_from(pid, init)
        {
            warn!("control connection from pid {pid}, which is not in the sandbox; refused");
            return None;
        }
        let Some(start) = process_start(pid) else {
            debug!("control connection from pid {pid}, which has exited; refused");
            return None;
        };
        Some(Owner { pid, start })
    }

    /// Starts the DNS forwarder (see [`crate::dns`]): `listen` are the nameserver
    /// addresses the sandbox's resolver uses (added to its `lo` where needed), `upstream`
    /// where queries go from the host namespace. Needs the sandbox to exist (its socket
    /// factory makes the inside sockets).
    pub fn enable_dns(
        &mut self,
        listen: &[std::net::IpAddr],
        upstream: Vec<std::net::SocketAddr>,
    ) -> io::Result<()> {
        let nl = self.shared.sandbox_socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )?;
        let (mut inside, mut inside_tcp) = (Vec::new(), Vec::new());
        for ip in listen {
            if !ip.is_loopback() {
                let prefix = if ip.is_ipv4() { 32 } else { 128 };
                ferry_sys::add_address(nl.as_fd(), 1, *ip, prefix)?;
            }
            let domain = if ip.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            };
            let fd = self.shared.sandbox_socket(
                domain,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )?;
            ferry_sys::set_nonblocking(fd.as_fd(), true)?;
            ferry_sys::bind(fd.as_fd(), &std::net::SocketAddr::new(*ip, 53))?;
            inside.push(fd);
            let l = self.shared.sandbox_socket(
                domain,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )?;
            ferry_sys::set_nonblocking(l.as_fd(), true)?;
            ferry_sys::setsockopt(
                l.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                &1i32.to_ne_bytes(),
            )?;
            ferry_sys::bind(l.as_fd(), &std::net::SocketAddr::new(*ip, 53))?;
            ferry_sys::listen(l.as_fd(), 64)?;
            inside_tcp.push(l);
        }
        let dns = crate::dns::Dns::new(inside, inside_tcp, upstream)?;
        for (i, fd) in dns.inside.iter().enumerate() {
            self.epoll.add(
                fd.as_fd(),
                libc::EPOLLIN as u32,
                token(T_DNS_IN, index_u32(i)),
            )?;
        }
        for (i, fd) in dns.inside_tcp.iter().enumerate() {
            self.epoll.add(
                fd.as_fd(),
                libc::EPOLLIN as u32,
                token(T_DNS_TCP, index_u32(i)),
            )?;
        }
        self.epoll.add(
            dns.outside.as_fd(),
            libc::EPOLLIN as u32,
            token(T_DNS_UP, 0),
        )?;
        self.dns = Some(dns);
        Ok(())
    }

    /// A handle that stops [`Server::run`] (and every server of its group).
    pub fn stop_handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
        }
    }

    /// Serves until stopped; returns the counters.
    pub fn run(mut self) -> ServerStats {
        let mut events = Vec::with_capacity(256);
        let mut last_work = Instant::now();
        self.shared.live[self.index]
            .tid
            .store(ferry_sys::gettid().cast_signed(), Ordering::Release);
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.stats.turns += 1;
            let did = self.drain_rings();
            if did == 0 {
                self.module_idle();
            }
            if self.stats.turns.is_multiple_of(64) {
                self.publish_live();
                self.expire_hellos();
            }
            let busy = did > 0 || last_work.elapsed() < self.cfg.server_spin;
            self.wait_events(busy, &mut events);
            if did == 0 && events.is_empty() {
                self.stats.spin_turns += 1;
                // S0's SBW polls with schedule(): on a machine with few cores the thread
                // we wait for (the program, the peer, softirq) may need this very CPU.
                std::thread::yield_now();
            } else {
                last_work = Instant::now();
            }
            for ev in events.drain(..) {
                self.dispatch(ev);
            }
            self.drain_rings();
            self.settle_dirty();
            self.flush_all();
        }
        self.shutdown();
        self.collect_stats()
    }

    /// Asks epoll for events: without waiting while `busy` (work done, or the spin span
    /// not over: S0's SBW), briefly while completions back up, else asleep once every
    /// channel's sleep flag is armed (no longer than S1's batch delay, or than a
    /// pending Hello or an unserved published connection may wait).
    fn wait_events(&mut self, busy: bool, events: &mut Vec<Event>) {
        let timeout = if busy {
            0
        } else if self.channels.has_backlog() {
            // Completions wait for room in a ring the program empties without
            // telling: look again soon, without burning the CPU.
            1
        } else if self.channels.arm_all() {
            self.stats.sleeps += 1;
            self.publish_live();
            -1
        } else {
            0
        };
        events.clear();
        let waited = if timeout < 0 && self.cfg.batch > 1 {
            // S1's flush on a maximum delay: a shim may hold back its doorbell, so
            // never sleep longer than the delay it was promised.
            self.epoll.wait_for(self.cfg.batch_delay, events)
        } else if timeout < 0 && (!self.pending_hello.is_empty() || self.unserved) {
            // A connection that never says Hello is closed in time; so is one to a
            // published port nothing in the sandbox serves.
            self.expire_hellos();
            self.expire_unserved();
            self.epoll.wait_for(HELLO_TIMEOUT / 2, events)
        } else {
            self.epoll.wait(timeout, events)
        };
        self.waits += 1;
        if let Err(e) = waited {
            warn!("epoll_wait failed: {e}");
        }
        self.channels.disarm_all();
    }

    /// Handles every record waiting in every request ring; returns how many.
    pub(crate) fn drain_rings(&mut self) -> usize {
        let mut total = 0;
        for idx in 0..self.channels.slots() {
            loop {
                match self.channels.next_request(idx) {
                    Next::Record(rec) => {
                        total += 1;
                        self.stats.requests += 1;
                        let handled = Call::decode(&rec)
                            .map_err(ProtoError::from)
                            .and_then(|call| self.handle(idx, call));
                        if let Err(why) = handled {
                            self.bad_channel(idx, &why.to_string());
                        }
                    }
                    Next::Throttled(first) => {
                        self.stats.backpressure += u64::from(first);
                        break;
                    }
                    Next::Empty => break,
                    Next::Broken(why) => {
                        self.bad_channel(idx, &why);
                        break;
                    }
                }
            }
        }
        self.flush_pending();
        for id in std::mem::take(&mut self.pair_resume) {
            self.pair_input(id);
        }
        total
    }

    pub(crate) fn flush_all(&mut self) {
        self.channels.flush_all();
    }

    fn dispatch(&mut self, ev: Event) {
        let idx = (ev.token & 0xffff_ffff) as u32;
        match ev.token >> 56 {
            T_LISTEN => self.accept_channels(),
            T_CTL => self.ctl_readable(idx, ev.events),
            T_DOORBELL => {
                if let Some(ch) = self.chan_mut(idx) {
                    let _ = ferry_sys::eventfd_drain(ch.doorbell());
                    ch.stats.doorbells += 1;
                }
            }
            T_HOST => self.host_event(idx, ev.events),
            T_PAIR => self.pair_event(idx, ev.events),
            T_PUBLISH => self.publish_event(idx as usize),
            T_UDP_FLOW => self.flow_event(idx),
            T_HELLO => self.hello(idx),
            T_DNS_IN => {
                if let Some(d) = self.dns.as_mut() {
                    d.from_sandbox(idx as usize);
                }
            }
            T_DNS_UP => {
                if let Some(d) = self.dns.as_mut() {
                    d.from_upstream();
                }
            }
            T_DNS_TCP => {
                if let Some(d) = self.dns.as_mut() {
                    d.accept_tcp(idx as usize);
                }
            }
            T_INBOX => {
                let _ = ferry_sys::eventfd_drain(self.shared.inbox[self.index].efd.as_fd());
                self.drain_inbox();
            }
            _ => {}
        }
    }

    /// Our end of socket `id`'s readiness pair reported `events`: the program closed
    /// its last descriptor (a hang-up not of our making), wrote into its end (input), or
    /// made room (a pump with bytes waiting for it goes on).
    pub(crate) fn pair_event(&mut self, id: u32, events: u32) {
        if events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 && !self.pair_alive(id, events) {
            self.app_closed(id);
            return;
        }
        if events & libc::EPOLLIN as u32 != 0 {
            // (Sends the program queued before it wrote into the pair go first:
            // `pair_input` defers to the end of the next pass over the rings.)
            self.pair_input(id);
        }
        // Room in a pair: only a socket with bytes waiting for it needs a pump (the
        // others hear of new bytes from their host socket).
        if events & libc::EPOLLOUT as u32 != 0
            && self
                .socks
                .get(&id)
                .is_some_and(|s| !s.rx_pending.is_empty() || s.oob_byte.is_some())
        {
            self.pump(id);
        }
    }

    fn accept_channels(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            match ferry_sys::accept4(listener.as_fd(), libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) {
                Ok((fd, _)) => {
                    let Some(owner) = self.peer_owner(&fd) else {
                        self.stats.channels_refused += 1;
                        continue;
                    };
                    if !self.admit(owner) {
                        continue;
                    }
                    // The channel is set up when its Hello arrives.
                    let n = self.next_hello;
                    self.next_hello = self.next_hello.wrapping_add(1);
                    if let Err(e) =
                        self.epoll
                            .add(fd.as_fd(), libc::EPOLLIN as u32, token(T_HELLO, n))
                    {
                        warn!("cannot watch new control connection: {e}");
                        continue;
                    }
                    self.pending_hello.insert(n, (fd, owner, Instant::now()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // Out of descriptors, say: the connection waits in the backlog, and
                    // the next turn tries again (no spin: the listener is level-triggered
                    // but this loop gives up for the turn).
                    warn!("accept on control socket: {e}");
                    return;
                }
            }
        }
    }

    /// Whether a new control connection of `owner` may wait for its Hello: the sandbox's
    /// channels stay under the cap, and at most [`MAX_PENDING_HELLO`] connections wait
    /// at once. When they are that many, those whose Hello has come are taken first;
    /// then the oldest connection of the process with the most waiting gives way (a
    /// flood of silent connections evicts itself, not a shim about to say Hello).
    fn admit(&mut self, owner: Owner) -> bool {
        let channels = self.shared.channels_open();
        if channels + self.pending_hello.len() >= self.cfg.max_channels {
            if let Some(n) = self.refusals.tick() {
                warn!(
                    "the sandbox has {channels} channels open (--max-channels {}): a new control connection from pid {} refused ({n} since the last line)",
                    self.cfg.max_channels, owner.pid
                );
            }
            self.stats.channels_refused += 1;
            return false;
        }
        if self.pending_hello.len() < MAX_PENDING_HELLO {
            return true;
        }
        let ready: Vec<u32> = self
            .pending_hello
            .iter()
            .filter(|(_, (fd, _, _))| {
                ferry_sys::poll_now(fd.as_fd(), libc::POLLIN).unwrap_or(0) != 0
            })
            .map(|(n, _)| *n)
            .collect();
        for n in ready {
            self.hello(n);
        }
        if self.pending_hello.len() >= MAX_PENDING_HELLO {
            let mut per_owner: HashMap<Owner, usize> = HashMap::new();
            for (_, o, _) in self.pending_hello.values() {
                *per_owner.entry(*o).or_default() += 1;
            }
            let worst = per_owner
                .into_iter()
                .max_by_key(|(_, k)| *k)
                .map(|(o, _)| o);
            let victim = self
                .pending_hello
                .iter()
                .filter(|(_, (_, o, _))| Some(*o) == worst)
                .min_by_key(|(_, (_, _, at))| *at)
                .map(|(n, _)| *n);
            if let Some(n) = victim {
                self.drop_pending_hello(n, "too many connections waiting for their Hello");
            }
        }
        true
    }

    fn drop_pending_hello(&mut self, n: u32, why: &str) {
        if let Some((fd, owner, _)) = self.pending_hello.remove(&n) {
            let _ = self.epoll.delete(fd.as_fd());
            if let Some(k) = self.refusals.tick() {
                warn!(
                    "control connection from pid {}: {why}; closed ({k} since the last line)",
                    owner.pid
                );
            }
            self.stats.channels_refused += 1;
        }
    }

    /// Closes control connections that did not say Hello in [`HELLO_TIMEOUT`].
    fn expire_hellos(&mut self) {
        if self.pending_hello.is_empty() {
            return;
        }
        let late: Vec<u32> = self
            .pending_hello
            .iter()
            .filter(|(_, (_, _, at))| at.elapsed() > HELLO_TIMEOUT)
            .map(|(n, _)| *n)
            .collect();
        for n in late {
            self.drop_pending_hello(n, "no Hello in time");
        }
    }

    fn ctl_readable(&mut self, idx: u32, events: u32) {
        let Some(ch) = self.channels.get(idx) else {
            return;
        };
        // A `BindModule` carries its binding after the header in the same packet.
        let mut buf = self.modules.take_ctl_buf();
        let head = size_of::<Ctl>();
        match ferry_sys::recv_with_fds(ch.ctl.as_fd(), &mut buf, libc::MSG_DONTWAIT) {
            Ok((0, _)) => {
                // Take what the thread queued before it went away.
                self.drain_rings();
                self.close_channel(idx, "closed by the sandbox");
            }
            Ok((n, fds)) if n >= head => {
                let msg: Ctl = bytemuck::pod_read_unaligned(&buf[..head]);
                if msg.kind() == Some(CtlKind::BindModule) {
                    self.bind_module_ctl(idx, msg, &buf[head..n], fds);
                } else if msg.kind() == Some(CtlKind::Files) && n == head {
                    self.stash_files(idx, fds);
                } else if msg.kind() == Some(CtlKind::RegisterFile) && n == head {
                    self.register_file_ctl(idx, fds);
                } else if msg.kind() == Some(CtlKind::UnregisterFile) && n == head {
                    self.unregister_file_ctl(idx, msg, fds);
                } else if n == head {
                    self.control(idx, msg, fds);
                } else {
                    self.bad_channel(idx, &format!("control message of {n} bytes"));
                }
            }
            Ok((n, _)) => self.bad_channel(idx, &format!("control message of {n} bytes")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                    self.drain_rings();
                    self.close_channel(idx, "hung up");
                }
            }
            Err(e) => self.close_channel(idx, &format!("control socket error: {e}")),
        }
        self.modules.put_ctl_buf(buf);
    }

    fn hello(&mut self, n: u32) {
        let Some((fd, owner, _)) = self.pending_hello.remove(&n) else {
            return;
        };
        let _ = self.epoll.delete(fd.as_fd());
        let mut buf = [0u8; size_of::<Hello>()];
        let hello: Hello = match ferry_sys::recv_with_fds(fd.as_fd(), &mut buf, libc::MSG_DONTWAIT)
        {
            Ok((n, _)) if n == buf.len() => bytemuck::pod_read_unaligned(&buf),
            Ok((0, _)) => {
                // The process (or thread) went before it said Hello: exiting while a
                // channel was being opened.
                debug!("a connection closed before its Hello");
                return;
            }
            other => {
                warn!("bad hello ({other:?}); closing the connection");
                return;
            }
        };
        let target = (hello.server & 0xffff) as usize;
        if hello.version != PROTO_VERSION || target >= self.shared.n {
            warn!(
                "hello for protocol version {} (want {PROTO_VERSION}), server {target} (of {}); refused",
                hello.version, self.shared.n
            );
            let reply = HelloReply::default();
            let _ = ferry_sys::send_with_fds(fd.as_fd(), as_bytes(&reply), &[]);
            return;
        }
        if target == self.index {
            self.open_channel(fd, hello, owner);
        } else {
            self.shared.inbox[target].send(Msg::Hello(fd, hello, owner));
        }
    }

    /// Sets up a channel for a control connection that said `hello` for this server.
    pub(crate) fn open_channel(&mut self, fd: OwnedFd, hello: Hello, owner: Owner) {
        let idx = self.channels.free_slot();
        // Sockets of this channel take the pair receive path if the server offers it
        // and the peer reads pairs (the shim does; the native client does not).
        let rx_pair = self.cfg.rx_pair && hello.server & ferry_proto::HELLO_READS_PAIR != 0;
        let ch = match Channel::new(idx, fd, self.cfg.layout, owner, hello.tid) {
            Ok(ch) => ch,
            Err(e) => {
                warn!("channel {idx}: cannot create region: {e}");
                return;
            }
        };
        let reply = HelloReply {
            version: PROTO_VERSION,
            channel: idx,
            spin_ns: u64::try_from(self.cfg.shim_spin.as_nanos()).unwrap_or(u64::MAX),
            batch: self.cfg.batch.max(1),
            batch_delay_us: u32::try_from(self.cfg.batch_delay.as_micros()).unwrap_or(u32::MAX),
            flags: if rx_pair {
                ferry_proto::HELLO_RX_PAIR
            } else {
                0
            },
            reserved: 0,
        };
        let sent = self.io.ctl_send(
            ch.ctl.as_fd(),
            as_bytes(&reply),
            &[ch.region.fd(), ch.doorbell()],
        );
        if let Err(e) = sent {
            warn!("channel {idx}: cannot send region: {e}");
            return;
        }
        let watched = self
            .epoll
            .add(ch.doorbell(), libc::EPOLLIN as u32, token(T_DOORBELL, idx))
            .and_then(|()| {
                self.epoll
                    .add(ch.ctl.as_fd(), libc::EPOLLIN as u32, token(T_CTL, idx))
            });
        if let Err(e) = watched {
            warn!("channel {idx}: cannot watch channel: {e}");
            return;
        }
        debug!(
            "{} channel {idx}: pid {} tid {}",
            self.stats.id, owner.pid, hello.tid
        );
        let mut ch = ch;
        ch.routes = hello.server & HELLO_ROUTES != 0;
        ch.rx_pair = rx_pair;
        self.channels.put(idx, ch);
        self.shared.channel_opened();
    }

    /// Takes what other servers handed this one.
    pub(crate) fn drain_inbox(&mut self) {
        for m in self.shared.inbox[self.index].take() {
            match m {
                Msg::Hello(fd, hello, owner) => self.open_channel(fd, hello, owner),
                Msg::Sock(s) => {
                    let id = s.id;
                    self.stats.sockets_adopted += 1;
                    if let Err(e) = self.install(*s) {
                        warn!("socket {id}: cannot take it over: {e}");
                    }
                }
                Msg::Published(port) => {
                    if let Some(id) = self.listener_for(port) {
                        self.host_event(id, libc::EPOLLIN as u32);
                    }
                }
            }
        }
    }

    /// Copies this server's counters where the assigner and `ferry ctl` read them.
    fn publish_live(&self) {
        let live = &self.shared.live[self.index];
        let outstanding: usize = self
            .socks
            .values()
            .map(|s| s.parked.len() + s.txq.len())
            .sum();
        let set = |a: &std::sync::atomic::AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&live.outstanding, outstanding as u64);
        set(&live.sockets, self.socks.len() as u64);
        set(&live.channels, self.channels.iter().count() as u64);
        set(&live.requests, self.stats.requests);
        set(&live.bytes_out, self.stats.bytes_out);
        set(&live.bytes_in, self.stats.bytes_in);
        set(&live.sleeps, self.stats.sleeps);
        live.cpu.store(ferry_sys::current_cpu(), Ordering::Relaxed);
    }

    /// A channel's peer broke the protocol: close it, keep serving the others.
    pub(crate) fn bad_channel(&mut self, idx: u32, why: &str) {
        warn!("channel {idx}: malformed data from the sandbox ({why}); closing the channel");
        self.stats.bad_channels += 1;
        self.close_channel(idx, "malformed data");
    }

    pub(crate) fn close_channel(&mut self, idx: u32, why: &str) {
        if let Some(mut ch) = self.channels.take(idx) {
            debug!("channel {idx}: {why}");
            self.shared.channel_closed();
            let _ = self.epoll.delete(ch.ctl.as_fd());
            let _ = self.epoll.delete(ch.doorbell());
            ch.stats.pair_sleeps = ch.region.outside_sleep_count(ferry_ring::Side::A);
            self.stats.closed_channel(ch.stats);
            self.modules.channel_closed(idx);
            // Nobody is left to send through this channel: its waiters' fds become
            // writable again (another thread may still have room).
            for id in std::mem::take(&mut ch.room_wait) {
                self.drain_filler(id);
            }
            // Parked operations of this channel have nobody to answer any more.
            for s in self.socks.values_mut() {
                let before = s.parked.len();
                s.parked.retain(|p| p.owner().0 != idx);
                if s.app_closed && s.parked.len() != before {
                    self.dirty.push(s.id);
                }
            }
            // A process that died holding a detached socket closed no descriptor the
            // server could hear of: its channels going is the sign to ask.
            let detached: Vec<u32> = self
                .socks
                .values()
                .filter(|s| s.pair_detached() && !s.app_closed)
                .map(|s| s.id)
                .collect();
            for id in detached {
                if self.app_gone(id) {
                    self.app_closed(id);
                }
            }
        }
    }

    /// A new socket served by server `server` (not registered anywhere yet), made by or
    /// for `owner`; `kind` is (domain, type, protocol). Makes its readiness pair: the
    /// program's end comes back beside the socket, for the reply that gives it to the
    /// program.
    pub(crate) fn new_sock(
        &self,
        server: usize,
        fd: OwnedFd,
        kind: (i32, i32, i32),
        place: Place,
        owner: Owner,
    ) -> io::Result<(Sock, OwnedFd)> {
        let (domain, ty, protocol) = kind;
        let id = self.shared.new_id(server);
        let NewPair { ours, theirs, name } = self.io.new_pair(id)?;
        let sock = Sock {
            id,
            domain,
            ty,
            protocol,
            fd,
            place,
            pair: ours,
            name,
            holders: vec![owner],
            prune_at: 8,
            opts: Vec::new(),
            bound_wild: None,
            contacted: None,
            token: crate::sock::Token::Unwanted,
            pair_end: crate::sock::PairEnd::Open,
            rx_maybe: true,
            rx_ending: false,
            rx_pair: false,
            rx_pending: Vec::new(),
            rx_bulk: false,
            recv_mark: 0,
            parked: Default::default(),
            txq: Default::default(),
            conn: crate::sock::Conn::Idle,
            so_error: 0,
            app_closed: false,
            shut_wr_pending: false,
            hup_reported: false,
            hup_due: false,
            published_listener: None,
            oob_due: false,
            oob_byte: None,
            pair_in_wait: false,
            pair_reset: false,
            filler_due: false,
            last_ch: 0,
            stats: crate::SocketStats {
                id,
                ..Default::default()
            },
            egress: None,
        };
        Ok((sock, theirs))
    }

    /// Registers a socket of this server: its host socket and readiness pair join the
    /// event loop.
    pub(crate) fn install(&mut self, sock: Sock) -> io::Result<()> {
        let id = sock.id;
        self.epoll
            .add(sock.fd.as_fd(), host_events(), token(T_HOST, id))?;
        if let Err(e) = self.epoll.add(
            sock.pair.as_fd(),
            pair_events(sock.rx_pair),
            token(T_PAIR, id),
        ) {
            let _ = self.epoll.delete(sock.fd.as_fd());
            return Err(e);
        }
        self.socks.insert(id, sock);
        Ok(())
    }

    /// Serves `sock` here, or hands it to its server; returns its id. The hand-over
    /// happens before the caller tells the shim the id (see [`crate::group`]).
    pub(crate) fn place_sock(&mut self, sock: Sock) -> io::Result<u32> {
        let id = sock.id;
        let server = ferry_proto::server_of(id);
        if server == self.index {
            self.install(sock)?;
        } else {
            self.stats.sockets_handed += 1;
            self.shared.inbox[server].send(Msg::Sock(Box::new(sock)));
        }
        Ok(id)
    }

    /// Replaces a socket's host socket (provisional → host or sandbox namespace).
    pub(crate) fn replace_host_fd(&mut self, id: u32, fd: OwnedFd, place: Place) -> io::Result<()> {
        let io = self.io;
        let s = self
            .socks
            .get_mut(&id)
            .expect("caller checked the socket exists");
        for (level, name, value) in &s.opts {
            if let Err(e) = io.setsockopt(fd.as_fd(), *level, *name, value) {
                debug!("socket {id}: replaying option {level}/{name}: {e}");
            }
        }
        let _ = self.epoll.delete(s.fd.as_fd());
        self.epoll
            .add(fd.as_fd(), host_events(), token(T_HOST, id))?;
        s.fd = fd;
        s.place = place;
        s.rx_maybe = true;
        Ok(())
    }

    /// Our end of socket `id`'s pair reported `events` with `EPOLLHUP` or `EPOLLERR`:
    /// whether the program's end is still open. The hang-up means the program has
    /// closed its last descriptor (the kernel shuts both of our directions then), unless
    /// we shut both ourselves (`Server::mirror_hup`) or closed our end (`detach_pair`);
    /// then the pair's name says. `EPOLLERR` (the program's end went with bytes unread)
    /// always means closed.
    fn pair_alive(&mut self, id: u32, events: u32) -> bool {
        events & libc::EPOLLERR as u32 == 0
            && self
                .socks
                .get(&id)
                .is_some_and(|s| s.pair_end == PairEnd::Hup || s.pair_detached())
            && self.app_alive(id)
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
        s.conn = Conn::Failed { reported: false };
        drop(std::mem::replace(&mut s.pair, placeholder));
    }

    /// `CtlKind::Renew`: stream `id`, whose pair was detached when a non-blocking
    /// connect failed and which the kernel has reset since, connects again: it gets a
    /// new pair (a new name), joins the loop as a new socket's does, and starts over
    /// as unconnected. Returns the program's end.
    pub(crate) fn renew_pair(&mut self, id: u32) -> Result<OwnedFd, Errno> {
        let Some(s) = self.socks.get(&id) else {
            return Err(Errno(libc::EBADF));
        };
        if s.conn != (Conn::Failed { reported: true }) || !s.is_stream() {
            return Err(Errno(libc::EINVAL));
        }
        let NewPair { ours, theirs, name } = self.io.new_pair(id).map_err(|e| Errno::of(&e))?;
        self.epoll
            .add(ours.as_fd(), pair_events(s.rx_pair), token(T_PAIR, id))
            .map_err(|e| Errno::of(&e))?;
        let s = self.socks.get_mut(&id).expect("looked up above");
        s.pair = ours;
        s.name = name;
        s.conn = Conn::Idle;
        s.hup_due = false;
        s.pair_end = PairEnd::Open;
        s.hup_reported = false;
        s.rx_ending = false;
        s.filler_due = false;
        s.pair_reset = false;
        s.so_error = 0;
        s.rx_maybe = true;
        debug!("socket {id}: readiness pair renewed to connect again");
        Ok(theirs)
    }

    /// Whether the program has closed its last descriptor of socket `id`, asked now
    /// (our end of the pair has hung up, and not by our own doing).
    pub(crate) fn app_gone(&mut self, id: u32) -> bool {
        let io = self.io;
        let Some(s) = self.socks.get(&id) else {
            return false;
        };
        let rev = u32::from(io.poll_now(s.pair.as_fd(), 0).unwrap_or(0).cast_unsigned());
        rev & (libc::POLLHUP | libc::POLLERR) as u32 != 0 && !self.pair_alive(id, rev)
    }

    /// Whether the program's end of socket `id`'s pair is still open, from its name in
    /// the server's network namespace: binding the probe to it fails with `EADDRINUSE`
    /// while any process holds that end (the name goes with its last descriptor, and
    /// names are never used twice). When the probe cannot be made or bound, the end
    /// counts as open: the socket is then released when the sandbox ends, not before.
    fn app_alive(&mut self, id: u32) -> bool {
        let Some(name) = self.socks.get(&id).map(|s| s.name) else {
            return false;
        };
        let probe = match self.name_probe.take() {
            Some(p) => p,
            None => match self.io.unix_socket() {
                Ok(p) => p,
                Err(e) => {
                    warn!("socket {id}: cannot make a name probe: {e}");
                    return true;
                }
            },
        };
        match self.io.bind_abstract(probe.as_fd(), &name) {
            // The name was free: the end is gone (dropping the probe frees it again).
            Ok(()) => false,
            Err(e) => {
                if e.raw_os_error() != Some(libc::EADDRINUSE) {
                    warn!("socket {id}: name probe: {e}");
                }
                self.name_probe = Some(probe);
                true
            }
        }
    }

    pub(crate) fn app_closed(&mut self, id: u32) {
        let io = self.io;
        let Some(s) = self.socks.get_mut(&id).filter(|s| !s.app_closed) else {
            return;
        };
        s.app_closed = true;
        let mut reset = false;
        if s.rx_pair && s.connected() {
            // Closed with bytes unread (the kernel marks our end ECONNRESET when the
            // program's end goes with data queued): the peer gets a reset, as from a
            // kernel socket closed with unread data.
            reset = s.pair_reset
                || !s.rx_pending.is_empty()
                || io
                    .getsockopt_int(s.pair.as_fd(), libc::SOL_SOCKET, libc::SO_ERROR)
                    .is_ok_and(|e| e == libc::ECONNRESET);
            if reset {
                let _ = io.linger_reset(s.fd.as_fd());
            }
        }
        let _ = self.epoll.delete(s.pair.as_fd());
        self.dirty.push(id);
        if !reset {
            // What the program wrote into its end before closing it still goes out.
            self.pair_input(id);
        }
    }

    /// Finishes state changes noticed during the turn: closes sockets whose program side
    /// is gone and whose sends are done.
    pub(crate) fn settle_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for id in dirty {
            let Some(s) = self.socks.get(&id) else {
                continue;
            };
            // A thread still blocked on the socket keeps it, as with the kernel (a close
            // in another thread does not end a blocked recv). A module writes its output
            // first.
            let idle = s.app_closed && s.txq.is_empty() && !s.pair_in_wait && s.parked.is_empty();
            if idle && self.module_settled(id) {
                let s = self.socks.remove(&id).expect("just looked it up");
                self.shared.socket_closed();
                if let Some(port) = s.published_listener
                    && self.shared.listener_down(port) == 0
                {
                    self.refuse_waiting(port);
                }
                let _ = self.epoll.delete(s.fd.as_fd());
                self.stats.closed_socket(s.stats);
                debug!("socket {id}: closed");
            }
        }
    }

    fn shutdown(&mut self) {
        // Whatever the sandbox closed (or died holding) is released now; what is left open
        // after this is counted, so a leak shows in the stats.
        self.drain_rings();
        self.reap_closed();
        self.stats.open_at_stop = self.socks.len() as u64;
        // Push out what the sandbox queued before it went away, briefly.
        let deadline = Instant::now() + std::time::Duration::from_millis(500);
        while Instant::now() < deadline
            && (self
                .socks
                .values()
                .any(|s| !s.txq.is_empty() || s.pair_in_wait)
                || self.modules.busy())
        {
            self.drain_rings();
            let ids: Vec<u32> = self.socks.keys().copied().collect();
            for id in ids {
                self.flush_tx(id);
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        for idx in 0..self.channels.slots() {
            self.close_channel(idx, "server stopping");
        }
        // Sockets handed over but never taken (the stop came first) are closed here.
        for m in self.shared.inbox[self.index].take() {
            if let Msg::Sock(s) = m {
                self.stats.closed_socket(s.stats);
            }
        }
        if self.listener.is_some() {
            let _ = std::fs::remove_file(&self.cfg.socket_path);
        }
        info!("{} stopped", self.stats.id);
    }

    fn collect_stats(mut self) -> ServerStats {
        if let Some(d) = &self.dns {
            self.stats.dns_queries = d.queries;
            self.stats.dns_answers = d.answers;
            self.stats.dns_tcp = d.tcp_connections;
        }
        self.stats.udp_published_in = self.udp_flows.inbound;
        self.stats.udp_published_out = self.udp_flows.outbound;
        self.stats.udp_published_dropped = self.udp_flows.dropped;
        let socks: Vec<_> = self.socks.values().map(|s| s.stats).collect();
        self.stats.sockets.extend(socks);
        self.stats.sockets.sort_by_key(|s| s.id);
        self.stats.channels.sort_by_key(|c| c.id);
        std::mem::take(&mut self.stats)
    }

    fn publish_event(&mut self, i: usize) {
        loop {
            let (fd, port) = &self.published[i];
            match ferry_sys::accept4(fd.as_fd(), libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) {
                Ok((conn, peer)) => {
                    debug!("published port {port}: connection from {peer:?}");
                    let port = *port;
                    if !self.shared.has_listener(port) {
                        // Nothing in the sandbox listens there through ferry (yet): the
                        // connection waits at most `UNSERVED_GRACE` for a listener.
                        self.unserved = true;
                    }
                    let mut queue = lock(&self.shared.published);
                    match queue.iter_mut().find(|(p, _)| *p == port) {
                        Some(q) if q.1.len() >= MAX_WAITING => {
                            drop(queue);
                            let _ = ferry_sys::linger_reset(conn.as_fd());
                            self.stats.published_refused += 1;
                            if let Some(n) = self.refusals.tick() {
                                warn!(
                                    "published port {port}: {MAX_WAITING} connections already wait for the sandbox to accept them: one more refused ({n} since the last line)"
                                );
                            }
                            continue;
                        }
                        Some(q) => q.1.push_back((conn, Instant::now())),
                        None => {}
                    }
                    drop(queue);
                    // The sandbox's listener may be served by any server.
                    for (k, inbox) in self.shared.inbox.iter().enumerate() {
                        if k != self.index {
                            inbox.send(Msg::Published(port));
                        }
                    }
                    if let Some(id) = self.listener_for(port) {
                        self.host_event(id, libc::EPOLLIN as u32);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    self.published_datagrams(i);
                    return;
                }
                Err(e) => {
                    // Out of descriptors, say: the connection stays queued. The
                    // listener is level-triggered, so the next turn tries again; the
                    // log says so once a second at most.
                    if let Some(n) = self.refusals.tick() {
                        warn!("published port {port}: accept: {e} ({n} since the last line)");
                    }
                    return;
                }
            }
        }
    }

    /// The last listener on published `port` went: the connections waiting for it are
    /// reset (the kernel does the same to a closed listener's queue).
    pub(crate) fn refuse_waiting(&mut self, port: u16) {
        let waiting: Vec<(OwnedFd, Instant)> = lock(&self.shared.published)
            .iter_mut()
            .filter(|(p, _)| *p == port)
            .flat_map(|(_, q)| q.drain(..))
            .collect();
        for (conn, _) in waiting {
            let _ = ferry_sys::linger_reset(conn.as_fd());
            self.stats.published_refused += 1;
        }
    }

    /// Resets connections that waited [`UNSERVED_GRACE`] on a published port where
    /// nothing in the sandbox listens through ferry (a program ferry cannot serve may
    /// listen there: the client gets a refusal instead of a connection that hangs).
    fn expire_unserved(&mut self) {
        let now = Instant::now();
        let mut refused = Vec::new();
        let mut still = false;
        for (port, q) in lock(&self.shared.published).iter_mut() {
            if q.is_empty() || self.shared.has_listener(*port) {
                continue;
            }
            while let Some((_, at)) = q.front() {
                if now.duration_since(*at) < UNSERVED_GRACE {
                    still = true;
                    break;
                }
                let (conn, _) = q.pop_front().expect("front exists");
                refused.push((*port, conn));
            }
        }
        self.unserved = still;
        for (port, conn) in refused {
            let peer = ferry_sys::sock_addr(conn.as_fd(), true).ok().flatten();
            let _ = ferry_sys::linger_reset(conn.as_fd());
            self.stats.published_refused += 1;
            if let Some(n) = self.refusals.tick() {
                warn!(
                    "published port {port}: nothing in the sandbox listens on port {port} through ferry (a program ferry cannot serve, static or Go, is not reachable until nic mode): connection from {} refused ({n} since the last line)",
                    peer.map_or_else(|| "?".into(), |p| p.to_string())
                );
            }
        }
    }

    /// The host socket of published port `i`.
    pub(crate) fn published_fd(&self, i: usize) -> std::os::fd::BorrowedFd<'_> {
        self.published[i].0.as_fd()
    }

    /// The sandbox port published port `i` feeds.
    pub(crate) fn published_port(&self, i: usize) -> u16 {
        self.published[i].1
    }

    /// The sandbox listener a published port feeds.
    pub(crate) fn listener_for(&self, port: u16) -> Option<u32> {
        let io = self.io;
        self.socks
            .values()
            .find(|s| {
                s.listening()
                    && io
                        .sock_addr(s.fd.as_fd(), false)
                        .ok()
                        .flatten()
                        .is_some_and(|a| a.port() == port)
            })
            .map(|s| s.id)
    }

    /// A connection accepted on a published port that waits for `listener`.
    pub(crate) fn take_published(&mut self, listener: u32) -> Option<(OwnedFd, u16)> {
        let io = self.io;
        let port = io
            .sock_addr(self.socks.get(&listener)?.fd.as_fd(), false)
            .ok()
            .flatten()?
            .port();
        let conn = lock(&self.shared.published)
            .iter_mut()
            .find(|(p, q)| *p == port && !q.is_empty())?
            .1
            .pop_front()
            .map(|(fd, _)| fd)?;
        Some((conn, port))
    }

    pub(crate) fn has_published(&self, listener: u32) -> bool {
        let io = self.io;
        // Asked on every token check: no getsockname when nothing is published.
        if !self.shared.any_published {
            return false;
        }
        let Some(s) = self.socks.get(&listener) else {
            return false;
        };
        let Some(port) = io
            .sock_addr(s.fd.as_fd(), false)
            .ok()
            .flatten()
            .map(|a| a.port())
        else {
            return false;
        };
        lock(&self.shared.published)
            .iter()
            .any(|(p, q)| *p == port && !q.is_empty())
    }
}

/// What the loop watches on our end of a socket's readiness pair.
fn pair_events(rx_pair: bool) -> u32 {
    if rx_pair {
        // Room in the pair resumes a pump that stopped on a full pair; bytes from the
        // program's end are its writes the shim did not see.
        (libc::EPOLLRDHUP | libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLET).cast_unsigned()
    } else {
        libc::EPOLLRDHUP as u32
    }
}

fn host_events() -> u32 {
    (libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET)
        .cast_unsigned()
}

/// Whether `pid` is `ancestor` or one of its descendants (walking `/proc/PID/stat`).
pub fn descends_from(mut pid: i32, ancestor: i32) -> bool {
    for _ in 0..4096 {
        if pid == ancestor {
            return true;
        }
        if pid <= 1 {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // "pid (comm) state ppid …": comm may contain anything, so parse after the last ')'.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        else {
            return false;
        };
        pid = ppid;
    }
    false
}

/// When process `pid` started (`/proc/PID/stat`'s `starttime`, in clock ticks since
/// boot); `None` when it does not exist.
pub(crate) fn process_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid …": starttime is the 20th field after the comm.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

pub(crate) fn as_bytes<T: bytemuck::Pod>(v: &T) -> &[u8] {
    bytemuck::bytes_of(v)
}

impl Server {
    /// Channel `ch`, if it is open.
    pub(crate) fn chan(&self, ch: u32) -> Option<&Channel> {
        self.channels.get(ch)
    }

    /// Channel `ch`, if it is open.
    pub(crate) fn chan_mut(&mut self, ch: u32) -> Option<&mut Channel> {
        self.channels.get_mut(ch)
    }

    pub(crate) fn sock(&mut self, id: u32) -> Option<&mut Sock> {
        self.socks.get_mut(&id)
    }

    /// Answers a control request with a reply message and the program's end of a new
    /// socket's pair. A reply that cannot be sent loses the descriptor: the program's
    /// end is then closed, and the socket goes with it as any closed socket does.
    pub(crate) fn ctl_reply_fd(&self, ch: u32, reply: Ctl, fd: OwnedFd) {
        let io = self.io;
        if let Some(c) = self.chan(ch)
            && let Err(e) = io.ctl_send(c.ctl.as_fd(), as_bytes(&reply), &[fd.as_fd()])
        {
            debug!("channel {ch}: control reply lost: {e}");
        }
    }

    /// Answers a control request with a reply message (and no descriptors).
    pub(crate) fn ctl_reply(&self, ch: u32, reply: Ctl) {
        let io = self.io;
        if let Some(c) = self.chan(ch)
            && let Err(e) = io.ctl_send(c.ctl.as_fd(), as_bytes(&reply), &[])
        {
            debug!("channel {ch}: control reply lost: {e}");
        }
    }

    pub(crate) fn new_reply(result: impl Into<crate::ops::Answer>) -> Ctl {
        Ctl {
            result: result.into().0,
            ..Ctl::new(CtlKind::Reply, 0)
        }
    }

    /// Takes the first parked operation matching `pred`.
    pub(crate) fn unpark(&mut self, id: u32, pred: impl Fn(&Parked) -> bool) -> Option<Parked> {
        let s = self.socks.get_mut(&id)?;
        let i = s.parked.iter().position(pred)?;
        s.parked.remove(i)
    }
}
