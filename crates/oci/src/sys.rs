//! The system calls `ferry oci` needs that the rest of ferry does not.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A duplicate of `fd` that a program this process starts inherits (not close-on-exec),
/// numbered 3 or above.
pub fn inheritable_dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: fcntl on a descriptor we borrow; no memory is passed.
    let r = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD, 3) } as libc::c_long)?;
    // SAFETY: the kernel just returned this descriptor; it is ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// Moves the calling thread into the network namespace at `path` (call it before any
/// other thread starts: threads started later inherit it).
pub fn enter_netns(path: &Path) -> io::Result<()> {
    let ns = std::fs::File::open(path)?;
    // SAFETY: setns on a descriptor we own; no memory is passed.
    cvt(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }.into())?;
    Ok(())
}

/// Moves the calling thread into a new network namespace and brings its `lo` up.
pub fn new_netns() -> io::Result<()> {
    // SAFETY: unshare with a flag; no memory is passed.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNET) }.into())?;
    loopback_up()
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket(2) call.
    let fd = cvt(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }.into(),
    )?;
    // SAFETY: socket returned a fresh descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own for the duration of the call.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }.into())?;
    Ok(())
}

/// A pidfd for `pid` (any process, not only a child): readable once it has exited.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0) })?;
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until one of `fds` is readable (or hung up), at most `timeout` (`None`:
/// forever); returns its index, `None` on the timeout.
pub fn wait_any(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Option<usize>> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos()),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    loop {
        // SAFETY: polls is a valid array of polls.len() entries; ts_ptr is null or
        // points at `ts`, which outlives the call; no signal mask.
        let r = unsafe {
            libc::ppoll(
                polls.as_mut_ptr(),
                polls.len() as libc::nfds_t,
                ts_ptr,
                std::ptr::null(),
            )
        };
        match r {
            -1 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            0 => return Ok(None),
            _ => return Ok(polls.iter().position(|p| p.revents != 0)),
        }
    }
}

/// Sends `sig` to the process `pidfd` refers to.
pub fn pidfd_signal(pidfd: BorrowedFd<'_>, sig: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a descriptor we borrow and no siginfo.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfd_of_an_exited_child_is_readable() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let fd = pidfd_open(child.id()).unwrap();
        child.wait().unwrap();
        assert_eq!(wait_any(&[fd.as_fd()], None).unwrap(), Some(0));
        let mut sleeper = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let fd = pidfd_open(sleeper.id()).unwrap();
        assert_eq!(
            wait_any(&[fd.as_fd()], Some(Duration::from_millis(20))).unwrap(),
            None
        );
        pidfd_signal(fd.as_fd(), libc::SIGKILL).unwrap();
        assert_eq!(wait_any(&[fd.as_fd()], None).unwrap(), Some(0));
        sleeper.wait().unwrap();
    }
}
