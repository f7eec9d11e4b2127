//! Region layout: the parameters both sides agree on, the byte offsets derived from them,
//! and the header that records both in shared memory.
//!
//! Everything here is pure arithmetic on local values. The offsets are a function of
//! [`Layout`] alone, so a side that opens a region recomputes them from the header's
//! parameters and only then compares them with what the header claims
//! ([`Error::LayoutMismatch`]).
//!
//! ```text
//! 0        header (magic, version, parameters, derived offsets)      HEADER_LEN
//! 128      closed flag of side A (u32, own 128-byte line; at +8 a u64 count of its
//!          sleeps outside the channel, for statistics)
//! 256      closed flag of side B (u32, own 128-byte line; the same)
//! 512      ring A->B: control block (RING_CTL_LEN) + ring_slots * record_size
//! ...      ring B->A: same shape, 128-byte aligned
//! ...      buffers: bufs_a + bufs_b buffers of buf_stride bytes, 64- or 4096-aligned
//! ...      padding up to a multiple of PAGE
//! ```

use crate::error::Error;

/// Magic number at offset 0 of every region ("FERRYRNG", little-endian).
pub const MAGIC: u64 = u64::from_le_bytes(*b"FERRYRNG");
/// Version of the shared-memory layout; bumped on any incompatible change.
pub const VERSION: u32 = 1;

/// Separation between words written by different parties (two 64-byte lines, so that
/// the adjacent-line prefetcher does not couple them either).
pub(crate) const LINE: usize = 128;
/// Bytes reserved at the start of the region for the header and the closed flags.
pub(crate) const HEADER_LEN: usize = 4 * LINE;
/// Offset of side A's closed flag; side B's follows one `LINE` later.
pub(crate) const CLOSED_OFF: usize = LINE;
/// Bytes of a ring's control block (tail, head, two wait cells, one `LINE` each).
pub(crate) const RING_CTL_LEN: usize = 4 * LINE;
/// Region lengths are rounded up to this (fixed, not `sysconf`, so both sides agree).
pub(crate) const PAGE: usize = 4096;
/// Largest region either side agrees to map (1 TiB of address space; memfd pages are
/// only allocated when touched).
pub(crate) const MAX_REGION_LEN: u64 = 1 << 40;

/// The parameters of a channel. Both sides must agree on them; the creator writes them
/// into the header and the opener validates them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Slots per direction; a power of two in 2..=65536.
    pub ring_slots: u32,
    /// Bytes per record (both directions); a multiple of 8 in 8..=4096.
    pub record_size: u32,
    /// Data buffers allocated by side A (the sandbox side).
    pub bufs_a: u32,
    /// Data buffers allocated by side B (the server side).
    pub bufs_b: u32,
    /// Bytes per buffer; a multiple of 64 in 64..=1 MiB.
    pub buf_size: u32,
}

/// Which end of the channel. Ring A->B carries requests, ring B->A completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The sandbox side (the shim or a native client).
    A,
    /// The server side.
    B,
}

impl Side {
    /// The other side.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
}

impl Layout {
    /// Check every parameter's range and that the whole region fits in
    /// `MAX_REGION_LEN` (1 TiB); returns [`Error::Layout`] naming the first violation.
    pub fn validate(&self) -> Result<(), Error> {
        if !self.ring_slots.is_power_of_two() || !(2..=65536).contains(&self.ring_slots) {
            return Err(Error::Layout(
                "ring_slots must be a power of two in 2..=65536",
            ));
        }
        if self.record_size & 7 != 0 || !(8..=4096).contains(&self.record_size) {
            return Err(Error::Layout(
                "record_size must be a multiple of 8 in 8..=4096",
            ));
        }
        if self.buf_size & 63 != 0 || !(64..=1 << 20).contains(&self.buf_size) {
            return Err(Error::Layout(
                "buf_size must be a multiple of 64 in 64..=1 MiB",
            ));
        }
        if self.bufs_a.checked_add(self.bufs_b).is_none() {
            return Err(Error::Layout("bufs_a + bufs_b must fit in a u32"));
        }
        match self.geometry_checked() {
            Some(g) if g.total_len as u64 <= MAX_REGION_LEN => Ok(()),
            _ => Err(Error::Layout("region would exceed 1 TiB")),
        }
    }

    /// Bytes of the region (a multiple of 4096). Meaningful only for a layout that
    /// passes [`Layout::validate`]; returns 0 for one whose size overflows.
    pub fn region_len(&self) -> usize {
        self.geometry_checked().map_or(0, |g| g.total_len)
    }

    /// Total number of buffers (both sides).
    pub fn total_bufs(&self) -> u32 {
        self.bufs_a.saturating_add(self.bufs_b)
    }

    /// Offsets for a validated layout.
    pub(crate) fn geometry(&self) -> Geometry {
        // `validate` ran `geometry_checked` successfully on every Layout that reaches
        // here (Region::create/open validate first), so this cannot fail.
        self.geometry_checked()
            .expect("geometry of a validated layout")
    }

    fn geometry_checked(&self) -> Option<Geometry> {
        let slots_len = (self.ring_slots as usize).checked_mul(self.record_size as usize)?;
        let ring_len = round_up(RING_CTL_LEN.checked_add(slots_len)?, LINE)?;
        let ring_ab = HEADER_LEN;
        let ring_ba = ring_ab.checked_add(ring_len)?;
        let (align, buf_stride) = if self.buf_size >= 4096 {
            (PAGE, round_up(self.buf_size as usize, PAGE)?)
        } else {
            (64, self.buf_size as usize)
        };
        let bufs_off = round_up(ring_ba.checked_add(ring_len)?, align)?;
        let total_bufs = (self.bufs_a as usize).checked_add(self.bufs_b as usize)?;
        let bufs_len = total_bufs.checked_mul(buf_stride)?;
        let total_len = round_up(bufs_off.checked_add(bufs_len)?, PAGE)?;
        Some(Geometry {
            ring_off: [ring_ab, ring_ba],
            bufs_off,
            buf_stride,
            total_len,
        })
    }
}

/// Byte offsets of everything in a region, derived from a [`Layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Offset of each ring's control block, indexed by the producing side
    /// (`[A->B, B->A]`); the ring's slots start `RING_CTL_LEN` later.
    pub(crate) ring_off: [usize; 2],
    pub(crate) bufs_off: usize,
    pub(crate) buf_stride: usize,
    pub(crate) total_len: usize,
}

impl Geometry {
    /// Offset of the first slot of the ring produced by `producer`.
    pub(crate) fn slots_off(&self, producer: Side) -> usize {
        self.ring_off[producer.index()] + RING_CTL_LEN
    }
}

/// The header at offset 0 of a region, exactly as stored (little-endian hosts only, like
/// the rest of the channel: both sides run on the same machine).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Header {
    pub(crate) magic: u64,
    pub(crate) version: u32,
    pub(crate) header_len: u32,
    pub(crate) ring_slots: u32,
    pub(crate) record_size: u32,
    pub(crate) bufs_a: u32,
    pub(crate) bufs_b: u32,
    pub(crate) buf_size: u32,
    pub(crate) reserved: u32,
    pub(crate) ring_ab_off: u64,
    pub(crate) ring_ba_off: u64,
    pub(crate) bufs_off: u64,
    pub(crate) buf_stride: u64,
    pub(crate) total_len: u64,
}

const _: () = assert!(core::mem::size_of::<Header>() <= CLOSED_OFF);

impl Header {
    /// The header a creator writes for `layout` (which must be valid).
    pub(crate) fn for_layout(layout: &Layout) -> Header {
        let g = layout.geometry();
        Header {
            magic: MAGIC,
            version: VERSION,
            header_len: HEADER_LEN as u32,
            ring_slots: layout.ring_slots,
            record_size: layout.record_size,
            bufs_a: layout.bufs_a,
            bufs_b: layout.bufs_b,
            buf_size: layout.buf_size,
            reserved: 0,
            ring_ab_off: g.ring_off[0] as u64,
            ring_ba_off: g.ring_off[1] as u64,
            bufs_off: g.bufs_off as u64,
            buf_stride: g.buf_stride as u64,
            total_len: g.total_len as u64,
        }
    }

    /// Parse a header copied out of shared memory: magic, version, parameter ranges,
    /// then every derived field against the value recomputed from the parameters.
    pub(crate) fn parse(&self) -> Result<Layout, Error> {
        if self.magic != MAGIC {
            return Err(Error::BadMagic { found: self.magic });
        }
        if self.version != VERSION {
            return Err(Error::BadVersion {
                found: self.version,
                expected: VERSION,
            });
        }
        let layout = Layout {
            ring_slots: self.ring_slots,
            record_size: self.record_size,
            bufs_a: self.bufs_a,
            bufs_b: self.bufs_b,
            buf_size: self.buf_size,
        };
        layout.validate()?;
        let want = Header::for_layout(&layout);
        let fields = [
            ("header_len", self.header_len as u64, want.header_len as u64),
            ("reserved", self.reserved as u64, 0),
            ("ring_ab_off", self.ring_ab_off, want.ring_ab_off),
            ("ring_ba_off", self.ring_ba_off, want.ring_ba_off),
            ("bufs_off", self.bufs_off, want.bufs_off),
            ("buf_stride", self.buf_stride, want.buf_stride),
            ("total_len", self.total_len, want.total_len),
        ];
        for (field, found, expected) in fields {
            if found != expected {
                return Err(Error::LayoutMismatch {
                    field,
                    found,
                    expected,
                });
            }
        }
        Ok(layout)
    }
}

fn round_up(x: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// Both ends copy `size_of::<T>()` bytes per slot of stride `record_size`: they must agree.
pub(crate) fn check_record_size<T>(layout: &Layout) -> Result<(), Error> {
    if size_of::<T>() != layout.record_size as usize {
        return Err(Error::RecordSize {
            expected: layout.record_size,
            tx: size_of::<T>(),
            rx: size_of::<T>(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Layout {
        Layout {
            ring_slots: 8,
            record_size: 64,
            bufs_a: 3,
            bufs_b: 2,
            buf_size: 1024,
        }
    }

    #[test]
    fn geometry_is_aligned_and_disjoint() {
        for buf_size in [64, 1024, 4096, 4160, 65536] {
            let l = Layout {
                buf_size,
                ..small()
            };
            l.validate().unwrap();
            let g = l.geometry();
            assert_eq!(g.ring_off[0], HEADER_LEN);
            assert_eq!(g.ring_off[1] % LINE, 0);
            assert!(g.ring_off[1] >= g.slots_off(Side::A) + 8 * 64);
            assert!(g.bufs_off >= g.slots_off(Side::B) + 8 * 64);
            let align = if buf_size >= 4096 { 4096 } else { 64 };
            assert_eq!(g.bufs_off % align, 0);
            assert_eq!(g.buf_stride % align, 0);
            assert!(g.buf_stride >= buf_size as usize);
            assert_eq!(g.total_len % PAGE, 0);
            assert!(g.total_len >= g.bufs_off + 5 * g.buf_stride);
            assert_eq!(l.region_len(), g.total_len);
        }
    }

    #[test]
    fn validate_rejects_each_bad_parameter() {
        let bad = [
            Layout {
                ring_slots: 3,
                ..small()
            },
            Layout {
                ring_slots: 1,
                ..small()
            },
            Layout {
                ring_slots: 1 << 17,
                ..small()
            },
            Layout {
                record_size: 12,
                ..small()
            },
            Layout {
                record_size: 0,
                ..small()
            },
            Layout {
                record_size: 8192,
                ..small()
            },
            Layout {
                buf_size: 100,
                ..small()
            },
            Layout {
                buf_size: 2 << 20,
                ..small()
            },
            Layout {
                bufs_a: u32::MAX,
                bufs_b: 1,
                ..small()
            },
            Layout {
                bufs_a: 1 << 21,
                buf_size: 1 << 20,
                ..small()
            },
        ];
        for l in bad {
            assert!(matches!(l.validate(), Err(Error::Layout(_))), "{l:?}");
        }
        small().validate().unwrap();
        Layout {
            bufs_a: 0,
            bufs_b: 0,
            ..small()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn header_round_trips_and_names_the_bad_field() {
        let h = Header::for_layout(&small());
        assert_eq!(h.parse().unwrap(), small());
        let bad = Header {
            bufs_off: h.bufs_off + 64,
            ..h
        };
        assert!(matches!(
            bad.parse(),
            Err(Error::LayoutMismatch {
                field: "bufs_off",
                ..
            })
        ));
        let bad = Header { magic: 7, ..h };
        assert!(matches!(bad.parse(), Err(Error::BadMagic { found: 7 })));
        let bad = Header { version: 9, ..h };
        assert!(matches!(
            bad.parse(),
            Err(Error::BadVersion { found: 9, .. })
        ));
        let bad = Header { ring_slots: 5, ..h };
        assert!(matches!(bad.parse(), Err(Error::Layout(_))));
    }
}
