//! C1's engines and their network: a bridge of C1's own with the remote namespace on
//! it (so containers reach the remote without forwarding, NAT or the host's firewall),
//! a dockerd of C1's own (Debian's docker.io, in a private mount namespace, with
//! `ferry oci` registered), rootful Podman (its own storage, every call in one private
//! mount namespace), the bench image built by scripts/oci-image.sh, and long-lived
//! containers that clients are `exec`ed into, with the CPU time of what serves them.
//! Everything is removed on drop.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::core::{CpuFile, cgroup_cpu_file};
use crate::exec::{Daemon, output, with_descendants};

/// scripts/oci-image.sh, run with `bash -c` (the bench may run from anywhere).
const IMAGE_SCRIPT: &str = include_str!("../../../../../scripts/oci-image.sh");
/// The image's name in both engines.
pub const IMAGE: &str = "ferry-bench";
/// The runtime name of ferry with [`PUBLISH`] as a preset.
pub const PUBLISHING: &str = "ferry-pub";
/// The runtime name of the baseline build's `ferry-oci` (`--baseline`).
pub const BASE_RUNTIME: &str = "ferry-base";
/// ferry's option publishing nginx's port (8080) in the engine's namespace.
pub const PUBLISH: &str = "ferry.publish=8080:8080";

/// Prefix of the engines' commands: the normal scheduling policy. Under a real-time
/// bench (`chrt -f 10 ferry bench`) Go programs that spin (docker import's untar,
/// podman's layer applier) starve the processes they wait for on a small machine.
const OTHER: [&str; 3] = ["chrt", "-o", "0"];

/// A thread's or process's real-time policy (`chrt`'s flag and priority), if it has one.
fn rt_policy_of(id: &str) -> Option<(&'static str, String)> {
    let out = Command::new("chrt").args(["-p", id]).output().ok()?;
    let t = String::from_utf8_lossy(&out.stdout);
    let flag = if t.contains("SCHED_FIFO") {
        "-f"
    } else if t.contains("SCHED_RR") {
        "-r"
    } else {
        return None;
    };
    let prio = t.lines().find_map(|l| l.split("priority:").nth(1))?;
    Some((flag, prio.trim().to_owned()))
}

/// `chrt [-a] ARGS… -p PRIO ID`; whether it worked.
fn chrt(all: bool, flag: &str, prio: &str, id: &str) -> bool {
    let mut c = Command::new("chrt");
    if all {
        c.arg("-a");
    }
    c.args([flag, "-p", prio, id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// C1 at the normal scheduling policy, whatever the bench's (`chrt -f 10 ferry bench`):
/// an engine's cgroup refuses real-time tasks, so a container's client cannot have the
/// bench's policy, and a real-time server outside it (C1's redis-server, the remote's
/// iperf3) or a real-time `ferry run` beside it would not be measured alike (measured:
/// redis -P 1 from ferry's container 0.64× `ferry run` under the bench's policy, alike
/// by hand at the normal one). While it lives, the thread that made it (whose children
/// C1 spawns) and the remote namespace's processes run at the normal policy; dropped,
/// they get the bench's back.
#[derive(Debug)]
pub struct NormalPolicy {
    /// The thread's id and policy before.
    thread: Option<(String, &'static str, String)>,
    /// The remote namespace's processes lowered, with their policy before.
    remote: Vec<(String, &'static str, String)>,
}

impl NormalPolicy {
    /// Lowers this thread and the processes of network namespace `remote_ns`.
    pub fn enter(remote_ns: &str) -> NormalPolicy {
        let tid = fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let thread = tid.and_then(|t| {
            let (flag, prio) = rt_policy_of(&t)?;
            chrt(false, "-o", "0", &t).then_some((t, flag, prio))
        });
        let pids = Command::new("ip")
            .args(["netns", "pids", remote_ns])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let remote = pids
            .split_whitespace()
            .filter_map(|pid| {
                let (flag, prio) = rt_policy_of(pid)?;
                chrt(true, "-o", "0", pid).then(|| (pid.to_owned(), flag, prio))
            })
            .collect();
        NormalPolicy { thread, remote }
    }
}

impl Drop for NormalPolicy {
    fn drop(&mut self) {
        for (pid, flag, prio) in &self.remote {
            chrt(true, flag, prio, pid);
        }
        if let Some((tid, flag, prio)) = &self.thread {
            chrt(false, flag, prio, tid);
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    output(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
    )
    .map(|_| ())
}

/// The bridge the engines' containers are on, with the remote namespace on it too.
#[derive(Debug)]
pub struct Lan {
    bridge: String,
    veth: String,
    prefix: String,
}

impl Lan {
    /// A bridge on a free 172.31.x.0/24 (host .1) and a veth into `remote_ns` (.254).
    pub fn make(remote_ns: &str) -> Result<Lan, String> {
        let used = output(Command::new("ip").args(["-o", "-4", "addr"]), "ip addr")?;
        let routes = output(Command::new("ip").args(["-4", "route"]), "ip route")?;
        let third = (160..250)
            .find(|t| {
                let p = format!("172.31.{t}.");
                !used.contains(&p) && !routes.contains(&p)
            })
            .ok_or("no free 172.31.x.0/24 for C1's bridge")?;
        let tag = std::process::id() % 100_000;
        let lan = Lan {
            bridge: format!("c1b{tag}"),
            veth: format!("c1v{tag}"),
            prefix: format!("172.31.{third}"),
        };
        let (b, v, p) = (&lan.bridge, &lan.veth, &lan.prefix);
        ip(&["link", "add", b, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{p}.1/24"), "dev", b])?;
        ip(&["link", "set", b, "up"])?;
        ip(&[
            "link", "add", v, "type", "veth", "peer", "name", "c1r", "netns", remote_ns,
        ])?;
        ip(&["link", "set", v, "master", b, "up"])?;
        let remote = format!("{p}.254/24");
        ip(&["-n", remote_ns, "addr", "add", &remote, "dev", "c1r"])?;
        ip(&["-n", remote_ns, "link", "set", "c1r", "up"])?;
        Ok(lan)
    }

    /// The remote's address on the bridge.
    pub fn remote_ip(&self) -> String {
        format!("{}.254", self.prefix)
    }

    /// The bridge's name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.veth]);
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// Builds the bench image's rootfs in `root` and pipes it to `import`.
fn build_image(root: &Path, import: &[String]) -> Result<(), String> {
    let mut c = Command::new(OTHER[0]);
    c.args(&OTHER[1..])
        .args(["bash", "-c", IMAGE_SCRIPT, "oci-image.sh", "bench"])
        .arg(root)
        .args(import)
        .stdout(Stdio::null());
    output(
        &mut c,
        "building the bench image (scripts/oci-image.sh bench)",
    )
    .map(|_| ())
}

/// A dockerd of C1's own, with `ferry oci` registered as runtime `ferry` (and a
/// baseline build's as [`BASE_RUNTIME`]).
#[derive(Debug)]
pub struct Docker {
    dir: PathBuf,
    daemon: Child,
}

impl Docker {
    /// Starts dockerd with its state in `dir`, containers on `bridge`, the host's
    /// firewall and forwarding untouched; imports the bench image. `base`: another
    /// build's `ferry`, registered by its own `ferry oci install` as [`BASE_RUNTIME`].
    pub fn start(
        dir: &Path,
        ferry: &Path,
        base: Option<&Path>,
        bridge: &str,
    ) -> Result<Docker, String> {
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let config = dir.join("daemon.json");
        fs::write(&config, "{}").map_err(|e| format!("{}: {e}", config.display()))?;
        // `ferry`: its defaults; `ferry-pub`: nginx's port published too (Debian's
        // dockerd speaks API 1.41: no `--annotation`, so a preset).
        let base = base.map(|b| (b, BASE_RUNTIME, None));
        let ours = [("ferry", None), (PUBLISHING, Some(PUBLISH))].map(|(n, p)| (ferry, n, p));
        for (ferry, name, preset) in ours.into_iter().chain(base) {
            let mut install = Command::new(ferry);
            install.arg("oci");
            if let Some(p) = preset {
                install.args(["--preset", p]);
            }
            install.args(["install", "--docker", "--name", name, "--config"]);
            output(install.arg(&config), "ferry oci install --docker")?;
        }
        let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
        let log = fs::File::create(dir.join("dockerd.log")).map_err(|e| e.to_string())?;
        let daemon = Command::new(OTHER[0])
            .args(&OTHER[1..])
            .args(["unshare", "-m", "--propagation", "private", "--", "dockerd"])
            .args(["--data-root", &p("data"), "--exec-root", &p("exec")])
            .args(["--pidfile", &p("pid"), "--config-file", &p("daemon.json")])
            .args(["-H", &format!("unix://{}", p("sock")), "--bridge", bridge])
            .args(["--iptables=false", "--ip-forward=false", "--ip-masq=false"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting dockerd: {e}"))?;
        let docker = Docker {
            dir: dir.to_owned(),
            daemon,
        };
        let t = Instant::now();
        while output(&mut docker.command(&["info"]), "docker info").is_err() {
            if t.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "dockerd did not come up in 30 s (see {})",
                    dir.join("dockerd.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut import = docker.argv();
        import.extend(["import", "-", IMAGE].map(str::to_owned));
        build_image(&dir.join("image"), &import)?;
        Ok(docker)
    }

    /// `docker -H SOCK` as argv.
    pub fn argv(&self) -> Vec<String> {
        let sock = format!("unix://{}", self.dir.join("sock").display());
        let mut v: Vec<String> = OTHER.map(str::to_owned).into();
        v.extend(["docker".into(), "-H".into(), sock]);
        v
    }

    /// `docker -H SOCK ARGS…`.
    pub fn command(&self, args: &[&str]) -> Command {
        let argv = self.argv();
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]).args(args).stdin(Stdio::null());
        c
    }

    /// A long-lived container running [`RUNNER`] with `docker run -d OPTS…` (its
    /// network served by ferry when OPTS name a ferry runtime), its
    /// directory in `dir`.
    pub fn container(&self, name: &str, opts: &[&str], dir: &Path) -> Result<Ctr, String> {
        let mount = runner_dir(dir)?;
        let mut args = vec!["run", "-d", "-v", &mount];
        args.extend(opts);
        args.extend([IMAGE, "sh", "-c", RUNNER]);
        let id = output(&mut self.command(&args), &format!("{name}: docker run"))?;
        let inspect = ["inspect", "-f", "{{.State.Pid}}", &id];
        let pid = output(&mut self.command(&inspect), "docker inspect")?;
        let helper = if opts.contains(&"ferry") || opts.contains(&PUBLISHING) {
            Helper::FerrySide(id.clone())
        } else {
            Helper::None
        };
        Ctr::new(dir, id, &pid, helper)
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        if let Ok(ids) = output(&mut self.command(&["ps", "-aq"]), "docker ps") {
            for id in ids.split_whitespace() {
                let _ = output(&mut self.command(&["rm", "-f", id]), "docker rm");
            }
        }
        ferry_sandbox::testbed::terminate(&mut self.daemon, Duration::from_secs(15));
    }
}

/// Rootful Podman with storage of its own; every call in one private mount namespace
/// (held by a `sleep`), so that its mounts never reach the host's.
#[derive(Debug)]
pub struct Podman {
    dir: PathBuf,
    holder: Daemon,
    version: String,
}

impl Podman {
    /// Its storage under `dir`; imports the bench image.
    pub fn start(dir: &Path) -> Result<Podman, String> {
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut hold = Command::new("unshare");
        hold.args(["-m", "--propagation", "private", "--"])
            .args(OTHER)
            .args(["sleep", "1000000"]);
        let holder = Daemon::spawn("podman's mount namespace", &mut hold)
            .map_err(|e| format!("unshare -m: {e}"))?;
        // The namespace exists once unshare has become sleep.
        let t = Instant::now();
        while fs::read_link(format!("/proc/{}/exe", holder.pid()))
            .is_ok_and(|e| !e.to_string_lossy().contains("sleep"))
            && t.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut p = Podman {
            dir: dir.to_owned(),
            holder,
            version: String::new(),
        };
        let v = output(&mut p.command(&["--version"]), "podman --version")?;
        p.version = v;
        let mut import = p.argv();
        import.extend(["import", "-", IMAGE].map(str::to_owned));
        build_image(&dir.join("image"), &import)?;
        Ok(p)
    }

    /// `podman --version`'s line.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `nsenter … podman --root … ` as argv.
    pub fn argv(&self) -> Vec<String> {
        let d = |n: &str| self.dir.join(n).to_string_lossy().into_owned();
        let mut v: Vec<String> = OTHER.map(str::to_owned).into();
        v.extend(["nsenter", "-t", &self.holder.pid().to_string(), "-m"].map(str::to_owned));
        v.extend(["--", "podman", "--root", &d("root"), "--runroot", &d("run")].map(str::to_owned));
        v.extend(
            [
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
            ]
            .map(str::to_owned),
        );
        v
    }

    /// `podman ARGS…`.
    pub fn command(&self, args: &[&str]) -> Command {
        let argv = self.argv();
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]).args(args).stdin(Stdio::null());
        c
    }

    /// Whether this Podman has `--network pasta` (Podman 4.4 and later).
    fn has_pasta(&self) -> bool {
        podman_has_pasta(&self.version)
    }

    /// A long-lived container running [`RUNNER`] on `net`, publishing `publish`
    /// (`127.0.0.1:HOST_PORT:PORT`), its directory in `dir`.
    pub fn container(
        &self,
        name: &str,
        net: &UserNet,
        publish: &str,
        dir: &Path,
    ) -> Result<Ctr, String> {
        let mount = runner_dir(dir)?;
        // A Podman without pasta's network gets it as a newer one makes it.
        let own = match net {
            UserNet::Pasta(pasta) if !self.has_pasta() => Some(PastaNet::up(pasta, publish)?),
            _ => None,
        };
        let network = match (net, &own) {
            (_, Some(o)) => o.network(),
            (UserNet::Slirp4netns, None) => "slirp4netns".to_owned(),
            (UserNet::Pasta(_), None) => "pasta".to_owned(),
        };
        let mut args = vec!["run", "-d", "-v", &mount, "--network", &network];
        if own.is_none() {
            args.extend(["-p", publish]);
        }
        // This root lacks CAP_SYS_RESOURCE: podman's default limits are above the hard ones.
        args.extend([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ]);
        args.extend([IMAGE, "sh", "-c", RUNNER]);
        let id = output(&mut self.command(&args), &format!("{name}: podman run"))?;
        let inspect = ["inspect", "-f", "{{.State.Pid}}", &id];
        let pid = output(&mut self.command(&inspect), "podman inspect")?;
        let helper = match (net, &own) {
            // Ours: its pid (Debian's pasta runs as `passt.avx2`, whatever it was called).
            (_, Some(o)) => Helper::Pid(o.pid()),
            (UserNet::Slirp4netns, None) => Helper::Comm(&["slirp4netns"]),
            // pasta is passt's binary: its command name may be either.
            (UserNet::Pasta(_), None) => Helper::Comm(&["pasta", "passt"]),
        };
        let mut ctr = Ctr::new(dir, id, &pid, helper)?;
        ctr._net = own;
        Ok(ctr)
    }
}

/// `podman --version`'s line names 4.4 or later (which has `--network pasta`).
fn podman_has_pasta(version: &str) -> bool {
    let Some(v) = version.split_whitespace().last() else {
        return false;
    };
    let mut n = v.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
    let (major, minor) = (n.next().unwrap_or(0), n.next().unwrap_or(0));
    (major, minor) >= (4, 4)
}

/// A rootless engine's user-mode network for a Podman container.
#[derive(Clone, Debug)]
pub enum UserNet {
    /// Podman's `--network slirp4netns`.
    Slirp4netns,
    /// Podman's `--network pasta`, with this pasta.
    Pasta(PathBuf),
}

/// Podman 4.4's `--network pasta` for an older Podman (Debian 12's is 4.3): a network
/// namespace (named, held by a `sleep` in it), pasta attached to it as Podman attaches it
/// (`--config-net`, the published port as `-t ADDR/PORT:TARGET`, nothing else
/// forwarded, in the foreground), and the container joins it (`--network ns:PATH`).
#[derive(Debug)]
pub struct PastaNet {
    pasta: Option<Daemon>,
    holder: Daemon,
    /// The namespace's name (`ip netns`).
    name: String,
}

impl PastaNet {
    fn up(pasta: &Path, publish: &str) -> Result<PastaNet, String> {
        let forward = pasta_forward(publish)?;
        // pasta opens a named namespace (not another process's /proc/PID/ns/net, which
        // it may not once it has given up its privileges).
        let name = format!("ferry-c1-pasta-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        output(
            Command::new("ip").args(["netns", "add", &name]),
            "ip netns add",
        )?;
        let mut hold = Command::new("ip");
        hold.args(["netns", "exec", &name, "sleep", "1000000"]);
        let holder = Daemon::spawn("pasta's namespace", &mut hold);
        let mut net = PastaNet {
            pasta: None,
            holder: holder.map_err(|e| format!("ip netns exec: {e}"))?,
            name,
        };
        let mut cmd = Command::new(pasta);
        cmd.args([
            "--config-net",
            "--netns",
            &format!("/run/netns/{}", net.name),
        ])
        .args(["--runas", "0:0", "-f", "-q", "-t", &forward])
        .args(["-u", "none", "-T", "none", "-U", "none"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut d =
            Daemon::spawn("pasta", &mut cmd).map_err(|e| format!("{}: {e}", pasta.display()))?;
        let t = Instant::now();
        let dev = format!("/proc/{}/net/dev", net.holder.pid());
        // Two header lines, lo, and pasta's interface once it is there.
        while !fs::read_to_string(&dev).is_ok_and(|d| d.lines().count() > 3) {
            if !d.alive() || t.elapsed() > Duration::from_secs(5) {
                return Err("pasta did not configure the container's namespace".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        net.pasta = Some(d);
        Ok(net)
    }

    /// pasta's pid (0 before it runs).
    fn pid(&self) -> u32 {
        self.pasta.as_ref().map_or(0, Daemon::pid)
    }

    /// Podman's `--network` for the namespace.
    fn network(&self) -> String {
        format!("ns:/proc/{}/ns/net", self.holder.pid())
    }
}

impl Drop for PastaNet {
    fn drop(&mut self) {
        // The name only: the namespace ends with the last process in it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Podman's `-p 127.0.0.1:HOST_PORT:PORT` as pasta's `-t 127.0.0.1/HOST_PORT:PORT`.
fn pasta_forward(publish: &str) -> Result<String, String> {
    match publish.rsplitn(3, ':').collect::<Vec<_>>()[..] {
        [to, from, addr] => Ok(format!("{addr}/{from}:{to}")),
        _ => Err(format!("cannot forward {publish:?} with pasta")),
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = output(&mut self.command(&["rm", "-af", "-t", "0"]), "podman rm");
    }
}

/// What serves a container's network outside its cgroup.
#[derive(Clone, Debug)]
enum Helper {
    /// Nothing (the kernel: bridge, host network).
    None,
    /// ferry's network side for the container id (`ferry oci _serve --id ID`).
    FerrySide(String),
    /// A process of ours whose command name starts with one of these (podman's
    /// slirp4netns or pasta).
    Comm(&'static [&'static str]),
    /// This process of ours (pasta attached by the bench).
    Pid(u32),
}

/// The container's first process: runs each command line written to `/c/in` (a FIFO)
/// with its output in `/c/out` and `/c/err`, then its status in `/c/rc`. Commands are
/// not `exec`ed by the engine: they are the first process's children, in the sandbox
/// as the container's own processes are (ferry's servers refuse `docker exec`'s).
pub const RUNNER: &str = "while true; do read -r cmd < /c/in || exit 1; \
    sh -c \"$cmd\" > /c/out 2> /c/err; echo $? > /c/rc; done";

/// nginx's configuration in a container: listening on `port`, serving `/c/www`,
/// daemonised (the runner goes on), its temporary files in `/tmp`.
pub fn nginx_conf(port: u16) -> String {
    format!(
        "worker_processes 1;\nuser root;\npid /tmp/nginx.pid;\nerror_log /c/nginx-error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  sendfile on;\n  keepalive_requests 1000000;\n\
         \x20 client_body_temp_path /tmp/b;\n  proxy_temp_path /tmp/p;\n  fastcgi_temp_path /tmp/f;\n\
         \x20 uwsgi_temp_path /tmp/u;\n  scgi_temp_path /tmp/s;\n\
         \x20 default_type application/octet-stream;\n\
         \x20 server {{ listen {port}; root /c/www; }}\n}}\n"
    )
}

/// A free TCP port on the host's loopback (for a published port).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Makes `dir` with the runner's FIFO; its `-v` argument.
fn runner_dir(dir: &Path) -> Result<String, String> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let fifo = dir.join("in");
    let st = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .map_err(|e| format!("mkfifo: {e}"))?;
    if !st.success() {
        return Err(format!("mkfifo {} failed", fifo.display()));
    }
    Ok(format!("{}:/c", dir.display()))
}

/// A running container with [`RUNNER`] as its first process.
#[derive(Debug)]
pub struct Ctr {
    /// The runner's directory on the host.
    dir: PathBuf,
    /// Its first process's cgroup CPU file.
    cpu_file: Option<CpuFile>,
    helper: Helper,
    /// The network made for it outside the engine (pasta for an older Podman).
    _net: Option<PastaNet>,
}

/// A command's end in the container: status, stdout, stderr.
#[derive(Debug)]
pub struct Ran {
    /// Its exit status (None: it did not end before the deadline).
    pub code: Option<i32>,
    /// Its output.
    pub stdout: String,
    /// Its errors.
    pub stderr: String,
}

impl Ctr {
    fn new(dir: &Path, id: String, pid: &str, helper: Helper) -> Result<Ctr, String> {
        let pid: u32 = pid
            .trim()
            .parse()
            .map_err(|_| format!("container {id}: no pid ({pid:?})"))?;
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let cpu_file = cgroup_cpu_file(&cgroup, "/sys/fs/cgroup", &v2_root());
        let ctr = Ctr {
            dir: dir.to_owned(),
            cpu_file,
            helper,
            _net: None,
        };
        Ok(ctr)
    }

    /// Starts nginx in the container on `port`, serving `files` (name, length).
    pub fn start_nginx(&self, port: u16, files: &[(&str, usize)]) -> Result<(), String> {
        let www = self.dir.join("www");
        fs::create_dir_all(&www).map_err(|e| format!("{}: {e}", www.display()))?;
        for (name, len) in files {
            let body: Vec<u8> = (0..*len).map(|i| b'a' + (i % 26) as u8).collect();
            fs::write(www.join(name), body).map_err(|e| format!("{name}: {e}"))?;
        }
        let conf = self.dir.join("nginx.conf");
        fs::write(&conf, nginx_conf(port)).map_err(|e| format!("nginx.conf: {e}"))?;
        let argv = ["nginx", "-c", "/c/nginx.conf", "-e", "/c/nginx-error.log"].map(str::to_owned);
        let ran = self.run(&argv, Instant::now() + Duration::from_secs(20), &|| false)?;
        if ran.code != Some(0) {
            return Err(format!(
                "nginx in the container: {:?} {}",
                ran.code,
                ran.stderr.trim()
            ));
        }
        Ok(())
    }

    /// Runs `argv` in the container; waits for its end until `deadline` or `stop`.
    pub fn run(
        &self,
        argv: &[String],
        deadline: Instant,
        stop: &dyn Fn() -> bool,
    ) -> Result<Ran, String> {
        let rc = self.dir.join("rc");
        let _ = fs::remove_file(&rc);
        let line = format!("{}\n", super::core::shell_words(argv));
        // Opening blocks until the runner reads: not past the deadline (its own thread).
        let fifo = self.dir.join("in");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = fs::OpenOptions::new()
                .write(true)
                .open(&fifo)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            let _ = tx.send(r);
        });
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("writing to the container's runner: {e}")),
            Err(_) => return Err("the container's runner did not take the command".into()),
        }
        loop {
            let done = fs::read_to_string(&rc).ok().filter(|s| s.ends_with('\n'));
            if let Some(code) = done {
                let read = |n: &str| fs::read_to_string(self.dir.join(n)).unwrap_or_default();
                return Ok(Ran {
                    code: code.trim().parse().ok(),
                    stdout: read("out"),
                    stderr: read("err"),
                });
            }
            if Instant::now() > deadline || stop() {
                return Ok(Ran {
                    code: None,
                    stdout: String::new(),
                    stderr: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// CPU time so far of the container's cgroup and of what serves its network
    /// outside it; None when the cgroup's time cannot be read.
    pub fn cpu(&self) -> Option<Duration> {
        let f = self.cpu_file.as_ref()?;
        let ns = f.parse_ns(&fs::read_to_string(f.path()).ok()?)?;
        Some(Duration::from_nanos(ns + self.helper_ns()))
    }

    fn helper_ns(&self) -> u64 {
        self.helpers().into_iter().map(run_ns).sum()
    }

    /// The processes serving the container's network from outside it.
    fn helpers(&self) -> BTreeSet<u32> {
        let mine = with_descendants(std::process::id());
        let roots: Vec<u32> = match &self.helper {
            Helper::None => return BTreeSet::new(),
            Helper::FerrySide(id) => all_pids()
                .into_iter()
                .filter(|p| is_side_of(*p, id))
                .collect(),
            Helper::Comm(names) => mine
                .into_iter()
                .filter(|p| names.iter().any(|c| comm_is(*p, c)))
                .collect(),
            Helper::Pid(pid) => vec![*pid],
        };
        roots.into_iter().flat_map(with_descendants).collect()
    }
}

fn v2_root() -> String {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup".into()
    } else {
        "/sys/fs/cgroup/unified".into()
    }
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` is ferry's network side (or a fork of it) for container `id`.
fn is_side_of(pid: u32, id: &str) -> bool {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    args.len() > 4 && args[1] == b"oci" && args[2] == b"_serve" && args[4] == id.as_bytes()
}

fn comm_is(pid: u32, comm: &str) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim().starts_with(comm))
}

/// Nanoseconds every thread of `pid` has run (`schedstat`).
fn run_ns(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| crate::parse::schedstat_run_ns(&s).ok())
        .sum()
}

/// redis-server in the remote namespace on the bridge's address (the testbed's binds
/// its veth address only).
#[derive(Debug)]
pub struct Redis {
    daemon: Daemon,
}

impl Redis {
    /// Starts it and waits until it answers.
    pub fn start(remote_ns: &str, ip: &str, port: u16, dir: &Path) -> Result<Redis, String> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", remote_ns, "redis-server"])
            .args(["--port", &port.to_string(), "--bind", ip, "--save", ""])
            .args(["--appendonly", "no", "--protected-mode", "no", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let daemon = Daemon::spawn("redis-server (C1)", &mut c).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let port = port.to_string();
        loop {
            let ping = Command::new("redis-cli")
                .args(["-h", ip, "-p", &port, "ping"])
                .output();
            if ping.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG")) {
                return Ok(Redis { daemon });
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err(format!("redis-server on {ip}:{port} did not answer"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its CPU time so far.
    pub fn cpu(&self) -> Duration {
        Duration::from_nanos(
            with_descendants(self.daemon.pid())
                .into_iter()
                .map(run_ns)
                .sum(),
        )
    }
}

#[cfg(test)]
mod pasta_tests {
    use super::*;

    #[test]
    fn podman_4_4_and_later_have_pasta() {
        assert!(!podman_has_pasta("podman version 4.3.1"));
        assert!(podman_has_pasta("podman version 4.4.0"));
        assert!(podman_has_pasta("podman version 5.2.2"));
        assert!(!podman_has_pasta("podman version 3.9"));
        assert!(!podman_has_pasta(""));
    }

    #[test]
    fn a_published_port_is_forwarded_by_pasta_from_the_same_address() {
        assert_eq!(
            pasta_forward("127.0.0.1:40123:8080").unwrap(),
            "127.0.0.1/40123:8080"
        );
        assert!(pasta_forward("8080").is_err());
    }
}
