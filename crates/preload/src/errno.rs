//! Errors inside the shim: every internal function returns `Result<T, Errno>`; the value
//! becomes the thread's `errno` (and a `-1` return) only at the C boundary
//! ([`crate::exports`]).

use std::io;

/// A positive `errno` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

/// The shim's result type.
pub type Res<T> = Result<T, Errno>;

impl Errno {
    /// `EIO`: an internal failure (a broken channel, a bug).
    pub const EIO: Errno = Errno(libc::EIO);
    /// `EINVAL`.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// `EAGAIN`.
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    /// `EINTR`.
    pub const EINTR: Errno = Errno(libc::EINTR);
    /// `EFAULT`.
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    /// `ECONNRESET`: the server went away.
    pub const ECONNRESET: Errno = Errno(libc::ECONNRESET);

    /// The errno of an `io::Error` (`EIO` when it has none).
    pub fn from_io(e: &io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// Splits a protocol result (`>= 0` a value, `< 0` a negated errno).
    pub fn check(result: i32) -> Res<u32> {
        if result < 0 {
            Err(Errno(result.saturating_neg()))
        } else {
            Ok(result as u32)
        }
    }
}

impl From<io::Error> for Errno {
    fn from(e: io::Error) -> Errno {
        Errno::from_io(&e)
    }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: glibc's `__errno_location` returns the calling thread's errno, a
    // thread-local `int` valid for the thread's whole life, never null.
    unsafe { *libc::__errno_location() = e };
}

/// Reads the calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: as in `set_errno`: this thread's own errno, valid while it runs.
    unsafe { *libc::__errno_location() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_results_split() {
        assert_eq!(Errno::check(5), Ok(5));
        assert_eq!(Errno::check(0), Ok(0));
        assert_eq!(Errno::check(-libc::EPIPE), Err(Errno(libc::EPIPE)));
        assert_eq!(Errno::check(i32::MIN), Err(Errno(i32::MAX)));
    }

    #[test]
    fn io_errors_keep_their_code() {
        let e = io::Error::from_raw_os_error(libc::ENOTCONN);
        assert_eq!(Errno::from(e), Errno(libc::ENOTCONN));
        assert_eq!(Errno::from(io::Error::other("x")), Errno::EIO);
    }
}
