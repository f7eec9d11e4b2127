//! Socket addresses as they travel inside records: the kernel's own `sockaddr_in` /
//! `sockaddr_in6` byte layout, so the shim can copy them straight from and to the
//! program's buffers, and the server can decode them with every length checked.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Size of `struct sockaddr_in`.
pub const SOCKADDR_IN_LEN: usize = 16;
/// Size of `struct sockaddr_in6`.
pub const SOCKADDR_IN6_LEN: usize = 28;

/// `sa_family_t` of `AF_INET` (2).
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "AF_INET is a small positive constant; the assertion below checks it fits"
)]
pub(crate) const FAMILY_INET: u16 = libc::AF_INET as u16;
/// `sa_family_t` of `AF_INET6` (10).
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "AF_INET6 is a small positive constant; the assertion below checks it fits"
)]
pub(crate) const FAMILY_INET6: u16 = libc::AF_INET6 as u16;
const _: () = assert!(FAMILY_INET as i32 == libc::AF_INET && FAMILY_INET6 as i32 == libc::AF_INET6);

/// Why address bytes were refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddrError {
    /// Too short to hold even the family.
    #[error("address of {0} bytes is too short")]
    Short(usize),
    /// A family other than AF_INET / AF_INET6.
    #[error("address family {0} is not inet")]
    Family(u16),
}

/// An inet socket address in kernel byte layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireAddr(SocketAddr);

impl From<SocketAddr> for WireAddr {
    fn from(sa: SocketAddr) -> WireAddr {
        WireAddr(sa)
    }
}

impl WireAddr {
    /// The address as a std value.
    pub fn to_std(self) -> SocketAddr {
        self.0
    }

    /// Parses kernel `sockaddr` bytes (as given to `connect`/`bind`).
    pub fn decode(b: &[u8]) -> Result<WireAddr, AddrError> {
        if b.len() < 2 {
            return Err(AddrError::Short(b.len()));
        }
        let family = u16::from_ne_bytes([b[0], b[1]]);
        match i32::from(family) {
            libc::AF_INET => {
                if b.len() < SOCKADDR_IN_LEN {
                    return Err(AddrError::Short(b.len()));
                }
                let port = u16::from_be_bytes([b[2], b[3]]);
                let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
                Ok(WireAddr(SocketAddr::V4(SocketAddrV4::new(ip, port))))
            }
            libc::AF_INET6 => {
                if b.len() < SOCKADDR_IN6_LEN {
                    return Err(AddrError::Short(b.len()));
                }
                let port = u16::from_be_bytes([b[2], b[3]]);
                let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&b[8..24]);
                let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
                let sa = SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, scope);
                Ok(WireAddr(SocketAddr::V6(sa)))
            }
            _ => Err(AddrError::Family(family)),
        }
    }

    /// Writes kernel `sockaddr` bytes into `out` (at least 28 bytes); returns the length.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        match self.0 {
            SocketAddr::V4(a) => {
                out[..SOCKADDR_IN_LEN].fill(0);
                out[0..2].copy_from_slice(&FAMILY_INET.to_ne_bytes());
                out[2..4].copy_from_slice(&a.port().to_be_bytes());
                out[4..8].copy_from_slice(&a.ip().octets());
                SOCKADDR_IN_LEN
            }
            SocketAddr::V6(a) => {
                out[..SOCKADDR_IN6_LEN].fill(0);
                out[0..2].copy_from_slice(&FAMILY_INET6.to_ne_bytes());
                out[2..4].copy_from_slice(&a.port().to_be_bytes());
                out[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
                out[8..24].copy_from_slice(&a.ip().octets());
                out[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
                SOCKADDR_IN6_LEN
            }
        }
    }

    /// True for addresses that mean "this machine's loopback" (127/8, ::1, v4-mapped 127/8).
    pub fn is_loopback(&self) -> bool {
        match self.0.ip() {
            std::net::IpAddr::V4(ip) => ip.is_loopback(),
            std::net::IpAddr::V6(ip) => {
                ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        }
    }

    /// True for the wildcard address (0.0.0.0, ::, or v4-mapped 0.0.0.0).
    pub fn is_unspecified(&self) -> bool {
        match self.0.ip() {
            std::net::IpAddr::V4(ip) => ip.is_unspecified(),
            std::net::IpAddr::V6(ip) => {
                ip.is_unspecified() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_addresses() {
        assert!(WireAddr("[::ffff:0.0.0.0]:0".parse().unwrap()).is_unspecified());
        assert!(!WireAddr("[::ffff:0.0.0.1]:0".parse().unwrap()).is_unspecified());
    }

    #[test]
    fn v4_round_trip() {
        let sa: SocketAddr = "10.77.0.2:5201".parse().unwrap();
        let mut buf = [0u8; 32];
        let n = WireAddr(sa).encode(&mut buf);
        assert_eq!(n, SOCKADDR_IN_LEN);
        assert_eq!(WireAddr::decode(&buf[..n]).unwrap().to_std(), sa);
    }

    #[test]
    fn short_and_foreign_are_refused() {
        assert_eq!(WireAddr::decode(&[2]), Err(AddrError::Short(1)));
        let family = u16::try_from(libc::AF_UNIX).unwrap();
        let unix = family.to_ne_bytes();
        assert_eq!(
            WireAddr::decode(&[unix[0], unix[1], 0, 0]),
            Err(AddrError::Family(family))
        );
    }

    #[test]
    fn loopback_detection() {
        let m: SocketAddr = "[::ffff:127.0.0.5]:1".parse().unwrap();
        assert!(WireAddr(m).is_loopback());
        let r: SocketAddr = "10.0.0.1:1".parse().unwrap();
        assert!(!WireAddr(r).is_loopback());
    }
}
