//! The servers' seccomp filter (`ferry_server::confine`), installed in a child process:
//! what a server makes still works, what an attacker would want is refused.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use ferry_server::confine;

/// One probe: a name, a system call and its arguments (integers, or addresses of
/// static NUL-terminated strings).
type Probe = (&'static str, libc::c_long, [usize; 5]);

fn probes() -> Vec<Probe> {
    let s = |c: &'static std::ffi::CStr| c.as_ptr() as usize;
    let i = |v: libc::c_long| v as usize;
    vec![
        (
            "socket(AF_INET)",
            libc::SYS_socket,
            [
                i(libc::AF_INET.into()),
                i(libc::SOCK_STREAM.into()),
                0,
                0,
                0,
            ],
        ),
        (
            "socket(AF_UNIX)",
            libc::SYS_socket,
            [
                i(libc::AF_UNIX.into()),
                i(libc::SOCK_STREAM.into()),
                0,
                0,
                0,
            ],
        ),
        (
            "socket(AF_PACKET)",
            libc::SYS_socket,
            [i(libc::AF_PACKET.into()), i(libc::SOCK_RAW.into()), 0, 0, 0],
        ),
        ("execve", libc::SYS_execve, [s(c"/bin/true"), 0, 0, 0, 0]),
        (
            "fork",
            libc::SYS_clone,
            [i(libc::SIGCHLD.into()), 0, 0, 0, 0],
        ),
        ("clone3", libc::SYS_clone3, [0; 5]),
        (
            "ptrace",
            libc::SYS_ptrace,
            [i(libc::PTRACE_ATTACH.into()), 1, 0, 0, 0],
        ),
        (
            "mount",
            libc::SYS_mount,
            [s(c"none"), s(c"/mnt"), s(c"tmpfs"), 0, 0],
        ),
        ("setns", libc::SYS_setns, [0; 5]),
        (
            "unshare",
            libc::SYS_unshare,
            [i(libc::CLONE_NEWNET.into()), 0, 0, 0, 0],
        ),
        ("setuid", libc::SYS_setuid, [0; 5]),
        ("bpf", libc::SYS_bpf, [0; 5]),
        (
            "ioctl(SIOCGIFFLAGS)",
            libc::SYS_ioctl,
            [0, i(libc::SIOCGIFFLAGS as libc::c_long), 0, 0, 0],
        ),
        (
            "ioctl(FIONREAD)",
            libc::SYS_ioctl,
            [0, i(libc::FIONREAD as libc::c_long), 0, 0, 0],
        ),
        (
            "fcntl(F_SETOWN)",
            libc::SYS_fcntl,
            [0, i(libc::F_SETOWN.into()), 0, 0, 0],
        ),
        (
            "prctl(PR_SET_DUMPABLE)",
            libc::SYS_prctl,
            [i(libc::PR_SET_DUMPABLE.into()), 1, 0, 0, 0],
        ),
        ("getpid", libc::SYS_getpid, [0; 5]),
    ]
}

/// Makes one probe's call: its result, or the negated errno.
fn call((_, nr, a): &Probe) -> i64 {
    // SAFETY: the arguments are integers or addresses of static strings; the calls that
    // would act (fork, clone3, execve) are the ones the filter must refuse, and the test
    // fails if one does not.
    let r = unsafe { libc::syscall(*nr, a[0], a[1], a[2], a[3], a[4]) };
    if r == -1 {
        -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        r
    }
}

/// Refused by the filter: `EPERM` (the allowlist) or `ENOSYS` (`clone3`).
fn refused(r: i64) -> bool {
    r == -i64::from(libc::EPERM) || r == -i64::from(libc::ENOSYS)
}

#[test]
fn the_filter_keeps_a_relay_and_refuses_the_rest() {
    let filters = confine::filters().expect("filters build on this architecture");
    let probes = probes();
    let mut fds = [0; 2];
    // SAFETY: a valid out-array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are fresh descriptors of ours.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only installs the prepared filters and makes raw system calls
    // (async-signal-safe), then _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        if confine::install(&filters).is_err() {
            // SAFETY: ends the child.
            unsafe { libc::_exit(2) };
        }
        for p in &probes {
            let v: [u8; 8] = call(p).to_ne_bytes();
            // SAFETY: writes 8 bytes from a valid buffer to our pipe.
            unsafe { libc::write(w.as_raw_fd(), v.as_ptr().cast(), 8) };
        }
        // SAFETY: ends the child.
        unsafe { libc::_exit(0) };
    }
    drop(w);
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut std::fs::File::from(r), &mut out).unwrap();
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(libc::WEXITSTATUS(status), 0, "the filter was not installed");
    let results: Vec<i64> = out
        .chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(results.len(), probes.len());
    let got: Vec<(&str, bool)> = probes
        .iter()
        .zip(&results)
        .map(|((name, _, _), &r)| (*name, refused(r)))
        .collect();
    let want = [
        ("socket(AF_INET)", false),
        ("socket(AF_UNIX)", false),
        ("socket(AF_PACKET)", true),
        ("execve", true),
        ("fork", true),
        ("clone3", true),
        ("ptrace", true),
        ("mount", true),
        ("setns", true),
        ("unshare", true),
        ("setuid", true),
        ("bpf", true),
        ("ioctl(SIOCGIFFLAGS)", true),
        ("ioctl(FIONREAD)", false),
        ("fcntl(F_SETOWN)", true),
        ("prctl(PR_SET_DUMPABLE)", true),
        ("getpid", false),
    ];
    assert_eq!(got, want, "(name, refused by the filter)");
}

#[test]
fn the_allowlist_is_short() {
    // passt allows 31-41 system calls; a Rust server with threads, wasm modules and
    // signal forwarding needs more, but every one is listed for a reason.
    assert!(confine::ALLOWED.len() < 100, "{}", confine::ALLOWED.len());
}
