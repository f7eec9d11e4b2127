//! `ferry-vhost` owns VM guests' network device: a vhost-user-net backend whose frames
//! ferry's NIC servers serve exactly as they serve a sandbox's TAP (the same admission,
//! `-p` publishing, counters). A frontend (QEMU `-netdev vhost-user`, or any other that
//! speaks the protocol) shares the guest's memory and its virtio rings; the protocol
//! itself (the memory table, ring addresses, kick and call eventfds) is the rust-vmm
//! crates' (`vhost`, `vhost-user-backend`); the rings' contents are read and written here.
//!
//! ```text
//!   guest virtio-net ── virtqueues in guest memory (shared memfd) ── QEMU
//!        │ kick eventfds                                   │ vhost-user socket
//!   worker thread: Backend::handle_event ─ wakes ─▶ VirtioPair (one per queue pair)
//!                                                   = the FrameDevice of NIC server nic-K
//! ```
//!
//! It owns: [`Backend`] (what the device offers, the protocol's callbacks: a kick only
//! wakes the queue pair's NIC server), [`VirtioPair`] (a queue pair as a
//! [`FrameDevice`](ferry_nic::device::FrameDevice): the guest's transmit ring read into
//! batches of frames, frames written into its receive ring, merged buffers, event-idx
//! notification suppression, a bounded backlog while the guest has posted no buffers),
//! [`Counters`] (what a hostile or slow guest was refused), steering each frame to its
//! flow's NIC server whatever queue carried it (`steer.rs`), the relay in front of the
//! daemon (`relay.rs`: QEMU's early ring enable), and [`serve`] (one frontend
//! connection, served until it ends). It must not: trust any descriptor, length or
//! address the guest or frontend passes (every access goes through the memory table's
//! bounds; a bad chain is completed empty and counted, never a panic or a stall), or
//! know about policy (that is the NIC servers').

mod backend;
mod csum;
#[doc(hidden)]
pub mod fuzzing;
mod pair;
mod relay;
mod steer;

use std::path::Path;
use std::sync::Arc;

pub use backend::{Backend, Counters, CountersSnapshot};
pub use pair::VirtioPair;

/// Why the backend could not serve.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The vhost-user daemon could not be made or could not listen.
    #[error("vhost-user: {0}")]
    Daemon(String),
    /// An eventfd could not be made.
    #[error("cannot make an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    /// The caller's step once the socket listened failed (confining the process, say).
    #[error("{0}")]
    Ready(String),
}

/// Ends [`serve`] from another thread (a signal's): before a frontend has connected,
/// the wait for one ends (the socket file removed); while one is served, its connection
/// is shut down, as if the frontend had gone. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Stop {
    state: Arc<std::sync::Mutex<StopState>>,
}

#[derive(Debug, Default)]
struct StopState {
    stopped: bool,
    /// The socket [`serve`] waits on for a frontend.
    listening: Option<std::path::PathBuf>,
    /// The frontend's connection while it is served.
    front: Option<std::os::unix::net::UnixStream>,
}

impl Stop {
    fn state(&self) -> std::sync::MutexGuard<'_, StopState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends [`serve`] (see the type's header); idempotent.
    pub fn stop(&self) {
        let mut st = self.state();
        st.stopped = true;
        if let Some(path) = &st.listening {
            // Wakes the accept, which then finds `stopped`.
            let _ = std::os::unix::net::UnixStream::connect(path);
        }
        if let Some(front) = &st.front {
            let _ = front.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Whether [`Stop::stop`] was called.
    pub fn stopped(&self) -> bool {
        self.state().stopped
    }

    /// The socket file [`serve`] is waiting on, if it is.
    pub fn listening(&self) -> Option<std::path::PathBuf> {
        self.state().listening.clone()
    }
}

/// Listens on `socket` (a unix socket path; an existing socket file there is replaced),
/// serves one frontend connection until it ends (the VM exits, or its socket breaks) or
/// `stop` ends it, then tells every queue pair's NIC server that the device is gone. The
/// socket file is removed once a frontend has connected, or when stopped before. The
/// connection is relayed to the daemon through a private socket (`relay.rs` says why).
/// `ready` is called once the socket listens and the backend's own set-up is done (what
/// follows is serving the frontend: the caller confines the process there); a frontend
/// that connects from then on is taken (before, it could find the file and be refused).
pub fn serve(
    backend: &Backend,
    socket: &Path,
    stop: &Stop,
    ready: impl FnOnce() -> Result<(), String>,
) -> Result<(), Error> {
    let result = serve_one(backend, socket, stop, ready);
    backend.disconnect();
    result
}

/// Listens on `socket` (an existing socket file there is replaced) for one frontend's
/// connection (`None`: `stop` ended the wait); the socket file is removed either way,
/// and `stop` shuts the connection down from then on. `ready` is called once the socket
/// listens (the file exists a moment before: a frontend told of the socket only then is
/// never refused); its error ends the wait. [`serve`]'s first step, and `ferry vm
/// --stream`'s (QEMU's stream netdev connects the same way).
pub fn accept_frontend(
    socket: &Path,
    stop: &Stop,
    ready: impl FnOnce() -> Result<(), String>,
) -> Result<Option<std::os::unix::net::UnixStream>, Error> {
    use std::os::unix::net::UnixListener;
    if let Ok(meta) = std::fs::symlink_metadata(socket)
        && std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type())
    {
        let _ = std::fs::remove_file(socket);
    }
    let listener = UnixListener::bind(socket)
        .map_err(|e| Error::Daemon(format!("cannot listen on {}: {e}", socket.display())))?;
    {
        let mut st = stop.state();
        if st.stopped {
            drop(listener);
            let _ = std::fs::remove_file(socket);
            return Ok(None);
        }
        st.listening = Some(socket.to_path_buf());
    }
    if let Err(e) = ready() {
        stop.state().listening = None;
        drop(listener);
        let _ = std::fs::remove_file(socket);
        return Err(Error::Ready(e));
    }
    let accepted = listener.accept();
    let mut st = stop.state();
    st.listening = None;
    drop(listener);
    let _ = std::fs::remove_file(socket);
    let (front, _) = accepted.map_err(|e| Error::Daemon(e.to_string()))?;
    if st.stopped {
        return Ok(None);
    }
    st.front = front.try_clone().ok();
    Ok(Some(front))
}

/// [`serve`]'s steps: the frontend → the daemon on a private socket → the relay.
fn serve_one(
    backend: &Backend,
    socket: &Path,
    stop: &Stop,
    ready: impl FnOnce() -> Result<(), String>,
) -> Result<(), Error> {
    use std::os::unix::net::{UnixListener, UnixStream};
    use vhost_user_backend::VhostUserDaemon;
    let daemon_err = |e: &dyn std::fmt::Display| Error::Daemon(e.to_string());
    // The daemon's side, on a path of its own only until it has connected (made before
    // `ready`: a confined process makes no directory).
    let private = PrivateDir::make().map_err(|e| daemon_err(&e))?;
    let inner_path = private.0.join("backend.sock");
    let inner = UnixListener::bind(&inner_path).map_err(|e| daemon_err(&e))?;
    let Some(front) = accept_frontend(socket, stop, ready)? else {
        return Ok(());
    };
    let mut daemon = VhostUserDaemon::new("ferry-vhost".into(), backend.clone(), backend.memory())
        .map_err(|e| daemon_err(&e))?;
    let path = inner_path.to_string_lossy().into_owned();
    let connect = std::thread::spawn(move || inner.accept().map(|(s, _)| s));
    let started = daemon.start_client(&path).map_err(|e| daemon_err(&e));
    if started.is_err() {
        // Unblocks the accept.
        let _ = UnixStream::connect(&inner_path);
    }
    let back: std::io::Result<UnixStream> = connect
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("accept panicked")));
    // Connected (or failed): the private path is not needed, even if ferry is killed.
    drop(private);
    let result = started.and_then(|()| {
        let back = back.map_err(|e| daemon_err(&e))?;
        let relayed = relay::relay(front, back);
        let waited = match daemon.wait() {
            // The frontend went away: the end of a VM, not a failure.
            Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => Ok(()),
            r => r.map_err(|e| daemon_err(&e)),
        };
        relayed.map_err(|e| daemon_err(&e)).and(waited)
    });
    drop(daemon);
    stop.state().front = None;
    result
}

/// A directory of this process's own (mode 0700), removed when dropped.
struct PrivateDir(std::path::PathBuf);

impl PrivateDir {
    fn make() -> std::io::Result<PrivateDir> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!("ferry-vhost-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&p)?;
        Ok(PrivateDir(p))
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.join("backend.sock"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A backend of `pairs` queue pairs and the NIC servers' devices over them;
/// `published`: the guest's TCP ports published on the host (the first server's).
pub fn backend(
    pairs: usize,
    mtu: usize,
    published: &[u16],
) -> Result<(Backend, Vec<VirtioPair>), Error> {
    let backend = Backend::new(pairs, published)?;
    let devices = (0..pairs)
        .map(|i| VirtioPair::new(Arc::clone(backend.inner()), i, mtu))
        .collect();
    Ok((backend, devices))
}
