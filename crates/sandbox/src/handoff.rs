//! The hand-off's request path for programs without the shim (ferry's `--handoff` for a
//! static or Go program; docs/DESIGN.md, "Hand-off"). The init's guard (host_guard.rs)
//! makes a sandbox TCP socket's `connect` itself; before it does, it asks the launcher's
//! side whether the destination is a hand-off, over a socket pair made before the clone
//! (the launcher's channel carries only its own requests to the init). Each request
//! carries a fresh socket pair's end for its answer, so a kept call waits on an fd of
//! its own, as the guard's other kept calls do, and the init never blocks on this path:
//! the request is sent without waiting (a full queue means "not a hand-off"), and an
//! answer that does not come within [`ANSWER_MS`] means the same.
//!
//! The launcher's side ([`HandoffRequests`], a thread of ferry's) decides with the
//! policy — the sandbox has none — and answers "not a hand-off" (the init makes the
//! call on the sandbox's socket as before, and nic mode serves it), a failure, or a host
//! TCP socket it made, set the options the program had set and connected without
//! waiting. The init then puts that socket at the program's fd number.
//!
//! The wire: a request is [`REQ_LEN`] bytes — version, family (4 or 6), port
//! (big-endian), 16 address bytes, flow info, scope id, the count of options, then up to
//! [`MAX_OPTS`] (level, name, value) triples of `i32` — with the answer's socket
//! attached. An answer is an `i32`: [`NOT_HANDOFF`], 0 (connected) or `-EINPROGRESS`
//! with the host socket attached, or `-errno` (the connect failed at once).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd};

use libc::c_int;

use crate::sys;

/// The wire version of a request.
const VERSION: u8 = 1;
/// The most options a request carries.
pub(crate) const MAX_OPTS: usize = 10;
/// A request's length.
pub(crate) const REQ_LEN: usize = 1 + 1 + 2 + 16 + 4 + 4 + 1 + MAX_OPTS * 12;
/// The answer "not a hand-off": the init makes the call on the sandbox's socket.
pub(crate) const NOT_HANDOFF: i32 = 1;
/// How long the init waits for an answer before it makes the call itself.
pub(crate) const ANSWER_MS: u64 = 2000;

/// The integer socket options a program may have set on its socket before `connect`
/// that a handed-off socket takes over, as `(level, name, halved)`: `halved` for the
/// buffer sizes, which `getsockopt` reports doubled. The launcher's side sets no other.
pub(crate) const CARRIED_OPTS: [(c_int, c_int, bool); MAX_OPTS] = [
    (libc::IPPROTO_TCP, libc::TCP_NODELAY, false),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE, false),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, false),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, false),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, false),
    (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, false),
    (libc::SOL_SOCKET, libc::SO_RCVBUF, true),
    (libc::SOL_SOCKET, libc::SO_SNDBUF, true),
    (libc::SOL_SOCKET, libc::SO_PRIORITY, false),
    (libc::IPPROTO_IP, libc::IP_TOS, false),
];

/// An integer socket option to set: `(level, name, value)`.
pub type SockOpt = (i32, i32, i32);

/// A request as the init encodes it (no allocation: the init may not).
pub(crate) fn encode(to: &SocketAddr, opts: &[SockOpt], out: &mut [u8; REQ_LEN]) {
    out.fill(0);
    out[0] = VERSION;
    let (ip, flow, scope) = match to {
        SocketAddr::V4(a) => {
            out[1] = 4;
            (a.ip().to_ipv6_mapped().octets(), 0, 0)
        }
        SocketAddr::V6(a) => {
            out[1] = 6;
            (a.ip().octets(), a.flowinfo(), a.scope_id())
        }
    };
    out[2..4].copy_from_slice(&to.port().to_be_bytes());
    out[4..20].copy_from_slice(&ip);
    out[20..24].copy_from_slice(&flow.to_ne_bytes());
    out[24..28].copy_from_slice(&scope.to_ne_bytes());
    let n = opts.len().min(MAX_OPTS);
    out[28] = n as u8;
    for (i, &(level, name, value)) in opts[..n].iter().enumerate() {
        let at = 29 + i * 12;
        out[at..at + 4].copy_from_slice(&level.to_ne_bytes());
        out[at + 4..at + 8].copy_from_slice(&name.to_ne_bytes());
        out[at + 8..at + 12].copy_from_slice(&value.to_ne_bytes());
    }
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A request as the launcher's side reads it: `None` for anything malformed, and
/// options other than [`CARRIED_OPTS`] dropped.
pub(crate) fn decode(b: &[u8]) -> Option<(SocketAddr, Vec<SockOpt>)> {
    if b.len() != REQ_LEN || b[0] != VERSION || usize::from(b[28]) > MAX_OPTS {
        return None;
    }
    let port = u16::from_be_bytes([b[2], b[3]]);
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&b[4..20]);
    let v6 = Ipv6Addr::from(ip);
    let to = match b[1] {
        4 => SocketAddr::V4(SocketAddrV4::new(v6.to_ipv4_mapped()?, port)),
        6 => SocketAddr::V6(SocketAddrV6::new(
            v6,
            port,
            i32_at(b, 20) as u32,
            i32_at(b, 24) as u32,
        )),
        _ => return None,
    };
    let opts = (0..usize::from(b[28]))
        .map(|i| {
            let at = 29 + i * 12;
            (i32_at(b, at), i32_at(b, at + 4), i32_at(b, at + 8))
        })
        .filter(|&(l, n, _)| CARRIED_OPTS.iter().any(|&(cl, cn, _)| (cl, cn) == (l, n)))
        .collect();
    Some((to, opts))
}

/// Which destinations can be a hand-off at all (ferry's `--handoff` rules): the init
/// asks about a connect only to these, and makes the others itself at once (nic mode
/// serves them, with no round trip to ferry's side). Ferry's side still decides each
/// one it is asked about with the whole policy; this only spares the asking. Called in
/// the init: it must not allocate or block.
#[derive(Clone)]
pub struct HandoffScope(pub std::sync::Arc<dyn Fn(&SocketAddr) -> bool + Send + Sync>);

impl std::fmt::Debug for HandoffScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandoffScope")
    }
}

/// The launcher's end of the request path ([`crate::Sandbox::handoff_requests`]): one
/// thread receives the requests and answers each ([`Request::answer`]).
#[derive(Debug)]
pub struct HandoffRequests(pub(crate) OwnedFd);

impl HandoffRequests {
    /// The next request, waiting for it; `Ok(None)` once the sandbox's init is gone.
    /// A malformed request (never from ferry's init) is answered "not a hand-off".
    pub fn recv(&self) -> io::Result<Option<Request>> {
        loop {
            let mut buf = [0u8; REQ_LEN + 1];
            let (n, reply) = sys::recv_with_fd(self.0.as_raw_fd(), &mut buf)?;
            if n == 0 && reply.is_none() {
                return Ok(None);
            }
            let Some(reply) = reply else { continue };
            match decode(&buf[..n]) {
                Some((to, opts)) => return Ok(Some(Request { to, opts, reply })),
                None => Request::not_handoff(&reply),
            }
        }
    }
}

/// One `connect` the init asks about.
#[derive(Debug)]
pub struct Request {
    /// The destination, as the program named it (read once from its memory).
    pub to: SocketAddr,
    /// The options the program set on its socket (of [`CARRIED_OPTS`], those that
    /// differ from a new socket's), to set on the host socket before it connects.
    pub opts: Vec<SockOpt>,
    reply: OwnedFd,
}

/// What the launcher's side answers.
#[derive(Debug)]
pub enum Answer {
    /// Not a hand-off: the init makes the call on the sandbox's socket.
    NotHandoff,
    /// A host TCP socket, connected (`in_progress` false) or connecting.
    Socket { sock: OwnedFd, in_progress: bool },
    /// The host's connect failed at once with this errno.
    Failed(i32),
}

impl Request {
    /// Answers the request (an init that has gone is no error: nothing waits).
    pub fn answer(self, answer: Answer) {
        let (code, fd) = match &answer {
            Answer::NotHandoff => (NOT_HANDOFF, None),
            Answer::Socket { sock, in_progress } => (
                if *in_progress { -libc::EINPROGRESS } else { 0 },
                Some(sock.as_raw_fd()),
            ),
            Answer::Failed(e) => (-e.abs(), None),
        };
        let _ = sys::send_with_fd(self.reply.as_raw_fd(), &code.to_ne_bytes(), fd);
    }

    fn not_handoff(reply: &OwnedFd) {
        let _ = sys::send_with_fd(reply.as_raw_fd(), &NOT_HANDOFF.to_ne_bytes(), None);
    }
}

/// An inet address from `sockaddr` bytes as a `connect` names it: `None` for another
/// family or a short length (the init then makes the call as before).
pub(crate) fn inet_addr(bytes: &[u8], len: usize) -> Option<SocketAddr> {
    let b = &bytes[..len.min(bytes.len())];
    let family = c_int::from(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    if family == libc::AF_INET && b.len() >= 16 {
        let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
        return Some(SocketAddr::new(IpAddr::V4(ip), port));
    }
    if family == libc::AF_INET6 && b.len() >= 28 {
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[8..24]);
        let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
        return Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(ip),
            port,
            flow,
            scope,
        )));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_comes_back_as_sent_and_only_carried_options_pass() {
        let mut b = [0u8; REQ_LEN];
        let to: SocketAddr = "10.51.0.2:5301".parse().unwrap();
        let opts = [
            (libc::IPPROTO_TCP, libc::TCP_NODELAY, 1),
            (libc::SOL_SOCKET, libc::SO_BINDTODEVICE, 1),
            (libc::SOL_SOCKET, libc::SO_RCVBUF, 65536),
        ];
        encode(&to, &opts, &mut b);
        let (got, carried) = decode(&b).unwrap();
        assert_eq!(got, to);
        assert_eq!(carried, vec![opts[0], opts[2]]);

        let to6: SocketAddr = "[fd00::2]:80".parse().unwrap();
        encode(&to6, &[], &mut b);
        assert_eq!(decode(&b).unwrap(), (to6, vec![]));
    }

    #[test]
    fn malformed_requests_are_refused() {
        let mut b = [0u8; REQ_LEN];
        encode(&"1.2.3.4:5".parse().unwrap(), &[], &mut b);
        assert!(decode(&b[..REQ_LEN - 1]).is_none());
        let mut bad = b;
        bad[0] = 9;
        assert!(decode(&bad).is_none());
        let mut bad = b;
        bad[1] = 5;
        assert!(decode(&bad).is_none());
        let mut bad = b;
        bad[28] = MAX_OPTS as u8 + 1;
        assert!(decode(&bad).is_none());
        // Family 4 with an address that is not v4-mapped.
        let mut bad = b;
        bad[4] = 0xfd;
        assert!(decode(&bad).is_none());
    }

    #[test]
    fn inet_addresses_from_sockaddr_bytes() {
        // SAFETY: sockaddr_in is plain data.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as u16;
        sin.sin_port = 8080u16.to_be();
        sin.sin_addr.s_addr = u32::from_ne_bytes([10, 51, 0, 2]);
        // SAFETY: reading the bytes of a plain-data struct.
        let bytes: [u8; 16] = unsafe { std::mem::transmute(sin) };
        assert_eq!(
            inet_addr(&bytes, 16),
            Some("10.51.0.2:8080".parse().unwrap())
        );
        assert_eq!(inet_addr(&bytes, 8), None);
        assert_eq!(inet_addr(&[0u8; 16], 16), None); // AF_UNSPEC
    }
}
