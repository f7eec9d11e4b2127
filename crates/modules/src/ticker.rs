//! The epoch ticker: one thread per [`crate::ModuleHost`] that advances the engine's
//! epoch every `period` while callbacks run, so that a callback past its deadline
//! traps. It parks itself after a while without callbacks (no wake-ups on an idle
//! server); the first callback after that unparks it (one futex wake). The thread is
//! started by the first callback, not with the host: a host made while a process is
//! set up (ferry's configured modules) then starts no thread before the process drops
//! its privileges, and every thread has what the process has.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use wasmtime::Engine;

/// Idle ticks before the ticker parks.
const IDLE_TICKS_BEFORE_PARK: u32 = 64;

#[derive(Debug, Default)]
struct Shared {
    in_flight: AtomicUsize,
    parked: AtomicBool,
    stop: AtomicBool,
}

#[derive(Debug)]
pub(crate) struct Ticker {
    shared: Arc<Shared>,
    engine: Engine,
    period: Duration,
    /// Started by the first [`Ticker::start`]; `None` inside if it could not be.
    thread: std::sync::OnceLock<Option<JoinHandle<()>>>,
}

/// Held while a callback runs; keeps the ticker awake.
#[derive(Debug)]
pub(crate) struct Running<'a>(&'a Ticker);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.shared.in_flight.fetch_sub(1, SeqCst);
    }
}

impl Ticker {
    /// A ticker for `engine`, not running yet.
    pub(crate) fn new(engine: Engine, period: Duration) -> Ticker {
        Ticker {
            shared: Arc::new(Shared::default()),
            engine,
            period,
            thread: std::sync::OnceLock::new(),
        }
    }

    /// Makes sure the thread runs; false when it could not be started (then no deadline
    /// would be enforced: the caller must not run wasm).
    pub(crate) fn start(&self) -> bool {
        self.thread
            .get_or_init(|| Self::spawn(self.engine.clone(), self.period, &self.shared).ok())
            .is_some()
    }

    fn spawn(
        engine: Engine,
        period: Duration,
        shared: &Arc<Shared>,
    ) -> std::io::Result<JoinHandle<()>> {
        let s = Arc::clone(shared);
        thread::Builder::new()
            .name("ferry-modules-epoch".into())
            .spawn(move || {
                let mut idle = 0u32;
                while !s.stop.load(SeqCst) {
                    thread::sleep(period);
                    engine.increment_epoch();
                    if s.in_flight.load(SeqCst) != 0 {
                        idle = 0;
                        continue;
                    }
                    idle += 1;
                    if idle < IDLE_TICKS_BEFORE_PARK {
                        continue;
                    }
                    // Dekker-style hand-shake with `enter`: publish `parked`, then look at
                    // `in_flight` again; `enter` bumps `in_flight`, then looks at `parked`.
                    // With SeqCst on both sides one of us sees the other.
                    s.parked.store(true, SeqCst);
                    if s.in_flight.load(SeqCst) == 0 && !s.stop.load(SeqCst) {
                        thread::park();
                    }
                    s.parked.store(false, SeqCst);
                    idle = 0;
                }
            })
    }

    /// Marks a callback as running until the guard drops.
    pub(crate) fn enter(&self) -> Running<'_> {
        self.shared.in_flight.fetch_add(1, SeqCst);
        if self.shared.parked.load(SeqCst)
            && let Some(Some(t)) = self.thread.get()
        {
            t.thread().unpark();
        }
        Running(self)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take().flatten() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
