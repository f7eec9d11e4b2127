//! One sandbox socket as the server sees it: its host socket, where that lives, its
//! readiness pair, parked operations and queued sends, and the state tables of its
//! connection ([`Conn`]), readiness token ([`Token`]) and the pair's end ([`PairEnd`]).
//! Must not: reach the table or the channels (a `Sock` knows only itself); its few
//! calls go through the seam it is given.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use ferry_proto::cmsg;
use ferry_ring::{BufSpan, Buffers};
use tracing::{debug, warn};

use crate::ops::Errno;
use crate::recv_side::{RecvSide, UrgentEvent};
use crate::seam::Io;
use crate::send_side::SendSide;
use crate::sockopt;
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
        crate::procs::process_start(self.pid) == Some(self.start)
    }
}

/// The abstract name of a pair's program end (`ferry_proto::pair_name`).
pub(crate) type PairName = ([u8; ferry_proto::PAIR_NAME_MAX], usize);

/// The processes that may act on a socket: the one that made or accepted it, and
/// those that proved they hold it (`CtlKind::Claim`). Dead ones are pruned when the
/// list has doubled since the last look (so a socket inherited by many short-lived
/// children stays small, at amortised cost).
#[derive(Debug)]
pub(crate) struct Holders {
    list: Vec<Owner>,
    /// The length at which the list is pruned next.
    prune_at: usize,
}

impl Holders {
    /// A socket made or accepted by `first`.
    pub(crate) fn new(first: Owner) -> Holders {
        Holders {
            list: vec![first],
            prune_at: 8,
        }
    }

    /// Whether `owner` may act on the socket.
    pub(crate) fn contains(&self, owner: Owner) -> bool {
        self.list.contains(&owner)
    }

    /// Adds `owner` (a process that proved it holds the socket).
    pub(crate) fn add(&mut self, owner: Owner) {
        self.add_pruning(owner, Owner::alive);
    }

    /// [`Holders::add`], with `alive` telling which holders still run.
    fn add_pruning(&mut self, owner: Owner, alive: impl Fn(&Owner) -> bool) {
        if self.contains(owner) {
            return;
        }
        if self.list.len() >= self.prune_at {
            self.list.retain(alive);
            self.prune_at = (self.list.len() * 2).max(8);
        }
        self.list.push(owner);
    }
}

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
///
/// It moves only by [`Token::next`] (through `Sock::token_moves`): `Want` and
/// `Drained` to `Wanted`, `Written` to `Out{0}`, `Edge` to `Out{n+1}`.
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

/// What moves a [`Token`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenEvent {
    /// `WantToken`: the shim polls the fd.
    Want,
    /// `TokenDrained`: the shim read every token.
    Drained,
    /// The server wrote a token (the host socket is readable).
    Written,
    /// The server wrote one more for a new-data edge.
    Edge,
}

impl Token {
    /// Most tokens written beyond the first between two drains.
    pub(crate) const MAX_EXTRA: u8 = 8;

    /// The move `ev` makes from here; `None`: not a legal move.
    pub(crate) fn next(self, ev: TokenEvent) -> Option<Token> {
        use Token::*;
        Some(match (self, ev) {
            (Unwanted, TokenEvent::Want) | (Out { .. }, TokenEvent::Drained) => Wanted,
            (Wanted, TokenEvent::Written) => Out { extra: 0 },
            (Out { extra }, TokenEvent::Edge) if extra < Token::MAX_EXTRA => {
                Out { extra: extra + 1 }
            }
            _ => return None,
        })
    }
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
/// | `Connecting{filled}` | the same, an error, none parked       | detach the pair (`POLLERR|POLLHUP`) | `Failed`           |
/// | `Failed`           | connect                                 | answer the error; `connect(AF_UNSPEC)` | `FailReported`  |
/// | `FailReported`     | connect                                 | `ECONNABORTED` + `CMP_RENEW_PAIR`   | `FailReported`     |
/// | `FailReported`     | `CtlKind::Renew`                        | a new pair                          | `Idle`             |
/// | `Connected`        | accept made the socket                  |                                     | `Connected`        |
///
/// It moves only by [`Conn::next`] (through `Sock::conn_moves`), whose moves are those
/// of this table as [`ConnEvent`]s (a failed connect with its pair filled goes by
/// `Refused` and then `Detached`); the unit tests check every move against it.
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
    /// `Tx::detach_pair`), `pair` is a placeholder whose peer is gone.
    Failed,
    /// `Failed`, and a later connect has reported the failure (and reset the host
    /// socket, as the kernel's does): the next one asks the shim to renew the pair.
    FailReported,
}

/// What moves a [`Conn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnEvent {
    /// A connect answered 0, or an accept made the socket.
    Connected,
    /// A connect answered `EINPROGRESS`.
    InProgress(SocketAddr),
    /// `REQ_FILLED` with a non-blocking connect.
    Filled,
    /// The connect in progress ended with `SO_ERROR` 0.
    Succeeded,
    /// It ended with an error.
    Refused,
    /// The pair was detached after a non-blocking connect failed.
    Detached,
    Listen,
    /// A connect after the failure reported it.
    Reported,
    /// `CtlKind::Renew`: a new pair.
    Renewed,
}

impl Conn {
    /// The move `ev` makes from here; `None`: not a legal move.
    pub(crate) fn next(self, ev: ConnEvent) -> Option<Conn> {
        use Conn::*;
        Some(match (self, ev) {
            (Idle, ConnEvent::Connected) => Connected,
            (Idle, ConnEvent::InProgress(to)) => Connecting { to, filled: false },
            (Connecting { to, .. }, ConnEvent::Filled) => Connecting { to, filled: true },
            (Connecting { .. }, ConnEvent::Succeeded) => Connected,
            (Connecting { .. }, ConnEvent::Refused) => Idle,
            (Idle, ConnEvent::Detached) => Failed,
            (Idle | Listening, ConnEvent::Listen) => Listening,
            (Failed, ConnEvent::Reported) => FailReported,
            (FailReported, ConnEvent::Renewed) => Idle,
            _ => return None,
        })
    }
}

/// How much of the host stream's ending the program's end of the pair shows. It only
/// moves forward (a renewed pair starts `Open` again):
///
/// | state  | event                                              | action                           | next  |
/// |--------|----------------------------------------------------|----------------------------------|-------|
/// | `Open` | the end of the stream is read (0, or the error kept for `SO_ERROR`), or a token check sees `POLLRDHUP` | shut the pair's write side (the program reads 0, polls `POLLRDHUP`) | `Eof` |
/// | `Eof`  | `RecvSide::hup_due` (the host socket hung up), program's end open | publish the channel's completions; shut the read side too | `Hup` |
///
/// It moves only by [`PairEnd::next`] (through `Sock::pair_end_moves`).
///
/// In `Hup` both directions of the pair are shut, so our end reports `EPOLLHUP` while
/// the program's end is still open (see `SockTable::app_alive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum PairEnd {
    #[default]
    Open,
    /// The end of the stream is mirrored.
    Eof,
    /// The end of the stream and the hang-up are mirrored.
    Hup,
}

impl PairEnd {
    /// The move to `to` from here: forward one step, or back to `Open` with a renewed
    /// pair; `None`: not a legal move.
    pub(crate) fn next(self, to: PairEnd) -> Option<PairEnd> {
        use PairEnd::*;
        match (self, to) {
            (Open, Eof) | (Eof, Hup) | (_, Open) => Some(to),
            _ => None,
        }
    }
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
    /// The processes that may act on this socket.
    pub holders: Holders,
    /// Options set (the last value of each), replayed when the socket moves.
    pub opts: Vec<(i32, i32, Vec<u8>)>,
    /// The port of the program's bind to the wildcard address (0.0.0.0 or ::), which put
    /// the socket in the sandbox: a client that then connects or sends elsewhere moves to
    /// the host (`Placing::move_to_host`).
    pub bound_wild: Option<u16>,
    /// A datagram socket that holds a port the program chose on the host: only the peers
    /// it sent to or connected to (the last few) may send to it (see `reach.rs`).
    pub contacted: Option<Vec<SocketAddr>>,
    /// The readiness token: whether the shim polls this socket, and whether a token
    /// byte lies in the pair for it.
    token: Token,
    /// How much of the host stream's ending the program's end of the pair shows.
    pair_end: PairEnd,
    /// The receive side: the path its bytes take, the host stream's end, urgent data
    /// (see `recv_side.rs`).
    pub rx: RecvSide,
    pub parked: VecDeque<Parked>,
    pub txq: VecDeque<TxItem>,
    /// Where the connection stands (see [`Conn`]; moved by [`Sock::conn_moves`]).
    conn: Conn,
    /// Error left by the last connect, for `SO_ERROR`.
    pub so_error: i32,
    /// The program has closed its last reference.
    pub app_closed: bool,
    /// The program's end was found gone by a poll that saw no out-of-band byte unread
    /// (`SockTable::app_gone`): what is left in the pair is the program's own bytes, and
    /// a peek tells them. (`FIONREAD` cannot: the kernel keeps counting a filler's
    /// marker after a read has passed it.)
    pub pair_unmarked: bool,
    /// Since `app_closed`, our end of the pair is still in the event loop: a socket
    /// that closes in the same turn leaves it by closing; one that stays is taken out
    /// at the end of the turn (`Server::settle_dirty`).
    pub pair_listed: bool,
    /// Our end of the pair is watched for room (`EPOLLOUT`): set once a pump stopped on
    /// a full pair (`Rx::pump`), kept until the pair is renewed.
    pub pair_room_watched: bool,
    /// What waits on the way out: the program's bytes in the pair, the filler behind
    /// them, a reset of the pair, a `SHUT_WR` (private flags, moved by
    /// [`SendSide::moves`]).
    pub send: SendSide,
    /// Records of other threads' channels that the program's `close` or `shutdown`
    /// of this socket came after: the host socket keeps them company until they are
    /// taken (see [`crate::channel::Fence`]).
    pub fence: crate::channel::Fence,
    /// A hang-up or reset has been reported to the program.
    pub hup_reported: bool,
    /// The port this socket listens on, and whether on the wildcard (counted in
    /// `Shared`'s listeners until the socket goes).
    pub listens_on: Option<(u16, bool)>,
    /// The channel that last used this socket (where unsolicited errors go).
    pub last_ch: u32,
    pub stats: SocketStats,
    /// The bond's source address this socket was bound to (egress bonding).
    pub egress: Option<Lease>,
    /// Whether the connection goes to the program (`--handoff`).
    pub handoff: Handoff,
}

/// A stream connecting to a `--handoff` destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Handoff {
    #[default]
    No,
    /// A blocking connect is in progress: handed off if it succeeds; a refusal is
    /// answered as any (the socket stays served, so the program may connect again, as
    /// natively).
    WhenConnected,
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
    /// A new socket `id` made by or for `owner`: `kind` is (domain, type, protocol),
    /// `fd` its host socket, placed at `place`; `pair` our end of its readiness pair and
    /// the program end's name. Unconnected, on the ring path.
    pub(crate) fn new(
        id: u32,
        kind: (i32, i32, i32),
        fd: OwnedFd,
        place: Place,
        (pair, name): (OwnedFd, PairName),
        owner: Owner,
    ) -> Sock {
        let (domain, ty, protocol) = kind;
        Sock {
            id,
            domain,
            ty,
            protocol,
            fd,
            place,
            pair,
            name,
            holders: Holders::new(owner),
            opts: Vec::new(),
            bound_wild: None,
            contacted: None,
            token: Token::Unwanted,
            pair_end: PairEnd::Open,
            rx: RecvSide::new(),
            parked: Default::default(),
            txq: Default::default(),
            conn: Conn::Idle,
            so_error: 0,
            app_closed: false,
            pair_unmarked: false,
            pair_listed: false,
            pair_room_watched: false,
            handoff: Handoff::No,
            send: SendSide::default(),
            fence: Default::default(),
            hup_reported: false,
            listens_on: None,
            last_ch: 0,
            stats: crate::SocketStats {
                id,
                ..Default::default()
            },
            egress: None,
        }
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
        matches!(self.conn, Conn::Failed | Conn::FailReported)
    }

    /// The readiness token's state.
    pub(crate) fn token(&self) -> Token {
        self.token
    }

    /// Moves the token by `ev` when [`Token`]'s table allows it; false (and no move)
    /// otherwise.
    pub(crate) fn token_moves(&mut self, ev: TokenEvent) -> bool {
        self.token.next(ev).map(|t| self.token = t).is_some()
    }

    /// How far the host stream's ending reached the pair.
    pub(crate) fn pair_end(&self) -> PairEnd {
        self.pair_end
    }

    /// Moves the pair's end to `to` when [`PairEnd::next`] allows it; false otherwise.
    pub(crate) fn pair_end_moves(&mut self, to: PairEnd) -> bool {
        self.pair_end.next(to).map(|p| self.pair_end = p).is_some()
    }

    /// Where the connection stands.
    pub(crate) fn conn(&self) -> Conn {
        self.conn
    }

    /// Moves the connection by `ev` when [`Conn`]'s table allows it; false (and no
    /// move) otherwise.
    pub(crate) fn conn_moves(&mut self, ev: ConnEvent) -> bool {
        match self.conn.next(ev) {
            Some(c) => {
                self.conn = c;
                true
            }
            None => {
                debug!("socket {}: {ev:?} refused in {:?}", self.id, self.conn);
                false
            }
        }
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
        self.rx.pair() && self.conn == Conn::Connected
    }

    /// The end of the stream reaches the program's end of the pair (POLLIN|POLLRDHUP,
    /// then 0 from a read): the pair's write side is shut, once.
    pub(crate) fn mirror_eof(&mut self, io: &dyn Io) {
        if self.pair_end_moves(PairEnd::Eof) {
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
        if let Some(b) = self.rx.urgent_held() {
            if io.send_oob(self.pair.as_fd(), b).is_err() {
                return false;
            }
            self.rx.urgent_moves(UrgentEvent::Through);
        }
        if !self.rx.urgent_due() || !io.at_mark(self.fd.as_fd()).unwrap_or(false) {
            // No urgent data, or bytes ahead of the mark to read first.
            return true;
        }
        let mut b = [0u8; 1];
        match io.recv(self.fd.as_fd(), &mut b, libc::MSG_OOB | libc::MSG_DONTWAIT) {
            Ok(1) => {
                self.stats.bytes_in += 1;
                if io.send_oob(self.pair.as_fd(), b[0]).is_err() {
                    self.rx.urgent_moves(UrgentEvent::Kept(b[0]));
                    return false;
                }
                self.rx.urgent_moves(UrgentEvent::Through);
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            // Read already (the program asked the server for it first), or kept inline
            // (`SO_OOBINLINE`: the pump moves it with the rest).
            _ => {
                self.rx.urgent_moves(UrgentEvent::Through);
                true
            }
        }
    }

    /// With `rx_pair`, the answer to a receive on a connected stream whose bytes go
    /// through the pair: how the stream ended (0, or the error that ended it, reported
    /// once) or `EAGAIN` while it has not. `None`: not such a socket.
    pub(crate) fn stream_end(&mut self) -> Option<Result<(), Errno>> {
        if !self.reads_pair() {
            return None;
        }
        if self.pair_end == PairEnd::Open {
            return Some(Err(Errno(libc::EAGAIN)));
        }
        Some(match std::mem::take(&mut self.so_error) {
            0 => Ok(()),
            e => Err(Errno(e)),
        })
    }

    /// Edge-triggered epoll wants an edge for every arrival of new data, even while the
    /// socket is already readable: adds a token byte per new-data edge (`events`), a
    /// few at most between two drains.
    pub(crate) fn edge_token(&mut self, io: &dyn Io, events: u32) {
        if self.token.next(TokenEvent::Edge).is_none()
            || events & libc::EPOLLIN as u32 == 0
            || self.listening()
        {
            return;
        }
        if io.send(std::os::fd::AsFd::as_fd(&self.pair), &[1]).is_ok() {
            self.token_moves(TokenEvent::Edge);
            self.stats.tokens += 1;
        }
    }

    /// Reads and discards the shim's filler in the pair (one read: see
    /// `Tx::drain_filler`).
    pub(crate) fn drain_filler(&mut self, io: &dyn Io) {
        let mut buf = [0u8; 16 << 10];
        let _ = io.discard(std::os::fd::AsFd::as_fd(&self.pair), &mut buf);
        self.stats.room_waits += 1;
    }

    /// `connect(AF_UNSPEC)` : a datagram socket's association dissolves;
    /// a stream cannot (`EAFNOSUPPORT`, as the kernel's TCP says).
    pub(crate) fn disconnect(&self, io: &dyn Io) -> Result<(), Errno> {
        if self.is_stream() {
            return Err(Errno(libc::EAFNOSUPPORT));
        }
        io.connect_unspec(self.fd.as_fd())
            .map_err(|e| Errno::of(&e))
    }

    /// `setsockopt` : refused (`EPERM`) where it would let the sandbox
    /// reach what it may not (`sockopt.rs`, `reach.rs`); a value set is kept for a move.
    pub(crate) fn setopt(
        &mut self,
        io: &dyn Io,
        host_addrs: &mut ferry_egress::HostAddrs,
        (level, name): (i32, i32),
        value: &[u8],
    ) -> Result<(), Errno> {
        let id = self.id;
        let s = self;
        let sticky_source =
            (level, name) == (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) && s.place != Place::Sandbox;
        let refused = sockopt::refused(level, name, value).map(str::to_owned);
        let refused = match cmsg::in6_pktinfo(value).filter(|_| sticky_source) {
            Some((index, ip)) if refused.is_none() => {
                ferry_egress::reach::source_refused(host_addrs, index, ip)
            }
            _ => refused,
        };
        if let Some(why) = refused {
            if (level, name) == (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) {
                // Tried by every `curl --interface` (it falls back to the interface's
                // address, as for an unprivileged user): refused quietly.
                debug!("socket {id}: SO_BINDTODEVICE refused: {why}");
            } else {
                warn!("socket {id}: setsockopt({level}, {name}) refused: {why}");
            }
            return Err(Errno(libc::EPERM));
        }
        match io.setsockopt(s.fd.as_fd(), level, name, value) {
            Ok(()) => {
                // Kept for a move (one value per option: bounded).
                s.opts.retain(|(l, n, _)| (*l, *n) != (level, name));
                s.opts.push((level, name, value.to_vec()));
                if (level, name) == (libc::SOL_SOCKET, libc::SO_RCVBUF) {
                    crate::ops::bound_pair(io, s, value);
                }
                Ok(())
            }
            Err(e) => Err(Errno::of(&e)),
        }
    }

    /// The host socket's hang-up is due on the program's end of the pair and not there
    /// yet: it has been reported, and the end of the stream has reached the pair (see
    /// `Rx::mirror_hup`).
    pub(crate) fn hup_to_mirror(&self) -> bool {
        self.rx.hup_due() && self.pair_end == PairEnd::Eof && !self.app_closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(pid: i32) -> Owner {
        Owner { pid, start: 1 }
    }

    fn to() -> SocketAddr {
        "192.0.2.1:80".parse().unwrap()
    }

    /// [`Conn`]'s doc table as [`ConnEvent`]s, row by row.
    fn conn_moves() -> Vec<(Conn, ConnEvent, Conn)> {
        use Conn::*;
        let (open, filled) = (
            Connecting {
                to: to(),
                filled: false,
            },
            Connecting {
                to: to(),
                filled: true,
            },
        );
        vec![
            (Idle, ConnEvent::Connected, Connected),
            (Idle, ConnEvent::InProgress(to()), open),
            (Idle, ConnEvent::Listen, Listening),
            (Listening, ConnEvent::Listen, Listening),
            (open, ConnEvent::Filled, filled),
            (filled, ConnEvent::Filled, filled),
            (open, ConnEvent::Succeeded, Connected),
            (filled, ConnEvent::Succeeded, Connected),
            (open, ConnEvent::Refused, Idle),
            (filled, ConnEvent::Refused, Idle),
            (Idle, ConnEvent::Detached, Failed),
            (Failed, ConnEvent::Reported, FailReported),
            (FailReported, ConnEvent::Renewed, Idle),
        ]
    }

    #[test]
    fn conn_moves_exactly_as_its_table_says() {
        let table = conn_moves();
        let states = [
            Conn::Idle,
            Conn::Connecting {
                to: to(),
                filled: false,
            },
            Conn::Connecting {
                to: to(),
                filled: true,
            },
            Conn::Connected,
            Conn::Listening,
            Conn::Failed,
            Conn::FailReported,
        ];
        let events = [
            ConnEvent::Connected,
            ConnEvent::InProgress(to()),
            ConnEvent::Filled,
            ConnEvent::Succeeded,
            ConnEvent::Refused,
            ConnEvent::Detached,
            ConnEvent::Listen,
            ConnEvent::Reported,
            ConnEvent::Renewed,
        ];
        for s in states {
            for ev in events {
                let row = table
                    .iter()
                    .find(|(f, e, _)| *f == s && *e == ev)
                    .map(|r| r.2);
                assert_eq!(s.next(ev), row, "{s:?} on {ev:?}");
            }
        }
    }

    #[test]
    fn a_failed_connect_is_reported_once_then_needs_a_new_pair() {
        let mut c = Conn::Idle;
        for ev in [
            ConnEvent::InProgress(to()),
            ConnEvent::Filled,
            ConnEvent::Refused,
            ConnEvent::Detached,
            ConnEvent::Reported,
        ] {
            c = c.next(ev).unwrap_or_else(|| panic!("{ev:?} from {c:?}"));
        }
        assert_eq!(c, Conn::FailReported);
        assert_eq!(c.next(ConnEvent::Reported), None, "reported once");
        assert_eq!(
            c.next(ConnEvent::InProgress(to())),
            None,
            "no connect before renewal"
        );
        assert_eq!(c.next(ConnEvent::Renewed), Some(Conn::Idle));
        assert_eq!(Conn::Connected.next(ConnEvent::Detached), None);
        assert_eq!(Conn::Connected.next(ConnEvent::Listen), None);
    }

    #[test]
    fn token_moves_exactly_as_its_table_says() {
        use Token::*;
        let out = |extra| Out { extra };
        let table = [
            (Unwanted, TokenEvent::Want, Wanted),
            (Wanted, TokenEvent::Written, out(0)),
            (out(0), TokenEvent::Edge, out(1)),
            (out(7), TokenEvent::Edge, out(8)),
            (out(0), TokenEvent::Drained, Wanted),
            (out(7), TokenEvent::Drained, Wanted),
            (out(8), TokenEvent::Drained, Wanted),
        ];
        let states = [Unwanted, Wanted, out(0), out(7), out(8)];
        let events = [
            TokenEvent::Want,
            TokenEvent::Drained,
            TokenEvent::Written,
            TokenEvent::Edge,
        ];
        for s in states {
            for ev in events {
                let row = table
                    .iter()
                    .find(|(f, e, _)| *f == s && *e == ev)
                    .map(|r| r.2);
                assert_eq!(s.next(ev), row, "{s:?} on {ev:?}");
            }
        }
    }

    #[test]
    fn the_pairs_end_moves_forward_one_step_until_renewed() {
        use PairEnd::*;
        let all = [Open, Eof, Hup];
        for from in all {
            for to in all {
                let legal = matches!((from, to), (Open, Eof) | (Eof, Hup) | (_, Open));
                assert_eq!(from.next(to), legal.then_some(to), "{from:?} to {to:?}");
            }
        }
    }

    #[test]
    fn holders_of_a_socket_inherited_by_many_short_lived_children_stay_few() {
        let mut h = Holders::new(owner(1));
        // Children that have all exited by the time the list is pruned, but the first.
        for pid in 2..1000 {
            h.add_pruning(owner(pid), |o| o.pid == 1);
            assert!(
                h.list.len() <= 9,
                "{} holders after pid {pid}",
                h.list.len()
            );
        }
        assert!(h.contains(owner(1)), "the live holder is kept");
        assert!(h.contains(owner(999)), "the newest holder is added");
        assert!(!h.contains(owner(2)), "an exited holder is pruned");
    }

    #[test]
    fn live_holders_are_never_pruned_and_the_list_grows_by_doubling() {
        let mut h = Holders::new(owner(1));
        for pid in 2..=40 {
            h.add_pruning(owner(pid), |_| true);
        }
        assert_eq!(h.list.len(), 40);
        assert!((1..=40).all(|p| h.contains(owner(p))));
        // The same process again is not a second holder; one of the same pid but
        // another start time (the pid used again) is another process.
        h.add_pruning(owner(7), |_| true);
        assert_eq!(h.list.len(), 40);
        assert!(!h.contains(Owner { pid: 7, start: 2 }));
        assert!(h.prune_at > 40 && h.prune_at <= 2 * 40);
    }
}
