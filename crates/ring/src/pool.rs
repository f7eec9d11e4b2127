//! Data buffers: each side's pool of its own buffers, and validated access to all of
//! them.
//!
//! Ownership: buffers `0..bufs_a` belong to side A, `bufs_a..bufs_a + bufs_b` to side
//! B. Only the owner allocates and frees its buffers, from a process-local free list;
//! nothing about ownership is kept in shared memory, so a peer cannot corrupt it. A
//! buffer travels by id in a record: the owner fills it and sends the id, the peer reads
//! it and sends the id back, the owner frees it. The "lent" bitmap catches ids the peer
//! returns twice or that were never lent ([`Error::DoubleFree`]) and ids of the other
//! side ([`Error::BufferNotOurs`]).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::Error;
use crate::layout::{Layout, Side};
use crate::region::{Claim, Region};

/// A buffer's global index: `0..bufs_a` are A's, then B's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

/// One side's own buffers: a free list plus an "is lent" bitmap, process-local.
pub struct BufPool {
    side: Side,
    /// Our ids are `first..first + count`.
    first: u32,
    count: u32,
    /// Every id in the region is `< total`.
    total: u32,
    free: Vec<u32>,
    /// Bit `id - first` is set while the buffer is allocated.
    lent: Vec<u64>,
    _claim: Arc<Claim>,
}

impl BufPool {
    pub(crate) fn new(layout: &Layout, side: Side, claim: Arc<Claim>) -> BufPool {
        let (first, count) = match side {
            Side::A => (0, layout.bufs_a),
            Side::B => (layout.bufs_a, layout.bufs_b),
        };
        BufPool {
            side,
            first,
            count,
            total: layout.total_bufs(),
            // Reversed so that the lowest ids are handed out first.
            free: (first..first + count).rev().collect(),
            lent: vec![0; (count as usize).div_ceil(64)],
            _claim: claim,
        }
    }

    /// Take a free buffer; `None` = all are lent (back-pressure).
    pub fn alloc(&mut self) -> Option<BufId> {
        let id = self.free.pop()?;
        let bit = (id - self.first) as usize;
        self.lent[bit / 64] |= 1 << (bit % 64);
        Some(BufId(id))
    }

    /// Give a buffer back. The id usually came from the peer, so it is checked:
    /// [`Error::BufferIndex`] (no such buffer), [`Error::BufferNotOurs`] (the peer's),
    /// [`Error::DoubleFree`] (not lent).
    pub fn free(&mut self, id: BufId) -> Result<(), Error> {
        let BufId(raw) = id;
        if raw >= self.total {
            return Err(Error::BufferIndex {
                id: raw,
                total: self.total,
            });
        }
        if !self.owns(id) {
            return Err(Error::BufferNotOurs {
                id: raw,
                owner: self.side.peer(),
            });
        }
        let bit = (raw - self.first) as usize;
        let word = &mut self.lent[bit / 64];
        if *word & (1 << (bit % 64)) == 0 {
            return Err(Error::DoubleFree { id: raw });
        }
        *word &= !(1 << (bit % 64));
        self.free.push(raw);
        Ok(())
    }

    /// Whether `id` is one of this side's buffers.
    pub fn owns(&self, id: BufId) -> bool {
        id.0.wrapping_sub(self.first) < self.count
    }

    /// Buffers free now.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Buffers this side owns.
    pub fn total(&self) -> usize {
        self.count as usize
    }

    /// The side whose buffers these are.
    pub fn side(&self) -> Side {
        self.side
    }
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("side", &self.side)
            .field("ids", &(self.first..self.first + self.count))
            .field("available", &self.free.len())
            .finish_non_exhaustive()
    }
}

/// A validated `(id, off, len)` inside one buffer; only made by [`Buffers::span`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufSpan {
    id: u32,
    off: u32,
    len: u32,
}

impl BufSpan {
    /// The buffer.
    pub fn id(&self) -> BufId {
        BufId(self.id)
    }

    /// Offset in the buffer.
    pub fn off(&self) -> u32 {
        self.off
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Access to all buffer memory of a region, through validated spans. `Clone + Send +
/// Sync`; cloning is cheap (it shares the region).
///
/// The memory is shared with the peer, which may write any buffer at any time: copies
/// in and out are plain byte copies through raw pointers (never references), so such
/// writes can only change the bytes copied, which the receiver validates.
#[derive(Clone)]
pub struct Buffers {
    base: NonNull<u8>,
    stride: usize,
    buf_size: u32,
    total: u32,
    region: Arc<Region>,
}

// SAFETY: `base` points into the mapping owned by `region`, which we keep alive; the
// memory is only accessed by raw copies (see the type's docs), never through references,
// so sharing the pointer between threads adds nothing a peer process cannot already do.
unsafe impl Send for Buffers {}
// SAFETY: `&Buffers` offers only the raw-copy operations `Buffers` does (no `&mut`,
// no references into the mapping), so sharing it between threads adds nothing a peer
// process writing the same memory cannot already do (see `Send` above).
unsafe impl Sync for Buffers {}

impl Buffers {
    pub(crate) fn new(region: Arc<Region>) -> Buffers {
        let layout = region.layout();
        Buffers {
            base: region.bufs_base(),
            stride: region.buf_stride(),
            buf_size: layout.buf_size,
            total: layout.total_bufs(),
            region,
        }
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size as usize
    }

    /// Validate `(id, off, len)` (usually read from a peer's record):
    /// [`Error::BufferIndex`] / [`Error::BufferRange`].
    pub fn span(&self, id: u32, off: u32, len: u32) -> Result<BufSpan, Error> {
        if id >= self.total {
            return Err(Error::BufferIndex {
                id,
                total: self.total,
            });
        }
        match off.checked_add(len) {
            Some(end) if end <= self.buf_size => Ok(BufSpan { id, off, len }),
            _ => Err(Error::BufferRange {
                id,
                off,
                len,
                buf_size: self.buf_size,
            }),
        }
    }

    /// The whole of buffer `id`.
    pub fn whole(&self, id: BufId) -> Result<BufSpan, Error> {
        self.span(id.0, 0, self.buf_size)
    }

    /// Copy `min(s.len(), data.len())` bytes of `data` into the span; returns how many.
    pub fn write(&self, s: BufSpan, data: &[u8]) -> usize {
        let n = data.len().min(s.len as usize);
        // SAFETY: `start` checked the span against this region's buffers, so `n` bytes
        // from it are inside the mapping; `data` is local memory, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.start(s), n) };
        n
    }

    /// Copy `min(s.len(), out.len())` bytes of the span into `out`; returns how many.
    pub fn read(&self, s: BufSpan, out: &mut [u8]) -> usize {
        let n = out.len().min(s.len as usize);
        // SAFETY: as in `write`, with `out` as the local, non-overlapping destination.
        unsafe { std::ptr::copy_nonoverlapping(self.start(s), out.as_mut_ptr(), n) };
        n
    }

    /// Start of the span, for system calls straight into or out of shared memory
    /// (`s.len()` bytes are valid). Dereferencing it is the caller's `unsafe`.
    pub fn as_mut_ptr(&self, s: BufSpan) -> *mut u8 {
        self.start(s)
    }

    /// Start of a span. Spans are only made by `span`, but one made for another region
    /// (with larger buffers) must not reach out of this one: re-checked, and a mismatch
    /// (a bug in the caller, not peer data) panics.
    fn start(&self, s: BufSpan) -> *mut u8 {
        assert!(
            s.id < self.total && s.off as u64 + s.len as u64 <= self.buf_size as u64,
            "BufSpan {s:?} does not belong to this region"
        );
        let off = s.id as usize * self.stride + s.off as usize;
        // SAFETY: checked above: `off + len <= total * stride`, the size of the buffer
        // area inside the mapping (validated geometry).
        unsafe { self.base.as_ptr().add(off) }
    }
}

impl fmt::Debug for Buffers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffers")
            .field("total", &self.total)
            .field("buf_size", &self.buf_size)
            .field("region", &Arc::as_ptr(&self.region))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            ring_slots: 4,
            record_size: 8,
            bufs_a: 3,
            bufs_b: 70,
            buf_size: 128,
        }
    }

    fn region() -> Arc<Region> {
        Arc::new(Region::create("ferry-pool-test", layout()).unwrap())
    }

    #[test]
    fn alloc_until_exhausted_then_free() {
        let r = region();
        let mut a = BufPool::new(&layout(), Side::A, Arc::new(r.claim(Side::A).unwrap()));
        let ids: Vec<_> = std::iter::from_fn(|| a.alloc()).collect();
        assert_eq!(ids, [BufId(0), BufId(1), BufId(2)]);
        assert_eq!(a.available(), 0);
        a.free(BufId(1)).unwrap();
        assert_eq!(a.alloc(), Some(BufId(1)));
        for id in ids {
            a.free(id).unwrap();
        }
        assert_eq!((a.available(), a.total()), (3, 3));
    }

    #[test]
    fn free_rejects_bad_ids() {
        let r = region();
        let mut b = BufPool::new(&layout(), Side::B, Arc::new(r.claim(Side::B).unwrap()));
        let ids: Vec<_> = std::iter::from_fn(|| b.alloc()).collect();
        assert_eq!(ids.len(), 70);
        assert_eq!(ids[0], BufId(3));
        assert!(matches!(
            b.free(BufId(73)),
            Err(Error::BufferIndex { id: 73, total: 73 })
        ));
        assert!(matches!(
            b.free(BufId(2)),
            Err(Error::BufferNotOurs {
                id: 2,
                owner: Side::A
            })
        ));
        b.free(BufId(72)).unwrap();
        assert!(matches!(
            b.free(BufId(72)),
            Err(Error::DoubleFree { id: 72 })
        ));
        assert_eq!(b.available(), 1);
    }

    #[test]
    fn spans_are_checked_and_copies_land() {
        let r = region();
        let bufs = Buffers::new(r.clone());
        assert!(matches!(
            bufs.span(73, 0, 1),
            Err(Error::BufferIndex { id: 73, .. })
        ));
        assert!(matches!(
            bufs.span(0, 100, 29),
            Err(Error::BufferRange {
                off: 100,
                len: 29,
                ..
            })
        ));
        assert!(matches!(
            bufs.span(0, u32::MAX, 2),
            Err(Error::BufferRange { .. })
        ));
        let s = bufs.span(72, 120, 8).unwrap();
        assert_eq!(bufs.write(s, b"0123456789"), 8);
        let mut out = [0u8; 16];
        assert_eq!(bufs.read(bufs.span(72, 118, 10).unwrap(), &mut out), 10);
        assert_eq!(&out[..10], b"\0\x0001234567");
        assert_eq!(bufs.as_mut_ptr(s).addr() % 8, 0);
        let whole = bufs.whole(BufId(5)).unwrap();
        assert_eq!((whole.off(), whole.len()), (0, 128));
    }

    #[test]
    #[should_panic(expected = "does not belong")]
    fn span_of_another_region_is_refused() {
        let big = Layout {
            buf_size: 4096,
            ..layout()
        };
        let other = Buffers::new(Arc::new(Region::create("big", big).unwrap()));
        let s = other.span(0, 0, 4096).unwrap();
        Buffers::new(region()).write(s, &[0; 8]);
    }
}
