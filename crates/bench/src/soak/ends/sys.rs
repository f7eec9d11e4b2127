//! The libc calls of the end cases that std has no form for (`send` with flags, `write`,
//! `sendfile`, integer and linger socket options). Each goes through libc's function of
//! that name, as std's own socket calls do, so that under `ferry run` the shim serves
//! it: these are the calls under test.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

fn check(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `send(fd, buf, flags)`.
pub fn send(fd: BorrowedFd<'_>, buf: &[u8], flags: i32) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the call; `fd` is
    // borrowed, so open.
    check(unsafe { libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), flags) })
}

/// `write(fd, buf)`.
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: as for `send`.
    check(unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) })
}

/// `sendfile(out, file, &offset, count)`: the file's position is not used or moved,
/// so threads may share the file.
pub fn sendfile(
    out: BorrowedFd<'_>,
    file: BorrowedFd<'_>,
    offset: u64,
    count: usize,
) -> io::Result<usize> {
    let mut off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: both descriptors are borrowed, so open; `off` is a valid pointer for the
    // call.
    check(unsafe { libc::sendfile(out.as_raw_fd(), file.as_raw_fd(), &mut off, count) })
}

fn set_opt<T>(fd: BorrowedFd<'_>, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is valid for reads of `size_of::<T>()` bytes for the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(r as isize).map(drop)
}

/// An integer socket option (`SO_SNDBUF`, `SO_RCVBUF`…).
pub fn set_int(fd: BorrowedFd<'_>, level: i32, name: i32, value: i32) -> io::Result<()> {
    set_opt(fd, level, name, &value)
}

/// `SO_LINGER` on with a zero timeout: `close` then resets the connection.
pub fn linger_zero(fd: BorrowedFd<'_>) -> io::Result<()> {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    set_opt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &l)
}
