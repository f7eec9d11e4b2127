//! The integrity soak and the connection load behind `ferry-soak`: TCP traffic whose
//! every byte both ends can check.
//!
//! Theory of operation. Each connection carries two byte streams, one each way, whose
//! contents are a pure function of a key and the byte's offset ([`fill`]): a receiver
//! generates what it should have got and compares byte for byte, so a lost, doubled,
//! reordered or altered byte is found at its offset, whatever the split into reads.
//! Both ends also hash what they sent and what they received (SHA-256) and exchange the
//! digests at the end of each stream, so equal digests on both sides are checked too.
//!
//! Wire format of one soak connection (all integers little-endian):
//!
//! - client → server: a 48-byte [`Header`] (magic, connection number, key, bytes up,
//!   bytes down, how the server ends), `up` payload bytes, the SHA-256 of that payload
//!   as the client sent it;
//! - server → client: `down` payload bytes, the SHA-256 of that payload as the server
//!   sent it, the SHA-256 of the up payload as the server received it (sent only once
//!   the server has received the whole up stream).
//!
//! The client checks both digests: what it got against what the server sent, and what
//! the server got against what it sent itself. At the end the driver opens one more
//! connection whose header has the [`END_MAGIC`] and its totals; the verifier answers
//! with its own verdict line (`verifier: OK …` or `verifier: BAD …`).
//!
//! Sizes, the split into messages (1 B … 1 MiB), the order in which ready connections are
//! served, the read and write calls used (`read`, `readv`, `recv(MSG_PEEK)`+`read`,
//! `write`, `writev`) and how each end finishes (`shutdown` early or late, `close` at
//! once or after the peer's end of stream) all come from a seeded generator: a run is
//! repeatable from its seed.

pub mod conn;
pub mod ends;
pub mod hold;
pub mod run;

use sha2::{Digest, Sha256};

/// First 8 bytes of a soak connection's header.
pub const MAGIC: [u8; 8] = *b"FSOAK001";
/// First 8 bytes of the driver's closing connection.
pub const END_MAGIC: [u8; 8] = *b"FSOAKEND";
/// Length of a [`Header`] on the wire.
pub const HEADER_LEN: usize = 48;
/// Largest message (one write's worth, one read's worth).
pub const MAX_MESSAGE: usize = 1 << 20;

/// Key salt of the client → server stream.
const UP_SALT: u64 = 0x7570_7570_7570_7570;
/// Key salt of the server → client stream.
const DOWN_SALT: u64 = 0x646f_776e_646f_776e;

/// A small, fast, seeded generator (xorshift64*); not for cryptography.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(mix(seed) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// Log-uniform in `1..=max`: every power of two up to `max` as likely as any other,
    /// uniform within it.
    pub fn size(&mut self, max: u64) -> u64 {
        let bits = 64 - max.max(1).leading_zeros() as u64;
        let lo = 1u64 << self.below(bits);
        (lo + self.below(lo)).min(max)
    }
}

/// splitmix64's finaliser: a bijective mix of 64 bits.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with the stream `key`'s bytes from `offset` on: byte `i` is byte `i % 8`
/// of `mix(key + i / 8 · φ)`, so any range can be made without the ones before it.
pub fn fill(key: u64, offset: u64, buf: &mut [u8]) {
    let word = |k: u64| mix(key ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes();
    let skip = (offset % 8) as usize;
    let mut k = offset / 8;
    let mut rest = &mut buf[..];
    if skip != 0 {
        let w = word(k);
        let n = (8 - skip).min(rest.len());
        rest[..n].copy_from_slice(&w[skip..skip + n]);
        rest = &mut rest[n..];
        k += 1;
    }
    let mut chunks = rest.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&word(k));
        k += 1;
    }
    let tail = chunks.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&word(k)[..n]);
}

/// What one soak connection carries, chosen by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Magic: [`MAGIC`] or [`END_MAGIC`].
    pub magic: [u8; 8],
    /// Connection number (for messages), or with `END_MAGIC` the number of connections.
    pub id: u64,
    /// Stream key; with `END_MAGIC` unused.
    pub key: u64,
    /// Payload bytes client → server (with `END_MAGIC`: the run's total).
    pub up: u64,
    /// Payload bytes server → client (with `END_MAGIC`: the run's total).
    pub down: u64,
    /// How the server ends ([`conn::End`] as a number).
    pub flags: u64,
}

impl Header {
    /// The wire form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(&self.magic);
        for (i, v) in [self.id, self.key, self.up, self.down, self.flags]
            .iter()
            .enumerate()
        {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses the wire form; `None` for an unknown magic.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Option<Header> {
        let magic: [u8; 8] = b[..8].try_into().ok()?;
        if magic != MAGIC && magic != END_MAGIC {
            return None;
        }
        let n = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[8 + i * 8..16 + i * 8]);
            u64::from_le_bytes(w)
        };
        Some(Header {
            magic,
            id: n(0),
            key: n(1),
            up: n(2),
            down: n(3),
            flags: n(4),
        })
    }

    /// Key of the client → server payload.
    pub fn up_key(&self) -> u64 {
        self.key ^ UP_SALT
    }

    /// Key of the server → client payload.
    pub fn down_key(&self) -> u64 {
        self.key ^ DOWN_SALT
    }
}

/// Which ways a driver's connections carry payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client → server only.
    Up,
    /// Server → client only.
    Down,
    /// Both (most connections both ways, some one way only).
    Both,
}

impl Direction {
    /// `up`, `down` or `both`.
    pub fn parse(s: &str) -> Result<Direction, String> {
        match s {
            "up" => Ok(Direction::Up),
            "down" => Ok(Direction::Down),
            "both" => Ok(Direction::Both),
            _ => Err(format!("direction `{s}`: expected up, down or both")),
        }
    }
}

/// The driver's connections, made from a seed until their payload adds up to `total`.
#[derive(Clone, Debug)]
pub struct Plan {
    rng: Rng,
    seed: u64,
    next: u64,
    left: u64,
    max_conn: u64,
    direction: Direction,
}

impl Plan {
    /// Connections carrying `total` payload bytes (both ways added), each at most
    /// `max_conn` bytes each way.
    pub fn new(seed: u64, total: u64, max_conn: u64, direction: Direction) -> Plan {
        Plan {
            rng: Rng::new(seed ^ 0x706c_616e),
            seed,
            next: 0,
            left: total,
            max_conn: max_conn.max(1),
            direction,
        }
    }
}

impl Iterator for Plan {
    type Item = Header;

    fn next(&mut self) -> Option<Header> {
        if self.left == 0 {
            return None;
        }
        let r = &mut self.rng;
        let (mut up, mut down) = (r.size(self.max_conn), r.size(self.max_conn));
        match (self.direction, r.below(16)) {
            (Direction::Up, _) => down = 0,
            (Direction::Down, _) => up = 0,
            (Direction::Both, 0) => up = 0,
            (Direction::Both, 1) => down = 0,
            (Direction::Both, 2) => (up, down) = (r.size(64), r.size(64)),
            (Direction::Both, 3) => (up, down) = (0, 0),
            _ => {}
        }
        // The last connection takes what is left.
        let scale = |v: u64, left: u64| v.min(left);
        up = scale(up, self.left);
        down = scale(down, self.left - up);
        self.left -= up + down;
        let h = Header {
            magic: MAGIC,
            id: self.next,
            key: mix(self.seed ^ mix(self.next)),
            up,
            down,
            flags: r.below(conn::End::SERVER_WAYS),
        };
        self.next += 1;
        Some(h)
    }
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// `12.3 MB` style (10^6 bytes), for progress lines.
pub fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Parses `500M`, `10G`, `4K` or a plain byte count (powers of 1000; `Mi`, `Gi` for 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("size `{s}`: no number"))?;
    let mult = match unit {
        "" | "B" => 1,
        "K" | "k" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        _ => return Err(format!("size `{s}`: unknown unit `{unit}`")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_range_of_a_stream_matches_the_whole() {
        let mut whole = vec![0u8; 1000];
        fill(42, 0, &mut whole);
        for (off, len) in [(0, 1), (3, 5), (7, 9), (8, 8), (13, 200), (999, 1), (5, 0)] {
            let mut part = vec![0u8; len];
            fill(42, off as u64, &mut part);
            assert_eq!(part, whole[off..off + len], "range {off}+{len}");
        }
        let mut other = vec![0u8; 1000];
        fill(43, 0, &mut other);
        assert_ne!(other, whole);
    }

    #[test]
    fn header_round_trip() {
        let h = Header {
            magic: MAGIC,
            id: 7,
            key: u64::MAX,
            up: 1 << 40,
            down: 3,
            flags: 2,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert_eq!(Header::decode(&bad), None);
    }

    #[test]
    fn plan_adds_up_and_repeats() {
        let a: Vec<Header> = Plan::new(9, 300 << 20, 64 << 20, Direction::Both).collect();
        let b: Vec<Header> = Plan::new(9, 300 << 20, 64 << 20, Direction::Both).collect();
        assert_eq!(a, b);
        assert_eq!(a.iter().map(|h| h.up + h.down).sum::<u64>(), 300 << 20);
        assert!(a.iter().all(|h| h.up <= 64 << 20 && h.down <= 64 << 20));
        assert!(a.iter().any(|h| h.up > 0 && h.down > 0));
        let up: Vec<Header> = Plan::new(9, 10 << 20, 1 << 20, Direction::Up).collect();
        assert!(up.iter().all(|h| h.down == 0));
    }

    #[test]
    fn sizes_stay_in_range() {
        let mut r = Rng::new(1);
        let v: Vec<u64> = (0..10_000).map(|_| r.size(MAX_MESSAGE as u64)).collect();
        assert!(v.iter().all(|&s| (1..=MAX_MESSAGE as u64).contains(&s)));
        assert!(v.contains(&1));
        assert!(v.iter().any(|&s| s > 512 << 10));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("10G"), Ok(10_000_000_000));
        assert_eq!(parse_size("300M"), Ok(300_000_000));
        assert_eq!(parse_size("4Ki"), Ok(4096));
        assert_eq!(parse_size("17"), Ok(17));
        assert!(parse_size("x").is_err());
        assert!(parse_size("3Q").is_err());
    }
}
