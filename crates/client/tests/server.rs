//! The protocol server driven through the native API, against real kernel sockets:
//! data integrity, policy, and a malicious channel that must not hurt the others.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use ferry_client::Client;
use ferry_proto::{Call, Op, Req};
mod common;
use common::Running;
use ferry_server::{Config, Policy, Rule, Server, Verdict};

fn start(tag: &str, policy: Policy) -> Running {
    common::start(tag, |cfg| cfg.policy = policy)
}

/// A kernel echo server on 127.0.0.1 (reached through the server's "sandbox" sockets).
fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if c.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn echo_round_trip_is_byte_exact() {
    let srv = start("echo", Policy::default());
    let echo = echo_server();
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, echo).unwrap();
    let data = pattern(3 << 20);
    let mut got = vec![0u8; data.len()];
    let mut sent = 0;
    let mut recvd = 0;
    while recvd < data.len() {
        if sent < data.len() {
            let n = (data.len() - sent).min(200_000);
            c.send(&s, &data[sent..sent + n]).unwrap();
            sent += n;
        }
        let n = c.recv(&s, &mut got[recvd..]).unwrap();
        assert!(n > 0, "early EOF at {recvd}");
        recvd += n;
    }
    assert!(got == data, "echoed bytes differ");
    drop(s);
    drop(c);
    std::thread::sleep(Duration::from_millis(100));
    let stats = srv.stop();
    let sock = stats
        .sockets
        .iter()
        .find(|x| x.bytes_out > 0)
        .expect("socket stats");
    assert_eq!(sock.bytes_out, data.len() as u64);
    assert_eq!(sock.bytes_in, data.len() as u64);
}

#[test]
fn policy_refuses_with_eacces() {
    let deny = Rule::parse(Verdict::Deny, "192.0.2.0/24").unwrap();
    let srv = start("deny", Policy::new(vec![deny]));
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    let e = c
        .connect_to(&s, "192.0.2.7:80".parse().unwrap())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    assert_eq!(srv.stop().denied, 1);
}

#[test]
fn malformed_records_close_only_their_channel() {
    let srv = start("evil", Policy::default());
    let echo = echo_server();
    let mut good = Client::connect(&srv.path).unwrap();
    let gs = good.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    good.connect_to(&gs, echo).unwrap();
    for (i, bad) in [
        Req {
            op: 999,
            ..Req::default()
        },
        Req {
            addr_len: 200,
            ..Req::new(Op::Recv, 1)
        },
        Req {
            buf: 1 << 30,
            len: 10,
            ..Req::new(Op::Send, 1)
        },
        Req {
            buf: 0,
            ..Req::new(Op::BufReturn, 1)
        },
        // Control bytes that do not follow on from the ones before (none).
        Req {
            a: 64,
            ..Req::new(Op::SendCtl, 1).with_bytes(&[0; 16])
        },
    ]
    .into_iter()
    .enumerate()
    {
        let mut evil = Client::connect(&srv.path).unwrap();
        evil.push_raw(bad).unwrap();
        // The evil channel gets closed: its calls fail instead of hanging. (A control
        // message may overtake the ring record, so allow a few tries.)
        let closed = (0..200).any(|_| {
            let failed = evil.socket(libc::AF_INET, libc::SOCK_STREAM).is_err();
            if !failed {
                std::thread::sleep(Duration::from_millis(5));
            }
            failed
        });
        assert!(
            closed,
            "case {i}: channel still open after malformed record"
        );
        // The good channel is still served.
        good.send(&gs, b"ping").unwrap();
        let mut buf = [0u8; 4];
        let mut n = 0;
        while n < 4 {
            n += good.recv(&gs, &mut buf[n..]).unwrap();
        }
        assert_eq!(&buf, b"ping", "case {i}");
    }
    assert_eq!(srv.stop().bad_channels, 5);
}

/// Once the server has closed a channel, the client's calls fail instead of waiting
/// forever for room in the request ring, or for a buffer, that no one will give back.
/// (Found by the `server` fuzz target: a record that closed the channel, then more
/// records than the ring holds, hung the client in `push`.)
#[test]
fn a_closed_channel_fails_pushes_and_sends_instead_of_hanging() {
    let srv = start("closed", Policy::default());
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_DGRAM).unwrap();
    c.push_raw(Req {
        op: 999,
        ..Req::default()
    })
    .unwrap();
    let closed = (0..200).any(|_| {
        let failed = c.socket(libc::AF_INET, libc::SOCK_DGRAM).is_err();
        if !failed {
            std::thread::sleep(Duration::from_millis(5));
        }
        failed
    });
    assert!(closed, "channel still open after a malformed record");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // More bytes than the channel has buffers: none comes back.
        let sent = c.send(&s, &vec![0u8; 128 << 20]);
        // More records than the ring has slots: the last ones find no room, ever.
        let pushed =
            (0..4 * 256).try_for_each(|_| c.push_raw(Call::WantToken { sock: s.id }.encode()));
        let _ = tx.send((pushed.map_err(|e| e.kind()), sent.map_err(|e| e.kind())));
    });
    let (pushed, sent) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the client hangs on a channel the server closed");
    assert_eq!(pushed, Err(std::io::ErrorKind::ConnectionReset));
    assert_eq!(sent, Err(std::io::ErrorKind::ConnectionReset));
    assert_eq!(srv.stop().bad_channels, 1);
}

/// A sandbox that opens and closes sockets and channels without end does not grow the
/// server's counters without end: past `MAX_LISTED` closed ones, they are added up in
/// one entry. (Found by the `server` fuzz target, whose memory grew with every input.)
#[test]
fn closed_sockets_and_channels_leave_bounded_counters() {
    use ferry_server::{FOLDED, MAX_LISTED};
    let srv = start("many", Policy::default());
    let n = MAX_LISTED + 200;
    let mut c = Client::connect(&srv.path).unwrap();
    for _ in 0..n {
        drop(c.socket(libc::AF_INET, libc::SOCK_DGRAM).unwrap());
    }
    for _ in 0..n / 16 {
        drop(Client::connect(&srv.path).unwrap());
    }
    // The last close is seen once the server answers a later call.
    c.socket(libc::AF_INET, libc::SOCK_DGRAM).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(c);
    std::thread::sleep(Duration::from_millis(100));
    let stats = srv.stop();
    assert!(
        stats.sockets.len() <= MAX_LISTED + 2,
        "{} sockets listed",
        stats.sockets.len()
    );
    assert!(
        stats.sockets.iter().any(|s| s.id == FOLDED),
        "no folded entry"
    );
    assert!(stats.channels.len() <= MAX_LISTED + 1);
    assert_eq!(stats.sockets_created, n as u64 + 1);
}

/// Fills the program's end of a readiness pair (smallest send buffer) until a send
/// would block, as the shim does when it runs out of room.
fn fill_pair(pair: std::os::fd::BorrowedFd<'_>) {
    ferry_sys::setsockopt(pair, libc::SOL_SOCKET, libc::SO_SNDBUF, &1i32.to_ne_bytes()).unwrap();
    while ferry_sys::send_nosignal(pair, &[0u8; 4096]).is_ok() {}
}

fn writable(pair: std::os::fd::BorrowedFd<'_>, timeout_ms: i32) -> bool {
    ferry_sys::poll_wait(pair, libc::POLLOUT, timeout_ms).unwrap() & libc::POLLOUT != 0
}

/// `WantRoom`: the server empties the pair when a buffer comes back to the channel, not
/// before; at once when one came back after the count the shim sent.
#[test]
fn want_room_makes_the_pair_writable_when_a_buffer_comes_back() {
    use std::os::fd::AsFd;
    let srv = start("room", Policy::default());
    let echo = echo_server();
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, echo).unwrap();
    fill_pair(s.pair.as_fd());
    assert!(!writable(s.pair.as_fd(), 0), "filled pair still writable");
    // No buffer has come back on this channel yet (count 0): wait for one.
    c.push_raw(
        Call::WantRoom {
            sock: s.id,
            returns_seen: 0,
        }
        .encode(),
    )
    .unwrap();
    assert!(
        !writable(s.pair.as_fd(), 200),
        "pair emptied with no buffer returned"
    );
    c.send(&s, b"ping").unwrap();
    assert!(
        writable(s.pair.as_fd(), 2000),
        "pair not emptied after a buffer came back"
    );
    let mut buf = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        n += c.recv(&s, &mut buf[n..]).unwrap();
    }
    assert_eq!(&buf, b"ping");
    // One buffer has come back by now (count 1): a `WantRoom` that says 0 was sent
    // before it, so the server empties the pair at once.
    fill_pair(s.pair.as_fd());
    assert!(!writable(s.pair.as_fd(), 0));
    c.push_raw(
        Call::WantRoom {
            sock: s.id,
            returns_seen: 0,
        }
        .encode(),
    )
    .unwrap();
    assert!(
        writable(s.pair.as_fd(), 2000),
        "pair not emptied though a buffer came back before the WantRoom"
    );
}

/// What a sandbox writes into its end of a readiness pair, and `WantRoom` for sockets it
/// does not have, cost the server nothing: the channel and the socket keep working.
#[test]
fn garbage_in_the_pair_is_harmless() {
    use std::os::fd::AsFd;
    let srv = start("garbage", Policy::default());
    let echo = echo_server();
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, echo).unwrap();
    let pair = s.pair.as_fd();
    ferry_sys::setsockopt(
        pair,
        libc::SOL_SOCKET,
        libc::SO_SNDBUF,
        &(4i32 << 20).to_ne_bytes(),
    )
    .unwrap();
    let mut written = 0;
    while let Ok(n) = ferry_sys::send_nosignal(pair, &[0xa5u8; 65536]) {
        written += n;
    }
    assert!(written > 1 << 20, "wrote only {written} bytes");
    for id in [s.id, s.id ^ 0x7fff_0000, 0] {
        c.push_raw(
            Call::WantRoom {
                sock: id,
                returns_seen: 77,
            }
            .encode(),
        )
        .unwrap();
    }
    for round in 0..3 {
        c.send(&s, b"ping").unwrap();
        let mut buf = [0u8; 4];
        let mut n = 0;
        while n < 4 {
            n += c.recv(&s, &mut buf[n..]).unwrap();
        }
        assert_eq!(&buf, b"ping", "round {round}");
    }
    assert_eq!(srv.stop().bad_channels, 0);
}

#[test]
fn listener_accepts_and_serves_inside() {
    let srv = start("listen", Policy::default());
    let mut c = Client::connect(&srv.path).unwrap();
    let l = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.bind(&l, "127.0.0.1:0".parse().unwrap()).unwrap();
    c.listen(&l, 16).unwrap();
    let addr = c.local_addr(&l).unwrap();
    let t = std::thread::spawn(move || {
        let mut k = std::net::TcpStream::connect(addr).unwrap();
        k.write_all(b"hello ferry").unwrap();
        let mut back = [0u8; 5];
        k.read_exact(&mut back).unwrap();
        back
    });
    let (conn, peer) = c.accept(&l).unwrap();
    assert!(peer.unwrap().ip().is_loopback());
    let mut buf = [0u8; 11];
    let mut n = 0;
    while n < buf.len() {
        n += c.recv(&conn, &mut buf[n..]).unwrap();
    }
    assert_eq!(&buf, b"hello ferry");
    c.send(&conn, b"thank").unwrap();
    assert_eq!(&t.join().unwrap(), b"thank");
}

#[test]
fn bulk_send_survives_a_full_host_socket() {
    let srv = start("bulk", Policy::default());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let total = 40usize << 20;
    let reader = std::thread::spawn(move || {
        let (mut k, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_millis(200)); // let the host socket fill up
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0usize;
        let mut sum = 0u64;
        loop {
            match k.read(&mut buf).unwrap() {
                0 => return (n, sum),
                m => {
                    sum = buf[..m]
                        .iter()
                        .fold(sum, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)));
                    n += m;
                }
            }
        }
    });
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, addr).unwrap();
    let data = pattern(total);
    for chunk in data.chunks(128 << 10) {
        c.send(&s, chunk).unwrap();
    }
    drop(s); // last reference: the server finishes the queue, then closes
    let want = data
        .iter()
        .fold(0u64, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)));
    assert_eq!(reader.join().unwrap(), (total, want));
}

#[test]
fn processes_outside_the_sandbox_are_refused() {
    let path = std::env::temp_dir().join(format!(
        "ferry-client-test-outsider-{}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let mut server = Server::new(Config::new(path.clone()), Box::new(ferry_sys::socket)).unwrap();
    // Pretend the sandbox is a process we do not descend from: our parent's sibling… any
    // unrelated live process will do; pid 1 is an ancestor of everyone, so use a child.
    let mut other = std::process::Command::new("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    server.restrict_to_descendants_of(other.id() as i32);
    let handle = server.stop_handle();
    let t = std::thread::spawn(move || server.run());
    assert!(Client::connect(&path).is_err(), "an outsider got a channel");
    handle.stop();
    t.join().unwrap();
    let _ = other.kill();
    let _ = other.wait();
    assert!(ferry_server::descends_from(std::process::id() as i32, 1));
    assert!(!ferry_server::descends_from(1, std::process::id() as i32));
}

#[test]
fn a_stopped_server_fails_blocked_calls_instead_of_hanging() {
    let srv = start("dies", Policy::default());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let _keep = std::thread::spawn(move || {
        let conn = l.accept();
        std::thread::sleep(Duration::from_secs(5));
        drop(conn);
    });
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, addr).unwrap();
    let t = std::time::Instant::now();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        srv.stop()
    });
    // Nothing will ever arrive: only the server's end can end this wait.
    let mut buf = [0u8; 16];
    let r = c.recv(&s, &mut buf);
    assert!(r.is_err(), "recv returned {r:?} after the server stopped");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    stopper.join().unwrap();
}

/// The TTL of the next datagram on `rx` (IP_RECVTTL must be on).
fn recv_ttl(rx: &std::net::UdpSocket) -> i32 {
    use std::os::fd::AsRawFd;
    let mut data = [0u8; 64];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: `msg` points at live buffers.
    let n = unsafe { libc::recvmsg(rx.as_raw_fd(), &mut msg, 0) };
    assert!(n > 0, "recvmsg: {}", std::io::Error::last_os_error());
    // SAFETY: walking the control buffer the kernel filled, with libc's macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TTL {
                return libc::CMSG_DATA(c).cast::<i32>().read_unaligned();
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    panic!("no IP_TTL control message");
}

#[test]
fn set_option_reaches_the_host_socket() {
    use std::os::fd::AsRawFd;
    let srv = start("setopt", Policy::default());
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let on: i32 = 1;
    // SAFETY: a valid socket and a 4-byte option value.
    let r = unsafe {
        libc::setsockopt(
            rx.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_RECVTTL,
            (&on as *const i32).cast(),
            4,
        )
    };
    assert_eq!(r, 0);
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_DGRAM).unwrap();
    c.connect_to(&s, rx.local_addr().unwrap()).unwrap();
    c.send(&s, b"default").unwrap();
    assert_eq!(recv_ttl(&rx), 64, "loopback keeps the default TTL");
    c.set_option(&s, libc::IPPROTO_IP, libc::IP_TTL, &7i32.to_ne_bytes())
        .unwrap();
    c.send(&s, b"ttl 7").unwrap();
    assert_eq!(recv_ttl(&rx), 7, "the option reached the host socket");

    // The kernel's refusals come back as they are; a value too big never leaves.
    let bad = c.set_option(&s, libc::IPPROTO_IP, libc::IP_TTL, &0i32.to_ne_bytes());
    assert_eq!(bad.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    let unknown = c.set_option(&s, libc::SOL_SOCKET, 0x7fff, &1i32.to_ne_bytes());
    assert_eq!(unknown.unwrap_err().raw_os_error(), Some(libc::ENOPROTOOPT));
    let big = c.set_option(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, &[0u8; 33]);
    assert_eq!(big.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    let t = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.set_nodelay(&t, true).unwrap();
}

#[test]
fn native_client_keeps_the_ring_receive_path_when_the_server_offers_the_pair() {
    // The native API receives through the ring; a server offering the pair path to
    // shims must not move this channel's bytes into pairs nobody reads.
    let srv = common::start("rxpair", |cfg| cfg.rx_pair = true);
    let echo = echo_server();
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, echo).unwrap();
    let data = pattern(300_000);
    c.send(&s, &data).unwrap();
    let mut got = vec![0u8; data.len()];
    let mut n = 0;
    while n < data.len() {
        let k = c.recv(&s, &mut got[n..]).unwrap();
        assert!(k > 0, "early EOF at {n}");
        n += k;
    }
    assert!(got == data, "echoed bytes differ");
}

/// This host's address toward its default route (not loopback, which is never handed
/// off); `None` on a machine without one.
fn host_address() -> Option<std::net::IpAddr> {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    probe.connect("192.0.2.1:9").ok()?;
    let ip = probe.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn a_connect_the_policy_would_hand_off_stays_served_for_a_client_that_cannot_take_it() {
    // The native client has no descriptor to put a host socket at: it does not say
    // HELLO_TAKES_HANDOFF, so the server serves the connection as any (before, the
    // connect got a CMP_HANDOFF answer and an unasked host socket it could not use).
    let Some(ip) = host_address() else {
        eprintln!("skipped: this machine has no non-loopback address");
        return;
    };
    let l = TcpListener::bind((ip, 0)).unwrap();
    let to = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut buf = [0u8; 5];
        c.read_exact(&mut buf).unwrap();
        c.write_all(&buf).unwrap();
    });
    let rule = Rule::parse(Verdict::Allow, &format!("{ip}/32")).unwrap();
    let srv = start("nohandoff", Policy::default().with_handoff(vec![rule]));
    let mut c = Client::connect(&srv.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM).unwrap();
    c.connect_to(&s, to).unwrap();
    c.send(&s, b"hello").unwrap();
    let mut got = [0u8; 5];
    let mut n = 0;
    while n < got.len() {
        let k = c.recv(&s, &mut got[n..]).unwrap();
        assert!(k > 0, "early EOF");
        n += k;
    }
    assert_eq!(&got, b"hello");
    peer.join().unwrap();
    drop(s);
    drop(c);
    std::thread::sleep(Duration::from_millis(100));
    let stats = srv.stop();
    assert!(
        stats
            .sockets
            .iter()
            .any(|x| x.bytes_out == 5 && x.bytes_in == 5),
        "the connection was not served by the server"
    );
}
