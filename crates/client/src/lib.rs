//! ferry's native channel API: a program (or a test) talks to a protocol server directly,
//! without the LD_PRELOAD shim — one channel, explicit sockets, and data that goes from
//! the caller's bytes into the channel's buffers and from the server's buffers straight
//! out. It owns the client side of the protocol in `docs/specs/socket-protocol.md` for a
//! single thread; it must not interpose libc or keep global state.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod capi;
#[allow(unsafe_code)]
mod zc;

pub use zc::{Lent, ZcBuf};

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::demux::{Demux, Event};
use ferry_proto::{
    Binding, BufRef, CTL_BLOB_FD, Call, Cmp, Ctl, CtlKind, Hello, HelloReply, InlineBytes,
    MAX_INLINE_BINDING, ModuleRef, PROTO_VERSION, ProtoError, Req, WireAddr, module_hash,
};
use ferry_ring::{BufId, Buffers, Endpoint, Region, Side, SpinPolicy, WaitResult};

/// A socket served by the server: its id and this side's end of the readiness pair.
#[derive(Debug)]
pub struct Socket {
    /// Server-assigned id.
    pub id: u32,
    /// The program's end of the readiness pair (readable when the socket is, once
    /// tokens are asked for).
    pub pair: OwnedFd,
}

/// A file registered with the channel's server ([`Client::register_file`]): bindings
/// name it by this handle instead of passing its descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileRef(pub u32);

/// One channel to a protocol server.
#[derive(Debug)]
pub struct Client {
    ctl: OwnedFd,
    ep: Endpoint<Req, Cmp>,
    spin: SpinPolicy,
    /// Which completion is whose (tags, the call in progress).
    demux: Demux,
    /// Errors the server reported for fire-and-forget operations, by socket.
    pub async_errors: Vec<(u32, i32)>,
    /// Hashes of modules this channel's server has loaded (bound by hash next time).
    loaded: std::collections::HashSet<[u8; 32]>,
    /// The last module bound and its hash (comparing bytes is cheaper than hashing).
    last_module: Option<(Vec<u8>, [u8; 32])>,
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(-code)
}

/// A protocol violation (a [`ProtoError`]) or a ring's refusal, as an `InvalidData` error
/// that keeps it as its source.
fn proto_err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl Client {
    /// Opens a channel to the server listening at `path`.
    pub fn connect(path: &Path) -> io::Result<Client> {
        let ctl = ferry_sys::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0)?;
        ferry_sys::connect_unix(ctl.as_fd(), path)?;
        let hello = Hello {
            version: PROTO_VERSION,
            pid: std::process::id(),
            tid: ferry_sys::gettid(),
            server: 0,
        };
        ferry_sys::send_with_fds(ctl.as_fd(), bytemuck::bytes_of(&hello), &[])?;
        let mut buf = [0u8; size_of::<HelloReply>()];
        let (n, mut fds) = ferry_sys::recv_with_fds(ctl.as_fd(), &mut buf, 0)?;
        let reply: HelloReply = if n == buf.len() {
            bytemuck::pod_read_unaligned(&buf)
        } else {
            return Err(proto_err(ProtoError::HelloSize(n)));
        };
        if reply.version != PROTO_VERSION {
            return Err(proto_err(ProtoError::Refused(reply.version)));
        }
        if fds.len() != 2 {
            return Err(proto_err(ProtoError::HelloFds(fds.len())));
        }
        let doorbell = fds.pop().expect("two fds");
        let region = Arc::new(Region::open(fds.pop().expect("two fds")).map_err(proto_err)?);
        let mut ep = Endpoint::new(region, Side::A).map_err(proto_err)?;
        ep.tx.set_doorbell(Some(doorbell));
        let spin = SpinPolicy {
            span: Duration::from_nanos(reply.spin_ns),
            ..SpinPolicy::default()
        };
        Ok(Client {
            ctl,
            ep,
            spin,
            demux: Demux::new(),
            async_errors: Vec::new(),
            loaded: Default::default(),
            last_module: None,
        })
    }

    /// A control request that makes a socket: the reply and the program's end of its
    /// readiness pair (made and named by the server).
    fn ctl_new_socket(&mut self, msg: Ctl) -> io::Result<(Ctl, Option<OwnedFd>)> {
        ferry_sys::send_with_fds(self.ctl.as_fd(), bytemuck::bytes_of(&msg), &[])?;
        self.ctl_reply()
    }

    /// Sends one control packet and waits for the reply.
    fn ctl_packet(
        &mut self,
        packet: &[u8],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> io::Result<Ctl> {
        ferry_sys::send_with_fds(self.ctl.as_fd(), packet, fds)?;
        Ok(self.ctl_reply()?.0)
    }

    /// The server's reply to a control packet, with the descriptor it carries, if any.
    fn ctl_reply(&mut self) -> io::Result<(Ctl, Option<OwnedFd>)> {
        let mut buf = [0u8; size_of::<Ctl>()];
        // Blocking: polling here (as the rings do) measured slower on a loaded 2-vCPU
        // machine (bind round trip p50 82 µs polling vs 52 µs blocking).
        let (n, mut fds) = ferry_sys::recv_with_fds(self.ctl.as_fd(), &mut buf, 0)?;
        if n != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "server closed the channel",
            ));
        }
        Ok((bytemuck::pod_read_unaligned(&buf), fds.pop()))
    }

    /// The new socket of a `Socket` or `Accept` reply.
    fn new_socket(r: Ctl, fd: Option<OwnedFd>) -> io::Result<Socket> {
        if r.result < 0 {
            return Err(err(r.result));
        }
        let pair = fd.ok_or_else(|| io::Error::from_raw_os_error(libc::EMFILE))?;
        Ok(Socket {
            id: r.result as u32,
            pair,
        })
    }

    /// Creates a socket (`SOCK_STREAM` or `SOCK_DGRAM`).
    pub fn socket(&mut self, domain: i32, ty: i32) -> io::Result<Socket> {
        let msg = Ctl {
            a: domain,
            b: ty,
            ..Ctl::new(CtlKind::Socket, 0)
        };
        let (r, fd) = self.ctl_new_socket(msg)?;
        Client::new_socket(r, fd)
    }

    /// Accepts a connection on a listening socket (blocking).
    pub fn accept(&mut self, s: &Socket) -> io::Result<(Socket, Option<SocketAddr>)> {
        let (r, fd) = self.ctl_new_socket(Ctl::new(CtlKind::Accept, s.id))?;
        let peer = WireAddr::decode(&r.addr[..(r.addr_len as usize).min(32)])
            .ok()
            .map(WireAddr::to_std);
        Ok((Client::new_socket(r, fd)?, peer))
    }

    /// Claims socket `s` for this process (one it did not make or accept here, e.g.
    /// inherited across `fork`): its descriptor is the proof.
    pub fn claim(&mut self, s: &Socket) -> io::Result<()> {
        let r = self.ctl_packet(
            bytemuck::bytes_of(&Ctl::new(CtlKind::Claim, s.id)),
            &[s.pair.as_fd()],
        )?;
        if r.result < 0 {
            return Err(err(r.result));
        }
        Ok(())
    }

    /// Pushes a fire-and-forget request.
    fn push_call(&mut self, call: Call) -> io::Result<()> {
        self.push(call.encode())
    }

    fn push(&mut self, req: Req) -> io::Result<()> {
        loop {
            if self.ep.tx.push(&req).map_err(proto_err)? {
                self.ep.tx.commit();
                self.ep.tx.notify();
                return Ok(());
            }
            self.ep.tx.commit();
            self.ep.tx.notify();
            let waited = self
                .ep
                .tx
                .wait_space(self.spin, Some(Duration::from_millis(100)))
                .map_err(proto_err)?;
            if waited == WaitResult::PeerClosed {
                // The server closed the channel: the ring will never have room again.
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "server closed the channel",
                ));
            }
        }
    }

    /// Sends a tagged request and collects its answer. Each `Data` record is offered to
    /// `sink` (which returns whether it keeps the buffer; a buffer not kept goes back to
    /// the server at once).
    fn call_with(
        &mut self,
        call: Call,
        sink: &mut dyn FnMut(&Buffers, Cmp) -> bool,
    ) -> io::Result<Cmp> {
        self.exchange(|tag| call.with_tag(tag).encode(), sink)
    }

    /// [`Client::call_with`] for the record `record` makes with the call's tag.
    fn exchange(
        &mut self,
        record: impl FnOnce(u32) -> Req,
        sink: &mut dyn FnMut(&Buffers, Cmp) -> bool,
    ) -> io::Result<Cmp> {
        let tag = self.demux.begin();
        let answer = self.push(record(tag)).and_then(|()| self.answer(sink));
        if answer.is_err() {
            self.demux.abandon();
        }
        answer
    }

    /// Waits for the answer of the call in progress, handling what else comes.
    fn answer(&mut self, sink: &mut dyn FnMut(&Buffers, Cmp) -> bool) -> io::Result<Cmp> {
        loop {
            let Some(c) = self.ep.rx.pop().map_err(proto_err)? else {
                match self
                    .ep
                    .rx
                    .wait(self.spin, Some(Duration::from_secs(5)))
                    .map_err(proto_err)?
                {
                    WaitResult::Ready | WaitResult::Interrupted => continue,
                    WaitResult::TimedOut | WaitResult::PeerClosed => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "server did not answer",
                        ));
                    }
                }
            };
            match self.demux.take(c).map_err(proto_err)? {
                Event::BufReturn { buf, .. } => {
                    self.ep.pool.free(BufId(buf)).map_err(proto_err)?;
                }
                Event::AsyncError { sock, result } => self.async_errors.push((sock, result)),
                Event::Data { sock, buf, len } => {
                    self.ep.bufs.span(buf, 0, len).map_err(proto_err)?;
                    if !sink(&self.ep.bufs, c) {
                        self.give_back_id(sock, buf)?;
                    }
                }
                Event::Done(done) => {
                    self.ep.rx.release();
                    return Ok(done);
                }
                // This client never gives a call up, and takes no control bytes: anything
                // else breaks the protocol.
                Event::Control | Event::Orphan { .. } | Event::Stale => {
                    return Err(proto_err(ProtoError::Unexpected(c)));
                }
            }
        }
    }

    /// A tagged request whose data (if any) is copied into `out`.
    fn call(&mut self, call: Call, out: Option<&mut [u8]>) -> io::Result<Cmp> {
        self.exchange(|tag| call.with_tag(tag).encode(), &mut copy_into(out))
    }

    fn give_back_id(&mut self, sock: u32, buf: u32) -> io::Result<()> {
        self.push_call(Call::BufReturn { sock, buf })
    }

    fn simple(&mut self, call: Call) -> io::Result<i32> {
        let c = self.call(call, None)?;
        if c.result < 0 {
            Err(err(c.result))
        } else {
            Ok(c.result)
        }
    }

    /// `connect` (blocking).
    pub fn connect_to(&mut self, s: &Socket, addr: SocketAddr) -> io::Result<()> {
        self.simple(Call::Connect {
            sock: s.id,
            tag: 0,
            addr: WireAddr::from(addr),
            nonblock: false,
            filled: false,
        })
        .map(drop)
    }

    /// `bind`.
    pub fn bind(&mut self, s: &Socket, addr: SocketAddr) -> io::Result<()> {
        self.simple(Call::Bind {
            sock: s.id,
            tag: 0,
            addr: WireAddr::from(addr),
        })
        .map(drop)
    }

    /// `listen`.
    pub fn listen(&mut self, s: &Socket, backlog: u32) -> io::Result<()> {
        self.simple(Call::Listen {
            sock: s.id,
            tag: 0,
            // The C int's bits, as the record always carried them.
            backlog: i32::from_ne_bytes(backlog.to_ne_bytes()),
        })
        .map(drop)
    }

    /// `getsockname`.
    pub fn local_addr(&mut self, s: &Socket) -> io::Result<SocketAddr> {
        let c = self.call(Call::SockName { sock: s.id, tag: 0 }, None)?;
        if c.result < 0 {
            return Err(err(c.result));
        }
        WireAddr::decode(c.bytes())
            .map(WireAddr::to_std)
            .map_err(proto_err)
    }

    /// One of our buffers (waiting for one to come back if none is free) holding
    /// `bytes`, at most a buffer's size.
    fn filled_buffer(&mut self, bytes: &[u8]) -> io::Result<BufId> {
        let b = loop {
            if let Some(b) = self.ep.pool.alloc() {
                break b;
            }
            self.reap()?;
        };
        let span = self
            .ep
            .bufs
            .span(b.0, 0, bytes.len() as u32)
            .map_err(proto_err)?;
        self.ep.bufs.write(span, bytes);
        Ok(b)
    }

    /// Queues `data` for sending, filling channel buffers directly (one copy, from the
    /// caller's bytes into shared memory); returns once everything is queued.
    pub fn send(&mut self, s: &Socket, data: &[u8]) -> io::Result<usize> {
        let bs = self.ep.bufs.buf_size();
        for chunk in data.chunks(bs) {
            let b = self.filled_buffer(chunk)?;
            self.push_call(Call::Send {
                sock: s.id,
                buf: BufRef {
                    id: b.0,
                    len: chunk.len() as u32,
                },
                offset: 0,
                flags: 0,
                dest: None,
            })?;
        }
        Ok(data.len())
    }

    /// Waits for completions that return buffers (or report errors).
    fn reap(&mut self) -> io::Result<()> {
        match self.ep.rx.pop().map_err(proto_err)? {
            Some(c) => match self.demux.take(c).map_err(proto_err)? {
                Event::BufReturn { buf, .. } => self.ep.pool.free(BufId(buf)).map_err(proto_err),
                Event::AsyncError { sock, result } => {
                    self.async_errors.push((sock, result));
                    Err(err(result))
                }
                _ => Err(proto_err(ProtoError::Unexpected(c))),
            },
            None => {
                let waited = self
                    .ep
                    .rx
                    .wait(self.spin, Some(Duration::from_secs(5)))
                    .map_err(proto_err)?;
                if waited == WaitResult::PeerClosed {
                    // No buffer will ever come back.
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "server closed the channel",
                    ));
                }
                Ok(())
            }
        }
    }

    /// Receives up to `out.len()` bytes (blocking); 0 at end of stream.
    pub fn recv(&mut self, s: &Socket, out: &mut [u8]) -> io::Result<usize> {
        let c = self.call(
            Call::Recv {
                sock: s.id,
                tag: 0,
                max: out.len() as u32,
                flags: 0,
                nonblock: false,
            },
            Some(out),
        )?;
        if c.result < 0 {
            Err(err(c.result))
        } else {
            Ok(c.result as usize)
        }
    }

    /// Binds a data-path module to a connected stream socket: the server runs it next to
    /// the socket (`docs/MODULES.md`). `module` is binary wasm or `.wat` text; `props` are
    /// the properties it reads; `files` are the files it may send ranges of (regular
    /// files open for reading; index = position). From now on what is sent on `s` goes
    /// through the module, and what it emits goes to the peer; `shutdown(SHUT_WR)` or
    /// dropping the socket ends its input. Modules this channel bound before travel as
    /// their hash. Errors: `EINVAL` (bad module, properties or files), `EBUSY` (a module
    /// is bound already), `ENOBUFS` (the server runs as many modules as it may), `EIO`
    /// (the module failed at start: the connection was reset).
    pub fn bind_module(
        &mut self,
        s: &Socket,
        module: &[u8],
        props: &[(&str, &str)],
        files: &[std::os::fd::BorrowedFd<'_>],
    ) -> io::Result<()> {
        self.bind_module_refs(s, module, props, files, &[])
    }

    /// Like [`Client::bind_module`], but does not wait for the server's answer when the
    /// module was bound on this channel before (it goes by hash, in order with the
    /// socket's sends, like a send): an error comes back later as an asynchronous error
    /// of the socket ([`Client::async_errors`]). The first binding of a module waits.
    pub fn bind_module_nowait(
        &mut self,
        s: &Socket,
        module: &[u8],
        props: &[(&str, &str)],
        files: &[std::os::fd::BorrowedFd<'_>],
    ) -> io::Result<()> {
        self.bind_module_refs_nowait(s, module, props, files, &[])
    }

    /// [`Client::bind_module`] whose module may also send registered files
    /// ([`Client::register_file`]): its files are `files` (indices `0..files.len()`),
    /// then `registered` in order. A handle that is not registered fails the binding
    /// with `EBADF`.
    pub fn bind_module_refs(
        &mut self,
        s: &Socket,
        module: &[u8],
        props: &[(&str, &str)],
        files: &[std::os::fd::BorrowedFd<'_>],
        registered: &[FileRef],
    ) -> io::Result<()> {
        let hash = self.hash_of(module);
        if self.loaded.contains(&hash) {
            match self.bind_binding(s, ModuleRef::Hash(hash), props, files, registered, true) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    self.loaded.remove(&hash);
                }
                r => return r,
            }
        }
        self.bind_binding(s, ModuleRef::Bytes(module), props, files, registered, true)?;
        self.loaded.insert(hash);
        Ok(())
    }

    /// [`Client::bind_module_nowait`] with registered files (see
    /// [`Client::bind_module_refs`]). With only registered files, a binding of a module
    /// bound before is one ring record: no descriptor travels.
    pub fn bind_module_refs_nowait(
        &mut self,
        s: &Socket,
        module: &[u8],
        props: &[(&str, &str)],
        files: &[std::os::fd::BorrowedFd<'_>],
        registered: &[FileRef],
    ) -> io::Result<()> {
        let hash = self.hash_of(module);
        if self.loaded.contains(&hash) {
            return self.bind_binding(s, ModuleRef::Hash(hash), props, files, registered, false);
        }
        self.bind_module_refs(s, module, props, files, registered)
    }

    /// Registers a file with this channel's server (like io_uring's registered files):
    /// the descriptor travels and is checked once (a regular file open for reading), and
    /// later bindings name it by the returned handle ([`Client::bind_module_refs`]), so
    /// that a binding needs no descriptor passing. The server keeps its own reference
    /// (the caller may close `fd`) until [`Client::unregister_file`] or the channel
    /// closes. Errors: `EINVAL` (not a regular file), `EBADF` (not open for reading),
    /// `ENFILE` (the channel has `MAX_REGISTERED_FILES` registered).
    pub fn register_file(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<FileRef> {
        let r = self.ctl_packet(
            bytemuck::bytes_of(&Ctl::new(CtlKind::RegisterFile, 0)),
            &[fd],
        )?;
        if r.result < 0 {
            return Err(err(r.result));
        }
        Ok(FileRef(r.result as u32))
    }

    /// Forgets a registered file. Bindings sent before (even without waiting) still see
    /// it, and a module already running keeps sending it; a later binding naming it fails
    /// with `EBADF`, and the handle may be given to the next registered file. Errors:
    /// `EBADF` (not registered).
    pub fn unregister_file(&mut self, f: FileRef) -> io::Result<()> {
        let mut msg = Ctl::new(CtlKind::UnregisterFile, 0);
        msg.a = i32::try_from(f.0).map_err(|_| err(-libc::EBADF))?;
        let r = self.ctl_packet(bytemuck::bytes_of(&msg), &[])?;
        if r.result < 0 {
            return Err(err(r.result));
        }
        Ok(())
    }

    fn bind_binding(
        &mut self,
        s: &Socket,
        module: ModuleRef<'_>,
        props: &[(&str, &str)],
        files: &[std::os::fd::BorrowedFd<'_>],
        registered: &[FileRef],
        wait: bool,
    ) -> io::Result<()> {
        if files.len() > ferry_proto::MAX_FILES || registered.len() > ferry_proto::MAX_FILE_HANDLES
        {
            return Err(err(-libc::EINVAL));
        }
        let blob = Binding {
            module,
            props: props.to_vec(),
            handles: registered.iter().map(|f| f.0).collect(),
        }
        .encode();
        if blob.len() <= self.ep.bufs.buf_size() {
            return self.bind_on_ring(s, &blob, files, wait);
        }
        let mut msg = Ctl::new(CtlKind::BindModule, s.id);
        msg.a = i32::try_from(blob.len()).map_err(|_| err(-libc::E2BIG))?;
        msg.b = files.len() as i32;
        let r = if blob.len() <= MAX_INLINE_BINDING {
            let mut packet = bytemuck::bytes_of(&msg).to_vec();
            packet.extend_from_slice(&blob);
            self.ctl_packet(&packet, files)?
        } else {
            msg.c = CTL_BLOB_FD;
            let memfd =
                rustix::fs::memfd_create("ferry-module-binding", rustix::fs::MemfdFlags::CLOEXEC)?;
            let mut f = std::fs::File::from(memfd);
            std::io::Write::write_all(&mut f, &blob)?;
            let mut fds = vec![f.as_fd()];
            fds.extend_from_slice(files);
            self.ctl_packet(bytemuck::bytes_of(&msg), &fds)?
        };
        if r.result < 0 {
            return Err(err(r.result));
        }
        Ok(())
    }

    /// A binding that fits a channel buffer goes on the ring (ordered with the sends; the
    /// answer comes like any other, without a wake-up of its own); its files go just
    /// before on the control socket.
    fn bind_on_ring(
        &mut self,
        s: &Socket,
        blob: &[u8],
        files: &[std::os::fd::BorrowedFd<'_>],
        wait: bool,
    ) -> io::Result<()> {
        if !files.is_empty() {
            let msg = Ctl::new(CtlKind::Files, s.id);
            ferry_sys::send_with_fds(self.ctl.as_fd(), bytemuck::bytes_of(&msg), files)?;
        }
        let b = self.filled_buffer(blob)?;
        let call = Call::BindModule {
            sock: s.id,
            tag: 0,
            binding: BufRef {
                id: b.0,
                len: blob.len() as u32,
            },
            files: files.len() as u32,
        };
        if wait {
            self.simple(call).map(drop)
        } else {
            self.push_call(call)
        }
    }

    /// `setsockopt(level, name, value)` on the server's host socket (at most 32 bytes
    /// of value), e.g. `TCP_NODELAY` as a native-endian `i32`.
    pub fn set_option(
        &mut self,
        s: &Socket,
        level: i32,
        name: i32,
        value: &[u8],
    ) -> io::Result<()> {
        let value = InlineBytes::new(value).ok_or(io::Error::from_raw_os_error(libc::EINVAL))?;
        self.simple(Call::SetOpt {
            sock: s.id,
            tag: 0,
            level,
            name,
            value,
        })
        .map(drop)
    }

    /// `TCP_NODELAY`: segments leave without waiting for earlier ones to be acknowledged.
    pub fn set_nodelay(&mut self, s: &Socket, on: bool) -> io::Result<()> {
        self.set_option(
            s,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &i32::from(on).to_ne_bytes(),
        )
    }

    /// `shutdown(how)`.
    pub fn shutdown(&mut self, s: &Socket, how: i32) -> io::Result<()> {
        self.simple(Call::Shutdown {
            sock: s.id,
            tag: 0,
            how,
        })
        .map(drop)
    }

    /// Sends a raw control packet and returns the reply: for tests of the server's
    /// defences.
    #[doc(hidden)]
    pub fn ctl_raw(
        &mut self,
        packet: &[u8],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> io::Result<Ctl> {
        self.ctl_packet(packet, fds)
    }

    /// [`Client::ctl_raw`], keeping the descriptor the reply carries.
    #[doc(hidden)]
    pub fn ctl_raw_fd(
        &mut self,
        packet: &[u8],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> io::Result<(Ctl, Option<OwnedFd>)> {
        ferry_sys::send_with_fds(self.ctl.as_fd(), packet, fds)?;
        self.ctl_reply()
    }

    /// SHA-256 of `module`, remembered for the last module.
    fn hash_of(&mut self, module: &[u8]) -> [u8; 32] {
        if let Some((bytes, h)) = &self.last_module
            && bytes.as_slice() == module
        {
            return *h;
        }
        let h = module_hash(module);
        self.last_module = Some((module.to_vec(), h));
        h
    }

    /// Writes a raw record into the request ring: for tests of the server's defences.
    #[doc(hidden)]
    pub fn push_raw(&mut self, req: Req) -> io::Result<()> {
        self.push(req)
    }

    /// Writes a raw record if the request ring has room, without waiting: `false` when
    /// it is full. For tests of the server's back-pressure.
    #[doc(hidden)]
    pub fn try_push_raw(&mut self, req: Req) -> io::Result<bool> {
        let pushed = self.ep.tx.push(&req).map_err(proto_err)?;
        self.ep.tx.commit();
        self.ep.tx.notify();
        Ok(pushed)
    }

    /// Sends a tagged raw request (any socket id) and returns its `Done`, with the bytes
    /// of its `Data` records copied into `out`: for tests of what a channel may do.
    #[doc(hidden)]
    pub fn call_raw(&mut self, req: Req, out: &mut [u8]) -> io::Result<Cmp> {
        self.exchange(|tag| Req { tag, ..req }, &mut copy_into(Some(out)))
    }

    /// One of this channel's buffers holding `bytes` (at most a buffer's size), for a
    /// raw record to lend: for tests of the server's defences.
    #[doc(hidden)]
    pub fn fill_raw(&mut self, bytes: &[u8]) -> io::Result<u32> {
        let n = bytes.len().min(self.ep.bufs.buf_size());
        self.filled_buffer(&bytes[..n]).map(|b| b.0)
    }

    /// The channel's control socket, to send packets without waiting for an answer:
    /// for tests of the server's defences.
    #[doc(hidden)]
    pub fn ctl_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.ctl.as_fd()
    }
}

/// A `Data` sink that copies the bytes into `out` (if given), one record after the
/// other, and keeps no buffer.
fn copy_into(mut out: Option<&mut [u8]>) -> impl FnMut(&Buffers, Cmp) -> bool {
    let mut filled = 0usize;
    move |bufs, c| {
        if let (Some(o), Ok(span)) = (out.as_deref_mut(), bufs.span(c.buf, 0, c.len)) {
            let at = filled.min(o.len());
            filled += bufs.read(span, &mut o[at..]);
        }
        false
    }
}
