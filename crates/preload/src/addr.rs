//! Socket addresses between the program's memory and records: reading a `sockaddr` the
//! program passed (checked before it goes on the ring, since a record the server refuses
//! would close the whole channel), and writing one back with the kernel's truncation
//! rules.

use ferry_proto::WireAddr;
use libc::{sockaddr, socklen_t};

use crate::errno::{Errno, Res};

const IN_LEN: usize = size_of::<libc::sockaddr_in>();
const IN6_LEN: usize = size_of::<libc::sockaddr_in6>();
/// The shortest `sockaddr_in6` the kernel accepts (RFC 2133's, without scope id).
const IN6_MIN_LEN: usize = 24;

/// The family field of the program's address (`None` when too short to hold one).
///
/// # Safety
/// `addr` must be readable for `len` bytes (or null).
pub unsafe fn family(addr: *const sockaddr, len: socklen_t) -> Option<i32> {
    if addr.is_null() || (len as usize) < 2 {
        return None;
    }
    let mut f = [0u8; 2];
    // SAFETY: `addr` is non-null and readable for `len >= 2` bytes (checked; # Safety);
    // `f` is a local, so the copy cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(addr.cast::<u8>(), f.as_mut_ptr(), 2) };
    Some(i32::from(u16::from_ne_bytes(f)))
}

/// Reads an inet address the program passed (`connect`, `bind`, `sendto`).
///
/// # Safety
/// `addr` must be readable for `len` bytes (or null).
pub unsafe fn read_sockaddr(addr: *const sockaddr, len: socklen_t) -> Res<WireAddr> {
    let len = len as usize;
    if addr.is_null() {
        return Err(if len == 0 {
            Errno::EINVAL
        } else {
            Errno::EFAULT
        });
    }
    if len < 2 {
        return Err(Errno::EINVAL);
    }
    let mut buf = [0u8; IN6_LEN];
    let n = len.min(IN6_LEN);
    // SAFETY: `addr` is non-null and readable for `len >= n` bytes (# Safety); `buf`, a
    // local the program cannot overlap, holds `IN6_LEN >= n`.
    unsafe { std::ptr::copy_nonoverlapping(addr.cast::<u8>(), buf.as_mut_ptr(), n) };
    decode(&buf, len)
}

/// Decodes address bytes (`buf` zero-padded to `sockaddr_in6` size, `len` as the
/// program gave it).
fn decode(buf: &[u8; IN6_LEN], len: usize) -> Res<WireAddr> {
    let family = i32::from(u16::from_ne_bytes([buf[0], buf[1]]));
    let need = match family {
        libc::AF_INET if len >= IN_LEN => IN_LEN,
        libc::AF_INET6 if len >= IN6_MIN_LEN => IN6_LEN,
        libc::AF_INET | libc::AF_INET6 => return Err(Errno::EINVAL),
        _ => return Err(Errno(libc::EAFNOSUPPORT)),
    };
    WireAddr::decode(&buf[..need]).map_err(|_| Errno::EINVAL)
}

/// Writes `bytes` (a kernel-layout address) to the program's `addr`/`len` like the
/// kernel: at most `*len` bytes are copied and `*len` becomes the full length.
///
/// # Safety
/// `len` must be null or point at a readable and writable `socklen_t`, and `addr` be
/// null or writable for `*len` bytes.
pub unsafe fn write_sockaddr(bytes: &[u8], addr: *mut sockaddr, len: *mut socklen_t) -> Res<()> {
    if len.is_null() {
        return if addr.is_null() {
            Ok(())
        } else {
            Err(Errno::EFAULT)
        };
    }
    // SAFETY: `len` is non-null (checked above), so a readable `socklen_t` (# Safety).
    let room = unsafe { len.read() };
    if (room as i32) < 0 {
        return Err(Errno::EINVAL);
    }
    if !addr.is_null() {
        let n = bytes.len().min(room as usize);
        // SAFETY: `addr` is non-null and writable for `*len` = `room >= n` bytes
        // (# Safety); `bytes` is the shim's, so the copy cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr.cast::<u8>(), n) };
    }
    // SAFETY: `len` is non-null (checked above), so a writable `socklen_t` (# Safety).
    unsafe { len.write(bytes.len() as socklen_t) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn raw(sa: &str) -> ([u8; IN6_LEN], usize) {
        let sa: SocketAddr = sa.parse().unwrap();
        let mut buf = [0u8; 32];
        let n = WireAddr::from(sa).encode(&mut buf);
        let mut out = [0u8; IN6_LEN];
        out.copy_from_slice(&buf[..IN6_LEN]);
        (out, n)
    }

    #[test]
    fn program_addresses_are_checked() {
        let (b, n) = raw("10.1.2.3:80");
        assert_eq!(
            decode(&b, n).unwrap().to_std(),
            "10.1.2.3:80".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(decode(&b, 15), Err(Errno::EINVAL));
        let (b, n) = raw("[2001:db8::1]:443");
        assert_eq!(n, IN6_LEN);
        assert!(decode(&b, n).is_ok());
        // RFC 2133 length: the scope id is taken as zero.
        let mut short = b;
        short[24..].fill(0);
        assert_eq!(
            decode(&short, 24).unwrap().to_std(),
            "[2001:db8::1]:443".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(decode(&b, 23), Err(Errno::EINVAL));
        let mut unix = [0u8; IN6_LEN];
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(decode(&unix, 20), Err(Errno(libc::EAFNOSUPPORT)));
    }

    #[test]
    fn reading_program_memory() {
        let (b, n) = raw("127.0.0.1:9");
        // SAFETY: `b` is a live local readable for `n <= IN6_LEN` bytes.
        let a = unsafe { read_sockaddr(b.as_ptr().cast(), n as socklen_t) }.unwrap();
        assert!(a.is_loopback());
        // SAFETY: a null address is allowed (it is refused, never read).
        let r = unsafe { read_sockaddr(std::ptr::null(), 16) };
        assert_eq!(r, Err(Errno::EFAULT));
        // SAFETY: `b` is a live local readable for (more than) the 1 byte named.
        let r = unsafe { read_sockaddr(b.as_ptr().cast(), 1) };
        assert_eq!(r, Err(Errno::EINVAL));
        // SAFETY: `b` is readable for (more than) the 2 bytes named.
        assert_eq!(unsafe { family(b.as_ptr().cast(), 2) }, Some(libc::AF_INET));
        // SAFETY: as above, for 1 byte (too short: nothing is read).
        assert_eq!(unsafe { family(b.as_ptr().cast(), 1) }, None);
    }

    #[test]
    fn writing_back_truncates_like_the_kernel() {
        let (b, n) = raw("[::1]:5");
        let mut out = [0xffu8; 8];
        let mut len: socklen_t = 8;
        // SAFETY: `len` is a live local holding at most `out`'s size, and `out` a live
        // local array writable for that many bytes.
        unsafe { write_sockaddr(&b[..n], out.as_mut_ptr().cast(), &mut len) }.unwrap();
        assert_eq!(len as usize, IN6_LEN);
        assert_eq!(out, b[..8]);
        let mut len: socklen_t = 0;
        // SAFETY: a null address is allowed (only the length, a live local, is written).
        unsafe { write_sockaddr(&b[..n], std::ptr::null_mut(), &mut len) }.unwrap();
        assert_eq!(len as usize, IN6_LEN);
        let mut len = u32::MAX;
        // SAFETY: `len` is a live local; its value (negative as an int) is refused
        // before `out` is written.
        let r = unsafe { write_sockaddr(&b[..n], out.as_mut_ptr().cast(), &mut len) };
        assert_eq!(r, Err(Errno::EINVAL));
    }
}
