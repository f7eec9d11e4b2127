//! The server's channels: each one a sandbox thread's rings, buffers, control socket
//! and doorbell ([`Channel`]), and the table of them ([`Channels`]).
//!
//! Owns: a channel's completions until the shim can take them (the backlog), when its
//! requests are taken (back-pressure), its sleep flag, its count of buffers returned
//! (for `WantRoom`). Must not: act on sockets (requests go to `ops.rs`), or drop a
//! completion.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use ferry_proto::{Cmp, CmpKind, Ctl, ProtoError, Req, cmsg};
use ferry_ring::BufId;
use ferry_ring::{Endpoint, Layout, Region, Side};
use tracing::debug;

use crate::ops::{Answer, reply};
use crate::seam::Io;
use crate::sock::Owner;
use crate::stats::ChannelStats;

#[derive(Debug)]
pub(crate) struct Channel {
    pub ctl: OwnedFd,
    pub doorbell: OwnedFd,
    pub region: Arc<Region>,
    pub ep: Endpoint<Cmp, Req>,
    /// Completions that did not fit in the ring yet.
    pub backlog: VecDeque<Cmp>,
    /// The sleep flag is armed (the loop is about to block).
    pub armed: bool,
    /// Its requests are not being taken: its completions back up.
    pub throttled: bool,
    /// The thread went away (its control socket closed): what it queued is still
    /// taken, whatever its completions, which nobody reads any more, are dropped.
    pub going: bool,
    /// The shim routes each socket's calls to the socket's server, so sockets created
    /// through this channel may be assigned to any server.
    pub routes: bool,
    /// The endpoint takes handed-off host sockets (`HELLO_TAKES_HANDOFF`): without it a
    /// connect the policy would hand off is served as any.
    pub takes_handoff: bool,
    /// Sockets created or accepted through this channel take the pair receive path
    /// (`Config::rx_pair`, and the shim reads the pair).
    pub rx_pair: bool,
    /// `BufReturn` completions queued so far (wrapping): compared with the count a
    /// `WantRoom` carries, it tells whether a buffer came back after the shim looked.
    pub returns: u32,
    /// Sockets whose readiness pair the shim filled because this channel had no free
    /// buffer (`WantRoom`): emptied at the next `BufReturn` to this channel.
    pub room_wait: Vec<u32>,
    /// Control bytes (`Op::SendCtl`) for the next `Send` from this channel.
    pub send_ctl: Vec<u8>,
    /// The process that opened the channel (the kernel's word, at connect): the sockets
    /// it may use are those that list it as a holder.
    pub owner: Owner,
    /// Which channel this is, among every channel the server has had (a slot's index is
    /// used again; a serial is not): what a [`Fence`] names.
    pub serial: u64,
    pub stats: ChannelStats,
}

impl Channel {
    /// Creates the region and the doorbell for a new channel.
    pub(crate) fn new(
        id: u32,
        ctl: OwnedFd,
        layout: Layout,
        owner: Owner,
        tid: u32,
    ) -> io::Result<Channel> {
        let region = Region::create(&format!("ferry-ch{id}"), layout).map_err(io::Error::other)?;
        let region = Arc::new(region);
        let ep = Endpoint::new(region.clone(), Side::B).map_err(io::Error::other)?;
        let doorbell = ferry_sys::eventfd()?;
        Ok(Channel {
            ctl,
            doorbell,
            region,
            ep,
            backlog: VecDeque::new(),
            armed: false,
            throttled: false,
            going: false,
            routes: false,
            takes_handoff: false,
            rx_pair: false,
            returns: 0,
            room_wait: Vec::new(),
            send_ctl: Vec::new(),
            owner,
            serial: 0,
            stats: ChannelStats {
                id,
                pid: owner.pid.cast_unsigned(),
                tid,
                ..ChannelStats::default()
            },
        })
    }

    /// Queues a completion (into the ring, or the backlog when the ring is full).
    pub(crate) fn complete(&mut self, c: Cmp) {
        if c.kind == CmpKind::BufReturn as u16 {
            self.returns = self.returns.wrapping_add(1);
        }
        if self.going {
            // Nobody reads them.
        } else if !self.backlog.is_empty() || !matches!(self.ep.tx.push(&c), Ok(true)) {
            self.backlog.push_back(c);
        }
        self.stats.completions += 1;
    }

    /// Moves backlog into the ring, publishes, and wakes the shim if it sleeps.
    pub(crate) fn flush(&mut self) {
        while let Some(c) = self.backlog.front() {
            if !matches!(self.ep.tx.push(c), Ok(true)) {
                break;
            }
            self.backlog.pop_front();
        }
        if self.ep.tx.pending() > 0 {
            self.ep.tx.commit();
            self.stats.batches += 1;
            if self.ep.tx.notify() {
                self.stats.wakes_sent += 1;
            } else {
                self.stats.wakes_avoided += 1;
            }
        }
    }

    /// The span the shim lent with a record: `len` bytes at `off` in its buffer `id`
    /// (`Buffers::span` checks that they lie in the region).
    pub(crate) fn lent_span(
        &self,
        id: u32,
        off: u32,
        len: u32,
    ) -> Result<ferry_ring::BufSpan, ferry_proto::ProtoError> {
        self.ep
            .bufs
            .span(id, off, len)
            .map_err(|_| ferry_proto::ProtoError::BadBuffer(id))
    }

    /// Borrowed doorbell.
    pub(crate) fn doorbell(&self) -> std::os::fd::BorrowedFd<'_> {
        self.doorbell.as_fd()
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.region.close(Side::B);
    }
}

/// Completions a channel may have waiting beyond its ring before the server stops
/// taking its requests (a shim reads its completions at every call, and one call queues
/// at most a few hundred).
pub(crate) const BACKLOG_HIGH: usize = 2048;

/// What [`Channels::next_request`] found.
#[derive(Debug)]
pub(crate) enum Next {
    /// A record to handle.
    Record(Req),
    /// Nothing more now: the ring is empty, or the channel is gone.
    Empty,
    /// The channel's completions back up: its requests wait in its ring (`true` the
    /// first time since it last took one).
    Throttled(bool),
    /// The ring is corrupt: the channel broke the protocol.
    Broken(String),
}

/// The server's channels by index; a closed channel's slot is used again.
#[derive(Debug, Default)]
pub(crate) struct Channels {
    slots: Vec<Option<Channel>>,
    /// Serials given so far (the next channel's is one more).
    serials: u64,
}

/// The records other channels had published, not yet taken, when something that must
/// come after them happened: a program thread's `close` or `shutdown` of a socket that
/// another thread sent on just before. Each thread has its own ring, so the server may
/// see the close first; the socket keeps its host socket (and its `SHUT_WR` waits) until
/// every channel named here has taken as many records as it had published then
/// ([`Channels::passed`]). Empty in the common case (no other ring held anything).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fence(Vec<FenceMark>);

/// One channel of a [`Fence`]: its slot, its serial, and the count of records taken
/// (`ChannelStats::requests`) that passes the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FenceMark {
    idx: u32,
    serial: u64,
    taken: u64,
}

impl Fence {
    /// Whether the fence waits for nothing (no other channel held records).
    pub(crate) fn is_clear(&self) -> bool {
        self.0.is_empty()
    }

    /// The channels it waits for: slot, serial, and the count of records each must
    /// have taken.
    pub(crate) fn marks(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        self.0.iter().map(|m| (m.idx, m.serial, m.taken))
    }
}

impl Channels {
    /// Answers a control request of channel `ch` with `reply` and, beside it, `fds`
    /// (the program's end of a new socket's pair). A reply that cannot be sent loses the
    /// descriptor: the program's end is then closed, and the socket goes with it as any
    /// closed socket does.
    pub(crate) fn send_reply(&self, io: &dyn Io, ch: u32, reply: Ctl, fds: &[BorrowedFd<'_>]) {
        if let Some(c) = self.get(ch)
            && let Err(e) = io.ctl_send(c.ctl.as_fd(), bytemuck::bytes_of(&reply), fds)
        {
            debug!("channel {ch}: control reply lost: {e}");
        }
    }

    /// Answers a control request of channel `ch` with `result` (and no descriptors).
    pub(crate) fn answer(&self, io: &dyn Io, ch: u32, result: impl Into<Answer>) {
        self.send_reply(io, ch, reply(result), &[]);
    }

    /// `BufReturn`: the shim gives back server buffer `buf` of channel `ch`.
    pub(crate) fn buffer_returned(&mut self, ch: u32, buf: u32) -> Result<(), ProtoError> {
        match self.get_mut(ch) {
            Some(chan) => chan
                .ep
                .pool
                .free(BufId(buf))
                .map_err(|_| ProtoError::BadBuffer(buf)),
            None => Ok(()),
        }
    }

    /// `SendCtl`: control bytes kept for the next `Send` from channel `ch` (the shim
    /// sends them in a row, right before it).
    pub(crate) fn send_ctl(
        &mut self,
        ch: u32,
        offset: u32,
        bytes: &[u8],
    ) -> Result<(), ProtoError> {
        let Some(chan) = self.get_mut(ch) else {
            return Ok(());
        };
        let have = chan.send_ctl.len();
        if offset as usize != have || have + bytes.len() > cmsg::MAX_CONTROL {
            return Err(ProtoError::ControlOffset { offset, have });
        }
        chan.send_ctl.extend_from_slice(bytes);
        Ok(())
    }

    /// Channel `ch`, if it is open.
    pub(crate) fn get(&self, ch: u32) -> Option<&Channel> {
        self.slots.get(ch as usize).and_then(Option::as_ref)
    }

    /// Channel `ch`, if it is open.
    pub(crate) fn get_mut(&mut self, ch: u32) -> Option<&mut Channel> {
        self.slots.get_mut(ch as usize).and_then(Option::as_mut)
    }

    /// How many indexes there are (open or free).
    pub(crate) fn slots(&self) -> u32 {
        u32::try_from(self.slots.len()).unwrap_or(u32::MAX)
    }

    /// The index a new channel gets: the first free slot, or a new one.
    pub(crate) fn free_slot(&mut self) -> u32 {
        let idx = self
            .slots
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.slots.len());
        if idx == self.slots.len() {
            self.slots.push(None);
        }
        u32::try_from(idx).unwrap_or(u32::MAX)
    }

    /// Puts a new channel at `idx` (from [`Channels::free_slot`]).
    pub(crate) fn put(&mut self, idx: u32, mut ch: Channel) {
        self.serials += 1;
        ch.serial = self.serials;
        self.slots[idx as usize] = Some(ch);
    }

    /// Takes channel `idx` out (it is closing).
    pub(crate) fn take(&mut self, idx: u32) -> Option<Channel> {
        self.slots.get_mut(idx as usize).and_then(Option::take)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Channel> {
        self.slots.iter().flatten()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Channel> {
        self.slots.iter_mut().flatten()
    }

    /// Whether a channel has completions waiting for room in its ring.
    pub(crate) fn has_backlog(&self) -> bool {
        self.iter().any(|c| !c.backlog.is_empty())
    }

    /// Arms every channel's sleep flag; false when a ring got records meanwhile.
    pub(crate) fn arm_all(&mut self) -> bool {
        for ch in self.iter_mut() {
            match ch.ep.rx.arm_sleep() {
                Ok(true) => ch.armed = true,
                _ => return false,
            }
        }
        true
    }

    pub(crate) fn disarm_all(&mut self) {
        for ch in self.iter_mut().filter(|c| c.armed) {
            ch.ep.rx.disarm();
            ch.armed = false;
        }
    }

    /// Publishes every channel's completions.
    pub(crate) fn flush_all(&mut self) {
        for ch in self.iter_mut() {
            ch.flush();
        }
    }

    /// A fence behind every record the channels (but `except`, whose earlier records
    /// are taken already) have published and the server not taken yet.
    pub(crate) fn fence(&mut self, except: Option<u32>) -> Fence {
        let mut marks = Vec::new();
        for (idx, ch) in self.slots.iter_mut().enumerate() {
            let Some(ch) = ch else { continue };
            let idx = u32::try_from(idx).unwrap_or(u32::MAX);
            if Some(idx) == except {
                continue;
            }
            // A ring whose indexes do not add up holds nothing to wait for (the
            // channel is closed as broken when next read).
            let waiting = ch.ep.rx.available().unwrap_or(0) as u64;
            if waiting > 0 {
                marks.push(FenceMark {
                    idx,
                    serial: ch.serial,
                    taken: ch.stats.requests + waiting,
                });
            }
        }
        Fence(marks)
    }

    /// Whether channel `idx`, if it is still the one of that `serial`, has taken fewer
    /// than `taken` records.
    pub(crate) fn behind(&self, idx: u32, serial: u64, taken: u64) -> bool {
        self.get(idx)
            .is_some_and(|ch| ch.serial == serial && ch.stats.requests < taken)
    }

    /// Whether a channel other than `except` has records not taken yet (a load of
    /// each ring's producer index).
    pub(crate) fn others_pending(&mut self, except: u32) -> bool {
        self.slots.iter_mut().enumerate().any(|(i, ch)| {
            i != except as usize
                && ch
                    .as_mut()
                    .is_some_and(|c| c.ep.rx.available().unwrap_or(0) > 0)
        })
    }

    /// Whether every record `fence` waits for has been taken (or its channel is gone,
    /// and its records with it).
    pub(crate) fn passed(&self, fence: &Fence) -> bool {
        fence.0.iter().all(|m| {
            self.get(m.idx)
                .is_none_or(|ch| ch.serial != m.serial || ch.stats.requests >= m.taken)
        })
    }

    /// Channel `idx`'s thread went away: its requests are taken whatever its
    /// completions (see [`Channel::going`]), so that sends it queued before it went
    /// still go out.
    pub(crate) fn going(&mut self, idx: u32) {
        if let Some(ch) = self.get_mut(idx) {
            ch.going = true;
            ch.backlog.clear();
        }
    }

    /// Whether a channel has records the server has not taken yet.
    pub(crate) fn rings_pending(&mut self) -> bool {
        self.iter_mut()
            .any(|c| c.ep.rx.available().unwrap_or(0) > 0)
    }

    /// The next request record of channel `idx`. Completions waiting for room are
    /// published first (the shim takes them as it goes); if too many still wait, the
    /// channel is throttled: the program does not read its completions, so its requests
    /// wait in its ring until it does. What was taken is released then (a producer
    /// waiting for room is woken: otherwise a program that does read them would sleep
    /// out its wait).
    pub(crate) fn next_request(&mut self, idx: u32) -> Next {
        let Some(ch) = self.get_mut(idx) else {
            return Next::Empty;
        };
        if !ch.backlog.is_empty() {
            ch.flush();
        }
        if ch.backlog.len() >= BACKLOG_HIGH {
            ch.ep.rx.release();
            let first = !std::mem::replace(&mut ch.throttled, true);
            if first {
                debug!("channel {idx}: completions back up; its requests wait");
            }
            return Next::Throttled(first);
        }
        ch.throttled = false;
        match ch.ep.rx.pop() {
            Ok(Some(r)) => {
                ch.stats.requests += 1;
                Next::Record(r)
            }
            Ok(None) => {
                ch.ep.rx.release();
                Next::Empty
            }
            Err(e) => Next::Broken(e.to_string()),
        }
    }
}
