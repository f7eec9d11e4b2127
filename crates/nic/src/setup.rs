//! The sandbox's TAP device: its queues opened inside the sandbox's network namespace,
//! attached with a `virtio_net_hdr` and checksum offload, and the interface given its
//! MTU, addresses and default routes ([`Plan`]).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};

use ferry_sys::tun;
use tracing::warn;

use crate::Plan;

/// The sandbox's TAP device: one descriptor per queue (one per NIC server).
#[derive(Debug)]
pub struct Tap {
    pub queues: Vec<OwnedFd>,
}

/// Makes the TAP `plan.ifname` with `queues` queues and configures it. `open_tun` opens
/// `/dev/net/tun` inside the sandbox's namespace and `socket` makes a socket there (both
/// through the sandbox's socket factory); the ioctls and netlink requests act in that
/// namespace, with the caller's privilege over it (it made the sandbox).
pub fn setup(
    plan: &Plan,
    queues: usize,
    open_tun: &dyn Fn() -> io::Result<OwnedFd>,
    socket: &dyn Fn(i32, i32, i32) -> io::Result<OwnedFd>,
) -> io::Result<Tap> {
    let ctx = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    let mut fds = Vec::with_capacity(queues);
    for q in 0..queues.max(1) {
        let fd = open_tun().map_err(|e| ctx("cannot open /dev/net/tun in the sandbox", e))?;
        tun::tap_attach(fd.as_fd(), &plan.ifname, queues > 1)
            .map_err(|e| ctx(&format!("cannot make TAP queue {q}"), e))?;
        tun::tap_vnet_hdr_len(fd.as_fd(), tun::VNET_HDR_LEN as i32)
            .map_err(|e| ctx("TUNSETVNETHDRSZ", e))?;
        fds.push(fd);
    }
    // The sandbox's kernel may leave checksums to us: it then does not compute them.
    tun::tap_offload(fds[0].as_fd(), tun::TUN_F_CSUM).map_err(|e| ctx("TUNSETOFFLOAD", e))?;
    let inet = socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)?;
    tun::if_up(inet.as_fd(), &plan.ifname, plan.mtu).map_err(|e| {
        ctx(
            &format!("cannot bring {} up (MTU {})", plan.ifname, plan.mtu),
            e,
        )
    })?;
    let index = tun::if_index(inet.as_fd(), &plan.ifname)?;
    let nl = socket(
        libc::AF_NETLINK,
        libc::SOCK_RAW | libc::SOCK_CLOEXEC,
        libc::NETLINK_ROUTE,
    )?;
    tun::add_global_address(nl.as_fd(), index, IpAddr::V4(plan.v4), plan.prefix4)
        .map_err(|e| ctx("cannot add the sandbox's IPv4 address", e))?;
    tun::add_default_route(nl.as_fd(), index, IpAddr::V4(plan.gw4))
        .map_err(|e| ctx("cannot add the IPv4 default route", e))?;
    // IPv6 may be off in the sandbox's kernel: then the sandbox has IPv4 only.
    let v6 = tun::add_global_address(nl.as_fd(), index, IpAddr::V6(plan.v6), plan.prefix6)
        .and_then(|()| tun::add_default_route(nl.as_fd(), index, IpAddr::V6(plan.gw6)));
    if let Err(e) = v6 {
        warn!("nic mode: the sandbox has no IPv6 ({e})");
    }
    Ok(Tap { queues: fds })
}
