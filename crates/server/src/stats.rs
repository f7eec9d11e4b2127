//! Counters the server keeps and reports (`ferry run --stats`, `--stats-json`), each
//! listed once (`ferry_counters::counters!`: the field, its sum, its text and its JSON
//! key come from the list). Must not: grow with what a sandbox does (closed sockets and
//! channels fold into one row past a bound).

use std::fmt;

use ferry_counters::Counters;
use ferry_egress::EgressStats;

/// Most closed sockets, and most closed channels, a server lists one by one; the
/// counters of those closed after them are added up in one entry per list whose id is
/// [`FOLDED`]. A sandbox that opens and closes sockets or threads without end (any
/// long-lived server program, or a hostile one in a loop) would otherwise grow its
/// protocol server's memory by an entry for each.
pub const MAX_LISTED: usize = 4096;

/// Id of the entry that adds up the closed channels or sockets beyond [`MAX_LISTED`].
pub const FOLDED: u32 = u32::MAX;

ferry_counters::counters! {
    /// Per-socket counters.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SocketStats {
        /// Socket id.
        pub id: u32,
    }
    counters {
        /// Operations performed for it.
        calls: "calls",
        /// Bytes sent to the network.
        bytes_out: "bytes out",
        /// Bytes received from the network.
        bytes_in: "bytes in",
        /// Readiness tokens written.
        tokens: "tokens",
        /// Times the program's end was made writable again after a send found no room.
        room_waits: "room waits",
    }
}

ferry_counters::counters! {
    /// Per-channel counters (one channel per sandbox thread).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct ChannelStats {
        /// Channel number.
        pub id: u32,
        /// Sandbox process id.
        pub pid: u32,
        /// Sandbox thread id.
        pub tid: u32,
    }
    counters {
        /// Request records handled.
        requests: "requests",
        /// Completion records published.
        completions: "completions",
        /// Commits that published at least one completion (batches).
        batches: "batches",
        /// Wakes sent to the shim.
        wakes_sent: "wakes sent",
        /// Wakes avoided because the shim was spinning.
        wakes_avoided: "wakes avoided",
        /// Doorbells received from the shim.
        doorbells: "doorbells",
        /// Sleeps of the shim's threads in the kernel on a readiness pair (the pair
        /// receive path: a reader that spun out), as the shim counted them in the region.
        pair_sleeps: "pair sleeps",
    }
}

ferry_counters::counters! {
    /// Whole-server counters. Listed in the order of `--stats-json`'s keys.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ServerStats {
        /// Server id (kind + serial), e.g. `proto-0`.
        pub id: String,
        /// Channels seen (at most [`MAX_LISTED`] closed ones, then their sum as [`FOLDED`]).
        pub channels: Vec<ChannelStats>,
        /// Sockets seen (at most [`MAX_LISTED`] closed ones, then their sum as [`FOLDED`]).
        pub sockets: Vec<SocketStats>,
        /// Egress bonding: per source address (filled in by the caller, which owns the bond
        /// every server of the sandbox shares).
        pub egress: Vec<EgressStats>,
    }
    counters {
        /// Request records handled.
        requests: "requests",
        /// Bytes sent to the network.
        bytes_out: "bytes out",
        /// Bytes received from the network.
        bytes_in: "bytes in",
        /// Sockets created through this server's channels (wherever they were assigned).
        sockets_created: "sockets created",
        /// Of those, sockets that were made ahead, in an idle turn (`connect.rs`, `Spares`).
        sockets_made_ahead: "sockets made ahead",
        /// Sockets this server created or accepted and handed to another server.
        sockets_handed: "sockets handed over",
        /// Sockets another server handed to this one.
        sockets_adopted: "sockets taken over",
        /// Event-loop turns.
        turns: "turns",
        /// Turns that found nothing to do while spinning.
        spin_turns: "idle spins",
        /// Times the loop went to sleep in epoll.
        sleeps: "sleeps",
        /// Host system calls that moved data (send/recv).
        data_syscalls: "data syscalls",
        /// Host receives that found nothing (`EAGAIN`): wasted system calls.
        empty_reads: "empty reads",
        /// Channels closed because their peer wrote malformed data.
        bad_channels: "bad channels",
        /// Destinations refused by the policy, and other operations the address rules
        /// refuse (docs/SECURITY.md).
        denied: "denied",
        /// Datagrams a socket on the host received from a source the sandbox may not talk
        /// to, dropped.
        dropped_arrivals: "dropped arrivals",
        /// Datagrams to published UDP ports forwarded into the sandbox (`udp_publish`).
        udp_published_in: "published datagrams in",
        /// Answers to them forwarded back out.
        udp_published_out: "published datagrams out",
        /// Datagrams either way dropped.
        udp_published_dropped: "published datagrams dropped",
        /// Connections to published TCP ports refused: nothing in the sandbox listened on
        /// the port through ferry, or too many waited.
        published_refused: "published connections refused",
        /// Control connections refused or closed before they became channels (not from the
        /// sandbox, no Hello in time, over a cap).
        channels_refused: "refused channels",
        /// Times a channel's requests were left untaken because its completions backed up
        /// (the program does not read them): back-pressure.
        backpressure: "back-pressure",
        /// Sockets still open when the server stopped although their program side was gone
        /// (should be 0: anything else is a leak).
        open_at_stop: "left open",
        /// DNS queries relayed for the sandbox.
        dns_queries: "DNS queries",
        /// DNS answers delivered.
        dns_answers: "DNS answers",
        /// DNS-over-TCP connections relayed.
        dns_tcp: "DNS over TCP",
        /// Datagrams the sandbox sent its nameserver addresses that are not queries
        /// (responses, runts), dropped.
        dns_dropped: "DNS dropped",
        /// DNS queries in flight forgotten to make room (`dns::MAX_PENDING`).
        dns_evicted: "DNS evicted",
        /// Datagrams on the upstream socket that answered nothing in flight, dropped.
        dns_stray: "DNS stray",
        /// DNS-over-TCP connections closed at once because `dns::MAX_TCP` were relayed.
        dns_tcp_refused: "DNS over TCP refused",
        /// Distinct data-path modules compiled.
        modules_loaded: "modules loaded",
        /// Module instances started on sockets.
        modules_started: "modules started",
        /// Module instances stopped by a failure (their sockets were reset).
        modules_failed: "modules failed",
        /// Module bindings refused (bad binding or module, no capacity…).
        module_refused: "modules refused",
        /// Bytes modules wrote to their sockets.
        module_bytes_out: "module bytes out",
        /// Time spent making module instances (fresh or spare, with their inputs),
        /// nanoseconds, summed.
        module_start_ns: "module start ns",
        /// Time spent in modules' `init`, nanoseconds, summed.
        module_init_ns: "module init ns",
        /// Time spent writing modules' output to their sockets (send, sendfile),
        /// nanoseconds, summed.
        module_write_ns: "module write ns",
    }
}

impl fmt::Display for ServerStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "server {}: {}", self.id, self.text_fields())?;
        for c in &self.channels {
            if c.id == FOLDED {
                writeln!(
                    f,
                    "  channels closed after the first {MAX_LISTED}: {}",
                    c.text_fields()
                )?;
            } else {
                let (id, pid, tid) = (c.id, c.pid, c.tid);
                writeln!(
                    f,
                    "  channel {id} (pid {pid} tid {tid}): {}",
                    c.text_fields()
                )?;
            }
        }
        for s in &self.sockets {
            if s.id == FOLDED {
                writeln!(
                    f,
                    "  sockets closed after the first {MAX_LISTED}: {}",
                    s.text_fields()
                )?;
            } else {
                writeln!(f, "  socket {}: {}", s.id, s.text_fields())?;
            }
        }
        for e in &self.egress {
            writeln!(
                f,
                "  egress {}: connections {} (open {}), bytes out {}, bytes in {}",
                e.addr, e.connections, e.live, e.bytes_out, e.bytes_in
            )?;
        }
        Ok(())
    }
}

impl ServerStats {
    /// Records a closed socket's counters: listed while fewer than [`MAX_LISTED`] are,
    /// else added to the [`FOLDED`] entry.
    pub(crate) fn closed_socket(&mut self, s: SocketStats) {
        if self.sockets.len() < MAX_LISTED {
            self.sockets.push(s);
            return;
        }
        if self.sockets.last().is_none_or(|l| l.id != FOLDED) {
            self.sockets.push(SocketStats {
                id: FOLDED,
                ..SocketStats::default()
            });
        }
        self.sockets.last_mut().expect("just made sure").add(&s);
    }

    /// Records a closed channel's counters, as [`ServerStats::closed_socket`] does.
    pub(crate) fn closed_channel(&mut self, c: ChannelStats) {
        if self.channels.len() < MAX_LISTED {
            self.channels.push(c);
            return;
        }
        if self.channels.last().is_none_or(|l| l.id != FOLDED) {
            self.channels.push(ChannelStats {
                id: FOLDED,
                ..ChannelStats::default()
            });
        }
        self.channels.last_mut().expect("just made sure").add(&c);
    }

    /// The counters as one JSON object (for `ferry run --stats-json` and the benchmarks).
    pub fn to_json(&self) -> String {
        let chans: Vec<String> = self
            .channels
            .iter()
            .map(|c| {
                let (id, pid, tid) = (c.id, c.pid, c.tid);
                format!(
                    r#"{{"id":{id},"pid":{pid},"tid":{tid},{}}}"#,
                    c.json_fields()
                )
            })
            .collect();
        let socks: Vec<String> = self
            .sockets
            .iter()
            .map(|s| format!(r#"{{"id":{},{}}}"#, s.id, s.json_fields()))
            .collect();
        let egress: Vec<String> = self
            .egress
            .iter()
            .map(|e| {
                format!(
                    r#"{{"addr":"{}","connections":{},"live":{},"bytes_out":{},"bytes_in":{}}}"#,
                    e.addr, e.connections, e.live, e.bytes_out, e.bytes_in
                )
            })
            .collect();
        format!(
            r#"{{"server":"{}",{},"channels":[{}],"sockets":[{}],"egress":[{}]}}"#,
            self.id,
            self.json_fields(),
            chans.join(","),
            socks.join(","),
            egress.join(",")
        )
    }
}

/// The counters of a group of servers: one object with the totals (same keys as
/// [`ServerStats::to_json`], every channel and socket, and `egress`, the counters of the
/// bond all servers share) plus `"servers"`, each server's own.
pub fn group_json(servers: &[ServerStats], egress: &[EgressStats]) -> String {
    let mut total = merge(servers);
    total.egress = egress.to_vec();
    let total = total.to_json();
    let each: Vec<String> = servers.iter().map(ServerStats::to_json).collect();
    format!(
        "{},\"servers\":[{}]}}",
        total.strip_suffix('}').unwrap_or(&total),
        each.join(",")
    )
}

/// Sums the counters of several servers (id `all`).
pub fn merge(servers: &[ServerStats]) -> ServerStats {
    let mut t = ServerStats {
        id: "all".into(),
        ..ServerStats::default()
    };
    for s in servers {
        t.add(s);
        t.channels.extend_from_slice(&s.channels);
        t.sockets.extend_from_slice(&s.sockets);
        t.egress.extend_from_slice(&s.egress);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `server` fuzz target (its memory grew with every input): closed
    /// sockets and channels were listed one by one, without end.
    #[test]
    fn closed_sockets_and_channels_are_listed_up_to_a_bound() {
        let mut st = ServerStats::default();
        let n = MAX_LISTED + 1000;
        for i in 0..n {
            st.closed_socket(SocketStats {
                id: u32::try_from(i).unwrap(),
                calls: 1,
                bytes_out: 2,
                ..SocketStats::default()
            });
            st.closed_channel(ChannelStats {
                id: u32::try_from(i).unwrap(),
                requests: 3,
                ..ChannelStats::default()
            });
        }
        assert_eq!(st.sockets.len(), MAX_LISTED + 1);
        assert_eq!(st.channels.len(), MAX_LISTED + 1);
        let rest = st.sockets.last().unwrap();
        assert_eq!((rest.id, rest.calls, rest.bytes_out), (FOLDED, 1000, 2000));
        let calls: u64 = st.sockets.iter().map(|s| s.calls).sum();
        assert_eq!(calls, n as u64, "no counter is lost");
        let requests: u64 = st.channels.iter().map(|c| c.requests).sum();
        assert_eq!(requests, 3 * n as u64);
        assert_eq!(st.channels.last().unwrap().id, FOLDED);
    }

    /// Every listed counter is summed by `merge`, in `--stats`' text and in
    /// `--stats-json`, for the server, its channels and its sockets: adding a counter to
    /// a list is the only edit a new counter needs.
    #[test]
    fn every_counter_is_summed_and_shown() {
        ferry_counters::check::<ServerStats>(ServerStats::COUNTERS, |s| {
            (s.to_json(), s.to_string())
        });
        // A channel's or socket's counters: their object in the server's JSON (the
        // list `key` names), and the server's text.
        let within = |s: ServerStats, key: &str| {
            let j = s.to_json();
            let at = j.find(key).expect("the list") + key.len();
            let list = j[at..].split(']').next().unwrap_or_default().to_string();
            (list, s.to_string())
        };
        ferry_counters::check::<ChannelStats>(ChannelStats::COUNTERS, |c| {
            let s = ServerStats {
                channels: vec![*c],
                ..ServerStats::default()
            };
            within(s, r#""channels":["#)
        });
        ferry_counters::check::<SocketStats>(SocketStats::COUNTERS, |c| {
            let s = ServerStats {
                sockets: vec![*c],
                ..ServerStats::default()
            };
            within(s, r#""sockets":["#)
        });
        let mut a = ServerStats::default();
        for (i, name) in ServerStats::COUNTERS.iter().enumerate() {
            a.set(name, i as u64 + 1);
        }
        let total = merge(&[a.clone(), a.clone()]);
        for (one, sum) in a.counters().iter().zip(total.counters()) {
            assert_eq!(sum.value, 2 * one.value, "{} is merged", one.name);
        }
    }

    #[test]
    fn group_json_has_totals_and_each_server() {
        let a = ServerStats {
            id: "proto-0".into(),
            requests: 3,
            sockets: vec![SocketStats {
                id: 16,
                ..SocketStats::default()
            }],
            ..ServerStats::default()
        };
        let b = ServerStats {
            id: "proto-1".into(),
            requests: 4,
            open_at_stop: 1,
            ..ServerStats::default()
        };
        let j = group_json(&[a, b], &[]);
        assert!(j.starts_with(r#"{"server":"all","requests":7,"#), "{j}");
        assert!(j.contains(r#""open_at_stop":1,"#), "{j}");
        assert!(
            j.contains(r#""servers":[{"server":"proto-0","requests":3,"#),
            "{j}"
        );
        assert!(j.contains(r#"{"server":"proto-1","requests":4,"#), "{j}");
        assert!(j.ends_with("]}"), "{j}");
    }
}
