//! The few system calls the shim needs that `ferry-sys` does not wrap, entered straight
//! into the kernel (`ferry_sys::syscall6`): never through the libc function of the same
//! name, which may be the shim's own, nor through `syscall()`, which is the shim's too
//! and sends socket data calls on ferry sockets back into the shim.

use std::ffi::{c_int, c_long};
use std::io;

/// One raw system call; `-1` becomes `errno` as an `io::Error`.
///
/// # Safety
/// The arguments must be valid for system call `nr` (pointers to live objects of the
/// sizes it uses).
unsafe fn raw(nr: c_long, a: [c_long; 6]) -> io::Result<i64> {
    // SAFETY: the arguments are valid for `nr` (# Safety), `syscall6`'s own contract.
    unsafe { ferry_sys::syscall6(nr, a) }
}

/// `fcntl(fd, F_GETFL)`.
pub fn getfl(fd: c_int) -> io::Result<c_int> {
    // SAFETY: F_GETFL reads only integers (the fd and the command) and writes no memory.
    unsafe {
        raw(
            libc::SYS_fcntl,
            [fd.into(), libc::F_GETFL.into(), 0, 0, 0, 0],
        )
    }
    .map(|v| v as c_int)
}

/// Sets or clears `FD_CLOEXEC`.
pub fn set_cloexec(fd: c_int, on: bool) -> io::Result<()> {
    let v = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: F_SETFD reads only integers (fd, command and flag) and writes no memory.
    unsafe {
        raw(
            libc::SYS_fcntl,
            [fd.into(), libc::F_SETFD.into(), v.into(), 0, 0, 0],
        )
    }
    .map(drop)
}

/// `ioctl(fd, SIOCOUTQ)`: what a socket has sent that its peer has not taken yet
/// (for a unix socket, the memory of those messages, not a byte count).
pub fn outq(fd: c_int) -> io::Result<c_int> {
    let mut v: c_int = 0;
    // SAFETY: SIOCOUTQ writes one int into `v`, a live local.
    unsafe {
        raw(
            libc::SYS_ioctl,
            [
                fd.into(),
                libc::TIOCOUTQ as c_long,
                &mut v as *mut c_int as c_long,
                0,
                0,
                0,
            ],
        )
    }?;
    Ok(v)
}

/// Receives (or with `MSG_PEEK`, looks at) at most one byte; `Ok(0)` at end of stream.
pub fn recv_byte(fd: c_int, flags: c_int) -> io::Result<usize> {
    let mut b = [0u8; 1];
    // SAFETY: `b` is a live one-byte local, the length passed is 1; no address (null
    // pointers) is asked for.
    let r = unsafe {
        raw(
            libc::SYS_recvfrom,
            [fd.into(), b.as_mut_ptr() as c_long, 1, flags.into(), 0, 0],
        )
    };
    r.map(|n| n as usize)
}

/// Reads and discards up to 64 bytes (readiness tokens); returns how many.
pub fn recv_bytes(fd: c_int, flags: c_int) -> io::Result<usize> {
    let mut b = [0u8; 64];
    // SAFETY: `b` is a live 64-byte local, the length passed is 64; no address (null
    // pointers) is asked for.
    let r = unsafe {
        raw(
            libc::SYS_recvfrom,
            [fd.into(), b.as_mut_ptr() as c_long, 64, flags.into(), 0, 0],
        )
    };
    r.map(|n| n as usize)
}

/// `recvmsg(2)` into `n` iovecs, no address or control data; returns the bytes.
///
/// # Safety
/// `iov` must point at `n` readable iovecs whose buffers are writable for their lengths.
pub unsafe fn recv_iov(
    fd: c_int,
    iov: *const libc::iovec,
    n: usize,
    flags: c_int,
) -> crate::errno::Res<usize> {
    // SAFETY: a msghdr is integers and raw pointers: all-zero is a valid one, with no
    // name and no control buffer.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.cast_mut();
    msg.msg_iovlen = n;
    // SAFETY: `msg` is a live local naming `n` iovecs at `iov` whose buffers are
    // writable (# Safety), and no name or control buffer.
    let r = unsafe {
        raw(
            libc::SYS_recvmsg,
            [
                fd.into(),
                &mut msg as *mut libc::msghdr as c_long,
                flags.into(),
                0,
                0,
                0,
            ],
        )
    };
    r.map(|k| k as usize)
        .map_err(|e| crate::errno::Errno::from_io(&e))
}

/// `read(2)`, or `pread64(2)` at `off`, into raw memory.
///
/// # Safety
/// `p` must be writable for `n` bytes.
pub unsafe fn read_into(fd: c_int, p: *mut u8, n: usize, off: Option<i64>) -> io::Result<usize> {
    let r = match off {
        // SAFETY: `p` writable for `n` bytes (# Safety), the length passed.
        Some(o) => unsafe {
            raw(
                libc::SYS_pread64,
                [fd.into(), p as c_long, n as c_long, o as c_long, 0, 0],
            )
        },
        // SAFETY: as for `pread64`: `p` writable for `n` bytes (# Safety).
        None => unsafe {
            raw(
                libc::SYS_read,
                [fd.into(), p as c_long, n as c_long, 0, 0, 0],
            )
        },
    };
    r.map(|k| k as usize)
}

/// `write(2)`, or `pwrite64(2)` at `off`, from raw memory.
///
/// # Safety
/// `p` must be readable for `n` bytes.
pub unsafe fn write_from(fd: c_int, p: *const u8, n: usize, off: Option<i64>) -> io::Result<usize> {
    let r = match off {
        // SAFETY: `p` readable for `n` bytes (# Safety), the length passed.
        Some(o) => unsafe {
            raw(
                libc::SYS_pwrite64,
                [fd.into(), p as c_long, n as c_long, o as c_long, 0, 0],
            )
        },
        // SAFETY: as for `pwrite64`: `p` readable for `n` bytes (# Safety).
        None => unsafe {
            raw(
                libc::SYS_write,
                [fd.into(), p as c_long, n as c_long, 0, 0, 0],
            )
        },
    };
    r.map(|k| k as usize)
}

/// `close_range(2)` (used when libc has no `closefrom`).
pub fn close_range(first: u32, last: u32, flags: c_int) -> io::Result<()> {
    // SAFETY: close_range reads three integers and touches no memory.
    unsafe {
        raw(
            libc::SYS_close_range,
            [first.into(), last.into(), flags.into(), 0, 0, 0],
        )
    }
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

    #[test]
    fn bytes_flags_and_reads() {
        let (a, b) =
            ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC).unwrap();
        let e = recv_byte(b.as_raw_fd(), libc::MSG_DONTWAIT).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        ferry_sys::write(a.as_fd(), b"xy").unwrap();
        assert_eq!(
            recv_byte(b.as_raw_fd(), libc::MSG_PEEK | libc::MSG_DONTWAIT).unwrap(),
            1
        );
        assert_eq!(recv_byte(b.as_raw_fd(), libc::MSG_DONTWAIT).unwrap(), 1);
        let mut out = [0u8; 4];
        // SAFETY: `out` holds 4 bytes.
        let r = unsafe { read_into(b.as_raw_fd(), out.as_mut_ptr(), 4, None) }.unwrap();
        assert_eq!(r, 1);
        assert_eq!(out[0], b'y');
        set_cloexec(a.as_raw_fd(), false).unwrap();
        assert_eq!(getfl(a.as_raw_fd()).unwrap() & libc::O_NONBLOCK, 0);
        drop(a);
        assert_eq!(recv_byte(b.as_raw_fd(), libc::MSG_DONTWAIT).unwrap(), 0);
    }
}
