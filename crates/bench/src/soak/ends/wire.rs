//! The wire format of the end cases: a fixed header opening each connection, the
//! driver's closing message (what each connection's sends reported) and the peer's
//! binary verdict. All integers little-endian.

use super::{Act, Case, CloseWay, Method};

/// Length of a [`Head`] on the wire.
pub const HEAD_LEN: usize = 64;
/// First 8 bytes of a case connection.
pub const MAGIC: [u8; 8] = *b"FENDS001";
/// First 8 bytes of the driver's closing connection of a case.
pub const END_MAGIC: [u8; 8] = *b"FENDSEND";
/// First 8 bytes of the peer's verdict.
pub const VERDICT_MAGIC: [u8; 8] = *b"FENDSVRD";
/// Most connections one closing message may list (a peer refuses more).
pub const MAX_LISTED: u64 = 1 << 24;

/// What opens a connection: which run and case, what the payload is, and what the
/// peer does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// [`MAGIC`] or [`END_MAGIC`].
    pub magic: [u8; 8],
    /// The driver's run (connections of two drivers never mix).
    pub run: u64,
    /// Connection number within the case; with [`END_MAGIC`], how many are listed.
    pub id: u64,
    /// The case.
    pub case: Case,
    /// What the peer does once it has `stop` bytes.
    pub act: Act,
    /// Stream key of the payload (see [`crate::soak::fill`]).
    pub key: u64,
    /// Offset in the stream of the first payload byte.
    pub start: u64,
    /// Payload bytes the peer reads before it acts (`u64::MAX`: to the end of stream).
    pub stop: u64,
    /// Payload bytes the driver means to send (`u64::MAX`: until a send fails).
    pub len: u64,
    /// The calls that send it (for the peer's reports).
    pub method: Method,
    /// How the driver closes (the race case; for the peer's reports).
    pub close: CloseWay,
}

impl Head {
    /// The wire form.
    pub fn encode(&self) -> [u8; HEAD_LEN] {
        let mut b = [0u8; HEAD_LEN];
        b[..8].copy_from_slice(&self.magic);
        let how = self.case as u64
            | (self.act as u64) << 8
            | (self.method as u64) << 16
            | (self.close as u64) << 24;
        let words = [
            self.run, self.id, how, self.key, self.start, self.stop, self.len,
        ];
        for (i, v) in words.iter().enumerate() {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses the wire form; `None` for an unknown magic, case or act.
    pub fn decode(b: &[u8; HEAD_LEN]) -> Option<Head> {
        let magic: [u8; 8] = b[..8].try_into().ok()?;
        if magic != MAGIC && magic != END_MAGIC {
            return None;
        }
        let w = words::<7>(&b[8..]);
        Some(Head {
            magic,
            run: w[0],
            id: w[1],
            case: Case::from_u64(w[2] & 0xff)?,
            act: Act::from_u64(w[2] >> 8 & 0xff)?,
            method: Method::from_u64(w[2] >> 16 & 0xff)?,
            close: CloseWay::from_u64(w[2] >> 24)?,
            key: w[3],
            start: w[4],
            stop: w[5],
            len: w[6],
        })
    }

    /// The closing message's head: `count` (id, sent) pairs follow.
    pub fn closing(run: u64, case: Case, count: u64) -> Head {
        Head {
            magic: END_MAGIC,
            run,
            id: count,
            case,
            act: Act::ToEof,
            key: 0,
            start: 0,
            stop: 0,
            len: 0,
            method: Method::Send,
            close: CloseWay::Close,
        }
    }
}

/// `N` little-endian words from the front of `b` (which holds at least `8 N` bytes).
pub fn words<const N: usize>(b: &[u8]) -> [u64; N] {
    let mut out = [0u64; N];
    for (i, c) in b.chunks_exact(8).take(N).enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        out[i] = u64::from_le_bytes(w);
    }
    out
}

/// The (id, bytes the sends reported) pairs of a closing message.
pub fn encode_sent(sent: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(sent.len() * 16);
    for (id, n) in sent {
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
    }
    b
}

/// The pairs back from their wire form (a trailing partial pair is ignored).
pub fn decode_sent(b: &[u8]) -> Vec<(u64, u64)> {
    b.chunks_exact(16)
        .map(|c| {
            let [id, n] = words::<2>(c);
            (id, n)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_round_trip() {
        let h = Head {
            magic: MAGIC,
            run: 1 << 63,
            id: 7,
            case: Case::Dead,
            act: Act::Reset,
            key: u64::MAX,
            start: 12,
            stop: 4096,
            len: u64::MAX,
            method: Method::SendfileNb,
            close: CloseWay::ShutWait,
        };
        assert_eq!(Head::decode(&h.encode()), Some(h));
        let c = Head::closing(3, Case::Sendfile, 9);
        assert_eq!(Head::decode(&c.encode()), Some(c));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert_eq!(Head::decode(&bad), None);
        let mut bad = h.encode();
        bad[24] = 9; // no such case
        assert_eq!(Head::decode(&bad), None);
    }

    #[test]
    fn sent_round_trip() {
        let v = vec![(0, 5), (3, u64::MAX), (1 << 40, 0)];
        assert_eq!(decode_sent(&encode_sent(&v)), v);
        assert_eq!(decode_sent(&[0u8; 20]), vec![(0, 0)]);
    }
}
