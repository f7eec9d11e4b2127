//! Which channel a call uses, and what happens to channels at `fork` and `exit`.
//!
//! **Per thread.** Each thread has a *main* channel per protocol server, opened lazily
//! on its first ferry call that needs that server and closed when the thread exits. A
//! socket's calls go to the server serving it (its id says which, S4); new sockets are
//! created through the first server, which assigns them. A call holds its channel for its whole
//! duration (a "busy" flag, with compiler fences because a signal handler can run
//! between any two instructions of the same thread).
//!
//! **Re-entrancy.** A ferry call made while this thread is already inside one (from a
//! signal handler that interrupted the shim) must not touch the busy channel: its rings
//! are in the middle of an operation. It uses the thread's *spare* channel instead (also
//! opened lazily), and a third level of nesting, or a call during thread teardown, opens
//! a temporary channel for just that call. Each channel has its own tags, so the
//! interrupted call later finds its answer undisturbed. (Opening a channel allocates; a
//! handler that interrupts `malloc` inside the shim and then opens its first spare
//! channel could deadlock in malloc. Once open, channels do not allocate.)
//!
//! **Fork.** The child inherits the parent's mappings and descriptors, but the rings
//! belong to the parent's threads: the child must never touch them. A `pthread_atfork`
//! child handler bumps the fork generation and closes the descriptors of every channel
//! of the process (control socket, region memfd, doorbell: a registry of raw numbers, so
//! it needs no lock and no allocation); a channel of an older generation is then leaked
//! (its mapping stays, never used) instead of dropped. The fd cache is kept: the child
//! shares the parent's sockets.
//!
//! **Exit.** A thread's channel, when it is dropped (thread exit, `exit`'s thread-local
//! destructors), rings the doorbell and waits briefly until the server has taken every
//! request; `_exit`/`_Exit` (interposed) do the same for the calling thread. Then
//! `atexit` (or `_exit`) rings every other registered doorbell, so records another
//! thread committed without ringing (doorbell batching) are seen by the server.

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_int;
use std::os::fd::RawFd;
use std::sync::Once;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering, compiler_fence};

use ferry_proto::MAX_SERVERS;

use crate::chan::Channel;
use crate::errno::{Errno, Res};
use crate::{config, real};

static GEN: AtomicU32 = AtomicU32::new(0);

/// The current fork generation (bumped in every child).
pub fn generation() -> u32 {
    GEN.load(Ordering::Acquire)
}

/// One channel place of a thread: a channel per protocol server, opened on first use.
struct Slot {
    busy: Cell<bool>,
    chan: UnsafeCell<[Option<Box<Channel>>; MAX_SERVERS]>,
}

/// Clears the busy flag when a call ends, even by unwinding (the channel is then
/// considered broken).
struct Busy<'a>(&'a Slot);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: the slot is busy, i.e. owned by this frame on this thread; nothing
            // else holds a reference into it while we are unwinding out of the call.
            for ch in unsafe { &mut *self.0.chan.get() }.iter_mut().flatten() {
                ch.dead = true;
            }
        }
        compiler_fence(Ordering::SeqCst);
        self.0.busy.set(false);
    }
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            busy: Cell::new(false),
            chan: UnsafeCell::new([const { None }; MAX_SERVERS]),
        }
    }

    fn enter(&self) -> Busy<'_> {
        self.busy.set(true);
        compiler_fence(Ordering::SeqCst);
        Busy(self)
    }

    /// Runs `f` on this slot's channel to `server`, opening it if needed. The slot must
    /// be idle.
    fn run<R>(&self, server: usize, f: impl FnOnce(&mut Channel) -> Res<R>) -> Res<R> {
        let _busy = self.enter();
        // SAFETY: the busy flag was clear and is now set: no other frame on this thread
        // (a signal handler uses another slot while it is set), and no other thread (the
        // slot is thread-local), refers into the slot until `_busy` drops.
        let chans = unsafe { &mut *self.chan.get() };
        let chan = chans.get_mut(server).ok_or(Errno(libc::EBADF))?;
        match chan
            .as_deref()
            .map(|ch| (ch.fork_gen == generation(), ch.dead))
        {
            Some((false, _)) => std::mem::forget(chan.take()),
            Some((true, true)) => *chan = None,
            _ => {}
        }
        let ch = match chan {
            Some(ch) => ch,
            None => chan.insert(Box::new(Channel::open(server)?)),
        };
        f(ch)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let busy = self.busy.get();
        for chan in self.chan.get_mut() {
            if let Some(ch) = chan.take()
                && (ch.fork_gen != generation() || busy)
            {
                std::mem::forget(ch);
            }
        }
    }
}

struct Slots {
    main: Slot,
    spare: Slot,
}

thread_local! {
    static SLOTS: Slots = const { Slots { main: Slot::new(), spare: Slot::new() } };
}

/// Runs `f` on a channel of this thread to the first server (new sockets are created
/// through it; see the module docs for which channel).
pub fn with_channel<R>(f: impl FnOnce(&mut Channel) -> Res<R>) -> Res<R> {
    with_channel_to(0, f)
}

/// Runs `f` on a channel of this thread to server `server` (the one serving a socket:
/// [`ferry_proto::server_of`] of its id).
pub fn with_channel_to<R>(server: usize, f: impl FnOnce(&mut Channel) -> Res<R>) -> Res<R> {
    let mut f = Some(f);
    let r = SLOTS.try_with(|s| {
        let slot = if !s.main.busy.get() {
            &s.main
        } else if !s.spare.busy.get() {
            &s.spare
        } else {
            return None;
        };
        Some(slot.run(server, f.take()?))
    });
    if let Ok(Some(r)) = r {
        return r;
    }
    let f = f.take().ok_or(Errno::EIO)?;
    let mut ch = Channel::open(server)?;
    f(&mut ch)
}

/// Runs `f` on each of this thread's main channels (to the servers in `servers`, or to
/// every server) that is open, idle and usable: to ring a doorbell before something
/// blocks, or to release a socket. Never opens a channel.
pub fn with_open_channels(servers: Option<usize>, mut f: impl FnMut(&mut Channel)) {
    let _ = SLOTS.try_with(|s| {
        if s.main.busy.get() {
            return;
        }
        let _busy = s.main.enter();
        // SAFETY: as in `Slot::run`: the slot was idle and is now held by this frame.
        let chans = unsafe { &mut *s.main.chan.get() };
        for (i, chan) in chans.iter_mut().enumerate() {
            if servers.is_some_and(|k| k != i) {
                continue;
            }
            if let Some(ch) = chan
                && ch.fork_gen == generation()
                && !ch.dead
            {
                f(ch);
            }
        }
    });
}

/// Raw descriptors of every open channel: `ctl | memfd << 21 | bell << 42`, each + 1.
static REGISTRY: [AtomicU64; 512] = [const { AtomicU64::new(0) }; 512];
const FD_BITS: u32 = 21;
const FD_MASK: u64 = (1 << FD_BITS) - 1;

fn pack(fds: [RawFd; 3]) -> Option<u64> {
    let mut w = 0u64;
    for (i, fd) in fds.into_iter().enumerate() {
        let v = u64::try_from(fd).ok()? + 1;
        if v > FD_MASK {
            return None;
        }
        w |= v << (FD_BITS * i as u32);
    }
    Some(w)
}

fn unpack(w: u64) -> [RawFd; 3] {
    [0, 1, 2].map(|i| ((w >> (FD_BITS * i)) & FD_MASK) as RawFd - 1)
}

/// No registered descriptor is below this (a cheap first test in `close`).
static LOWEST: AtomicI32 = AtomicI32::new(i32::MAX);

/// Records a channel's descriptors; returns its registry slot (`None` if full).
pub fn register(ctl: RawFd, memfd: RawFd, bell: RawFd) -> Option<usize> {
    let w = pack([ctl, memfd, bell])?;
    LOWEST.fetch_min(ctl.min(memfd).min(bell), Ordering::AcqRel);
    REGISTRY.iter().position(|s| {
        s.compare_exchange(0, w, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    })
}

/// Whether `fd` is one of the shim's own descriptors (the program must not close them:
/// for the program they do not exist).
#[inline]
pub fn is_shim_fd(fd: RawFd) -> bool {
    fd >= LOWEST.load(Ordering::Acquire) && shim_fds().any(|f| f == fd)
}

/// The shim's registered descriptors.
pub fn shim_fds() -> impl Iterator<Item = RawFd> {
    REGISTRY
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .filter(|&w| w != 0)
        .flat_map(unpack)
}

/// Calls `f(lo, hi)` for each part of `first..=last` that holds none of the shim's own
/// descriptors (`close_range`/`closefrom` must not close them).
pub fn around_shim_fds(first: u32, last: u32, mut f: impl FnMut(u32, u32)) {
    let mut mine: [u32; 3 * 256] = [0; 3 * 256];
    let mut n = 0;
    if i64::from(last) >= i64::from(LOWEST.load(Ordering::Acquire)) {
        for fd in shim_fds() {
            let fd = fd as u32;
            if (first..=last).contains(&fd) && n < mine.len() {
                mine[n] = fd;
                n += 1;
            }
        }
    }
    let mine = &mut mine[..n];
    mine.sort_unstable();
    let mut lo = first;
    for &fd in mine.iter() {
        if fd > lo {
            f(lo, fd - 1);
        }
        if fd == u32::MAX {
            return;
        }
        lo = fd + 1;
    }
    if lo <= last {
        f(lo, last);
    }
}

/// Forgets a registry slot (before its descriptors are closed).
pub fn unregister(i: usize) {
    REGISTRY[i].store(0, Ordering::Release);
}

/// `pthread_atfork` child handler: see the module docs.
extern "C" fn atfork_child() {
    GEN.fetch_add(1, Ordering::AcqRel);
    crate::signals::after_fork();
    // The child is another process: it claims each inherited socket before it acts on
    // it (the server knows processes, not descriptors).
    crate::fdtable::TABLE.clear_all(crate::fdtable::F_CLAIMED);
    for s in &REGISTRY {
        let w = s.swap(0, Ordering::AcqRel);
        if w != 0 {
            for fd in unpack(w) {
                let _ = ferry_sys::close_raw(fd);
            }
        }
    }
}

/// `_exit(2)` skips `atexit` handlers and thread-local destructors: let the server take
/// this thread's queued requests first (a child that sends and `_exit`s must not lose
/// its data), and ring every other channel's doorbell.
///
/// # Safety
/// None beyond `_exit(2)`'s: `status` is an integer, and the call does not return.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    before_abrupt_exit();
    // SAFETY: an integer; libc's `_exit` ends the process, so nothing of this thread's
    // state is used afterwards.
    unsafe { real::exit_now(real::Exit::Underscore, status) }
}

/// `_Exit(3)`: as [`_exit`].
///
/// # Safety
/// None beyond `_Exit(3)`'s: `status` is an integer, and the call does not return.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    before_abrupt_exit();
    // SAFETY: an integer; libc's `_Exit` ends the process, so nothing of this thread's
    // state is used afterwards.
    unsafe { real::exit_now(real::Exit::Capital, status) }
}

fn before_abrupt_exit() {
    if config::active() {
        let _ = std::panic::catch_unwind(|| with_open_channels(None, Channel::drain));
        at_exit();
    }
}

/// `atexit` handler: rings every doorbell.
extern "C" fn at_exit() {
    for s in &REGISTRY {
        let w = s.load(Ordering::Acquire);
        if w != 0 {
            // SAFETY: never -1 (`unpack` of a registered word); a channel's slot is
            // cleared before its descriptors are closed, so a registered doorbell is
            // open. (A channel closing on another thread between the load and the write
            // could leave the number stale: the write then fails or reaches whatever
            // took the number; no memory is involved.)
            let _ = ferry_sys::eventfd_signal(unsafe { ferry_sys::borrow(unpack(w)[2]) });
        }
    }
}

/// Registers the fork and exit handlers (once per process, at the first channel).
pub fn install_hooks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering handlers with the C library; they touch only atomics and
        // descriptors, and stay valid as long as the library is loaded (it is never
        // unloaded: LD_PRELOAD).
        unsafe {
            libc::pthread_atfork(None, None, Some(atfork_child));
            libc::atexit(at_exit);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_words_round_trip() {
        let w = pack([3, 1000, (1 << 21) - 2]).unwrap();
        assert_eq!(unpack(w), [3, 1000, (1 << 21) - 2]);
        assert_eq!(pack([0, 0, 1 << 21]), None);
        assert_eq!(pack([-1, 0, 0]), None);
        assert_ne!(pack([0, 0, 0]), Some(0));
    }

    #[test]
    fn ranges_skip_shim_descriptors() {
        let slot = register(60_000, 60_002, 60_010).unwrap();
        assert!(is_shim_fd(60_002) && !is_shim_fd(60_001));
        let mut parts = Vec::new();
        around_shim_fds(3, u32::MAX, |a, b| parts.push((a, b)));
        // Other tests may register concurrently: check only around ours.
        assert!(parts.iter().any(|&(a, b)| a <= 59_999 && b == 59_999));
        assert!(parts.contains(&(60_001, 60_001)));
        assert!(parts.iter().any(|&(a, _)| a == 60_011));
        let ours = [60_000, 60_002, 60_010];
        assert!(
            parts
                .iter()
                .all(|&(a, b)| ours.iter().all(|f| !(a..=b).contains(f)))
        );
        let mut parts = Vec::new();
        around_shim_fds(60_000, 60_000, |a, b| parts.push((a, b)));
        assert!(parts.is_empty());
        let mut parts = Vec::new();
        around_shim_fds(5, 9, |a, b| parts.push((a, b)));
        assert_eq!(parts, [(5, 9)]);
        unregister(slot);
    }

    #[test]
    fn registry_slots_are_reused() {
        let a = register(900, 901, 902).unwrap();
        let b = register(903, 904, 905).unwrap();
        assert_ne!(a, b);
        unregister(a);
        let c = register(906, 907, 908).unwrap();
        assert_eq!(a, c);
        unregister(b);
        unregister(c);
    }
}
