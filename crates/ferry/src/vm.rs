//! `ferry vm`: a VM guest's network served by ferry's NIC servers. ferry is the guest's
//! vhost-user-net backend (`ferry-vhost`); each virtio queue pair is the frame device of
//! one NIC server, which serves it exactly as it serves a sandbox's TAP queue (the same
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
    #[arg(long, value_name = "SOCKET")]
    pub vhost_user: PathBuf,
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

/// The signal thread: the first signal of [`SIGNALS`](crate::stop::SIGNALS) stops
/// serving (`stop`) and is kept in `signalled`; a second one, should stopping hang,
/// removes the socket file ferry still listens on and exits at once.
fn take_signals(stop: ferry_vhost::Stop, signalled: Arc<AtomicI32>) -> std::io::Result<()> {
    let thread = move || {
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
        .spawn(thread)
        .map(drop)
}

/// The guest's addressing, one line on stdout (for scripts: `key=value` pairs; `dns=`
/// the resolver's address, or `off`).
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
    let mut cfg = ferry_nic::NicConfig::new(plan.clone());
    cfg.policy = policy;
    cfg.egress = bond;
    cfg.spin = a.server_spin;
    cfg.max_flows = a.max_flows;
    cfg.dns = guest_dns(&a.dns, &cfg.policy)?;
    let cfg = Arc::new(cfg);
    let ports: Vec<u16> = a.publish.iter().map(|p| p.sandbox_port).collect();
    let (backend, devices) =
        ferry_vhost::backend(usize::from(a.nic_servers), a.mtu as usize, &ports)
            .map_err(|e| RunError::Nic(e.to_string()))?;
    let published: Vec<ferry_nic::NicPublish> = a
        .publish
        .iter()
        .map(|p| ferry_nic::NicPublish {
            host: p.host,
            sandbox_port: p.sandbox_port,
        })
        .collect();
    let mut threads = Vec::new();
    for (i, dev) in devices.into_iter().enumerate() {
        let mine = if i == 0 { &published[..] } else { &[] };
        let server = ferry_nic::NicServer::with_device(i, Box::new(dev), cfg.clone(), mine)
            .map_err(|e| RunError::Nic(format!("cannot start NIC server {i}: {e}")))?;
        let stop = server.stop_handle();
        let t = std::thread::Builder::new()
            .name("ferry-nic".into())
            .spawn(move || server.run())
            .map_err(|source| RunError::Thread {
                what: "NIC servers",
                source,
            })?;
        threads.push((stop, t));
    }
    announce(&plan, !cfg.dns.is_empty(), &a.vhost_user);
    let served = ferry_vhost::serve(&backend, &a.vhost_user, stop);
    info!("the VM's frontend has gone");
    let mut stats = Vec::new();
    for (stop, t) in threads {
        stop.drain();
        match t.join() {
            Ok(s) => stats.push(s),
            Err(_) => warn!("a NIC server panicked"),
        }
    }
    report(a, &stats, backend.counters());
    served.map_err(|e| RunError::Nic(e.to_string()))
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

/// `--stats` (text on stderr) and `--stats-json FILE`.
fn report(a: &VmArgs, stats: &[ferry_nic::NicStats], dev: ferry_vhost::CountersSnapshot) {
    if a.stats {
        for s in stats {
            eprint!("{s}");
        }
        eprintln!("{dev}");
    }
    if let Some(path) = &a.stats_json {
        let json = format!(
            "{{\"nic\":{},\"vhost\":{{\"tx_frames\":{},\"rx_frames\":{},\"rx_lost\":{},\"steered\":{},\"steer_lost\":{},\"bad_tx\":{},\"bad_rx\":{},\"bad_ring\":{}}}}}\n",
            ferry_nic::nic_json(stats),
            dev.tx_frames,
            dev.rx_frames,
            dev.rx_lost,
            dev.steered,
            dev.steer_lost,
            dev.bad_tx,
            dev.bad_rx,
            dev.bad_ring
        );
        if let Err(e) = std::fs::write(path, json) {
            warn!("--stats-json {}: {e}", path.display());
        }
    }
}
