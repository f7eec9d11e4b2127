//! Egress bonding on the protocol server's side: a host socket's source address for a
//! new outgoing connection, from the sandbox's [`ferry_egress::Bond`] (the bond itself, its modes and
//! counters are `ferry_egress`'s).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use tracing::warn;

use crate::ops::Errno;
use crate::server::Server;
use crate::sock::Place;

/// `IP_BIND_ADDRESS_NO_PORT` (linux/in.h): bind the address now, the port at connect,
/// so a bonded source address does not use up a port per destination.
const IP_BIND_ADDRESS_NO_PORT: i32 = 24;

impl Server {
    /// Before connecting host socket `id` to `dst`: when there is a bond and the
    /// program has not bound the socket itself, binds it to the bond's source address
    /// for `dst`. `Err` is the errno for the program's connect.
    pub(crate) fn bond_source(&mut self, id: u32, dst: SocketAddr) -> Result<(), Errno> {
        let io = self.io;
        let Some(bond) = self.cfg.egress.clone() else {
            return Ok(());
        };
        let Some(s) = self.socks.get_mut(&id) else {
            return Ok(());
        };
        if s.place != Place::Host || s.egress.is_some() {
            return Ok(());
        }
        // Bound by the program, or by an earlier sendto/connect (a UDP socket that
        // connects again keeps its address): leave it.
        if let Ok(Some(local)) = io.sock_addr(s.fd.as_fd(), false)
            && (local.port() != 0 || !local.ip().is_unspecified())
        {
            return Ok(());
        }
        let Some(lease) = bond.lease(dst) else {
            return Ok(());
        };
        let src = match (lease.addr(), s.domain) {
            (IpAddr::V4(v4), libc::AF_INET6) => IpAddr::V6(v4.to_ipv6_mapped()),
            (ip, _) => ip,
        };
        let fd = s.fd.as_fd();
        let bound = io
            .setsockopt(
                fd,
                libc::IPPROTO_IP,
                IP_BIND_ADDRESS_NO_PORT,
                &1i32.to_ne_bytes(),
            )
            .and_then(|()| io.bind(fd, &SocketAddr::new(src, 0)));
        match bound {
            Ok(()) => {
                s.egress = Some(lease);
                Ok(())
            }
            Err(e) => {
                warn!("socket {id}: cannot use egress source {src} for {dst}: {e}");
                Err(Errno::of(&e))
            }
        }
    }
}
