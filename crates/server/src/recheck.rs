//! Detached sockets to ask about again ([`Rechecks`]): a process that dies holding a
//! socket whose pair was detached (a refused non-blocking connect) closes no descriptor
//! the server hears of; its channels closing is the sign to probe the pair's name
//! (`SockTable::app_gone`). But the kernel releases an exiting process's files in no
//! order the server can rely on (the control socket's hang-up may come before the pair
//! end's last reference goes), so a probe that still finds the name held right after a
//! channel closed is made again, a few times, for a bounded while.
//!
//! Pure: the caller probes; this decides when and which. Bounded by the sockets a
//! server holds (one entry per id) and in time ([`Rechecks::FOR`]).

use std::time::{Duration, Instant};

/// Socket ids to probe again, each until its deadline.
#[derive(Debug, Default)]
pub(crate) struct Rechecks {
    ids: Vec<(u32, Instant)>,
    /// When the next round is due (None: nothing to ask).
    next: Option<Instant>,
}

impl Rechecks {
    /// How long after a channel closed its sockets are asked about.
    pub(crate) const FOR: Duration = Duration::from_secs(2);
    /// Between two rounds.
    pub(crate) const EVERY: Duration = Duration::from_millis(10);

    /// Socket `id` was found held right after a channel closed (at `now`): asked about
    /// again until [`Rechecks::FOR`] from now.
    pub(crate) fn add(&mut self, id: u32, now: Instant) {
        let until = now + Self::FOR;
        match self.ids.iter_mut().find(|(i, _)| *i == id) {
            Some(e) => e.1 = until,
            None => self.ids.push((id, until)),
        }
        self.next.get_or_insert(now + Self::EVERY);
    }

    /// The ids to probe now (none before the round is due); those whose time is up are
    /// dropped. The caller gives back, with [`Rechecks::still_held`], those still held.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(u32, Instant)> {
        if self.next.is_none_or(|t| now < t) {
            return Vec::new();
        }
        let due: Vec<(u32, Instant)> = std::mem::take(&mut self.ids)
            .into_iter()
            .filter(|(_, until)| now < *until)
            .collect();
        self.next = None;
        due
    }

    /// An id [`Rechecks::due`] gave is still held: asked about again next round.
    pub(crate) fn still_held(&mut self, entry: (u32, Instant), now: Instant) {
        self.ids.push(entry);
        self.next.get_or_insert(now + Self::EVERY);
    }

    /// Whether a round is to come.
    pub(crate) fn pending(&self) -> bool {
        self.next.is_some()
    }

    /// How long the event loop may sleep before the next round (None: as long as it
    /// likes).
    pub(crate) fn sleep_at_most(&self, now: Instant) -> Option<Duration> {
        self.next.map(|t| t.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_socket_is_asked_about_each_round_until_its_time_is_up() {
        let t0 = Instant::now();
        let mut r = Rechecks::default();
        assert_eq!(r.sleep_at_most(t0), None);
        r.add(7, t0);
        r.add(7, t0);
        assert_eq!(r.sleep_at_most(t0), Some(Rechecks::EVERY));
        // Not before the round is due.
        assert!(r.due(t0).is_empty());
        let mut now = t0 + Rechecks::EVERY;
        let mut rounds = 0;
        loop {
            let due = r.due(now);
            if due.is_empty() {
                break;
            }
            assert_eq!(due.len(), 1, "one entry per id");
            rounds += 1;
            for e in due {
                r.still_held(e, now);
            }
            now += Rechecks::EVERY;
        }
        assert_eq!(rounds, 199, "every 10 ms for 2 s");
        assert_eq!(r.sleep_at_most(now), None, "nothing left to ask");
    }

    #[test]
    fn a_socket_found_gone_is_not_asked_about_again() {
        let t0 = Instant::now();
        let mut r = Rechecks::default();
        r.add(1, t0);
        r.add(2, t0);
        let now = t0 + Rechecks::EVERY;
        let due = r.due(now);
        assert_eq!(due.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2]);
        // 1 is gone (not given back), 2 still held.
        r.still_held(due[1], now);
        let due = r.due(now + Rechecks::EVERY);
        assert_eq!(due.iter().map(|e| e.0).collect::<Vec<_>>(), [2]);
    }
}
