//! Which descriptors are ferry sockets: the cache lookup on every intercepted call, the
//! identification of descriptors the cache does not know, and keeping the cache true
//! when descriptors are duplicated, received or closed behind the shim's back.

use std::ffi::c_int;

use crate::config;
use crate::errno::{errno, set_errno};
use crate::fdtable::{Entry, F_DIRECT, F_NONBLOCK, Sock, TABLE};

/// The ferry socket behind `fd`, or `None` (the call goes to libc). The fast path for
/// other descriptors is one atomic load plus one table lookup.
#[inline]
pub fn lookup(fd: c_int) -> Option<Sock> {
    if fd < 0 || !config::active() {
        return None;
    }
    match TABLE.get(fd) {
        Entry::Other => None,
        Entry::Ferry(s) => Some(s),
        Entry::Unknown => probe(fd),
    }
}

/// Identifies `fd` by its unix name and caches the answer. Leaves `errno` as it was.
#[cold]
fn probe(fd: c_int) -> Option<Sock> {
    let saved = errno();
    let r = identify(fd);
    set_errno(saved);
    r
}

fn identify(fd: c_int) -> Option<Sock> {
    let mut name = [0u8; 107];
    // SAFETY: `fd >= 0` (`lookup` checked), so not -1, and the borrow is used only for
    // the `getsockname` below; if the number is not open that fails with EBADF (handled
    // below). No memory is involved.
    let b = unsafe { ferry_sys::borrow(fd) };
    match ferry_sys::abstract_name(b, &mut name) {
        Ok(Some(n)) => {
            if let Some(id) = ferry_proto::parse_pair_name(&name[..n]) {
                let fl = crate::sys::getfl(fd).unwrap_or(0);
                let flags = F_DIRECT
                    | if fl & libc::O_NONBLOCK != 0 {
                        F_NONBLOCK
                    } else {
                        0
                    };
                let s = Sock::new(fd, id, flags);
                TABLE.set(fd, Entry::Ferry(s));
                return Some(s);
            }
            TABLE.set(fd, Entry::Other);
            None
        }
        Ok(None) => {
            TABLE.set(fd, Entry::Other);
            None
        }
        // Not open: nothing to cache.
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => None,
        Err(_) => {
            TABLE.set(fd, Entry::Other);
            None
        }
    }
}

/// After a successful `fcntl`: track `O_NONBLOCK` and duplicates.
pub fn after_fcntl(fd: c_int, cmd: c_int, arg: u64, result: c_int) {
    match cmd {
        libc::F_SETFL => set_nonblock(fd, arg as c_int & libc::O_NONBLOCK != 0),
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => TABLE.copy(fd, result),
        _ => {}
    }
}

/// `O_NONBLOCK` changed on `fd` (`F_SETFL`, `FIONBIO`): the kernel keeps it per open
/// file, which this process's duplicates share.
pub fn set_nonblock(fd: c_int, on: bool) {
    if let Entry::Ferry(s) = TABLE.get(fd) {
        let (set, clear) = if on { (F_NONBLOCK, 0) } else { (0, F_NONBLOCK) };
        TABLE.update_id(s.id, set, clear);
    }
}

/// Descriptors arrived with `SCM_RIGHTS` in `msg`: their numbers may have been cached as
/// something else.
///
/// # Safety
/// `msg` must be null or a readable message header that a successful `recvmsg` just
/// filled: `msg_control` null or readable for `msg_controllen` bytes, laid out by the
/// kernel.
pub unsafe fn forget_received(msg: *const libc::msghdr) {
    if msg.is_null() {
        return;
    }
    // SAFETY: non-null (checked above), so a readable header (# Safety), only read.
    let m = unsafe { &*msg };
    if m.msg_control.is_null() || m.msg_controllen == 0 {
        return;
    }
    // SAFETY: `msg_control` is readable for `msg_controllen` bytes, laid out by the
    // kernel (# Safety): CMSG_FIRSTHDR/CMSG_NXTHDR return only headers inside those
    // bytes, each `cmsg_len` lies within them, and an SCM_RIGHTS payload of
    // `cmsg_len - CMSG_LEN(0)` bytes is an array of ints, read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<c_int>();
                let len = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..len / size_of::<c_int>() {
                    TABLE.clear(data.add(i).read_unaligned());
                }
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

    #[test]
    fn ferry_names_are_recognised() {
        let (a, b) =
            ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC).unwrap();
        let (name, n) = ferry_proto::pair_name(4_000_000_001, 0x1234);
        ferry_sys::bind_abstract(a.as_fd(), &name[..n]).unwrap();
        ferry_sys::set_nonblocking(a.as_fd(), true).unwrap();
        set_errno(1234);
        let s = identify(a.as_raw_fd()).unwrap();
        assert_eq!(
            (s.id, s.nonblock(), s.typed()),
            (4_000_000_001, true, false)
        );
        assert_eq!(TABLE.get(a.as_raw_fd()), Entry::Ferry(s));
        assert_eq!(identify(b.as_raw_fd()), None);
        assert_eq!(TABLE.get(b.as_raw_fd()), Entry::Other);
        // A number that is not open is not cached (one far above anything the tests
        // open, so no other test thread can be given it meanwhile).
        let closed = 900_000;
        assert_eq!(probe(closed), None);
        assert_eq!(TABLE.get(closed), Entry::Unknown);
        assert_eq!(errno(), 1234);
        TABLE.clear(a.as_raw_fd());
        TABLE.clear(b.as_raw_fd());
    }

    #[test]
    fn fcntl_tracking() {
        TABLE.set(50_000, Entry::Ferry(Sock::new(50_000, 3, 0)));
        after_fcntl(
            50_000,
            libc::F_SETFL,
            libc::O_NONBLOCK as u64 | libc::O_RDWR as u64,
            0,
        );
        assert!(matches!(TABLE.get(50_000), Entry::Ferry(s) if s.nonblock()));
        after_fcntl(50_000, libc::F_DUPFD_CLOEXEC, 0, 50_001);
        assert!(matches!(TABLE.get(50_001), Entry::Ferry(s) if s.nonblock() && s.id == 3));
        after_fcntl(50_000, libc::F_SETFL, 0, 0);
        assert!(matches!(TABLE.get(50_000), Entry::Ferry(s) if !s.nonblock()));
        // The duplicate shares the open file description: it follows.
        assert!(matches!(TABLE.get(50_001), Entry::Ferry(s) if !s.nonblock()));
        TABLE.clear(50_000);
        TABLE.clear(50_001);
    }

    #[test]
    fn received_descriptors_are_forgotten() {
        let (a, b) =
            ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC)
                .unwrap();
        let efd = ferry_sys::eventfd().unwrap();
        ferry_sys::send_with_fds(a.as_fd(), b"x", &[efd.as_fd()]).unwrap();
        let mut cbuf = [0u64; 8];
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        // SAFETY: a msghdr is integers and raw pointers: all-zero is a valid (empty) one.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&cbuf);
        // SAFETY: `msg` points at `iov` (one byte of `byte`) and at `cbuf` for its own
        // size, all live locals of this frame; no name is asked for.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmsg,
                b.as_raw_fd(),
                &mut msg as *mut libc::msghdr,
                libc::MSG_CMSG_CLOEXEC,
            )
        };
        assert_eq!(r, 1);
        // SAFETY: the recvmsg above succeeded with one SCM_RIGHTS message, so
        // CMSG_FIRSTHDR is a header inside `cbuf` and its data holds one int (8-aligned
        // buffer, so the read is aligned).
        let got = unsafe { *libc::CMSG_DATA(libc::CMSG_FIRSTHDR(&msg)).cast::<c_int>() };
        TABLE.set(got, Entry::Other);
        // SAFETY: `msg` is a readable header a successful recvmsg just filled, its
        // control buffer the live `cbuf`.
        unsafe { forget_received(&msg) };
        assert_eq!(TABLE.get(got), Entry::Unknown);
        let _ = ferry_sys::close_raw(got);
    }
}
