//! The C interface of the native API (`include/ferry.h`): a handle per channel, sockets
//! by id, and zero-copy buffers by pointer. Every function returns a negated errno on
//! failure and never unwinds into C.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use crate::{Client, FileRef, Lent, Socket, ZcBuf};

/// One channel and what the C side holds of it.
#[derive(Debug)]
pub struct FerryHandle {
    client: Client,
    sockets: HashMap<c_int, Socket>,
    /// Buffers handed out by `ferry_send_buf`, by address.
    filling: HashMap<usize, ZcBuf>,
    /// Buffers handed out by `ferry_recv_zc`, by address.
    lent: HashMap<usize, Lent>,
}

fn neg(e: std::io::Error) -> c_int {
    -e.raw_os_error().unwrap_or(libc::EIO)
}

fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-libc::EIO)
}

/// Opens a channel to the server at `path`, or at `$FERRY_SOCKET` when `path` is NULL.
/// Returns NULL on failure (errno set).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_open(path: *const c_char) -> *mut FerryHandle {
    let path: Option<PathBuf> = if path.is_null() {
        std::env::var_os("FERRY_SOCKET").map(PathBuf::from)
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        let s = unsafe { CStr::from_ptr(path) };
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(s.to_bytes())))
    };
    let r = catch_unwind(|| {
        let path = path.ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
        Client::connect(&path)
    });
    match r {
        Ok(Ok(client)) => Box::into_raw(Box::new(FerryHandle {
            client,
            sockets: HashMap::new(),
            filling: HashMap::new(),
            lent: HashMap::new(),
        })),
        Ok(Err(e)) => {
            // SAFETY: errno is thread-local and always writable.
            unsafe { *libc::__errno_location() = e.raw_os_error().unwrap_or(libc::EIO) };
            std::ptr::null_mut()
        }
        Err(_) => std::ptr::null_mut(),
    }
}

use std::os::unix::ffi::OsStrExt;

/// Closes a channel (and every socket it holds).
///
/// # Safety
/// `h` came from `ferry_open` and is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_close(h: *mut FerryHandle) {
    if !h.is_null() {
        // SAFETY: the caller gives back ownership of a handle from `ferry_open`.
        drop(unsafe { Box::from_raw(h) });
    }
}

fn with(h: *mut FerryHandle, f: impl FnOnce(&mut FerryHandle) -> c_int) -> c_int {
    if h.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: a non-null handle comes from `ferry_open` (the header's contract) and is
    // used by one thread at a time.
    guard(|| f(unsafe { &mut *h }))
}

/// Creates a socket; returns its id (>= 0).
///
/// # Safety
/// `h` from `ferry_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_socket(h: *mut FerryHandle, domain: c_int, ty: c_int) -> c_int {
    with(h, |h| match h.client.socket(domain, ty) {
        Ok(s) => {
            let id = s.id as c_int;
            h.sockets.insert(id, s);
            id
        }
        Err(e) => neg(e),
    })
}

/// Connects a socket (blocking).
///
/// # Safety
/// `h` from `ferry_open`; `addr` points at `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_connect(
    h: *mut FerryHandle,
    sock: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    if addr.is_null() {
        return -libc::EFAULT;
    }
    // SAFETY: the caller vouches for `len` readable bytes at `addr`.
    let bytes = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len as usize) };
    let Ok(wa) = ferry_proto::WireAddr::decode(bytes) else {
        return -libc::EINVAL;
    };
    let to: SocketAddr = wa.to_std();
    with(h, |h| {
        let Some(s) = h.sockets.get(&sock) else {
            return -libc::EBADF;
        };
        match h.client.connect_to(s, to) {
            Ok(()) => 0,
            Err(e) => neg(e),
        }
    })
}

/// Closes a socket.
///
/// # Safety
/// `h` from `ferry_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_sock_close(h: *mut FerryHandle, sock: c_int) -> c_int {
    with(h, |h| {
        if h.sockets.remove(&sock).is_some() {
            0
        } else {
            -libc::EBADF
        }
    })
}

/// Binds a data-path module to a connected stream socket (see `Client::bind_module`).
/// `module`/`module_len`: binary wasm or `.wat` text. `props`: `nprops` strings
/// `"key=value"` (the first `=` splits). `fds`: `nfds` files the module may send (the
/// caller keeps its own descriptors). Returns 0 or a negated errno.
///
/// # Safety
/// `h` from `ferry_open`; `module` points at `module_len` readable bytes; `props` at
/// `nprops` NUL-terminated strings; `fds` at `nfds` ints (either may be NULL when its
/// count is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_bind_module(
    h: *mut FerryHandle,
    sock: c_int,
    module: *const c_void,
    module_len: usize,
    props: *const *const c_char,
    nprops: usize,
    fds: *const c_int,
    nfds: usize,
) -> c_int {
    // SAFETY: the same contract, with no handles.
    unsafe {
        ferry_bind_module_ex(
            h,
            sock,
            module,
            module_len,
            props,
            nprops,
            fds,
            nfds,
            std::ptr::null(),
            0,
            0,
        )
    }
}

/// `ferry_bind_module_ex` flag: do not wait for the answer once the module is loaded
/// (an error comes back on a later call on the socket).
pub const FERRY_BIND_NOWAIT: c_int = 1;

/// `ferry_bind_module` whose module may also send registered files: its files are the
/// `nfds` descriptors of `fds`, then the `nhandles` handles of `handles` (from
/// `ferry_register_file`). `flags`: 0 or `FERRY_BIND_NOWAIT`. Returns 0 or a negated
/// errno (`-EBADF` for a handle that is not registered).
///
/// # Safety
/// As `ferry_bind_module`; `handles` points at `nhandles` ints (NULL when 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_bind_module_ex(
    h: *mut FerryHandle,
    sock: c_int,
    module: *const c_void,
    module_len: usize,
    props: *const *const c_char,
    nprops: usize,
    fds: *const c_int,
    nfds: usize,
    handles: *const c_int,
    nhandles: usize,
    flags: c_int,
) -> c_int {
    if module.is_null()
        || (props.is_null() && nprops > 0)
        || (fds.is_null() && nfds > 0)
        || (handles.is_null() && nhandles > 0)
    {
        return -libc::EFAULT;
    }
    if flags & !FERRY_BIND_NOWAIT != 0 {
        return -libc::EINVAL;
    }
    // SAFETY: the caller vouches for `module_len` readable bytes at `module`.
    let module = unsafe { std::slice::from_raw_parts(module.cast::<u8>(), module_len) };
    let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(nprops);
    for i in 0..nprops {
        // SAFETY: the caller vouches for `nprops` string pointers at `props`.
        let p = unsafe { *props.add(i) };
        if p.is_null() {
            return -libc::EFAULT;
        }
        // SAFETY: each is a NUL-terminated string (the caller's contract).
        let Ok(kv) = unsafe { CStr::from_ptr(p) }.to_str() else {
            return -libc::EINVAL;
        };
        let Some(pair) = kv.split_once('=') else {
            return -libc::EINVAL;
        };
        pairs.push(pair);
    }
    let raw: &[c_int] = if nfds == 0 {
        &[]
    } else {
        // SAFETY: the caller vouches for `nfds` ints at `fds`.
        unsafe { std::slice::from_raw_parts(fds, nfds) }
    };
    if raw.iter().any(|&fd| fd < 0) {
        return -libc::EBADF;
    }
    let handles: &[c_int] = if nhandles == 0 {
        &[]
    } else {
        // SAFETY: the caller vouches for `nhandles` ints at `handles`.
        unsafe { std::slice::from_raw_parts(handles, nhandles) }
    };
    let Ok(refs) = handles
        .iter()
        .map(|&r| u32::try_from(r).map(FileRef))
        .collect::<Result<Vec<_>, _>>()
    else {
        return -libc::EBADF;
    };
    // SAFETY: the descriptors are open and stay open for the call (the caller's
    // contract); they are only borrowed to be sent.
    let files: Vec<std::os::fd::BorrowedFd<'_>> = raw
        .iter()
        .map(|&fd| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        .collect();
    with(h, |h| {
        let Some(s) = h.sockets.get(&sock) else {
            return -libc::EBADF;
        };
        let r = if flags & FERRY_BIND_NOWAIT != 0 {
            h.client
                .bind_module_refs_nowait(s, module, &pairs, &files, &refs)
        } else {
            h.client.bind_module_refs(s, module, &pairs, &files, &refs)
        };
        match r {
            Ok(()) => 0,
            Err(e) => neg(e),
        }
    })
}

/// Registers a file (a regular file open for reading) with the channel's server;
/// returns its handle (>= 0) for `ferry_bind_module_ex`, or a negated errno. The server
/// keeps its own reference: the caller may close `fd`.
///
/// # Safety
/// `h` from `ferry_open`; `fd` is open for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_register_file(h: *mut FerryHandle, fd: c_int) -> c_int {
    if fd < 0 {
        return -libc::EBADF;
    }
    // SAFETY: the caller keeps `fd` open for the call; it is only borrowed to be sent.
    let f = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    with(h, |h| match h.client.register_file(f) {
        Ok(r) => r.0 as c_int,
        Err(e) => neg(e),
    })
}

/// Forgets a registered file (bindings made before keep it). Returns 0 or `-EBADF`.
///
/// # Safety
/// `h` from `ferry_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_unregister_file(h: *mut FerryHandle, handle: c_int) -> c_int {
    let Ok(handle) = u32::try_from(handle) else {
        return -libc::EBADF;
    };
    with(h, |h| match h.client.unregister_file(FileRef(handle)) {
        Ok(()) => 0,
        Err(e) => neg(e),
    })
}

/// `shutdown(how)` of a socket (`SHUT_WR` ends a bound module's input).
///
/// # Safety
/// `h` from `ferry_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_shutdown(h: *mut FerryHandle, sock: c_int, how: c_int) -> c_int {
    with(h, |h| {
        let Some(s) = h.sockets.get(&sock) else {
            return -libc::EBADF;
        };
        match h.client.shutdown(s, how) {
            Ok(()) => 0,
            Err(e) => neg(e),
        }
    })
}

/// `setsockopt(2)` of a socket (the value at most 32 bytes).
///
/// # Safety
/// `h` from `ferry_open`; `val` readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_setsockopt(
    h: *mut FerryHandle,
    sock: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    if val.is_null() && len > 0 {
        return -libc::EFAULT;
    }
    let value = if len == 0 {
        &[][..]
    } else {
        // SAFETY: `len` readable bytes at `val` (caller).
        unsafe { std::slice::from_raw_parts(val.cast::<u8>(), len as usize) }
    };
    with(h, |h| {
        let Some(s) = h.sockets.get(&sock) else {
            return -libc::EBADF;
        };
        match h.client.set_option(s, level, name, value) {
            Ok(()) => 0,
            Err(e) => neg(e),
        }
    })
}

/// A free channel buffer to fill: returns its address and stores its size in `*cap`.
/// Returns NULL on failure.
///
/// # Safety
/// `h` from `ferry_open`; `cap` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_send_buf(h: *mut FerryHandle, cap: *mut usize) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    with(h, |h| match h.client.buffer() {
        Ok(mut b) => {
            let bytes = h.client.bytes_mut(&mut b);
            out = bytes.as_mut_ptr().cast::<c_void>();
            if !cap.is_null() {
                // SAFETY: the caller passes a writable `cap`.
                unsafe { cap.write(bytes.len()) };
            }
            h.filling.insert(out as usize, b);
            0
        }
        Err(e) => neg(e),
    });
    out
}

/// Sends the first `len` bytes of a buffer from `ferry_send_buf`; the buffer belongs to
/// ferry again afterwards.
///
/// # Safety
/// `h` from `ferry_open`; `buf` from `ferry_send_buf` on the same handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_send_commit(
    h: *mut FerryHandle,
    sock: c_int,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    with(h, |h| {
        let Some(b) = h.filling.remove(&(buf as usize)) else {
            return -libc::EINVAL;
        };
        let Some(s) = h.sockets.get(&sock) else {
            return -libc::EBADF;
        };
        match h.client.send_buffer(s, b, len) {
            Ok(()) => len as c_int,
            Err(e) => neg(e),
        }
    })
}

/// Receives up to `max` bytes without copying: `*data` points into the server's buffer
/// until `ferry_recv_done`. Returns the length, 0 at end of stream.
///
/// # Safety
/// `h` from `ferry_open`; `data` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_recv_zc(
    h: *mut FerryHandle,
    sock: c_int,
    max: usize,
    data: *mut *const c_void,
) -> isize {
    let mut n: isize = 0;
    let r = with(h, |h| {
        let Some(s) = h.sockets.get(&sock) else {
            return -libc::EBADF;
        };
        match h.client.recv_lend(s, max) {
            Ok(Some(l)) => {
                let bytes = h.client.lent_bytes(&l);
                n = bytes.len() as isize;
                if !data.is_null() {
                    // SAFETY: the caller passes a writable `data`.
                    unsafe { data.write(bytes.as_ptr().cast()) };
                }
                h.lent.insert(bytes.as_ptr() as usize, l);
                0
            }
            Ok(None) => 0,
            Err(e) => neg(e),
        }
    });
    if r < 0 { r as isize } else { n }
}

/// Gives back the buffer of a `ferry_recv_zc`.
///
/// # Safety
/// `h` from `ferry_open`; `data` from `ferry_recv_zc` on the same handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferry_recv_done(h: *mut FerryHandle, data: *const c_void) -> c_int {
    with(h, |h| {
        let Some(l) = h.lent.remove(&(data as usize)) else {
            return -libc::EINVAL;
        };
        match h.client.give_back(l) {
            Ok(()) => 0,
            Err(e) => neg(e),
        }
    })
}
