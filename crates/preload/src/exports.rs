//! The C entry points of the socket API. Each one asks [`lookup`] whether the descriptor
//! is a ferry socket; if not (or the shim is inert) it calls libc's own function and
//! returns, so other descriptors pay one table lookup. Ferry sockets go through
//! [`boundary`], the one place where `Result<_, Errno>` becomes `errno` and `-1`, and
//! where a panic is caught (it must not unwind into C) and becomes `EIO`.

use std::ffi::{c_int, c_long, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use ferry_proto::cmsg;
use libc::{mmsghdr, msghdr, off_t, size_t, sockaddr, socklen_t, ssize_t, timespec};

use crate::addr::write_sockaddr;
use crate::errno::{Errno, Res, errno, set_errno};
use crate::fdtable::{Entry, Sock, TABLE};
use crate::ident::{forget_received, lookup};
use crate::iov::IoCursor;
use crate::log::{self, Once};
use crate::{config, data, ops, real};

/// A C return type with an error value.
pub trait CRet: Copy {
    /// The failure return (`-1`).
    const ERR: Self;
}

impl CRet for c_int {
    const ERR: c_int = -1;
}

impl CRet for ssize_t {
    const ERR: ssize_t = -1;
}

/// Runs a ferry call: `Err(e)` sets `errno = e` and returns `-1`; success leaves `errno`
/// as the program had it; a panic is caught, logged once, and becomes `EIO`.
pub fn boundary<T: CRet>(f: impl FnOnce() -> Res<T>) -> T {
    let saved = errno();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => {
            set_errno(saved);
            v
        }
        Ok(Err(e)) => {
            set_errno(e.down_as(libc::ECONNRESET).0);
            T::ERR
        }
        Err(_) => {
            log::once(
                Once::Panic,
                format_args!("internal error (panic) in the shim; the call fails with EIO"),
            );
            set_errno(libc::EIO);
            T::ERR
        }
    }
}

/// Marks a descriptor libc just created (not a ferry socket) so later calls skip the
/// identification.
fn created_other(fd: c_int) {
    if fd >= 0 && config::active() {
        TABLE.set(fd, Entry::Other);
    }
}

/// # Safety
/// C contract of `socket(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if !config::active() || !ops::relayed(domain, ty, protocol) {
        // SAFETY: the caller's arguments, forwarded to libc.
        let fd = unsafe { real::socket(domain, ty, protocol) };
        created_other(fd);
        return fd;
    }
    boundary(|| ops::socket(domain, ty, protocol))
}

/// # Safety
/// C contract of `connect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::connect(fd, addr, len) };
    };
    // SAFETY: the caller's address, as `connect(2)` requires.
    boundary(|| unsafe { ops::connect(s, addr, len) }.map(|()| 0))
}

/// # Safety
/// C contract of `bind(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::bind(fd, addr, len) };
    };
    // SAFETY: the caller's address, as `bind(2)` requires.
    boundary(|| unsafe { ops::bind(s, addr, len) }.map(|()| 0))
}

/// # Safety
/// C contract of `listen(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::listen(fd, backlog) };
    };
    boundary(|| ops::listen(s, backlog).map(|()| 0))
}

/// # Safety
/// C contract of `accept(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: same contract.
    unsafe { accept4(fd, addr, len, 0) }
}

/// # Safety
/// C contract of `accept4(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        let r = unsafe { real::accept4(fd, addr, len, flags) };
        created_other(r);
        return r;
    };
    ops::flush();
    // SAFETY: the caller's address buffer, as `accept4(2)` requires.
    boundary(|| unsafe { ops::accept(s, addr, len, flags) })
}

/// A one-buffer cursor.
///
/// # Safety
/// `buf` valid for `n` bytes (direction as used); `iov` outlives the cursor.
unsafe fn one(iov: &libc::iovec) -> Res<IoCursor> {
    // SAFETY: one iovec the caller vouches for.
    unsafe { IoCursor::new(iov, 1) }
}

/// # Safety
/// `buf` readable for `n` bytes; `addr` as for `sendto(2)`.
unsafe fn send_one(
    s: Sock,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    let iov = libc::iovec {
        iov_base: buf.cast_mut(),
        iov_len: n,
    };
    boundary(|| {
        // SAFETY: the caller's buffer and address.
        let mut cur = unsafe { one(&iov) }?;
        // SAFETY: as above.
        unsafe { data::send(s, &mut cur, addr, alen, flags, &[]) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// `buf` writable for `n` bytes; `addr`/`alen` as for `recvfrom(2)`.
pub(crate) unsafe fn recv_one(
    s: Sock,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    let iov = libc::iovec {
        iov_base: buf,
        iov_len: n,
    };
    boundary(|| {
        // SAFETY: the caller's buffer.
        let mut cur = unsafe { one(&iov) }?;
        // SAFETY: as above.
        let got = unsafe { data::recv(s, &mut cur, flags) }?;
        if !addr.is_null() {
            // SAFETY: the caller's address buffer.
            unsafe { write_sockaddr(got.from(), addr, alen) }?;
        }
        Ok(got.len as ssize_t)
    })
}

/// # Safety
/// C contract of `send(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::send(fd, buf, n, flags) };
    };
    // SAFETY: the caller's buffer.
    unsafe { send_one(s, buf, n, flags, std::ptr::null(), 0) }
}

/// # Safety
/// C contract of `sendto(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::sendto(fd, buf, n, flags, addr, alen) };
    };
    // SAFETY: the caller's buffer and address.
    unsafe { send_one(s, buf, n, flags, addr, alen) }
}

/// # Safety
/// `m` a valid message header.
unsafe fn send_msg(s: Sock, m: &msghdr, flags: c_int) -> Res<usize> {
    let control: &[u8] = if m.msg_control.is_null() || m.msg_controllen == 0 {
        &[]
    } else {
        // SAFETY: the header's control buffer (caller); more than a message may carry
        // is refused unread past that.
        unsafe {
            std::slice::from_raw_parts(
                m.msg_control.cast::<u8>(),
                m.msg_controllen.min(cmsg::MAX_CONTROL + 1),
            )
        }
    };
    // SAFETY: the header's iovecs (caller).
    let mut cur = unsafe { IoCursor::new(m.msg_iov, m.msg_iovlen) }?;
    // SAFETY: as above.
    unsafe {
        data::send(
            s,
            &mut cur,
            m.msg_name.cast(),
            m.msg_namelen,
            flags,
            control,
        )
    }
}

/// # Safety
/// `m` a valid message header.
unsafe fn recv_msg(s: Sock, m: &mut msghdr, flags: c_int) -> Res<usize> {
    // SAFETY: the header's iovecs (caller).
    let mut cur = unsafe { IoCursor::new(m.msg_iov, m.msg_iovlen) }?;
    // SAFETY: as above.
    let got = unsafe { data::recv(s, &mut cur, flags) }?;
    if !m.msg_name.is_null() {
        let mut l = m.msg_namelen;
        // SAFETY: the header's name buffer (caller).
        unsafe { write_sockaddr(got.from(), m.msg_name.cast(), &mut l) }?;
        m.msg_namelen = l;
    }
    m.msg_flags = got.flags;
    let room = if m.msg_control.is_null() {
        0
    } else {
        m.msg_controllen
    };
    if got.control_len == 0 || room == 0 {
        if got.control_len > 0 {
            m.msg_flags |= libc::MSG_CTRUNC;
        }
        m.msg_controllen = 0;
    } else {
        // SAFETY: the header's control buffer (caller), writable for its length.
        let out = unsafe { std::slice::from_raw_parts_mut(m.msg_control.cast::<u8>(), room) };
        let placed = cmsg::put(got.control(), out);
        m.msg_controllen = placed.used;
        if placed.truncated {
            m.msg_flags |= libc::MSG_CTRUNC;
        }
    }
    Ok(got.len)
}

/// # Safety
/// C contract of `sendmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::sendmsg(fd, msg, flags) };
    };
    boundary(|| {
        // SAFETY: the caller's header.
        let m = unsafe { msg.as_ref() }.ok_or(Errno::EFAULT)?;
        // SAFETY: as above.
        unsafe { send_msg(s, m, flags) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// C contract of `sendmmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::sendmmsg(fd, msgs, vlen, flags) };
    };
    boundary(|| {
        if msgs.is_null() && vlen > 0 {
            return Err(Errno::EFAULT);
        }
        let mut i = 0;
        while i < vlen.min(1024) as usize {
            // SAFETY: `i < vlen` entries of the caller's array.
            let mm = unsafe { &mut *msgs.add(i) };
            // SAFETY: the caller's header.
            match unsafe { send_msg(s, &mm.msg_hdr, flags) } {
                Ok(n) => mm.msg_len = n as c_uint,
                Err(_) if i > 0 => break,
                Err(e) => return Err(e),
            }
            i += 1;
        }
        Ok(i as c_int)
    })
}

/// # Safety
/// C contract of `recv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::recv(fd, buf, n, flags) };
    };
    // SAFETY: the caller's buffer.
    unsafe { recv_one(s, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// # Safety
/// C contract of `recvfrom(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::recvfrom(fd, buf, n, flags, addr, alen) };
    };
    // SAFETY: the caller's buffers.
    unsafe { recv_one(s, buf, n, flags, addr, alen) }
}

/// # Safety
/// C contract of `recvmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        let r = unsafe { real::recvmsg(fd, msg, flags) };
        if r >= 0 && config::active() {
            // SAFETY: the kernel just filled `msg`.
            unsafe { forget_received(msg) };
        }
        return r;
    };
    boundary(|| {
        // SAFETY: the caller's header.
        let m = unsafe { msg.as_mut() }.ok_or(Errno::EFAULT)?;
        // SAFETY: as above.
        unsafe { recv_msg(s, m, flags) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// C contract of `recvmmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        let r = unsafe { real::recvmmsg(fd, msgs, vlen, flags, timeout) };
        if r > 0 && config::active() {
            for i in 0..r as usize {
                // SAFETY: the kernel filled the first `r` entries.
                unsafe { forget_received(&(*msgs.add(i)).msg_hdr) };
            }
        }
        return r;
    };
    boundary(|| {
        if msgs.is_null() && vlen > 0 {
            return Err(Errno::EFAULT);
        }
        // SAFETY: null or the caller's timespec.
        let limit = unsafe { timeout.as_ref() }.map(|t| {
            Duration::new(
                t.tv_sec.max(0) as u64,
                t.tv_nsec.clamp(0, 999_999_999) as u32,
            )
        });
        let start = Instant::now();
        let mut i = 0;
        while i < vlen.min(1024) as usize {
            let fl = if i > 0 && flags & libc::MSG_WAITFORONE != 0 {
                flags | libc::MSG_DONTWAIT
            } else {
                flags
            };
            // SAFETY: `i < vlen` entries of the caller's array.
            let mm = unsafe { &mut *msgs.add(i) };
            // SAFETY: the caller's header.
            match unsafe { recv_msg(s, &mut mm.msg_hdr, fl & !libc::MSG_WAITFORONE) } {
                Ok(n) => mm.msg_len = n as c_uint,
                Err(_) if i > 0 => break,
                Err(e) => return Err(e),
            }
            i += 1;
            if limit.is_some_and(|l| start.elapsed() >= l) {
                break;
            }
        }
        Ok(i as c_int)
    })
}

/// # Safety
/// C contract of `shutdown(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::shutdown(fd, how) };
    };
    boundary(|| ops::shutdown(s, how).map(|()| 0))
}

/// # Safety
/// C contract of `setsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::setsockopt(fd, level, name, val, len) };
    };
    // SAFETY: the caller's value buffer.
    boundary(|| unsafe { ops::setsockopt(s, level, name, val, len) }.map(|()| 0))
}

/// # Safety
/// C contract of `getsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::getsockopt(fd, level, name, val, len) };
    };
    // SAFETY: the caller's value buffer and length.
    boundary(|| unsafe { ops::getsockopt(s, level, name, val, len) }.map(|()| 0))
}

/// # Safety
/// C contract of `getsockname(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::getsockname(fd, addr, len) };
    };
    // SAFETY: the caller's address buffer and length.
    boundary(|| unsafe { ops::name(s, false, addr, len) }.map(|()| 0))
}

/// # Safety
/// C contract of `getpeername(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::getpeername(fd, addr, len) };
    };
    // SAFETY: the caller's address buffer and length.
    boundary(|| unsafe { ops::name(s, true, addr, len) }.map(|()| 0))
}

/// # Safety
/// C contract of `sendfile(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    let Some(s) = lookup(out) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::sendfile(out, inp, off, n) };
    };
    // SAFETY: the caller's offset pointer.
    boundary(|| unsafe { data::sendfile(s, inp, off, n) }.map(|n| n as ssize_t))
}

/// # Safety
/// C contract of `sendfile64` (the same function on 64-bit systems).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    let Some(s) = lookup(out) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::sendfile64(out, inp, off, n) };
    };
    // SAFETY: the caller's offset pointer.
    boundary(|| unsafe { data::sendfile(s, inp, off, n) }.map(|n| n as ssize_t))
}

/// `splice` with a ferry socket at one end (the other must be a pipe or, on the input
/// side, a file).
///
/// # Safety
/// C contract of `splice(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    match (lookup(fd_in), lookup(fd_out)) {
        (None, None) => {
            // SAFETY: forwarded to libc.
            unsafe { real::splice(fd_in, off_in, fd_out, off_out, len, flags) }
        }
        (Some(_), Some(_)) => boundary(|| Err(Errno::EINVAL)),
        (None, Some(s)) => boundary(|| {
            if !off_out.is_null() {
                return Err(Errno(libc::ESPIPE));
            }
            // SAFETY: the caller's input offset.
            unsafe { data::splice_in(s, fd_in, off_in, len, flags) }.map(|n| n as ssize_t)
        }),
        (Some(s), None) => boundary(|| {
            if !off_in.is_null() {
                return Err(Errno(libc::ESPIPE));
            }
            // SAFETY: the caller's output offset.
            unsafe { data::splice_out(s, fd_out, off_out, len, flags) }.map(|n| n as ssize_t)
        }),
    }
}

/// # Safety
/// C contract of glibc's fortified `recv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    match lookup(fd) {
        // SAFETY: the caller's buffer, length checked against its size.
        Some(s) if n <= buflen => unsafe {
            recv_one(s, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut())
        },
        // SAFETY: forwarded to libc (which also reports the overflow).
        _ => unsafe { real::__recv_chk(fd, buf, n, buflen, flags) },
    }
}

/// # Safety
/// C contract of glibc's fortified `recvfrom`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    match lookup(fd) {
        // SAFETY: the caller's buffers, length checked against the buffer's size.
        Some(s) if n <= buflen => unsafe { recv_one(s, buf, n, flags, addr, alen) },
        // SAFETY: forwarded to libc (which also reports the overflow).
        _ => unsafe { real::__recvfrom_chk(fd, buf, n, buflen, flags, addr, alen) },
    }
}

/// `syscall` (variadic in C; see [`real::syscall`]). The socket data calls made through
/// it on a ferry socket go where the function of the same name would: libuv before 1.45
/// (Debian 12's, which dig and other bind9 tools use) sends and receives datagrams with
/// `syscall(SYS_sendmmsg, …)` and `syscall(SYS_recvmmsg, …)`, which would otherwise
/// write into the readiness pair and lose every datagram. Everything else goes to libc.
///
/// # Safety
/// C contract of `syscall(2)` for `n`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    let data_call = matches!(
        n,
        libc::SYS_sendmmsg
            | libc::SYS_recvmmsg
            | libc::SYS_sendmsg
            | libc::SYS_recvmsg
            | libc::SYS_sendto
            | libc::SYS_recvfrom
    );
    if !data_call || lookup(a as c_int).is_none() {
        // SAFETY: forwarded (caller).
        return unsafe { real::syscall(n, a, b, c, d, e, f) };
    }
    let fd = a as c_int;
    // SAFETY: each arm hands the caller's arguments, as the system call of that number
    // takes them, to the function of the same name (the caller's contract is theirs).
    unsafe {
        match n {
            libc::SYS_sendmmsg => c_long::from(sendmmsg(fd, b as _, c as c_uint, d as c_int)),
            libc::SYS_recvmmsg => {
                c_long::from(recvmmsg(fd, b as _, c as c_uint, d as c_int, e as _))
            }
            libc::SYS_sendmsg => sendmsg(fd, b as _, c as c_int) as c_long,
            libc::SYS_recvmsg => recvmsg(fd, b as _, c as c_int) as c_long,
            libc::SYS_sendto => {
                sendto(fd, b as _, c as size_t, d as c_int, e as _, f as socklen_t) as c_long
            }
            _ => recvfrom(fd, b as _, c as size_t, d as c_int, e as _, f as _) as c_long,
        }
    }
}
