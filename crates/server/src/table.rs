//! The socket table: making a socket's readiness pair and its `Sock`, installing it in
//! this server's loop (or handing it to its server), replacing its host socket when it
//! moves, detaching and renewing its pair, knowing when the program has closed its last
//! descriptor (the pair's hang-up, its name), and closing what is done. Must not: answer
//! requests (`ops.rs`) or move data (`tx.rs`, `rx.rs`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::ops::{Errno, MAX_PARKED_PER_CHANNEL};
use crate::send_side::SendEvent;
use ferry_sys::Epoll;

use crate::channel::Channels;
use crate::seam::Io;
use crate::server::Server;
use crate::sock::{Conn, ConnEvent, NewPair, PairEnd, Parked, Place, Sock};
use crate::token::{T_HOST, T_PAIR, host_events, pair_events, token};

/// How the program's end of a pair was found closed. Either way nothing more can enter
/// our end: the hang-up means the program's end has shut its sending side or gone, and
/// the probe that its last descriptor has gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    /// The hang-up seen was the program's close; `reset`: our end's error was set with
    /// it (`POLLERR`: the end went with bytes unread), read from the same readiness.
    Seen { reset: bool },
    /// The name probe said so (our own hang-up came first): the error is to be asked.
    Probed,
}

/// Hashes a socket id for [`SockTable`]: a multiplication (Fibonacci hashing) instead
/// of SipHash, which took ~1% of a server's time on redis GETs. The ids are the
/// server's own serials (`Shared::new_id`), so nothing the sandbox chooses collides.
#[derive(Debug, Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // A product's low bits depend only on the id's low bits (a server's index,
        // the same for all its ids): the high half, which depends on all, is folded in.
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.0 = (self.0 ^ u64::from(id)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A server's sockets, by id, and the work noticed on them for later in the turn:
/// sockets whose state changed (closing, a fence to pass: `settle_dirty`), sockets
/// with sends queued during this pass of the rings (`flush_pending`), and sockets
/// whose program-written pair bytes wait for the end of the pass (`pair_input`).
/// Each list holds ids only; a socket gone meanwhile is skipped.
#[derive(Debug, Default)]
pub(crate) struct SockTable {
    socks: HashMap<u32, Sock, BuildHasherDefault<IdHasher>>,
    dirty: Vec<u32>,
    tx_pending: Vec<u32>,
    pair_resume: Vec<u32>,
    /// An unbound unix socket of the server's namespace: binding it to a pair's name
    /// tells whether the program's end is still open (see `app_alive`).
    probe: Option<OwnedFd>,
}

impl SockTable {
    pub(crate) fn get(&self, id: &u32) -> Option<&Sock> {
        self.socks.get(id)
    }

    pub(crate) fn get_mut(&mut self, id: &u32) -> Option<&mut Sock> {
        self.socks.get_mut(id)
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        self.socks.contains_key(&id)
    }

    #[cfg(test)]
    pub(crate) fn insert(&mut self, sock: Sock) {
        self.socks.insert(sock.id, sock);
    }

    pub(crate) fn remove(&mut self, id: &u32) -> Option<Sock> {
        self.socks.remove(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.socks.len()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Sock> {
        self.socks.values()
    }

    /// The ids of every socket, in no order.
    pub(crate) fn ids(&self) -> Vec<u32> {
        self.socks.keys().copied().collect()
    }

    /// Operations waiting for their host sockets: parked ones and queued sends.
    pub(crate) fn outstanding(&self) -> usize {
        self.socks
            .values()
            .map(|s| s.parked.len() + s.txq.len())
            .sum()
    }

    /// Some socket still has bytes of the program's to send.
    pub(crate) fn sending(&self) -> bool {
        self.socks
            .values()
            .any(|s| !s.txq.is_empty() || s.send.pair_waits())
    }

    /// Socket `id`'s state changed: `settle_dirty` looks at it this turn.
    pub(crate) fn mark_dirty(&mut self, id: u32) {
        self.dirty.push(id);
    }

    pub(crate) fn take_dirty(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.dirty)
    }

    /// Socket `id` has sends queued in this pass of the rings.
    pub(crate) fn queue_tx(&mut self, id: u32) {
        self.tx_pending.push(id);
    }

    pub(crate) fn take_tx_pending(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.tx_pending)
    }

    /// Socket `id`'s pair bytes go out at the end of this pass of the rings.
    pub(crate) fn resume_pair_input(&mut self, id: u32) {
        self.pair_resume.push(id);
    }

    pub(crate) fn take_pair_resume(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.pair_resume)
    }

    /// Channel `ch` closed: its parked operations have nobody to answer any more (a
    /// closed socket that waited only for them can go).
    pub(crate) fn drop_parked_of(&mut self, ch: u32) {
        for s in self.socks.values_mut() {
            let before = s.parked.len();
            s.parked.retain(|p| p.owner().0 != ch);
            if s.app_closed && s.parked.len() != before {
                self.dirty.push(s.id);
            }
        }
    }

    /// Registers a socket of this server: its host socket and readiness pair join the
    /// event loop.
    pub(crate) fn install(&mut self, epoll: &Epoll, sock: Sock) -> io::Result<()> {
        SockTable::register(
            epoll,
            sock.id,
            sock.fd.as_fd(),
            sock.pair.as_fd(),
            sock.rx.pair(),
        )?;
        self.socks.insert(sock.id, sock);
        Ok(())
    }

    /// Adds socket `id`'s host socket `fd` and our end of its pair to the loop, the
    /// pair watched as `rx_pair` says ([`pair_events`]); neither when one fails.
    pub(crate) fn register(
        epoll: &Epoll,
        id: u32,
        fd: BorrowedFd<'_>,
        pair: BorrowedFd<'_>,
        rx_pair: bool,
    ) -> io::Result<()> {
        epoll.add(fd, host_events(), token(T_HOST, id))?;
        if let Err(e) = epoll.add(pair, pair_events(rx_pair), token(T_PAIR, id)) {
            let _ = epoll.delete(fd);
            return Err(e);
        }
        Ok(())
    }

    /// Installs `sock`, made ahead and registered then for the pair path
    /// ([`SockTable::register`]): a socket of a channel that receives through the ring
    /// has its pair's watch changed. Returns its id.
    pub(crate) fn adopt_registered(&mut self, epoll: &Epoll, sock: Sock) -> io::Result<u32> {
        let id = sock.id;
        if !sock.rx.pair() {
            epoll.modify(sock.pair.as_fd(), pair_events(false), token(T_PAIR, id))?;
        }
        self.socks.insert(id, sock);
        Ok(id)
    }

    /// Replaces a socket's host socket (provisional → host or sandbox namespace).
    pub(crate) fn replace_host_fd(
        &mut self,
        io: &dyn Io,
        epoll: &Epoll,
        id: u32,
        fd: OwnedFd,
        place: Place,
    ) -> io::Result<()> {
        let Some(s) = self.socks.get_mut(&id) else {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        };
        for (level, name, value) in &s.opts {
            if let Err(e) = io.setsockopt(fd.as_fd(), *level, *name, value) {
                debug!("socket {id}: replaying option {level}/{name}: {e}");
            }
        }
        let _ = epoll.delete(s.fd.as_fd());
        epoll.add(fd.as_fd(), host_events(), token(T_HOST, id))?;
        s.fd = fd;
        s.place = place;
        s.rx.input_edge();
        Ok(())
    }

    /// Our end of socket `id`'s pair reported `events` with `EPOLLHUP` or `EPOLLERR`:
    /// whether the program's end is still open. The hang-up means the program has
    /// closed its last descriptor (the kernel shuts both of our directions then), unless
    /// we shut both ourselves (`Rx::mirror_hup`) or closed our end (`detach_pair`);
    /// then the pair's name says. `EPOLLERR` (the program's end went with bytes unread)
    /// always means closed. `None` while it is open, else how it was found gone.
    /// `pri_asked`: `events` answers for `EPOLLPRI` too, which a unix stream socket
    /// reports while an out-of-band byte is unread; without it, a pair found gone holds
    /// no filler marker, and since nothing can enter it any more ([`Gone`]), one peek
    /// tells the program's last bytes ([`Sock::pair_unmarked`]).
    pub(crate) fn gone_by(
        &mut self,
        io: &dyn Io,
        id: u32,
        events: u32,
        pri_asked: bool,
    ) -> Option<Gone> {
        let gone = self.gone_by_events(io, id, events)?;
        if pri_asked
            && events & libc::EPOLLPRI as u32 == 0
            && let Some(s) = self.socks.get_mut(&id)
        {
            s.pair_unmarked = true;
        }
        Some(gone)
    }

    fn gone_by_events(&mut self, io: &dyn Io, id: u32, events: u32) -> Option<Gone> {
        if events & libc::EPOLLERR as u32 != 0 {
            return Some(Gone::Seen { reset: true });
        }
        let ours = self
            .socks
            .get(&id)
            .is_some_and(|s| s.pair_end() == PairEnd::Hup || s.pair_detached());
        if !ours {
            return Some(Gone::Seen { reset: false });
        }
        (!self.app_alive(io, id)).then_some(Gone::Probed)
    }

    /// `CtlKind::Renew`: stream `id`, whose pair was detached when a non-blocking
    /// connect failed and which the kernel has reset since, connects again: it gets a
    /// new pair (a new name), joins the loop as a new socket's does, and starts over
    /// as unconnected. Returns the program's end.
    pub(crate) fn renew_pair(
        &mut self,
        io: &dyn Io,
        epoll: &Epoll,
        id: u32,
    ) -> Result<OwnedFd, Errno> {
        let Some(s) = self.socks.get(&id) else {
            return Err(Errno(libc::EBADF));
        };
        if s.conn() != Conn::FailReported || !s.is_stream() {
            return Err(Errno(libc::EINVAL));
        }
        let NewPair { ours, theirs, name } = io.new_pair(id).map_err(|e| Errno::of(&e))?;
        epoll
            .add(ours.as_fd(), pair_events(s.rx.pair()), token(T_PAIR, id))
            .map_err(|e| Errno::of(&e))?;
        let s = self.socks.get_mut(&id).ok_or(Errno(libc::EBADF))?;
        s.pair = ours;
        s.name = name;
        s.conn_moves(ConnEvent::Renewed);
        s.pair_end_moves(PairEnd::Open);
        s.hup_reported = false;
        s.pair_room_watched = false;
        s.send.moves(SendEvent::Renewed);
        s.so_error = 0;
        s.rx.renewed();
        debug!("socket {id}: readiness pair renewed to connect again");
        Ok(theirs)
    }

    /// Whether the program has closed its last descriptor of socket `id`, asked now
    /// (our end of the pair has hung up, and not by our own doing); the poll asks for
    /// `POLLPRI` too (see [`SockTable::gone_by`]).
    pub(crate) fn app_gone(&mut self, io: &dyn Io, id: u32) -> Option<Gone> {
        let s = self.socks.get(&id)?;
        let rev = io.poll_now(s.pair.as_fd(), libc::POLLPRI).unwrap_or(0);
        let rev = u32::from(rev.cast_unsigned());
        if rev & (libc::POLLHUP | libc::POLLERR) as u32 == 0 {
            return None;
        }
        self.gone_by(io, id, rev, true)
    }

    /// Whether the program's end of socket `id`'s pair is still open, from its name in
    /// the server's network namespace: binding the probe to it fails with `EADDRINUSE`
    /// while any process holds that end (the name goes with its last descriptor, and
    /// names are never used twice). When the probe cannot be made or bound, the end
    /// counts as open: the socket is then released when the sandbox ends, not before.
    fn app_alive(&mut self, io: &dyn Io, id: u32) -> bool {
        let Some(name) = self.socks.get(&id).map(|s| s.name) else {
            return false;
        };
        let probe = match self.probe.take() {
            Some(p) => p,
            None => match io.unix_socket() {
                Ok(p) => p,
                Err(e) => {
                    warn!("socket {id}: cannot make a name probe: {e}");
                    return true;
                }
            },
        };
        match io.bind_abstract(probe.as_fd(), &name) {
            // The name was free: the end is gone (dropping the probe frees it again).
            Ok(()) => false,
            Err(e) => {
                if e.raw_os_error() != Some(libc::EADDRINUSE) {
                    warn!("socket {id}: name probe: {e}");
                }
                self.probe = Some(probe);
                true
            }
        }
    }

    /// Parks a blocking operation of socket `id` until its host socket is ready. A
    /// shim's thread has one request in flight at a time: a channel with more than a
    /// few parked on one socket breaks the protocol (and would grow the queue without
    /// bound); false then, and nothing is parked.
    pub(crate) fn park(&mut self, id: u32, p: Parked) -> bool {
        let ch = p.owner().0;
        let Some(s) = self.socks.get_mut(&id) else {
            return true;
        };
        if s.parked.iter().filter(|q| q.owner().0 == ch).count() >= MAX_PARKED_PER_CHANNEL {
            return false;
        }
        s.parked.push_back(p);
        true
    }

    /// Puts back an operation that still waits, ahead of the others.
    pub(crate) fn park_front(&mut self, id: u32, p: Parked) {
        if let Some(s) = self.socks.get_mut(&id) {
            s.parked.push_front(p);
        }
    }

    /// Takes socket `id`'s first parked operation matching `pred`.
    pub(crate) fn unpark(&mut self, id: u32, pred: impl Fn(&Parked) -> bool) -> Option<Parked> {
        let s = self.socks.get_mut(&id)?;
        let i = s.parked.iter().position(pred)?;
        s.parked.remove(i)
    }

    /// Whether channel `ch`'s process may act on socket `id` (it made, accepted or
    /// claimed it). An unknown socket counts as usable here: the operation then finds
    /// no socket and says `EBADF` itself.
    pub(crate) fn may_use(&self, channels: &Channels, ch: u32, id: u32) -> bool {
        let (Some(c), Some(s)) = (channels.get(ch), self.get(&id)) else {
            return true;
        };
        s.holders.contains(c.owner)
    }
}

/// Connected streams the program closed, done with, whose closing (the host socket's
/// `close(2)`, where the kernel sends the FIN or reset and tears the connection down,
/// tens of µs; and the pair's) waits for a turn with nothing to do: it then costs no
/// request its time (a program of short connections asks for its next socket right
/// after its close). A ring path's pair has left the event loop (it is level-triggered);
/// an edge-triggered pair and the host socket stay in it until closed, and an event of
/// one finds no socket and is ignored. Bounded: closed
/// once [`Closing::MAX_HELD`] wait or the oldest has waited [`Closing::MAX_WAIT`], at a
/// bind's `EADDRINUSE` and when the server stops. Only connected streams: a port such a
/// socket holds stays taken after the kernel's `close` too (the connection ends after
/// it), where a listener's or a bound socket's is free when `close` returns.
#[derive(Debug, Default)]
pub(crate) struct Closing {
    socks: Vec<Sock>,
    /// When the oldest came.
    since: Option<Instant>,
}

impl Closing {
    /// Sockets held at most.
    pub(crate) const MAX_HELD: usize = 64;
    /// How long the oldest waits at most.
    pub(crate) const MAX_WAIT: Duration = Duration::from_micros(200);

    fn hold(&mut self, s: Sock) {
        self.since.get_or_insert_with(Instant::now);
        self.socks.push(s);
    }

    /// Whether sockets wait.
    pub(crate) fn any(&self) -> bool {
        !self.socks.is_empty()
    }

    /// Whether they may wait no longer.
    pub(crate) fn overdue(&self) -> bool {
        self.socks.len() >= Self::MAX_HELD
            || self.since.is_some_and(|t| t.elapsed() >= Self::MAX_WAIT)
    }

    /// Closes the oldest.
    pub(crate) fn close_one(&mut self) {
        if !self.socks.is_empty() {
            drop(self.socks.remove(0));
        }
        if self.socks.is_empty() {
            self.since = None;
        }
    }

    /// Closes them all.
    pub(crate) fn close_all(&mut self) {
        self.socks.clear();
        self.since = None;
    }
}

impl Server {
    /// Finishes state changes noticed during the turn: closes sockets whose program side
    /// is gone and whose sends are done, and shuts those down for writing whose
    /// `shutdown` waited for other threads' sends. A socket whose fence other channels
    /// have not passed yet is looked at again after the next pass over the rings.
    pub(crate) fn settle_dirty(&mut self) {
        let dirty = self.socks.take_dirty();
        let mut fenced = Vec::new();
        // Sockets the program closed that stay for now: their pair leaves the loop.
        let unlisted: Vec<u32> = dirty
            .iter()
            .copied()
            .filter(|id| self.socks.get(id).is_some_and(|s| s.pair_listed))
            .collect();
        for id in dirty {
            let Some(s) = self.socks.get_mut(&id) else {
                continue;
            };
            if !s.fence.is_clear() {
                if !self.channels.passed(&s.fence) {
                    if !fenced.contains(&id) {
                        fenced.push(id);
                    }
                    continue;
                }
                s.fence = Default::default();
                // What they queued is sent (or waits for room), then a `SHUT_WR` that
                // waited happens (`after_sends`).
                self.tx().flush_tx(id);
            }
            let Some(s) = self.socks.get(&id) else {
                continue;
            };
            // A thread still blocked on the socket keeps it, as with the kernel (a close
            // in another thread does not end a blocked recv). A module writes its output
            // first.
            let idle =
                s.app_closed && s.txq.is_empty() && !s.send.pair_waits() && s.parked.is_empty();
            if idle && {
                let mut tx = self.tx();
                let (m, mut a) = tx.module_parts();
                m.settled(&mut a, id)
            } {
                let s = self.socks.remove(&id).expect("just looked it up");
                self.shared.socket_closed();
                if let Some((port, wildcard)) = s.listens_on
                    && self.shared.listener_down(port, wildcard) == 0
                {
                    self.published.refuse_waiting(&self.shared, port);
                }
                self.stats.closed_socket(s.stats);
                debug!("socket {id}: closed");
                if s.is_stream() && s.connected() {
                    // Closed in a turn with nothing to do (`Closing`). A level-triggered
                    // pair's (the ring path's) hang-up would wake every wait meanwhile;
                    // an edge-triggered one's was reported once, and a later event finds
                    // no socket and is ignored, as the host socket's: one call less.
                    if !s.rx.pair() {
                        let _ = self.epoll.delete(s.pair.as_fd());
                    }
                    self.closing.hold(s);
                }
                // Else dropping `s` closes the host socket, its only descriptor (a
                // handed-off one left the table before), which takes it out of the event
                // loop: no EPOLL_CTL_DEL.
            }
        }
        for id in fenced {
            self.socks.mark_dirty(id);
        }
        for id in unlisted {
            if let Some(s) = self.socks.get_mut(&id)
                && std::mem::take(&mut s.pair_listed)
            {
                let _ = self.epoll.delete(s.pair.as_fd());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::sock::Owner;

    #[test]
    fn socket_ids_hash_apart_in_the_top_bits_too() {
        // The table's groups are picked by the low bits and probed by the top 7: the
        // ids of one server (its index in the low bits, serials above) must spread
        // over both.
        let hash = |id: u32| {
            let mut h = IdHasher::default();
            h.write_u32(id);
            h.finish()
        };
        let ids = (1..=1024u32).map(|serial| serial << ferry_proto::SERVER_BITS | 3);
        let (mut top, mut low) = (HashSet::new(), HashSet::new());
        for id in ids {
            top.insert(hash(id) >> 57);
            low.insert(hash(id) & 1023);
        }
        assert!(top.len() > 100, "top 7 bits: {} values", top.len());
        assert!(low.len() > 500, "low 10 bits: {} values", low.len());
    }

    fn sock(id: u32) -> Sock {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let owner = Owner { pid: 1, start: 1 };
        let kind = (libc::AF_INET, libc::SOCK_STREAM, 0);
        Sock::new(
            id,
            kind,
            a.into(),
            Place::Host,
            (b.into(), ([0; ferry_proto::PAIR_NAME_MAX], 0)),
            owner,
        )
    }

    fn recv(ch: u32, tag: u32) -> Parked {
        Parked::Recv {
            ch,
            tag,
            len: 1,
            flags: 0,
        }
    }

    /// Whether the unix socket at the other end of `s`'s host socket is still open.
    fn host_open(peer: &UnixStream) -> bool {
        peer.set_nonblocking(true).expect("nonblocking");
        let mut b = [0u8; 1];
        matches!(
            std::io::Read::read(&mut &*peer, &mut b),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        )
    }

    #[test]
    fn closing_holds_sockets_in_order_and_is_overdue_when_full() {
        let mut c = Closing::default();
        assert!(!c.any() && !c.overdue());
        let mut peers = Vec::new();
        for id in 0..u32::try_from(Closing::MAX_HELD).expect("small") {
            let (host, peer) = UnixStream::pair().expect("socketpair");
            let mut s = sock(id);
            s.fd = host.into();
            peers.push(peer);
            c.hold(s);
        }
        // (Overdue by count; it may be by time as well on a slow machine.)
        assert!(c.overdue());
        assert!(
            peers.iter().all(host_open),
            "held sockets are not closed yet"
        );
        c.close_one();
        assert!(
            !host_open(&peers[0]) && host_open(&peers[1]),
            "the oldest goes first"
        );
        c.close_all();
        assert!(!c.any() && c.since.is_none());
        assert!(!peers.iter().any(host_open));
    }

    #[test]
    fn closing_is_overdue_once_the_oldest_waited_long_enough() {
        let mut c = Closing::default();
        c.hold(sock(1));
        std::thread::sleep(Closing::MAX_WAIT);
        assert!(c.overdue());
        c.close_one();
        assert!(!c.any() && !c.overdue());
    }

    #[test]
    fn a_closed_channels_parked_operations_go_and_only_closed_sockets_settle() {
        let mut t = SockTable::default();
        let (mut closed, mut open) = (sock(1), sock(2));
        closed.app_closed = true;
        closed
            .parked
            .extend([recv(1, 10), recv(2, 20), recv(1, 11)]);
        open.parked.extend([recv(1, 30)]);
        t.insert(closed);
        t.insert(open);
        let untouched = sock(3);
        t.insert(untouched);
        assert_eq!(t.outstanding(), 4);
        t.drop_parked_of(1);
        assert_eq!(t.outstanding(), 1);
        let left: Vec<_> = t
            .get(&1)
            .unwrap()
            .parked
            .iter()
            .map(Parked::owner)
            .collect();
        assert_eq!(left, [(2, 20)], "the other channel's operation stays");
        assert!(t.get(&2).unwrap().parked.is_empty());
        assert_eq!(
            t.take_dirty(),
            [1],
            "only the closed socket that lost some settles"
        );
        assert!(t.take_dirty().is_empty(), "taken once");
    }

    #[test]
    fn unpark_takes_the_first_match_and_keeps_the_rest_in_order() {
        let mut t = SockTable::default();
        let mut s = sock(5);
        s.parked.extend([
            recv(1, 1),
            Parked::Connect { ch: 1, tag: 2 },
            recv(1, 3),
            recv(1, 4),
        ]);
        t.insert(s);
        let got = t.unpark(5, |p| matches!(p, Parked::Recv { tag, .. } if *tag > 1));
        assert!(matches!(got, Some(Parked::Recv { tag: 3, .. })), "{got:?}");
        let tags: Vec<_> = t
            .get(&5)
            .unwrap()
            .parked
            .iter()
            .map(|p| p.owner().1)
            .collect();
        assert_eq!(tags, [1, 2, 4]);
        assert!(t.unpark(5, |p| p.owner().0 == 9).is_none());
        assert!(t.unpark(6, |_| true).is_none(), "no such socket");
    }

    #[test]
    fn a_channel_parks_a_few_operations_per_socket_and_no_more() {
        let mut t = SockTable::default();
        t.insert(sock(1));
        for tag in 0..u32::try_from(MAX_PARKED_PER_CHANNEL).unwrap() {
            assert!(t.park(1, recv(1, tag)));
        }
        assert!(!t.park(1, recv(1, 99)), "one too many from channel 1");
        assert!(t.park(1, recv(2, 0)), "channel 2 has its own few");
        t.park_front(1, recv(2, 7));
        let first = t.get(&1).unwrap().parked.front().map(Parked::owner);
        assert_eq!(
            first,
            Some((2, 7)),
            "a retried operation keeps its place first"
        );
        assert_eq!(t.outstanding(), MAX_PARKED_PER_CHANNEL + 2);
        assert!(t.park(9, recv(1, 0)), "no such socket: nothing to refuse");
    }

    #[test]
    fn the_turns_work_lists_are_handed_out_once_each() {
        let mut t = SockTable::default();
        t.insert(sock(1));
        t.queue_tx(1);
        t.resume_pair_input(1);
        t.mark_dirty(1);
        assert_eq!(t.take_tx_pending(), [1]);
        assert_eq!(t.take_pair_resume(), [1]);
        assert_eq!(t.take_dirty(), [1]);
        assert!(t.take_tx_pending().is_empty() && t.take_pair_resume().is_empty());
        assert!(!t.sending());
        t.get_mut(&1).unwrap().send.moves(SendEvent::PairWaits);
        assert!(t.sending(), "program bytes in the pair are still to send");
        assert!(t.contains(1) && !t.contains(2));
        assert_eq!(t.remove(&1).map(|s| s.id), Some(1));
        assert_eq!(t.len(), 0);
    }
}
