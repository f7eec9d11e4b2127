//! `ferry demo --vm`: the demo's file fetched from a QEMU guest (scripts/guest-image.sh's
//! kernel and busybox initramfs) whose virtio-net device is served by `ferry vm`
//! (vhost-user), compared by size and SHA-256 with the file the remote serves.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_bench::exec::{Interrupt, run};
use ferry_bench::guest::{Accel, Guest, Image, Net, QEMU, said};

use crate::demo::Fetch;

/// The guest image, after checking QEMU; why not, naming what installs or builds it.
pub fn image(dir: Option<&Path>) -> Result<Image, String> {
    if ferry_bench::config::which(QEMU).is_none() {
        return Err(format!(
            "{QEMU} not found (scripts/install-deps.sh installs qemu-system-x86)"
        ));
    }
    let dir = dir
        .map(Path::to_path_buf)
        .or_else(Image::default_dir)
        .ok_or("no guest image directory: give --guest DIR")?;
    let image = Image::existing(&dir);
    if !image.present() {
        return Err(format!(
            "no guest image in {} (vmlinuz, initrd.img): build it with scripts/guest-image.sh {}",
            dir.display(),
            dir.display()
        ));
    }
    Ok(image)
}

fn failed(why: String) -> Fetch {
    Fetch {
        ok: false,
        bytes: 0,
        secs: 0.0,
        same: false,
        stderr: why,
    }
}

/// The guest's fetch of `url` through `ferry vm`, compared with `want`.
pub fn fetch(image: &Image, url: &str, want: &[u8]) -> Fetch {
    let dir = std::env::temp_dir().join(format!("ferry-demo-vm-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return failed(format!("{}: {e}", dir.display()));
    }
    let r = fetch_in(image, url, want, &dir.join("vu.sock"));
    // Our own directory (the socket, if ferry vm left it).
    let _ = std::fs::remove_dir_all(&dir);
    r.unwrap_or_else(failed)
}

/// `ferry vm` on `sock`: the process and the guest's (ADDR/PREFIX, gateway).
fn start_vm(sock: &Path) -> Result<(Child, (String, String)), String> {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("ferry"));
    let mut child = Command::new(exe)
        .args(["vm", "--mtu", "65520", "--vhost-user"])
        .arg(sock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start ferry vm: {e}"))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .map(str::to_owned)
    };
    let end = Instant::now() + Duration::from_secs(10);
    while !sock.exists() && Instant::now() < end && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(10));
    }
    match (field("ip="), field("gw=")) {
        (Some(ip), Some(gw)) if sock.exists() => Ok((child, (ip, gw))),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!("ferry vm did not come up: {line:?}"))
        }
    }
}

fn fetch_in(image: &Image, url: &str, want: &[u8], sock: &Path) -> Result<Fetch, String> {
    let (accel, why) = Accel::detect(image, Duration::from_secs(20));
    println!("guest: accelerator {} ({why})", accel.name());
    let (mut vm, addr) = start_vm(sock)?;
    let guest = Guest {
        accel,
        image: image.clone(),
        net: Net::VhostUser {
            socket: sock.to_owned(),
            queues: 1,
        },
        addr: Some(addr),
        mtu: Some(65520),
        script: format!(
            "up() {{ cut -d' ' -f1 /proc/uptime; }}\n\
             t0=$(up); h=$(wget -q -O - {url} | sha256sum | cut -d' ' -f1); t1=$(up)\n\
             echo GOT $h $(awk \"BEGIN {{ print $t1 - $t0 }}\")\n"
        ),
        mem_mb: 256,
        smp: 2,
    };
    let out = guest
        .command()
        .map_err(|e| e.to_string())
        .and_then(|mut c| {
            run(&mut c, Duration::from_secs(300), &Interrupt::new()).map_err(|e| e.to_string())
        });
    // The guest powered off: ferry vm ends with its frontend.
    let end = Instant::now() + Duration::from_secs(3);
    while matches!(vm.try_wait(), Ok(None)) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = vm.kill();
    let _ = vm.wait();
    let out = out?;
    let got = said(&out.stdout, "GOT").ok_or_else(|| {
        format!(
            "the guest printed no result ({}): {}",
            out.failure(),
            out.stdout.lines().last().unwrap_or("")
        )
    })?;
    let mut w = got.split_whitespace();
    let (hash, secs) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
    let same = hash == sha256(want)?;
    Ok(Fetch {
        ok: true,
        bytes: if same { want.len() as u64 } else { 0 },
        secs: secs.parse::<f64>().unwrap_or(f64::NAN).max(1e-6),
        same,
        stderr: format!("guest SHA-256 {hash}"),
    })
}

/// SHA-256 of `data`, hex (coreutils' sha256sum).
fn sha256(data: &[u8]) -> Result<String, String> {
    let mut c = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("sha256sum: {e}"))?;
    let mut stdin = c.stdin.take().ok_or("sha256sum: no stdin")?;
    let data = data.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&data));
    let out = c
        .wait_with_output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    let _ = feeder.join();
    let s = String::from_utf8_lossy(&out.stdout);
    Ok(s.split_whitespace().next().unwrap_or("").to_owned())
}
