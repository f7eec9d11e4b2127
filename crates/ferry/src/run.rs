//! `ferry run`: sandbox + protocol server + the program, with its exit status passed on.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::Args;
use ferry_sandbox::{SocketFactory, SocketWatch, Spec, UserNs};
use ferry_server::{
    Accepted, Assign, Bond, Config, Mode, Policy, Publish, Rule, Server, Servers, Verdict,
};
use tracing::{debug, warn};

/// Exit status when ferry itself fails before the program runs.
pub const EXIT_SETUP: i32 = 125;

/// Exit status for a bad option value found after parsing (as clap's usage errors).
pub const EXIT_USAGE: i32 = 2;

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// Spin span of a waiting call before it sleeps (S0's SBW), e.g. 0, 10us, 1ms.
    #[arg(long, value_name = "SPAN", default_value = "200us", value_parser = crate::args::span)]
    pub spin: Duration,
    /// Spin span of the protocol server's loop before it sleeps.
    #[arg(long, value_name = "SPAN", default_value = "200us", value_parser = crate::args::span)]
    pub server_spin: Duration,
    /// Ring the server's doorbell once per N queued operations (S1 batching; 1 = always).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub batch: u32,
    /// With --batch > 1: the longest a queued operation waits before the server looks.
    #[arg(long, value_name = "SPAN", default_value = "50us", value_parser = crate::args::span)]
    pub batch_delay: Duration,
    /// Allow egress to CIDR[:PORT] (with any --allow, everything else is denied). IPv4
    /// link-local (169.254.0.0/16, cloud metadata) is reached only through an --allow
    /// inside it, e.g. --allow 169.254.169.254/32 --allow 0.0.0.0/0 --allow ::/0.
    #[arg(long, value_name = "CIDR[:PORT]")]
    pub allow: Vec<String>,
    /// Deny egress to CIDR[:PORT].
    #[arg(long, value_name = "CIDR[:PORT]")]
    pub deny: Vec<String>,
    /// DNS for the sandbox's resolver: `auto` (forward to the host's nameservers), `off`,
    /// or upstream servers `IP[:PORT],…` to forward to instead.
    #[arg(long, value_name = "auto|off|IP[:PORT],…", default_value = "auto")]
    pub dns: String,
    /// Egress bonding: new outgoing connections leave from these host source addresses
    /// (IPv4 or IPv6; an interface name means its addresses), spread by --bond. A
    /// connection keeps its address.
    #[arg(long, value_name = "ADDR|IF[,…]", value_delimiter = ',')]
    pub egress: Vec<String>,
    /// How --egress spreads connections: rr (in turn), xor (by destination address and
    /// port), least (fewest open connections). Default: rr.
    #[arg(long, value_name = "rr|xor|least", requires = "egress", value_parser = ["rr", "xor", "least"])]
    pub bond: Option<String>,
    /// Publish a sandbox port on the host: [IP:]HOST_PORT:PORT[/udp]. Without IP, on every
    /// address of both families.
    #[arg(short = 'p', long = "publish", value_name = "[IP:]HOST_PORT:PORT[/udp]", value_parser = crate::args::publish)]
    pub publish: Vec<Publish>,
    /// Protocol servers (threads) serving the sandbox, each with its own channels and
    /// sockets (S4); new sockets are spread over them by --assign.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=ferry_proto::MAX_SERVERS as i64))]
    pub servers: u16,
    /// Pin server K to the K-th CPU of LIST (round robin), e.g. 0,1 or 0-3. Default: not
    /// pinned (the scheduler places them).
    #[arg(long, value_name = "LIST", value_parser = crate::args::cpu_list)]
    pub cpus: Option<crate::args::CpuList>,
    /// How a new socket picks its server: least (fewest outstanding requests), rr, hash.
    #[arg(long, value_name = "least|rr|hash", default_value = "least")]
    pub assign: Assign,
    /// Where accepted connections go: assign (like new sockets) or listener (the
    /// listener's server).
    #[arg(long, value_name = "assign|listener", default_value = "assign")]
    pub accepted: Accepted,
    /// How received TCP bytes reach the program: pair (the server moves them into the
    /// program's fd, read with the kernel's own calls: no round trip per read) or ring
    /// (each read asks the server, which receives into the channel's buffers).
    #[arg(long, value_name = "pair|ring", default_value = "pair")]
    pub rx: Rx,
    /// Bind a data-path module (WebAssembly, `.wasm` or `.wat`) to connections accepted
    /// through a published port (PORT = the sandbox port of a `-p`) or made to a
    /// destination (IP:PORT); what the program sends on them is the module's input, what
    /// it emits goes out. E.g. `-p 8080:80 --module 80=gzip.wat,http=1`. Repeatable.
    #[arg(long = "module", value_name = "PORT|IP:PORT=FILE[,key=value…]", value_parser = crate::args::module)]
    pub modules: Vec<crate::args::ModuleSpec>,
    /// Longest a module callback may run before the module is stopped (and its
    /// connection reset).
    #[arg(long, value_name = "SPAN", default_value = "5ms", value_parser = crate::args::span)]
    pub module_deadline: Duration,
    /// How the sandbox reaches the network: socket (the shim serves programs linked to
    /// libc; the others see only lo), nic (a TAP device `eth0` served by ferry's NIC
    /// servers: any program, static and Go ones and ping included), both (the default:
    /// the shim where it reaches, the TAP for the rest).
    #[arg(long, value_name = "socket|nic|both", default_value = "both")]
    pub net: Net,
    /// NIC servers (threads), one TAP queue each, with --net nic|both (S2, S4): the
    /// sandbox's kernel spreads its flows over the queues.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub nic_servers: u16,
    /// MTU of the sandbox's TAP with --net nic|both (default: the largest, as measured
    /// in `ferry bench E5`).
    #[arg(long, value_name = "BYTES", default_value_t = ferry_nic::DEFAULT_MTU, value_parser = clap::value_parser!(u32).range(1280..=65520))]
    pub mtu: u32,
    /// Time the NIC servers' stages (TAP read, stack, host sockets, TAP write, wake) into
    /// the counters (`--stats`, `--stats-json`): for `ferry bench E5`.
    #[arg(long, hide = true)]
    pub nic_timing: bool,
    /// Print per-server, per-channel and per-socket counters when the program exits.
    #[arg(long)]
    pub stats: bool,
    /// Write the counters as JSON to FILE when the program exits.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// The sandbox's host identity. auto (= always): a user namespace whose root is an
    /// unprivileged host identity (your own uid; as root, root's subordinate ids from
    /// /etc/subuid, else 2000000000-2000065535). never (root only): the sandbox's root
    /// is the host's root, and a program in it can leave the sandbox: the policy no
    /// longer binds it.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub userns: String,
    /// Share a host path with the sandbox as its own (repeatable; `:ro` for reading
    /// only). Run by root, the sandbox's root is the owner there of what host root owns
    /// (an idmapped mount), and nowhere else; never /, a system directory (/etc, /usr,
    /// /var, …) or anything in or above one. The working directory is shared only when
    /// named (`--volume .`).
    #[arg(long = "volume", value_name = "PATH[:ro]", value_parser = crate::args::volume)]
    pub volumes: Vec<ferry_sandbox::Volume>,
    /// Most channels (one per thread and server) the sandbox may have open at once.
    #[arg(long, value_name = "N", default_value_t = ferry_server::DEFAULT_MAX_CHANNELS, value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u32).range(1..=65536), |v| v as usize))]
    pub max_channels: usize,
    /// Most sockets the sandbox may have open at once (default: what ferry's descriptor
    /// limit allows, two descriptors each).
    #[arg(long, value_name = "N", value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u32).range(1..=1048576), |v| v as usize))]
    pub max_sockets: Option<usize>,
    /// Leave the protocol servers unconfined: they keep this process's capabilities and
    /// may make any system call (see docs/SECURITY.md). For debugging and measurements.
    #[arg(long)]
    pub unconfined: bool,
    /// More log output (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// The program and its arguments.
    #[arg(required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// Sets up logging to stderr at the level `-v` asks for (`FERRY_LOG` overrides).
pub fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Builds the policy from `--allow`/`--deny` in command-line order.
fn policy(a: &RunArgs) -> Result<Policy, String> {
    // clap keeps each option's values in order but not their interleaving; deny rules go
    // first so that a deny inside an allowed range wins.
    let mut rules = Vec::new();
    for d in &a.deny {
        rules.push(Rule::parse(Verdict::Deny, d).map_err(|e| format!("--deny {d}: {e}"))?);
    }
    for al in &a.allow {
        rules.push(Rule::parse(Verdict::Allow, al).map_err(|e| format!("--allow {al}: {e}"))?);
    }
    Ok(Policy::new(rules))
}

/// Where the shim library is: `FERRY_PRELOAD`, or next to the ferry binary.
pub fn find_preload() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FERRY_PRELOAD") {
        return Ok(PathBuf::from(p));
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the ferry binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [
        dir.join("libferry_preload.so"),
        dir.join("deps/libferry_preload.so"),
        dir.join("../lib/ferry/libferry_preload.so"),
    ] {
        if cand.is_file() {
            return Ok(cand);
        }
    }
    Err(format!(
        "cannot find libferry_preload.so next to {} (build the whole workspace: `cargo build --release`), or set FERRY_PRELOAD",
        exe.display()
    ))
}

/// The shim where the sandbox's processes can read it: `preload` itself when every
/// directory above it may be searched and the file read by anyone, else a copy in the
/// sandbox's directory `dir` (which they can search).
fn readable_preload(preload: &Path, dir: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode()).ok();
    let open = preload.canonicalize().ok().is_some_and(|full| {
        mode(&full).is_some_and(|m| m & 0o004 != 0)
            && full
                .ancestors()
                .skip(1)
                .all(|d| mode(d).is_some_and(|m| m & 0o001 != 0))
    });
    if open {
        return Ok(preload.to_path_buf());
    }
    let copy = dir.join("libferry_preload.so");
    std::fs::copy(preload, &copy)
        .and_then(|_| ferry_sys::chmod(&copy, 0o644))
        .map_err(|e| format!("cannot copy {} for the sandbox: {e}", preload.display()))?;
    debug!("the shim is copied to {} for the sandbox", copy.display());
    Ok(copy)
}

/// Warns when CMD is a static binary: the shim cannot reach it, so it only sees `lo`.
/// Only when the sandbox's socket watch is off (an old kernel, or ferry inside a sandbox
/// that watches already): the watch tells every such process, when it makes a socket.
fn warn_if_static(cmd: &OsString) {
    let path = if cmd.to_string_lossy().contains('/') {
        Some(PathBuf::from(cmd))
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(cmd))
                .find(|c| c.is_file())
        })
    };
    let Some(path) = path else { return };
    if let Ok(bytes) = std::fs::read(&path)
        && is_static_elf(&bytes)
    {
        warn!(
            "{} is statically linked: ferry's socket shim cannot serve it, so it sees only the sandbox's loopback (--net nic or both serves it)",
            path.display()
        );
    }
}

/// An ELF64 executable without a `PT_INTERP` program header.
fn is_static_elf(b: &[u8]) -> bool {
    let rd16 = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    let rd32 = |o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    let rd64 = |o: usize| {
        b.get(o..o + 8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
    };
    if b.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (rd64(32), rd16(54), rd16(56)) else {
        return false;
    };
    !(0..usize::from(phnum)).any(|i| rd32(phoff as usize + i * usize::from(phentsize)) == Some(3))
}

/// Reads the `--module` files and checks their targets.
fn module_rules(a: &RunArgs) -> Result<Vec<ferry_server::ModuleRule>, String> {
    let mut rules = Vec::new();
    for m in &a.modules {
        if let ferry_server::ModuleTarget::Port(p) = m.target
            && !a.publish.iter().any(|x| x.sandbox_port == p && !x.udp)
        {
            return Err(format!(
                "--module {p}=…: no TCP port {p} is published (-p HOST_PORT:{p})"
            ));
        }
        let module = std::fs::read(&m.path)
            .map_err(|e| format!("--module: cannot read {}: {e}", m.path.display()))?;
        rules.push(ferry_server::ModuleRule {
            target: m.target,
            module,
            props: m.props.clone(),
        });
    }
    Ok(rules)
}

pub fn main(a: RunArgs) -> i32 {
    init_logging(a.verbose);
    crate::log_nofile();
    let bond = match bond(&a) {
        Ok(b) => b,
        Err(msg) => {
            eprintln!("ferry: {msg}");
            return EXIT_USAGE;
        }
    };
    match run(a, bond) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("ferry: {msg}");
            EXIT_SETUP
        }
    }
}

/// Builds the bond from `--egress`/`--bond`; every address must be on this host.
fn bond(a: &RunArgs) -> Result<Option<Arc<Bond>>, String> {
    if a.egress.is_empty() {
        return Ok(None);
    }
    let mode: Mode = a.bond.as_deref().unwrap_or("rr").parse()?;
    let addrs = crate::args::egress_sources(&a.egress, &host_addresses()?)?;
    Ok(Some(Arc::new(Bond::new(mode, addrs))))
}

/// The addresses of the caller's network namespace with their interfaces' names.
fn host_addresses() -> Result<Vec<(String, IpAddr)>, String> {
    let addrs = ferry_sys::interface_addresses()
        .map_err(|e| format!("--egress: cannot list this host's addresses: {e}"))?;
    let mut names = std::collections::HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/sys/class/net") {
        for entry in dir.flatten() {
            let index = std::fs::read_to_string(entry.path().join("ifindex"))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok());
            if let Some(index) = index {
                names.insert(index, entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    Ok(addrs
        .into_iter()
        .map(|(index, ip)| (names.get(&index).cloned().unwrap_or_default(), ip))
        .collect())
}

fn run(a: RunArgs, bond: Option<Arc<Bond>>) -> Result<i32, String> {
    let policy = policy(&a)?;
    let policy_for_dns = policy.clone();
    dns_upstreams(&a.dns, &[])?; // refuse a malformed --dns before anything starts
    // nic mode alone needs no shim.
    let preload = if a.net == Net::Nic {
        None
    } else {
        Some(find_preload()?)
    };
    // The run's private directory (the admin socket: this user only) and, beside it,
    // the sandbox's (its control socket).
    let dir = std::env::temp_dir().join(format!("ferry-{}-{}", std::process::id(), nanos()));
    let sandbox_dir = dir.with_extension("sandbox");
    let mkdir = |d: &Path, mode| {
        std::fs::create_dir(d)
            .and_then(|()| ferry_sys::chmod(d, mode))
            .map_err(|e| format!("cannot create {}: {e}", d.display()))
    };
    mkdir(&dir, 0o700)?;
    let _cleanup = RemoveDir(dir.clone());
    // Traversable by the sandbox's users (whatever uid a program switches to, it needs
    // the control socket); not listable.
    mkdir(&sandbox_dir, 0o711)?;
    let _cleanup_sandbox = RemoveDir(sandbox_dir.clone());
    let sock_path = sandbox_dir.join("ctl.sock");
    // The sandbox's processes run as another host user: the shim must be where they can
    // read it.
    let preload = match preload {
        Some(p) => Some(readable_preload(&p, &sandbox_dir)?),
        None => None,
    };
    // The watch knows the shim by the path its processes map it at.
    let shim = preload
        .as_ref()
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()));

    let mut cfg = Config::new(sock_path.clone());
    cfg.shim_spin = a.spin;
    cfg.server_spin = a.server_spin;
    cfg.batch = a.batch;
    cfg.batch_delay = a.batch_delay;
    cfg.policy = policy;
    // In nic mode TCP ports are published to the sandbox's address on the TAP (whatever
    // serves them); with the shim there too (`both`) they stay socket mode's, which
    // hands them to the shim's listeners (loopback-bound ones and modules included),
    // and a connection to a port no listener of the shim's is on to the TAP (`tap`: a
    // static or Go server). UDP ports keep socket mode's flows (made inside the
    // sandbox, they reach any program).
    let nic_on = a.net != Net::Socket;
    let (nic_publish, publish): (Vec<Publish>, Vec<Publish>) =
        a.publish.iter().partition(|p| a.net == Net::Nic && !p.udp);
    cfg.publish = publish;
    let tap = if a.net == Net::Both && cfg.publish.iter().any(|p| !p.udp) {
        let h = ferry_server::TapHandoff::new()
            .map_err(|e| format!("cannot set up the published ports' handoff: {e}"))?;
        Some(Arc::new(h))
    } else {
        None
    };
    cfg.tap = tap.clone();
    cfg.egress = bond.clone();
    cfg.servers = usize::from(a.servers);
    cfg.assign = a.assign;
    cfg.accepted = a.accepted;
    cfg.rx_pair = a.rx == Rx::Pair;
    cfg.max_channels = a.max_channels;
    cfg.max_sockets = a
        .max_sockets
        .unwrap_or_else(|| ferry_server::default_max_sockets(a.max_channels));
    cfg.cpus = match &a.cpus {
        Some(crate::args::CpuList(list)) => {
            let allowed = ferry_sys::allowed_cpus().unwrap_or_default();
            if let Some(bad) = list
                .iter()
                .find(|c| !allowed.is_empty() && !allowed.contains(c))
            {
                return Err(format!(
                    "--cpus: CPU {bad} is not available (this process may use {})",
                    crate::args::format_cpus(&allowed)
                ));
            }
            list.clone()
        }
        // Unpinned by default: on a small machine the scheduler places the servers beside
        // the program and its peers better than a fixed CPU each (measured in E7).
        None => Vec::new(),
    };
    cfg.modules.rules = module_rules(&a)?;
    if a.module_deadline.is_zero() {
        return Err("--module-deadline must be more than 0".into());
    }
    cfg.modules.limits.deadline = a.module_deadline;
    let factory: Arc<OnceLock<SocketFactory>> = Arc::new(OnceLock::new());
    let f2 = factory.clone();
    let make = Box::new(move |d, t, p| match f2.get() {
        Some(f) => f.socket(d, t, p),
        None => Err(std::io::Error::from_raw_os_error(libc::EAGAIN)),
    });
    let mut servers = Servers::new(cfg, make).map_err(|e| match e {
        ferry_server::Error::Module(m) => format!("--module: {m}"),
        e => e.to_string(),
    })?;
    let stop = servers.stop_handle();
    let control = servers.control();

    let userns = match a.userns.as_str() {
        "never" => {
            if !ferry_sandbox::testbed::is_root() {
                return Err("--userns never needs root (without a user namespace, making the sandbox's namespaces does)".into());
            }
            warn!(
                "--userns never: the sandbox's root is this host's root; a program in it can leave the sandbox (its network namespace, the egress policy, the host's files): nothing ferry enforces binds it"
            );
            UserNs::Never
        }
        _ => UserNs::Auto,
    };
    let mut env = vec![("FERRY_SOCKET".into(), sock_path.into_os_string())];
    if let Some(preload) = preload {
        env.push(("LD_PRELOAD".into(), preload.into_os_string()));
    }
    let spec = Spec {
        program: a.cmd[0].clone(),
        args: a.cmd[1..].to_vec(),
        env,
        userns,
        // The command waits until the DNS forwarder is up (a resolver may query at once).
        hold: true,
        // Programs the shim cannot serve (static, Go, ping) are told of on stderr.
        // With a TAP they are served: nothing to tell.
        watch: (a.net == Net::Socket).then(|| SocketWatch {
            shim: shim.map(PathBuf::into_os_string),
        }),
        volumes: a.volumes.clone(),
        // With a TAP, a raw ICMP socket (busybox's ping) is relayed like any echo.
        raw_icmp: a.net != Net::Socket,
    };
    // What the sandbox's root will find closed (root's files), said once, up front.
    for line in ferry_sandbox::reach_advice(&spec) {
        warn!("{line}");
    }
    // The program starts with the descriptor limit ferry was started with, as it would
    // natively; ferry's own (raised at start) comes back right after.
    let nofile = crate::NOFILE.get().copied().flatten();
    if let Some((before, _)) = nofile {
        let _ = ferry_sys::set_nofile_soft(before);
    }
    let launched = ferry_sandbox::launch(&spec);
    if let Some((_, after)) = nofile {
        let _ = ferry_sys::set_nofile_soft(after);
    }
    let mut sandbox = launched.map_err(|e| format!("cannot start the sandbox: {e}"))?;
    if !sandbox.watching() && a.net == Net::Socket {
        debug!("the sandbox's socket watch is off (kernel or architecture)");
        warn_if_static(&a.cmd[0]);
    }
    let _ = factory.set(sandbox.factory());
    // The servers parse what the sandbox writes: nobody may read or write their memory
    // (a process of the sandbox running as the same user included). Not before the
    // launch: the sandbox's init, a clone of this process, must be writable by it then
    // (its id maps).
    if let Err(e) = ferry_sys::set_dumpable(false) {
        warn!("cannot make ferry non-dumpable: {e}");
    }
    servers.first().restrict_to_descendants_of(sandbox.pid());
    let nics = if nic_on {
        match start_nic(&a, &sandbox, &policy_for_dns, bond.clone(), &nic_publish) {
            Ok(mut nics) => {
                if let (Some(tap), Some(first)) = (tap, nics.first_mut()) {
                    first.serve_handoff(tap).map_err(|e| {
                        format!("cannot hand published ports to the NIC server: {e}")
                    })?;
                }
                nics
            }
            // The default: without a usable TAP (no /dev/net/tun, a kernel without tun)
            // the sandbox keeps the shim alone.
            Err(e) if a.net == Net::Both => {
                warn!(
                    "{e}: the sandbox has the socket shim only (programs it cannot serve see only lo)"
                );
                Vec::new()
            }
            Err(e) => return Err(e),
        }
    } else {
        Vec::new()
    };
    if let Err(e) = start_dns(servers.first(), &a.dns, &policy_for_dns) {
        warn!("DNS forwarding is off: {e}");
    }
    sandbox
        .start()
        .map_err(|e| format!("cannot start the program: {e}"))?;
    debug!("sandbox init pid {}", sandbox.pid());

    let admin = dir.join(crate::ctl::ADMIN_SOCKET);
    let admin = crate::ctl::listen(&admin)
        .map_err(|e| warn!("`ferry ctl` is off for this run: {e}"))
        .ok();
    // Set-up is done: from here on the process keeps only what serving needs (before
    // any thread starts, so that every thread has no more).
    if a.unconfined {
        warn!(
            "--unconfined: the servers keep this process's privileges and may make any system call"
        );
    } else {
        let n = ferry_server::confine::confine()
            .map_err(|e| format!("cannot confine the servers: {e} (--unconfined runs without)"))?;
        debug!("servers confined: {n} system calls allowed");
    }

    // Ctrl-C and friends go to the program while it runs, and end ferry once it has
    // ended (`stop.rs`); the threads started from here on inherit the mask.
    let signals =
        crate::stop::Signals::start(sandbox.signaller(), vec![dir.clone(), sandbox_dir.clone()])
            .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    if let Some(admin) = admin
        && let Err(e) = crate::ctl::serve(
            admin,
            control,
            nics.iter()
                .map(|n| (n.id().to_string(), n.live()))
                .collect(),
            sandbox.pid(),
        )
    {
        warn!("`ferry ctl` is off for this run: {e}");
    }
    let server_thread = std::thread::Builder::new()
        .name("ferry-servers".into())
        .spawn(move || servers.run())
        .map_err(|e| format!("cannot start the protocol servers: {e}"))?;

    let mut nic_threads = Vec::new();
    for nic in nics {
        let stop = nic.stop_handle();
        let t = std::thread::Builder::new()
            .name("ferry-nic".into())
            .spawn(move || nic.run())
            .map_err(|e| format!("cannot start the NIC servers: {e}"))?;
        nic_threads.push((stop, t));
    }

    let code = sandbox
        .wait()
        .map_err(|e| format!("waiting for the sandbox: {e}"))?;
    signals.stopping();
    stop.stop();
    let mut nic_stats = Vec::new();
    for (stop, _) in &nic_threads {
        stop.drain();
    }
    let stopped = crate::stop::finished_within(crate::stop::STOP_GRACE, || {
        server_thread.is_finished() && nic_threads.iter().all(|(_, t)| t.is_finished())
    });
    if !stopped {
        return Ok(code);
    }
    for (_, t) in nic_threads {
        nic_stats.push(t.join().map_err(|_| "a NIC server panicked".to_string())?);
    }
    let stats = server_thread
        .join()
        .map_err(|_| "the protocol servers panicked".to_string())?
        .map_err(|e| e.to_string())?;
    signals.finish();
    // Every server is gone, so every connection has ended and added its bytes to the
    // bond, which all servers share: its counters are reported once.
    let egress = bond.map(|b| b.stats()).unwrap_or_default();
    if a.stats {
        for s in &stats {
            eprint!("{s}");
        }
        let bonded = ferry_server::ServerStats {
            id: "egress".into(),
            egress: egress.clone(),
            ..Default::default()
        };
        if !egress.is_empty() {
            eprint!("{bonded}");
        }
        for s in &nic_stats {
            eprint!("{s}");
        }
    }
    let json = ferry_server::group_json(&stats, &egress);
    let json = match json.strip_suffix('}') {
        Some(head) if !nic_stats.is_empty() => {
            format!("{head},\"nic\":{}}}", ferry_nic::nic_json(&nic_stats))
        }
        _ => json,
    };
    if let Some(path) = &a.stats_json
        && let Err(e) = std::fs::write(path, json + "\n")
    {
        eprintln!("ferry: cannot write {}: {e}", path.display());
    }
    Ok(code)
}

/// Makes the sandbox's TAP (`--net nic|both`) and one NIC server per queue; the first
/// listens for the TCP ports published to the TAP.
fn start_nic(
    a: &RunArgs,
    sandbox: &ferry_sandbox::Sandbox,
    policy: &Policy,
    bond: Option<Arc<Bond>>,
    publish: &[Publish],
) -> Result<Vec<ferry_nic::NicServer>, String> {
    let host: Vec<IpAddr> = ferry_sys::interface_addresses()
        .map(|v| v.into_iter().map(|(_, ip)| ip).collect())
        .unwrap_or_default();
    let mut plan = ferry_nic::Plan::avoiding(&host);
    plan.mtu = a.mtu;
    let factory = sandbox.factory();
    let tap = ferry_nic::setup(
        &plan,
        usize::from(a.nic_servers),
        &|| factory.open_tun(),
        &|d, t, p| factory.socket(d, t, p),
    )
    .map_err(|e| {
        format!(
            "--net {}: cannot set up the sandbox's TAP: {e}",
            a.net.name()
        )
    })?;
    debug!(
        "nic mode: {} at {}/{} via {}, {}/{} via {}, MTU {}",
        plan.ifname, plan.v4, plan.prefix4, plan.gw4, plan.v6, plan.prefix6, plan.gw6, plan.mtu
    );
    let mut cfg = ferry_nic::NicConfig::new(plan);
    cfg.policy = policy.clone();
    cfg.egress = bond;
    cfg.spin = a.server_spin;
    // One flow is one host socket: the sandbox's socket cap bounds both modes.
    if let Some(max) = a.max_sockets {
        cfg.max_flows = max;
    }
    cfg.timing = a.nic_timing;
    let cfg = Arc::new(cfg);
    let published: Vec<ferry_nic::NicPublish> = publish
        .iter()
        .map(|p| ferry_nic::NicPublish {
            host: p.host,
            sandbox_port: p.sandbox_port,
        })
        .collect();
    tap.queues
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let mine = if i == 0 { &published[..] } else { &[] };
            ferry_nic::NicServer::new(i, q, cfg.clone(), mine)
                .map_err(|e| format!("cannot start NIC server {i}: {e}"))
        })
        .collect()
}

/// Parses `--dns`: `None` for off, else the upstream servers (`auto`: `nameservers`).
fn dns_upstreams(
    mode: &str,
    nameservers: &[std::net::IpAddr],
) -> Result<Option<Vec<std::net::SocketAddr>>, String> {
    match mode {
        "off" => Ok(None),
        "auto" => Ok(Some(
            nameservers
                .iter()
                .map(|ip| std::net::SocketAddr::new(*ip, 53))
                .collect(),
        )),
        list => list
            .split(',')
            .map(|item| {
                item.parse::<std::net::SocketAddr>()
                    .or_else(|_| {
                        item.parse::<std::net::IpAddr>()
                            .map(|ip| std::net::SocketAddr::new(ip, 53))
                    })
                    .map_err(|_| format!("--dns: `{item}` is not IP[:PORT] (or use auto / off)"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
    }
}

/// Starts the server's DNS forwarder on the nameserver addresses the sandbox's resolver
/// uses (the host's `/etc/resolv.conf`, which the sandbox shares).
fn start_dns(server: &mut Server, mode: &str, policy: &Policy) -> Result<(), String> {
    let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let listen = ferry_server::dns::nameservers(&conf);
    let Some(upstream) = dns_upstreams(mode, &listen)? else {
        return Ok(());
    };
    if listen.is_empty() || upstream.is_empty() {
        return Err("no nameserver in /etc/resolv.conf".into());
    }
    let allowed: Vec<_> = upstream
        .into_iter()
        .filter(|u| u.ip().is_loopback() || policy.check(u) == Verdict::Allow)
        .collect();
    if allowed.is_empty() {
        return Err("the egress policy denies every upstream nameserver".into());
    }
    server
        .enable_dns(&listen, allowed)
        .map_err(|e| format!("cannot set up the forwarder: {e}"))
}

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

/// Removes the run's private directory (control socket) on every exit path.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_detection() {
        let sh = std::fs::read("/bin/sh").unwrap();
        assert!(!is_static_elf(&sh), "/bin/sh is dynamic");
        assert!(!is_static_elf(b"#!/bin/sh\n"));
    }
}

/// `--net`: how the sandbox reaches the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Net {
    /// The socket shim only.
    Socket,
    /// The TAP device only.
    Nic,
    /// Both: the shim where it reaches, the TAP for the rest.
    Both,
}

impl Net {
    fn name(self) -> &'static str {
        match self {
            Net::Socket => "socket",
            Net::Nic => "nic",
            Net::Both => "both",
        }
    }
}

/// `--rx`: the path of received TCP bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Rx {
    /// Through the program's fd (the readiness pair).
    Pair,
    /// Through the channel's ring, one request per read.
    Ring,
}
