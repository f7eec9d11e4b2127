//! A protocol server on a thread, for the native-API tests. Its "sandbox" sockets are
//! plain local sockets: the tests run in the host namespace.
#![allow(dead_code)]

use std::path::PathBuf;

use ferry_server::{Config, Server, ServerStats};

/// A running server; stopped (and joined) on drop.
pub struct Running {
    pub path: PathBuf,
    pub handle: ferry_server::Handle,
    thread: Option<std::thread::JoinHandle<ServerStats>>,
}

impl Running {
    /// Stops the server and returns its counters.
    pub fn stop(mut self) -> ServerStats {
        self.handle.stop();
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.handle.stop();
            let _ = t.join();
        }
    }
}

/// Starts a server on a fresh socket path named after `tag`, `setup` adjusting its
/// configuration first.
pub fn start(tag: &str, setup: impl FnOnce(&mut Config)) -> Running {
    let path = std::env::temp_dir().join(format!(
        "ferry-client-test-{tag}-{}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let mut cfg = Config::new(path.clone());
    setup(&mut cfg);
    let server = Server::new(cfg, Box::new(ferry_sys::socket)).unwrap();
    let handle = server.stop_handle();
    let thread = Some(std::thread::spawn(move || server.run()));
    Running {
        path,
        handle,
        thread,
    }
}
