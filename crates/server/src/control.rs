//! Control connections and channels: who may open a channel (the sandbox's processes,
//! by the kernel's word), the Hello and its deadline, opening and closing a channel
//! (its region, doorbell and watch), control messages read off a channel's socket, and
//! sockets handed over by other servers. Must not: act on a socket (that is `ops.rs`'s
//! and the socket modules'), or wait on a peer.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use ferry_proto::{Ctl, CtlKind, HELLO_ROUTES, Hello, HelloReply, PROTO_VERSION};
use tracing::{debug, warn};

use ferry_sys::Epoll;

use crate::channel::{Channel, Channels};
use crate::group::Msg;
use crate::group::Shared;
use crate::modules::Modules;
use crate::procs::{descends_from, process_start};
use crate::seam::Io;
use crate::server::Server;
use crate::sock::Owner;
use crate::stats::ServerStats;
use crate::table::SockTable;
use crate::token::{T_CTL, T_DOORBELL, T_HELLO, T_LISTEN, token};
use crate::tx::Tx;
use crate::{Config, Error, LogThrottle};

/// How long a control connection may take to say Hello before it is closed.
pub(crate) const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Most control connections waiting for their Hello at once (the oldest gives way).
pub(crate) const MAX_PENDING_HELLO: usize = 64;

/// The control socket's side of a server (the first one's): the listener, who may
/// open a channel, and the connections waiting for their Hello (at most
/// [`MAX_PENDING_HELLO`], each for [`HELLO_TIMEOUT`]).
#[derive(Debug, Default)]
pub(crate) struct ControlConns {
    /// The control socket (the first server only).
    listener: Option<OwnedFd>,
    /// Connections that have not said Hello yet: the connection, the process that made
    /// it, and when it came.
    pending: HashMap<u32, (OwnedFd, Owner, Instant)>,
    next: u32,
    /// Only this process and its descendants may open channels.
    init_pid: Option<i32>,
    /// Log lines about refused connections, at most one a second.
    refusals: LogThrottle,
    /// Connections refused or closed before they became channels.
    refused: u64,
}

/// Whether a new control connection may wait for its Hello ([`ControlConns::admit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    Yes,
    /// The sandbox's channels are at their cap.
    Refused,
    /// [`MAX_PENDING_HELLO`] wait already: take those whose Hello has come, then
    /// [`ControlConns::make_room`].
    Crowded,
}

impl ControlConns {
    /// Binds the control socket at `cfg.socket_path` and adds it to `epoll`.
    pub(crate) fn bind(cfg: &Config, epoll: &Epoll) -> Result<ControlConns, Error> {
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
        Ok(ControlConns {
            listener: Some(listener),
            ..ControlConns::default()
        })
    }

    /// This server has the control socket.
    pub(crate) fn bound(&self) -> bool {
        self.listener.is_some()
    }

    /// Channels only from `init` and its descendants.
    pub(crate) fn restrict(&mut self, init: i32) {
        self.init_pid = Some(init);
    }

    /// The next connection on the control socket whose process may open a channel
    /// (those that may not are refused and counted); `None` when none is left now.
    pub(crate) fn accept(&mut self) -> Option<(OwnedFd, Owner)> {
        loop {
            let listener = self.listener.as_ref()?;
            match ferry_sys::accept4(listener.as_fd(), libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) {
                Ok((fd, _)) => match self.peer_owner(&fd) {
                    Some(owner) => return Some((fd, owner)),
                    None => self.refused += 1,
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) => {
                    // Out of descriptors, say: the connection waits in the backlog, and
                    // the next turn tries again (no spin: the listener is level-triggered
                    // but this loop gives up for the turn).
                    warn!("accept on control socket: {e}");
                    return None;
                }
            }
        }
    }

    /// The process at the other end of a new control connection, if it may open a
    /// channel: a process of the sandbox (once [`ControlConns::restrict`] was called),
    /// with a pid and start time the kernel vouches for.
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

    /// Whether a new control connection of `owner` may wait for its Hello: the
    /// sandbox's `channels` open (of `max` at most) and those waiting stay under the
    /// cap, and at most [`MAX_PENDING_HELLO`] wait at once.
    pub(crate) fn admit(&mut self, owner: Owner, channels: usize, max: usize) -> Admit {
        if channels + self.pending.len() >= max {
            if let Some(n) = self.refusals.tick() {
                warn!(
                    "the sandbox has {channels} channels open (--max-channels {max}): a new control connection from pid {} refused ({n} since the last line)",
                    owner.pid
                );
            }
            self.refused += 1;
            return Admit::Refused;
        }
        if self.pending.len() < MAX_PENDING_HELLO {
            Admit::Yes
        } else {
            Admit::Crowded
        }
    }

    /// The waiting connections whose Hello has come.
    pub(crate) fn ready(&self) -> Vec<u32> {
        self.pending
            .iter()
            .filter(|(_, (fd, _, _))| {
                ferry_sys::poll_now(fd.as_fd(), libc::POLLIN).unwrap_or(0) != 0
            })
            .map(|(n, _)| *n)
            .collect()
    }

    /// When [`MAX_PENDING_HELLO`] still wait: the oldest connection of the process
    /// with the most waiting gives way (a flood of silent connections evicts itself,
    /// not a shim about to say Hello).
    pub(crate) fn make_room(&mut self, epoll: &Epoll) {
        if self.pending.len() < MAX_PENDING_HELLO {
            return;
        }
        if let Some(n) = crowded_victim(&self.pending) {
            self.drop_pending(n, "too many connections waiting for their Hello", epoll);
        }
    }

    /// `fd` of `owner` waits for its Hello (watched by `epoll`).
    pub(crate) fn wait_for_hello(&mut self, fd: OwnedFd, owner: Owner, epoll: &Epoll) {
        let n = self.next;
        self.next = self.next.wrapping_add(1);
        if let Err(e) = epoll.add(fd.as_fd(), libc::EPOLLIN as u32, token(T_HELLO, n)) {
            warn!("cannot watch new control connection: {e}");
            return;
        }
        self.pending.insert(n, (fd, owner, Instant::now()));
    }

    /// Connection `n`, whose Hello has come, taken out of the wait.
    pub(crate) fn take(&mut self, n: u32, epoll: &Epoll) -> Option<(OwnedFd, Owner)> {
        let (fd, owner, _) = self.pending.remove(&n)?;
        let _ = epoll.delete(fd.as_fd());
        Some((fd, owner))
    }

    /// Connections wait for their Hello.
    pub(crate) fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    fn drop_pending(&mut self, n: u32, why: &str, epoll: &Epoll) {
        if let Some((fd, owner, _)) = self.pending.remove(&n) {
            let _ = epoll.delete(fd.as_fd());
            if let Some(k) = self.refusals.tick() {
                warn!(
                    "control connection from pid {}: {why}; closed ({k} since the last line)",
                    owner.pid
                );
            }
            self.refused += 1;
        }
    }

    /// Closes control connections that did not say Hello in [`HELLO_TIMEOUT`].
    pub(crate) fn expire(&mut self, epoll: &Epoll) {
        if self.pending.is_empty() {
            return;
        }
        let late: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, (_, _, at))| at.elapsed() > HELLO_TIMEOUT)
            .map(|(n, _)| *n)
            .collect();
        for n in late {
            self.drop_pending(n, "no Hello in time", epoll);
        }
    }

    /// Adds this part's counters to `stats`.
    pub(crate) fn count_into(&self, stats: &mut ServerStats) {
        stats.channels_refused += self.refused;
    }
}

/// Of the connections waiting for their Hello, the one to give way: the oldest of the
/// process with the most waiting.
fn crowded_victim(pending: &HashMap<u32, (OwnedFd, Owner, Instant)>) -> Option<u32> {
    let mut per_owner: HashMap<Owner, usize> = HashMap::new();
    for (_, o, _) in pending.values() {
        *per_owner.entry(*o).or_default() += 1;
    }
    let worst = per_owner
        .into_iter()
        .max_by_key(|(_, k)| *k)
        .map(|(o, _)| o);
    pending
        .iter()
        .filter(|(_, (_, o, _))| Some(*o) == worst)
        .min_by_key(|(_, (_, _, at))| *at)
        .map(|(n, _)| *n)
}

/// What opening and closing channels works on: the seam, the event loop (a channel's
/// doorbell and control socket join it), the control connections, the channels, the
/// sockets and modules (a closed channel's waiters, parked operations and files), the
/// sandbox's shared state (the channel count, other servers' inboxes), the
/// configuration and the counters. Borrowed from [`Server::channel_life`].
pub(crate) struct ChannelLife<'a> {
    pub io: &'static dyn Io,
    pub epoll: &'a Epoll,
    pub control: &'a mut ControlConns,
    pub channels: &'a mut Channels,
    pub socks: &'a mut SockTable,
    pub modules: &'a mut Modules,
    pub shared: &'a Shared,
    pub cfg: &'a Config,
    pub stats: &'a mut ServerStats,
    /// This server's index in its group.
    pub index: usize,
    pub rechecks: &'a mut crate::recheck::Rechecks,
}

impl Server {
    /// The parts opening and closing channels work on.
    pub(crate) fn channel_life(&mut self) -> ChannelLife<'_> {
        ChannelLife {
            io: self.io,
            epoll: &self.epoll,
            control: &mut self.control,
            channels: &mut self.channels,
            socks: &mut self.socks,
            modules: &mut self.modules,
            shared: &self.shared,
            cfg: &self.cfg,
            stats: &mut self.stats,
            index: self.index,
            rechecks: &mut self.rechecks,
        }
    }
    /// Accepts channels only from `init` and its descendants (the sandbox's processes:
    /// `init` is the sandbox's pid 1, so orphans inside are re-parented to it). The
    /// control socket must be reachable by every user inside the sandbox (programs drop
    /// privileges), so this is what keeps other host processes out.
    pub fn restrict_to_descendants_of(&mut self, init: i32) {
        self.control.restrict(init);
    }

    pub(crate) fn ctl_readable(&mut self, idx: u32, events: u32) {
        let Some(ch) = self.channels.get(idx) else {
            return;
        };
        // A `BindModule` carries its binding after the header in the same packet.
        let mut buf = self.modules.take_ctl_buf();
        let head = size_of::<Ctl>();
        match ferry_sys::recv_with_fds(ch.ctl.as_fd(), &mut buf, libc::MSG_DONTWAIT) {
            Ok((0, _)) => {
                // Take what the thread queued before it went away.
                self.channels.going(idx);
                self.drain_rings();
                self.channel_life()
                    .close_channel(idx, "closed by the sandbox");
            }
            Ok((n, fds)) if n >= head => {
                let msg: Ctl = bytemuck::pod_read_unaligned(&buf[..head]);
                if msg.kind() == Some(CtlKind::BindModule) {
                    self.bind_module_ctl(idx, msg, &buf[head..n], fds);
                } else if msg.kind() == Some(CtlKind::Files) && n == head {
                    if !self.modules.stash_files(idx, fds) {
                        self.bad_channel(idx, "module files without their bindings");
                    }
                } else if msg.kind() == Some(CtlKind::RegisterFile) && n == head {
                    let handle = self.modules.register_file(idx, fds);
                    self.channels.answer(self.io, idx, handle);
                } else if msg.kind() == Some(CtlKind::UnregisterFile) && n == head {
                    self.drain_rings();
                    let done = self.modules.unregister_file(idx, msg.a, &fds);
                    self.channels.answer(self.io, idx, done);
                } else if n == head {
                    self.control(idx, msg, fds);
                } else {
                    self.bad_channel(idx, &format!("control message of {n} bytes"));
                }
            }
            Ok((n, _)) => self.bad_channel(idx, &format!("control message of {n} bytes")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                    self.channels.going(idx);
                    self.drain_rings();
                    self.channel_life().close_channel(idx, "hung up");
                }
            }
            Err(e) => self
                .channel_life()
                .close_channel(idx, &format!("control socket error: {e}")),
        }
        self.modules.put_ctl_buf(buf);
    }

    /// Takes what other servers handed this one.
    pub(crate) fn drain_inbox(&mut self) {
        for m in self.shared.inbox[self.index].take() {
            match m {
                Msg::Hello(fd, hello, owner) => self.channel_life().open_channel(fd, hello, owner),
                Msg::Sock(s) => {
                    let id = s.id;
                    self.stats.sockets_adopted += 1;
                    if let Err(e) = self.socks.install(&self.epoll, *s) {
                        warn!("socket {id}: cannot take it over: {e}");
                    }
                }
                Msg::Published(port) => {
                    if let Some(id) = self.socks.listener_for(self.io, port) {
                        self.host_event(id, libc::EPOLLIN as u32);
                    }
                }
            }
        }
    }

    /// A channel's peer broke the protocol: close it, keep serving the others.
    pub(crate) fn bad_channel(&mut self, idx: u32, why: &str) {
        warn!("channel {idx}: malformed data from the sandbox ({why}); closing the channel");
        self.stats.bad_channels += 1;
        self.channel_life().close_channel(idx, "malformed data");
    }
}

impl ChannelLife<'_> {
    /// The way out, for a closed channel's waiters and closed sockets.
    pub(crate) fn tx(&mut self) -> Tx<'_> {
        Tx {
            io: self.io,
            epoll: self.epoll,
            socks: &mut *self.socks,
            channels: &mut *self.channels,
            modules: &mut *self.modules,
            stats: &mut *self.stats,
        }
    }

    /// New connections on the control socket: each admitted one waits for its Hello
    /// (when too many wait, those whose Hello has come are taken first).
    pub(crate) fn accept_channels(&mut self) {
        while let Some((fd, owner)) = self.control.accept() {
            let open = self.shared.channels_open();
            match self.control.admit(owner, open, self.cfg.max_channels) {
                Admit::Refused => continue,
                Admit::Yes => {}
                Admit::Crowded => {
                    for n in self.control.ready() {
                        self.hello(n);
                    }
                    self.control.make_room(self.epoll);
                }
            }
            self.control.wait_for_hello(fd, owner, self.epoll);
        }
    }

    pub(crate) fn hello(&mut self, n: u32) {
        let Some((fd, owner)) = self.control.take(n, self.epoll) else {
            return;
        };
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
            let _ = ferry_sys::send_with_fds(fd.as_fd(), bytemuck::bytes_of(&reply), &[]);
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
            bytemuck::bytes_of(&reply),
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
        ch.takes_handoff = hello.server & ferry_proto::HELLO_TAKES_HANDOFF != 0;
        ch.rx_pair = rx_pair;
        self.channels.put(idx, ch);
        self.shared.channel_opened();
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
                self.tx().drain_filler(id);
            }
            // Parked operations of this channel have nobody to answer any more.
            self.socks.drop_parked_of(idx);
            // A process that died holding a detached socket closed no descriptor the
            // server could hear of: its channels going is the sign to ask.
            let detached: Vec<u32> = self
                .socks
                .values()
                .filter(|s| s.pair_detached() && !s.app_closed)
                .map(|s| s.id)
                .collect();
            let now = Instant::now();
            for id in detached {
                match self.socks.app_gone(self.io, id) {
                    Some(how) => self.tx().app_closed(id, how),
                    // The process's files may not all be released yet: asked again.
                    None => self.rechecks.add(id, now),
                }
            }
        }
    }

    /// Asks again about the detached sockets a closed channel's process may have held
    /// (`recheck.rs`), when their round is due.
    pub(crate) fn recheck_detached(&mut self) {
        let now = Instant::now();
        for entry in self.rechecks.due(now) {
            let id = entry.0;
            if self.socks.get(&id).is_none_or(|s| s.app_closed) {
                continue;
            }
            match self.socks.app_gone(self.io, id) {
                Some(how) => self.tx().app_closed(id, how),
                None => self.rechecks.still_held(entry, now),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use super::*;

    fn owner(pid: i32) -> Owner {
        Owner { pid, start: 1 }
    }

    /// A connection of `who` waiting for its Hello since `ago`; the peer end beside it.
    fn wait(c: &mut ControlConns, epoll: &Epoll, who: Owner, ago: Duration) -> UnixStream {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        c.wait_for_hello(ours.into(), who, epoll);
        let n = c.next - 1;
        c.pending.get_mut(&n).expect("waiting").2 = Instant::now() - ago;
        theirs
    }

    #[test]
    fn a_connection_is_refused_at_the_channel_cap_counting_those_waiting() {
        let epoll = Epoll::new(8).expect("epoll");
        let mut c = ControlConns::default();
        assert_eq!(c.admit(owner(1), 3, 4), Admit::Yes);
        let _peer = wait(&mut c, &epoll, owner(1), Duration::ZERO);
        assert_eq!(
            c.admit(owner(1), 3, 4),
            Admit::Refused,
            "3 open + 1 waiting"
        );
        assert_eq!(c.admit(owner(1), 2, 4), Admit::Yes);
        let mut stats = ServerStats::default();
        c.count_into(&mut stats);
        assert_eq!(stats.channels_refused, 1);
    }

    #[test]
    fn a_flood_of_silent_connections_evicts_its_own_oldest_not_a_shims() {
        let epoll = Epoll::new(8).expect("epoll");
        let mut c = ControlConns::default();
        let mut peers = vec![wait(&mut c, &epoll, owner(7), Duration::from_millis(900))];
        for i in 1..MAX_PENDING_HELLO {
            let ago = Duration::from_millis(800 - i as u64);
            peers.push(wait(&mut c, &epoll, owner(66), ago));
        }
        assert_eq!(c.admit(owner(66), 0, 1000), Admit::Crowded);
        c.make_room(&epoll);
        assert_eq!(c.pending.len(), MAX_PENDING_HELLO - 1);
        assert!(
            c.pending.contains_key(&0),
            "the shim's older connection stays"
        );
        assert!(!c.pending.contains_key(&1), "the flood's oldest went");
        assert_eq!(c.admit(owner(66), 0, 1000), Admit::Yes);
    }

    #[test]
    fn only_connections_whose_hello_came_are_ready_and_late_ones_expire() {
        let epoll = Epoll::new(8).expect("epoll");
        let mut c = ControlConns::default();
        let mut said = wait(&mut c, &epoll, owner(1), Duration::ZERO);
        let _silent = wait(&mut c, &epoll, owner(1), Duration::ZERO);
        let _late = wait(
            &mut c,
            &epoll,
            owner(2),
            HELLO_TIMEOUT + Duration::from_millis(1),
        );
        said.write_all(b"hello").expect("write");
        assert_eq!(c.ready(), [0]);
        c.expire(&epoll);
        assert!(c.waiting());
        assert_eq!(c.pending.len(), 2);
        assert!(!c.pending.contains_key(&2), "the late one is closed");
        assert!(c.take(0, &epoll).is_some());
        assert!(c.take(0, &epoll).is_none(), "taken once");
    }
}
