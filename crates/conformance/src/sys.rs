//! The syscall layer of the suite: one macro that turns libc's `-1`/errno convention
//! into `Result<_, Errno>`, errno and signal names, an owned fd, and zero-initialised
//! C structs.
//!
//! Cases print errno *names* (`EAGAIN`), never numbers or `strerror` text, so that the
//! output is the same on every libc and under every shim.

use std::ffi::CStr;
use std::fmt;

use libc::c_int;

/// Runs a libc call and maps a `-1` return to the `errno` it left behind.
///
/// Works for every integer return type (`c_int`, `ssize_t`, `off_t`).
///
/// # Safety contract of every use
/// The call runs inside an `unsafe` block the use site does not spell, so each use
/// takes on the call's C contract, and the suite's cases keep it:
/// - pointer arguments are null where the call allows null, or references to (or
///   `as_ptr()`s of) locals, arrays, vectors and structs the case owns and keeps alive
///   across the call; a `sockaddr_in`/`_in6`/`_un`/`_nl`/`_storage` is passed as a
///   `sockaddr` pointer, as the C API intends;
/// - lengths are those of the buffers or structs passed, or smaller (cases test short
///   lengths on purpose);
/// - descriptors are plain numbers: a wrong or closed one makes the call fail (`EBADF`,
///   which many cases test) and touches no memory; each case runs alone in its own
///   child process, so a descriptor it closes is its own.
///
/// A call whose soundness rests on more than that (`fork`, `clone`, installing a
/// signal handler) is written `sys!(unsafe { … })`, with a SAFETY comment of its own.
macro_rules! sys {
    ($e:expr) => {{
        #[allow(unused_unsafe)]
        // SAFETY: each use passes one libc call whose pointer and length arguments
        // describe memory the calling case owns and keeps alive for the call (the
        // contract above, kept at every use site).
        let r = unsafe { $e };
        if r == -1 {
            Err($crate::sys::Errno::last())
        } else {
            Ok(r)
        }
    }};
}

/// An `errno` value, displayed by its symbolic name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub c_int);

impl Errno {
    /// The calling thread's current `errno`.
    pub fn last() -> Self {
        // SAFETY: glibc's `__errno_location` returns the calling thread's errno, valid
        // for the thread's whole life.
        Errno(unsafe { *libc::__errno_location() })
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match errno_name(self.0) {
            Some(name) => f.write_str(name),
            None => write!(f, "errno{}", self.0),
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Lets `?` turn an `Errno` into the `String` error a case returns.
impl From<Errno> for String {
    fn from(e: Errno) -> String {
        e.to_string()
    }
}

/// Adds the name of the failing step to a set-up error.
pub trait Ctx<T> {
    /// `Err(EAGAIN)` becomes `Err("what=EAGAIN")`.
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for Result<T, Errno> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}={e}"))
    }
}

/// A call's outcome as printed: the value, or the errno name.
pub fn show<T: fmt::Display>(r: Result<T, Errno>) -> String {
    match r {
        Ok(v) => v.to_string(),
        Err(e) => e.to_string(),
    }
}

macro_rules! name_table {
    ($fn:ident, $($name:ident),* $(,)?) => {
        /// The symbolic name of a constant, if it is one the suite knows.
        pub fn $fn(v: c_int) -> Option<&'static str> {
            $(if v == libc::$name { return Some(stringify!($name)); })*
            None
        }
    };
}

name_table!(
    errno_name,
    EPERM,
    ENOENT,
    ESRCH,
    EINTR,
    EIO,
    ENXIO,
    E2BIG,
    ENOEXEC,
    EBADF,
    ECHILD,
    EAGAIN,
    ENOMEM,
    EACCES,
    EFAULT,
    EBUSY,
    EEXIST,
    EXDEV,
    ENODEV,
    ENOTDIR,
    EISDIR,
    EINVAL,
    ENFILE,
    EMFILE,
    ENOTTY,
    EFBIG,
    ENOSPC,
    ESPIPE,
    EROFS,
    EMLINK,
    EPIPE,
    EDOM,
    ERANGE,
    EDEADLK,
    ENAMETOOLONG,
    ENOSYS,
    ENOTEMPTY,
    ELOOP,
    ENOMSG,
    ENOTSOCK,
    EDESTADDRREQ,
    EMSGSIZE,
    EPROTOTYPE,
    ENOPROTOOPT,
    EPROTONOSUPPORT,
    ESOCKTNOSUPPORT,
    EOPNOTSUPP,
    EPFNOSUPPORT,
    EAFNOSUPPORT,
    EADDRINUSE,
    EADDRNOTAVAIL,
    ENETDOWN,
    ENETUNREACH,
    ENETRESET,
    ECONNABORTED,
    ECONNRESET,
    ENOBUFS,
    EISCONN,
    ENOTCONN,
    ESHUTDOWN,
    ETIMEDOUT,
    ECONNREFUSED,
    EHOSTDOWN,
    EHOSTUNREACH,
    EALREADY,
    EINPROGRESS,
    ECANCELED,
    EOVERFLOW,
);

name_table!(
    signal_name,
    SIGHUP,
    SIGINT,
    SIGQUIT,
    SIGILL,
    SIGTRAP,
    SIGABRT,
    SIGBUS,
    SIGFPE,
    SIGKILL,
    SIGUSR1,
    SIGSEGV,
    SIGUSR2,
    SIGPIPE,
    SIGALRM,
    SIGTERM,
    SIGCHLD,
    SIGCONT,
    SIGSTOP,
    SIGSYS,
    SIGURG,
);

/// Describes a wait status: `exit 0`, `signal SIGPIPE`.
pub fn wait_status(status: c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exit {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        match signal_name(sig) {
            Some(name) => format!("signal {name}"),
            None => format!("signal {sig}"),
        }
    } else {
        format!("status {status:#x}")
    }
}

/// A C struct for which all-zero bytes are a valid value.
///
/// # Safety
/// Implement only for `#[repr(C)]` plain-data types without references, niches or
/// invariants (libc's socket, poll, signal and time structs).
pub unsafe trait Plain: Copy {}

macro_rules! plain {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: each type listed is an integer or a libc `#[repr(C)]` struct of
        // integers, arrays and raw pointers (no references, enums or niches), so all-zero
        // bytes are a valid value of it (null pointers, empty sets and addresses).
        unsafe impl Plain for $t {}
    )* };
}

plain!(
    libc::c_int,
    libc::itimerspec,
    libc::sockaddr_storage,
    libc::sockaddr_in,
    libc::sockaddr_in6,
    libc::sockaddr_un,
    libc::sockaddr_nl,
    libc::msghdr,
    libc::mmsghdr,
    libc::iovec,
    libc::epoll_event,
    libc::tcp_info,
    libc::sigaction,
    libc::sigset_t,
    libc::itimerval,
    libc::timeval,
    libc::timespec,
    libc::fd_set,
    libc::addrinfo,
    libc::rlimit,
    libc::stat,
    libc::ucred,
    libc::in_pktinfo,
    libc::in6_pktinfo,
    libc::linger,
    libc::pollfd,
    libc::nlmsghdr,
    libc::posix_spawn_file_actions_t,
);

/// An all-zero `T`.
pub fn zeroed<T: Plain>() -> T {
    // SAFETY: `Plain` promises all-zero bytes are a valid `T`.
    unsafe { std::mem::zeroed() }
}

/// An open file descriptor, closed on drop.
#[derive(Debug)]
pub struct Fd(c_int);

impl Fd {
    /// Takes ownership of `fd`.
    pub fn new(fd: c_int) -> Fd {
        Fd(fd)
    }

    /// The descriptor number.
    pub fn raw(&self) -> c_int {
        self.0
    }

    /// Gives up ownership without closing.
    pub fn into_raw(self) -> c_int {
        let fd = self.0;
        std::mem::forget(self);
        fd
    }

    /// Closes now and reports the result.
    pub fn close(self) -> Result<c_int, Errno> {
        let fd = self.into_raw();
        sys!(libc::close(fd))
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: an integer; `Fd` owns the descriptor (taken in `new`, given up only by
        // `into_raw`, which skips this), so no one else's descriptor is closed.
        unsafe { libc::close(self.0) };
    }
}

/// `pipe2(flags)` as (read end, write end).
pub fn pipe(flags: c_int) -> Result<(Fd, Fd), Errno> {
    let mut fds = [0; 2];
    sys!(libc::pipe2(fds.as_mut_ptr(), flags))?;
    Ok((Fd::new(fds[0]), Fd::new(fds[1])))
}

/// Opens `/dev/null` read-write.
pub fn dev_null() -> Result<Fd, Errno> {
    sys!(libc::open(c"/dev/null".as_ptr(), libc::O_RDWR)).map(Fd::new)
}

/// The fd the kernel would hand out next: what `/dev/null` gets when opened now.
pub fn lowest_free_fd() -> Result<c_int, Errno> {
    let fd = dev_null()?;
    Ok(fd.raw())
}

/// Number of entries in `/proc/self/fd` (including the one used to read it).
pub fn fd_count() -> Result<usize, String> {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .map_err(|e| format!("read_dir /proc/self/fd: {e}"))
}

/// `F_GETFD` as `cloexec`/`inherit`, or the errno.
pub fn cloexec_state(fd: c_int) -> String {
    match sys!(libc::fcntl(fd, libc::F_GETFD)) {
        Ok(v) if v & libc::FD_CLOEXEC != 0 => "cloexec".into(),
        Ok(_) => "inherit".into(),
        Err(e) => e.to_string(),
    }
}

/// `F_GETFL` as `nonblock`/`block`, or the errno.
pub fn nonblock_state(fd: c_int) -> String {
    match sys!(libc::fcntl(fd, libc::F_GETFL)) {
        Ok(v) if v & libc::O_NONBLOCK != 0 => "nonblock".into(),
        Ok(_) => "block".into(),
        Err(e) => e.to_string(),
    }
}

/// Sets or clears `O_NONBLOCK` through `fcntl`.
pub fn set_nonblocking(fd: c_int, on: bool) -> Result<(), Errno> {
    let flags = sys!(libc::fcntl(fd, libc::F_GETFL))?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    sys!(libc::fcntl(fd, libc::F_SETFL, flags)).map(drop)
}

/// Sleeps the calling thread.
pub fn sleep_ms(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// A path for a scratch file of this process: `$TMPDIR/ferry-conformance-PID-NAME`, or
/// under `/tmp` when that would be too long for a unix socket address (108 bytes).
pub fn scratch_path(name: &str) -> String {
    // SAFETY: no arguments; getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    let dir = std::env::temp_dir();
    let path = format!("{}/ferry-conformance-{pid}-{name}", dir.display());
    if path.len() < 100 {
        path
    } else {
        format!("/tmp/ferry-conformance-{pid}-{name}")
    }
}

/// A file holding `content`, open for reading; its name is gone already.
pub fn scratch_file(name: &str, content: &[u8]) -> Result<Fd, String> {
    let path = scratch_path(name);
    std::fs::write(&path, content).map_err(|e| e.to_string())?;
    let cpath = std::ffi::CString::new(path.clone()).map_err(|e| e.to_string())?;
    let f = sys!(libc::open(cpath.as_ptr(), libc::O_RDONLY)).map(Fd::new);
    let _ = std::fs::remove_file(&path);
    f.ctx("open")
}

/// A C string from a NUL-terminated buffer (lossy).
pub fn c_buf_str(buf: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A C string pointer (lossy; empty for NULL).
///
/// # Safety
/// `p` must be null or point at a NUL-terminated string that stays valid during the call.
pub unsafe fn c_ptr_str(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: not null (checked above), so NUL-terminated and valid (# Safety); the
    // bytes are copied out before returning.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
