//! The throttled log: at most one line a second for an event a sandbox can repeat at
//! will (a refused destination, a flood at a published port), each line saying how many
//! events it stands for. Every path's refusal lines go through one.

use std::time::{Duration, Instant};

/// Shortest time between two lines of one throttle.
pub const EVERY: Duration = Duration::from_secs(1);

/// At most one log line every `EVERY` (a second): [`LogThrottle::tick`] says when to write one,
/// and how many events it covers.
#[derive(Debug, Default)]
pub struct LogThrottle {
    last: Option<Instant>,
    count: u64,
}

impl LogThrottle {
    /// Counts one event; `Some(events since the last line)` when a line is due.
    pub fn tick(&mut self) -> Option<u64> {
        self.tick_at(Instant::now())
    }

    /// [`LogThrottle::tick`] at `now`.
    pub fn tick_at(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < EVERY)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_second_counting_what_it_covers() {
        let mut t = LogThrottle::default();
        let t0 = Instant::now();
        assert_eq!(t.tick_at(t0), Some(1), "the first event is written");
        for k in 1..100 {
            assert_eq!(t.tick_at(t0 + Duration::from_millis(k * 9)), None);
        }
        // A second after the last line: one line for the 99 held back and this one.
        assert_eq!(t.tick_at(t0 + EVERY), Some(100));
        assert_eq!(t.tick_at(t0 + EVERY + Duration::from_millis(999)), None);
        assert_eq!(t.tick_at(t0 + EVERY * 2), Some(2));
        // A clock read earlier than the last line (another thread's) holds it back.
        assert_eq!(t.tick_at(t0), None);
    }
}
