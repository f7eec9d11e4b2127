//! One protocol server's event loop and the state it owns (`Server`): making it, the
//! loop itself (drain the rings, spin or sleep in epoll, dispatch each event to its
//! owner), the live counters, stopping. Its parts live beside it: control connections
//! and channels (`control.rs`, `channel.rs`), the socket table (`table.rs`), published
//! ports (`published.rs`), requests (`ops.rs`) and the socket modules (`connect.rs`,
//! `tx.rs`, `rx.rs`); see docs/DESIGN.md, "Server core". Must not: hold socket logic of
//! its own, or block anywhere but in its epoll wait.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ferry_proto::{Call, Ctl, CtlKind, ProtoError};
use ferry_sys::{Epoll, Event};
use tracing::{debug, info, warn};

use crate::channel::{Channel, Channels, Next};
use crate::group::{Handle, Msg, Shared, server_name};
use crate::seam::Io;
use crate::sock::{Owner, Parked, Sock};
use crate::stats::ServerStats;
use crate::{Config, Error, LogThrottle, SandboxSocketFn};

/// Epoll token kinds (top byte of the token; the low 32 bits carry an index).
pub(crate) const T_LISTEN: u64 = 1;
pub(crate) const T_CTL: u64 = 2;
pub(crate) const T_DOORBELL: u64 = 3;
pub(crate) const T_HOST: u64 = 4;
pub(crate) const T_PAIR: u64 = 5;
pub(crate) const T_PUBLISH: u64 = 6;
pub(crate) const T_INBOX: u64 = 7;
pub(crate) const T_HELLO: u64 = 8;
pub(crate) const T_DNS_IN: u64 = 9;
pub(crate) const T_DNS_UP: u64 = 10;
pub(crate) const T_DNS_TCP: u64 = 11;
pub(crate) const T_UDP_FLOW: u64 = 12;
/// Most connections of one published port that wait for the sandbox to accept them;
/// more are refused.
pub(crate) const MAX_WAITING: usize = 8192;
/// How long a connection to a published port waits for a listener in the sandbox when
/// there is none (the program may still be starting) before it is refused.
pub(crate) const UNSERVED_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a control connection may take to say Hello before it is closed.
pub(crate) const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Most control connections waiting for their Hello at once (the oldest gives way).
pub(crate) const MAX_PENDING_HELLO: usize = 64;

/// A small index (of a published port, a DNS socket) as an epoll token's index.
pub(crate) fn index_u32(i: usize) -> u32 {
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
    pub(crate) listener: Option<OwnedFd>,
    pub(crate) channels: Channels,
    pub(crate) socks: HashMap<u32, Sock>,
    /// Host listeners of published ports (the first server only) and the sandbox port
    /// each feeds; the accepted connections wait in [`Shared::published`].
    pub(crate) published: Vec<(OwnedFd, u16)>,
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
    pub(crate) pending_hello: HashMap<u32, (OwnedFd, Owner, Instant)>,
    pub(crate) next_hello: u32,
    /// Only this process and its descendants may open channels.
    pub(crate) init_pid: Option<i32>,
    /// The sandbox's DNS forwarder, when enabled.
    pub(crate) dns: Option<crate::dns::Dns>,
    /// Sockets whose program-written pair bytes wait for this pass over the rings
    /// (see `Server::pair_input`).
    pub(crate) pair_resume: Vec<u32>,
    /// Data-path modules bound to sockets (`modules.rs`).
    pub(crate) modules: crate::modules::Modules,
    /// An unbound unix socket of the server's namespace: binding it to a pair's name
    /// tells whether the program's end is still open (see `app_alive`).
    pub(crate) name_probe: Option<OwnedFd>,
    /// The host's own addresses, for the bind and source rules (`reach.rs`).
    pub(crate) host_addrs: ferry_egress::HostAddrs,
    /// Log lines about refused control connections and sockets, at most one a second.
    pub(crate) refusals: LogThrottle,
    /// Connections to published ports wait with no listener in the sandbox
    /// ([`Server::expire_unserved`]).
    pub(crate) unserved: bool,
    /// `take_earlier_records` is taking other channels' records (it does not nest).
    pub(crate) taking_earlier: bool,
    /// Flows of the published UDP ports (the first server only).
    pub(crate) udp_flows: crate::udp_publish::Flows,
    /// Log lines about requests for sockets a process does not hold, likewise.
    pub(crate) strangers: LogThrottle,
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
            taking_earlier: false,
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
            while self.take_record(idx) {
                total += 1;
            }
        }
        self.flush_pending();
        for id in std::mem::take(&mut self.pair_resume) {
            self.pair_input(id);
        }
        total
    }

    /// Takes and handles channel `idx`'s next record; false when there is none to
    /// take now (empty, throttled, gone or broken).
    fn take_record(&mut self, idx: u32) -> bool {
        match self.channels.next_request(idx) {
            Next::Record(rec) => {
                self.stats.requests += 1;
                let handled = Call::decode(&rec)
                    .map_err(ProtoError::from)
                    .and_then(|call| self.handle(idx, call));
                if let Err(why) = handled {
                    self.bad_channel(idx, &why.to_string());
                }
                true
            }
            Next::Throttled(first) => {
                self.stats.backpressure += u64::from(first);
                false
            }
            Next::Empty => false,
            Next::Broken(why) => {
                self.bad_channel(idx, &why);
                false
            }
        }
    }

    /// `Op::Order` from channel `ch`: takes every record the other channels have
    /// published by now. The thread that asked waits for the answer, so none of its
    /// later records can be among those overtaken; what the others published before it
    /// asked (a send that returned before this thread's send began) goes first, and
    /// what they publish concurrently may go either way, as with the kernel. Costs a
    /// load of each other ring's index; not nested (the records taken here do not take
    /// others first).
    pub(crate) fn take_earlier_records(&mut self, ch: u32) {
        if self.taking_earlier || !self.channels.others_pending(ch) {
            return;
        }
        self.taking_earlier = true;
        let fence = self.channels.fence(Some(ch));
        for (idx, serial, taken) in fence.marks() {
            while self.channels.behind(idx, serial, taken) && self.take_record(idx) {}
        }
        self.taking_earlier = false;
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
            d.count_into(&mut self.stats);
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
}

/// What the loop watches on our end of a socket's readiness pair.
pub(crate) fn pair_events(rx_pair: bool) -> u32 {
    if rx_pair {
        // Room in the pair resumes a pump that stopped on a full pair; bytes from the
        // program's end are its writes the shim did not see.
        (libc::EPOLLRDHUP | libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLET).cast_unsigned()
    } else {
        libc::EPOLLRDHUP as u32
    }
}

pub(crate) fn host_events() -> u32 {
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
