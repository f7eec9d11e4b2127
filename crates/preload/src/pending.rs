//! Errors the server reported on fire-and-forget operations (`CmpKind::AsyncError`),
//! kept per socket id until the next call on that socket reports them (like the kernel's
//! `sk_err`). Any thread's channel may receive one, any thread may report it, so this
//! is a small lock-free table: a word per pending error (`id << 32 | errno`, 0 = free)
//! and a count that lets the common case (no pending error anywhere) skip the scan.
//!
//! An entry must not outlive its socket: the server reports a broken connection again
//! for each send that was still in flight, so errors keep arriving after the program
//! saw the first one and closed the socket. Closing the last descriptor of a socket
//! forgets its entry ([`Pending::forget`]), and a full table first drops the entries
//! of sockets no descriptor names any more ([`Pending::put_or_evict`]): a full table
//! of stale errors once made every later error vanish, and sends into dead connections
//! then kept succeeding.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const SLOTS: usize = 256;

/// The table.
#[derive(Debug)]
pub struct Pending {
    slots: [AtomicU64; SLOTS],
    count: AtomicU32,
}

/// The process's pending errors.
pub static PENDING: Pending = Pending::new();

fn pack(id: u32, errno: i32) -> u64 {
    u64::from(id) << 32 | u64::from(errno as u32)
}

impl Pending {
    /// An empty table.
    pub const fn new() -> Pending {
        Pending {
            slots: [const { AtomicU64::new(0) }; SLOTS],
            count: AtomicU32::new(0),
        }
    }

    /// Records `errno` (positive) for socket `id`, replacing an earlier one; false when
    /// the table is full (the error is then lost).
    pub fn put(&self, id: u32, errno: i32) -> bool {
        if errno <= 0 {
            return true;
        }
        let new = pack(id, errno);
        for s in &self.slots {
            let w = s.load(Ordering::Acquire);
            if w != 0
                && (w >> 32) as u32 == id
                && s.compare_exchange(w, new, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return true;
            }
        }
        for s in &self.slots {
            if s.compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.count.fetch_add(1, Ordering::AcqRel);
                return true;
            }
        }
        false
    }

    /// [`Pending::put`]; when the table is full, first drops the entries of sockets
    /// for which `live` says no descriptor is left, then tries again.
    pub fn put_or_evict(&self, id: u32, errno: i32, live: impl Fn(u32) -> bool) -> bool {
        if self.put(id, errno) {
            return true;
        }
        for s in &self.slots {
            let w = s.load(Ordering::Acquire);
            if w != 0
                && !live((w >> 32) as u32)
                && s.compare_exchange(w, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.count.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.put(id, errno)
    }

    /// Drops socket `id`'s pending error, if any (its last descriptor was closed).
    pub fn forget(&self, id: u32) {
        let _ = self.take(id, |_| true);
    }

    /// Whether socket `id` has an error pending.
    pub fn has(&self, id: u32) -> bool {
        self.count.load(Ordering::Acquire) != 0
            && self.slots.iter().any(|s| {
                let w = s.load(Ordering::Acquire);
                w != 0 && (w >> 32) as u32 == id
            })
    }

    /// Takes socket `id`'s pending error if `accept(errno)` says so.
    #[inline]
    pub fn take(&self, id: u32, accept: impl Fn(i32) -> bool) -> Option<i32> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        for s in &self.slots {
            let w = s.load(Ordering::Acquire);
            if w == 0 || (w >> 32) as u32 != id || !accept(w as u32 as i32) {
                continue;
            }
            if s.compare_exchange(w, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.count.fetch_sub(1, Ordering::AcqRel);
                return Some(w as u32 as i32);
            }
        }
        None
    }
}

impl Default for Pending {
    fn default() -> Pending {
        Pending::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_reported_once_per_socket() {
        let p = Pending::new();
        assert_eq!(p.take(1, |_| true), None);
        assert!(p.put(1, libc::EPIPE));
        assert!(p.put(2, libc::ECONNRESET));
        assert!(p.put(1, libc::ECONNREFUSED)); // replaces
        assert_eq!(p.take(3, |_| true), None);
        assert_eq!(p.take(1, |e| e != libc::ECONNREFUSED), None);
        assert_eq!(p.take(1, |_| true), Some(libc::ECONNREFUSED));
        assert_eq!(p.take(1, |_| true), None);
        assert_eq!(p.take(2, |_| true), Some(libc::ECONNRESET));
        assert_eq!(p.count.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_table_refuses() {
        let p = Pending::new();
        for id in 0..SLOTS as u32 {
            assert!(p.put(id + 1, libc::EPIPE));
        }
        assert!(!p.put(1000, libc::EPIPE));
        assert!(p.put(5, libc::EIO)); // replacing still works
        assert_eq!(p.take(5, |_| true), Some(libc::EIO));
        assert!(p.put(1000, libc::EPIPE));
    }

    #[test]
    fn a_full_table_drops_the_errors_of_closed_sockets() {
        let p = Pending::new();
        for id in 0..SLOTS as u32 {
            assert!(p.put(id + 1, libc::EPIPE));
        }
        // Sockets 1..=10 are still open; the rest were closed with errors pending.
        let live = |id: u32| id <= 10;
        assert!(p.put_or_evict(1000, libc::ECONNRESET, live));
        assert_eq!(p.take(1000, |_| true), Some(libc::ECONNRESET));
        for id in 1..=10 {
            assert_eq!(p.take(id, |_| true), Some(libc::EPIPE), "socket {id}");
        }
        assert_eq!(p.count.load(Ordering::Relaxed), 0);
        // Every one open: still refused, nothing lost.
        for id in 0..SLOTS as u32 {
            assert!(p.put(id + 1, libc::EPIPE));
        }
        assert!(!p.put_or_evict(1000, libc::EPIPE, |_| true));
        assert_eq!(p.count.load(Ordering::Relaxed), SLOTS as u32);
    }

    #[test]
    fn a_forgotten_error_is_gone() {
        let p = Pending::new();
        assert!(p.put(7, libc::EPIPE));
        p.forget(7);
        p.forget(8);
        assert!(!p.has(7));
        assert_eq!(p.count.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn zero_is_not_an_error() {
        let p = Pending::new();
        assert!(p.put(1, 0));
        assert_eq!(p.take(1, |_| true), None);
    }
}
