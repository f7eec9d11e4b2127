//! The language spoken between a sandboxed program's shim and its protocol server.
//!
//! This crate owns the *shape* of every message that crosses the sandbox boundary: the
//! fixed-size records carried by the shared-memory rings ([`Req`] from the shim, [`Cmp`]
//! from the server), the control messages carried by the per-thread unix socket
//! ([`Ctl`]), socket addresses as they travel inside records ([`WireAddr`]), control
//! messages and which of them a sandbox may send ([`cmsg`]), the
//! validation that turns raw records written by an untrusted peer into typed values
//! ([`Call::decode`], and [`Request::decode`] under it) and the typed requests a side
//! writes ([`Call::encode`]), the client side's completion demux ([`demux`]), and the
//! protocol violations either side may report ([`ProtoError`]). It does no I/O and
//! contains no `unsafe`.
//!
//! # Theory of operation
//!
//! Every inet socket of the sandbox has a server-assigned id (`u32`, never reused within
//! a server). Operations that carry a file descriptor (creating a socket, accepting a
//! connection) travel on the control socket with `SCM_RIGHTS`; everything else travels
//! as a [`Req`] on the request ring. A request that wants an answer carries a non-zero
//! `tag`; the server answers with one or more [`Cmp`] records bearing that tag: zero or
//! more [`CmpKind::Data`] records (each lending one server buffer) and exactly one final
//! [`CmpKind::Done`]. Records with tag 0 are fire-and-forget (sends on a blocking socket,
//! buffer returns, readiness bookkeeping): S1's batched output operations.
//!
//! Buffers change hands only inside records: a `Send` lends a shim buffer to the server,
//! which gives it back with [`CmpKind::BufReturn`]; a `Data` completion lends a server
//! buffer to the shim, which gives it back with [`Op::BufReturn`].
#![deny(unsafe_code)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod addr;
mod call;
pub mod cmsg;
mod ctl;
pub mod demux;
mod error;
mod module;

pub use addr::{AddrError, WireAddr};
pub use call::{BufRef, Call, InlineBytes};
pub use ctl::{
    Ctl, CtlKind, HELLO_READS_PAIR, HELLO_ROUTES, HELLO_RX_PAIR, HELLO_TAKES_HANDOFF, Hello,
    HelloReply, MAX_SERVERS, PAIR_NAME_MAX, PAIR_NAME_PREFIX, PROTO_VERSION, SERVER_BITS,
    pair_name, parse_pair_name, server_of,
};
pub use error::ProtoError;
pub use module::{
    BINDING_MAGIC, Binding, BindingError, CTL_BLOB_FD, MAX_BINDING_BYTES, MAX_FILE_HANDLES,
    MAX_FILES, MAX_INLINE_BINDING, MAX_KEY_BYTES, MAX_MODULE_BYTES, MAX_PROPS,
    MAX_REGISTERED_FILES, MAX_VALUE_BYTES, ModuleRef, module_hash,
};

use bytemuck::{Pod, Zeroable};

/// Size in bytes of every ring record, both directions.
pub const RECORD_SIZE: usize = 64;

/// A request record as it lies in shared memory (shim → server).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Req {
    /// [`Op`] code.
    pub op: u16,
    /// `MSG_*` flags for data operations; [`REQ_NONBLOCK`] etc.
    pub flags: u16,
    /// Socket id.
    pub sock: u32,
    /// Non-zero when the shim waits for a [`CmpKind::Done`] with this tag.
    pub tag: u32,
    /// First argument (length, level, how, backlog…).
    pub a: u32,
    /// Second argument (option name, more flags…).
    pub b: u32,
    /// Buffer id lent with this request (or `NO_BUF`).
    pub buf: u32,
    /// Bytes used in that buffer.
    pub len: u32,
    /// Valid bytes in `addr`.
    pub addr_len: u32,
    /// A socket address or option value.
    pub addr: [u8; 32],
}

/// A completion record as it lies in shared memory (server → shim).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Cmp {
    /// [`CmpKind`] code.
    pub kind: u16,
    /// [`CMP_DRAIN_TOKEN`] etc.
    pub flags: u16,
    /// Socket id the completion is about.
    pub sock: u32,
    /// Tag of the request being answered (0 for unsolicited records).
    pub tag: u32,
    /// Result: `>= 0` a value, `< 0` a negated errno.
    pub result: i32,
    /// Buffer id lent or returned (or `NO_BUF`).
    pub buf: u32,
    /// Bytes of data in that buffer.
    pub len: u32,
    /// Extra value (e.g. `msg_flags`, option length).
    pub a: u32,
    /// Valid bytes in `addr`.
    pub addr_len: u32,
    /// A socket address or option value.
    pub addr: [u8; 32],
}

const _: () = assert!(size_of::<Req>() == RECORD_SIZE);
const _: () = assert!(size_of::<Cmp>() == RECORD_SIZE);

/// "No buffer" marker in `buf` fields.
pub const NO_BUF: u32 = u32::MAX;
/// Request flag: the socket is non-blocking (answer `EAGAIN` instead of parking).
pub const REQ_NONBLOCK: u16 = 1;
/// Request flag (`Connect` of a stream): the shim has filled the program's end of the
/// readiness pair so that it polls unwritable while the connection is in progress; the
/// server reads the filler out when the connect is answered with anything but
/// `EINPROGRESS`, else when the connection completes or fails.
pub const REQ_FILLED: u16 = 2;
/// Completion flag: the host socket was found empty; drain the readiness token.
pub const CMP_DRAIN_TOKEN: u16 = 1;
/// Completion flag (`Connect` of a stream, with `-ECONNABORTED`): the socket's readiness
/// pair is gone (an earlier non-blocking connect failed, which closed the server's end
/// so that the program's polls `POLLERR|POLLHUP`), and the kernel has put the socket
/// back to unconnected since (the connect after the failure reported it). Renew the
/// pair ([`CtlKind::Renew`]), put its program end in the fd's place, and connect again.
pub const CMP_RENEW_PAIR: u16 = 2;
/// Completion flag (`Connect` of a stream, result 0 or `-EINPROGRESS`): the destination
/// is one to hand off (`--handoff`). The server has connected the host socket (or begun
/// to) and serves it no more; the host socket follows on the channel's control socket
/// ([`CtlKind::Handoff`]): take it and put it in the fd's place.
pub const CMP_HANDOFF: u16 = 4;

/// Operations carried on the request ring.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `connect(addr)`.
    Connect = 1,
    /// `bind(addr)`.
    Bind = 2,
    /// `listen(a = backlog)`.
    Listen = 3,
    /// Send `len` bytes of `buf` (stream) or one datagram, optional destination in `addr`;
    /// `a` = `MSG_*` flags.
    Send = 4,
    /// Receive up to `a` bytes; `b` = `MSG_*` flags.
    Recv = 5,
    /// `shutdown(a = how)`.
    Shutdown = 6,
    /// `setsockopt(level = a, name = b, value = addr[..addr_len])`.
    SetOpt = 7,
    /// `getsockopt(level = a, name = b, optlen = len)`.
    GetOpt = 8,
    /// `getsockname()`.
    SockName = 9,
    /// `getpeername()`.
    PeerName = 10,
    /// `ioctl(FIONREAD)`.
    Pending = 11,
    /// The shim gives back a server buffer (`buf`).
    BufReturn = 12,
    /// The shim drained the socket's readiness token.
    TokenDrained = 13,
    /// The shim wants readiness tokens for this socket (it is being polled).
    WantToken = 14,
    /// Abandon the parked request with tag `a` (signal or timeout in the shim).
    Cancel = 15,
    /// The program closed an fd of this socket: if that was the last reference, close
    /// the host socket before answering (so a port is free again when `close` returns).
    Release = 16,
    /// Bind a data-path module to the socket: `buf`/`len` lend a buffer holding the
    /// [`Binding`]; `a` = number of files, which travel just before on the control socket
    /// as one [`CtlKind::Files`] packet. Tagged: `Done{0 or -errno}`; tag 0: errors come
    /// back as `AsyncError`. Ordered with the socket's sends (later sends are the
    /// module's input).
    BindModule = 17,
    /// A non-blocking send on this socket found none of this channel's buffers free,
    /// and the shim has filled its end of the readiness pair so that the program's fd
    /// polls unwritable. `a` = how many `BufReturn` completions the shim had taken from
    /// this channel when it found no room. The server empties the pair (making the fd
    /// writable) once a buffer comes back to this channel: at once if it has returned
    /// more than `a` already.
    WantRoom = 18,
    /// `connect(AF_UNSPEC)` on a datagram socket: dissolve its association (the peer
    /// that `send` without an address goes to, and the only source it receives from).
    Disconnect = 19,
    /// Control bytes for the next `Send` of this socket on this channel (a datagram's
    /// `sendmsg` control messages, see [`cmsg`]): `a` = their offset, `addr[..addr_len]`
    /// = the bytes. Several records in a row carry more than one record holds.
    SendCtl = 20,
    /// This thread is about to send on the socket after another thread of the process
    /// sent on it last: take every record the other channels have published so far
    /// before answering (tagged: `Done{0}`). A send that returned in one thread before
    /// another thread's send began is then queued first, as the kernel keeps a
    /// stream's bytes in the order of the calls; the answer comes before this thread
    /// publishes anything more, so nothing of its own is overtaken.
    Order = 21,
}

/// Kinds of completion records.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpKind {
    /// Final answer to a tagged request.
    Done = 1,
    /// Data for a tagged `Recv`: `buf`/`len` lent to the shim; more records follow.
    Data = 2,
    /// A shim buffer comes back (its `Send` is finished).
    BufReturn = 3,
    /// An error on an earlier fire-and-forget operation (reported on the next call).
    AsyncError = 4,
    /// Control bytes for a tagged `Recv` of a datagram (see [`cmsg`]), before its
    /// `Done`: `a` = their offset, `addr[..addr_len]` = the bytes.
    Control = 5,
}

/// Why a record from the peer was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The operation code is not one this version knows.
    #[error("unknown operation code {0}")]
    UnknownOp(u16),
    /// The completion kind is not one this version knows.
    #[error("unknown completion kind {0}")]
    UnknownKind(u16),
    /// `addr_len` is larger than the `addr` field.
    #[error("address length {0} exceeds the record's field")]
    AddrLen(u32),
    /// The address bytes are not a valid inet socket address.
    #[error("bad address: {0}")]
    Addr(#[from] AddrError),
    /// A data record names no buffer.
    #[error("{0:?} record without a buffer")]
    MissingBuf(Op),
}

impl Op {
    fn from_u16(v: u16) -> Result<Op, DecodeError> {
        use Op::*;
        Ok(match v {
            1 => Connect,
            2 => Bind,
            3 => Listen,
            4 => Send,
            5 => Recv,
            6 => Shutdown,
            7 => SetOpt,
            8 => GetOpt,
            9 => SockName,
            10 => PeerName,
            11 => Pending,
            12 => BufReturn,
            13 => TokenDrained,
            14 => WantToken,
            15 => Cancel,
            16 => Release,
            17 => BindModule,
            18 => WantRoom,
            19 => Disconnect,
            20 => SendCtl,
            21 => Order,
            other => return Err(DecodeError::UnknownOp(other)),
        })
    }
}

impl CmpKind {
    /// Decodes a completion kind.
    pub fn from_u16(v: u16) -> Result<CmpKind, DecodeError> {
        Ok(match v {
            1 => CmpKind::Done,
            2 => CmpKind::Data,
            3 => CmpKind::BufReturn,
            4 => CmpKind::AsyncError,
            5 => CmpKind::Control,
            other => return Err(DecodeError::UnknownKind(other)),
        })
    }
}

/// A request after validation: the server only ever acts on this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The operation.
    pub op: Op,
    /// The raw record (already checked for the fields `op` uses).
    pub raw: Req,
}

impl Request {
    /// Validates a record copied out of the request ring.
    pub fn decode(raw: Req) -> Result<Request, DecodeError> {
        let op = Op::from_u16(raw.op)?;
        if raw.addr_len as usize > raw.addr.len() {
            return Err(DecodeError::AddrLen(raw.addr_len));
        }
        match op {
            Op::Connect | Op::Bind => {
                WireAddr::decode(&raw.addr[..raw.addr_len as usize])?;
            }
            Op::Send | Op::BufReturn | Op::BindModule if raw.buf == NO_BUF => {
                return Err(DecodeError::MissingBuf(op));
            }
            _ => {}
        }
        Ok(Request { op, raw })
    }

    /// The address carried by the record (connect, bind, sendto); `None` when empty.
    pub fn addr(&self) -> Result<Option<WireAddr>, DecodeError> {
        if self.raw.addr_len == 0 {
            return Ok(None);
        }
        Ok(Some(WireAddr::decode(
            &self.raw.addr[..self.raw.addr_len as usize],
        )?))
    }

    /// The option value bytes of a `SetOpt`.
    pub fn value(&self) -> &[u8] {
        &self.raw.addr[..self.raw.addr_len as usize]
    }
}

/// The length of bytes put into a record's 32-byte field, as the record stores it (at
/// most 32; were it ever more, the record would be refused for its `addr_len`).
fn field_len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Req {
    /// A request for `op` on `sock`.
    pub fn new(op: Op, sock: u32) -> Req {
        Req {
            op: op as u16,
            sock,
            buf: NO_BUF,
            ..Req::default()
        }
    }

    /// Puts `addr` into the record.
    pub fn with_addr(mut self, addr: &WireAddr) -> Req {
        self.addr_len = field_len(addr.encode(&mut self.addr));
        self
    }

    /// Puts raw bytes (an option value, at most 32) into the record.
    pub fn with_bytes(mut self, bytes: &[u8]) -> Req {
        let n = bytes.len().min(self.addr.len());
        self.addr[..n].copy_from_slice(&bytes[..n]);
        self.addr_len = field_len(n);
        self
    }
}

impl Cmp {
    /// A completion of `kind` for `sock` answering `tag`.
    pub fn new(kind: CmpKind, sock: u32, tag: u32, result: i32) -> Cmp {
        Cmp {
            kind: kind as u16,
            sock,
            tag,
            result,
            buf: NO_BUF,
            ..Cmp::default()
        }
    }

    /// Puts `addr` into the record.
    pub fn with_addr(mut self, addr: &WireAddr) -> Cmp {
        self.addr_len = field_len(addr.encode(&mut self.addr));
        self
    }

    /// Puts raw bytes (an option value, at most 32) into the record.
    pub fn with_bytes(mut self, bytes: &[u8]) -> Cmp {
        let n = bytes.len().min(self.addr.len());
        self.addr[..n].copy_from_slice(&bytes[..n]);
        self.addr_len = field_len(n);
        self
    }

    /// The bytes in `addr`, bounded by the field's size whatever `addr_len` says.
    pub fn bytes(&self) -> &[u8] {
        &self.addr[..(self.addr_len as usize).min(self.addr.len())]
    }

    /// The completion's kind.
    pub fn kind(&self) -> Result<CmpKind, DecodeError> {
        CmpKind::from_u16(self.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn unknown_op_is_refused() {
        let raw = Req {
            op: 999,
            ..Req::default()
        };
        assert_eq!(Request::decode(raw), Err(DecodeError::UnknownOp(999)));
    }

    #[test]
    fn oversized_addr_len_is_refused() {
        let raw = Req {
            addr_len: 33,
            ..Req::new(Op::Recv, 1)
        };
        assert_eq!(Request::decode(raw), Err(DecodeError::AddrLen(33)));
    }

    #[test]
    fn send_without_buffer_is_refused() {
        assert_eq!(
            Request::decode(Req::new(Op::Send, 1)),
            Err(DecodeError::MissingBuf(Op::Send))
        );
    }

    #[test]
    fn connect_address_round_trips() {
        let sa: SocketAddr = "[::1]:8080".parse().unwrap();
        let req = Req::new(Op::Connect, 4).with_addr(&WireAddr::from(sa));
        let r = Request::decode(req).unwrap();
        assert_eq!(r.addr().unwrap().unwrap().to_std(), sa);
    }

    #[test]
    fn connect_with_garbage_address_is_refused() {
        let mut req = Req::new(Op::Connect, 4);
        req.addr_len = 5;
        req.addr[..2].copy_from_slice(&addr::FAMILY_INET.to_ne_bytes());
        assert!(matches!(Request::decode(req), Err(DecodeError::Addr(_))));
    }
}
