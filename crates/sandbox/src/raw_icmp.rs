//! Raw ICMP sockets for the command (`Spec::raw_icmp`): the init makes them.
//!
//! Theory of operation. Some programs ping only through a raw socket
//! (`socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)`, ICMPv6 alike): busybox's `ping` has no
//! fallback to the unprivileged ping sockets iputils' `ping` uses. A raw socket needs
//! `CAP_NET_RAW` over the sandbox's network namespace, which the command lacks: its
//! user namespace is nested in the one that owns the network namespace (that is what
//! locks the sandbox's mounts for it). The init, root of the owning user namespace, has
//! it. So the command installs [`filter`] (after no-new-privileges, before `execve`,
//! as the socket watch does, and instead of it: one listener per process): a raw ICMP
//! `socket` becomes a user notification, and the init ([`answer`]) makes the same
//! socket in its place and installs it in the caller as the call's result
//! (`SECCOMP_IOCTL_NOTIF_ADDFD` with `SECCOMP_ADDFD_FLAG_SEND`, Linux 5.14). Every
//! other call proceeds in the kernel.
//!
//! Bounds. The socket carries ICMP only: `IP_HDRINCL` and `IPV6_HDRINCL`, which would
//! let it write whole IP packets of any protocol, are refused (`EPERM`) by the same
//! filter for every socket of the command (no other socket kind takes them). What it
//! sends leaves through the sandbox's own interfaces: its loopback, or the TAP, where
//! the NIC servers relay echo requests under the egress policy and drop other ICMP
//! (docs/SECURITY.md, nic mode). What it may read is the ICMP the sandbox's namespace
//! receives. The init holds nothing per call: one socket made, handed over, closed.

use libc::{c_int, sock_filter};

use crate::sys::errno;
use crate::watch::{SOCK_TYPE_MASK, X32_SYSCALL_BIT};

/// The filter's instructions; jumps name the index they go to, resolved by [`filter`].
#[derive(Clone, Copy)]
enum Op {
    /// Load the word at this offset of `seccomp_data`.
    Load(u32),
    /// Keep only these bits of the loaded word.
    And(u32),
    /// If the word equals the value, go to the first index, else to the second.
    Eq(u32, usize, usize),
    /// End with this action.
    Ret(u32),
}

/// `IPV6_HDRINCL` (linux/in6.h; not in the libc crate).
const IPV6_HDRINCL: u32 = 36;

/// The program: a raw ICMP `socket` notifies, `setsockopt(IP_HDRINCL or
/// IPV6_HDRINCL)` fails with `EPERM`, anything else is allowed. `seccomp_data`: nr at
/// 0, arch at 4, args[i] at 16 + 8i (their low halves on little-endian machines; the
/// arguments compared are ints).
fn program(arch: u32) -> [Op; 27] {
    const ALLOW: usize = 24;
    const NOTIFY: usize = 25;
    const EPERM: usize = 26;
    const SOCKET: usize = 7;
    const SETSOCKOPT: usize = 17;
    let (socket, setsockopt) = (libc::SYS_socket as u32, libc::SYS_setsockopt as u32);
    let arg = |i: u32| 16 + 8 * i;
    [
        Op::Load(4),
        Op::Eq(arch, 2, ALLOW),
        Op::Load(0),
        Op::Eq(socket, SOCKET, 4),
        Op::Eq(socket | X32_SYSCALL_BIT, SOCKET, 5),
        Op::Eq(setsockopt, SETSOCKOPT, 6),
        Op::Eq(setsockopt | X32_SYSCALL_BIT, SETSOCKOPT, ALLOW),
        // 7: socket(domain, type, protocol)
        Op::Load(arg(1)),
        Op::And(SOCK_TYPE_MASK as u32),
        Op::Eq(libc::SOCK_RAW as u32, 10, ALLOW),
        Op::Load(arg(0)),
        Op::Eq(libc::AF_INET as u32, 12, 14),
        Op::Load(arg(2)),
        Op::Eq(libc::IPPROTO_ICMP as u32, NOTIFY, ALLOW),
        Op::Eq(libc::AF_INET6 as u32, 15, ALLOW),
        Op::Load(arg(2)),
        Op::Eq(libc::IPPROTO_ICMPV6 as u32, NOTIFY, ALLOW),
        // 17: setsockopt(fd, level, name, …)
        Op::Load(arg(1)),
        Op::Eq(libc::IPPROTO_IP as u32, 19, 21),
        Op::Load(arg(2)),
        Op::Eq(libc::IP_HDRINCL as u32, EPERM, ALLOW),
        Op::Eq(libc::IPPROTO_IPV6 as u32, 22, ALLOW),
        Op::Load(arg(2)),
        Op::Eq(IPV6_HDRINCL, EPERM, ALLOW),
        Op::Ret(libc::SECCOMP_RET_ALLOW),
        Op::Ret(libc::SECCOMP_RET_USER_NOTIF),
        Op::Ret(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
    ]
}

/// [`program`] for `arch` as BPF (jumps are forward and relative).
pub(crate) fn filter(arch: u32) -> [sock_filter; 27] {
    let ops = program(arch);
    let mut out = [sock_filter {
        code: 0,
        jt: 0,
        jf: 0,
        k: 0,
    }; 27];
    for (i, op) in ops.iter().enumerate() {
        // Targets are later instructions of this short program: the offsets fit a u8.
        let rel = |to: usize| (to - i - 1) as u8;
        let (code, jt, jf, k) = match *op {
            Op::Load(k) => (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, k),
            Op::And(k) => (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 0, 0, k),
            Op::Eq(k, yes, no) => (
                libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
                rel(yes),
                rel(no),
                k,
            ),
            Op::Ret(k) => (libc::BPF_RET | libc::BPF_K, 0, 0, k),
        };
        out[i] = sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        };
    }
    out
}

/// Whether `socket(domain, ty, protocol)` asks for a raw ICMP socket.
fn is_raw_icmp(domain: c_int, ty: c_int, protocol: c_int) -> bool {
    ty & SOCK_TYPE_MASK == libc::SOCK_RAW
        && matches!(
            (domain, protocol),
            (libc::AF_INET, libc::IPPROTO_ICMP) | (libc::AF_INET6, libc::IPPROTO_ICMPV6)
        )
}

/// In the init: answers notification `req` (a raw ICMP `socket` of the command's) on
/// `listener` with a socket made here, or with the error making it gave.
pub(crate) fn answer(listener: c_int, req: &libc::seccomp_notif) {
    let args = &req.data.args;
    let (domain, ty, protocol) = (
        args[0] as u32 as c_int,
        args[1] as u32 as c_int,
        args[2] as u32 as c_int,
    );
    let error = if is_raw_icmp(domain, ty, protocol) {
        let nonblock = ty & libc::SOCK_NONBLOCK;
        // SAFETY: socket(2) with integer arguments.
        let fd = unsafe {
            libc::socket(
                domain,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | nonblock,
                protocol,
            )
        };
        if fd < 0 {
            errno()
        } else {
            let add = libc::seccomp_notif_addfd {
                id: req.id,
                flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
                srcfd: fd as u32,
                newfd: 0,
                newfd_flags: if ty & libc::SOCK_CLOEXEC != 0 {
                    libc::O_CLOEXEC as u32
                } else {
                    0
                },
            };
            // SAFETY: ADDFD reads `add`, a valid seccomp_notif_addfd; on success the
            // caller's call returns the new descriptor and the notification is answered.
            let sent = unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &add) };
            let e = errno();
            // SAFETY: our copy; the caller has its own.
            unsafe { libc::close(fd) };
            if sent >= 0 || e == libc::ENOENT {
                // Handed over, or the caller is gone (died, or interrupted: it asks again).
                return;
            }
            libc::EPERM
        }
    } else {
        // Not a call the filter notifies: refuse it as the kernel would have.
        libc::EPERM
    };
    // SAFETY: seccomp_notif_resp is plain data; all-zero is "no error, value 0".
    let mut resp: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
    resp.id = req.id;
    resp.error = -error;
    // SAFETY: SEND reads resp, a valid seccomp_notif_resp. ENOENT (the caller is gone)
    // needs nothing.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86_64: u32 = 0xC000_003E;

    fn verdict(arch: u32, nr: u32, args: [u64; 3]) -> u32 {
        crate::bpf_test::verdict(&filter(X86_64), arch, nr, &args)
    }

    #[test]
    fn raw_icmp_sockets_notify_and_nothing_else_does() {
        let socket = libc::SYS_socket as u32;
        let (notify, allow) = (libc::SECCOMP_RET_USER_NOTIF, libc::SECCOMP_RET_ALLOW);
        let (v4, v6) = (libc::AF_INET as u64, libc::AF_INET6 as u64);
        let raw = libc::SOCK_RAW as u64;
        let flags = (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64;
        let (icmp, icmp6) = (libc::IPPROTO_ICMP as u64, libc::IPPROTO_ICMPV6 as u64);
        for call in [socket, socket | X32_SYSCALL_BIT] {
            assert_eq!(verdict(X86_64, call, [v4, raw, icmp]), notify);
            assert_eq!(verdict(X86_64, call, [v6, raw | flags, icmp6]), notify);
            // High bits of an int argument do not hide it.
            assert_eq!(verdict(X86_64, call, [1 << 32 | v4, raw, icmp]), notify);
        }
        for args in [
            [v4, libc::SOCK_DGRAM as u64, icmp],
            [v4, raw, icmp6],
            [v6, raw, icmp],
            [v4, raw, libc::IPPROTO_TCP as u64],
            [v4, libc::SOCK_STREAM as u64, 0],
            [libc::AF_PACKET as u64, raw, icmp],
        ] {
            assert_eq!(verdict(X86_64, socket, args), allow, "{args:?}");
        }
        assert_eq!(
            verdict(X86_64, libc::SYS_connect as u32, [v4, raw, icmp]),
            allow
        );
        // Another architecture's numbers mean other calls.
        assert_eq!(verdict(0x4000_0003, socket, [v4, raw, icmp]), allow);
    }

    #[test]
    fn whole_ip_headers_are_refused() {
        let sso = libc::SYS_setsockopt as u32;
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let allow = libc::SECCOMP_RET_ALLOW;
        let (ip, ip6) = (libc::IPPROTO_IP as u64, libc::IPPROTO_IPV6 as u64);
        let hdrincl = libc::IP_HDRINCL as u64;
        assert_eq!(verdict(X86_64, sso, [3, ip, hdrincl]), eperm);
        assert_eq!(
            verdict(X86_64, sso | X32_SYSCALL_BIT, [3, ip, hdrincl]),
            eperm
        );
        assert_eq!(
            verdict(X86_64, sso, [3, ip6, u64::from(IPV6_HDRINCL)]),
            eperm
        );
        assert_eq!(verdict(X86_64, sso, [3, ip, libc::IP_TTL as u64]), allow);
        assert_eq!(verdict(X86_64, sso, [3, ip6, hdrincl]), allow);
        assert_eq!(
            verdict(X86_64, sso, [3, libc::SOL_SOCKET as u64, hdrincl]),
            allow
        );
    }

    #[test]
    fn raw_icmp_is_what_the_filter_notifies() {
        assert!(is_raw_icmp(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMP
        ));
        assert!(is_raw_icmp(
            libc::AF_INET6,
            libc::SOCK_RAW,
            libc::IPPROTO_ICMPV6
        ));
        assert!(!is_raw_icmp(
            libc::AF_INET,
            libc::SOCK_DGRAM,
            libc::IPPROTO_ICMP
        ));
        assert!(!is_raw_icmp(
            libc::AF_INET,
            libc::SOCK_RAW,
            libc::IPPROTO_RAW
        ));
    }
}
