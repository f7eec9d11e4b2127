//! [`StreamDevice`]: QEMU's `-netdev stream` (and passt's socket protocol) as a
//! [`FrameDevice`]: a connected unix stream socket carrying Ethernet frames, each behind
//! its length (4 bytes, big-endian), no `virtio_net_hdr` (so frames written carry
//! complete checksums).
//!
//! The peer is not trusted. Reading: [`Deframer`] (pure) holds at most one buffer of
//! `2 × (4 + the largest frame)` bytes; a length of 0 or beyond the largest frame the
//! interface carries is refused, counted, and its bytes skipped as they come (never
//! buffered), so the stream stays in step; a partial frame waits for its rest. Writing:
//! what the socket does not take (the rest of a frame, the frames after it) waits in a
//! bounded queue ([`PENDING_MAX`] bytes past the first frame), written first on the next
//! call and as soon as the socket is writable again (the device's wake descriptor is an
//! epoll of the socket, which adds writability while bytes wait); frames beyond the bound
//! are lost and counted. A peer that reads slowly (a TCG guest's QEMU under load) is
//! waited for, not made to lose frames whose retransmission would stall its TCP; one that
//! never reads costs the bound's bytes, and the server never blocks.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{DeviceCaps, FrameDevice, Frames, Sent};
use crate::frame;
use crate::timing::{Stage, Timing};

/// The length in front of each frame.
pub const LEN: usize = 4;

/// What the peer was refused or lost, over the connection's life.
#[derive(Debug, Default)]
pub struct StreamCounters {
    /// Frames refused for their length (0, or beyond the largest frame), and the bytes
    /// skipped with them.
    pub bad_len: AtomicU64,
    pub skipped: AtomicU64,
    /// Frames towards the peer lost because it did not read (a tail waited).
    pub lost: AtomicU64,
}

impl StreamCounters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl std::fmt::Display for StreamCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = Ordering::Relaxed;
        write!(
            f,
            "stream: refused lengths {} ({} bytes skipped), lost towards the peer {}",
            self.bad_len.load(r),
            self.skipped.load(r),
            self.lost.load(r)
        )
    }
}

/// The reading side's state (see the module's header): bytes read and not yet taken
/// (`buf[start..end]`), and how many bytes of a refused frame are still to skip.
#[derive(Debug)]
pub struct Deframer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    skip: usize,
    max_frame: usize,
}

impl Deframer {
    /// A deframer of frames up to `max_frame` bytes.
    pub fn new(max_frame: usize) -> Deframer {
        Deframer {
            buf: vec![0; 2 * (LEN + max_frame)],
            start: 0,
            end: 0,
            skip: 0,
            max_frame,
        }
    }

    /// The next whole frame in what was read (`None`: more bytes are needed); refused
    /// lengths are counted in `c` and skipped on the way.
    pub fn next(&mut self, c: &StreamCounters) -> Option<&[u8]> {
        loop {
            if self.skip > 0 {
                let n = self.skip.min(self.end - self.start);
                self.skip -= n;
                self.start += n;
                StreamCounters::add(&c.skipped, n as u64);
                if self.skip > 0 {
                    return None;
                }
            }
            let have = &self.buf[self.start..self.end];
            let len: [u8; LEN] = have.get(..LEN)?.try_into().ok()?;
            let len = u32::from_be_bytes(len) as usize;
            if len == 0 || len > self.max_frame {
                StreamCounters::add(&c.bad_len, 1);
                self.start += LEN;
                self.skip = len;
                continue;
            }
            if have.len() < LEN + len {
                return None;
            }
            let at = self.start + LEN;
            self.start = at + len;
            return Some(&self.buf[at..at + len]);
        }
    }

    /// Room to read into (what waits is moved to the front first when that makes room
    /// for a whole frame); never empty while [`Deframer::next`] returns `None`.
    pub fn space(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < LEN + self.max_frame {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`Deframer::space`].
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }
}

/// Most bytes of frames waiting for the peer to read, past the first one.
pub const PENDING_MAX: usize = 4 << 20;

/// Framed bytes the socket did not take yet (`bytes[at..]`), in order.
#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    at: usize,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn len(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// Writes what waits with `write`; whether all of it went.
    fn flush(&mut self, write: &mut impl FnMut(&[u8], &[u8]) -> io::Result<usize>) -> bool {
        while !self.is_empty() {
            match write(&self.bytes[self.at..], &[]) {
                Ok(0) | Err(_) => return false,
                Ok(n) => self.at += n,
            }
        }
        self.bytes.clear();
        self.at = 0;
        true
    }

    /// Queues `hdr` then `frame`, from their `from`-th byte on.
    fn keep(&mut self, hdr: &[u8], frame: &[u8], from: usize) {
        if self.at > 0 && self.at >= self.bytes.len() / 2 {
            self.bytes.drain(..self.at);
            self.at = 0;
        }
        if let Some(h) = hdr.get(from..) {
            self.bytes.extend_from_slice(h);
            self.bytes.extend_from_slice(frame);
        } else {
            self.bytes
                .extend_from_slice(frame.get(from - hdr.len()..).unwrap_or_default());
        }
    }
}

/// Writes `frame` behind its length with `write` (a gather write of two slices; its
/// count of bytes taken), after what is `pending`; what the socket does not take waits
/// there. Whether the frame went or waits: `false`, lost (the queue is full, or the
/// socket failed).
fn send_frame(
    pending: &mut Pending,
    frame: &[u8],
    write: &mut impl FnMut(&[u8], &[u8]) -> io::Result<usize>,
) -> bool {
    let Ok(len) = u32::try_from(frame.len()) else {
        return false;
    };
    let hdr = len.to_be_bytes();
    if !pending.flush(write) {
        if pending.len() + LEN + frame.len() > PENDING_MAX {
            return false;
        }
        pending.keep(&hdr, frame, 0);
        return true;
    }
    let n = match write(&hdr, frame) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(_) => return false,
    };
    if n < LEN + frame.len() {
        pending.keep(&hdr, frame, n);
    }
    true
}

/// A connected stream socket as a frame device (see the module's header).
#[derive(Debug)]
pub struct StreamDevice {
    fd: OwnedFd,
    /// The wake descriptor: the socket's readability, and its writability while bytes
    /// are pending (`out`).
    poll: ferry_sys::Epoll,
    out: bool,
    mtu: usize,
    rx: Deframer,
    pending: Pending,
    counters: Arc<StreamCounters>,
}

impl StreamDevice {
    /// The connection `fd` (made non-blocking) of an interface whose MTU is `mtu`.
    pub fn new(fd: OwnedFd, mtu: usize) -> io::Result<StreamDevice> {
        ferry_sys::set_nonblocking(fd.as_fd(), true)?;
        let poll = ferry_sys::Epoll::new(1)?;
        poll.add(fd.as_fd(), libc::EPOLLIN as u32, 0)?;
        Ok(StreamDevice {
            fd,
            poll,
            out: false,
            mtu,
            rx: Deframer::new(mtu + frame::ETH_LEN),
            pending: Pending::default(),
            counters: Arc::default(),
        })
    }

    /// Writes what is pending; watches for writability while some still is.
    fn flush(&mut self) {
        let fd = self.fd.as_fd();
        let mut write = |a: &[u8], b: &[u8]| ferry_sys::tun::write2(fd, a, b);
        self.pending.flush(&mut write);
        self.watch_out(!self.pending.is_empty());
    }

    fn watch_out(&mut self, out: bool) {
        if out == self.out {
            return;
        }
        let events = if out {
            libc::EPOLLIN | libc::EPOLLOUT
        } else {
            libc::EPOLLIN
        };
        // Failing, the next frame or kick still flushes: only the wake is late.
        if self.poll.modify(self.fd.as_fd(), events as u32, 0).is_ok() {
            self.out = out;
        }
    }

    /// What the peer was refused or lost (shared: read it while the server runs).
    pub fn counters(&self) -> Arc<StreamCounters> {
        self.counters.clone()
    }
}

impl FrameDevice for StreamDevice {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            partial_csum: false,
        }
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        self.poll.as_fd()
    }

    fn recv(&mut self, into: &mut Frames, max: usize, timing: &mut Timing) -> io::Result<usize> {
        if self.out {
            self.flush();
        }
        let mut n = 0;
        while n < max && !into.full() {
            if let Some(f) = self.rx.next(&self.counters) {
                into.push(f);
                n += 1;
                continue;
            }
            let t0 = timing.start();
            let got = ferry_sys::read(self.fd.as_fd(), self.rx.space());
            let stage = if matches!(got, Ok(k) if k > 0) {
                Stage::TapRead
            } else {
                Stage::TapReadEmpty
            };
            timing.end(stage, t0, got.is_ok());
            match got {
                Ok(0) if n > 0 => break,
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the stream's peer is gone",
                    ));
                }
                Ok(k) => self.rx.filled(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn send(&mut self, frames: &Frames, timing: &mut Timing) -> Sent {
        let mut sent = Sent::default();
        let fd = self.fd.as_fd();
        // Once the socket is full, the batch's other frames queue without a write each.
        let mut full = false;
        let mut write = |a: &[u8], b: &[u8]| {
            if full {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let r = ferry_sys::tun::write2(fd, a, b);
            full = match &r {
                Ok(n) => *n < a.len() + b.len(),
                Err(e) => e.kind() == io::ErrorKind::WouldBlock,
            };
            r
        };
        for (frame, _) in frames.iter() {
            let t0 = timing.start();
            let ok = send_frame(&mut self.pending, frame, &mut write);
            timing.end(Stage::TapWrite, t0, ok);
            if ok {
                sent.frames += 1;
                sent.bytes += frame.len() as u64;
            } else {
                sent.lost += 1;
                StreamCounters::add(&self.counters.lost, 1);
            }
        }
        let waiting = !self.pending.is_empty();
        self.watch_out(waiting);
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(frames: &[&[u8]]) -> Vec<u8> {
        let mut v = Vec::new();
        for f in frames {
            v.extend_from_slice(&u32::try_from(f.len()).unwrap().to_be_bytes());
            v.extend_from_slice(f);
        }
        v
    }

    /// Feeds `bytes` to a deframer `chunk` bytes at a time; the frames it yields.
    fn deframe(d: &mut Deframer, c: &StreamCounters, bytes: &[u8], chunk: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for part in bytes.chunks(chunk) {
            let space = d.space();
            assert!(space.len() >= part.len());
            space[..part.len()].copy_from_slice(part);
            d.filled(part.len());
            while let Some(f) = d.next(c) {
                out.push(f.to_vec());
            }
        }
        out
    }

    #[test]
    fn frames_come_whole_however_the_stream_is_cut() {
        let big = vec![7u8; 1514];
        let bytes = framed(&[b"one", &big, b"three"]);
        for chunk in [1, 3, 4, 5, 1000, bytes.len()] {
            let (mut d, c) = (Deframer::new(1514), StreamCounters::default());
            let got = deframe(&mut d, &c, &bytes, chunk);
            assert_eq!(got, vec![b"one".to_vec(), big.clone(), b"three".to_vec()]);
            assert_eq!(c.bad_len.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn zero_and_oversized_lengths_are_refused_and_skipped_in_step() {
        let (mut d, c) = (Deframer::new(100), StreamCounters::default());
        let mut bytes = framed(&[b"a"]);
        bytes.extend_from_slice(&0u32.to_be_bytes());
        // 5,000 bytes claimed and sent: skipped as they come, never buffered.
        bytes.extend_from_slice(&5000u32.to_be_bytes());
        bytes.extend_from_slice(&[0xee; 5000]);
        bytes.extend_from_slice(&framed(&[b"b", &[1; 100]]));
        let got = deframe(&mut d, &c, &bytes, 64);
        assert_eq!(got, vec![b"a".to_vec(), b"b".to_vec(), vec![1; 100]]);
        assert_eq!(c.bad_len.load(Ordering::Relaxed), 2);
        assert_eq!(c.skipped.load(Ordering::Relaxed), 5000);
        assert_eq!(d.buf.len(), 2 * (LEN + 100), "the buffer never grew");
        // A length of 4 GiB: its bytes are skipped as they come, the buffer stays.
        let mut huge = u32::MAX.to_be_bytes().to_vec();
        huge.extend_from_slice(&[0; 10_000]);
        assert!(deframe(&mut d, &c, &huge, 100).is_empty());
        assert_eq!(d.buf.len(), 2 * (LEN + 100));
    }

    #[test]
    fn a_slow_peer_is_waited_for_in_step_and_one_that_never_reads_costs_the_bound() {
        let mut pending = Pending::default();
        let wire = std::cell::RefCell::new(Vec::new());
        let room = std::cell::Cell::new(6usize);
        let mut write = |a: &[u8], b: &[u8]| -> io::Result<usize> {
            let mut n = 0;
            for s in [a, b] {
                let k = s.len().min(room.get() - n);
                wire.borrow_mut().extend_from_slice(&s[..k]);
                n += k;
            }
            if n == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            room.set(room.get() - n);
            Ok(n)
        };
        assert!(send_frame(&mut pending, b"hello", &mut write), "part went");
        assert!(send_frame(&mut pending, b"waits", &mut write), "queued");
        assert_eq!(pending.len(), 3 + LEN + 5);
        room.set(100);
        assert!(send_frame(&mut pending, b"next", &mut write));
        assert_eq!(
            *wire.borrow(),
            framed(&[b"hello", b"waits", b"next"]),
            "nothing lost, the stream in step"
        );
        assert!(pending.is_empty());
        // A peer that never reads: frames queue up to the bound, then are lost.
        room.set(0);
        let big = vec![1u8; 60_000];
        let queued = (0..200)
            .filter(|_| send_frame(&mut pending, &big, &mut write))
            .count();
        assert_eq!(queued, PENDING_MAX / (LEN + big.len()));
        assert!(pending.len() <= PENDING_MAX);
    }

    #[test]
    fn a_device_reads_batches_and_writes_frames_over_a_socket() {
        let (a, b) = ferry_sys::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
        .unwrap();
        let mut dev = StreamDevice::new(a, 1500).unwrap();
        let mut t = Timing::new(false);
        let bytes = framed(&[b"x1", b"x2", b"x3"]);
        ferry_sys::send_nosignal(b.as_fd(), &bytes[..9]).unwrap();
        let mut f = Frames::new();
        assert_eq!(dev.recv(&mut f, 64, &mut t).unwrap(), 1);
        ferry_sys::send_nosignal(b.as_fd(), &bytes[9..]).unwrap();
        assert_eq!(dev.recv(&mut f, 64, &mut t).unwrap(), 2);
        assert_eq!(f.get(2), Some(&b"x3"[..]));
        let mut out = Frames::new();
        out.push(b"back");
        assert_eq!(dev.send(&out, &mut t).frames, 1);
        let mut buf = [0u8; 16];
        let n = ferry_sys::recv(b.as_fd(), &mut buf, libc::MSG_DONTWAIT).unwrap();
        assert_eq!(&buf[..n], &framed(&[b"back"])[..]);
        drop(b);
        assert!(dev.recv(&mut f, 64, &mut t).is_err(), "the peer gone");
    }

    #[test]
    fn frames_a_full_socket_does_not_take_wait_and_its_room_wakes_the_server() {
        let (a, b) = ferry_sys::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
        .unwrap();
        let mut dev = StreamDevice::new(a, 65520).unwrap();
        let mut t = Timing::new(false);
        let mut out = Frames::new();
        for k in 0..40u8 {
            out.push(&vec![k; 60_000]);
        }
        let sent = dev.send(&out, &mut t);
        assert_eq!(
            (sent.frames, sent.lost),
            (40, 0),
            "2.4 MB: more than the socket holds"
        );
        assert!(!dev.pending.is_empty());
        let ready = |d: &StreamDevice| ferry_sys::poll_wait(d.wake_fd(), libc::POLLIN, 0).unwrap();
        assert_eq!(
            ready(&dev) & libc::POLLIN,
            0,
            "nothing to do while the peer reads nothing"
        );
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        while got.len() < 40 * (LEN + 60_000) {
            match ferry_sys::recv(b.as_fd(), &mut buf, libc::MSG_DONTWAIT) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => {
                    assert_ne!(ready(&dev) & libc::POLLIN, 0, "room wakes the server");
                    let mut f = Frames::new();
                    dev.recv(&mut f, 64, &mut t).unwrap();
                }
            }
        }
        let want: Vec<Vec<u8>> = (0..40u8).map(|k| vec![k; 60_000]).collect();
        let want: Vec<&[u8]> = want.iter().map(Vec::as_slice).collect();
        assert!(got == framed(&want), "every frame, in order");
        assert!(dev.pending.is_empty());
        assert_eq!(ready(&dev) & libc::POLLIN, 0, "no wake once all went");
    }
}
