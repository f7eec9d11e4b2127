//! The socket factory: creating sockets inside the sandbox's network namespace from the
//! host side, and the wire format the launcher and the sandbox init speak.
//!
//! Theory of operation: the init (pid 1 of the sandbox) lives in the sandbox netns and
//! holds one end of an `AF_UNIX` `SOCK_SEQPACKET` pair; the launcher holds the other.
//! A request is one datagram `{domain, type, protocol}`; the init calls `socket(2)` in
//! its namespace and answers with one datagram `{errno}`, carrying the new fd as
//! `SCM_RIGHTS` when `errno == 0`. A socket keeps the namespace it was created in, so
//! the protocol server (in the host namespace, possibly unprivileged, where `setns(2)`
//! is not allowed) can then bind, listen and connect on the sandbox's own loopback.
//! Requests are strictly one at a time (a mutex around the launcher's end).
//!
//! The same socket carries the launch handshake before the factory is handed out:
//! launcher → init "go" (id maps are written), init → launcher "ready" (with the
//! sandbox netns fd) or "setup failed at stage S with errno E".

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

use crate::sys;

/// Wire format between the launcher and the sandbox init. All integers native-endian
/// (both ends are the same binary on the same machine).
pub(crate) mod wire {
    /// Launcher → init: id maps are in place, start.
    pub(crate) const GO: [u8; 1] = [1];
    /// Launcher → init, before "go": the next volume's idmapped copy is attached.
    pub(crate) const TREE: [u8; 1] = [2];
    /// Init → launcher: setup done; `a` = command pid inside the sandbox, `b` =
    /// [`ready_flags`]; the sandbox netns fd is attached.
    pub(crate) const READY: u32 = 1;
    /// Init → launcher: setup failed; `a` = stage (see `Stage`), `b` = errno.
    pub(crate) const SETUP_FAILED: u32 = 2;
    /// Length of an init → launcher handshake message and of a factory request.
    pub(crate) const MSG_LEN: usize = 12;
    /// A factory request whose `domain` is this asks for `/dev/net/tun` opened in the
    /// sandbox's namespace (a TAP queue made from it is the sandbox's), non-blocking.
    pub(crate) const OPEN_TUN: i32 = -0x74_756e;
    /// Length of a factory reply.
    pub(crate) const REPLY_LEN: usize = 4;

    /// The last word of "ready": bit 0 whether the socket watch is on; bits 8–19 the
    /// errno of the sandbox's own sysfs (0: mounted), bits 20–31 that of its substitute
    /// `/etc/shadow` (0: mounted or none).
    pub(crate) fn ready_flags(watching: bool, sysfs: Option<i32>, shadow: Option<i32>) -> i32 {
        let e = |v: Option<i32>| v.unwrap_or(0) & 0xfff;
        i32::from(watching) | (e(sysfs) << 8) | (e(shadow) << 20)
    }

    /// Decodes [`ready_flags`]: (watching, sysfs errno, shadow errno), 0 for none.
    pub(crate) fn parse_ready_flags(w: i32) -> (bool, i32, i32) {
        (w & 1 == 1, (w >> 8) & 0xfff, (w >> 20) & 0xfff)
    }

    /// Encodes three 32-bit words (handshake message or factory request).
    pub(crate) fn encode(w: [i32; 3]) -> [u8; MSG_LEN] {
        let mut out = [0; MSG_LEN];
        for (chunk, word) in out.chunks_exact_mut(4).zip(w) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        out
    }

    /// Decodes three 32-bit words; `None` unless `buf` is exactly [`MSG_LEN`] long.
    pub(crate) fn decode(buf: &[u8]) -> Option<[i32; 3]> {
        if buf.len() != MSG_LEN {
            return None;
        }
        let word = |i: usize| i32::from_ne_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        Some([word(0), word(4), word(8)])
    }
}

/// Creates sockets inside a sandbox's network namespace. Cheap to clone; all clones
/// share one channel to the sandbox init and take turns on it.
///
/// Fails with `BrokenPipe` once the sandbox has exited.
#[derive(Clone)]
pub struct SocketFactory {
    chan: Arc<Mutex<OwnedFd>>,
}

impl SocketFactory {
    pub(crate) fn new(chan: OwnedFd) -> Self {
        Self {
            chan: Arc::new(Mutex::new(chan)),
        }
    }

    /// `socket(domain, ty, protocol)` executed inside the sandbox's network namespace.
    /// `ty` may carry `SOCK_NONBLOCK`; the returned fd is always close-on-exec.
    pub fn socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
        if domain == wire::OPEN_TUN {
            return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
        }
        self.request(domain, ty, protocol)
    }

    /// `/dev/net/tun` opened (read-write, non-blocking) inside the sandbox's network
    /// namespace: a TAP device attached through it is made there. Attaching needs
    /// `CAP_NET_ADMIN` over that namespace, which the sandbox's creator has.
    pub fn open_tun(&self) -> io::Result<OwnedFd> {
        self.request(wire::OPEN_TUN, 0, 0)
    }

    fn request(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
        let chan = self.chan.lock().unwrap_or_else(PoisonError::into_inner);
        let fd = chan.as_raw_fd();
        sys::send_with_fd(fd, &wire::encode([domain, ty, protocol]), None).map_err(gone)?;
        let mut reply = [0u8; 8];
        let (n, sock) = sys::recv_with_fd(fd, &mut reply).map_err(gone)?;
        drop(chan);
        if n == 0 {
            return Err(gone(io::ErrorKind::BrokenPipe.into()));
        }
        if n != wire::REPLY_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "sandbox init sent a malformed socket factory reply",
            ));
        }
        let errno = i32::from_ne_bytes([reply[0], reply[1], reply[2], reply[3]]);
        match (errno, sock) {
            (0, Some(sock)) => Ok(sock),
            (0, None) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "sandbox init replied success without a socket",
            )),
            (errno, _) => Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

impl fmt::Debug for SocketFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SocketFactory").finish_non_exhaustive()
    }
}

/// Maps "the init has gone away" errors to one recognisable `BrokenPipe`.
fn gone(err: io::Error) -> io::Error {
    match err.raw_os_error() {
        Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN) | None => {
            io::Error::new(io::ErrorKind::BrokenPipe, "sandbox has exited")
        }
        Some(_) => err,
    }
}

#[cfg(test)]
mod tests {
    use super::wire;

    #[test]
    fn wire_roundtrip() {
        let words = [libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, -1];
        assert_eq!(wire::decode(&wire::encode(words)), Some(words));
        assert_eq!(wire::decode(&[0; 11]), None);
        assert_eq!(wire::decode(&[0; 13]), None);
    }

    #[test]
    fn ready_flags_roundtrip() {
        let w = wire::ready_flags(true, Some(libc::EPERM), None);
        assert_eq!(wire::parse_ready_flags(w), (true, libc::EPERM, 0));
        let w = wire::ready_flags(false, None, Some(libc::ENOENT));
        assert_eq!(wire::parse_ready_flags(w), (false, 0, libc::ENOENT));
    }
}
