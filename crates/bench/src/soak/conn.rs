//! One end of one soak connection: a non-blocking state machine that the event loops of
//! [`super::run`] step when `poll` says its socket is ready.
//!
//! The outgoing side stages one message at a time (a random size up to 1 MiB, hashed as
//! it is staged) and writes what the socket takes, with `write` or a split `writev`. The
//! incoming side reads a random amount with `read`, `readv` or `recv(MSG_PEEK)` followed
//! by a `read` of the same length, checks every payload byte against the stream it
//! expects, hashes it, and keeps the trailer digests. How the connection ends is chosen
//! per connection ([`End`]).

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, TcpStream};

use sha2::{Digest, Sha256};

use super::{HEADER_LEN, Header, MAX_MESSAGE, Rng, fill};

/// How one end finishes once its streams are complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Client: `shutdown(SHUT_WR)` as soon as all is sent, then read to the server's end
    /// of stream, then `close`.
    ShutEarly,
    /// Client: `close` once all is sent and received (no `shutdown`).
    CloseAfter,
    /// Client: once all is sent and received, `shutdown(SHUT_WR)`, read to end, `close`.
    ShutLate,
    /// Server: `close` once all is sent and received.
    CloseNow,
    /// Server: `shutdown(SHUT_WR)`, read to the client's end of stream, `close`.
    ShutThenEof,
    /// Server: read to the client's end of stream, then `close`.
    EofThenClose,
}

impl End {
    /// How many ways a server can end (the header's `flags` picks one).
    pub const SERVER_WAYS: u64 = 3;

    /// The server's way from the header's `flags`.
    pub fn server(flags: u64) -> End {
        match flags % Self::SERVER_WAYS {
            0 => End::CloseNow,
            1 => End::ShutThenEof,
            _ => End::EofThenClose,
        }
    }

    /// A client's way, at random.
    pub fn client(rng: &mut Rng) -> End {
        match rng.below(3) {
            0 => End::ShutEarly,
            1 => End::CloseAfter,
            _ => End::ShutLate,
        }
    }
}

/// Which end of the connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The driver's end: sends the header.
    Client,
    /// The verifier's end: reads the header first.
    Server,
}

/// What a step left the connection in.
#[derive(Debug, PartialEq, Eq)]
pub enum State {
    /// Still going.
    Open,
    /// Both streams complete and the end done: the socket can be dropped.
    Finished,
}

/// A connection that failed: why, at which byte.
#[derive(Debug)]
pub struct Failure(pub String);

/// Counters of one end of one connection.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Payload bytes sent.
    pub sent: u64,
    /// Payload bytes received.
    pub received: u64,
    /// Received payload bytes that differ from the expected stream.
    pub bad: u64,
    /// Offset of the first bad byte.
    pub first_bad: Option<u64>,
    /// Digests compared equal (client: 2 per connection, server: 1).
    pub digests_equal: u64,
    /// Digests compared different.
    pub digests_differ: u64,
}

/// Scratch buffers shared by every connection of one loop.
#[derive(Debug)]
pub struct Scratch {
    read: Vec<u8>,
    expect: Vec<u8>,
}

impl Scratch {
    /// Buffers for messages up to [`MAX_MESSAGE`].
    pub fn new() -> Scratch {
        Scratch {
            read: vec![0; MAX_MESSAGE],
            expect: vec![0; MAX_MESSAGE],
        }
    }
}

impl Default for Scratch {
    fn default() -> Scratch {
        Scratch::new()
    }
}

/// Which calls move the bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Calls {
    /// `read`, `readv`, `recv(MSG_PEEK)`+`read`; `write`, `writev`.
    #[default]
    All,
    /// All but the peek.
    NoPeek,
    /// `read` and `write` only.
    Plain,
}

impl Calls {
    /// `all`, `no-peek` or `plain`.
    pub fn parse(s: &str) -> Result<Calls, String> {
        match s {
            "all" => Ok(Calls::All),
            "no-peek" => Ok(Calls::NoPeek),
            "plain" => Ok(Calls::Plain),
            _ => Err(format!("calls `{s}`: expected all, no-peek or plain")),
        }
    }
}

/// What the staged bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Staged {
    Nothing,
    Header,
    Payload,
    Trailer,
}

/// One end of a soak connection.
#[derive(Debug)]
pub struct Conn {
    /// The socket (non-blocking).
    pub sock: TcpStream,
    role: Role,
    rng: Rng,
    /// Known once the header is in (the server) or from the start (the client).
    pub header: Option<Header>,
    end: End,
    /// Which calls move the bytes.
    pub calls: Calls,
    // Outgoing.
    staged: Vec<u8>,
    staged_pos: usize,
    staged_kind: Staged,
    out_payload_staged: u64,
    out_hash: Sha256,
    out_done: bool,
    // Incoming.
    in_header: Vec<u8>,
    in_hash: Sha256,
    in_trailer: Vec<u8>,
    in_done: bool,
    eof: bool,
    shut: bool,
    /// Counters.
    pub tally: Tally,
    sent_digest: Option<[u8; 32]>,
    received_digest: Option<[u8; 32]>,
}

impl Conn {
    /// The driver's end of connection `h`: the header is the first thing it sends.
    pub fn client(sock: TcpStream, h: Header, seed: u64) -> Conn {
        let mut rng = Rng::new(seed ^ h.key);
        let end = End::client(&mut rng);
        let mut c = Conn::new(sock, Role::Client, rng, end);
        c.staged = h.encode().to_vec();
        c.staged_kind = Staged::Header;
        c.header = Some(h);
        c
    }

    /// The verifier's end of an accepted connection: reads the header first.
    pub fn server(sock: TcpStream, seed: u64) -> Conn {
        Conn::new(sock, Role::Server, Rng::new(seed), End::CloseNow)
    }

    fn new(sock: TcpStream, role: Role, rng: Rng, end: End) -> Conn {
        Conn {
            sock,
            role,
            rng,
            header: None,
            end,
            calls: Calls::All,
            staged: Vec::new(),
            staged_pos: 0,
            staged_kind: Staged::Nothing,
            out_payload_staged: 0,
            out_hash: Sha256::new(),
            out_done: false,
            in_header: Vec::with_capacity(HEADER_LEN),
            in_hash: Sha256::new(),
            in_trailer: Vec::new(),
            in_done: false,
            eof: false,
            shut: false,
            tally: Tally::default(),
            sent_digest: None,
            received_digest: None,
        }
    }

    /// Whether the loop should wait for input / room to send.
    pub fn wants(&self) -> (bool, bool) {
        let read = !self.eof && !self.is_end();
        let write = self.staged_pos < self.staged.len() || self.can_stage();
        (read, write)
    }

    /// Whether this is the driver's closing connection (the verifier answers it).
    pub fn is_end(&self) -> bool {
        self.header.is_some_and(|h| h.magic == super::END_MAGIC)
    }

    fn out_len(&self) -> Option<u64> {
        let h = self.header?;
        Some(match self.role {
            Role::Client => h.up,
            Role::Server => h.down,
        })
    }

    fn out_key(&self) -> u64 {
        self.header.map_or(0, |h| match self.role {
            Role::Client => h.up_key(),
            Role::Server => h.down_key(),
        })
    }

    fn in_len(&self) -> u64 {
        self.header.map_or(0, |h| match self.role {
            Role::Client => h.down,
            Role::Server => h.up,
        })
    }

    fn in_key(&self) -> u64 {
        self.header.map_or(0, |h| match self.role {
            Role::Client => h.down_key(),
            Role::Server => h.up_key(),
        })
    }

    fn trailer_len(&self) -> usize {
        match self.role {
            Role::Client => 64,
            Role::Server => 32,
        }
    }

    /// Whether there is more to stage now: payload left, or the trailer once it can be
    /// written (the server's needs the whole up stream first).
    fn can_stage(&self) -> bool {
        let Some(len) = self.out_len() else {
            return false;
        };
        if self.out_done || self.is_end() {
            return false;
        }
        if self.out_payload_staged < len {
            return true;
        }
        self.staged_kind != Staged::Trailer && (self.role == Role::Client || self.in_done)
    }

    fn stage(&mut self) {
        let Some(len) = self.out_len() else { return };
        self.staged.clear();
        self.staged_pos = 0;
        if self.out_payload_staged < len {
            let n = self
                .rng
                .size(MAX_MESSAGE as u64)
                .min(len - self.out_payload_staged) as usize;
            self.staged.resize(n, 0);
            fill(self.out_key(), self.out_payload_staged, &mut self.staged);
            self.out_hash.update(&self.staged);
            self.out_payload_staged += n as u64;
            self.staged_kind = Staged::Payload;
            return;
        }
        let digest: [u8; 32] = self.out_hash.clone().finalize().into();
        self.sent_digest = Some(digest);
        self.staged.extend_from_slice(&digest);
        if self.role == Role::Server {
            let got = self.received_digest.unwrap_or([0; 32]);
            self.staged.extend_from_slice(&got);
        }
        self.staged_kind = Staged::Trailer;
    }

    /// The socket is writable: write (part of) the staged message.
    pub fn on_writable(&mut self) -> Result<State, Failure> {
        if self.staged_pos == self.staged.len() {
            if !self.can_stage() {
                return self.advance();
            }
            self.stage();
        }
        let buf = &self.staged[self.staged_pos..];
        let r = if buf.len() > 1 && self.calls != Calls::Plain && self.rng.chance(1, 4) {
            let cut = 1 + self.rng.below(buf.len() as u64 - 1) as usize;
            let (a, b) = buf.split_at(cut);
            self.sock
                .write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
        } else {
            self.sock.write(buf)
        };
        match r {
            Ok(n) => {
                self.staged_pos += n;
                if self.staged_kind == Staged::Payload {
                    self.tally.sent += n as u64;
                }
                let all = self.staged_pos == self.staged.len();
                if all && self.staged_kind == Staged::Trailer {
                    self.out_done = true;
                }
                if all && self.staged_kind == Staged::Header && self.is_end() {
                    self.out_done = true;
                }
            }
            Err(e) if would_block(&e) => {}
            Err(e) => return Err(self.fail(format!("send: {e}"))),
        }
        self.advance()
    }

    /// The socket is readable: read a random amount and check it.
    pub fn on_readable(&mut self, scratch: &mut Scratch) -> Result<State, Failure> {
        let want = self.rng.size(MAX_MESSAGE as u64) as usize;
        let way = match self.calls {
            Calls::All => self.rng.below(8),
            Calls::NoPeek => [0, 1, 3][self.rng.below(3) as usize],
            Calls::Plain => 3,
        };
        let buf = &mut scratch.read[..want];
        let r = match way {
            0 | 1 if want > 1 => {
                let cut = 1 + self.rng.below(want as u64 - 1) as usize;
                let (a, b) = buf.split_at_mut(cut);
                self.sock
                    .read_vectored(&mut [IoSliceMut::new(a), IoSliceMut::new(b)])
            }
            2 => self.peek_then_read(buf),
            _ => self.sock.read(buf),
        };
        let n = match r {
            Ok(n) => n,
            Err(e) if would_block(&e) => return self.advance(),
            Err(e) => return Err(self.fail(format!("receive: {e}"))),
        };
        if n == 0 {
            self.eof = true;
            if !self.in_done {
                return Err(self.fail("end of stream before the whole stream".into()));
            }
            return self.advance();
        }
        let (read, expect) = (&scratch.read[..n], &mut scratch.expect);
        self.take(read, expect)?;
        self.advance()
    }

    /// `recv(MSG_PEEK)`, then a `read` of what the peek saw, which must be the same.
    fn peek_then_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.peek(buf)?;
        if n == 0 {
            return Ok(0);
        }
        let peeked = buf[..n].to_vec();
        let mut got = 0;
        let mut tries = 0;
        while got < n {
            match self.sock.read(&mut buf[got..n]) {
                Ok(0) => break,
                Ok(k) => got += k,
                // Peeked bytes are there to read: a few empty tries at most.
                Err(e) if would_block(&e) && got == 0 && tries < 10_000 => tries += 1,
                Err(e) if would_block(&e) && got > 0 => break,
                Err(e) => return Err(e),
            }
        }
        if buf[..got] != peeked[..got] {
            return Err(io::Error::other(
                "a read returned other bytes than the peek",
            ));
        }
        Ok(got)
    }

    /// Consumes received bytes: header, payload (checked and hashed), trailer.
    fn take(&mut self, mut bytes: &[u8], expect: &mut [u8]) -> Result<(), Failure> {
        if self.role == Role::Server && self.header.is_none() {
            let n = (HEADER_LEN - self.in_header.len()).min(bytes.len());
            self.in_header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.in_header.len() < HEADER_LEN {
                return Ok(());
            }
            let mut raw = [0u8; HEADER_LEN];
            raw.copy_from_slice(&self.in_header);
            let Some(h) = Header::decode(&raw) else {
                return Err(self.fail("bad header (magic)".into()));
            };
            self.header = Some(h);
            self.end = End::server(h.flags);
            self.rng = Rng::new(h.key ^ 0x7365_7276);
            if h.magic == super::END_MAGIC {
                self.in_done = true;
                if !bytes.is_empty() {
                    return Err(self.fail("bytes after the closing header".into()));
                }
                return Ok(());
            }
        }
        let left = self.in_len() - self.tally.received;
        let n = (left.min(bytes.len() as u64)) as usize;
        if n > 0 {
            let (payload, rest) = bytes.split_at(n);
            let expect = &mut expect[..n];
            fill(self.in_key(), self.tally.received, expect);
            if payload != expect {
                let bad = payload.iter().zip(expect.iter()).filter(|(a, b)| a != b);
                let first = payload.iter().zip(expect.iter()).position(|(a, b)| a != b);
                self.tally.bad += bad.count() as u64;
                if self.tally.first_bad.is_none() {
                    self.tally.first_bad = first.map(|p| self.tally.received + p as u64);
                }
            }
            self.in_hash.update(payload);
            self.tally.received += n as u64;
            bytes = rest;
        }
        if self.tally.received == self.in_len() && self.received_digest.is_none() {
            self.received_digest = Some(self.in_hash.clone().finalize().into());
        }
        if !bytes.is_empty() {
            let room = self.trailer_len() - self.in_trailer.len();
            if bytes.len() > room {
                return Err(self.fail(format!(
                    "{} bytes more than the stream has",
                    bytes.len() - room
                )));
            }
            self.in_trailer.extend_from_slice(bytes);
        }
        if self.in_trailer.len() == self.trailer_len() && !self.in_done {
            self.in_done = true;
            self.check_digests();
        }
        Ok(())
    }

    /// Compares the peer's digests with ours (counted in the tally).
    fn check_digests(&mut self) {
        let got = self.received_digest.unwrap_or([0; 32]);
        let mut pairs = vec![(got, &self.in_trailer[..32])];
        if self.role == Role::Client {
            // What the server received against what we sent (staged = sent: every
            // staged byte is written before the trailer).
            let sent: [u8; 32] = self.out_hash.clone().finalize().into();
            pairs.push((sent, &self.in_trailer[32..64]));
        }
        for (ours, theirs) in pairs {
            if ours[..] == *theirs {
                self.tally.digests_equal += 1;
            } else {
                self.tally.digests_differ += 1;
            }
        }
    }

    /// Ends the connection when its streams are complete, as its [`End`] says.
    fn advance(&mut self) -> Result<State, Failure> {
        if self.is_end() {
            // The verifier's loop answers the closing connection itself.
            return Ok(State::Open);
        }
        let complete = self.in_done && self.out_done;
        let shut_now = match self.end {
            End::ShutEarly => self.out_done,
            End::ShutLate | End::ShutThenEof => complete,
            _ => false,
        };
        if shut_now && !self.shut {
            self.shut = true;
            if let Err(e) = self.sock.shutdown(Shutdown::Write) {
                return Err(self.fail(format!("shutdown: {e}")));
            }
        }
        let finished = match self.end {
            End::CloseAfter | End::CloseNow => complete,
            _ => complete && self.eof,
        };
        Ok(if finished {
            State::Finished
        } else {
            State::Open
        })
    }

    fn fail(&self, why: String) -> Failure {
        let id = self.header.map_or("?".into(), |h| h.id.to_string());
        Failure(format!(
            "connection {id} ({:?}, {:?}): {why}; sent {} of {:?}, received {} of {}",
            self.role,
            self.end,
            self.tally.sent,
            self.out_len(),
            self.tally.received,
            self.in_len()
        ))
    }

    /// One line on where the connection stands (for a stall report).
    pub fn describe(&self) -> String {
        let (r, w) = self.wants();
        format!(
            "connection {} ({:?}, {:?}): sent {} of {:?} (staged {} of {}), received {} of {} + trailer {}/{}, wants read {r} write {w}, eof {}, shut {}",
            self.header.map_or("?".into(), |h| h.id.to_string()),
            self.role,
            self.end,
            self.tally.sent,
            self.out_len(),
            self.staged_pos,
            self.staged.len(),
            self.tally.received,
            self.in_len(),
            self.in_trailer.len(),
            self.trailer_len(),
            self.eof,
            self.shut
        )
    }

    /// The digest of the payload this end sent (known once it is all staged).
    pub fn sent_digest(&self) -> Option<[u8; 32]> {
        self.sent_digest
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}
