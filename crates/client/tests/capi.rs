//! The C interface (`include/ferry.h`): a C program moves data through zero-copy channel
//! buffers to a kernel echo server and checks every byte that comes back.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_server::{Config, Server};

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

#[test]
fn c_program_echoes_through_zero_copy_buffers() {
    if Command::new("gcc").arg("--version").output().is_err() {
        eprintln!("skipped: gcc not installed");
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("ferry-zc-echo-{}", std::process::id()));
    let lib = library_dir();
    let cc = Command::new("gcc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(manifest.join("tests/c/zc_echo.c"))
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-L")
        .arg(&lib)
        .arg("-lferry_client")
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );

    let path = std::env::temp_dir().join(format!("ferry-capi-test-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let server = Server::new(Config::new(path.clone()), Box::new(ferry_sys::socket)).unwrap();
    let handle = server.stop_handle();
    let t = std::thread::spawn(move || server.run());

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
        .env("FERRY_SOCKET", &path)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&out);
    handle.stop();
    t.join().unwrap();
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
