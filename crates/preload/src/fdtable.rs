//! The process's descriptor cache: for each fd number, whether it is a ferry socket (and
//! which), a descriptor known not to be one, or not known yet.
//!
//! The cache is a two-level table of atomics indexed by fd: 256 chunks of 4096 slots,
//! each chunk `mmap`ed on first store (zero pages: "unknown"), so a lookup is two loads
//! and no lock, and the table costs nothing for fds never seen. Numbers at or above
//! [`MAX_FD`] are never cached (they are probed on every call: correct, slower).
//!
//! The cache is a cache: the truth is the descriptor itself (a ferry socket is the
//! program's end of a readiness pair bound to `"\0ferry:<id>:<random>"`, see
//! `docs/specs/socket-protocol.md`). Entries are dropped when the shim sees the number
//! closed or replaced (`close`, `dup2`, `dup3`, `close_range`, `closefrom`, `fclose`,
//! descriptors received with `SCM_RIGHTS`); an unknown number is identified with one
//! `getsockname`. Besides the identity a slot keeps what the shim must know without
//! asking the server: the socket's `O_NONBLOCK`, type, family, whether readiness tokens
//! were asked for, and its `SO_RCVTIMEO`/`SO_SNDTIMEO`.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Fds below this are cached.
pub const MAX_FD: usize = 1 << 20;
const CHUNK_BITS: usize = 12;
const CHUNK_LEN: usize = 1 << CHUNK_BITS;
const NCHUNKS: usize = MAX_FD / CHUNK_LEN;

/// Slot flag: the slot describes a ferry socket (always set in a ferry entry).
pub const F_FERRY: u32 = 1;
/// The socket is non-blocking (`O_NONBLOCK` on the program's end).
pub const F_NONBLOCK: u32 = 1 << 1;
/// `SOCK_DGRAM` (else `SOCK_STREAM`); valid with [`F_TYPED`].
pub const F_DGRAM: u32 = 1 << 2;
/// `AF_INET6` (else `AF_INET`); valid with [`F_TYPED`].
pub const F_INET6: u32 = 1 << 3;
/// Type and family are known (else ask the server: the fd was identified by name).
pub const F_TYPED: u32 = 1 << 4;
/// `Op::WantToken` has been sent for this socket.
pub const F_WANT: u32 = 1 << 5;
/// The socket has a peer (connected, connecting or accepted): sends need no address.
pub const F_PEER: u32 = 1 << 6;
/// The program shut the socket down for writing: sends fail with `EPIPE`.
pub const F_SHUT_WR: u32 = 1 << 7;
/// The program may write this socket's fd with calls the shim does not see: it was
/// `fdopen`ed, or sits (or sat) on descriptor 0, 1 or 2 where stdio's streams write, or
/// was identified by name (inherited across `exec`, received over `SCM_RIGHTS`). Its
/// sends first wait for such bytes to be taken (`data::pair_taken`).
pub const F_DIRECT: u32 = 1 << 8;
/// This process may act on the socket at the server: it made or accepted it, or has
/// claimed it (`CtlKind::Claim`, with the fd as proof). Not set for sockets identified
/// by name (inherited across `exec`, received with `SCM_RIGHTS`); cleared in a `fork`
/// child, which is another process.
pub const F_CLAIMED: u32 = 1 << 9;
/// The socket came from `accept`: what it sends answers its peer (it awaits no reply,
/// [`FdTable::sent`]).
pub const F_ACCEPTED: u32 = 1 << 10;
/// Highest descriptor stdio writes by default (`stderr`).
pub const STDIO_FDS: i32 = 2;

/// The word of a descriptor known not to be a ferry socket.
const OTHER: u64 = u64::MAX;

/// What the cache says about one fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Not known: identify it.
    Unknown,
    /// Not a ferry socket.
    Other,
    /// A ferry socket.
    Ferry(Sock),
}

/// A ferry socket as seen through one descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sock {
    /// The descriptor (filled in by lookups; not stored).
    pub fd: i32,
    /// Server-assigned socket id.
    pub id: u32,
    /// `F_*` flags.
    pub flags: u32,
}

impl Sock {
    /// A ferry socket with `flags` (`F_FERRY` is added).
    pub fn new(fd: i32, id: u32, flags: u32) -> Sock {
        Sock {
            fd,
            id,
            flags: flags | F_FERRY,
        }
    }

    /// `O_NONBLOCK`.
    pub fn nonblock(&self) -> bool {
        self.flags & F_NONBLOCK != 0
    }

    /// `SOCK_DGRAM`.
    pub fn dgram(&self) -> bool {
        self.flags & F_DGRAM != 0
    }

    /// `AF_INET6`.
    pub fn inet6(&self) -> bool {
        self.flags & F_INET6 != 0
    }

    /// Type and family are known.
    pub fn typed(&self) -> bool {
        self.flags & F_TYPED != 0
    }

    /// Tokens were asked for.
    pub fn wants_tokens(&self) -> bool {
        self.flags & F_WANT != 0
    }

    /// Connected (or connecting, or accepted).
    pub fn has_peer(&self) -> bool {
        self.flags & F_PEER != 0
    }

    /// See [`F_DIRECT`].
    pub fn direct(&self) -> bool {
        self.flags & F_DIRECT != 0
    }

    /// A stream with a peer whose received bytes the server moves into this fd
    /// (`rx_pair`, said by the servers' hello replies): its receives are the fd's own.
    pub fn reads_pair(&self) -> bool {
        crate::config::rx_pair() && self.typed() && !self.dgram() && self.has_peer()
    }

    /// Shut down for writing.
    pub fn shut_wr(&self) -> bool {
        self.flags & F_SHUT_WR != 0
    }
}

fn encode(e: Entry) -> u64 {
    match e {
        Entry::Unknown => 0,
        Entry::Other => OTHER,
        Entry::Ferry(s) => u64::from(s.flags | F_FERRY) << 32 | u64::from(s.id),
    }
}

fn decode(w: u64, fd: i32) -> Entry {
    if w == 0 {
        Entry::Unknown
    } else if w == OTHER {
        Entry::Other
    } else {
        Entry::Ferry(Sock {
            fd,
            id: w as u32,
            flags: (w >> 32) as u32,
        })
    }
}

/// One fd's cached state.
#[derive(Debug, Default)]
struct Slot {
    word: AtomicU64,
    /// `SO_RCVTIMEO` in microseconds (0 = none).
    rcvtimeo_us: AtomicU64,
    /// `SO_SNDTIMEO` in microseconds (0 = none).
    sndtimeo_us: AtomicU64,
    /// The send buffer the program set (`SO_SNDBUF`, in bytes as the kernel counts
    /// them; 0 = never set): a stream's bytes in flight stay within it.
    send_budget: AtomicU64,
    /// The thread that sent on the socket through this fd last (0 = none yet).
    last_sender: AtomicU32,
    /// A digest of the last destination a datagram sent through this fd was admitted
    /// to (0 = none yet).
    last_dest: AtomicU64,
    /// 1 while a reply is awaited: the program sent through this fd (a connected
    /// client socket) and has received nothing through it since ([`FdTable::sent`]).
    awaiting: AtomicU32,
}

type Chunk = [Slot; CHUNK_LEN];

/// The cache. One static instance serves the process ([`TABLE`]); tests make their own.
#[derive(Debug)]
pub struct FdTable {
    chunks: [AtomicPtr<Chunk>; NCHUNKS],
    /// One past the highest fd ever stored (bounds the scans of [`FdTable::update_id`]).
    high: AtomicUsize,
    /// Slots whose `awaiting` is 1: the exchanges in flight ([`FdTable::in_flight`]).
    in_flight: AtomicU32,
}

/// The process's table.
pub static TABLE: FdTable = FdTable::new();

impl FdTable {
    /// An empty table (no memory until the first store).
    pub const fn new() -> FdTable {
        FdTable {
            chunks: [const { AtomicPtr::new(ptr::null_mut()) }; NCHUNKS],
            high: AtomicUsize::new(0),
            in_flight: AtomicU32::new(0),
        }
    }

    fn slot(&self, fd: i32) -> Option<&Slot> {
        let i = usize::try_from(fd).ok().filter(|&i| i < MAX_FD)?;
        let chunk = self.chunks[i >> CHUNK_BITS].load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: a non-null chunk pointer was installed by `slot_mut` and points at a
        // zero-initialised (valid: all atomics) chunk that is never freed while the table
        // lives; `i & (CHUNK_LEN - 1)` is in bounds.
        Some(unsafe { &(*chunk)[i & (CHUNK_LEN - 1)] })
    }

    /// The slot of `fd`, allocating its chunk; `None` beyond `MAX_FD` or when memory runs
    /// out (the fd is then simply not cached).
    fn slot_mut(&self, fd: i32) -> Option<&Slot> {
        if let Some(s) = self.slot(fd) {
            return Some(s);
        }
        let i = usize::try_from(fd).ok().filter(|&i| i < MAX_FD)?;
        let cell = &self.chunks[i >> CHUNK_BITS];
        let fresh = map_chunk()?;
        match cell.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            // SAFETY: `fresh` came from `map_chunk` and was never shared.
            Err(_) => unsafe { unmap_chunk(fresh) },
        }
        self.slot(fd)
    }

    /// What is known about `fd`.
    #[inline]
    pub fn get(&self, fd: i32) -> Entry {
        match self.slot(fd) {
            Some(s) => decode(s.word.load(Ordering::Acquire), fd),
            None => Entry::Unknown,
        }
    }

    /// Records `e` for `fd` (a new descriptor: timeouts reset).
    pub fn set(&self, fd: i32, e: Entry) {
        if let Some(s) = self.slot_mut(fd) {
            s.rcvtimeo_us.store(0, Ordering::Relaxed);
            s.sndtimeo_us.store(0, Ordering::Relaxed);
            s.send_budget.store(0, Ordering::Relaxed);
            s.last_sender.store(0, Ordering::Relaxed);
            s.last_dest.store(0, Ordering::Relaxed);
            self.settle(s);
            s.word.store(encode(e), Ordering::Release);
            self.high.fetch_max(fd as usize + 1, Ordering::AcqRel);
        }
    }

    /// The fds of this process that name socket `id`, lowest first (a scan of the
    /// table up to the highest fd ever stored, skipping chunks never mapped).
    fn fds_of(&self, id: u32) -> impl Iterator<Item = i32> + '_ {
        let high = self.high.load(Ordering::Acquire).min(MAX_FD);
        let mut fd = 0;
        std::iter::from_fn(move || {
            while fd < high {
                if self.chunks[fd >> CHUNK_BITS]
                    .load(Ordering::Acquire)
                    .is_null()
                {
                    fd = ((fd >> CHUNK_BITS) + 1) << CHUNK_BITS;
                    continue;
                }
                let this = fd as i32;
                fd += 1;
                if matches!(self.get(this), Entry::Ferry(s) if s.id == id) {
                    return Some(this);
                }
            }
            None
        })
    }

    /// Sets and clears flags on every fd of this process that names socket `id` (state
    /// the kernel keeps per open file or per socket, changed through one of them).
    pub fn update_id(&self, id: u32, set: u32, clear: u32) {
        for fd in self.fds_of(id) {
            self.update(fd, set, clear);
        }
    }

    /// Whether some fd of this process names socket `id` (a scan of the table: for the
    /// rare cases that need it, such as a table of pending errors that filled up).
    pub fn names(&self, id: u32) -> bool {
        self.fds_of(id).next().is_some()
    }

    /// Clears `flags` on every ferry socket of the table (a `fork` child's first act:
    /// what only the parent had is not the child's).
    pub fn clear_all(&self, flags: u32) {
        let high = self.high.load(Ordering::Acquire).min(MAX_FD);
        for fd in 0..high {
            if let Some(slot) = self.slot(fd as i32) {
                let w = slot.word.load(Ordering::Acquire);
                if w != 0 && w != OTHER {
                    slot.word
                        .fetch_and(!(u64::from(flags) << 32), Ordering::AcqRel);
                }
            }
        }
    }

    /// Forgets `fd` (closed or replaced); returns what was known.
    pub fn clear(&self, fd: i32) -> Entry {
        match self.slot(fd) {
            Some(s) => {
                let old = s.word.swap(0, Ordering::AcqRel);
                s.rcvtimeo_us.store(0, Ordering::Relaxed);
                s.sndtimeo_us.store(0, Ordering::Relaxed);
                s.send_budget.store(0, Ordering::Relaxed);
                s.last_sender.store(0, Ordering::Relaxed);
                s.last_dest.store(0, Ordering::Relaxed);
                self.settle(s);
                decode(old, fd)
            }
            None => Entry::Unknown,
        }
    }

    /// Forgets every fd in `lo..=hi`.
    pub fn clear_range(&self, lo: u32, hi: u32) {
        let hi = (hi as usize).min(MAX_FD - 1);
        let mut fd = lo as usize;
        while fd <= hi {
            let chunk = fd >> CHUNK_BITS;
            if self.chunks[chunk].load(Ordering::Acquire).is_null() {
                fd = (chunk + 1) << CHUNK_BITS;
                continue;
            }
            self.clear(fd as i32);
            fd += 1;
        }
    }

    /// Sets and clears flags of a ferry entry; false when `fd` is not one.
    pub fn update(&self, fd: i32, set: u32, clear: u32) -> bool {
        let Some(s) = self.slot(fd) else { return false };
        let mut w = s.word.load(Ordering::Acquire);
        loop {
            let Entry::Ferry(mut sock) = decode(w, fd) else {
                return false;
            };
            sock.flags = (sock.flags | set) & !clear;
            match s.word.compare_exchange_weak(
                w,
                encode(Entry::Ferry(sock)),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
    }

    /// `sock` sent through `fd`: a connected socket the program made (not an accepted
    /// one, whose sends answer its peer) now awaits a reply, until [`FdTable::received`].
    #[inline]
    pub fn sent(&self, fd: i32, sock: &Sock) {
        if !sock.has_peer() || sock.flags & F_ACCEPTED != 0 {
            return;
        }
        if let Some(s) = self.slot(fd)
            && s.awaiting.load(Ordering::Relaxed) == 0
            && s.awaiting.swap(1, Ordering::Relaxed) == 0
        {
            self.in_flight.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Something was received through `fd`: no reply is awaited there any more.
    #[inline]
    pub fn received(&self, fd: i32) {
        if let Some(s) = self.slot(fd)
            && s.awaiting.load(Ordering::Relaxed) != 0
        {
            self.settle(s);
        }
    }

    /// A slot's awaited reply, if any, is no longer counted (received, or the fd went).
    fn settle(&self, s: &Slot) {
        if s.awaiting.swap(0, Ordering::Relaxed) != 0 {
            // Only the swap that took the 1 subtracts it: never below zero.
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// How many of the process's connected client sockets sent and have received
    /// nothing since: the exchanges it has in flight. A heuristic for spinning
    /// (`chan::spin_pays`); a reply that comes in several reads, a socket used through
    /// two descriptors, or one that never answers only skews it.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// `fd`'s (receive, send) timeouts in microseconds, 0 = none.
    pub fn timeouts(&self, fd: i32) -> (u64, u64) {
        match self.slot(fd) {
            Some(s) => (
                s.rcvtimeo_us.load(Ordering::Relaxed),
                s.sndtimeo_us.load(Ordering::Relaxed),
            ),
            None => (0, 0),
        }
    }

    /// Records `SO_RCVTIMEO` (`send == false`) or `SO_SNDTIMEO`.
    pub fn set_timeout(&self, fd: i32, send: bool, us: u64) {
        if let Some(s) = self.slot_mut(fd) {
            let cell = if send { &s.sndtimeo_us } else { &s.rcvtimeo_us };
            cell.store(us, Ordering::Relaxed);
        }
    }

    /// Records thread `tid` as the last to send through `fd`; true when another
    /// thread did before (its sends may still wait in its channel's ring: see
    /// `Op::Order`).
    pub fn sender_changed(&self, fd: i32, tid: u32) -> bool {
        let Some(s) = self.slot(fd) else { return false };
        if s.last_sender.load(Ordering::Relaxed) == tid {
            return false;
        }
        let before = s.last_sender.swap(tid, Ordering::AcqRel);
        before != 0 && before != tid
    }

    /// Whether a datagram to the destination with digest `dest` (never 0) was admitted
    /// through `fd` last.
    pub fn dest_admitted(&self, fd: i32, dest: u64) -> bool {
        self.slot(fd)
            .is_some_and(|s| s.last_dest.load(Ordering::Relaxed) == dest)
    }

    /// Records that a datagram to `dest` was admitted through `fd`.
    pub fn admit_dest(&self, fd: i32, dest: u64) {
        if let Some(s) = self.slot(fd) {
            s.last_dest.store(dest, Ordering::Relaxed);
        }
    }

    /// `fd`'s send budget in bytes (`SO_SNDBUF` as the kernel counts it), 0 = none set.
    pub fn send_budget(&self, fd: i32) -> u64 {
        self.slot(fd)
            .map_or(0, |s| s.send_budget.load(Ordering::Relaxed))
    }

    /// Records the send budget of every fd that names socket `id` (the send buffer
    /// is the socket's, whichever descriptor set it).
    pub fn set_send_budget(&self, id: u32, bytes: u64) {
        for fd in self.fds_of(id) {
            if let Some(s) = self.slot(fd) {
                s.send_budget.store(bytes, Ordering::Relaxed);
            }
        }
    }

    /// `to` became a duplicate of `from` (`dup*`, `F_DUPFD`): it inherits the entry.
    pub fn copy(&self, from: i32, to: i32) {
        if from == to {
            return;
        }
        match self.get(from) {
            Entry::Unknown => {
                self.clear(to);
            }
            e => {
                let (r, s) = self.timeouts(from);
                let budget = self.send_budget(from);
                self.set(to, e);
                self.set_timeout(to, false, r);
                self.set_timeout(to, true, s);
                if let Some(slot) = self.slot(to) {
                    slot.send_budget.store(budget, Ordering::Relaxed);
                }
                if let Entry::Ferry(sock) = e
                    && to <= STDIO_FDS
                {
                    self.update_id(sock.id, F_DIRECT, 0);
                }
            }
        }
    }
}

impl Default for FdTable {
    fn default() -> FdTable {
        FdTable::new()
    }
}

impl Drop for FdTable {
    fn drop(&mut self) {
        for c in &self.chunks {
            let p = c.swap(ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: `p` came from `map_chunk`; `&mut self` means no reference into
                // it is alive.
                unsafe { unmap_chunk(p) };
            }
        }
    }
}

/// A zeroed chunk from anonymous memory (no malloc: the shim may run in a signal
/// handler).
fn map_chunk() -> Option<*mut Chunk> {
    // SAFETY: an anonymous private mapping with no address hint (not MAP_FIXED) cannot
    // replace existing memory; the result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            size_of::<Chunk>(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// # Safety
/// `p` came from `map_chunk` and nothing refers into it any more.
unsafe fn unmap_chunk(p: *mut Chunk) {
    // SAFETY: `p` is the start of a `map_chunk` mapping of exactly this size, and nothing
    // refers into it any more (# Safety), so unmapping frees no memory still in use.
    unsafe { libc::munmap(p.cast(), size_of::<Chunk>()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let t = FdTable::new();
        assert_eq!(t.get(7), Entry::Unknown);
        t.set(7, Entry::Other);
        assert_eq!(t.get(7), Entry::Other);
        let s = Sock::new(7, 42, F_NONBLOCK | F_DGRAM | F_TYPED);
        t.set(7, Entry::Ferry(s));
        assert_eq!(t.get(7), Entry::Ferry(s));
        let Entry::Ferry(g) = t.get(7) else { panic!() };
        assert!(g.nonblock() && g.dgram() && g.typed() && !g.inet6() && !g.wants_tokens());
        assert_eq!(t.clear(7), Entry::Ferry(s));
        assert_eq!(t.get(7), Entry::Unknown);
    }

    #[test]
    fn id_zero_and_all_flags_stay_distinct_from_markers() {
        let s = Sock::new(
            3,
            u32::MAX,
            F_NONBLOCK | F_DGRAM | F_INET6 | F_TYPED | F_WANT,
        );
        assert_ne!(encode(Entry::Ferry(s)), OTHER);
        assert_eq!(decode(encode(Entry::Ferry(s)), 3), Entry::Ferry(s));
        let z = Sock::new(3, 0, 0);
        assert_ne!(encode(Entry::Ferry(z)), 0);
    }

    #[test]
    fn out_of_range_fds_are_never_cached() {
        let t = FdTable::new();
        t.set(-1, Entry::Other);
        t.set(MAX_FD as i32, Entry::Other);
        assert_eq!(t.get(-1), Entry::Unknown);
        assert_eq!(t.get(MAX_FD as i32), Entry::Unknown);
        t.set((MAX_FD - 1) as i32, Entry::Other);
        assert_eq!(t.get((MAX_FD - 1) as i32), Entry::Other);
    }

    #[test]
    fn flag_updates_touch_only_ferry_entries() {
        let t = FdTable::new();
        t.set(5, Entry::Ferry(Sock::new(5, 9, 0)));
        assert!(t.update(5, F_NONBLOCK, 0));
        assert!(matches!(t.get(5), Entry::Ferry(s) if s.nonblock()));
        assert!(t.update(5, F_WANT, F_NONBLOCK));
        assert!(
            matches!(t.get(5), Entry::Ferry(s) if !s.nonblock() && s.wants_tokens() && s.id == 9)
        );
        t.set(6, Entry::Other);
        assert!(!t.update(6, F_NONBLOCK, 0));
        assert_eq!(t.get(6), Entry::Other);
        assert!(!t.update(8, F_NONBLOCK, 0));
    }

    #[test]
    fn dup_copies_entry_and_timeouts() {
        let t = FdTable::new();
        t.set(3, Entry::Ferry(Sock::new(3, 11, F_NONBLOCK)));
        t.set_timeout(3, false, 1500);
        t.set_timeout(3, true, 2500);
        t.set(9000, Entry::Other);
        t.copy(3, 9000);
        assert_eq!(t.get(9000), Entry::Ferry(Sock::new(9000, 11, F_NONBLOCK)));
        assert_eq!(t.timeouts(9000), (1500, 2500));
        // Copying an unknown fd forgets the target.
        t.copy(4, 9000);
        assert_eq!(t.get(9000), Entry::Unknown);
        assert_eq!(t.timeouts(9000), (0, 0));
    }

    #[test]
    fn updates_by_id_reach_every_duplicate() {
        let t = FdTable::new();
        t.set(3, Entry::Ferry(Sock::new(3, 7, 0)));
        t.set(9000, Entry::Ferry(Sock::new(9000, 7, F_WANT)));
        t.set(9001, Entry::Ferry(Sock::new(9001, 8, 0)));
        t.set(4, Entry::Other);
        t.update_id(7, F_NONBLOCK | F_SHUT_WR, F_WANT);
        assert!(matches!(t.get(3), Entry::Ferry(s) if s.nonblock() && s.flags & F_SHUT_WR != 0));
        assert!(matches!(t.get(9000), Entry::Ferry(s) if s.nonblock() && !s.wants_tokens()));
        assert!(matches!(t.get(9001), Entry::Ferry(s) if !s.nonblock()));
        assert_eq!(t.get(4), Entry::Other);
    }

    #[test]
    fn new_entries_reset_timeouts() {
        let t = FdTable::new();
        t.set(3, Entry::Ferry(Sock::new(3, 1, 0)));
        t.set_timeout(3, false, 10);
        t.set(3, Entry::Ferry(Sock::new(3, 2, 0)));
        assert_eq!(t.timeouts(3), (0, 0));
    }

    #[test]
    fn clear_range_skips_empty_chunks() {
        let t = FdTable::new();
        for fd in [3, 4, 5000, 70000, 1_000_000] {
            t.set(fd, Entry::Other);
        }
        t.clear_range(4, 70000);
        assert_eq!(t.get(3), Entry::Other);
        assert_eq!(t.get(4), Entry::Unknown);
        assert_eq!(t.get(5000), Entry::Unknown);
        assert_eq!(t.get(70000), Entry::Unknown);
        assert_eq!(t.get(1_000_000), Entry::Other);
        t.clear_range(0, u32::MAX);
        assert_eq!(t.get(1_000_000), Entry::Unknown);
    }

    #[test]
    fn concurrent_flag_updates_do_not_lose_bits() {
        let t = std::sync::Arc::new(FdTable::new());
        t.set(10, Entry::Ferry(Sock::new(10, 77, 0)));
        let hs: Vec<_> = [F_NONBLOCK, F_DGRAM, F_INET6, F_WANT]
            .into_iter()
            .map(|f| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        t.update(10, f, 0);
                        t.update(10, 0, f);
                    }
                    t.update(10, f, 0);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let Entry::Ferry(s) = t.get(10) else { panic!() };
        assert_eq!(s.flags, F_FERRY | F_NONBLOCK | F_DGRAM | F_INET6 | F_WANT);
        assert_eq!(s.id, 77);
    }

    #[test]
    fn connected_clients_that_sent_are_in_flight_until_they_receive_or_close() {
        let t = FdTable::new();
        let client = |fd| Sock::new(fd, fd as u32, F_PEER);
        for fd in [3, 4, 5] {
            t.set(fd, Entry::Ferry(client(fd)));
        }
        t.set(6, Entry::Ferry(Sock::new(6, 6, F_PEER | F_ACCEPTED)));
        t.set(7, Entry::Ferry(Sock::new(7, 7, 0)));
        // A second send before the reply counts once; an accepted socket's send is a
        // reply and an unconnected socket's awaits none.
        for fd in [3, 3, 4, 5, 6, 7] {
            let Entry::Ferry(s) = t.get(fd) else { panic!() };
            t.sent(fd, &s);
        }
        assert_eq!(t.in_flight(), 3);
        t.received(3);
        t.received(3);
        t.received(6);
        assert_eq!(t.in_flight(), 2);
        // Closed, or replaced by a new socket: its exchange is no longer awaited.
        t.clear(4);
        t.set(5, Entry::Ferry(client(5)));
        assert_eq!(t.in_flight(), 0);
        // A duplicate starts with no reply awaited.
        let Entry::Ferry(s) = t.get(3) else { panic!() };
        t.sent(3, &s);
        t.copy(3, 9);
        t.received(9);
        assert_eq!(t.in_flight(), 1);
    }
}
