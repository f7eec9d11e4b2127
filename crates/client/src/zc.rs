//! Zero-copy access to channel buffers (S0's DMHU): the caller writes straight into the
//! buffer the server will send from, and reads straight out of the buffer the server
//! received into. The only copies left are the kernel's own.

use std::io;

use ferry_proto::{BufRef, Call};
use ferry_ring::{BufId, BufSpan};

use crate::{Client, Socket, err, proto_err};

/// A free buffer of this channel, handed to the caller to fill.
#[derive(Debug)]
pub struct ZcBuf {
    id: BufId,
    span: BufSpan,
}

/// Received data that still lies in the server's buffer (give it back when done).
#[derive(Debug)]
pub struct Lent {
    sock: u32,
    span: BufSpan,
}

impl ZcBuf {
    /// How many bytes the buffer holds.
    pub fn capacity(&self) -> usize {
        self.span.len() as usize
    }
}

impl Lent {
    /// How many bytes were received.
    pub fn len(&self) -> usize {
        self.span.len() as usize
    }

    /// Whether nothing was received (never true for a `Lent` from `recv_lend`).
    pub fn is_empty(&self) -> bool {
        self.span.is_empty()
    }
}

impl Client {
    /// A free buffer to fill; waits while every buffer is in flight.
    pub fn buffer(&mut self) -> io::Result<ZcBuf> {
        loop {
            if let Some(id) = self.ep.pool.alloc() {
                let span = self.ep.bufs.whole(id).map_err(proto_err)?;
                return Ok(ZcBuf { id, span });
            }
            self.reap()?;
        }
    }

    /// The buffer's memory, to write into.
    pub fn bytes_mut<'a>(&'a self, b: &'a mut ZcBuf) -> &'a mut [u8] {
        let ptr = self.ep.bufs.as_mut_ptr(b.span);
        // SAFETY: `b` was allocated from this side's pool and is not lent to the server
        // yet, so nobody else reads or writes it; the span was validated against the
        // region, which `self` keeps mapped for the lifetime of the borrow; `b` is
        // borrowed mutably, so no second slice of the same buffer can exist.
        unsafe { std::slice::from_raw_parts_mut(ptr, b.span.len() as usize) }
    }

    /// Sends the first `len` bytes of `b`: the server hands them to the kernel straight
    /// from the buffer, which comes back to this side's pool when sent.
    pub fn send_buffer(&mut self, s: &Socket, b: ZcBuf, len: usize) -> io::Result<()> {
        let len = len.min(b.capacity()) as u32;
        self.push_call(Call::Send {
            sock: s.id,
            buf: BufRef { id: b.id.0, len },
            offset: 0,
            flags: 0,
            dest: None,
        })
    }

    /// Receives up to `max` bytes (at most one buffer) without copying them: they stay in
    /// the server's buffer until [`give_back`](Self::give_back). `None` at end of stream.
    pub fn recv_lend(&mut self, s: &Socket, max: usize) -> io::Result<Option<Lent>> {
        let max = max.min(self.ep.bufs.buf_size()).max(1) as u32;
        let mut kept: Option<Lent> = None;
        let c = self.call_with(
            Call::Recv {
                sock: s.id,
                tag: 0,
                max,
                flags: 0,
                nonblock: false,
            },
            &mut |bufs, c| match (&kept, bufs.span(c.buf, 0, c.len)) {
                (None, Ok(span)) => {
                    kept = Some(Lent { sock: c.sock, span });
                    true
                }
                _ => false,
            },
        )?;
        if c.result < 0 {
            if let Some(l) = kept {
                self.give_back(l)?;
            }
            return Err(err(c.result));
        }
        Ok(kept)
    }

    /// The received bytes.
    pub fn lent_bytes<'a>(&'a self, l: &'a Lent) -> &'a [u8] {
        let ptr = self.ep.bufs.as_mut_ptr(l.span);
        // SAFETY: the server lent this buffer to us and does not touch it until we give
        // it back (protocol invariant; the server is the trusted side); the span was
        // validated against the region `self` keeps mapped.
        unsafe { std::slice::from_raw_parts(ptr, l.span.len() as usize) }
    }

    /// Returns a received buffer to the server.
    pub fn give_back(&mut self, l: Lent) -> io::Result<()> {
        self.give_back_id(l.sock, l.span.id().0)
    }
}
