//! One sandbox socket as the server sees it: its host socket, where that lives, its
//! readiness pair, parked operations and queued sends, and the state tables of its
//! connection ([`Conn`]), readiness token ([`Token`]) and the pair's end ([`PairEnd`]).
//! Must not: reach the table or the channels (a `Sock` knows only itself); its few
//! calls go through the seam it is given.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;

use ferry_ring::{BufSpan, Buffers};

use crate::seam::Io;
use crate::stats::SocketStats;
use ferry_egress::Lease;

/// A process of the sandbox, as the server knows it: the pid its control connections
/// came from (`SO_PEERCRED`, the kernel's word) and that process's start time, so that
/// a pid used again by a later process is another owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    pub pid: i32,
    pub start: u64,
}

impl Owner {
    /// Whether this process still runs (its pid names a process of the same start).
    pub(crate) fn alive(&self) -> bool {
        crate::server::process_start(self.pid) == Some(self.start)
    }
}

/// The abstract name of a pair's program end (`ferry_proto::pair_name`).
pub(crate) type PairName = ([u8; ferry_proto::PAIR_NAME_MAX], usize);

/// A new readiness pair made by the server: its own end (non-blocking, never shared),
/// the program's end, and the name the program's end is bound to, in the server's own
/// network namespace (where the sandbox cannot bind: nobody there can take or fake it).
#[derive(Debug)]
pub(crate) struct NewPair {
    pub ours: OwnedFd,
    pub theirs: OwnedFd,
    pub name: PairName,
}

/// Where a socket's host socket lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Created at `socket()` in the host namespace; moves at bind/connect/listen.
    Provisional,
    /// In the host namespace (egress).
    Host,
    /// Inside the sandbox's network namespace (its loopback, its listeners).
    Sandbox,
}

/// The readiness token of a socket of the ring path (a listener, a datagram socket, or
/// a stream whose bytes come through the ring): one byte the server writes into the
/// pair so that the program's fd polls readable when the host socket is. Legal moves:
///
/// | state      | event                                        | action            | next         |
/// |------------|----------------------------------------------|-------------------|--------------|
/// | `Unwanted` | `WantToken` (the shim polls the fd)          | check the host    | `Wanted`/`Out` |
/// | `Wanted`   | host socket readable (edge, or asked)        | write a token     | `Out{0}`     |
/// | `Out{n}`   | new-data edge, `n` < 8 (edge-triggered epoll) | write one more   | `Out{n+1}`   |
/// | `Out{n}`   | a receive or accept found the socket empty   | `CMP_DRAIN_TOKEN` | `Out{n}`     |
/// | `Out{n}`   | `TokenDrained` (the shim read them all)       | check the host    | `Wanted`/`Out` |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Token {
    /// The shim has not asked: nothing is written.
    #[default]
    Unwanted,
    /// The shim polls the fd; no token is in the pair.
    Wanted,
    /// A token is in the pair, with `extra` more written since (one per new-data edge).
    Out { extra: u8 },
}

/// Where a socket's connection stands. A datagram socket stays `Idle` whatever it
/// connects to (its association is the kernel's alone); a stream moves so:
///
/// | state              | event                                   | action                              | next               |
/// |--------------------|-----------------------------------------|-------------------------------------|--------------------|
/// | `Idle`             | connect answers 0                       | `Done(0)`                           | `Connected`        |
/// | `Idle`             | connect answers `EINPROGRESS`           | park it, or `Done(-EINPROGRESS)`    | `Connecting`       |
/// | `Idle`             | listen                                  |                                     | `Listening`        |
/// | `Connecting`       | `REQ_FILLED` with a non-blocking connect | keep the shim's filler              | `Connecting{filled}` |
/// | `Connecting`       | host `EPOLLOUT`/`ERR`/`HUP`, `SO_ERROR` 0 | answer the parked connect; drain the filler | `Connected`  |
/// | `Connecting`       | the same, an error, a connect parked    | answer it; `connect(AF_UNSPEC)`     | `Idle`             |
/// | `Connecting{filled}` | the same, an error, none parked       | detach the pair (`POLLERR|POLLHUP`) | `Failed{false}`    |
/// | `Failed{false}`    | connect                                 | answer the error; `connect(AF_UNSPEC)` | `Failed{true}`  |
/// | `Failed{true}`     | connect                                 | `ECONNABORTED` + `CMP_RENEW_PAIR`   | `Failed{true}`     |
/// | `Failed{true}`     | `CtlKind::Renew`                        | a new pair                          | `Idle`             |
/// | `Connected`        | accept made the socket                  |                                     | `Connected`        |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Conn {
    /// Neither connected nor listening.
    #[default]
    Idle,
    /// A stream's connect is in progress, to `to`; `filled`: the program's end of the
    /// pair is filled (unwritable) until it ends (`REQ_FILLED`).
    Connecting {
        to: SocketAddr,
        filled: bool,
    },
    /// The stream is (or was) connected: hang-ups and resets mean something.
    Connected,
    Listening,
    /// A non-blocking connect failed: our end of the pair was closed (see
    /// `Server::detach_pair`), `pair` is a placeholder whose peer is gone. `reported`:
    /// a later connect has reported the failure (and reset the host socket, as the
    /// kernel's does); the next one asks the shim to renew the pair.
    Failed {
        reported: bool,
    },
}

/// How much of the host stream's ending the program's end of the pair shows. It only
/// moves forward (a renewed pair starts `Open` again):
///
/// | state  | event                                              | action                           | next  |
/// |--------|----------------------------------------------------|----------------------------------|-------|
/// | `Open` | the end of the stream is read (0, or the error kept for `SO_ERROR`), or a token check sees `POLLRDHUP` | shut the pair's write side (the program reads 0, polls `POLLRDHUP`) | `Eof` |
/// | `Eof`  | `hup_due` (the host socket hung up), program's end open | publish the channel's completions; shut the read side too | `Hup` |
///
/// In `Hup` both directions of the pair are shut, so our end reports `EPOLLHUP` while
/// the program's end is still open (see `Server::app_alive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum PairEnd {
    #[default]
    Open,
    /// The end of the stream is mirrored.
    Eof,
    /// The end of the stream and the hang-up are mirrored.
    Hup,
}

/// An operation waiting for its host socket.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Parked {
    /// A blocking receive.
    Recv {
        ch: u32,
        tag: u32,
        len: u32,
        flags: i32,
    },
    /// A blocking connect.
    Connect { ch: u32, tag: u32 },
    /// A blocking accept (of the native API: the shim's accepts never block here).
    Accept { ch: u32 },
}

impl Parked {
    /// The channel and tag to answer (accept answers on the control socket: tag 0).
    pub(crate) fn owner(&self) -> (u32, u32) {
        match *self {
            Parked::Recv { ch, tag, .. } | Parked::Connect { ch, tag } => (ch, tag),
            Parked::Accept { ch, .. } => (ch, 0),
        }
    }
}

/// A send waiting for room in the host socket.
#[derive(Debug)]
pub(crate) struct TxItem {
    /// The channel that lent the buffer.
    pub ch: u32,
    /// Keeps the lending channel's memory mapped even if the channel dies meanwhile.
    pub bufs: Buffers,
    /// The data.
    pub span: BufSpan,
    /// Bytes already sent.
    pub sent: usize,
    /// Destination of a datagram.
    pub to: Option<SocketAddr>,
    /// `MSG_*` flags.
    pub flags: i32,
    /// A datagram's control messages, checked ([`ferry_proto::cmsg::sanitize_send`]).
    pub control: Vec<u8>,
}

/// A sandbox socket.
#[derive(Debug)]
pub(crate) struct Sock {
    pub id: u32,
    pub domain: i32,
    pub ty: i32,
    pub protocol: i32,
    /// The host socket (non-blocking, close-on-exec).
    pub fd: OwnedFd,
    pub place: Place,
    /// Server end of the readiness pair (made by the server, non-blocking, never in the
    /// sandbox).
    pub pair: OwnedFd,
    /// The abstract name of the pair's program end (in the server's namespace).
    pub name: PairName,
    /// The processes that may act on this socket: the one that made or accepted it, and
    /// those that proved they hold it (`CtlKind::Claim`). Dead ones are pruned when the
    /// list reaches `prune_at`.
    pub holders: Vec<Owner>,
    pub prune_at: usize,
    /// Options set (the last value of each), replayed when the socket moves.
    pub opts: Vec<(i32, i32, Vec<u8>)>,
    /// The port of the program's bind to the wildcard address (0.0.0.0 or ::), which put
    /// the socket in the sandbox: a client that then connects or sends elsewhere moves to
    /// the host (`Server::move_to_host`).
    pub bound_wild: Option<u16>,
    /// A datagram socket that holds a port the program chose on the host: only the peers
    /// it sent to or connected to (the last few) may send to it (see `reach.rs`).
    pub contacted: Option<Vec<SocketAddr>>,
    /// The readiness token: whether the shim polls this socket, and whether a token
    /// byte lies in the pair for it.
    pub token: Token,
    /// How much of the host stream's ending the program's end of the pair shows.
    pub pair_end: PairEnd,
    /// The host socket may have input (a stream that is not listening): cleared when a
    /// receive finds its queue empty, set by every input edge of the (edge-triggered)
    /// host socket. While clear, a token check needs no `ppoll`: any arrival after the
    /// queue emptied brings a new edge.
    pub rx_maybe: bool,
    /// A stream whose received bytes go into the pair (the channel that made or accepted
    /// it reads them there): see `Server::pump`.
    pub rx_pair: bool,
    /// `rx_pair`: received bytes the pair has not taken yet (at most one read).
    pub rx_pending: Vec<u8>,
    /// `rx_pair`: the stream is in bulk mode (spliced, see `Server::pump`).
    pub rx_bulk: bool,
    /// The host socket has reported a hang-up, reset or error: no arrival edge will
    /// follow it, so a pump reads on until the read says 0, `EAGAIN` or the error.
    pub rx_ending: bool,
    /// `Server::waits` at the last receive: an input event reported by a later wait
    /// than the next one cannot be older than that receive.
    pub recv_mark: u64,
    pub parked: VecDeque<Parked>,
    pub txq: VecDeque<TxItem>,
    /// Where the connection stands (see [`Conn`]).
    pub conn: Conn,
    /// Error left by the last connect, for `SO_ERROR`.
    pub so_error: i32,
    /// The program has closed its last reference.
    pub app_closed: bool,
    /// A `SHUT_WR` waits for the send queue to empty.
    pub shut_wr_pending: bool,
    /// Records of other threads' channels that the program's `close` or `shutdown`
    /// of this socket came after: the host socket keeps them company until they are
    /// taken (see [`crate::channel::Fence`]).
    pub fence: crate::channel::Fence,
    /// A hang-up or reset has been reported to the program.
    pub hup_reported: bool,
    /// Connected (or connecting) to a `--handoff` destination and out of the loop: the
    /// program takes the host socket with `CtlKind::Handoff`.
    pub handing_off: bool,
    /// A blocking connect to a `--handoff` destination is in progress: handed off if it
    /// succeeds; a refusal is answered as any (the socket stays served, so the program
    /// may connect again, as natively).
    pub handoff_when_connected: bool,
    /// `rx_pair`: the host socket hung up (both directions shut, or closed by a reset):
    /// the kernel's `POLLHUP` for it, due on the program's end once the bytes before it
    /// are through (see `Server::mirror_hup`).
    pub hup_due: bool,
    /// The published TCP port this socket listens on (counted in `Shared`'s listeners
    /// until the socket goes).
    pub published_listener: Option<u16>,
    /// `rx_pair`: the host socket reported urgent data (`EPOLLPRI`) that has not been
    /// moved into the pair yet (see [`Sock::urgent_first`]).
    pub oob_due: bool,
    /// `rx_pair`: an urgent byte taken from the host socket that the pair did not take
    /// yet (it was full).
    pub oob_byte: Option<u8>,
    /// `rx_pair`: bytes the program wrote straight into the pair wait for room on the
    /// host socket (or for the sends queued before them); see `Server::pair_input`.
    pub pair_in_wait: bool,
    /// `rx_pair`: a read of our end found it reset (the program closed its end with
    /// bytes unread), an error the kernel reports once.
    pub pair_reset: bool,
    /// `rx_pair`: the filler is to be drained once the program's bytes before its
    /// marker are out.
    pub filler_due: bool,
    /// The channel that last used this socket (where unsolicited errors go).
    pub last_ch: u32,
    pub stats: SocketStats,
    /// The bond's source address this socket was bound to (egress bonding).
    pub egress: Option<Lease>,
}

impl Drop for Sock {
    fn drop(&mut self) {
        // The connection ends: its bytes go to its source address's counters.
        if let Some(lease) = &mut self.egress {
            lease.set_bytes(self.stats.bytes_out, self.stats.bytes_in);
        }
    }
}

impl Sock {
    /// Whether `owner` may act on this socket.
    pub(crate) fn held_by(&self, owner: Owner) -> bool {
        self.holders.contains(&owner)
    }

    /// Adds `owner` to the processes that may act on this socket; first drops those
    /// that have exited when the list has doubled since the last look (so a socket
    /// inherited by many short-lived children stays small, at amortised cost).
    pub(crate) fn add_holder(&mut self, owner: Owner) {
        if self.held_by(owner) {
            return;
        }
        if self.holders.len() >= self.prune_at {
            self.holders.retain(Owner::alive);
            self.prune_at = (self.holders.len() * 2).max(8);
        }
        self.holders.push(owner);
    }

    /// How many queued sends go out in the next call. S1 on the server side:
    /// consecutive stream sends go in one vectored call (a datagram is always one call
    /// of its own). Urgent data ends a batch: `MSG_OOB` marks the last byte of the call
    /// that carries it.
    pub(crate) fn tx_batch(&self) -> usize {
        if !self.is_stream() {
            return 1;
        }
        let n = self.txq.len().min(crate::hostio::MAX_IOV);
        self.txq
            .iter()
            .take(n)
            .position(|i| i.flags & libc::MSG_OOB != 0)
            .map_or(n, |p| p + 1)
    }

    /// The host socket took `n` bytes of the queued sends: takes the finished ones off
    /// the queue (a stream's partly sent one keeps its place, with its progress).
    pub(crate) fn take_sent(&mut self, mut n: usize) -> Vec<TxItem> {
        let stream = self.is_stream();
        let mut done = Vec::new();
        while let Some(item) = self.txq.front_mut() {
            let left = item.span.len() as usize - item.sent;
            if n < left && stream {
                item.sent += n;
                break;
            }
            n = n.saturating_sub(left);
            done.extend(self.txq.pop_front());
            let unsent_next = self
                .txq
                .front()
                .is_some_and(|i| i.span.len() as usize > i.sent);
            if !stream || n == 0 && unsent_next {
                break;
            }
        }
        done
    }

    /// A token lies in the pair.
    pub(crate) fn token_out(&self) -> bool {
        matches!(self.token, Token::Out { .. })
    }

    /// The pair was detached after a failed non-blocking connect.
    pub(crate) fn pair_detached(&self) -> bool {
        matches!(self.conn, Conn::Failed { .. })
    }

    pub(crate) fn listening(&self) -> bool {
        self.conn == Conn::Listening
    }

    pub(crate) fn connected(&self) -> bool {
        self.conn == Conn::Connected
    }

    pub(crate) fn connecting(&self) -> bool {
        matches!(self.conn, Conn::Connecting { .. })
    }

    pub(crate) fn is_stream(&self) -> bool {
        self.ty == libc::SOCK_STREAM
    }

    /// A connected stream of the pair path whose pair holds nothing but what the
    /// program wrote and the shim's marked fillers (not a connect's filler).
    pub(crate) fn takes_pair_input(&self, io: &dyn Io) -> bool {
        self.reads_pair() && io.unix_oob_works()
    }

    /// A connected stream whose received bytes go through the pair (`rx_pair`).
    pub(crate) fn reads_pair(&self) -> bool {
        self.rx_pair && self.conn == Conn::Connected
    }

    /// The end of the stream reaches the program's end of the pair (POLLIN|POLLRDHUP,
    /// then 0 from a read): the pair's write side is shut, once.
    pub(crate) fn mirror_eof(&mut self, io: &dyn Io) {
        if self.pair_end == PairEnd::Open {
            self.pair_end = PairEnd::Eof;
            let _ = io.shutdown(std::os::fd::AsFd::as_fd(&self.pair), libc::SHUT_WR);
        }
    }

    /// `rx_pair`, before each read of a pump: TCP urgent data (`MSG_OOB`, reported by
    /// `EPOLLPRI`) goes into the pair as the unix socket's own out-of-band byte, at its
    /// place in the stream. A read stops short of the mark, and one that starts at it
    /// would skip the urgent byte and discard it: so at the mark the byte is taken with
    /// `MSG_OOB` and sent into the pair with `MSG_OOB` first. The program's end then
    /// reports `POLLPRI`, is in `select`'s exceptional set, raises `SIGURG` for its
    /// `F_SETOWN` owner and answers `recv(MSG_OOB)` and `SIOCATMARK`, all by the
    /// kernel's own unix-socket code. False when the pump must wait: the byte has not
    /// come yet (its arrival is a new edge), or the pair has no room for it.
    pub(crate) fn urgent_first(&mut self, io: &dyn Io) -> bool {
        use std::os::fd::AsFd;
        if let Some(b) = self.oob_byte {
            if io.send_oob(self.pair.as_fd(), b).is_err() {
                return false;
            }
            self.oob_byte = None;
        }
        if !self.oob_due || !io.at_mark(self.fd.as_fd()).unwrap_or(false) {
            // No urgent data, or bytes ahead of the mark to read first.
            return true;
        }
        let mut b = [0u8; 1];
        match io.recv(self.fd.as_fd(), &mut b, libc::MSG_OOB | libc::MSG_DONTWAIT) {
            Ok(1) => {
                self.oob_due = false;
                self.stats.bytes_in += 1;
                if io.send_oob(self.pair.as_fd(), b[0]).is_err() {
                    self.oob_byte = Some(b[0]);
                    return false;
                }
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            // Read already (the program asked the server for it first), or kept inline
            // (`SO_OOBINLINE`: the pump moves it with the rest).
            _ => {
                self.oob_due = false;
                true
            }
        }
    }

    /// The host socket's hang-up is due on the program's end of the pair and not there
    /// yet: it has been reported, and the end of the stream has reached the pair (see
    /// `Server::mirror_hup`).
    pub(crate) fn hup_to_mirror(&self) -> bool {
        self.hup_due && self.pair_end == PairEnd::Eof && !self.app_closed
    }
}
