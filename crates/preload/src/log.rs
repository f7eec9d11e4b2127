//! Log lines on stderr (prefix `ferry:`), only when `FERRY_LOG` is set. Formatting goes
//! into a stack buffer and out with one raw `write(2)`: no allocation, no lock, so it is
//! usable from any context the shim runs in (signal handlers included).

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

/// Kinds of events logged at most once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Once {
    /// An internal error became `EIO`.
    Internal = 0,
    /// A channel failed (server gone or broken protocol).
    Channel = 1,
    /// A panic was caught at the C boundary.
    Panic = 2,
    /// Control messages on a ferry socket were ignored.
    Cmsg = 3,
    /// An option value too long for a record was refused.
    LongOpt = 4,
    /// The channel could not be opened.
    Open = 5,
    /// The pending-error table was full.
    ErrTable = 6,
    /// An unsupported address family or operation.
    Unsupported = 7,
}

static LOGGED: AtomicU64 = AtomicU64::new(0);

/// Logs `args` unless an event of kind `once` was logged before.
pub fn once(kind: Once, args: fmt::Arguments<'_>) {
    if !crate::config::log_enabled() {
        return;
    }
    let bit = 1u64 << (kind as u8);
    if LOGGED.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
        line(args);
    }
}

/// Logs `args` (when enabled).
pub fn line(args: fmt::Arguments<'_>) {
    if !crate::config::log_enabled() {
        return;
    }
    let mut w = StackBuf {
        buf: [0; 512],
        len: 0,
    };
    let _ = write!(w, "ferry: [{}] ", std::process::id());
    let _ = w.write_fmt(args);
    let _ = w.write_str("\n");
    let n = w.len;
    // SAFETY: 2 is not -1, and the borrow lives for this one `write`; if the program has
    // closed stderr the write fails (EBADF) or goes where the program put descriptor 2,
    // as its own messages would. No memory is involved.
    let _ = ferry_sys::write(unsafe { ferry_sys::borrow(2) }, &w.buf[..n]);
}

/// A truncating formatter into a fixed buffer.
struct StackBuf {
    buf: [u8; 512],
    len: usize,
}

impl Write for StackBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1 - self.len; // keep one byte for the newline
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_buffer_truncates() {
        let mut w = StackBuf {
            buf: [0; 512],
            len: 0,
        };
        for _ in 0..100 {
            let _ = w.write_str("0123456789");
        }
        assert_eq!(w.len, 511);
        let _ = w.write_str("\n");
        assert_eq!(w.len, 511);
    }
}
