//! A thin `epoll(7)` wrapper: register descriptors with a `u64` token, wait for events.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// One readiness event: the registered token and the `EPOLL*` bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The token given at registration.
    pub token: u64,
    /// `EPOLLIN`, `EPOLLOUT`, `EPOLLHUP`… bits.
    pub events: u32,
}

/// An epoll instance.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
    buf: Vec<libc::epoll_event>,
}

impl std::os::fd::AsFd for Epoll {
    /// The instance itself: it polls readable while any registered descriptor is ready
    /// (an epoll inside another's).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Epoll {
    /// Creates an instance (close-on-exec) that returns at most `max_events` per wait.
    pub fn new(max_events: usize) -> io::Result<Epoll> {
        let r = crate::syscall!(libc::SYS_epoll_create1, libc::EPOLL_CLOEXEC)?;
        // SAFETY: the kernel just returned this descriptor; it is ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(r as i32) };
        Ok(Epoll {
            fd,
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; max_events.max(1)],
        })
    }

    fn ctl(&self, op: i32, fd: BorrowedFd<'_>, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        crate::syscall!(
            libc::SYS_epoll_ctl,
            self.fd.as_raw_fd(),
            op,
            fd.as_raw_fd(),
            &mut ev as *mut _
        )
        .map(drop)
    }

    /// Turns a wait's result into events; a signal interrupting the wait is no error.
    fn collect(&self, r: io::Result<i64>, out: &mut Vec<Event>) -> io::Result<()> {
        let n = match r {
            Ok(n) => n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        out.extend(self.buf[..n].iter().map(|e| Event {
            token: e.u64,
            events: e.events,
        }));
        Ok(())
    }

    /// Registers `fd`.
    pub fn add(&self, fd: BorrowedFd<'_>, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    /// Changes a registration.
    pub fn modify(&self, fd: BorrowedFd<'_>, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    /// Removes a registration (closing the descriptor also does).
    pub fn delete(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits at most `timeout` (`epoll_pwait2`: nanosecond resolution) and appends events
    /// to `out`. A signal interrupting the wait yields no events, not an error.
    pub fn wait_for(
        &mut self,
        timeout: std::time::Duration,
        out: &mut Vec<Event>,
    ) -> io::Result<()> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let r = crate::syscall!(
            libc::SYS_epoll_pwait2,
            self.fd.as_raw_fd(),
            self.buf.as_mut_ptr(),
            self.buf.len() as i32,
            &ts as *const libc::timespec,
            std::ptr::null::<libc::sigset_t>(),
            8
        );
        self.collect(r, out)
    }

    /// Waits up to `timeout_ms` (-1 = forever, 0 = poll) and appends events to `out`.
    /// A signal interrupting the wait yields no events, not an error.
    pub fn wait(&mut self, timeout_ms: i32, out: &mut Vec<Event>) -> io::Result<()> {
        let r = crate::syscall!(
            libc::SYS_epoll_pwait,
            self.fd.as_raw_fd(),
            self.buf.as_mut_ptr(),
            self.buf.len() as i32,
            timeout_ms,
            std::ptr::null::<libc::sigset_t>(),
            8
        );
        self.collect(r, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn eventfd_readiness_is_reported_with_its_token() {
        let mut ep = Epoll::new(8).unwrap();
        let efd = crate::eventfd().unwrap();
        ep.add(efd.as_fd(), libc::EPOLLIN as u32, 42).unwrap();
        let mut evs = Vec::new();
        ep.wait(0, &mut evs).unwrap();
        assert!(evs.is_empty());
        crate::eventfd_signal(efd.as_fd()).unwrap();
        ep.wait(1000, &mut evs).unwrap();
        assert_eq!(
            evs,
            vec![Event {
                token: 42,
                events: libc::EPOLLIN as u32
            }]
        );
        assert_eq!(crate::eventfd_drain(efd.as_fd()).unwrap(), 1);
        assert_eq!(crate::eventfd_drain(efd.as_fd()).unwrap(), 0);
    }

    #[test]
    fn fds_cross_a_socketpair() {
        let (a, b) =
            crate::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC).unwrap();
        let efd = crate::eventfd().unwrap();
        crate::send_with_fds(a.as_fd(), b"hi", &[efd.as_fd()]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = crate::recv_with_fds(b.as_fd(), &mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"hi");
        assert_eq!(fds.len(), 1);
        crate::eventfd_signal(fds[0].as_fd()).unwrap();
        assert_eq!(crate::eventfd_drain(efd.as_fd()).unwrap(), 1);
    }
}
