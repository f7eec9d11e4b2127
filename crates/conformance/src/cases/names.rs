//! COMPAT 9 — name resolution: `getaddrinfo` for localhost, numeric hosts and services,
//! `AI_PASSIVE`, `AI_V4MAPPED`, errors, connecting through its results; `getnameinfo`;
//! `gethostbyname`; a sensible `/etc/hosts`.
//!
//! Nothing here may reach a DNS server: every name is numeric or `localhost`, which
//! `/etc/hosts` answers. Where the order of several results depends on the machine's
//! addresses (RFC 3484 sorting), the results are printed sorted.

use std::ffi::CString;

use libc::c_int;

use super::{Case, Res};
use crate::flags::{proto_name, socktype_name};
use crate::net::{Addr, accept, connect, family_name, listener, socket};
use crate::sys::{Ctx, c_ptr_str, zeroed};

pub const CASES: &[Case] = &[
    Case::new("gai.localhost_inet", localhost_inet),
    Case::new("gai.localhost_unspec", localhost_unspec),
    Case::new("gai.numeric_v4_all_socktypes", numeric_v4_all_socktypes),
    Case::new("gai.numeric_v6", numeric_v6),
    Case::new("gai.passive_v4", passive_v4),
    Case::new("gai.passive_unspec", passive_unspec),
    Case::new("gai.v4mapped_hint", v4mapped_hint),
    Case::new("gai.errors", errors),
    Case::new("gai.connect_via_result", connect_via_result),
    Case::new("gai.getnameinfo_numeric", getnameinfo_numeric),
    Case::new("gai.getnameinfo_localhost", getnameinfo_localhost),
    Case::new("gai.gethostbyname_localhost", gethostbyname_localhost),
    Case::new("gai.etc_hosts_localhost", etc_hosts_localhost),
];

unsafe extern "C" {
    fn gethostbyname(name: *const libc::c_char) -> *mut libc::hostent;
}

/// One `getaddrinfo` result.
struct Ai {
    family: c_int,
    socktype: c_int,
    protocol: c_int,
    addr: Addr,
}

impl Ai {
    fn show(&self) -> String {
        format!(
            "{}/{}/{}/{}:{}",
            family_name(self.family),
            socktype_name(self.socktype),
            proto_name(self.protocol),
            self.addr.ip(),
            self.addr.port()
        )
    }
}

fn eai_name(rc: c_int) -> String {
    let names = [
        (libc::EAI_BADFLAGS, "EAI_BADFLAGS"),
        (libc::EAI_NONAME, "EAI_NONAME"),
        (libc::EAI_AGAIN, "EAI_AGAIN"),
        (libc::EAI_FAIL, "EAI_FAIL"),
        (libc::EAI_NODATA, "EAI_NODATA"),
        (libc::EAI_FAMILY, "EAI_FAMILY"),
        (libc::EAI_SOCKTYPE, "EAI_SOCKTYPE"),
        (libc::EAI_SERVICE, "EAI_SERVICE"),
        (libc::EAI_MEMORY, "EAI_MEMORY"),
        (libc::EAI_SYSTEM, "EAI_SYSTEM"),
    ];
    names
        .iter()
        .find(|(v, _)| *v == rc)
        .map_or_else(|| format!("EAI({rc})"), |(_, n)| n.to_string())
}

fn gai(
    node: Option<&str>,
    service: Option<&str>,
    family: c_int,
    socktype: c_int,
    flags: c_int,
) -> Result<Vec<Ai>, String> {
    let node = node.map(|n| CString::new(n).expect("no NUL"));
    let service = service.map(|s| CString::new(s).expect("no NUL"));
    let mut hints: libc::addrinfo = zeroed();
    hints.ai_family = family;
    hints.ai_socktype = socktype;
    hints.ai_flags = flags;
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: node and service are null or live CStrings owned by this frame; `hints`
    // is an initialised local and `res` a local out-pointer getaddrinfo fills.
    let rc = unsafe {
        libc::getaddrinfo(
            node.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
            service.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            &hints,
            &mut res,
        )
    };
    if rc != 0 {
        return Err(eai_name(rc));
    }
    let mut out = Vec::new();
    let mut p = res;
    // SAFETY: getaddrinfo succeeded, so `res` heads a list glibc owns until the
    // `freeaddrinfo` below: each node is valid, its `ai_addr` readable for `ai_addrlen`
    // bytes (what `from_raw` asks), and nothing is kept past the free (the addresses
    // are copied).
    unsafe {
        while !p.is_null() {
            let ai = &*p;
            out.push(Ai {
                family: ai.ai_family,
                socktype: ai.ai_socktype,
                protocol: ai.ai_protocol,
                addr: Addr::from_raw(ai.ai_addr, ai.ai_addrlen),
            });
            p = ai.ai_next;
        }
        libc::freeaddrinfo(res);
    }
    Ok(out)
}

fn list(r: Result<Vec<Ai>, String>) -> String {
    match r {
        Ok(v) => v.iter().map(Ai::show).collect::<Vec<_>>().join(" "),
        Err(e) => e,
    }
}

fn sorted(r: Result<Vec<Ai>, String>) -> String {
    match r {
        Ok(v) => {
            let mut items: Vec<String> = v.iter().map(Ai::show).collect();
            items.sort();
            items.dedup();
            items.join(" ")
        }
        Err(e) => e,
    }
}

fn localhost_inet() -> Res {
    Ok(list(gai(
        Some("localhost"),
        Some("80"),
        libc::AF_INET,
        libc::SOCK_STREAM,
        0,
    )))
}

fn localhost_unspec() -> Res {
    let r = gai(
        Some("localhost"),
        Some("80"),
        libc::AF_UNSPEC,
        libc::SOCK_STREAM,
        0,
    )?;
    let has_v4 = r.iter().any(|a| a.addr.ip() == "127.0.0.1");
    let all_loopback = r
        .iter()
        .all(|a| a.addr.ip() == "127.0.0.1" || a.addr.ip() == "::1");
    Ok(format!(
        "has_127.0.0.1={has_v4} all_loopback={all_loopback} nonempty={}",
        !r.is_empty()
    ))
}

fn numeric_v4_all_socktypes() -> Res {
    let flags = libc::AI_NUMERICHOST | libc::AI_NUMERICSERV;
    Ok(list(gai(
        Some("127.0.0.1"),
        Some("8080"),
        libc::AF_UNSPEC,
        0,
        flags,
    )))
}

fn numeric_v6() -> Res {
    Ok(list(gai(
        Some("::1"),
        Some("443"),
        libc::AF_UNSPEC,
        libc::SOCK_DGRAM,
        libc::AI_NUMERICHOST,
    )))
}

fn passive_v4() -> Res {
    Ok(list(gai(
        None,
        Some("0"),
        libc::AF_INET,
        libc::SOCK_STREAM,
        libc::AI_PASSIVE,
    )))
}

fn passive_unspec() -> Res {
    let passive = sorted(gai(
        None,
        Some("7"),
        libc::AF_UNSPEC,
        libc::SOCK_STREAM,
        libc::AI_PASSIVE,
    ));
    let active = sorted(gai(None, Some("7"), libc::AF_UNSPEC, libc::SOCK_STREAM, 0));
    Ok(format!("passive: {passive}; without_passive: {active}"))
}

fn v4mapped_hint() -> Res {
    let flags = libc::AI_V4MAPPED | libc::AI_NUMERICHOST;
    Ok(list(gai(
        Some("127.0.0.1"),
        Some("1"),
        libc::AF_INET6,
        libc::SOCK_STREAM,
        flags,
    )))
}

fn errors() -> Res {
    let name_numeric = list(gai(Some("localhost"), None, 0, 0, libc::AI_NUMERICHOST));
    let svc_numeric = list(gai(
        Some("127.0.0.1"),
        Some("http"),
        0,
        0,
        libc::AI_NUMERICSERV,
    ));
    let bad_family = list(gai(Some("127.0.0.1"), None, 12345, 0, 0));
    let neither = list(gai(None, None, 0, 0, 0));
    let bad_socktype = list(gai(Some("127.0.0.1"), Some("1"), 0, 12345, 0));
    Ok(format!(
        "numerichost(localhost)={name_numeric} numericserv(http)={svc_numeric} \
         family={bad_family} no_node_no_service={neither} socktype={bad_socktype}"
    ))
}

fn connect_via_result() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let port = addr.port().to_string();
    let results = gai(
        Some("localhost"),
        Some(&port),
        libc::AF_UNSPEC,
        libc::SOCK_STREAM,
        0,
    )?;
    for ai in &results {
        let Ok(s) = socket(ai.family, ai.socktype, ai.protocol) else {
            continue;
        };
        if connect(s.raw(), &ai.addr).is_ok() {
            let _a = accept(l.raw()).ctx("accept")?;
            return Ok(format!("connected family={}", family_name(ai.family)));
        }
    }
    Ok("no result connected".into())
}

fn nameinfo(a: &Addr, flags: c_int) -> String {
    let mut host = [0 as libc::c_char; 256];
    let mut serv = [0 as libc::c_char; 32];
    // SAFETY: `a`'s storage is readable for `a.len()` bytes; `host` and `serv` are live
    // local arrays passed with their own lengths.
    let rc = unsafe {
        libc::getnameinfo(
            a.ptr(),
            a.len(),
            host.as_mut_ptr(),
            host.len() as libc::socklen_t,
            serv.as_mut_ptr(),
            serv.len() as libc::socklen_t,
            flags,
        )
    };
    if rc != 0 {
        return eai_name(rc);
    }
    format!(
        "{}:{}",
        crate::sys::c_buf_str(&host),
        crate::sys::c_buf_str(&serv)
    )
}

fn getnameinfo_numeric() -> Res {
    let flags = libc::NI_NUMERICHOST | libc::NI_NUMERICSERV;
    Ok(format!(
        "v4={} v6={} mapped={}",
        nameinfo(&Addr::parse("127.0.0.1", 8080), flags),
        nameinfo(&Addr::parse("::1", 8080), flags),
        nameinfo(&Addr::parse("::ffff:127.0.0.1", 53), flags)
    ))
}

fn getnameinfo_localhost() -> Res {
    let flags = libc::NI_NAMEREQD | libc::NI_NUMERICSERV;
    Ok(format!(
        "127.0.0.1 → {}",
        nameinfo(&Addr::parse("127.0.0.1", 80), flags)
    ))
}

fn gethostbyname_localhost() -> Res {
    // SAFETY: a C string literal; the result is checked for null before use.
    let h = unsafe { gethostbyname(c"localhost".as_ptr()) };
    if h.is_null() {
        return Ok("NULL".into());
    }
    // SAFETY: a non-null `hostent` from gethostbyname is glibc's static result, valid
    // until the next such call, which nothing here makes (the case is single-threaded);
    // its address list is null-terminated, each entry `h_length` bytes; `h_name` is null
    // or a NUL-terminated string (what `c_ptr_str` asks). Everything is copied out.
    let (name, family, len, first) = unsafe {
        let h = &*h;
        let first = if h.h_addr_list.is_null() || (*h.h_addr_list).is_null() {
            None
        } else {
            let p = (*h.h_addr_list).cast::<u8>();
            Some(std::slice::from_raw_parts(p, h.h_length as usize).to_vec())
        };
        (c_ptr_str(h.h_name), h.h_addrtype, h.h_length, first)
    };
    let first = match first {
        Some(b) if b.len() == 4 => std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string(),
        Some(b) => format!("{b:?}"),
        None => "none".into(),
    };
    Ok(format!(
        "h_name={name} type={} len={len} first={first}",
        family_name(family)
    ))
}

fn etc_hosts_localhost() -> Res {
    let hosts = std::fs::read_to_string("/etc/hosts").map_err(|e| format!("/etc/hosts: {e}"))?;
    let maps = hosts.lines().any(|l| {
        let mut f = l.split('#').next().unwrap_or("").split_whitespace();
        f.next() == Some("127.0.0.1") && f.any(|n| n == "localhost")
    });
    let resolv = std::path::Path::new("/etc/resolv.conf").exists();
    Ok(format!(
        "127.0.0.1_localhost={maps} resolv.conf_exists={resolv}"
    ))
}
