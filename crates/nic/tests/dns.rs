//! A guest's resolver on the gateway (`ferry vm --dns`, `server/dns.rs`), driven
//! in-process over `ferry_nic::testkit`: a query to the gateway's port 53 goes to the
//! upstream under an id of the forwarder's and its answer comes back from the gateway
//! with the guest's id; a flood of junk and queries holds one socket and a bounded table
//! and the next query is still answered; without upstreams the port is refused at once.

use std::net::SocketAddr;

use ferry_nic::testkit::frames;
use ferry_nic::testkit::{Harness, Seen};
use ferry_nic::{NicConfig, Plan};

const UPSTREAM: &str = "192.0.2.53:53";

fn upstream() -> SocketAddr {
    UPSTREAM.parse().unwrap()
}

/// A harness whose servers relay the guest's DNS to [`UPSTREAM`].
fn with_resolver() -> Harness {
    let mut cfg = NicConfig::new(Plan::avoiding(&[]));
    cfg.dns = vec![upstream()];
    Harness::with_config(cfg, &[])
}

/// A DNS query (QR = 0) or response with id `id`.
fn msg(id: u16, response: bool) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend_from_slice(&[
        if response { 0x81 } else { 0x01 },
        0,
        0,
        1,
        0,
        0,
        0,
        0,
        0,
        0,
    ]);
    m.extend_from_slice(b"\x02vm\x05ferry\x00\x00\x01\x00\x01");
    m
}

fn id_of(m: &[u8]) -> u16 {
    u16::from_be_bytes([m[0], m[1]])
}

fn gw53(h: &Harness) -> SocketAddr {
    SocketAddr::new(h.plan().gw4.into(), 53)
}

/// The guest's query goes upstream (one socket, the id rewritten, the rest intact); the
/// answer comes back to the port that asked, from the gateway, with the guest's id.
#[test]
fn a_query_to_the_gateway_is_relayed_and_answered_from_the_gateway() {
    let mut h = with_resolver();
    let (me, gw) = (h.sandbox_addr(h.plan().gw4.into(), 40000), gw53(&h));
    h.send_frame(frames::udp(me, gw, &msg(0x1234, false)));
    h.run();
    let s = h.host().to(upstream()).expect("a socket to the upstream");
    let sent = h.host().view(s).datagrams;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0][2..], msg(0x1234, false)[2..]);
    let mut answer = msg(id_of(&sent[0]), true);
    h.host().datagram(s, &answer);
    h.run();
    answer[..2].copy_from_slice(&0x1234u16.to_be_bytes());
    assert_eq!(
        h.take_frames(),
        vec![Seen::Udp {
            src: gw,
            dst: me,
            payload: answer
        }]
    );
    let c = h.counters();
    assert_eq!((c.dns_queries, c.dns_answers, c.udp_flows), (1, 1, 0));
}

/// A flood (responses, runts, 3 × 4,096 queries no one answers) keeps one upstream
/// socket and a bounded table (the oldest queries evicted), answers nothing it was not
/// asked, and the next query is still relayed and answered.
#[test]
fn a_flood_at_the_resolver_is_bounded_and_the_next_query_is_answered() {
    let mut h = with_resolver();
    let (me, gw) = (h.sandbox_addr(h.plan().gw4.into(), 40001), gw53(&h));
    let queries = 3 * ferry_egress::dns::MAX_PENDING as u16;
    for chunk in (0..queries).collect::<Vec<_>>().chunks(512) {
        for &i in chunk {
            h.send_frame(frames::udp(me, gw, &msg(i, false)));
            h.send_frame(frames::udp(me, gw, &msg(i, true)));
            h.send_frame(frames::udp(me, gw, &[0xff; 5]));
        }
        h.run();
    }
    assert!(h.take_frames().is_empty(), "nothing comes back unasked");
    let s = h.host().to(upstream()).unwrap();
    assert_eq!(
        h.host().all().len(),
        1,
        "one upstream socket, whatever comes"
    );
    // A query from upstream is no answer: not passed on (stray).
    h.host().datagram(s, &msg(0xffff, false));
    let c = h.counters();
    assert_eq!(c.dns_queries, u64::from(queries));
    assert_eq!(c.dns_dropped, 2 * u64::from(queries));
    assert_eq!(
        c.dns_evicted,
        u64::from(queries) - ferry_egress::dns::MAX_PENDING as u64
    );
    let before = h.host().view(s).datagrams.len();
    h.send_frame(frames::udp(me, gw, &msg(7, false)));
    h.run();
    let sent = h.host().view(s).datagrams;
    assert_eq!(sent.len(), before + 1);
    h.host().datagram(s, &msg(id_of(&sent[before]), true));
    h.run();
    let got = h.take_frames();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(matches!(&got[0], Seen::Udp { src, payload, .. } if *src == gw && id_of(payload) == 7));
    assert_eq!(h.counters().dns_stray, 1);
}

/// Without upstreams (`--dns off`), the gateway's port 53 is refused at once, as any
/// destination on the guest's own link is.
#[test]
fn without_a_resolver_the_gateways_port_53_is_refused_at_once() {
    let mut h = Harness::new();
    let (me, gw) = (h.sandbox_addr(h.plan().gw4.into(), 40002), gw53(&h));
    h.send_frame(frames::udp(me, gw, &msg(1, false)));
    h.run();
    assert_eq!(
        h.take_frames(),
        vec![Seen::Prohibited {
            src: gw.ip(),
            dst: me.ip()
        }]
    );
    assert!(h.host().all().is_empty());
    assert_eq!(h.counters().dns_queries, 0);
}

/// DNS over TCP to the gateway's port 53 is relayed to the upstream byte for byte (a
/// TCP flow whose host side connects to the upstream); without a resolver the same
/// connect is refused at once (a reset).
#[test]
fn dns_over_tcp_to_the_gateway_reaches_the_upstream() {
    use smoltcp::socket::tcp::State;
    let mut h = with_resolver();
    let gw = gw53(&h);
    let c = h.connect(gw);
    h.run();
    let s = h.host().to(upstream()).expect("a connect to the upstream");
    assert_eq!(h.host().view(s).kind.1, libc::SOCK_STREAM);
    h.host().connect_done(s, 0);
    h.run();
    assert_eq!(h.state(c), State::Established);
    let q = msg(9, false);
    let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    h.write(c, &framed);
    h.run();
    assert_eq!(h.host().view(s).sent, framed, "unchanged, its id too");
    h.host().data(s, b"\x00\x02ok");
    h.run();
    assert_eq!(h.read(c), b"\x00\x02ok");
    let mut off = Harness::new();
    let c = off.connect(gw);
    off.run();
    assert_eq!(off.state(c), State::Closed, "refused at once");
    assert!(off.host().all().is_empty());
}
