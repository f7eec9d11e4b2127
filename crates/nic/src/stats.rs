//! A NIC server's counters (`--stats`, `--stats-json`, `ferry ctl stats`).

use std::fmt;

use crate::timing::{Stage, StageTotal};

/// What one NIC server did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NicStats {
    /// Server id, `nic-K`.
    pub id: String,
    /// Frames read from the TAP, and their bytes.
    pub frames_in: u64,
    pub frame_bytes_in: u64,
    /// Frames written to the TAP, and their bytes.
    pub frames_out: u64,
    pub frame_bytes_out: u64,
    /// Frames to the sandbox dropped because the TAP's queue was full.
    pub tap_full: u64,
    /// Frames from the sandbox dropped: malformed, fragments, unsupported protocols,
    /// sources that are not the sandbox's.
    pub malformed: u64,
    pub fragments: u64,
    pub unsupported: u64,
    pub spoofed: u64,
    /// Flows opened (TCP from the sandbox, TCP through `-p`, UDP, echo).
    pub tcp_flows: u64,
    pub published_flows: u64,
    pub udp_flows: u64,
    pub echo_flows: u64,
    /// Flows refused: by the policy and the address rules, or because the server
    /// carried its maximum.
    pub denied: u64,
    pub over_cap: u64,
    /// TCP connections to the destination that failed (the sandbox got a reset).
    pub connect_failed: u64,
    /// TCP connects the sandbox gave up (reset, closed) before the destination
    /// answered: their host connects were aborted.
    pub abandoned: u64,
    /// Payload bytes to the network and from it.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Loop turns, turns that found nothing while spinning, and sleeps in epoll.
    pub turns: u64,
    pub spin_turns: u64,
    pub sleeps: u64,
    /// Flows still open when the server stopped.
    pub open_at_stop: u64,
    /// Per-stage totals, when timing was on ([`NicConfig::timing`](crate::NicConfig)).
    pub timing: Option<Vec<(Stage, StageTotal)>>,
}

impl fmt::Display for NicStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "server {}: frames in {} ({} B) out {} ({} B), TAP full {}, dropped: malformed {} fragments {} unsupported {} spoofed {}; flows: tcp {} published {} udp {} echo {}, denied {}, over cap {}, connects failed {}, abandoned {}; bytes out {} in {}; turns {} (idle spins {}), sleeps {}, left open {}",
            self.id,
            self.frames_in,
            self.frame_bytes_in,
            self.frames_out,
            self.frame_bytes_out,
            self.tap_full,
            self.malformed,
            self.fragments,
            self.unsupported,
            self.spoofed,
            self.tcp_flows,
            self.published_flows,
            self.udp_flows,
            self.echo_flows,
            self.denied,
            self.over_cap,
            self.connect_failed,
            self.abandoned,
            self.bytes_out,
            self.bytes_in,
            self.turns,
            self.spin_turns,
            self.sleeps,
            self.open_at_stop
        )?;
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
        let fields: [(&str, u64); 23] = [
            ("frames_in", self.frames_in),
            ("frame_bytes_in", self.frame_bytes_in),
            ("frames_out", self.frames_out),
            ("frame_bytes_out", self.frame_bytes_out),
            ("tap_full", self.tap_full),
            ("malformed", self.malformed),
            ("fragments", self.fragments),
            ("unsupported", self.unsupported),
            ("spoofed", self.spoofed),
            ("tcp_flows", self.tcp_flows),
            ("published_flows", self.published_flows),
            ("udp_flows", self.udp_flows),
            ("echo_flows", self.echo_flows),
            ("denied", self.denied),
            ("over_cap", self.over_cap),
            ("connect_failed", self.connect_failed),
            ("abandoned", self.abandoned),
            ("bytes_out", self.bytes_out),
            ("bytes_in", self.bytes_in),
            ("turns", self.turns),
            ("spin_turns", self.spin_turns),
            ("sleeps", self.sleeps),
            ("open_at_stop", self.open_at_stop),
        ];
        let mut body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        if let Some(t) = &self.timing {
            let stages: Vec<String> = t
                .iter()
                .map(|(s, v)| {
                    format!(
                        "\"{}\":{{\"calls\":{},\"hits\":{},\"ns\":{}}}",
                        s.name(),
                        v.calls,
                        v.hits,
                        v.ns
                    )
                })
                .collect();
            body.push(format!("\"timing\":{{{}}}", stages.join(",")));
        }
        format!("{{\"id\":\"{}\",{}}}", self.id, body.join(","))
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
    pub fn snapshot(&self, id: &str) -> ferry_proto::LiveStats {
        use std::sync::atomic::Ordering::Relaxed;
        ferry_proto::LiveStats {
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
