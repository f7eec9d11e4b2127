//! A NIC server's counters (`--stats`, `--stats-json`, `ferry ctl stats`), each listed
//! once (`ferry_counters::counters!`: the field, its sum, its text and its JSON key come
//! from the list).

use std::fmt;

use ferry_counters::{Counters, LiveStats};

use crate::timing::{Stage, StageTotal};

ferry_counters::counters! {
    /// What one NIC server did. Listed in the order of `--stats-json`'s keys.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct NicStats {
        /// Server id, `nic-K`.
        pub id: String,
        /// Per-stage totals, when timing was on ([`NicConfig::timing`](crate::NicConfig)).
        pub timing: Option<Vec<(Stage, StageTotal)>>,
    }
    counters {
        /// Frames read from the TAP.
        frames_in: "frames in",
        /// Their bytes.
        frame_bytes_in: "frame bytes in",
        /// Frames written to the TAP.
        frames_out: "frames out",
        /// Their bytes.
        frame_bytes_out: "frame bytes out",
        /// Frames to the sandbox dropped because the TAP's queue was full.
        tap_full: "TAP full",
        /// Frames from the sandbox dropped as malformed.
        malformed: "malformed",
        /// Fragments from the sandbox, dropped.
        fragments: "fragments",
        /// Frames of protocols the server does not relay, dropped.
        unsupported: "unsupported",
        /// Frames whose source is not the sandbox's, dropped.
        spoofed: "spoofed",
        /// TCP flows the sandbox opened.
        tcp_flows: "tcp flows",
        /// TCP flows through `-p` (published ports).
        published_flows: "published flows",
        /// UDP flows.
        udp_flows: "udp flows",
        /// Echo (ping) flows.
        echo_flows: "echo flows",
        /// Flows refused by the policy and the address rules.
        denied: "denied",
        /// Flows refused because the server carried its maximum.
        over_cap: "over cap",
        /// TCP connections to the destination that failed (the sandbox got a reset).
        connect_failed: "connects failed",
        /// TCP connects the sandbox gave up (reset, closed) before the destination
        /// answered: their host connects were aborted.
        abandoned: "abandoned",
        /// Payload bytes to the network.
        bytes_out: "bytes out",
        /// Payload bytes from the network.
        bytes_in: "bytes in",
        /// Loop turns.
        turns: "turns",
        /// Turns that found nothing while spinning.
        spin_turns: "idle spins",
        /// Sleeps in epoll.
        sleeps: "sleeps",
        /// A guest's DNS queries relayed upstream (`ferry vm --dns`), answers returned,
        /// datagrams dropped (not a query), queries evicted (too many in flight), and
        /// datagrams from upstream that answered no query in flight.
        dns_queries: "DNS queries",
        dns_answers: "DNS answers",
        dns_dropped: "DNS dropped",
        dns_evicted: "DNS evicted",
        dns_stray: "DNS stray",
        /// Flows still open when the server stopped.
        open_at_stop: "left open",
    }
}

impl fmt::Display for NicStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "server {}: {}", self.id, self.text_fields())?;
        if let Some(t) = &self.timing {
            let each: Vec<String> = t
                .iter()
                .filter(|(_, v)| v.calls > 0)
                .map(|(s, v)| {
                    format!(
                        "{} {} calls ({} hits) {:.0} ns/call",
                        s.name(),
                        v.calls,
                        v.hits,
                        v.ns as f64 / v.calls as f64
                    )
                })
                .collect();
            writeln!(f, "server {} timing: {}", self.id, each.join(", "))?;
        }
        Ok(())
    }
}

impl NicStats {
    /// The counters as one JSON object.
    pub fn to_json(&self) -> String {
        let mut body = self.json_fields();
        if let Some(t) = &self.timing {
            let stages: Vec<String> = t
                .iter()
                .map(|(s, v)| format!("\"{}\":{{{}}}", s.name(), v.json_fields()))
                .collect();
            body += &format!(",\"timing\":{{{}}}", stages.join(","));
        }
        format!("{{\"id\":\"{}\",{}}}", self.id, body)
    }
}

/// The NIC servers' counters as a JSON array.
pub fn nic_json(servers: &[NicStats]) -> String {
    let each: Vec<String> = servers.iter().map(NicStats::to_json).collect();
    format!("[{}]", each.join(","))
}

/// A running NIC server's live counters, read by `ferry ctl` from another thread; the
/// server refreshes them when it goes to sleep and every [`LIVE_EVERY`] turns.
#[derive(Debug, Default)]
pub struct NicLive {
    pub(crate) tid: std::sync::atomic::AtomicI32,
    pub(crate) cpu: std::sync::atomic::AtomicI32,
    pub(crate) pinned: std::sync::atomic::AtomicI32,
    pub(crate) flows: std::sync::atomic::AtomicU64,
    pub(crate) frames: std::sync::atomic::AtomicU64,
    pub(crate) bytes_out: std::sync::atomic::AtomicU64,
    pub(crate) bytes_in: std::sync::atomic::AtomicU64,
    pub(crate) sleeps: std::sync::atomic::AtomicU64,
}

/// Turns between two refreshes of [`NicLive`] while busy.
pub(crate) const LIVE_EVERY: u64 = 1024;

impl NicLive {
    /// The counters as a row of `ferry ctl stats` (`sockets`: open flows, `requests`:
    /// frames from the sandbox).
    pub fn snapshot(&self, id: &str) -> LiveStats {
        use std::sync::atomic::Ordering::Relaxed;
        LiveStats {
            id: id.to_string(),
            cpu: self.cpu.load(Relaxed),
            pinned: self.pinned.load(Relaxed),
            sockets: self.flows.load(Relaxed),
            channels: 0,
            requests: self.frames.load(Relaxed),
            outstanding: 0,
            bytes_out: self.bytes_out.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            sleeps: self.sleeps.load(Relaxed),
        }
    }

    /// Pins the server's thread to `cpu`.
    pub fn move_to(&self, cpu: usize) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        let tid = self.tid.load(Ordering::Acquire);
        if tid <= 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the NIC server is not running",
            ));
        }
        ferry_sys::pin_thread(tid, cpu)?;
        self.pinned
            .store(i32::try_from(cpu).unwrap_or(-1), Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed counter is summed, in `--stats`' text and in `--stats-json`; so is
    /// every stage's total in the timing object.
    #[test]
    fn every_counter_is_summed_and_shown() {
        ferry_counters::check::<NicStats>(NicStats::COUNTERS, |s| (s.to_json(), s.to_string()));
        ferry_counters::check::<StageTotal>(StageTotal::COUNTERS, |t| {
            let s = NicStats {
                timing: Some(vec![(Stage::Pump, *t)]),
                ..NicStats::default()
            };
            (s.to_json(), t.text_fields())
        });
    }

    #[test]
    fn json_has_timing_only_when_on() {
        let mut s = NicStats {
            id: "nic-0".into(),
            frames_in: 3,
            ..Default::default()
        };
        let off = s.to_json();
        assert!(
            off.starts_with("{\"id\":\"nic-0\",\"frames_in\":3,"),
            "{off}"
        );
        assert!(!off.contains("timing"));
        s.timing = Some(vec![(
            Stage::TapRead,
            StageTotal {
                calls: 4,
                hits: 3,
                ns: 1200,
            },
        )]);
        let on = s.to_json();
        assert!(
            on.ends_with(",\"timing\":{\"tap_read\":{\"calls\":4,\"hits\":3,\"ns\":1200}}}"),
            "{on}"
        );
        assert!(
            s.to_string()
                .contains("tap_read 4 calls (3 hits) 300 ns/call")
        );
    }
}
