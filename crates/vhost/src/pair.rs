//! [`VirtioPair`]: one virtio-net queue pair as a NIC server's
//! [`FrameDevice`]. The guest's transmit ring (queue 2K+1) is read into a batch of
//! frames; frames are written into its receive ring (queue 2K), a frame over as many
//! merged buffers as it needs (`MRG_RXBUF`). Each chain is completed at once; the call
//! eventfd is written only when the guest asked for it (event-idx). Frames the guest has
//! posted no room for wait in a bounded backlog until it does (its kick wakes the
//! server), then are lost.
//!
//! Every descriptor, length and address comes from the guest: a chain is read or
//! written only through the memory table's bounds (`virtio-queue`'s `Reader`/`Writer`);
//! one that fails is completed empty and counted.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ferry_nic::device::{DeviceCaps, FRAME_MAX, FrameDevice, Frames, Partial, Sent};
use ferry_nic::{Stage, Timing};
use vhost_user_backend::{VringMutex, VringState, VringT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};

use crate::backend::{Counters, Inner, feature};
use crate::csum;
use crate::steer::{self, Owner};

/// The header in front of every frame on the rings (`virtio_net_hdr_v1`): 12 bytes with
/// `VERSION_1` or `MRG_RXBUF`, else 10.
const HDR_LONG: usize = 12;
const HDR_SHORT: usize = 10;
const NEEDS_CSUM: u8 = 1;
/// Most frames (and bytes) waiting for the guest's receive buffers.
const BACKLOG_FRAMES: usize = 512;

/// One queue pair (see the module's header).
#[derive(Debug)]
pub struct VirtioPair {
    inner: Arc<Inner>,
    index: usize,
    mtu: usize,
    /// Frames that found no receive buffer yet.
    backlog: Backlog,
    /// Frames read from this pair's transmit ring, before steering.
    read: Frames,
}

/// Frames that found no receive buffer yet, in order: those from `at` on wait; those
/// before it went, their bytes kept until every frame has gone or the buffer is full
/// (then the waiting ones move to its start): a frame is copied in once, not again each
/// time some ahead of it go.
#[derive(Debug, Default)]
struct Backlog {
    frames: Frames,
    at: usize,
    spare: Frames,
}

impl Backlog {
    fn waiting(&self) -> usize {
        self.frames.len().saturating_sub(self.at)
    }

    fn is_empty(&self) -> bool {
        self.waiting() == 0
    }

    /// `n` more frames have gone.
    fn went(&mut self, n: usize) {
        self.at = (self.at + n).min(self.frames.len());
        if self.is_empty() {
            self.frames.clear();
            self.at = 0;
        }
    }

    /// Keeps a copy of frame `f` (with its offload); whether there was room (at most
    /// [`BACKLOG_FRAMES`] frames and [`Frames::FULL`] bytes wait).
    fn keep(&mut self, f: &[u8], csum: Option<Partial>) -> bool {
        if self.waiting() >= BACKLOG_FRAMES {
            return false;
        }
        if self.frames.full() && self.at > 0 {
            self.spare.clear();
            for (g, c) in self.frames.iter().skip(self.at) {
                push_with_offload(&mut self.spare, g, c);
            }
            std::mem::swap(&mut self.frames, &mut self.spare);
            self.at = 0;
        }
        if self.frames.full() {
            return false;
        }
        push_with_offload(&mut self.frames, f, csum);
        true
    }
}

/// Appends a copy of frame `f` and its offload to `to`.
fn push_with_offload(to: &mut Frames, f: &[u8], csum: Option<Partial>) {
    to.push(f);
    if let Some((_, c)) = to.last_mut() {
        *c = csum;
    }
}

/// Why a chain was refused.
#[derive(Debug)]
enum Refused {
    Unreadable,
    Short,
    Long,
}

impl VirtioPair {
    pub(crate) fn new(inner: Arc<Inner>, index: usize, mtu: usize) -> VirtioPair {
        VirtioPair {
            inner,
            index,
            mtu,
            backlog: Backlog::default(),
            read: Frames::new(),
        }
    }

    fn hdr_len(&self) -> usize {
        let acked = self.inner.acked.load(Ordering::Relaxed);
        if acked & (feature::VERSION_1 | feature::NET_MRG_RXBUF) != 0 {
            HDR_LONG
        } else {
            HDR_SHORT
        }
    }

    fn acked(&self, bit: u64) -> bool {
        self.inner.acked.load(Ordering::Relaxed) & bit != 0
    }

    /// Ring `q` of this pair (0: receive, 1: transmit), once the frontend set it up.
    fn ring(&self, q: usize) -> Option<&VringMutex> {
        self.inner.vrings.get()?.get(2 * self.index + q)
    }

    /// Empties the wake eventfd (level-triggered in the server's epoll).
    fn drain_wake(&self) {
        if let Some(w) = self.inner.wakes.get(self.index) {
            let _ = w.read();
        }
    }

    /// Tells the guest about used buffers of `st`, if it asked to be told.
    fn notify(&self, st: &mut VringState) {
        if st.needs_notification().unwrap_or(true) && st.signal_used_queue().is_err() {
            Counters::add(&self.inner.counters.bad_ring, 1);
        }
    }

    /// Completes chain `head` with `len` bytes written.
    fn complete(&self, st: &mut VringState, head: u16, len: u32) {
        if st.add_used(head, len).is_err() {
            Counters::add(&self.inner.counters.bad_ring, 1);
        }
    }

    /// Reads up to `max` frames from the transmit ring into `into`.
    fn read_tx(&self, into: &mut Frames, max: usize, timing: &mut Timing) -> usize {
        let Some(ring) = self.ring(1) else { return 0 };
        let mut st = ring.get_mut();
        if !st.is_enabled() || !st.get_queue().ready() {
            return 0;
        }
        let mem = self.inner.mem.memory();
        let hdr = self.hdr_len();
        let (mut n, mut used) = (0, false);
        loop {
            let _ = st.disable_notification();
            let mut popped_any = false;
            while n < max && !into.full() {
                let t0 = timing.start();
                let Some(chain) = st.get_queue_mut().pop_descriptor_chain(mem.clone()) else {
                    break;
                };
                popped_any = true;
                let head = chain.head_index();
                let got = chain
                    .reader(&*mem)
                    .map_err(|_| Refused::Unreadable)
                    .and_then(|r| read_frame(r, hdr, into));
                timing.end(Stage::TapRead, t0, got.is_ok());
                match got {
                    Ok(()) => n += 1,
                    Err(why) => {
                        tracing::debug!("vhost-user: tx chain {head} refused: {why:?}");
                        Counters::add(&self.inner.counters.bad_tx, 1);
                    }
                }
                self.complete(&mut st, head, 0);
                used = true;
            }
            if n >= max || into.full() {
                // More may wait: come back without a kick.
                self.inner.wake(self.index);
                break;
            }
            // Re-armed; a chain that came in meanwhile is read now. A ring that says
            // chains wait but yields none (an available index beyond the ring) is left.
            match st.enable_notification() {
                Ok(true) if popped_any => continue,
                _ => break,
            }
        }
        if used {
            self.notify(&mut st);
        }
        Counters::add(&self.inner.counters.tx_frames, n as u64);
        n
    }

    /// Writes `frames` into the receive ring, in order, from the `skip`-th; how many went
    /// (the rest found no room).
    fn write_rx(&self, frames: &Frames, skip: usize, timing: &mut Timing) -> usize {
        let Some(ring) = self.ring(0) else { return 0 };
        let mut st = ring.get_mut();
        if !st.is_enabled() || !st.get_queue().ready() {
            return 0;
        }
        let mem = self.inner.mem.memory();
        let rx = RxParams {
            hdr: self.hdr_len(),
            mrg: self.acked(feature::NET_MRG_RXBUF),
            partial: self.acked(feature::NET_GUEST_CSUM),
        };
        let mut done = 0;
        let mut retried = false;
        let old = st.get_queue().next_used();
        loop {
            for (f, csum) in frames.iter().skip(skip + done) {
                let t0 = timing.start();
                let placed = put_frame(&mut st, &mem, f, csum, rx, &self.inner.counters);
                timing.end(Stage::TapWrite, t0, placed);
                if !placed {
                    break;
                }
                done += 1;
            }
            if skip + done >= frames.len() || retried {
                break;
            }
            // Out of room: the guest's next buffer must kick; buffers posted meanwhile
            // are tried once more.
            retried = true;
            if !arm_kick(&mut st, &mem) {
                break;
            }
        }
        if done > 0 {
            if wants_call(st.get_queue(), &mem, old) && st.signal_used_queue().is_err() {
                Counters::add(&self.inner.counters.bad_ring, 1);
            }
            Counters::add(&self.inner.counters.rx_frames, done as u64);
        }
        done
    }

    /// Writes what waits in the backlog; keeps what still finds no room.
    fn flush_backlog(&mut self, timing: &mut Timing) {
        if self.backlog.is_empty() {
            return;
        }
        let went = self.write_rx(&self.backlog.frames, self.backlog.at, timing);
        self.backlog.went(went);
    }

    /// Moves the frames other pairs' servers steered here into `into`; how many.
    fn take_inbox(&self, into: &mut Frames) -> usize {
        let Some(inbox) = self.inner.inboxes.get(self.index) else {
            return 0;
        };
        let mut inbox = inbox.lock().unwrap_or_else(|e| e.into_inner());
        let n = inbox.len();
        for (f, _) in inbox.iter() {
            into.push(f);
        }
        inbox.clear();
        n
    }

    /// Hands frame `f` to pair `k`'s server (its inbox, bounded like the backlog).
    fn give(&self, k: usize, f: &[u8]) {
        let Some(inbox) = self.inner.inboxes.get(k) else {
            return;
        };
        let c = &self.inner.counters;
        {
            let mut inbox = inbox.lock().unwrap_or_else(|e| e.into_inner());
            if inbox.len() >= BACKLOG_FRAMES || inbox.full() {
                Counters::add(&c.steer_lost, 1);
                return;
            }
            inbox.push(f);
        }
        Counters::add(&c.steered, 1);
        self.inner.wake(k);
    }

    /// Keeps the frames of `frames` from the `from`-th for later; how many were lost.
    fn keep(&mut self, frames: &Frames, from: usize) -> u64 {
        let mut lost = 0;
        for (f, csum) in frames.iter().skip(from) {
            if !self.backlog.keep(f, csum) {
                lost += 1;
            }
        }
        Counters::add(&self.inner.counters.rx_lost, lost);
        let waited = (frames.len() - from) as u64 - lost;
        Counters::add(&self.inner.counters.rx_waited, waited);
        lost
    }
}

/// Asks the guest to kick when it posts its next receive buffer; whether buffers came
/// meanwhile. With event-idx the available event must be the ring's available index, not
/// this side's position: a frame too large for the buffers posted leaves them in the ring
/// (its position before them), and an event there, already passed, would never kick.
fn arm_kick(st: &mut VringState, mem: &vm_memory::GuestMemoryLoadGuard<GuestMemoryMmap>) -> bool {
    let q = st.get_queue_mut();
    let Ok(avail) = q.avail_idx(&**mem, std::sync::atomic::Ordering::Acquire) else {
        return false;
    };
    let at = q.next_avail();
    q.set_next_avail(avail.0);
    let more = q.enable_notification(&**mem);
    q.set_next_avail(at);
    // More than those that did not suffice: worth another try.
    matches!(more, Ok(true))
}

/// How frames are written to the receive ring (from the features the guest acked).
#[derive(Clone, Copy, Debug)]
struct RxParams {
    hdr: usize,
    mrg: bool,
    partial: bool,
}

/// Reads one frame (behind its `hdr`-byte header) from a transmit chain into `into`.
fn read_frame(
    mut r: virtio_queue::Reader<'_>,
    hdr: usize,
    into: &mut Frames,
) -> Result<(), Refused> {
    let total = r.available_bytes();
    if total < hdr {
        return Err(Refused::Short);
    }
    let len = total - hdr;
    if len > FRAME_MAX {
        return Err(Refused::Long);
    }
    let mut h = [0u8; HDR_LONG];
    r.read_exact(&mut h[..hdr])
        .map_err(|_| Refused::Unreadable)?;
    // The guest's partial checksum (NEEDS_CSUM) is not completed: the servers verify no
    // checksum (nic's frame path), as with the TAP's offload.
    let mut ok = false;
    into.push_with(len, |b| {
        ok = r.read_exact(b).is_ok();
        ok.then_some((0, len))
    });
    if ok { Ok(()) } else { Err(Refused::Unreadable) }
}

/// The header in front of a frame written to the guest.
fn rx_header(csum: Option<Partial>, num_buffers: u16) -> [u8; HDR_LONG] {
    let mut h = [0u8; HDR_LONG];
    if let Some((start, offset)) = csum {
        h[0] = NEEDS_CSUM;
        h[6..8].copy_from_slice(&start.to_le_bytes());
        h[8..10].copy_from_slice(&offset.to_le_bytes());
    }
    h[10..12].copy_from_slice(&num_buffers.to_le_bytes());
    h
}

/// What a frame written to the guest is made of, in order: its header, the frame up to
/// a completed checksum's field, the field's two bytes, the rest of the frame (or the
/// header and the whole frame), and how far writing has got.
struct Pieces<'a> {
    /// Header, head of the frame, (the field), tail of the frame.
    parts: [&'a [u8]; 3],
    /// The completed checksum's bytes, written between the head and the tail.
    field: Option<[u8; 2]>,
    /// The piece being written (0 header, 1 head, 2 field, 3 tail), the offset in it.
    at: (usize, usize),
}

impl<'a> Pieces<'a> {
    fn new(hdr: &'a [u8], frame: &'a [u8], fixed: Option<(usize, [u8; 2])>) -> Pieces<'a> {
        match fixed {
            Some((at, v)) if at.checked_add(2).is_some_and(|end| end <= frame.len()) => Pieces {
                parts: [hdr, &frame[..at], &frame[at + 2..]],
                field: Some(v),
                at: (0, 0),
            },
            _ => Pieces {
                parts: [hdr, frame, &[]],
                field: None,
                at: (0, 0),
            },
        }
    }

    /// Piece `i` (see [`Pieces::at`]).
    fn piece(&self, i: usize) -> Option<&[u8]> {
        match i {
            0 | 1 => Some(self.parts[i]),
            2 => Some(self.field.as_ref().map_or(&[][..], |f| &f[..])),
            3 => Some(self.parts[2]),
            _ => None,
        }
    }

    /// Writes what is left, as much as `w` holds; the bytes written. `Err`: the chain
    /// could not be written (what it took is written again into the next).
    fn write_into(&mut self, w: &mut virtio_queue::Writer<'_>) -> Result<usize, ()> {
        let before = self.at;
        let mut wrote = 0;
        while w.available_bytes() > 0 {
            let (i, off) = self.at;
            let Some(piece) = self.piece(i) else { break };
            let left = piece.get(off..).unwrap_or_default();
            if left.is_empty() {
                self.at = (i + 1, 0);
                continue;
            }
            let n = left.len().min(w.available_bytes());
            if w.write_all(&left[..n]).is_err() {
                self.at = before;
                return Err(());
            }
            wrote += n;
            self.at = (i, off + n);
        }
        Ok(wrote)
    }
}

/// Writes one frame (and its header) into the receive ring's next chains: as many as
/// it needs with `MRG_RXBUF`, else one that holds it. Whether it was placed; if not,
/// the ring is as it was (the chains stay the guest's).
fn put_frame(
    st: &mut VringState,
    mem: &vm_memory::GuestMemoryLoadGuard<GuestMemoryMmap>,
    frame: &[u8],
    csum: Option<Partial>,
    rx: RxParams,
    counters: &Counters,
) -> bool {
    let need = rx.hdr + frame.len();
    let start = st.get_queue().next_avail();
    let mut chains = Vec::new();
    let mut room = 0usize;
    while room < need {
        let Some(chain) = st.get_queue_mut().pop_descriptor_chain(mem.clone()) else {
            st.get_queue_mut().set_next_avail(start);
            return false;
        };
        let head = chain.head_index();
        let w = chain.writer(&**mem).ok();
        let cap = w.as_ref().map_or(0, |w| w.available_bytes());
        if cap == 0 {
            Counters::add(&counters.bad_rx, 1);
        }
        room += cap;
        chains.push((head, w));
        if !rx.mrg && room < need {
            // One chain must hold the frame: it does not fit (an MTU the guest's
            // buffers were not sized for).
            st.get_queue_mut().set_next_avail(start);
            return false;
        }
    }
    // The frame as the guest gets it: header, then the frame, its checksum complete
    // unless the guest completes it; written from where it lies straight into the
    // chains, no copy of it made first.
    let num = u16::try_from(chains.len()).unwrap_or(u16::MAX);
    let offload = if rx.partial { csum } else { None };
    let hdr = rx_header(offload, num);
    let fixed = csum
        .filter(|_| !rx.partial)
        .and_then(|p| csum::value(frame, p));
    let mut src = Pieces::new(&hdr[..rx.hdr], frame, fixed);
    let mut used = Vec::with_capacity(chains.len());
    for (head, w) in chains {
        let wrote = match w {
            Some(mut w) => src.write_into(&mut w).unwrap_or_else(|()| {
                Counters::add(&counters.bad_rx, 1);
                0
            }),
            None => 0,
        };
        used.push((head, wrote as u32));
    }
    if publish_used(st.get_queue_mut(), mem, &used).is_err() {
        Counters::add(&counters.bad_ring, 1);
    }
    true
}

/// Puts a frame's chains (`(head, bytes written)`) on the used ring and only then moves
/// the used index past all of them: a guest that saw the first before the rest (its
/// `num_buffers` saying more) would drop the frame ("buffers missing"), as
/// `Queue::add_used`, which moves the index each time, let it.
fn publish_used(
    q: &mut virtio_queue::Queue,
    mem: &GuestMemoryMmap,
    used: &[(u16, u32)],
) -> Result<(), ()> {
    use vm_memory::{Bytes, GuestAddress};
    let size = q.size();
    if size == 0 || used.iter().any(|&(head, _)| head >= size) {
        return Err(());
    }
    let mut next = q.next_used();
    for &(head, len) in used {
        let slot = u64::from(next % size);
        let at = q.used_ring().checked_add(4 + 8 * slot).ok_or(())?;
        let mut elem = [0u8; 8];
        elem[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        mem.write_slice(&elem, GuestAddress(at)).map_err(|_| ())?;
        next = next.wrapping_add(1);
    }
    let idx = q.used_ring().checked_add(2).ok_or(())?;
    mem.store(next.to_le(), GuestAddress(idx), Ordering::Release)
        .map_err(|_| ())?;
    q.set_next_used(next);
    Ok(())
}

/// Whether the guest wants to hear of the used buffers from `old` on (event-idx: its
/// used event lies among them; else unless it set `NO_INTERRUPT`).
fn wants_call(q: &virtio_queue::Queue, mem: &GuestMemoryMmap, old: u16) -> bool {
    use vm_memory::{Bytes, GuestAddress};
    std::sync::atomic::fence(Ordering::SeqCst);
    let new = q.next_used();
    if q.event_idx_enabled() {
        let at = q.avail_ring() + 4 + 2 * u64::from(q.size());
        let Ok(event) = mem.load::<u16>(GuestAddress(at), Ordering::Acquire) else {
            return true;
        };
        let event = u16::from_le(event);
        new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
    } else {
        match mem.load::<u16>(GuestAddress(q.avail_ring()), Ordering::Acquire) {
            Ok(flags) => u16::from_le(flags) & 1 == 0,
            Err(_) => true,
        }
    }
}

impl FrameDevice for VirtioPair {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            partial_csum: true,
        }
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        let fd = self.inner.wakes[self.index].as_raw_fd();
        // SAFETY: the eventfd is owned by `inner`, which this pair holds for as long as
        // the borrow lives.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    fn recv(&mut self, into: &mut Frames, max: usize, timing: &mut Timing) -> io::Result<usize> {
        self.drain_wake();
        if self.inner.gone.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the VM's frontend has gone",
            ));
        }
        self.flush_backlog(timing);
        if self.inner.pairs == 1 {
            return Ok(self.read_tx(into, max, timing));
        }
        let mut n = self.take_inbox(into);
        let mut read = std::mem::take(&mut self.read);
        read.clear();
        self.read_tx(&mut read, max.saturating_sub(n).max(1), timing);
        for (f, _) in read.iter() {
            match steer::owner(f, self.inner.pairs, &self.inner.published) {
                Owner::One(k) if k == self.index => {
                    into.push(f);
                    n += 1;
                }
                Owner::One(k) => self.give(k, f),
                Owner::All => {
                    into.push(f);
                    n += 1;
                    for k in (0..self.inner.pairs).filter(|&k| k != self.index) {
                        self.give(k, f);
                    }
                }
            }
        }
        self.read = read;
        Ok(n)
    }

    fn send(&mut self, frames: &Frames, timing: &mut Timing) -> Sent {
        self.flush_backlog(timing);
        // In order: nothing overtakes the backlog.
        let went = if self.backlog.is_empty() {
            self.write_rx(frames, 0, timing)
        } else {
            0
        };
        // Kept frames count as sent; those the full backlog cannot take are the last.
        let lost = self.keep(frames, went);
        let kept = frames.len() - lost as usize;
        Sent {
            frames: kept as u64,
            bytes: frames.iter().take(kept).map(|(f, _)| f.len() as u64).sum(),
            lost,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The rings as a hostile guest fills them: descriptor tables, available and used
    //! rings written into real (anonymous) guest memory, read by the real queue code.

    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic};

    const SIZE: u16 = 16;
    const NEXT: u16 = 1;
    const WRITE: u16 = 2;
    const INDIRECT: u16 = 4;
    /// Per queue q: descriptor table, available ring, used ring; buffers from `BUF`.
    const fn desc(q: u64) -> u64 {
        0x1000 + q * 0x4000
    }
    const fn avail(q: u64) -> u64 {
        0x2000 + q * 0x4000
    }
    const fn used(q: u64) -> u64 {
        0x3000 + q * 0x4000
    }
    const BUF: u64 = 0x10_0000;

    struct Rig {
        backend: crate::Backend,
        pair: VirtioPair,
        mem: GuestMemoryMmap,
        /// Next free descriptor and avail index per queue.
        next: [u16; 2],
        posted: [u16; 2],
    }

    impl Rig {
        fn new() -> Rig {
            let (backend, mut pairs) = crate::backend(1, 65520, &[]).unwrap();
            let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
            backend.inner().mem.lock().unwrap().replace(mem.clone());
            let vrings: Vec<VringMutex> = (0..2u64)
                .map(|q| {
                    let v = <VringMutex as VringT<GuestMemoryAtomic<GuestMemoryMmap>>>::new(
                        backend.memory(),
                        SIZE,
                    )
                    .unwrap();
                    v.set_queue_size(SIZE);
                    v.set_queue_info(desc(q), avail(q), used(q)).unwrap();
                    v.set_queue_ready(true);
                    v.set_enabled(true);
                    v
                })
                .collect();
            assert!(backend.inner().vrings.set(vrings).is_ok());
            backend.inner().acked.store(
                feature::VERSION_1 | feature::NET_MRG_RXBUF | feature::NET_GUEST_CSUM,
                Ordering::SeqCst,
            );
            Rig {
                backend,
                pair: pairs.remove(0),
                mem,
                next: [0; 2],
                posted: [0; 2],
            }
        }

        /// Writes descriptor `(addr, len, flags, next)` at index `i` of queue `q`.
        fn put_desc(&self, q: u64, i: u16, (addr, len, flags, next): (u64, u32, u16, u16)) {
            let at = desc(q) + 16 * u64::from(i);
            self.mem.write_obj(addr, GuestAddress(at)).unwrap();
            self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
            self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
            self.mem.write_obj(next, GuestAddress(at + 14)).unwrap();
        }

        /// Offers chain `head` on queue `q`'s available ring.
        fn offer(&mut self, q: usize, head: u16) {
            let a = avail(q as u64);
            let slot = GuestAddress(a + 4 + 2 * u64::from(self.posted[q] % SIZE));
            self.mem.write_obj(head, slot).unwrap();
            self.posted[q] = self.posted[q].wrapping_add(1);
            self.mem
                .write_obj(self.posted[q], GuestAddress(a + 2))
                .unwrap();
        }

        /// A one-descriptor chain on queue `q` (a fresh index), offered.
        fn chain(&mut self, q: usize, addr: u64, len: u32, flags: u16) -> u16 {
            let i = self.next[q];
            self.next[q] += 1;
            self.put_desc(q as u64, i, (addr, len, flags, 0));
            self.offer(q, i);
            i
        }

        /// A frame the guest sends: header then `payload`, at `addr`.
        fn tx_frame(&mut self, addr: u64, payload: &[u8]) {
            let mut b = vec![0u8; HDR_LONG];
            b.extend_from_slice(payload);
            self.mem.write_slice(&b, GuestAddress(addr)).unwrap();
            self.chain(1, addr, b.len() as u32, 0);
        }

        fn used_idx(&self, q: u64) -> u16 {
            self.mem.read_obj(GuestAddress(used(q) + 2)).unwrap()
        }

        /// Used element `n` of queue `q`: (id, len).
        fn used_elem(&self, q: u64, n: u16) -> (u32, u32) {
            let at = used(q) + 4 + 8 * u64::from(n);
            (
                self.mem.read_obj(GuestAddress(at)).unwrap(),
                self.mem.read_obj(GuestAddress(at + 4)).unwrap(),
            )
        }

        fn recv(&mut self) -> Frames {
            let mut f = Frames::new();
            let n = self.pair.recv(&mut f, 64, &mut Timing::new(false)).unwrap();
            assert_eq!(n, f.len());
            f
        }
    }

    #[test]
    fn a_frame_the_guest_sends_arrives_and_its_chain_is_completed() {
        let mut r = Rig::new();
        r.tx_frame(BUF, b"an ethernet frame");
        let f = r.recv();
        assert_eq!(f.get(0), Some(&b"an ethernet frame"[..]));
        assert_eq!(r.used_idx(1), 1);
        assert_eq!(r.used_elem(1, 0), (0, 0));
    }

    #[test]
    fn hostile_transmit_chains_are_refused_counted_and_do_not_stall_the_ring() {
        let mut r = Rig::new();
        // Outside guest memory; shorter than the header; longer than a frame.
        r.chain(1, 0xffff_0000_0000, 100, 0);
        r.chain(1, BUF, 4, 0);
        r.chain(1, BUF, (HDR_LONG + FRAME_MAX + 1) as u32, 0);
        // A loop: a descriptor that is its own next. The chain ends after as many
        // descriptors as the ring holds (virtio-queue's bound): a frame of garbage, as
        // any guest may send, not a stall.
        let i = r.next[1];
        r.next[1] += 1;
        r.put_desc(1, i, (BUF, 64, NEXT, i));
        r.offer(1, i);
        // An indirect table outside guest memory.
        r.chain(1, 0xffff_0000_0000, 16 * 4, INDIRECT);
        // A length that overflows when summed: two descriptors of 4 GiB - 1.
        let i = r.next[1];
        r.next[1] += 2;
        r.put_desc(1, i, (BUF, u32::MAX, NEXT, i + 1));
        r.put_desc(1, i + 1, (BUF, u32::MAX, 0, 0));
        r.offer(1, i);
        // Then an honest frame.
        r.tx_frame(BUF + 0x1000, b"still served");
        let f = r.recv();
        assert_eq!(f.len(), 2, "the loop's bounded frame and the honest one");
        assert_eq!(
            f.get(0).map(<[u8]>::len),
            Some(usize::from(SIZE) * 64 - HDR_LONG)
        );
        assert_eq!(f.get(1), Some(&b"still served"[..]));
        assert_eq!(r.backend.counters().bad_tx, 5);
        assert_eq!(r.used_idx(1), 7, "every chain given back");
    }

    #[test]
    fn an_available_index_beyond_the_ring_reads_nothing() {
        let mut r = Rig::new();
        r.mem
            .write_obj(1000u16, GuestAddress(avail(1) + 2))
            .unwrap();
        assert!(r.recv().is_empty());
        assert_eq!(r.used_idx(1), 0);
    }

    /// Frames of `lens` bytes, for sending.
    fn frames(lens: &[usize]) -> Frames {
        let mut f = Frames::new();
        for (k, &n) in lens.iter().enumerate() {
            f.push(&vec![k as u8 + 1; n]);
        }
        f
    }

    #[test]
    fn a_frame_spans_merged_buffers_and_waits_for_room_when_there_is_none() {
        let mut r = Rig::new();
        for k in 0..3 {
            r.chain(0, BUF + 0x1000 * k, 100, WRITE);
        }
        let sent = r.pair.send(&frames(&[250]), &mut Timing::new(false));
        assert_eq!((sent.frames, sent.lost), (1, 0));
        assert_eq!(r.used_idx(0), 3);
        let lens: Vec<u32> = (0..3).map(|n| r.used_elem(0, n).1).collect();
        assert_eq!(lens, [100, 100, 62], "12-byte header + 250 bytes");
        let num_buffers: u16 = r.mem.read_obj(GuestAddress(BUF + 10)).unwrap();
        assert_eq!(num_buffers, 3);
        let mut tail = [0u8; 62];
        r.mem
            .read_slice(&mut tail, GuestAddress(BUF + 0x2000))
            .unwrap();
        assert!(tail.iter().all(|&b| b == 1));
        // No buffers: the frame waits (counted as sent), and goes once the guest posts one.
        let sent = r.pair.send(&frames(&[40]), &mut Timing::new(false));
        assert_eq!((sent.frames, sent.lost), (1, 0));
        assert_eq!(r.used_idx(0), 3);
        r.chain(0, BUF + 0x8000, 100, WRITE);
        assert!(r.recv().is_empty());
        assert_eq!(r.used_idx(0), 4);
        assert_eq!(r.used_elem(0, 3).1, 52);
        assert_eq!(r.backend.counters().rx_frames, 2);
    }

    #[test]
    fn receive_buffers_outside_memory_are_counted_and_a_full_backlog_loses_frames() {
        let mut r = Rig::new();
        r.chain(0, 0xffff_0000_0000, 100, WRITE);
        let sent = r.pair.send(&frames(&[50]), &mut Timing::new(false));
        assert_eq!(sent.lost, 0);
        assert!(r.backend.counters().bad_rx >= 1);
        // Far more than the backlog holds: the rest is lost, and counted.
        let many = frames(&vec![60; BACKLOG_FRAMES + 10]);
        let sent = r.pair.send(&many, &mut Timing::new(false));
        assert!(sent.lost >= 10, "{sent:?}");
        assert_eq!(r.backend.counters().rx_lost, sent.lost);
    }

    /// Reads `len` bytes of guest memory at `addr`.
    fn guest_bytes(r: &Rig, addr: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        r.mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
        b
    }

    #[test]
    fn a_checksum_completed_for_the_guest_may_straddle_its_buffers_and_chains() {
        let mut r = Rig::new();
        // A guest that completes no checksum: the device does, while writing.
        r.backend.inner().acked.store(
            feature::VERSION_1 | feature::NET_MRG_RXBUF,
            Ordering::SeqCst,
        );
        r.chain(0, BUF, 100, WRITE);
        // The second chain is two descriptors of 50 bytes.
        let i = r.next[0];
        r.next[0] += 2;
        r.put_desc(0, i, (BUF + 0x1000, 50, WRITE | NEXT, i + 1));
        r.put_desc(0, i + 1, (BUF + 0x2000, 50, WRITE, 0));
        r.offer(0, i);
        r.chain(0, BUF + 0x3000, 100, WRITE);
        let frame: Vec<u8> = (0..200u32).map(|k| (k * 7 + 3) as u8).collect();
        let mut f = Frames::new();
        f.push(&frame);
        // The field, 87..89 of the frame, lies at 99..101 of what the guest gets: across
        // the first buffer's end.
        *f.last_mut().unwrap().1 = Some((40, 47));
        let sent = r.pair.send(&f, &mut Timing::new(false));
        assert_eq!((sent.frames, sent.lost), (1, 0));
        let lens: Vec<u32> = (0..3).map(|n| r.used_elem(0, n).1).collect();
        assert_eq!(lens, [100, 100, 12]);
        let hdr = guest_bytes(&r, BUF, HDR_LONG);
        assert_eq!(hdr[0], 0, "no NEEDS_CSUM for a guest that did not take it");
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3);
        let mut got = guest_bytes(&r, BUF + HDR_LONG as u64, 100 - HDR_LONG);
        got.extend(guest_bytes(&r, BUF + 0x1000, 50));
        got.extend(guest_bytes(&r, BUF + 0x2000, 50));
        got.extend(guest_bytes(&r, BUF + 0x3000, 12));
        let mut want = frame.clone();
        csum::complete(&mut want, (40, 47));
        assert_ne!(want[87..89], frame[87..89], "the field changed");
        assert_eq!(got, want);
        // The batch's frame itself is untouched (it may be sent again from a backlog).
        assert_eq!(f.get(0), Some(&frame[..]));
    }

    #[test]
    fn a_frame_longer_than_a_chain_without_merged_buffers_writes_nothing_past_it() {
        let mut r = Rig::new();
        r.backend
            .inner()
            .acked
            .store(feature::VERSION_1, Ordering::SeqCst);
        r.mem.write_slice(&[0xee; 256], GuestAddress(BUF)).unwrap();
        r.chain(0, BUF, 100, WRITE);
        // One byte more than the chain holds behind the 12-byte header: it waits.
        let sent = r.pair.send(&frames(&[89]), &mut Timing::new(false));
        assert_eq!((sent.frames, sent.lost), (1, 0));
        assert_eq!(r.used_idx(0), 0, "the chain stays the guest's");
        assert!(guest_bytes(&r, BUF, 256).iter().all(|&b| b == 0xee));
        assert_eq!(r.backend.counters().rx_waited, 1);
        // One that fits exactly goes into a fresh ring (the waiting one ahead of it
        // still finds no room, so nothing overtakes it: it too waits).
        let mut r = Rig::new();
        r.backend
            .inner()
            .acked
            .store(feature::VERSION_1, Ordering::SeqCst);
        r.chain(0, BUF, 100, WRITE);
        let sent = r.pair.send(&frames(&[88]), &mut Timing::new(false));
        assert_eq!((sent.frames, sent.lost), (1, 0));
        assert_eq!(r.used_elem(0, 0), (0, 100));
        assert!(
            guest_bytes(&r, BUF + HDR_LONG as u64, 88)
                .iter()
                .all(|&b| b == 1)
        );
    }

    /// What waits in `b`: each frame's first byte and its offload.
    fn waiting(b: &Backlog) -> Vec<(u8, Option<Partial>)> {
        b.frames.iter().skip(b.at).map(|(f, c)| (f[0], c)).collect()
    }

    #[test]
    fn the_backlog_keeps_order_and_offloads_as_frames_go_and_its_buffer_fills() {
        let mut b = Backlog::default();
        assert!(b.keep(&[1; 10], None));
        assert!(b.keep(&[2; 10], Some((34, 16))));
        assert!(b.keep(&[3; 10], None));
        b.went(1);
        assert!(b.keep(&[4; 10], None));
        assert_eq!(waiting(&b), [(2, Some((34, 16))), (3, None), (4, None)]);
        // Frames near the byte cap: the buffer fills with the gone ones' bytes still in
        // it, and the waiting ones move to its start, in order, before the next.
        let big = Frames::FULL / 4;
        b.went(2);
        for k in 5..8 {
            assert!(b.keep(&vec![k; big], Some((1, u16::from(k)))));
        }
        b.went(2);
        assert!(b.keep(&vec![8; big], None));
        assert_eq!(b.at, 5, "no move while there is room");
        assert!(b.keep(&vec![9; big], None));
        assert_eq!(b.at, 0, "moved to the start");
        assert_eq!(
            waiting(&b),
            [(6, Some((1, 6))), (7, Some((1, 7))), (8, None), (9, None)]
        );
        assert!(b.frames.iter().all(|(f, _)| f.len() == big));
        // Full of waiting frames: the next is refused, nothing moves.
        assert!(!b.keep(&[10; 10], None));
        assert_eq!(waiting(&b).len(), 4);
        // All gone: empty, its buffer reused from the start.
        b.went(4);
        assert!(b.is_empty() && b.frames.is_empty());
        let mut b = Backlog::default();
        for _ in 0..BACKLOG_FRAMES {
            assert!(b.keep(&[0; 1], None));
        }
        assert!(!b.keep(&[0; 1], None), "at most BACKLOG_FRAMES wait");
    }
}
