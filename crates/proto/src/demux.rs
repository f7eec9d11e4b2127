//! The client side's completion demux: what to do with each [`Cmp`] taken off a
//! channel's completion ring, for one channel with at most one tagged call in progress
//! (the shim's channels and the native client's). It owns the call's tag, the control
//! bytes that come with its answer, the completions held while the side waits for room
//! in the request ring, and the count of returned buffers `Op::WantRoom` needs. It does
//! no I/O: the side takes records off the ring, gives each to [`Demux::take`] and acts on
//! the [`Event`] (frees a buffer, copies data out and gives the server's buffer back,
//! notes an error); buffers, rings and waiting stay the side's.
//!
//! Rules:
//! - A completion is the call's when its tag is the call's ([`Demux::begin`] hands out
//!   non-zero tags in turn). The call's `Data` lend a server buffer, its `Control`
//!   records carry control bytes at an offset, its `Done` is final and ends the call.
//! - `BufReturn` (one of this side's buffers is free again) and `AsyncError` (an error
//!   of an earlier fire-and-forget request, reported on the socket's next call) belong
//!   to no call, whatever their tag.
//! - A `Data`, `Control` or `Done` of no call in progress belongs to one given up on
//!   (cancelled, timed out): a `Data`'s buffer must go back ([`Event::Orphan`]), the rest
//!   is dropped ([`Event::Stale`]). A side that never gives a call up may treat both as
//!   violations.
//! - While the side waits for room in the request ring (the server may wait for room in
//!   the completion ring meanwhile), it takes completions with [`Demux::hold`]: tagged
//!   ones are held, in order, for the call (a `Cancel` is pushed while its call waits),
//!   and come back first from [`Demux::next_held`]; the rest are handled at once.

use std::collections::VecDeque;

use crate::{Cmp, CmpKind, ProtoError, cmsg};

/// What a completion asks of the side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// This side's buffer `buf`, lent with a `Send` (or `BindModule`) on `sock`, is free
    /// again.
    BufReturn {
        /// The socket the send was on.
        sock: u32,
        /// This side's buffer id.
        buf: u32,
        /// Bytes of the record that went out: all of them, or with an error as
        /// many as the host socket took before the connection broke (0 where the
        /// server does not say).
        len: u32,
        /// 0, or the negated errno of the broken connection that dropped the rest.
        result: i32,
    },
    /// An earlier fire-and-forget request on `sock` failed: `result` is the negated
    /// errno, to report on the socket's next call.
    AsyncError {
        /// The socket.
        sock: u32,
        /// `< 0`: a negated errno.
        result: i32,
    },
    /// Data for the call in progress: the server lent its buffer `buf` holding `len`
    /// bytes; copy them out and give it back (`Call::BufReturn`).
    Data {
        /// The socket.
        sock: u32,
        /// The server's buffer id.
        buf: u32,
        /// Bytes of data in it.
        len: u32,
    },
    /// Control bytes for the call in progress arrived ([`Demux::control`]).
    Control,
    /// The final answer of the call in progress, which is over.
    Done(Cmp),
    /// A `Data` of no call in progress (its call was given up on): give the server's
    /// buffer `buf` back.
    Orphan {
        /// The socket.
        sock: u32,
        /// The server's buffer id.
        buf: u32,
    },
    /// A `Done` or `Control` of no call in progress: the answer to a call given up on.
    /// Nothing to do.
    Stale,
}

/// The demux of one channel (see the module docs).
#[derive(Clone, Debug)]
pub struct Demux {
    /// The last tag handed out.
    last_tag: u32,
    /// The tag of the call in progress.
    call: Option<u32>,
    /// Completions taken while waiting for ring space, not handled yet.
    held: VecDeque<Cmp>,
    /// `BufReturn` completions taken so far (wrapping).
    returns: u32,
    /// Control bytes of the current (or last) call's answer.
    control: [u8; cmsg::MAX_CONTROL],
    control_len: usize,
}

impl Default for Demux {
    fn default() -> Demux {
        Demux::new()
    }
}

impl Demux {
    /// A channel's demux: no call in progress, nothing held.
    pub fn new() -> Demux {
        Demux {
            last_tag: 0,
            call: None,
            held: VecDeque::new(),
            returns: 0,
            control: [0; cmsg::MAX_CONTROL],
            control_len: 0,
        }
    }

    /// Starts a call: its tag (non-zero, the next in turn). Control bytes of the call
    /// before are forgotten.
    pub fn begin(&mut self) -> u32 {
        self.last_tag = self.last_tag.wrapping_add(1).max(1);
        self.call = Some(self.last_tag);
        self.control_len = 0;
        self.last_tag
    }

    /// The side stopped waiting for the call in progress without its `Done` (it failed
    /// or gave up): what still comes for it is [`Event::Orphan`] or [`Event::Stale`].
    pub fn abandon(&mut self) {
        self.call = None;
    }

    /// The tag of the call in progress.
    pub fn in_progress(&self) -> Option<u32> {
        self.call
    }

    /// What to do with completion `c` (see the module docs); `Err` for a completion of
    /// an unknown kind, or control bytes out of place.
    pub fn take(&mut self, c: Cmp) -> Result<Event, ProtoError> {
        let kind = c.kind()?;
        let mine = self.call.is_some_and(|t| t == c.tag);
        Ok(match kind {
            CmpKind::BufReturn => {
                self.returns = self.returns.wrapping_add(1);
                Event::BufReturn {
                    sock: c.sock,
                    buf: c.buf,
                    len: c.len,
                    result: c.result.min(0),
                }
            }
            CmpKind::AsyncError => Event::AsyncError {
                sock: c.sock,
                result: c.result,
            },
            CmpKind::Data if mine => Event::Data {
                sock: c.sock,
                buf: c.buf,
                len: c.len,
            },
            CmpKind::Data => Event::Orphan {
                sock: c.sock,
                buf: c.buf,
            },
            CmpKind::Control if mine => {
                self.add_control(c.a, c.bytes())?;
                Event::Control
            }
            CmpKind::Done if mine => {
                self.call = None;
                Event::Done(c)
            }
            CmpKind::Control | CmpKind::Done => Event::Stale,
        })
    }

    /// Completion `c`, taken while waiting for room in the request ring: a tagged one
    /// is held (`None`), to be taken later in its turn; any other is taken now.
    pub fn hold(&mut self, c: Cmp) -> Result<Option<Event>, ProtoError> {
        if c.tag != 0 {
            self.held.push_back(c);
            return Ok(None);
        }
        self.take(c).map(Some)
    }

    /// The oldest completion held by [`Demux::hold`]: it comes before any still in the
    /// ring.
    pub fn next_held(&mut self) -> Option<Cmp> {
        self.held.pop_front()
    }

    /// `BufReturn` completions taken so far (wrapping): what `Call::WantRoom` carries.
    pub fn returns_seen(&self) -> u32 {
        self.returns
    }

    /// The control bytes that came with the current (or last) call's answer.
    pub fn control(&self) -> &[u8] {
        &self.control[..self.control_len]
    }

    fn add_control(&mut self, offset: u32, bytes: &[u8]) -> Result<(), ProtoError> {
        let bad = ProtoError::ControlOffset {
            offset,
            have: self.control_len,
        };
        let at = usize::try_from(offset).map_err(|_| bad.clone())?;
        let end = at.checked_add(bytes.len()).ok_or(bad.clone())?;
        let dst = self.control.get_mut(at..end).ok_or(bad)?;
        dst.copy_from_slice(bytes);
        self.control_len = self.control_len.max(end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DecodeError, NO_BUF};

    fn cmp(kind: CmpKind, tag: u32) -> Cmp {
        Cmp {
            buf: 4,
            len: 100,
            ..Cmp::new(kind, 9, tag, 0)
        }
    }

    #[test]
    fn a_calls_completions_are_its_own() {
        let mut d = Demux::new();
        let t = d.begin();
        assert_eq!(d.in_progress(), Some(t));
        assert_eq!(
            d.take(cmp(CmpKind::Data, t)),
            Ok(Event::Data {
                sock: 9,
                buf: 4,
                len: 100
            })
        );
        let mut ctl = Cmp::new(CmpKind::Control, 9, t, 0).with_bytes(&[1, 2, 3]);
        assert_eq!(d.take(ctl), Ok(Event::Control));
        ctl.a = 3;
        assert_eq!(d.take(ctl), Ok(Event::Control));
        assert_eq!(d.control(), &[1, 2, 3, 1, 2, 3]);
        let done = Cmp::new(CmpKind::Done, 9, t, 42);
        assert_eq!(d.take(done), Ok(Event::Done(done)));
        assert_eq!(d.in_progress(), None);
        // The control bytes stay readable after the call, until the next one begins.
        assert_eq!(d.control().len(), 6);
        d.begin();
        assert!(d.control().is_empty());
    }

    #[test]
    fn tags_are_non_zero_and_in_turn() {
        let mut d = Demux::new();
        assert_eq!(d.begin(), 1);
        assert_eq!(d.begin(), 2);
        d.last_tag = u32::MAX;
        assert_eq!(d.begin(), 1, "0 is never a call's tag");
    }

    #[test]
    fn returns_and_errors_belong_to_no_call() {
        let mut d = Demux::new();
        let t = d.begin();
        for tag in [0, t, t + 1] {
            assert_eq!(
                d.take(Cmp {
                    buf: 3,
                    ..Cmp::new(CmpKind::BufReturn, 5, tag, 0)
                }),
                Ok(Event::BufReturn {
                    sock: 5,
                    buf: 3,
                    len: 0,
                    result: 0
                })
            );
            assert_eq!(
                d.take(Cmp::new(CmpKind::AsyncError, 5, tag, -libc::EPIPE)),
                Ok(Event::AsyncError {
                    sock: 5,
                    result: -libc::EPIPE
                })
            );
        }
        assert_eq!(d.returns_seen(), 3);
        assert_eq!(d.in_progress(), Some(t), "the call still waits");
    }

    #[test]
    fn completions_of_calls_given_up_on() {
        let mut d = Demux::new();
        // Before any call, and of another call.
        assert_eq!(
            d.take(cmp(CmpKind::Data, 0)),
            Ok(Event::Orphan { sock: 9, buf: 4 })
        );
        let old = d.begin();
        d.abandon();
        let t = d.begin();
        assert_eq!(
            d.take(cmp(CmpKind::Data, old)),
            Ok(Event::Orphan { sock: 9, buf: 4 })
        );
        assert_eq!(d.take(cmp(CmpKind::Control, old)), Ok(Event::Stale));
        assert_eq!(d.take(cmp(CmpKind::Done, old)), Ok(Event::Stale));
        assert_eq!(d.in_progress(), Some(t));
        assert!(d.control().is_empty(), "another call's control bytes");
        // After the call's Done, a second Done with its tag is stale.
        let done = cmp(CmpKind::Done, t);
        assert_eq!(d.take(done), Ok(Event::Done(done)));
        assert_eq!(d.take(done), Ok(Event::Stale));
        d.begin();
        d.abandon();
        assert_eq!(d.take(cmp(CmpKind::Done, t + 1)), Ok(Event::Stale));
    }

    #[test]
    fn control_bytes_out_of_place_are_refused() {
        let mut d = Demux::new();
        let t = d.begin();
        let mut c = Cmp::new(CmpKind::Control, 9, t, 0).with_bytes(&[0; 32]);
        c.a = 224;
        assert_eq!(d.take(c), Ok(Event::Control));
        assert_eq!(d.control().len(), 256);
        c.a = 225;
        assert_eq!(
            d.take(c),
            Err(ProtoError::ControlOffset {
                offset: 225,
                have: 256
            })
        );
        c.a = u32::MAX;
        assert!(d.take(c).is_err());
        // `addr_len` beyond the field is cut to it.
        c.a = 0;
        c.addr_len = 1000;
        assert_eq!(d.take(c), Ok(Event::Control));
    }

    #[test]
    fn unknown_kinds_are_refused() {
        let mut d = Demux::new();
        let t = d.begin();
        let c = Cmp {
            kind: 77,
            ..Cmp::new(CmpKind::Done, 1, t, 0)
        };
        assert_eq!(
            d.take(c),
            Err(ProtoError::Decode(DecodeError::UnknownKind(77)))
        );
        assert_eq!(
            d.hold(Cmp { tag: 0, ..c }).map(|_| ()),
            d.take(c).map(|_| ())
        );
        assert_eq!(d.in_progress(), Some(t));
    }

    #[test]
    fn completions_held_while_waiting_for_room_come_first() {
        let mut d = Demux::new();
        let t = d.begin();
        // Untagged ones are handled at once; tagged ones wait, in order.
        assert_eq!(
            d.hold(Cmp {
                buf: 1,
                ..Cmp::new(CmpKind::BufReturn, 2, 0, 0)
            }),
            Ok(Some(Event::BufReturn {
                sock: 2,
                buf: 1,
                len: 0,
                result: 0
            }))
        );
        let data = cmp(CmpKind::Data, t);
        let stale = cmp(CmpKind::Done, t + 7);
        let done = cmp(CmpKind::Done, t);
        for c in [data, stale, done] {
            assert_eq!(d.hold(c), Ok(None));
        }
        assert_eq!(d.in_progress(), Some(t), "held, not taken");
        let mut events = Vec::new();
        while let Some(c) = d.next_held() {
            events.push(d.take(c).unwrap());
        }
        assert_eq!(
            events,
            [
                Event::Data {
                    sock: 9,
                    buf: 4,
                    len: 100
                },
                Event::Stale,
                Event::Done(done)
            ]
        );
        assert_eq!(d.next_held(), None);
        // Untagged Data of no call: its buffer goes back.
        assert_eq!(
            d.hold(Cmp {
                buf: NO_BUF - 1,
                ..Cmp::new(CmpKind::Data, 2, 0, 0)
            }),
            Ok(Some(Event::Orphan {
                sock: 2,
                buf: NO_BUF - 1
            }))
        );
    }
}
