//! Target `server`: a protocol server, in this process, driven by a channel whose every
//! byte comes from the input.
//!
//! Set-up (once): the process moves into a network namespace of its own with only `lo`
//! up (so nothing the server does leaves the machine; needs root), starts echo peers on
//! `127.0.0.1:7` and `[::1]:7` (TCP and UDP), starts a [`Server`] on a thread, and opens a
//! *bystander* channel with a TCP connection to the echo peer: a well-behaved program
//! sharing the server with the hostile one.
//!
//! An input whose first byte has its high bit set first sends a raw `Hello` of its own
//! (any bytes, maybe a descriptor) on a connection of its own. Each input then opens a
//! channel with the native client ([`Client`]) and runs a script of at
//! most [`MAX_STEPS`] steps: raw ring records (socket ids below 256 stand for the
//! script's own sockets, so records reach real sockets), sends of chosen bytes with
//! chosen offsets, flags, addresses and control messages (`SendCtl` chunks), module
//! bindings on the ring (with their `Files` packet) or by the client's call, raw control
//! packets with chosen descriptors, and the client's own calls (socket, connect, bind,
//! listen, options, shutdown, close). The script's channel may be closed by the server
//! at any point: that is its right; the script goes on, and every call on the closed
//! channel must fail rather than wait forever.
//!
//! Properties, checked after every input: the server still answers a fresh channel
//! (socket, bind, getsockname), and the bystander's connection still echoes. A panic on
//! the server's thread aborts the process (libFuzzer's panic hook), and a server that
//! stops answering shows as a failed check or a libFuzzer timeout.
//!
//! The server keeps running across inputs, as it does for a sandbox: what an input
//! leaves behind (sockets, channels, parked operations) is the next input's world.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use ferry_client::{Client, Socket};
use ferry_proto::{Binding, Ctl, CtlKind, MAX_FILES, ModuleRef, NO_BUF, Op, Req, WireAddr};
use ferry_server::{Config, Server};

use crate::input::Input;

/// Most steps of one script.
pub const MAX_STEPS: usize = 64;
/// Most sockets a script holds at once.
const MAX_SOCKETS: usize = 8;
/// The echo peers' port.
const ECHO_PORT: u16 = 7;

/// The channel geometry of the server under test: a small ring (so that a script can
/// fill it) and buffers large enough for a module binding on the ring.
fn layout() -> ferry_ring::Layout {
    ferry_ring::Layout {
        ring_slots: 64,
        record_size: ferry_proto::RECORD_SIZE as u32,
        bufs_a: 16,
        bufs_b: 16,
        buf_size: 32 * 1024,
    }
}

struct World {
    path: PathBuf,
    bystander: Client,
    conn: Socket,
}

fn world() -> &'static Mutex<World> {
    static WORLD: OnceLock<Mutex<World>> = OnceLock::new();
    WORLD.get_or_init(|| Mutex::new(World::start()))
}

impl World {
    fn start() -> World {
        // FERRY_FUZZ_LOG=debug (an env filter) shows the server's log, to replay a failure.
        if let Ok(filter) = std::env::var("FERRY_FUZZ_LOG") {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .init();
        }
        crate::netns::isolate();
        for ip in ["127.0.0.1", "::1"] {
            echo_peers(SocketAddr::new(ip.parse().expect("literal"), ECHO_PORT));
        }
        let path = std::env::temp_dir().join(format!("ferry-fuzz-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut cfg = Config::new(path.clone());
        cfg.layout = layout();
        let server = Server::new(cfg, Box::new(ferry_sys::socket)).expect("server");
        std::thread::spawn(move || server.run());
        let mut bystander = Client::connect(&path).expect("bystander channel");
        let conn = bystander
            .socket(libc::AF_INET, libc::SOCK_STREAM)
            .expect("bystander socket");
        bystander
            .connect_to(&conn, echo(false))
            .expect("bystander connect");
        World {
            path,
            bystander,
            conn,
        }
    }

    /// The bystander's connection still carries bytes both ways.
    fn ping(&mut self) {
        let sent = self.bystander.send(&self.conn, b"ping");
        assert!(sent.is_ok(), "bystander send failed: {sent:?}");
        let mut buf = [0u8; 4];
        let mut n = 0;
        while n < buf.len() {
            match self.bystander.recv(&self.conn, &mut buf[n..]) {
                Ok(0) => panic!("bystander connection ended"),
                Ok(k) => n += k,
                Err(e) => panic!("bystander recv failed: {e}"),
            }
        }
        assert_eq!(&buf, b"ping");
    }

    /// A fresh channel is served.
    fn fresh(&self) {
        let mut c = Client::connect(&self.path).expect("fresh channel refused");
        let s = c
            .socket(libc::AF_INET, libc::SOCK_DGRAM)
            .expect("fresh channel: socket");
        c.bind(&s, "127.0.0.1:0".parse().expect("literal"))
            .expect("fresh channel: bind");
        let a = c.local_addr(&s).expect("fresh channel: getsockname");
        assert!(a.ip().is_loopback() && a.port() != 0, "{a}");
    }
}

fn echo(v6: bool) -> SocketAddr {
    let ip = if v6 { "::1" } else { "127.0.0.1" };
    SocketAddr::new(ip.parse().expect("literal"), ECHO_PORT)
}

/// TCP and UDP echo on `at`, on threads of their own.
fn echo_peers(at: SocketAddr) {
    let tcp = TcpListener::bind(at).expect("echo listener");
    std::thread::spawn(move || {
        for c in tcp.incoming().flatten() {
            std::thread::spawn(move || echo_stream(c));
        }
    });
    let udp = UdpSocket::bind(at).expect("echo socket");
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&buf[..n], from);
        }
    });
}

fn echo_stream(mut c: TcpStream) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = vec![0u8; 65536];
    while let Ok(n) = c.read(&mut buf) {
        if n == 0 || c.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// One input.
pub fn run(data: &[u8]) {
    let mut w = world().lock().unwrap_or_else(|p| p.into_inner());
    let mut input = Input::new(data);
    if data.first().is_some_and(|b| b & 0x80 != 0) {
        raw_hello(&w.path, &mut input);
    }
    if let Ok(c) = Client::connect(&w.path) {
        let mut script = Script::new(c, w.conn.id);
        script.run(&mut input);
        script.end();
    }
    w.ping();
    w.fresh();
    w.ping();
}

/// The hostile channel and what it holds.
struct Script {
    c: Client,
    socks: Vec<Socket>,
    /// Descriptors whose other end was passed to the server (kept open for the script).
    kept: Vec<OwnedFd>,
    /// The bystander's socket, which the script may not name (see `sock_id`): a process's
    /// channels share its sockets, and the bystander lives in this very process (across
    /// processes the server refuses: `crates/ferry/tests/security.rs`).
    bystander: u32,
}

impl Script {
    fn new(c: Client, bystander: u32) -> Script {
        // Calls that wait for a control reply give up after a while instead of hanging
        // on a reply the script's own packets made the server skip (a `timeval`:
        // seconds, then microseconds).
        let mut tv = [0u8; 16];
        tv[8..].copy_from_slice(&200_000i64.to_ne_bytes());
        let _ = ferry_sys::setsockopt(c.ctl_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv);
        Script {
            c,
            socks: Vec::new(),
            kept: Vec::new(),
            bystander,
        }
    }

    fn run(&mut self, input: &mut Input<'_>) {
        // The first byte: the script's sockets (its high bit asked for a raw hello).
        for kind in 0..(input.u8() & 0x7f) % 3 {
            self.new_socket(kind);
        }
        for _ in 0..MAX_STEPS {
            if input.is_empty() {
                break;
            }
            let step = input.u8();
            let _ = match step % 14 {
                0 => self.raw_record(input),
                1 => self.send(input),
                2 => self.send_with_control(input),
                3 => self.bind_module_on_ring(input),
                4 => self.raw_control(input),
                5 => self.connect(input),
                6 => self.bind_listen(input),
                7 => self.set_option(input),
                8 => self.shutdown(input),
                9 => self.close(input),
                10 => {
                    self.new_socket(input.u8());
                    Ok(())
                }
                11 => self.bind_module_call(input),
                12 => self.recv(input),
                _ => self.register_file(input),
            };
            self.drain_replies();
        }
    }

    fn new_socket(&mut self, kind: u8) {
        if self.socks.len() >= MAX_SOCKETS {
            return;
        }
        let domain = if kind & 1 == 0 {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let ty = if kind & 2 == 0 {
            libc::SOCK_STREAM
        } else {
            libc::SOCK_DGRAM
        };
        if let Ok(s) = self.c.socket(domain, ty) {
            self.socks.push(s);
        }
    }

    /// Socket id for a record: ids below 256 name the script's sockets.
    ///
    /// Never the bystander's: until the server checks that a channel's process holds
    /// the sockets it names (work in progress), any channel may operate on any socket
    /// of its server, and this target found a script taking the bystander's echoed
    /// bytes with a `Recv` of its own. Remove this exception with that check.
    fn sock_id(&self, raw: u32) -> u32 {
        let id = if raw < 256 && !self.socks.is_empty() {
            self.socks[raw as usize % self.socks.len()].id
        } else {
            raw
        };
        if id == self.bystander { id ^ 0x100 } else { id }
    }

    /// Index of one of the script's sockets.
    fn pick(&self, pick: u8) -> Option<usize> {
        (!self.socks.is_empty()).then(|| pick as usize % self.socks.len())
    }

    /// A destination: none, the echo peers, a closed port, an unreachable address, or
    /// raw bytes.
    fn addr(input: &mut Input<'_>) -> Option<[u8; 32]> {
        let mut out = [0u8; 32];
        let pick = input.u8() % 6;
        let sa: SocketAddr = match pick {
            0 => return None,
            1 => echo(false),
            2 => echo(true),
            3 => "127.0.0.1:9".parse().expect("literal"),
            4 => "10.77.0.1:80".parse().expect("literal"),
            _ => {
                input.fill(&mut out);
                return Some(out);
            }
        };
        WireAddr::from(sa).encode(&mut out);
        Some(out)
    }

    fn raw_record(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let mut r: Req = input.pod();
        r.sock = self.sock_id(r.sock);
        self.c.push_raw(r)
    }

    fn send(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let sock = self.sock_id(u32::from(input.u8()));
        let flags = input.u8();
        let len = input.u16() as usize % 4096;
        let data = input.take(len);
        let to = Self::addr(input);
        let buf = self.c.fill_raw(data)?;
        let mut r = Req {
            buf,
            len: data.len() as u32,
            ..Req::new(Op::Send, sock)
        };
        // MSG_OOB, MSG_MORE, MSG_EOR, and sometimes a span offset or length of its own.
        r.a = [0, libc::MSG_OOB, libc::MSG_MORE, libc::MSG_EOR][flags as usize & 3] as u32;
        if flags & 4 != 0 {
            r.b = u32::from(flags >> 3);
        }
        if flags & 0x80 != 0 {
            r.len = input.u32();
        }
        if let Some(a) = to {
            let n = (input.u8() % 33) as usize;
            r.addr = a;
            r.addr_len = if flags & 0x40 != 0 {
                n as u32
            } else {
                a_len(&a)
            };
        }
        self.c.push_raw(r)
    }

    fn send_with_control(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let sock = self.sock_id(u32::from(input.u8()));
        let len = input.u16() as usize % (ferry_proto::cmsg::MAX_CONTROL + 64);
        let ctl = input.take(len);
        for (i, chunk) in ctl.chunks(ferry_proto::cmsg::CHUNK).enumerate() {
            let r = Req {
                a: (i * ferry_proto::cmsg::CHUNK) as u32,
                ..Req::new(Op::SendCtl, sock).with_bytes(chunk)
            };
            self.c.push_raw(r)?;
        }
        let data = input.bytes8();
        let buf = self.c.fill_raw(data)?;
        let mut r = Req {
            buf,
            len: data.len() as u32,
            ..Req::new(Op::Send, sock)
        };
        if let Some(a) = Self::addr(input) {
            r.addr = a;
            r.addr_len = a_len(&a);
        }
        self.c.push_raw(r)
    }

    fn bind_module_on_ring(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let sock = self.sock_id(u32::from(input.u8()));
        let nfiles = (input.u8() % 3) as usize;
        let tag = u32::from(input.u8() & 1);
        let len = input.u16() as usize;
        let blob = input.take(len);
        if nfiles > 0 {
            let files: Vec<OwnedFd> = (0..nfiles).map(|_| file()).collect();
            let fds: Vec<BorrowedFd<'_>> = files.iter().map(AsFd::as_fd).collect();
            let msg = Ctl::new(CtlKind::Files, sock);
            ferry_sys::send_with_fds(self.c.ctl_fd(), bytemuck::bytes_of(&msg), &fds)?;
        }
        let buf = self.c.fill_raw(blob)?;
        self.c.push_raw(Req {
            buf,
            len: blob.len() as u32,
            a: nfiles as u32,
            tag,
            ..Req::new(Op::BindModule, sock)
        })
    }

    fn bind_module_call(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let pick = input.u8();
        let len = input.u16() as usize;
        let Ok(b) = Binding::decode(input.take(len)) else {
            return Ok(());
        };
        let (ModuleRef::Bytes(module), Some(i)) = (b.module, self.pick(pick)) else {
            return Ok(());
        };
        let files: Vec<OwnedFd> = (0..b.handles.len().min(MAX_FILES))
            .map(|_| file())
            .collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(AsFd::as_fd).collect();
        self.c.bind_module(&self.socks[i], module, &b.props, &fds)
    }

    fn raw_control(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let mut msg: Ctl = input.pod();
        msg.sock = self.sock_id(msg.sock);
        let inline = input.bytes8();
        let mut packet = bytemuck::bytes_of(&msg).to_vec();
        packet.extend_from_slice(inline);
        let fds: Vec<OwnedFd> = match input.u8() % 6 {
            0 => Vec::new(),
            1 | 2 => {
                let (mine, theirs) =
                    ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)?;
                self.kept.push(mine);
                vec![theirs]
            }
            3 => vec![file()],
            4 => vec![file(), file()],
            _ => {
                // A binding in a memfd, as a large one travels.
                let memfd =
                    rustix::fs::memfd_create("ferry-fuzz-blob", rustix::fs::MemfdFlags::CLOEXEC)?;
                rustix::io::write(&memfd, input.bytes16())?;
                vec![memfd]
            }
        };
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        ferry_sys::send_with_fds(self.c.ctl_fd(), &packet, &borrowed)
    }

    fn connect(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let pick = input.u8();
        let Some(to) = Self::addr(input).and_then(|a| WireAddr::decode(&a).ok()) else {
            return Ok(());
        };
        let Some(i) = self.pick(pick) else {
            return Ok(());
        };
        let id = self.socks[i].id;
        if pick & 0x80 != 0 {
            // Non-blocking, with the pair filled as the shim does.
            let r = Req {
                flags: ferry_proto::REQ_NONBLOCK | ferry_proto::REQ_FILLED,
                tag: 0,
                ..Req::new(Op::Connect, id).with_addr(&to)
            };
            return self.c.push_raw(r);
        }
        self.c.connect_to(&self.socks[i], to.to_std())
    }

    fn bind_listen(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let pick = input.u8();
        let Some(i) = self.pick(pick) else {
            return Ok(());
        };
        let at: SocketAddr = match pick >> 5 & 3 {
            0 => "127.0.0.1:0",
            1 => "[::1]:0",
            2 => "0.0.0.0:0",
            _ => "[::]:0",
        }
        .parse()
        .expect("literal");
        let bound = self.c.bind(&self.socks[i], at);
        if pick & 0x80 != 0 {
            return self.c.listen(&self.socks[i], u32::from(input.u8()));
        }
        bound
    }

    fn set_option(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        const OPTS: &[(i32, i32)] = &[
            (libc::SOL_SOCKET, libc::SO_RCVBUF),
            (libc::SOL_SOCKET, libc::SO_SNDBUF),
            (libc::SOL_SOCKET, libc::SO_LINGER),
            (libc::SOL_SOCKET, libc::SO_OOBINLINE),
            (libc::SOL_SOCKET, libc::SO_PRIORITY),
            (libc::SOL_SOCKET, libc::SO_REUSEADDR),
            (libc::SOL_SOCKET, libc::SO_TIMESTAMP),
            (libc::IPPROTO_IP, libc::IP_PKTINFO),
            (libc::IPPROTO_IP, libc::IP_RECVTTL),
            (libc::IPPROTO_IP, libc::IP_RECVTOS),
            (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY),
            (libc::IPPROTO_TCP, libc::TCP_CORK),
            (libc::SOL_UDP, libc::UDP_SEGMENT),
        ];
        let pick = input.u8();
        let which = input.u8() as usize;
        let (level, name) = if which < OPTS.len() * 8 {
            OPTS[which % OPTS.len()]
        } else {
            (input.u32() as i32, input.u32() as i32)
        };
        let n = (input.u8() % 33) as usize;
        let value = input.take(n);
        let Some(i) = self.pick(pick) else {
            return Ok(());
        };
        self.c.set_option(&self.socks[i], level, name, value)
    }

    fn shutdown(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let pick = input.u8();
        let Some(i) = self.pick(pick) else {
            return Ok(());
        };
        self.c.shutdown(&self.socks[i], i32::from(pick >> 6))
    }

    fn close(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let pick = input.u8() as usize;
        if self.socks.is_empty() {
            return Ok(());
        }
        let s = self.socks.swap_remove(pick % self.socks.len());
        let id = s.id;
        drop(s);
        // As the shim does after closing the fd.
        self.c.push_raw(Req {
            tag: u32::from(pick as u8 & 1),
            ..Req::new(Op::Release, id)
        })
    }

    fn recv(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let sock = self.sock_id(u32::from(input.u8()));
        let flags = input.u8();
        let r = Req {
            flags: u16::from(flags & 3),
            tag: u32::from(flags >> 2 & 1),
            a: u32::from(input.u16()) << (flags >> 3 & 7),
            b: [0, libc::MSG_PEEK, libc::MSG_OOB, libc::MSG_TRUNC][(flags >> 6) as usize] as u32,
            buf: NO_BUF,
            ..Req::new(Op::Recv, sock)
        };
        self.c.push_raw(r)
    }

    fn register_file(&mut self, input: &mut Input<'_>) -> std::io::Result<()> {
        let pick = input.u8();
        if pick & 1 == 0 {
            let f = file();
            self.c.register_file(f.as_fd()).map(drop)
        } else {
            self.c
                .unregister_file(ferry_client::FileRef(u32::from(pick >> 1)))
        }
    }

    /// Closes the channel and waits until the server has: it then has handled every
    /// record the script queued, so the checks after the script see all its effects.
    fn end(self) {
        let _ = ferry_sys::shutdown(self.c.ctl_fd(), libc::SHUT_WR);
        let mut buf = [0u8; 4096];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match ferry_sys::recv_with_fds(self.c.ctl_fd(), &mut buf, 0) {
                // End of stream, or a reset: the server closed the channel (with replies
                // it had not read, as when it found the channel malformed).
                Ok((0, _)) => return,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return,
                _ => {}
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the server did not close the script's channel within 5 s"
            );
        }
    }

    /// Takes the server's control replies the script did not wait for (non-blocking).
    fn drain_replies(&mut self) {
        let mut buf = [0u8; size_of::<Ctl>()];
        while let Ok((n, _fds)) =
            ferry_sys::recv_with_fds(self.c.ctl_fd(), &mut buf, libc::MSG_DONTWAIT)
        {
            if n == 0 {
                return;
            }
        }
    }
}

/// A connection to the control socket whose first packet (the `Hello`) is the input's:
/// any length, version, server index and flags, sometimes with a descriptor. The server
/// answers or hangs up; the script's own channel comes after.
fn raw_hello(path: &std::path::Path, input: &mut Input<'_>) {
    input.u8(); // the byte that asked for this
    let Ok(fd) = ferry_sys::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0)
    else {
        return;
    };
    if ferry_sys::connect_unix(fd.as_fd(), path).is_err() {
        return;
    }
    let pick = input.u8();
    let hello = input.bytes8();
    let file = (pick & 1 != 0).then(file);
    let fds: Vec<BorrowedFd<'_>> = file.iter().map(AsFd::as_fd).collect();
    let _ = ferry_sys::send_with_fds(fd.as_fd(), hello, &fds);
    if pick & 2 != 0 {
        // Wait for the answer (a reply with the region and doorbell, a refusal, or the
        // end), at most 200 ms.
        let _ = ferry_sys::poll_wait(fd.as_fd(), libc::POLLIN, 200);
        let mut buf = [0u8; 64];
        let _ = ferry_sys::recv_with_fds(fd.as_fd(), &mut buf, libc::MSG_DONTWAIT);
    }
}

/// The length of a wire address's family (16 or 28), or 0 when it is none.
fn a_len(a: &[u8; 32]) -> u32 {
    match i32::from(u16::from_ne_bytes([a[0], a[1]])) {
        libc::AF_INET => 16,
        libc::AF_INET6 => 28,
        _ => 32,
    }
}

/// A small regular file open for reading (what a module may send).
fn file() -> OwnedFd {
    let fd = rustix::fs::memfd_create("ferry-fuzz-file", rustix::fs::MemfdFlags::CLOEXEC)
        .expect("memfd_create");
    rustix::io::write(&fd, b"0123456789abcdef").expect("write to a memfd");
    fd
}
