//! `ferry-ring`: the shared-memory channel between a sandboxed program and a protocol
//! server.
//!
//! This crate owns the region (a sealed memfd that both sides map), the per-direction
//! single-producer/single-consumer rings of fixed-size records, the pool of data buffers
//! referenced by id, and spin-then-sleep waiting with futex wakes. It is where the
//! project's `unsafe` for shared memory lives, and its contract is that nothing the peer
//! writes into shared memory can cause undefined behaviour, a panic or an out-of-bounds
//! access on this side: every index, length and id read from the region is checked and a
//! violation is a typed [`Error`]. It must not interpret records (that is `ferry-proto`),
//! perform socket I/O or policy (`ferry-server`), or trust the peer for anything but the
//! bytes it sends.
//!
//! # Theory of operation
//!
//! **Layout.** A region is one memfd, sized by [`Layout`] and sealed with
//! `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL` by its creator, so it can never shrink
//! under a reader. It starts with a header (magic, version, the layout, every derived
//! offset, total length) and the two sides' "closed" flags, followed by two rings
//! (A->B carries requests, B->A completions) and then the buffers. A ring is a control
//! block of four 128-byte lines (producer index, consumer index, consumer's wait cell,
//! producer's wait cell) and `ring_slots` slots of `record_size` bytes. [`Region::open`]
//! checks the seals, the file size and the whole header, and keeps a local copy of the
//! layout: nothing in the header is read again. See `layout.rs` for the byte map.
//!
//! **Index protocol.** Indices are free-running `u32`s (slot = index mod capacity). The
//! producer writes slots, then publishes a whole batch with one `Release` store of the
//! tail ([`Producer::commit`]); the consumer loads the tail with `Acquire`, copies records
//! out, and hands a batch of slots back with one `Release` store of the head
//! ([`Consumer::release`]). Each side keeps its own index in local memory as the source
//! of truth and only writes it to shared memory; it reads the peer's index and accepts it
//! only if it moved forward and stays within the capacity of what this side published
//! ([`Error::CorruptIndex`]). The producer caches the consumer's head and reloads it only
//! when the cache says the ring is full. Records are copied with volatile accesses into
//! and out of local memory; no reference to a record in shared memory is handed out, so
//! the caller validates a stable copy.
//!
//! **Sleep/wake protocol** (paper S0, "SBW"). A waiter spins for [`SpinPolicy::span`]
//! (busy for `pure_spin`, then `sched_yield` between checks, paced by [`YieldPacer`];
//! [`AdaptiveSpin`] is the budget a caller gives a span of waits that may be idle); then it reads its futex
//! word, sets its "sleeping" flag, issues `fence(SeqCst)`, re-checks and only then blocks
//! in `FUTEX_WAIT` (not private, so it works across processes). A waker, after
//! publishing, issues `fence(SeqCst)` and takes the flag (an exchange that leaves it
//! clear, so one sleep costs one wake however many publishes follow): only if it was set does it bump
//! the futex word and `FUTEX_WAKE` (or write the consumer's doorbell eventfd, for a
//! consumer that sleeps in epoll: [`Consumer::arm_sleep`]); otherwise it counts a wake
//! avoided. The fences make this Dekker's handshake: either the waiter's re-check sees
//! the publication or the waker sees the flag; the bumped word catches a wake that lands
//! between re-check and block. `wait.rs` has the full argument and `loom_tests.rs`
//! model-checks it. Counters ([`WaitStats`]) are process-local.
//!
//! **Buffers.** Buffer ids `0..bufs_a` belong to side A, the rest to side B. Each side
//! allocates and frees only its own, from a process-local free list with an "is lent"
//! bitmap ([`BufPool`]): an id returned by the peer is checked for range, owner and
//! double free. Any side may read or write any buffer through [`Buffers`], which only
//! accepts spans validated against the buffer bounds ([`BufSpan`]).
//!
//! **Trust.** Side A (the sandbox) is untrusted by side B and vice versa; each side's
//! correctness relies only on its local state and on checks of what it reads. A peer
//! that breaks the protocol can make the channel fail (an [`Error`], or records with
//! garbage content), never this side's memory safety. The closed flags and the sleeping
//! flags are hints: lying about them costs the liar, or at worst a spare system call;
//! each side's count of its sleeps outside the channel
//! ([`Region::count_outside_sleep`]) is a statistic only.
//!
//! ```
//! use std::sync::Arc;
//! use ferry_ring::{Endpoint, Layout, Region, Side, SpinPolicy};
//!
//! let layout = Layout { ring_slots: 256, record_size: 64, bufs_a: 64, bufs_b: 64, buf_size: 4096 };
//! let region = Arc::new(Region::create("demo", layout)?);
//! let mut a: Endpoint<[u64; 8], [u64; 8]> = Endpoint::new(region.clone(), Side::A)?;
//! let mut b: Endpoint<[u64; 8], [u64; 8]> = Endpoint::new(region, Side::B)?;
//! a.tx.push(&[1; 8])?;
//! a.tx.commit();
//! a.tx.notify();
//! b.rx.wait(SpinPolicy::default(), None)?;
//! assert_eq!(b.rx.pop()?, Some([1; 8]));
//! b.rx.release();
//! # Ok::<(), ferry_ring::Error>(())
//! ```

#![cfg_attr(loom, allow(dead_code, unused_imports))]

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
compile_error!("ferry-ring supports 64-bit Linux only (memfd seals, futex, 64-bit offsets)");

pub use bytemuck::{Pod, Zeroable};

mod error;
mod layout;
mod ring;
mod sync;
mod wait;

#[cfg(not(loom))]
mod consumer;
#[cfg(not(loom))]
mod endpoint;
#[cfg(not(loom))]
mod pool;
#[cfg(not(loom))]
mod producer;
#[cfg(not(loom))]
mod region;
#[cfg(not(loom))]
mod sys;

#[cfg(all(test, loom))]
mod loom_tests;

pub use error::Error;
pub use layout::{Layout, MAGIC, Side, VERSION};
pub use wait::{AdaptiveSpin, SpinPolicy, WaitResult, WaitStats, YieldPacer};

#[cfg(not(loom))]
pub use consumer::Consumer;
#[cfg(not(loom))]
pub use endpoint::Endpoint;
#[cfg(not(loom))]
pub use pool::{BufId, BufPool, BufSpan, Buffers};
#[cfg(not(loom))]
pub use producer::Producer;
#[cfg(not(loom))]
#[doc(hidden)]
pub use region::RawRegion;
#[cfg(not(loom))]
pub use region::Region;
