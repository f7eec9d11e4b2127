//! Shared pieces of the shim's integration tests: where the built shim is, running a
//! program under it, a protocol server in a thread, and small kernel peers.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The built shim: `target/<profile>/deps/libferry_preload.so` (what `cargo test`
/// builds, beside this test's executable) or `target/<profile>/libferry_preload.so`
/// (what `cargo build` leaves), whichever is newer.
pub fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let candidates = [
        deps.join("libferry_preload.so"),
        deps.parent().unwrap().join("libferry_preload.so"),
    ];
    candidates
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .expect("libferry_preload.so not built")
}

/// The real Python interpreter (not a version-manager wrapper script), if any.
pub fn python() -> Option<PathBuf> {
    static PY: OnceLock<Option<PathBuf>> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()?;
        let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !p.is_empty()).then(|| PathBuf::from(p))
    })
    .clone()
}

/// Whether a program is on PATH.
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A command with the shim preloaded; `ferry_socket` sets `FERRY_SOCKET`.
pub fn shimmed(prog: impl AsRef<std::ffi::OsStr>, ferry_socket: Option<&Path>) -> Command {
    let mut c = Command::new(prog);
    c.env("LD_PRELOAD", shim())
        .env_remove("FERRY_SOCKET")
        .env("FERRY_LOG", "1");
    if let Some(p) = ferry_socket {
        c.env("FERRY_SOCKET", p);
    }
    c
}

/// Runs a command with a time limit (killed after it); returns its output.
pub fn run(mut c: Command, limit: Duration) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t0.elapsed() > limit {
            // Where it hangs, when gdb is there to tell.
            if have("gdb") {
                let bt = Command::new("gdb")
                    .args([
                        "-p",
                        &child.id().to_string(),
                        "-batch",
                        "-ex",
                        "thread apply all bt",
                    ])
                    .output();
                if let Ok(bt) = bt {
                    eprintln!("{}", String::from_utf8_lossy(&bt.stdout));
                }
            }
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Runs a Python script under the shim; panics with its output unless it exits 0.
pub fn py(script: &str, ferry_socket: Option<&Path>, args: &[String]) -> String {
    let py = python().expect("python3");
    let mut c = shimmed(py, ferry_socket);
    c.arg("-c").arg(script).args(args);
    let out = run(c, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "script failed ({})\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Serialises the end-to-end tests of one test binary: every test server numbers its
/// sockets from 1, and the names `"\0ferry:<id>"` share the host's abstract namespace.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A protocol server in a thread of the test process (host namespace: "sandbox"
/// sockets are plain local sockets).
pub struct Running {
    pub path: PathBuf,
    handle: ferry_server::Handle,
    thread: Option<std::thread::JoinHandle<ferry_server::ServerStats>>,
}

impl Running {
    /// Starts a server with `batch` (doorbell batching threshold).
    pub fn start(tag: &str, batch: u32) -> Running {
        Running::start_with(tag, |cfg| cfg.batch = batch)
    }

    /// Starts a server whose configuration `set` adjusts.
    pub fn start_with(tag: &str, set: impl FnOnce(&mut ferry_server::Config)) -> Running {
        let path =
            std::env::temp_dir().join(format!("ferry-preload-{tag}-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut cfg = ferry_server::Config::new(path.clone());
        set(&mut cfg);
        let server = ferry_server::Server::new(cfg, Box::new(ferry_sys::socket)).unwrap();
        let handle = server.stop_handle();
        let thread = Some(std::thread::spawn(move || server.run()));
        Running {
            path,
            handle,
            thread,
        }
    }

    /// Stops the server; returns its counters.
    pub fn stop(mut self) -> ferry_server::ServerStats {
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
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A kernel TCP echo server on 127.0.0.1.
pub fn tcp_echo() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if c.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// A kernel UDP echo server on 127.0.0.1.
pub fn udp_echo() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], from);
        }
    });
    addr
}

/// A kernel HTTP/1.0 server on 127.0.0.1 answering every request with `body`.
pub fn http(body: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let resp = format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{body}",
                    body.len()
                );
                let _ = c.write_all(resp.as_bytes());
            });
        }
    });
    addr
}

/// A kernel TCP server on 127.0.0.1 that accepts and then stays silent (never closes).
pub fn tcp_silent() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut keep = Vec::new();
        for c in l.incoming().flatten() {
            keep.push(c);
        }
    });
    addr
}
