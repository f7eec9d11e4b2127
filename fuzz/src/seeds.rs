//! The starting corpus: valid records, bindings, control messages, regions and scripts,
//! so that coverage starts deep instead of at the first length check. Written by
//! `cargo run --example seeds` into `corpus/<target>/seed-*`; libFuzzer adds what it
//! finds beside them.

use std::net::SocketAddr;
use std::path::Path;

use ferry_proto::cmsg;
use ferry_proto::{Binding, Cmp, CmpKind, Ctl, CtlKind, ModuleRef, Op, Req, WireAddr};

/// The example modules of `crates/modules` (text).
const EXAMPLES: &[(&str, &[u8])] = &[
    (
        "gzip",
        include_bytes!("../../crates/modules/examples/gzip.wat"),
    ),
    (
        "http_file",
        include_bytes!("../../crates/modules/examples/http_file.wat"),
    ),
    (
        "template",
        include_bytes!("../../crates/modules/examples/template.wat"),
    ),
];

/// Small modules, each reaching one kind of outcome.
const SMALL: &[(&str, &str)] = &[
    (
        "pass",
        r#"(module
  (import "ferry" "emit" (func $emit (param i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "init") (result i32) i32.const 0)
  (func (export "on_data") (param i32) (result i32)
    local.get 0 call $emit drop i32.const 0))"#,
    ),
    (
        "file",
        r#"(module
  (import "ferry" "emit_file" (func $f (param i32 i64 i64) (result i32)))
  (import "ferry" "prop" (func $prop (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_new" (func $new (param i32 i32) (result i32)))
  (import "ferry" "emit" (func $emit (param i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "len")
  (func (export "init") (result i32)
    (drop (call $prop (i32.const 0) (i32.const 3) (i32.const 16) (i32.const 8)))
    (drop (call $emit (call $new (i32.const 16) (i32.const 8))))
    (drop (call $f (i32.const 0) (i64.const 0) (i64.const 16)))
    i32.const 0)
  (func (export "on_data") (param i32) (result i32) i32.const 1)
  (func (export "on_close") (result i32) i32.const 0))"#,
    ),
    (
        "spin",
        r#"(module
  (memory (export "memory") 1)
  (func (export "init") (result i32) i32.const 0)
  (func (export "on_data") (param i32) (result i32) (loop (br 0)) i32.const 0))"#,
    ),
    (
        "grow",
        r#"(module
  (memory (export "memory") 1)
  (func (export "init") (result i32)
    (loop (br_if 0 (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
    i32.const 0)
  (func (export "on_data") (param i32) (result i32) unreachable))"#,
    ),
    (
        "bufs",
        r#"(module
  (import "ferry" "buf_new" (func $new (param i32 i32) (result i32)))
  (import "ferry" "buf_slice" (func $slice (param i32 i32 i32) (result i32)))
  (import "ferry" "buf_prepend" (func $pre (param i32 i32 i32) (result i32)))
  (import "ferry" "buf_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_len" (func $len (param i32) (result i32)))
  (import "ferry" "buf_drop" (func $drop (param i32) (result i32)))
  (import "ferry" "emit" (func $emit (param i32) (result i32)))
  (import "ferry" "log" (func $log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (func (export "init") (result i32) (call $log (i32.const 1) (i32.const 0) (i32.const 4)) i32.const 0)
  (func (export "on_data") (param $b i32) (result i32) (local $s i32)
    (local.set $s (call $slice (local.get $b) (i32.const 1) (i32.const 2)))
    (drop (call $pre (local.get $s) (i32.const 0) (i32.const 4)))
    (drop (call $read (local.get $b) (i32.const 0) (i32.const 64) (call $len (local.get $b))))
    (drop (call $emit (local.get $s)))
    (drop (call $drop (local.get $b)))
    i32.const 0))"#,
    ),
];

/// Named inputs of one target.
type Seeds = Vec<(String, Vec<u8>)>;

/// Writes every target's seeds under `corpus`.
pub fn write_all(corpus: &Path) -> std::io::Result<()> {
    let sets: [(&str, Seeds); 8] = [
        ("records", records()),
        ("binding", bindings()),
        ("cmsg", cmsgs()),
        ("ring", rings()),
        ("modules", modules()),
        ("server", scripts()),
        ("frame", frames()),
        ("dns", dns_scripts()),
    ];
    for (target, seeds) in sets {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in seeds {
            std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
        }
    }
    Ok(())
}

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("literal address")
}

fn rec<T: bytemuck::Pod>(v: &T) -> Vec<u8> {
    bytemuck::bytes_of(v).to_vec()
}

fn records() -> Seeds {
    let v4 = WireAddr::from(sa("127.0.0.1:80"));
    let v6 = WireAddr::from(sa("[::1]:8080"));
    let reqs = [
        Req::new(Op::Connect, 1).with_addr(&v4),
        Req::new(Op::Bind, 2).with_addr(&v6),
        Req {
            buf: 3,
            len: 100,
            a: libc::MSG_MORE as u32,
            ..Req::new(Op::Send, 17).with_addr(&v4)
        },
        Req {
            a: 65536,
            tag: 9,
            ..Req::new(Op::Recv, 17)
        },
        Req {
            a: libc::SOL_SOCKET as u32,
            b: libc::SO_RCVBUF as u32,
            ..Req::new(Op::SetOpt, 1).with_bytes(&4096i32.to_ne_bytes())
        },
        Req {
            buf: 40,
            ..Req::new(Op::BufReturn, 1)
        },
        Req {
            a: 32,
            ..Req::new(Op::SendCtl, 1).with_bytes(&[0; 32])
        },
    ];
    let mut out: Seeds = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("req{i}"), rec(r)))
        .collect();
    let all: Vec<u8> = reqs.iter().flat_map(rec).collect();
    out.push(("reqs".into(), all));
    let done = Cmp::new(CmpKind::Done, 1, 9, 0).with_addr(&v6);
    out.push(("cmp".into(), rec(&done)));
    let ctl = Ctl {
        a: libc::AF_INET,
        b: libc::SOCK_STREAM,
        ..Ctl::new(CtlKind::Socket, 0)
    };
    out.push(("ctl".into(), rec(&ctl)));
    out.push(("name".into(), b"ferry:4294967295".to_vec()));
    let mut sockaddr = [0u8; 32];
    let n = v6.encode(&mut sockaddr);
    out.push(("sockaddr6".into(), sockaddr[..n].to_vec()));
    out
}

fn binding(module: ModuleRef<'_>, props: &[(&str, &str)], handles: &[u32]) -> Vec<u8> {
    Binding {
        module,
        props: props.to_vec(),
        handles: handles.to_vec(),
    }
    .encode()
}

fn bindings() -> Seeds {
    vec![
        (
            "bytes".into(),
            binding(
                ModuleRef::Bytes(b"(module)"),
                &[("content-type", "text/plain"), ("http", "")],
                &[0, 3],
            ),
        ),
        (
            "hash".into(),
            binding(
                ModuleRef::Hash(ferry_proto::module_hash(b"(module)")),
                &[],
                &[],
            ),
        ),
    ]
}

fn cmsgs() -> Seeds {
    let with_room = |room: u16, body: Vec<u8>| {
        let mut v = room.to_le_bytes().to_vec();
        v.extend(body);
        v
    };
    let mut send = Vec::new();
    cmsg::push(&mut send, libc::IPPROTO_IP, libc::IP_PKTINFO, &[1; 12]);
    cmsg::push(&mut send, libc::IPPROTO_IP, libc::IP_TOS, &[0x10]);
    cmsg::push(
        &mut send,
        libc::IPPROTO_IP,
        libc::IP_TTL,
        &64i32.to_ne_bytes(),
    );
    let mut v6 = Vec::new();
    cmsg::push(&mut v6, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &[2; 20]);
    cmsg::push(
        &mut v6,
        libc::IPPROTO_IPV6,
        libc::IPV6_HOPLIMIT,
        &[8, 0, 0, 0],
    );
    cmsg::push(
        &mut v6,
        libc::SOL_UDP,
        libc::UDP_SEGMENT,
        &1200u16.to_ne_bytes(),
    );
    let mut skipped = Vec::new();
    cmsg::push(
        &mut skipped,
        libc::SOL_SOCKET,
        libc::SCM_RIGHTS,
        &[3, 0, 0, 0],
    );
    cmsg::push(&mut skipped, libc::IPPROTO_TCP, 1, &[0; 4]);
    cmsg::push(&mut skipped, libc::SOL_SOCKET, libc::SO_MARK, &[1, 0, 0, 0]);
    let mut received = Vec::new();
    cmsg::push(
        &mut received,
        libc::SOL_SOCKET,
        libc::SO_TIMESTAMP,
        &[9; 16],
    );
    cmsg::push(
        &mut received,
        libc::IPPROTO_IP,
        libc::IP_TTL,
        &[64, 0, 0, 0],
    );
    vec![
        ("send".into(), with_room(256, send.clone())),
        ("send-cut".into(), with_room(40, send)),
        ("v6".into(), with_room(70, v6)),
        ("skipped".into(), with_room(512, skipped)),
        ("recv".into(), with_room(50, received)),
    ]
}

fn rings() -> Seeds {
    use ferry_ring::{Layout, Region};
    // The open scenario: a real header (read back from a region made with the layout),
    // the file's exact size, the seals the creator sets.
    let layout = Layout {
        ring_slots: 4,
        record_size: 64,
        bufs_a: 1,
        bufs_b: 2,
        buf_size: 128,
    };
    let region = Region::create("ferry-fuzz-seed", layout).expect("seed region");
    let raw = region.raw_for_tests();
    let mut open = vec![0u8, 0x80 | 0x01 | 0x02 | 0x10];
    open.extend_from_slice(&(layout.region_len() as u32).to_le_bytes());
    for off in (0..128).step_by(4) {
        open.extend_from_slice(&raw.read_u32(off).to_le_bytes());
    }
    // Then a script (the steps of `crate::ring`): the peer pushes a request, the server
    // pops, counts, releases, lends a buffer, completes, publishes, frees an id the peer
    // sent back, reads a span, arms, waits; the peer takes the completion; a close.
    let mut script = vec![14, 0];
    script.extend(rec(&Req {
        a: 4096,
        tag: 1,
        ..Req::new(Op::Recv, 7)
    }));
    script.extend([4, 6, 9, 7]);
    script.extend(rec(&Cmp::new(CmpKind::Done, 7, 1, 0)));
    script.extend([8, 10, 0, 0, 0, 0, 11]);
    for w in [2u32, 8, 16] {
        script.extend(w.to_le_bytes());
    }
    script.extend([12, 13, 1, 14, 1, 15, 1, 0]);
    open.extend_from_slice(&script);
    let mut run = vec![1u8, 0b0101_0110];
    run.extend_from_slice(&script);
    // The peer moves its tail far ahead; the server's pop must refuse it.
    run.extend([0, 0, 0, 200, 0, 0, 0, 4]);
    vec![("open".into(), open), ("run".into(), run)]
}

fn modules() -> Seeds {
    let mut out = Vec::new();
    let props: &[(&str, &str)] = &[
        ("content-type", "text/html"),
        ("http", "1"),
        ("name", "world"),
        ("len", "16"),
        ("body", "hello {{name}}, GET / HTTP/1.1\r\n\r\n"),
    ];
    for (name, text) in EXAMPLES {
        out.push((
            name.to_string(),
            binding(ModuleRef::Bytes(text), props, &[0]),
        ));
    }
    for (name, text) in SMALL {
        out.push((
            name.to_string(),
            binding(ModuleRef::Bytes(text.as_bytes()), props, &[0]),
        ));
        // The same module in binary form: mutations of it reach the validator and
        // the compiler rather than the text parser.
        let wasm = wat::parse_str(text).expect("seed module");
        out.push((
            format!("{name}-wasm"),
            binding(ModuleRef::Bytes(&wasm), props, &[0]),
        ));
    }
    out
}

/// Server scripts in the encoding of [`crate::server`]: a socket-count byte, then steps
/// (the step's number first).
fn scripts() -> Seeds {
    const SEND: u8 = 1;
    const SEND_CTL: u8 = 2;
    const BIND_RING: u8 = 3;
    const RAW_CTL: u8 = 4;
    const CONNECT: u8 = 5;
    const BIND_LISTEN: u8 = 6;
    const SET_OPT: u8 = 7;
    const SHUTDOWN: u8 = 8;
    const CLOSE: u8 = 9;
    const NEW: u8 = 10;
    const RECV: u8 = 12;
    const REGISTER: u8 = 13;
    let mut tcp = vec![1, CONNECT, 0, 1, SEND, 0, 0, 5, 0];
    tcp.extend_from_slice(b"hello");
    tcp.extend_from_slice(&[
        0,
        RECV,
        0,
        0b0000_0101,
        0,
        16,
        SET_OPT,
        0,
        12,
        4,
        1,
        0,
        0,
        0,
    ]);
    tcp.extend_from_slice(&[SHUTDOWN, 0x40, CLOSE, 0]);

    let mut udp = vec![0, NEW, 2, SEND_CTL, 0];
    let mut c = Vec::new();
    cmsg::push(&mut c, libc::IPPROTO_IP, libc::IP_TOS, &[0x10]);
    cmsg::push(&mut c, libc::IPPROTO_IP, libc::IP_TTL, &9i32.to_ne_bytes());
    udp.extend_from_slice(&(c.len() as u16).to_le_bytes());
    udp.extend_from_slice(&c);
    udp.extend_from_slice(&[4, b'p', b'i', b'n', b'g', 1]);
    udp.extend_from_slice(&[SET_OPT, 0, 7, 4, 1, 0, 0, 0, RECV, 0, 0b0000_0101, 0, 16]);

    let pass = SMALL[0].1.as_bytes();
    let blob = binding(ModuleRef::Bytes(pass), &[("a", "b")], &[]);
    let mut module = vec![1, CONNECT, 0, 1, BIND_RING, 0, 0, 1];
    module.extend_from_slice(&(blob.len() as u16).to_le_bytes());
    module.extend_from_slice(&blob);
    module.extend_from_slice(&[SEND, 0, 0, 3, 0, b'a', b'b', b'c', 0, REGISTER, 0]);

    let mut listen = vec![1, BIND_LISTEN, 0x80, 8, RAW_CTL];
    let accept = Ctl {
        a: 1,
        ..Ctl::new(CtlKind::Accept, 0)
    };
    listen.extend_from_slice(bytemuck::bytes_of(&accept));
    listen.extend_from_slice(&[0, 1]);
    let socket = Ctl {
        a: libc::AF_INET6,
        b: libc::SOCK_DGRAM,
        ..Ctl::new(CtlKind::Socket, 0)
    };
    listen.push(RAW_CTL);
    listen.extend_from_slice(bytemuck::bytes_of(&socket));
    listen.extend_from_slice(&[0, 1]);

    // A raw hello first (high bit of the first byte; then whether to pass a descriptor
    // and wait for the answer, and the packet): for a server that does not exist, and
    // for a protocol version that does not either; then one socket.
    let mut hellos = Vec::new();
    for (server, version) in [(5, ferry_proto::PROTO_VERSION), (0, 7)] {
        let h = ferry_proto::Hello {
            version,
            pid: 1,
            tid: 1,
            server,
        };
        hellos.extend([0x80, 3, size_of::<ferry_proto::Hello>() as u8]);
        hellos.extend(rec(&h));
    }
    let mut hello = hellos[..3 + size_of::<ferry_proto::Hello>()].to_vec();
    hello.extend([1, CONNECT, 0, 1]);
    let mut version = hellos[3 + size_of::<ferry_proto::Hello>()..].to_vec();
    version.extend([2, NEW, 3]);

    vec![
        ("tcp".into(), tcp),
        ("udp".into(), udp),
        ("module".into(), module),
        ("listen".into(), listen),
        ("hello".into(), hello),
        ("hello-version".into(), version),
    ]
}

/// Scripts of the `frame` target: each valid frame a sandbox sends (from its default
/// addresses, to the gateway's hardware address), alone and in one session.
pub(crate) fn frames() -> Seeds {
    use crate::frame::craft::{self, GATEWAY};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let (me4, gw4) = (Ipv4Addr::new(10, 0, 2, 100), Ipv4Addr::new(10, 0, 2, 2));
    let me6 = Ipv6Addr::new(0xfd00, 0, 0, 2, 0, 0, 0, 0x100);
    let gw6 = Ipv6Addr::new(0xfd00, 0, 0, 2, 0, 0, 0, 2);
    let (a4, b4) = (IpAddr::V4(me4), IpAddr::from([192, 0, 2, 1]));
    let (a6, b6) = (
        IpAddr::V6(me6),
        IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1]),
    );
    let script = |frames: &[(u8, Vec<u8>)]| {
        let mut v = Vec::new();
        for (flags, f) in frames {
            v.push(*flags);
            v.extend_from_slice(&(f.len() as u16).to_le_bytes());
            v.extend_from_slice(f);
        }
        v
    };
    let arp = craft::arp_request(me4, gw4);
    let ndp = craft::neighbour_solicit(me6, gw6);
    let syn4 = craft::tcp(GATEWAY, a4, b4, (40000, 80), 0x02);
    let syn6 = craft::tcp(GATEWAY, a6, b6, (40000, 443), 0x02);
    let udp4 = craft::udp(GATEWAY, a4, b4, (40001, 53), b"\x12\x34\x01\x00\x00\x01");
    let udp6 = craft::udp(GATEWAY, a6, b6, (40001, 53), b"query");
    let echo4 = craft::echo(GATEWAY, a4, b4, 7, 1, b"ping");
    let echo6 = craft::echo(GATEWAY, a6, b6, 7, 1, b"ping");
    let ack4 = craft::tcp(GATEWAY, a4, b4, (40000, 80), 0x10);
    let spoofed = craft::tcp(GATEWAY, IpAddr::from([10, 0, 2, 55]), b4, (40000, 80), 0x02);
    let mut fragment = udp4.clone();
    fragment[14 + 6] = 0x20; // more fragments
    let session = script(&[
        (1, arp.clone()),
        (1, ndp.clone()),
        (0, syn4.clone()),
        (0, ack4),
        (1, syn6.clone()),
        (0, udp4.clone()),
        (1, udp6.clone()),
        (0, echo4.clone()),
        (0, echo6.clone()),
        (0, spoofed),
        (1, fragment),
        (0, b"short".to_vec()),
    ]);
    let flows = flows_script(a4);
    vec![
        ("arp".into(), script(&[(1, arp)])),
        ("ndp".into(), script(&[(1, ndp)])),
        ("syn4".into(), script(&[(1, syn4)])),
        ("syn6".into(), script(&[(1, syn6)])),
        ("udp4".into(), script(&[(1, udp4)])),
        ("udp6".into(), script(&[(1, udp6)])),
        ("echo4".into(), script(&[(1, echo4)])),
        ("echo6".into(), script(&[(1, echo6)])),
        ("session".into(), session),
        ("flows".into(), flows),
        // The largest frames the sandbox's MTU (65,520) allows: lengths near 64 KiB (and
        // libFuzzer's input length limit raised to fit them).
        (
            "big".into(),
            script(&[
                (
                    0,
                    craft::udp(GATEWAY, a4, b4, (40002, 9), &[0x5a; 65_520 - 28]),
                ),
                (
                    1,
                    craft::udp(GATEWAY, a6, b6, (40002, 9), &[0xa5; 65_520 - 48]),
                ),
            ]),
        ),
    ]
}

/// A `frame` script that moves data through every kind of flow: the sandbox's stack
/// connects to an allowed address (the host connects later), each side writes, both
/// close; a datagram and an echo request to allowed addresses, answered; a connection
/// to the published port reaches a listener of the sandbox's, each side writes, both
/// close; time passes.
fn flows_script(me4: std::net::IpAddr) -> Vec<u8> {
    use crate::frame::craft::{self, GATEWAY};
    let mut v = Vec::new();
    let mut rec = |flags: u8, bytes: &[u8]| {
        v.push(flags);
        v.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        v.extend_from_slice(bytes);
    };
    let allowed = std::net::IpAddr::from([198, 51, 100, 1]);
    // Flags 7: an operation, then exchanges until nothing more happens; 5: a frame, the
    // same. Host sockets by index: 0 the published listener, then in the order made.
    rec(7, &[10, 0, 0]); // the sandbox connects to 198.51.100.1:1000 (under way)
    rec(7, &[0, 1]); // host socket 1 connects
    rec(7, b"\x0b\x00hello"); // the sandbox writes
    rec(7, b"\x02\x01world"); // the host sends
    rec(7, &[12, 0]); // the sandbox closes
    rec(7, &[4, 1]); // the host's end of stream
    rec(5, &craft::udp(GATEWAY, me4, allowed, (40001, 53), b"query"));
    rec(7, b"\x03\x02answer"); // host socket 2 (UDP) answers
    rec(5, &craft::echo(GATEWAY, me4, allowed, 7, 1, b"ping"));
    rec(7, b"\x03\x03\x00\x00\x00\x00\x00\x00\x00\x01pong"); // the ping socket's reply
    rec(7, &[14, 0]); // a listener on port 80 in the sandbox (its socket 1)
    rec(7, &[9, 0, 0]); // a connection to the published port from 127.0.0.1:1024
    rec(7, b"\x02\x04hi"); // host socket 4 (the accepted one) sends
    rec(7, b"\x0b\x01yo"); // the sandbox answers on it
    rec(7, &[12, 1]); // and closes
    rec(7, &[4, 4]); // so does the client
    rec(7, &[8, 200]); // 10 s pass
    v
}

/// Scripts of the `dns` target (`fuzz/src/dns.rs` reads them): a query answered, a
/// response and a runt from the sandbox, a stranger's and a late answer, failing sends,
/// a query outliving its lifetime, a burst past the table's bound answered.
pub(crate) fn dns_scripts() -> Seeds {
    // A step's bytes: the op, then its arguments.
    let datagram = |op: u8, args: [u8; 3], m: &[u8]| {
        let mut v = vec![op];
        v.extend_from_slice(&args);
        v.extend_from_slice(&(m.len() as u16).to_le_bytes());
        v.extend_from_slice(m);
        v
    };
    let query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03www\x05ferry\x04test\x00\x00\x01\x00\x01";
    let mut response = query.to_vec();
    response[2] = 0x81;
    let header = |two: u8| vec![two, 0x07, 0x00];
    let mut answered = header(0);
    answered.extend(datagram(0, [0, 1, 1], query)); // a query from client 1 on socket 0
    answered.extend([2, 0]); // the forwarder reads socket 0
    answered.extend(datagram(1, [0, 6, 0], &response)); // its answer, under its id
    answered.extend(datagram(1, [2, 6, 0], &response)); // a stranger's copy
    answered.extend([3]); // the forwarder reads upstream
    answered.extend(datagram(1, [1, 6, 0], &response)); // a late second answer
    answered.extend([3]);
    let mut hostile = header(1);
    hostile.extend(datagram(0, [1, 0, 2], &response)); // a response from the sandbox
    hostile.extend(datagram(0, [1, 0, 0], b"\x00\x01\x00")); // a runt
    hostile.extend(datagram(0, [1, 2, 1], &[0x5a; 4200])); // longer than the buffer
    hostile.extend([2, 1, 2, 2, 5, 5]); // reads (and a socket that is not there); failures
    hostile.extend(datagram(0, [0, 3, 1], query));
    hostile.extend([2, 0, 5, 0, 4, 0x10, 0x27, 2, 0]); // 10 s later
    hostile.extend(datagram(1, [0, 6, 0], &response));
    hostile.extend([3]);
    let mut burst = header(1);
    burst.extend([6, 150, 1, 0]); // 4,801 queries: past the table's bound
    for _ in 0..80 {
        burst.extend([2, 0]);
    }
    burst.extend([7, 255, 3]); // answers to the newest 255
    // A table of 4 queries: bursts mixed with responses, answers, time, failures.
    let mut small = vec![5, 3, 0x34, 0x12];
    small.extend([6, 0, 1, 0, 2, 0, 6, 1, 2, 1, 2, 0, 2, 0, 7, 6, 3]);
    small.extend(datagram(0, [1, 3, 1], query));
    small.extend([5, 2, 2, 1, 4, 0x88, 0x13, 7, 2, 3, 5, 4, 7, 9, 3]);
    vec![
        ("answered".into(), answered),
        ("hostile".into(), hostile),
        ("burst".into(), burst),
        ("small".into(), small),
        ("resolv".into(), {
            let mut v = vec![2];
            v.extend(b"nameserver 10.0.0.2\nnameserver fe80::1%eth0\nsearch x\n");
            v
        }),
    ]
}
