//! A NIC server's flow rules, one test (or two) per rule, driven in-process over the
//! harness of `ferry_nic::testkit`: the sandbox's side is a TCP/IP stack of its own (or
//! frames a test writes), the host's sockets a model, time a clock the test moves.
//! Deterministic: no threads, no kernel sockets, no waiting.
//!
//! Each test names the rule it guards in its name and asserts what breaking the rule
//! would change: what the sandbox sees (its socket's state, the frames it gets), what
//! the host's socket saw (bytes, shutdown, reset, close) and the counters.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ferry_egress::{Policy, Rule, Verdict};
use ferry_nic::testkit::frames::{self, ACK, RST, SYN};
use ferry_nic::testkit::{Conn, Harness, HostSock, Seen};
use ferry_nic::{NicConfig, NicPublish, Plan};
use smoltcp::socket::tcp::State;

const REMOTE: &str = "192.0.2.7:80";

fn remote() -> SocketAddr {
    REMOTE.parse().unwrap()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A configuration whose policy denies `cidrs`.
fn denying(cidrs: &[&str]) -> NicConfig {
    let mut cfg = NicConfig::new(Plan::avoiding(&[]));
    cfg.policy = Policy::new(
        cidrs
            .iter()
            .map(|c| Rule::parse(Verdict::Deny, c).unwrap())
            .collect(),
    );
    cfg
}

/// The sandbox connects to `to`; the host's connect is left under way.
fn pending(h: &mut Harness, to: SocketAddr) -> (Conn, HostSock) {
    let c = h.connect(to);
    h.run();
    let s = h
        .host()
        .to(to)
        .expect("a host socket connecting to the destination");
    (c, s)
}

/// The sandbox connects to `to` and the host's connect succeeds.
fn established(h: &mut Harness, to: SocketAddr) -> (Conn, HostSock) {
    let (c, s) = pending(h, to);
    h.host().connect_done(s, 0);
    h.run();
    assert_eq!(h.state(c), State::Established);
    (c, s)
}

// Rule: a connect the destination refuses is refused to the sandbox (a reset), and
// leaves nothing behind.

#[test]
fn a_refused_connect_resets_the_sandboxs_connection() {
    let mut h = Harness::new();
    let (c, s) = pending(&mut h, remote());
    assert_eq!(h.state(c), State::SynSent);
    h.host().connect_done(s, libc::ECONNREFUSED);
    h.run();
    assert_eq!(h.state(c), State::Closed, "the sandbox got no reset");
    let frames = h.take_frames();
    assert!(
        frames.iter().any(
            |f| matches!(f, Seen::Tcp { src, flags, .. } if *src == remote() && flags & RST != 0)
        ),
        "{frames:?}"
    );
    assert_eq!(h.flows(), (0, 0));
    assert!(h.host().view(s).closed);
    assert_eq!(h.stack_sockets(), 0);
    let st = h.counters();
    assert_eq!((st.tcp_flows, st.connect_failed), (1, 1), "{st:?}");
}

// Rule: a connected flow carries bytes both ways, unchanged, and counts them.

#[test]
fn a_connected_flow_carries_bytes_both_ways() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    assert!(
        h.host().view(s).no_delay,
        "TCP_NODELAY not set on the host socket"
    );
    assert_eq!(h.write(c, b"GET / HTTP/1.0\r\n\r\n"), 18);
    h.run();
    assert_eq!(h.host().view(s).sent, b"GET / HTTP/1.0\r\n\r\n");
    h.host().data(s, b"HTTP/1.0 200 OK\r\n\r\nbody");
    h.run();
    assert_eq!(h.read(c), b"HTTP/1.0 200 OK\r\n\r\nbody");
    let st = h.counters();
    assert_eq!((st.bytes_out, st.bytes_in), (18, 23), "{st:?}");
    assert_eq!(st.open_at_stop, 1);
}

// Rule: a host socket that takes nothing holds the sandbox's bytes in the stack (the
// window closes) and none is lost or reordered when it takes them again; the same for
// a large transfer the other way.

#[test]
fn back_pressure_keeps_every_byte_in_order() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    h.host().room(s, Some(1000));
    let mut written = h.write(c, &data);
    h.run();
    assert_eq!(
        h.host().view(s).sent.len(),
        1000,
        "sent past the host's room"
    );
    h.host().room(s, None);
    for _ in 0..100 {
        written += h.write(c, &data[written..]);
        h.run();
        if written == data.len() && h.host().view(s).sent.len() == data.len() {
            break;
        }
    }
    assert_eq!(h.host().view(s).sent, data, "bytes lost or reordered");
    let back: Vec<u8> = data.iter().rev().copied().collect();
    h.host().data(s, &back);
    let mut got = Vec::new();
    for _ in 0..100 {
        h.run();
        got.extend(h.read(c));
        if got.len() == back.len() {
            break;
        }
    }
    assert_eq!(got, back);
}

// Rule: a flow is backlogged (the server sleeps at once instead of spinning) while the
// host's bytes wait behind a full stack buffer the sandbox has not taken, or the
// sandbox's behind a host socket that takes none; not while bytes go back and forth,
// nor once the backlog is gone.

#[test]
fn a_backlog_either_way_is_seen_and_a_round_trip_is_not() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    h.host().data(s, b"pong");
    h.run();
    assert_eq!(h.read(c), b"pong");
    assert!(!h.backlogged(), "a round trip counted as a backlog");
    // More than the stack's buffer and the sandbox's, unread.
    let big = vec![7u8; 4 << 20];
    h.host().data(s, &big);
    h.run();
    assert!(h.backlogged(), "the host's bytes wait behind a full buffer");
    let mut got = 0;
    for _ in 0..1000 {
        got += h.read(c).len();
        h.run();
        if got == big.len() {
            break;
        }
    }
    assert_eq!(got, big.len());
    assert!(!h.backlogged(), "nothing waits any more");
    // The other way: the host takes nothing.
    h.host().room(s, Some(0));
    let data = vec![9u8; 4 << 20];
    let mut written = 0;
    for _ in 0..100 {
        written += h.write(c, &data[written..]);
        h.run();
    }
    assert!(
        h.backlogged(),
        "the sandbox's bytes wait behind the host socket"
    );
    h.host().room(s, None);
    for _ in 0..1000 {
        written += h.write(c, &data[written..]);
        h.run();
        if h.host().view(s).sent.len() == data.len() {
            break;
        }
    }
    assert_eq!(h.host().view(s).sent.len(), data.len());
    assert!(!h.backlogged(), "the host took everything");
}

// Rule: the sandbox's FIN is a shutdown(SHUT_WR) on the host (after every byte before
// it), and the host may still send; both ends done, the host socket closes without a
// reset.

#[test]
fn the_sandboxs_fin_shuts_the_host_side_and_the_host_still_sends() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    h.write(c, b"request");
    h.close(c);
    h.run();
    let v = h.host().view(s);
    assert_eq!(v.sent, b"request");
    assert!(v.shut_wr, "the sandbox's FIN did not reach the host");
    assert!(!v.closed && !v.lingered);
    h.host().data(s, b"response");
    h.run();
    assert_eq!(
        h.read(c),
        b"response",
        "a half-closed flow stopped carrying"
    );
    h.host().fin(s);
    h.run();
    assert!(matches!(h.state(c), State::TimeWait | State::Closed));
    let v = h.host().view(s);
    assert!(v.closed, "the flow outlived both ends");
    assert!(!v.lingered, "a finished connection was reset");
    assert_eq!(h.flows(), (0, 0));
}

// Rule: the host's end of stream is a FIN to the sandbox (after every byte before it),
// and the sandbox may still send.

#[test]
fn the_hosts_end_of_stream_is_a_fin_and_the_sandbox_still_sends() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    h.host().data(s, b"last words");
    h.host().fin(s);
    h.run();
    assert_eq!(h.read(c), b"last words");
    assert!(
        h.eof(c),
        "the host's end of stream did not reach the sandbox"
    );
    assert_eq!(h.state(c), State::CloseWait);
    h.write(c, b"late reply");
    h.run();
    let v = h.host().view(s);
    assert_eq!(v.sent, b"late reply");
    assert!(!v.shut_wr);
    h.close(c);
    h.run();
    let v = h.host().view(s);
    assert!(v.shut_wr && v.closed && !v.lingered, "{v:?}");
    assert_eq!(h.flows(), (0, 0));
}

// Rule: a reset either way resets the other side, mid-stream.

#[test]
fn a_reset_from_the_sandbox_resets_the_host_connection() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    h.write(c, b"partial");
    h.run();
    h.abort(c);
    h.run();
    let v = h.host().view(s);
    assert_eq!(v.sent, b"partial");
    assert!(v.lingered, "the host connection was closed, not reset");
    assert!(v.closed);
    assert_eq!(h.flows(), (0, 0));
    assert_eq!(h.stack_sockets(), 0);
}

#[test]
fn a_reset_from_the_host_resets_the_sandbox() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    h.host().data(s, b"some");
    h.run();
    assert_eq!(h.read(c), b"some");
    h.host().reset(s);
    h.run();
    assert_eq!(
        h.state(c),
        State::Closed,
        "the sandbox's connection survived"
    );
    assert!(h.take_frames().iter().any(|f| f.is_tcp(RST)));
    assert!(h.host().view(s).closed);
    assert_eq!(h.flows(), (0, 0));
}

// Rule: a pending connect holds a copy of the SYN and nothing else (no stack socket,
// nothing due), and the sandbox's reset ends it and its host connect.

#[test]
fn a_pending_connect_costs_nothing_and_ends_with_the_sandboxs_reset() {
    let mut h = Harness::new();
    let (c, s) = pending(&mut h, remote());
    assert_eq!(h.flows(), (1, 1));
    assert_eq!(h.stack_sockets(), 0, "a pending flow holds a stack socket");
    // Nothing is due: a turn does nothing and the sandbox's SYNs are kept, not answered.
    assert!(!h.turn());
    h.advance(Duration::from_millis(1500));
    assert_eq!(h.flows(), (1, 1));
    assert!(!h.take_frames().iter().any(|f| f.is_tcp(SYN | ACK)));
    h.abort(c);
    h.run();
    assert_eq!(h.flows(), (0, 0));
    assert!(
        h.host().view(s).closed,
        "the host connect outlived the sandbox's"
    );
    assert_eq!(h.counters().abandoned, 1);
}

// Rule: a pending connect whose sandbox socket is gone without a word ends when the
// sandbox's kernel answers the probe with a reset.

#[test]
fn a_silently_abandoned_connect_ends_at_the_probes_answer() {
    let mut h = Harness::new();
    let (c, s) = pending(&mut h, remote());
    h.sandbox().forget(c);
    h.advance(Duration::from_millis(1500));
    assert_eq!(h.flows(), (1, 1), "ended before any probe");
    h.take_frames();
    h.advance(Duration::from_secs(2));
    let seen = h.take_frames();
    assert!(
        seen.iter()
            .any(|f| matches!(f, Seen::Tcp { src, flags: 0, .. } if *src == remote())),
        "no probe: {seen:?}"
    );
    assert_eq!(h.flows(), (0, 0));
    assert!(h.host().view(s).closed);
    assert_eq!(h.counters().abandoned, 1);
}

// Rule: the latest SYN the sandbox sent is the one answered (a retransmission replaces
// the kept copy); one too large to keep is reset.

#[test]
fn the_latest_syn_is_answered_and_a_large_one_is_reset() {
    let mut h = Harness::new();
    let me = h.sandbox_addr(remote().ip(), 41_000);
    h.send_frame(frames::tcp(
        me,
        remote(),
        (SYN, 1000, 0),
        &[2, 4, 5, 0xb4],
        b"",
    ));
    h.send_frame(frames::tcp(
        me,
        remote(),
        (SYN, 7000, 0),
        &[2, 4, 5, 0xb4],
        b"",
    ));
    h.run();
    assert_eq!(h.flows(), (1, 1));
    let s = h.host().to(remote()).unwrap();
    h.host().connect_done(s, 0);
    h.run();
    let synack = h.take_frames().into_iter().find(|f| f.is_tcp(SYN | ACK));
    assert!(
        matches!(synack, Some(Seen::Tcp { ack: 7001, .. })),
        "{synack:?}"
    );
    let big = frames::tcp(me, addr("192.0.2.8:80"), (SYN, 1, 0), &[], &[0; 1100]);
    h.send_frame(big);
    h.run();
    assert!(h.take_frames().iter().any(|f| f.is_tcp(RST)));
    assert!(h.host().to(addr("192.0.2.8:80")).is_none());
    assert_eq!(h.counters().malformed, 1);
}

// Rule: a destination the policy or the address rules refuse gets a reset (TCP) or
// "prohibited" (UDP, echo) at once, and no host socket is made.

#[test]
fn refused_destinations_are_answered_at_once_and_reach_nothing() {
    let mut h = Harness::with_config(denying(&["192.0.2.0/24"]), &[]);
    let c = h.connect(remote());
    h.run();
    assert_eq!(h.state(c), State::Closed, "a denied connect was not reset");
    let me = h.sandbox_addr(remote().ip(), 5353);
    let gw: IpAddr = h.plan().gw4.into();
    for to in [
        "192.0.2.9:53",
        "127.0.0.1:53",
        "10.0.2.2:53",
        "224.0.0.251:5353",
    ] {
        h.send_frame(frames::udp(me, addr(to), b"q"));
    }
    h.send_frame(frames::echo(me.ip(), ip("192.0.2.9"), 1, 1, b"ping"));
    h.take_frames();
    h.run();
    let prohibited = h
        .take_frames()
        .into_iter()
        .filter(|f| {
            *f == Seen::Prohibited {
                src: gw,
                dst: me.ip(),
            }
        })
        .count();
    assert_eq!(prohibited, 5);
    assert!(
        h.host().all().is_empty(),
        "a host socket for a refused flow"
    );
    assert_eq!(h.counters().denied, 6);
}

// Rule: only the sandbox's own addresses may be sources.

#[test]
fn a_spoofed_source_is_dropped_before_any_flow() {
    let mut h = Harness::new();
    h.send_frame(frames::udp(addr("10.0.2.55:5000"), remote(), b"x"));
    h.send_frame(frames::syn(addr("192.0.2.99:5000"), remote()));
    h.send_frame(frames::echo(ip("127.0.0.1"), ip("192.0.2.7"), 1, 1, b"x"));
    h.run();
    assert!(h.take_frames().is_empty(), "a spoofed frame was answered");
    assert!(h.host().all().is_empty());
    let st = h.counters();
    assert_eq!((st.spoofed, st.frames_in), (3, 3), "{st:?}");
}

// Rule: at most max_flows flows; past it a flow is refused as a denied one is, and a
// freed slot is taken again.

#[test]
fn the_flow_cap_refuses_the_next_flow() {
    let mut cfg = NicConfig::new(Plan::avoiding(&[]));
    cfg.max_flows = 2;
    let mut h = Harness::with_config(cfg, &[]);
    let me = h.sandbox_addr(remote().ip(), 5000);
    h.send_frame(frames::udp(me, addr("192.0.2.1:53"), b"a"));
    h.send_frame(frames::udp(me, addr("192.0.2.2:53"), b"b"));
    h.send_frame(frames::udp(me, addr("192.0.2.3:53"), b"c"));
    h.run();
    assert_eq!(h.flows(), (2, 0));
    assert!(h.host().to(addr("192.0.2.3:53")).is_none());
    assert!(
        h.take_frames()
            .iter()
            .any(|f| matches!(f, Seen::Prohibited { .. }))
    );
    let c = h.connect(remote());
    h.run();
    assert_eq!(
        h.state(c),
        State::Closed,
        "a connect past the cap was not reset"
    );
    assert_eq!(h.counters().over_cap, 2);
    // The datagram flows idle out; the slot is free again.
    h.advance(Duration::from_secs(61));
    assert_eq!(h.flows(), (0, 0));
    h.send_frame(frames::udp(me, addr("192.0.2.3:53"), b"c"));
    h.run();
    assert!(h.host().to(addr("192.0.2.3:53")).is_some());
}

// Rule: a UDP flow is one connected host socket per (sandbox end, destination); what it
// receives comes back from the destination to the sandbox's end.

#[test]
fn datagrams_go_out_on_one_socket_and_answers_come_back() {
    let mut h = Harness::new();
    let me = h.sandbox_addr(remote().ip(), 5353);
    let dns = addr("192.0.2.53:53");
    h.send_frame(frames::udp(me, dns, b"query-1"));
    h.send_frame(frames::udp(me, dns, b"query-2"));
    h.run();
    let s = h.host().to(dns).expect("a UDP socket to the server");
    let v = h.host().view(s);
    assert_eq!(v.kind, (libc::AF_INET, libc::SOCK_DGRAM, 0));
    assert_eq!(v.datagrams, vec![b"query-1".to_vec(), b"query-2".to_vec()]);
    assert_eq!(h.host().all().len(), 1, "a socket per datagram");
    h.host().datagram(s, b"answer");
    h.run();
    assert_eq!(
        h.take_frames(),
        vec![Seen::Udp {
            src: dns,
            dst: me,
            payload: b"answer".to_vec()
        }]
    );
    let st = h.counters();
    assert_eq!((st.udp_flows, st.bytes_out, st.bytes_in), (1, 14, 6));
}

// Rule: echo requests go out on an unprivileged ping socket with the sandbox's sequence
// number and data; replies come back with the sandbox's identifier.

#[test]
fn echo_goes_out_on_a_ping_socket_and_replies_keep_the_sandboxs_identifier() {
    let mut h = Harness::new();
    for (to, proto, reply) in [
        ("192.0.2.7", libc::IPPROTO_ICMP, 0u8),
        ("2001:db8::7", libc::IPPROTO_ICMPV6, 129),
    ] {
        let to = ip(to);
        let me = h.sandbox_addr(to, 0).ip();
        h.send_frame(frames::echo(me, to, 0x4242, 3, b"ping"));
        h.run();
        let s = h.host().to(SocketAddr::new(to, 0)).expect("a ping socket");
        let v = h.host().view(s);
        assert_eq!(v.kind.1, libc::SOCK_DGRAM);
        assert_eq!(v.kind.2, proto);
        assert_eq!(v.datagrams.len(), 1);
        assert_eq!(&v.datagrams[0][6..], b"\0\x03ping");
        // The kernel's identifier on the host is its own; not a reply: ignored.
        h.host().datagram(s, &[3, 0, 0, 0, 0, 0, 0, 3]);
        h.host().datagram(
            s,
            &[
                reply, 0, 0xaa, 0xbb, 0x01, 0x02, 0, 3, b'p', b'o', b'n', b'g',
            ],
        );
        h.run();
        assert_eq!(
            h.take_frames(),
            vec![Seen::EchoReply {
                src: to,
                dst: me,
                ident: 0x4242,
                seq: 3,
                data: b"pong".to_vec()
            }]
        );
    }
    assert_eq!(h.counters().echo_flows, 2);
}

// Rule: datagram flows idle 60 s (echo: 10 s) are closed; traffic keeps them open.

#[test]
fn idle_udp_and_echo_flows_expire_each_at_its_time() {
    let mut h = Harness::new();
    let me = h.sandbox_addr(remote().ip(), 5000);
    let (a, b) = (addr("192.0.2.1:53"), addr("192.0.2.2:53"));
    h.send_frame(frames::udp(me, a, b"a"));
    h.send_frame(frames::udp(me, b, b"b"));
    h.send_frame(frames::echo(me.ip(), ip("192.0.2.7"), 9, 1, b"x"));
    h.run();
    let (ua, ub) = (h.host().to(a).unwrap(), h.host().to(b).unwrap());
    let echo = h.host().to(addr("192.0.2.7:0")).unwrap();
    h.advance(Duration::from_secs(9));
    assert!(
        !h.host().view(echo).closed,
        "an echo flow closed before 10 s"
    );
    h.advance(Duration::from_secs(2));
    assert!(h.host().view(echo).closed, "an idle echo flow kept");
    // An answer at 30 s keeps flow `b` another 60 s.
    h.advance(Duration::from_secs(19));
    h.host().datagram(ub, b"late");
    h.run();
    h.advance(Duration::from_secs(31));
    assert!(h.host().view(ua).closed, "an idle UDP flow kept");
    assert!(!h.host().view(ub).closed, "a UDP flow with traffic closed");
    h.advance(Duration::from_secs(30));
    assert!(h.host().view(ub).closed);
    assert_eq!(h.flows(), (0, 0));
}

// Rule: a connection to a published port reaches a listener in the sandbox, from the
// gateway when the client is on the host's loopback, and carries bytes both ways.

#[test]
fn a_published_connection_reaches_a_listener_in_the_sandbox() {
    let at = addr("127.0.0.1:8080");
    let publish = [NicPublish {
        host: at,
        sandbox_port: 80,
    }];
    let mut h = Harness::with_config(NicConfig::new(Plan::avoiding(&[])), &publish);
    let l = h.listen(80);
    let client = h.host().incoming(at, addr("127.0.0.1:5555"));
    h.run();
    assert_eq!(
        h.state(l),
        State::Established,
        "the sandbox's listener got nothing"
    );
    let gw = h.plan().gw4;
    let ep = h.sandbox().tcp(l).remote_endpoint().unwrap();
    assert_eq!(
        (ep.addr, ep.port),
        (gw.into(), 5555),
        "not from the gateway"
    );
    h.host().data(client, b"hello sandbox");
    h.run();
    assert_eq!(h.read(l), b"hello sandbox");
    h.write(l, b"hello host");
    h.close(l);
    h.run();
    let v = h.host().view(client);
    assert_eq!(v.sent, b"hello host");
    assert!(v.shut_wr);
    h.host().fin(client);
    h.run();
    let v = h.host().view(client);
    assert!(v.closed && !v.lingered, "{v:?}");
    assert_eq!(h.counters().published_flows, 1);
}

// Rule: a published connection the sandbox resets (nothing listens yet) is asked again
// every 100 ms; a listener that comes within 2 s gets it, after 2 s it is reset.

#[test]
fn a_published_connection_waits_two_seconds_for_a_listener() {
    let at = addr("0.0.0.0:8080");
    let publish = [NicPublish {
        host: at,
        sandbox_port: 80,
    }];
    let mut h = Harness::with_config(NicConfig::new(Plan::avoiding(&[])), &publish);
    let early = h.host().incoming(at, addr("198.51.100.9:4000"));
    h.run();
    assert_eq!(
        h.flows(),
        (1, 0),
        "a refused published connection was dropped"
    );
    assert!(!h.host().view(early).closed);
    for _ in 0..5 {
        h.advance(Duration::from_millis(100));
    }
    let l = h.listen(80);
    h.advance(Duration::from_millis(100));
    assert_eq!(
        h.state(l),
        State::Established,
        "the late listener got nothing"
    );
    let ep = h.sandbox().tcp(l).remote_endpoint().unwrap();
    assert_eq!(ep.port, 4000);
    h.abort(l);
    h.run();
    assert!(h.host().view(early).lingered);
    // Nobody listens: reset after the grace.
    h.sandbox().forget(l);
    let late = h.host().incoming(at, addr("198.51.100.9:4001"));
    for _ in 0..19 {
        h.advance(Duration::from_millis(100));
    }
    assert!(!h.host().view(late).closed, "reset before 2 s");
    for _ in 0..3 {
        h.advance(Duration::from_millis(100));
    }
    let v = h.host().view(late);
    assert!(v.lingered && v.closed, "{v:?}");
    assert_eq!(h.flows(), (0, 0));
}

// Rule: a draining server ends once its TCP flows have, or the device has gone, or
// after DRAIN_MAX; not before.

#[test]
fn drain_waits_for_tcp_flows_and_no_longer_than_its_bound() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    assert!(!h.finished());
    h.drain();
    assert!(!h.finished(), "ended with a TCP flow open");
    h.write(c, b"written before exit");
    h.close(c);
    h.host().fin(s);
    h.run();
    assert_eq!(h.host().view(s).sent, b"written before exit");
    assert!(h.finished(), "still running with no TCP flow");

    let mut h = Harness::new();
    let (_c, _s) = established(&mut h, remote());
    h.drain();
    assert!(!h.finished());
    h.advance(Duration::from_secs(5));
    assert!(h.finished(), "drained for longer than DRAIN_MAX");

    let mut h = Harness::new();
    let (_c, _s) = established(&mut h, remote());
    h.drain();
    h.device_gone();
    h.run();
    assert!(h.finished(), "drained a device that is gone");
}

// Rule: a frame the device cannot take is lost, as on a wire; TCP recovers it.

#[test]
fn frames_lost_to_a_full_device_are_counted_and_tcp_recovers() {
    let mut h = Harness::new();
    let (c, s) = established(&mut h, remote());
    h.device_room(Some(0));
    h.host().data(s, b"lost once");
    h.run();
    assert!(h.counters().tap_full >= 1);
    assert_eq!(h.read(c), b"");
    h.device_room(None);
    h.advance(Duration::from_secs(2));
    assert_eq!(h.read(c), b"lost once");
}

// Rule: IPv6 flows work as IPv4 ones (neighbour discovery answered for the gateway).

#[test]
fn an_ipv6_connection_carries_bytes() {
    let mut h = Harness::new();
    let to = addr("[2001:db8::7]:443");
    let (c, s) = established(&mut h, to);
    h.write(c, b"v6");
    h.host().data(s, b"six");
    h.run();
    assert_eq!(h.host().view(s).sent, b"v6");
    assert_eq!(h.read(c), b"six");
    assert_eq!(h.host().view(s).kind.0, libc::AF_INET6);
}

// Rule: a connect that succeeds at once (the host answered before the call returned)
// needs no pending flow.

#[test]
fn a_connect_done_at_once_is_established_without_waiting() {
    let mut h = Harness::new();
    h.host().script_connect(remote(), 0);
    let c = h.connect(remote());
    h.run();
    assert_eq!(h.state(c), State::Established);
    assert_eq!(h.flows(), (1, 0));
}

// Rule: the bond's address is where host sockets leave from (bound before the connect).

#[test]
fn host_sockets_leave_from_the_bonds_address() {
    let mut cfg = NicConfig::new(Plan::avoiding(&[]));
    cfg.egress = Some(std::sync::Arc::new(ferry_egress::Bond::new(
        ferry_egress::Mode::Rr,
        vec![ip("198.51.100.1")],
    )));
    let mut h = Harness::with_config(cfg, &[]);
    let (_c, s) = pending(&mut h, remote());
    assert_eq!(h.host().view(s).bound, Some(addr("198.51.100.1:0")));
}

// Rule: a flood of refused or malformed frames gets at most one answer each (no
// amplification), and nothing is held for it.

#[test]
fn a_flood_of_refused_frames_gets_no_more_back_than_it_sends() {
    let mut h = Harness::with_config(denying(&["0.0.0.0/0", "::/0"]), &[]);
    let me = h.sandbox_addr(remote().ip(), 5000);
    let me6 = h.sandbox_addr(ip("2001:db8::1"), 5000);
    for i in 0..100u16 {
        let to = SocketAddr::new(ip("192.0.2.1"), 1000 + i);
        let to6 = SocketAddr::new(ip("2001:db8::1"), 1000 + i);
        h.send_frame(frames::syn(SocketAddr::new(me.ip(), 2000 + i), to));
        h.send_frame(frames::udp(me, to, b"x"));
        h.send_frame(frames::udp(me6, to6, b"x"));
        h.send_frame(frames::echo(me.ip(), to.ip(), i, i, b"x"));
        let mut cut = frames::udp(me, to, b"truncated");
        cut.truncate(30 + usize::from(i % 10));
        h.send_frame(cut);
    }
    h.run();
    let st = h.counters();
    assert!(
        st.frames_out <= st.frames_in,
        "{} frames out for {} in",
        st.frames_out,
        st.frames_in
    );
    assert_eq!((st.denied, st.malformed), (400, 100), "{st:?}");
    assert_eq!(h.flows(), (0, 0));
    assert!(h.host().all().is_empty());
    assert_eq!(h.stack_sockets(), 0);
}

// Rule: a flow's stack socket is reused once the flow is gone (its buffers are not
// zeroed again), and the next flow sees none of the last one's bytes or state.

#[test]
fn a_reused_socket_carries_the_next_flow_afresh() {
    let mut h = Harness::new();
    for round in 0..3u8 {
        let to = addr(&format!("198.51.100.7:{}", 80 + u16::from(round)));
        let (c, s) = established(&mut h, to);
        let ask = [b'a' + round; 5];
        assert_eq!(h.write(c, &ask), 5);
        h.host().data(s, &[b'x' + round; 7]);
        h.run();
        assert_eq!(h.host().view(s).sent, ask, "round {round}");
        assert_eq!(h.read(c), [b'x' + round; 7], "round {round}");
        // Bytes left unread on either side when the flow ends must not reach the next.
        h.host().data(s, b"stale");
        h.write(c, b"stale");
        h.abort(c);
        h.run();
        assert_eq!(h.flows(), (0, 0), "round {round}");
        assert_eq!(h.stack_sockets(), 0, "round {round}");
    }
}
