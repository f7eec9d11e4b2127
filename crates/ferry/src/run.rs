//! `ferry run`: sandbox + protocol server + the program, with its exit status passed on.
//!
//! [`run`] is a list of named steps (see its comment), each a function that fails with
//! its own [`RunError`] variant; [`RunError::exit_code`] is the one place ferry's exit
//! status is decided. The shim (`shim.rs`), nic mode (`nic.rs`), the DNS forwarder
//! (`dns.rs`) and serving, draining and reporting (`serve.rs`) have files of their own.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::Args;
use ferry_sandbox::{SocketFactory, SocketWatch, Spec, UserNs};
use ferry_server::{Accepted, Assign, Bond, Config, Mode, Policy, Publish, Rule, Servers, Verdict};
use tracing::{debug, warn};

mod autopub;
mod autopub_udp;
mod dns;
mod handoff;
mod nic;
mod serve;
mod shim;
pub mod timing;

use dns::start_dns;
pub(crate) use dns::{allowed_upstreams, dns_upstreams};
use nic::set_up_nic;
use serve::{Serving, report, serve_admin};
pub(crate) use shim::find_preload;
use shim::{Shim, find_shim, warn_if_static};
use timing::Stages;

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
    /// Hand TCP connections to CIDR[:PORT] (that the policy admits) to the program as
    /// the host's own connected socket: kernel speed, but no per-byte mediation, modules
    /// or per-byte counters for them (docs/SECURITY.md, "Hand-off"). Programs without
    /// the shim (static, Go) too, through the sandbox's init.
    #[arg(long, value_name = "CIDR[:PORT]")]
    pub handoff: Vec<String>,
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
    /// Publish where ferry runs every TCP port a program in the sandbox listens on (on
    /// the wildcard or the TAP's address; not loopback), while it listens, on every
    /// address of both families (`ferry oci`'s default). With --net socket, the ports
    /// the shim's listeners are on (a static program's needs the TAP).
    #[arg(long, conflicts_with = "publish")]
    pub publish_auto: bool,
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

/// The log's filter for `-v` (`FERRY_LOG` overrides).
pub(crate) fn log_filter(verbose: u8) -> tracing_subscriber::EnvFilter {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level))
}

/// Sets up logging to stderr at the level `-v` asks for (`FERRY_LOG` overrides).
pub fn init_logging(verbose: u8) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter(verbose))
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Builds the policy from `--allow`/`--deny` in command-line order, with the
/// `--handoff` rules.
fn policy(a: &RunArgs) -> Result<Policy, String> {
    policy_of(&a.allow, &a.deny, &a.handoff)
}

/// The policy of `--allow` rules `allow`, `--deny` rules `deny` and `--handoff` rules
/// `handoff` (`ferry run`, `ferry vm`).
pub(crate) fn policy_of(
    allow: &[String],
    deny: &[String],
    handoff: &[String],
) -> Result<Policy, String> {
    // clap keeps each option's values in order but not their interleaving; deny rules go
    // first so that a deny inside an allowed range wins.
    let mut rules = Vec::new();
    for d in deny {
        rules.push(Rule::parse(Verdict::Deny, d).map_err(|e| format!("--deny {d}: {e}"))?);
    }
    for al in allow {
        rules.push(Rule::parse(Verdict::Allow, al).map_err(|e| format!("--allow {al}: {e}"))?);
    }
    let handoff = handoff
        .iter()
        .map(|h| Rule::parse(Verdict::Allow, h).map_err(|e| format!("--handoff {h}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Policy::new(rules).with_handoff(handoff))
}

/// The checks `ferry run` makes of its options before anything starts (`--allow`,
/// `--deny`, `--dns`), for `ferry oci create` to refuse a bad option up front.
pub(crate) fn check_plan(a: &RunArgs) -> Result<(), String> {
    policy(a)?;
    dns_upstreams(&a.dns, &[])?;
    Ok(())
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
    let mut stages = Stages::from_env();
    let code = match bond(&a).and_then(|bond| run(&a, bond, &mut Program, &mut stages)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferry: {e}");
            e.exit_code()
        }
    };
    // What `run` dropped on its way out: the sandbox, the directories.
    stages.mark("cleanup");
    stages.print();
    code
}

/// Why `ferry run` failed before the program's status could be passed on: one variant
/// per step of [`run`]. Its [`exit_code`](RunError::exit_code) is ferry's status.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A bad option value found after parsing (`--egress`, `--bond`).
    #[error("{0}")]
    Usage(String),
    /// The plan: `--allow`/`--deny`, `--dns`, `--cpus`, `--module`, `--module-deadline`,
    /// `--userns` cannot be followed.
    #[error("{0}")]
    Plan(String),
    /// The shim cannot be found, or not placed where the sandbox can read it.
    #[error("{0}")]
    Shim(String),
    /// The run's private directories.
    #[error("cannot create {}: {source}", path.display())]
    Dir {
        /// Which.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The protocol servers (their control socket, modules, the published ports'
    /// handoff).
    #[error("{0}")]
    Servers(String),
    /// The sandbox could not be made.
    #[error("cannot start the sandbox: {0}")]
    Sandbox(#[source] ferry_sandbox::Error),
    /// nic mode's TAP or NIC servers.
    #[error("{0}")]
    Nic(String),
    /// The held program could not be let go.
    #[error("cannot start the program: {0}")]
    Start(#[source] ferry_sandbox::Error),
    /// The process could not drop what serving does not need.
    #[error("cannot confine the servers: {0} (--unconfined runs without)")]
    Confine(#[source] ferry_server::confine::ConfineError),
    /// A thread could not be started: `what` names it.
    #[error("cannot start the {what}: {source}")]
    Thread {
        /// "signal thread", "protocol servers", "NIC servers".
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// Waiting for the sandbox failed.
    #[error("waiting for the sandbox: {0}")]
    Wait(#[source] ferry_sandbox::Error),
    /// A server thread panicked or failed: the message says which.
    #[error("{0}")]
    Drain(String),
    /// The workload's own step (`ferry oci`: the container's runtime, its pid).
    #[error("{0}")]
    Workload(String),
}

impl RunError {
    /// `ferry run`'s exit status for this failure: 2 for a bad option value (as clap's
    /// usage errors), 125 for any other failure of ferry's own. (The program's status
    /// is passed on otherwise; the sandbox's init exits 127 for a program not found and
    /// 126 for one that cannot be executed, as shells do.)
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Usage(_) => EXIT_USAGE,
            _ => EXIT_SETUP,
        }
    }
}

/// What [`run`] serves: `ferry run`'s program, held in the sandbox until the servers
/// are ready ([`Program`]), or (`ferry oci`) a container whose processes join the
/// sandbox's network namespace. The seam between the steps that are the same for both
/// (servers, sandbox, TAP, DNS, confinement, drain) and those that are not.
pub(crate) trait Workload {
    /// Where the run's directories are made.
    fn dirs_base(&self) -> PathBuf {
        std::env::temp_dir()
    }

    /// The sandbox's namespace exists (its TAP and DNS come next): a workload that
    /// joins it may start joining beside them (`ferry oci`: the real runtime's create).
    fn made(&mut self, _: &ferry_sandbox::Sandbox, _: &RunDirs) -> Result<(), RunError> {
        Ok(())
    }

    /// The sandbox, its TAP and DNS are ready in `dirs`: let the workload go. Returns
    /// the pid whose descendants may open channels to the servers.
    fn go(&mut self, sandbox: &mut ferry_sandbox::Sandbox, dirs: &RunDirs)
    -> Result<i32, RunError>;

    /// The servers serve.
    fn serving(&mut self) {}

    /// Waits for the workload's end: the status to pass on.
    fn wait(&mut self, sandbox: &mut ferry_sandbox::Sandbox) -> Result<i32, RunError>;
}

/// `ferry run`'s workload: the command, held until [`Workload::go`].
struct Program;

impl Workload for Program {
    fn go(&mut self, sandbox: &mut ferry_sandbox::Sandbox, _: &RunDirs) -> Result<i32, RunError> {
        sandbox.start().map_err(RunError::Start)?;
        Ok(sandbox.pid())
    }

    fn wait(&mut self, sandbox: &mut ferry_sandbox::Sandbox) -> Result<i32, RunError> {
        sandbox.wait().map_err(RunError::Wait)
    }
}

/// Serves `work` with `ferry run`'s options `a` (`ferry oci`'s network side).
pub(crate) fn serve_workload(a: &RunArgs, work: &mut dyn Workload) -> Result<i32, RunError> {
    let mut stages = Stages::from_env();
    let r = bond(a).and_then(|bond| run(a, bond, work, &mut stages));
    stages.print();
    r
}

/// Builds the bond from `--egress`/`--bond`; every address must be on this host.
fn bond(a: &RunArgs) -> Result<Option<Arc<Bond>>, RunError> {
    bond_of(&a.egress, a.bond.as_deref())
}

/// The bond of `--egress` sources `egress` spread by `--bond` mode `mode` (`ferry run`,
/// `ferry vm`).
pub(crate) fn bond_of(
    egress: &[String],
    mode: Option<&str>,
) -> Result<Option<Arc<Bond>>, RunError> {
    if egress.is_empty() {
        return Ok(None);
    }
    let mode: Mode = mode.unwrap_or("rr").parse().map_err(RunError::Usage)?;
    let addrs = crate::args::egress_sources(egress, &host_addresses()?).map_err(RunError::Usage)?;
    Ok(Some(Arc::new(Bond::new(mode, addrs))))
}

/// The addresses of the caller's network namespace with their interfaces' names.
fn host_addresses() -> Result<Vec<(String, IpAddr)>, RunError> {
    let addrs = ferry_sys::interface_addresses().map_err(|e| {
        RunError::Usage(format!("--egress: cannot list this host's addresses: {e}"))
    })?;
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

/// `ferry run`'s steps, in order: check the plan → find the shim → make the run's
/// directories → place the shim → configure and make the protocol servers → describe
/// the sandbox → make it → set up nic mode → start DNS → let the program go → confine →
/// serve → wait for the program → drain the servers → report. Returns the program's
/// exit status. `t` times each step (`FERRY_TIMING`).
fn run(
    a: &RunArgs,
    bond: Option<Arc<Bond>>,
    work: &mut dyn Workload,
    t: &mut Stages,
) -> Result<i32, RunError> {
    check_plan(a).map_err(RunError::Plan)?;
    let policy = policy(a).map_err(RunError::Plan)?;
    t.mark("plan");
    let preload = find_shim(a)?;
    let dirs = RunDirs::make(&work.dirs_base())?;
    let shim = preload
        .map(|p| Shim::place(&p, &dirs.sandbox))
        .transpose()?;
    t.mark("shim+dirs");
    let plan = server_config(a, policy.clone(), &bond, &dirs)?;
    let (mut servers, factory) = make_servers(plan.cfg)?;
    t.mark("servers");
    let spec = sandbox_spec(a, &dirs, shim.as_ref())?;
    let mut sandbox = make_sandbox(a, &spec, &factory)?;
    work.made(&sandbox, &dirs)?;
    t.mark("sandbox");
    let auto_tap = plan.tap.clone().filter(|_| a.publish_auto);
    let nic = if a.net == Net::Socket {
        nic::Nic::default()
    } else {
        set_up_nic(a, &sandbox, &policy, &bond, &plan.nic_publish, plan.tap)?
    };
    let auto_sink = match auto_tap {
        _ if a.net == Net::Socket => Some((autopub::Sink::Servers(servers.inbound()), vec![])),
        Some(t) if !nic.servers.is_empty() => Some((autopub::Sink::Tap(t), nic.addrs.clone())),
        _ => None,
    };
    t.mark("nic");
    if let Err(e) = start_dns(servers.first(), &a.dns, &policy) {
        warn!("DNS forwarding is off: {e}");
    }
    t.mark("dns");
    // The servers accept channels only once they serve, below: no process of the
    // workload can open one before the restriction is in place.
    let owner = work.go(&mut sandbox, &dirs)?;
    servers.first().restrict_to_descendants_of(owner);
    debug!(
        "sandbox init pid {}, channels for descendants of {owner}",
        sandbox.pid()
    );
    let admin = crate::ctl::listen(&dirs.run.join(crate::ctl::ADMIN_SOCKET))
        .map_err(|e| warn!("`ferry ctl` is off for this run: {e}"))
        .ok();
    t.mark("start");
    confine(a)?;
    if let Some(requests) = sandbox.handoff_requests() {
        handoff::serve(requests, policy.clone(), bond.is_some());
    }
    let _auto = auto_publish(a, &sandbox, auto_sink);
    t.mark("confine");
    // Ctrl-C and friends go to the program while it runs, and end ferry once it has
    // ended (`stop.rs`); the threads started from here on inherit the mask.
    let signals =
        crate::stop::Signals::start(sandbox.signaller(), dirs.both()).map_err(|source| {
            RunError::Thread {
                what: "signal thread",
                source,
            }
        })?;
    if let Some(admin) = admin {
        serve_admin(admin, &servers, &nic.servers, sandbox.pid());
    }
    let serving = Serving::start(servers, nic.servers)?;
    work.serving();
    t.mark("serve");
    let code = work.wait(&mut sandbox)?;
    t.mark("wait");
    signals.stopping();
    let Some(drained) = serving.drain()? else {
        return Ok(code);
    };
    t.mark("drain");
    signals.finish();
    t.mark("signals");
    report(a, &drained, bond);
    t.mark("report");
    Ok(code)
}

/// The run's private directory (the admin socket: this user only) and, beside it, the
/// sandbox's (its control socket); both are removed when this is dropped.
pub(crate) struct RunDirs {
    /// The run's private directory (the admin socket).
    pub(crate) run: PathBuf,
    /// The sandbox's directory: its control socket (and, for a container, the shim).
    pub(crate) sandbox: PathBuf,
    _cleanup: [RemoveDir; 2],
}

impl RunDirs {
    fn make(base: &Path) -> Result<RunDirs, RunError> {
        let run = base.join(format!("ferry-{}-{}", std::process::id(), nanos()));
        let sandbox = run.with_extension("sandbox");
        let mkdir = |d: &Path, mode| {
            std::fs::create_dir(d)
                .and_then(|()| ferry_sys::chmod(d, mode))
                .map_err(|source| RunError::Dir {
                    path: d.to_path_buf(),
                    source,
                })
        };
        mkdir(&run, 0o700)?;
        let run_cleanup = RemoveDir(run.clone());
        // Traversable by the sandbox's users (whatever uid a program switches to, it
        // needs the control socket); not listable.
        mkdir(&sandbox, 0o711)?;
        Ok(RunDirs {
            _cleanup: [RemoveDir(sandbox.clone()), run_cleanup],
            run,
            sandbox,
        })
    }

    /// The sandbox's control socket.
    fn control_socket(&self) -> PathBuf {
        self.sandbox.join("ctl.sock")
    }

    fn both(&self) -> Vec<PathBuf> {
        vec![self.run.clone(), self.sandbox.clone()]
    }
}

/// What [`server_config`] decides.
struct ServerPlan {
    /// The protocol servers' configuration.
    cfg: Config,
    /// The TCP ports published to the TAP instead (nic mode).
    nic_publish: Vec<Publish>,
    /// With `--net both`, the handoff of the published connections no listener of the
    /// shim's takes, to the first NIC server.
    tap: Option<Arc<ferry_server::TapHandoff>>,
}

/// The protocol servers' configuration, with the TCP ports published to the TAP
/// instead (nic mode) and, with `--net both`, the handoff of published connections no
/// listener of the shim's takes.
fn server_config(
    a: &RunArgs,
    policy: Policy,
    bond: &Option<Arc<Bond>>,
    dirs: &RunDirs,
) -> Result<ServerPlan, RunError> {
    let mut cfg = Config::new(dirs.control_socket());
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
    let (nic_publish, publish): (Vec<Publish>, Vec<Publish>) =
        a.publish.iter().partition(|p| a.net == Net::Nic && !p.udp);
    cfg.publish = publish;
    let auto = a.publish_auto && a.net != Net::Socket;
    // In socket mode the servers take the connections to the ports it publishes.
    if a.publish_auto && a.net == Net::Socket {
        cfg.auto_publish = autopub::MAX_PORTS;
    }
    let tap = if auto || a.net == Net::Both && cfg.publish.iter().any(|p| !p.udp) {
        let h = ferry_server::TapHandoff::new().map_err(|e| {
            RunError::Servers(format!("cannot set up the published ports' handoff: {e}"))
        })?;
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
    cfg.cpus = server_cpus(a)?;
    cfg.modules.rules = module_rules(a).map_err(RunError::Plan)?;
    if a.module_deadline.is_zero() {
        return Err(RunError::Plan(
            "--module-deadline must be more than 0".into(),
        ));
    }
    cfg.modules.limits.deadline = a.module_deadline;
    Ok(ServerPlan {
        cfg,
        nic_publish,
        tap,
    })
}

/// `--cpus`, each CPU checked against those this process may use.
fn server_cpus(a: &RunArgs) -> Result<Vec<usize>, RunError> {
    let Some(crate::args::CpuList(list)) = &a.cpus else {
        // Unpinned by default: on a small machine the scheduler places the servers beside
        // the program and its peers better than a fixed CPU each (measured in E7).
        return Ok(Vec::new());
    };
    let allowed = ferry_sys::allowed_cpus().unwrap_or_default();
    if let Some(bad) = list
        .iter()
        .find(|c| !allowed.is_empty() && !allowed.contains(c))
    {
        return Err(RunError::Plan(format!(
            "--cpus: CPU {bad} is not available (this process may use {})",
            crate::args::format_cpus(&allowed)
        )));
    }
    Ok(list.clone())
}

/// Where the servers get the sockets they make in the sandbox's namespace: set once the
/// sandbox exists.
type FactoryCell = Arc<OnceLock<SocketFactory>>;

/// Makes the protocol servers (their control socket listens from here on).
fn make_servers(cfg: Config) -> Result<(Servers, FactoryCell), RunError> {
    let factory: FactoryCell = Arc::new(OnceLock::new());
    let f2 = factory.clone();
    let make = Box::new(move |d, t, p| match f2.get() {
        Some(f) => f.socket(d, t, p),
        None => Err(std::io::Error::from_raw_os_error(libc::EAGAIN)),
    });
    let servers = Servers::new(cfg, make).map_err(|e| {
        RunError::Servers(match e {
            ferry_server::Error::Module(m) => format!("--module: {m}"),
            e => e.to_string(),
        })
    })?;
    Ok((servers, factory))
}

/// What the sandbox runs and how: the program held until the servers are ready, the
/// shim preloaded, the socket watch or the raw ICMP relay, the volumes.
fn sandbox_spec(a: &RunArgs, dirs: &RunDirs, shim: Option<&Shim>) -> Result<Spec, RunError> {
    let userns = match a.userns.as_str() {
        "never" => {
            if !ferry_sandbox::testbed::is_root() {
                return Err(RunError::Plan("--userns never needs root (without a user namespace, making the sandbox's namespaces does)".into()));
            }
            warn!(
                "--userns never: the sandbox's root is this host's root; a program in it can leave the sandbox (its network namespace, the egress policy, the host's files): nothing ferry enforces binds it"
            );
            UserNs::Never
        }
        _ => UserNs::Auto,
    };
    let mut env = vec![(
        "FERRY_SOCKET".into(),
        dirs.control_socket().into_os_string(),
    )];
    if let Some(shim) = shim {
        env.push(("LD_PRELOAD".into(), shim.preload.clone().into_os_string()));
    }
    if !a.handoff.is_empty() {
        // The shim opens its channels so that the hand-off guard never stands in for it.
        env.push(("FERRY_GUARDED".into(), "1".into()));
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
            shim: shim.map(|s| s.mapped.clone().into_os_string()),
        }),
        volumes: a.volumes.clone(),
        // With a TAP, a raw ICMP socket (busybox's ping) is relayed like any echo.
        raw_icmp: a.net != Net::Socket && a.handoff.is_empty(),
        // Handed-off sockets are the host's: the command may not re-aim them.
        guard_host_sockets: !a.handoff.is_empty(),
        // Only a connect a `--handoff` rule names is worth a round trip to ours.
        handoff_scope: (!a.handoff.is_empty())
            .then(|| policy(a))
            .and_then(Result::ok)
            .map(|p| {
                ferry_sandbox::HandoffScope(Arc::new(move |to: &std::net::SocketAddr| {
                    p.hands_off(to)
                }))
            }),
    };
    // What the sandbox's root will find closed (root's files), said once, up front.
    for line in ferry_sandbox::reach_advice(&spec) {
        warn!("{line}");
    }
    Ok(spec)
}

/// Launches the sandbox (the program held) and gives the servers its socket factory;
/// from here on nobody may read or write this process's memory.
fn make_sandbox(
    a: &RunArgs,
    spec: &Spec,
    factory: &FactoryCell,
) -> Result<ferry_sandbox::Sandbox, RunError> {
    // The program starts with the descriptor limit ferry was started with, as it would
    // natively; ferry's own (raised at start) comes back right after.
    let nofile = crate::NOFILE.get().copied().flatten();
    if let Some((before, _)) = nofile {
        let _ = ferry_sys::set_nofile_soft(before);
    }
    let launched = ferry_sandbox::launch(spec);
    if let Some((_, after)) = nofile {
        let _ = ferry_sys::set_nofile_soft(after);
    }
    let sandbox = launched.map_err(RunError::Sandbox)?;
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
    Ok(sandbox)
}

/// Set-up is done: from here on the process keeps only what serving needs (before any
/// thread starts, so that every thread has no more), unless `--unconfined`.
fn confine(a: &RunArgs) -> Result<(), RunError> {
    if a.unconfined {
        warn!(
            "--unconfined: the servers keep this process's privileges and may make any system call"
        );
        return Ok(());
    }
    // `--publish-auto` binds the ports it publishes once confined, 80 and 443 included.
    let keep: &[u32] = if a.publish_auto {
        &[CAP_NET_BIND_SERVICE]
    } else {
        &[]
    };
    let n = ferry_server::confine::confine_keeping(keep).map_err(RunError::Confine)?;
    debug!("servers confined: {n} system calls allowed");
    Ok(())
}

/// `CAP_NET_BIND_SERVICE` (linux/capability.h).
const CAP_NET_BIND_SERVICE: u32 = 10;

/// `--publish-auto`'s thread, publishing the listeners on the wildcard (and the
/// sandbox's TAP addresses `addrs`) through `sink`: the TAP's handoff, or in socket
/// mode the protocol servers (none: the TAP could not be made, said once).
fn auto_publish(
    a: &RunArgs,
    sandbox: &ferry_sandbox::Sandbox,
    sink: Option<(autopub::Sink, Vec<IpAddr>)>,
) -> Option<autopub::AutoPublish> {
    if !a.publish_auto {
        return None;
    }
    let Some((sink, addrs)) = sink else {
        warn!("--publish-auto: the sandbox has no TAP: no port is published");
        return None;
    };
    let ty = libc::SOCK_RAW | libc::SOCK_CLOEXEC;
    sandbox
        .factory()
        .socket(libc::AF_NETLINK, ty, autopub::NETLINK_SOCK_DIAG)
        .and_then(|diag| autopub::AutoPublish::start(diag, addrs, sink, sandbox.factory()))
        .map_err(|e| warn!("--publish-auto: {e}: no port is published"))
        .ok()
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
