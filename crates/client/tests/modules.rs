//! Data-path modules bound through the native API (`Client::bind_module`), served to
//! curl by a real protocol server: http_file's header + file, gzip on the way out, and
//! modules that loop, trap or over-allocate failing only their own socket. Also hostile
//! `BindModule` control messages, which must get an errno and leave the server serving.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_client::{Client, FileRef, Socket};
use ferry_proto::{Binding, Ctl, CtlKind, ModuleRef};
mod common;
use common::Running;

const HTTP_FILE: &[u8] = include_bytes!("../../modules/examples/http_file.wat");
const GZIP: &[u8] = include_bytes!("../../modules/examples/gzip.wat");

/// Loops forever in `init`.
const LOOP_INIT: &str = r#"(module (memory (export "memory") 1)
  (func (export "init") (result i32) (loop $l (br $l)) (i32.const 0))
  (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#;
/// Loops forever when fed.
const LOOP_DATA: &str = r#"(module (memory (export "memory") 1)
  (func (export "init") (result i32) (i32.const 0))
  (func (export "on_data") (param i32) (result i32) (loop $l (br $l)) (i32.const 0)))"#;
/// Grows its memory without bound in `init`.
const HOG: &str = r#"(module (memory (export "memory") 1)
  (func (export "init") (result i32)
    (loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
    (i32.const 0))
  (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#;
/// Traps (`unreachable`) in `init`.
const TRAP: &str = r#"(module (memory (export "memory") 1)
  (func (export "init") (result i32) unreachable)
  (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#;

fn start(tag: &str) -> Running {
    common::start(&format!("modules-{tag}"), |_| {})
}

/// A server whose module callbacks have a deadline of a second, not 5 ms: for tests of
/// what a module does, not of its deadline, so that a loaded machine that preempts a
/// callback does not stop the module (it did once, under a parallel build).
fn start_patient(tag: &str) -> Running {
    common::start(&format!("modules-{tag}"), |cfg| {
        cfg.modules.limits.deadline = std::time::Duration::from_secs(1);
    })
}

fn have_curl() -> bool {
    Command::new("curl").arg("--version").output().is_ok()
}

/// A listener of the native API on 127.0.0.1 and its port.
fn listener(c: &mut Client) -> (Socket, u16) {
    let l = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.bind(&l, "127.0.0.1:0".parse().unwrap()).unwrap();
    c.listen(&l, 16).unwrap();
    let port = c.local_addr(&l).unwrap().port();
    (l, port)
}

/// curl fetching `http://127.0.0.1:port/` once per path in `bodies` (over one kept-alive
/// connection), headers into `head`, each body into its path.
fn curl(port: u16, extra: &[&str], head: &Path, bodies: &[&Path]) -> Child {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "20", "-D"])
        .arg(head)
        .args(extra);
    for body in bodies {
        cmd.arg("-o")
            .arg(body)
            .arg(format!("http://127.0.0.1:{port}/"));
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Accepts one connection and reads its request (up to the blank line).
fn accept_request(c: &mut Client, l: &Socket) -> Socket {
    let (s, _) = c.accept(l).unwrap();
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = c.recv(&s, &mut buf).unwrap();
        assert!(
            n > 0,
            "request cut short: {:?}",
            String::from_utf8_lossy(&req)
        );
        req.extend_from_slice(&buf[..n]);
    }
    assert!(req.starts_with(b"GET / HTTP/1.1\r\n"));
    s
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ferry-modules-{name}-{}", std::process::id()))
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + i / 509) as u8).collect()
}

/// Serves `data` with http_file on one accepted connection and checks what curl got.
fn serve_file(c: &mut Client, l: &Socket, port: u16, data: &[u8], tag: &str) {
    let file = tmp(&format!("{tag}-file"));
    std::fs::write(&file, data).unwrap();
    let (head, body) = (tmp(&format!("{tag}-head")), tmp(&format!("{tag}-body")));
    let child = curl(port, &[], &head, &[&body]);
    let s = accept_request(c, l);
    let f = std::fs::File::open(&file).unwrap();
    let len = data.len().to_string();
    c.bind_module(
        &s,
        HTTP_FILE,
        &[("content-length", &len), ("content-type", "text/x-test")],
        &[f.as_fd()],
    )
    .unwrap();
    drop(f);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let h = std::fs::read_to_string(&head).unwrap();
    assert!(h.starts_with("HTTP/1.1 200 OK\r\n"), "{h}");
    assert!(h.contains(&format!("Content-Length: {len}\r\n")), "{h}");
    assert!(h.contains("Content-Type: text/x-test\r\n"), "{h}");
    let got = std::fs::read(&body).unwrap();
    assert_eq!(got.len(), data.len(), "body length");
    assert!(got == data, "body differs from the file");
    drop(s);
    for p in [file, head, body] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn http_file_serves_header_and_file_to_curl() {
    if !have_curl() {
        eprintln!("skipped: curl not installed");
        return;
    }
    let srv = start_patient("http");
    let mut c = Client::connect(&srv.path).unwrap();
    let (l, port) = listener(&mut c);
    // Up to 4 MiB the server copies the file's bytes (pread + send), above it uses
    // sendfile (`ModuleConfig::copy_max`): both ways are checked.
    for (i, len) in [0usize, 2322, 1 << 20, (3 << 20) + 17, (4 << 20) + 5]
        .into_iter()
        .enumerate()
    {
        serve_file(&mut c, &l, port, &pattern(len), &format!("h{i}"));
    }
    drop(l);
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    let st = srv.stop();
    assert_eq!(st.modules_loaded, 1, "compiled once, then bound by hash");
    assert_eq!(st.modules_started, 5);
    assert_eq!(st.modules_failed, 0);
    let body: u64 = [0u64, 2322, 1 << 20, (3 << 20) + 17, (4 << 20) + 5]
        .iter()
        .sum();
    assert!(
        st.module_bytes_out > body,
        "{} bytes out",
        st.module_bytes_out
    );
    assert!(st.to_json().contains("\"modules_started\":5"));
    assert_eq!(st.open_at_stop, 0);
}

#[test]
fn http_file_bound_once_answers_curls_kept_alive_requests() {
    // http_file's `lines` mode: bound once on the connection, the module answers every
    // line the program sends. curl fetches three URLs over one kept-alive connection;
    // the program reads each request and forwards one line.
    if !have_curl() {
        eprintln!("skipped: curl not installed");
        return;
    }
    let srv = start_patient("lines");
    let mut c = Client::connect(&srv.path).unwrap();
    let (l, port) = listener(&mut c);
    let data = pattern(2322);
    let file = tmp("lines-file");
    std::fs::write(&file, &data).unwrap();
    let bodies: Vec<PathBuf> = (0..3).map(|i| tmp(&format!("lines-body{i}"))).collect();
    let head = tmp("lines-head");
    let child = curl(
        port,
        &[],
        &head,
        &bodies.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
    );
    let (s, _) = c.accept(&l).unwrap();
    let f = std::fs::File::open(&file).unwrap();
    let reg = c.register_file(f.as_fd()).unwrap();
    drop(f);
    let len = data.len().to_string();
    c.bind_module_refs(
        &s,
        HTTP_FILE,
        &[("content-length", &len), ("mode", "lines")],
        &[],
        &[reg],
    )
    .unwrap();
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    let mut answered = 0;
    loop {
        let n = c.recv(&s, &mut buf).unwrap();
        if n == 0 {
            break; // curl is done and closed
        }
        req.extend_from_slice(&buf[..n]);
        while let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            assert!(req.starts_with(b"GET / HTTP/1.1\r\n"));
            req.drain(..end + 4);
            c.send(&s, b"GET /\n").unwrap();
            answered += 1;
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(answered, 3, "three requests on one connection");
    let h = std::fs::read_to_string(&head).unwrap();
    assert_eq!(h.matches("HTTP/1.1 200 OK\r\n").count(), 3, "{h}");
    for b in &bodies {
        assert!(
            std::fs::read(b).unwrap() == data,
            "body differs from the file"
        );
    }
    drop(s);
    drop(l);
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    let st = srv.stop();
    assert_eq!(st.modules_started, 1, "one instance for the connection");
    assert_eq!(st.modules_failed, 0);
    assert_eq!(st.open_at_stop, 0);
    for p in bodies.into_iter().chain([file, head]) {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn gzip_compresses_the_programs_sends_for_curl() {
    if !have_curl() {
        eprintln!("skipped: curl not installed");
        return;
    }
    let srv = start_patient("gzip");
    let mut c = Client::connect(&srv.path).unwrap();
    let (l, port) = listener(&mut c);
    let mut text = Vec::new();
    for i in 0..40_000 {
        writeln!(
            text,
            "line {i}: the quick brown fox jumps over the lazy dog {}",
            i % 97
        )
        .unwrap();
    }
    let (head, body) = (tmp("gz-head"), tmp("gz-body"));
    let child = curl(port, &["--compressed"], &head, &[&body]);
    let s = accept_request(&mut c, &l);
    c.bind_module(
        &s,
        GZIP,
        &[("http", "1"), ("content-type", "text/plain")],
        &[],
    )
    .unwrap();
    // Uneven pieces, more than the channel's buffers hold at once: back-pressure.
    for piece in text.chunks(50_001) {
        c.send(&s, piece).unwrap();
    }
    c.shutdown(&s, libc::SHUT_WR).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let h = std::fs::read_to_string(&head).unwrap();
    assert!(h.contains("Content-Encoding: gzip"), "{h}");
    let got = std::fs::read(&body).unwrap();
    assert_eq!(got.len(), text.len());
    assert!(got == text, "decompressed body differs");
    drop(s);
    drop(l);
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    let st = srv.stop();
    assert_eq!(st.modules_failed, 0);
    assert!(
        st.module_bytes_out < text.len() as u64 / 2,
        "{} bytes on the wire for {}",
        st.module_bytes_out,
        text.len()
    );
    for p in [head, body] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn failing_modules_fail_only_their_socket() {
    if !have_curl() {
        eprintln!("skipped: curl not installed");
        return;
    }
    let srv = start("fail");
    let mut c = Client::connect(&srv.path).unwrap();
    let (l, port) = listener(&mut c);

    // Failing at start: the binding answers EIO, curl sees the connection reset, and
    // the loop was stalled about one deadline (5 ms by default), not forever.
    for (i, bad) in [LOOP_INIT, HOG, TRAP].into_iter().enumerate() {
        let (head, body) = (tmp(&format!("f{i}-head")), tmp(&format!("f{i}-body")));
        let child = curl(port, &[], &head, &[&body]);
        let s = accept_request(&mut c, &l);
        let t = Instant::now();
        let e = c.bind_module(&s, bad.as_bytes(), &[], &[]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "module {i}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "curl got a response from module {i}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("reset") || err.contains("Recv failure"),
            "{err}"
        );
        // Another socket of the same server, meanwhile, works.
        serve_file(&mut c, &l, port, &pattern(100_000), &format!("ok{i}"));
        drop(s);
    }

    // Failing on data: the program's sends on that socket fail with EIO.
    let (head, body) = (tmp("fd-head"), tmp("fd-body"));
    let child = curl(port, &[], &head, &[&body]);
    let s = accept_request(&mut c, &l);
    c.bind_module(&s, LOOP_DATA.as_bytes(), &[], &[]).unwrap();
    c.send(&s, b"fed to a loop").unwrap();
    let mut buf = [0u8; 16];
    let _ = c.recv(&s, &mut buf);
    assert!(
        c.async_errors
            .iter()
            .any(|&(id, e)| id == s.id && e == -libc::EIO),
        "{:?}",
        c.async_errors
    );
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    serve_file(&mut c, &l, port, &pattern(2322), "okd");
    drop(s);
    drop(l);
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    let st = srv.stop();
    assert_eq!(st.modules_failed, 4);
    assert_eq!(st.open_at_stop, 0);
    for p in [head, body] {
        let _ = std::fs::remove_file(p);
    }
}

fn packet(msg: Ctl, blob: &[u8]) -> Vec<u8> {
    let mut p = bytemuck::bytes_of(&msg).to_vec();
    p.extend_from_slice(blob);
    p
}

#[test]
fn hostile_bindings_get_an_errno_and_the_server_carries_on() {
    if !have_curl() {
        eprintln!("skipped: curl not installed");
        return;
    }
    let srv = start("hostile");
    let mut c = Client::connect(&srv.path).unwrap();
    let (l, port) = listener(&mut c);
    let (head, body) = (tmp("ho-head"), tmp("ho-body"));
    let child = curl(port, &[], &head, &[&body]);
    let s = accept_request(&mut c, &l);

    let good = Binding {
        module: ModuleRef::Bytes(HTTP_FILE),
        props: vec![("content-length", "0")],
        handles: vec![],
    }
    .encode();
    let msg = |a: usize, b: i32, c: i32, sock: u32| Ctl {
        a: a as i32,
        b,
        c,
        ..Ctl::new(CtlKind::BindModule, sock)
    };
    let (pr, pw) = ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM).unwrap();
    let unknown_hash = Binding {
        module: ModuleRef::Hash([7; 32]),
        props: vec![],
        handles: vec![],
    }
    .encode();
    let wasi = br#"(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
        (memory (export "memory") 1) (func (export "init") (result i32) (i32.const 0))
        (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#;
    let wasi = Binding {
        module: ModuleRef::Bytes(wasi),
        props: vec![],
        handles: vec![],
    }
    .encode();
    let mut garbage = good.clone();
    garbage[9] ^= 0x40;
    let cases: Vec<(&str, Vec<u8>, Vec<std::os::fd::BorrowedFd<'_>>, i32)> = vec![
        (
            "no binding",
            packet(msg(0, 0, 0, s.id), &[]),
            vec![],
            libc::EINVAL,
        ),
        (
            "length mismatch",
            packet(msg(good.len() + 5, 0, 0, s.id), &good),
            vec![],
            libc::EINVAL,
        ),
        (
            "huge length",
            packet(msg(usize::MAX >> 1, 0, 0, s.id), &good),
            vec![],
            libc::EINVAL,
        ),
        (
            "bad magic",
            packet(msg(4, 0, 0, s.id), b"ABCD"),
            vec![],
            libc::EINVAL,
        ),
        (
            "corrupt lengths",
            packet(msg(garbage.len(), 0, 0, s.id), &garbage),
            vec![],
            libc::EINVAL,
        ),
        (
            "file count lies",
            packet(msg(good.len(), 3, 0, s.id), &good),
            vec![],
            libc::EINVAL,
        ),
        (
            "socket as file",
            packet(msg(good.len(), 1, 0, s.id), &good),
            vec![pr.as_fd()],
            libc::EINVAL,
        ),
        (
            "blob fd not a file",
            packet(msg(good.len(), 0, 1, s.id), &[]),
            vec![pw.as_fd()],
            libc::EINVAL,
        ),
        (
            "unknown socket",
            packet(msg(good.len(), 0, 0, 99_999), &good),
            vec![],
            libc::EBADF,
        ),
        (
            "listening socket",
            packet(msg(good.len(), 0, 0, l.id), &good),
            vec![],
            libc::EOPNOTSUPP,
        ),
        (
            "unknown hash",
            packet(msg(unknown_hash.len(), 0, 0, s.id), &unknown_hash),
            vec![],
            libc::ENOENT,
        ),
        (
            "WASI import",
            packet(msg(wasi.len(), 0, 0, s.id), &wasi),
            vec![],
            libc::EINVAL,
        ),
    ];
    for (what, p, fds, want) in cases {
        let r = c.ctl_raw(&p, &fds).unwrap();
        assert_eq!(r.result, -want, "{what}");
    }
    // Registering files: exactly one descriptor, a regular file open for reading.
    let reg = |a: i32| {
        bytemuck::bytes_of(&Ctl {
            a,
            ..Ctl::new(CtlKind::RegisterFile, 0)
        })
        .to_vec()
    };
    let unreg = |a: i32| {
        bytemuck::bytes_of(&Ctl {
            a,
            ..Ctl::new(CtlKind::UnregisterFile, 0)
        })
        .to_vec()
    };
    let path_only = rustix::fs::open(
        "/proc/self/exe",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let exe = std::fs::File::open("/proc/self/exe").unwrap();
    let reg_cases: Vec<(&str, Vec<u8>, Vec<std::os::fd::BorrowedFd<'_>>, i32)> = vec![
        ("register nothing", reg(0), vec![], libc::EINVAL),
        (
            "register two",
            reg(0),
            vec![exe.as_fd(), exe.as_fd()],
            libc::EINVAL,
        ),
        ("register a socket", reg(0), vec![pr.as_fd()], libc::EINVAL),
        (
            "register O_PATH",
            reg(0),
            vec![path_only.as_fd()],
            libc::EBADF,
        ),
        ("unregister unknown", unreg(5), vec![], libc::EBADF),
        ("unregister negative", unreg(-1), vec![], libc::EBADF),
        (
            "unregister with a file",
            unreg(0),
            vec![exe.as_fd()],
            libc::EINVAL,
        ),
    ];
    for (what, p, fds, want) in reg_cases {
        let r = c.ctl_raw(&p, &fds).unwrap();
        assert_eq!(r.result, -want, "{what}");
    }
    // The same channel binds a good module on the same socket afterwards; a second
    // binding while it runs is refused.
    c.bind_module(&s, GZIP, &[("http", "1")], &[]).unwrap();
    let e = c
        .bind_module(&s, HTTP_FILE, &[("content-length", "0")], &[])
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY));
    c.send(&s, b"after the storm").unwrap();
    c.shutdown(&s, libc::SHUT_WR).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read_to_string(&head)
            .unwrap()
            .contains("Content-Encoding: gzip\r\n")
    );
    let gz = Command::new("gzip").arg("-dc").arg(&body).output().unwrap();
    assert_eq!(gz.stdout, b"after the storm");
    drop(s);
    serve_file(&mut c, &l, port, &pattern(5000), "ho-after");
    drop(l);
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    let st = srv.stop();
    assert_eq!(st.bad_channels, 0);
    assert!(st.module_refused >= 12);
    assert_eq!(st.open_at_stop, 0);
    for p in [head, body] {
        let _ = std::fs::remove_file(p);
    }
}

/// Not a test: prints the p50 of `bind_module` round trips (http_file, 2,322 bytes) to
/// a kernel client, for tuning. `cargo test --release -p ferry-client --test modules --
/// --ignored --nocapture bind_round_trip`.
#[test]
#[ignore]
fn bind_round_trip() {
    use std::io::Read;
    let srv = start_patient("rt");
    let mut c = Client::connect(&srv.path).unwrap();
    let (l, port) = listener(&mut c);
    let file = tmp("rt-file");
    std::fs::write(&file, pattern(2322)).unwrap();
    let t = std::thread::spawn(move || {
        let mut k = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0;
        while let Ok(n) = k.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    });
    let (s, _) = c.accept(&l).unwrap();
    let mut lat = Vec::new();
    for _ in 0..5000 {
        let f = std::fs::File::open(&file).unwrap();
        let t = Instant::now();
        if std::env::var_os("FERRY_NOWAIT").is_some() {
            c.bind_module_nowait(&s, HTTP_FILE, &[("content-length", "2322")], &[f.as_fd()])
        } else {
            c.bind_module(&s, HTTP_FILE, &[("content-length", "2322")], &[f.as_fd()])
        }
        .unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(s);
    let got = t.join().unwrap();
    lat.sort_by(f64::total_cmp);
    eprintln!(
        "bind p50 {:.1} us, p90 {:.1} us; {got} bytes",
        lat[lat.len() / 2],
        lat[lat.len() * 9 / 10]
    );
    let _ = std::fs::remove_file(file);
}

#[test]
fn bindings_in_a_row_queue_their_output_in_order() {
    use std::io::Read;
    let srv = start_patient("row");
    let body = pattern((1 << 20) + 3);
    let file = tmp("row-file");
    std::fs::write(&file, &body).unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut k, _) = l.accept().unwrap();
        // Let the server's socket fill up before reading: the second binding arrives
        // while the first one's output is still queued.
        std::thread::sleep(Duration::from_millis(200));
        let mut all = Vec::new();
        k.read_to_end(&mut all).unwrap();
        all
    });
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, addr).unwrap();
    let len = body.len().to_string();
    let props = [("content-length", len.as_str())];
    for i in 0..3 {
        let f = std::fs::File::open(&file).unwrap();
        if i == 0 {
            c.bind_module(&s, HTTP_FILE, &props, &[f.as_fd()]).unwrap();
        } else {
            c.bind_module_nowait(&s, HTTP_FILE, &props, &[f.as_fd()])
                .unwrap();
        }
    }
    c.send(&s, b"tail").unwrap();
    drop(s);
    let all = peer.join().unwrap();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: application/octet-stream\r\n\r\n"
    );
    let mut want = Vec::new();
    for _ in 0..3 {
        want.extend_from_slice(head.as_bytes());
        want.extend_from_slice(&body);
    }
    want.extend_from_slice(b"tail");
    assert_eq!(all.len(), want.len());
    assert!(all == want, "responses out of order or damaged");
    assert!(c.async_errors.is_empty(), "{:?}", c.async_errors);
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    let st = srv.stop();
    assert_eq!((st.modules_started, st.modules_failed), (3, 0));
    assert_eq!(st.open_at_stop, 0);
    let _ = std::fs::remove_file(file);
}

#[test]
fn a_bad_binding_record_closes_only_its_channel() {
    let srv = start_patient("ring");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut good = Client::connect(&srv.path).unwrap();
    let gs = good.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    good.connect_to(&gs, addr).unwrap();
    let (_k1, _) = l.accept().unwrap();
    for bad in [
        // A buffer that is not the channel's.
        ferry_proto::Req {
            buf: 100_000,
            len: 16,
            ..ferry_proto::Req::new(ferry_proto::Op::BindModule, gs.id)
        },
        // Files announced that never came.
        ferry_proto::Req {
            buf: 0,
            len: 16,
            a: 2,
            ..ferry_proto::Req::new(ferry_proto::Op::BindModule, gs.id)
        },
    ] {
        let mut evil = Client::connect(&srv.path).unwrap();
        let es = evil.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
        evil.push_raw(bad).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            evil.local_addr(&es).is_err(),
            "channel still open after {bad:?}"
        );
    }
    // The good channel binds and serves.
    let file = tmp("ring-file");
    std::fs::write(&file, b"still here").unwrap();
    let f = std::fs::File::open(&file).unwrap();
    good.bind_module(&gs, HTTP_FILE, &[("content-length", "10")], &[f.as_fd()])
        .unwrap();
    let st = srv.stop();
    assert_eq!(st.bad_channels, 2);
    let _ = std::fs::remove_file(file);
}

/// Descriptors of this process (the test's server runs in it) open on `path`.
fn open_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == path))
        .count()
}

/// Waits (up to 5 s) until `open_on(path)` is `n`.
fn wait_open_on(path: &Path, n: usize) {
    let t = Instant::now();
    while open_on(path) != n {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{} descriptors on {}, want {n}",
            open_on(path),
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A kernel peer that reads everything each of `n` connections sends.
fn reading_peer(n: usize) -> (std::net::SocketAddr, std::thread::JoinHandle<Vec<Vec<u8>>>) {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        (0..n)
            .map(|_| {
                let (mut k, _) = l.accept().unwrap();
                let mut all = Vec::new();
                k.read_to_end(&mut all).unwrap();
                all
            })
            .collect()
    });
    (addr, t)
}

#[test]
fn registered_files_are_bound_by_handle() {
    let srv = start_patient("registered");
    let body = pattern(2322);
    let file = tmp("reg-file");
    std::fs::write(&file, &body).unwrap();
    let other = tmp("reg-other");
    std::fs::write(&other, pattern(1 << 20)).unwrap();
    let (addr, peer) = reading_peer(2);
    let mut c = Client::connect(&srv.path).unwrap();

    // Registered once; our own descriptor is closed at once (the server keeps its own).
    let reg = {
        let f = std::fs::File::open(&file).unwrap();
        c.register_file(f.as_fd()).unwrap()
    };
    assert_eq!(open_on(&file), 1, "the server holds one descriptor");
    let big = c
        .register_file(std::fs::File::open(&other).unwrap().as_fd())
        .unwrap();
    assert_ne!(reg, big);

    // Not files a module may send.
    let (pr, _pw) = ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM).unwrap();
    let e = c.register_file(pr.as_fd()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "a socket");
    let wr = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    let e = c.register_file(wr.as_fd()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF), "write-only");
    drop(wr);

    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, addr).unwrap();
    let len = body.len().to_string();
    let props = [("content-length", len.as_str())];
    // Three responses by handle on one connection, the later ones without waiting.
    c.bind_module_refs(&s, HTTP_FILE, &props, &[], &[reg])
        .unwrap();
    // Unknown handles: the binding fails with EBADF, waiting or not.
    let e = c
        .bind_module_refs(&s, HTTP_FILE, &props, &[], &[FileRef(77)])
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    c.bind_module_refs_nowait(&s, HTTP_FILE, &props, &[], &[reg, FileRef(u32::MAX)])
        .unwrap();
    c.local_addr(&s).unwrap(); // a round trip: the binding was handled
    assert_eq!(c.async_errors, [(s.id, -libc::EBADF)]);
    c.async_errors.clear();
    for _ in 0..2 {
        c.bind_module_refs_nowait(&s, HTTP_FILE, &props, &[], &[reg])
            .unwrap();
    }
    // Passed files come first: file 0 is the passed one, file 1 the registered one
    // (http_file sends file 0, so this one sends `other`'s first 2,322 bytes).
    let passed = std::fs::File::open(&other).unwrap();
    c.bind_module_refs_nowait(&s, HTTP_FILE, &props, &[passed.as_fd()], &[reg])
        .unwrap();
    drop(passed);
    // Unregistered: a binding queued before still has it, a later one fails.
    c.bind_module_refs_nowait(&s, HTTP_FILE, &props, &[], &[reg])
        .unwrap();
    c.unregister_file(reg).unwrap();
    let e = c.unregister_file(reg).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    let e = c
        .bind_module_refs(&s, HTTP_FILE, &props, &[], &[reg])
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    c.send(&s, b"tail").unwrap();
    drop(s);

    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: application/octet-stream\r\n\r\n"
    );
    let mut want = Vec::new();
    for i in 0..5 {
        want.extend_from_slice(head.as_bytes());
        if i == 3 {
            want.extend_from_slice(&pattern(1 << 20)[..body.len()]);
        } else {
            want.extend_from_slice(&body);
        }
    }
    want.extend_from_slice(b"tail");
    // The unregistered file is closed once no instance needs it any more.
    wait_open_on(&file, 0);

    // A second connection: the big file by handle, with a 1 MiB body.
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, addr).unwrap();
    let big_len = (1u32 << 20).to_string();
    c.bind_module_refs(&s, HTTP_FILE, &[("content-length", &big_len)], &[], &[big])
        .unwrap();
    drop(s);
    let got = peer.join().unwrap();
    assert_eq!(got[0].len(), want.len());
    assert!(got[0] == want, "responses by handle differ");
    assert!(got[1].ends_with(&pattern(1 << 20)), "1 MiB body by handle");
    assert!(c.async_errors.is_empty(), "{:?}", c.async_errors);

    // The table is bounded; closing the channel closes every registered file.
    let limit = ferry_proto::MAX_REGISTERED_FILES;
    let f = std::fs::File::open(&file).unwrap();
    let mut handles = std::collections::HashSet::new();
    while handles.len() < limit - 1 {
        let h = c.register_file(f.as_fd()).unwrap();
        assert!((h.0 as usize) < limit);
        assert!(handles.insert(h), "handle {h:?} given twice");
    }
    let e = c.register_file(f.as_fd()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENFILE));
    // A freed handle is given again.
    let h = *handles.iter().next().unwrap();
    c.unregister_file(h).unwrap();
    assert_eq!(c.register_file(f.as_fd()).unwrap(), h);
    drop(f);
    assert_eq!(open_on(&file), limit - 1);
    drop(c);
    wait_open_on(&file, 0);
    wait_open_on(&other, 0);
    let st = srv.stop();
    assert_eq!(st.modules_failed, 0);
    assert_eq!(st.modules_started, 6);
    assert_eq!(st.bad_channels, 0);
    for p in [file, other] {
        let _ = std::fs::remove_file(p);
    }
}
