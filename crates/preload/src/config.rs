//! Process-wide configuration, read from the environment once: `FERRY_SOCKET` (the
//! server's control socket; unset = the shim is inert and passes everything through),
//! `FERRY_LOG` (log internal errors to stderr) and `FERRY_GUARDED` (the hand-off guard
//! watches the program's calls: see `chan::connect_ctl`).

use std::ffi::OsString;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

const UNKNOWN: u8 = 0;
const INERT: u8 = 1;
const ACTIVE: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static PATH: OnceLock<Option<OsString>> = OnceLock::new();
static LOG: OnceLock<bool> = OnceLock::new();

/// Reads the environment (idempotent). Called from the library constructor and lazily.
pub fn init() {
    let path = PATH.get_or_init(|| std::env::var_os("FERRY_SOCKET").filter(|p| !p.is_empty()));
    LOG.get_or_init(|| std::env::var_os("FERRY_LOG").is_some_and(|v| !v.is_empty() && v != "0"));
    STATE.store(
        if path.is_some() { ACTIVE } else { INERT },
        Ordering::Release,
    );
}

/// Whether the shim relays inet sockets (`FERRY_SOCKET` is set). One load on the fast path.
#[inline]
pub fn active() -> bool {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => true,
        INERT => false,
        _ => {
            init();
            STATE.load(Ordering::Acquire) == ACTIVE
        }
    }
}

/// The control socket's path.
pub fn socket_path() -> Option<&'static OsString> {
    init();
    PATH.get().and_then(Option::as_ref)
}

/// Whether `FERRY_GUARDED` says the hand-off guard watches this process's calls.
pub fn guarded() -> bool {
    static GUARDED: OnceLock<bool> = OnceLock::new();
    *GUARDED.get_or_init(|| std::env::var_os("FERRY_GUARDED").is_some_and(|v| v == "1"))
}

/// Whether `FERRY_LOG` asks for log lines.
pub fn log_enabled() -> bool {
    *LOG.get_or_init(|| std::env::var_os("FERRY_LOG").is_some_and(|v| !v.is_empty() && v != "0"))
}

static RX_PAIR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the servers move connected TCP sockets' received bytes into their fds
/// ([`ferry_proto::HELLO_RX_PAIR`], said in every channel's hello reply).
pub fn rx_pair() -> bool {
    RX_PAIR.load(Ordering::Relaxed)
}

/// A hello reply said so (see [`rx_pair`]).
pub fn set_rx_pair(on: bool) {
    RX_PAIR.store(on, Ordering::Relaxed);
}

static SPIN_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The servers' spin span (S0's SBW, said in every channel's hello reply): how long a
/// wait on ferry sockets polls before it sleeps. Zero until a channel has opened.
pub fn spin() -> std::time::Duration {
    std::time::Duration::from_nanos(SPIN_NS.load(Ordering::Relaxed))
}

/// A hello reply said so (see [`spin`]).
pub fn set_spin(span: std::time::Duration) {
    SPIN_NS.store(span.as_nanos() as u64, Ordering::Relaxed);
}
