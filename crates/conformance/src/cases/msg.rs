//! COMPAT 8 (part 2) — `sendmsg`/`recvmsg` with iovecs and control messages
//! (`IP_PKTINFO`, `IPV6_PKTINFO`, TTL, TOS, timestamps, truncated control data) and
//! `sendmmsg`/`recvmmsg`.

use libc::c_int;

use super::{Case, Res};
use crate::net::{Addr, connect, poll1, sendto, set_int, tcp_pair, udp_bound, wait_for};
use crate::sys::{Ctx, show, zeroed};

pub const CASES: &[Case] = &[
    Case::new("msg.sendmsg_recvmsg_iov", sendmsg_recvmsg_iov),
    Case::new("msg.recvmsg_ip_pktinfo", recvmsg_ip_pktinfo),
    Case::new("msg.recvmsg_ttl_tos", recvmsg_ttl_tos),
    Case::new("msg.recvmsg_ipv6_pktinfo", recvmsg_ipv6_pktinfo),
    Case::new("msg.recvmsg_timestamp", recvmsg_timestamp),
    Case::new("msg.recvmsg_ctrunc", recvmsg_ctrunc),
    Case::new("msg.sendmsg_pktinfo_source", sendmsg_pktinfo_source),
    Case::new("msg.sendmsg_name_unconnected", sendmsg_name_unconnected),
    Case::new("msg.sendmmsg_recvmmsg_udp", sendmmsg_recvmmsg_udp),
    Case::new("msg.sendmmsg_tcp", sendmmsg_tcp),
    Case::new("msg.recvmsg_ctrunc_partial", recvmsg_ctrunc_partial),
    Case::new("msg.recvmmsg_pktinfo_each", recvmmsg_pktinfo_each),
    Case::new("msg.sendmsg_tos_ttl_cmsgs", sendmsg_tos_ttl_cmsgs),
    Case::new(
        "msg.sendmsg_ipv6_tclass_hoplimit",
        sendmsg_ipv6_tclass_hoplimit,
    ),
    Case::new("msg.sendmsg_udp_segment", sendmsg_udp_segment),
    Case::new("msg.sendmsg_refused_cmsgs", sendmsg_refused_cmsgs),
];

/// One received control message: (level, type, payload).
type Cmsg = (c_int, c_int, Vec<u8>);

/// A datagram received with `recvmsg` plus its control messages.
struct Received {
    len: usize,
    flags: c_int,
    from: Addr,
    data: Vec<u8>,
    cmsgs: Vec<Cmsg>,
}

fn recvmsg_with(
    fd: c_int,
    buf_len: usize,
    control_len: usize,
    flags: c_int,
) -> Result<Received, String> {
    let mut data = vec![0u8; buf_len];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut control = vec![0u64; control_len.div_ceil(8)];
    let mut from = Addr::empty();
    let mut msg: libc::msghdr = zeroed();
    msg.msg_name = from.ptr_mut().cast();
    msg.msg_namelen = from.len();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control_len;
    let n = sys!(libc::recvmsg(fd, &mut msg, flags)).ctx("recvmsg")? as usize;
    *from.len_mut() = msg.msg_namelen;
    let cmsgs = cmsgs_of(&msg);
    data.truncate(n.min(buf_len));
    Ok(Received {
        len: n,
        flags: msg.msg_flags,
        from,
        data,
        cmsgs,
    })
}

/// The control messages of a header the kernel just filled.
fn cmsgs_of(msg: &libc::msghdr) -> Vec<Cmsg> {
    let mut cmsgs = Vec::new();
    // SAFETY: `msg` is the header `recvmsg_with` just had filled: `msg_control` is its
    // live buffer of at least `msg_controllen` bytes, and CMSG_FIRSTHDR/CMSG_NXTHDR
    // return only headers that lie inside those bytes (null otherwise). Each payload
    // length is taken from a `cmsg_len` the kernel (or the shim, following the kernel's
    // rules) wrote: at least CMSG_LEN(0) and within the returned `msg_controllen`, so
    // the slice stays inside the buffer; it is copied out at once.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(msg);
        while !cm.is_null() {
            let payload = (*cm).cmsg_len - libc::CMSG_LEN(0) as usize;
            let p = libc::CMSG_DATA(cm);
            let bytes = std::slice::from_raw_parts(p, payload).to_vec();
            cmsgs.push(((*cm).cmsg_level, (*cm).cmsg_type, bytes));
            cm = libc::CMSG_NXTHDR(msg, cm);
        }
    }
    cmsgs
}

/// `ttl=N` / `tos=0xN` for the IP_TTL / IP_TOS messages (others by level and type),
/// sorted.
fn ttl_tos(cmsgs: &[Cmsg]) -> Vec<String> {
    let mut found: Vec<String> = cmsgs
        .iter()
        .map(|(l, t, d)| match (*l, *t) {
            (libc::IPPROTO_IP, libc::IP_TTL) => {
                format!("ttl={}", read_pod::<c_int>(d).unwrap_or(-1))
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => {
                format!("tos={:#x}", d.first().copied().unwrap_or(0))
            }
            (l, t) => format!("cmsg({l},{t})"),
        })
        .collect();
    found.sort();
    found
}

fn read_pod<T: crate::sys::Plain>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: `bytes` holds at least `size_of::<T>()` bytes (checked above), read
    // unaligned; `T: Plain` makes any bytes a valid `T`.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn flag_names(flags: c_int) -> String {
    let mut v = Vec::new();
    for (bit, name) in [
        (libc::MSG_TRUNC, "MSG_TRUNC"),
        (libc::MSG_CTRUNC, "MSG_CTRUNC"),
        (libc::MSG_EOR, "MSG_EOR"),
        (libc::MSG_OOB, "MSG_OOB"),
    ] {
        if flags & bit != 0 {
            v.push(name);
        }
    }
    if v.is_empty() {
        "0".into()
    } else {
        v.join("|")
    }
}

fn sendmsg_recvmsg_iov() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let parts: [&[u8]; 3] = [b"alpha-", b"beta-", b"gamma"];
    let iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        })
        .collect();
    let mut msg: libc::msghdr = zeroed();
    msg.msg_iov = iov.as_ptr().cast_mut();
    msg.msg_iovlen = iov.len();
    let sent = show(sys!(libc::sendmsg(c.raw(), &msg, 0)));
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    crate::sys::sleep_ms(5);
    let (mut a, mut b) = ([0u8; 8], [0u8; 32]);
    let mut riov = [
        libc::iovec {
            iov_base: a.as_mut_ptr().cast(),
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        },
    ];
    let mut rmsg: libc::msghdr = zeroed();
    rmsg.msg_iov = riov.as_mut_ptr();
    rmsg.msg_iovlen = 2;
    let n = sys!(libc::recvmsg(s.raw(), &mut rmsg, 0)).ctx("recvmsg")? as usize;
    Ok(format!(
        "sendmsg={sent} recvmsg={n} iov0={:?} iov1={:?} flags={}",
        String::from_utf8_lossy(&a),
        String::from_utf8_lossy(&b[..n.saturating_sub(8)]),
        flag_names(rmsg.msg_flags)
    ))
}

fn recvmsg_ip_pktinfo() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    let on = show(set_int(r.raw(), libc::IPPROTO_IP, libc::IP_PKTINFO, 1).map(|_| 0));
    sendto(t.raw(), b"pkt", 0, &raddr).ctx("sendto")?;
    let m = recvmsg_with(r.raw(), 64, 256, 0)?;
    let mut info = "missing".to_string();
    for (level, ty, data) in &m.cmsgs {
        if *level == libc::IPPROTO_IP
            && *ty == libc::IP_PKTINFO
            && let Some(pi) = read_pod::<libc::in_pktinfo>(data)
        {
            let dst = std::net::Ipv4Addr::from(pi.ipi_addr.s_addr.to_ne_bytes());
            let spec = std::net::Ipv4Addr::from(pi.ipi_spec_dst.s_addr.to_ne_bytes());
            info = format!("ifindex={} dst={dst} spec_dst={spec}", pi.ipi_ifindex);
        }
    }
    Ok(format!(
        "IP_PKTINFO={on} len={} from={} pktinfo: {info}",
        m.len,
        m.from.describe()
    ))
}

fn recvmsg_ttl_tos() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_RECVTTL, 1).ctx("IP_RECVTTL")?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_RECVTOS, 1).ctx("IP_RECVTOS")?;
    set_int(t.raw(), libc::IPPROTO_IP, libc::IP_TOS, 0x10).ctx("IP_TOS")?;
    sendto(t.raw(), b"ttl", 0, &raddr).ctx("sendto")?;
    let m = recvmsg_with(r.raw(), 64, 256, 0)?;
    let mut found = ttl_tos(&m.cmsgs);
    if found.is_empty() {
        found.push("no cmsgs".into());
    }
    Ok(found.join(" "))
}

fn recvmsg_ipv6_pktinfo() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET6)?;
    let (t, _) = udp_bound(libc::AF_INET6)?;
    set_int(r.raw(), libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1).ctx("setsockopt")?;
    set_int(r.raw(), libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1).ctx("setsockopt")?;
    sendto(t.raw(), b"pkt6", 0, &raddr).ctx("sendto")?;
    let m = recvmsg_with(r.raw(), 64, 256, 0)?;
    let mut found = Vec::new();
    for (level, ty, data) in &m.cmsgs {
        match (*level, *ty) {
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                if let Some(pi) = read_pod::<libc::in6_pktinfo>(data) {
                    let a = std::net::Ipv6Addr::from(pi.ipi6_addr.s6_addr);
                    found.push(format!("pktinfo=[{a} ifindex={}]", pi.ipi6_ifindex));
                }
            }
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => found.push(format!(
                "hoplimit={}",
                read_pod::<c_int>(data).unwrap_or(-1)
            )),
            (l, t) => found.push(format!("cmsg({l},{t})")),
        }
    }
    found.sort();
    if found.is_empty() {
        found.push("no cmsgs".into());
    }
    Ok(format!("from={} {}", m.from.describe(), found.join(" ")))
}

fn recvmsg_timestamp() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    set_int(r.raw(), libc::SOL_SOCKET, libc::SO_TIMESTAMP, 1).ctx("SO_TIMESTAMP")?;
    sendto(t.raw(), b"ts", 0, &raddr).ctx("sendto")?;
    let m = recvmsg_with(r.raw(), 64, 256, 0)?;
    let ts = m
        .cmsgs
        .iter()
        .find(|(l, ty, _)| *l == libc::SOL_SOCKET && *ty == libc::SCM_TIMESTAMP);
    let plausible = ts
        .and_then(|(_, _, d)| read_pod::<libc::timeval>(d))
        .is_some_and(|tv| tv.tv_sec > 1_600_000_000);
    Ok(format!(
        "SCM_TIMESTAMP present={} plausible={plausible}",
        ts.is_some()
    ))
}

fn recvmsg_ctrunc() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_PKTINFO, 1).ctx("IP_PKTINFO")?;
    sendto(t.raw(), b"ctrunc", 0, &raddr).ctx("sendto")?;
    let m = recvmsg_with(r.raw(), 64, 8, 0)?;
    Ok(format!(
        "len={} flags={} cmsgs={}",
        m.len,
        flag_names(m.flags),
        m.cmsgs.len()
    ))
}

fn sendmsg_pktinfo_source() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let t = crate::net::udp_socket(libc::AF_INET).ctx("socket")?;
    // An in_pktinfo: ipi_ifindex 0, ipi_spec_dst 127.0.0.1, ipi_addr unset.
    let pi = [0i32.to_ne_bytes(), [127, 0, 0, 1], [0; 4]].concat();
    let sent = sendmsg_cmsgs(
        t.raw(),
        &raddr,
        b"with-pktinfo",
        &[(libc::IPPROTO_IP, libc::IP_PKTINFO, pi)],
    );
    let m = recvmsg_with(r.raw(), 64, 0, 0)?;
    Ok(format!(
        "sendmsg={sent} got={:?} from={}",
        String::from_utf8_lossy(&m.data),
        m.from.describe()
    ))
}

fn sendmsg_name_unconnected() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET6)?;
    let t = crate::net::udp_socket(libc::AF_INET6).ctx("socket")?;
    let mut payload = *b"named";
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    let mut msg: libc::msghdr = zeroed();
    msg.msg_name = raddr.ptr().cast_mut().cast();
    msg.msg_namelen = raddr.len();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let sent = show(sys!(libc::sendmsg(t.raw(), &msg, 0)));
    let mut nameless: libc::msghdr = zeroed();
    nameless.msg_iov = &mut iov;
    nameless.msg_iovlen = 1;
    let no_name = show(sys!(libc::sendmsg(t.raw(), &nameless, 0)));
    let m = recvmsg_with(r.raw(), 64, 0, 0)?;
    Ok(format!(
        "sendmsg={sent} without_name={no_name} got={:?} from={}",
        String::from_utf8_lossy(&m.data),
        m.from.describe()
    ))
}

fn sendmmsg_recvmmsg_udp() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    connect(t.raw(), &raddr).ctx("connect")?;
    let payloads: [&[u8]; 3] = [b"a", b"bb", b"ccc"];
    let mut iovs: Vec<libc::iovec> = payloads
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            let mut h: libc::mmsghdr = zeroed();
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let sent = show(sys!(libc::sendmmsg(t.raw(), msgs.as_mut_ptr(), 3, 0)));
    let sent_lens: Vec<u32> = msgs.iter().map(|m| m.msg_len).collect();
    // Collect all three, in as many recvmmsg calls as it takes (delivery timing is not
    // the kernel contract under test; batching and order are).
    let mut got: Vec<String> = Vec::new();
    let mut from: Vec<String> = Vec::new();
    while got.len() < 3 {
        wait_for(r.raw(), libc::POLLIN).ctx("poll")?;
        let mut bufs = [[0u8; 16]; 4];
        let mut names = [Addr::empty(); 4];
        let mut riovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut rmsgs: Vec<libc::mmsghdr> = riovs
            .iter_mut()
            .zip(names.iter_mut())
            .map(|(iov, name)| {
                let mut h: libc::mmsghdr = zeroed();
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_name = name.ptr_mut().cast();
                h.msg_hdr.msg_namelen = name.len();
                h
            })
            .collect();
        let null = std::ptr::null_mut();
        let flags = libc::MSG_DONTWAIT;
        let n = sys!(libc::recvmmsg(r.raw(), rmsgs.as_mut_ptr(), 4, flags, null)).ctx("recvmmsg")?
            as usize;
        for (m, b) in rmsgs[..n].iter().zip(bufs.iter()) {
            got.push(String::from_utf8_lossy(&b[..m.msg_len as usize]).into_owned());
            let (name, len) = (m.msg_hdr.msg_name.cast(), m.msg_hdr.msg_namelen);
            // SAFETY: `msg_name` still points at this entry's `names[i]`, a live
            // `sockaddr_storage`, and `from_raw` reads at most that many bytes of it.
            from.push(unsafe { Addr::from_raw(name, len) }.ip());
        }
    }
    Ok(format!(
        "sendmmsg={sent} lens={sent_lens:?} recvmmsg_total={} got={got:?} from={}",
        got.len(),
        from.join(",")
    ))
}

fn sendmmsg_tcp() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let payloads: [&[u8]; 2] = [b"first;", b"second"];
    let mut iovs: Vec<libc::iovec> = payloads
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            let mut h: libc::mmsghdr = zeroed();
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let sent = show(sys!(libc::sendmmsg(c.raw(), msgs.as_mut_ptr(), 2, 0)));
    let got = crate::net::recv_exact(s.raw(), 12)?;
    Ok(format!(
        "sendmmsg={sent} peer_got={:?}",
        String::from_utf8_lossy(&got)
    ))
}

/// `sendmsg` of `payload` to `dest` with the given control messages; the call's result.
fn sendmsg_cmsgs(fd: c_int, dest: &Addr, payload: &[u8], cmsgs: &[Cmsg]) -> String {
    let space: usize = cmsgs
        .iter()
        // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
        .map(|(_, _, d)| unsafe { libc::CMSG_SPACE(d.len() as u32) } as usize)
        .sum();
    let mut control = vec![0u64; space.div_ceil(8).max(1)];
    let mut payload = payload.to_vec();
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    let mut msg: libc::msghdr = zeroed();
    msg.msg_name = dest.ptr().cast_mut().cast();
    msg.msg_namelen = dest.len();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `control` is a live, 8-aligned buffer of `space` bytes, the sum of every
    // message's CMSG_SPACE, so the k-th header and its data (copied from the caller's
    // slice, which cannot overlap it) lie inside it. CMSG_NXTHDR reads only the zeroed
    // next header inside `msg_controllen`, and returns null only after the last one.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(&msg);
        for (level, ty, data) in cmsgs {
            (*cm).cmsg_level = *level;
            (*cm).cmsg_type = *ty;
            (*cm).cmsg_len = libc::CMSG_LEN(data.len() as u32) as usize;
            std::ptr::copy_nonoverlapping(data.as_ptr(), libc::CMSG_DATA(cm), data.len());
            cm = libc::CMSG_NXTHDR(&msg, cm);
        }
    }
    show(sys!(libc::sendmsg(fd, &msg, 0)))
}

fn int_cmsg(level: c_int, ty: c_int, v: c_int) -> Cmsg {
    (level, ty, v.to_ne_bytes().to_vec())
}

/// The received messages, decoded where they are integers, sorted.
fn describe_cmsgs(cmsgs: &[Cmsg]) -> String {
    let mut found: Vec<String> = cmsgs
        .iter()
        .map(|(l, t, d)| match read_pod::<c_int>(d) {
            Some(v) if d.len() == 4 => format!("({l},{t})={v:#x}"),
            _ => format!("({l},{t})+{}", d.len()),
        })
        .collect();
    found.sort();
    if found.is_empty() {
        "none".into()
    } else {
        found.join(" ")
    }
}

fn recvmsg_ctrunc_partial() -> Res {
    // Room for a header and 4 bytes of IP_PKTINFO's 12: the kernel cuts the message.
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_PKTINFO, 1).ctx("IP_PKTINFO")?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_RECVTTL, 1).ctx("IP_RECVTTL")?;
    sendto(t.raw(), b"cut", 0, &raddr).ctx("sendto")?;
    // SAFETY: CMSG_LEN is arithmetic on its argument; it touches no memory.
    let room = unsafe { libc::CMSG_LEN(4) } as usize;
    let m = recvmsg_with(r.raw(), 64, room, 0)?;
    let lens: Vec<usize> = m.cmsgs.iter().map(|(_, _, d)| d.len()).collect();
    Ok(format!(
        "len={} flags={} data_lens={lens:?}",
        m.len,
        flag_names(m.flags)
    ))
}

fn recvmmsg_pktinfo_each() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_PKTINFO, 1).ctx("IP_PKTINFO")?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_RECVTOS, 1).ctx("IP_RECVTOS")?;
    for (p, tos) in [(&b"one"[..], 0x04), (&b"two"[..], 0x08)] {
        set_int(t.raw(), libc::IPPROTO_IP, libc::IP_TOS, tos).ctx("IP_TOS")?;
        sendto(t.raw(), p, 0, &raddr).ctx("sendto")?;
    }
    wait_for(r.raw(), libc::POLLIN).ctx("poll")?;
    let mut data = [[0u8; 16]; 2];
    let mut control = [[0u64; 16]; 2];
    let mut iovs: Vec<libc::iovec> = data
        .iter_mut()
        .map(|d| libc::iovec {
            iov_base: d.as_mut_ptr().cast(),
            iov_len: d.len(),
        })
        .collect();
    let mut hdrs: Vec<libc::mmsghdr> = (0..2).map(|_| zeroed()).collect();
    for (i, h) in hdrs.iter_mut().enumerate() {
        h.msg_hdr.msg_iov = &mut iovs[i];
        h.msg_hdr.msg_iovlen = 1;
        h.msg_hdr.msg_control = control[i].as_mut_ptr().cast();
        h.msg_hdr.msg_controllen = size_of_val(&control[i]);
    }
    let n = sys!(libc::recvmmsg(
        r.raw(),
        hdrs.as_mut_ptr(),
        2,
        libc::MSG_DONTWAIT,
        std::ptr::null_mut()
    ))
    .ctx("recvmmsg")?;
    let mut out = vec![format!("recvmmsg={n}")];
    for h in hdrs.iter().take(n as usize) {
        let cmsgs = cmsgs_of(&h.msg_hdr);
        let tos = cmsgs
            .iter()
            .find(|(l, t, _)| (*l, *t) == (libc::IPPROTO_IP, libc::IP_TOS))
            .and_then(|(_, _, d)| d.first().copied());
        let pktinfo = cmsgs
            .iter()
            .any(|(l, t, _)| (*l, *t) == (libc::IPPROTO_IP, libc::IP_PKTINFO));
        out.push(format!("[len={} tos={tos:?} pktinfo={pktinfo}]", h.msg_len));
    }
    Ok(out.join(" "))
}

fn sendmsg_tos_ttl_cmsgs() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_RECVTTL, 1).ctx("IP_RECVTTL")?;
    set_int(r.raw(), libc::IPPROTO_IP, libc::IP_RECVTOS, 1).ctx("IP_RECVTOS")?;
    let sent = sendmsg_cmsgs(
        t.raw(),
        &raddr,
        b"marked",
        &[
            int_cmsg(libc::IPPROTO_IP, libc::IP_TOS, 0x28),
            int_cmsg(libc::IPPROTO_IP, libc::IP_TTL, 7),
        ],
    );
    // A second datagram without them: the socket's own values again.
    let plain = show(sendto(t.raw(), b"plain", 0, &raddr));
    let a = recvmsg_with(r.raw(), 64, 256, 0)?;
    let b = recvmsg_with(r.raw(), 64, 256, 0)?;
    let tos_ttl = |m: &Received| ttl_tos(&m.cmsgs).join(",");
    Ok(format!(
        "sendmsg={sent} first=[{}] second={plain} [{}]",
        tos_ttl(&a),
        tos_ttl(&b)
    ))
}

fn sendmsg_ipv6_tclass_hoplimit() -> Res {
    let (r, raddr) = udp_bound(libc::AF_INET6)?;
    let (t, _) = udp_bound(libc::AF_INET6)?;
    set_int(r.raw(), libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1).ctx("RECVTCLASS")?;
    set_int(r.raw(), libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1).ctx("RECVHOPLIMIT")?;
    let sent = sendmsg_cmsgs(
        t.raw(),
        &raddr,
        b"six",
        &[
            int_cmsg(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, 0x20),
            int_cmsg(libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, 9),
        ],
    );
    let m = recvmsg_with(r.raw(), 64, 256, 0)?;
    Ok(format!("sendmsg={sent} {}", describe_cmsgs(&m.cmsgs)))
}

fn sendmsg_udp_segment() -> Res {
    // UDP GSO: one call, datagrams of the segment size (the last one shorter).
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    let payload = vec![b'g'; 2500];
    let sent = sendmsg_cmsgs(
        t.raw(),
        &raddr,
        &payload,
        &[(
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            1000u16.to_ne_bytes().to_vec(),
        )],
    );
    let mut lens = Vec::new();
    while poll1(r.raw(), libc::POLLIN, 300).is_ok_and(|e| e & libc::POLLIN != 0) {
        let m = recvmsg_with(r.raw(), 4096, 0, libc::MSG_DONTWAIT)?;
        lens.push(m.len);
    }
    Ok(format!("sendmsg={sent} datagrams={lens:?}"))
}

fn sendmsg_refused_cmsgs() -> Res {
    // Messages the kernel refuses on a datagram socket, and one of a level it skips.
    let (r, raddr) = udp_bound(libc::AF_INET)?;
    let (t, _) = udp_bound(libc::AF_INET)?;
    let rights = sendmsg_cmsgs(
        t.raw(),
        &raddr,
        b"r",
        &[int_cmsg(libc::SOL_SOCKET, libc::SCM_RIGHTS, 0)],
    );
    let short = sendmsg_cmsgs(
        t.raw(),
        &raddr,
        b"s",
        &[(libc::IPPROTO_IP, libc::IP_PKTINFO, vec![0; 8])],
    );
    let unknown = sendmsg_cmsgs(t.raw(), &raddr, b"u", &[int_cmsg(libc::IPPROTO_IP, 999, 0)]);
    let skipped = sendmsg_cmsgs(
        t.raw(),
        &raddr,
        b"k",
        &[int_cmsg(libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)],
    );
    let mut got = Vec::new();
    while poll1(r.raw(), libc::POLLIN, 300).is_ok_and(|e| e & libc::POLLIN != 0) {
        let m = recvmsg_with(r.raw(), 64, 0, libc::MSG_DONTWAIT)?;
        got.push(String::from_utf8_lossy(&m.data).into_owned());
    }
    Ok(format!(
        "rights={rights} short_pktinfo={short} unknown_ip={unknown} tcp_level={skipped} \
         delivered={got:?}"
    ))
}
