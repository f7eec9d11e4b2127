//! Parsers for option values: time spans, published ports, CPU lists, egress addresses,
//! module bindings.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ferry_server::Publish;

/// Parses `0`, `500ns`, `10us`/`10µs`, `2ms`, `1s` (a bare number means microseconds).
pub fn span(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let idx = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(idx);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a time span (e.g. 10us, 1ms)"))?;
    let ns = match unit {
        "ns" => v,
        "" | "us" | "µs" => v * 1e3,
        "ms" => v * 1e6,
        "s" => v * 1e9,
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{s}` (use ns, us, ms or s)"
            ));
        }
    };
    if !(0.0..=60e9).contains(&ns) {
        return Err(format!("`{s}` is out of range (0 to 60s)"));
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// Parses `-p [IP:]HOST_PORT:PORT[/udp|/tcp]`.
pub fn publish(s: &str) -> Result<Publish, String> {
    let (spec, udp) = match s.rsplit_once('/') {
        Some((spec, "udp")) => (spec, true),
        Some((spec, "tcp")) => (spec, false),
        Some((_, proto)) => {
            return Err(format!("unknown protocol `{proto}` in `{s}` (tcp or udp)"));
        }
        None => (s, false),
    };
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("`{p}` is not a port in `{s}`"))
    };
    let (ip, host_port, sandbox_port) = match spec.rsplitn(3, ':').collect::<Vec<_>>().as_slice() {
        // Without an address: every address of both families (`[::]`, dual-stack; the
        // server falls back to 0.0.0.0 where IPv6 is off), as pasta and Podman do.
        [sp, hp] => (IpAddr::V6(Ipv6Addr::UNSPECIFIED), port(hp)?, port(sp)?),
        [sp, hp, ip] => {
            let ip = ip.trim_start_matches('[').trim_end_matches(']');
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| format!("`{ip}` is not an IP address in `{s}`"))?;
            (ip, port(hp)?, port(sp)?)
        }
        _ => return Err(format!("`{s}` is not [IP:]HOST_PORT:PORT[/udp]")),
    };
    Ok(Publish {
        host: SocketAddr::new(ip, host_port),
        sandbox_port,
        udp,
    })
}

/// Parses `--volume PATH[:ro|:rw]` (read-write unless `:ro`) and checks the path
/// (`ferry_sandbox::Volume::new`: never `/`, a system directory or anything in or above
/// one).
pub fn volume(s: &str) -> Result<ferry_sandbox::Volume, String> {
    let (path, read_only) = match s.rsplit_once(':') {
        Some((p, "ro")) => (p, true),
        Some((p, "rw")) => (p, false),
        _ => (s, false),
    };
    if path.is_empty() {
        return Err(format!("`{s}` names no path"));
    }
    ferry_sandbox::Volume::new(std::path::Path::new(path), read_only).map_err(|e| e.to_string())
}

/// A list of CPUs (`--cpus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

/// `--cpus`: a CPU list.
pub fn cpu_list(s: &str) -> Result<CpuList, String> {
    cpus(s).map(CpuList)
}

/// Parses a CPU list: `0,2`, `0-3`, `0-1,4` (each CPU once, in the order given).
pub fn cpus(s: &str) -> Result<Vec<usize>, String> {
    let cpu = |c: &str| {
        c.trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n < 1024)
            .ok_or_else(|| format!("`{c}` is not a CPU number in `{s}`"))
    };
    let mut out = Vec::new();
    for item in s.split(',') {
        let range = match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (cpu(a)?, cpu(b)?);
                if a > b {
                    return Err(format!("`{item}` is an empty range in `{s}`"));
                }
                a..=b
            }
            None => {
                let c = cpu(item)?;
                c..=c
            }
        };
        for c in range {
            if out.contains(&c) {
                return Err(format!("CPU {c} is listed twice in `{s}`"));
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// Writes a CPU list back compactly (`0-3,6`).
pub fn format_cpus(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Resolves `--egress` items against the host's addresses `(interface, address)`: an
/// address must be one of them; an interface name stands for its addresses (IPv6
/// link-local ones excepted: they need a scope a source address cannot carry).
pub fn egress_sources(items: &[String], host: &[(String, IpAddr)]) -> Result<Vec<IpAddr>, String> {
    let mut out = Vec::new();
    for item in items {
        let item = item.trim();
        let bare = item.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            if !host.iter().any(|(_, a)| *a == ip) {
                return Err(format!("--egress {item}: no such address on this host"));
            }
            out.push(ip);
            continue;
        }
        if !host.iter().any(|(name, _)| name == item) {
            return Err(format!(
                "--egress {item}: no such address or interface on this host"
            ));
        }
        let before = out.len();
        out.extend(
            host.iter()
                .filter(|(name, ip)| name == item && !is_link_local_v6(ip))
                .map(|(_, ip)| *ip),
        );
        if out.len() == before {
            return Err(format!(
                "--egress {item}: the interface has no usable address"
            ));
        }
    }
    Ok(out)
}

fn is_link_local_v6(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// `--module TARGET=PATH[,key=value…]`: where (a published sandbox port, or a
/// destination `IP:PORT`), which module file, and its properties.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleSpec {
    /// A sandbox port (`PORT`) or a destination (`IP:PORT`).
    pub target: ferry_server::ModuleTarget,
    /// The module file (`.wasm` or `.wat`).
    pub path: std::path::PathBuf,
    /// Its properties, in order.
    pub props: Vec<(String, String)>,
}

/// Parses `PORT=PATH[,key=value…]` or `IP:PORT=PATH[,key=value…]` (`[v6]:PORT` too).
pub fn module(s: &str) -> Result<ModuleSpec, String> {
    use ferry_server::ModuleTarget;
    let (target, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not PORT=FILE[,key=value…] or IP:PORT=FILE[,…]"))?;
    let target = if let Ok(port) = target.parse::<u16>() {
        ModuleTarget::Port(port)
    } else {
        let sa: SocketAddr = target
            .parse()
            .map_err(|_| format!("`{target}` is neither a port nor IP:PORT in `{s}`"))?;
        ModuleTarget::Dest(sa)
    };
    let mut parts = rest.split(',');
    let path = parts.next().unwrap_or_default();
    if path.is_empty() {
        return Err(format!("no module file in `{s}`"));
    }
    let mut props = Vec::new();
    for kv in parts {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("property `{kv}` in `{s}` is not key=value"))?;
        if k.is_empty() {
            return Err(format!("property `{kv}` in `{s}` has an empty key"));
        }
        props.push((k.to_string(), v.to_string()));
    }
    Ok(ModuleSpec {
        target,
        path: path.into(),
        props,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(cpus("0").unwrap(), [0]);
        assert_eq!(cpus("1,0").unwrap(), [1, 0]);
        assert_eq!(cpus("0-2,5").unwrap(), [0, 1, 2, 5]);
        assert!(cpus("").is_err());
        assert!(cpus("a").is_err());
        assert!(cpus("3-1").is_err());
        assert!(cpus("0,0").is_err());
        assert_eq!(format_cpus(&[0, 1, 2, 5]), "0-2,5");
        assert_eq!(format_cpus(&[1]), "1");
    }

    #[test]
    fn spans() {
        assert_eq!(span("0").unwrap(), Duration::ZERO);
        assert_eq!(span("10us").unwrap(), Duration::from_micros(10));
        assert_eq!(span("10µs").unwrap(), Duration::from_micros(10));
        assert_eq!(span("2ms").unwrap(), Duration::from_millis(2));
        assert_eq!(span("500ns").unwrap(), Duration::from_nanos(500));
        assert_eq!(span("7").unwrap(), Duration::from_micros(7));
        assert!(span("fast").is_err());
        assert!(span("3h").is_err());
    }

    #[test]
    fn publishes() {
        let p = publish("8080:80").unwrap();
        assert_eq!(
            (p.host.to_string().as_str(), p.sandbox_port, p.udp),
            ("[::]:8080", 80, false)
        );
        let p = publish("127.0.0.1:5353:53/udp").unwrap();
        assert_eq!(
            (p.host.to_string().as_str(), p.sandbox_port, p.udp),
            ("127.0.0.1:5353", 53, true)
        );
        assert!(publish("80").is_err());
        assert!(publish("x:80").is_err());
        assert!(publish("80:81/sctp").is_err());
    }

    #[test]
    fn egress_addresses_and_interfaces() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let host = [
            ("lo".to_string(), ip("127.0.0.1")),
            ("eth0".to_string(), ip("192.0.2.2")),
            ("eth0".to_string(), ip("fe80::1")),
            ("eth0".to_string(), ip("fd00::2")),
            ("wg0".to_string(), ip("fe80::9")),
        ];
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            egress_sources(&items(&["127.0.0.1", "eth0", "[fd00::2]"]), &host).unwrap(),
            [
                ip("127.0.0.1"),
                ip("192.0.2.2"),
                ip("fd00::2"),
                ip("fd00::2")
            ]
        );
        assert_eq!(
            egress_sources(&items(&["10.9.9.9"]), &host).unwrap_err(),
            "--egress 10.9.9.9: no such address on this host"
        );
        assert!(
            egress_sources(&items(&["eth9"]), &host)
                .unwrap_err()
                .contains("no such")
        );
        assert!(
            egress_sources(&items(&["wg0"]), &host)
                .unwrap_err()
                .contains("no usable")
        );
    }

    #[test]
    fn volumes() {
        let v = volume("/tmp:ro").unwrap();
        assert!(v.read_only());
        assert_eq!(
            v.path(),
            std::path::Path::new("/tmp").canonicalize().unwrap()
        );
        assert!(!volume("/tmp:rw").unwrap().read_only());
        assert!(!volume("/tmp").unwrap().read_only());
        for refused in ["/", "/etc", "/usr:ro", "/etc/../usr/lib", "/proc/self"] {
            let e = volume(refused).unwrap_err();
            assert!(e.contains("never shared"), "{refused}: {e}");
        }
        assert!(volume(":ro").is_err());
        assert!(volume("/no/such/dir").unwrap_err().contains("No such file"));
    }

    #[test]
    fn modules() {
        use ferry_server::ModuleTarget;
        let m = module("80=gzip.wat,http=1,content-type=text/html").unwrap();
        assert_eq!(m.target, ModuleTarget::Port(80));
        assert_eq!(m.path.to_str(), Some("gzip.wat"));
        assert_eq!(
            m.props,
            vec![
                ("http".into(), "1".into()),
                ("content-type".into(), "text/html".into())
            ]
        );
        let m = module("10.0.0.2:8080=t.wasm,a=b=c").unwrap();
        assert_eq!(
            m.target,
            ModuleTarget::Dest("10.0.0.2:8080".parse().unwrap())
        );
        assert_eq!(m.props, vec![("a".into(), "b=c".into())]);
        assert!(matches!(
            module("[::1]:80=t.wat").unwrap().target,
            ModuleTarget::Dest(_)
        ));
        assert!(module("80").is_err());
        assert!(module("80=").is_err());
        assert!(module("x=t.wat").is_err());
        assert!(module("80=t.wat,novalue").is_err());
        assert!(module("80=t.wat,=v").is_err());
    }
}
