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

use crate::channel::Channel;
use crate::group::Msg;
use crate::server::{
    HELLO_TIMEOUT, MAX_PENDING_HELLO, Server, T_CTL, T_DOORBELL, T_HELLO, as_bytes, descends_from,
    process_start, token,
};
use crate::sock::Owner;

impl Server {
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

    pub(crate) fn accept_channels(&mut self) {
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
    pub(crate) fn expire_hellos(&mut self) {
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
                    self.channels.going(idx);
                    self.drain_rings();
                    self.close_channel(idx, "hung up");
                }
            }
            Err(e) => self.close_channel(idx, &format!("control socket error: {e}")),
        }
        self.modules.put_ctl_buf(buf);
    }

    pub(crate) fn hello(&mut self, n: u32) {
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
}
