//! Atomics shim: `core` atomics normally, `loom`'s under `--cfg loom` so the index and
//! sleep/wake protocols can be model-checked (see `loom_tests.rs` and `loom.sh`).
//!
//! Only the protocol code (`ring.rs`, `wait.rs`) goes through this module; under loom the
//! shared-memory parts of the crate (region, endpoints, buffers) are not compiled.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, fence};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, fence};

pub(crate) use core::sync::atomic::Ordering;

/// Busy-wait hint for the pure-spin phase.
#[cfg(not(loom))]
pub(crate) fn spin_hint() {
    core::hint::spin_loop();
}

/// Under loom a spinning thread must yield so the model can schedule the other one.
#[cfg(loom)]
pub(crate) fn spin_hint() {
    loom::thread::yield_now();
}

/// Give the core away (`sched_yield`) in the yielding phase of a spin.
#[cfg(not(loom))]
pub(crate) fn yield_now() {
    std::thread::yield_now();
}

#[cfg(loom)]
pub(crate) fn yield_now() {
    loom::thread::yield_now();
}
