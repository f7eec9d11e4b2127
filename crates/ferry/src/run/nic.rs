//! `ferry run`'s nic mode: the sandbox's TAP and its NIC servers.

use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use ferry_server::{Bond, Policy, Publish};
use tracing::{debug, warn};

use super::{Net, RunArgs, RunError};

/// nic mode: the NIC servers and the TAP's first queue held by ferry itself.
#[derive(Default)]
pub(super) struct Nic {
    /// One a queue (none without nic mode).
    pub(super) servers: Vec<ferry_nic::NicServer>,
    /// The sandbox's addresses on the TAP.
    pub(super) addrs: Vec<IpAddr>,
    /// A second descriptor of the first queue, closed when ferry exits: the queue stays
    /// attached for the whole run, so that nothing in the sandbox can attach to the
    /// (persistent) device even if a NIC server ends early.
    _held: Option<OwnedFd>,
}

/// nic mode's NIC servers (`--net nic|both`); the first takes the published
/// connections handed over by the protocol servers (`tap`). With `--net both` a
/// sandbox without a usable TAP keeps the shim alone.
pub(super) fn set_up_nic(
    a: &RunArgs,
    sandbox: &ferry_sandbox::Sandbox,
    policy: &Policy,
    bond: &Option<Arc<Bond>>,
    publish: &[Publish],
    tap: Option<Arc<ferry_server::TapHandoff>>,
) -> Result<Nic, RunError> {
    match start_nic(a, sandbox, policy, bond.clone(), publish) {
        Ok(mut nic) => {
            if let (Some(tap), Some(first)) = (tap, nic.servers.first_mut()) {
                first.serve_handoff(tap).map_err(|e| {
                    RunError::Nic(format!(
                        "cannot hand published ports to the NIC server: {e}"
                    ))
                })?;
            }
            Ok(nic)
        }
        // The default: without a usable TAP (no /dev/net/tun, a kernel without tun)
        // the sandbox keeps the shim alone.
        Err(e) if a.net == Net::Both => {
            warn!(
                "{e}: the sandbox has the socket shim only (programs it cannot serve see only lo)"
            );
            Ok(Nic::default())
        }
        Err(e) => Err(RunError::Nic(e)),
    }
}

/// Makes the sandbox's TAP (`--net nic|both`) and one NIC server per queue; the first
/// listens for the TCP ports published to the TAP.
fn start_nic(
    a: &RunArgs,
    sandbox: &ferry_sandbox::Sandbox,
    policy: &Policy,
    bond: Option<Arc<Bond>>,
    publish: &[Publish],
) -> Result<Nic, String> {
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
    // Removed with the sandbox's namespace, not by the last close of its queues: that
    // close would wait for the device's unregistration on ferry's way out (~17 ms of
    // every run). The namespace lives only while the sandbox or ferry holds it; ferry
    // holds the first queue until it exits (`Nic`).
    let held = tap.queues.first().and_then(|q| q.try_clone().ok());
    if let Some(q) = &held
        && let Err(e) = ferry_sys::tun::tap_persist(q.as_fd(), true)
    {
        debug!("nic mode: the TAP is removed by ferry's exit (TUNSETPERSIST: {e})");
    }
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
    let servers = tap
        .queues
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let mine = if i == 0 { &published[..] } else { &[] };
            ferry_nic::NicServer::new(i, q, cfg.clone(), mine)
                .map_err(|e| format!("cannot start NIC server {i}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(Nic {
        servers,
        addrs: vec![cfg.plan.v4.into(), cfg.plan.v6.into()],
        _held: held,
    })
}
