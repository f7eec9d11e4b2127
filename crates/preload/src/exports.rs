//! The C entry points of the socket API. Each one asks [`lookup`] whether the descriptor
//! is a ferry socket; if not (or the shim is inert) it calls libc's own function and
//! returns, so other descriptors pay one table lookup. Ferry sockets go through
//! [`boundary`], the one place where `Result<_, Errno>` becomes `errno` and `-1`, and
//! where a panic is caught (it must not unwind into C) and becomes `EIO`.
//!
//! **Contracts.** Each export is `unsafe extern "C"` and its `# Safety` section is what
//! its caller, a C program, must guarantee: the contract of the libc function of the
//! same name, pointer by pointer. One thing is stricter than the kernel's: where the
//! kernel answers `EFAULT` for memory it cannot read or write, the shim (which copies
//! a ferry socket's addresses, buffers and headers itself) may touch it directly, so
//! every pointer must be valid for what the function does with it, or null where the
//! function allows null (the shim answers `EFAULT` for a null it cannot use). The
//! unsafe blocks below rest on those sections; on a descriptor that is not a ferry
//! socket every export hands libc the caller's arguments unchanged, so the caller's
//! contract is exactly what libc's function asks.

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
/// None beyond `socket(2)`'s: the arguments are integers (unsafe as every function the
/// shim replaces is).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if !config::active() || !ops::relayed(domain, ty, protocol) {
        // SAFETY: integers only, passed to libc's `socket` unchanged.
        let fd = unsafe { real::socket(domain, ty, protocol) };
        created_other(fd);
        return fd;
    }
    boundary(|| ops::socket(domain, ty, protocol))
}

/// # Safety
/// As for `connect(2)`: `addr` must be null (an error) or readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `addr` readable for `len` bytes (# Safety), passed on unchanged.
        return unsafe { real::connect(fd, addr, len) };
    };
    // SAFETY: `addr` readable for `len` bytes (# Safety) is what `ops::connect` asks.
    boundary(|| unsafe { ops::connect(s, addr, len) }.map(|()| 0))
}

/// # Safety
/// As for `bind(2)`: `addr` must be null (an error) or readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `addr` readable for `len` bytes (# Safety), passed on unchanged.
        return unsafe { real::bind(fd, addr, len) };
    };
    // SAFETY: `addr` readable for `len` bytes (# Safety) is what `ops::bind` asks.
    boundary(|| unsafe { ops::bind(s, addr, len) }.map(|()| 0))
}

/// # Safety
/// None beyond `listen(2)`'s: the arguments are integers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: integers only, passed to libc's `listen` unchanged.
        return unsafe { real::listen(fd, backlog) };
    };
    boundary(|| ops::listen(s, backlog).map(|()| 0))
}

/// # Safety
/// As for `accept(2)`: `len` must be null or point at a readable and writable
/// `socklen_t`, and `addr` be null or writable for `*len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: `accept4` with no flags asks exactly this function's contract (# Safety).
    unsafe { accept4(fd, addr, len, 0) }
}

/// # Safety
/// As for `accept4(2)`: `len` must be null or point at a readable and writable
/// `socklen_t`, and `addr` be null or writable for `*len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `addr`/`len` as `accept4(2)` needs them (# Safety), passed on unchanged.
        let r = unsafe { real::accept4(fd, addr, len, flags) };
        created_other(r);
        return r;
    };
    ops::flush();
    // SAFETY: `addr`/`len` valid as `ops::accept` asks (this function's # Safety).
    boundary(|| unsafe { ops::accept(s, addr, len, flags) })
}

/// A one-buffer cursor.
///
/// # Safety
/// `iov`'s buffer must be valid for `iov_len` bytes (readable for a send, writable for a
/// receive) while the cursor is used; `iov` must outlive the cursor.
unsafe fn one(iov: &libc::iovec) -> Res<IoCursor> {
    // SAFETY: `iov` is one readable iovec (a reference), and its buffer's validity and
    // lifetime are this function's own contract, which is `IoCursor::new`'s for n = 1.
    unsafe { IoCursor::new(iov, 1) }
}

/// # Safety
/// `buf` readable for `n` bytes; `addr` null or readable for `alen` bytes.
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
        // SAFETY: `iov` describes `buf`, readable for `n` bytes (# Safety), and lives on
        // this frame past the cursor's last use.
        let mut cur = unsafe { one(&iov) }?;
        // SAFETY: the cursor's buffer is readable (above); `addr` is null or readable
        // for `alen` bytes (# Safety).
        unsafe { data::send(s, &mut cur, addr, alen, flags, &[]) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// `buf` writable for `n` bytes; `alen` null or a readable and writable `socklen_t`,
/// and `addr` null or writable for `*alen` bytes.
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
        // SAFETY: `iov` describes `buf`, writable for `n` bytes (# Safety), and lives on
        // this frame past the cursor's last use.
        let mut cur = unsafe { one(&iov) }?;
        // SAFETY: the cursor's buffer is writable (above).
        let got = unsafe { data::recv(s, &mut cur, flags) }?;
        if !addr.is_null() {
            // SAFETY: `alen` null (refused with EFAULT) or valid, and `addr` writable for
            // `*alen` bytes (# Safety), as `write_sockaddr` asks.
            unsafe { write_sockaddr(got.from(), addr, alen) }?;
        }
        Ok(got.len as ssize_t)
    })
}

/// # Safety
/// As for `send(2)`: `buf` must be readable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: `buf` readable for `n` bytes (# Safety), passed on unchanged.
        return unsafe { real::send(fd, buf, n, flags) };
    };
    // SAFETY: `buf` readable for `n` bytes (# Safety); no address.
    unsafe { send_one(s, buf, n, flags, std::ptr::null(), 0) }
}

/// # Safety
/// As for `sendto(2)`: `buf` must be readable for `n` bytes and `addr` null or readable
/// for `alen` bytes.
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
        // SAFETY: `buf` and `addr` valid for their lengths (# Safety), passed on unchanged.
        return unsafe { real::sendto(fd, buf, n, flags, addr, alen) };
    };
    // SAFETY: `buf` and `addr` valid for their lengths (# Safety), as `send_one` asks.
    unsafe { send_one(s, buf, n, flags, addr, alen) }
}

/// # Safety
/// `m` must be a message header as `sendmsg(2)` takes it: `msg_iov` valid for
/// `msg_iovlen` entries, each buffer readable for its `iov_len` bytes; `msg_name` null
/// or readable for `msg_namelen` bytes; `msg_control` null or readable for
/// `msg_controllen` bytes.
unsafe fn send_msg(s: Sock, m: &msghdr, flags: c_int) -> Res<usize> {
    let control: &[u8] = if m.msg_control.is_null() || m.msg_controllen == 0 {
        &[]
    } else {
        // SAFETY: `msg_control` is readable for `msg_controllen` bytes (# Safety), and
        // the slice is no longer than that; it is capped one past what a message may
        // carry, so a longer buffer is refused without being read further. Only read
        // during this call.
        unsafe {
            std::slice::from_raw_parts(
                m.msg_control.cast::<u8>(),
                m.msg_controllen.min(cmsg::MAX_CONTROL + 1),
            )
        }
    };
    // SAFETY: `msg_iov` valid for `msg_iovlen` entries of readable buffers (# Safety),
    // alive for this call, which the cursor does not outlive.
    let mut cur = unsafe { IoCursor::new(m.msg_iov, m.msg_iovlen) }?;
    // SAFETY: the cursor's buffers are readable (above); `msg_name` is null or readable
    // for `msg_namelen` bytes (# Safety).
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
/// `m` must be a message header as `recvmsg(2)` takes it: `msg_iov` valid for
/// `msg_iovlen` entries, each buffer writable for its `iov_len` bytes; `msg_name` null
/// or writable for `msg_namelen` bytes; `msg_control` null or writable for
/// `msg_controllen` bytes.
unsafe fn recv_msg(s: Sock, m: &mut msghdr, flags: c_int) -> Res<usize> {
    // SAFETY: `msg_iov` valid for `msg_iovlen` entries of writable buffers (# Safety),
    // alive for this call, which the cursor does not outlive.
    let mut cur = unsafe { IoCursor::new(m.msg_iov, m.msg_iovlen) }?;
    // SAFETY: the cursor's buffers are writable (above).
    let got = unsafe { data::recv(s, &mut cur, flags) }?;
    if !m.msg_name.is_null() {
        let mut l = m.msg_namelen;
        // SAFETY: `msg_name` is writable for `msg_namelen` bytes (# Safety), the room
        // `l` (a local) gives `write_sockaddr`.
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
        // SAFETY: `msg_control` is non-null here and writable for `room` =
        // `msg_controllen` bytes (# Safety); the program's buffer cannot overlap the
        // shim's `got`, and the slice is dropped before this call returns.
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
/// As for `sendmsg(2)`: `msg` null (`EFAULT`) or a readable header whose `msg_iov` is
/// valid for `msg_iovlen` entries, each buffer readable for its `iov_len` bytes, and
/// whose `msg_name` and `msg_control` are null or readable for their lengths.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: `msg` as `sendmsg(2)` needs it (# Safety), passed on unchanged.
        return unsafe { real::sendmsg(fd, msg, flags) };
    };
    boundary(|| {
        // SAFETY: `msg` is null (refused) or a readable header (# Safety), not written
        // by anyone during the call.
        let m = unsafe { msg.as_ref() }.ok_or(Errno::EFAULT)?;
        // SAFETY: the header's buffers are what `send_msg` asks (# Safety).
        unsafe { send_msg(s, m, flags) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// As for `sendmmsg(2)`: `msgs` must be null (`EFAULT` unless `vlen` is 0) or valid
/// (readable, and `msg_len` writable) for `vlen` entries, each header as [`sendmsg`] asks (the shim
/// uses at most the first 1024).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `msgs` as `sendmmsg(2)` needs it (# Safety), passed on unchanged.
        return unsafe { real::sendmmsg(fd, msgs, vlen, flags) };
    };
    boundary(|| {
        if msgs.is_null() && vlen > 0 {
            return Err(Errno::EFAULT);
        }
        let mut i = 0;
        while i < vlen.min(1024) as usize {
            // SAFETY: `msgs` is non-null here (checked above) and valid for `vlen`
            // entries (# Safety); `i < vlen`; no other reference to the entry is live.
            let mm = unsafe { &mut *msgs.add(i) };
            // SAFETY: each entry's header is as `send_msg` asks (# Safety).
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
/// As for `recv(2)`: `buf` must be writable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: `buf` writable for `n` bytes (# Safety), passed on unchanged.
        return unsafe { real::recv(fd, buf, n, flags) };
    };
    // SAFETY: `buf` writable for `n` bytes (# Safety); no address is asked for.
    unsafe { recv_one(s, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// # Safety
/// As for `recvfrom(2)`: `buf` must be writable for `n` bytes, `alen` null or point at
/// a readable and writable `socklen_t`, and `addr` null or writable for `*alen` bytes.
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
        // SAFETY: `buf`, `addr` and `alen` as `recvfrom(2)` needs them (# Safety),
        // passed on unchanged.
        return unsafe { real::recvfrom(fd, buf, n, flags, addr, alen) };
    };
    // SAFETY: `buf`, `addr` and `alen` are what `recv_one` asks (# Safety).
    unsafe { recv_one(s, buf, n, flags, addr, alen) }
}

/// # Safety
/// As for `recvmsg(2)`: `msg` null (`EFAULT`) or a readable and writable header whose
/// `msg_iov` is valid for `msg_iovlen` entries, each buffer writable for its `iov_len`
/// bytes, and whose `msg_name` and `msg_control` are null or writable for their lengths.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: `msg` as `recvmsg(2)` needs it (# Safety), passed on unchanged.
        let r = unsafe { real::recvmsg(fd, msg, flags) };
        if r >= 0 && config::active() {
            // SAFETY: the call succeeded, so `msg` is a valid header whose control
            // length the kernel just set within its buffer, as `forget_received` asks.
            unsafe { forget_received(msg) };
        }
        return r;
    };
    boundary(|| {
        // SAFETY: `msg` is null (refused) or a readable, writable header (# Safety) that
        // nothing else touches during the call.
        let m = unsafe { msg.as_mut() }.ok_or(Errno::EFAULT)?;
        // SAFETY: the header's buffers are what `recv_msg` asks (# Safety).
        unsafe { recv_msg(s, m, flags) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// As for `recvmmsg(2)`: `msgs` must be null (`EFAULT` unless `vlen` is 0) or valid
/// (readable and writable) for `vlen` entries, each header as [`recvmsg`] asks (the shim uses at most
/// the first 1024); `timeout` null or a readable `timespec`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `msgs` and `timeout` as `recvmmsg(2)` needs them (# Safety), passed on
        // unchanged.
        let r = unsafe { real::recvmmsg(fd, msgs, vlen, flags, timeout) };
        if r > 0 && config::active() {
            for i in 0..r as usize {
                // SAFETY: `r <= vlen`, so entry `i` is one of the caller's valid headers
                // (# Safety), and one the kernel just filled, as `forget_received` asks.
                unsafe { forget_received(&(*msgs.add(i)).msg_hdr) };
            }
        }
        return r;
    };
    boundary(|| {
        if msgs.is_null() && vlen > 0 {
            return Err(Errno::EFAULT);
        }
        // SAFETY: `timeout` is null or a readable timespec (# Safety), copied at once.
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
            // SAFETY: `msgs` is non-null here (checked above) and valid for `vlen`
            // entries (# Safety); `i < vlen`; no other reference to the entry is live.
            let mm = unsafe { &mut *msgs.add(i) };
            // SAFETY: each entry's header is as `recv_msg` asks (# Safety).
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
/// None beyond `shutdown(2)`'s: the arguments are integers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: integers only, passed to libc's `shutdown` unchanged.
        return unsafe { real::shutdown(fd, how) };
    };
    boundary(|| ops::shutdown(s, how).map(|()| 0))
}

/// # Safety
/// As for `setsockopt(2)`: `val` must be null (`EFAULT` unless `len` is 0) or readable
/// for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `val` readable for `len` bytes (# Safety), passed on unchanged.
        return unsafe { real::setsockopt(fd, level, name, val, len) };
    };
    // SAFETY: `val` readable for `len` bytes (# Safety) is what `ops::setsockopt` asks.
    boundary(|| unsafe { ops::setsockopt(s, level, name, val, len) }.map(|()| 0))
}

/// # Safety
/// As for `getsockopt(2)`: `len` must be null (`EFAULT`) or point at a readable and
/// writable `socklen_t`, and `val` be null (`EFAULT` unless `*len` is 0) or writable for
/// `*len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `val` and `len` as `getsockopt(2)` needs them (# Safety), passed on
        // unchanged.
        return unsafe { real::getsockopt(fd, level, name, val, len) };
    };
    // SAFETY: `val` and `len` (# Safety) are what `ops::getsockopt` asks.
    boundary(|| unsafe { ops::getsockopt(s, level, name, val, len) }.map(|()| 0))
}

/// # Safety
/// As for `getsockname(2)`: `len` must be null (`EFAULT`) or point at a readable and
/// writable `socklen_t`, and `addr` be null or writable for `*len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `addr` and `len` as `getsockname(2)` needs them (# Safety), passed on
        // unchanged.
        return unsafe { real::getsockname(fd, addr, len) };
    };
    // SAFETY: `addr` and `len` (# Safety) are what `ops::name` asks.
    boundary(|| unsafe { ops::name(s, false, addr, len) }.map(|()| 0))
}

/// # Safety
/// As for `getpeername(2)`: `len` must be null (`EFAULT`) or point at a readable and
/// writable `socklen_t`, and `addr` be null or writable for `*len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let Some(s) = lookup(fd) else {
        // SAFETY: `addr` and `len` as `getpeername(2)` needs them (# Safety), passed on
        // unchanged.
        return unsafe { real::getpeername(fd, addr, len) };
    };
    // SAFETY: `addr` and `len` (# Safety) are what `ops::name` asks.
    boundary(|| unsafe { ops::name(s, true, addr, len) }.map(|()| 0))
}

/// # Safety
/// As for `sendfile(2)`: `off` must be null or point at a readable and writable
/// `off_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    let Some(s) = lookup(out) else {
        // SAFETY: `off` null or valid (# Safety), passed on unchanged.
        return unsafe { real::sendfile(out, inp, off, n) };
    };
    // SAFETY: `off` null or a readable, writable off_t (# Safety), as `data::sendfile`
    // asks.
    boundary(|| unsafe { data::sendfile(s, inp, off, n) }.map(|n| n as ssize_t))
}

/// # Safety
/// As for `sendfile64` (the same function on 64-bit systems): `off` must be null or point at a readable and writable
/// `off_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    let Some(s) = lookup(out) else {
        // SAFETY: `off` null or valid (# Safety), passed on unchanged.
        return unsafe { real::sendfile64(out, inp, off, n) };
    };
    // SAFETY: `off` null or a readable, writable off_t (# Safety), as `data::sendfile`
    // asks.
    boundary(|| unsafe { data::sendfile(s, inp, off, n) }.map(|n| n as ssize_t))
}

/// `splice` with a ferry socket at one end (the other must be a pipe or, on the input
/// side, a file).
///
/// # Safety
/// As for `splice(2)`: `off_in` and `off_out` must each be null or point at a readable
/// and writable `loff_t`.
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
            // SAFETY: the offsets are null or valid (# Safety), passed on unchanged.
            unsafe { real::splice(fd_in, off_in, fd_out, off_out, len, flags) }
        }
        (Some(_), Some(_)) => boundary(|| Err(Errno::EINVAL)),
        (None, Some(s)) => boundary(|| {
            if !off_out.is_null() {
                return Err(Errno(libc::ESPIPE));
            }
            // SAFETY: `off_in` null or a readable, writable loff_t (# Safety), which
            // is what `splice_in` asks of its offset.
            unsafe { data::splice_in(s, fd_in, off_in, len, flags) }.map(|n| n as ssize_t)
        }),
        (Some(s), None) => boundary(|| {
            if !off_in.is_null() {
                return Err(Errno(libc::ESPIPE));
            }
            // SAFETY: `off_out` null or a readable, writable loff_t (# Safety), which
            // is what `splice_out` asks of its offset.
            unsafe { data::splice_out(s, fd_out, off_out, len, flags) }.map(|n| n as ssize_t)
        }),
    }
}

/// # Safety
/// As for glibc's fortified `recv`: `buf` must be writable for `buflen` bytes (the size
/// of the object the compiler saw); `n > buflen` is reported by libc, which aborts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    match lookup(fd) {
        // SAFETY: `buf` is writable for `buflen >= n` bytes (# Safety and the guard).
        Some(s) if n <= buflen => unsafe {
            recv_one(s, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut())
        },
        // SAFETY: the caller's arguments unchanged: libc checks `n` against `buflen`
        // (and aborts on overflow) before it writes `buf`.
        _ => unsafe { real::__recv_chk(fd, buf, n, buflen, flags) },
    }
}

/// # Safety
/// As for glibc's fortified `recvfrom`: `buf` must be writable for `buflen` bytes (`n >
/// buflen` is reported by libc, which aborts); `addr` and `alen` as for [`recvfrom`].
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
        // SAFETY: `buf` is writable for `buflen >= n` bytes (# Safety and the guard);
        // `addr` and `alen` are as `recv_one` asks (# Safety).
        Some(s) if n <= buflen => unsafe { recv_one(s, buf, n, flags, addr, alen) },
        // SAFETY: the caller's arguments unchanged: libc checks `n` against `buflen`
        // (and aborts on overflow) before it writes `buf`.
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
/// As for `syscall(2)`: the arguments must be valid for system call `n` as the kernel
/// reads and writes them (for the six socket data calls, as the function of the same
/// name takes them: [`sendmmsg`], [`recvmmsg`], [`sendmsg`], [`recvmsg`], [`sendto`],
/// [`recvfrom`]); arguments the call does not use are ignored.
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
        // SAFETY: the arguments are valid for system call `n` (# Safety) and reach
        // libc's `syscall` unchanged.
        return unsafe { real::syscall(n, a, b, c, d, e, f) };
    }
    let fd = a as c_int;
    // SAFETY: each arm hands the caller's arguments, in the order and types the system
    // call of that number takes them (which # Safety says they are valid for), to the
    // exported function of the same name, whose contract is that system call's.
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
