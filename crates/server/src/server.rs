//! One protocol server's event loop and the state it owns (`Server`): making it, the
//! loop itself (drain the rings, spin or sleep in epoll, dispatch each event to its
//! owner), the live counters, stopping. Its parts live beside it: control connections
//! and channels (`control.rs`, `channel.rs`), the socket table (`table.rs`), published
//! ports (`published.rs`), requests (`ops.rs`) and the socket modules (`connect.rs`,
//! `tx.rs`, `rx.rs`); see docs/DESIGN.md, "Server core". Must not: hold socket logic of
//! its own, or block anywhere but in its epoll wait.

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferry_proto::{Call, ProtoError};
use ferry_ring::{AdaptiveSpin, YieldPacer};
use ferry_sys::{Epoll, Event};
use tracing::{info, warn};

use crate::channel::{Channels, Next};
use crate::control::{ControlConns, HELLO_TIMEOUT};
use crate::group::{Handle, Live, Msg, Shared, server_name};
use crate::published::PublishedPorts;
use crate::seam::Io;
use crate::stats::ServerStats;
use crate::table::SockTable;
use crate::token::{
    T_CTL, T_DNS_IN, T_DNS_TCP, T_DNS_UP, T_DOORBELL, T_HELLO, T_HOST, T_INBOX, T_LISTEN, T_PAIR,
    T_PUBLISH, T_UDP_FLOW, index_u32, token,
};
use crate::{Config, Error, LogThrottle, SandboxSocketFn};

/// Busy-wait hints in an idle spin turn that does not yield: about as long as a
/// `sched_yield` with nothing else to run.
const SERVER_GAP_SPINS: u32 = 10;

/// How long a server is idle before it does the work it put off (closing what
/// `table.rs`'s `Closing` holds, making `connect.rs`'s spare TCP socket): longer than a
/// program takes to send the request that follows an answer (a `connect` after its
/// `socket`), so that work does not delay that request.
const PUT_OFF: Duration = Duration::from_micros(10);

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
    /// The control socket and connections waiting for their Hello (`control.rs`).
    pub(crate) control: ControlConns,
    pub(crate) channels: Channels,
    /// The sockets, and the work noticed on them for later in the turn (`table.rs`).
    pub(crate) socks: SockTable,
    /// Published ports (host listeners: the first server only); the accepted
    /// connections wait in [`Shared::published`].
    pub(crate) published: PublishedPorts,
    pub(crate) stats: ServerStats,
    /// `epoll_wait` calls returned so far: orders host events against receives (see
    /// `RecvSide::mark`).
    pub(crate) waits: u64,
    /// `rx_pair`: where host bytes land on their way into a pair.
    pub(crate) scratch: crate::rx::RxScratch,
    /// The sandbox's DNS forwarder, when enabled.
    pub(crate) dns: Option<crate::dns::Dns>,
    /// Data-path modules bound to sockets (`modules.rs`).
    pub(crate) modules: crate::modules::Modules,
    /// The host's own addresses, for the bind and source rules (`reach.rs`).
    pub(crate) host_addrs: ferry_egress::HostAddrs,
    /// Log lines about refused control connections and sockets, at most one a second.
    pub(crate) refusals: LogThrottle,
    /// `take_earlier_records` is taking other channels' records (it does not nest).
    pub(crate) taking_earlier: bool,
    /// Log lines about requests for sockets a process does not hold, likewise.
    pub(crate) strangers: LogThrottle,
    /// The TCP socket made ahead in an idle turn (`connect.rs`).
    pub(crate) spares: crate::connect::Spares,
    /// Connected streams closed in an idle turn (`table.rs`).
    pub(crate) closing: crate::table::Closing,
    /// Detached sockets a closed channel's process may have held (`recheck.rs`).
    pub(crate) rechecks: crate::recheck::Rechecks,
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
        let (control, published) = if index == 0 {
            let control = ControlConns::bind(&cfg, &epoll)?;
            (control, PublishedPorts::bind(&cfg, &epoll)?)
        } else {
            Default::default()
        };
        Server::assemble(
            cfg,
            shared,
            index,
            epoll,
            control,
            published,
            &crate::seam::SYS,
        )
    }

    /// A server of its own group that serves channels opened in-process
    /// ([`ChannelLife::open_channel`](crate::control::ChannelLife::open_channel)) and makes every call through `io`: no control socket,
    /// no published ports (the harness of `testkit.rs`).
    pub(crate) fn in_process(mut cfg: Config, io: &'static dyn Io) -> Result<Server, Error> {
        cfg.servers = 1;
        let sandbox: SandboxSocketFn = Box::new(move |d, t, p| io.socket(d, t, p));
        let shared = Arc::new(Shared::new(&cfg, sandbox)?);
        let epoll = Epoll::new(256).map_err(Error::EventLoop)?;
        Server::assemble(
            cfg,
            shared,
            0,
            epoll,
            Default::default(),
            Default::default(),
            io,
        )
    }

    fn assemble(
        cfg: Config,
        shared: Arc<Shared>,
        index: usize,
        epoll: Epoll,
        control: ControlConns,
        published: PublishedPorts,
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
            control,
            channels: Channels::default(),
            socks: SockTable::default(),
            published,
            stats,
            waits: 0,
            scratch: Default::default(),
            dns: None,
            modules,
            host_addrs: Default::default(),
            refusals: LogThrottle::default(),
            taking_earlier: false,
            strangers: LogThrottle::default(),
            spares: Default::default(),
            closing: Default::default(),
            rechecks: Default::default(),
        })
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
        let mut pacer = YieldPacer::new();
        let mut spin = AdaptiveSpin::new(self.cfg.server_spin);
        let mut idled = false;
        self.shared.live[self.index]
            .tid
            .store(ferry_sys::gettid().cast_signed(), Ordering::Release);
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.stats.turns += 1;
            let did = self.drain_rings();
            if did == 0 {
                self.modules.idle();
            }
            if self.stats.turns.is_multiple_of(64) {
                publish_live(
                    &self.shared.live[self.index],
                    &self.socks,
                    &self.channels,
                    &self.stats,
                );
                self.control.expire(&self.epoll);
            }
            let busy = did > 0 || last_work.elapsed() < spin.budget();
            if !busy {
                // About to sleep: what was put off is done now.
                self.closing.close_all();
                self.put_off_work(Duration::MAX);
            }
            self.wait_events(busy, &mut events);
            if did == 0 && events.is_empty() {
                idled = true;
                self.stats.spin_turns += 1;
                let quiet = last_work.elapsed();
                if quiet >= PUT_OFF && (self.closing.any() || self.spares.due(quiet)) {
                    // Nothing to do for a while: what was put off is done now, off the
                    // way of requests.
                    self.put_off_work(quiet);
                } else {
                    // S0's SBW polls with schedule(): on a machine with few cores the
                    // thread we wait for (the program, the peer, softirq) may need this
                    // very CPU. A yield that ran nothing else is followed by a few turns
                    // without (`YieldPacer`): the thread waited for runs on the other CPU.
                    pacer.pause(SERVER_GAP_SPINS);
                }
            } else {
                let now = Instant::now();
                if std::mem::take(&mut idled) {
                    // How long this server waited for work: its spin budget follows.
                    spin.waited(now.saturating_duration_since(last_work));
                }
                last_work = now;
            }
            for ev in events.drain(..) {
                self.dispatch(ev);
            }
            self.drain_rings();
            if self.rechecks.pending() {
                self.channel_life().recheck_detached();
            }
            self.settle_dirty();
            self.channels.flush_all();
            if self.closing.overdue() {
                self.closing.close_all();
            }
        }
        self.shutdown();
        self.collect_stats()
    }

    /// One piece of the work put off for a turn with nothing to do (so that an event
    /// waits for one piece at most): making the spare TCP socket (`Spares`: the next
    /// `socket()` waits for it) when due after `quiet` without work, else closing a
    /// connected stream the program closed (`Closing`).
    pub(crate) fn put_off_work(&mut self, quiet: Duration) {
        if self.spares.due(quiet) {
            self.spares
                .make(self.io, &self.epoll, &self.shared, self.index);
        } else if self.closing.any() {
            self.closing.close_one();
        }
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
            publish_live(
                &self.shared.live[self.index],
                &self.socks,
                &self.channels,
                &self.stats,
            );
            -1
        } else {
            0
        };
        events.clear();
        // A detached socket to ask about again (`recheck.rs`) bounds any sleep.
        let recheck = self.rechecks.sleep_at_most(Instant::now());
        let at_most = |d: Duration| recheck.map_or(d, |r| r.min(d));
        let waited = if timeout < 0 && self.cfg.batch > 1 {
            // S1's flush on a maximum delay: a shim may hold back its doorbell, so
            // never sleep longer than the delay it was promised.
            self.epoll.wait_for(at_most(self.cfg.batch_delay), events)
        } else if timeout < 0 && (self.control.waiting() || self.published.unserved()) {
            // A connection that never says Hello is closed in time; so is one to a
            // published port nothing in the sandbox serves.
            self.control.expire(&self.epoll);
            self.published.expire_unserved(&self.shared);
            self.epoll.wait_for(at_most(HELLO_TIMEOUT / 2), events)
        } else if let Some(d) = recheck.filter(|_| timeout < 0) {
            self.epoll.wait_for(d, events)
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
        self.tx().flush_pending();
        for id in self.socks.take_pair_resume() {
            self.tx().pair_input(id);
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

    fn dispatch(&mut self, ev: Event) {
        let idx = (ev.token & 0xffff_ffff) as u32;
        match ev.token >> 56 {
            T_LISTEN => self.channel_life().accept_channels(),
            T_CTL => self.ctl_readable(idx, ev.events),
            T_DOORBELL => {
                if let Some(ch) = self.channels.get_mut(idx) {
                    let _ = ferry_sys::eventfd_drain(ch.doorbell());
                    ch.stats.doorbells += 1;
                }
            }
            T_HOST => self.host_event(idx, ev.events),
            T_PAIR => self.rx().pair_event(idx, ev.events),
            T_PUBLISH => self.publish_event(idx as usize),
            T_UDP_FLOW => self.published.flow_event(idx),
            T_HELLO => self.channel_life().hello(idx),
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

    fn shutdown(&mut self) {
        // Whatever the sandbox closed (or died holding) is released now; what is left open
        // after this is counted, so a leak shows in the stats.
        self.drain_rings();
        self.reap_closed();
        self.stats.open_at_stop = self.socks.len() as u64;
        // Push out what the sandbox queued before it went away, briefly.
        let deadline = Instant::now() + std::time::Duration::from_millis(500);
        while Instant::now() < deadline && (self.socks.sending() || self.modules.busy()) {
            self.drain_rings();
            let ids = self.socks.ids();
            for id in ids {
                self.tx().flush_tx(id);
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        for idx in 0..self.channels.slots() {
            self.channel_life().close_channel(idx, "server stopping");
        }
        // Sockets handed over but never taken (the stop came first) are closed here.
        for m in self.shared.inbox[self.index].take() {
            if let Msg::Sock(s) = m {
                self.stats.closed_socket(s.stats);
            }
        }
        if self.control.bound() {
            let _ = std::fs::remove_file(&self.cfg.socket_path);
        }
        info!("{} stopped", self.stats.id);
    }

    fn collect_stats(mut self) -> ServerStats {
        if let Some(d) = &self.dns {
            d.count_into(&mut self.stats);
        }
        self.published.count_into(&mut self.stats);
        self.control.count_into(&mut self.stats);
        let socks: Vec<_> = self.socks.values().map(|s| s.stats).collect();
        self.stats.sockets.extend(socks);
        self.stats.sockets.sort_by_key(|s| s.id);
        self.stats.channels.sort_by_key(|c| c.id);
        std::mem::take(&mut self.stats)
    }
}

/// Copies this server's counters where the assigner and `ferry ctl` read them.
fn publish_live(live: &Live, socks: &SockTable, channels: &Channels, stats: &ServerStats) {
    let outstanding = socks.outstanding();
    let set = |a: &std::sync::atomic::AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
    set(&live.outstanding, outstanding as u64);
    set(&live.sockets, socks.len() as u64);
    set(&live.channels, channels.iter().count() as u64);
    set(&live.requests, stats.requests);
    set(&live.bytes_out, stats.bytes_out);
    set(&live.bytes_in, stats.bytes_in);
    set(&live.sleeps, stats.sleeps);
    live.cpu.store(ferry_sys::current_cpu(), Ordering::Relaxed);
}
