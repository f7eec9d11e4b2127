//! Control messages (`msg_control` of `sendmsg`/`recvmsg`) as they cross the channel.
//!
//! Both directions carry the kernel's own layout (this machine's `cmsghdr` followed by
//! the data, each message padded to the word size) in chunks of [`CHUNK`] bytes, one
//! record per chunk, just before the record they belong to: [`Op::SendCtl`] records
//! before a datagram's `Send`, [`CmpKind::Control`] records before a receive's `Done`.
//! At most [`MAX_CONTROL`] bytes travel with one message.
//!
//! A sender may attach only the messages in [`SEND_ALLOWED`] (source address and
//! interface, TOS/traffic class, TTL/hop limit, don't-fragment, UDP segmentation), each
//! with its exact length: [`sanitize_send`] rebuilds a clean buffer from them and refuses
//! anything else, so the server never hands the kernel bytes it has not checked.
//!
//! [`Op::SendCtl`]: crate::Op::SendCtl
//! [`CmpKind::Control`]: crate::CmpKind::Control

/// Most control bytes that travel with one message.
pub const MAX_CONTROL: usize = 256;
/// Control bytes carried by one record.
pub const CHUNK: usize = 32;

/// `sizeof(struct cmsghdr)`: `cmsg_len` (a `size_t`), `cmsg_level`, `cmsg_type`.
pub const HDR: usize = size_of::<usize>() + 8;
const ALIGN: usize = size_of::<usize>();

/// `CMSG_ALIGN`.
pub const fn align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// `CMSG_LEN(n)`.
pub const fn len(n: usize) -> usize {
    HDR + n
}

/// `CMSG_SPACE(n)`.
pub const fn space(n: usize) -> usize {
    HDR + align(n)
}

/// One control message: level, type and data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cmsg<'a> {
    /// `cmsg_level`.
    pub level: i32,
    /// `cmsg_type`.
    pub ty: i32,
    /// The bytes after the header (`cmsg_len - HDR` of them).
    pub data: &'a [u8],
}

/// Why control bytes were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CmsgError {
    /// A header claims more bytes than there are, or fewer than a header.
    #[error("control message length {0} does not fit")]
    Length(usize),
    /// More control bytes than [`MAX_CONTROL`].
    #[error("{0} control bytes (at most {MAX_CONTROL})")]
    TooLong(usize),
    /// A message a sandbox may not send.
    #[error("control message ({0}, {1}) is not allowed")]
    NotAllowed(i32, i32),
    /// An allowed message with the wrong data length.
    #[error("control message ({0}, {1}) with {2} data bytes")]
    DataLength(i32, i32, usize),
}

impl CmsgError {
    /// The errno a program gets for it (the kernel's for a bad control buffer).
    pub fn errno(&self) -> i32 {
        libc::EINVAL
    }
}

/// The messages in `raw` (the kernel's layout), in order; stops at the first malformed
/// header (which [`check`] reports).
pub fn parse(raw: &[u8]) -> impl Iterator<Item = Cmsg<'_>> {
    let mut off = 0;
    std::iter::from_fn(move || {
        let (m, next) = at(raw, off).ok()??;
        off = next;
        Some(m)
    })
}

/// Every header of `raw` well formed.
pub fn check(raw: &[u8]) -> Result<(), CmsgError> {
    let mut off = 0;
    while let Some((_, next)) = at(raw, off)? {
        off = next;
    }
    Ok(())
}

/// The message at `off` and where the next starts; `None` past the last.
fn at(raw: &[u8], off: usize) -> Result<Option<(Cmsg<'_>, usize)>, CmsgError> {
    if raw.len().saturating_sub(off) < HDR {
        // Like the kernel's CMSG_NXTHDR: a tail shorter than a header ends the list.
        return Ok(None);
    }
    let word = &raw[off..off + ALIGN];
    let total = usize::from_ne_bytes(word.try_into().expect("word-sized"));
    if total < HDR || total > raw.len() - off {
        return Err(CmsgError::Length(total));
    }
    let int = |at: usize| i32::from_ne_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
    let m = Cmsg {
        level: int(off + ALIGN),
        ty: int(off + ALIGN + 4),
        data: &raw[off + HDR..off + total],
    };
    Ok(Some((m, off + align(total))))
}

/// Appends one message in the kernel's layout (padded to the word size).
pub fn push(out: &mut Vec<u8>, level: i32, ty: i32, data: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&len(data.len()).to_ne_bytes());
    out.extend_from_slice(&level.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(data);
    out.resize(start + space(data.len()), 0);
}

/// The messages a sandbox may send, with the data lengths each may have.
pub const SEND_ALLOWED: &[(i32, i32, &[usize])] = &[
    (libc::IPPROTO_IP, libc::IP_PKTINFO, &[12]),
    (libc::IPPROTO_IP, libc::IP_TOS, &[1, 4]),
    (libc::IPPROTO_IP, libc::IP_TTL, &[4]),
    (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &[20]),
    (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, &[4]),
    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, &[4]),
    (libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, &[4]),
    (libc::SOL_UDP, libc::UDP_SEGMENT, &[2]),
];

/// A clean copy of the control bytes a sandbox attached to a datagram: every message
/// allowed ([`SEND_ALLOWED`]) and of its exact length, re-laid out by this side. Levels
/// other than socket, IP, IPv6 and UDP are left out, as the kernel skips them (and
/// `SCM_RIGHTS`/`SCM_CREDENTIALS`, which only unix sockets read); any
/// other message of those levels is refused (the kernel's `EINVAL` for types it does
/// not know; ferry's for the ones it does not carry, such as `SO_MARK` or
/// `SCM_TXTIME`).
pub fn sanitize_send(raw: &[u8]) -> Result<Vec<u8>, CmsgError> {
    if raw.len() > MAX_CONTROL {
        return Err(CmsgError::TooLong(raw.len()));
    }
    check(raw)?;
    let mut out = Vec::with_capacity(raw.len());
    for m in parse(raw) {
        let unix_only = m.level == libc::SOL_SOCKET
            && (m.ty == libc::SCM_RIGHTS || m.ty == libc::SCM_CREDENTIALS);
        let spoken = [
            libc::SOL_SOCKET,
            libc::IPPROTO_IP,
            libc::IPPROTO_IPV6,
            libc::SOL_UDP,
        ];
        if unix_only || !spoken.contains(&m.level) {
            // The kernel's datagram sockets skip levels they do not speak, and the
            // unix-only messages (their descriptors are never looked at).
            continue;
        }
        let Some((_, _, lens)) = SEND_ALLOWED
            .iter()
            .find(|(l, t, _)| (*l, *t) == (m.level, m.ty))
        else {
            return Err(CmsgError::NotAllowed(m.level, m.ty));
        };
        if !lens.contains(&m.data.len()) {
            return Err(CmsgError::DataLength(m.level, m.ty, m.data.len()));
        }
        push(&mut out, m.level, m.ty, m.data);
    }
    Ok(out)
}

/// The source addresses and interfaces a sender asks for in `raw` (checked bytes, e.g.
/// from [`sanitize_send`]): `(interface index, source)` of each `IP_PKTINFO`
/// (`ipi_spec_dst`, which is what the kernel sends from) and `IPV6_PKTINFO`.
pub fn sources(raw: &[u8]) -> impl Iterator<Item = (u32, std::net::IpAddr)> + '_ {
    parse(raw).filter_map(|m| match (m.level, m.ty, m.data.len()) {
        (libc::IPPROTO_IP, libc::IP_PKTINFO, 12) => {
            let index = u32::from_ne_bytes(m.data[..4].try_into().ok()?);
            let ip: [u8; 4] = m.data[4..8].try_into().ok()?;
            Some((index, std::net::IpAddr::from(ip)))
        }
        (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, 20) => Some(in6_pktinfo(m.data)?),
        _ => None,
    })
}

/// `struct in6_pktinfo` (the address, then the interface index) as `(index, address)`.
pub fn in6_pktinfo(data: &[u8]) -> Option<(u32, std::net::IpAddr)> {
    let ip: [u8; 16] = data.get(..16)?.try_into().ok()?;
    let index = u32::from_ne_bytes(data.get(16..20)?.try_into().ok()?);
    Some((index, std::net::IpAddr::from(ip)))
}

/// What [`put`] wrote into a program's control buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    /// The new `msg_controllen`.
    pub used: usize,
    /// Something did not fit: `MSG_CTRUNC`.
    pub truncated: bool,
}

/// Writes the messages of `raw` into `out` (a program's `msg_control`) as the kernel's
/// `put_cmsg` does: a message that does not fit whole is cut at the end of the buffer
/// and `MSG_CTRUNC` set; none at all if not even its header fits.
pub fn put(raw: &[u8], out: &mut [u8]) -> Placed {
    let mut p = Placed::default();
    for m in parse(raw) {
        let avail = out.len() - p.used;
        if avail < HDR {
            p.truncated = true;
            break;
        }
        let mut cmlen = len(m.data.len());
        if avail < cmlen {
            p.truncated = true;
            cmlen = avail;
        }
        let dst = &mut out[p.used..];
        dst[..ALIGN].copy_from_slice(&cmlen.to_ne_bytes());
        dst[ALIGN..ALIGN + 4].copy_from_slice(&m.level.to_ne_bytes());
        dst[ALIGN + 4..HDR].copy_from_slice(&m.ty.to_ne_bytes());
        let n = cmlen - HDR;
        dst[HDR..HDR + n].copy_from_slice(&m.data[..n]);
        p.used += space(m.data.len()).min(avail);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pktinfo() -> Vec<u8> {
        let mut v = Vec::new();
        push(&mut v, libc::IPPROTO_IP, libc::IP_PKTINFO, &[7; 12]);
        v
    }

    #[test]
    fn sources_of_pktinfo() {
        let mut v = Vec::new();
        let mut p4 = [0u8; 12];
        p4[..4].copy_from_slice(&3u32.to_ne_bytes());
        p4[4..8].copy_from_slice(&[10, 1, 2, 3]);
        p4[8..].copy_from_slice(&[9, 9, 9, 9]);
        push(&mut v, libc::IPPROTO_IP, libc::IP_PKTINFO, &p4);
        push(&mut v, libc::IPPROTO_IP, libc::IP_TTL, &7i32.to_ne_bytes());
        let mut p6 = [0u8; 20];
        p6[15] = 1;
        p6[16..].copy_from_slice(&0u32.to_ne_bytes());
        push(&mut v, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &p6);
        let got: Vec<_> = sources(&v).collect();
        assert_eq!(
            got,
            [
                (3, "10.1.2.3".parse().unwrap()),
                (0, "::1".parse().unwrap())
            ]
        );
    }

    #[test]
    #[allow(unsafe_code)]
    fn push_lays_out_like_the_cmsg_macros() {
        let v = pktinfo();
        // SAFETY: the libc macros are plain arithmetic.
        let (want_space, want_len) = unsafe { (libc::CMSG_SPACE(12), libc::CMSG_LEN(12)) };
        assert_eq!(v.len(), want_space as usize);
        assert_eq!(len(12), want_len as usize);
        let ms: Vec<_> = parse(&v).collect();
        assert_eq!(ms.len(), 1);
        assert_eq!((ms[0].level, ms[0].ty, ms[0].data), (0, 8, &[7u8; 12][..]));
    }

    #[test]
    fn allowed_messages_pass_and_others_are_refused() {
        let mut v = pktinfo();
        push(&mut v, libc::IPPROTO_IP, libc::IP_TOS, &[0x10]);
        assert_eq!(sanitize_send(&v).unwrap(), v);
        let mut bad = pktinfo();
        push(&mut bad, libc::SOL_SOCKET, libc::SO_MARK, &[1, 0, 0, 0]);
        assert_eq!(
            sanitize_send(&bad),
            Err(CmsgError::NotAllowed(libc::SOL_SOCKET, libc::SO_MARK))
        );
        let mut rights = Vec::new();
        push(
            &mut rights,
            libc::SOL_SOCKET,
            libc::SCM_RIGHTS,
            &[3, 0, 0, 0],
        );
        assert_eq!(sanitize_send(&rights).unwrap(), [0u8; 0], "never passed on");
        let mut tcp = pktinfo();
        push(&mut tcp, libc::IPPROTO_TCP, 1, &[0; 4]);
        assert_eq!(
            sanitize_send(&tcp).unwrap(),
            pktinfo(),
            "other levels are skipped"
        );
        let mut short = Vec::new();
        push(&mut short, libc::IPPROTO_IP, libc::IP_PKTINFO, &[0; 8]);
        assert_eq!(
            sanitize_send(&short),
            Err(CmsgError::DataLength(libc::IPPROTO_IP, libc::IP_PKTINFO, 8))
        );
    }

    #[test]
    fn hostile_lengths_are_refused() {
        let mut v = pktinfo();
        v[..ALIGN].copy_from_slice(&4096usize.to_ne_bytes());
        assert_eq!(sanitize_send(&v), Err(CmsgError::Length(4096)));
        v[..ALIGN].copy_from_slice(&3usize.to_ne_bytes());
        assert_eq!(sanitize_send(&v), Err(CmsgError::Length(3)));
        v[..ALIGN].copy_from_slice(&usize::MAX.to_ne_bytes());
        assert!(sanitize_send(&v).is_err());
        assert!(parse(&v).next().is_none());
        assert_eq!(
            sanitize_send(&[0; MAX_CONTROL + 1]),
            Err(CmsgError::TooLong(MAX_CONTROL + 1))
        );
    }

    #[test]
    fn put_truncates_as_the_kernel_does() {
        let mut v = pktinfo();
        push(&mut v, libc::IPPROTO_IP, libc::IP_TTL, &64i32.to_ne_bytes());
        let mut out = [0u8; 64];
        assert_eq!(
            put(&v, &mut out),
            Placed {
                used: v.len(),
                truncated: false
            }
        );
        assert_eq!(&out[..v.len()], &v[..]);
        // Room for a header only: none of it.
        let mut tiny = [0u8; 8];
        assert_eq!(
            put(&v, &mut tiny),
            Placed {
                used: 0,
                truncated: true
            }
        );
        // The first whole; 8 bytes left are no room for the second's header.
        let mut room = [0u8; 40];
        assert_eq!(
            put(&v, &mut room),
            Placed {
                used: 32,
                truncated: true
            }
        );
        // The first whole, the second cut after 2 of its 4 data bytes.
        let mut cut = [0u8; 50];
        assert_eq!(
            put(&v, &mut cut),
            Placed {
                used: 50,
                truncated: true
            }
        );
        assert_eq!(usize::from_ne_bytes(cut[32..40].try_into().unwrap()), 18);
        assert_eq!(&cut[48..50], &64i32.to_ne_bytes()[..2]);
    }
}
