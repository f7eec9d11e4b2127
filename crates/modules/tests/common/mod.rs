//! Helpers shared by the integration tests: example modules, a one-connection HTTP
//! server on 127.0.0.1, curl.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::thread::{self, JoinHandle};

use ferry_modules::{Limits, ModuleHost};

/// The text of `examples/<name>.wat`.
pub fn example(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.wat"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A host for the examples' tests: the default limits but a deadline that a loaded
/// 2-vCPU machine does not overrun (the deadline itself is tested in isolation.rs).
pub fn host() -> ModuleHost {
    ModuleHost::new(Limits {
        deadline: std::time::Duration::from_millis(250),
        ..Limits::default()
    })
    .expect("module host")
}

/// A fresh temporary directory for this test.
pub fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferry-modules-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmpdir");
    d
}

/// Deterministic pseudo-random bytes (xorshift).
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Compressible text: lines of words drawn from a small vocabulary.
pub fn text_bytes(n: usize, seed: u64) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "ferry", "socket", "module", "kernel", "buffer", "header", "sandbox", "server", "the", "a",
        "of", "sendfile", "compress", "wasm", "deadline", "memory", "pool", "instance",
    ];
    let r = random_bytes(n, seed);
    let mut out = Vec::with_capacity(n + 16);
    let mut i = 0;
    while out.len() < n {
        let w = WORDS[r[i % r.len()] as usize % WORDS.len()];
        out.extend_from_slice(w.as_bytes());
        out.push(if r[(i + 7) % r.len()].is_multiple_of(11) {
            b'\n'
        } else {
            b' '
        });
        i += 1;
    }
    out.truncate(n);
    out
}

/// Reads an HTTP request's head from `s` (up to the blank line).
pub fn read_request(s: &TcpStream) -> String {
    let mut r = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).expect("read request") == 0 {
            break;
        }
        head.push_str(&line);
        if line == "\r\n" || line == "\n" {
            break;
        }
    }
    head
}

/// Listens on 127.0.0.1, accepts one connection, reads the request, hands the socket to
/// `serve`, then shuts it down. Returns the URL and the server thread.
pub fn serve_once<F>(serve: F) -> (String, JoinHandle<()>)
where
    F: FnOnce(&TcpStream) + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", l.local_addr().expect("addr"));
    let t = thread::spawn(move || {
        let (s, _) = l.accept().expect("accept");
        let _req = read_request(&s);
        serve(&s);
        let _ = s.shutdown(Shutdown::Write);
        // Let the client finish reading before the socket is closed.
        let mut sink = [0u8; 256];
        let _ = (&s).read(&mut sink);
    });
    (url, t)
}

/// `curl -s -S` with `args`, writing headers and body to files in `dir`.
pub fn curl(dir: &std::path::Path, url: &str, args: &[&str]) -> (String, Vec<u8>, Output) {
    let hdr = dir.join("headers");
    let body = dir.join("body");
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "20", "-D"])
        .arg(&hdr)
        .arg("-o")
        .arg(&body)
        .args(args)
        .arg(url)
        .output()
        .expect("run curl (is it installed?)");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        std::fs::read_to_string(&hdr).unwrap_or_default(),
        std::fs::read(&body).unwrap_or_default(),
        out,
    )
}
