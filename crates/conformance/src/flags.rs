//! Bit sets and enums printed by name: poll `revents`, epoll events, socket types,
//! protocols and TCP states.

use libc::c_int;

fn join(v: u32, table: &[(u32, &str)]) -> String {
    let mut names: Vec<&str> = Vec::new();
    let mut rest = v;
    for &(bit, name) in table {
        if v & bit != 0 {
            names.push(name);
            rest &= !bit;
        }
    }
    let mut out = names.join("|");
    if rest != 0 {
        if !out.is_empty() {
            out.push('|');
        }
        out.push_str(&format!("{rest:#x}"));
    }
    if out.is_empty() { "0".into() } else { out }
}

/// `POLLIN|POLLOUT`, or `0`.
pub fn poll_names(revents: i16) -> String {
    let table = [
        (libc::POLLIN, "POLLIN"),
        (libc::POLLPRI, "POLLPRI"),
        (libc::POLLOUT, "POLLOUT"),
        (libc::POLLRDHUP, "POLLRDHUP"),
        (libc::POLLERR, "POLLERR"),
        (libc::POLLHUP, "POLLHUP"),
        (libc::POLLNVAL, "POLLNVAL"),
        (libc::POLLRDNORM, "POLLRDNORM"),
        (libc::POLLRDBAND, "POLLRDBAND"),
        (libc::POLLWRNORM, "POLLWRNORM"),
        (libc::POLLWRBAND, "POLLWRBAND"),
    ];
    let table: Vec<(u32, &str)> = table.iter().map(|&(b, n)| (b as u16 as u32, n)).collect();
    join(revents as u16 as u32, &table)
}

/// `EPOLLIN|EPOLLRDHUP`, or `0`.
pub fn epoll_names(events: u32) -> String {
    let table = [
        (libc::EPOLLIN, "EPOLLIN"),
        (libc::EPOLLPRI, "EPOLLPRI"),
        (libc::EPOLLOUT, "EPOLLOUT"),
        (libc::EPOLLRDHUP, "EPOLLRDHUP"),
        (libc::EPOLLERR, "EPOLLERR"),
        (libc::EPOLLHUP, "EPOLLHUP"),
        (libc::EPOLLRDNORM, "EPOLLRDNORM"),
        (libc::EPOLLWRNORM, "EPOLLWRNORM"),
    ];
    let table: Vec<(u32, &str)> = table.iter().map(|&(b, n)| (b as u32, n)).collect();
    join(events, &table)
}

/// `SOCK_STREAM`, `SOCK_DGRAM`, …
pub fn socktype_name(t: c_int) -> String {
    match t {
        libc::SOCK_STREAM => "SOCK_STREAM".into(),
        libc::SOCK_DGRAM => "SOCK_DGRAM".into(),
        libc::SOCK_SEQPACKET => "SOCK_SEQPACKET".into(),
        libc::SOCK_RAW => "SOCK_RAW".into(),
        other => format!("type{other}"),
    }
}

/// `IPPROTO_TCP`, `IPPROTO_UDP`, …
pub fn proto_name(p: c_int) -> String {
    match p {
        0 => "0".into(),
        libc::IPPROTO_TCP => "IPPROTO_TCP".into(),
        libc::IPPROTO_UDP => "IPPROTO_UDP".into(),
        other => format!("proto{other}"),
    }
}

/// The `tcpi_state` names (`include/net/tcp_states.h`).
pub fn tcp_state_name(s: u8) -> String {
    const NAMES: [&str; 12] = [
        "?",
        "ESTABLISHED",
        "SYN_SENT",
        "SYN_RECV",
        "FIN_WAIT1",
        "FIN_WAIT2",
        "TIME_WAIT",
        "CLOSE",
        "CLOSE_WAIT",
        "LAST_ACK",
        "LISTEN",
        "CLOSING",
    ];
    NAMES
        .get(usize::from(s))
        .map_or_else(|| format!("state{s}"), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_join_and_keep_unknown_bits() {
        assert_eq!(poll_names(0), "0");
        assert_eq!(poll_names(libc::POLLIN | libc::POLLOUT), "POLLIN|POLLOUT");
        assert_eq!(
            epoll_names(libc::EPOLLIN as u32 | 1 << 30),
            "EPOLLIN|0x40000000"
        );
        assert_eq!(tcp_state_name(1), "ESTABLISHED");
    }
}
