//! Where a TCP flow stands: [`Phase`], and the only moves between phases.
//!
//! A flow the sandbox opens starts as a pending flow (`pending.rs`: a host connect under
//! way, its SYN kept, no stack socket); a published one starts `Calling` the sandbox.
//!
//! | phase         | move (what happened)                                               | next          |
//! |---------------|--------------------------------------------------------------------|---------------|
//! | (pending)     | the host connect succeeded: the SYN is replayed into a stack socket | `Open`        |
//! | `Calling`     | [`Move::Answered`]: the sandbox completed the handshake            | `Open`        |
//! | `Open`        | [`Move::SandboxFin`]: the sandbox's FIN, every byte before it sent: `shutdown(SHUT_WR)` on the host | `SandboxDone` |
//! | `Open`        | [`Move::HostFin`]: the host's end of stream: the stack closes (a FIN to the sandbox) | `HostDone`    |
//! | `HostDone`    | [`Move::SandboxFin`]                                               | `BothDone`    |
//! | `SandboxDone` | [`Move::HostFin`]                                                  | `BothDone`    |
//!
//! Any other move is refused (the flow stays where it is). Resets and failures are not
//! moves: they close the stack socket and the flow ends at the next reap, from any
//! phase. A flow that ends in `BothDone` closes its host socket normally; in any other
//! phase the host connection is reset (it was cut, not finished), and a `Calling` one
//! is asked again or reset (`published.rs`).
//!
//! The host socket's readiness (readable, writable: edge-triggered epoll's news) is not
//! a phase: it comes and goes in any of them.

use super::published::Unanswered;

/// Where a TCP flow stands (see the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// A published connection the sandbox has not answered yet.
    Calling(Unanswered),
    /// Both directions carry bytes.
    Open,
    /// The sandbox has finished sending; the host's write side is shut.
    SandboxDone,
    /// The host has finished sending; the stack has sent (or will send) the FIN.
    HostDone,
    /// Both have finished.
    BothDone,
}

/// What moves a flow from one phase to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Move {
    Answered,
    SandboxFin,
    HostFin,
}

impl Phase {
    /// The phase after `m`, or `None` when `m` is not a move from here.
    pub(crate) fn after(self, m: Move) -> Option<Phase> {
        match (self, m) {
            (Phase::Calling(_), Move::Answered) => Some(Phase::Open),
            (Phase::Open, Move::SandboxFin) => Some(Phase::SandboxDone),
            (Phase::Open, Move::HostFin) => Some(Phase::HostDone),
            (Phase::HostDone, Move::SandboxFin) | (Phase::SandboxDone, Move::HostFin) => {
                Some(Phase::BothDone)
            }
            _ => None,
        }
    }

    /// Makes move `m` if it is one from here; whether it was.
    pub(crate) fn make(&mut self, m: Move) -> bool {
        match self.after(m) {
            Some(next) => {
                *self = next;
                true
            }
            None => false,
        }
    }

    /// Whether the sandbox's end of stream has reached the host.
    pub(crate) fn sandbox_done(self) -> bool {
        matches!(self, Phase::SandboxDone | Phase::BothDone)
    }

    /// Whether the host's end of stream has reached the stack.
    pub(crate) fn host_done(self) -> bool {
        matches!(self, Phase::HostDone | Phase::BothDone)
    }

    /// The published connection still waiting for the sandbox's answer, if this is one.
    pub(crate) fn calling(self) -> Option<Unanswered> {
        match self {
            Phase::Calling(u) => Some(u),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unanswered() -> Unanswered {
        Unanswered {
            client: "192.0.2.1:5000".parse().unwrap(),
            port: 80,
            since: std::time::Instant::now(),
        }
    }

    /// The module's table, row by row; every other (phase, move) is refused.
    #[test]
    fn only_the_tables_moves_are_made() {
        use Move::*;
        use Phase::*;
        let calling = Calling(unanswered());
        let table = [
            (calling, Answered, Open),
            (Open, SandboxFin, SandboxDone),
            (Open, HostFin, HostDone),
            (HostDone, SandboxFin, BothDone),
            (SandboxDone, HostFin, BothDone),
        ];
        for from in [calling, Open, SandboxDone, HostDone, BothDone] {
            for m in [Answered, SandboxFin, HostFin] {
                let want = table
                    .iter()
                    .find(|(f, mv, _)| *f == from && *mv == m)
                    .map(|(_, _, to)| *to);
                assert_eq!(from.after(m), want, "{from:?} on {m:?}");
                let mut p = from;
                assert_eq!(p.make(m), want.is_some());
                assert_eq!(
                    p,
                    want.unwrap_or(from),
                    "{from:?} on {m:?}: refused moves stay"
                );
            }
        }
    }

    #[test]
    fn each_direction_is_done_once_its_end_has_passed() {
        assert!(!Phase::Open.sandbox_done() && !Phase::Open.host_done());
        assert!(Phase::SandboxDone.sandbox_done() && !Phase::SandboxDone.host_done());
        assert!(!Phase::HostDone.sandbox_done() && Phase::HostDone.host_done());
        assert!(Phase::BothDone.sandbox_done() && Phase::BothDone.host_done());
        let c = Phase::Calling(unanswered());
        assert!(!c.sandbox_done() && !c.host_done());
        assert!(c.calling().is_some() && Phase::Open.calling().is_none());
    }
}
