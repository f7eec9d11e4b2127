//! [`FakeDevice`]: a frame device whose frames are byte vectors in two queues, one each
//! way, shared with the harness ([`Wire`]). Like the sandbox's kernel behind a TAP, it
//! completes the partial TCP checksums the server leaves ([`frame::complete_partial`])
//! and refuses a frame when its queue towards the sandbox is full.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::device::{DeviceCaps, FrameDevice, Frames, Sent};
use crate::frame;
use crate::timing::Timing;

/// The two queues of a [`FakeDevice`].
#[derive(Debug, Default)]
pub struct Wire {
    /// Frames the sandbox wrote, not read by the server yet.
    pub to_server: VecDeque<Vec<u8>>,
    /// Frames the server wrote, not taken by the harness yet.
    pub from_server: VecDeque<Vec<u8>>,
    /// Frames the queue towards the sandbox still takes (`None`: any number).
    pub room: Option<usize>,
    /// The device is gone (reads fail once the queue is empty).
    pub gone: bool,
}

/// The shared queues.
pub type SharedWire = Arc<Mutex<Wire>>;

pub(crate) fn lock(w: &SharedWire) -> MutexGuard<'_, Wire> {
    w.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A frame device over a [`Wire`] (see the module's header).
#[derive(Debug)]
pub struct FakeDevice {
    wire: SharedWire,
    /// Never signalled: the harness delivers everything itself.
    wake: OwnedFd,
    mtu: usize,
}

impl FakeDevice {
    /// A device of MTU `mtu` over `wire`.
    pub fn new(wire: SharedWire, mtu: usize) -> io::Result<FakeDevice> {
        Ok(FakeDevice {
            wire,
            wake: ferry_sys::eventfd()?,
            mtu,
        })
    }
}

impl FrameDevice for FakeDevice {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            partial_csum: true,
        }
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    fn recv(&mut self, into: &mut Frames, max: usize, _: &mut Timing) -> io::Result<usize> {
        let mut w = lock(&self.wire);
        if w.gone && w.to_server.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EBADFD));
        }
        let mut n = 0;
        while n < max && !into.full() {
            let Some(f) = w.to_server.pop_front() else {
                break;
            };
            into.push(&f);
            n += 1;
        }
        Ok(n)
    }

    fn send(&mut self, frames: &Frames, _: &mut Timing) -> Sent {
        let mut w = lock(&self.wire);
        let mut sent = Sent::default();
        for (f, csum) in frames.iter() {
            if w.gone || w.room == Some(0) {
                sent.lost += 1;
                continue;
            }
            let mut f = f.to_vec();
            if let Some((start, offset)) = csum {
                assert!(
                    usize::from(start) + usize::from(offset) + 2 <= f.len(),
                    "a partial checksum at {start}+{offset} outside a frame of {} bytes",
                    f.len()
                );
                frame::complete_partial(&mut f, (start, offset));
            }
            sent.frames += 1;
            sent.bytes += f.len() as u64;
            w.from_server.push_back(f);
            if let Some(r) = w.room.as_mut() {
                *r -= 1;
            }
        }
        sent
    }
}
