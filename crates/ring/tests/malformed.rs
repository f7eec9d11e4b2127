//! A misbehaving peer: one test per kind of malformed data it can put in shared memory
//! (or hand over instead of a proper region), each asserting the exact typed error. The
//! peer is simulated by writing raw words into the mapping (`Region::raw_for_tests`).

#![cfg(not(loom))]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use ferry_ring::{BufId, Endpoint, Error, Layout, Region, Side, VERSION};

type Rec = [u64; 2];
type Ep = Endpoint<Rec, Rec>;

const LAYOUT: Layout = Layout {
    ring_slots: 4,
    record_size: 16,
    bufs_a: 3,
    bufs_b: 5,
    buf_size: 256,
};

// Header field offsets (see layout.rs).
const VERSION_OFF: usize = 8;
const RING_SLOTS_OFF: usize = 16;
const BUFS_OFF_OFF: usize = 56;

fn region() -> Arc<Region> {
    Arc::new(Region::create("ferry-malformed", LAYOUT).unwrap())
}

/// A second view of the same memfd, as the peer process would open it.
fn reopen(r: &Region) -> Result<Region, Error> {
    Region::open(r.fd().try_clone_to_owned().unwrap())
}

fn memfd(flags: libc::c_uint, len: usize) -> OwnedFd {
    // SAFETY: the name is a NUL-terminated literal; the result is checked.
    let fd = unsafe { libc::memfd_create(c"ferry-test".as_ptr(), flags) };
    assert!(fd >= 0);
    // SAFETY: memfd_create returned a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscall on a descriptor we own.
    let r = unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) };
    assert_eq!(r, 0);
    fd
}

fn seal(fd: &OwnedFd, seals: libc::c_int) {
    // SAFETY: plain syscall on a descriptor we own.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    assert_eq!(r, 0);
}

#[test]
fn corrupt_producer_index_too_far_ahead() {
    let r = region();
    let mut b = Ep::new(r.clone(), Side::B).unwrap();
    let raw = r.raw_for_tests();
    raw.write_u32(raw.tail_off(Side::A), 5); // capacity is 4
    let e = b.rx.available().unwrap_err();
    assert!(
        matches!(
            e,
            Error::CorruptIndex {
                which: "producer tail",
                found: 5,
                lo: 0,
                hi: 4
            }
        ),
        "{e}"
    );
    assert!(matches!(
        b.rx.pop(),
        Err(Error::CorruptIndex { found: 5, .. })
    ));
    raw.write_u32(raw.tail_off(Side::A), u32::MAX);
    assert!(matches!(
        b.rx.pop(),
        Err(Error::CorruptIndex {
            found: u32::MAX,
            ..
        })
    ));
}

#[test]
fn corrupt_producer_index_backwards() {
    let r = region();
    let mut b = Ep::new(r.clone(), Side::B).unwrap();
    let raw = r.raw_for_tests();
    raw.write_u32(raw.tail_off(Side::A), 3);
    assert_eq!(b.rx.available().unwrap(), 3);
    raw.write_u32(raw.tail_off(Side::A), 1);
    let e = b.rx.available().unwrap_err();
    assert!(
        matches!(
            e,
            Error::CorruptIndex {
                which: "producer tail",
                found: 1,
                lo: 3,
                hi: 4
            }
        ),
        "{e}"
    );
}

#[test]
fn corrupt_consumer_index_ahead_of_tail() {
    let r = region();
    let mut a = Ep::new(r.clone(), Side::A).unwrap();
    assert_eq!(a.tx.push_slice(&[[1, 2]; 4]).unwrap(), 4);
    a.tx.commit();
    let raw = r.raw_for_tests();
    raw.write_u32(raw.head_off(Side::A), 5); // only 4 were published
    let e = a.tx.push(&[0; 2]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CorruptIndex {
                which: "consumer head",
                found: 5,
                lo: 0,
                hi: 4
            }
        ),
        "{e}"
    );
}

#[test]
fn corrupt_consumer_index_backwards() {
    let r = region();
    let mut a = Ep::new(r.clone(), Side::A).unwrap();
    a.tx.push_slice(&[[1, 2]; 4]).unwrap();
    a.tx.commit();
    let raw = r.raw_for_tests();
    raw.write_u32(raw.head_off(Side::A), 2);
    assert_eq!(a.tx.free().unwrap(), 2);
    raw.write_u32(raw.head_off(Side::A), 1);
    let e = a.tx.free().unwrap_err();
    assert!(
        matches!(
            e,
            Error::CorruptIndex {
                which: "consumer head",
                found: 1,
                lo: 2,
                hi: 4
            }
        ),
        "{e}"
    );
}

#[test]
fn bad_magic() {
    let r = region();
    r.raw_for_tests().write_u32(0, 0x1234_5678);
    let e = reopen(&r).unwrap_err();
    assert!(
        matches!(e, Error::BadMagic { found } if found as u32 == 0x1234_5678),
        "{e}"
    );
}

#[test]
fn bad_version() {
    let r = region();
    r.raw_for_tests().write_u32(VERSION_OFF, 99);
    let e = reopen(&r).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BadVersion {
                found: 99,
                expected: VERSION
            }
        ),
        "{e}"
    );
}

#[test]
fn header_layout_out_of_range() {
    let r = region();
    r.raw_for_tests().write_u32(RING_SLOTS_OFF, 3);
    let e = reopen(&r).unwrap_err();
    assert!(matches!(e, Error::Layout(_)), "{e}");
}

#[test]
fn header_offset_mismatch() {
    let r = region();
    let raw = r.raw_for_tests();
    let bufs_off = raw.read_u32(BUFS_OFF_OFF);
    raw.write_u32(BUFS_OFF_OFF, bufs_off - 64);
    let e = reopen(&r).unwrap_err();
    assert!(
        matches!(e, Error::LayoutMismatch { field: "bufs_off", found, expected } if found + 64 == expected),
        "{e}"
    );
}

#[test]
fn file_size_mismatch() {
    // A well-formed header in a file one page larger than its layout says.
    let len = LAYOUT.region_len();
    let fd = memfd(libc::MFD_ALLOW_SEALING, len + 4096);
    let fake = Region::create("donor", LAYOUT).unwrap();
    // Copy the genuine header words into the oversized memfd through a mapping.
    // SAFETY: fresh shared mapping of a descriptor we own; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    for off in (0..128).step_by(4) {
        let w = fake.raw_for_tests().read_u32(off);
        // SAFETY: `off + 4 <= 4096`, inside the 4-aligned mapping we just made.
        unsafe { p.cast::<u8>().add(off).cast::<u32>().write(w) };
    }
    // SAFETY: unmapping the mapping made above, no longer used.
    unsafe { libc::munmap(p, 4096) };
    seal(&fd, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
    let e = Region::open(fd).unwrap_err();
    assert!(
        matches!(e, Error::SizeMismatch { file, expected } if file == len as u64 + 4096 && expected == len as u64),
        "{e}"
    );
}

#[test]
fn file_too_small_for_a_header() {
    let fd = memfd(libc::MFD_ALLOW_SEALING, 16);
    seal(&fd, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
    let e = Region::open(fd).unwrap_err();
    assert!(matches!(e, Error::SizeMismatch { file: 16, .. }), "{e}");
}

#[test]
fn missing_seals() {
    // A memfd made without MFD_ALLOW_SEALING carries only F_SEAL_SEAL.
    let e = Region::open(memfd(0, LAYOUT.region_len())).unwrap_err();
    assert!(
        matches!(e, Error::MissingSeals { have } if have == libc::F_SEAL_SEAL as u32),
        "{e}"
    );
    // Sealable, but the peer "forgot" GROW: it could still grow it.
    let fd = memfd(libc::MFD_ALLOW_SEALING, LAYOUT.region_len());
    seal(&fd, libc::F_SEAL_SHRINK);
    let e = Region::open(fd).unwrap_err();
    assert!(
        matches!(e, Error::MissingSeals { have } if have == libc::F_SEAL_SHRINK as u32),
        "{e}"
    );
}

#[test]
fn not_a_memfd() {
    let (rd, _wr) = std::io::pipe().unwrap();
    let e = Region::open(OwnedFd::from(rd)).unwrap_err();
    assert!(matches!(e, Error::Seal(_)), "{e}");
}

#[test]
fn buffer_id_out_of_range() {
    let mut a = Ep::new(region(), Side::A).unwrap();
    let e = a.bufs.span(8, 0, 1).unwrap_err();
    assert!(matches!(e, Error::BufferIndex { id: 8, total: 8 }), "{e}");
    let e = a.pool.free(BufId(u32::MAX)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BufferIndex {
                id: u32::MAX,
                total: 8
            }
        ),
        "{e}"
    );
}

#[test]
fn buffer_range_past_the_end() {
    let a = Ep::new(region(), Side::A).unwrap();
    let e = a.bufs.span(7, 200, 57).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BufferRange {
                id: 7,
                off: 200,
                len: 57,
                buf_size: 256
            }
        ),
        "{e}"
    );
    let e = a.bufs.span(0, 8, u32::MAX).unwrap_err(); // off + len overflows u32
    assert!(matches!(e, Error::BufferRange { .. }), "{e}");
    a.bufs.span(7, 200, 56).unwrap();
}

#[test]
fn freeing_a_buffer_not_ours() {
    let r = region();
    let mut a = Ep::new(r.clone(), Side::A).unwrap();
    let mut b = Ep::new(r, Side::B).unwrap();
    let theirs = b.pool.alloc().unwrap();
    assert_eq!(theirs, BufId(3));
    let e = a.pool.free(theirs).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BufferNotOurs {
                id: 3,
                owner: Side::B
            }
        ),
        "{e}"
    );
    let e = b.pool.free(BufId(0)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BufferNotOurs {
                id: 0,
                owner: Side::A
            }
        ),
        "{e}"
    );
}

#[test]
fn double_free() {
    let mut a = Ep::new(region(), Side::A).unwrap();
    let id = a.pool.alloc().unwrap();
    a.pool.free(id).unwrap();
    let e = a.pool.free(id).unwrap_err();
    assert!(matches!(e, Error::DoubleFree { id: 0 }), "{e}");
    let e = a.pool.free(BufId(2)).unwrap_err(); // ours, never lent
    assert!(matches!(e, Error::DoubleFree { id: 2 }), "{e}");
    assert_eq!(a.pool.available(), 3);
}

#[test]
fn record_size_mismatch() {
    let e = Endpoint::<[u64; 2], [u64; 4]>::new(region(), Side::B).unwrap_err();
    assert!(
        matches!(
            e,
            Error::RecordSize {
                expected: 16,
                tx: 16,
                rx: 32
            }
        ),
        "{e}"
    );
}

#[test]
fn second_endpoint_for_the_same_side() {
    let r = region();
    let _a = Ep::new(r.clone(), Side::A).unwrap();
    let e = Ep::new(r.clone(), Side::A).unwrap_err();
    assert!(matches!(e, Error::SideClaimed(Side::A)), "{e}");
    let again = Arc::new(reopen(&r).unwrap());
    assert!(matches!(
        Ep::new(again, Side::A),
        Err(Error::SideClaimed(Side::A))
    ));
}

#[test]
fn header_rewritten_after_open_is_ignored() {
    let r = region();
    let mut a = Ep::new(r.clone(), Side::A).unwrap();
    let raw = r.raw_for_tests();
    raw.write_u32(RING_SLOTS_OFF, 65536);
    raw.write_u32(0, 0);
    assert_eq!(r.layout(), LAYOUT);
    assert_eq!(a.tx.push_slice(&[[0; 2]; 9]).unwrap(), 4);
}

#[test]
fn garbage_flags_are_only_hints() {
    let r = region();
    let mut a = Ep::new(r.clone(), Side::A).unwrap();
    let raw = r.raw_for_tests();
    raw.write_u32(raw.cons_sleeping_off(Side::A), 0xdead_beef);
    assert!(
        a.tx.notify(),
        "an odd value counts as asleep: one spare wake"
    );
    raw.write_u32(raw.cons_sleeping_off(Side::A), 0);
    assert!(!a.tx.notify());
    raw.write_u32(raw.prod_sleeping_off(Side::B), 7);
    raw.write_u32(raw.tail_off(Side::B), 1);
    assert_eq!(a.rx.pop().unwrap(), Some([0; 2]));
    a.rx.release(); // wakes the "sleeping" producer: a syscall, nothing else
    assert_eq!(a.rx.stats().wakes_sent, 1);
    assert_eq!(raw.read_u32(raw.head_off(Side::B)), 1);
    raw.write_u32(128 + 128, 0x8000_0000); // side B's closed flag
    assert!(r.is_closed(Side::B));
}

/// A peer scribbling random words over the control blocks and slots while this side
/// works: every call returns Ok or a typed error; nothing panics or reaches outside.
#[test]
fn random_scribbles_never_panic() {
    let r = region();
    let mut a = Ep::new(r.clone(), Side::A).unwrap();
    let raw = r.raw_for_tests();
    let end = raw.slots_off(Side::B) + 4 * 16;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let (mut oks, mut errs) = (0, 0);
    for i in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (raw.tail_off(Side::A) + x as usize % (end - raw.tail_off(Side::A))) & !3;
        // Mostly small values, so that some land inside the valid ranges.
        raw.write_u32(
            off,
            if x & 0x100 == 0 {
                (x >> 32) as u32 & 7
            } else {
                (x >> 32) as u32
            },
        );
        let res = match i % 5 {
            0 => a.tx.push(&[i, i]).map(drop),
            1 => a.tx.free().map(drop),
            2 => a.rx.pop().map(drop),
            3 => a.rx.available().map(drop),
            _ => {
                a.tx.commit();
                a.tx.notify();
                a.rx.release();
                Ok(())
            }
        };
        match res {
            Ok(()) => oks += 1,
            Err(Error::CorruptIndex { .. }) => errs += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(oks > 0 && errs > 0, "{oks} ok, {errs} errors");
}
