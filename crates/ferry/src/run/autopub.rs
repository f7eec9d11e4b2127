//! `--publish-auto` (`ferry oci`'s default, `ferry.publish=auto`): every TCP port a
//! program in the sandbox listens on, and every UDP port it receives on — on the
//! wildcard or the TAP's address, never on loopback — is published where ferry runs (the host for `ferry run`, the namespace
//! the engine gave a container: the pod IP), for as long as something listens there,
//! as pasta's `-t auto` does.
//!
//! A thread ([`AutoPublish`]) asks the sandbox's network namespace for its TCP
//! listeners and bound, unconnected UDP sockets every [`SCAN_EVERY`] (`NETLINK_SOCK_DIAG`, listening sockets only: the
//! kernel walks its listening table, so the cost grows with listeners, not with
//! connections), binds a host listener ([`ferry_server::host_listener`], both families)
//! for each port new since, closes the host listener of a port nothing listens on any
//! more, and passes each connection to the first NIC server ([`TapHandoff`]), which
//! connects it to the sandbox's address on the TAP from the client's address: a server
//! of the shim's (its socket is bound to the wildcard in the sandbox's namespace) and a
//! static or Go one alike. Without a TAP (`--net socket`) the TCP ports are those the
//! protocol servers count the shim's listeners on, on the wildcard, and each connection
//! goes to them ([`Sink::Servers`], the way a `-p` port's does), which publish at most
//! [`MAX_PORTS`] on their side too. UDP ports are `autopub_udp.rs`'s (datagrams through one flow
//! per client). At most [`MAX_PORTS`] ports of each; a port the host side has in use
//! already is left out with a log line. Must not: serve a connection (the NIC server
//! does) or publish a loopback listener (the sandbox's own, as with runc).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_server::TapHandoff;
use tracing::{debug, warn};

use super::autopub_udp::{self, UdpPorts};

/// How often the sandbox's listeners are looked at.
pub(crate) const SCAN_EVERY: Duration = Duration::from_millis(250);
/// Most ports published at once.
pub(crate) const MAX_PORTS: usize = 256;

/// `NETLINK_SOCK_DIAG` (linux/netlink.h).
pub(crate) const NETLINK_SOCK_DIAG: i32 = 4;
/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `TCP_LISTEN` (linux/tcp_states.h).
const TCP_LISTEN: u8 = 10;
/// `TCP_CLOSE` (linux/tcp_states.h): a UDP socket not connected (bound: receiving).
const TCP_CLOSE: u8 = 7;

/// What a scan looks for: a protocol's sockets in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kind {
    protocol: u8,
    state: u8,
}

/// TCP listeners.
pub(crate) const TCP: Kind = Kind {
    protocol: libc::IPPROTO_TCP as u8,
    state: TCP_LISTEN,
};
/// UDP sockets bound and not connected.
pub(crate) const UDP: Kind = Kind {
    protocol: libc::IPPROTO_UDP as u8,
    state: TCP_CLOSE,
};
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `struct nlmsghdr`'s size.
const NLMSG_HDR: usize = 16;
/// `struct inet_diag_req_v2`'s size.
const REQ_LEN: usize = 56;

/// Where the connections to a published port go.
pub(crate) enum Sink {
    /// To the first NIC server, which connects them to the sandbox's TAP address.
    Tap(Arc<TapHandoff>),
    /// (Socket mode) to the protocol servers, which hand them to the listener of the
    /// shim's on the port as a `-p` port's: the servers publish a port only while it is
    /// open there, and at most as many as they were configured for.
    Servers(ferry_server::Inbound),
}

impl Sink {
    /// Publishes `port` on the sink's side: false when it takes no more ports.
    fn open(&self, port: u16) -> bool {
        match self {
            Sink::Tap(_) => true,
            Sink::Servers(s) => s.open(port),
        }
    }

    /// `port` is no longer published.
    fn close(&self, port: u16) {
        if let Sink::Servers(s) = self {
            s.close(port);
        }
    }

    /// Passes `conn`, accepted on `port`, on; gives it back when it cannot be taken.
    fn send(&self, conn: OwnedFd, port: u16) -> Result<(), OwnedFd> {
        match self {
            Sink::Tap(t) => t.send(conn, port),
            Sink::Servers(s) => s.admit(port, conn).map_err(|r| r.into_conn()),
        }
    }
}

/// The epoll token of the stop eventfd (ports are `u16`).
const STOP: u64 = 1 << 32;

/// The `SOCK_DIAG_BY_FAMILY` dump request for the sockets of `kind` of `family`.
pub(crate) fn request(family: u8, kind: Kind, seq: u32) -> [u8; NLMSG_HDR + REQ_LEN] {
    let mut m = [0u8; NLMSG_HDR + REQ_LEN];
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    m[0..4].copy_from_slice(&((NLMSG_HDR + REQ_LEN) as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // inet_diag_req_v2: family, protocol, ext, pad, states, then a zero socket id.
    m[16] = family;
    m[17] = kind.protocol;
    m[20..24].copy_from_slice(&(1u32 << kind.state).to_ne_bytes());
    m
}

/// What one `recv` of a dump's answer said.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// More messages follow.
    More,
    /// The dump is complete.
    Done,
}

/// Adds to `out` the ports (with the address each is bound to) of the sockets in state
/// `state` in `buf` (messages of the dump answer `seq`) that are bound to the wildcard
/// or one of `tap` (the sandbox's addresses on its TAP): not loopback, nor ferry's DNS
/// forwarder on the nameservers' addresses. Malformed input ends the dump with an
/// error; nothing is trusted beyond `buf`.
pub(crate) fn parse(
    buf: &[u8],
    seq: u32,
    state: u8,
    tap: &[IpAddr],
    out: &mut BTreeMap<u16, IpAddr>,
) -> io::Result<Part> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: {what}"));
    let mut at = 0;
    while buf.len() - at >= NLMSG_HDR {
        let h = &buf[at..];
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let ty = u16::from_ne_bytes([h[4], h[5]]);
        let their_seq = u32::from_ne_bytes([h[8], h[9], h[10], h[11]]);
        if len < NLMSG_HDR || len > h.len() {
            return Err(bad("a message's length"));
        }
        let body = &h[NLMSG_HDR..len];
        at = (at + ((len + 3) & !3)).min(buf.len());
        if their_seq != seq {
            continue;
        }
        match ty {
            NLMSG_DONE => return Ok(Part::Done),
            NLMSG_ERROR => {
                let errno = body
                    .get(0..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or_else(|| bad("a short error"))?;
                return Err(io::Error::from_raw_os_error(-errno));
            }
            SOCK_DIAG_BY_FAMILY => {
                if let Some((port, ip)) = listener(body, state, tap) {
                    out.entry(port).or_insert(ip);
                }
            }
            _ => {}
        }
    }
    Ok(Part::More)
}

/// The port and address of an `inet_diag_msg` for a socket in `state` bound to the
/// wildcard or one of `tap`.
fn listener(msg: &[u8], state: u8, tap: &[IpAddr]) -> Option<(u16, IpAddr)> {
    // family, state, timer, retrans, then the socket id: sport, dport (big-endian),
    // src (16 bytes).
    let src = msg.get(8..24)?;
    let port = u16::from_be_bytes([*msg.get(4)?, *msg.get(5)?]);
    let ip: IpAddr = match i32::from(*msg.first()?) {
        libc::AF_INET => Ipv4Addr::new(src[0], src[1], src[2], src[3]).into(),
        libc::AF_INET6 => {
            let a: [u8; 16] = src.try_into().ok()?;
            Ipv6Addr::from(a).to_canonical()
        }
        _ => return None,
    };
    let ours = ip.is_unspecified() || tap.contains(&ip);
    (msg.get(1) == Some(&state) && ours && port != 0).then_some((port, ip))
}

/// The sandbox's ports of `kind` on the wildcard or `tap` (with the address each is
/// bound to), asked on `diag` (a `NETLINK_SOCK_DIAG` socket made in its namespace).
fn listening(
    diag: &OwnedFd,
    kind: Kind,
    tap: &[IpAddr],
    seq: &mut u32,
) -> io::Result<BTreeMap<u16, IpAddr>> {
    let mut ports = BTreeMap::new();
    let mut buf = vec![0u8; 32 << 10];
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        *seq = seq.wrapping_add(1);
        ferry_sys::write(diag.as_fd(), &request(family, kind, *seq))?;
        loop {
            let n = ferry_sys::recv(diag.as_fd(), &mut buf, 0)?;
            if n == 0 || parse(&buf[..n], *seq, kind.state, tap, &mut ports)? == Part::Done {
                break;
            }
        }
    }
    Ok(ports)
}

/// The host listeners' changes that make `have` follow `want` under [`MAX_PORTS`]:
/// (ports to publish, ports to withdraw). `skip`: ports left out (in use on the host).
pub(crate) fn changes(
    have: &BTreeSet<u16>,
    want: &BTreeSet<u16>,
    skip: &BTreeSet<u16>,
) -> (Vec<u16>, Vec<u16>) {
    let withdraw: Vec<u16> = have.difference(want).copied().collect();
    let room = MAX_PORTS.saturating_sub(have.len() - withdraw.len());
    let publish = want
        .difference(have)
        .filter(|p| !skip.contains(p))
        .take(room)
        .copied()
        .collect();
    (publish, withdraw)
}

/// The auto-publishing thread; stopped and joined when dropped.
pub(crate) struct AutoPublish {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl AutoPublish {
    /// Starts publishing the listeners `diag` finds on the wildcard or `addrs` (the
    /// sandbox's on its TAP; see the module's header) through `sink`, and the UDP ports
    /// through flows `factory` makes.
    pub(crate) fn start(
        diag: OwnedFd,
        addrs: Vec<IpAddr>,
        sink: Sink,
        factory: ferry_sandbox::SocketFactory,
    ) -> io::Result<AutoPublish> {
        let stop = Arc::new(ferry_sys::eventfd()?);
        let mut ports = Ports {
            diag,
            addrs,
            sink,
            epoll: ferry_sys::Epoll::new(64)?,
            open: BTreeMap::new(),
            skip: BTreeSet::new(),
            udp: UdpPorts::new(factory),
            udp_skip: BTreeSet::new(),
            seq: 0,
            scan_failed: false,
            full: false,
            refusals: ferry_server::LogThrottle::default(),
        };
        ports.epoll.add(stop.as_fd(), libc::EPOLLIN as u32, STOP)?;
        let thread = std::thread::Builder::new()
            .name("ferry-autopub".into())
            .spawn(move || ports.run())?;
        Ok(AutoPublish {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AutoPublish {
    fn drop(&mut self) {
        let _ = ferry_sys::eventfd_signal(self.stop.as_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's state: the published ports' host listeners, the ports left out.
struct Ports {
    diag: OwnedFd,
    /// The sandbox's addresses on the TAP.
    addrs: Vec<IpAddr>,
    sink: Sink,
    epoll: ferry_sys::Epoll,
    open: BTreeMap<u16, OwnedFd>,
    skip: BTreeSet<u16>,
    /// The UDP ports and their flows, and the UDP ports left out.
    udp: UdpPorts,
    udp_skip: BTreeSet<u16>,
    seq: u32,
    /// A scan failed (said once).
    scan_failed: bool,
    /// [`MAX_PORTS`] reached (said once).
    full: bool,
    refusals: ferry_server::LogThrottle,
}

impl Ports {
    fn run(&mut self) {
        let mut next = Instant::now();
        let mut events = Vec::new();
        loop {
            let now = Instant::now();
            if now >= next {
                self.scan();
                next = now + SCAN_EVERY;
            }
            events.clear();
            if let Err(e) = self
                .epoll
                .wait_for(next.saturating_duration_since(Instant::now()), &mut events)
            {
                warn!("--publish-auto: {e}: ports are no longer published");
                return;
            }
            for ev in &events {
                if ev.token == STOP {
                    return;
                }
                match autopub_udp::Token::of(ev.token) {
                    Some(autopub_udp::Token::Port(port)) => self.udp.inbound(&self.epoll, port),
                    Some(autopub_udp::Token::Flow(id)) => self.udp.outbound(id),
                    None => {
                        if let Ok(port) = u16::try_from(ev.token) {
                            self.accept(port);
                        }
                    }
                }
            }
        }
    }

    /// Follows the sandbox's listeners and UDP receivers.
    fn scan(&mut self) {
        self.scan_tcp();
        self.scan_udp();
    }

    /// The sandbox's sockets of `kind` (said once when they cannot be listed).
    fn scan_of(&mut self, kind: Kind) -> Option<BTreeMap<u16, IpAddr>> {
        match listening(&self.diag, kind, &self.addrs, &mut self.seq) {
            Ok(w) => Some(w),
            Err(e) => {
                if !std::mem::replace(&mut self.scan_failed, true) {
                    warn!("--publish-auto: cannot list the sandbox's listeners: {e}");
                }
                None
            }
        }
    }

    fn scan_udp(&mut self) {
        let Some(want) = self.scan_of(UDP) else {
            return;
        };
        self.udp.sweep(&self.epoll);
        self.udp_skip.retain(|p| want.contains_key(p));
        let have: BTreeSet<u16> = self.udp.ports().collect();
        let keys: BTreeSet<u16> = want.keys().copied().collect();
        let (publish, withdraw) = changes(&have, &keys, &self.udp_skip);
        for port in withdraw {
            self.udp.withdraw(&self.epoll, port);
        }
        for port in publish {
            let to = autopub_udp::target(want[&port], port);
            if !self.udp.publish(&self.epoll, port, to) {
                self.udp_skip.insert(port);
            }
        }
    }

    /// The TCP ports to publish: the protocol servers know their listeners (socket
    /// mode: a static program's, which no server serves, is left out); the namespace's
    /// are asked otherwise.
    fn tcp_ports(&mut self) -> Option<BTreeSet<u16>> {
        match &self.sink {
            Sink::Servers(s) => Some(s.listening().into_iter().collect()),
            Sink::Tap(_) => self.scan_of(TCP).map(|w| w.into_keys().collect()),
        }
    }

    fn scan_tcp(&mut self) {
        let Some(want) = self.tcp_ports() else {
            return;
        };
        self.skip.retain(|p| want.contains(p));
        let have: BTreeSet<u16> = self.open.keys().copied().collect();
        let (publish, withdraw) = changes(&have, &want, &self.skip);
        for port in withdraw {
            if let Some(l) = self.open.remove(&port) {
                let _ = self.epoll.delete(l.as_fd());
                self.sink.close(port);
                debug!("--publish-auto: port {port} withdrawn (nothing listens there)");
            }
        }
        for port in publish {
            self.publish(port);
        }
        let left = want.len() - want.iter().filter(|p| self.open.contains_key(p)).count();
        if left > self.skip.len() && !std::mem::replace(&mut self.full, true) {
            warn!(
                "--publish-auto: the sandbox listens on more than {MAX_PORTS} ports: only {MAX_PORTS} are published"
            );
        }
    }

    fn publish(&mut self, port: u16) {
        if !self.sink.open(port) {
            warn!("--publish-auto: port {port}: the servers publish no more ports: not published");
            self.skip.insert(port);
            return;
        }
        let at = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
        let made = ferry_server::host_listener(at, false).and_then(|(l, _)| {
            self.epoll
                .add(l.as_fd(), libc::EPOLLIN as u32, u64::from(port))
                .map(|()| l)
        });
        match made {
            Ok(l) => {
                debug!("--publish-auto: port {port} published");
                self.open.insert(port, l);
            }
            Err(e) => {
                warn!("--publish-auto: port {port}: {e}: not published");
                self.sink.close(port);
                self.skip.insert(port);
            }
        }
    }

    /// Passes the connections waiting on `port` to the TAP.
    fn accept(&mut self, port: u16) {
        let Some(l) = self.open.get(&port) else {
            return;
        };
        let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        while let Ok((conn, _)) = ferry_sys::accept4(l.as_fd(), flags) {
            if let Err(conn) = self.sink.send(conn, port) {
                let _ = ferry_sys::linger_reset(conn.as_fd());
                if let Some(n) = self.refusals.tick() {
                    warn!(
                        "--publish-auto: port {port}: no more connections are taken now: one reset ({n} since the last line)"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One `inet_diag_msg` answer to `seq`.
    fn msg(seq: u32, family: u8, state: u8, port: u16, src: &[u8]) -> Vec<u8> {
        let mut body = vec![0u8; 72];
        body[0] = family;
        body[1] = state;
        body[4..6].copy_from_slice(&port.to_be_bytes());
        body[8..8 + src.len()].copy_from_slice(src);
        let mut m = Vec::new();
        m.extend(((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
        m.extend(SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        m.extend(2u16.to_ne_bytes());
        m.extend(seq.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.extend(body);
        m
    }

    fn done(seq: u32, ty: u16, errno: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(20u32.to_ne_bytes());
        m.extend(ty.to_ne_bytes());
        m.extend(2u16.to_ne_bytes());
        m.extend(seq.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.extend(errno.to_ne_bytes());
        m
    }

    #[test]
    fn listeners_on_the_wildcard_and_the_tap_not_on_loopback_or_dns() {
        let v4 = libc::AF_INET as u8;
        let v6 = libc::AF_INET6 as u8;
        let mut buf = msg(7, v4, 10, 80, &[0, 0, 0, 0]);
        buf.extend(msg(7, v4, 10, 8080, &[10, 0, 2, 100]));
        buf.extend(msg(7, v4, 10, 9000, &[127, 0, 0, 1]));
        let mapped_lo = Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets();
        buf.extend(msg(7, v6, 10, 9001, &mapped_lo));
        buf.extend(msg(7, v6, 10, 9002, &Ipv6Addr::LOCALHOST.octets()));
        buf.extend(msg(7, v6, 10, 443, &Ipv6Addr::UNSPECIFIED.octets()));
        // ferry's DNS forwarder, on a nameserver's address.
        buf.extend(msg(7, v4, 10, 53, &[8, 8, 8, 8]));
        // Another dump's answer, and a socket not listening: not ours.
        buf.extend(msg(6, v4, 10, 1, &[0, 0, 0, 0]));
        buf.extend(msg(7, v4, 1, 2, &[0, 0, 0, 0]));
        let tap: [IpAddr; 1] = [Ipv4Addr::new(10, 0, 2, 100).into()];
        let mut ports = BTreeMap::new();
        assert_eq!(parse(&buf, 7, 10, &tap, &mut ports).unwrap(), Part::More);
        assert_eq!(ports.keys().copied().collect::<Vec<_>>(), [80, 443, 8080]);
        assert_eq!(ports[&8080], tap[0]);
        assert_eq!(ports[&443], IpAddr::from(Ipv6Addr::UNSPECIFIED));
        // The same messages asked for UDP's receivers (state 7): none is in that state.
        let mut udp = BTreeMap::new();
        parse(&buf, 7, UDP.state, &tap, &mut udp).unwrap();
        assert!(udp.is_empty());
        let mut ports = BTreeMap::new();
        assert_eq!(
            parse(&done(7, NLMSG_DONE, 0), 7, 10, &tap, &mut ports).unwrap(),
            Part::Done
        );
        let e = parse(&done(7, NLMSG_ERROR, -libc::EPERM), 7, 10, &tap, &mut ports).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        let mut ports = BTreeMap::new();
        let mut m = msg(1, libc::AF_INET as u8, 10, 80, &[0; 4]);
        m[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse(&m, 1, 10, &[], &mut ports).is_err());
        m[0..4].copy_from_slice(&3u32.to_ne_bytes());
        assert!(parse(&m, 1, 10, &[], &mut ports).is_err());
        // A message too short for a socket id: ignored.
        let mut short = done(1, SOCK_DIAG_BY_FAMILY, 0);
        short.truncate(20);
        assert_eq!(parse(&short, 1, 10, &[], &mut ports).unwrap(), Part::More);
        assert!(parse(&[1, 2, 3], 1, 10, &[], &mut ports).is_ok());
        assert!(ports.is_empty());
    }

    #[test]
    fn changes_follow_the_listeners_within_the_cap() {
        let set = |v: &[u16]| v.iter().copied().collect::<BTreeSet<u16>>();
        let (p, w) = changes(&set(&[80, 81]), &set(&[81, 82, 83]), &set(&[83]));
        assert_eq!((p, w), (vec![82], vec![80]));
        let many: BTreeSet<u16> = (1..=1000).collect();
        let (p, w) = changes(&set(&[]), &many, &set(&[]));
        assert_eq!((p.len(), w.len()), (MAX_PORTS, 0));
        let have: BTreeSet<u16> = p.into_iter().collect();
        let (p, _) = changes(&have, &many, &set(&[]));
        assert!(p.is_empty(), "no room beyond the cap");
    }

    /// The real kernel's answer: a listener (and a UDP socket) of this test's on the
    /// wildcard is found, one on loopback is not; a connected UDP socket is not.
    #[test]
    fn the_kernel_lists_its_listeners() {
        let diag = match ferry_sys::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        ) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipped: no NETLINK_SOCK_DIAG here: {e}");
                return;
            }
        };
        let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let udp_any = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let udp_lo = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_conn = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        udp_conn.connect("192.0.2.1:9").unwrap();
        let mut seq = 0;
        let ports = listening(&diag, TCP, &[], &mut seq).unwrap();
        assert!(ports.contains_key(&any.local_addr().unwrap().port()));
        assert!(!ports.contains_key(&lo.local_addr().unwrap().port()));
        assert!(!ports.contains_key(&udp_any.local_addr().unwrap().port()));
        let udp = listening(&diag, UDP, &[], &mut seq).unwrap();
        let port = |s: &std::net::UdpSocket| s.local_addr().unwrap().port();
        assert!(udp.contains_key(&port(&udp_any)));
        assert!(!udp.contains_key(&port(&udp_lo)));
        assert!(!udp.contains_key(&port(&udp_conn)));
        assert!(!udp.contains_key(&any.local_addr().unwrap().port()));
    }
}
