//! Errors the server reported on fire-and-forget operations (`CmpKind::AsyncError`),
//! kept per socket id until the next call on that socket reports them (like the kernel's
//! `sk_err`). Any thread's channel may receive one, any thread may report it, so this
//! is a small lock-free table: a word per pending error (`id << 32 | errno`, 0 = free)
//! and a count that lets the common case (no pending error anywhere) skip the scan.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const SLOTS: usize = 64;

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
    fn zero_is_not_an_error() {
        let p = Pending::new();
        assert!(p.put(1, 0));
        assert_eq!(p.take(1, |_| true), None);
    }
}
