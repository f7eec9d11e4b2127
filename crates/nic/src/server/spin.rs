//! How long a NIC server spins with nothing to do before it sleeps (SBW), as what
//! spinning has been worth says ([`Spin`]): a spin pays when the next event comes within
//! it (a sleep and a wake-up saved), and is CPU burnt for nothing when the peer is slower
//! than the spin (a VM guest under TCG answers in hundreds of µs: the whole spin was its
//! backend's CPU per byte). The window is [`NicConfig::spin`](crate::NicConfig) at most;
//! it halves after each wake-up that no spin up to that would have caught, and doubles
//! (from a sixteenth of it) after one that a longer spin would have: KVM's halt-polling
//! rule. A spin that finds work changes nothing. Pure: the server hands it what it
//! measured.

use std::time::Duration;

/// The spin window (see the module's header).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spin {
    max: Duration,
    now: Duration,
}

impl Spin {
    /// A window of `max`, the configured spin, to start with.
    pub fn new(max: Duration) -> Spin {
        Spin { max, now: max }
    }

    /// How long to spin now.
    pub fn window(&self) -> Duration {
        self.now
    }

    /// The smallest window a wake-up grows it to (and below which it shrinks to none).
    fn floor(&self) -> Duration {
        self.max / 16
    }

    /// The server slept `slept` before an event woke it (not a timer's end: a timer is
    /// known ahead and says nothing about the peer).
    pub fn woke_after(&mut self, slept: Duration) {
        if slept > self.max {
            // No spin would have caught it.
            self.now /= 2;
            if self.now < self.floor() {
                self.now = Duration::ZERO;
            }
        } else if slept > self.now {
            // A longer spin would have.
            self.now = (self.now * 2).max(self.floor()).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn a_slow_peer_stops_the_spin_and_a_quick_one_brings_it_back() {
        let mut s = Spin::new(200 * US);
        assert_eq!(s.window(), 200 * US);
        // Answers within the spin: nothing to learn.
        s.woke_after(150 * US);
        assert_eq!(s.window(), 200 * US);
        // A peer slower than any spin: halved each time, then none.
        let seen: Vec<_> = (0..5)
            .map(|_| {
                s.woke_after(500 * US);
                s.window()
            })
            .collect();
        assert_eq!(
            seen,
            [
                100 * US,
                50 * US,
                25 * US,
                12500 * US / 1000,
                Duration::ZERO
            ]
        );
        s.woke_after(Duration::from_secs(1));
        assert_eq!(s.window(), Duration::ZERO);
        // Quick again: a sixteenth, then doubling up to the configured spin.
        let seen: Vec<_> = (0..6)
            .map(|_| {
                s.woke_after(180 * US);
                s.window()
            })
            .collect();
        assert_eq!(
            seen,
            [
                12500 * US / 1000,
                25 * US,
                50 * US,
                100 * US,
                200 * US,
                200 * US
            ]
        );
        // A wake-up the current window would have caught changes nothing.
        let mut s = Spin::new(200 * US);
        s.woke_after(500 * US);
        s.woke_after(40 * US);
        assert_eq!(s.window(), 100 * US);
    }

    #[test]
    fn no_configured_spin_stays_none() {
        let mut s = Spin::new(Duration::ZERO);
        for slept in [0, 5, 500] {
            s.woke_after(slept * US);
            assert_eq!(s.window(), Duration::ZERO);
        }
    }
}
