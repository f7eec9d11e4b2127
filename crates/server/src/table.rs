//! The socket table: making a socket's readiness pair and its `Sock`, installing it in
//! this server's loop (or handing it to its server), replacing its host socket when it
//! moves, detaching and renewing its pair, knowing when the program has closed its last
//! descriptor (the pair's hang-up, its name), and closing what is done. Must not: answer
//! requests (`ops.rs`) or move data (`tx.rs`, `rx.rs`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use tracing::{debug, warn};

use crate::group::Msg;
use crate::ops::Errno;
use crate::server::{Server, T_HOST, T_PAIR, host_events, pair_events, token};
use crate::sock::{Conn, NewPair, Owner, PairEnd, Place, Sock};

impl Server {
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
            fence: Default::default(),
            hup_reported: false,
            handing_off: false,
            handoff_when_connected: false,
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
        let Some(s) = self.socks.get_mut(&id) else {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        };
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
    pub(crate) fn pair_alive(&mut self, id: u32, events: u32) -> bool {
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
        let s = self.socks.get_mut(&id).ok_or(Errno(libc::EBADF))?;
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
        if self.socks.get(&id).is_none_or(|s| s.app_closed) {
            return;
        }
        // Sends another thread queued before the close are still to come.
        let fence = self.channels.fence(None);
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        s.app_closed = true;
        s.fence = fence;
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
    /// is gone and whose sends are done, and shuts those down for writing whose
    /// `shutdown` waited for other threads' sends. A socket whose fence other channels
    /// have not passed yet is looked at again after the next pass over the rings.
    pub(crate) fn settle_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        let mut fenced = Vec::new();
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
                self.flush_tx(id);
            }
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
        self.dirty.extend(fenced);
    }
}
