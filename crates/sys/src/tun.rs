//! TAP devices (`/dev/net/tun`) and the interface set-up a pseudo-NIC needs: attaching a
//! queue, offloads, the `virtio_net_hdr` each frame carries, and the netlink/ioctl calls
//! that give an interface its MTU, addresses and default routes. The descriptors may
//! belong to another network namespace (made there by the sandbox's init): every call
//! acts in the namespace of the descriptor it is given.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::{read, syscall, write};

/// `TUNSETIFF` (`_IOW('T', 202, int)`; the libc crate does not name the tun ioctls).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `TUNSETPERSIST` (`_IOW('T', 203, int)`).
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
/// `TUNSETOFFLOAD` (`_IOW('T', 208, unsigned int)`).
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// `TUNSETVNETHDRSZ` (`_IOW('T', 216, int)`).
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;

/// Length of the `struct virtio_net_hdr` in front of every frame with `IFF_VNET_HDR`.
pub const VNET_HDR_LEN: usize = 10;
/// `virtio_net_hdr.flags`: the checksum is to be completed from `csum_start`.
pub const VNET_NEEDS_CSUM: u8 = 1;
/// `virtio_net_hdr.flags`: the checksum is known good (the receiver need not check it).
pub const VNET_DATA_VALID: u8 = 2;
/// `TUNSETOFFLOAD` bit: the reader completes checksums (`VNET_NEEDS_CSUM` frames).
pub const TUN_F_CSUM: u32 = 0x01;
/// `TUNSETOFFLOAD` bits: TCP segmentation offload for IPv4 and IPv6 (need `TUN_F_CSUM`).
pub const TUN_F_TSO4: u32 = 0x02;
/// See [`TUN_F_TSO4`].
pub const TUN_F_TSO6: u32 = 0x04;

/// A `struct ifreq` with the name set (40 bytes: 16 of name, 24 of union).
fn ifreq(name: &str) -> io::Result<[u8; 40]> {
    let mut r = [0u8; 40];
    if name.is_empty() || name.len() >= 16 || name.contains('\0') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    r[..name.len()].copy_from_slice(name.as_bytes());
    Ok(r)
}

/// Attaches the `/dev/net/tun` descriptor `fd` to TAP device `name` (made if missing)
/// with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, and `IFF_MULTI_QUEUE` when `multi_queue`
/// (then each descriptor attached to the same name is one more queue).
pub fn tap_attach(fd: BorrowedFd<'_>, name: &str, multi_queue: bool) -> io::Result<()> {
    let mut r = ifreq(name)?;
    let mut flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
    if multi_queue {
        flags |= libc::IFF_MULTI_QUEUE;
    }
    r[16..18].copy_from_slice(&(flags as u16).to_ne_bytes());
    syscall!(libc::SYS_ioctl, fd.as_raw_fd(), TUNSETIFF, r.as_mut_ptr()).map(drop)
}

/// `TUNSETPERSIST`: whether the device outlives its last queue's descriptor. A
/// persistent device is removed with its network namespace (by the kernel's namespace
/// clean-up, after the namespace's last user is gone) instead of by the last `close`,
/// which then need not wait for the device's unregistration (RCU grace periods, some
/// 10–20 ms).
pub fn tap_persist(fd: BorrowedFd<'_>, persist: bool) -> io::Result<()> {
    syscall!(
        libc::SYS_ioctl,
        fd.as_raw_fd(),
        TUNSETPERSIST,
        libc::c_ulong::from(persist)
    )
    .map(drop)
}

/// `TUNSETOFFLOAD`: which offloads the reader of the TAP handles (`TUN_F_*`).
pub fn tap_offload(fd: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    syscall!(libc::SYS_ioctl, fd.as_raw_fd(), TUNSETOFFLOAD, flags).map(drop)
}

/// `TUNSETVNETHDRSZ`: the length of the header in front of every frame.
pub fn tap_vnet_hdr_len(fd: BorrowedFd<'_>, len: i32) -> io::Result<()> {
    syscall!(
        libc::SYS_ioctl,
        fd.as_raw_fd(),
        TUNSETVNETHDRSZ,
        &len as *const i32
    )
    .map(drop)
}

/// `writev(2)` of two pieces (a header and a frame): one frame on a TAP.
pub fn write2(fd: BorrowedFd<'_>, a: &[u8], b: &[u8]) -> io::Result<usize> {
    let iov = [
        libc::iovec {
            iov_base: a.as_ptr() as *mut libc::c_void,
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        },
    ];
    syscall!(libc::SYS_writev, fd.as_raw_fd(), iov.as_ptr(), 2).map(|n| n as usize)
}

/// Interface `name`'s index, asked through `sock` (any socket of its namespace).
pub fn if_index(sock: BorrowedFd<'_>, name: &str) -> io::Result<u32> {
    let mut r = ifreq(name)?;
    syscall!(
        libc::SYS_ioctl,
        sock.as_raw_fd(),
        libc::SIOCGIFINDEX,
        r.as_mut_ptr()
    )?;
    Ok(u32::from_ne_bytes([r[16], r[17], r[18], r[19]]))
}

/// Sets interface `name`'s MTU and brings it up, through `sock` (an inet socket of its
/// namespace).
pub fn if_up(sock: BorrowedFd<'_>, name: &str, mtu: u32) -> io::Result<()> {
    let mut r = ifreq(name)?;
    r[16..20].copy_from_slice(&mtu.to_ne_bytes());
    syscall!(
        libc::SYS_ioctl,
        sock.as_raw_fd(),
        libc::SIOCSIFMTU,
        r.as_mut_ptr()
    )?;
    let mut r = ifreq(name)?;
    syscall!(
        libc::SYS_ioctl,
        sock.as_raw_fd(),
        libc::SIOCGIFFLAGS,
        r.as_mut_ptr()
    )?;
    let flags = u16::from_ne_bytes([r[16], r[17]]) | libc::IFF_UP as u16;
    r[16..18].copy_from_slice(&flags.to_ne_bytes());
    syscall!(
        libc::SYS_ioctl,
        sock.as_raw_fd(),
        libc::SIOCSIFFLAGS,
        r.as_mut_ptr()
    )
    .map(drop)
}

/// One netlink request (`kind`, `flags` besides `NLM_F_REQUEST | NLM_F_ACK`) with a
/// fixed header `head` and attributes `(type, value)`; waits for its acknowledgement.
/// `EEXIST` counts as done.
pub fn netlink_request(
    nl: BorrowedFd<'_>,
    kind: u16,
    flags: i32,
    head: &[u8],
    attrs: &[(u16, &[u8])],
) -> io::Result<()> {
    let pad = |n: usize| (n + 3) & !3;
    let total = 16 + pad(head.len()) + attrs.iter().map(|(_, v)| pad(4 + v.len())).sum::<usize>();
    let mut m = vec![0u8; total];
    let len = u32::try_from(total).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK | flags) as u16;
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence number
    m[16..16 + head.len()].copy_from_slice(head);
    let mut at = 16 + pad(head.len());
    for (ty, v) in attrs {
        let alen =
            u16::try_from(4 + v.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        m[at..at + 2].copy_from_slice(&alen.to_ne_bytes());
        m[at + 2..at + 4].copy_from_slice(&ty.to_ne_bytes());
        m[at + 4..at + 4 + v.len()].copy_from_slice(v);
        at += pad(4 + v.len());
    }
    write(nl, &m)?;
    let mut ack = [0u8; 512];
    let n = read(nl, &mut ack)?;
    // NLMSG_ERROR: header, then a signed errno (0 = success).
    if n >= 20 && u16::from_ne_bytes([ack[4], ack[5]]) == libc::NLMSG_ERROR as u16 {
        let e = i32::from_ne_bytes([ack[16], ack[17], ack[18], ack[19]]);
        if e != 0 && -e != libc::EEXIST {
            return Err(io::Error::from_raw_os_error(-e));
        }
    }
    Ok(())
}

/// Adds `ip/prefix` to interface `ifindex` with universe scope (IPv6: without duplicate
/// address detection, so it is usable at once).
pub fn add_global_address(
    nl: BorrowedFd<'_>,
    ifindex: u32,
    ip: IpAddr,
    prefix: u8,
) -> io::Result<()> {
    let (family, bytes) = family_bytes(ip);
    let mut head = [0u8; 8];
    head[0] = family;
    head[1] = prefix;
    if ip.is_ipv6() {
        head[2] = libc::IFA_F_NODAD as u8;
    }
    head[3] = libc::RT_SCOPE_UNIVERSE;
    head[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    netlink_request(
        nl,
        libc::RTM_NEWADDR,
        libc::NLM_F_CREATE | libc::NLM_F_EXCL,
        &head,
        &[(libc::IFA_LOCAL, &bytes), (libc::IFA_ADDRESS, &bytes)],
    )
}

/// Adds a default route via `gateway` on interface `ifindex`.
pub fn add_default_route(nl: BorrowedFd<'_>, ifindex: u32, gateway: IpAddr) -> io::Result<()> {
    let (family, bytes) = family_bytes(gateway);
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
    let mut head = [0u8; 12];
    head[0] = family;
    head[4] = libc::RT_TABLE_MAIN;
    head[5] = libc::RTPROT_STATIC;
    head[6] = libc::RT_SCOPE_UNIVERSE;
    head[7] = libc::RTN_UNICAST;
    netlink_request(
        nl,
        libc::RTM_NEWROUTE,
        libc::NLM_F_CREATE | libc::NLM_F_EXCL,
        &head,
        &[
            (libc::RTA_GATEWAY, &bytes),
            (libc::RTA_OIF, &ifindex.to_ne_bytes()),
        ],
    )
}

fn family_bytes(ip: IpAddr) -> (u8, Vec<u8>) {
    match ip {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    }
}
