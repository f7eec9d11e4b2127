//! A socket's receive side ([`RecvSide`]): which way its received bytes go
//! ([`RxPath`]), how far the host stream has ended ([`HostEnd`]), its urgent byte
//! ([`Urgent`]), whether the host socket may hold input, the bytes a pair did not take,
//! and the wait of its last receive. Each state moves only by its `next` (the table
//! beside it; the unit tests check every move against it). Must not: make system calls
//! (the pump in `rx.rs` does; this says what it found).

/// Bytes a bulk stream's program reads out of a full pair before its pair is widened
/// (`RecvSide::widen_due`): four default pairs (`wmem_default`, 208 KiB), a few
/// hundred microseconds of a bulk reader's time.
pub(crate) const WIDEN_AFTER: usize = 1 << 20;

/// Which way a socket's received bytes go. Legal moves:
///
/// | state  | event        | next   |
/// |--------|--------------|--------|
/// | `Ring` | `ToPair` (a stream of a pair-path channel, when made) | `Pair` |
/// | `Pair` | `FullRead` (a read filled the scratch buffer, or a splice moved at least its minimum) | `Bulk` |
/// | `Pair` | `ShortRead`  | `Pair` |
/// | `Bulk` | `FullRead`   | `Bulk` |
/// | `Bulk` | `ShortRead`  | `Pair` |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum RxPath {
    /// Receives are the shim's requests, answered into its channel's buffers.
    #[default]
    Ring,
    /// The server moves the bytes into the readiness pair, copied.
    Pair,
    /// The same, spliced (host socket → pipe → pair).
    Bulk,
}

/// What moves an [`RxPath`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PathEvent {
    ToPair,
    FullRead,
    ShortRead,
}

impl RxPath {
    /// The move `ev` makes from here; `None`: not a legal move.
    pub(crate) fn next(self, ev: PathEvent) -> Option<RxPath> {
        use PathEvent::*;
        use RxPath::*;
        match (self, ev) {
            (Ring, ToPair) => Some(Pair),
            (Pair | Bulk, FullRead) => Some(Bulk),
            (Pair | Bulk, ShortRead) => Some(Pair),
            _ => None,
        }
    }
}

/// How far the host stream has ended (a connected stream's hang-up, reset or error:
/// no arrival edge follows it). Legal moves:
///
/// | state    | event                                   | next     |
/// |----------|-----------------------------------------|----------|
/// | `Open`   | `Ended` (`EPOLLRDHUP`/`ERR`/`HUP`)       | `Ended`  |
/// | `Open`   | `HungUp` (`EPOLLHUP` on the pair path)   | `HungUp` |
/// | `Ended`  | `Ended`                                 | `Ended`  |
/// | `Ended`  | `HungUp`                                | `HungUp` |
/// | `HungUp` | `Ended`, `HungUp`                       | `HungUp` |
/// | any      | `Renewed` (a new pair after a failed connect) | `Open` |
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum HostEnd {
    #[default]
    Open,
    /// The host socket reported its end: a pump reads on until the read says 0,
    /// `EAGAIN` or the error.
    Ended,
    /// Both directions shut, or closed by a reset: the kernel's `POLLHUP`, due on the
    /// program's end of the pair once the bytes before it are through.
    HungUp,
}

/// What moves a [`HostEnd`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EndEvent {
    Ended,
    HungUp,
    Renewed,
}

impl HostEnd {
    /// The move `ev` makes from here (an ending never goes back but by `Renewed`).
    pub(crate) fn next(self, ev: EndEvent) -> HostEnd {
        match ev {
            EndEvent::Ended => self.max(HostEnd::Ended),
            EndEvent::HungUp => HostEnd::HungUp,
            EndEvent::Renewed => HostEnd::Open,
        }
    }
}

/// TCP urgent data on its way into the pair (the pair path; see `Sock::urgent_first`).
/// Legal moves:
///
/// | state        | event                                         | next         |
/// |--------------|-----------------------------------------------|--------------|
/// | `Quiet`      | `Edge` (`EPOLLPRI`)                           | `Due`        |
/// | `Due`        | `Edge`                                        | `Due`        |
/// | `Due`        | `Through` (the byte at the mark went into the pair, or was not there) | `Quiet` |
/// | `Due`        | `Kept(b)` (taken, but the pair had no room)   | `Held(b)`    |
/// | `Held(b)`    | `Edge`                                        | `HeldDue(b)` |
/// | `Held(b)`    | `Through` (the held byte went into the pair)  | `Quiet`      |
/// | `HeldDue(b)` | `Edge`                                        | `HeldDue(b)` |
/// | `HeldDue(b)` | `Through`                                     | `Due`        |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Urgent {
    #[default]
    Quiet,
    /// The host socket reported urgent data not moved into the pair yet.
    Due,
    /// An urgent byte taken from the host socket that the pair did not take yet.
    Held(u8),
    /// `Held`, and more urgent data reported since.
    HeldDue(u8),
}

/// What moves an [`Urgent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UrgentEvent {
    Edge,
    Through,
    Kept(u8),
}

impl Urgent {
    /// The move `ev` makes from here; `None`: not a legal move.
    pub(crate) fn next(self, ev: UrgentEvent) -> Option<Urgent> {
        use Urgent::*;
        use UrgentEvent::*;
        match (self, ev) {
            (Quiet | Due, Edge) => Some(Due),
            (Held(b) | HeldDue(b), Edge) => Some(HeldDue(b)),
            (Due | Held(_), Through) => Some(Quiet),
            (HeldDue(_), Through) => Some(Due),
            (Due, Kept(b)) => Some(Held(b)),
            _ => None,
        }
    }
}

/// A socket's receive side.
#[derive(Debug, Default)]
pub(crate) struct RecvSide {
    path: RxPath,
    end: HostEnd,
    urgent: Urgent,
    /// The host socket may have input (a stream that is not listening): cleared when a
    /// receive finds its queue empty, set by every input edge of the (edge-triggered)
    /// host socket. While clear, a token check needs no `ppoll`: any arrival after the
    /// queue emptied brings a new edge.
    maybe: bool,
    /// The pair path: received bytes the pair has not taken yet (at most one read).
    pending: Vec<u8>,
    /// The pair path in bulk mode: bytes of this stream the pair has not taken yet that
    /// wait in the server's pipe (never beside `pending`: see `rx.rs`'s `RxScratch`).
    piped: usize,
    /// The program bounded the pair's buffer (its `SO_RCVBUF`, or its listener's).
    bounded: bool,
    /// The pair's buffer was widened for bulk (once; see `rx.rs`'s `widen_pair`).
    widened: bool,
    /// Bytes the program read while the pair kept more waiting (up to [`WIDEN_AFTER`]).
    read_full: usize,
    /// `Server::waits` at the last receive: an input event reported by a later wait
    /// than the next one cannot be older than that receive.
    mark: u64,
}

impl RecvSide {
    /// A new socket's: the ring path, open, and maybe input.
    pub(crate) fn new() -> RecvSide {
        RecvSide {
            maybe: true,
            ..RecvSide::default()
        }
    }

    /// Moves the path by `ev` when the table allows it; false (and no move) otherwise.
    pub(crate) fn move_path(&mut self, ev: PathEvent) -> bool {
        self.path.next(ev).map(|p| self.path = p).is_some()
    }

    /// The received bytes go through the pair (copied or spliced).
    pub(crate) fn pair(&self) -> bool {
        self.path != RxPath::Ring
    }

    /// The pair path in bulk mode (spliced).
    pub(crate) fn bulk(&self) -> bool {
        self.path == RxPath::Bulk
    }

    pub(crate) fn end_moves(&mut self, ev: EndEvent) {
        self.end = self.end.next(ev);
    }

    /// The host stream has reported its end (see [`HostEnd::Ended`]).
    pub(crate) fn ending(&self) -> bool {
        self.end != HostEnd::Open
    }

    /// The host socket hung up: `POLLHUP` is due on the program's end of the pair.
    pub(crate) fn hup_due(&self) -> bool {
        self.end == HostEnd::HungUp
    }

    /// Moves the urgent state by `ev` when the table allows it; false otherwise.
    pub(crate) fn urgent_moves(&mut self, ev: UrgentEvent) -> bool {
        self.urgent.next(ev).map(|u| self.urgent = u).is_some()
    }

    /// Urgent data is reported and not read from the host socket yet.
    pub(crate) fn urgent_due(&self) -> bool {
        matches!(self.urgent, Urgent::Due | Urgent::HeldDue(_))
    }

    /// The urgent byte the pair has not taken yet.
    pub(crate) fn urgent_held(&self) -> Option<u8> {
        match self.urgent {
            Urgent::Held(b) | Urgent::HeldDue(b) => Some(b),
            _ => None,
        }
    }

    /// The host socket may have input (see the field).
    pub(crate) fn maybe(&self) -> bool {
        self.maybe
    }

    /// An input edge of the host socket (or a new host socket).
    pub(crate) fn input_edge(&mut self) {
        self.maybe = true;
    }

    /// A receive found the host socket's queue empty.
    pub(crate) fn found_empty(&mut self) {
        self.maybe = false;
    }

    /// Bytes the pair has not taken yet.
    pub(crate) fn pending(&self) -> &[u8] {
        &self.pending
    }

    pub(crate) fn pending_mut(&mut self) -> &mut Vec<u8> {
        &mut self.pending
    }

    /// Bytes of this stream waiting in the server's pipe for room in the pair.
    pub(crate) fn piped(&self) -> usize {
        self.piped
    }

    pub(crate) fn set_piped(&mut self, n: usize) {
        self.piped = n;
    }

    /// The program bounded the pair's buffer (see `ops::bound_pair`).
    pub(crate) fn bound(&mut self) {
        self.bounded = true;
    }

    /// The program read `n` bytes that the full pair had kept waiting.
    pub(crate) fn took_waiting(&mut self, n: usize) {
        self.read_full = self.read_full.saturating_add(n).min(WIDEN_AFTER);
    }

    /// Whether the pair's buffer is to be widened now: a bulk stream whose program
    /// has read [`WIDEN_AFTER`] bytes that the full pair had kept waiting (it keeps
    /// reading, and a larger pair saves it reads), once, and never one the program
    /// bounded. A program that reads once and stops (CPython's
    /// `testWithTimeoutTriggeredSend` reads 88 KiB, then sleeps while its peer sends
    /// 10 MiB with a 10 ms timeout) keeps the default pair, so the bytes ferry holds
    /// for it stay near the kernel's.
    pub(crate) fn widen_due(&mut self) -> bool {
        if self.bounded || self.widened || !self.bulk() || self.read_full < WIDEN_AFTER {
            return false;
        }
        self.widened = true;
        true
    }

    /// Received bytes the pair has not taken yet, copied or in the pipe.
    pub(crate) fn queued(&self) -> bool {
        self.queued_len() > 0
    }

    /// How many received bytes the pair has not taken yet (see [`RecvSide::queued`]).
    pub(crate) fn queued_len(&self) -> usize {
        self.pending.len() + self.piped
    }

    /// The wait count at the last receive.
    pub(crate) fn mark(&self) -> u64 {
        self.mark
    }

    pub(crate) fn set_mark(&mut self, waits: u64) {
        self.mark = waits;
    }

    /// A new pair after a failed connect: the host stream starts over.
    pub(crate) fn renewed(&mut self) {
        self.end_moves(EndEvent::Renewed);
        self.maybe = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATHS: [RxPath; 3] = [RxPath::Ring, RxPath::Pair, RxPath::Bulk];
    const PATH_EVENTS: [PathEvent; 3] =
        [PathEvent::ToPair, PathEvent::FullRead, PathEvent::ShortRead];

    /// The table of [`RxPath`]'s doc, row by row.
    const PATH_MOVES: &[(RxPath, PathEvent, RxPath)] = &[
        (RxPath::Ring, PathEvent::ToPair, RxPath::Pair),
        (RxPath::Pair, PathEvent::FullRead, RxPath::Bulk),
        (RxPath::Pair, PathEvent::ShortRead, RxPath::Pair),
        (RxPath::Bulk, PathEvent::FullRead, RxPath::Bulk),
        (RxPath::Bulk, PathEvent::ShortRead, RxPath::Pair),
    ];

    #[test]
    fn rx_path_moves_exactly_as_its_table_says() {
        for s in PATHS {
            for ev in PATH_EVENTS {
                let row = PATH_MOVES
                    .iter()
                    .find(|(f, e, _)| *f == s && *e == ev)
                    .map(|r| r.2);
                assert_eq!(s.next(ev), row, "{s:?} on {ev:?}");
            }
        }
    }

    #[test]
    fn a_ring_socket_never_turns_bulk_and_a_pair_one_never_back_to_the_ring() {
        let mut r = RecvSide::new();
        assert!(!r.move_path(PathEvent::FullRead));
        assert!(!r.pair() && !r.bulk());
        assert!(r.move_path(PathEvent::ToPair));
        assert!(r.move_path(PathEvent::FullRead));
        assert!(r.bulk());
        assert!(!r.move_path(PathEvent::ToPair));
        assert!(r.move_path(PathEvent::ShortRead));
        assert!(r.pair() && !r.bulk());
    }

    #[test]
    fn host_end_moves_forward_only_until_renewed() {
        use EndEvent as E;
        use HostEnd as H;
        let table: &[(HostEnd, EndEvent, HostEnd)] = &[
            (H::Open, E::Ended, H::Ended),
            (H::Open, E::HungUp, H::HungUp),
            (H::Ended, E::Ended, H::Ended),
            (H::Ended, E::HungUp, H::HungUp),
            (H::HungUp, E::Ended, H::HungUp),
            (H::HungUp, E::HungUp, H::HungUp),
            (H::Open, E::Renewed, H::Open),
            (H::Ended, E::Renewed, H::Open),
            (H::HungUp, E::Renewed, H::Open),
        ];
        for &(from, ev, to) in table {
            assert_eq!(from.next(ev), to, "{from:?} on {ev:?}");
        }
    }

    #[test]
    fn a_hang_up_is_due_only_after_one_and_a_renewed_pair_forgets_it() {
        let mut r = RecvSide::new();
        assert!(!r.ending() && !r.hup_due());
        r.end_moves(EndEvent::Ended);
        assert!(r.ending() && !r.hup_due());
        r.end_moves(EndEvent::HungUp);
        r.end_moves(EndEvent::Ended);
        assert!(
            r.ending() && r.hup_due(),
            "an ending never undoes a hang-up"
        );
        r.found_empty();
        r.renewed();
        assert!(!r.ending() && !r.hup_due() && r.maybe());
    }

    /// The table of [`Urgent`]'s doc, row by row.
    const URGENT_MOVES: &[(Urgent, UrgentEvent, Urgent)] = &[
        (Urgent::Quiet, UrgentEvent::Edge, Urgent::Due),
        (Urgent::Due, UrgentEvent::Edge, Urgent::Due),
        (Urgent::Due, UrgentEvent::Through, Urgent::Quiet),
        (Urgent::Due, UrgentEvent::Kept(7), Urgent::Held(7)),
        (Urgent::Held(7), UrgentEvent::Edge, Urgent::HeldDue(7)),
        (Urgent::Held(7), UrgentEvent::Through, Urgent::Quiet),
        (Urgent::HeldDue(7), UrgentEvent::Edge, Urgent::HeldDue(7)),
        (Urgent::HeldDue(7), UrgentEvent::Through, Urgent::Due),
    ];

    #[test]
    fn urgent_moves_exactly_as_its_table_says() {
        let states = [
            Urgent::Quiet,
            Urgent::Due,
            Urgent::Held(7),
            Urgent::HeldDue(7),
        ];
        let events = [
            UrgentEvent::Edge,
            UrgentEvent::Through,
            UrgentEvent::Kept(7),
        ];
        for s in states {
            for ev in events {
                let row = URGENT_MOVES
                    .iter()
                    .find(|(f, e, _)| *f == s && *e == ev)
                    .map(|r| r.2);
                assert_eq!(s.next(ev), row, "{s:?} on {ev:?}");
            }
        }
    }

    #[test]
    fn a_held_urgent_byte_is_kept_until_it_goes_and_a_new_one_waits_behind_it() {
        let mut r = RecvSide::new();
        assert!(
            !r.urgent_moves(UrgentEvent::Through),
            "nothing to let through"
        );
        assert!(r.urgent_moves(UrgentEvent::Edge));
        assert!(r.urgent_moves(UrgentEvent::Kept(b'!')));
        assert_eq!(r.urgent_held(), Some(b'!'));
        assert!(!r.urgent_due());
        assert!(
            !r.urgent_moves(UrgentEvent::Kept(b'?')),
            "one byte held at most"
        );
        assert!(r.urgent_moves(UrgentEvent::Edge));
        assert_eq!(r.urgent_held(), Some(b'!'));
        assert!(r.urgent_due());
        assert!(r.urgent_moves(UrgentEvent::Through));
        assert_eq!(r.urgent_held(), None);
        assert!(r.urgent_due(), "the later urgent data is still to read");
    }

    #[test]
    fn a_pair_is_widened_once_for_a_program_that_keeps_reading_and_never_for_one_read() {
        let mut r = RecvSide::new();
        assert!(r.move_path(PathEvent::ToPair) && r.move_path(PathEvent::FullRead));
        r.took_waiting(88_192);
        assert!(!r.widen_due(), "one read, then a sleep: the default pair");
        r.took_waiting(WIDEN_AFTER - 88_193);
        assert!(!r.widen_due());
        r.took_waiting(1);
        assert!(r.widen_due(), "a reader");
        r.took_waiting(WIDEN_AFTER);
        assert!(!r.widen_due(), "once");

        let mut bounded = RecvSide::new();
        assert!(bounded.move_path(PathEvent::ToPair) && bounded.move_path(PathEvent::FullRead));
        bounded.bound();
        bounded.took_waiting(usize::MAX);
        assert!(!bounded.widen_due(), "the program chose its buffer");
    }
}
