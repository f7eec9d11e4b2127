//! The event loop's epoll tokens (what kind of file reported, and its index) and the
//! events watched on a socket's host socket and readiness pair. A leaf: every part
//! that registers a file with the loop names it here.

/// Epoll token kinds (top byte of the token; the low 32 bits carry an index).
pub(crate) const T_LISTEN: u64 = 1;
pub(crate) const T_CTL: u64 = 2;
pub(crate) const T_DOORBELL: u64 = 3;
pub(crate) const T_HOST: u64 = 4;
pub(crate) const T_PAIR: u64 = 5;
pub(crate) const T_PUBLISH: u64 = 6;
pub(crate) const T_INBOX: u64 = 7;
pub(crate) const T_HELLO: u64 = 8;
pub(crate) const T_DNS_IN: u64 = 9;
pub(crate) const T_DNS_UP: u64 = 10;
pub(crate) const T_DNS_TCP: u64 = 11;
pub(crate) const T_UDP_FLOW: u64 = 12;

/// A small index (of a published port, a DNS socket) as an epoll token's index.
pub(crate) fn index_u32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

pub(crate) fn token(kind: u64, idx: u32) -> u64 {
    kind << 56 | u64::from(idx)
}

/// What the loop watches on our end of a socket's readiness pair. Bytes from the
/// program's end are its writes the shim did not see. Room in the pair is watched
/// (`EPOLLOUT`, [`pair_room_events`]) only from the first pump that stopped on a full
/// pair: every read by the program makes room, and a request/response stream's
/// readings would each report it to the loop (and wake a sleeping server) for nothing.
/// `EPOLLPRI` adds no wake-up (a filler's marker comes with its bytes) but says, with
/// the hang-up, whether a marker is left (`SockTable::gone_by`).
pub(crate) fn pair_events(rx_pair: bool) -> u32 {
    if rx_pair {
        (libc::EPOLLRDHUP | libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLET).cast_unsigned()
    } else {
        libc::EPOLLRDHUP as u32
    }
}

/// [`pair_events`] with room in the pair watched: a pump waits for it.
pub(crate) fn pair_room_events() -> u32 {
    pair_events(true) | libc::EPOLLOUT.cast_unsigned()
}

pub(crate) fn host_events() -> u32 {
    (libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET)
        .cast_unsigned()
}
