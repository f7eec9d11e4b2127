//! ferry's protocol server: it serves the inet sockets of one sandbox on real host
//! sockets, talking to the sandbox's shim over shared-memory channels.
//!
//! This crate owns the server side of socket mode: accepting channels on the control
//! socket, spreading sockets over several servers, creating and placing host sockets
//! (host namespace vs. the sandbox's own namespace, as [`ferry_egress::admit`] decides
//! for a connect, a datagram and an arrival), performing every operation
//! non-blocking and parking the ones that must wait, readiness tokens (and, on the pair
//! receive path, moving a TCP socket's received bytes into its readiness pair), which
//! socket options and control messages a sandbox may use (`sockopt.rs`,
//! `ferry_proto::cmsg`: nothing that needs the server's privilege or points into its
//! memory), binding a socket to its egress bond's source address (`place.rs`),
//! published ports (TCP connections handed to the sandbox's listener; UDP datagrams
//! forwarded through a flow per client, `udp_publish`), data-path modules bound to sockets (`modules`: the
//! server half of `ferry-modules` — binding, feeding a module the program's sends,
//! writing its output, failing only its socket), and counters. It trusts nothing that
//! comes from a channel: a malformed record closes that channel (with a log line) and the
//! server carries on. It must not block on a host socket, panic on peer data, or touch
//! the sandbox's processes. Shared-memory mechanics are `ferry-ring`'s; record layouts
//! are `ferry-proto`'s; the protocol is described in `docs/specs/socket-protocol.md`.
//!
//! # Layout (docs/DESIGN.md, "Server core")
//!
//! `Server` (`server.rs`: the event loop) coordinates parts that own their state:
//! `ControlConns` (`control.rs`: the control socket, Hellos), `Channels` (`channel.rs`:
//! rings, backlog, back-pressure), `SockTable` (`table.rs`: the sockets and the turn's
//! work on them), `PublishedPorts` (`published.rs`, `udp_publish.rs`), `Modules`
//! (`modules.rs`). `ops.rs` dispatches each typed request (`ferry_proto::Call`) and
//! control message. The data path's concerns are views borrowing only the fields they
//! touch: `Tx` (`tx.rs`, the way out), `Rx` (`rx.rs`, the way in), `Connects`
//! (`connect.rs`: make, accept and connect sockets, and hand a `--handoff` connection's
//! host socket to the program; `Placing` in `place.rs` places them), `ChannelLife`
//! (`control.rs`: open and close channels). `sock.rs` is one socket's state (`Conn`,
//! `Token`, `PairEnd`, `Holders`, `Handoff`), `recheck.rs` which detached sockets a
//! gone process may still seem to hold, `recv_side.rs` its
//! receive side and `send_side.rs` what waits on its way out, each with its table of
//! moves; `token.rs` and `procs.rs` are leaves.
//! Every call on a host socket or pair goes through the seam (`seam.rs`), so that
//! [`testkit`] can run the real server over a scripted fake, in-process and
//! deterministically.
//!
//! # Theory of operation
//!
//! A sandbox has one or more servers ([`Servers`], S4; the assignment of sockets to
//! servers, hand-over and live control are in `group.rs`). Each is one thread running
//! one event loop ([`Server::run`]). Each turn it drains every channel's
//! request ring, dispatching each validated record, then asks epoll (with timeout 0 while
//! there is work or while its spin span has not run out, S0's SBW) for readiness of host
//! sockets, control sockets, doorbells and readiness pairs, retries parked operations,
//! and finally publishes each channel's completions with one commit and at most one wake.
//! When the spin span passes with nothing to do, it arms every channel's sleep flag and
//! blocks in epoll; the shims ring the doorbell eventfds only while the flag is set.
//!
//! The one `unsafe` module, `hostio`, hands channel buffers straight to the host
//! socket's `sendmsg`/`recvmsg` (S0's DMHU: no copy between the wire and shared memory).
//! Bulk streams on the pair path are spliced host socket → pipe → pair; the first such
//! splice makes the process ignore SIGPIPE (a splice cannot say `MSG_NOSIGNAL`).
//!
//! The pair also carries what the kernel's socket would show: a hang-up shuts both of
//! its directions (POLLHUP), urgent data goes in as the unix socket's own out-of-band
//! byte (POLLPRI, SIGURG, `recv(MSG_OOB)`), and a failed non-blocking connect closes the
//! server's end with the shim's filler unread (POLLERR). In the other direction the
//! server reads what the program wrote into its end itself (stdio, a shell's builtins)
//! and sends it on the host socket (`Tx::pair_input`); a filler starts with an
//! out-of-band marker, where those reads stop. Whenever the server's own end
//! hangs up by the server's doing, whether the program still holds the fd is asked of
//! the pair's abstract name (`SockTable::app_alive`).
//!
//! # What a sandbox can do to a server (docs/SECURITY.md)
//!
//! The server makes every readiness pair and keeps its end to itself (non-blocking, never
//! in the sandbox), names the program's end in its own network namespace, and answers a
//! request about a socket only for a process that made, accepted or claimed it
//! (`CtlKind::Claim`, the descriptor as proof; `sock::Holders`). Every queue a channel
//! can fill is bounded: completions by back-pressure (the channel is not read while they
//! back up), parked requests per channel and socket, control connections waiting for
//! their Hello (2 s, 64 at most), channels and sockets per sandbox
//! (`Config::max_channels`, `Config::max_sockets`). Where a socket may go is
//! `ferry_egress`'s (its `admit`, policy and address rules: local addresses, host
//! addresses, sources, arrivals); binds and listening are placed in `connect.rs`.
//! Once set up, the process that runs the servers confines itself ([`confine`]).
#![deny(unsafe_code)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod channel;
pub mod confine;
mod connect;
mod control;
pub mod dns;
mod group;
#[allow(unsafe_code)]
mod hostio;
mod modules;
mod ops;
mod place;
mod procs;
mod published;
mod recheck;
mod recv_side;
mod rx;
mod seam;
mod send_side;
mod server;
mod sock;
mod sockopt;
mod stats;
mod table;
pub mod testkit;
mod token;
mod tx;
mod udp_publish;

pub use ferry_counters::{Counters, LiveStats};
pub use ferry_egress::{
    Bond, EgressStats, LogThrottle, Mode, Policy, Rule, TapHandoff, Verdict, host_listener,
};
pub use ferry_modules::{Interrupt as ModuleInterrupt, Limits as ModuleLimits};
pub use group::{Accepted, Assign, Control, Handle, Servers, parse_server, server_name};
pub use modules::{HIGH_WATER, ModuleConfig, ModuleError, ModuleRule, ModuleTarget};
pub use procs::descends_from;
pub use published::{Inbound, Refused};
pub use server::Server;
pub use stats::{
    ChannelStats, FOLDED, MAX_LISTED, ServerStats, SocketStats, group_json, merge as merge_stats,
};

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The spin span of a waiting call (shim) and of the server's loop before they sleep
/// (S0's SBW), unless configured: 200 µs covers a remote round trip over a veth pair on
/// a 2-vCPU VM up to about its 99th percentile, which 50 µs did not (ferry bench E2:
/// wakes per round trip 0.064–0.099 at 50 µs, 0.0011–0.0025 at 200 µs; docs/DESIGN.md).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// Makes a socket inside the sandbox's network namespace: `(domain, type, protocol)`.
pub type SandboxSocketFn = Box<dyn Fn(i32, i32, i32) -> io::Result<OwnedFd> + Send>;

/// A published port: connections to `host` are handed to the sandbox's listener on
/// `sandbox_port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Publish {
    /// Where the host listens.
    pub host: std::net::SocketAddr,
    /// The sandbox port whose listener receives the connections.
    pub sandbox_port: u16,
    /// UDP instead of TCP.
    pub udp: bool,
}

/// How a server behaves.
#[derive(Clone, Debug)]
pub struct Config {
    /// Path of the control socket the shims connect to.
    pub socket_path: PathBuf,
    /// Spin span of the shims' waits (sent to them at channel set-up).
    pub shim_spin: Duration,
    /// Spin span of the server's own loop before it sleeps.
    pub server_spin: Duration,
    /// Doorbell batching threshold for the shims (1 = every operation).
    pub batch: u32,
    /// With batching, the longest a queued operation may wait unannounced: the server
    /// never sleeps longer than this, and looks at the rings when it wakes.
    pub batch_delay: Duration,
    /// Egress policy.
    pub policy: Policy,
    /// Published ports.
    pub publish: Vec<Publish>,
    /// With a TAP beside the shim (`--net both`): where connections to a published TCP
    /// port that no listener of the shim's is on go (nic mode's NIC server).
    pub tap: Option<Arc<TapHandoff>>,
    /// Most ports [`Inbound`] may publish while the sandbox runs (`--publish-auto` in
    /// socket mode); 0: none.
    pub auto_publish: usize,
    /// Egress bonding: source addresses for new outgoing connections (shared by every
    /// server of the sandbox).
    pub egress: Option<Arc<Bond>>,
    /// Channel geometry.
    pub layout: ferry_ring::Layout,
    /// How many protocol servers (threads) serve the sandbox (S4), at most
    /// [`ferry_proto::MAX_SERVERS`].
    pub servers: usize,
    /// CPUs to pin the servers to (server K on `cpus[K % len]`); empty: not pinned.
    pub cpus: Vec<usize>,
    /// How new sockets are assigned to servers.
    pub assign: Assign,
    /// Where accepted connections go.
    pub accepted: Accepted,
    /// Data-path modules: limits, and the modules the server binds on its own.
    pub modules: ModuleConfig,
    /// Received TCP data reaches the program through its fd (the readiness pair)
    /// instead of the ring ([`ferry_proto::HELLO_RX_PAIR`]).
    pub rx_pair: bool,
    /// Most channels the sandbox may have open at once (on all servers together);
    /// further control connections are refused with a log line. Each channel is one
    /// shared region ([`Config::layout`]: 4 MiB by default, used as it is touched) and
    /// three descriptors.
    pub max_channels: usize,
    /// Most sockets the sandbox may have open at once (on all servers together); more
    /// get `ENFILE` with a log line. Each is two of the server's descriptors.
    pub max_sockets: usize,
}

impl Config {
    /// Defaults: spin spans from measurement (see docs/DESIGN.md), batch 1, open policy.
    pub fn new(socket_path: PathBuf) -> Config {
        Config {
            socket_path,
            shim_spin: DEFAULT_SPIN,
            server_spin: DEFAULT_SPIN,
            batch: 1,
            batch_delay: Duration::from_micros(50),
            policy: Policy::default(),
            publish: Vec::new(),
            tap: None,
            auto_publish: 0,
            egress: None,
            layout: default_layout(),
            servers: 1,
            cpus: Vec::new(),
            assign: Assign::Least,
            accepted: Accepted::Assign,
            modules: ModuleConfig::default(),
            rx_pair: false,
            max_channels: DEFAULT_MAX_CHANNELS,
            max_sockets: default_max_sockets(DEFAULT_MAX_CHANNELS),
        }
    }
}

/// [`Config::max_channels`] unless configured.
pub const DEFAULT_MAX_CHANNELS: usize = 512;

/// [`Config::max_sockets`] unless configured: what the process's descriptor limit
/// leaves after `channels` channels (three descriptors each) and a reserve, at two
/// descriptors per socket (its host socket and its end of the readiness pair); at least
/// 64.
pub fn default_max_sockets(channels: usize) -> usize {
    let limit = ferry_sys::nofile_limit().map_or(1024, |(soft, _)| {
        usize::try_from(soft).unwrap_or(usize::MAX)
    });
    (limit.saturating_sub(channels * 3 + 256) / 2).max(64)
}

/// The channel geometry ferry uses unless told otherwise: 256 records each way, 32 buffers
/// of 64 KiB per side.
pub fn default_layout() -> ferry_ring::Layout {
    ferry_ring::Layout {
        ring_slots: 256,
        #[allow(clippy::cast_possible_truncation, reason = "64, a constant")]
        record_size: ferry_proto::RECORD_SIZE as u32,
        bufs_a: 32,
        bufs_b: 32,
        buf_size: 64 * 1024,
    }
}

/// Why a server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Creating or binding the control socket failed.
    #[error("cannot listen on control socket {path}: {source}")]
    Listen {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Setting up epoll or the stop eventfd failed.
    #[error("cannot set up the event loop: {0}")]
    EventLoop(io::Error),
    /// A configured module could not be loaded.
    #[error(transparent)]
    Module(#[from] ModuleError),
    /// Listening on a published port failed.
    #[error("cannot publish {addr}: {source}")]
    Publish {
        /// The host address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: io::Error,
    },
}
