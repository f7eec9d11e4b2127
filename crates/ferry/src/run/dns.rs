//! `ferry run`'s DNS forwarder: `--dns` and the nameservers it forwards for.

use ferry_server::{Policy, Server, Verdict};

/// Parses `--dns`: `None` for off, else the upstream servers (`auto`: `nameservers`).
pub(crate) fn dns_upstreams(
    mode: &str,
    nameservers: &[std::net::IpAddr],
) -> Result<Option<Vec<std::net::SocketAddr>>, String> {
    match mode {
        "off" => Ok(None),
        "auto" => Ok(Some(
            nameservers
                .iter()
                .map(|ip| std::net::SocketAddr::new(*ip, 53))
                .collect(),
        )),
        list => list
            .split(',')
            .map(|item| {
                item.parse::<std::net::SocketAddr>()
                    .or_else(|_| {
                        item.parse::<std::net::IpAddr>()
                            .map(|ip| std::net::SocketAddr::new(ip, 53))
                    })
                    .map_err(|_| format!("--dns: `{item}` is not IP[:PORT] (or use auto / off)"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
    }
}

/// The upstream nameservers for `--dns MODE` (`auto`: the host's, `/etc/resolv.conf`)
/// that `policy` allows (a loopback one, the host's own resolver, always: the forwarder
/// asks it from the host's namespace); `None` for off. With the host's nameserver
/// addresses (the ones a sandbox's resolver asks).
pub(crate) fn allowed_upstreams(
    mode: &str,
    policy: &Policy,
) -> Result<(Option<Vec<std::net::SocketAddr>>, Vec<std::net::IpAddr>), String> {
    let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let listen = ferry_server::dns::nameservers(&conf);
    let Some(upstream) = dns_upstreams(mode, &listen)? else {
        return Ok((None, listen));
    };
    if upstream.is_empty() {
        return Err("no nameserver in /etc/resolv.conf".into());
    }
    let allowed: Vec<_> = upstream
        .into_iter()
        .filter(|u| u.ip().is_loopback() || policy.check(u) == Verdict::Allow)
        .collect();
    if allowed.is_empty() {
        return Err("the egress policy denies every upstream nameserver".into());
    }
    Ok((Some(allowed), listen))
}

/// Starts the server's DNS forwarder on the nameserver addresses the sandbox's resolver
/// uses (the host's `/etc/resolv.conf`, which the sandbox shares).
pub(super) fn start_dns(server: &mut Server, mode: &str, policy: &Policy) -> Result<(), String> {
    let (Some(allowed), listen) = allowed_upstreams(mode, policy)? else {
        return Ok(());
    };
    if listen.is_empty() {
        return Err("no nameserver in /etc/resolv.conf".into());
    }
    server
        .enable_dns(&listen, allowed)
        .map_err(|e| format!("cannot set up the forwarder: {e}"))
}
