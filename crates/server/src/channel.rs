//! One channel: a sandbox thread's rings, buffers, control socket and doorbell.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use ferry_proto::{Cmp, CmpKind, Req};
use ferry_ring::{Endpoint, Layout, Region, Side};

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
    /// The shim routes each socket's calls to the socket's server, so sockets created
    /// through this channel may be assigned to any server.
    pub routes: bool,
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
            routes: false,
            rx_pair: false,
            returns: 0,
            room_wait: Vec::new(),
            send_ctl: Vec::new(),
            owner,
            stats: ChannelStats {
                id,
                pid: owner.pid as u32,
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
        if !self.backlog.is_empty() || !matches!(self.ep.tx.push(&c), Ok(true)) {
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
