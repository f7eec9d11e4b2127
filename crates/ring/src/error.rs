//! The crate's error type: one variant per failure, each naming what the peer (or the
//! system) did wrong. Values that came from shared memory are reported as found.

use std::io;

use crate::layout::Side;

/// Everything that can go wrong in this crate.
///
/// Variants from `Layout` to `LayoutMismatch` come from creating or opening a region;
/// `CorruptIndex` and the `Buffer*` variants from peer data at run time. A channel that
/// returned one of the peer-data errors should be closed by its user: the peer is
/// misbehaving (or has been taken over).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A layout parameter is out of range.
    #[error("invalid layout: {0}")]
    Layout(&'static str),
    /// `memfd_create` failed (or the name contained a NUL byte).
    #[error("memfd_create failed: {0}")]
    Memfd(io::Error),
    /// `ftruncate` of a new region failed.
    #[error("sizing the region (ftruncate) failed: {0}")]
    Resize(io::Error),
    /// Reading or adding memfd seals failed (the fd is not a sealable memfd?).
    #[error("memfd seals (fcntl) failed: {0}")]
    Seal(io::Error),
    /// `mmap` of the region failed.
    #[error("mmap of the region failed: {0}")]
    Mmap(io::Error),
    /// `fstat` of the region fd failed.
    #[error("fstat of the region failed: {0}")]
    Stat(io::Error),
    /// The region fd lacks `F_SEAL_SHRINK | F_SEAL_GROW`: the peer could truncate it
    /// under us (SIGBUS) or grow it.
    #[error("region fd lacks seals SHRINK|GROW (has {have:#x})")]
    MissingSeals {
        /// The seals that are present (`F_GET_SEALS`).
        have: u32,
    },
    /// The file size is not what the header's layout requires.
    #[error("region file is {file} bytes, its layout needs {expected}")]
    SizeMismatch {
        /// Size from `fstat`.
        file: u64,
        /// Size implied by the header (or the minimum header size).
        expected: u64,
    },
    /// The region does not start with the ferry magic number.
    #[error("bad magic {found:#018x} (not a ferry region)")]
    BadMagic {
        /// The first 8 bytes of the region.
        found: u64,
    },
    /// The region has a layout version this build does not speak.
    #[error("region layout version {found}, this build speaks {expected}")]
    BadVersion {
        /// Version in the header.
        found: u32,
        /// [`crate::VERSION`].
        expected: u32,
    },
    /// A derived header field disagrees with the value computed from the parameters.
    #[error("header field {field} is {found}, the layout implies {expected}")]
    LayoutMismatch {
        /// Name of the header field.
        field: &'static str,
        /// Value in the header.
        found: u64,
        /// Value computed from the layout.
        expected: u64,
    },
    /// A record type's size differs from the region's `record_size`.
    #[error("record types are {tx} (tx) and {rx} (rx) bytes, the region's are {expected}")]
    RecordSize {
        /// `layout.record_size`.
        expected: u32,
        /// `size_of::<Tx>()`.
        tx: usize,
        /// `size_of::<Rx>()`.
        rx: usize,
    },
    /// This process already has an endpoint for that side of that region.
    #[error("side {0:?} of this region already has an endpoint in this process")]
    SideClaimed(Side),
    /// The peer wrote a ring index outside the range the protocol allows (ahead of what
    /// it may have, or moving backwards). The valid range is the circular interval
    /// `lo..=hi` of free-running u32 indices.
    #[error("peer wrote a corrupt {which} index {found} (valid {lo}..={hi})")]
    CorruptIndex {
        /// `"producer tail"` or `"consumer head"`.
        which: &'static str,
        /// The value read from shared memory.
        found: u32,
        /// Lowest valid value (the last one seen).
        lo: u32,
        /// Highest valid value.
        hi: u32,
    },
    /// A buffer id is not below the number of buffers in the region.
    #[error("buffer id {id} out of range (the region has {total})")]
    BufferIndex {
        /// The id.
        id: u32,
        /// `bufs_a + bufs_b`.
        total: u32,
    },
    /// A span does not fit inside its buffer.
    #[error("span {off}+{len} of buffer {id} exceeds the buffer size {buf_size}")]
    BufferRange {
        /// The buffer id.
        id: u32,
        /// Offset in the buffer.
        off: u32,
        /// Length.
        len: u32,
        /// `layout.buf_size`.
        buf_size: u32,
    },
    /// A buffer returned to a pool belongs to the other side.
    #[error("buffer {id} belongs to side {owner:?}, not to this pool")]
    BufferNotOurs {
        /// The id.
        id: u32,
        /// The side that owns it.
        owner: Side,
    },
    /// A buffer returned to a pool was not lent out.
    #[error("buffer {id} freed while not lent (double free)")]
    DoubleFree {
        /// The id.
        id: u32,
    },
    /// `FUTEX_WAIT` failed for a reason other than timeout, interruption or a changed
    /// word.
    #[error("futex wait failed: {0}")]
    Futex(io::Error),
}
