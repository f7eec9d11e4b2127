//! Several protocol servers for one sandbox (S4): what they share, how a new socket is
//! assigned to one of them, and the live view `ferry ctl` reads.
//!
//! Each server is one thread with its own event loop, channels and socket table (see
//! [`crate::server`]). A shim thread opens one channel per server it talks to; a socket's
//! id carries its server in its low [`SERVER_BITS`](ferry_proto::SERVER_BITS) bits, so
//! the shim sends every call of a socket to that socket's server without asking.
//!
//! **Assignment.** A socket is assigned when it is created (and an accepted connection
//! when it is accepted): the server that receives the request asks [`Shared::pick`] for a
//! target — the server with the fewest outstanding requests (parked operations plus
//! queued sends; ties go to the one with fewer sockets), round-robin, or a hash (of the
//! creating thread, or of an accepted connection's peer). A socket made for another
//! server is handed over whole through that server's [`Inbox`] *before* the shim learns
//! its id, so by the time a request for it can arrive the socket is in the inbox; a
//! server that meets an unknown id of its own drains its inbox first.
//!
//! **Moving a server** to another CPU is a change of its thread's affinity: the thread
//! keeps its state and its rings, so nothing is lost or re-ordered (S4 moved a process;
//! here the kernel migrates the thread at its next scheduling point).
//!
//! Must not: share a socket table or channel between servers (a socket has one server;
//! a hand-over moves it whole), or take a lock on a server's hot path but the inboxes'.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ferry_counters::LiveStats;
use ferry_proto::{Hello, MAX_SERVERS, SERVER_BITS};

use crate::sock::Sock;
use crate::{Config, Error, SandboxSocketFn, Server, ServerStats};

/// How new sockets are spread over the servers (`ferry run --assign`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Assign {
    /// The server with the fewest outstanding requests (S4's choice).
    #[default]
    Least,
    /// Each server in turn.
    RoundRobin,
    /// A hash of the creating thread (a thread's sockets stay together) or, for an
    /// accepted connection, of its peer address.
    Hash,
}

impl std::str::FromStr for Assign {
    type Err = String;
    fn from_str(s: &str) -> Result<Assign, String> {
        match s {
            "least" => Ok(Assign::Least),
            "rr" => Ok(Assign::RoundRobin),
            "hash" => Ok(Assign::Hash),
            other => Err(format!("`{other}` is not least, rr or hash")),
        }
    }
}

/// Where accepted connections go (`ferry run --accepted`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accepted {
    /// Assigned like new sockets (spreads a busy listener's clients over the servers).
    #[default]
    Assign,
    /// Served by the listener's server (no hand-over).
    Listener,
}

impl std::str::FromStr for Accepted {
    type Err = String;
    fn from_str(s: &str) -> Result<Accepted, String> {
        match s {
            "assign" => Ok(Accepted::Assign),
            "listener" => Ok(Accepted::Listener),
            other => Err(format!("`{other}` is not assign or listener")),
        }
    }
}

/// What one server hands another.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A control connection that said Hello for this server, and its process.
    Hello(OwnedFd, Hello, crate::sock::Owner),
    /// A socket assigned to this server.
    Sock(Box<Sock>),
    /// A connection is waiting on published port `.0`.
    Published(u16),
}

/// A server's mailbox: a queue plus an eventfd in the server's epoll set.
#[derive(Debug)]
pub(crate) struct Inbox {
    q: Mutex<Vec<Msg>>,
    pub efd: OwnedFd,
}

impl Inbox {
    fn new() -> io::Result<Inbox> {
        Ok(Inbox {
            q: Mutex::new(Vec::new()),
            efd: ferry_sys::eventfd()?,
        })
    }

    pub(crate) fn send(&self, m: Msg) {
        lock(&self.q).push(m);
        let _ = ferry_sys::eventfd_signal(self.efd.as_fd());
    }

    pub(crate) fn take(&self) -> Vec<Msg> {
        std::mem::take(&mut *lock(&self.q))
    }
}

/// A server's live counters, written by its thread, read by the assigner and `ferry ctl`.
#[derive(Debug, Default)]
pub struct Live {
    /// Parked operations plus queued sends, at the last refresh.
    pub outstanding: AtomicU64,
    /// Open sockets.
    pub sockets: AtomicU64,
    /// Open channels.
    pub channels: AtomicU64,
    /// Requests handled so far.
    pub requests: AtomicU64,
    /// Bytes sent to the network so far.
    pub bytes_out: AtomicU64,
    /// Bytes received from the network so far.
    pub bytes_in: AtomicU64,
    /// Times the loop slept.
    pub sleeps: AtomicU64,
    /// The server thread's kernel thread id (0 before it runs).
    pub tid: AtomicI32,
    /// The CPU it last ran on (-1 unknown).
    pub cpu: AtomicI32,
    /// The CPU it is pinned to (-1 none).
    pub pinned: AtomicI32,
}

/// How many sockets of the sandbox listen on one port.
#[derive(Debug, Default)]
pub(crate) struct Listening {
    all: usize,
    /// Those bound to the wildcard address.
    wildcard: usize,
}

/// Connections accepted on a published port, each with the time it came, that wait for
/// the sandbox's listener.
pub(crate) type Waiting = VecDeque<(OwnedFd, Instant)>;

/// State every server of a sandbox shares.
pub(crate) struct Shared {
    pub n: usize,
    pub assign: Assign,
    pub accepted: Accepted,
    rr: AtomicUsize,
    next_serial: AtomicU32,
    pub inbox: Vec<Inbox>,
    pub live: Vec<Live>,
    pub stop: AtomicBool,
    factory: Mutex<SandboxSocketFn>,
    /// Connections accepted on published ports that wait for the sandbox's listener, by
    /// sandbox port.
    pub published: Mutex<Vec<(u16, Waiting)>>,
    pub any_published: bool,
    /// The ports [`crate::Inbound`] published while the sandbox runs (`published` has
    /// their queues), at most [`Config::auto_publish`].
    pub auto: Mutex<Vec<u16>>,
    /// [`Config::auto_publish`].
    pub auto_max: usize,
    /// Sockets of the sandbox listening (through ferry) on each port, on every server:
    /// (all, those bound to the wildcard). A connection to a published port with none
    /// waits a moment for one, then is refused (`PublishedPorts::expire_unserved`);
    /// `--publish-auto` publishes the ports with one on the wildcard ([`crate::Inbound`]).
    listeners: Mutex<BTreeMap<u16, Listening>>,
    /// Channels open on every server of the sandbox (capped by `Config::max_channels`).
    channels_open: AtomicUsize,
    /// Sockets open on every server of the sandbox (capped by `Config::max_sockets`).
    sockets_open: AtomicUsize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("n", &self.n)
            .field("assign", &self.assign)
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking server thread must not take the others down with a poisoned lock.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn new(cfg: &Config, factory: SandboxSocketFn) -> Result<Shared, Error> {
        let n = cfg.servers.clamp(1, MAX_SERVERS);
        let inbox = (0..n)
            .map(|_| Inbox::new())
            .collect::<io::Result<Vec<_>>>()
            .map_err(Error::EventLoop)?;
        let published = cfg
            .publish
            .iter()
            .map(|p| (p.sandbox_port, VecDeque::new()))
            .collect();
        Ok(Shared {
            n,
            assign: cfg.assign,
            accepted: cfg.accepted,
            rr: AtomicUsize::new(0),
            next_serial: AtomicU32::new(1),
            inbox,
            live: (0..n)
                .map(|_| Live {
                    cpu: AtomicI32::new(-1),
                    pinned: AtomicI32::new(-1),
                    ..Live::default()
                })
                .collect(),
            stop: AtomicBool::new(false),
            factory: Mutex::new(factory),
            published: Mutex::new(published),
            any_published: !cfg.publish.is_empty() || cfg.auto_publish > 0,
            auto: Mutex::new(Vec::new()),
            auto_max: cfg.auto_publish,
            listeners: Mutex::new(BTreeMap::new()),
            channels_open: AtomicUsize::new(0),
            sockets_open: AtomicUsize::new(0),
        })
    }

    /// A socket of the sandbox started listening on `port` (`wildcard`: bound to the
    /// wildcard address).
    pub(crate) fn listener_up(&self, port: u16, wildcard: bool) {
        let mut all = lock(&self.listeners);
        let n = all.entry(port).or_default();
        n.all += 1;
        n.wildcard += usize::from(wildcard);
    }

    /// A socket listening on `port` went; returns how many are left there.
    pub(crate) fn listener_down(&self, port: u16, wildcard: bool) -> usize {
        let mut all = lock(&self.listeners);
        let Some(n) = all.get_mut(&port) else {
            return 0;
        };
        n.all = n.all.saturating_sub(1);
        n.wildcard = n.wildcard.saturating_sub(usize::from(wildcard));
        let left = n.all;
        if left == 0 {
            all.remove(&port);
        }
        left
    }

    /// Whether anything in the sandbox listens (through ferry) on `port`.
    pub(crate) fn has_listener(&self, port: u16) -> bool {
        lock(&self.listeners).contains_key(&port)
    }

    /// The ports something in the sandbox listens on (through ferry) on the wildcard.
    pub(crate) fn wildcard_listeners(&self) -> Vec<u16> {
        lock(&self.listeners)
            .iter()
            .filter(|(_, n)| n.wildcard > 0)
            .map(|(p, _)| *p)
            .collect()
    }

    /// Channels open on every server.
    pub(crate) fn channels_open(&self) -> usize {
        self.channels_open.load(Ordering::Relaxed)
    }

    pub(crate) fn channel_opened(&self) {
        self.channels_open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn channel_closed(&self) {
        self.channels_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Takes one of the sandbox's `max` sockets: false when all are in use.
    pub(crate) fn take_socket(&self, max: usize) -> bool {
        self.sockets_open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives a socket back ([`Shared::take_socket`]).
    pub(crate) fn socket_closed(&self) {
        self.sockets_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// A new socket id served by `server`.
    pub(crate) fn new_id(&self, server: usize) -> u32 {
        let serial = self.next_serial.fetch_add(1, Ordering::Relaxed);
        serial << SERVER_BITS | u32::try_from(server).unwrap_or(0)
    }

    /// Which server a new socket goes to; `key` feeds the hash mode. Counts the socket
    /// at once (the server's own count replaces this at its next refresh), so that a
    /// burst of new sockets is spread before any server has refreshed.
    pub(crate) fn pick(&self, key: u64) -> usize {
        if self.n == 1 {
            return 0;
        }
        let k = self.choose(key);
        self.live[k].sockets.fetch_add(1, Ordering::Relaxed);
        k
    }

    fn choose(&self, key: u64) -> usize {
        match self.assign {
            Assign::RoundRobin => self.rr.fetch_add(1, Ordering::Relaxed) % self.n,
            Assign::Hash => usize::try_from(mix(key) % self.n as u64).unwrap_or(0),
            Assign::Least => (0..self.n)
                .min_by_key(|&i| {
                    let l = &self.live[i];
                    (
                        l.outstanding.load(Ordering::Relaxed),
                        l.sockets.load(Ordering::Relaxed),
                    )
                })
                .unwrap_or(0),
        }
    }

    /// Makes a socket inside the sandbox's network namespace.
    pub(crate) fn sandbox_socket(
        &self,
        domain: i32,
        ty: i32,
        protocol: i32,
    ) -> io::Result<OwnedFd> {
        (lock(&self.factory))(domain, ty, protocol)
    }

    /// Asks every server to stop.
    pub(crate) fn stop_all(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for i in &self.inbox {
            let _ = ferry_sys::eventfd_signal(i.efd.as_fd());
        }
    }
}

/// A 64-bit finalizer (splitmix64's), so that nearby keys land on different servers.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Stops a running server (or group) from another thread.
#[derive(Clone, Debug)]
pub struct Handle {
    pub(crate) shared: Arc<Shared>,
}

impl Handle {
    /// Asks the loops to finish (queued sends are flushed first).
    pub fn stop(&self) {
        self.shared.stop_all();
    }
}

/// Live control of a running group: per-server counters, moving a server to a CPU.
#[derive(Clone, Debug)]
pub struct Control {
    shared: Arc<Shared>,
}

impl Control {
    /// How many servers the group has.
    pub fn servers(&self) -> usize {
        self.shared.n
    }

    /// The current counters of every server.
    pub fn snapshot(&self) -> Vec<LiveStats> {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.shared
            .live
            .iter()
            .enumerate()
            .map(|(i, l)| LiveStats {
                id: server_name(i),
                cpu: l.cpu.load(Ordering::Relaxed),
                pinned: l.pinned.load(Ordering::Relaxed),
                sockets: r(&l.sockets),
                channels: r(&l.channels),
                requests: r(&l.requests),
                outstanding: r(&l.outstanding),
                bytes_out: r(&l.bytes_out),
                bytes_in: r(&l.bytes_in),
                sleeps: r(&l.sleeps),
            })
            .collect()
    }

    /// Pins server `server` to `cpu` (its thread migrates at its next scheduling point;
    /// nothing it holds moves or is dropped).
    pub fn move_server(&self, server: usize, cpu: usize) -> io::Result<()> {
        let live = self.shared.live.get(server).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no server {server} (there are {})", self.shared.n),
            )
        })?;
        let tid = live.tid.load(Ordering::Acquire);
        if tid <= 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not running", server_name(server)),
            ));
        }
        ferry_sys::pin_thread(tid, cpu)?;
        live.pinned
            .store(i32::try_from(cpu).unwrap_or(-1), Ordering::Relaxed);
        Ok(())
    }
}

/// A server's id: kind and serial number.
pub fn server_name(i: usize) -> String {
    format!("proto-{i}")
}

/// Parses a server id (`proto-K` or `K`).
pub fn parse_server(s: &str) -> Option<usize> {
    s.strip_prefix("proto-").unwrap_or(s).parse().ok()
}

/// N protocol servers for one sandbox, each a thread (pinned when `cpus` is given).
pub struct Servers {
    servers: Vec<Server>,
    shared: Arc<Shared>,
    cpus: Vec<usize>,
}

impl std::fmt::Debug for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Servers")
            .field("n", &self.servers.len())
            .field("cpus", &self.cpus)
            .finish()
    }
}

impl Servers {
    /// Creates `cfg.servers` servers; the first binds the control socket and the
    /// published ports.
    pub fn new(cfg: Config, factory: SandboxSocketFn) -> Result<Servers, Error> {
        let shared = Arc::new(Shared::new(&cfg, factory)?);
        let cpus = cfg.cpus.clone();
        let servers = (0..shared.n)
            .map(|i| Server::member(cfg.clone(), shared.clone(), i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Servers {
            servers,
            shared,
            cpus,
        })
    }

    /// The first server (control socket, published ports, DNS).
    pub fn first(&mut self) -> &mut Server {
        &mut self.servers[0]
    }

    /// The handle that publishes ports while the sandbox runs (`--publish-auto` in
    /// socket mode), within [`Config::auto_publish`].
    pub fn inbound(&self) -> crate::Inbound {
        crate::Inbound::new(self.shared.clone())
    }

    /// A handle that stops every server.
    pub fn stop_handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
        }
    }

    /// Live counters and CPU moves.
    pub fn control(&self) -> Control {
        Control {
            shared: self.shared.clone(),
        }
    }

    /// Runs every server on its own thread until stopped; returns their counters in
    /// server order.
    pub fn run(self) -> io::Result<Vec<ServerStats>> {
        let mut threads = Vec::new();
        for (i, s) in self.servers.into_iter().enumerate() {
            let cpu = (!self.cpus.is_empty()).then(|| self.cpus[i % self.cpus.len()]);
            let shared = self.shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("ferry-{}", server_name(i)))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        match ferry_sys::pin_thread(0, cpu) {
                            Ok(()) => shared.live[i]
                                .pinned
                                .store(i32::try_from(cpu).unwrap_or(-1), Ordering::Relaxed),
                            Err(e) => {
                                tracing::warn!("{}: cannot pin to CPU {cpu}: {e}", server_name(i))
                            }
                        }
                    }
                    s.run()
                });
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    self.shared.stop_all();
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        let mut stats = Vec::new();
        let mut panicked = false;
        for t in threads {
            match t.join() {
                Ok(s) => stats.push(s),
                Err(_) => panicked = true,
            }
        }
        if panicked {
            return Err(io::Error::other("a protocol server panicked"));
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(n: usize, assign: Assign) -> Shared {
        let mut cfg = Config::new("/nonexistent".into());
        cfg.servers = n;
        cfg.assign = assign;
        Shared::new(&cfg, Box::new(ferry_sys::socket)).unwrap()
    }

    #[test]
    fn ids_carry_their_server() {
        let s = shared(3, Assign::Least);
        for server in 0..3 {
            let id = s.new_id(server);
            assert_eq!(ferry_proto::server_of(id), server);
            assert_ne!(id, 0);
        }
        assert_ne!(s.new_id(1), s.new_id(1));
    }

    #[test]
    fn round_robin_visits_every_server() {
        let s = shared(3, Assign::RoundRobin);
        let picks: Vec<_> = (0..6).map(|_| s.pick(0)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn least_prefers_fewest_outstanding_then_fewest_sockets() {
        let s = shared(3, Assign::Least);
        s.live[0].outstanding.store(5, Ordering::Relaxed);
        s.live[1].outstanding.store(1, Ordering::Relaxed);
        s.live[2].outstanding.store(1, Ordering::Relaxed);
        s.live[1].sockets.store(4, Ordering::Relaxed);
        s.live[2].sockets.store(2, Ordering::Relaxed);
        assert_eq!(s.pick(0), 2);
        s.live[2].outstanding.store(9, Ordering::Relaxed);
        assert_eq!(s.pick(0), 1);
    }

    #[test]
    fn least_spreads_a_burst_before_any_refresh() {
        let s = shared(2, Assign::Least);
        let picks: Vec<_> = (0..4).map(|_| s.pick(0)).collect();
        assert_eq!(picks, [0, 1, 0, 1]);
    }

    #[test]
    fn hash_is_stable_and_spreads() {
        let s = shared(2, Assign::Hash);
        assert_eq!(s.pick(42), s.pick(42));
        let ones = (0..1000u64).filter(|k| s.pick(*k) == 1).count();
        assert!(
            (350..650).contains(&ones),
            "{ones} of 1000 keys on server 1"
        );
    }

    #[test]
    fn one_server_takes_everything() {
        let s = shared(1, Assign::RoundRobin);
        assert!((0..5).all(|k| s.pick(k) == 0));
    }

    #[test]
    fn names_parse_back() {
        assert_eq!(parse_server(&server_name(3)), Some(3));
        assert_eq!(parse_server("1"), Some(1));
        assert_eq!(parse_server("nic-1"), None);
    }
}
