//! A server's live counters as `ferry ctl stats` shows them: one [`LiveStats`] row per
//! server, protocol servers (`proto-K`) and NIC servers (`nic-K`) alike, answered on the
//! run's admin socket.

/// One server's row of `ferry ctl stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveStats {
    /// `proto-K` or `nic-K`.
    pub id: String,
    /// CPU it last ran on (-1 unknown).
    pub cpu: i32,
    /// CPU it is pinned to (-1 none).
    pub pinned: i32,
    /// Open sockets (a NIC server: open flows).
    pub sockets: u64,
    /// Open channels (a NIC server: 0).
    pub channels: u64,
    /// Requests handled (a NIC server: frames from the sandbox).
    pub requests: u64,
    /// Parked operations and queued sends at the last refresh.
    pub outstanding: u64,
    /// Bytes out.
    pub bytes_out: u64,
    /// Bytes in.
    pub bytes_in: u64,
    /// Times the loop slept.
    pub sleeps: u64,
}
