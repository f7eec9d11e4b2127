//! Parsers for what the clients print: iperf3 `-J`, sockperf ping-pong and throughput,
//! redis-benchmark `--csv`, wrk, ferry-burner, `ip -o link`, ferry's `--stats-json`, and
//! the machine's CPU time (`/proc/stat`).
//! Pure functions of text; each failure says what was missing.

use serde_json::Value;

/// Bits per second received (TCP) or sent (UDP) by an iperf3 run, from `iperf3 -J`.
pub fn iperf3_bps(json: &str) -> Result<f64, String> {
    let v: Value = serde_json::from_str(json.trim())
        .map_err(|e| format!("iperf3 output is not JSON ({e})"))?;
    if let Some(err) = v.get("error").and_then(Value::as_str) {
        return Err(format!("iperf3: {err}"));
    }
    let end = v.get("end").ok_or("iperf3 JSON has no `end`")?;
    let bps = end
        .pointer("/sum_received/bits_per_second")
        .or_else(|| end.pointer("/sum/bits_per_second"))
        .and_then(Value::as_f64)
        .ok_or("iperf3 JSON has no bits_per_second")?;
    if bps <= 0.0 {
        return Err("iperf3 moved no data".into());
    }
    Ok(bps)
}

/// What sockperf ping-pong reports (µs; round trips when run with `--full-rtt`).
#[derive(Clone, Debug, PartialEq)]
pub struct PingPong {
    /// Median latency.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Observations in the valid (measured) part of the run.
    pub observations: u64,
    /// Messages received over the whole run, warm-up included (what ferry's counters see).
    pub total_received: u64,
}

/// Parses `sockperf ping-pong` output.
pub fn sockperf_pp(out: &str) -> Result<PingPong, String> {
    let pct = |p: &str| {
        out.lines()
            .find_map(|l| l.split_once(&format!("percentile {p} =")).map(|x| x.1))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| format!("sockperf printed no {p} percentile"))
    };
    let observations = out
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("Total ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .ok_or("sockperf printed no observation count")?;
    let total_received = out
        .lines()
        .find(|l| l.contains("[Total Run]"))
        .and_then(|l| field(l, "ReceivedMessages="))
        .unwrap_or(observations);
    Ok(PingPong {
        p50: pct("50.000")?,
        p99: pct("99.000")?,
        observations,
        total_received,
    })
}

/// Parses `sockperf throughput` output: (messages per second, Mbit/s).
pub fn sockperf_tp(out: &str) -> Result<(f64, f64), String> {
    let rate = out
        .lines()
        .find_map(|l| l.split_once("Message Rate is ").map(|x| x.1))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .ok_or("sockperf printed no message rate")?;
    let mbps = out
        .lines()
        .find_map(|l| l.split_once("MBps (").map(|x| x.1))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .ok_or("sockperf printed no bandwidth")?;
    Ok((rate, mbps))
}

/// Every message rate in the output of several `sockperf throughput` runs.
pub fn sockperf_tp_all(out: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.split_once("Message Rate is ").map(|x| x.1))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Every median round trip in the output of several `sockperf ping-pong` runs.
pub fn sockperf_pp_all(out: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.split_once("percentile 50.000 =").map(|x| x.1))
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

fn field(line: &str, key: &str) -> Option<u64> {
    let (_, rest) = line.split_once(key)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Requests per second of `test` (e.g. "GET") in `redis-benchmark --csv` output.
pub fn redis_rps(out: &str, test: &str) -> Result<f64, String> {
    out.lines()
        .find_map(|l| {
            let mut cols = l.split(',').map(|c| c.trim().trim_matches('"'));
            (cols.next()? == test).then(|| cols.next()?.parse().ok())?
        })
        .ok_or_else(|| format!("redis-benchmark printed no {test} result"))
}

/// Requests per second from wrk's summary.
pub fn wrk_rps(out: &str) -> Result<f64, String> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|v: &f64| *v > 0.0)
        .ok_or_else(|| "wrk printed no Requests/sec".into())
}

/// MFlops from `ferry-burner` (`MFlops 1234.5`).
pub fn burner_mflops(out: &str) -> Result<f64, String> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("MFlops "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "ferry-burner printed no MFlops line".into())
}

/// The first non-loopback interface in `ip -o link show` output: (name, MTU).
pub fn link_mtu(out: &str) -> Option<(String, u32)> {
    out.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let _index = it.next()?;
        let name = it.next()?.trim_end_matches(':');
        let name = name.split('@').next()?.to_owned();
        if name == "lo" {
            return None;
        }
        let words: Vec<&str> = l.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "mtu")?;
        Some((name, words.get(at + 1)?.parse().ok()?))
    })
}

/// ferry's server counters, summed over channels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FerryStats {
    /// Server loop turns.
    pub turns: u64,
    /// Times the server slept.
    pub sleeps: u64,
    /// System calls on host sockets.
    pub data_syscalls: u64,
    /// Requests over all channels.
    pub requests: u64,
    /// Completions over all channels.
    pub completions: u64,
    /// Batches the server consumed.
    pub batches: u64,
    /// Wake-ups the server sent to sleeping sandbox threads.
    pub wakes_sent: u64,
    /// Wake-ups the server did not need to send (the thread was spinning).
    pub wakes_avoided: u64,
    /// Doorbells the sandbox rang to wake the server.
    pub doorbells: u64,
    /// Sleeps of the program's readers in the kernel on the pair receive path (each
    /// ended by a kernel wake-up).
    pub pair_sleeps: u64,
    /// Module instances started.
    pub modules_started: u64,
    /// Time spent making their instances, nanoseconds.
    pub module_start_ns: u64,
    /// Time spent in their `init`, nanoseconds.
    pub module_init_ns: u64,
    /// Time spent writing their output, nanoseconds.
    pub module_write_ns: u64,
    /// The NIC servers' counters (nic mode), summed over servers.
    pub nic: Option<NicCounters>,
}

/// The NIC servers' counters (`"nic":[…]` of `--stats-json`), summed over servers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// NIC servers that reported.
    pub servers: u64,
    /// Frames read from the TAP and written to it.
    pub frames_in: u64,
    pub frames_out: u64,
    /// Frames to the sandbox dropped on a full TAP queue.
    pub tap_full: u64,
    /// Loop turns and sleeps in epoll.
    pub turns: u64,
    pub sleeps: u64,
    /// Per-stage timing (`ferry run --nic-timing`) by stage name: calls, hits,
    /// nanoseconds. Empty when timing was off.
    pub stages: Vec<(String, StageCount)>,
}

/// One stage's totals from a NIC server's timing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageCount {
    /// Times the stage ran.
    pub calls: u64,
    /// Times it moved something.
    pub hits: u64,
    /// Nanoseconds in it.
    pub ns: u64,
}

impl NicCounters {
    /// A stage's totals (zero when absent).
    pub fn stage(&self, name: &str) -> StageCount {
        self.stages
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| *c)
            .unwrap_or_default()
    }
}

fn nic_counters(v: &Value) -> Option<NicCounters> {
    let servers = v.get("nic")?.as_array()?;
    let mut out = NicCounters::default();
    for s in servers {
        let c = |k: &str| s.get(k).and_then(Value::as_u64).unwrap_or(0);
        out.servers += 1;
        out.frames_in += c("frames_in");
        out.frames_out += c("frames_out");
        out.tap_full += c("tap_full");
        out.turns += c("turns");
        out.sleeps += c("sleeps");
        let Some(timing) = s.get("timing").and_then(Value::as_object) else {
            continue;
        };
        for (name, t) in timing {
            let f = |k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0);
            let at = match out.stages.iter().position(|(n, _)| n == name) {
                Some(i) => i,
                None => {
                    out.stages.push((name.clone(), StageCount::default()));
                    out.stages.len() - 1
                }
            };
            let st = &mut out.stages[at].1;
            st.calls += f("calls");
            st.hits += f("hits");
            st.ns += f("ns");
        }
    }
    Some(out)
}

impl FerryStats {
    /// Crossings that cost a wake-up: the server waking the program, the program
    /// ringing the server's doorbell, and (pair receive path) a reader the kernel woke.
    pub fn wakes(&self) -> u64 {
        self.wakes_sent + self.doorbells + self.pair_sleeps
    }
}

/// The NIC servers' counters of `ferry vm --stats-json` output (no channels there).
pub fn nic_stats(json: &str) -> Result<NicCounters, String> {
    let v: Value =
        serde_json::from_str(json.trim()).map_err(|e| format!("ferry stats are not JSON ({e})"))?;
    nic_counters(&v).ok_or_else(|| "ferry stats have no NIC servers".into())
}

/// Parses `ferry run --stats-json` output.
pub fn ferry_stats(json: &str) -> Result<FerryStats, String> {
    let v: Value =
        serde_json::from_str(json.trim()).map_err(|e| format!("ferry stats are not JSON ({e})"))?;
    let top = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut s = FerryStats {
        turns: top("turns"),
        sleeps: top("sleeps"),
        data_syscalls: top("data_syscalls"),
        modules_started: top("modules_started"),
        module_start_ns: top("module_start_ns"),
        module_init_ns: top("module_init_ns"),
        module_write_ns: top("module_write_ns"),
        nic: nic_counters(&v),
        ..FerryStats::default()
    };
    for ch in v
        .get("channels")
        .and_then(Value::as_array)
        .ok_or("ferry stats have no channels")?
    {
        let c = |k: &str| ch.get(k).and_then(Value::as_u64).unwrap_or(0);
        s.requests += c("requests");
        s.completions += c("completions");
        s.batches += c("batches");
        s.wakes_sent += c("wakes_sent");
        s.wakes_avoided += c("wakes_avoided");
        s.doorbells += c("doorbells");
        s.pair_sleeps += c("pair_sleeps");
    }
    Ok(s)
}

/// E6's serving program's output: the requester's `STATS p50 p99 MB/s mean` line and,
/// for the module way, `BIND p50`.
pub fn e6(out: &str) -> Result<(f64, f64, f64, Option<f64>), String> {
    let nums = |tag: &str| -> Option<Vec<f64>> {
        let l = out.lines().find(|l| l.starts_with(tag))?;
        Some(
            l.split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect(),
        )
    };
    let s = nums("STATS").ok_or("no STATS line from ferry-e6")?;
    let [p50, p99, mbps, _mean] = s[..] else {
        return Err(format!("bad STATS line in {out:?}"));
    };
    Ok((
        p50,
        p99,
        mbps,
        nums("BIND").and_then(|b| b.first().copied()),
    ))
}

/// The machine's busy CPU time so far, in clock ticks, from `/proc/stat`'s `cpu` line:
/// user, nice, system, irq and softirq of every CPU. Idle and iowait are not work, and
/// steal is time another guest had the CPU.
pub fn proc_stat_busy(stat: &str) -> Result<u64, String> {
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some("cpu"))
        .ok_or("/proc/stat has no `cpu` line")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| {
            v.parse()
                .map_err(|_| format!("/proc/stat: bad number {v:?}"))
        })
        .collect::<Result<_, _>>()?;
    if f.len() < 7 {
        return Err(format!(
            "/proc/stat's cpu line has {} fields, not 7",
            f.len()
        ));
    }
    // user nice system idle iowait irq softirq [steal …]
    Ok(f[0] + f[1] + f[2] + f[5] + f[6])
}

/// A thread's time on a CPU in nanoseconds, from its `/proc/<pid>/task/<tid>/schedstat`
/// (`run_ns wait_ns timeslices`).
pub fn schedstat_run_ns(schedstat: &str) -> Result<u64, String> {
    let v = schedstat
        .split_whitespace()
        .next()
        .ok_or("schedstat is empty")?;
    v.parse()
        .map_err(|_| format!("schedstat: bad number {v:?}"))
}

/// The CPU time of a process's reaped children in clock ticks, from its
/// `/proc/<pid>/stat` (`cutime` + `cstime`, the 16th and 17th fields; the command name,
/// the 2nd, is in parentheses and may hold spaces).
pub fn stat_children_ticks(stat: &str) -> Result<u64, String> {
    let (_, rest) = stat.rsplit_once(')').ok_or("stat has no command name")?;
    // rest starts at the 3rd field (state): cutime is the 14th of rest.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> Result<u64, String> {
        let v = fields.get(i).ok_or("stat is short")?;
        v.parse().map_err(|_| format!("stat: bad number {v:?}"))
    };
    Ok(tick(13)? + tick(14)?)
}

/// System calls by command name from `perf report --stdio --sort comm -F sample,comm`
/// (one `COUNT COMM` line each). Fails when perf says it lost samples: the counts
/// would be short.
pub fn perf_comm_counts(report: &str) -> Result<Vec<(String, u64)>, String> {
    let lost = report
        .lines()
        .find_map(|l| l.strip_prefix("# Total Lost Samples:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if lost > 0 {
        return Err(format!(
            "perf lost {lost} samples: the counts would be short"
        ));
    }
    let mut out = Vec::new();
    for l in report.lines() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let (n, comm) = l
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("perf report: unexpected line {l:?}"))?;
        let n = n
            .parse()
            .map_err(|_| format!("perf report: bad count in {l:?}"))?;
        out.push((comm.trim().to_owned(), n));
    }
    Ok(out)
}

/// The phases of a short connection, as `ferry-shortconn client` names them in its
/// `phases-us` line, with the name each has in R2's rows.
pub const SHORTCONN_PHASES: [(&str, &str); 5] = [
    ("socket", "socket()"),
    ("connect", "connect()"),
    ("exchange", "1st exchange"),
    ("end", "end of stream"),
    ("close", "close()"),
];

/// The mean time of each phase of a connection (µs), in the order of
/// [`SHORTCONN_PHASES`], from `ferry-shortconn client`'s `phases-us socket A connect B
/// exchange C end D close E` line.
pub fn shortconn_phases(out: &str) -> Result<[f64; 5], String> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("phases-us "))
        .ok_or("ferry-shortconn printed no `phases-us` line")?;
    let w: Vec<&str> = line.split_whitespace().skip(1).collect();
    let mut v = [0.0; 5];
    if w.len() != 2 * v.len() {
        return Err(format!("unexpected line {line:?}"));
    }
    for (i, (name, _)) in SHORTCONN_PHASES.iter().enumerate() {
        if w[2 * i] != *name {
            return Err(format!("expected {name} in {line:?}"));
        }
        v[i] = w[2 * i + 1]
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("bad {name} time in {line:?}"))?;
    }
    Ok(v)
}

/// Connections completed and seconds spent, from `ferry-shortconn client`'s last line
/// (`connections N seconds S`).
pub fn shortconn(out: &str) -> Result<(u64, f64), String> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("connections "))
        .ok_or("ferry-shortconn printed no `connections` line")?;
    let w: Vec<&str> = line.split_whitespace().collect();
    match w.as_slice() {
        ["connections", n, "seconds", s] => {
            let n: u64 = n.parse().map_err(|_| format!("bad count in {line:?}"))?;
            let s: f64 = s.parse().map_err(|_| format!("bad seconds in {line:?}"))?;
            if n == 0 || s <= 0.0 {
                return Err(format!("no connection completed: {line:?}"));
            }
            Ok((n, s))
        }
        _ => Err(format!("unexpected line {line:?}")),
    }
}

/// pgbench's transactions and rate: `number of transactions actually processed: N`
/// and `tps = X (without initial connection time)`.
pub fn pgbench(out: &str) -> Result<(u64, f64), String> {
    let value = |prefix: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().next())
    };
    let n: u64 = value("number of transactions actually processed:")
        .and_then(|v| v.split('/').next()?.parse().ok())
        .filter(|n| *n > 0)
        .ok_or("pgbench printed no transactions processed")?;
    let tps: f64 = value("tps =")
        .and_then(|v| v.parse().ok())
        .ok_or("pgbench printed no `tps =` line")?;
    Ok((n, tps))
}

/// Requests wrk completed (`N requests in …`).
pub fn wrk_requests(out: &str) -> Result<u64, String> {
    out.lines()
        .find_map(|l| {
            let (n, rest) = l.trim().split_once(' ')?;
            rest.starts_with("requests in ").then(|| n.parse().ok())?
        })
        .filter(|n| *n > 0)
        .ok_or_else(|| "wrk printed no `N requests in` line".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_ticks_from_stat() {
        let stat = "4242 (postgres: a b) S 1 4242 4242 0 -1 4194560 900 77 0 0 12 5 30 8 20 0 1 0";
        assert_eq!(stat_children_ticks(stat), Ok(38));
        assert!(stat_children_ticks("4242 (x) S 1").is_err());
    }

    #[test]
    fn pgbench_transactions_and_rate() {
        let out = "transaction type: <builtin: select only>\n\
                   number of transactions actually processed: 117899\n\
                   latency average = 0.101 ms\n\
                   initial connection time = 4.512 ms\n\
                   tps = 39456.427051 (without initial connection time)\n";
        assert_eq!(pgbench(out), Ok((117_899, 39_456.427051)));
        // With -t, pgbench prints processed/planned.
        let out = "number of transactions actually processed: 500/1000\ntps = 10.5 (x)\n";
        assert_eq!(pgbench(out), Ok((500, 10.5)));
        assert!(pgbench("number of transactions actually processed: 0\ntps = 0\n").is_err());
        assert!(pgbench("connection to server failed\n").is_err());
    }

    const SOCKPERF: &str = "sockperf: [Total Run] RunTime=2.001 sec; Warm up time=400 msec; SentMessages=51727; ReceivedMessages=51726
sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=47437; ReceivedMessages=47437
sockperf: \x1b[2;35m====> avg-rtt=16.312 (std-dev=98.482)\x1b[0m
sockperf: \x1b[2;35mTotal 47437 observations\x1b[0m; each percentile contains 474.37 observations
sockperf: ---> percentile 99.000 =   37.184
sockperf: ---> percentile 90.000 =   12.653
sockperf: ---> percentile 50.000 =   10.609
";

    #[test]
    fn sockperf_ping_pong() {
        let p = sockperf_pp(SOCKPERF).unwrap();
        assert_eq!(p.p50, 10.609);
        assert_eq!(p.p99, 37.184);
        assert_eq!(p.observations, 47437);
        assert_eq!(p.total_received, 51726);
        assert!(sockperf_pp("sockperf: error").is_err());
    }

    #[test]
    fn sockperf_throughput() {
        let out = "sockperf: Summary: Message Rate is 46235 [msg/sec]\n\
                   sockperf: Summary: BandWidth is 45.151 MBps (361.211 Mbps)\n";
        assert_eq!(sockperf_tp(out).unwrap(), (46235.0, 361.211));
    }

    #[test]
    fn iperf3() {
        let tcp = r#"{"end":{"sum_sent":{"bits_per_second":2.0},"sum_received":{"bits_per_second":1.5e9}}}"#;
        assert_eq!(iperf3_bps(tcp).unwrap(), 1.5e9);
        let udp = r#"{"end":{"sum":{"bits_per_second":8.0e7,"lost_percent":0}}}"#;
        assert_eq!(iperf3_bps(udp).unwrap(), 8.0e7);
        let bad = r#"{"end":{},"error":"unable to connect to server"}"#;
        assert!(iperf3_bps(bad).unwrap_err().contains("unable to connect"));
        assert!(iperf3_bps("iperf3: error").is_err());
    }

    #[test]
    fn redis_and_wrk_and_burner() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SET\",\"344827.59\",\"1.9\"\n\"GET\",\"416666.66\",\"1.4\"\n";
        assert_eq!(redis_rps(csv, "GET").unwrap(), 416666.66);
        assert_eq!(redis_rps(csv, "SET").unwrap(), 344827.59);
        assert!(redis_rps(csv, "LPUSH").is_err());
        let wrk =
            "  2 threads and 16 connections\nRequests/sec:  12345.67\nTransfer/sec:      1.23MB\n";
        assert_eq!(wrk_rps(wrk).unwrap(), 12345.67);
        assert_eq!(burner_mflops("seconds 2\nMFlops 1234.5\n").unwrap(), 1234.5);
    }

    #[test]
    fn mtu_of_first_real_link() {
        let out = "1: lo: <LOOPBACK,UP> mtu 65536 qdisc noqueue\n\
                   2: tap0: <BROADCAST,UP,LOWER_UP> mtu 65520 qdisc pfifo_fast\n";
        assert_eq!(link_mtu(out), Some(("tap0".into(), 65520)));
        assert_eq!(
            link_mtu("5: eth0@if6: <UP> mtu 1500 qdisc x"),
            Some(("eth0".into(), 1500))
        );
        assert_eq!(link_mtu("1: lo: <LOOPBACK> mtu 65536"), None);
    }

    #[test]
    fn ferry_counters_sum_channels() {
        let j = r#"{"server":"proto-0","turns":10,"sleeps":2,"data_syscalls":7,"channels":[
            {"id":0,"requests":5,"completions":5,"batches":3,"wakes_sent":1,"wakes_avoided":2,"doorbells":4},
            {"id":1,"requests":1,"completions":1,"batches":1,"wakes_sent":0,"wakes_avoided":0,"doorbells":1}],
            "sockets":[]}"#;
        let s = ferry_stats(j).unwrap();
        assert_eq!(s.requests, 6);
        assert_eq!(s.wakes(), 6);
        assert_eq!(s.data_syscalls, 7);
        assert_eq!(s.nic, None);
    }

    #[test]
    fn nic_counters_sum_servers_and_stages() {
        let j = r#"{"turns":1,"channels":[],"nic":[
            {"id":"nic-0","frames_in":10,"frames_out":8,"sleeps":2,"timing":{
                "tap_read":{"calls":10,"hits":10,"ns":5000},"wake":{"calls":1,"hits":1,"ns":700}}},
            {"id":"nic-1","frames_in":4,"frames_out":4,"sleeps":1,"timing":{
                "tap_read":{"calls":4,"hits":4,"ns":1000}}}]}"#;
        let n = ferry_stats(j).unwrap().nic.unwrap();
        assert_eq!(
            (n.servers, n.frames_in, n.frames_out, n.sleeps),
            (2, 14, 12, 3)
        );
        assert_eq!(
            n.stage("tap_read"),
            StageCount {
                calls: 14,
                hits: 14,
                ns: 6000
            }
        );
        assert_eq!(n.stage("wake").ns, 700);
        assert_eq!(n.stage("egress"), StageCount::default());
        assert_eq!(n.stages[0].0, "tap_read");
    }

    #[test]
    fn proc_stat_busy_counts_work_not_idle_or_steal() {
        let stat = "cpu  100 2 30 5000 7 1 4 900 0 0\ncpu0 50 1 15 2500 3 0 2 450 0 0\n";
        assert_eq!(proc_stat_busy(stat), Ok(137));
        assert!(proc_stat_busy("intr 1 2 3\n").is_err());
        assert!(proc_stat_busy("cpu 1 2 x 4 5 6 7\n").is_err());
        assert!(proc_stat_busy("cpu 1 2 3\n").is_err());
    }

    #[test]
    fn schedstat_is_run_time_first() {
        assert_eq!(schedstat_run_ns("130594 765744 2\n"), Ok(130_594));
        assert!(schedstat_run_ns("").is_err());
        assert!(schedstat_run_ns("x 1 2").is_err());
    }

    #[test]
    fn perf_counts_by_command() {
        let r = "# Total Lost Samples: 0\n#\n# Samples: 365  of event 'raw_syscalls:sys_enter'\n\
                 #\n#      Samples  Command\n# ............  .......\n#\n\
                 \x20          118  cat    \n           147  ferry-servers\n\n#\n";
        assert_eq!(
            perf_comm_counts(r),
            Ok(vec![("cat".into(), 118), ("ferry-servers".into(), 147)])
        );
        let lost = "# Total Lost Samples: 12\n           118  cat\n";
        assert!(perf_comm_counts(lost).unwrap_err().contains("lost 12"));
        assert!(perf_comm_counts("  x cat\n").is_err());
    }

    #[test]
    fn shortconn_and_wrk_counts() {
        assert_eq!(
            shortconn("warming\nconnections 11767 seconds 1.000061\n"),
            Ok((11767, 1.000061))
        );
        assert!(shortconn("connections 0 seconds 1.0\n").is_err());
        assert!(shortconn("ferry-shortconn client: connect: refused\n").is_err());
        let out = "connections 10 seconds 1.0\n\
                   phases-us socket 5.63 connect 33.54 exchange 36.42 end 13.68 close 23.93\n";
        assert_eq!(
            shortconn_phases(out),
            Ok([5.63, 33.54, 36.42, 13.68, 23.93])
        );
        assert!(shortconn_phases("connections 10 seconds 1.0\n").is_err());
        assert!(shortconn_phases("phases-us socket 1 connect 2 exchange 3 end 4\n").is_err());
        assert!(
            shortconn_phases("phases-us socket 1 connect x exchange 3 end 4 close 5\n").is_err()
        );
        assert!(
            shortconn_phases("phases-us close 1 connect 2 exchange 3 end 4 socket 5\n").is_err()
        );
        let wrk = "Running 3s test @ http://10.0.0.2/index.html\n  1 threads and 4 connections\n\
                   \x20 24853 requests in 3.00s, 29.80MB read\nRequests/sec:   8284.21\n";
        assert_eq!(wrk_requests(wrk), Ok(24853));
        assert!(wrk_requests("Requests/sec: 1\n").is_err());
    }
}
