//! C entry points that work on any descriptor: `read`/`write` and friends (relayed for
//! ferry sockets), `close`/`dup*`/`fcntl` (which keep the descriptor cache true), `ioctl`
//! (`FIONREAD`, `FIONBIO`), and the readiness calls, which are *not* emulated: ferry
//! sockets are real descriptors that the server makes readable with a token, so
//! `poll`/`select`/`epoll` only need the shim to ask for tokens (the first time a socket
//! is watched for input) and to ring a pending doorbell before the program blocks.
//! Every one of those waits (`poll`, `ppoll`, `select`, `pselect`, `epoll_wait`,
//! `epoll_pwait`, `epoll_pwait2`) on ferry sockets spins for the SBW span before it
//! sleeps ([`spin_wait`]).

use std::ffi::{c_int, c_uint, c_ulong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libc::{
    FILE, epoll_event, fd_set, iovec, nfds_t, pollfd, sigset_t, size_t, ssize_t, timespec, timeval,
};

use crate::chan::{spin_for, spin_policy_of};
use crate::errno::{Errno, errno, set_errno};
use crate::exports::{boundary, recv_one};
use crate::fdtable::{Entry, Sock, TABLE};
use crate::ident::{after_fcntl, lookup, set_nonblock};
use crate::iov::IoCursor;
use crate::{config, data, ops, real, signals, tls};

/// `close_range` flag: mark close-on-exec instead of closing.
const CLOSE_RANGE_CLOEXEC: c_int = 1 << 2;

/// # Safety
/// C contract of `read(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::read(fd, buf, n) };
    };
    // SAFETY: the caller's buffer.
    unsafe { recv_one(s, buf, n, 0, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// # Safety
/// C contract of glibc's fortified `read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    match lookup(fd) {
        // SAFETY: the caller's buffer, length checked against its size.
        Some(s) if n <= buflen => unsafe {
            recv_one(s, buf, n, 0, std::ptr::null_mut(), std::ptr::null_mut())
        },
        // SAFETY: forwarded to libc (which also reports the overflow).
        _ => unsafe { real::__read_chk(fd, buf, n, buflen) },
    }
}

/// # Safety
/// C contract of `write(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::write(fd, buf, n) };
    };
    let iov = iovec {
        iov_base: buf.cast_mut(),
        iov_len: n,
    };
    // SAFETY: one iovec over the caller's buffer.
    unsafe { send_vec(s, &iov, 1) }
}

/// # Safety
/// `iov` valid for `n` entries of readable buffers.
unsafe fn send_vec(s: Sock, iov: *const iovec, n: c_int) -> ssize_t {
    boundary(|| {
        let n = usize::try_from(n).map_err(|_| Errno::EINVAL)?;
        // SAFETY: the caller's iovecs.
        let mut cur = unsafe { IoCursor::new(iov, n) }?;
        // SAFETY: as above.
        unsafe { data::send(s, &mut cur, std::ptr::null(), 0, 0, &[]) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// C contract of `writev(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::writev(fd, iov, n) };
    };
    // SAFETY: the caller's iovecs.
    unsafe { send_vec(s, iov, n) }
}

/// # Safety
/// C contract of `readv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded to libc.
        return unsafe { real::readv(fd, iov, n) };
    };
    boundary(|| {
        let n = usize::try_from(n).map_err(|_| Errno::EINVAL)?;
        // SAFETY: the caller's iovecs.
        let mut cur = unsafe { IoCursor::new(iov, n) }?;
        // SAFETY: as above.
        unsafe { data::recv(s, &mut cur, 0) }.map(|g| g.len as ssize_t)
    })
}

/// # Safety
/// C contract of `close(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if config::active() {
        if tls::is_shim_fd(fd) {
            // Not the program's descriptor: for the program it is not open.
            set_errno(libc::EBADF);
            return -1;
        }
        // The entry goes before the descriptor: once closed, the number may be reused.
        if let Entry::Ferry(s) = TABLE.clear(fd) {
            ops::flush();
            // SAFETY: forwarded to libc.
            let r = unsafe { real::close(fd) };
            if r == 0 {
                let e = errno();
                ops::release(s.id);
                set_errno(e);
            }
            return r;
        }
    }
    // SAFETY: forwarded to libc.
    unsafe { real::close(fd) }
}

/// # Safety
/// C contract of `close_range(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if !config::active() || first > last {
        // SAFETY: forwarded to libc.
        return unsafe { real::close_range(first, last, flags) };
    }
    if flags & CLOSE_RANGE_CLOEXEC == 0 {
        ops::flush();
        TABLE.clear_range(first, last);
    }
    let mut r = 0;
    tls::around_shim_fds(first, last, |lo, hi| {
        // SAFETY: forwarded to libc, minus the shim's own descriptors.
        if unsafe { real::close_range(lo, hi, flags) } != 0 {
            r = -1;
        }
    });
    r
}

/// # Safety
/// C contract of `closefrom(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    if config::active() && lowfd >= 0 {
        ops::flush();
        TABLE.clear_range(lowfd as c_uint, c_uint::MAX);
        if tls::shim_fds().any(|f| f >= lowfd) {
            tls::around_shim_fds(lowfd as c_uint, c_uint::MAX, |lo, hi| {
                let _ = crate::sys::close_range(lo, hi, 0);
            });
            return;
        }
    }
    // SAFETY: forwarded to libc.
    unsafe { real::closefrom(lowfd) }
}

/// `fclose` closes its descriptor inside libc, out of the shim's sight.
///
/// # Safety
/// C contract of `fclose(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fclose(f: *mut FILE) -> c_int {
    if config::active() && !f.is_null() {
        // SAFETY: `f` is the caller's open stream.
        let fd = unsafe { libc::fileno(f) };
        if fd >= 0 && matches!(TABLE.clear(fd), Entry::Ferry(_)) {
            ops::flush();
        }
    }
    // SAFETY: forwarded to libc.
    unsafe { real::fclose(f) }
}

/// # Safety
/// C contract of `fdopen(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const std::ffi::c_char) -> *mut libc::FILE {
    if let Some(s) = crate::ident::lookup(fd) {
        // stdio will write the fd with calls the shim does not see.
        TABLE.update_id(s.id, crate::fdtable::F_DIRECT, 0);
    }
    // SAFETY: forwarded to libc.
    unsafe { real::fdopen(fd, mode) }
}

/// # Safety
/// C contract of `dup(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: forwarded to libc.
    let r = unsafe { real::dup(fd) };
    if r >= 0 && config::active() {
        TABLE.copy(fd, r);
    }
    r
}

/// The target of `dup2`/`dup3` is about to be replaced.
fn replacing(old: c_int, new: c_int) {
    if old != new && config::active() && matches!(TABLE.get(new), Entry::Ferry(_)) {
        ops::flush();
    }
}

/// # Safety
/// C contract of `dup2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    replacing(old, new);
    // SAFETY: forwarded to libc.
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 && old != new && config::active() {
        TABLE.copy(old, r);
    }
    r
}

/// # Safety
/// C contract of `dup3(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    replacing(old, new);
    // SAFETY: forwarded to libc.
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 && config::active() {
        TABLE.copy(old, r);
    }
    r
}

/// `fcntl` (variadic in C: the optional third argument arrives as an unsigned long).
///
/// # Safety
/// C contract of `fcntl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded to libc.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if r >= 0 && config::active() {
        after_fcntl(fd, cmd, arg, r);
    }
    r
}

/// `fcntl64` (what `fcntl` is called with `_FILE_OFFSET_BITS=64`).
///
/// # Safety
/// C contract of `fcntl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded to libc.
    let r = unsafe { real::fcntl64(fd, cmd, arg) };
    if r >= 0 && config::active() {
        after_fcntl(fd, cmd, arg, r);
    }
    r
}

/// `ioctl` (variadic in C). On ferry sockets `FIONREAD` is relayed and `FIONBIO` tracked;
/// everything else goes to the program's end of the readiness pair, a real socket (so
/// e.g. `SIOCGIFCONF` lists the sandbox's interfaces).
///
/// # Safety
/// C contract of `ioctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    // Compare the low 32 bits: callers with an `int` prototype leave the rest undefined.
    let req = request as u32;
    if req == libc::FIONREAD as u32
        && let Some(s) = lookup(fd)
    {
        return boundary(|| {
            let n = ops::pending(s)?;
            let p = arg.cast::<c_int>();
            if p.is_null() {
                return Err(Errno::EFAULT);
            }
            // SAFETY: FIONREAD's argument is an `int *` (caller).
            unsafe { p.write_unaligned(n) };
            Ok(0)
        });
    }
    // SAFETY: forwarded to libc.
    let r = unsafe { real::ioctl(fd, request, arg) };
    if r == 0 && req == libc::FIONBIO as u32 && !arg.is_null() && lookup(fd).is_some() {
        // SAFETY: FIONBIO's argument is an `int *` (caller), which libc just read.
        let on = unsafe { arg.cast::<c_int>().read_unaligned() } != 0;
        set_nonblock(fd, on);
    }
    r
}

/// Collects the ferry sockets a readiness call watches for input and have no tokens
/// yet, asks for tokens in batches, and rings the doorbell.
struct Watch {
    list: [Sock; 32],
    n: usize,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            list: [Sock::new(-1, 0, 0); 32],
            n: 0,
        }
    }

    fn add(&mut self, fd: c_int) {
        if let Some(s) = lookup(fd)
            && !s.wants_tokens()
        {
            self.list[self.n] = s;
            self.n += 1;
            if self.n == self.list.len() {
                ops::want_tokens(&self.list);
                self.n = 0;
            }
        }
    }

    fn finish(self) {
        if self.n > 0 {
            ops::want_tokens(&self.list[..self.n]);
        } else {
            ops::flush();
        }
    }
}

/// Interests that only a readiness token (or the mirrored EOF) can satisfy.
const POLL_INPUT: i16 =
    libc::POLLIN | libc::POLLPRI | libc::POLLRDNORM | libc::POLLRDBAND | libc::POLLRDHUP;

/// Whether `poll` waits for input from a ferry socket and for no ferry socket's room to
/// send (then it spins first, [`spin_wait`]: a reply is near, while room comes back
/// at the pace of the network and a writer should sleep); asks the server for
/// readiness tokens where input is awaited.
///
/// # Safety
/// `fds` valid for `n` entries.
unsafe fn before_poll(fds: *const pollfd, n: nfds_t) -> bool {
    if !config::active() {
        return false;
    }
    let mut w = Watch::new();
    let (mut input, mut output) = (false, false);
    if !fds.is_null() {
        for i in 0..n as usize {
            // SAFETY: `i < n` entries (caller).
            let p = unsafe { fds.add(i).read() };
            if p.fd < 0 || p.events == 0 {
                continue;
            }
            if p.events & POLL_INPUT != 0 {
                w.add(p.fd);
            }
            if lookup(p.fd).is_some() {
                input = input || p.events & POLL_INPUT != 0;
                output = output || p.events & (libc::POLLOUT | libc::POLLWRNORM) != 0;
            }
        }
    }
    w.finish();
    input && !output
}

/// After a `poll` that reported `r` ready descriptors: a ferry socket that has hung up
/// polls writable too (if asked), as a TCP socket always does once it has. The pair's
/// end can report `POLLHUP` a moment before it is writable again (after a refused
/// connect the kernel wakes it before it frees the filler that kept it unwritable: see
/// the server's `detach_pair`).
///
/// # Safety
/// `fds` valid for `n` entries.
unsafe fn after_poll(fds: *mut pollfd, n: nfds_t, r: c_int) -> c_int {
    if r <= 0 || fds.is_null() || !config::active() {
        return r;
    }
    for i in 0..n as usize {
        // SAFETY: `i < n` entries (caller).
        let p = unsafe { &mut *fds.add(i) };
        let want = p.events & (libc::POLLOUT | libc::POLLWRNORM);
        if p.revents & libc::POLLHUP != 0 && want & !p.revents != 0 && lookup(p.fd).is_some() {
            p.revents |= want;
        }
    }
    r
}

/// Epoll sets (by descriptor, below 65,536) a ferry socket was added to (or changed in)
/// for input alone: their waits spin first ([`spin_wait`]). A bit left by a closed and
/// reused descriptor costs only a spin.
static EPOLL_FERRY: [AtomicU64; 1024] = [const { AtomicU64::new(0) }; 1024];

fn epoll_bit(ep: c_int) -> Option<(usize, u64)> {
    let i = usize::try_from(ep)
        .ok()
        .filter(|&i| i < 64 * EPOLL_FERRY.len())?;
    Some((i / 64, 1 << (i % 64)))
}

fn epoll_has_ferry(ep: c_int) -> bool {
    epoll_bit(ep).is_some_and(|(w, b)| EPOLL_FERRY[w].load(Ordering::Relaxed) & b != 0)
}

/// What the spin before a wait found.
enum Spun {
    /// The wait's answer (ready descriptors, or -1 with `errno`): return it.
    Done(c_int),
    /// Nothing: sleep in the kernel for what is left of the timeout (`None`: no limit).
    Sleep(Option<Duration>),
}

/// A timeout in milliseconds (negative: none).
fn from_ms(ms: c_int) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// Milliseconds, rounded up (-1: none).
fn to_ms(d: Option<Duration>) -> c_int {
    d.map_or(-1, |d| {
        c_int::try_from(d.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX)
    })
}

/// A wait's timeout (`None`: none), or `Err` when the kernel would refuse it with
/// `EINVAL` (then the wait does not spin: the kernel's own call says so).
///
/// # Safety
/// `ts` null or valid.
unsafe fn from_timespec(ts: *const timespec) -> Result<Option<Duration>, ()> {
    // SAFETY: null or valid (caller).
    let Some(ts) = (unsafe { ts.as_ref() }) else {
        return Ok(None);
    };
    let secs = u64::try_from(ts.tv_sec).map_err(drop)?;
    let nanos = u32::try_from(ts.tv_nsec)
        .ok()
        .filter(|&n| n < 1_000_000_000)
        .ok_or(())?;
    Ok(Some(Duration::new(secs, nanos)))
}

fn to_timespec(d: Duration) -> timespec {
    timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: d.subsec_nanos().into(),
    }
}

const ZERO_TS: timespec = timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

/// S0's spin-before-sleep for `poll`/`select`/`epoll_wait` (and kin) on ferry sockets: their readiness comes
/// from the server's writes into their pairs, which usually land within the spin span,
/// while a program asleep in the kernel pays a wake-up (dear on VMs). `probe` is the
/// wait with a zero timeout; it is repeated (a pure spin, then `sched_yield` between
/// tries) until it reports something, the span or the caller's timeout has passed, or
/// a signal handler has run (then `EINTR`, as the sleeping wait would have said: these
/// waits are never restarted). A wait that goes on to sleep is counted like a blocking
/// reader's (`pair_sleeps`).
fn spin_wait(timeout: Option<Duration>, mut probe: impl FnMut() -> c_int) -> Spun {
    let p = spin_policy_of(config::spin());
    if timeout.is_some_and(|t| t.is_zero()) || p.span.is_zero() {
        return Spun::Sleep(timeout);
    }
    let limit = timeout.map_or(p.span, |t| t.min(p.span));
    let seen = signals::counts();
    let t0 = Instant::now();
    let answer = spin_for(p, limit, || match probe() {
        0 if signals::counts() != seen => {
            set_errno(libc::EINTR);
            Some(-1)
        }
        0 => None,
        r => Some(r),
    });
    if let Some(r) = answer {
        return Spun::Done(r);
    }
    let Some(t) = timeout else {
        ops::count_kernel_sleep();
        return Spun::Sleep(None);
    };
    let left = t.saturating_sub(t0.elapsed());
    if left.is_zero() {
        return Spun::Done(0);
    }
    ops::count_kernel_sleep();
    Spun::Sleep(Some(left))
}

/// Whether `select` waits for input from a ferry socket and for no ferry socket's room
/// to send (then it spins first, as `poll`: [`before_poll`]); asks the server for
/// readiness tokens for the read and exception sets.
///
/// # Safety
/// The sets (read, write, exception) are null or valid `fd_set`s.
unsafe fn before_select(nfds: c_int, sets: [*const fd_set; 3]) -> bool {
    if !config::active() {
        return false;
    }
    let mut w = Watch::new();
    let (mut input, mut output) = (false, false);
    let nfds = nfds.clamp(0, libc::FD_SETSIZE as c_int) as usize;
    for (k, set) in sets.into_iter().enumerate().filter(|(_, s)| !s.is_null()) {
        // SAFETY: an fd_set is FD_SETSIZE bits of plain data (caller).
        let words = unsafe { set.cast::<[u64; libc::FD_SETSIZE / 64]>().read_unaligned() };
        for (i, mut bits) in words.into_iter().enumerate() {
            while bits != 0 {
                let fd = i * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if fd < nfds {
                    if k != 1 {
                        w.add(fd as c_int);
                    }
                    if lookup(fd as c_int).is_some() {
                        if k == 1 {
                            output = true;
                        } else {
                            input = true;
                        }
                    }
                }
            }
        }
    }
    w.finish();
    input && !output
}

/// The caller's `select` sets, kept so that each zero-timeout try of the spin (which
/// rewrites them) starts from the program's.
struct SelectSets {
    ptrs: [*mut fd_set; 3],
    saved: [Option<fd_set>; 3],
}

impl SelectSets {
    /// # Safety
    /// The sets are null or valid `fd_set`s.
    unsafe fn save(ptrs: [*mut fd_set; 3]) -> SelectSets {
        // SAFETY: null or valid (caller).
        let saved = ptrs.map(|p| unsafe { p.as_ref() }.copied());
        SelectSets { ptrs, saved }
    }

    fn restore(&self) {
        for (p, s) in self.ptrs.iter().zip(&self.saved) {
            if let Some(s) = s {
                // SAFETY: the caller's valid set (`save`).
                unsafe { p.write(*s) };
            }
        }
    }
}

/// # Safety
/// C contract of `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's array; then forwarded to libc.
    let r = unsafe {
        if before_poll(fds, n) {
            match spin_wait(from_ms(timeout), || real::poll(fds, n, 0)) {
                Spun::Done(r) => r,
                Spun::Sleep(t) => real::poll(fds, n, to_ms(t)),
            }
        } else {
            real::poll(fds, n, timeout)
        }
    };
    // SAFETY: as above.
    unsafe { after_poll(fds, n, r) }
}

/// # Safety
/// C contract of `ppoll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the caller's array and timeout; then forwarded to libc.
    let r = unsafe {
        if before_poll(fds, n)
            && let Ok(timeout) = from_timespec(ts)
        {
            match spin_wait(timeout, || real::ppoll(fds, n, &ZERO_TS, mask)) {
                Spun::Done(r) => r,
                Spun::Sleep(Some(t)) => real::ppoll(fds, n, &to_timespec(t), mask),
                Spun::Sleep(None) => real::ppoll(fds, n, ts, mask),
            }
        } else {
            real::ppoll(fds, n, ts, mask)
        }
    };
    // SAFETY: as above.
    unsafe { after_poll(fds, n, r) }
}

/// # Safety
/// C contract of glibc's fortified `poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    let fits = (n as usize).saturating_mul(size_of::<pollfd>()) <= fdslen;
    // SAFETY: the caller's array (libc checks its length); then forwarded to libc.
    let r = unsafe {
        if fits && before_poll(fds, n) {
            match spin_wait(from_ms(timeout), || real::__poll_chk(fds, n, 0, fdslen)) {
                Spun::Done(r) => r,
                Spun::Sleep(t) => real::__poll_chk(fds, n, to_ms(t), fdslen),
            }
        } else {
            real::__poll_chk(fds, n, timeout, fdslen)
        }
    };
    if !fits {
        return r;
    }
    // SAFETY: as above (the array is as long as the caller said).
    unsafe { after_poll(fds, n, r) }
}

/// # Safety
/// C contract of glibc's fortified `ppoll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
    fdslen: size_t,
) -> c_int {
    let fits = (n as usize).saturating_mul(size_of::<pollfd>()) <= fdslen;
    // SAFETY: as in `__poll_chk`.
    let r = unsafe {
        if fits
            && before_poll(fds, n)
            && let Ok(timeout) = from_timespec(ts)
        {
            let probe = || real::__ppoll_chk(fds, n, &ZERO_TS, mask, fdslen);
            match spin_wait(timeout, probe) {
                Spun::Done(r) => r,
                Spun::Sleep(Some(t)) => real::__ppoll_chk(fds, n, &to_timespec(t), mask, fdslen),
                Spun::Sleep(None) => real::__ppoll_chk(fds, n, ts, mask, fdslen),
            }
        } else {
            real::__ppoll_chk(fds, n, ts, mask, fdslen)
        }
    };
    if !fits {
        return r;
    }
    // SAFETY: as above.
    unsafe { after_poll(fds, n, r) }
}

/// # Safety
/// C contract of `select(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    // SAFETY: the caller's sets and timeout; then forwarded to libc.
    unsafe {
        // A negative timeval is the kernel's EINVAL to give: no spin then.
        let timeout = match tv.as_ref() {
            None => Ok(None),
            Some(t) => match (u64::try_from(t.tv_sec), u64::try_from(t.tv_usec)) {
                (Ok(s), Ok(us)) => Ok(Some(Duration::from_secs(s) + Duration::from_micros(us))),
                _ => Err(()),
            },
        };
        if before_select(n, [r.cast_const(), w.cast_const(), e.cast_const()])
            && let Ok(timeout) = timeout
        {
            let sets = SelectSets::save([r, w, e]);
            let probe = || {
                sets.restore();
                let mut zero = timeval {
                    tv_sec: 0,
                    tv_usec: 0,
                };
                real::select(n, r, w, e, &mut zero)
            };
            match spin_wait(timeout, probe) {
                Spun::Done(r) => return r,
                Spun::Sleep(left) => {
                    sets.restore();
                    if let (Some(t), Some(left)) = (tv.as_mut(), left) {
                        // The kernel leaves what remains of it here, as it would have.
                        t.tv_sec = libc::time_t::try_from(left.as_secs()).unwrap_or(0);
                        t.tv_usec = left.subsec_micros().into();
                    }
                }
            }
        }
        real::select(n, r, w, e, tv)
    }
}

/// # Safety
/// C contract of `pselect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the caller's sets and timeout; then forwarded to libc.
    unsafe {
        if before_select(n, [r.cast_const(), w.cast_const(), e.cast_const()])
            && let Ok(timeout) = from_timespec(ts)
        {
            let sets = SelectSets::save([r, w, e]);
            let probe = || {
                sets.restore();
                real::pselect(n, r, w, e, &ZERO_TS, mask)
            };
            match spin_wait(timeout, probe) {
                Spun::Done(r) => return r,
                Spun::Sleep(left) => {
                    sets.restore();
                    if let Some(t) = left {
                        return real::pselect(n, r, w, e, &to_timespec(t), mask);
                    }
                }
            }
        }
        real::pselect(n, r, w, e, ts, mask)
    }
}

/// # Safety
/// C contract of `epoll_ctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    if config::active() && (op == libc::EPOLL_CTL_ADD || op == libc::EPOLL_CTL_MOD) && !ev.is_null()
    {
        // SAFETY: the caller's event (read unaligned: the struct is packed on x86-64).
        let events = unsafe { std::ptr::addr_of!((*ev).events).read_unaligned() };
        let input = libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLRDNORM | libc::EPOLLRDHUP;
        // A ferry socket watched for input alone marks the set: its waits spin first.
        // (One watched for room to send too does not, as with `poll`: [`before_poll`].)
        let input_only = events & input as u32 != 0 && events & libc::EPOLLOUT as u32 == 0;
        if let Some((w, b)) = epoll_bit(ep).filter(|_| input_only && lookup(fd).is_some()) {
            EPOLL_FERRY[w].fetch_or(b, Ordering::Relaxed);
        }
        if events & input as u32 != 0 {
            let mut w = Watch::new();
            w.add(fd);
            w.finish();
        }
    }
    // SAFETY: forwarded to libc.
    unsafe { real::epoll_ctl(ep, op, fd, ev) }
}

/// # Safety
/// C contract of `epoll_wait(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    let mut timeout = timeout;
    if config::active() {
        ops::flush();
        if epoll_has_ferry(ep) {
            // SAFETY: forwarded to libc (the caller's buffer).
            match spin_wait(from_ms(timeout), || unsafe {
                real::epoll_wait(ep, evs, max, 0)
            }) {
                Spun::Done(r) => return r,
                Spun::Sleep(t) => timeout = to_ms(t),
            }
        }
    }
    // SAFETY: forwarded to libc.
    unsafe { real::epoll_wait(ep, evs, max, timeout) }
}

/// # Safety
/// C contract of `epoll_pwait(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    let mut timeout = timeout;
    if config::active() {
        ops::flush();
        if epoll_has_ferry(ep) {
            // SAFETY: forwarded to libc (the caller's buffer and mask).
            match spin_wait(from_ms(timeout), || unsafe {
                real::epoll_pwait(ep, evs, max, 0, mask)
            }) {
                Spun::Done(r) => return r,
                Spun::Sleep(t) => timeout = to_ms(t),
            }
        }
    }
    // SAFETY: forwarded to libc.
    unsafe { real::epoll_pwait(ep, evs, max, timeout, mask) }
}

/// # Safety
/// C contract of `epoll_pwait2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    ep: c_int,
    evs: *mut epoll_event,
    max: c_int,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if config::active() {
        ops::flush();
        if epoll_has_ferry(ep)
            // SAFETY: the caller's timeout, null or valid.
            && let Ok(timeout) = unsafe { from_timespec(ts) }
        {
            // SAFETY: forwarded to libc (the caller's buffer, timeout and mask).
            unsafe {
                let probe = || real::epoll_pwait2(ep, evs, max, &ZERO_TS, mask);
                match spin_wait(timeout, probe) {
                    Spun::Done(r) => return r,
                    Spun::Sleep(Some(t)) => {
                        return real::epoll_pwait2(ep, evs, max, &to_timespec(t), mask);
                    }
                    Spun::Sleep(None) => {}
                }
            }
        }
    }
    // SAFETY: forwarded to libc.
    unsafe { real::epoll_pwait2(ep, evs, max, ts, mask) }
}
