//! The end cases of `ferry-soak` (`ferry-soak ends` in the sandbox, `ferry-soak
//! ends-peer` outside it): what happens to bytes at the end of a connection, where a
//! network layer loses them or lies about them.
//!
//! - **race**: a worker thread sends a connection's payload (64–256 KiB; blocking
//!   `send` or `write`, whole or in pieces; non-blocking `send` with `poll`; `sendfile`,
//!   blocking or not) and, the moment its sends have returned, another thread
//!   `close`s the socket or `shutdown(SHUT_WR)`s it (then closes at once, or after the
//!   peer's end of stream). The peer reads to the end of stream: every byte a send
//!   reported must be there, in order, before the FIN.
//! - **dead**: the peer reads 0–256 KiB, then resets (`SO_LINGER` 0) or closes, while
//!   the driver keeps sending (every method): each connection must see EPIPE or
//!   ECONNRESET before it has sent past the peer's stop by [`send::Bounds`] (bytes or
//!   time), and every send after that error must fail too. Thousands of connections in
//!   one process.
//! - **sendfile**: `SO_SNDBUF` 4096, then `sendfile` of 128–256 KiB to a peer (its
//!   `SO_RCVBUF` 1 KiB) that reads 1 KiB and closes: the sender must get EPIPE or
//!   ECONNRESET, not the whole file reported sent (asyncio's
//!   `test_sendfile_close_peer_in_the_middle_of_receiving`).
//!
//! Every connection opens with a [`wire::Head`] naming its run, case and number, the
//! payload's stream (key and offset, see [`crate::soak::fill`]) and what the peer does.
//! At the end of each case the driver lists each connection with the bytes its sends
//! reported; the peer answers with what it received of them ([`tally::judge`]). A case
//! passes with no byte lost, added or altered, no send into a dead connection, every
//! error sticky, no stall ([`tally::Summary::ok`]). Busy processes (`--busy`, two by
//! default) spin beside the driver: the races show with them.

pub mod drive;
pub mod peer;
pub mod plan;
pub mod send;
#[allow(unsafe_code)]
mod sys;
pub mod tally;
pub mod wire;

/// A case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Case {
    /// Sends racing a close or shutdown from another thread.
    Race = 0,
    /// Sends into connections the peer reset or closed.
    Dead = 1,
    /// `sendfile` with a small `SO_SNDBUF` to a peer that closes after 1 KiB.
    Sendfile = 2,
}

impl Case {
    /// Every case, in the order a run takes them.
    pub const ALL: [Case; 3] = [Case::Race, Case::Dead, Case::Sendfile];

    /// `race`, `dead`, `sendfile`.
    pub fn name(self) -> &'static str {
        match self {
            Case::Race => "race",
            Case::Dead => "dead",
            Case::Sendfile => "sendfile",
        }
    }

    /// A case from its name.
    pub fn parse(s: &str) -> Result<Case, String> {
        Case::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("case `{s}`: expected race, dead or sendfile"))
    }

    fn from_u64(v: u64) -> Option<Case> {
        Case::ALL.into_iter().find(|c| *c as u64 == v)
    }
}

/// What the peer does with a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Reads to the end of stream, then closes.
    ToEof = 0,
    /// Reads its `stop` bytes, then resets (`SO_LINGER` 0, `close`).
    Reset = 1,
    /// Reads its `stop` bytes, then closes.
    Close = 2,
}

impl Act {
    fn from_u64(v: u64) -> Option<Act> {
        [Act::ToEof, Act::Reset, Act::Close]
            .into_iter()
            .find(|a| *a as u64 == v)
    }
}

/// The calls that move a connection's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Blocking `send`.
    Send = 0,
    /// Blocking `write`.
    Write = 1,
    /// Non-blocking `send`, `poll` for `POLLOUT` when it would block.
    SendNb = 2,
    /// Blocking `sendfile` from the file.
    Sendfile = 3,
    /// Non-blocking `sendfile` with `poll`.
    SendfileNb = 4,
}

impl Method {
    /// Every method.
    pub const ALL: [Method; 5] = [
        Method::Send,
        Method::Write,
        Method::SendNb,
        Method::Sendfile,
        Method::SendfileNb,
    ];

    /// `send`, `write`, `send-nb`, `sendfile`, `sendfile-nb`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Send => "send",
            Method::Write => "write",
            Method::SendNb => "send-nb",
            Method::Sendfile => "sendfile",
            Method::SendfileNb => "sendfile-nb",
        }
    }

    /// A method from its name.
    pub fn parse(s: &str) -> Result<Method, String> {
        Method::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("method `{s}`: expected send, write, send-nb, sendfile or sendfile-nb")
            })
    }

    fn from_u64(v: u64) -> Option<Method> {
        Method::ALL.into_iter().find(|m| *m as u64 == v)
    }

    /// Whether the socket is non-blocking.
    pub fn nonblocking(self) -> bool {
        matches!(self, Method::SendNb | Method::SendfileNb)
    }

    /// Whether the bytes come from the file.
    pub fn from_file(self) -> bool {
        matches!(self, Method::Sendfile | Method::SendfileNb)
    }
}

/// How the race case's closing thread ends a connection once the sends returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseWay {
    /// `close` at once.
    Close = 0,
    /// `shutdown(SHUT_WR)`, then `close` at once.
    ShutClose = 1,
    /// `shutdown(SHUT_WR)`, wait for the peer's end of stream, `close`.
    ShutWait = 2,
}

impl CloseWay {
    fn from_u64(v: u64) -> Option<CloseWay> {
        [CloseWay::Close, CloseWay::ShutClose, CloseWay::ShutWait]
            .into_iter()
            .find(|c| *c as u64 == v)
    }
}
