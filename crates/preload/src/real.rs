//! libc's own definitions of the functions the shim replaces, looked up once each with
//! `dlsym(RTLD_NEXT, name)` and cached in an atomic pointer. A function the C library
//! lacks (e.g. `epoll_pwait2` on an old glibc) fails with `ENOSYS`.

#![allow(clippy::too_many_arguments)]

use std::ffi::{c_int, c_long, c_uint, c_ulong, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{
    FILE, epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t,
    sockaddr, socklen_t, ssize_t, timespec, timeval,
};

use crate::errno::set_errno;

/// One looked-up symbol.
struct Sym {
    name: &'static str,
    ptr: AtomicPtr<c_void>,
}

impl Sym {
    const fn new(name: &'static str) -> Sym {
        Sym {
            name,
            ptr: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The next definition after this object's, or `None` when there is none.
    fn get(&self) -> Option<*mut c_void> {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return Some(p);
        }
        debug_assert!(self.name.ends_with('\0'));
        // SAFETY: `name` ends with a NUL (asserted above; every `Sym::new` is given a
        // literal that does) and is 'static; RTLD_NEXT is a pseudo-handle dlsym always
        // accepts.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) };
        if p.is_null() {
            return None;
        }
        self.ptr.store(p, Ordering::Release);
        Some(p)
    }
}

macro_rules! reals {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty ; )*) => { $(
        /// Calls libc's definition of the function of the same name.
        ///
        /// # Safety
        /// The arguments must satisfy that C function's contract.
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            static SYM: Sym = Sym::new(concat!(stringify!($name), "\0"));
            let Some(p) = SYM.get() else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            // SAFETY: `p` is non-null and is the definition after the shim's of the
            // symbol named like this function (dlsym RTLD_NEXT): the C library's, whose
            // C prototype the Rust signature repeats (checked by hand against glibc's
            // headers; a mismatch would be a bug here).
            let f = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(p) };
            // SAFETY: the arguments satisfy that C function's contract (# Safety).
            unsafe { f($($arg),*) }
        }
    )* };
}

/// Calls libc's `fdopen` (a pointer result: null with `ENOSYS` when there is none).
///
/// # Safety
/// The arguments must satisfy `fdopen(3)`'s contract.
pub unsafe fn fdopen(fd: c_int, mode: *const std::ffi::c_char) -> *mut FILE {
    static SYM: Sym = Sym::new("fdopen\0");
    let Some(p) = SYM.get() else {
        set_errno(libc::ENOSYS);
        return ptr::null_mut();
    };
    // SAFETY: `p` is non-null and is libc's `FILE *fdopen(int, const char *)` (dlsym
    // RTLD_NEXT of that name), whose prototype this repeats.
    let f = unsafe {
        std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(c_int, *const std::ffi::c_char) -> *mut FILE,
        >(p)
    };
    // SAFETY: `mode` is a NUL-terminated string (# Safety, `fdopen(3)`'s contract).
    unsafe { f(fd, mode) }
}

reals! {
    // Variadic in C; on Linux's C calling conventions the six arguments after the
    // number travel where six fixed ones would, and libc's reads all six.
    fn syscall(n: c_long, a: c_long, b: c_long, c: c_long, d: c_long, e: c_long, f: c_long) -> c_long;
    fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn listen(fd: c_int, backlog: c_int) -> c_int;
    fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int;
    fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    fn recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    fn recvmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int, timeout: *mut timespec) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    fn close(fd: c_int) -> c_int;
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn dup(fd: c_int) -> c_int;
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    fn ppoll(fds: *mut pollfd, n: nfds_t, ts: *const timespec, mask: *const sigset_t) -> c_int;
    fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, tv: *mut timeval) -> c_int;
    fn pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, ts: *const timespec, mask: *const sigset_t) -> c_int;
    fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
    fn epoll_wait(ep: c_int, evs: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
    fn epoll_pwait(ep: c_int, evs: *mut epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    fn epoll_pwait2(ep: c_int, evs: *mut epoll_event, max: c_int, ts: *const timespec, mask: *const sigset_t) -> c_int;
    fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t;
    fn sendfile64(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t;
    fn splice(fd_in: c_int, off_in: *mut libc::loff_t, fd_out: c_int, off_out: *mut libc::loff_t, len: size_t, flags: c_uint) -> ssize_t;
    fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    fn __recvfrom_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    fn __ppoll_chk(fds: *mut pollfd, n: nfds_t, ts: *const timespec, mask: *const sigset_t, fdslen: size_t) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn fclose(f: *mut FILE) -> c_int;
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
    fn siginterrupt(sig: c_int, flag: c_int) -> c_int;
}

/// libc's `_exit` (or `_Exit`, named by `which`); without it, `exit_group(2)`.
///
/// # Safety
/// None for memory (an integer), but it ends the process at once: no destructor, no
/// `atexit` handler and no stdio flush runs.
pub unsafe fn exit_now(which: Exit, status: c_int) -> ! {
    static EXIT: Sym = Sym::new("_exit\0");
    static EXIT2: Sym = Sym::new("_Exit\0");
    let sym = match which {
        Exit::Underscore => &EXIT,
        Exit::Capital => &EXIT2,
    };
    if let Some(p) = sym.get() {
        // SAFETY: `p` is non-null and is libc's `void _exit(int)` (or `_Exit`, dlsym
        // RTLD_NEXT of that name), which does not return, as `!` says.
        let f = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> !>(p) };
        // SAFETY: an integer; ending the process is this function's documented effect.
        unsafe { f(status) }
    }
    loop {
        // SAFETY: exit_group reads one integer, touches no memory and does not return
        // (the loop only satisfies the type).
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// Which of libc's immediate exits.
#[derive(Clone, Copy, Debug)]
pub enum Exit {
    /// `_exit`.
    Underscore,
    /// `_Exit`.
    Capital,
}

/// libc's `signal`.
///
/// # Safety
/// As for `signal(3)`: `h` must be `SIG_DFL`, `SIG_IGN` or a `void (*)(int)` handler.
pub unsafe fn signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    static SYM: Sym = Sym::new("signal\0");
    // SAFETY: `SYM` names libc's `signal`, of the prototype `handler_fn` assumes; `h` as
    // `signal(3)` needs it (# Safety).
    unsafe { handler_fn(&SYM, sig, h) }
}

/// libc's `sysv_signal`.
///
/// # Safety
/// As for [`signal`].
pub unsafe fn sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    static SYM: Sym = Sym::new("sysv_signal\0");
    // SAFETY: `SYM` names libc's `sysv_signal`, of the prototype `handler_fn` assumes;
    // `h` as `signal(3)` needs it (# Safety).
    unsafe { handler_fn(&SYM, sig, h) }
}

/// # Safety
/// `sym` must name a `sighandler_t f(int, sighandler_t)` function, and `h` be what that
/// function accepts (`SIG_DFL`, `SIG_IGN` or a `void (*)(int)` handler).
unsafe fn handler_fn(sym: &Sym, sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    let Some(p) = sym.get() else {
        set_errno(libc::ENOSYS);
        return libc::SIG_ERR;
    };
    // SAFETY: `p` is non-null and is the C library's definition of the symbol `sym`
    // names, of that prototype (# Safety).
    let f = unsafe {
        std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t,
        >(p)
    };
    // SAFETY: `h` is what the function accepts (# Safety); `sig` is an integer.
    unsafe { f(sig, h) }
}

/// libc's `fcntl` (variadic; the third argument is passed as an unsigned long, which is
/// how both `int` and pointer arguments travel in the C calling convention).
///
/// # Safety
/// The arguments must satisfy `fcntl(2)`'s contract for `cmd`.
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    static SYM: Sym = Sym::new("fcntl\0");
    // SAFETY: `SYM` names libc's variadic `fcntl`; `arg` is valid for `cmd` (# Safety).
    unsafe { variadic_fcntl(&SYM, fd, cmd, arg) }
}

/// libc's `fcntl64` (see [`fcntl`]).
///
/// # Safety
/// As for [`fcntl`].
pub unsafe fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    static SYM: Sym = Sym::new("fcntl64\0");
    // SAFETY: `SYM` names libc's variadic `fcntl64`; `arg` is valid for `cmd`
    // (# Safety).
    unsafe { variadic_fcntl(&SYM, fd, cmd, arg) }
}

/// # Safety
/// `sym` must name an `int f(int, int, ...)` function of `fcntl`'s contract, and `arg` be
/// valid for `cmd` under it.
unsafe fn variadic_fcntl(sym: &Sym, fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let Some(p) = sym.get() else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: `p` is non-null and is the definition of the symbol `sym` names, a
    // variadic `int (int, int, ...)` (# Safety).
    let f = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int, c_int, ...) -> c_int>(p)
    };
    // SAFETY: `arg` is valid for `cmd` (# Safety); passed as an unsigned long, which is
    // how both `int` and pointer variadic arguments travel on Linux's C conventions.
    unsafe { f(fd, cmd, arg) }
}

/// libc's `ioctl` (variadic; see [`fcntl`] for the third argument).
///
/// # Safety
/// The arguments must satisfy `ioctl(2)`'s contract for `request`.
pub unsafe fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    static SYM: Sym = Sym::new("ioctl\0");
    let Some(p) = SYM.get() else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: `p` is non-null and is libc's variadic `int ioctl(int, unsigned long,
    // ...)` (dlsym RTLD_NEXT of that name).
    let f = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int>(p)
    };
    // SAFETY: `arg` is valid for `request` (# Safety).
    unsafe { f(fd, request, arg) }
}

/// libc's `closefrom` (glibc 2.34+); without it, `close_range(lowfd, ~0, 0)`.
///
/// # Safety
/// None for memory (an integer); closing descriptors that other code still uses is the
/// caller's bug, as with libc's.
pub unsafe fn closefrom(lowfd: c_int) {
    static SYM: Sym = Sym::new("closefrom\0");
    match SYM.get() {
        Some(p) => {
            // SAFETY: `p` is non-null and is libc's `void closefrom(int)` (dlsym
            // RTLD_NEXT of that name).
            let f = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(p) };
            // SAFETY: an integer; which descriptors go is the caller's choice (# Safety).
            unsafe { f(lowfd) }
        }
        None => {
            let _ = crate::sys::close_range(lowfd as c_uint, c_uint::MAX, 0);
        }
    }
}
