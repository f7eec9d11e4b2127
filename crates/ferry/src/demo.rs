//! `ferry demo`: a "remote" host in its own network namespace serves a file over HTTP;
//! the same client (curl) fetches it natively and through `ferry run`, and the demo
//! prints both results side by side with ferry's counters. With `--vm`, a QEMU guest
//! (scripts/guest-image.sh's) fetches it too, its network served by `ferry vm`, and
//! the bytes it got (size and SHA-256) are compared with the file's.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Instant;

use clap::Args;
use ferry_sandbox::testbed::{Remote, free_subnet, is_root};

use crate::run::EXIT_SETUP;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Size of the file the remote serves, in MiB.
    #[arg(long, default_value_t = 64)]
    pub size_mb: usize,
    /// Also fetch it from a VM guest whose network `ferry vm` serves (needs QEMU and
    /// the guest image scripts/guest-image.sh builds).
    #[arg(long)]
    pub vm: bool,
    /// The guest image's directory (vmlinuz, initrd.img; default: `guest/` in the
    /// target directory of this binary).
    #[arg(long, value_name = "DIR", requires = "vm")]
    pub guest: Option<std::path::PathBuf>,
}

/// A deterministic body, so both fetches can be compared byte for byte.
fn body(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

fn serve(listener: TcpListener, body: std::sync::Arc<Vec<u8>>) {
    for conn in listener.incoming().flatten() {
        let body = body.clone();
        std::thread::spawn(move || {
            let _ = reply(conn, &body);
        });
    }
}

fn reply(mut conn: TcpStream, body: &[u8]) -> std::io::Result<()> {
    let mut rd = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    while rd.read_line(&mut line)? > 2 {
        line.clear();
    }
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    conn.write_all(body)
}

#[derive(Clone, Debug)]
pub(crate) struct Fetch {
    pub(crate) ok: bool,
    pub(crate) bytes: u64,
    pub(crate) secs: f64,
    pub(crate) same: bool,
    pub(crate) stderr: String,
}

fn fetch(cmd: &mut Command, want: &[u8]) -> Fetch {
    let t = Instant::now();
    let out = cmd.output();
    let secs = t.elapsed().as_secs_f64();
    match out {
        Ok(o) => Fetch {
            ok: o.status.success(),
            bytes: o.stdout.len() as u64,
            secs,
            same: o.stdout == want,
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        },
        Err(e) => Fetch {
            ok: false,
            bytes: 0,
            secs,
            same: false,
            stderr: e.to_string(),
        },
    }
}

/// Why the demo could not be set up; every one exits [`EXIT_SETUP`].
#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error(
        "needs root to create the remote namespace (veth); try `sudo ferry demo`, or `ferry run -- CMD` as any user"
    )]
    NotRoot,
    #[error("needs curl (run scripts/install-deps.sh)")]
    NoCurl,
    #[error("no free subnet: {0}")]
    Subnet(#[source] std::io::Error),
    #[error("cannot create the remote namespace: {0}")]
    Remote(#[source] std::io::Error),
    #[error("cannot listen in the remote namespace: {0}")]
    Listen(#[source] std::io::Error),
    #[error("--vm: {0}")]
    Vm(String),
}

/// The demo's steps: check the tools → make the remote host and serve the file → fetch
/// it natively, through ferry and through nic mode → print the results.
pub fn main(a: DemoArgs) -> i32 {
    crate::run::init_logging(0);
    let vm_image = if a.vm {
        match crate::demo_vm::image(a.guest.as_deref()) {
            Ok(i) => Some(i),
            Err(e) => {
                eprintln!("ferry demo: {}", DemoError::Vm(e));
                return EXIT_SETUP;
            }
        }
    } else {
        None
    };
    let remote = match check_tools().and_then(|()| RemoteHost::start(a.size_mb)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ferry demo: {e}");
            return EXIT_SETUP;
        }
    };
    let mut results = fetch_three_ways(&remote).to_vec();
    if let Some(image) = &vm_image {
        results.push((
            "ferry-vm",
            crate::demo_vm::fetch(image, &remote.url, &remote.data),
        ));
    }
    print_results(&results);
    let vm_ok = results.get(3).is_none_or(|(_, v)| v.ok && v.same);
    let (n, f, c) = (&results[0].1, &results[1].1, &results[2].1);
    if n.ok && f.ok && f.same && c.ok && c.same && vm_ok {
        println!(
            "\nferry served the sandboxed curl from outside its sandbox (requests over shared memory, received bytes through its socket fd), and again through nic mode (a TAP served by a NIC server: what static and Go programs use): same bytes as native."
        );
        if vm_image.is_some() {
            println!(
                "A VM guest fetched it too, its virtio-net device served by `ferry vm` (vhost-user, the same NIC servers): same size and SHA-256."
            );
        }
        0
    } else {
        eprintln!(
            "\nferry demo: a sandboxed fetch failed or differed (native ok: {}, nic mode ok: {}, same: {}, guest ok and same: {vm_ok})",
            n.ok, c.ok, c.same
        );
        1
    }
}

/// Root (for the remote namespace) and curl.
fn check_tools() -> Result<(), DemoError> {
    if !is_root() {
        return Err(DemoError::NotRoot);
    }
    if Command::new("curl").arg("--version").output().is_err() {
        return Err(DemoError::NoCurl);
    }
    Ok(())
}

/// The remote host: its namespace, serving the file over HTTP from a thread.
struct RemoteHost {
    _remote: Remote,
    url: String,
    data: std::sync::Arc<Vec<u8>>,
}

impl RemoteHost {
    fn start(size_mb: usize) -> Result<RemoteHost, DemoError> {
        let (host_ip, remote_ip) = free_subnet().map_err(DemoError::Subnet)?;
        let name = format!("ferry-demo-{}", std::process::id());
        let remote = Remote::create(&name, host_ip, remote_ip, 30).map_err(DemoError::Remote)?;
        let listener = remote
            .run_in(|| TcpListener::bind(SocketAddr::from((remote_ip, 8080))))
            .and_then(|l| l)
            .map_err(DemoError::Listen)?;
        let data = std::sync::Arc::new(body(size_mb << 20));
        let served = data.clone();
        std::thread::spawn(move || serve(listener, served));
        println!(
            "remote host: namespace {} at {remote_ip}, serving {size_mb} MiB over HTTP",
            remote.name()
        );
        Ok(RemoteHost {
            url: format!("http://{remote_ip}:8080/file"),
            _remote: remote,
            data,
        })
    }
}

/// The same curl natively, through `ferry run --stats` and through nic mode.
fn fetch_three_ways(remote: &RemoteHost) -> [(&'static str, Fetch); 3] {
    let curl = |c: &mut Command| {
        c.args(["-sS", "--fail", "-o", "-", &remote.url]);
    };
    let mut native = Command::new("curl");
    curl(&mut native);
    let exe = std::env::current_exe().unwrap_or_else(|_| "ferry".into());
    let mut ferry = Command::new(&exe);
    ferry.args(["run", "--stats", "--", "curl"]);
    curl(&mut ferry);
    // The same curl through nic mode: no shim, the sandbox's kernel and a TAP.
    let mut nic = Command::new(&exe);
    nic.args(["run", "--net", "nic", "--", "curl"]);
    curl(&mut nic);
    [
        ("native", fetch(&mut native, &remote.data)),
        ("ferry", fetch(&mut ferry, &remote.data)),
        ("ferry-nic", fetch(&mut nic, &remote.data)),
    ]
}

/// The table of the fetches, then ferry's counters for the sandboxed one (and the
/// guest's failure, if it failed).
fn print_results(results: &[(&str, Fetch)]) {
    println!(
        "\n{:<10} {:>10} {:>10} {:>12} {:>10}",
        "client", "ok", "bytes", "MB/s", "identical"
    );
    for (name, r) in results {
        println!(
            "{:<10} {:>10} {:>10} {:>12.1} {:>10}",
            name,
            r.ok,
            r.bytes,
            r.bytes as f64 / r.secs / 1e6,
            r.same
        );
    }
    println!(
        "\nferry's counters for the sandboxed curl:\n{}",
        results[1].1.stderr.trim_end()
    );
    if let Some((_, v)) = results.get(3).filter(|(_, v)| !v.ok) {
        println!("\nthe guest's fetch: {}", v.stderr.trim_end());
    }
}
