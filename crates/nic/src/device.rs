//! The frame device a NIC server serves: where the sandbox's frames come from and go
//! to. [`FrameDevice`] is the whole contract (read a batch, write a batch, a descriptor
//! to wait on, what the device can do); the server knows nothing else of it.
//! [`TapQueue`] is the first device: one queue of the sandbox's TAP (or any descriptor
//! carrying one frame per message behind a `virtio_net_hdr`, such as one end of an
//! `AF_UNIX` `SOCK_SEQPACKET` pair); [`StreamDevice`] is QEMU's `-netdev stream` socket
//! (frames behind a 4-byte length, `stream.rs`). Another device — a VM's virtio queue
//! (`ferry-vhost`) — is another implementation in a file (or crate) of its own.
//!
//! Owns: [`Frames`], a batch of frames in one buffer (each with its checksum offload),
//! and the device trait. Must not: interpret a frame (that is `frame.rs`), or hold more
//! than one batch's bytes.

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;

use crate::frame;
use crate::timing::Timing;

mod stream;
mod tap;

pub use stream::{Deframer, StreamCounters, StreamDevice};
pub use tap::TapQueue;

/// Largest frame a device carries: an IP packet of up to 64 KiB and its Ethernet header.
pub const FRAME_MAX: usize = 65_536 + frame::ETH_LEN;

/// What a device can do, fixed when it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Largest IP packet it carries (the sandbox interface's MTU); a frame is at most
    /// this plus [`frame::ETH_LEN`].
    pub mtu: usize,
    /// It takes TCP segments whose checksum is left partial (the pseudo-header's sum,
    /// completed by the receiver: a `virtio_net_hdr` with `NEEDS_CSUM`). Without it,
    /// every frame written carries complete checksums.
    pub partial_csum: bool,
}

/// A source and sink of Ethernet frames: the sandbox's side of a NIC server.
///
/// Every call is non-blocking. Errors other than "nothing now" mean the device is gone
/// (the sandbox's namespace, the VM): the server stops reading it.
pub trait FrameDevice: Send + fmt::Debug {
    /// What it can do.
    fn caps(&self) -> DeviceCaps;
    /// A descriptor that polls readable when frames wait (the server's epoll watches it).
    fn wake_fd(&self) -> BorrowedFd<'_>;
    /// Appends to `into` the frames waiting, at most `max` of them and none once `into`
    /// holds [`Frames::FULL`] bytes; how many. `Err`: the device is gone (and nothing
    /// was read). Each read is timed ([`Stage::TapRead`](crate::Stage), or
    /// `TapReadEmpty` for the one that found nothing).
    fn recv(&mut self, into: &mut Frames, max: usize, timing: &mut Timing) -> io::Result<usize>;
    /// Writes every frame of `frames`, in order (each with its offload); what went. A
    /// frame the device has no room for is lost, as on a wire. Each write is timed
    /// ([`Stage::TapWrite`](crate::Stage)).
    fn send(&mut self, frames: &Frames, timing: &mut Timing) -> Sent;
}

impl<D: FrameDevice + ?Sized> FrameDevice for Box<D> {
    fn caps(&self) -> DeviceCaps {
        (**self).caps()
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        (**self).wake_fd()
    }

    fn recv(&mut self, into: &mut Frames, max: usize, timing: &mut Timing) -> io::Result<usize> {
        (**self).recv(into, max, timing)
    }

    fn send(&mut self, frames: &Frames, timing: &mut Timing) -> Sent {
        (**self).send(frames, timing)
    }
}

/// What one [`FrameDevice::send`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Frames written, and their bytes.
    pub frames: u64,
    pub bytes: u64,
    /// Frames lost (the device's queue was full, or it is gone).
    pub lost: u64,
}

/// A checksum the receiver completes: (`csum_start`, `csum_offset`) as in a
/// `virtio_net_hdr` with `NEEDS_CSUM`.
pub type Partial = (u16, u16);

#[derive(Clone, Copy, Debug)]
struct Span {
    start: usize,
    len: usize,
    csum: Option<Partial>,
}

/// A batch of frames in one buffer. The buffer grows to the largest batch seen and is
/// never zeroed again: a batch costs the bytes of its frames, plus room for one more.
#[derive(Debug, Default)]
pub struct Frames {
    buf: Vec<u8>,
    used: usize,
    spans: Vec<Span>,
}

impl Frames {
    /// Bytes a batch holds before it counts as full (readers stop, writers flush).
    pub const FULL: usize = 1 << 20;

    /// An empty batch.
    pub fn new() -> Frames {
        Frames::default()
    }

    /// Frames in the batch.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Whether it holds [`Frames::FULL`] bytes or more.
    pub fn full(&self) -> bool {
        self.used >= Frames::FULL
    }

    /// Empties the batch (its buffer stays).
    pub fn clear(&mut self) {
        self.used = 0;
        self.spans.clear();
    }

    /// Frame `i`.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let s = self.spans.get(i)?;
        self.buf.get(s.start..s.start + s.len)
    }

    /// Frame `i`'s partial checksum, if it has one.
    pub fn partial(&self, i: usize) -> Option<Partial> {
        self.spans.get(i)?.csum
    }

    /// The frames, each with its partial checksum.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<Partial>)> {
        self.spans
            .iter()
            .map(|s| (&self.buf[s.start..s.start + s.len], s.csum))
    }

    /// Appends a frame: `fill` gets `room` bytes and says where in them the frame lies
    /// (offset, length), or `None` for nothing appended. A device reads a message with
    /// its header into the room and points past the header.
    pub fn push_with(
        &mut self,
        room: usize,
        fill: impl FnOnce(&mut [u8]) -> Option<(usize, usize)>,
    ) -> Option<&mut [u8]> {
        let at = self.used;
        if self.buf.len() < at + room {
            self.buf.resize(at + room, 0);
        }
        let (offset, len) = fill(&mut self.buf[at..at + room])?;
        let len = len.min(room.saturating_sub(offset));
        let start = at + offset.min(room);
        self.spans.push(Span {
            start,
            len,
            csum: None,
        });
        self.used = start + len;
        Some(&mut self.buf[start..start + len])
    }

    /// Appends a frame of `len` bytes for the caller to write (what the buffer held
    /// there before, not zeroes).
    pub fn append(&mut self, len: usize) -> &mut [u8] {
        let at = self.used;
        if self.buf.len() < at + len {
            self.buf.resize(at + len, 0);
        }
        self.spans.push(Span {
            start: at,
            len,
            csum: None,
        });
        self.used = at + len;
        &mut self.buf[at..at + len]
    }

    /// Appends a copy of `frame`.
    pub fn push(&mut self, frame: &[u8]) {
        self.push_with(frame.len(), |b| {
            b.copy_from_slice(frame);
            Some((0, frame.len()))
        });
    }

    /// The last frame, to finish it (its checksum), and where its partial checksum goes.
    pub fn last_mut(&mut self) -> Option<(&mut [u8], &mut Option<Partial>)> {
        let s = self.spans.last_mut()?;
        Some((&mut self.buf[s.start..s.start + s.len], &mut s.csum))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_keep_their_bytes_order_and_offload() {
        let mut f = Frames::new();
        f.push(b"first");
        f.push_with(100, |b| {
            b[..10].fill(9);
            b[10..13].copy_from_slice(b"two");
            Some((10, 3))
        });
        // A fill that appends nothing leaves the batch as it was.
        assert!(f.push_with(50, |_| None).is_none());
        let (last, csum) = f.last_mut().unwrap();
        assert_eq!(last, b"two");
        *csum = Some((34, 16));
        assert_eq!(f.len(), 2);
        assert_eq!(f.get(0), Some(&b"first"[..]));
        assert_eq!(f.get(1), Some(&b"two"[..]));
        assert_eq!(f.get(2), None);
        assert_eq!(f.partial(1), Some((34, 16)));
        let all: Vec<_> = f.iter().collect();
        assert_eq!(
            all,
            vec![(&b"first"[..], None), (&b"two"[..], Some((34, 16)))]
        );
        // The batch holds what its frames need, not the room each asked for.
        assert_eq!(f.used, 5 + 10 + 3);
        f.clear();
        assert!(f.is_empty() && !f.full());
        f.push(b"again");
        f.append(3).copy_from_slice(b"end");
        assert_eq!(f.get(0), Some(&b"again"[..]));
        assert_eq!(f.get(1), Some(&b"end"[..]));
    }

    #[test]
    fn a_fill_that_claims_more_than_its_room_is_cut_to_it() {
        let mut f = Frames::new();
        f.push_with(8, |_| Some((4, 100)));
        assert_eq!(f.get(0).map(<[u8]>::len), Some(4));
        f.push_with(8, |_| Some((20, 1)));
        assert_eq!(f.get(1).map(<[u8]>::len), Some(0));
    }
}
