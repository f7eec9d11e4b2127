//! [`TapQueue`]: one queue of the sandbox's TAP as a [`FrameDevice`]. Each `read`
//! returns one frame behind its `virtio_net_hdr` (whose flags are not needed: checksums
//! are not verified), each `writev` sends one with a header that carries the partial
//! TCP checksum, if any (`NEEDS_CSUM`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ferry_sys::tun;

use super::{DeviceCaps, FRAME_MAX, FrameDevice, Frames, Sent};
use crate::timing::{Stage, Timing};

/// A TAP queue (see the module's header). Any descriptor that carries one frame per
/// message behind a `virtio_net_hdr` serves: tests give it one end of an `AF_UNIX`
/// `SOCK_SEQPACKET` pair.
#[derive(Debug)]
pub struct TapQueue {
    fd: OwnedFd,
    mtu: usize,
}

impl TapQueue {
    /// The queue `fd` (made non-blocking) of an interface whose MTU is `mtu`.
    pub fn new(fd: OwnedFd, mtu: usize) -> io::Result<TapQueue> {
        ferry_sys::set_nonblocking(fd.as_fd(), true)?;
        Ok(TapQueue { fd, mtu })
    }

    /// The `virtio_net_hdr` in front of a frame: `NEEDS_CSUM` with its offsets, or none.
    fn header(csum: Option<(u16, u16)>) -> [u8; tun::VNET_HDR_LEN] {
        let mut hdr = [0u8; tun::VNET_HDR_LEN];
        if let Some((start, offset)) = csum {
            hdr[0] = tun::VNET_NEEDS_CSUM;
            hdr[6..8].copy_from_slice(&start.to_le_bytes());
            hdr[8..10].copy_from_slice(&offset.to_le_bytes());
        }
        hdr
    }
}

impl FrameDevice for TapQueue {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            partial_csum: true,
        }
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn recv(&mut self, into: &mut Frames, max: usize, timing: &mut Timing) -> io::Result<usize> {
        let mut n = 0;
        while n < max && !into.full() {
            let t0 = timing.start();
            let mut got = Ok(0);
            into.push_with(tun::VNET_HDR_LEN + FRAME_MAX, |b| {
                got = ferry_sys::read(self.fd.as_fd(), b).and_then(|n| match n {
                    // A TAP never reads empty; a socket's peer has gone.
                    0 => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the queue's peer is gone",
                    )),
                    n => Ok(n),
                });
                // A message shorter than its header is an empty frame (malformed).
                let len = *got.as_ref().ok()?;
                Some((tun::VNET_HDR_LEN, len.saturating_sub(tun::VNET_HDR_LEN)))
            });
            let stage = if got.is_ok() {
                Stage::TapRead
            } else {
                Stage::TapReadEmpty
            };
            timing.end(stage, t0, got.is_ok());
            match got {
                Ok(_) => n += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // Gone: what was read still counts; the next call reports it.
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn send(&mut self, frames: &Frames, timing: &mut Timing) -> Sent {
        let mut sent = Sent::default();
        for (frame, csum) in frames.iter() {
            let t0 = timing.start();
            let r = tun::write2(self.fd.as_fd(), &TapQueue::header(csum), frame);
            timing.end(Stage::TapWrite, t0, r.is_ok());
            match r {
                Ok(_) => {
                    sent.frames += 1;
                    sent.bytes += frame.len() as u64;
                }
                // The queue towards the sandbox is full: the frame is lost, as on a wire
                // (TCP retransmits).
                Err(_) => sent.lost += 1,
            }
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (TapQueue, OwnedFd) {
        let (a, b) = ferry_sys::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
        .unwrap();
        (TapQueue::new(a, 1500).unwrap(), b)
    }

    #[test]
    fn reads_a_batch_behind_headers_and_stops_when_empty() {
        let (mut q, peer) = pair();
        let mut t = Timing::new(true);
        for msg in [&b"0123456789frame-one"[..], b"0123456789two", b"short"] {
            ferry_sys::send_nosignal(peer.as_fd(), msg).unwrap();
        }
        let mut f = Frames::new();
        assert_eq!(q.recv(&mut f, 64, &mut t).unwrap(), 3);
        assert_eq!(f.get(0), Some(&b"frame-one"[..]));
        assert_eq!(f.get(1), Some(&b"two"[..]));
        // Shorter than its header: an empty frame, for the classifier to drop.
        assert_eq!(f.get(2), Some(&b""[..]));
        assert_eq!(q.recv(&mut f, 64, &mut t).unwrap(), 0);
        let totals = t.totals().unwrap();
        assert_eq!(totals[Stage::TapRead as usize].1.calls, 3);
        assert_eq!(totals[Stage::TapReadEmpty as usize].1.calls, 2);
        // At most `max` a call.
        for _ in 0..3 {
            ferry_sys::send_nosignal(peer.as_fd(), b"0123456789x").unwrap();
        }
        f.clear();
        assert_eq!(q.recv(&mut f, 2, &mut t).unwrap(), 2);
        assert_eq!(q.recv(&mut f, 2, &mut t).unwrap(), 1);
        // The peer gone: an error once nothing is left, not empty frames.
        ferry_sys::send_nosignal(peer.as_fd(), b"0123456789last").unwrap();
        drop(peer);
        f.clear();
        assert_eq!(q.recv(&mut f, 64, &mut t).unwrap(), 1);
        assert_eq!(f.get(0), Some(&b"last"[..]));
        assert!(q.recv(&mut f, 64, &mut t).is_err());
    }

    #[test]
    fn writes_each_frame_with_its_offload_header() {
        let (mut q, peer) = pair();
        let mut t = Timing::new(false);
        let mut f = Frames::new();
        f.push(b"plain");
        f.push(b"segment");
        *f.last_mut().unwrap().1 = Some((34, 16));
        let sent = q.send(&f, &mut t);
        assert_eq!(
            sent,
            Sent {
                frames: 2,
                bytes: 12,
                lost: 0
            }
        );
        let mut buf = [0u8; 64];
        let n = ferry_sys::recv(peer.as_fd(), &mut buf, libc::MSG_DONTWAIT).unwrap();
        assert_eq!(&buf[..n], b"\0\0\0\0\0\0\0\0\0\0plain");
        let n = ferry_sys::recv(peer.as_fd(), &mut buf, libc::MSG_DONTWAIT).unwrap();
        assert_eq!(buf[0], tun::VNET_NEEDS_CSUM);
        assert_eq!(&buf[6..10], &[34, 0, 16, 0]);
        assert_eq!(&buf[10..n], b"segment");
        // A full queue loses frames and says so.
        drop(peer);
        assert_eq!(q.send(&f, &mut t).lost, 2);
    }
}
