//! The flow table of datagram paths: flows by id (a server's event token) and by key
//! (who talks to whom), with idle expiry and a cap per group, one type for every path
//! that relays datagrams — socket mode's published UDP ports (a flow per client of a
//! port, the port's flows one group) and nic mode's flows (a NIC server's one table: its
//! UDP and echo flows, a flow per sandbox end and destination, expire when idle; its TCP
//! flows, idle for ever ([`std::time::Duration::MAX`]), end with their connection).
//!
//! Bounds, since whoever sends the datagrams chooses the keys: a flow that carried
//! nothing for its idle time ([`Limits::idle`]) is taken out by the next
//! [`FlowTable::expire`] (which looks at most every [`SWEEP_EVERY`]), and a group holds
//! at most [`Limits::cap`] flows: a new one takes the place of the group's flow idle
//! longest. Releasing what a flow holds (its socket, its registration) is the caller's:
//! every flow the table lets go is handed back to it.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Shortest time between two sweeps of [`FlowTable::expire`].
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A table's bounds, as functions of a flow's key.
#[derive(Clone, Copy, Debug)]
pub struct Limits<K> {
    /// How long a flow may carry nothing before it expires.
    pub idle: fn(&K) -> Duration,
    /// Most flows of one group (at least 1).
    pub cap: usize,
    /// The group a key belongs to.
    pub group: fn(&K) -> usize,
}

impl<K> Limits<K> {
    /// `idle` for every flow, no cap.
    pub fn uncapped(idle: fn(&K) -> Duration) -> Limits<K> {
        Limits {
            idle,
            cap: usize::MAX,
            group: |_| 0,
        }
    }
}

/// One flow: its key, when it last carried something, the caller's value.
#[derive(Debug)]
struct Entry<K, V> {
    key: K,
    last: Instant,
    value: V,
}

/// Flows by id and by key (see the module docs).
#[derive(Debug)]
pub struct FlowTable<K, V> {
    flows: HashMap<u64, Entry<K, V>>,
    ids: HashMap<K, u64>,
    /// Flows per group.
    groups: HashMap<usize, usize>,
    limits: Limits<K>,
    swept: Option<Instant>,
}

impl<K: Hash + Eq + Clone, V> FlowTable<K, V> {
    /// An empty table.
    pub fn new(limits: Limits<K>) -> FlowTable<K, V> {
        FlowTable {
            flows: HashMap::new(),
            ids: HashMap::new(),
            groups: HashMap::new(),
            limits,
            swept: None,
        }
    }

    /// The id of `key`'s flow.
    pub fn find(&self, key: &K) -> Option<u64> {
        self.ids.get(key).copied()
    }

    /// Whether flow `id` is in the table.
    pub fn contains(&self, id: u64) -> bool {
        self.flows.contains_key(&id)
    }

    pub fn get(&self, id: u64) -> Option<&V> {
        self.flows.get(&id).map(|e| &e.value)
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut V> {
        self.flows.get_mut(&id).map(|e| &mut e.value)
    }

    /// Flow `id` carried something at `now` (its idle time starts again).
    pub fn active(&mut self, id: u64, now: Instant) -> Option<&mut V> {
        let e = self.flows.get_mut(&id)?;
        e.last = now;
        Some(&mut e.value)
    }

    /// Adds flow `id` for `key`, active at `now`. Returns the flows it displaced, for
    /// the caller to release: the group's flow idle longest when the group was full, and
    /// a flow that had this key or this id already.
    pub fn insert(&mut self, id: u64, key: K, value: V, now: Instant) -> Vec<(u64, K, V)> {
        let mut gone = Vec::new();
        if let Some(old) = self.find(&key) {
            gone.extend(self.take(old));
        }
        gone.extend(self.take(id));
        let group = (self.limits.group)(&key);
        if self.groups.get(&group).copied().unwrap_or(0) >= self.limits.cap.max(1)
            && let Some(oldest) = self.idle_longest(group)
        {
            gone.extend(self.take(oldest));
        }
        *self.groups.entry(group).or_default() += 1;
        self.ids.insert(key.clone(), id);
        self.flows.insert(
            id,
            Entry {
                key,
                last: now,
                value,
            },
        );
        gone
    }

    /// Takes flow `id` out.
    pub fn remove(&mut self, id: u64) -> Option<(K, V)> {
        self.take(id).map(|(_, k, v)| (k, v))
    }

    /// Takes out the flows idle for their [`Limits::idle`] at `now`; nothing when the
    /// last sweep was less than [`SWEEP_EVERY`] before.
    pub fn expire(&mut self, now: Instant) -> Vec<(u64, K, V)> {
        if self
            .swept
            .is_some_and(|t| now.saturating_duration_since(t) < SWEEP_EVERY)
        {
            return Vec::new();
        }
        self.swept = Some(now);
        let idle = self.limits.idle;
        let old: Vec<u64> = self
            .flows
            .iter()
            .filter(|(_, e)| now.saturating_duration_since(e.last) >= idle(&e.key))
            .map(|(id, _)| *id)
            .collect();
        old.into_iter().filter_map(|id| self.take(id)).collect()
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// Every flow, with its id (in no order).
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.flows.iter().map(|(id, e)| (*id, &e.value))
    }

    /// Every flow, with its id, to change (in no order; keys and idle times stay).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut V)> {
        self.flows.iter_mut().map(|(id, e)| (*id, &mut e.value))
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// The flow of `group` that carried something longest ago.
    fn idle_longest(&self, group: usize) -> Option<u64> {
        let of = self.limits.group;
        self.flows
            .iter()
            .filter(|(_, e)| of(&e.key) == group)
            .min_by_key(|(_, e)| e.last)
            .map(|(id, _)| *id)
    }

    fn take(&mut self, id: u64) -> Option<(u64, K, V)> {
        let e = self.flows.remove(&id)?;
        if self.ids.get(&e.key) == Some(&id) {
            self.ids.remove(&e.key);
        }
        let group = (self.limits.group)(&e.key);
        if let Some(n) = self.groups.get_mut(&group) {
            *n -= 1;
            if *n == 0 {
                self.groups.remove(&group);
            }
        }
        Some((id, e.key, e.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (group, client): a published port's flows, `cap` a port.
    type Key = (usize, u16);

    const IDLE: Duration = Duration::from_secs(60);

    fn capped(cap: usize) -> FlowTable<Key, &'static str> {
        FlowTable::new(Limits {
            idle: |_| IDLE,
            cap,
            group: |k| k.0,
        })
    }

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    #[test]
    fn flows_are_found_by_key_and_by_id() {
        let mut t = capped(4);
        let t0 = Instant::now();
        assert!(t.insert(7, (0, 1), "a", t0).is_empty());
        assert!(t.insert(9, (0, 2), "b", t0).is_empty());
        assert_eq!(t.find(&(0, 1)), Some(7));
        assert_eq!(t.get(9), Some(&"b"));
        assert!(t.contains(7) && !t.contains(8));
        *t.get_mut(7).unwrap() = "a2";
        let mut all: Vec<_> = t.iter().map(|(id, v)| (id, *v)).collect();
        all.sort_unstable();
        assert_eq!(all, [(7, "a2"), (9, "b")]);
        for (_, v) in t.iter_mut() {
            *v = "c";
        }
        assert_eq!((t.get(7), t.find(&(0, 2))), (Some(&"c"), Some(9)));
        *t.get_mut(7).unwrap() = "a2";
        assert_eq!(t.remove(7), Some(((0, 1), "a2")));
        assert_eq!(t.find(&(0, 1)), None);
        assert_eq!(t.remove(7), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_full_group_gives_its_idle_longest_flows_place_to_a_new_one() {
        let mut t = capped(3);
        let t0 = Instant::now();
        for k in 0..3u16 {
            assert!(
                t.insert(u64::from(k), (0, k), "port 0", ms(t0, k.into()))
                    .is_empty()
            );
        }
        // Flow 0 was the first; it has carried something since, so flow 1 is oldest.
        t.active(0, ms(t0, 50)).unwrap();
        // Another group's flows are not counted against this one.
        assert!(t.insert(10, (1, 0), "port 1", t0).is_empty());
        let gone = t.insert(3, (0, 3), "port 0", ms(t0, 60));
        assert_eq!(gone, [(1, (0, 1), "port 0")]);
        assert_eq!(t.find(&(0, 1)), None, "its key went with it");
        assert_eq!(t.len(), 4);
        // The group stays at its cap: the next new one takes flow 2's place.
        assert_eq!(t.insert(4, (0, 4), "port 0", ms(t0, 70))[0].0, 2);
        assert!(t.insert(11, (1, 1), "port 1", t0).is_empty());
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn a_key_or_an_id_inserted_again_displaces_the_flow_that_had_it() {
        let mut t = capped(8);
        let t0 = Instant::now();
        t.insert(1, (0, 1), "first", t0);
        assert_eq!(t.insert(2, (0, 1), "again", t0), [(1, (0, 1), "first")]);
        assert_eq!(t.find(&(0, 1)), Some(2));
        // An id in use (a wrapped counter): the flow that had it goes, and its key.
        assert_eq!(t.insert(2, (0, 5), "reused", t0), [(2, (0, 1), "again")]);
        assert_eq!(t.find(&(0, 1)), None);
        assert_eq!((t.len(), t.find(&(0, 5))), (1, Some(2)));
        // Counts follow: the group holds one flow, room for seven more.
        for k in 10..17u16 {
            assert!(t.insert(k.into(), (0, k), "x", t0).is_empty());
        }
        assert_eq!(t.insert(99, (0, 99), "x", t0).len(), 1);
    }

    #[test]
    fn idle_flows_expire_and_sweeps_are_rate_limited() {
        let mut t = capped(8);
        let t0 = Instant::now();
        t.insert(1, (0, 1), "idle", t0);
        t.insert(2, (0, 2), "busy", t0);
        t.active(2, t0 + IDLE).unwrap();
        assert!(t.expire(t0 + Duration::from_secs(1)).is_empty());
        // Within a second of the last sweep: not looked at.
        assert!(t.expire(ms(t0, 1_500)).is_empty());
        let gone = t.expire(t0 + IDLE + Duration::from_secs(3));
        assert_eq!(gone, [(1, (0, 1), "idle")]);
        assert_eq!((t.len(), t.find(&(0, 1))), (1, None));
        // Idle exactly its time: expired.
        assert_eq!(t.expire(t0 + IDLE * 2).len(), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn idle_times_may_differ_by_key() {
        // nic mode's table: (echo, flow); echo flows idle 10 s, UDP 60 s; no cap.
        let mut t: FlowTable<(bool, u16), ()> = FlowTable::new(Limits::uncapped(|k| {
            if k.0 {
                Duration::from_secs(10)
            } else {
                Duration::from_secs(60)
            }
        }));
        let t0 = Instant::now();
        for k in 0..1000u16 {
            assert!(t.insert(k.into(), (k % 2 == 0, k), (), t0).is_empty());
        }
        let gone = t.expire(t0 + Duration::from_secs(10));
        assert_eq!(gone.len(), 500);
        assert!(gone.iter().all(|(_, (echo, _), ())| *echo));
        assert_eq!(t.expire(t0 + Duration::from_secs(60)).len(), 500);
    }
}
