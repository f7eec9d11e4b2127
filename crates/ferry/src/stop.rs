//! How `ferry run` ends: the signals it forwards to the program while the program runs,
//! and the bounded wait for its server threads after.
//!
//! SIGINT, SIGTERM, SIGHUP and SIGQUIT are blocked in every thread and taken by one
//! signal thread. While the program runs they go to it (through the sandbox's init), so
//! the program decides, as it would natively. Once it has ended, ferry stops its
//! servers: then any of them ends ferry at once (its directories removed), and without
//! one ferry waits at most [`STOP_GRACE`] for the server threads before it exits with
//! the program's status anyway. A server thread stuck in a loop (a bug, but one a
//! sandbox might find) cannot keep ferry alive, or make it deaf to signals.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

/// The signals ferry takes for itself.
pub const SIGNALS: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Longest ferry waits for its server threads once the program has ended: a NIC
/// server's drain (at most 5 s, `DRAIN_MAX`) and a margin.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

const RUNNING: u8 = 0;
const STOPPING: u8 = 1;
const DONE: u8 = 2;

/// The signal thread (see the module's header).
#[derive(Debug)]
pub struct Signals {
    phase: Arc<AtomicU8>,
}

impl Signals {
    /// Blocks [`SIGNALS`] in this thread (threads started later inherit the mask) and
    /// starts the thread that takes them; `dirs` are removed before an exit on a signal.
    pub fn start(
        program: ferry_sandbox::Signaller,
        dirs: Vec<PathBuf>,
    ) -> std::io::Result<Signals> {
        let _ = ferry_sys::block_signals(&SIGNALS);
        let phase = Arc::new(AtomicU8::new(RUNNING));
        let p = phase.clone();
        // Not joined ([`Signals::finish`]).
        std::thread::Builder::new()
            .name("ferry-signals".into())
            .spawn(move || take_signals(&p, &program, &dirs))?;
        Ok(Signals { phase })
    }

    /// The program has ended and the servers are stopping: a signal now ends ferry.
    pub fn stopping(&self) {
        self.phase.store(STOPPING, Ordering::SeqCst);
    }

    /// The servers have stopped: the thread ends at its next poll, or with the process,
    /// which does not wait for it (a join would add up to the poll's 100 ms to every
    /// run). A signal from here on ends ferry as while stopping.
    pub fn finish(self) {
        self.phase.store(DONE, Ordering::SeqCst);
    }
}

fn take_signals(phase: &AtomicU8, program: &ferry_sandbox::Signaller, dirs: &[PathBuf]) {
    while phase.load(Ordering::SeqCst) != DONE {
        let Ok(Some(sig)) = ferry_sys::wait_signal(&SIGNALS, Duration::from_millis(100)) else {
            continue;
        };
        // The phase may have moved while this thread waited: read it again.
        if phase.load(Ordering::SeqCst) == RUNNING {
            debug!("forwarding signal {sig}");
            let _ = program.signal(sig);
            continue;
        }
        eprintln!("ferry: signal {sig} while stopping the servers: exiting now");
        for d in dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        std::process::exit(128 + sig);
    }
}

/// Waits until `threads` server threads have each said on `ended` that they finished,
/// or `grace` has passed; whether they all finished. Woken by the last one's message,
/// not a poll: a run adds no wait of its own to the servers' stop.
pub fn finished_within(grace: Duration, ended: &Receiver<()>, threads: usize) -> bool {
    let deadline = Instant::now() + grace;
    for _ in 0..threads {
        let left = deadline.saturating_duration_since(Instant::now());
        if ended.recv_timeout(left).is_err() {
            warn!(
                "the servers did not stop within {} s: ferry exits without them (and without their counters)",
                grace.as_secs()
            );
            return false;
        }
    }
    true
}
