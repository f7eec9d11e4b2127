//! A private network namespace for the server target: nothing the server under test
//! does reaches beyond this process's own `lo`.

use std::io;

/// Moves the calling thread (and the threads it starts later) into a new network
/// namespace and brings its `lo` up. Needs root (`CAP_SYS_ADMIN`, `CAP_NET_ADMIN`).
pub fn isolate() {
    // SAFETY: unshare(CLONE_NEWNET) only changes which network namespace this thread's
    // later sockets live in; it touches no memory and no descriptor table.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        panic!(
            "the server target needs root for a network namespace of its own: {}",
            io::Error::last_os_error()
        );
    }
    lo_up().expect("bringing lo up in the fuzz namespace");
}

/// `ip link set lo up`, by `SIOCGIFFLAGS`/`SIOCSIFFLAGS`.
fn lo_up() -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let sock = ferry_sys::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)?;
    // SAFETY: `ifreq` is plain data (a name and a union of integers); all zeros is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `ifr` names an interface and lives across the call; SIOCGIFFLAGS writes
    // only its flags member.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS has just initialised the union's flags member.
    unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as for SIOCGIFFLAGS; the kernel only reads `ifr`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
