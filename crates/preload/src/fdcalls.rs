//! C entry points that work on any descriptor: `read`/`write` and friends (relayed for
//! ferry sockets), `close`/`dup*`/`fcntl` (which keep the descriptor cache true), `ioctl`
//! (`FIONREAD`, `FIONBIO`), and the readiness calls, which are *not* emulated: ferry
//! sockets are real descriptors that the server makes readable with a token, so
//! `poll`/`select`/`epoll` only need the shim to ask for tokens (the first time a socket
//! is watched for input) and to ring a pending doorbell before the program blocks.
//! Every one of those waits (`poll`, `ppoll`, `select`, `pselect`, `epoll_wait`,
//! `epoll_pwait`, `epoll_pwait2`) on ferry sockets spins for the SBW span before it
//! sleeps (`spin_wait`).
//!
//! Each export's `# Safety` section is its C caller's contract, as in
//! [`crate::exports`]: the libc function's, with every pointer valid for what the
//! function does with it (the shim reads a `poll` array or `select` sets itself before
//! libc does, where the kernel would answer `EFAULT`).

use std::ffi::{c_int, c_uint, c_ulong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libc::{
    FILE, epoll_event, fd_set, iovec, nfds_t, pollfd, sigset_t, size_t, ssize_t, timespec, timeval,
};

use crate::chan::{
    kernel_budget, kernel_sleeps, kernel_waited, kernel_woke, spin_for, spin_pays, spin_policy_of,
};
use crate::errno::{Errno, errno, set_errno};
use crate::exports::{boundary, recv_one};
use crate::fdtable::{Entry, Sock, TABLE};
use crate::ident::{after_fcntl, lookup, set_nonblock};
use crate::iov::IoCursor;
use crate::{config, data, ops, real, signals, tls};

/// `close_range` flag: mark close-on-exec instead of closing.
const CLOSE_RANGE_CLOEXEC: c_int = 1 << 2;

/// # Safety
/// As for `read(2)`: `buf` must be writable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: `buf` writable for `n` bytes (# Safety), passed on unchanged.
        return unsafe { real::read(fd, buf, n) };
    };
    // SAFETY: `buf` writable for `n` bytes (# Safety); no address is asked for.
    unsafe { recv_one(s, buf, n, 0, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// # Safety
/// As for glibc's fortified `read`: `buf` must be writable for `buflen` bytes (the size
/// of the object the compiler saw); `n > buflen` is reported by libc, which aborts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    match lookup(fd) {
        // SAFETY: `buf` is writable for `buflen >= n` bytes (# Safety and the guard).
        Some(s) if n <= buflen => unsafe {
            recv_one(s, buf, n, 0, std::ptr::null_mut(), std::ptr::null_mut())
        },
        // SAFETY: the caller's arguments unchanged: libc checks `n` against `buflen`
        // (and aborts on overflow) before it writes `buf`.
        _ => unsafe { real::__read_chk(fd, buf, n, buflen) },
    }
}

/// # Safety
/// As for `write(2)`: `buf` must be readable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: `buf` readable for `n` bytes (# Safety), passed on unchanged.
        return unsafe { real::write(fd, buf, n) };
    };
    let iov = iovec {
        iov_base: buf.cast_mut(),
        iov_len: n,
    };
    // SAFETY: one iovec (a live local) over `buf`, readable for `n` bytes (# Safety).
    unsafe { send_vec(s, &iov, 1) }
}

/// # Safety
/// `iov` must be null (`EFAULT` unless `n` is 0) or valid for `n` entries, each buffer
/// readable for its `iov_len` bytes.
unsafe fn send_vec(s: Sock, iov: *const iovec, n: c_int) -> ssize_t {
    boundary(|| {
        let n = usize::try_from(n).map_err(|_| Errno::EINVAL)?;
        // SAFETY: `iov` valid for `n` entries of readable buffers (# Safety), alive for
        // this call, which the cursor does not outlive.
        let mut cur = unsafe { IoCursor::new(iov, n) }?;
        // SAFETY: the cursor's buffers are readable (above); no address.
        unsafe { data::send(s, &mut cur, std::ptr::null(), 0, 0, &[]) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// As for `writev(2)`: `iov` must be valid for `n` entries (the shim refuses more than
/// 1024 before reading any), each buffer readable for its `iov_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: `iov` as `writev(2)` needs it (# Safety), passed on unchanged.
        return unsafe { real::writev(fd, iov, n) };
    };
    // SAFETY: `iov` and its buffers (# Safety) are what `send_vec` asks.
    unsafe { send_vec(s, iov, n) }
}

/// # Safety
/// As for `readv(2)`: `iov` must be valid for `n` entries (the shim refuses more than
/// 1024 before reading any), each buffer writable for its `iov_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let Some(s) = lookup(fd) else {
        // SAFETY: `iov` as `readv(2)` needs it (# Safety), passed on unchanged.
        return unsafe { real::readv(fd, iov, n) };
    };
    boundary(|| {
        let n = usize::try_from(n).map_err(|_| Errno::EINVAL)?;
        // SAFETY: `iov` valid for `n` entries of writable buffers (# Safety), alive for
        // this call, which the cursor does not outlive.
        let mut cur = unsafe { IoCursor::new(iov, n) }?;
        // SAFETY: the cursor's buffers are writable (above).
        unsafe { data::recv(s, &mut cur, 0) }.map(|g| g.len as ssize_t)
    })
}

/// # Safety
/// None for memory: `fd` is an integer. As with the kernel's `close`, closing a
/// descriptor another part of the program still uses is that program's bug; the shim's
/// own descriptors are refused (`EBADF`), never closed.
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
            // SAFETY: an integer; `fd` is the program's (not one of the shim's, checked
            // above) and its cache entry is already gone.
            let r = unsafe { real::close(fd) };
            if r == 0 {
                let e = errno();
                ops::release(&s);
                set_errno(e);
            }
            return r;
        }
    }
    // SAFETY: an integer, passed on unchanged; the shim's own descriptors were refused
    // above (when active).
    unsafe { real::close(fd) }
}

/// # Safety
/// None for memory: the arguments are integers (see [`close`]); the shim's own
/// descriptors in the range are left open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if !config::active() || first > last {
        // SAFETY: integers only, passed on unchanged (inert: the shim has no descriptors
        // of its own; or an empty range, which libc refuses).
        return unsafe { real::close_range(first, last, flags) };
    }
    if flags & CLOSE_RANGE_CLOEXEC == 0 {
        ops::flush();
        TABLE.clear_range(first, last);
    }
    let mut r = 0;
    tls::around_shim_fds(first, last, |lo, hi| {
        // SAFETY: integers only: a part of the caller's range that holds none of the
        // shim's own descriptors.
        if unsafe { real::close_range(lo, hi, flags) } != 0 {
            r = -1;
        }
    });
    r
}

/// # Safety
/// None for memory: `lowfd` is an integer (see [`close`]); the shim's own descriptors
/// are left open.
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
    // SAFETY: an integer; when the shim is active, none of its own descriptors is at or
    // above `lowfd` here (that case returned above).
    unsafe { real::closefrom(lowfd) }
}

/// `fclose` closes its descriptor inside libc, out of the shim's sight.
///
/// # Safety
/// As for `fclose(3)`: `f` must be a stream opened by the C library and not closed yet;
/// it is invalid once this returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fclose(f: *mut FILE) -> c_int {
    if config::active() && !f.is_null() {
        // SAFETY: `f` is an open stream (# Safety); `fileno` only reads it.
        let fd = unsafe { libc::fileno(f) };
        if fd >= 0 && matches!(TABLE.clear(fd), Entry::Ferry(_)) {
            ops::flush();
        }
    }
    // SAFETY: `f` is an open stream (# Safety), passed on unchanged.
    unsafe { real::fclose(f) }
}

/// # Safety
/// As for `fdopen(3)`: `mode` must point at a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const std::ffi::c_char) -> *mut libc::FILE {
    if let Some(s) = crate::ident::lookup(fd) {
        // stdio will write the fd with calls the shim does not see.
        TABLE.update_id(s.id, crate::fdtable::F_DIRECT, 0);
    }
    // SAFETY: `mode` is a NUL-terminated string (# Safety), passed on unchanged.
    unsafe { real::fdopen(fd, mode) }
}

/// # Safety
/// None beyond `dup(2)`'s: `fd` is an integer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: an integer, passed on unchanged.
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
/// None for memory: the arguments are integers. As with the kernel's `dup2`, replacing
/// a descriptor another part of the program still uses is that program's bug.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    replacing(old, new);
    // SAFETY: integers only, passed on unchanged.
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 && old != new && config::active() {
        TABLE.copy(old, r);
    }
    r
}

/// # Safety
/// As for [`dup2`]: integers only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    replacing(old, new);
    // SAFETY: integers only, passed on unchanged.
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 && config::active() {
        TABLE.copy(old, r);
    }
    r
}

/// `fcntl` (variadic in C: the optional third argument arrives as an unsigned long).
///
/// # Safety
/// As for `fcntl(2)`: for a command that takes a pointer (`F_GETLK`, `F_SETOWN_EX`…),
/// `arg` must point at the object that command reads or writes. The shim itself only
/// reads `arg` as an integer (`F_SETFL`'s flags).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: `arg` is valid for `cmd` (# Safety), passed on unchanged.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if r >= 0 && config::active() {
        after_fcntl(fd, cmd, arg, r);
    }
    r
}

/// `fcntl64` (what `fcntl` is called with `_FILE_OFFSET_BITS=64`).
///
/// # Safety
/// As for [`fcntl`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: `arg` is valid for `cmd` (# Safety), passed on unchanged.
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
/// As for `ioctl(2)`: `arg` must be valid for what `request` reads or writes; for
/// `FIONREAD` and `FIONBIO`, null (`EFAULT`) or a writable, respectively readable, `int`.
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
            // SAFETY: non-null (checked above), so a writable `int` (# Safety, FIONREAD),
            // written unaligned as the shim cannot know the caller's alignment.
            unsafe { p.write_unaligned(n) };
            Ok(0)
        });
    }
    // SAFETY: `arg` is valid for `request` (# Safety), passed on unchanged.
    let r = unsafe { real::ioctl(fd, request, arg) };
    if r == 0 && req == libc::FIONBIO as u32 && !arg.is_null() && lookup(fd).is_some() {
        // SAFETY: non-null (checked) and, for FIONBIO, a readable `int` (# Safety), which
        // libc has just read too; read unaligned.
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
/// `fds` must be null or readable for `n` entries.
unsafe fn before_poll(fds: *const pollfd, n: nfds_t) -> bool {
    if !config::active() {
        return false;
    }
    let mut w = Watch::new();
    let (mut input, mut output) = (false, false);
    if !fds.is_null() {
        for i in 0..n as usize {
            // SAFETY: `fds` is non-null here and readable for `n` entries (# Safety);
            // `i < n`. The entry is copied out.
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
/// `fds` must be null or readable and writable for `n` entries.
unsafe fn after_poll(fds: *mut pollfd, n: nfds_t, r: c_int) -> c_int {
    if r <= 0 || fds.is_null() || !config::active() {
        return r;
    }
    for i in 0..n as usize {
        // SAFETY: `fds` is non-null here and valid for `n` entries (# Safety); `i < n`;
        // the reference ends with this iteration, and nothing else touches the array
        // during the call.
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

/// Whether this process (or the one it forked from) ever added a ferry socket to an
/// epoll set: without that, a hand-off (`ops::take_handoff`) skips the scan of
/// `/proc/self/fd` for registrations to carry. (A set inherited across `exec` with a
/// registration made before it is not seen; `renew_pair` always scans.)
pub(crate) static EPOLL_ADDED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

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
/// `ts` must be null or point at a readable `timespec`.
unsafe fn from_timespec(ts: *const timespec) -> Result<Option<Duration>, ()> {
    // SAFETY: null (`None`) or a readable timespec (# Safety), only read here.
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

/// The answer of a wait's sleeping call, after telling this thread's spin budget how
/// long the wait lasted when [`spin_wait`] sent it to sleep ([`kernel_woke`]).
fn woke(r: c_int) -> c_int {
    kernel_woke();
    r
}

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
    if !spin_pays() {
        // Many replies coming: sleep at once and wake to a batch of them.
        ops::count_kernel_sleep();
        return Spun::Sleep(timeout);
    }
    let t0 = Instant::now();
    let budget = kernel_budget(p.span);
    let limit = timeout.map_or(budget, |t| t.min(budget));
    let seen = signals::counts();
    let answer = spin_for(p, limit, || match probe() {
        0 if signals::counts() != seen => {
            set_errno(libc::EINTR);
            Some(-1)
        }
        0 => None,
        r => Some(r),
    });
    if let Some(r) = answer {
        kernel_waited(p.span, t0);
        return Spun::Done(r);
    }
    let Some(t) = timeout else {
        ops::count_kernel_sleep();
        kernel_sleeps(t0);
        return Spun::Sleep(None);
    };
    let left = t.saturating_sub(t0.elapsed());
    if left.is_zero() {
        return Spun::Done(0);
    }
    ops::count_kernel_sleep();
    kernel_sleeps(t0);
    Spun::Sleep(Some(left))
}

/// Whether `select` waits for input from a ferry socket and for no ferry socket's room
/// to send (then it spins first, as `poll`: [`before_poll`]); asks the server for
/// readiness tokens for the read and exception sets.
///
/// # Safety
/// The sets (read, write, exception) must each be null or a readable, whole `fd_set`
/// (`FD_SETSIZE` bits: all of it is read, whatever `nfds`).
unsafe fn before_select(nfds: c_int, sets: [*const fd_set; 3]) -> bool {
    if !config::active() {
        return false;
    }
    let mut w = Watch::new();
    let (mut input, mut output) = (false, false);
    let nfds = nfds.clamp(0, libc::FD_SETSIZE as c_int) as usize;
    for (k, set) in sets.into_iter().enumerate().filter(|(_, s)| !s.is_null()) {
        // SAFETY: `set` is non-null (filtered) and a readable whole fd_set (# Safety):
        // FD_SETSIZE bits of plain integers, copied out unaligned.
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
    /// The sets must each be null or a whole `fd_set`, readable now and writable for as
    /// long as the returned value is used ([`SelectSets::restore`] writes them).
    unsafe fn save(ptrs: [*mut fd_set; 3]) -> SelectSets {
        // SAFETY: each pointer is null (`None`) or a readable fd_set (# Safety), copied.
        let saved = ptrs.map(|p| unsafe { p.as_ref() }.copied());
        SelectSets { ptrs, saved }
    }

    fn restore(&self) {
        for (p, s) in self.ptrs.iter().zip(&self.saved) {
            if let Some(s) = s {
                // SAFETY: `s` is `Some` only for a non-null pointer, which `save`'s
                // contract keeps writable while `self` is used.
                unsafe { p.write(*s) };
            }
        }
    }
}

/// # Safety
/// As for `poll(2)`: `fds` must be null (`EFAULT` unless `n` is 0) or readable and
/// writable for `n` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: `fds` is valid for `n` entries (# Safety): `before_poll` reads them and
    // libc's `poll` gets them unchanged (the zero-timeout tries too).
    let r = unsafe {
        if before_poll(fds, n) {
            match spin_wait(from_ms(timeout), || real::poll(fds, n, 0)) {
                Spun::Done(r) => r,
                Spun::Sleep(t) => woke(real::poll(fds, n, to_ms(t))),
            }
        } else {
            real::poll(fds, n, timeout)
        }
    };
    // SAFETY: `fds` is valid for `n` entries (# Safety), as `after_poll` asks.
    unsafe { after_poll(fds, n, r) }
}

/// # Safety
/// As for `ppoll(2)`: `fds` as for [`poll`]; `ts` null or a readable `timespec`; `mask`
/// null or a readable `sigset_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: `fds`, `ts` and `mask` are valid (# Safety): `before_poll` reads the
    // array, `from_timespec` the timeout, and libc's `ppoll` gets them unchanged or with
    // the timeout replaced by a local (`ZERO_TS`, or what is left of it).
    let r = unsafe {
        if before_poll(fds, n)
            && let Ok(timeout) = from_timespec(ts)
        {
            match spin_wait(timeout, || real::ppoll(fds, n, &ZERO_TS, mask)) {
                Spun::Done(r) => r,
                Spun::Sleep(Some(t)) => woke(real::ppoll(fds, n, &to_timespec(t), mask)),
                Spun::Sleep(None) => woke(real::ppoll(fds, n, ts, mask)),
            }
        } else {
            real::ppoll(fds, n, ts, mask)
        }
    };
    // SAFETY: `fds` is valid for `n` entries (# Safety), as `after_poll` asks.
    unsafe { after_poll(fds, n, r) }
}

/// # Safety
/// As for glibc's fortified `poll`: `fds` as for [`poll`], in an object of `fdslen`
/// bytes (libc aborts when `n` entries do not fit).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    let fits = (n as usize).saturating_mul(size_of::<pollfd>()) <= fdslen;
    // SAFETY: the shim reads `fds` only when `n` entries fit in `fdslen` bytes (`fits`),
    // then valid (# Safety); libc's `__poll_chk` gets the caller's arguments, with at
    // most the timeout changed, and checks the length itself.
    let r = unsafe {
        if fits && before_poll(fds, n) {
            match spin_wait(from_ms(timeout), || real::__poll_chk(fds, n, 0, fdslen)) {
                Spun::Done(r) => r,
                Spun::Sleep(t) => woke(real::__poll_chk(fds, n, to_ms(t), fdslen)),
            }
        } else {
            real::__poll_chk(fds, n, timeout, fdslen)
        }
    };
    if !fits {
        return r;
    }
    // SAFETY: `n` entries fit in the caller's `fdslen`-byte array (`fits`), valid
    // (# Safety), as `after_poll` asks.
    unsafe { after_poll(fds, n, r) }
}

/// # Safety
/// As for glibc's fortified `ppoll`: `fds` as for [`__poll_chk`], `ts` and `mask` as
/// for [`ppoll`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
    fdslen: size_t,
) -> c_int {
    let fits = (n as usize).saturating_mul(size_of::<pollfd>()) <= fdslen;
    // SAFETY: as in `__poll_chk`, with `ts` read by `from_timespec` only when the shim
    // spins, and `mask` passed on unchanged (# Safety).
    let r = unsafe {
        if fits
            && before_poll(fds, n)
            && let Ok(timeout) = from_timespec(ts)
        {
            let probe = || real::__ppoll_chk(fds, n, &ZERO_TS, mask, fdslen);
            match spin_wait(timeout, probe) {
                Spun::Done(r) => r,
                Spun::Sleep(Some(t)) => {
                    woke(real::__ppoll_chk(fds, n, &to_timespec(t), mask, fdslen))
                }
                Spun::Sleep(None) => woke(real::__ppoll_chk(fds, n, ts, mask, fdslen)),
            }
        } else {
            real::__ppoll_chk(fds, n, ts, mask, fdslen)
        }
    };
    if !fits {
        return r;
    }
    // SAFETY: `n` entries fit in the caller's `fdslen`-byte array (`fits`), valid
    // (# Safety), as `after_poll` asks.
    unsafe { after_poll(fds, n, r) }
}

/// # Safety
/// As for `select(2)`, with glibc's `fd_set`: `r`, `w` and `e` must each be null or a
/// readable and writable whole `fd_set` (`FD_SETSIZE` bits: the shim reads and restores
/// all of it, whatever `n`), and `tv` null or a readable and writable `timeval`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    // SAFETY: `tv` is null or a readable, writable timeval and each set null or a whole
    // readable, writable fd_set (# Safety): what `before_select` and `SelectSets::save`
    // ask (`sets` lives until this returns); libc's `select` gets the caller's pointers,
    // with a local zero timeout during the spin.
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
        woke(real::select(n, r, w, e, tv))
    }
}

/// # Safety
/// As for [`select`], with `ts` null or a readable `timespec` and `mask` null or a
/// readable `sigset_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the sets, `ts` and `mask` are valid (# Safety): what `before_select`,
    // `from_timespec` and `SelectSets::save` ask (`sets` lives until this returns);
    // libc's `pselect` gets the caller's pointers, with a local timeout while spinning.
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
                        return woke(real::pselect(n, r, w, e, &to_timespec(t), mask));
                    }
                }
            }
        }
        woke(real::pselect(n, r, w, e, ts, mask))
    }
}

/// # Safety
/// As for `epoll_ctl(2)`: `ev` must be null (allowed for `EPOLL_CTL_DEL`) or point at a
/// readable `epoll_event`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    if config::active() && op == libc::EPOLL_CTL_ADD && lookup(fd).is_some() {
        EPOLL_ADDED.store(true, Ordering::Relaxed);
    }
    if config::active() && (op == libc::EPOLL_CTL_ADD || op == libc::EPOLL_CTL_MOD) && !ev.is_null()
    {
        // SAFETY: non-null (checked), so a readable epoll_event (# Safety); the field is
        // read unaligned, through a raw place (no reference): the struct is packed on
        // x86-64.
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
    // SAFETY: `ev` null or readable (# Safety), passed on unchanged.
    unsafe { real::epoll_ctl(ep, op, fd, ev) }
}

/// # Safety
/// As for `epoll_wait(2)`: `evs` must be writable for `max` entries.
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
            // SAFETY: `evs` writable for `max` entries (# Safety), passed on unchanged.
            match spin_wait(from_ms(timeout), || unsafe {
                real::epoll_wait(ep, evs, max, 0)
            }) {
                Spun::Done(r) => return r,
                Spun::Sleep(t) => timeout = to_ms(t),
            }
        }
    }
    // SAFETY: `evs` writable for `max` entries (# Safety), passed on unchanged.
    woke(unsafe { real::epoll_wait(ep, evs, max, timeout) })
}

/// # Safety
/// As for `epoll_pwait(2)`: `evs` must be writable for `max` entries and `mask` null or
/// a readable `sigset_t`.
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
            // SAFETY: `evs` and `mask` valid (# Safety), passed on unchanged.
            match spin_wait(from_ms(timeout), || unsafe {
                real::epoll_pwait(ep, evs, max, 0, mask)
            }) {
                Spun::Done(r) => return r,
                Spun::Sleep(t) => timeout = to_ms(t),
            }
        }
    }
    // SAFETY: `evs` and `mask` valid (# Safety), passed on unchanged.
    woke(unsafe { real::epoll_pwait(ep, evs, max, timeout, mask) })
}

/// # Safety
/// As for `epoll_pwait2(2)`: `evs` must be writable for `max` entries, `ts` null or a
/// readable `timespec`, and `mask` null or a readable `sigset_t`.
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
            // SAFETY: `ts` null or a readable timespec (# Safety), as `from_timespec` asks.
            && let Ok(timeout) = unsafe { from_timespec(ts) }
        {
            // SAFETY: `evs` and `mask` valid (# Safety), passed on unchanged; the
            // timeout is a local (`ZERO_TS`, or what is left of the caller's).
            unsafe {
                let probe = || real::epoll_pwait2(ep, evs, max, &ZERO_TS, mask);
                match spin_wait(timeout, probe) {
                    Spun::Done(r) => return r,
                    Spun::Sleep(Some(t)) => {
                        return woke(real::epoll_pwait2(ep, evs, max, &to_timespec(t), mask));
                    }
                    Spun::Sleep(None) => {}
                }
            }
        }
    }
    // SAFETY: `evs`, `ts` and `mask` valid (# Safety), passed on unchanged.
    woke(unsafe { real::epoll_pwait2(ep, evs, max, ts, mask) })
}
