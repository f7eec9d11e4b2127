//! `ferry vm`: a VM guest's network served by ferry's NIC servers. ferry is the guest's
//! vhost-user-net backend (`ferry-vhost`), or the far end of QEMU's stream netdev
//! (`--stream`: one socket, `ferry_nic::device::StreamDevice`, one NIC server); each
//! virtio queue pair is the frame device of one NIC server, which serves it exactly as it serves a sandbox's TAP queue (the same
//! egress policy and address rules, `-p` publishing, bonding, counters). Serves one
//! frontend connection, then reports and exits: 0 when the frontend went, 128 + N on
//! signal N (SIGINT, SIGTERM, SIGHUP, SIGQUIT end the wait for a frontend or its
//! connection the same way, the socket file removed; a second one ends ferry at once).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use clap::Args;
use ferry_server::Publish;
use tracing::{info, warn};

use crate::run::{RunError, bond_of, init_logging, policy_of};

#[derive(Debug, Args)]
pub struct VmArgs {
    /// The vhost-user socket to listen on (QEMU: `-chardev socket,id=c,path=SOCKET
    /// -netdev vhost-user,id=n,chardev=c` with shared guest memory).
    #[arg(
        long,
        value_name = "SOCKET",
        required_unless_present = "stream",
        conflicts_with = "stream"
    )]
    pub vhost_user: Option<PathBuf>,
    /// Or a stream socket to listen on, QEMU ≥ 7.2's `-netdev
    /// stream,id=n,server=off,addr.type=unix,addr.path=SOCKET` (frames behind a 4-byte
    /// length; one queue, one NIC server; no shared memory needed).
    #[arg(long, value_name = "SOCKET")]
    pub stream: Option<PathBuf>,
    /// Virtio queue pairs, one NIC server (thread) each (QEMU: `queues=N` on the netdev,
    /// `mq=on,vectors=2N+2` on the device); a frame goes to its flow's server whatever
    /// queue the guest sent it on.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub nic_servers: u16,
    /// The guest interface's MTU (the guest sets it; frames up to it are carried).
    #[arg(long, value_name = "BYTES", default_value_t = ferry_nic::DEFAULT_MTU, value_parser = clap::value_parser!(u32).range(1280..=65520))]
    pub mtu: u32,
    /// Allow egress to CIDR[:PORT] (with any --allow, everything else is denied).
    #[arg(long, value_name = "CIDR[:PORT]")]
    pub allow: Vec<String>,
    /// Deny egress to CIDR[:PORT].
    #[arg(long, value_name = "CIDR[:PORT]")]
    pub deny: Vec<String>,
    /// DNS for the guest: its NIC servers answer on the gateway's port 53 (UDP) by
    /// relaying to `auto` (the host's nameservers), upstream servers `IP[:PORT],…`, or
    /// nothing (`off`); the announced `dns=` is the address to give the guest's resolver.
    #[arg(long, value_name = "auto|off|IP[:PORT],…", default_value = "auto")]
    pub dns: String,
    /// Egress bonding: new outgoing connections leave from these host source addresses.
    #[arg(long, value_name = "ADDR|IF[,…]", value_delimiter = ',')]
    pub egress: Vec<String>,
    /// How --egress spreads connections: rr, xor, least.
    #[arg(long, value_name = "rr|xor|least", requires = "egress", value_parser = ["rr", "xor", "least"])]
    pub bond: Option<String>,
    /// Publish a guest TCP port on the host: [IP:]HOST_PORT:PORT.
    #[arg(short = 'p', long = "publish", value_name = "[IP:]HOST_PORT:PORT", value_parser = crate::args::publish)]
    pub publish: Vec<Publish>,
    /// Spin span of a NIC server's loop before it sleeps.
    #[arg(long, value_name = "SPAN", default_value = "200us", value_parser = crate::args::span)]
    pub server_spin: Duration,
    /// Most flows a NIC server carries at once.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_flows: usize,
    /// Print the NIC servers' and the device's counters when the guest has gone.
    #[arg(long)]
    pub stats: bool,
    /// Write the NIC servers' counters as JSON to FILE when the guest has gone.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// Time the NIC servers' stages (descriptor reads as `tap_read`, the stack, host
    /// sockets, descriptor writes as `tap_write`, wake) into the counters: for
    /// `ferry bench E8`'s per-packet costs.
    #[arg(long, hide = true)]
    pub nic_timing: bool,
    /// Leave the backend and NIC servers unconfined: they keep this process's
    /// capabilities and may make any system call (see docs/SECURITY.md). For debugging.
    #[arg(long)]
    pub unconfined: bool,
    /// More log output (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

pub fn main(a: VmArgs) -> i32 {
    init_logging(a.verbose);
    // Before any thread starts: every thread inherits the mask, the signal thread takes them.
    let _ = ferry_sys::block_signals(&crate::stop::SIGNALS);
    let stop = ferry_vhost::Stop::default();
    let signalled = Arc::new(AtomicI32::new(0));
    if let Err(e) = take_signals(stop.clone(), signalled.clone()) {
        eprintln!("ferry vm: cannot start the signal thread: {e}");
        return crate::run::EXIT_SETUP;
    }
    let r = vm(&a, &stop);
    let sig = signalled.load(Ordering::SeqCst);
    if sig != 0 {
        eprintln!("ferry vm: signal {sig}: stopped");
        return 128 + sig;
    }
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ferry vm: {e}");
            e.exit_code()
        }
    }
}

/// `CAP_KILL` (linux/capability.h), the one capability a confined ferry keeps.
const CAP_KILL: u32 = 5;

/// The signal thread: the first signal of [`SIGNALS`](crate::stop::SIGNALS) stops
/// serving (`stop`) and is kept in `signalled`; a second one, should stopping hang,
/// removes the socket file ferry still listens on and exits at once.
fn take_signals(stop: ferry_vhost::Stop, signalled: Arc<AtomicI32>) -> std::io::Result<()> {
    let (dropped, done) = std::sync::mpsc::channel();
    let thread = move || {
        // It needs none of the process's capabilities (CAP_KILL kept as `confine` keeps
        // it): the servers' confinement would not reach this thread, started before.
        // Dropped before `take_signals` returns (the filter refuses `capset` after).
        let _ = dropped.send(ferry_sys::drop_capabilities(&[CAP_KILL]));
        loop {
            let Ok(Some(sig)) =
                ferry_sys::wait_signal(&crate::stop::SIGNALS, Duration::from_secs(1))
            else {
                continue;
            };
            if signalled.swap(sig, Ordering::SeqCst) == 0 {
                info!("signal {sig}: stopping");
                stop.stop();
                continue;
            }
            if let Some(path) = stop.listening() {
                let _ = std::fs::remove_file(path);
            }
            eprintln!("ferry vm: signal {sig} while stopping: exiting now");
            std::process::exit(128 + sig);
        }
    };
    // Not joined: it ends with the process.
    std::thread::Builder::new()
        .name("ferry-signals".into())
        .spawn(thread)?;
    if let Ok(Err(e)) = done.recv() {
        warn!("the signal thread keeps its capabilities: {e}");
    }
    Ok(())
}

/// The guest's addressing, one line on stdout once the socket listens (for scripts:
/// `key=value` pairs; `dns=` the resolver's address, or `off`): start the frontend after it.
fn announce(plan: &ferry_nic::Plan, dns: bool, socket: &std::path::Path) {
    let resolver = if dns {
        plan.gw4.to_string()
    } else {
        "off".into()
    };
    println!(
        "ferry vm: guest ip={}/{} gw={} ip6={}/{} gw6={} dns={resolver} mtu={} socket={}",
        plan.v4,
        plan.prefix4,
        plan.gw4,
        plan.v6,
        plan.prefix6,
        plan.gw6,
        plan.mtu,
        socket.display()
    );
}

/// `ferry vm`'s steps: the plan → the device and its NIC servers → serve the frontend's
/// connection → stop the servers → report.
fn vm(a: &VmArgs, stop: &ferry_vhost::Stop) -> Result<(), RunError> {
    if let Some(p) = a.publish.iter().find(|p| p.udp) {
        return Err(RunError::Usage(format!(
            "-p {}:{}/udp: ferry vm publishes TCP ports only",
            p.host, p.sandbox_port
        )));
    }
    // A guest gets no hand-off: its TCP is the NIC servers' (there is no shim to take a socket).
    let policy = policy_of(&a.allow, &a.deny, &[]).map_err(RunError::Plan)?;
    let bond = bond_of(&a.egress, a.bond.as_deref())?;
    let host: Vec<IpAddr> = ferry_sys::interface_addresses()
        .map(|v| v.into_iter().map(|(_, ip)| ip).collect())
        .unwrap_or_default();
    let mut plan = ferry_nic::Plan::avoiding(&host);
    plan.mtu = a.mtu;
    let mut cfg = ferry_nic::NicConfig::new(plan);
    cfg.policy = policy;
    cfg.egress = bond;
    cfg.spin = a.server_spin;
    cfg.max_flows = a.max_flows;
    cfg.timing = a.nic_timing;
    cfg.dns = guest_dns(&a.dns, &cfg.policy)?;
    let cfg = Arc::new(cfg);
    let published: Vec<ferry_nic::NicPublish> = a
        .publish
        .iter()
        .map(|p| ferry_nic::NicPublish {
            host: p.host,
            sandbox_port: p.sandbox_port,
        })
        .collect();
    match (&a.vhost_user, &a.stream) {
        (Some(socket), _) => serve_vhost(a, &cfg, &published, socket, stop),
        (None, Some(socket)) => serve_stream(a, &cfg, &published, socket, stop),
        (None, None) => Err(RunError::Usage("--vhost-user or --stream is needed".into())),
    }
}

/// A NIC server's thread, and the handle that stops it.
type ServerThread = (
    ferry_nic::StopHandle,
    std::thread::JoinHandle<ferry_nic::NicStats>,
);

/// NIC server `i` on `dev`, set up (its published listeners bound), not yet running.
fn make_server(
    i: usize,
    dev: Box<dyn ferry_nic::device::FrameDevice>,
    cfg: &Arc<ferry_nic::NicConfig>,
    published: &[ferry_nic::NicPublish],
) -> Result<ferry_nic::NicServer, RunError> {
    ferry_nic::NicServer::with_device(i, dev, cfg.clone(), published)
        .map_err(|e| RunError::Nic(format!("cannot start NIC server {i}: {e}")))
}

/// Set-up is done: from here on the process keeps only what serving needs (the
/// servers' threads start after, with no more), unless `--unconfined`.
fn confine(a: &VmArgs) -> Result<(), RunError> {
    if a.unconfined {
        warn!("--unconfined: the backend and NIC servers may make any system call");
        return Ok(());
    }
    let n = ferry_server::confine::confine().map_err(RunError::Confine)?;
    tracing::debug!("ferry vm confined: {n} system calls allowed");
    Ok(())
}

/// Runs `server` in a thread of its own.
fn start_server(server: ferry_nic::NicServer) -> Result<ServerThread, RunError> {
    let stop = server.stop_handle();
    let t = std::thread::Builder::new()
        .name("ferry-nic".into())
        .spawn(move || server.run())
        .map_err(|source| RunError::Thread {
            what: "NIC servers",
            source,
        })?;
    Ok((stop, t))
}

/// Drains and joins the servers: their counters.
fn join_servers(threads: Vec<ServerThread>) -> Vec<ferry_nic::NicStats> {
    let mut stats = Vec::new();
    for (stop, t) in threads {
        stop.drain();
        match t.join() {
            Ok(s) => stats.push(s),
            Err(_) => warn!("a NIC server panicked"),
        }
    }
    stats
}

/// `--vhost-user`: the device and its NIC servers, then one frontend served.
fn serve_vhost(
    a: &VmArgs,
    cfg: &Arc<ferry_nic::NicConfig>,
    published: &[ferry_nic::NicPublish],
    socket: &std::path::Path,
    stop: &ferry_vhost::Stop,
) -> Result<(), RunError> {
    let ports: Vec<u16> = published.iter().map(|p| p.sandbox_port).collect();
    let (backend, devices) =
        ferry_vhost::backend(usize::from(a.nic_servers), a.mtu as usize, &ports)
            .map_err(|e| RunError::Nic(e.to_string()))?;
    let mut servers = Vec::new();
    for (i, dev) in devices.into_iter().enumerate() {
        let mine = if i == 0 { published } else { &[] };
        servers.push(make_server(i, Box::new(dev), cfg, mine)?);
    }
    let mut threads = Vec::new();
    // Listening, set up: confined, the servers run, the guest is announced.
    let ready = || -> Result<(), String> {
        confine(a).map_err(|e| e.to_string())?;
        for server in servers {
            threads.push(start_server(server).map_err(|e| e.to_string())?);
        }
        announce(&cfg.plan, !cfg.dns.is_empty(), socket);
        Ok(())
    };
    let served = ferry_vhost::serve(&backend, socket, stop, ready);
    info!("the VM's frontend has gone");
    let stats = join_servers(threads);
    let dev = backend.counters();
    report(a, &stats, &dev.to_string(), &vhost_json(&dev));
    served.map_err(|e| RunError::Nic(e.to_string()))
}

/// `--stream`: one connection, one NIC server on it, until the peer closes (or a
/// signal shuts the connection down).
fn serve_stream(
    a: &VmArgs,
    cfg: &Arc<ferry_nic::NicConfig>,
    published: &[ferry_nic::NicPublish],
    socket: &std::path::Path,
    stop: &ferry_vhost::Stop,
) -> Result<(), RunError> {
    if a.nic_servers != 1 {
        return Err(RunError::Usage(
            "--stream carries one queue: one NIC server (no --nic-servers)".into(),
        ));
    }
    let conn = ferry_vhost::accept_frontend(socket, stop, || {
        announce(&cfg.plan, !cfg.dns.is_empty(), socket);
        Ok(())
    })
    .map_err(|e| RunError::Nic(e.to_string()))?;
    let Some(conn) = conn else {
        report(a, &[], "stream: no peer came", "{}");
        return Ok(());
    };
    let watch = conn
        .try_clone()
        .map_err(|e| RunError::Nic(format!("the stream: {e}")))?;
    let dev = ferry_nic::device::StreamDevice::new(conn.into(), a.mtu as usize)
        .map_err(|e| RunError::Nic(format!("the stream: {e}")))?;
    let counters = dev.counters();
    let server = make_server(0, Box::new(dev), cfg, published)?;
    confine(a)?;
    let thread = start_server(server)?;
    // Until the peer has closed its end (or the connection was shut down).
    let gone = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    loop {
        match ferry_sys::poll_wait(std::os::fd::AsFd::as_fd(&watch), gone, 1000) {
            Ok(ev) if ev & gone != 0 => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                warn!("waiting on the stream: {e}");
                break;
            }
        }
    }
    info!("the VM's frontend has gone");
    let stats = join_servers(vec![thread]);
    let json = format!(
        "{{\"bad_len\":{},\"skipped\":{},\"lost\":{}}}",
        counters.bad_len.load(std::sync::atomic::Ordering::Relaxed),
        counters.skipped.load(std::sync::atomic::Ordering::Relaxed),
        counters.lost.load(std::sync::atomic::Ordering::Relaxed)
    );
    report(a, &stats, &counters.to_string(), &json);
    Ok(())
}

/// The upstreams of `--dns` the policy allows (none: off). A malformed `--dns` is
/// refused; upstreams that cannot be had (none in resolv.conf, all denied) leave the
/// guest without a resolver, said once, as `ferry run` does.
fn guest_dns(
    mode: &str,
    policy: &ferry_server::Policy,
) -> Result<Vec<std::net::SocketAddr>, RunError> {
    crate::run::dns_upstreams(mode, &[]).map_err(RunError::Usage)?;
    match crate::run::allowed_upstreams(mode, policy) {
        Ok((up, _)) => Ok(up.unwrap_or_default()),
        Err(e) => {
            warn!("DNS forwarding is off: {e}");
            Ok(Vec::new())
        }
    }
}

/// The vhost-user device's counters as JSON.
fn vhost_json(dev: &ferry_vhost::CountersSnapshot) -> String {
    format!(
        "{{\"tx_frames\":{},\"rx_frames\":{},\"rx_lost\":{},\"steered\":{},\"steer_lost\":{},\"bad_tx\":{},\"bad_rx\":{},\"bad_ring\":{}}}",
        dev.tx_frames,
        dev.rx_frames,
        dev.rx_lost,
        dev.steered,
        dev.steer_lost,
        dev.bad_tx,
        dev.bad_rx,
        dev.bad_ring
    )
}

/// `--stats` (text on stderr: the servers', then the device's `dev` line) and
/// `--stats-json FILE` (the device's as `dev_json`, under `vhost` or `stream`).
fn report(a: &VmArgs, stats: &[ferry_nic::NicStats], dev: &str, dev_json: &str) {
    if a.stats {
        for s in stats {
            eprint!("{s}");
        }
        eprintln!("{dev}");
    }
    if let Some(path) = &a.stats_json {
        let key = if a.stream.is_some() {
            "stream"
        } else {
            "vhost"
        };
        let json = format!(
            "{{\"nic\":{},\"{key}\":{dev_json}}}\n",
            ferry_nic::nic_json(stats)
        );
        if let Err(e) = std::fs::write(path, json) {
            warn!("--stats-json {}: {e}", path.display());
        }
    }
}
