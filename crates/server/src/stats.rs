//! Counters the server keeps and reports (`ferry run --stats`). Must not: grow with
//! what a sandbox does (closed sockets and channels fold into one row past a bound).

use std::fmt;

use ferry_egress::EgressStats;

/// Most closed sockets, and most closed channels, a server lists one by one; the
/// counters of those closed after them are added up in one entry per list whose id is
/// [`FOLDED`]. A sandbox that opens and closes sockets or threads without end (any
/// long-lived server program, or a hostile one in a loop) would otherwise grow its
/// protocol server's memory by an entry for each.
pub const MAX_LISTED: usize = 4096;

/// Id of the entry that adds up the closed channels or sockets beyond [`MAX_LISTED`].
pub const FOLDED: u32 = u32::MAX;

/// Per-socket counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Socket id.
    pub id: u32,
    /// Operations performed for it.
    pub calls: u64,
    /// Bytes sent to the network.
    pub bytes_out: u64,
    /// Bytes received from the network.
    pub bytes_in: u64,
    /// Readiness tokens written.
    pub tokens: u64,
    /// Times the program's end was made writable again after a send found no room.
    pub room_waits: u64,
}

/// Per-channel counters (one channel per sandbox thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Channel number.
    pub id: u32,
    /// Sandbox process id.
    pub pid: u32,
    /// Sandbox thread id.
    pub tid: u32,
    /// Request records handled.
    pub requests: u64,
    /// Completion records published.
    pub completions: u64,
    /// Commits that published at least one completion (batches).
    pub batches: u64,
    /// Wakes sent to the shim.
    pub wakes_sent: u64,
    /// Wakes avoided because the shim was spinning.
    pub wakes_avoided: u64,
    /// Doorbells received from the shim.
    pub doorbells: u64,
    /// Sleeps of the shim's threads in the kernel on a readiness pair (the pair
    /// receive path: a reader that spun out), as the shim counted them in the region.
    pub pair_sleeps: u64,
}

impl SocketStats {
    fn add(&mut self, o: &SocketStats) {
        self.calls += o.calls;
        self.bytes_out += o.bytes_out;
        self.bytes_in += o.bytes_in;
        self.tokens += o.tokens;
        self.room_waits += o.room_waits;
    }
}

impl ChannelStats {
    fn add(&mut self, o: &ChannelStats) {
        self.requests += o.requests;
        self.completions += o.completions;
        self.batches += o.batches;
        self.wakes_sent += o.wakes_sent;
        self.wakes_avoided += o.wakes_avoided;
        self.doorbells += o.doorbells;
        self.pair_sleeps += o.pair_sleeps;
    }
}

/// Whole-server counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Server id (kind + serial), e.g. `proto-0`.
    pub id: String,
    /// Event-loop turns.
    pub turns: u64,
    /// Request records handled.
    pub requests: u64,
    /// Bytes sent to the network.
    pub bytes_out: u64,
    /// Bytes received from the network.
    pub bytes_in: u64,
    /// Sockets created through this server's channels (wherever they were assigned).
    pub sockets_created: u64,
    /// Sockets this server created or accepted and handed to another server.
    pub sockets_handed: u64,
    /// Sockets another server handed to this one.
    pub sockets_adopted: u64,
    /// Turns that found nothing to do while spinning.
    pub spin_turns: u64,
    /// Times the loop went to sleep in epoll.
    pub sleeps: u64,
    /// Host system calls that moved data (send/recv).
    pub data_syscalls: u64,
    /// Host receives that found nothing (`EAGAIN`): wasted system calls.
    pub empty_reads: u64,
    /// Channels closed because their peer wrote malformed data.
    pub bad_channels: u64,
    /// Destinations refused by the policy, and other operations the address rules
    /// refuse (docs/SECURITY.md).
    pub denied: u64,
    /// Datagrams a socket on the host received from a source the sandbox may not talk
    /// to, dropped.
    pub dropped_arrivals: u64,
    /// Datagrams to published UDP ports forwarded into the sandbox, answers forwarded
    /// back out, and datagrams either way dropped (`udp_publish`).
    pub udp_published_in: u64,
    pub udp_published_out: u64,
    pub udp_published_dropped: u64,
    /// Connections to published TCP ports refused: nothing in the sandbox listened on
    /// the port through ferry, or too many waited.
    pub published_refused: u64,
    /// Control connections refused or closed before they became channels (not from the
    /// sandbox, no Hello in time, over a cap).
    pub channels_refused: u64,
    /// Times a channel's requests were left untaken because its completions backed up
    /// (the program does not read them): back-pressure.
    pub backpressure: u64,
    /// DNS queries relayed for the sandbox, and answers delivered.
    pub dns_queries: u64,
    /// DNS answers delivered.
    pub dns_answers: u64,
    /// DNS-over-TCP connections relayed.
    pub dns_tcp: u64,
    /// Datagrams the sandbox sent its nameserver addresses that are not queries
    /// (responses, runts), dropped.
    pub dns_dropped: u64,
    /// DNS queries in flight forgotten to make room (`dns::MAX_PENDING`).
    pub dns_evicted: u64,
    /// Datagrams on the upstream socket that answered nothing in flight, dropped.
    pub dns_stray: u64,
    /// DNS-over-TCP connections closed at once because `dns::MAX_TCP` were relayed.
    pub dns_tcp_refused: u64,
    /// Distinct data-path modules compiled.
    pub modules_loaded: u64,
    /// Module instances started on sockets.
    pub modules_started: u64,
    /// Module instances stopped by a failure (their sockets were reset).
    pub modules_failed: u64,
    /// Module bindings refused (bad binding or module, no capacity…).
    pub module_refused: u64,
    /// Bytes modules wrote to their sockets.
    pub module_bytes_out: u64,
    /// Time spent making module instances (fresh or spare, with their inputs),
    /// nanoseconds, summed.
    pub module_start_ns: u64,
    /// Time spent in modules' `init`, nanoseconds, summed.
    pub module_init_ns: u64,
    /// Time spent writing modules' output to their sockets (send, sendfile),
    /// nanoseconds, summed.
    pub module_write_ns: u64,
    /// Sockets still open when the server stopped although their program side was gone
    /// (should be 0: anything else is a leak).
    pub open_at_stop: u64,
    /// Channels seen (at most [`MAX_LISTED`] closed ones, then their sum as [`FOLDED`]).
    pub channels: Vec<ChannelStats>,
    /// Sockets seen (at most [`MAX_LISTED`] closed ones, then their sum as [`FOLDED`]).
    pub sockets: Vec<SocketStats>,
    /// Egress bonding: per source address (filled in by the caller, which owns the bond
    /// every server of the sandbox shares).
    pub egress: Vec<EgressStats>,
}

impl fmt::Display for ServerStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "server {}: requests {}, bytes out {} in {}, sockets created {} handed over {} taken over {}, turns {} (idle spins {}), sleeps {}, data syscalls {} (empty reads {}), denied {}, dropped arrivals {}, published datagrams in {} out {} dropped {}, published connections refused {}, refused channels {}, back-pressure {}, bad channels {}, left open {}, modules loaded {} started {} failed {} refused {} bytes out {}, DNS queries {} answers {} dropped {} evicted {} stray {}, DNS over TCP {} refused {}",
            self.id,
            self.requests,
            self.bytes_out,
            self.bytes_in,
            self.sockets_created,
            self.sockets_handed,
            self.sockets_adopted,
            self.turns,
            self.spin_turns,
            self.sleeps,
            self.data_syscalls,
            self.empty_reads,
            self.denied,
            self.dropped_arrivals,
            self.udp_published_in,
            self.udp_published_out,
            self.udp_published_dropped,
            self.published_refused,
            self.channels_refused,
            self.backpressure,
            self.bad_channels,
            self.open_at_stop,
            self.modules_loaded,
            self.modules_started,
            self.modules_failed,
            self.module_refused,
            self.module_bytes_out,
            self.dns_queries,
            self.dns_answers,
            self.dns_dropped,
            self.dns_evicted,
            self.dns_stray,
            self.dns_tcp,
            self.dns_tcp_refused
        )?;
        for c in &self.channels {
            if c.id == FOLDED {
                writeln!(
                    f,
                    "  channels closed after the first {MAX_LISTED}: requests {}, completions {} in {} batches, wakes sent {} avoided {}, doorbells {}, pair sleeps {}",
                    c.requests,
                    c.completions,
                    c.batches,
                    c.wakes_sent,
                    c.wakes_avoided,
                    c.doorbells,
                    c.pair_sleeps
                )?;
                continue;
            }
            writeln!(
                f,
                "  channel {} (pid {} tid {}): requests {}, completions {} in {} batches, wakes sent {} avoided {}, doorbells {}, pair sleeps {}",
                c.id,
                c.pid,
                c.tid,
                c.requests,
                c.completions,
                c.batches,
                c.wakes_sent,
                c.wakes_avoided,
                c.doorbells,
                c.pair_sleeps
            )?;
        }
        for s in &self.sockets {
            if s.id == FOLDED {
                writeln!(
                    f,
                    "  sockets closed after the first {MAX_LISTED}: calls {}, bytes out {}, bytes in {}, tokens {}, room waits {}",
                    s.calls, s.bytes_out, s.bytes_in, s.tokens, s.room_waits
                )?;
                continue;
            }
            writeln!(
                f,
                "  socket {}: calls {}, bytes out {}, bytes in {}, tokens {}, room waits {}",
                s.id, s.calls, s.bytes_out, s.bytes_in, s.tokens, s.room_waits
            )?;
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
                format!(
                    r#"{{"id":{},"pid":{},"tid":{},"requests":{},"completions":{},"batches":{},"wakes_sent":{},"wakes_avoided":{},"doorbells":{},"pair_sleeps":{}}}"#,
                    c.id, c.pid, c.tid, c.requests, c.completions, c.batches, c.wakes_sent, c.wakes_avoided, c.doorbells, c.pair_sleeps
                )
            })
            .collect();
        let socks: Vec<String> = self
            .sockets
            .iter()
            .map(|s| {
                format!(
                    r#"{{"id":{},"calls":{},"bytes_out":{},"bytes_in":{},"tokens":{},"room_waits":{}}}"#,
                    s.id, s.calls, s.bytes_out, s.bytes_in, s.tokens, s.room_waits
                )
            })
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
            r#"{{"server":"{}","requests":{},"bytes_out":{},"bytes_in":{},"sockets_created":{},"sockets_handed":{},"sockets_adopted":{},"turns":{},"spin_turns":{},"sleeps":{},"data_syscalls":{},"empty_reads":{},"bad_channels":{},"denied":{},"dropped_arrivals":{},"udp_published_in":{},"udp_published_out":{},"udp_published_dropped":{},"published_refused":{},"channels_refused":{},"backpressure":{},"open_at_stop":{},"dns_queries":{},"dns_answers":{},"dns_tcp":{},"dns_dropped":{},"dns_evicted":{},"dns_stray":{},"dns_tcp_refused":{},"modules_loaded":{},"modules_started":{},"modules_failed":{},"module_refused":{},"module_bytes_out":{},"module_start_ns":{},"module_init_ns":{},"module_write_ns":{},"channels":[{}],"sockets":[{}],"egress":[{}]}}"#,
            self.id,
            self.requests,
            self.bytes_out,
            self.bytes_in,
            self.sockets_created,
            self.sockets_handed,
            self.sockets_adopted,
            self.turns,
            self.spin_turns,
            self.sleeps,
            self.data_syscalls,
            self.empty_reads,
            self.bad_channels,
            self.denied,
            self.dropped_arrivals,
            self.udp_published_in,
            self.udp_published_out,
            self.udp_published_dropped,
            self.published_refused,
            self.channels_refused,
            self.backpressure,
            self.open_at_stop,
            self.dns_queries,
            self.dns_answers,
            self.dns_tcp,
            self.dns_dropped,
            self.dns_evicted,
            self.dns_stray,
            self.dns_tcp_refused,
            self.modules_loaded,
            self.modules_started,
            self.modules_failed,
            self.module_refused,
            self.module_bytes_out,
            self.module_start_ns,
            self.module_init_ns,
            self.module_write_ns,
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
        t.turns += s.turns;
        t.requests += s.requests;
        t.bytes_out += s.bytes_out;
        t.bytes_in += s.bytes_in;
        t.sockets_created += s.sockets_created;
        t.sockets_handed += s.sockets_handed;
        t.sockets_adopted += s.sockets_adopted;
        t.spin_turns += s.spin_turns;
        t.sleeps += s.sleeps;
        t.data_syscalls += s.data_syscalls;
        t.empty_reads += s.empty_reads;
        t.bad_channels += s.bad_channels;
        t.denied += s.denied;
        t.dropped_arrivals += s.dropped_arrivals;
        t.udp_published_in += s.udp_published_in;
        t.udp_published_out += s.udp_published_out;
        t.udp_published_dropped += s.udp_published_dropped;
        t.published_refused += s.published_refused;
        t.channels_refused += s.channels_refused;
        t.backpressure += s.backpressure;
        t.dns_queries += s.dns_queries;
        t.dns_answers += s.dns_answers;
        t.dns_tcp += s.dns_tcp;
        t.dns_dropped += s.dns_dropped;
        t.dns_evicted += s.dns_evicted;
        t.dns_stray += s.dns_stray;
        t.dns_tcp_refused += s.dns_tcp_refused;
        t.open_at_stop += s.open_at_stop;
        t.modules_loaded += s.modules_loaded;
        t.modules_started += s.modules_started;
        t.modules_failed += s.modules_failed;
        t.module_refused += s.module_refused;
        t.module_bytes_out += s.module_bytes_out;
        t.module_start_ns += s.module_start_ns;
        t.module_init_ns += s.module_init_ns;
        t.module_write_ns += s.module_write_ns;
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
