//! The two-machine topology of the papers on one host: a "remote" network namespace
//! joined to the host by a veth pair, running the servers every configuration's client
//! talks to (iperf3, sockperf over TCP and UDP, redis-server, nginx over a generated
//! file set; for one experiment only, E6's requester and R2's short-connection server
//! and PostgreSQL).
//!
//! Everything is owned by [`Testbed`]: dropping it (normal end, error, Ctrl-C) stops the
//! servers, deletes the namespace and the veth, and removes the scratch directory.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_sandbox::testbed::{Remote, free_subnet};

use crate::exec::{Daemon, output};

/// iperf3 server for everything but E3.
pub const IPERF_PORT: u16 = 5201;
/// iperf3 server for E3, pinned to the other CPU (the "remote machine's" own core).
pub const IPERF_E3_PORT: u16 = 5202;
/// sockperf server (TCP).
pub const SOCKPERF_PORT: u16 = 11111;
/// sockperf server (UDP; E5's datagram ping-pong).
pub const SOCKPERF_UDP_PORT: u16 = 11114;
/// sockperf servers on CPU 0 (TCP, UDP): E5's ping-pong with everything on one core.
pub const SOCKPERF_CPU0_PORT: u16 = 11115;
/// See [`SOCKPERF_CPU0_PORT`].
pub const SOCKPERF_CPU0_UDP_PORT: u16 = 11116;
/// E7's first sockperf server (every address of the remote).
pub const SOCKPERF_E7A_PORT: u16 = 11112;
/// E7's second sockperf server (every address: reached over either path).
pub const SOCKPERF_E7B_PORT: u16 = 11113;
/// redis-server.
pub const REDIS_PORT: u16 = 6379;
/// nginx.
pub const HTTP_PORT: u16 = 80;
/// The file wrk fetches from nginx.
pub const HTTP_FILE: &str = "file-16k.bin";
/// E6's requester (`ferry-e6 requester`), started only for E6.
pub const E6_PORT: u16 = 5300;
/// R2's short-connection server (`ferry-shortconn server`), started only for R2.
pub const SHORTCONN_PORT: u16 = 5400;
/// R2's PostgreSQL server (for pgbench), started only for R2.
pub const PG_PORT: u16 = 5432;
/// The user PostgreSQL runs as (it refuses root); Debian's package creates it.
pub const PG_USER: &str = "postgres";
/// The database pgbench's tables are made in.
pub const PG_DB: &str = "postgres";

/// Why the testbed could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// No unused /30 for the veth pair.
    #[error("no free subnet for the remote namespace: {0}")]
    Subnet(std::io::Error),
    /// `ip netns add` / veth creation failed.
    #[error("cannot create the remote namespace: {0}")]
    Namespace(std::io::Error),
    /// A scratch file could not be written.
    #[error("cannot write {path}: {source}")]
    Scratch {
        /// The file or directory.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// A server did not start or did not listen in time.
    #[error(
        "{name} did not start in the remote namespace: {why} (is it installed? run scripts/install-deps.sh)"
    )]
    Server {
        /// Which server.
        name: String,
        /// What went wrong.
        why: String,
    },
}

/// The remote namespace and its servers. Field order is drop order: servers first.
#[derive(Debug)]
pub struct Testbed {
    servers: Vec<(u16, Daemon)>,
    remote: Remote,
    scratch: Scratch,
    /// MTU of the veth pair (host side).
    pub mtu: u32,
    /// `ferry-e6`, once E6's requester was started.
    e6_bin: Option<PathBuf>,
    /// `ferry-shortconn`, once R2's server was started.
    shortconn_bin: Option<PathBuf>,
    /// PostgreSQL's program directory, once R2's server was started.
    pg_bin: Option<PathBuf>,
}

/// A scratch directory under the system temp dir (so nginx's unprivileged workers can
/// read the file set), removed on drop.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn scratch_err(path: &Path) -> impl FnOnce(std::io::Error) -> TopologyError + '_ {
    move |source| TopologyError::Scratch {
        path: path.to_owned(),
        source,
    }
}

impl Testbed {
    /// Creates the namespace and starts every server. `pin_e3` pins the E3 iperf3
    /// server to CPU 1 (when there is one).
    pub fn up() -> Result<Testbed, TopologyError> {
        let (host_ip, remote_ip) = free_subnet().map_err(TopologyError::Subnet)?;
        let name = format!("ferry-bench-{}", std::process::id());
        let remote =
            Remote::create(&name, host_ip, remote_ip, 30).map_err(TopologyError::Namespace)?;
        let dir = std::env::temp_dir().join(format!("ferry-bench-{}", std::process::id()));
        fs::create_dir_all(dir.join("www")).map_err(scratch_err(&dir))?;
        let scratch = Scratch(dir);
        let mtu = fs::read_to_string(format!("/sys/class/net/{}/mtu", remote.paths()[0].host_if))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        // The remote keeps no TIME_WAIT: at ~10k short connections a second the
        // client's ~28k ports come round within 3 s while the remote still holds them,
        // and back-to-back runs collapsed (native once from 12k to 400 conn/s, 18k
        // entries in TIME_WAIT). Every configuration meets the same remote.
        let tw = remote.run_in(|| fs::write("/proc/sys/net/ipv4/tcp_max_tw_buckets", "0"));
        if let Err(e) | Ok(Err(e)) = tw {
            eprintln!(
                "bench: the remote keeps TIME_WAIT ({e}): short-connection rows may collapse"
            );
        }
        let mut remote = remote;
        // A second path (E7: two NIC paths), on a subnet of its own.
        let (h2, r2) = free_subnet().map_err(TopologyError::Subnet)?;
        remote.add_path(h2, r2).map_err(TopologyError::Namespace)?;
        let mut bed = Testbed {
            servers: Vec::new(),
            remote,
            scratch,
            mtu,
            e6_bin: None,
            shortconn_bin: None,
            pg_bin: None,
        };
        bed.write_site()?;
        for port in [
            IPERF_PORT,
            IPERF_E3_PORT,
            SOCKPERF_PORT,
            SOCKPERF_UDP_PORT,
            SOCKPERF_CPU0_PORT,
            SOCKPERF_CPU0_UDP_PORT,
            SOCKPERF_E7A_PORT,
            SOCKPERF_E7B_PORT,
            REDIS_PORT,
            HTTP_PORT,
        ] {
            bed.start(port)?;
        }
        Ok(bed)
    }

    /// The remote's address (the destination of every client).
    pub fn remote_ip(&self) -> Ipv4Addr {
        self.remote.remote_ip()
    }

    /// The remote's address on the second path.
    pub fn remote_ip2(&self) -> Ipv4Addr {
        self.remote.paths()[1].remote_ip
    }

    /// The host side's address.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.remote.host_ip()
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        self.remote.name()
    }

    /// The scratch directory (logs, nginx prefix, file set).
    pub fn scratch(&self) -> &Path {
        &self.scratch.0
    }

    /// Stops and starts the server on `port` again (after a failed run: an iperf3
    /// server whose client was killed can stay busy for minutes).
    pub fn restart(&mut self, port: u16) -> Result<(), TopologyError> {
        self.servers.retain(|(p, _)| *p != port);
        self.start(port)
    }

    /// Restarts every server that has died.
    pub fn revive(&mut self) -> Result<(), TopologyError> {
        let dead: Vec<u16> = self
            .servers
            .iter_mut()
            .filter_map(|(p, d)| (!d.alive()).then_some(*p))
            .collect();
        for port in dead {
            self.restart(port)?;
        }
        Ok(())
    }

    /// Starts E6's requester (`bin requester`) in the remote namespace.
    pub fn start_e6(&mut self, bin: &Path) -> Result<(), TopologyError> {
        self.e6_bin = Some(bin.to_owned());
        self.start(E6_PORT)
    }

    /// Starts R2's short-connection server (`bin server`) in the remote namespace.
    pub fn start_shortconn(&mut self, bin: &Path) -> Result<(), TopologyError> {
        self.shortconn_bin = Some(bin.to_owned());
        self.start(SHORTCONN_PORT)
    }

    /// Starts R2's PostgreSQL server in the remote namespace (`bin`: the directory of
    /// `initdb`, `postgres` and `pgbench`): a cluster made by `initdb` in the scratch directory,
    /// owned by [`PG_USER`] (the server refuses to run as root), open to any address
    /// without a password, with durability off (`fsync`, synchronous commit: the rows
    /// measure the network, not the disk), and pgbench's tables (scale 1) made in it.
    pub fn start_postgres(&mut self, bin: &Path) -> Result<(), TopologyError> {
        let fail = |why: String| TopologyError::Server {
            name: "postgres".into(),
            why,
        };
        let dir = self.scratch().join("pg");
        fs::create_dir_all(&dir).map_err(scratch_err(&dir))?;
        let mut owner = Command::new("chown");
        owner.arg(format!("{PG_USER}:")).arg(&dir);
        output(&mut owner, "chown").map_err(fail)?;
        let data = dir.join("data");
        let mut init = Command::new("runuser");
        init.args(["-u", PG_USER, "--"])
            .arg(bin.join("initdb"))
            .args([
                "-A",
                "trust",
                "-U",
                PG_USER,
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(&data);
        output(&mut init, "initdb").map_err(fail)?;
        let hba = data.join("pg_hba.conf");
        let mut rules = fs::read_to_string(&hba).map_err(scratch_err(&hba))?;
        rules.push_str("host all all 0.0.0.0/0 trust\n");
        fs::write(&hba, rules).map_err(scratch_err(&hba))?;
        self.pg_bin = Some(bin.to_owned());
        self.start(PG_PORT)?;
        let mut tables = Command::new(bin.join("pgbench"));
        tables
            .args(["-i", "-q", "-s", "1", "-h", &self.remote_ip().to_string()])
            .args(["-p", &PG_PORT.to_string(), "-U", PG_USER, PG_DB]);
        output(&mut tables, "pgbench -i").map(drop).map_err(fail)
    }

    /// CPU time used so far by the servers on `ports` (each with its child processes,
    /// e.g. nginx's worker, and every thread), from the nanosecond run times of
    /// `/proc/<pid>/task/*/schedstat`, plus what their children that have ended used
    /// (`cutime` + `cstime`, in clock ticks: PostgreSQL's backends end with their
    /// connections); None when a server or its times cannot be read.
    pub fn cpu_of(&self, ports: &[u16]) -> Option<Duration> {
        let tick_ns = 1_000_000_000 / rustix::param::clock_ticks_per_second().max(1);
        let mut ns = 0;
        for port in ports {
            let (_, d) = self.servers.iter().find(|(p, _)| p == port)?;
            for pid in crate::exec::with_descendants(d.pid()) {
                // A process that ended since the listing counts 0 here (its parent's
                // children's time holds it once it is reaped); the server itself must
                // be there.
                let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
                    if pid == d.pid() {
                        return None;
                    }
                    continue;
                };
                for task in tasks.flatten() {
                    // A thread that ended between the listing and the read counts 0.
                    if let Ok(s) = fs::read_to_string(task.path().join("schedstat")) {
                        ns += crate::parse::schedstat_run_ns(&s).ok()?;
                    }
                }
                if let Ok(s) = fs::read_to_string(format!("/proc/{pid}/stat")) {
                    ns += crate::parse::stat_children_ticks(&s).ok()? * tick_ns;
                }
            }
        }
        Some(Duration::from_nanos(ns))
    }

    fn write_site(&self) -> Result<(), TopologyError> {
        let dir = self.scratch();
        let www = dir.join("www");
        for (file, len) in [
            ("index.html", 1024),
            (HTTP_FILE, 16 << 10),
            ("file-1m.bin", 1 << 20),
        ] {
            let body: Vec<u8> = (0..len).map(|i: usize| b'a' + (i % 26) as u8).collect();
            let path = www.join(file);
            fs::write(&path, body).map_err(scratch_err(&path))?;
        }
        let conf = format!(
            "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  keepalive_requests 1000000;\n\
             \x20 client_body_temp_path {d}/body;\n  default_type application/octet-stream;\n\
             \x20 server {{ listen {ip}:{HTTP_PORT}; root {d}/www; }}\n}}\n",
            d = dir.display(),
            ip = self.remote_ip(),
        );
        let path = dir.join("nginx.conf");
        fs::write(&path, conf).map_err(scratch_err(&path))
    }

    fn start(&mut self, port: u16) -> Result<(), TopologyError> {
        let ip = self.remote_ip().to_string();
        let dir = self.scratch().to_owned();
        let (name, mut cmd) = match port {
            IPERF_PORT => {
                let mut c = self.remote.command("iperf3");
                c.args(["-s", "-p", &port.to_string()]);
                ("iperf3", c)
            }
            IPERF_E3_PORT => {
                let mut c = self.remote.command("taskset");
                let cpu = if cpus() > 1 { "1" } else { "0" };
                c.args(["-c", cpu, "iperf3", "-s", "-p", &port.to_string()]);
                ("iperf3 (E3)", c)
            }
            SOCKPERF_PORT => {
                let mut c = self.remote.command("sockperf");
                c.args(["server", "--tcp", "-i", &ip, "-p", &port.to_string()]);
                ("sockperf", c)
            }
            SOCKPERF_UDP_PORT => {
                let mut c = self.remote.command("sockperf");
                c.args(["server", "-i", &ip, "-p", &port.to_string()]);
                ("sockperf (UDP)", c)
            }
            SOCKPERF_CPU0_PORT | SOCKPERF_CPU0_UDP_PORT => {
                let mut c = self.remote.command("taskset");
                c.args([
                    "-c",
                    "0",
                    "sockperf",
                    "server",
                    "-i",
                    &ip,
                    "-p",
                    &port.to_string(),
                ]);
                if port == SOCKPERF_CPU0_PORT {
                    c.arg("--tcp");
                    ("sockperf (CPU 0)", c)
                } else {
                    ("sockperf (CPU 0, UDP)", c)
                }
            }
            SOCKPERF_E7A_PORT | SOCKPERF_E7B_PORT => {
                let mut c = self.remote.command("sockperf");
                c.args(["server", "--tcp", "-i", "0.0.0.0", "-p", &port.to_string()]);
                (
                    if port == SOCKPERF_E7A_PORT {
                        "sockperf (E7 a)"
                    } else {
                        "sockperf (E7 b)"
                    },
                    c,
                )
            }
            REDIS_PORT => {
                let mut c = self.remote.command("redis-server");
                c.args(["--port", &port.to_string(), "--bind", &ip, "--save", ""]);
                c.args(["--appendonly", "no", "--protected-mode", "no"]);
                c.arg("--dir").arg(&dir);
                ("redis-server", c)
            }
            SHORTCONN_PORT => {
                let bin = self
                    .shortconn_bin
                    .clone()
                    .unwrap_or_else(|| "ferry-shortconn".into());
                let mut c = self.remote.command(&bin.to_string_lossy());
                c.args(["server", &ip, &port.to_string()]);
                ("ferry-shortconn server", c)
            }
            PG_PORT => {
                let bin = self.pg_bin.clone().unwrap_or_default();
                let dir = dir.join("pg");
                let mut c = self.remote.command("runuser");
                c.args(["-u", PG_USER, "--"]).arg(bin.join("postgres"));
                c.arg("-D").arg(dir.join("data")).arg("-k").arg(&dir);
                c.args(["-h", &ip, "-p", &port.to_string()]);
                for setting in [
                    "fsync=off",
                    "synchronous_commit=off",
                    "full_page_writes=off",
                ] {
                    c.args(["-c", setting]);
                }
                ("postgres", c)
            }
            E6_PORT => {
                let bin = self.e6_bin.clone().unwrap_or_else(|| "ferry-e6".into());
                let mut c = self.remote.command(&bin.to_string_lossy());
                c.args(["requester", "--listen", &format!("{ip}:{port}")]);
                ("ferry-e6 requester", c)
            }
            _ => {
                let mut c = self.remote.command("nginx");
                c.arg("-p").arg(&dir).arg("-c").arg(dir.join("nginx.conf"));
                c.arg("-e").arg(dir.join("nginx-error.log"));
                ("nginx", c)
            }
        };
        let log = dir.join(format!("{}.log", name.replace([' ', '(', ')'], "")));
        let file = fs::File::create(&log).map_err(scratch_err(&log))?;
        let err = file.try_clone().map_err(scratch_err(&log))?;
        cmd.stdout(Stdio::from(file)).stderr(Stdio::from(err));
        let mut daemon = Daemon::spawn(name, &mut cmd).map_err(|e| TopologyError::Server {
            name: name.to_owned(),
            why: e.to_string(),
        })?;
        let end = Instant::now() + Duration::from_secs(10);
        while !self.listening(port) {
            if !daemon.alive() || Instant::now() > end {
                let why = fs::read_to_string(&log).unwrap_or_default();
                return Err(TopologyError::Server {
                    name: name.to_owned(),
                    why: format!("not listening on port {port}; log: {}", why.trim()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.servers.push((port, daemon));
        Ok(())
    }

    /// Whether a TCP socket listens on `port` inside the namespace (a UDP socket is
    /// bound, for the UDP server).
    fn listening(&self, port: u16) -> bool {
        let which = if port == SOCKPERF_UDP_PORT || port == SOCKPERF_CPU0_UDP_PORT {
            "-Hlun"
        } else {
            "-Hltn"
        };
        Command::new("ss")
            .args(["-N", self.name(), which, &format!("sport = :{port}")])
            .stderr(Stdio::null())
            .output()
            .map(|o| !o.stdout.is_empty())
            .unwrap_or(false)
    }
}

/// The directory of PostgreSQL's server programs (Debian keeps them in
/// `/usr/lib/postgresql/VERSION/bin`; the newest there), else the one of `postgres` in
/// `PATH`.
pub fn postgres_bin() -> Option<PathBuf> {
    let newest = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .max_by_key(|(v, _)| *v)
        .map(|(_, bin)| bin);
    newest.or_else(|| Some(crate::config::which("postgres")?.parent()?.to_owned()))
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
