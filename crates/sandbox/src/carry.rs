//! Putting a handed-off host socket into a program without the shim (handoff.rs,
//! host_guard.rs): at the caller's fd number (`SECCOMP_IOCTL_NOTIF_ADDFD` with
//! `SECCOMP_ADDFD_FLAG_SETFD`, close-on-exec as the old descriptor had it), with the
//! old file's `O_NONBLOCK`, and with the old file's epoll registrations carried over.
//!
//! Why the epoll registrations: Go (and other event loops) register a socket in their
//! epoll set before `connect`; epoll keys a registration by (file, fd number), so
//! replacing the file at that number leaves the set watching the old file, and the
//! program would wait for ever. The init finds the caller's epoll descriptors
//! (`/proc/TID/fd` links to `anon_inode:[eventpoll]`), the registrations of the old
//! file in their `fdinfo` (`tfd:` lines with its number and inode), takes each epoll
//! file (`pidfd_getfd`) and adds the new file with the same events and data, under the
//! same fd number when that number is free in the init (so that the program's later
//! `EPOLL_CTL_MOD`/`DEL` by number find it; otherwise under the init's own number:
//! events still arrive, those calls fail with `ENOENT`).
//!
//! Runs in the init: no allocation.

use libc::c_int;

use crate::init::{put, put_num};
use crate::sys::errno;

/// Descriptors of the caller scanned at most for epoll sets (a program with more has
/// the registrations in the sets past them not carried).
const FDS_SCANNED: usize = 4096;
/// Registrations carried at most per hand-off.
const CARRIED_MAX: usize = 16;
/// The fd numbers the init takes for itself to key a carried registration as the
/// program's number (above, the init's own number keys it).
const KEYED_BELOW: c_int = 1024;

/// One registration of the old file: the epoll set's fd number in the caller, the
/// events and the data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Registration {
    epfd: c_int,
    events: u32,
    data: u64,
}

/// Puts `host` (the init's descriptor) at fd number `target` of the caller of
/// notification `id` (thread `tid`), replacing `old` (the init's copy of the file that
/// was there): 0, or `-errno` when the kernel refused. The caller's pidfd is taken only
/// when there are registrations to carry (most connects have none).
pub(crate) fn hand_in(
    listener: c_int,
    id: u64,
    (tid, target): (u32, c_int),
    old: c_int,
    host: c_int,
) -> i64 {
    // SAFETY: fcntl(2) with integer arguments on our descriptors.
    unsafe {
        let flags = libc::fcntl(old, libc::F_GETFL);
        let now = libc::fcntl(host, libc::F_GETFL);
        if flags >= 0 && now >= 0 {
            let nb = (now & !libc::O_NONBLOCK) | (flags & libc::O_NONBLOCK);
            libc::fcntl(host, libc::F_SETFL, nb);
        }
    }
    let mut regs = [Registration::default(); CARRIED_MAX];
    let n = registrations(tid, target, inode(old), &mut regs);
    let cloexec = fd_flags(tid, target).is_some_and(|f| f & libc::O_CLOEXEC as u32 != 0);
    let add = libc::seccomp_notif_addfd {
        id,
        flags: libc::SECCOMP_ADDFD_FLAG_SETFD as u32,
        srcfd: host as u32,
        newfd: target as u32,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: ADDFD reads add, a valid seccomp_notif_addfd.
    if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &add) } < 0 {
        return -i64::from(errno());
    }
    if n == 0 {
        return 0;
    }
    // The pidfd names the caller (checked while it still waits), so the sets taken
    // through it are the caller's whatever its tid named during the scan.
    let Ok(pidfd) = crate::host_guard::pidfd_of(listener, id, tid) else {
        return 0;
    };
    for r in &regs[..n] {
        carry(pidfd.raw(), r, target, host);
    }
    0
}

/// Adds `host` to the caller's epoll set of registration `r`, as fd number `target`
/// when that number is free here.
fn carry(pidfd: c_int, r: &Registration, target: c_int, host: c_int) {
    // SAFETY: pidfd_getfd(2) with integer arguments; the result is a new CLOEXEC fd.
    let ep = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, r.epfd, 0) };
    if ep < 0 {
        return;
    }
    let ep = ep as c_int;
    // SAFETY: fcntl(2) with integer arguments; F_GETFD fails with EBADF on a free number.
    // A number past KEYED_BELOW is not taken here: the init's descriptor table would
    // grow to it (and stay grown) at the program's choice.
    let free =
        target != ep && target < KEYED_BELOW && unsafe { libc::fcntl(target, libc::F_GETFD) } < 0;
    // SAFETY: dup3 onto a number this process does not use (checked above; the init
    // is single-threaded).
    let key = if free && unsafe { libc::dup3(host, target, libc::O_CLOEXEC) } == target {
        target
    } else {
        host
    };
    let mut ev = libc::epoll_event {
        events: r.events,
        u64: r.data,
    };
    // SAFETY: epoll_ctl(2) on our copies; ev is a valid epoll_event.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, key, &mut ev) };
    // SAFETY: our descriptors, closed once.
    unsafe {
        if key != host {
            libc::close(key);
        }
        libc::close(ep);
    }
}

/// The inode of our descriptor `fd` (0 when unknown).
fn inode(fd: c_int) -> u64 {
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } == 0 {
        st.st_ino
    } else {
        0
    }
}

/// `/proc/TID/fdinfo/FD`'s `flags:` (octal), the descriptor's open flags with
/// `O_CLOEXEC` for its close-on-exec bit.
fn fd_flags(tid: u32, fd: c_int) -> Option<u32> {
    let mut buf = [0u8; 512];
    let n = read_fd_file(tid, b"/fdinfo/", fd, &mut buf)?;
    field(&buf[..n], b"flags:").and_then(|v| parse_radix(v, 8))
}

/// Reads `/proc/TID{dir}{fd}` into `buf`.
fn read_fd_file(tid: u32, dir: &[u8], fd: c_int, buf: &mut [u8]) -> Option<usize> {
    let mut file = [0u8; 32];
    let mut at = put(&mut file, 0, dir);
    at = put_num(&mut file, at, fd as u64);
    put(&mut file, at, b"\0");
    crate::watch::read_proc(tid, &file, buf)
}

/// The registrations of the file with inode `ino` at number `fd` in thread `tid`'s
/// epoll sets, into `out`; how many.
fn registrations(tid: u32, fd: c_int, ino: u64, out: &mut [Registration]) -> usize {
    let Some(dir) = crate::watch::open_proc(tid, b"/fd\0") else {
        return 0;
    };
    let mut found = 0;
    let mut scanned = 0;
    let mut buf = [0u8; 4096];
    'dents: loop {
        // SAFETY: getdents64 writes at most buf.len() bytes into buf.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut at = 0;
        while at + 19 < n as usize {
            let reclen = usize::from(u16::from_ne_bytes([buf[at + 16], buf[at + 17]]));
            if reclen == 0 {
                break 'dents;
            }
            let name = &buf[at + 19..(at + reclen).min(n as usize)];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            at += reclen;
            let Some(epfd) = parse_radix(name, 10) else {
                continue;
            };
            scanned += 1;
            if scanned > FDS_SCANNED || found == out.len() {
                break 'dents;
            }
            if is_epoll(dir, name) {
                found += epoll_entries(tid, epfd as c_int, (fd, ino), &mut out[found..]);
            }
        }
    }
    // SAFETY: our fd, closed once.
    unsafe { libc::close(dir) };
    found
}

/// Whether entry `name` of the `/proc/TID/fd` directory `dir` is an epoll set.
fn is_epoll(dir: c_int, name: &[u8]) -> bool {
    let mut path = [0u8; 16];
    if name.len() >= path.len() {
        return false;
    }
    path[..name.len()].copy_from_slice(name);
    let mut link = [0u8; 32];
    // SAFETY: path is NUL-terminated; readlinkat writes at most link.len() bytes.
    let n = unsafe {
        libc::readlinkat(
            dir,
            path.as_ptr().cast(),
            link.as_mut_ptr().cast(),
            link.len(),
        )
    };
    n > 0 && &link[..n as usize] == b"anon_inode:[eventpoll]"
}

/// The registrations of (`fd`, `ino`) in epoll set `epfd` of thread `tid`, into `out`.
fn epoll_entries(
    tid: u32,
    epfd: c_int,
    (fd, ino): (c_int, u64),
    out: &mut [Registration],
) -> usize {
    let mut buf = [0u8; 16384];
    let Some(n) = read_fd_file(tid, b"/fdinfo/", epfd, &mut buf) else {
        return 0;
    };
    let mut found = 0;
    for line in buf[..n].split(|&b| b == b'\n') {
        if found == out.len() {
            break;
        }
        if let Some((tfd, events, data, line_ino)) = tfd_line(line)
            && tfd == fd
            && line_ino == ino
        {
            out[found] = Registration { epfd, events, data };
            found += 1;
        }
    }
    found
}

/// An epoll `fdinfo` line `tfd: FD events: HEX data: HEX pos:N ino:HEX sdev:HEX`:
/// (fd, events, data, inode).
fn tfd_line(line: &[u8]) -> Option<(c_int, u32, u64, u64)> {
    if !line.starts_with(b"tfd:") {
        return None;
    }
    let tfd = parse_radix(field(line, b"tfd:")?, 10)?;
    let events = parse_radix(field(line, b"events:")?, 16)?;
    let data = parse_u64(field(line, b"data:")?, 16)?;
    let ino = parse_u64(field(line, b"ino:")?, 16)?;
    Some((tfd as c_int, events, data, ino))
}

/// The value after `key` in `text` (spaces and tabs skipped), up to the next blank.
fn field<'t>(text: &'t [u8], key: &[u8]) -> Option<&'t [u8]> {
    let at = text.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &text[at..];
    let start = rest.iter().position(|&b| b != b' ' && b != b'\t')?;
    let rest = &rest[start..];
    let end = rest
        .iter()
        .position(|&b| b == b' ' || b == b'\t' || b == b'\n')
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

fn parse_radix(s: &[u8], radix: u32) -> Option<u32> {
    parse_u64(s, radix).and_then(|v| u32::try_from(v).ok())
}

fn parse_u64(s: &[u8], radix: u32) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        let d = char::from(b).to_digit(radix)?;
        n.checked_mul(u64::from(radix))?.checked_add(u64::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoll_fdinfo_lines() {
        let line = b"tfd:        7 events: 8000201d data: 7f3c2a1b0008  pos:0 ino:4d2 sdev:8";
        assert_eq!(
            tfd_line(line),
            Some((7, 0x8000_201d, 0x7f3c_2a1b_0008, 0x4d2))
        );
        assert_eq!(tfd_line(b"pos:\t0"), None);
        assert_eq!(
            tfd_line(b"tfd: x events: 1 data: 1 pos:0 ino:1 sdev:0"),
            None
        );
        let info = b"pos:\t0\nflags:\t02004002\nmnt_id:\t15\nino:\t1057\n";
        assert_eq!(
            field(info, b"flags:").and_then(|v| parse_radix(v, 8)),
            Some(0o2004002)
        );
    }

    /// A real epoll set of this process: its registration of a socket is found by
    /// number and inode, and not for another number.
    #[test]
    fn registrations_of_a_socket_in_this_process() {
        // SAFETY: plain system calls on fds this test owns.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLOUT | libc::EPOLLET) as u32,
                u64: 0xfeed,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s, &mut ev), 0);
            let tid = libc::syscall(libc::SYS_gettid) as u32;
            let mut out = [Registration::default(); 4];
            let n = registrations(tid, s, inode(s), &mut out);
            // The kernel adds EPOLLERR and EPOLLHUP to every registration.
            let events = libc::EPOLLOUT | libc::EPOLLET | libc::EPOLLERR | libc::EPOLLHUP;
            assert_eq!(
                &out[..n],
                &[Registration {
                    epfd: ep,
                    events: events as u32,
                    data: 0xfeed
                }]
            );
            assert_eq!(registrations(tid, s + 100, inode(s), &mut out), 0);
            let flags = fd_flags(tid, s).unwrap();
            assert_ne!(flags & libc::O_CLOEXEC as u32, 0);
            libc::close(s);
            libc::close(ep);
        }
    }
}
