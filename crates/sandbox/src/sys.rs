//! Thin syscall wrappers shared by the launching side and the sandbox init.
//!
//! Everything here that the init calls is async-signal-safe: no allocation, no locks,
//! no thread-local state beyond `errno`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use libc::{c_int, c_long, pid_t};

/// Turns a `-1` return into the current `errno` as an [`io::Error`].
pub(crate) fn cvt(ret: c_int) -> io::Result<c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// [`cvt`] for `syscall(2)`, which returns a `long`.
pub(crate) fn cvt_long(ret: c_long) -> io::Result<c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Current `errno` as a plain integer (async-signal-safe).
pub(crate) fn errno() -> c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `clone(2)` with fork semantics (no new stack) plus `flags`, and SIGCHLD as the exit
/// signal. Unlike `fork(3)`, runs no `pthread_atfork` handlers and takes no libc locks,
/// so it is usable from a multi-threaded process and from a child of such a process.
///
/// Returns 0 in the child and the child's pid in the parent.
///
/// # Safety
///
/// In the child only the calling thread exists, and any lock another thread held at the
/// time of the call stays held forever (including the allocator's). The child must do
/// only async-signal-safe work (no allocation, no `std` locks, no panics) until it
/// calls `execve` or `_exit`. It must also not use libc functions that rely on the
/// cached thread id (`raise`, `abort`, `pthread_*`).
pub(crate) unsafe fn fork_raw(flags: c_int) -> io::Result<pid_t> {
    let flags = (flags | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: clone with a null stack behaves like fork: the child continues on a
    // copy-on-write copy of this stack. The remaining arguments (parent_tid, child_tid,
    // tls, in an order that varies by architecture) are all null and unused because no
    // CLONE_*TID / CLONE_SETTLS flag is set. The caller upholds the child's contract.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    cvt_long(ret).map(|pid| pid as pid_t)
}

/// `pidfd_open(2)`: a CLOEXEC fd that refers to process `pid` for good (no pid reuse).
pub(crate) fn pidfd_open(pid: pid_t) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = cvt_long(ret)? as RawFd;
    // SAFETY: pidfd_open returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_send_signal(2)`.
pub(crate) fn pidfd_send_signal(pidfd: RawFd, sig: c_int) -> io::Result<()> {
    // SAFETY: plain syscall; a null siginfo means "as if sent by kill(2)".
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    cvt_long(ret).map(drop)
}

/// Converts a `wait(2)` status into the exit code a shell would report:
/// the exit status, or 128 + the terminating signal.
pub(crate) fn exit_code(status: c_int) -> c_int {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        // Stopped/continued are not reported without WUNTRACED/WCONTINUED.
        128
    }
}

/// `waitpid(pid, 0)` retried on EINTR, returning the raw status.
pub(crate) fn waitpid_blocking(pid: pid_t) -> io::Result<c_int> {
    let mut status = 0;
    loop {
        // SAFETY: status is a valid out-pointer for the duration of the call.
        match cvt(unsafe { libc::waitpid(pid, &mut status, 0) }) {
            Ok(_) => return Ok(status),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Control-message buffer big enough (and aligned) for one `SCM_RIGHTS` fd.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Sends one datagram, attaching `fd` with `SCM_RIGHTS` if given. Never raises SIGPIPE.
/// Async-signal-safe.
pub(crate) fn send_with_fd(sock: RawFd, data: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cmsg = CmsgBuf([0; 64]);
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
        let space = unsafe { libc::CMSG_SPACE(size_of::<c_int>() as u32) } as usize;
        debug_assert!(space <= cmsg.0.len());
        msg.msg_control = cmsg.0.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` writable, aligned bytes, so the first
        // header exists and its data area can hold one c_int.
        unsafe {
            let hdr = libc::CMSG_FIRSTHDR(&msg);
            (*hdr).cmsg_level = libc::SOL_SOCKET;
            (*hdr).cmsg_type = libc::SCM_RIGHTS;
            (*hdr).cmsg_len = libc::CMSG_LEN(size_of::<c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(hdr).cast::<c_int>(), fd);
        }
    }
    loop {
        // SAFETY: msg and everything it points to live across the call.
        let ret = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if ret >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Receives one datagram into `buf`, plus at most one `SCM_RIGHTS` fd (made CLOEXEC).
/// Extra fds, if a peer sends several, are closed. Returns the datagram length
/// (0 means the peer hung up).
pub(crate) fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cmsg = CmsgBuf([0; 64]);
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.0.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.0.len() as _;
    let n = loop {
        // SAFETY: msg and the buffers it points to live across the call.
        let ret = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if ret >= 0 {
            break ret as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    let mut received = None;
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG_* macros walk
    // only within that area, and every SCM_RIGHTS payload is an array of fds that the
    // kernel just installed in our table and that nothing else owns.
    unsafe {
        let mut hdr = libc::CMSG_FIRSTHDR(&msg);
        while !hdr.is_null() {
            if (*hdr).cmsg_level == libc::SOL_SOCKET && (*hdr).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*hdr).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(hdr).cast::<c_int>();
                for i in 0..payload / size_of::<c_int>() {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if received.is_none() {
                        received = Some(fd);
                    }
                }
            }
            hdr = libc::CMSG_NXTHDR(&msg, hdr);
        }
    }
    Ok((n, received))
}

/// `open_tree(2)`: a file descriptor for the mount at `path` (relative to `dirfd`), or
/// with `OPEN_TREE_CLONE` a detached copy of it. Returns the raw result (-1 and `errno`
/// on failure). Async-signal-safe.
pub(crate) fn open_tree(dirfd: RawFd, path: &std::ffi::CStr, flags: libc::c_uint) -> c_long {
    // SAFETY: path is NUL-terminated and outlives the call; the rest are integers.
    unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) }
}

/// `move_mount(2)` of the mount `from` (a descriptor from `open_tree`) onto `to`; the
/// last component of `to` is not followed if it is a symbolic link. Returns the raw
/// result. Async-signal-safe.
pub(crate) fn move_mount(from: RawFd, to: &std::ffi::CStr) -> c_long {
    // SAFETY: both paths are NUL-terminated and outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from,
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    }
}

/// `mount_setattr(2)`: sets `attr_set` on the mount at `path` (relative to `dirfd`;
/// empty with `AT_EMPTY_PATH` for `dirfd` itself), with `userns` as its id mapping
/// when `attr_set` has `MOUNT_ATTR_IDMAP`. Returns the raw result. Async-signal-safe.
pub(crate) fn mount_setattr(
    dirfd: RawFd,
    path: &std::ffi::CStr,
    flags: libc::c_uint,
    attr_set: u64,
    userns: Option<RawFd>,
) -> c_long {
    // SAFETY: mount_attr is plain data; all-zero is "change nothing".
    let mut attr: libc::mount_attr = unsafe { std::mem::zeroed() };
    attr.attr_set = attr_set;
    attr.userns_fd = userns.map_or(0, |fd| fd as u64);
    // SAFETY: path is NUL-terminated; attr lives across the call and its size is given.
    unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &raw const attr,
            size_of::<libc::mount_attr>(),
        )
    }
}
