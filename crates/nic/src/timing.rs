//! Optional per-stage timing of a NIC server (`ferry bench E5`, S2 figs. 2–3): where a
//! packet's time goes between the TAP and the host sockets.
//!
//! Off unless [`NicConfig::timing`](crate::NicConfig::timing) is set (the hidden
//! `ferry run --nic-timing`): then each stage is bracketed by two reads of the monotonic
//! clock (vDSO, no system call) and adds its nanoseconds, its calls and its hits (calls
//! that moved a frame, a datagram or bytes) to a [`StageTotal`]. Off, every bracket is one
//! branch on a bool. The outer stages ([`Stage::Ingress`], [`Stage::Pump`],
//! [`Stage::Egress`]) count their own work only: the system calls made inside them
//! (TAP writes, host sends and receives) are subtracted and counted in their own stages.
//! A pump or an egress that moved nothing (a turn of the loop while it spins) counts as
//! [`Stage::IdlePoll`], with the empty TAP reads the server's looking for work.
//!
//! It owns the totals and the bracketing; it must not decide anything the server does.

use std::time::Instant;

/// A stage of the frame path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `read` on the TAP queue that returned a frame.
    TapRead,
    /// `read` on the TAP queue that found none (EAGAIN: the end of a batch, or a spin).
    TapReadEmpty,
    /// Classifying a frame and handing it to the stack (smoltcp's ingress) or to its
    /// datagram flow, without the system calls made meanwhile.
    Ingress,
    /// A send on a host socket (TCP bytes, a UDP datagram, an echo request).
    HostSend,
    /// A receive on a host socket (a hit when it returned bytes or a datagram).
    HostRecv,
    /// Moving bytes between the stack's socket buffers and the host sockets, without the
    /// host sends and receives.
    Pump,
    /// smoltcp's egress (making segments from its sockets), without the TAP writes.
    Egress,
    /// `write` of a frame to the TAP queue.
    TapWrite,
    /// From epoll returning after a sleep to the start of the first stage that handled
    /// a frame or host data (the server's pick-up after a wake-up).
    Wake,
    /// A pump or an egress that moved nothing (a turn with nothing to do).
    IdlePoll,
}

impl Stage {
    /// Every stage, in the order of [`Timing::totals`].
    pub const ALL: [Stage; 10] = [
        Stage::TapRead,
        Stage::TapReadEmpty,
        Stage::Ingress,
        Stage::HostSend,
        Stage::HostRecv,
        Stage::Pump,
        Stage::Egress,
        Stage::TapWrite,
        Stage::Wake,
        Stage::IdlePoll,
    ];

    /// Its name in `--stats-json` (`"timing":{"tap_read":{…},…}`).
    pub fn name(self) -> &'static str {
        match self {
            Stage::TapRead => "tap_read",
            Stage::TapReadEmpty => "tap_read_empty",
            Stage::Ingress => "ingress",
            Stage::HostSend => "host_send",
            Stage::HostRecv => "host_recv",
            Stage::Pump => "pump",
            Stage::Egress => "egress",
            Stage::TapWrite => "tap_write",
            Stage::Wake => "wake",
            Stage::IdlePoll => "idle_poll",
        }
    }

    /// Whether it is a system call counted inside the outer stages.
    fn nested(self) -> bool {
        matches!(self, Stage::HostSend | Stage::HostRecv | Stage::TapWrite)
    }
}

ferry_counters::counters! {
    /// One stage's totals (`"timing":{"tap_read":{"calls":…,"hits":…,"ns":…},…}`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct StageTotal {}
    counters {
        /// Times the stage ran.
        calls: "calls",
        /// Times it moved something (a frame, a datagram, bytes).
        hits: "hits",
        /// Nanoseconds spent in it.
        ns: "ns",
    }
}

/// Where an outer stage started: the clock and the nested stages' nanoseconds then.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    at: Instant,
    nested: u64,
}

/// A NIC server's per-stage totals (all zero when off).
#[derive(Clone, Debug, Default)]
pub struct Timing {
    on: bool,
    totals: [StageTotal; Stage::ALL.len()],
    /// Nanoseconds of the nested stages so far.
    nested: u64,
    /// When epoll returned after a sleep, until the first frame or host data is handled.
    woke: Option<Instant>,
}

impl Timing {
    /// Timing on or off.
    pub fn new(on: bool) -> Timing {
        Timing {
            on,
            ..Timing::default()
        }
    }

    /// The clock now, when on.
    #[inline]
    pub fn start(&self) -> Option<Instant> {
        self.on.then(Instant::now)
    }

    /// The start of an outer stage, when on.
    #[inline]
    pub fn mark(&self) -> Option<Mark> {
        self.on.then(|| Mark {
            at: Instant::now(),
            nested: self.nested,
        })
    }

    /// Ends stage `s` begun at `t0` (from [`Timing::start`]); `hit`: it moved something.
    #[inline]
    pub fn end(&mut self, s: Stage, t0: Option<Instant>, hit: bool) {
        if let Some(t0) = t0 {
            let ns = t0.elapsed().as_nanos() as u64;
            if s.nested() {
                self.nested += ns;
            }
            if hit {
                self.picked_up(t0);
            }
            self.add(s, ns, hit);
        }
    }

    /// Ends outer stage `s` begun at `m`, less the nested stages run meanwhile; a pump
    /// or an egress that moved nothing counts as [`Stage::IdlePoll`].
    #[inline]
    pub fn end_outer(&mut self, s: Stage, m: Option<Mark>, hit: bool) {
        if let Some(m) = m {
            let ns = (m.at.elapsed().as_nanos() as u64).saturating_sub(self.nested - m.nested);
            let s = match s {
                Stage::Pump | Stage::Egress if !hit => Stage::IdlePoll,
                s => s,
            };
            self.add(s, ns, hit);
        }
    }

    /// Epoll returned with events after a sleep.
    #[inline]
    pub fn woke(&mut self) {
        if self.on {
            self.woke = Some(Instant::now());
        }
    }

    /// The first frame or host data since the wake-up is handled from `t0` on.
    fn picked_up(&mut self, t0: Instant) {
        if let Some(w) = self.woke.take() {
            let ns = t0.saturating_duration_since(w).as_nanos() as u64;
            self.add(Stage::Wake, ns, true);
        }
    }

    fn add(&mut self, s: Stage, ns: u64, hit: bool) {
        let t = &mut self.totals[s as usize];
        t.calls += 1;
        t.hits += u64::from(hit);
        t.ns += ns;
    }

    /// The totals, in the order of [`Stage::ALL`]; `None` when off.
    pub fn totals(&self) -> Option<Vec<(Stage, StageTotal)>> {
        self.on.then(|| {
            Stage::ALL
                .iter()
                .map(|s| (*s, self.totals[*s as usize]))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_counts_nothing() {
        let mut t = Timing::new(false);
        let s = t.start();
        assert!(s.is_none());
        t.end(Stage::TapRead, s, true);
        t.end_outer(Stage::Ingress, t.mark(), true);
        assert!(t.totals().is_none());
    }

    #[test]
    fn outer_stages_leave_out_nested_ones() {
        let mut t = Timing::new(true);
        let m = t.mark();
        let s = t.start();
        std::thread::sleep(std::time::Duration::from_millis(20));
        t.end(Stage::HostSend, s, true);
        t.end_outer(Stage::Ingress, m, true);
        let totals = t.totals().unwrap();
        let get = |st: Stage| totals.iter().find(|(x, _)| *x == st).unwrap().1;
        assert_eq!(get(Stage::HostSend).calls, 1);
        assert!(get(Stage::HostSend).ns >= 20_000_000);
        // The ingress stage itself did (almost) nothing.
        assert!(
            get(Stage::Ingress).ns < 5_000_000,
            "{:?}",
            get(Stage::Ingress)
        );
        assert_eq!(get(Stage::Ingress).hits, 1);
    }

    #[test]
    fn wake_ends_at_the_first_hit() {
        let mut t = Timing::new(true);
        t.woke();
        let s = t.start();
        t.end(Stage::TapReadEmpty, s, false);
        let s = t.start();
        t.end(Stage::TapRead, s, true);
        let s = t.start();
        t.end(Stage::TapRead, s, true);
        let totals = t.totals().unwrap();
        assert_eq!(totals[Stage::Wake as usize].1.calls, 1);
        assert_eq!(totals[Stage::TapRead as usize].1.hits, 2);
    }

    #[test]
    fn idle_turns_are_polling() {
        let mut t = Timing::new(true);
        t.end_outer(Stage::Pump, t.mark(), false);
        t.end_outer(Stage::Egress, t.mark(), false);
        t.end_outer(Stage::Egress, t.mark(), true);
        let totals = t.totals().unwrap();
        assert_eq!(totals[Stage::IdlePoll as usize].1.calls, 2);
        assert_eq!(totals[Stage::Egress as usize].1.calls, 1);
        assert_eq!(totals[Stage::Pump as usize].1.calls, 0);
    }
}
