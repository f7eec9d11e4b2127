//! Which socket options a sandbox may set on its host socket.
//!
//! The server may run as root, with privilege over the host's network that a sandboxed
//! program must not borrow; and it performs every `setsockopt` in its own address space
//! and fd table. So an option is refused with `EPERM` (what an unprivileged program
//! gets from the kernel) when the kernel would check a capability for it, or when its
//! value holds a pointer or an fd number. Everything else is forwarded as it came, and
//! the kernel judges the value.

/// Why the option may not be set, if it may not.
pub(crate) fn refused(level: i32, name: i32, value: &[u8]) -> Option<&'static str> {
    use libc::*;
    const PRIVILEGED: &str = "it needs privilege over the host's network";
    const INDIRECT: &str = "its value points into the caller's memory or fd table";
    const FOREIGN: &str = "it lets the socket use addresses the host does not own";
    match (level, name) {
        (
            SOL_SOCKET,
            SO_MARK | SO_BINDTODEVICE | SO_BINDTOIFINDEX | SO_RCVBUFFORCE | SO_SNDBUFFORCE,
        )
        | (IPPROTO_IP, IP_TRANSPARENT | IP_IPSEC_POLICY | IP_XFRM_POLICY)
        | (IPPROTO_IPV6, IPV6_TRANSPARENT | IPV6_IPSEC_POLICY | IPV6_XFRM_POLICY) => {
            Some(PRIVILEGED)
        }
        // Unprivileged in the kernel, but they let a socket bind to or send from
        // addresses the host does not own (source spoofing on the host's network).
        (IPPROTO_IP, IP_FREEBIND) | (IPPROTO_IPV6, IPV6_FREEBIND) => Some(FOREIGN),
        (
            IPPROTO_TCP,
            TCP_REPAIR | TCP_REPAIR_QUEUE | TCP_QUEUE_SEQ | TCP_REPAIR_OPTIONS | TCP_REPAIR_WINDOW,
        ) => Some(PRIVILEGED),
        (
            SOL_SOCKET,
            SO_ATTACH_FILTER | SO_ATTACH_BPF | SO_ATTACH_REUSEPORT_CBPF | SO_ATTACH_REUSEPORT_EBPF,
        ) => Some(INDIRECT),
        // Priorities above 6 need CAP_NET_ADMIN.
        (SOL_SOCKET, SO_PRIORITY) if int(value).is_some_and(|p| !(0..=6).contains(&p)) => {
            Some(PRIVILEGED)
        }
        _ => None,
    }
}

fn int(value: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(value.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privileged_and_indirect_options_are_refused() {
        let one = 1i32.to_ne_bytes();
        for (l, n) in [
            (libc::SOL_SOCKET, libc::SO_MARK),
            (libc::IPPROTO_IP, libc::IP_TRANSPARENT),
            (libc::IPPROTO_TCP, libc::TCP_REPAIR),
            (libc::SOL_SOCKET, libc::SO_ATTACH_FILTER),
            (libc::SOL_SOCKET, libc::SO_SNDBUFFORCE),
            (libc::IPPROTO_IP, libc::IP_FREEBIND),
            (libc::IPPROTO_IPV6, libc::IPV6_FREEBIND),
        ] {
            assert!(refused(l, n, &one).is_some(), "({l}, {n})");
        }
        assert!(refused(libc::SOL_SOCKET, libc::SO_PRIORITY, &7i32.to_ne_bytes()).is_some());
    }

    #[test]
    fn ordinary_options_pass() {
        let one = 1i32.to_ne_bytes();
        for (l, n) in [
            (libc::SOL_SOCKET, libc::SO_REUSEADDR),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            (libc::SOL_SOCKET, libc::SO_SNDBUF),
            (libc::SOL_SOCKET, libc::SO_PRIORITY),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY),
            (libc::IPPROTO_IP, libc::IP_PKTINFO),
            (libc::IPPROTO_IP, libc::IP_TOS),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
        ] {
            assert!(refused(l, n, &one).is_none(), "({l}, {n})");
        }
    }
}
