//! What a descriptor's new file must take over from the old one when the shim puts a
//! new readiness pair in a ferry socket's place (`ops::renew_pair`: a stream connects
//! again after a refused non-blocking connect). The program sees one socket and one fd
//! number throughout, so everything the kernel keeps per open file or per (epoll set,
//! file) must move with it: the epoll sets the fd was registered in (with their events
//! and user data: an event loop that registered the fd for `EPOLLOUT` during the first
//! attempt waits on that registration for the next one), the status flags
//! (`O_NONBLOCK`, `O_ASYNC`), the signal owner and signal of `O_ASYNC`, and
//! `FD_CLOEXEC`.
//!
//! Epoll keeps its registrations per (file, fd number), and the kernel drops them when
//! the old file goes; nothing in the epoll API lists them, but `/proc/self/fdinfo` of an
//! epoll descriptor does (one `tfd:` line per registration, with the target file's
//! inode). Renewing a pair is rare (a connect retried after a refusal), so the scan of
//! `/proc/self/fd` it costs is paid only then.

use std::ffi::c_int;
use std::os::fd::RawFd;

/// One registration of a descriptor in an epoll set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The epoll descriptor.
    pub epfd: RawFd,
    /// Its event mask (flags such as `EPOLLET` included).
    pub events: u32,
    /// Its user data.
    pub data: u64,
}

/// The registrations of descriptor `fd` (whose file has inode `ino`) found in one epoll
/// descriptor's `fdinfo` text: lines `tfd: N events: HEX data: HEX pos:N ino:HEX sdev:HEX`.
pub fn parse_fdinfo(text: &str, epfd: RawFd, fd: RawFd, ino: u64) -> Option<Registration> {
    text.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        let mut field = |name: &str| {
            let tag = it.find(|w| w.starts_with(name))?;
            match tag.strip_prefix(name) {
                Some("") => it.next().map(str::to_owned),
                Some(v) => Some(v.to_owned()),
                None => None,
            }
        };
        let tfd: RawFd = field("tfd:")?.parse().ok()?;
        let events = u32::from_str_radix(&field("events:")?, 16).ok()?;
        let data = u64::from_str_radix(&field("data:")?, 16).ok()?;
        let tino = u64::from_str_radix(&field("ino:")?, 16).ok()?;
        (tfd == fd && tino == ino).then_some(Registration { epfd, events, data })
    })
}

/// Every registration of `fd` (inode `ino`) in this process's epoll sets.
pub fn registrations(fd: RawFd, ino: u64) -> Vec<Registration> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(epfd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        let is_epoll = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.as_os_str() == "anon_inode:[eventpoll]");
        if !is_epoll {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(format!("/proc/self/fdinfo/{epfd}"))
            && let Some(r) = parse_fdinfo(&text, epfd, fd, ino)
        {
            found.push(r);
        }
    }
    found
}

/// The inode of the file `fd` names.
pub fn inode(fd: RawFd) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `struct stat` into `st`, a live local of that type.
    let r = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    // SAFETY: fstat succeeded, so it filled `st`.
    (r == 0).then(|| unsafe { st.assume_init() }.st_ino)
}

/// What the kernel keeps per open file (or per fd) that the program set on a ferry
/// socket's descriptor: taken from the old file before it is replaced.
#[derive(Debug)]
pub struct Carried {
    fd_flags: c_int,
    status: c_int,
    owner: OwnerEx,
    sig: c_int,
    epoll: Vec<Registration>,
}

/// Linux's `fcntl` commands for the `O_ASYNC` signal and its owner (not in `libc`).
const F_SETSIG: c_int = 10;
const F_GETSIG: c_int = 11;
const F_SETOWN_EX: c_int = 15;
const F_GETOWN_EX: c_int = 16;

/// Linux's `struct f_owner_ex`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct OwnerEx {
    kind: c_int,
    pid: libc::pid_t,
}

/// Status flags a program may set with `F_SETFL` on a socket.
const STATUS: c_int = libc::O_NONBLOCK | libc::O_ASYNC;

impl Carried {
    /// Reads `fd`'s flags, signal owner and epoll registrations, and takes the fd out
    /// of those epoll sets (a registration belongs to the old file: it must not report
    /// that file's hang-up with the program's user data once the fd names another).
    pub fn take(fd: RawFd) -> Carried {
        Carried::take_with(fd, true)
    }

    /// [`Carried::take`], looking for epoll registrations only when `epoll` (the scan of
    /// `/proc/self/fd` costs more than the rest together).
    pub fn take_with(fd: RawFd, epoll: bool) -> Carried {
        let mut owner = OwnerEx::default();
        // SAFETY: integer commands on the program's fd; F_GETOWN_EX writes one
        // `f_owner_ex` into `owner`, a live local.
        let (fd_flags, status, sig) = unsafe {
            let _ = crate::real::fcntl(fd, F_GETOWN_EX, (&raw mut owner) as libc::c_ulong);
            (
                crate::real::fcntl(fd, libc::F_GETFD, 0),
                crate::real::fcntl(fd, libc::F_GETFL, 0),
                crate::real::fcntl(fd, F_GETSIG, 0),
            )
        };
        let epoll = epoll
            .then(|| inode(fd).map(|ino| registrations(fd, ino)))
            .flatten()
            .unwrap_or_default();
        for r in &epoll {
            // SAFETY: integers; EPOLL_CTL_DEL ignores the event pointer.
            let _ = unsafe {
                crate::real::epoll_ctl(r.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut())
            };
        }
        Carried {
            fd_flags,
            status,
            owner,
            sig,
            epoll,
        }
    }

    /// `O_CLOEXEC` if the old fd had `FD_CLOEXEC` (for the `dup3` that replaces it).
    pub fn cloexec(&self) -> c_int {
        if self.fd_flags >= 0 && self.fd_flags & libc::FD_CLOEXEC != 0 {
            libc::O_CLOEXEC
        } else {
            0
        }
    }

    /// Puts it all on `fd`, which now names the new file.
    pub fn give(&self, fd: RawFd) {
        // SAFETY: integer commands on the program's fd; F_SETOWN_EX reads one
        // `f_owner_ex`, a live field of `self`.
        unsafe {
            if self.status >= 0 {
                let now = crate::real::fcntl(fd, libc::F_GETFL, 0);
                if now >= 0 {
                    let v = (now & !STATUS) | (self.status & STATUS);
                    let _ = crate::real::fcntl(fd, libc::F_SETFL, v as libc::c_ulong);
                }
            }
            if self.owner.pid != 0 {
                let _ =
                    crate::real::fcntl(fd, F_SETOWN_EX, (&raw const self.owner) as libc::c_ulong);
            }
            if self.sig > 0 {
                let _ = crate::real::fcntl(fd, F_SETSIG, self.sig as libc::c_ulong);
            }
        }
        for r in &self.epoll {
            let mut ev = libc::epoll_event {
                events: r.events,
                u64: r.data,
            };
            // SAFETY: `ev` is a live local epoll_event; the rest are integers.
            let _ = unsafe { crate::real::epoll_ctl(r.epfd, libc::EPOLL_CTL_ADD, fd, &raw mut ev) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t1038\n\
        tfd:        4 events: 8000001c data:                4  pos:0 ino:55b3 sdev:9\n\
        tfd:       12 events:       19 data:     7f0000000001  pos:0 ino:abc sdev:9\n";

    #[test]
    fn finds_the_registration_of_the_fd_and_file() {
        assert_eq!(
            parse_fdinfo(INFO, 9, 4, 0x55b3),
            Some(Registration {
                epfd: 9,
                events: 0x8000_001c,
                data: 4
            })
        );
        assert_eq!(
            parse_fdinfo(INFO, 9, 12, 0xabc),
            Some(Registration {
                epfd: 9,
                events: 0x19,
                data: 0x7f00_0000_0001
            })
        );
    }

    #[test]
    fn another_file_at_the_same_number_is_not_it() {
        assert_eq!(parse_fdinfo(INFO, 9, 4, 0x55b4), None);
        assert_eq!(parse_fdinfo(INFO, 9, 5, 0x55b3), None);
        assert_eq!(parse_fdinfo("garbage\ntfd: x events: y", 9, 4, 1), None);
    }

    #[test]
    fn a_live_registration_is_found_and_carried() {
        // SAFETY: plain system calls on descriptors made here.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            let mut fds = [0; 2];
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: 0xfeed,
            };
            assert_eq!(
                libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fds[0], &raw mut ev),
                0
            );
            let regs = registrations(fds[0], inode(fds[0]).unwrap());
            assert_eq!(regs.len(), 1);
            assert_eq!(regs[0].epfd, ep);
            assert_eq!(regs[0].data, 0xfeed);
            assert_eq!(regs[0].events & libc::EPOLLET as u32, libc::EPOLLET as u32);
            for fd in [ep, fds[0], fds[1]] {
                libc::close(fd);
            }
        }
    }
}
