//! Typed requests: what a [`Req`] record means, one [`Call`] variant per [`Op`] with its
//! fields named and typed. [`Call::decode`] checks a record the peer wrote (as
//! [`Request::decode`] does, and the fields each operation uses); [`Call::encode`] writes
//! one. The record's generic fields (`flags`, `a`, `b`, `buf`, `len`, `addr`) are read and
//! written here and nowhere else, so what each of them means for an operation is said
//! once, in the variant's fields.
//!
//! A field the operation does not use is ignored by `decode` and written as zero (a
//! buffer id as [`NO_BUF`]) by `encode`, so `decode(encode(c)) == c` for every call, and
//! a record `decode` accepts decodes to the same call after an `encode`.

use std::fmt;

use crate::{DecodeError, NO_BUF, Op, REQ_FILLED, REQ_NONBLOCK, Req, Request, WireAddr, cmsg};

/// A buffer of the sender's lent with a request: its id and the bytes used in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufRef {
    /// Buffer id (never [`NO_BUF`] in a record that decodes).
    pub id: u32,
    /// Bytes used in the buffer (from the offset the operation says).
    pub len: u32,
}

/// Up to [`InlineBytes::MAX`] bytes carried in a record's `addr` field: an option value,
/// a piece of control bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InlineBytes {
    /// Valid bytes in `bytes`; the rest are zero.
    len: u8,
    bytes: [u8; InlineBytes::MAX],
}

impl InlineBytes {
    /// Most bytes a record carries.
    pub const MAX: usize = 32;

    /// `b`, or `None` when it is longer than [`InlineBytes::MAX`].
    pub fn new(b: &[u8]) -> Option<InlineBytes> {
        let len = u8::try_from(b.len())
            .ok()
            .filter(|&n| usize::from(n) <= Self::MAX)?;
        let mut bytes = [0; Self::MAX];
        bytes[..b.len()].copy_from_slice(b);
        Some(InlineBytes { len, bytes })
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Debug for InlineBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_bytes())
    }
}

/// A request, typed: one variant per [`Op`] (see each operation's documentation there
/// for what the server does). `sock` is the socket id; `tag`, in the requests that are
/// answered, is the tag of the answer (0: none wanted, where the operation allows it).
/// Fire-and-forget requests have no tag: the server never answers them by tag. `flags`
/// fields are the program's `MSG_*` flags (a C `int`); `level`, `name`, `how` and
/// `backlog` are the C `int`s of the calls they come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `connect(addr)`.
    Connect {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
        /// Where to.
        addr: WireAddr,
        /// The socket is non-blocking ([`REQ_NONBLOCK`]): answer `EINPROGRESS` at once.
        nonblock: bool,
        /// The shim filled its end of the readiness pair ([`REQ_FILLED`]).
        filled: bool,
    },
    /// `bind(addr)`.
    Bind {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
        /// The address.
        addr: WireAddr,
    },
    /// `listen(backlog)`.
    Listen {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
        /// The program's backlog.
        backlog: i32,
    },
    /// Send bytes of a lent buffer (a stream's, or one datagram); the buffer comes back
    /// with `BufReturn`, errors as `AsyncError`.
    Send {
        /// Socket id.
        sock: u32,
        /// The buffer and how many bytes of it, from `offset`, to send.
        buf: BufRef,
        /// Where the bytes start in the buffer (small sends share one).
        offset: u32,
        /// `MSG_*` flags.
        flags: i32,
        /// A datagram's destination (`sendto`); `None`: the socket's peer.
        dest: Option<WireAddr>,
    },
    /// Receive up to `max` bytes.
    Recv {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
        /// Most bytes wanted.
        max: u32,
        /// `MSG_*` flags.
        flags: i32,
        /// Answer `EAGAIN` instead of parking ([`REQ_NONBLOCK`]).
        nonblock: bool,
    },
    /// `shutdown(how)`.
    Shutdown {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
        /// `SHUT_RD`, `SHUT_WR` or `SHUT_RDWR`.
        how: i32,
    },
    /// `setsockopt(level, name, value)`.
    SetOpt {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
        /// Option level.
        level: i32,
        /// Option name.
        name: i32,
        /// The value (at most 32 bytes travel).
        value: InlineBytes,
    },
    /// `getsockopt(level, name)` with room for `len` bytes.
    GetOpt {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
        /// Option level.
        level: i32,
        /// Option name.
        name: i32,
        /// The program's `optlen`.
        len: u32,
    },
    /// `getsockname()`.
    SockName {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
    },
    /// `getpeername()`.
    PeerName {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
    },
    /// `ioctl(FIONREAD)`.
    Pending {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
    },
    /// A server buffer lent with a `Data` completion comes back.
    BufReturn {
        /// The socket the data was for (0 when the sender does not say; unused).
        sock: u32,
        /// The server's buffer id.
        buf: u32,
    },
    /// The shim drained the socket's readiness token.
    TokenDrained {
        /// Socket id.
        sock: u32,
    },
    /// The shim wants readiness tokens for the socket.
    WantToken {
        /// Socket id.
        sock: u32,
    },
    /// Abandon the parked request tagged `parked` (answered `Done{-EINTR}` with that
    /// tag if it was still parked).
    Cancel {
        /// Socket id.
        sock: u32,
        /// The tag of the request to abandon.
        parked: u32,
    },
    /// The program closed an fd of the socket.
    Release {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
    },
    /// Bind a data-path module to the socket (see [`Op::BindModule`]).
    BindModule {
        /// Socket id.
        sock: u32,
        /// Answer's tag; 0: errors come back as `AsyncError`.
        tag: u32,
        /// The buffer holding the [`crate::Binding`] (from its start).
        binding: BufRef,
        /// How many files travelled just before on the control socket.
        files: u32,
    },
    /// A non-blocking send found no room (see [`Op::WantRoom`]).
    WantRoom {
        /// Socket id.
        sock: u32,
        /// `BufReturn` completions the shim had taken from this channel (wrapping).
        returns_seen: u32,
    },
    /// `connect(AF_UNSPEC)` on a datagram socket.
    Disconnect {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
    },
    /// Other threads' earlier sends on the socket go first ([`Op::Order`]).
    Order {
        /// Socket id.
        sock: u32,
        /// Answer's tag.
        tag: u32,
    },
    /// Control bytes for the socket's next `Send` on this channel, at `offset` of them.
    SendCtl {
        /// Socket id.
        sock: u32,
        /// Where these bytes go among the message's control bytes.
        offset: u32,
        /// The bytes (at most [`cmsg::CHUNK`]).
        bytes: InlineBytes,
    },
}

/// A C `int` carried in a record's `u32` field: the same bits.
fn int_of(v: u32) -> i32 {
    i32::from_ne_bytes(v.to_ne_bytes())
}

/// A C `int` as a record's `u32` field carries it: the same bits.
fn field_of(v: i32) -> u32 {
    u32::from_ne_bytes(v.to_ne_bytes())
}

impl Call {
    /// Validates a record copied out of the request ring (what [`Request::decode`]
    /// checks, and a `Send`'s destination, when it has one) and types its fields.
    pub fn decode(raw: &Req) -> Result<Call, DecodeError> {
        let req = Request::decode(*raw)?;
        let r = req.raw;
        let (sock, tag) = (r.sock, r.tag);
        let nonblock = r.flags & REQ_NONBLOCK != 0;
        let buf = BufRef {
            id: r.buf,
            len: r.len,
        };
        let bytes = || InlineBytes::new(req.value()).ok_or(DecodeError::AddrLen(r.addr_len));
        let addr = || {
            req.addr()?
                .ok_or(DecodeError::Addr(crate::AddrError::Short(0)))
        };
        Ok(match req.op {
            Op::Connect => Call::Connect {
                sock,
                tag,
                addr: addr()?,
                nonblock,
                filled: r.flags & REQ_FILLED != 0,
            },
            Op::Bind => Call::Bind {
                sock,
                tag,
                addr: addr()?,
            },
            Op::Listen => Call::Listen {
                sock,
                tag,
                backlog: int_of(r.a),
            },
            Op::Send => Call::Send {
                sock,
                buf,
                offset: r.b,
                flags: int_of(r.a),
                dest: req.addr()?,
            },
            Op::Recv => Call::Recv {
                sock,
                tag,
                max: r.a,
                flags: int_of(r.b),
                nonblock,
            },
            Op::Shutdown => Call::Shutdown {
                sock,
                tag,
                how: int_of(r.a),
            },
            Op::SetOpt => Call::SetOpt {
                sock,
                tag,
                level: int_of(r.a),
                name: int_of(r.b),
                value: bytes()?,
            },
            Op::GetOpt => Call::GetOpt {
                sock,
                tag,
                level: int_of(r.a),
                name: int_of(r.b),
                len: r.len,
            },
            Op::SockName => Call::SockName { sock, tag },
            Op::PeerName => Call::PeerName { sock, tag },
            Op::Pending => Call::Pending { sock, tag },
            Op::BufReturn => Call::BufReturn { sock, buf: r.buf },
            Op::TokenDrained => Call::TokenDrained { sock },
            Op::WantToken => Call::WantToken { sock },
            Op::Cancel => Call::Cancel { sock, parked: r.a },
            Op::Release => Call::Release { sock, tag },
            Op::BindModule => Call::BindModule {
                sock,
                tag,
                binding: buf,
                files: r.a,
            },
            Op::WantRoom => Call::WantRoom {
                sock,
                returns_seen: r.a,
            },
            Op::Disconnect => Call::Disconnect { sock, tag },
            Op::Order => Call::Order { sock, tag },
            Op::SendCtl => Call::SendCtl {
                sock,
                offset: r.a,
                bytes: bytes()?,
            },
        })
    }

    /// The record of this request.
    pub fn encode(&self) -> Req {
        let mut r = Req::new(self.op(), self.sock());
        r.tag = self.tag();
        let set_buf = |r: &mut Req, b: &BufRef| (r.buf, r.len) = (b.id, b.len);
        match *self {
            Call::Connect {
                addr,
                nonblock,
                filled,
                ..
            } => {
                r = r.with_addr(&addr);
                if nonblock {
                    r.flags |= REQ_NONBLOCK;
                }
                if filled {
                    r.flags |= REQ_FILLED;
                }
            }
            Call::Bind { addr, .. } => r = r.with_addr(&addr),
            Call::Listen { backlog, .. } => r.a = field_of(backlog),
            Call::Send {
                buf,
                offset,
                flags,
                dest,
                ..
            } => {
                set_buf(&mut r, &buf);
                (r.a, r.b) = (field_of(flags), offset);
                if let Some(d) = dest {
                    r = r.with_addr(&d);
                }
            }
            Call::Recv {
                max,
                flags,
                nonblock,
                ..
            } => {
                (r.a, r.b) = (max, field_of(flags));
                if nonblock {
                    r.flags |= REQ_NONBLOCK;
                }
            }
            Call::Shutdown { how, .. } => r.a = field_of(how),
            Call::SetOpt {
                level, name, value, ..
            } => {
                r = r.with_bytes(value.as_bytes());
                (r.a, r.b) = (field_of(level), field_of(name));
            }
            Call::GetOpt {
                level, name, len, ..
            } => (r.a, r.b, r.len) = (field_of(level), field_of(name), len),
            Call::BufReturn { buf, .. } => r.buf = buf,
            Call::Cancel { parked, .. } => r.a = parked,
            Call::BindModule { binding, files, .. } => {
                set_buf(&mut r, &binding);
                r.a = files;
            }
            Call::WantRoom { returns_seen, .. } => r.a = returns_seen,
            Call::SendCtl { offset, bytes, .. } => {
                r = r.with_bytes(bytes.as_bytes());
                r.a = offset;
            }
            Call::SockName { .. }
            | Call::PeerName { .. }
            | Call::Pending { .. }
            | Call::TokenDrained { .. }
            | Call::WantToken { .. }
            | Call::Release { .. }
            | Call::Disconnect { .. }
            | Call::Order { .. } => {}
        }
        r
    }

    /// The operation.
    pub fn op(&self) -> Op {
        match self {
            Call::Connect { .. } => Op::Connect,
            Call::Bind { .. } => Op::Bind,
            Call::Listen { .. } => Op::Listen,
            Call::Send { .. } => Op::Send,
            Call::Recv { .. } => Op::Recv,
            Call::Shutdown { .. } => Op::Shutdown,
            Call::SetOpt { .. } => Op::SetOpt,
            Call::GetOpt { .. } => Op::GetOpt,
            Call::SockName { .. } => Op::SockName,
            Call::PeerName { .. } => Op::PeerName,
            Call::Pending { .. } => Op::Pending,
            Call::BufReturn { .. } => Op::BufReturn,
            Call::TokenDrained { .. } => Op::TokenDrained,
            Call::WantToken { .. } => Op::WantToken,
            Call::Cancel { .. } => Op::Cancel,
            Call::Release { .. } => Op::Release,
            Call::BindModule { .. } => Op::BindModule,
            Call::WantRoom { .. } => Op::WantRoom,
            Call::Disconnect { .. } => Op::Disconnect,
            Call::Order { .. } => Op::Order,
            Call::SendCtl { .. } => Op::SendCtl,
        }
    }

    /// The socket id.
    pub fn sock(&self) -> u32 {
        match *self {
            Call::Connect { sock, .. }
            | Call::Bind { sock, .. }
            | Call::Listen { sock, .. }
            | Call::Send { sock, .. }
            | Call::Recv { sock, .. }
            | Call::Shutdown { sock, .. }
            | Call::SetOpt { sock, .. }
            | Call::GetOpt { sock, .. }
            | Call::SockName { sock, .. }
            | Call::PeerName { sock, .. }
            | Call::Pending { sock, .. }
            | Call::BufReturn { sock, .. }
            | Call::TokenDrained { sock }
            | Call::WantToken { sock }
            | Call::Cancel { sock, .. }
            | Call::Release { sock, .. }
            | Call::BindModule { sock, .. }
            | Call::WantRoom { sock, .. }
            | Call::Disconnect { sock, .. }
            | Call::Order { sock, .. }
            | Call::SendCtl { sock, .. } => sock,
        }
    }

    /// The answer's tag; 0 for fire-and-forget requests.
    pub fn tag(&self) -> u32 {
        let mut c = *self;
        c.tag_slot().map_or(0, |t| *t)
    }

    /// This request with its answer's tag set to `t`; a fire-and-forget request, which
    /// has no tag, unchanged.
    pub fn with_tag(mut self, t: u32) -> Call {
        if let Some(tag) = self.tag_slot() {
            *tag = t;
        }
        self
    }

    /// Where the answer's tag is, for the requests that have one.
    fn tag_slot(&mut self) -> Option<&mut u32> {
        match self {
            Call::Connect { tag, .. }
            | Call::Bind { tag, .. }
            | Call::Listen { tag, .. }
            | Call::Recv { tag, .. }
            | Call::Shutdown { tag, .. }
            | Call::SetOpt { tag, .. }
            | Call::GetOpt { tag, .. }
            | Call::SockName { tag, .. }
            | Call::PeerName { tag, .. }
            | Call::Pending { tag, .. }
            | Call::Release { tag, .. }
            | Call::BindModule { tag, .. }
            | Call::Disconnect { tag, .. }
            | Call::Order { tag, .. } => Some(tag),
            Call::Send { .. }
            | Call::BufReturn { .. }
            | Call::TokenDrained { .. }
            | Call::WantToken { .. }
            | Call::Cancel { .. }
            | Call::WantRoom { .. }
            | Call::SendCtl { .. } => None,
        }
    }

    /// The `SendCtl` requests that carry `bytes` (a datagram's control messages, at most
    /// [`cmsg::MAX_CONTROL`]) for the next `Send` on `sock`: one per [`cmsg::CHUNK`]
    /// bytes, in order.
    pub fn send_ctl(sock: u32, bytes: &[u8]) -> impl Iterator<Item = Call> + '_ {
        bytes
            .chunks(cmsg::CHUNK)
            .zip((0u32..).step_by(cmsg::CHUNK))
            .filter_map(move |(chunk, offset)| {
                Some(Call::SendCtl {
                    sock,
                    offset,
                    bytes: InlineBytes::new(chunk)?,
                })
            })
    }
}

impl From<Call> for Req {
    fn from(c: Call) -> Req {
        c.encode()
    }
}

const _: () = assert!(NO_BUF == u32::MAX);
const _: () = assert!(cmsg::CHUNK <= InlineBytes::MAX);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RECORD_SIZE;

    fn v4() -> WireAddr {
        WireAddr::from("10.0.0.7:5201".parse::<std::net::SocketAddr>().unwrap())
    }

    fn v6() -> WireAddr {
        WireAddr::from(
            "[2001:db8::1%3]:443"
                .parse::<std::net::SocketAddr>()
                .unwrap(),
        )
    }

    /// One of each variant, with fields away from their defaults (and some at their
    /// extremes).
    fn every_call() -> Vec<Call> {
        let (sock, tag) = (0x1234_5671, 0xdead_beef);
        let buf = BufRef { id: 7, len: 4096 };
        let value = InlineBytes::new(&[1, 0, 0, 0]).unwrap();
        let mut calls = vec![
            Call::Connect {
                sock,
                tag,
                addr: v4(),
                nonblock: true,
                filled: true,
            },
            Call::Connect {
                sock,
                tag,
                addr: v6(),
                nonblock: false,
                filled: false,
            },
            Call::Bind {
                sock,
                tag,
                addr: v6(),
            },
            Call::Listen {
                sock,
                tag,
                backlog: -1,
            },
            Call::Send {
                sock,
                buf,
                offset: 3 * 1024,
                flags: libc::MSG_NOSIGNAL | libc::MSG_MORE,
                dest: Some(v4()),
            },
            Call::Send {
                sock,
                buf: BufRef { id: 0, len: 0 },
                offset: 0,
                flags: i32::MIN,
                dest: None,
            },
            Call::Recv {
                sock,
                tag,
                max: u32::MAX,
                flags: libc::MSG_PEEK | libc::MSG_TRUNC,
                nonblock: true,
            },
            Call::Shutdown {
                sock,
                tag,
                how: libc::SHUT_RDWR,
            },
            Call::SetOpt {
                sock,
                tag,
                level: libc::IPPROTO_TCP,
                name: libc::TCP_NODELAY,
                value,
            },
            Call::SetOpt {
                sock,
                tag,
                level: -7,
                name: i32::MAX,
                value: InlineBytes::new(&[0xff; 32]).unwrap(),
            },
            Call::GetOpt {
                sock,
                tag,
                level: libc::SOL_SOCKET,
                name: libc::SO_ERROR,
                len: 4,
            },
            Call::SockName { sock, tag },
            Call::PeerName { sock, tag },
            Call::Pending { sock, tag },
            Call::BufReturn { sock: 0, buf: 12 },
            Call::TokenDrained { sock },
            Call::WantToken { sock },
            Call::Cancel {
                sock,
                parked: u32::MAX,
            },
            Call::Release { sock, tag },
            Call::BindModule {
                sock,
                tag: 0,
                binding: buf,
                files: 3,
            },
            Call::WantRoom {
                sock,
                returns_seen: 0xffff_fffe,
            },
            Call::Disconnect { sock, tag },
            Call::Order { sock, tag },
            Call::SendCtl {
                sock,
                offset: 224,
                bytes: InlineBytes::new(&[]).unwrap(),
            },
        ];
        calls.extend(Call::send_ctl(sock, &[9; 40]));
        calls
    }

    #[test]
    fn every_variant_round_trips() {
        let calls = every_call();
        let mut ops: Vec<u16> = calls.iter().map(|c| c.op() as u16).collect();
        ops.sort_unstable();
        ops.dedup();
        assert_eq!(ops, (1..=21).collect::<Vec<u16>>(), "one call of each op");
        for c in calls {
            let r = c.encode();
            assert_eq!(r.op, c.op() as u16);
            assert_eq!((r.sock, r.tag), (c.sock(), c.tag()));
            assert_eq!(Call::decode(&r), Ok(c), "{r:?}");
        }
    }

    #[test]
    fn tags_go_only_where_answers_do() {
        for c in every_call() {
            let t = c.with_tag(99);
            if c.tag() == 0 && !matches!(c, Call::BindModule { .. }) {
                assert_eq!(t, c, "fire-and-forget {c:?} took a tag");
            } else {
                assert_eq!(t.tag(), 99);
                assert_eq!(Call::decode(&t.encode()), Ok(t));
            }
        }
    }

    /// Records as the shim and the native client wrote them before `Call` existed
    /// encode the same.
    #[test]
    fn records_are_the_ones_written_before() {
        let mut r = Req::new(Op::Recv, 5);
        (r.tag, r.flags, r.a, r.b) = (3, REQ_NONBLOCK, 1000, libc::MSG_PEEK as u32);
        let c = Call::Recv {
            sock: 5,
            tag: 3,
            max: 1000,
            flags: libc::MSG_PEEK,
            nonblock: true,
        };
        assert_eq!(c.encode(), r);
        let mut r = Req::new(Op::Send, 5).with_addr(&v6());
        (r.buf, r.len, r.a, r.b) = (2, 100, libc::MSG_DONTWAIT as u32, 64);
        let c = Call::Send {
            sock: 5,
            buf: BufRef { id: 2, len: 100 },
            offset: 64,
            flags: libc::MSG_DONTWAIT,
            dest: Some(v6()),
        };
        assert_eq!(c.encode(), r);
        let mut r = Req::new(Op::SetOpt, 5).with_bytes(&[1, 2, 3]);
        (r.tag, r.a, r.b) = (8, libc::SOL_SOCKET as u32, libc::SO_RCVBUF as u32);
        let c = Call::SetOpt {
            sock: 5,
            tag: 8,
            level: libc::SOL_SOCKET,
            name: libc::SO_RCVBUF,
            value: InlineBytes::new(&[1, 2, 3]).unwrap(),
        };
        assert_eq!(c.encode(), r);
        let mut r = Req::new(Op::Listen, 5);
        (r.tag, r.a) = (1, u32::MAX);
        let c = Call::Listen {
            sock: 5,
            tag: 1,
            backlog: -1,
        };
        assert_eq!(c.encode(), r);
    }

    #[test]
    fn control_bytes_go_in_chunks() {
        let bytes: Vec<u8> = (0..=255).collect();
        let calls: Vec<Call> = Call::send_ctl(4, &bytes[..100]).collect();
        assert_eq!(calls.len(), 4);
        let mut joined = Vec::new();
        for c in &calls {
            let Call::SendCtl {
                sock: 4,
                offset,
                bytes,
            } = c
            else {
                panic!("{c:?}");
            };
            assert_eq!(*offset as usize, joined.len());
            joined.extend_from_slice(bytes.as_bytes());
        }
        assert_eq!(joined, &bytes[..100]);
        assert_eq!(Call::send_ctl(4, &[]).count(), 0);
    }

    #[test]
    fn inline_bytes_hold_at_most_32() {
        assert_eq!(InlineBytes::new(&[7; 32]).unwrap().as_bytes(), &[7; 32]);
        assert_eq!(InlineBytes::new(&[7; 33]), None);
        assert_eq!(InlineBytes::new(&[7; 300]), None);
        assert_eq!(
            format!("{:?}", InlineBytes::new(&[1, 2]).unwrap()),
            "[1, 2]"
        );
    }

    #[test]
    fn refusals_are_request_decodes() {
        let mut send = Req::new(Op::Send, 1);
        assert_eq!(Call::decode(&send), Err(DecodeError::MissingBuf(Op::Send)));
        send.buf = 1;
        assert!(Call::decode(&send).is_ok());
        // A destination that is not an address: refused here (the server refused it
        // when it sent).
        send.addr_len = 3;
        assert!(matches!(Call::decode(&send), Err(DecodeError::Addr(_))));
        let connect = Req::new(Op::Connect, 1);
        assert!(matches!(Call::decode(&connect), Err(DecodeError::Addr(_))));
        assert_eq!(
            Call::decode(&Req {
                op: 0,
                ..Req::default()
            }),
            Err(DecodeError::UnknownOp(0))
        );
    }

    /// decode → encode → decode is stable on records the decoder accepts, whatever
    /// else they carry (here: pseudo-random records with a valid operation).
    #[test]
    fn decode_encode_decode_is_stable() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut accepted = 0;
        for i in 0..200_000u32 {
            let mut rec = [0u8; RECORD_SIZE];
            for chunk in rec.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_ne_bytes());
            }
            let mut r: Req = bytemuck::pod_read_unaligned(&rec);
            r.op = u16::try_from(i % 21).unwrap();
            r.addr_len %= 40;
            if i % 3 == 0 {
                // Real addresses, so that the operations that need one decode too.
                let a = if i % 2 == 0 { v4() } else { v6() };
                r.addr_len = u32::try_from(a.encode(&mut r.addr)).unwrap();
            }
            if let Ok(c) = Call::decode(&r) {
                accepted += 1;
                let again = c.encode();
                assert_eq!(Call::decode(&again), Ok(c), "{r:?}");
                assert_eq!(Request::decode(again).map(|q| q.op), Ok(c.op()));
            }
        }
        assert!(accepted > 100_000, "{accepted}");
    }
}
