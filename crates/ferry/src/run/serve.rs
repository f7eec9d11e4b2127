//! `ferry run` while the program runs and after: the server threads, `ferry ctl`, the
//! drain once the program has ended, the counters.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use ferry_nic::NicStats;
use ferry_server::{Bond, ServerStats, Servers};
use tracing::warn;

use super::{RunArgs, RunError};

/// Serves `ferry ctl` on the admin socket (the servers' live counters, CPU moves).
pub(super) fn serve_admin(
    admin: std::os::unix::net::UnixListener,
    servers: &Servers,
    nics: &[ferry_nic::NicServer],
    sandbox_init: i32,
) {
    let nics = nics
        .iter()
        .map(|n| (n.id().to_string(), n.live()))
        .collect();
    if let Err(e) = crate::ctl::serve(admin, servers.control(), nics, sandbox_init) {
        warn!("`ferry ctl` is off for this run: {e}");
    }
}

/// The server threads while the program runs.
pub(super) struct Serving {
    stop: ferry_server::Handle,
    servers: std::thread::JoinHandle<std::io::Result<Vec<ServerStats>>>,
    nics: Vec<(ferry_nic::StopHandle, std::thread::JoinHandle<NicStats>)>,
    /// One message from each thread as it ends ([`Ended`]).
    ended: Receiver<()>,
}

/// Says on its channel that the thread holding it has ended (returned or panicked), so
/// that [`Serving::drain`] waits for exactly that, not a poll.
struct Ended(Sender<()>);

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

impl Serving {
    /// Starts the protocol servers' thread and a thread per NIC server.
    pub(super) fn start(
        servers: Servers,
        nics: Vec<ferry_nic::NicServer>,
    ) -> Result<Serving, RunError> {
        let thread = |what| move |source| RunError::Thread { what, source };
        let (tx, ended) = channel();
        let stop = servers.stop_handle();
        let done = Ended(tx.clone());
        let server_thread = std::thread::Builder::new()
            .name("ferry-servers".into())
            .spawn(move || {
                let _done = done;
                servers.run()
            })
            .map_err(thread("protocol servers"))?;
        let mut nic_threads = Vec::new();
        for nic in nics {
            let stop = nic.stop_handle();
            let done = Ended(tx.clone());
            let t = std::thread::Builder::new()
                .name("ferry-nic".into())
                .spawn(move || {
                    let _done = done;
                    nic.run()
                })
                .map_err(thread("NIC servers"))?;
            nic_threads.push((stop, t));
        }
        Ok(Serving {
            stop,
            servers: server_thread,
            nics: nic_threads,
            ended,
        })
    }

    /// The program has ended: stops the servers (a NIC server first sends what the
    /// program wrote) and takes their counters. `None` when they did not finish within
    /// [`STOP_GRACE`](crate::stop::STOP_GRACE): ferry exits without them.
    pub(super) fn drain(self) -> Result<Option<Drained>, RunError> {
        self.stop.stop();
        for (stop, _) in &self.nics {
            stop.drain();
        }
        let threads = 1 + self.nics.len();
        let stopped = crate::stop::finished_within(crate::stop::STOP_GRACE, &self.ended, threads);
        if !stopped {
            return Ok(None);
        }
        let mut nic_stats = Vec::new();
        for (_, t) in self.nics {
            let stats = t
                .join()
                .map_err(|_| RunError::Drain("a NIC server panicked".into()))?;
            nic_stats.push(stats);
        }
        let stats = self
            .servers
            .join()
            .map_err(|_| RunError::Drain("the protocol servers panicked".into()))?
            .map_err(|e| RunError::Drain(e.to_string()))?;
        Ok(Some(Drained {
            servers: stats,
            nics: nic_stats,
        }))
    }
}

/// The counters of the servers that stopped.
pub(super) struct Drained {
    servers: Vec<ServerStats>,
    nics: Vec<NicStats>,
}

/// `--stats` (text on stderr) and `--stats-json FILE`.
pub(super) fn report(a: &RunArgs, drained: &Drained, bond: Option<Arc<Bond>>) {
    let (stats, nic_stats) = (&drained.servers[..], &drained.nics[..]);
    // Every server is gone, so every connection has ended and added its bytes to the
    // bond, which all servers share: its counters are reported once.
    let egress = bond.map(|b| b.stats()).unwrap_or_default();
    if a.stats {
        for s in stats {
            eprint!("{s}");
        }
        let bonded = ServerStats {
            id: "egress".into(),
            egress: egress.clone(),
            ..Default::default()
        };
        if !egress.is_empty() {
            eprint!("{bonded}");
        }
        for s in nic_stats {
            eprint!("{s}");
        }
    }
    let json = ferry_server::group_json(stats, &egress);
    let json = match json.strip_suffix('}') {
        Some(head) if !nic_stats.is_empty() => {
            format!("{head},\"nic\":{}}}", ferry_nic::nic_json(nic_stats))
        }
        _ => json,
    };
    if let Some(path) = &a.stats_json
        && let Err(e) = std::fs::write(path, json + "\n")
    {
        eprintln!("ferry: cannot write {}: {e}", path.display());
    }
}
