//! `sbx [--factory-check] CMD [ARGS…]`: runs CMD in a ferry sandbox (no network but its
//! own `lo`) and exits with its status. SIGINT, SIGTERM and SIGHUP are passed on.
//! Its inet sockets are watched (no shim: the init tells of every process that makes
//! one).
//!
//! `--factory-check` first starts a separate sandbox (`sleep 30`, killed afterwards),
//! creates a TCP listener on its 127.0.0.1 through the socket factory, checks that the
//! socket lives in that sandbox's network namespace and prints "factory ok" (used by
//! the crate's tests as an unprivileged user).

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::exit;

use ferry_sandbox::{Sandbox, SocketWatch, Spec, UserNs, launch};

fn main() {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let factory_check = args.first().is_some_and(|a| a == "--factory-check");
    if factory_check {
        args.remove(0);
    }
    if args.is_empty() {
        eprintln!("usage: sbx [--factory-check] CMD [ARGS…]");
        exit(2);
    }
    let program = args.remove(0);
    let spec = Spec {
        program,
        args,
        env: Vec::new(),
        userns: UserNs::Auto,
        hold: false,
        watch: Some(SocketWatch::default()),
        volumes: Vec::new(),
        raw_icmp: false,
        guard_host_sockets: false,
        handoff_scope: None,
    };
    if factory_check {
        if let Err(e) = check_factory() {
            eprintln!("sbx: factory check failed: {e}");
            exit(125);
        }
        println!("factory ok");
    }
    let mut sandbox = match launch(&spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sbx: {e}");
            exit(125);
        }
    };
    forward_signals(&sandbox);
    match sandbox.wait() {
        Ok(code) => exit(code),
        Err(e) => {
            eprintln!("sbx: {e}");
            exit(125);
        }
    }
}

/// Listener via the factory, bound to 127.0.0.1 (needs to happen in the sandbox netns),
/// and SIOCGSKNS names the same namespace as `netns_fd`.
fn check_factory() -> std::io::Result<()> {
    let spec = Spec {
        program: "sleep".into(),
        args: vec!["30".into()],
        env: Vec::new(),
        userns: UserNs::Auto,
        hold: false,
        watch: None,
        volumes: Vec::new(),
        raw_icmp: false,
        guard_host_sockets: false,
        handoff_scope: None,
    };
    let sandbox = launch(&spec).map_err(std::io::Error::other)?;
    let sandbox = &sandbox;
    let sock = sandbox
        .factory()
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)?;
    // SAFETY: sock is a valid socket; SIOCGSKNS takes no argument and returns a new fd.
    let ns = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGSKNS) };
    if ns == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a fresh fd that nothing else owns.
    let ns = unsafe { OwnedFd::from_raw_fd(ns) };
    let (a, b) = (
        inode(ns.as_raw_fd())?,
        inode(sandbox.netns_fd().as_raw_fd())?,
    );
    if a != b {
        return Err(std::io::Error::other(format!(
            "socket netns {a} != sandbox netns {b}"
        )));
    }
    bind_loopback(sandbox)?.local_addr().map(drop)
}

fn bind_loopback(sandbox: &Sandbox) -> std::io::Result<std::net::TcpListener> {
    let sock = sandbox
        .factory()
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)?;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: addr is a valid sockaddr_in of the given length.
    let ret = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&raw const addr).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if ret == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: listen on a valid, bound socket.
    if unsafe { libc::listen(sock.as_raw_fd(), 16) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(std::net::TcpListener::from(sock))
}

fn inode(fd: i32) -> std::io::Result<u64> {
    std::fs::metadata(format!("/proc/self/fd/{fd}")).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.ino()
    })
}

/// Passes SIGINT, SIGTERM and SIGHUP to the sandbox from a dedicated thread.
fn forward_signals(sandbox: &Sandbox) {
    let signaller = sandbox.signaller();
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t; blocking in the main thread before spawning the
    // forwarder makes every later thread inherit the mask, so sigwait sees them.
    unsafe {
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    std::thread::spawn(move || {
        loop {
            let mut sig = 0;
            // SAFETY: set is initialised and sig is a valid out-pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 && signaller.signal(sig).is_err() {
                return;
            }
        }
    });
}
