//! A cursor over the program's scatter/gather buffers (`iovec` arrays, or one buffer),
//! copying to and from raw memory (channel buffers).

use libc::iovec;

use crate::errno::{Errno, Res};

/// The kernel's `UIO_MAXIOV`.
const IOV_MAX: usize = 1024;
/// The kernel's `MAX_RW_COUNT`: one call moves at most this many bytes.
pub const MAX_RW: usize = 0x7fff_f000;

/// Position in an `iovec` array.
#[derive(Debug)]
pub struct IoCursor {
    iov: *const iovec,
    n: usize,
    idx: usize,
    off: usize,
    left: usize,
}

impl IoCursor {
    /// A cursor over `n` buffers at `iov`.
    ///
    /// # Safety
    /// `iov` must be null (`EFAULT` unless `n` is 0) or point at `n` readable `iovec`s
    /// (`n` above 1024 is refused first), and the array and the buffers it names must
    /// stay valid (readable for sends, writable for receives) and unchanged while the
    /// cursor is used.
    pub unsafe fn new(iov: *const iovec, n: usize) -> Res<IoCursor> {
        if n > IOV_MAX {
            return Err(Errno::EINVAL);
        }
        if n > 0 && iov.is_null() {
            return Err(Errno::EFAULT);
        }
        let mut total: usize = 0;
        for i in 0..n {
            // SAFETY: `iov` is non-null here (checked above) and readable for `n`
            // entries (# Safety); `i < n`. Only the length is read.
            let len = unsafe { (*iov.add(i)).iov_len };
            if len > isize::MAX as usize {
                return Err(Errno::EINVAL);
            }
            total = total
                .checked_add(len)
                .filter(|&t| t <= isize::MAX as usize)
                .ok_or(Errno::EINVAL)?;
        }
        Ok(IoCursor {
            iov,
            n,
            idx: 0,
            off: 0,
            left: total.min(MAX_RW),
        })
    }

    /// The `iovec` array while nothing has been moved yet (for a direct `recvmsg`).
    pub fn untouched(&self) -> Option<(*const iovec, usize)> {
        (self.idx == 0 && self.off == 0).then_some((self.iov, self.n))
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.left
    }

    /// Moves up to `n` bytes, calling `f(program_ptr, offset_in_transfer, len)` per piece.
    fn advance(&mut self, n: usize, mut f: impl FnMut(*mut u8, usize, usize)) -> usize {
        let mut done = 0;
        let want = n.min(self.left);
        while done < want && self.idx < self.n {
            // SAFETY: `idx < n` (loop condition), and the array stays readable for `n`
            // entries while the cursor is used (`new`'s contract). The entry is copied.
            let v = unsafe { *self.iov.add(self.idx) };
            let avail = v.iov_len - self.off;
            if avail == 0 {
                self.idx += 1;
                self.off = 0;
                continue;
            }
            let k = avail.min(want - done);
            // SAFETY: `off < iov_len` here (`avail > 0`), so the result stays inside the
            // buffer the entry names, which `new`'s contract keeps valid.
            let p = unsafe { v.iov_base.cast::<u8>().add(self.off) };
            f(p, done, k);
            done += k;
            self.off += k;
        }
        self.left -= done;
        done
    }

    /// Copies up to `n` bytes from `src` into the program's buffers; returns how many.
    ///
    /// # Safety
    /// `src` must be readable for `n` bytes and not overlap the program's buffers.
    pub unsafe fn write_from(&mut self, src: *const u8, n: usize) -> usize {
        self.advance(n, |dst, at, k| {
            // SAFETY: `at + k <= n` (`advance` hands out at most `n` bytes in all), so
            // the source range is inside `src`, readable for `n` (# Safety); `dst` is
            // writable for `k` bytes of the program's buffer (`new`'s contract); the
            // caller promises the two do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst, k) }
        })
    }

    /// Copies up to `n` bytes from the program's buffers into `dst`; returns how many.
    ///
    /// # Safety
    /// `dst` must be writable for `n` bytes and not overlap the program's buffers.
    pub unsafe fn read_into(&mut self, dst: *mut u8, n: usize) -> usize {
        self.advance(n, |src, at, k| {
            // SAFETY: as in `write_from`, directions swapped: `src` is `k` readable
            // bytes of the program's buffer, `dst + at` has `k` of the `n` writable
            // bytes (# Safety), and they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.add(at), k) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(b: &mut [u8]) -> iovec {
        iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        }
    }

    #[test]
    fn scatter_across_buffers() {
        let (mut a, mut b, mut c) = ([0u8; 3], [0u8; 0], [0u8; 5]);
        let v = [iov(&mut a), iov(&mut b), iov(&mut c)];
        // SAFETY: `v` holds 3 iovecs over live local arrays of their stated lengths,
        // all outliving the cursor.
        let mut cur = unsafe { IoCursor::new(v.as_ptr(), 3) }.unwrap();
        assert_eq!(cur.remaining(), 8);
        let src = *b"abcdefghij";
        // SAFETY: `src` is a live local readable for (more than) 4 bytes, not one of
        // the cursor's buffers.
        assert_eq!(unsafe { cur.write_from(src.as_ptr(), 4) }, 4);
        // SAFETY: `src[4..]` is readable for the 6 bytes named, not one of the cursor's
        // buffers.
        assert_eq!(unsafe { cur.write_from(src[4..].as_ptr(), 6) }, 4);
        assert_eq!(cur.remaining(), 0);
        assert_eq!(&a, b"abc");
        assert_eq!(&c, b"defgh");
    }

    #[test]
    fn gather_across_buffers() {
        let (mut a, mut b) = (*b"hello ", *b"world");
        let v = [iov(&mut a), iov(&mut b)];
        // SAFETY: `v` holds 2 iovecs over live local arrays, outliving the cursor.
        let mut cur = unsafe { IoCursor::new(v.as_ptr(), 2) }.unwrap();
        let mut out = [0u8; 8];
        // SAFETY: `out` is a live local writable for the 8 bytes named, not one of the
        // cursor's buffers.
        assert_eq!(unsafe { cur.read_into(out.as_mut_ptr(), 8) }, 8);
        assert_eq!(&out, b"hello wo");
        let mut rest = [0u8; 8];
        // SAFETY: as above, for `rest`.
        assert_eq!(unsafe { cur.read_into(rest.as_mut_ptr(), 8) }, 3);
        assert_eq!(&rest[..3], b"rld");
    }

    #[test]
    fn bad_vectors_are_refused() {
        // SAFETY: a null array is allowed: with a count it is refused (EFAULT) unread.
        let r = unsafe { IoCursor::new(std::ptr::null(), 1) }.unwrap_err();
        assert_eq!(r, Errno::EFAULT);
        // SAFETY: more than 1024 entries are refused (EINVAL) before the null array is
        // looked at.
        let r = unsafe { IoCursor::new(std::ptr::null(), 2000) }.unwrap_err();
        assert_eq!(r, Errno::EINVAL);
        let v = [
            iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: isize::MAX as usize,
            },
            iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 2,
            },
        ];
        // SAFETY: `v` holds 2 readable iovecs; only their lengths are read (their sum
        // is refused as too large).
        let r = unsafe { IoCursor::new(v.as_ptr(), 2) }.unwrap_err();
        assert_eq!(r, Errno::EINVAL);
        // SAFETY: no entries: nothing is read.
        let r = unsafe { IoCursor::new(std::ptr::null(), 0) }
            .unwrap()
            .remaining();
        assert_eq!(r, 0);
    }

    #[test]
    fn one_call_moves_at_most_max_rw() {
        let v = [iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: usize::MAX / 4,
        }];
        // SAFETY: `v` holds 1 readable iovec; only its length is read (`remaining`).
        let r = unsafe { IoCursor::new(v.as_ptr(), 1) }.unwrap().remaining();
        assert_eq!(r, MAX_RW);
    }
}
