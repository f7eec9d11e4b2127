//! The hand-off guard's stand-in: a process the init forks to make a `connect`, `bind`
//! or `listen` on a socket of another family than inet (unix, netlink, …) in the
//! caller's place, when the caller's descriptor table is shared with other threads (so
//! letting the call proceed in the kernel would let one of them put a handed-off socket
//! at that fd number first: host_guard.rs).
//!
//! Theory of operation. The init holds its copy of the caller's file (`pidfd_getfd`)
//! and the address it read once. The stand-in is a fork of the init (raw `clone`: the
//! init's rules hold, async-signal-safe only), so it holds them too. It takes the
//! caller's view before the call: its user namespace (`setns`, when not the init's),
//! its root and working directory (`/proc/TID/root`, `/proc/TID/cwd`: unix paths
//! resolve as the caller's would, whatever mount namespace it is in), its umask, its
//! user and group ids and supplementary groups, and its capabilities (never more than
//! the caller's: file permissions and privilege checks judge the stand-in as they would
//! the caller). Abstract unix names and netlink belong to the socket's own network
//! namespace, not the caller's. The call's result (0 or `-errno`) goes back on a pipe
//! the init polls; the stand-in then exits. A call that blocks (a unix connect to a
//! full backlog) blocks the stand-in only; the init kills it if the caller stops
//! waiting.
//!
//! What differs from the caller making the call: the peer credentials a unix
//! connection or listener records (`SO_PEERCRED`) name the stand-in's pid (the ids are
//! the caller's). ferry's own shim makes its control connections from a thread with a
//! descriptor table of its own, so they never need a stand-in.
//!
//! The stand-in keeps only the copy and its pipe (it closes the init's other fds) and
//! cannot be ptraced or read by the command: it is not dumpable (the init's flag,
//! kept), and its memory belongs to the init's user namespace.

use libc::c_int;

use crate::host_guard::{Addr, Call, make};
use crate::sys::errno;
use crate::watch::open_proc;

/// Starts a stand-in that makes `call` on `fd` (the init's copy) with `addr` (or
/// `backlog`) in the view of thread `tid`. Returns the pipe its result comes on and its
/// pidfd, or an errno for the caller.
pub(crate) fn start(
    tid: u32,
    call: Call,
    fd: c_int,
    addr: &Addr,
    backlog: c_int,
) -> Result<(c_int, c_int), c_int> {
    let mut pipe = [-1; 2];
    // SAFETY: pipe2 writes two fds into pipe.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(libc::EAGAIN);
    }
    // SAFETY: the child does only async-signal-safe work (raw system calls on stack
    // data) and ends with _exit.
    let pid = match unsafe { crate::sys::fork_raw(0) } {
        Ok(pid) => pid,
        Err(_) => {
            // SAFETY: our pipe, closed once.
            unsafe { libc::close(pipe[0]) };
            // SAFETY: as above.
            unsafe { libc::close(pipe[1]) };
            return Err(libc::EAGAIN);
        }
    };
    if pid == 0 {
        keep_only(fd, pipe[1]);
        let r = match enter(tid) {
            Ok(()) => make(call, fd, addr, backlog),
            Err(e) => -i64::from(e),
        };
        // SAFETY: writing 8 bytes from a live local; then the child exits.
        unsafe {
            libc::write(pipe[1], (&raw const r).cast(), 8);
            libc::_exit(0)
        }
    }
    // SAFETY: our write end, closed once.
    unsafe { libc::close(pipe[1]) };
    // Opened before the init reaps anything: the pid is still the stand-in's.
    // SAFETY: pidfd_open(2) with integer arguments.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        // SAFETY: the stand-in is our unreaped child; then our pipe, closed once.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::close(pipe[0]);
        }
        return Err(libc::EAGAIN);
    }
    Ok((pipe[0], pidfd as c_int))
}

/// In the stand-in: closes every fd of the init's but `a` and `b` (stdio too: the
/// stand-in holds nothing of the init's it does not need).
fn keep_only(a: c_int, b: c_int) {
    let (lo, hi) = (a.min(b) as u32, a.max(b) as u32);
    for (first, last) in [
        (0, lo.wrapping_sub(1)),
        (lo + 1, hi - 1),
        (hi + 1, u32::MAX),
    ] {
        if first <= last && first != lo && last != hi {
            // SAFETY: close_range(2) with integer arguments, in the stand-in only.
            unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
        }
    }
}

/// The stand-in's result from its pipe `fd` (`EIO` if it died first).
pub(crate) fn result(fd: c_int) -> i64 {
    let mut r = 0i64;
    // SAFETY: reading at most 8 bytes into a live local.
    let n = unsafe { libc::read(fd, (&raw mut r).cast(), 8) };
    if n == 8 { r } else { -i64::from(libc::EIO) }
}

/// In the stand-in: takes thread `tid`'s view (see the module's docs).
fn enter(tid: u32) -> Result<(), c_int> {
    let root = open_proc(tid, b"/root\0").ok_or(libc::ESRCH)?;
    let cwd = open_proc(tid, b"/cwd\0").ok_or(libc::ESRCH)?;
    let userns = open_proc(tid, b"/ns/user\0").ok_or(libc::ESRCH)?;
    let own = crate::host_guard::open_self(b"/proc/self/ns/user\0");
    if ino(Some(userns)) != own.and_then(|fd| ino(Some(fd))) {
        // SAFETY: setns(2) with integer arguments.
        check(unsafe { libc::setns(userns, libc::CLONE_NEWUSER) })?;
    }
    // SAFETY: fchdir/chroot on our fds and a NUL-terminated path.
    unsafe {
        check(libc::fchdir(root))?;
        check(libc::chroot(c".".as_ptr()))?;
        check(libc::fchdir(cwd))?;
    }
    let mut buf = [0u8; 4096];
    let n = crate::watch::read_proc(tid, b"/status\0", &mut buf).ok_or(libc::ESRCH)?;
    Creds::parse(&buf[..n]).ok_or(libc::ESRCH)?.take()
}

/// The inode of `fd` (a namespace's), the fd left open.
fn ino(fd: Option<c_int>) -> Option<u64> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    (unsafe { libc::fstat(fd?, &mut st) } == 0).then_some(st.st_ino)
}

fn check(r: c_int) -> Result<(), c_int> {
    if r == 0 { Ok(()) } else { Err(errno()) }
}

/// The parts of `/proc/TID/status` a stand-in takes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Creds {
    umask: u32,
    /// Real, effective, saved, filesystem.
    uid: [u32; 4],
    gid: [u32; 4],
    groups: [u32; GROUPS],
    ngroups: usize,
    /// Inheritable, permitted, effective.
    caps: [u64; 3],
}

/// Supplementary groups a stand-in takes at most (more: it refuses the call).
const GROUPS: usize = 64;

impl Creds {
    pub(crate) fn parse(status: &[u8]) -> Option<Creds> {
        let mut c = Creds {
            umask: 0o022,
            uid: [0; 4],
            gid: [0; 4],
            groups: [0; GROUPS],
            ngroups: 0,
            caps: [0; 3],
        };
        let umask = status_field(status, b"Umask:\t")?;
        c.umask = umask.iter().try_fold(0u32, |n, &b| {
            (b'0'..=b'7')
                .contains(&b)
                .then(|| n * 8 + u32::from(b - b'0'))
        })?;
        fill(&mut c.uid, status_field(status, b"Uid:\t")?)?;
        fill(&mut c.gid, status_field(status, b"Gid:\t")?)?;
        c.ngroups = fill(&mut c.groups, status_field(status, b"Groups:\t")?)?;
        for (i, key) in [&b"CapInh:\t"[..], b"CapPrm:\t", b"CapEff:\t"]
            .iter()
            .enumerate()
        {
            c.caps[i] = status_hex(status, key)?;
        }
        Some(c)
    }

    /// Becomes these credentials: umask, groups, ids, then capabilities (lowered only;
    /// a stand-in that cannot match the caller's groups refuses the call: `EPERM`).
    fn take(&self) -> Result<(), c_int> {
        // SAFETY: umask, setgroups, setres[ug]id, setfs[ug]id with plain arguments and a
        // live array.
        unsafe {
            libc::umask(self.umask as libc::mode_t);
            if libc::setgroups(self.ngroups, self.groups.as_ptr()) != 0
                && libc::getgroups(0, std::ptr::null_mut()) != 0
            {
                return Err(libc::EPERM);
            }
            check(libc::setresgid(self.gid[0], self.gid[1], self.gid[2]))?;
            check(libc::setresuid(self.uid[0], self.uid[1], self.uid[2]))?;
            libc::setfsgid(self.gid[3]);
            libc::setfsuid(self.uid[3]);
        }
        self.lower_caps()
    }

    fn lower_caps(&self) -> Result<(), c_int> {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: c_int,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const V3: u32 = 0x2008_0522;
        let [inh, prm, eff] = self.caps;
        let half = |v: u64, hi: bool| if hi { (v >> 32) as u32 } else { v as u32 };
        let data = [false, true].map(|hi| Data {
            effective: half(eff, hi),
            permitted: half(prm, hi),
            inheritable: half(inh, hi),
        });
        let mut header = Header {
            version: V3,
            pid: 0,
        };
        // SAFETY: capset reads the header and two data structs (version 3).
        let r = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
        // Raising is refused (EPERM): then the stand-in has fewer than the caller,
        // which only refuses more.
        if r == 0 || errno() == libc::EPERM {
            Ok(())
        } else {
            Err(errno())
        }
    }
}

/// The value of the line of `status` that starts with `key`.
fn status_field<'a>(status: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    status
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(key))
}

/// A hexadecimal field of `status` (the capability sets).
pub(crate) fn status_hex(status: &[u8], key: &[u8]) -> Option<u64> {
    let v = status_field(status, key)?;
    if v.is_empty() || v.len() > 16 {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| {
        let d = (b as char).to_digit(16)?;
        Some(n << 4 | u64::from(d))
    })
}

/// Fills `out` with the decimal numbers of `v` (separated by tabs or spaces); how many.
fn fill(out: &mut [u32], v: &[u8]) -> Option<usize> {
    let mut n = 0;
    for word in v
        .split(|&b| b == b'\t' || b == b' ')
        .filter(|w| !w.is_empty())
    {
        let slot = out.get_mut(n)?;
        *slot = word.iter().try_fold(0u32, |acc, &b| {
            b.is_ascii_digit()
                .then(|| acc.checked_mul(10)?.checked_add(u32::from(b - b'0')))
                .flatten()
        })?;
        n += 1;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gives_the_callers_credentials() {
        let status =
            b"Name:\tpython3\nUmask:\t0027\nState:\tS\nTgid:\t7\nUid:\t1000\t1001\t1002\t1003\n\
Gid:\t100\t101\t102\t103\nFDSize:\t64\nGroups:\t4 24 27 \nCapInh:\t0000000000000000\n\
CapPrm:\t000001ffffffffff\nCapEff:\t0000000000000400\n";
        let c = Creds::parse(status).unwrap();
        assert_eq!(c.umask, 0o027);
        assert_eq!(c.uid, [1000, 1001, 1002, 1003]);
        assert_eq!(c.gid, [100, 101, 102, 103]);
        assert_eq!(&c.groups[..c.ngroups], &[4, 24, 27]);
        assert_eq!(c.caps, [0, 0x1ff_ffff_ffff, 0x400]);
        // No groups; a missing line, a bad number, too many groups: no credentials.
        let none = b"Umask:\t0022\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\nCapInh:\t0\nCapPrm:\t0\nCapEff:\t0\n";
        assert_eq!(Creds::parse(none).unwrap().ngroups, 0);
        assert!(Creds::parse(&none[..none.len() - 10]).is_none());
        let bad = b"Umask:\t0022\nUid:\t0\t0\tx\t0\nGid:\t0\t0\t0\t0\nGroups:\t\nCapInh:\t0\nCapPrm:\t0\nCapEff:\t0\n";
        assert!(Creds::parse(bad).is_none());
        let many: String = (0..=GROUPS).map(|g| format!("{g} ")).collect();
        let text = format!(
            "Umask:\t0022\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t{many}\nCapInh:\t0\nCapPrm:\t0\nCapEff:\t0\n"
        );
        assert!(Creds::parse(text.as_bytes()).is_none());
    }
}
