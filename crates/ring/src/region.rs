//! The shared region: a sealed memfd mapped `MAP_SHARED` by both sides.
//!
//! The creator sizes the memfd, writes the header and seals it against shrinking and
//! growing (so the mapping can never be cut short under a reader: no SIGBUS). The
//! opener trusts nothing: it checks the seals and the file size, copies the header out
//! and validates it ([`Header::parse`]), and from then on uses only its local copy of the
//! layout. Later changes to the header by the peer have no effect.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::Error;
use crate::layout::{CLOSED_OFF, Geometry, HEADER_LEN, Header, LINE, Layout, Side};
use crate::ring::RingCtl;
use crate::sync::{AtomicU32, Ordering};
use crate::sys::{self, Mmap};
use crate::wait;

/// A mapped region. `Send + Sync`. Unmaps and closes on drop.
#[derive(Debug)]
pub struct Region {
    map: Mmap,
    fd: OwnedFd,
    layout: Layout,
    geo: Geometry,
    /// (device, inode) of the memfd: identifies the region for side claims.
    key: (u64, u64),
    /// Doorbell eventfd of each ring's producer (indexed by producing side), so that
    /// `close` can ring it too.
    doorbells: [Mutex<Option<Arc<OwnedFd>>>; 2],
}

impl Region {
    /// `memfd_create(CLOEXEC|ALLOW_SEALING)`, size, header, seal `SHRINK|GROW|SEAL`,
    /// `mmap` shared.
    pub fn create(name: &str, layout: Layout) -> Result<Region, Error> {
        layout.validate()?;
        let fd = sys::memfd_create(name).map_err(Error::Memfd)?;
        let len = layout.region_len();
        sys::ftruncate(fd.as_fd(), len).map_err(Error::Resize)?;
        let map = Mmap::shared(fd.as_fd(), len).map_err(Error::Mmap)?;
        let header = Header::for_layout(&layout);
        // SAFETY: the mapping is at least HEADER_LEN bytes, page aligned, and nobody
        // else has the fd yet, so nothing accesses the header concurrently.
        unsafe { map.ptr().cast::<Header>().as_ptr().write_volatile(header) };
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        sys::add_seals(fd.as_fd(), seals).map_err(Error::Seal)?;
        let (_, dev, ino) = sys::fstat(fd.as_fd()).map_err(Error::Stat)?;
        Ok(Region::assemble(map, fd, layout, (dev, ino)))
    }

    /// Validate seals (`SHRINK + GROW` present), file size and header (magic, version,
    /// layout, derived offsets and length) before use. Never trusts the header beyond
    /// what it checks; the layout is copied out once.
    pub fn open(fd: OwnedFd) -> Result<Region, Error> {
        let have = sys::seals(fd.as_fd()).map_err(Error::Seal)?;
        let need = (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) as u32;
        if have & need != need {
            return Err(Error::MissingSeals { have });
        }
        let (size, dev, ino) = sys::fstat(fd.as_fd()).map_err(Error::Stat)?;
        if size < HEADER_LEN as u64 || size > crate::layout::MAX_REGION_LEN {
            return Err(Error::SizeMismatch {
                file: size,
                expected: HEADER_LEN as u64,
            });
        }
        let map = Mmap::shared(fd.as_fd(), size as usize).map_err(Error::Mmap)?;
        // SAFETY: the mapping holds at least HEADER_LEN bytes (checked above, and the
        // seals keep it that long) at a page-aligned address; Header is Pod, so any
        // bytes the peer left there form a valid value. Volatile: the peer may write
        // concurrently; we act only on this one copy.
        let header = unsafe { map.ptr().cast::<Header>().as_ptr().read_volatile() };
        let layout = header.parse()?;
        let expected = layout.region_len() as u64;
        if size != expected {
            return Err(Error::SizeMismatch {
                file: size,
                expected,
            });
        }
        Ok(Region::assemble(map, fd, layout, (dev, ino)))
    }

    fn assemble(map: Mmap, fd: OwnedFd, layout: Layout, key: (u64, u64)) -> Region {
        let geo = layout.geometry();
        debug_assert_eq!(map.len(), geo.total_len);
        Region {
            map,
            fd,
            layout,
            geo,
            key,
            doorbells: Default::default(),
        }
    }

    /// The validated layout (a local copy).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The memfd, to pass to the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Mark `side` closed in shared memory and wake all four waiters (both rings'
    /// producers and consumers, futex and doorbell) so they notice.
    pub fn close(&self, side: Side) {
        self.closed_flag(side).store(1, Ordering::Release);
        for producer in [Side::A, Side::B] {
            let ctl = self.ring_ctl(producer);
            // Unconditional wakes: closing is rare, and bumping `seq` (Release, after
            // the flag store) makes a waiter about to block return and see the flag.
            wait::wake(&ctl.cons_wait.0, &wait::Futex);
            wait::wake(&ctl.prod_wait.0, &wait::Futex);
            let bell = self.doorbells[producer.index()].lock();
            if let Some(fd) = bell.unwrap_or_else(PoisonError::into_inner).as_ref() {
                let _ = sys::eventfd_ring(fd.as_fd());
            }
        }
    }

    /// Whether `side` has been marked closed (by either side: the flag is in shared
    /// memory, so the answer is only as trustworthy as the peer).
    pub fn is_closed(&self, side: Side) -> bool {
        self.closed_flag(side).load(Ordering::Acquire) != 0
    }

    /// Whether either side is closed.
    pub(crate) fn any_closed(&self) -> bool {
        self.is_closed(Side::A) || self.is_closed(Side::B)
    }

    /// Counts one sleep of `side` outside the channel (a shim asleep in the kernel on
    /// a socket of its own, which the peer's wake counters cannot see), in `side`'s own
    /// line next to its closed flag; for the peer's statistics only (a number it must
    /// not trust).
    pub fn count_outside_sleep(&self, side: Side) {
        self.outside_sleeps(side).fetch_add(1, Ordering::Relaxed);
    }

    /// `side`'s count of sleeps outside the channel ([`Region::count_outside_sleep`]).
    pub fn outside_sleep_count(&self, side: Side) -> u64 {
        self.outside_sleeps(side).load(Ordering::Relaxed)
    }

    fn outside_sleeps(&self, side: Side) -> &AtomicU64 {
        let off = CLOSED_OFF + side.index() * LINE + 8;
        // SAFETY: `off + 8 <= HEADER_LEN <= len`, 8-aligned (the mapping is page aligned,
        // LINE and CLOSED_OFF are multiples of 8); atomics only, as for the closed flag.
        unsafe { &*self.map.ptr().as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn closed_flag(&self, side: Side) -> &AtomicU32 {
        let off = CLOSED_OFF + side.index() * LINE;
        // SAFETY: `off + 4 <= HEADER_LEN <= len`, 4-aligned (the mapping is page
        // aligned); the memory lives as long as `self` and is only accessed atomically.
        unsafe { &*self.map.ptr().as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// The control block of the ring produced by `producer`.
    pub(crate) fn ring_ctl(&self, producer: Side) -> &RingCtl {
        let off = self.geo.ring_off[producer.index()];
        // SAFETY: the geometry of a validated layout places the control block inside
        // the mapping at a 128-aligned offset; RingCtl consists of atomics only (any bit
        // pattern is valid, and concurrent access by the peer is what they are for), and
        // the memory lives as long as `self`.
        unsafe { &*self.map.ptr().as_ptr().add(off).cast::<RingCtl>() }
    }

    /// First slot of the ring produced by `producer`; `ring_slots * record_size` bytes
    /// from here lie inside the mapping.
    pub(crate) fn slots(&self, producer: Side) -> NonNull<u8> {
        // SAFETY: the offset is inside the mapping (validated geometry), so the result
        // is in bounds and non-null.
        unsafe { self.map.ptr().add(self.geo.slots_off(producer)) }
    }

    /// First buffer; `(bufs_a + bufs_b) * buf_stride` bytes from here lie inside the
    /// mapping.
    pub(crate) fn bufs_base(&self) -> NonNull<u8> {
        // SAFETY: as in `slots`.
        unsafe { self.map.ptr().add(self.geo.bufs_off) }
    }

    pub(crate) fn buf_stride(&self) -> usize {
        self.geo.buf_stride
    }

    pub(crate) fn set_doorbell(&self, producer: Side, fd: Option<Arc<OwnedFd>>) {
        let mut bell = self.doorbells[producer.index()]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *bell = fd;
    }

    /// Claim `side` for an endpoint of this process; released when the claim drops.
    pub(crate) fn claim(&self, side: Side) -> Result<Claim, Error> {
        let key = (self.key.0, self.key.1, side);
        let mut claims = CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
        if !claims.get_or_insert_with(HashSet::new).insert(key) {
            return Err(Error::SideClaimed(side));
        }
        Ok(Claim { key })
    }

    /// Raw access for tests that play a misbehaving peer.
    #[doc(hidden)]
    pub fn raw_for_tests(&self) -> RawRegion<'_> {
        RawRegion { region: self }
    }
}

/// Sides claimed in this process, per memfd (device, inode).
static CLAIMS: Mutex<Option<HashSet<(u64, u64, Side)>>> = Mutex::new(None);

/// One side of one region held by an endpoint of this process.
#[derive(Debug)]
pub(crate) struct Claim {
    key: (u64, u64, Side),
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claims = CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(set) = claims.as_mut() {
            set.remove(&self.key);
        }
    }
}

/// What a malicious peer can do: write any u32 anywhere in the region. Test-only
/// (hidden from the docs); the stores are atomic, so they race with the crate's own
/// accesses only the way a peer in another process would.
#[doc(hidden)]
#[derive(Debug)]
pub struct RawRegion<'a> {
    region: &'a Region,
}

impl RawRegion<'_> {
    /// Store `v` at byte offset `off` (4-aligned, in bounds; panics otherwise).
    pub fn write_u32(&self, off: usize, v: u32) {
        self.word(off).store(v, Ordering::SeqCst);
    }

    /// Load the u32 at byte offset `off`.
    pub fn read_u32(&self, off: usize) -> u32 {
        self.word(off).load(Ordering::SeqCst)
    }

    /// Offset of the producer index (tail) of the ring produced by `producer`.
    pub fn tail_off(&self, producer: Side) -> usize {
        self.region.geo.ring_off[producer.index()]
    }

    /// Offset of the consumer index (head) of the ring produced by `producer`.
    pub fn head_off(&self, producer: Side) -> usize {
        self.region.geo.ring_off[producer.index()] + LINE
    }

    /// Offset of the consumer's "sleeping" flag in the ring produced by `producer`.
    pub fn cons_sleeping_off(&self, producer: Side) -> usize {
        self.region.geo.ring_off[producer.index()] + 2 * LINE + 4
    }

    /// Offset of the producer's "sleeping" flag in the ring produced by `producer`.
    pub fn prod_sleeping_off(&self, producer: Side) -> usize {
        self.region.geo.ring_off[producer.index()] + 3 * LINE + 4
    }

    /// Offset of the first slot of the ring produced by `producer`.
    pub fn slots_off(&self, producer: Side) -> usize {
        self.region.geo.slots_off(producer)
    }

    /// Length of the region in bytes.
    pub fn region_len(&self) -> usize {
        self.region.map.len()
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(
            off & 3 == 0 && off + 4 <= self.region.map.len(),
            "offset {off}"
        );
        // SAFETY: in bounds and 4-aligned (asserted; the mapping is page aligned); the
        // region is borrowed for the reference's lifetime; shared memory that any party
        // may write concurrently is exactly what an atomic is for.
        unsafe { &*self.region.map.ptr().as_ptr().add(off).cast::<AtomicU32>() }
    }
}
