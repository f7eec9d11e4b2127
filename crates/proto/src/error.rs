//! Protocol violations: why one side gives a channel up because of what its peer sent
//! (or did not send). Each side maps a [`ProtoError`] to its own failure (the shim marks
//! the channel dead, the native client returns `io::ErrorKind::InvalidData`, the server
//! closes the channel); I/O failures are not protocol violations and are not here.

use crate::{Cmp, DecodeError, Op};

/// How a peer broke the protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A record or message that does not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A completion that nothing on this side waits for: another call's, or of a kind
    /// the wait does not take.
    #[error("unexpected completion {0:?}")]
    Unexpected(Cmp),
    /// Control bytes (`SendCtl` records, `Control` completions) that do not follow the
    /// ones before them, or go beyond [`crate::cmsg::MAX_CONTROL`].
    #[error("control bytes at offset {offset} after {have}")]
    ControlOffset {
        /// The offset the record gave.
        offset: u32,
        /// How many bytes had come before.
        have: usize,
    },
    /// A request about a socket the server does not know.
    #[error("socket {0} is unknown")]
    UnknownSocket(u32),
    /// A request about a socket the channel's process does not hold.
    #[error("socket {0} is not held by the channel's process")]
    NotHolder(u32),
    /// A buffer id or range that is not in the region, or a buffer that is not the
    /// peer's to name (not lent, returned twice).
    #[error("buffer {0} is not one the peer may name")]
    BadBuffer(u32),
    /// A request that needs an address came without one.
    #[error("{0:?} without an address")]
    NoAddress(Op),
    /// An answer to `Hello` of the wrong size.
    #[error("hello reply of {0} bytes")]
    HelloSize(usize),
    /// The server refused the channel (its version, 0 for a refusal).
    #[error("server refused the channel (version {0})")]
    Refused(u32),
    /// An answer to `Hello` with other than its two descriptors.
    #[error("hello reply with {0} descriptors")]
    HelloFds(usize),
    /// A control message of a kind the receiver does not take.
    #[error("control message of kind {0}")]
    CtlKind(u32),
    /// A control message of the wrong size.
    #[error("control message of {0} bytes")]
    CtlSize(usize),
    /// A module binding on the ring named files that did not come before it on the
    /// control socket (as one `Files` message).
    #[error("a module binding's files did not come before it")]
    MissingFiles,
    /// More blocking requests parked on one socket than one channel may have.
    #[error("too many blocking requests on socket {0}")]
    TooManyParked(u32),
}
