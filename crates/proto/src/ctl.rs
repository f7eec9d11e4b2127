//! Control messages: what travels on a channel's unix `SOCK_SEQPACKET` socket beside the
//! rings. One fixed-size message per packet (a `BindModule` is followed in its packet by
//! its binding); file descriptors ride along with `SCM_RIGHTS` (the region and doorbell
//! with [`HelloReply`], a readiness socket with `Socket` and `Accept`, a module's files
//! with `BindModule` and `Files`, a file to register with `RegisterFile`).

use bytemuck::{Pod, Zeroable};

/// Version of the shim ↔ server protocol; both sides must agree (3: `Op::WantRoom`;
/// 4: registered files, and the binding layout `FMB2` that names them; 5: received
/// bytes through the readiness pair; 6: `REQ_FILLED` on a non-blocking connect; 7:
/// `Op::Disconnect`; 8: control messages, `Op::SendCtl` and `CmpKind::Control`; 9: the
/// server makes readiness pairs and names them, `CtlKind::Claim`; 11: `CMP_HANDOFF`,
/// `CtlKind::Handoff`; 12: the server sends `CtlKind::Handoff` unasked, with the
/// `CMP_HANDOFF` answer).
pub const PROTO_VERSION: u32 = 12;

/// Low bits of a socket id that name the protocol server serving the socket (S4: a
/// socket is assigned to one server at creation and every later call goes there).
pub const SERVER_BITS: u32 = 4;

/// Most protocol servers one sandbox can have.
pub const MAX_SERVERS: usize = 1 << SERVER_BITS;

/// The server (index) that serves socket `sock`.
pub fn server_of(sock: u32) -> usize {
    (sock & ((1 << SERVER_BITS) - 1)) as usize
}

/// The abstract unix name prefix (after the leading NUL) of the program's end of a
/// socket's readiness pair.
pub const PAIR_NAME_PREFIX: &[u8] = b"ferry:";

/// Bytes of a [`pair_name`]: `ferry:`, up to 10 digits, `:`, 16 hex digits.
pub const PAIR_NAME_MAX: usize = 6 + 10 + 1 + 16;

/// The abstract unix name (without the leading NUL) the server binds the program's end
/// of socket `id`'s readiness pair to, with `nonce` (unpredictable, so that names of several
/// runs sharing the server's network namespace never meet, and no one can take a name
/// before its socket: `"ferry:<id>:<nonce, 16 hex digits>"`. It tells a process that
/// inherited or received the fd which socket it is, and the server whether that end is
/// still open (the name is free once the last descriptor of it is closed). The name
/// lives in the server's network namespace, which the sandbox cannot bind in.
pub fn pair_name(id: u32, nonce: u64) -> ([u8; PAIR_NAME_MAX], usize) {
    let mut buf = [0u8; PAIR_NAME_MAX];
    let mut w = &mut buf[..];
    let _ = std::io::Write::write_fmt(&mut w, format_args!("ferry:{id}:{nonce:016x}"));
    let left = w.len();
    (buf, buf.len() - left)
}

/// The socket id in an abstract name, if it is a [`pair_name`].
pub fn parse_pair_name(name: &[u8]) -> Option<u32> {
    let rest = name.strip_prefix(PAIR_NAME_PREFIX)?;
    let colon = rest.iter().position(|&b| b == b':')?;
    let (digits, nonce) = (&rest[..colon], &rest[colon + 1..]);
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if nonce.len() != 16 || !nonce.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// [`Hello::server`] flag: this endpoint routes each socket's calls to the socket's own
/// server (by [`server_of`]), so new sockets may be assigned to any server. Without it
/// (e.g. a native client that only has this channel) they stay on the channel's server.
pub const HELLO_ROUTES: u32 = 1 << 31;

/// [`Hello::server`] flag: this endpoint reads a connected TCP socket's bytes from the
/// socket's fd when the server offers it ([`HELLO_RX_PAIR`]); the native client, which
/// receives through the ring, does not set it.
pub const HELLO_READS_PAIR: u32 = 1 << 30;

/// [`Hello::server`] flag: this endpoint takes a connected host socket for a `Connect`
/// the policy hands off (`CMP_HANDOFF` and the `CtlKind::Handoff` that follows). The
/// native client, which has no descriptor to put it at, does not set it: its sockets to
/// hand-off destinations stay served.
pub const HELLO_TAKES_HANDOFF: u32 = 1 << 29;

/// Kinds of [`Ctl`] messages.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtlKind {
    /// Shim → server: create a socket (`a` domain, `b` type, `c` protocol). The reply
    /// carries the program's end of the socket's readiness pair (made by the server,
    /// which keeps the other end to itself).
    Socket = 1,
    /// Shim → server: accept on socket `sock` (`a` = 1 when non-blocking). The reply
    /// carries the program's end of the new socket's readiness pair.
    Accept = 2,
    /// Server → shim: the answer (`result` = socket id or negated errno; `addr` = peer),
    /// with the program's end of a new socket's pair for `Socket` and `Accept`.
    Reply = 3,
    /// Program → server: bind a data-path module to socket `sock` (`a` = length of the
    /// [`crate::Binding`], `b` = number of files, `c` = [`crate::CTL_BLOB_FD`] when the
    /// binding is in the first descriptor instead of following this header in the same
    /// packet). The files ride along with `SCM_RIGHTS` (after the binding's memfd, if
    /// any). Answered with `Reply` (`result` 0 or a negated errno).
    BindModule = 4,
    /// Program → server: the files of the next [`crate::Op::BindModule`] record of this
    /// channel (descriptors only; no reply).
    Files = 5,
    /// Program → server: register the one file that rides along (a regular file open
    /// for reading) with this channel, so that bindings can name it by handle instead of
    /// passing its descriptor each time. Answered with `Reply` (`result` = the handle,
    /// `0..MAX_REGISTERED_FILES`, or a negated errno: `EINVAL` not a regular file,
    /// `EBADF` not readable, `ENFILE` the channel's table is full). The registration
    /// lasts until [`CtlKind::UnregisterFile`] or the channel closes.
    RegisterFile = 6,
    /// Program → server: forget registered file `a` (no descriptor). Bindings queued on
    /// the ring before this message still see it; an instance already started keeps its
    /// file open. Answered with `Reply` (`result` 0, or `-EBADF` for an unknown handle).
    UnregisterFile = 7,
    /// Program → server: this process holds socket `sock`; the proof rides along (its
    /// fd: the program's end of the socket's pair). A process may act on a socket only
    /// once it has made or accepted it, or claimed it: a socket it inherited across
    /// `fork`, kept across `exec` or received with `SCM_RIGHTS`. Answered with `Reply`
    /// (`result` 0, or `-EBADF` when the descriptor is not that socket's).
    Claim = 8,
    /// Program → server: give stream `sock` a new readiness pair (after a `Connect`
    /// answered with [`crate::CMP_RENEW_PAIR`]; the program's end of the old one is the
    /// proof that the process holds the socket, riding along as for `Claim`). The reply
    /// (`result` 0, or `-EINVAL` when the socket's pair is not gone, `-EBADF` when the
    /// proof fails) carries the program's end of the new pair.
    Renew = 9,
    /// Server → program, unasked: stream `sock`'s connected (or connecting) host
    /// socket (`result` 0), sent on the control socket of the channel whose `Connect`
    /// was just answered with [`crate::CMP_HANDOFF`], right after that answer; the
    /// server has forgotten the socket id. A program that gave up waiting for the
    /// answer closes it when it comes. Never sent by the program.
    Handoff = 10,
}

/// A control message.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Ctl {
    /// [`CtlKind`].
    pub kind: u32,
    /// Socket id the message is about.
    pub sock: u32,
    /// First argument.
    pub a: i32,
    /// Second argument.
    pub b: i32,
    /// Third argument.
    pub c: i32,
    /// Result: `>= 0` a value, `< 0` a negated errno.
    pub result: i32,
    /// Valid bytes in `addr`.
    pub addr_len: u32,
    /// Padding, zero.
    pub pad: u32,
    /// A socket address.
    pub addr: [u8; 32],
}

impl Ctl {
    /// A message of `kind` about `sock`.
    pub fn new(kind: CtlKind, sock: u32) -> Ctl {
        Ctl {
            kind: kind as u32,
            sock,
            ..Ctl::default()
        }
    }

    /// The message's kind, if known.
    pub fn kind(&self) -> Option<CtlKind> {
        match self.kind {
            1 => Some(CtlKind::Socket),
            2 => Some(CtlKind::Accept),
            3 => Some(CtlKind::Reply),
            4 => Some(CtlKind::BindModule),
            5 => Some(CtlKind::Files),
            6 => Some(CtlKind::RegisterFile),
            7 => Some(CtlKind::UnregisterFile),
            8 => Some(CtlKind::Claim),
            9 => Some(CtlKind::Renew),
            10 => Some(CtlKind::Handoff),
            _ => None,
        }
    }
}

/// First message of a channel, shim → server.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Hello {
    /// [`PROTO_VERSION`].
    pub version: u32,
    /// The shim's process id (for logs and stats).
    pub pid: u32,
    /// The shim's thread id.
    pub tid: u32,
    /// Which server this channel is for (low 16 bits, an index below the number of
    /// servers) and flags ([`HELLO_ROUTES`]).
    pub server: u32,
}

/// Answer to [`Hello`]; the region memfd and the server's doorbell eventfd ride along.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HelloReply {
    /// [`PROTO_VERSION`], or 0 when the server refuses the channel.
    pub version: u32,
    /// Channel number (for logs and stats).
    pub channel: u32,
    /// Spin span for the shim's waits, nanoseconds.
    pub spin_ns: u64,
    /// Doorbell batching threshold (1 = ring on every operation).
    pub batch: u32,
    /// Maximum delay of a deferred doorbell, microseconds.
    pub batch_delay_us: u32,
    /// `HELLO_RX_*` flags.
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

/// [`HelloReply::flags`]: the server moves a connected TCP socket's received bytes into
/// the program's fd (the readiness pair) itself; the shim reads them from there with
/// the kernel's calls and asks the server only at the end of the stream and for
/// out-of-band data.
pub const HELLO_RX_PAIR: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_names_round_trip() {
        for id in [0, 1, 42, u32::MAX] {
            for nonce in [0, 0xdead_beef, u64::MAX] {
                let (b, n) = pair_name(id, nonce);
                assert_eq!(parse_pair_name(&b[..n]), Some(id));
            }
        }
        assert_eq!(
            &pair_name(17, 255).0[..],
            b"ferry:17:00000000000000ff\0\0\0\0\0\0\0\0"
        );
        assert_eq!(parse_pair_name(b"ferry:"), None);
        assert_eq!(parse_pair_name(b"ferry:17"), None);
        assert_eq!(parse_pair_name(b"ferry:17:00ff"), None);
        assert_eq!(parse_pair_name(b"ferry:12x:00000000000000ff"), None);
        assert_eq!(parse_pair_name(b"ferry:1:00000000000000fg"), None);
        assert_eq!(parse_pair_name(b"ferry:99999999999:00000000000000ff"), None);
        assert_eq!(parse_pair_name(b"other:1:00000000000000ff"), None);
        assert_eq!(parse_pair_name(b"ferry:4294967296:00000000000000ff"), None);
    }
}
