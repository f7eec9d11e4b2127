//! A socket's send side ([`SendSide`]): what waits on the way out — the program's own
//! bytes in the pair, the shim's filler behind them, a reset met reading the pair, a
//! `shutdown(SHUT_WR)` waiting for the sends. Its flags move only by [`SendSide::next`]
//! (the table beside it; the unit tests check every move of every state against it).
//! Must not: make system calls (`tx.rs` does; this says what waits).

/// What waits on a socket's way out. The flags combine freely: each event sets or
/// clears one of them (a renewed pair two), whatever the others are, and a clearing
/// event answers whether the flag was set (what waited is due now):
///
/// | event           | flag                            | after | answers |
/// |-----------------|---------------------------------|-------|---------|
/// | `PairWaits`     | `pair_in_wait`                  | set   | `false` |
/// | `PairGoes`      | `pair_in_wait`                  | clear | was set |
/// | `FillerBehind`  | `filler_due`                    | set   | `false` |
/// | `FillerReached` | `filler_due`                    | clear | was set |
/// | `PairReset`     | `pair_reset`                    | set   | `false` |
/// | `ShutWrWaits`   | `shut_wr_pending`               | set   | `false` |
/// | `ShutWrGoes`    | `shut_wr_pending`               | clear | was set |
/// | `Renewed`       | `filler_due`, `pair_reset`      | clear | `false` |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SendSide {
    /// `rx_pair`: bytes the program wrote straight into the pair wait for room on the
    /// host socket (or for the sends queued before them); see `Tx::pair_input`.
    pair_in_wait: bool,
    /// `rx_pair`: the filler is to be drained once the program's bytes before its
    /// marker are out.
    filler_due: bool,
    /// `rx_pair`: a read of our end found it reset (the program closed its end with
    /// bytes unread), an error the kernel reports once.
    pair_reset: bool,
    /// A `SHUT_WR` waits for the send queue to empty.
    shut_wr_pending: bool,
}

/// What moves a [`SendSide`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendEvent {
    /// The program's bytes in the pair wait (queued sends, records in a ring, a full
    /// host socket).
    PairWaits,
    /// They go now (sent, dropped, or none are left).
    PairGoes,
    /// The filler stands behind the program's bytes: drained once they are out.
    FillerBehind,
    /// The pair input reached the filler's marker.
    FillerReached,
    /// A read of our end of the pair found it reset.
    PairReset,
    /// `shutdown(SHUT_WR)` waits for what the program sent before it.
    ShutWrWaits,
    /// The waiting `SHUT_WR` happens (or is not wanted any more).
    ShutWrGoes,
    /// The pair was renewed: its filler and reset were the old pair's.
    Renewed,
}

impl SendSide {
    /// The move `ev` makes from here, and what it answers (see the table).
    pub(crate) fn next(self, ev: SendEvent) -> (SendSide, bool) {
        use SendEvent::*;
        let mut to = self;
        let answer = match ev {
            PairWaits => {
                to.pair_in_wait = true;
                false
            }
            PairGoes => {
                to.pair_in_wait = false;
                self.pair_in_wait
            }
            FillerBehind => {
                to.filler_due = true;
                false
            }
            FillerReached => {
                to.filler_due = false;
                self.filler_due
            }
            PairReset => {
                to.pair_reset = true;
                false
            }
            ShutWrWaits => {
                to.shut_wr_pending = true;
                false
            }
            ShutWrGoes => {
                to.shut_wr_pending = false;
                self.shut_wr_pending
            }
            Renewed => {
                to.filler_due = false;
                to.pair_reset = false;
                false
            }
        };
        (to, answer)
    }

    /// Makes move `ev`; its answer (whether what it clears was set).
    pub(crate) fn moves(&mut self, ev: SendEvent) -> bool {
        let (to, answer) = self.next(ev);
        *self = to;
        answer
    }

    /// The program's bytes in the pair wait.
    pub(crate) fn pair_waits(&self) -> bool {
        self.pair_in_wait
    }

    /// A read of our end of the pair found it reset.
    pub(crate) fn pair_reset(&self) -> bool {
        self.pair_reset
    }

    /// A `SHUT_WR` waits for the send queue to empty.
    pub(crate) fn shut_wr_pending(&self) -> bool {
        self.shut_wr_pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENTS: [SendEvent; 8] = [
        SendEvent::PairWaits,
        SendEvent::PairGoes,
        SendEvent::FillerBehind,
        SendEvent::FillerReached,
        SendEvent::PairReset,
        SendEvent::ShutWrWaits,
        SendEvent::ShutWrGoes,
        SendEvent::Renewed,
    ];

    /// The flags as bits: pair_in_wait, filler_due, pair_reset, shut_wr_pending.
    const WAIT: u8 = 1;
    const FILLER: u8 = 2;
    const RESET: u8 = 4;
    const SHUT: u8 = 8;

    fn side(bits: u8) -> SendSide {
        SendSide {
            pair_in_wait: bits & WAIT != 0,
            filler_due: bits & FILLER != 0,
            pair_reset: bits & RESET != 0,
            shut_wr_pending: bits & SHUT != 0,
        }
    }

    /// The table of [`SendSide`]'s doc, row by row: the event, the flags it sets, the
    /// flags it clears, and the flag whose old value it answers (0: always `false`).
    const MOVES: &[(SendEvent, u8, u8, u8)] = &[
        (SendEvent::PairWaits, WAIT, 0, 0),
        (SendEvent::PairGoes, 0, WAIT, WAIT),
        (SendEvent::FillerBehind, FILLER, 0, 0),
        (SendEvent::FillerReached, 0, FILLER, FILLER),
        (SendEvent::PairReset, RESET, 0, 0),
        (SendEvent::ShutWrWaits, SHUT, 0, 0),
        (SendEvent::ShutWrGoes, 0, SHUT, SHUT),
        (SendEvent::Renewed, 0, FILLER | RESET, 0),
    ];

    #[test]
    fn the_send_side_moves_exactly_as_its_table_says_from_every_state() {
        for bits in 0..16u8 {
            for ev in EVENTS {
                let &(_, set, clear, answers) = MOVES
                    .iter()
                    .find(|r| r.0 == ev)
                    .expect("every event has its row");
                let want = (side((bits | set) & !clear), bits & answers != 0);
                assert_eq!(side(bits).next(ev), want, "{bits:04b} on {ev:?}");
            }
        }
    }

    #[test]
    fn a_clearing_move_answers_once_what_waited() {
        let mut s = SendSide::default();
        s.moves(SendEvent::ShutWrWaits);
        assert!(s.shut_wr_pending());
        assert!(s.moves(SendEvent::ShutWrGoes));
        assert!(!s.moves(SendEvent::ShutWrGoes), "the SHUT_WR happens once");
        s.moves(SendEvent::PairReset);
        s.moves(SendEvent::FillerBehind);
        s.moves(SendEvent::PairWaits);
        s.moves(SendEvent::Renewed);
        assert!(!s.pair_reset() && !s.moves(SendEvent::FillerReached));
        assert!(
            s.pair_waits(),
            "a renewed pair keeps the program's bytes waiting"
        );
    }
}
