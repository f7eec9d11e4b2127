//! The C interface (`include/ferry.h`): a C program moves data through zero-copy channel
//! buffers to a kernel echo server and checks every byte that comes back.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

fn library_dir() -> PathBuf {
    // tests run from target/<profile>/deps; the cdylib is next to them, or one up.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    for d in [deps.clone(), deps.parent().unwrap().to_path_buf()] {
        if d.join("libferry_client.so").is_file() {
            return d;
        }
    }
    panic!("libferry_client.so not built next to {}", deps.display());
}

/// Builds the C test program `tests/c/NAME.c` against `ferry.h` and the cdylib; `None`
/// (after saying so) when gcc is not installed.
fn compile_c(name: &str) -> Option<PathBuf> {
    if Command::new("gcc").arg("--version").output().is_err() {
        eprintln!("skipped: gcc not installed");
        return None;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("ferry-{name}-{}", std::process::id()));
    let cc = Command::new("gcc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(manifest.join(format!("tests/c/{name}.c")))
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-L")
        .arg(library_dir())
        .arg("-lferry_client")
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    Some(out)
}

#[test]
fn c_program_echoes_through_zero_copy_buffers() {
    let Some(out) = compile_c("zc_echo") else {
        return;
    };
    let lib = library_dir();
    let srv = common::start("capi", |_| {});

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut c, _)) = l.accept() {
            let mut buf = vec![0u8; 1 << 16];
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 || c.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let total = 5 << 20;
    let run = Command::new(&out)
        .args(["127.0.0.1", &port.to_string(), &total.to_string()])
        .env("FERRY_SOCKET", &srv.path)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&out);
    srv.stop();
    assert!(
        run.status.success(),
        "zc_echo: {}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        format!("ok {total}")
    );
}

#[test]
fn c_program_binds_http_file_and_a_failing_module() {
    // Also: a file registered once and bound by handle (`ferry_bind_module_ex`).
    let Some(out) = compile_c("bind_module") else {
        return;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tag = std::process::id();
    let lib = library_dir();
    let body: Vec<u8> = (0..300_001u32).map(|i| (i % 251) as u8).collect();
    let file = std::env::temp_dir().join(format!("ferry-bind-module-body-{tag}"));
    std::fs::write(&file, &body).unwrap();
    let looping = std::env::temp_dir().join(format!("ferry-bind-module-loop-{tag}.wat"));
    std::fs::write(
        &looping,
        r#"(module (memory (export "memory") 1)
          (func (export "init") (result i32) (loop $l (br $l)) (i32.const 0))
          (func (export "on_data") (param i32) (result i32) (i32.const 0)))"#,
    )
    .unwrap();

    let srv = common::start("capi-bind", |_| {});

    // The peer: a kernel socket that reads everything each connection sends.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let peer = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..3 {
            let (mut c, _) = l.accept().unwrap();
            let mut all = Vec::new();
            let _ = c.read_to_end(&mut all);
            got.push(all);
        }
        got
    });
    let run = Command::new(&out)
        .args(["127.0.0.1", &port.to_string()])
        .arg(manifest.join("../modules/examples/http_file.wat"))
        .arg(&file)
        .arg(&looping)
        .env("FERRY_SOCKET", &srv.path)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap();
    let got = peer.join().unwrap();
    let stats = srv.stop();
    for p in [&out, &file, &looping] {
        let _ = std::fs::remove_file(p);
    }
    assert!(
        run.status.success(),
        "bind_module: {}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        got[0].is_empty(),
        "the failed module's peer got {} bytes",
        got[0].len()
    );
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/x-c-test\r\n\r\n",
        body.len()
    );
    assert!(
        got[1].starts_with(head.as_bytes()),
        "{:?}",
        String::from_utf8_lossy(&got[1][..80.min(got[1].len())])
    );
    assert!(got[1][head.len()..] == body[..], "body differs");
    let mut by_handle = head.into_bytes();
    by_handle.extend_from_slice(&body);
    assert!(got[2] == by_handle, "response by registered handle differs");
    assert_eq!((stats.modules_started, stats.modules_failed), (2, 1));
}
