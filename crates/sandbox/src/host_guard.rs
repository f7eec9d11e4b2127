//! The hand-off guard (`Spec::guard_host_sockets`, ferry's `--handoff`): a handed-off
//! socket is the host's own connected TCP socket, put into the command at its fd
//! number; the guard keeps it from being re-aimed (docs/DESIGN.md, "Hand-off").
//!
//! Theory of operation. Whoever holds a socket of the host's network namespace can
//! dissolve its connection (`connect` with `AF_UNSPEC`) and connect it anywhere the host
//! reaches (the host's loopback services, destinations the policy denies), `bind` and
//! `listen` on the host, connect it implicitly (`MSG_FASTOPEN` on a send) or route it
//! through other hosts (`IP_OPTIONS`, `IPV6_RTHDR`). Options that need privilege over
//! the host's network are checked against the user namespace that owns it, which the
//! command's is not: they fail already. So the command's filter ([`filter`], in place of
//! the socket watch's and with it) fails fast-open sends and those two options with
//! `EPERM` for every socket (rare, and no judgement to race), and makes `connect`,
//! `bind` and `listen` user notifications; the init
//! ([`answer`]) takes the caller's descriptor (`pidfd_getfd`) and asks the kernel which
//! network namespace the socket is in (`SO_NETNS_COOKIE`): an inet socket of any
//! namespace but the sandbox's gets `EPERM`; a descriptor that is no longer open gets
//! `EBADF`, one that is not a socket `ENOTSOCK`; the rest proceed in the kernel. The
//! filter also fails `io_uring_setup` (`ENOSYS`: io_uring's connect, bind and listen
//! bypass seccomp) and kills a process that makes a system call of another
//! architecture (a 32-bit program's `socketcall` would name none of the calls above).
//!
//! Known hole (docs/DESIGN.md): "proceed" is `SECCOMP_USER_NOTIF_FLAG_CONTINUE`; a
//! thread that `dup2`s a handed-off socket onto the fd number between the init's look
//! and the kernel's call re-aims it. The fix is to make the call in the init on its
//! duplicate of the file instead of continuing.

use libc::{c_int, sock_filter};

use crate::sys::errno;
use crate::watch::X32_SYSCALL_BIT;

/// `SO_NETNS_COOKIE` (Linux 5.14; not in the libc crate).
const SO_NETNS_COOKIE: c_int = 71;
/// `PIDFD_THREAD` (Linux 6.9: a pidfd of a thread, not only of a process leader).
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// Where a jump goes: an action, or a named block of [`program`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum To {
    Allow,
    Notify,
    Eperm,
    Enosys,
    Kill,
    /// The next instruction.
    Next,
    Block(Block),
}

/// The blocks of [`program`] that look at arguments.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Block {
    Calls,
    Socket,
    /// Flags in argument 3 (`sendto`, `sendmmsg`).
    Flags3,
    /// Flags in argument 2 (`sendmsg`).
    Flags2,
    Setsockopt,
    SetsockoptV6,
}

/// One instruction, jumps by name.
#[derive(Clone, Copy, Debug)]
enum Op {
    Label(Block),
    Load(u32),
    And(u32),
    Eq(u32, To, To),
    Ret(To),
}

/// `seccomp_data`: nr at 0, arch at 4, args[i] at 16 + 8i (their low halves on
/// little-endian machines; the arguments compared are ints).
const fn arg(i: u32) -> u32 {
    16 + 8 * i
}

/// The program: see the module's docs. `tell`: `socket` with an inet family notifies
/// too (the socket watch's call).
fn program(arch: u32, tell: bool) -> Vec<Op> {
    use Block::*;
    let socket = if tell { To::Block(Socket) } else { To::Allow };
    let calls: [(i64, To); 8] = [
        (libc::SYS_connect, To::Notify),
        (libc::SYS_bind, To::Notify),
        (libc::SYS_listen, To::Notify),
        (libc::SYS_sendto, To::Block(Flags3)),
        (libc::SYS_sendmmsg, To::Block(Flags3)),
        (libc::SYS_sendmsg, To::Block(Flags2)),
        (libc::SYS_setsockopt, To::Block(Setsockopt)),
        (libc::SYS_io_uring_setup, To::Enosys),
    ];
    let mut p = vec![
        Op::Load(4),
        Op::Eq(arch, To::Block(Calls), To::Kill),
        Op::Label(Calls),
        Op::Load(0),
    ];
    for (nr, to) in [(libc::SYS_socket, socket)].into_iter().chain(calls) {
        let nr = nr as u32;
        p.push(Op::Eq(nr, to, To::Next));
        p.push(Op::Eq(nr | X32_SYSCALL_BIT, to, To::Next));
    }
    p.push(Op::Ret(To::Allow));
    let fastopen = libc::MSG_FASTOPEN as u32;
    p.extend([
        Op::Label(Socket),
        Op::Load(arg(0)),
        Op::Eq(libc::AF_INET as u32, To::Notify, To::Next),
        Op::Eq(libc::AF_INET6 as u32, To::Notify, To::Allow),
        Op::Label(Flags3),
        Op::Load(arg(3)),
        Op::And(fastopen),
        Op::Eq(0, To::Allow, To::Eperm),
        Op::Label(Flags2),
        Op::Load(arg(2)),
        Op::And(fastopen),
        Op::Eq(0, To::Allow, To::Eperm),
        Op::Label(Setsockopt),
        Op::Load(arg(1)),
        Op::Eq(libc::IPPROTO_IPV6 as u32, To::Block(SetsockoptV6), To::Next),
        Op::Eq(libc::IPPROTO_IP as u32, To::Next, To::Allow),
        Op::Load(arg(2)),
        Op::Eq(libc::IP_OPTIONS as u32, To::Eperm, To::Allow),
        Op::Label(SetsockoptV6),
        Op::Load(arg(2)),
        Op::Eq(libc::IPV6_RTHDR as u32, To::Eperm, To::Allow),
    ]);
    p
}

/// [`program`] for `arch` as BPF (labels resolved; jumps are forward and relative; the
/// actions are the last five instructions).
pub(crate) fn filter(arch: u32, tell: bool) -> Vec<sock_filter> {
    let ops: Vec<Op> = program(arch, tell);
    let code: Vec<Op> = ops
        .iter()
        .copied()
        .filter(|o| !matches!(o, Op::Label(_)))
        .collect();
    // Index of each label's next instruction, in `code`.
    let mut at = Vec::new();
    let mut n = 0;
    for o in &ops {
        match o {
            Op::Label(b) => at.push((*b, n)),
            _ => n += 1,
        }
    }
    let actions = [To::Allow, To::Notify, To::Eperm, To::Enosys, To::Kill];
    let end = code.len();
    let index = |to: To, i: usize| -> usize {
        match to {
            To::Next => i + 1,
            To::Block(b) => at.iter().find(|(l, _)| *l == b).map_or(end, |(_, n)| *n),
            action => end + actions.iter().position(|a| *a == action).unwrap_or(0),
        }
    };
    let ret = |to: To| match to {
        To::Allow => libc::SECCOMP_RET_ALLOW,
        To::Notify => libc::SECCOMP_RET_USER_NOTIF,
        To::Eperm => libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        To::Enosys => libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        _ => libc::SECCOMP_RET_KILL_PROCESS,
    };
    let ins = |code: u32, jt: u8, jf: u8, k: u32| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let mut out = Vec::with_capacity(end + actions.len());
    for (i, op) in code.iter().enumerate() {
        // Targets are later instructions of this short program: the offsets fit a u8.
        let rel = |to: To| (index(to, i) - i - 1) as u8;
        out.push(match *op {
            Op::Load(k) => ins(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, k),
            Op::And(k) => ins(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 0, 0, k),
            Op::Eq(k, yes, no) => ins(
                libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
                rel(yes),
                rel(no),
                k,
            ),
            Op::Ret(to) => ins(libc::BPF_RET | libc::BPF_K, 0, 0, ret(to)),
            Op::Label(_) => unreachable!("labels were removed"),
        });
    }
    for a in actions {
        out.push(ins(libc::BPF_RET | libc::BPF_K, 0, 0, ret(a)));
    }
    out
}

/// The sandbox's network namespace as `SO_NETNS_COOKIE` names it (the init's own), or
/// `None` on kernels before 5.14 (then every inet socket counts as the host's).
pub(crate) fn own_netns_cookie() -> Option<u64> {
    // SAFETY: socket(2) with integer arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    let cookie = netns_cookie(fd);
    // SAFETY: our socket, closed once.
    unsafe { libc::close(fd) };
    cookie
}

fn netns_cookie(fd: c_int) -> Option<u64> {
    let mut v = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live local.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

fn int_opt(fd: c_int, name: c_int) -> Result<c_int, c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live local.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut v).cast(), &mut len) };
    if r == 0 { Ok(v) } else { Err(errno()) }
}

/// What the init answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Continue,
    Fail(c_int),
}

/// The verdict on a call on `fd` (the init's duplicate of the caller's descriptor):
/// `own` is the sandbox's namespace cookie.
fn classify(fd: c_int, own: Option<u64>) -> Verdict {
    let domain = match int_opt(fd, libc::SO_DOMAIN) {
        Ok(d) => d,
        Err(libc::ENOTSOCK) => return Verdict::Fail(libc::ENOTSOCK),
        Err(_) => return Verdict::Fail(libc::EPERM),
    };
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Verdict::Continue;
    }
    match (netns_cookie(fd), own) {
        (Some(c), Some(o)) if c == o => Verdict::Continue,
        _ => Verdict::Fail(libc::EPERM),
    }
}

/// The caller's descriptor `fd` (thread `tid`), duplicated into the init.
fn their_fd(tid: u32, fd: c_int) -> Result<c_int, c_int> {
    // SAFETY: pidfd_open(2) with integer arguments.
    let mut pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
    if pidfd < 0 {
        // Before Linux 6.9: a process leader only (a single-threaded caller).
        // SAFETY: as above.
        pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, 0) };
    }
    if pidfd < 0 {
        return Err(libc::EPERM);
    }
    // SAFETY: pidfd_getfd(2) with integer arguments; the result is a new CLOEXEC fd.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd as c_int, fd, 0) };
    let e = errno();
    // SAFETY: our pidfd, closed once.
    unsafe { libc::close(pidfd as c_int) };
    if dup < 0 {
        return Err(if e == libc::EBADF {
            libc::EBADF
        } else {
            libc::EPERM
        });
    }
    Ok(dup as c_int)
}

/// In the init: answers notification `req` (a call on a descriptor, argument 0) on
/// `listener`; `own` is [`own_netns_cookie`].
pub(crate) fn answer(listener: c_int, req: &libc::seccomp_notif, own: Option<u64>) {
    let fd = req.data.args[0] as u32 as c_int;
    let verdict = match their_fd(req.pid, fd) {
        Ok(dup) => {
            let v = classify(dup, own);
            // SAFETY: our duplicate, closed once.
            unsafe { libc::close(dup) };
            v
        }
        Err(e) => Verdict::Fail(e),
    };
    // SAFETY: seccomp_notif_resp is plain data; all-zero is "no error, value 0".
    let mut resp: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
    resp.id = req.id;
    match verdict {
        Verdict::Continue => resp.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        Verdict::Fail(e) => resp.error = -e,
    }
    // SAFETY: SEND reads resp, a valid seccomp_notif_resp. ENOENT (the caller is gone)
    // needs nothing.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86_64: u32 = 0xC000_003E;

    /// Runs the filter on (arch, nr, args) as the kernel would.
    fn verdict(tell: bool, arch: u32, nr: i64, args: [u64; 4]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let prog = filter(X86_64, tell);
        let (mut pc, mut acc) = (0, 0u32);
        loop {
            let ins = prog[pc];
            let code = u32::from(ins.code);
            pc += 1;
            if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                let k = ins.k as usize;
                acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
            } else if code == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K {
                acc &= ins.k;
            } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                pc += usize::from(if acc == ins.k { ins.jt } else { ins.jf });
            } else if code == libc::BPF_RET | libc::BPF_K {
                return ins.k;
            } else {
                panic!("unexpected instruction {code:#x}");
            }
        }
    }

    #[test]
    fn re_aiming_calls_notify_and_the_data_path_does_not() {
        let notify = libc::SECCOMP_RET_USER_NOTIF;
        let allow = libc::SECCOMP_RET_ALLOW;
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let fo = libc::MSG_FASTOPEN as u64;
        for tell in [false, true] {
            let v = |nr: i64, args: [u64; 4]| verdict(tell, X86_64, nr, args);
            for nr in [libc::SYS_connect, libc::SYS_bind, libc::SYS_listen] {
                assert_eq!(v(nr, [3, 0, 0, 0]), notify, "{nr}");
                assert_eq!(v(nr | i64::from(X32_SYSCALL_BIT), [3, 0, 0, 0]), notify);
            }
            assert_eq!(v(libc::SYS_sendto, [3, 0, 0, fo]), eperm);
            assert_eq!(v(libc::SYS_sendto, [3, 0, 0, 0x40]), allow, "no fast open");
            assert_eq!(v(libc::SYS_sendmmsg, [3, 0, 0, fo | 0x40]), eperm);
            assert_eq!(v(libc::SYS_sendmsg, [3, 0, fo, 0]), eperm);
            assert_eq!(
                v(libc::SYS_sendmsg, [3, 0, 0, fo]),
                allow,
                "flags are arg 2"
            );
            let ip = libc::IPPROTO_IP as u64;
            let ip6 = libc::IPPROTO_IPV6 as u64;
            let opt = |level: u64, name: c_int| v(libc::SYS_setsockopt, [3, level, name as u64, 0]);
            assert_eq!(opt(ip, libc::IP_OPTIONS), eperm);
            assert_eq!(opt(ip6, libc::IPV6_RTHDR), eperm);
            assert_eq!(opt(ip, libc::IP_TTL), allow);
            assert_eq!(opt(libc::SOL_SOCKET as u64, libc::IP_OPTIONS), allow);
            assert_eq!(
                v(libc::SYS_io_uring_setup, [1, 0, 0, 0]),
                libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
            );
            for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_recvfrom] {
                assert_eq!(v(nr, [3, 0, 0, 0]), allow, "{nr}");
            }
            let inet = v(libc::SYS_socket, [libc::AF_INET as u64, 1, 0, 0]);
            assert_eq!(inet, if tell { notify } else { allow });
            assert_eq!(v(libc::SYS_socket, [libc::AF_UNIX as u64, 1, 0, 0]), allow);
        }
        // Another architecture's calls kill the process.
        assert_eq!(
            verdict(false, 0x4000_0003, 102, [0; 4]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }

    #[test]
    fn a_socket_of_another_namespace_is_refused_and_the_sandboxs_proceeds() {
        let own = own_netns_cookie();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
        if own.is_none() {
            eprintln!("skipped: no SO_NETNS_COOKIE (Linux < 5.14)");
            return;
        }
        assert_eq!(classify(fd, own), Verdict::Continue);
        assert_eq!(classify(fd, own.map(|c| c + 1)), Verdict::Fail(libc::EPERM));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let ufd = std::os::fd::AsRawFd::as_raw_fd(&a);
        assert_eq!(
            classify(ufd, own.map(|c| c + 1)),
            Verdict::Continue,
            "not inet"
        );
        let f = std::fs::File::open("/dev/null").unwrap();
        let ffd = std::os::fd::AsRawFd::as_raw_fd(&f);
        assert_eq!(classify(ffd, own), Verdict::Fail(libc::ENOTSOCK));
    }
}
