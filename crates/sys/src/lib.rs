//! ferry's syscall layer: the system calls ferry makes outside the shared-memory ring,
//! each wrapped once, turning `-1`/`errno` into `io::Error` and raw descriptors into
//! `OwnedFd`.
//!
//! Every wrapper enters the kernel directly (the system call instruction; libc's
//! `syscall(2)` on architectures other than x86-64 and AArch64) rather than through the
//! libc function of the same name. That matters: inside a sandboxed program ferry's shim
//! *replaces* the libc socket functions, and `syscall()` too, so code shared by the shim
//! and the server must never call them by name, or the shim would recurse into itself. This crate must not keep state, allocate
//! on hot paths beyond what a call returns, or know about ferry's protocol.

use std::io;
use std::mem::{MaybeUninit, size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

mod epoll;
pub mod tun;
pub use epoll::{Epoll, Event};

/// Runs a raw system call; `-1` becomes the thread's `errno` as an `io::Error`.
/// Arguments are converted to `c_long` (integers and pointers alike) outside any
/// `unsafe`, so the caller's expressions are never silently inside an unsafe block.
macro_rules! syscall {
    ($nr:expr $(, $arg:expr)* $(,)?) => {{
        let args: &[::libc::c_long] = &[$(($arg) as ::libc::c_long),*];
        $crate::raw_syscall($nr, args)
    }};
}
pub(crate) use syscall;

/// Enters the kernel with up to six arguments.
///
/// Straight into the kernel, not through libc's `syscall()`: in the preload shim a
/// program's `syscall()` is the shim's own (it routes socket data calls on ferry sockets
/// into the shim), and the shim's calls on its readiness pairs must not take that road.
fn raw_syscall(nr: libc::c_long, a: &[libc::c_long]) -> io::Result<i64> {
    let g = |i: usize| a.get(i).copied().unwrap_or(0);
    // SAFETY: every wrapper in this crate passes arguments valid for the call it names
    // (pointers to live, correctly sized objects); the kernel validates the rest.
    unsafe { syscall6(nr, [g(0), g(1), g(2), g(3), g(4), g(5)]) }
}

/// One system call with six arguments, straight into the kernel (see [`raw_syscall`]);
/// for the preload shim's few calls this crate does not wrap.
///
/// # Safety
/// The arguments must be valid for system call `nr` (pointers to live objects of the
/// sizes it uses).
pub unsafe fn syscall6(nr: libc::c_long, a: [libc::c_long; 6]) -> io::Result<i64> {
    // SAFETY: the arguments are valid for system call `nr` (# Safety), which is all
    // `kernel_call` asks.
    let r = unsafe { kernel_call(nr, a) };
    if (-4095..0).contains(&r) {
        Err(io::Error::from_raw_os_error(-r as i32))
    } else {
        Ok(r)
    }
}

/// One system call; the kernel's result (`-errno` on failure).
///
/// # Safety
/// The arguments must be valid for system call `nr`.
#[cfg(target_arch = "x86_64")]
unsafe fn kernel_call(nr: libc::c_long, a: [libc::c_long; 6]) -> i64 {
    let r: i64;
    // SAFETY: the x86-64 Linux system call convention: number in rax, arguments in
    // rdi, rsi, rdx, r10, r8, r9, result in rax; the instruction clobbers rcx and r11
    // and touches no stack. The call's own contract is the caller's.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => r,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    r
}

/// One system call; the kernel's result (`-errno` on failure).
///
/// # Safety
/// The arguments must be valid for system call `nr`.
#[cfg(target_arch = "aarch64")]
unsafe fn kernel_call(nr: libc::c_long, a: [libc::c_long; 6]) -> i64 {
    let r: i64;
    // SAFETY: the AArch64 Linux system call convention: number in x8, arguments in
    // x0..x5, result in x0. The call's own contract is the caller's.
    unsafe {
        std::arch::asm!(
            "svc 0",
            in("x8") nr,
            inlateout("x0") a[0] => r,
            in("x1") a[1],
            in("x2") a[2],
            in("x3") a[3],
            in("x4") a[4],
            in("x5") a[5],
            options(nostack),
        );
    }
    r
}

/// One system call through libc (other architectures); the result as the kernel's.
///
/// # Safety
/// The arguments must be valid for system call `nr`.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn kernel_call(nr: libc::c_long, a: [libc::c_long; 6]) -> i64 {
    // SAFETY: the arguments are valid for system call `nr` (# Safety); libc's variadic
    // `syscall` passes all six to the kernel, which reads only those `nr` uses.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r == -1 {
        -i64::from(
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    } else {
        r
    }
}

/// Wraps a descriptor a successful syscall returned.
fn owned(r: i64) -> OwnedFd {
    // SAFETY: `r` is a descriptor the kernel just returned to us; nobody else owns it.
    unsafe { OwnedFd::from_raw_fd(r as RawFd) }
}

/// `socket(2)`.
pub fn socket(domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    syscall!(libc::SYS_socket, domain, ty, protocol).map(owned)
}

/// `socketpair(2)`, returned as two owned ends.
pub fn socketpair(domain: i32, ty: i32) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    syscall!(libc::SYS_socketpair, domain, ty, 0, fds.as_mut_ptr())?;
    Ok((owned(fds[0] as i64), owned(fds[1] as i64)))
}

/// `close(2)` on a raw descriptor ferry does not own through an `OwnedFd`.
pub fn close_raw(fd: RawFd) -> io::Result<()> {
    syscall!(libc::SYS_close, fd).map(drop)
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`: a close-on-exec duplicate numbered `>= min`.
pub fn dup_above(fd: BorrowedFd<'_>, min: RawFd) -> io::Result<OwnedFd> {
    syscall!(libc::SYS_fcntl, fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min).map(owned)
}

/// Sets or clears `O_NONBLOCK`.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // `FIONBIO` sets or clears `O_NONBLOCK` in one call (`F_GETFL` + `F_SETFL` take two).
    let mut on = libc::c_int::from(on);
    syscall!(
        libc::SYS_ioctl,
        fd.as_raw_fd(),
        libc::FIONBIO,
        std::ptr::addr_of_mut!(on)
    )
    .map(drop)
}

/// `eventfd(2)`, non-blocking and close-on-exec.
pub fn eventfd() -> io::Result<OwnedFd> {
    syscall!(
        libc::SYS_eventfd2,
        0,
        libc::EFD_NONBLOCK | libc::EFD_CLOEXEC
    )
    .map(owned)
}

/// Adds one to an eventfd.
pub fn eventfd_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: u64 = 1;
    syscall!(libc::SYS_write, fd.as_raw_fd(), &one as *const u64, 8).map(drop)
}

/// Reads (and so resets) an eventfd's counter; 0 when it was already zero.
pub fn eventfd_drain(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v: u64 = 0;
    match syscall!(libc::SYS_read, fd.as_raw_fd(), &mut v as *mut u64, 8) {
        Ok(_) => Ok(v),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

/// `read(2)`.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    syscall!(libc::SYS_read, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()).map(|n| n as usize)
}

/// `write(2)`.
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    syscall!(libc::SYS_write, fd.as_raw_fd(), buf.as_ptr(), buf.len()).map(|n| n as usize)
}

/// `shutdown(2)`.
pub fn shutdown(fd: BorrowedFd<'_>, how: i32) -> io::Result<()> {
    syscall!(libc::SYS_shutdown, fd.as_raw_fd(), how).map(drop)
}

/// Polls one descriptor without blocking; returns its `revents`.
pub fn poll_now(fd: BorrowedFd<'_>, events: i16) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    syscall!(
        libc::SYS_ppoll,
        &mut p as *mut libc::pollfd,
        1,
        &ts as *const libc::timespec,
        0,
        8
    )?;
    Ok(p.revents)
}

/// Polls one descriptor, waiting at most `timeout_ms` (-1 = forever); returns `revents`.
pub fn poll_wait(fd: BorrowedFd<'_>, events: i16, timeout_ms: i32) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: (timeout_ms / 1000) as libc::time_t,
        tv_nsec: ((timeout_ms % 1000) * 1_000_000) as libc::c_long,
    };
    let tsp = if timeout_ms < 0 {
        std::ptr::null()
    } else {
        &ts as *const libc::timespec
    };
    syscall!(libc::SYS_ppoll, &mut p as *mut libc::pollfd, 1, tsp, 0, 8)?;
    Ok(p.revents)
}

/// Sends one packet with descriptors attached (`SCM_RIGHTS`), never raising SIGPIPE.
pub fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    // 24 fit the 128-byte control buffer (and the receiver's, `recv_with_fds`).
    const MAX: usize = 24;
    assert!(fds.len() <= MAX, "send_with_fds: at most {MAX} descriptors");
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX * size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = [0u64; 16];
    debug_assert!(space <= size_of::<[u64; 16]>());
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let data_len = (fds.len() * size_of::<RawFd>()) as u32;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: pure size computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(data_len) } as usize;
        // SAFETY: msg_control points at `cbuf`, large enough for one cmsg of
        // CMSG_SPACE(data_len) bytes, so CMSG_FIRSTHDR is non-null and in bounds.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data_len) as usize;
            let p = libc::CMSG_DATA(c) as *mut RawFd;
            for (i, fd) in fds.iter().enumerate() {
                p.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    loop {
        match syscall!(
            libc::SYS_sendmsg,
            sock.as_raw_fd(),
            &msg as *const libc::msghdr,
            libc::MSG_NOSIGNAL
        ) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Receives one packet and the descriptors attached to it (close-on-exec).
/// Returns `Ok((0, []))` at end of stream; a packet whose descriptors did not all fit
/// (the caller's descriptor limit, or more than 24) is an error.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: i32,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    match recv_with_fds_cut(sock, buf, flags)? {
        (_, _, true) => Err(io::Error::other("control message truncated")),
        (n, fds, false) => Ok((n, fds)),
    }
}

/// [`recv_with_fds`], telling a packet whose descriptors did not all arrive (the
/// kernel closed those it could not give, e.g. at the descriptor limit: `MSG_CTRUNC`)
/// by the third value instead of failing.
pub fn recv_with_fds_cut(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: i32,
) -> io::Result<(usize, Vec<OwnedFd>, bool)> {
    recv_with_fds_as(sock, buf, flags, true)
}

/// [`recv_with_fds_cut`], the descriptors close-on-exec or not (`cloexec`): one that
/// is to stay open across `exec` needs no `F_SETFD` after.
pub fn recv_with_fds_as(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: i32,
    cloexec: bool,
) -> io::Result<(usize, Vec<OwnedFd>, bool)> {
    let flags = if cloexec {
        flags | libc::MSG_CMSG_CLOEXEC
    } else {
        flags
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; 16]>();
    let n = loop {
        match syscall!(
            libc::SYS_recvmsg,
            sock.as_raw_fd(),
            &mut msg as *mut libc::msghdr,
            flags
        ) {
            Ok(n) => break n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG_* macros walk only
    // inside that buffer, and SCM_RIGHTS payloads are arrays of descriptors now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..count {
                    fds.push(owned(data.add(i).read_unaligned() as i64));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n, fds, msg.msg_flags & libc::MSG_CTRUNC != 0))
}

/// A socket address in the kernel's layout, ready for `bind`/`connect`/`sendto`.
#[allow(missing_debug_implementations)]
pub struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawAddr {
    /// Converts a std address.
    pub fn new(sa: &SocketAddr) -> RawAddr {
        // SAFETY: sockaddr_storage is plain data; zero is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = match sa {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe {
                    (&mut storage as *mut libc::sockaddr_storage)
                        .cast::<libc::sockaddr_in>()
                        .write(sin)
                };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe {
                    (&mut storage as *mut libc::sockaddr_storage)
                        .cast::<libc::sockaddr_in6>()
                        .write(sin6)
                };
                size_of::<libc::sockaddr_in6>()
            }
        };
        RawAddr {
            storage,
            len: len as libc::socklen_t,
        }
    }

    /// Pointer for the kernel.
    pub fn as_ptr(&self) -> *const libc::sockaddr {
        (&self.storage as *const libc::sockaddr_storage).cast()
    }

    /// Length for the kernel.
    pub fn len(&self) -> libc::socklen_t {
        self.len
    }

    /// Never empty; present for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Decodes a kernel socket address; `None` for non-inet families.
pub fn decode_addr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in; storage is aligned.
            let sin =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6; storage is aligned.
            let s = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
            let port = u16::from_be(s.sin6_port);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                port,
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `bind(2)`.
pub fn bind(fd: BorrowedFd<'_>, sa: &SocketAddr) -> io::Result<()> {
    let a = RawAddr::new(sa);
    syscall!(libc::SYS_bind, fd.as_raw_fd(), a.as_ptr(), a.len()).map(drop)
}

/// `connect(2)`.
pub fn connect(fd: BorrowedFd<'_>, sa: &SocketAddr) -> io::Result<()> {
    let a = RawAddr::new(sa);
    syscall!(libc::SYS_connect, fd.as_raw_fd(), a.as_ptr(), a.len()).map(drop)
}

/// `listen(2)`.
pub fn listen(fd: BorrowedFd<'_>, backlog: i32) -> io::Result<()> {
    syscall!(libc::SYS_listen, fd.as_raw_fd(), backlog).map(drop)
}

/// `accept4(2)`, returning the peer's address when it is inet.
pub fn accept4(fd: BorrowedFd<'_>, flags: i32) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
    // SAFETY: sockaddr_storage is integers and byte arrays: all-zero is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let r = syscall!(
        libc::SYS_accept4,
        fd.as_raw_fd(),
        &mut st as *mut _,
        &mut len as *mut _,
        flags
    )?;
    Ok((owned(r), decode_addr(&st, len)))
}

/// `getsockname(2)` / `getpeername(2)`.
pub fn sock_addr(fd: BorrowedFd<'_>, peer: bool) -> io::Result<Option<SocketAddr>> {
    // SAFETY: sockaddr_storage is integers and byte arrays: all-zero is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let nr = if peer {
        libc::SYS_getpeername
    } else {
        libc::SYS_getsockname
    };
    syscall!(nr, fd.as_raw_fd(), &mut st as *mut _, &mut len as *mut _)?;
    Ok(decode_addr(&st, len))
}

/// `setsockopt(2)` with raw value bytes.
pub fn setsockopt(fd: BorrowedFd<'_>, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    syscall!(
        libc::SYS_setsockopt,
        fd.as_raw_fd(),
        level,
        name,
        value.as_ptr(),
        value.len() as libc::socklen_t
    )
    .map(drop)
}

/// `getsockopt(2)` into raw bytes; returns the length the kernel reported.
pub fn getsockopt(fd: BorrowedFd<'_>, level: i32, name: i32, out: &mut [u8]) -> io::Result<usize> {
    let mut len = out.len() as libc::socklen_t;
    syscall!(
        libc::SYS_getsockopt,
        fd.as_raw_fd(),
        level,
        name,
        out.as_mut_ptr(),
        &mut len as *mut _
    )?;
    Ok(len as usize)
}

/// An `i32` socket option.
pub fn getsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut v = [0u8; 4];
    getsockopt(fd, level, name, &mut v)?;
    Ok(i32::from_ne_bytes(v))
}

/// `ioctl(fd, FIONREAD)`.
pub fn pending_bytes(fd: BorrowedFd<'_>) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    syscall!(
        libc::SYS_ioctl,
        fd.as_raw_fd(),
        libc::FIONREAD,
        &mut v as *mut libc::c_int
    )?;
    Ok(v)
}

/// `SIOCATMARK` (`<linux/sockios.h>`; the libc crate does not name it).
const SIOCATMARK: libc::c_ulong = 0x8905;

/// `ioctl(fd, SIOCATMARK)`: whether a stream's next byte is its urgent mark.
pub fn at_mark(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut v: libc::c_int = 0;
    syscall!(
        libc::SYS_ioctl,
        fd.as_raw_fd(),
        SIOCATMARK,
        &mut v as *mut libc::c_int
    )?;
    Ok(v != 0)
}

/// Whether this kernel's unix stream sockets carry out-of-band bytes (Linux 5.15 and
/// later, `CONFIG_AF_UNIX_OOB`): the mark that tells a readiness pair's filler from what
/// the program wrote into its fd itself. Tested once per process.
pub fn unix_oob_works() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        let Ok((a, b)) = socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC) else {
            return false;
        };
        use std::os::fd::AsFd;
        send_oob(a.as_fd(), 0).is_ok() && at_mark(b.as_fd()).unwrap_or(false)
    })
}

/// Sends one byte as out-of-band data (`MSG_OOB`), without blocking or SIGPIPE.
pub fn send_oob(fd: BorrowedFd<'_>, byte: u8) -> io::Result<usize> {
    syscall!(
        libc::SYS_sendto,
        fd.as_raw_fd(),
        &byte as *const u8,
        1usize,
        libc::MSG_OOB | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        0,
        0
    )
    .map(|n| n as usize)
}

/// `sendmsg(2)` of one buffer to an optional destination; never raises SIGPIPE.
///
/// # Safety
/// `ptr..ptr+len` must be readable for the duration of the call.
pub unsafe fn send_raw(
    fd: BorrowedFd<'_>,
    ptr: *const u8,
    len: usize,
    to: Option<&SocketAddr>,
    flags: i32,
) -> io::Result<usize> {
    // SAFETY: `ptr..ptr+len` is readable for the call (# Safety), which is what
    // `send_iov` asks of its one buffer.
    unsafe { send_iov(fd, &[(ptr, len)], to, &[], flags) }
}

/// `sendmsg(2)` of several buffers to an optional destination, with optional control
/// messages (`control`, the kernel's layout; empty for none); never raises SIGPIPE.
///
/// # Safety
/// Every `(ptr, len)` in `iov` must be readable for the duration of the call.
pub unsafe fn send_iov(
    fd: BorrowedFd<'_>,
    iov: &[(*const u8, usize)],
    to: Option<&SocketAddr>,
    control: &[u8],
    flags: i32,
) -> io::Result<usize> {
    let dest = to.map(RawAddr::new);
    let vecs: Vec<libc::iovec> = iov
        .iter()
        .map(|(p, l)| libc::iovec {
            iov_base: *p as *mut libc::c_void,
            iov_len: *l,
        })
        .collect();
    // SAFETY: a msghdr is integers and raw pointers: all-zero is a valid, empty header.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = vecs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = vecs.len();
    if let Some(d) = &dest {
        msg.msg_name = d.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = d.len();
    }
    if !control.is_empty() {
        // The kernel copies the control bytes in before reading them: no alignment due.
        msg.msg_control = control.as_ptr() as *mut libc::c_void;
        msg.msg_controllen = control.len();
    }
    syscall!(
        libc::SYS_sendmsg,
        fd.as_raw_fd(),
        &msg as *const libc::msghdr,
        flags | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT
    )
    .map(|n| n as usize)
}

/// What `recv_raw` got.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Bytes placed in the buffers (or the datagram's full length with `MSG_TRUNC`).
    pub len: usize,
    /// The sender, for datagram sockets.
    pub from: Option<SocketAddr>,
    /// `msg_flags` (e.g. `MSG_TRUNC`, `MSG_CTRUNC`).
    pub flags: i32,
    /// Control bytes placed in the caller's control buffer.
    pub control_len: usize,
}

/// `recvmsg(2)` into several buffers, non-blocking; control messages into `control`
/// when given (the kernel's layout).
///
/// # Safety
/// Every `(ptr, len)` in `bufs` must be writable for the duration of the call.
pub unsafe fn recv_raw(
    fd: BorrowedFd<'_>,
    bufs: &[(*mut u8, usize)],
    flags: i32,
    control: Option<&mut [u8]>,
) -> io::Result<Received> {
    let mut iov: [MaybeUninit<libc::iovec>; 8] = [MaybeUninit::uninit(); 8];
    let n = bufs.len().min(8);
    for (slot, (p, l)) in iov.iter_mut().zip(bufs) {
        slot.write(libc::iovec {
            iov_base: (*p).cast(),
            iov_len: *l,
        });
    }
    // SAFETY: sockaddr_storage is integers and byte arrays: all-zero is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    // SAFETY: a msghdr is integers and raw pointers: all-zero is a valid, empty header.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = iov.as_mut_ptr().cast();
    msg.msg_iovlen = n;
    msg.msg_name = (&mut st as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    if let Some(c) = control {
        msg.msg_control = c.as_mut_ptr().cast();
        msg.msg_controllen = c.len();
    }
    let r = syscall!(
        libc::SYS_recvmsg,
        fd.as_raw_fd(),
        &mut msg as *mut libc::msghdr,
        flags | libc::MSG_DONTWAIT
    )?;
    let from = if msg.msg_namelen > 0 {
        decode_addr(&st, msg.msg_namelen)
    } else {
        None
    };
    Ok(Received {
        len: r as usize,
        from,
        flags: msg.msg_flags,
        control_len: if msg.msg_control.is_null() {
            0
        } else {
            msg.msg_controllen
        },
    })
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    syscall!(libc::SYS_gettid).map_or(0, |t| t as u32)
}

/// Pins thread `tid` (0: the calling thread) to CPU `cpu` (`sched_setaffinity`).
pub fn pin_thread(tid: i32, cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is out of range"),
        ));
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so the bit is inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    syscall!(
        libc::SYS_sched_setaffinity,
        tid,
        size_of::<libc::cpu_set_t>(),
        &set as *const libc::cpu_set_t
    )
    .map(drop)
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is an array of integers; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    syscall!(
        libc::SYS_sched_getaffinity,
        0,
        size_of::<libc::cpu_set_t>(),
        &mut set as *mut libc::cpu_set_t
    )?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: every `c` is below CPU_SETSIZE, inside `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// The CPU the calling thread runs on now (-1 if unknown). libc's `sched_getcpu` reads
/// it from the thread's rseq area or the vDSO: no system call (a server asks before
/// every sleep).
pub fn current_cpu() -> i32 {
    // SAFETY: no arguments; returns the CPU or -1.
    unsafe { libc::sched_getcpu() }
}

/// Borrows a raw descriptor for the duration of a call.
///
/// # Safety
/// `fd` must not be -1, and must stay open for as long as the returned value is used.
pub unsafe fn borrow<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // SAFETY: `borrow_raw` asks exactly this function's contract (# Safety): not -1, and
    // open while the borrow lives.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

fn unix_addr(path: &std::path::Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let mut sun = libc::sockaddr_un {
        sun_family: libc::AF_UNIX as libc::sa_family_t,
        sun_path: [0; 108],
    };
    if bytes.len() >= sun.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "unix socket path too long",
        ));
    }
    for (d, s) in sun.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    Ok((sun, len as libc::socklen_t))
}

/// Abstract unix address (`"\0" + name`).
fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let mut sun = libc::sockaddr_un {
        sun_family: libc::AF_UNIX as libc::sa_family_t,
        sun_path: [0; 108],
    };
    if name.len() + 1 > sun.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "abstract name too long",
        ));
    }
    for (d, s) in sun.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    Ok((sun, len as libc::socklen_t))
}

/// Binds a unix socket to a filesystem path.
pub fn bind_unix(fd: BorrowedFd<'_>, path: &std::path::Path) -> io::Result<()> {
    let (sun, len) = unix_addr(path)?;
    syscall!(
        libc::SYS_bind,
        fd.as_raw_fd(),
        &sun as *const libc::sockaddr_un,
        len
    )
    .map(drop)
}

/// Connects a unix socket to a filesystem path.
pub fn connect_unix(fd: BorrowedFd<'_>, path: &std::path::Path) -> io::Result<()> {
    let (sun, len) = unix_addr(path)?;
    syscall!(
        libc::SYS_connect,
        fd.as_raw_fd(),
        &sun as *const libc::sockaddr_un,
        len
    )
    .map(drop)
}

/// Binds a unix socket to an abstract name (no filesystem entry; per network namespace).
pub fn bind_abstract(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (sun, len) = abstract_addr(name)?;
    syscall!(
        libc::SYS_bind,
        fd.as_raw_fd(),
        &sun as *const libc::sockaddr_un,
        len
    )
    .map(drop)
}

/// The abstract name a unix socket is bound to (without the leading NUL); `None` when the
/// socket is not a unix socket or not bound to an abstract name.
pub fn abstract_name(fd: BorrowedFd<'_>, out: &mut [u8; 107]) -> io::Result<Option<usize>> {
    // SAFETY: sockaddr_storage is integers and byte arrays: all-zero is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    syscall!(
        libc::SYS_getsockname,
        fd.as_raw_fd(),
        &mut st as *mut _,
        &mut len as *mut _
    )?;
    if i32::from(st.ss_family) != libc::AF_UNIX {
        return Ok(None);
    }
    let off = std::mem::offset_of!(libc::sockaddr_un, sun_path);
    let len = len as usize;
    if len <= off + 1 {
        return Ok(None);
    }
    // SAFETY: the family says the storage holds a sockaddr_un; storage is aligned for it.
    let sun = unsafe { &*(&st as *const libc::sockaddr_storage).cast::<libc::sockaddr_un>() };
    if sun.sun_path[0] != 0 {
        return Ok(None);
    }
    let n = (len - off - 1).min(out.len());
    for (d, s) in out.iter_mut().zip(&sun.sun_path[1..1 + n]) {
        *d = *s as u8;
    }
    Ok(Some(n))
}

fn sigmask(sigs: &[i32]) -> u64 {
    sigs.iter().fold(0u64, |m, s| m | 1u64 << (s - 1))
}

/// Blocks `sigs` in the calling thread (threads it starts later inherit the mask).
pub fn block_signals(sigs: &[i32]) -> io::Result<()> {
    let set = sigmask(sigs);
    syscall!(
        libc::SYS_rt_sigprocmask,
        libc::SIG_BLOCK,
        &set as *const u64,
        std::ptr::null_mut::<u64>(),
        8
    )
    .map(drop)
}

/// Waits up to `timeout` for one of `sigs` (which must be blocked); `None` on timeout.
pub fn wait_signal(sigs: &[i32], timeout: std::time::Duration) -> io::Result<Option<i32>> {
    let set = sigmask(sigs);
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    match syscall!(
        libc::SYS_rt_sigtimedwait,
        &set as *const u64,
        std::ptr::null_mut::<libc::siginfo_t>(),
        &ts as *const libc::timespec,
        8
    ) {
        Ok(sig) => Ok(Some(sig as i32)),
        Err(e)
            if e.raw_os_error() == Some(libc::EAGAIN) || e.kind() == io::ErrorKind::Interrupted =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The pid of the process at the other end of a unix socket (`SO_PEERCRED`), as seen
/// from the caller's PID namespace.
pub fn peer_pid(fd: BorrowedFd<'_>) -> io::Result<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    syscall!(
        libc::SYS_getsockopt,
        fd.as_raw_fd(),
        libc::SOL_SOCKET,
        libc::SO_PEERCRED,
        &mut cred as *mut libc::ucred,
        &mut len as *mut libc::socklen_t
    )?;
    Ok(cred.pid)
}

/// `prctl(PR_SET_DUMPABLE)`: a process that is not dumpable cannot be ptraced, nor its
/// memory read through `/proc`, by anyone without `CAP_SYS_PTRACE` over it.
pub fn set_dumpable(on: bool) -> io::Result<()> {
    syscall!(
        libc::SYS_prctl,
        libc::PR_SET_DUMPABLE,
        i32::from(on),
        0,
        0,
        0
    )
    .map(drop)
}

/// Drops every capability of the calling thread but those in `keep` (by number, e.g.
/// 5 for `CAP_KILL`) from its effective and permitted sets, and clears its inheritable
/// and ambient sets and the process's bounding set (where allowed: a process without
/// `CAP_SETPCAP` has nothing there to fear). Threads started later inherit the result;
/// threads already running keep theirs.
pub fn drop_capabilities(keep: &[u32]) -> io::Result<()> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
        .min(63);
    for cap in (0..=last).filter(|c| !keep.contains(c)) {
        match syscall!(libc::SYS_prctl, libc::PR_CAPBSET_DROP, cap, 0, 0, 0) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    let _ = syscall!(
        libc::SYS_prctl,
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL,
        0,
        0,
        0
    );
    /// `struct __user_cap_header_struct` and `__user_cap_data_struct` (version 3: two
    /// data words of 32 capabilities each).
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    syscall!(
        libc::SYS_capget,
        &mut header as *mut Header,
        data.as_mut_ptr()
    )?;
    let mask = |word: usize| {
        keep.iter()
            .filter(|&&c| c as usize / 32 == word)
            .fold(0u32, |m, &c| m | 1 << (c % 32))
    };
    for (i, d) in data.iter_mut().enumerate() {
        d.permitted &= mask(i);
        d.effective = d.permitted;
        d.inheritable = 0;
    }
    syscall!(libc::SYS_capset, &header as *const Header, data.as_ptr()).map(drop)
}

/// `SO_NETNS_COOKIE` (Linux 5.14; the libc crate does not name it).
const SO_NETNS_COOKIE: i32 = 71;

/// The cookie of the network namespace a socket was made in (`SO_NETNS_COOKIE`): equal
/// cookies, same namespace. Needs no privilege.
pub fn netns_cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v = [0u8; 8];
    getsockopt(fd, libc::SOL_SOCKET, SO_NETNS_COOKIE, &mut v)?;
    Ok(u64::from_ne_bytes(v))
}

/// 64 random bits from the kernel (`getrandom(2)`).
pub fn random_u64() -> io::Result<u64> {
    let mut v = [0u8; 8];
    let n = syscall!(libc::SYS_getrandom, v.as_mut_ptr(), v.len(), 0)?;
    if n != 8 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok(u64::from_ne_bytes(v))
}

/// Sets a path's permission bits.
pub fn chmod(path: &std::path::Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Sends bytes on a socket without blocking and without ever raising SIGPIPE.
pub fn send_nosignal(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    syscall!(
        libc::SYS_sendto,
        fd.as_raw_fd(),
        buf.as_ptr(),
        buf.len(),
        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        0,
        0
    )
    .map(|n| n as usize)
}

/// `SO_LINGER` {on, 0 s}: closing (or disconnecting) the TCP socket sends a reset.
pub fn linger_reset(fd: BorrowedFd<'_>) -> io::Result<()> {
    let linger = [1i32.to_ne_bytes(), 0i32.to_ne_bytes()].concat();
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &linger)
}

/// `recv(2)` into `buf` with `flags`.
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: i32) -> io::Result<usize> {
    syscall!(
        libc::SYS_recvfrom,
        fd.as_raw_fd(),
        buf.as_mut_ptr(),
        buf.len(),
        flags,
        0,
        0
    )
    .map(|n| n as usize)
}

/// A non-blocking pipe (read end, write end) of `size` bytes (`F_SETPIPE_SZ`; the kernel
/// rounds it up to pages and caps it at `/proc/sys/fs/pipe-max-size` for ordinary users,
/// which is not an error: the pipe keeps its default size then).
pub fn pipe_sized(size: usize) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    syscall!(
        libc::SYS_pipe2,
        fds.as_mut_ptr(),
        libc::O_NONBLOCK | libc::O_CLOEXEC
    )?;
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let _ = syscall!(libc::SYS_fcntl, w.as_raw_fd(), libc::F_SETPIPE_SZ, size);
    Ok((r, w))
}

/// `splice(2)` of up to `len` bytes from `from` to `to` (one of them a pipe), without
/// blocking on the pipe (`SPLICE_F_NONBLOCK`) and moving pages where the kernel can
/// (`SPLICE_F_MOVE`). A socket end blocks or not by its own file's `O_NONBLOCK` only (the
/// flag does not reach it), and a socket written to this way gets no `MSG_NOSIGNAL`: the
/// process must ignore SIGPIPE.
pub fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    syscall!(
        libc::SYS_splice,
        from.as_raw_fd(),
        std::ptr::null_mut::<libc::loff_t>(),
        to.as_raw_fd(),
        std::ptr::null_mut::<libc::loff_t>(),
        len,
        libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE
    )
    .map(|n| n as usize)
}

/// Ignores SIGPIPE in the whole process (a server must see EPIPE, not die).
pub fn ignore_sigpipe() -> io::Result<()> {
    // The kernel's struct sigaction: handler, flags, restorer, mask. SIG_IGN needs no
    // restorer.
    let act: [u64; 4] = [libc::SIG_IGN as u64, 0, 0, 0];
    syscall!(
        libc::SYS_rt_sigaction,
        libc::SIGPIPE,
        act.as_ptr(),
        std::ptr::null_mut::<u64>(),
        8
    )
    .map(drop)
}

/// The soft and hard `RLIMIT_NOFILE` of this process (`prlimit64(2)` on itself).
pub fn nofile_limit() -> io::Result<(u64, u64)> {
    let mut cur = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    syscall!(
        libc::SYS_prlimit64,
        0,
        libc::RLIMIT_NOFILE,
        std::ptr::null::<libc::rlimit64>(),
        &mut cur as *mut libc::rlimit64
    )?;
    Ok((cur.rlim_cur, cur.rlim_max))
}

/// Sets this process's soft `RLIMIT_NOFILE` to `soft` (at most the hard limit, which
/// stays as it is).
pub fn set_nofile_soft(soft: u64) -> io::Result<()> {
    let (_, hard) = nofile_limit()?;
    let new = libc::rlimit64 {
        rlim_cur: soft.min(hard),
        rlim_max: hard,
    };
    syscall!(
        libc::SYS_prlimit64,
        0,
        libc::RLIMIT_NOFILE,
        &new as *const libc::rlimit64,
        std::ptr::null_mut::<libc::rlimit64>()
    )
    .map(drop)
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit: a protocol server
/// holds two descriptors per connection of the sandbox (the host socket and its end of
/// the readiness pair), so the usual soft limit of 1,024 would cap a sandbox at ~500
/// connections. Returns the soft limit before and after. Unprivileged and always
/// allowed; the hard limit is left alone.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let (soft, hard) = nofile_limit()?;
    if soft < hard {
        set_nofile_soft(hard)?;
    }
    Ok((soft, hard.max(soft)))
}

/// Adds `ip/prefix` to interface `ifindex` through a `NETLINK_ROUTE` socket (which may
/// belong to another network namespace). An address that is already there is fine.
pub fn add_address(
    nl: BorrowedFd<'_>,
    ifindex: u32,
    ip: std::net::IpAddr,
    prefix: u8,
) -> io::Result<()> {
    let bytes = match ip {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    };
    // struct ifaddrmsg: family, prefixlen, flags, scope, index
    let mut head = [0u8; 8];
    head[0] = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    } as u8;
    head[1] = prefix;
    head[3] = libc::RT_SCOPE_HOST;
    head[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    tun::netlink_request(
        nl,
        libc::RTM_NEWADDR,
        libc::NLM_F_CREATE | libc::NLM_F_EXCL,
        &head,
        &[(libc::IFA_LOCAL, &bytes), (libc::IFA_ADDRESS, &bytes)],
    )
}

/// Every address of the caller's network namespace, as (interface index, address), from
/// a `RTM_GETADDR` dump over a fresh `NETLINK_ROUTE` socket.
pub fn interface_addresses() -> io::Result<Vec<(u32, std::net::IpAddr)>> {
    let nl = socket(
        libc::AF_NETLINK,
        libc::SOCK_RAW | libc::SOCK_CLOEXEC,
        libc::NETLINK_ROUTE,
    )?;
    let nl = std::os::fd::AsFd::as_fd(&nl);
    // nlmsghdr (16 bytes) + ifaddrmsg (8 bytes, family AF_UNSPEC: both families).
    let mut m = [0u8; 24];
    m[0..4].copy_from_slice(&24u32.to_ne_bytes());
    m[4..6].copy_from_slice(&libc::RTM_GETADDR.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes());
    write(nl, &m)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = read(nl, &mut buf)?;
        let mut at = 0;
        while at + 16 <= n {
            let u32_at =
                |o: usize| u32::from_ne_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
            let u16_at = |o: usize| u16::from_ne_bytes([buf[o], buf[o + 1]]);
            let len = u32_at(at) as usize;
            let kind = u16_at(at + 4);
            if len < 16 || at + len > n {
                return Err(io::Error::other("malformed netlink answer"));
            }
            if kind == libc::NLMSG_DONE as u16 {
                return Ok(out);
            }
            if kind == libc::NLMSG_ERROR as u16 && len >= 20 {
                let e = u32_at(at + 16) as i32;
                return Err(io::Error::from_raw_os_error(-e));
            }
            if kind == libc::RTM_NEWADDR && len >= 24 {
                let family = i32::from(buf[at + 16]);
                let index = u32_at(at + 20);
                // Attributes: IFA_LOCAL is the local end (IFA_ADDRESS is the peer on a
                // point-to-point link); IPv6 sends only IFA_ADDRESS.
                let (mut local, mut address) = (None, None);
                let mut a = at + 24;
                while a + 4 <= at + len {
                    let alen = usize::from(u16_at(a));
                    if alen < 4 || a + alen > at + len {
                        break;
                    }
                    let data = &buf[a + 4..a + alen];
                    let ip = match (family, data.len()) {
                        (libc::AF_INET, 4) => Some(std::net::IpAddr::from(
                            <[u8; 4]>::try_from(data).unwrap_or_default(),
                        )),
                        (libc::AF_INET6, 16) => Some(std::net::IpAddr::from(
                            <[u8; 16]>::try_from(data).unwrap_or_default(),
                        )),
                        _ => None,
                    };
                    match u16_at(a + 2) {
                        libc::IFA_LOCAL => local = ip,
                        libc::IFA_ADDRESS => address = ip,
                        _ => {}
                    }
                    a += (alen + 3) & !3;
                }
                if let Some(ip) = local.or(address) {
                    out.push((index, ip));
                }
            }
            at += (len + 3) & !3;
        }
    }
}

/// `recvfrom(2)` of one datagram (non-blocking): its length and sender.
pub fn recv_from(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<SocketAddr>)> {
    // SAFETY: `buf` is a live, writable buffer of its length.
    let got = unsafe { recv_raw(fd, &[(buf.as_mut_ptr(), buf.len())], 0, None) }?;
    Ok((got.len.min(buf.len()), got.from))
}

/// `sendto(2)` of one datagram (non-blocking, no SIGPIPE).
pub fn send_to(fd: BorrowedFd<'_>, buf: &[u8], to: &SocketAddr) -> io::Result<usize> {
    // SAFETY: `buf` is live and readable for its length.
    unsafe { send_raw(fd, buf.as_ptr(), buf.len(), Some(to), 0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_dump_lists_loopback() {
        let all = interface_addresses().unwrap();
        let lo = all
            .iter()
            .find(|(_, ip)| *ip == std::net::IpAddr::from([127, 0, 0, 1]))
            .expect("127.0.0.1 is listed");
        assert!(lo.0 > 0, "with its interface index: {all:?}");
        // Each address once per interface (IFA_LOCAL preferred, not both attributes).
        let mut seen = all.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), all.len(), "{all:?}");
    }

    #[test]
    fn nofile_soft_limit_goes_up_to_the_hard_one() {
        // Run in a child: the limit is process-wide and other tests share the process.
        // SAFETY: the child only makes async-signal-safe system calls, then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let ok = (|| {
                let (_, hard) = nofile_limit().ok()?;
                let low = hard.min(256);
                set_nofile_soft(low).ok()?;
                let (before, after) = raise_nofile_limit().ok()?;
                let now = nofile_limit().ok()?;
                (before == low && after == hard && now == (hard, hard)).then_some(())
            })();
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(if ok.is_some() { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; status is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
