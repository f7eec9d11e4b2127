//! The row of live counters every kind of server reports to `ferry ctl stats` (the
//! protocol servers' `Control::snapshot`, the NIC servers' `NicLive::snapshot`), and its
//! table and JSON.

use crate::Counters;

crate::counters! {
    /// One line of `ferry ctl stats`: a running server's live counters.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct LiveStats {
        /// `proto-K`, `nic-K`.
        pub id: String,
        /// CPU it last ran on (-1 unknown).
        pub cpu: i32,
        /// CPU it is pinned to (-1 none).
        pub pinned: i32,
    }
    counters {
        /// Open sockets (a NIC server's: open flows).
        sockets: "sockets",
        /// Open channels.
        channels: "channels",
        /// Requests handled (a NIC server's: frames from the sandbox).
        requests: "requests",
        /// Parked operations and queued sends at the last refresh.
        outstanding: "outstanding",
        /// Bytes out.
        bytes_out: "bytes out",
        /// Bytes in.
        bytes_in: "bytes in",
        /// Times the loop slept.
        sleeps: "sleeps",
    }
}

impl LiveStats {
    /// The row as one JSON object (`ferry ctl stats --json`).
    pub fn to_json(&self) -> String {
        format!(
            r#"{{"server":"{}","cpu":{},"pinned":{},{}}}"#,
            self.id,
            self.cpu,
            self.pinned,
            self.json_fields()
        )
    }
}

/// Rows of live counters as a JSON array (`ferry ctl stats --json`).
pub fn live_json(live: &[LiveStats]) -> String {
    let each: Vec<String> = live.iter().map(LiveStats::to_json).collect();
    format!("[{}]", each.join(","))
}

/// Narrowest counter column of [`live_table`].
const COLUMN: usize = 11;

/// Rows of live counters as a table: the server, its CPU and pin, then a column per
/// counter headed by its name (`ferry ctl stats`).
pub fn live_table(live: &[LiveStats]) -> String {
    let width = |name: &str| name.len().max(COLUMN);
    let mut out = String::from("server   cpu pinned");
    for name in LiveStats::COUNTERS {
        out += &format!(" {name:>w$}", w = width(name));
    }
    out.push('\n');
    for l in live {
        let pinned = if l.pinned < 0 {
            "-".to_string()
        } else {
            l.pinned.to_string()
        };
        out += &format!("{:<8} {:>3} {:>6}", l.id, l.cpu, pinned);
        for c in l.counters() {
            out += &format!(" {:>w$}", c.value, w = width(c.name));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_live_counter_is_summed_and_shown() {
        crate::check::<LiveStats>(LiveStats::COUNTERS, |l| {
            (live_json(std::slice::from_ref(l)), l.text_fields())
        });
    }

    /// `ferry ctl stats`' table: the server, CPU, pin, then a column per counter (the
    /// CLI tests read the sockets column, the fourth); its JSON keeps the keys and
    /// order it always had.
    #[test]
    fn table_has_a_column_per_counter_and_json_its_keys() {
        let row = LiveStats {
            id: "proto-0".into(),
            cpu: 1,
            pinned: -1,
            sockets: 5,
            bytes_out: 1 << 40,
            ..LiveStats::default()
        };
        let t = live_table(&[row]);
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0][..4], ["server", "cpu", "pinned", "sockets"], "{t}");
        assert_eq!(lines[0].len(), 3 + LiveStats::COUNTERS.len(), "{t}");
        assert_eq!(lines[1][..4], ["proto-0", "1", "-", "5"], "{t}");
        assert_eq!(lines[1][7], "1099511627776", "{t}");
        let j = live_json(&[LiveStats::default()]);
        assert_eq!(
            j,
            r#"[{"server":"","cpu":0,"pinned":0,"sockets":0,"channels":0,"requests":0,"outstanding":0,"bytes_out":0,"bytes_in":0,"sleeps":0}]"#
        );
    }
}
