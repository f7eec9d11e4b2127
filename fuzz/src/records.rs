//! Target `records`: every fixed-size record that crosses the sandbox boundary, decoded
//! from bytes the sandbox chose, and what the server derives from a request.
//!
//! The input is cut into 64-byte pieces, each read as a ring request ([`Req`], through
//! [`Request::decode`] and its `addr()`/`value()`, and through [`Call::decode`]), a
//! completion ([`Cmp`], also through one [`Demux`] kept over the whole input, as a
//! shim's channel takes them), a control message ([`Ctl`]) and a [`Hello`]; the whole
//! input is also decoded as a socket address and as a readiness pair's abstract name.
//! Properties checked: decoding never panics; a decoded request only exposes bytes
//! inside its record and the fields its operation needs are valid; a typed request
//! decodes where `Request::decode` does (but for a `Send` whose destination is not an
//! address) and round-trips through `encode`; the demux gives a call only its own
//! completions and keeps its control bytes within bounds; addresses round-trip; pair
//! names round-trip and name a server below [`MAX_SERVERS`].

use ferry_proto::demux::{Demux, Event};
use ferry_proto::{
    Call, Cmp, CmpKind, Ctl, Hello, MAX_SERVERS, NO_BUF, Op, PAIR_NAME_PREFIX, RECORD_SIZE, Req,
    Request, WireAddr, cmsg, pair_name, parse_pair_name, server_of,
};

use crate::input::Input;

/// One input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let mut demux = Demux::new();
    while !input.is_empty() {
        let mut rec = [0u8; RECORD_SIZE];
        input.fill(&mut rec);
        request(bytemuck::pod_read_unaligned(&rec));
        call(bytemuck::pod_read_unaligned(&rec));
        completion(bytemuck::pod_read_unaligned(&rec));
        demuxed(&mut demux, bytemuck::pod_read_unaligned(&rec));
        control(bytemuck::pod_read_unaligned(&rec));
        hello(bytemuck::pod_read_unaligned(&rec[..size_of::<Hello>()]));
    }
    address(data);
    name(data);
}

/// A request as the server takes it off the ring.
fn request(raw: Req) {
    let req = match Request::decode(raw) {
        Ok(req) => req,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(req.raw, raw, "decode keeps the record");
    assert_eq!(req.op as u16, raw.op);
    assert!(raw.addr_len as usize <= raw.addr.len(), "{raw:?}");
    assert_eq!(req.value(), &raw.addr[..raw.addr_len as usize]);
    if matches!(req.op, Op::Send | Op::BufReturn | Op::BindModule) {
        assert_ne!(raw.buf, NO_BUF, "{:?} without a buffer accepted", req.op);
    }
    let addr = req.addr();
    if matches!(req.op, Op::Connect | Op::Bind) {
        assert!(
            matches!(addr, Ok(Some(_))),
            "{:?} decoded but its address does not: {addr:?}",
            req.op
        );
    }
    match addr {
        Ok(Some(a)) => round_trip(a),
        Ok(None) => assert_eq!(raw.addr_len, 0),
        Err(e) => {
            let _ = e.to_string();
        }
    }
    assert!(server_of(raw.sock) < MAX_SERVERS);
}

/// A request in its typed form: accepted where [`Request::decode`] accepts it (but for a
/// `Send` whose destination is not an address), with the same operation and socket, and
/// stable through `encode`.
fn call(raw: Req) {
    let req = Request::decode(raw);
    let c = match Call::decode(&raw) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.to_string();
            if let Ok(req) = req {
                assert_eq!(req.op, Op::Send, "{raw:?} refused: {e}");
                assert!(req.addr().is_err(), "{raw:?} refused: {e}");
            }
            return;
        }
    };
    let req = req.expect("a typed request decodes as a Request");
    assert_eq!((c.op(), c.sock()), (req.op, raw.sock));
    let again = c.encode();
    assert_eq!(Call::decode(&again), Ok(c), "{raw:?}");
    // The record's tag is the call's, or the operation has none.
    assert!(c.tag() == raw.tag || c.with_tag(raw.tag) == c, "{raw:?}");
}

/// A completion taken by a demux, as the shim's channel takes them: a call begins before
/// each record whose `flags` have their top bit set (no flag of the protocol's).
fn demuxed(d: &mut Demux, c: Cmp) {
    if c.flags & 0x8000 != 0 {
        d.begin();
    }
    let call = d.in_progress();
    match d.take(c) {
        Ok(Event::Data { .. } | Event::Control) => assert_eq!(call, Some(c.tag)),
        Ok(Event::Done(done)) => {
            assert_eq!((call, done), (Some(c.tag), c));
            assert_eq!(d.in_progress(), None);
        }
        Ok(Event::Orphan { .. } | Event::Stale) => assert_ne!(call, Some(c.tag)),
        Ok(Event::BufReturn { .. } | Event::AsyncError { .. }) => {}
        Err(e) => {
            let _ = e.to_string();
        }
    }
    if !matches!(c.kind(), Ok(CmpKind::Done)) || call != Some(c.tag) {
        assert_eq!(d.in_progress(), call);
    }
    assert!(d.control().len() <= cmsg::MAX_CONTROL);
}

/// A completion as the shim or the native client takes it off the ring.
fn completion(c: Cmp) {
    let bytes = c.bytes();
    assert_eq!(bytes.len(), (c.addr_len as usize).min(c.addr.len()));
    if let Ok(kind) = c.kind() {
        assert_eq!(kind as u16, c.kind);
    }
    if let Ok(a) = WireAddr::decode(bytes) {
        round_trip(a);
    }
}

/// A control message as the server reads it off the control socket.
fn control(msg: Ctl) {
    if let Some(kind) = msg.kind() {
        assert_eq!(kind as u32, msg.kind);
    }
    let n = (msg.addr_len as usize).min(msg.addr.len());
    if let Ok(a) = WireAddr::decode(&msg.addr[..n]) {
        round_trip(a);
    }
}

/// A channel's first message: the server reads the target server from the low bits.
fn hello(h: Hello) {
    let target = (h.server & 0xffff) as usize;
    assert!(target <= 0xffff);
}

/// Raw `sockaddr` bytes (as given to connect, bind, sendto).
fn address(b: &[u8]) {
    match WireAddr::decode(b) {
        Ok(a) => {
            round_trip(a);
            let _ = (a.is_loopback(), a.is_unspecified());
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// Encoding a decoded address and decoding it again gives the same address.
fn round_trip(a: WireAddr) {
    let mut out = [0u8; 32];
    let n = a.encode(&mut out);
    assert!(n <= out.len());
    assert_eq!(WireAddr::decode(&out[..n]), Ok(a));
}

/// An abstract unix name, as the shim reads a readiness pair's:
/// `ferry:<id digits>:<16 hex digits>`.
fn name(b: &[u8]) {
    if let Some(id) = parse_pair_name(b) {
        let rest = &b[PAIR_NAME_PREFIX.len()..];
        let (digits, nonce) = rest.split_at(rest.iter().position(|&c| c == b':').unwrap());
        assert!(!digits.is_empty() && digits.len() <= 10);
        assert!(digits.iter().all(u8::is_ascii_digit), "{b:?}");
        assert_eq!(nonce.len(), 17, "{b:?}");
        assert!(nonce[1..].iter().all(u8::is_ascii_hexdigit), "{b:?}");
        assert!(b.len() <= ferry_proto::PAIR_NAME_MAX);
        let parsed = std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<u32>().ok());
        assert_eq!(parsed, Some(id), "{b:?}");
    }
    // Every id and nonce has a name that fits and parses back.
    let mut w = [0u8; 12];
    Input::new(b).fill(&mut w);
    let id = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    let nonce = u64::from_le_bytes([w[4], w[5], w[6], w[7], w[8], w[9], w[10], w[11]]);
    let (canon, n) = pair_name(id, nonce);
    assert!(n <= canon.len());
    assert_eq!(parse_pair_name(&canon[..n]), Some(id));
}
