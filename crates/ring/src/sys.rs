//! The system calls this crate makes, one small wrapper each: -1 becomes `io::Error`,
//! and owned resources are RAII (`OwnedFd`, [`Mmap`]).
//!
//! Every call enters the kernel through `syscall(2)`, never the libc function of the same
//! name: inside a sandboxed program this crate runs under ferry's shim, which replaces
//! libc functions such as `write` and `fcntl`, and calling them by name would recurse into
//! the shim.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use crate::sync::AtomicU32;

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)`.
pub(crate) fn memfd_create(name: &str) -> io::Result<OwnedFd> {
    let name =
        std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    let fd = check(unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), flags) })?;
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `ftruncate(fd, len)`.
pub(crate) fn ftruncate(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: no memory is passed; the descriptor is borrowed, so it is open.
    check(unsafe { libc::syscall(libc::SYS_ftruncate, fd.as_raw_fd(), len) })?;
    Ok(())
}

/// `fcntl(fd, F_ADD_SEALS, seals)`.
pub(crate) fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: no memory is passed; the descriptor is borrowed, so it is open.
    check(unsafe { libc::syscall(libc::SYS_fcntl, fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

/// `fcntl(fd, F_GET_SEALS)`.
pub(crate) fn seals(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: no memory is passed; the descriptor is borrowed, so it is open.
    let s = check(unsafe { libc::syscall(libc::SYS_fcntl, fd.as_raw_fd(), libc::F_GET_SEALS) })?;
    Ok(s as u32)
}

/// `fstat(fd)`: (size, device, inode).
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<(u64, u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is valid for writes of one `struct stat`, which the kernel fills.
    check(unsafe { libc::syscall(libc::SYS_fstat, fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so the kernel initialised `st`.
    let st = unsafe { st.assume_init() };
    Ok((st.st_size as u64, st.st_dev, st.st_ino))
}

/// Write 1 to an eventfd (the doorbell). `EAGAIN` (counter saturated) means the
/// doorbell is already ringing, so it is not an error.
pub(crate) fn eventfd_ring(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: the buffer is 8 readable bytes that outlive the call.
    let r = unsafe { libc::syscall(libc::SYS_write, fd.as_raw_fd(), &raw const one, 8usize) };
    match check(r) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `FUTEX_WAIT` (not private: the word may be shared with another process). Ok means
/// woken (or spurious); errors carry `EAGAIN` (word != expected), `ETIMEDOUT`, `EINTR`.
pub(crate) fn futex_wait(
    word: &AtomicU32,
    expected: u32,
    timeout: Option<Duration>,
) -> io::Result<()> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64 / 2) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned u32 for the duration of the call (the kernel
    // only reads it); `ts_ptr` is null or points to a timespec that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    check(r).map(drop)
}

/// `FUTEX_WAKE` of every waiter on `word` (not private). It cannot fail for a valid
/// address, so the result is ignored.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not dereference anything
    // else.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

/// A shared, read-write mapping of a whole file; unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory addressed by a raw pointer; `Mmap` itself only
// owns it (unmaps once, on drop). Who may access what is decided by its users.
unsafe impl Send for Mmap {}
// SAFETY: `&Mmap` only exposes the pointer and the length (no access to the memory),
// and unmapping needs the owner (`Drop`), so shared references cannot race it.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// `mmap(NULL, len, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0)`.
    pub(crate) fn shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mmap> {
        // SAFETY: asking for a fresh mapping (no fixed address) cannot alias existing
        // memory; the result is checked before use.
        let p = check(unsafe {
            libc::syscall(
                libc::SYS_mmap,
                std::ptr::null_mut::<u8>(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0 as libc::off_t,
            )
        })?;
        let ptr =
            NonNull::new(p as *mut u8).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(Mmap { ptr, len })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is the mapping made in `shared`, unmapped only here;
        // every user holds the owner (`Region`) alive while it uses pointers into it.
        unsafe {
            libc::syscall(libc::SYS_munmap, self.ptr.as_ptr(), self.len);
        }
    }
}
