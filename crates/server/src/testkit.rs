//! The in-process harness: a protocol server whose every call on host sockets, pairs
//! and control sockets goes to a scripted fake ([`Fake`], an in-memory model of
//! them), driven by hand — request records pushed into a real channel's ring, host and
//! pair events delivered one at a time, completions and pair effects read back. No
//! threads, no kernel sockets, no timing: a test says exactly which event comes when.
//!
//! Owns: the fake's model of a non-blocking host socket (input queue, urgent mark,
//! end of stream, pending error, room for output, scripted connect) and of the server's
//! end of a readiness pair (what the program wrote, with the shim's filler markers; what
//! the server wrote to the program; shutdowns; whether the program's end is open), and
//! the [`Harness`] API over a [`crate::server::Server`] built with
//! `Server::in_process`. Must not: change what the server decides
//! (the server under test is the real one, only its calls are answered by the model),
//! or be used outside tests and the fuzz target.
//!
//! The model's fds are eventfds (cheap kernel objects the server may register with
//! its epoll and close as it would sockets); the model is keyed by their numbers, and
//! a number the kernel gives out again starts a fresh model.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ferry_proto::{Cmp, Ctl, CtlKind, HELLO_READS_PAIR, Hello, Req};
use ferry_ring::{BufSpan, Buffers, Endpoint, Side};
use ferry_sys::Received;

use crate::Config;
use crate::seam::Io;
use crate::server::Server;
use crate::sock::{NewPair, Owner, PairName, TxItem};

fn err<T>(code: i32) -> io::Result<T> {
    Err(io::Error::from_raw_os_error(code))
}

/// A host socket as the fake models it.
#[derive(Debug, Default)]
struct Host {
    dgram: bool,
    /// Stream bytes received and not read yet.
    rx: VecDeque<u8>,
    /// Datagrams received and not read yet.
    dgrams: VecDeque<(Vec<u8>, SocketAddr)>,
    /// Urgent data: bytes of `rx` before the mark, and the urgent byte.
    urgent: Option<(usize, u8)>,
    /// The peer's end of stream arrived (after `rx`).
    fin: bool,
    /// A reset arrived: reads report it once `rx` is read (then the stream ends).
    error: Option<i32>,
    /// `SO_ERROR` (a connect's outcome).
    so_error: i32,
    /// Bytes the server sent.
    sent: Vec<u8>,
    /// Datagrams the server sent, with their destinations.
    sent_dgrams: Vec<(Vec<u8>, Option<SocketAddr>)>,
    /// Bytes sends may still put in (`None`: any number).
    room: Option<usize>,
    /// Sends fail with this error.
    send_error: Option<i32>,
    /// What the next connect returns (`None`: success).
    connect_result: Option<i32>,
    connects: Vec<SocketAddr>,
    unspecs: usize,
    /// A connect is in progress (`None`), or has ended (`Some`: `connect_outcome` or
    /// `connect_error_taken`, its outcome in `so_error`), until the next connect asks.
    connecting: Option<bool>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    listening: bool,
    backlog: VecDeque<(OwnedFd, SocketAddr)>,
    shut_rd: bool,
    shut_wr: bool,
    lingered: bool,
}

/// A byte of what the program wrote into its end of a pair, or the out-of-band mark
/// the shim's filler starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seg {
    Byte(u8),
    Mark,
}

/// The server's end of a readiness pair as the fake models it.
#[derive(Debug, Default)]
struct Pair {
    name: Vec<u8>,
    /// What the program wrote into its end (the server reads it).
    from_app: VecDeque<Seg>,
    /// What the server wrote to the program (tokens, stream bytes), not read by it yet.
    to_app: Vec<u8>,
    /// Out-of-band bytes the server sent to the program, each with the count of stream
    /// bytes sent before it.
    oob_to_app: Vec<(usize, u8)>,
    /// Room left in the program's end (`None`: any number of bytes).
    room: Option<usize>,
    shut_wr: bool,
    /// Bytes the server had written to the program when it shut its write side.
    eof_at: Option<usize>,
    shut_rd: bool,
    /// The program closed its end (with bytes unread: `reset`).
    app_closed: bool,
    reset: bool,
    /// A placeholder whose peer is gone.
    orphan: bool,
    /// Filler markers a read has passed: the kernel's `FIONREAD` still counts one byte
    /// for each (as Linux 6.x does), and poll reports `POLLIN` for them.
    passed_marks: usize,
}

#[derive(Debug)]
enum Obj {
    Host(Host),
    Pair(Pair),
    /// A channel's control socket: the messages the server sent on it.
    Ctl(VecDeque<Vec<u8>>),
    /// Anything else (a name probe, a duplicate).
    Other,
}

#[derive(Debug, Default)]
struct State {
    objs: HashMap<RawFd, Obj>,
    /// Pair names and whether the program's end holding each is open.
    names: HashMap<Vec<u8>, bool>,
    next_port: u16,
    next_name: u64,
}

impl State {
    fn host(&mut self, fd: BorrowedFd<'_>) -> io::Result<&mut Host> {
        match self.objs.get_mut(&fd.as_raw_fd()) {
            Some(Obj::Host(h)) => Ok(h),
            _ => err(libc::ENOTSOCK),
        }
    }

    fn pair(&mut self, fd: BorrowedFd<'_>) -> Option<&mut Pair> {
        match self.objs.get_mut(&fd.as_raw_fd()) {
            Some(Obj::Pair(p)) => Some(p),
            _ => None,
        }
    }
}

/// The scripted fake behind the seam (see the module's header).
#[derive(Debug, Default)]
pub struct Fake {
    st: Mutex<State>,
}

impl Fake {
    fn st(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new fd modelled as `obj`.
    fn make(&self, obj: Obj) -> io::Result<OwnedFd> {
        let fd = ferry_sys::eventfd()?;
        self.st().objs.insert(fd.as_raw_fd(), obj);
        Ok(fd)
    }

    fn with_host<R>(&self, fd: RawFd, f: impl FnOnce(&mut Host) -> R) -> R {
        match self.st().objs.get_mut(&fd) {
            Some(Obj::Host(h)) => f(h),
            other => panic!("fd {fd} is not a host socket: {other:?}"),
        }
    }

    fn with_pair<R>(&self, fd: RawFd, f: impl FnOnce(&mut Pair) -> R) -> R {
        match self.st().objs.get_mut(&fd) {
            Some(Obj::Pair(p)) => f(p),
            other => panic!("fd {fd} is not a pair: {other:?}"),
        }
    }

    /// Reads a stream: up to `len` bytes, stopping at the urgent mark; `consume` false
    /// peeks.
    fn read_stream(h: &mut Host, len: usize, consume: bool) -> io::Result<Vec<u8>> {
        if h.rx.is_empty() {
            if let Some(e) = h.error {
                if consume {
                    h.error = None;
                    h.fin = true;
                }
                return err(e);
            }
            // After `shutdown(SHUT_RD)` the kernel's reads say the stream ended.
            return if h.fin || h.shut_rd {
                Ok(Vec::new())
            } else {
                err(libc::EAGAIN)
            };
        }
        let mut limit = len;
        if let Some((before, _)) = h.urgent {
            if before == 0 {
                // A read at the mark passes it: the urgent byte is lost.
                if consume {
                    h.urgent = None;
                }
            } else {
                limit = limit.min(before);
            }
        }
        let n = limit.min(h.rx.len());
        let out: Vec<u8> = h.rx.iter().take(n).copied().collect();
        if consume {
            h.rx.drain(..n);
            if let Some((before, b)) = h.urgent {
                h.urgent = Some((before - n.min(before), b));
            }
        }
        Ok(out)
    }

    /// Reads what the program wrote into a pair: up to `len` bytes, passing a mark at
    /// the start and stopping at the next.
    fn read_pair(p: &mut Pair, len: usize, consume: bool) -> io::Result<Vec<u8>> {
        if p.from_app.is_empty() {
            if p.reset {
                return err(libc::ECONNRESET);
            }
            return if p.app_closed || p.shut_rd {
                Ok(Vec::new())
            } else {
                err(libc::EAGAIN)
            };
        }
        let skip = usize::from(p.from_app.front() == Some(&Seg::Mark));
        let bytes: Vec<u8> = p
            .from_app
            .iter()
            .skip(skip)
            .take(len)
            .map_while(|s| match s {
                Seg::Byte(b) => Some(*b),
                Seg::Mark => None,
            })
            .collect();
        if consume {
            p.from_app.drain(..skip + bytes.len());
            p.passed_marks += skip;
        }
        Ok(bytes)
    }
}

impl Io for Fake {
    fn socket(&self, _domain: i32, ty: i32, _protocol: i32) -> io::Result<OwnedFd> {
        self.make(Obj::Host(Host {
            dgram: ty & 0xf == libc::SOCK_DGRAM,
            ..Host::default()
        }))
    }

    fn new_pair(&self, id: u32) -> io::Result<NewPair> {
        let serial = {
            let mut st = self.st();
            st.next_name += 1;
            st.next_name
        };
        let name = ferry_proto::pair_name(id, serial);
        let bytes = name.0[..name.1].to_vec();
        let ours = self.make(Obj::Pair(Pair {
            name: bytes.clone(),
            ..Pair::default()
        }))?;
        let theirs = self.make(Obj::Other)?;
        self.st().names.insert(bytes, true);
        Ok(NewPair { ours, theirs, name })
    }

    fn orphan(&self) -> io::Result<OwnedFd> {
        self.make(Obj::Pair(Pair {
            orphan: true,
            ..Pair::default()
        }))
    }

    fn unix_socket(&self) -> io::Result<OwnedFd> {
        self.make(Obj::Other)
    }

    fn bind_abstract(&self, _fd: BorrowedFd<'_>, name: &PairName) -> io::Result<()> {
        match self.st().names.get(&name.0[..name.1]) {
            Some(true) => err(libc::EADDRINUSE),
            _ => Ok(()),
        }
    }

    fn abstract_name(
        &self,
        _fd: BorrowedFd<'_>,
        _out: &mut [u8; 107],
    ) -> io::Result<Option<usize>> {
        Ok(None)
    }

    fn netns_cookie(&self, _fd: BorrowedFd<'_>) -> io::Result<u64> {
        Ok(1)
    }

    fn set_nonblocking(&self, _fd: BorrowedFd<'_>, _on: bool) -> io::Result<()> {
        Ok(())
    }

    fn bind(&self, fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
        let mut st = self.st();
        st.next_port = st.next_port.wrapping_add(1);
        let port = 40_000 + st.next_port % 20_000;
        let h = st.host(fd)?;
        let mut a = *addr;
        if a.port() == 0 {
            a.set_port(port);
        }
        h.local = Some(a);
        Ok(())
    }

    fn connect(&self, fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
        let mut st = self.st();
        let Ok(h) = st.host(fd) else {
            // A duplicate of a host socket (finishing a blocking connect): nothing to do.
            return Ok(());
        };
        h.connects.push(*addr);
        if let Some(e) = h.connect_result.take() {
            // A scripted answer; `EINPROGRESS` starts a connect.
            h.peer = Some(*addr);
            h.connecting = (e == libc::EINPROGRESS).then_some(false);
            return err(e);
        }
        match h.connecting.take() {
            // As the kernel's: a connect while one is in progress says so, and the one
            // after it ended gives the outcome (a failure disconnects the socket).
            Some(false) => {
                h.connecting = Some(false);
                err(libc::EALREADY)
            }
            Some(true) => match std::mem::take(&mut h.so_error) {
                0 if h.peer.is_some() => Ok(()),
                e => {
                    h.unspecs += 1;
                    h.peer = None;
                    err(if e == 0 { libc::ECONNABORTED } else { e })
                }
            },
            None => {
                h.peer = Some(*addr);
                Ok(())
            }
        }
    }

    fn connect_unspec(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let mut st = self.st();
        let h = st.host(fd)?;
        h.unspecs += 1;
        h.peer = None;
        Ok(())
    }

    fn listen(&self, fd: BorrowedFd<'_>, _backlog: i32) -> io::Result<()> {
        self.st().host(fd)?.listening = true;
        Ok(())
    }

    fn accept(&self, fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
        match self.st().host(fd)?.backlog.pop_front() {
            Some((conn, peer)) => Ok((conn, Some(peer))),
            None => err(libc::EAGAIN),
        }
    }

    fn sock_addr(&self, fd: BorrowedFd<'_>, peer: bool) -> io::Result<Option<SocketAddr>> {
        let mut st = self.st();
        let h = st.host(fd)?;
        Ok(if peer { h.peer } else { h.local })
    }

    fn setsockopt(&self, _: BorrowedFd<'_>, _: i32, _: i32, _: &[u8]) -> io::Result<()> {
        Ok(())
    }

    fn getsockopt(&self, _: BorrowedFd<'_>, _: i32, _: i32, out: &mut [u8]) -> io::Result<usize> {
        let n = out.len().min(4);
        out[..n].fill(0);
        Ok(n)
    }

    fn getsockopt_int(&self, fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
        let mut st = self.st();
        if let Some(p) = st.pair(fd) {
            return Ok(if p.reset { libc::ECONNRESET } else { 0 });
        }
        let h = st.host(fd)?;
        Ok(match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut h.so_error),
            (libc::SOL_SOCKET, libc::SO_TYPE) if h.dgram => libc::SOCK_DGRAM,
            (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
            _ => 0,
        })
    }

    fn pending_bytes(&self, fd: BorrowedFd<'_>) -> io::Result<i32> {
        let mut st = self.st();
        if let Some(p) = st.pair(fd) {
            let n = p.from_app.len() + p.passed_marks;
            return Ok(i32::try_from(n).unwrap_or(i32::MAX));
        }
        let h = st.host(fd)?;
        Ok(i32::try_from(h.rx.len()).unwrap_or(i32::MAX))
    }

    fn shutdown(&self, fd: BorrowedFd<'_>, how: i32) -> io::Result<()> {
        let mut st = self.st();
        let (rd, wr) = (how != libc::SHUT_WR, how != libc::SHUT_RD);
        if let Some(p) = st.pair(fd) {
            p.shut_rd |= rd;
            if wr && !p.shut_wr {
                p.shut_wr = true;
                p.eof_at = Some(p.to_app.len());
            }
            return Ok(());
        }
        let h = st.host(fd)?;
        h.shut_rd |= rd;
        h.shut_wr |= wr;
        Ok(())
    }

    fn linger_reset(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.st().host(fd)?.lingered = true;
        Ok(())
    }

    fn poll_now(&self, fd: BorrowedFd<'_>, events: i16) -> io::Result<i16> {
        let mut st = self.st();
        let always = libc::POLLHUP | libc::POLLERR;
        if let Some(p) = st.pair(fd) {
            let mut rev = 0;
            if p.passed_marks > 0 || p.from_app.iter().any(|s| matches!(s, Seg::Byte(_))) {
                rev |= libc::POLLIN;
            }
            if p.from_app.contains(&Seg::Mark) {
                rev |= libc::POLLPRI;
            }
            if p.orphan || p.app_closed || (p.shut_rd && p.shut_wr) {
                rev |= libc::POLLHUP;
            }
            if p.reset {
                rev |= libc::POLLERR;
            }
            return Ok(rev & (events | always));
        }
        let h = st.host(fd)?;
        let mut rev = 0;
        let input = !h.rx.is_empty() || !h.dgrams.is_empty() || !h.backlog.is_empty();
        if input || h.fin || h.error.is_some() {
            rev |= libc::POLLIN;
        }
        if h.fin {
            rev |= libc::POLLRDHUP;
        }
        if h.error.is_some() {
            rev |= libc::POLLERR | libc::POLLHUP;
        }
        Ok(rev & (events | always))
    }

    fn at_mark(&self, fd: BorrowedFd<'_>) -> io::Result<bool> {
        let mut st = self.st();
        if let Some(p) = st.pair(fd) {
            return Ok(p.from_app.front() == Some(&Seg::Mark));
        }
        Ok(st.host(fd)?.urgent.is_some_and(|(before, _)| before == 0))
    }

    fn recv(&self, fd: BorrowedFd<'_>, buf: &mut [u8], flags: i32) -> io::Result<usize> {
        let mut st = self.st();
        let consume = flags & libc::MSG_PEEK == 0;
        let got = if let Some(p) = st.pair(fd) {
            Fake::read_pair(p, buf.len(), consume)?
        } else {
            let h = st.host(fd)?;
            if flags & libc::MSG_OOB != 0 {
                let Some((_, b)) = h.urgent else {
                    return err(libc::EINVAL);
                };
                if consume {
                    h.urgent = None;
                }
                vec![b]
            } else if h.dgram {
                match h.dgrams.front() {
                    None => return err(libc::EAGAIN),
                    Some((d, _)) => {
                        let d = d.clone();
                        if consume {
                            h.dgrams.pop_front();
                        }
                        d
                    }
                }
            } else {
                Fake::read_stream(h, buf.len(), consume)?
            }
        };
        let n = got.len().min(buf.len());
        buf[..n].copy_from_slice(&got[..n]);
        Ok(n)
    }

    fn discard(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(fd, buf, 0)
    }

    fn send(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
        let mut st = self.st();
        if let Some(p) = st.pair(fd) {
            if p.app_closed || p.orphan || p.shut_wr {
                return err(libc::EPIPE);
            }
            let n = p.room.map_or(buf.len(), |r| r.min(buf.len()));
            if n == 0 {
                return err(libc::EAGAIN);
            }
            if let Some(r) = p.room.as_mut() {
                *r -= n;
            }
            p.to_app.extend_from_slice(&buf[..n]);
            return Ok(n);
        }
        let h = st.host(fd)?;
        if let Some(e) = h.send_error {
            return err(e);
        }
        let n = h.room.map_or(buf.len(), |r| r.min(buf.len()));
        if n == 0 {
            return err(libc::EAGAIN);
        }
        if let Some(r) = h.room.as_mut() {
            *r -= n;
        }
        h.sent.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn send_oob(&self, fd: BorrowedFd<'_>, byte: u8) -> io::Result<usize> {
        let mut st = self.st();
        let Some(p) = st.pair(fd) else {
            return err(libc::ENOTSOCK);
        };
        if p.shut_wr {
            return err(libc::EPIPE);
        }
        p.oob_to_app.push((p.to_app.len(), byte));
        Ok(1)
    }

    fn unix_oob_works(&self) -> bool {
        true
    }

    fn rx_pipe(&self, _size: usize) -> Option<(OwnedFd, OwnedFd)> {
        None
    }

    fn splice(&self, _: BorrowedFd<'_>, _: BorrowedFd<'_>, _: usize) -> io::Result<usize> {
        err(libc::EINVAL)
    }

    fn send_items(
        &self,
        fd: BorrowedFd<'_>,
        items: std::collections::vec_deque::Iter<'_, TxItem>,
    ) -> io::Result<usize> {
        let mut bytes = Vec::new();
        let mut to = None;
        for (i, item) in items.take(crate::hostio::MAX_IOV).enumerate() {
            let mut data = vec![0u8; item.span.len() as usize];
            item.bufs.read(item.span, &mut data);
            bytes.extend_from_slice(&data[item.sent.min(data.len())..]);
            if i == 0 {
                to = item.to;
            }
        }
        let dgram = self.st().host(fd)?.dgram;
        if dgram {
            let mut st = self.st();
            let h = st.host(fd)?;
            if let Some(e) = h.send_error {
                return err(e);
            }
            h.sent_dgrams.push((bytes.clone(), to));
            return Ok(bytes.len());
        }
        self.send(fd, &bytes)
    }

    fn recv_spans(
        &self,
        fd: BorrowedFd<'_>,
        bufs: &Buffers,
        spans: &[BufSpan],
        flags: i32,
        _control: Option<&mut [u8]>,
    ) -> io::Result<Received> {
        let room: usize = spans.iter().map(|s| s.len() as usize).sum();
        let mut buf = vec![0u8; room];
        let (len, from) = {
            let mut st = self.st();
            let h = st.host(fd)?;
            if h.dgram && flags & libc::MSG_OOB == 0 {
                let Some((d, from)) = h.dgrams.front().cloned() else {
                    return err(libc::EAGAIN);
                };
                if flags & libc::MSG_PEEK == 0 {
                    h.dgrams.pop_front();
                }
                let n = d.len().min(room);
                buf[..n].copy_from_slice(&d[..n]);
                (d.len(), Some(from))
            } else {
                drop(st);
                (self.recv(fd, &mut buf, flags)?, None)
            }
        };
        let mut at = 0;
        for s in spans {
            let n = (s.len() as usize).min(len.min(room) - at.min(len.min(room)));
            bufs.write(*s, &buf[at..at + n]);
            at += n;
        }
        Ok(Received {
            len,
            from,
            flags: 0,
            control_len: 0,
        })
    }

    fn ctl_send(
        &self,
        fd: BorrowedFd<'_>,
        bytes: &[u8],
        _fds: &[BorrowedFd<'_>],
    ) -> io::Result<()> {
        match self.st().objs.get_mut(&fd.as_raw_fd()) {
            Some(Obj::Ctl(log)) => {
                log.push_back(bytes.to_vec());
                Ok(())
            }
            _ => err(libc::ENOTSOCK),
        }
    }
}

/// What the server did to a socket's readiness pair, as the program's end sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PairView {
    /// Bytes the server wrote to the program (tokens, or stream bytes on the pair
    /// path), not taken by [`Harness::take_pair_output`] yet.
    pub to_app: Vec<u8>,
    /// Out-of-band bytes (urgent data) the server sent to the program, each with the
    /// count of stream bytes that went before it.
    pub oob: Vec<(usize, u8)>,
    /// The server shut its write side: the program reads end of stream.
    pub eof: bool,
    /// How many bytes the server had written to the program when it shut its write
    /// side (all of `to_app` as it was then go before the end).
    pub eof_after: Option<usize>,
    /// The server shut its read side (the host's hang-up mirrored): with `eof`, the
    /// program's end reports `POLLHUP`.
    pub hup: bool,
    /// What the program wrote (and the shim's filler) that the server has not read.
    pub unread: usize,
    /// The server's end was replaced by a placeholder (a failed non-blocking connect).
    pub detached: bool,
}

/// What the host socket of a sandbox socket saw from the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostView {
    /// Stream bytes sent.
    pub sent: Vec<u8>,
    /// Datagrams sent.
    pub datagrams: Vec<(Vec<u8>, Option<SocketAddr>)>,
    pub connects: Vec<SocketAddr>,
    /// `connect(AF_UNSPEC)` calls, and connects that reported a failure (the kernel
    /// puts the socket back to unconnected then).
    pub unspecs: usize,
    pub shut_rd: bool,
    pub shut_wr: bool,
    /// `SO_LINGER` 0 was set (the close resets).
    pub lingered: bool,
}

/// One shim's side of a channel in the harness.
struct Shim {
    ep: Endpoint<Req, Cmp>,
    ctl: RawFd,
}

/// A protocol server driven by hand over the scripted [`Fake`] (see the module's
/// header).
pub struct Harness {
    srv: Server,
    fake: &'static Fake,
    shims: HashMap<u32, Shim>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").finish_non_exhaustive()
    }
}

thread_local! {
    /// This thread's fake: the server keeps a `'static` reference, as it does to the
    /// real one, so one is made (and leaked) per thread and used by every harness of
    /// the thread (its model is keyed by fd numbers, which harnesses do not share).
    static FAKE: &'static Fake = Box::leak(Box::default());
    /// Harnesses of this thread alive now: the last to go empties the model.
    static LIVE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn thread_fake() -> &'static Fake {
    FAKE.with(|f| *f)
}

impl Drop for Harness {
    fn drop(&mut self) {
        LIVE.set(LIVE.get().saturating_sub(1));
        if LIVE.get() == 0 {
            // What the model holds (connections never accepted, names) goes with it:
            // a fuzzer makes millions of harnesses in one process.
            *self.fake.st() = State::default();
        }
    }
}

/// The pid and start of this process: the owner of every channel of the harness.
fn this_process() -> Owner {
    let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    Owner {
        pid,
        start: crate::procs::process_start(pid).unwrap_or(0),
    }
}

impl Harness {
    /// A server with the default configuration; `rx_pair` chooses the receive path of
    /// streams (their bytes go through the readiness pair, or through the ring).
    pub fn new(rx_pair: bool) -> Harness {
        let mut cfg = Config::new("unused".into());
        cfg.rx_pair = rx_pair;
        cfg.layout = crate::default_layout();
        Harness::with_config(cfg)
    }

    /// A server with `cfg` (its socket path and published ports are not used).
    pub fn with_config(mut cfg: Config) -> Harness {
        cfg.publish.clear();
        let fake = thread_fake();
        LIVE.set(LIVE.get() + 1);
        let srv = Server::in_process(cfg, fake).expect("in-process server");
        Harness {
            srv,
            fake,
            shims: HashMap::new(),
        }
    }

    /// Opens a channel, as a shim's thread does; returns its index.
    pub fn channel(&mut self) -> u32 {
        let ctl = self.fake.make(Obj::Ctl(VecDeque::new())).expect("fake fd");
        let raw = ctl.as_raw_fd();
        let hello = Hello {
            tid: 1,
            server: if self.srv.cfg.rx_pair {
                HELLO_READS_PAIR
            } else {
                0
            },
            ..Hello::default()
        };
        self.srv
            .channel_life()
            .open_channel(ctl, hello, this_process());
        let idx = (0..self.srv.channels.slots())
            .find(|i| {
                self.srv
                    .channels
                    .get(*i)
                    .is_some_and(|c| c.ctl.as_raw_fd() == raw)
            })
            .expect("channel opened");
        let region = self.srv.channels.get(idx).expect("open").region.clone();
        let ep = Endpoint::new(region, Side::A).expect("shim side");
        // The HelloReply.
        self.ctl_replies(idx);
        self.shims.insert(idx, Shim { ep, ctl: raw });
        idx
    }

    /// Replies the server sent on channel `ch`'s control socket since the last look.
    pub fn ctl_replies(&mut self, ch: u32) -> Vec<Ctl> {
        let raw = match self.shims.get(&ch) {
            Some(s) => s.ctl,
            None => self.srv.channels.get(ch).expect("open").ctl.as_raw_fd(),
        };
        let mut st = self.fake.st();
        let Some(Obj::Ctl(log)) = st.objs.get_mut(&raw) else {
            return Vec::new();
        };
        log.drain(..)
            .filter(|b| b.len() == size_of::<Ctl>())
            .map(|b| bytemuck::pod_read_unaligned(&b))
            .collect()
    }

    /// A control request (socket, accept…) from channel `ch`; the replies.
    pub fn control(&mut self, ch: u32, msg: Ctl) -> Vec<Ctl> {
        self.srv.control(ch, msg, Vec::new());
        self.end_turn();
        self.ctl_replies(ch)
    }

    /// A new socket made through channel `ch`; its id.
    pub fn socket(&mut self, ch: u32, domain: i32, ty: i32) -> u32 {
        self.try_socket(ch, domain, ty)
            .unwrap_or_else(|e| panic!("socket refused: {e}"))
    }

    /// A new socket made through channel `ch`: its id, or the (negated) error.
    pub fn try_socket(&mut self, ch: u32, domain: i32, ty: i32) -> Result<u32, i32> {
        let msg = Ctl {
            a: domain,
            b: ty,
            ..Ctl::new(CtlKind::Socket, 0)
        };
        let r = self.control(ch, msg);
        let id = r.last().map_or(-libc::EIO, |r| r.result);
        u32::try_from(id).map_err(|_| id)
    }

    /// The ids of the sockets the server has now, in order.
    pub fn sockets(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.srv.socks.ids();
        ids.sort_unstable();
        ids
    }

    /// Whether channel `ch` is still open (the server closes a channel that breaks the
    /// protocol).
    pub fn channel_open(&self, ch: u32) -> bool {
        self.srv.channels.get(ch).is_some()
    }

    /// Pushes a request record into channel `ch`'s ring (not taken yet).
    pub fn push(&mut self, ch: u32, req: Req) {
        let shim = self.shims.get_mut(&ch).expect("a channel of the harness");
        assert!(
            matches!(shim.ep.tx.push(&req), Ok(true)),
            "request ring full"
        );
        shim.ep.tx.commit();
    }

    /// Whether channel `ch`'s request ring has room for `n` more records.
    pub fn ring_room(&mut self, ch: u32) -> usize {
        let shim = self.shims.get_mut(&ch).expect("a channel of the harness");
        shim.ep.tx.free().unwrap_or(0)
    }

    /// Records still waiting in channel `ch`'s request ring.
    pub fn ring_waiting(&mut self, ch: u32) -> usize {
        self.srv
            .channels
            .get_mut(ch)
            .map_or(0, |c| c.ep.rx.available().unwrap_or(0))
    }

    /// One pass of the server over the rings, as its loop makes after a wake-up: every
    /// request taken and handled, state changes settled, completions published.
    pub fn turn(&mut self) {
        self.srv.drain_rings();
        self.end_turn();
    }

    /// A turn with nothing to do: one piece of the work the server put off
    /// (`Server::put_off_work`: the spare TCP socket, then closing what waits).
    pub fn idle(&mut self) {
        self.srv.put_off_work(std::time::Duration::MAX);
    }

    /// A turn with nothing to do after `quiet` without work (the loop's idle turn, as
    /// opposed to [`Harness::idle`], the turn before it sleeps).
    pub fn idle_after(&mut self, quiet: std::time::Duration) {
        self.srv.put_off_work(quiet);
    }

    /// Sockets this server's `socket()`s took from what it made ahead.
    pub fn sockets_made_ahead(&self) -> u64 {
        self.srv.stats.sockets_made_ahead
    }

    fn end_turn(&mut self) {
        self.srv.settle_dirty();
        self.srv.channels.flush_all();
        // The harness has no idle turns: what a server closes in one is closed here.
        self.srv.closing.close_all();
    }

    /// Pushes `req` and runs a turn; the completions channel `ch` then has.
    pub fn call(&mut self, ch: u32, req: Req) -> Vec<Cmp> {
        self.push(ch, req);
        self.turn();
        self.completions(ch)
    }

    /// Completions published to channel `ch` since the last look (taken, as the shim
    /// takes them).
    pub fn completions(&mut self, ch: u32) -> Vec<Cmp> {
        let shim = self.shims.get_mut(&ch).expect("a channel of the harness");
        let mut out = Vec::new();
        while let Ok(Some(c)) = shim.ep.rx.pop() {
            out.push(c);
        }
        shim.ep.rx.release();
        out
    }

    /// Completions the server holds back for channel `ch` (its ring was full).
    pub fn backlog(&self, ch: u32) -> usize {
        self.srv.channels.get(ch).map_or(0, |c| c.backlog.len())
    }

    /// Times the server stopped taking a channel's requests because its completions
    /// backed up.
    pub fn backpressure_count(&self) -> u64 {
        self.srv.stats.backpressure
    }

    /// A request to send `data` on socket `id` from channel `ch`: the data goes into a
    /// buffer of the shim's, lent with the record.
    pub fn send_req(&mut self, ch: u32, id: u32, data: &[u8]) -> Req {
        self.try_send_req(ch, id, data)
            .expect("a free shim buffer that holds the data")
    }

    /// [`Harness::send_req`], or `None` when the shim has no free buffer or the data
    /// does not fit one.
    pub fn try_send_req(&mut self, ch: u32, id: u32, data: &[u8]) -> Option<Req> {
        let shim = self.shims.get_mut(&ch).expect("a channel of the harness");
        let len = u32::try_from(data.len()).ok()?;
        let b = shim.ep.pool.alloc()?;
        let Ok(span) = shim.ep.bufs.span(b.0, 0, len) else {
            let _ = shim.ep.pool.free(b);
            return None;
        };
        shim.ep.bufs.write(span, data);
        let call = ferry_proto::Call::Send {
            sock: id,
            buf: ferry_proto::BufRef { id: b.0, len },
            offset: 0,
            flags: 0,
            dest: None,
        };
        Some(call.encode())
    }

    /// A buffer the shim lent comes back to its pool (as the shim does when a
    /// `BufReturn` names it); false when it was not one the shim had lent.
    pub fn buffer_returned(&mut self, ch: u32, buf: u32) -> bool {
        let shim = self.shims.get_mut(&ch).expect("a channel of the harness");
        shim.ep.pool.free(ferry_ring::BufId(buf)).is_ok()
    }

    /// The shim gives back server buffer `buf` that a `Data` completion lent it (a
    /// `BufReturn` record; not sent when the ring is full).
    pub fn buffer_lent_back(&mut self, ch: u32, buf: u32) {
        let call = ferry_proto::Call::BufReturn { sock: 0, buf };
        if self.ring_room(ch) > 0 {
            self.push(ch, call.encode());
        }
    }

    /// The bytes of a `Data` completion (a server buffer lent to the shim).
    pub fn data(&mut self, ch: u32, c: &Cmp) -> Vec<u8> {
        let shim = self.shims.get_mut(&ch).expect("a channel of the harness");
        let span = shim.ep.bufs.span(c.buf, 0, c.len).expect("lent span");
        let mut out = vec![0u8; c.len as usize];
        shim.ep.bufs.read(span, &mut out);
        out
    }

    /// The number of `epoll_wait` calls the server has made (each event of the harness
    /// is one).
    fn tick(&mut self) {
        self.srv.waits += 1;
    }

    /// The host socket of `id` reports `events` (`EPOLL*`), as an epoll wait would; the
    /// turn then ends as the loop's does.
    pub fn host_event(&mut self, id: u32, events: i32) {
        self.tick();
        self.srv.host_event(id, events.cast_unsigned());
        self.srv.drain_rings();
        self.end_turn();
    }

    /// The host socket of `id` reports `events`, and nothing more happens: what the
    /// program sees in the middle of the server's turn (completions not yet published
    /// stay unseen).
    pub fn host_event_only(&mut self, id: u32, events: i32) {
        self.tick();
        self.srv.host_event(id, events.cast_unsigned());
    }

    /// The server's end of `id`'s pair reports `events`, with `EPOLLPRI` added while
    /// a filler's marker is unread (as the kernel's epoll reports it to a watch for it).
    pub fn pair_event(&mut self, id: u32, events: i32) {
        self.tick();
        let marked = self
            .fake
            .with_pair(self.pair_fd(id), |p| p.from_app.contains(&Seg::Mark));
        let events = if marked {
            events | libc::EPOLLPRI
        } else {
            events
        };
        self.srv.rx().pair_event(id, events.cast_unsigned());
        self.srv.drain_rings();
        self.end_turn();
    }

    fn host_fd(&self, id: u32) -> RawFd {
        self.srv
            .socks
            .get(&id)
            .expect("a live socket")
            .fd
            .as_raw_fd()
    }

    fn pair_fd(&self, id: u32) -> RawFd {
        self.srv
            .socks
            .get(&id)
            .expect("a live socket")
            .pair
            .as_raw_fd()
    }

    /// The events the server's epoll watches on its end of `id`'s pair, as the kernel
    /// holds them (`/proc/self/fdinfo` of the epoll descriptor); `None` when the pair
    /// is not in the loop.
    pub fn pair_watch(&self, id: u32) -> Option<u32> {
        use std::os::fd::AsFd;
        let epfd = self.srv.epoll.as_fd().as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{epfd}")).ok()?;
        let tfd = self.pair_fd(id);
        info.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("tfd:") && words.next()?.parse::<RawFd>().ok()? == tfd)
                .then_some(())?;
            let events = words.skip_while(|w| *w != "events:").nth(1)?;
            u32::from_str_radix(events, 16).ok()
        })
    }

    /// Whether the server still has socket `id`.
    pub fn has_socket(&self, id: u32) -> bool {
        self.srv.socks.contains(id)
    }

    /// Socket `id`'s host side, to script (the peer, the host kernel's socket) and to
    /// look at.
    pub fn peer(&self, id: u32) -> HostSide {
        HostSide {
            fake: self.fake,
            fd: self.host_fd(id),
        }
    }

    /// The program's side of socket `id`'s pair, to act as the program and to look at.
    pub fn app(&self, id: u32) -> AppSide {
        AppSide {
            fake: self.fake,
            fd: self.pair_fd(id),
        }
    }
}

/// A harness socket's host side ([`Harness::peer`]): what the peer and the host
/// kernel's socket do next, scripted, and what the server did there.
#[derive(Debug)]
pub struct HostSide {
    fake: &'static Fake,
    fd: RawFd,
}

impl HostSide {
    /// Bytes arrive on the socket's host socket (no event yet).
    pub fn input(&self, bytes: &[u8]) {
        self.fake
            .with_host(self.fd, |h| h.rx.extend(bytes.iter().copied()));
    }

    /// A datagram from `from` arrives on the socket's host socket (no event yet).
    pub fn datagram(&self, bytes: &[u8], from: SocketAddr) {
        self.fake
            .with_host(self.fd, |h| h.dgrams.push_back((bytes.to_vec(), from)));
    }

    /// Urgent data: `byte` arrives after the bytes queued so far.
    pub fn urgent(&self, byte: u8) {
        self.fake
            .with_host(self.fd, |h| h.urgent = Some((h.rx.len(), byte)));
    }

    /// The peer's end of stream arrives after the queued bytes.
    pub fn fin(&self) {
        self.fake.with_host(self.fd, |h| h.fin = true);
    }

    /// The peer resets the connection (`errno`, e.g. `ECONNRESET`).
    pub fn reset(&self, errno: i32) {
        self.fake.with_host(self.fd, |h| {
            h.error = Some(errno);
            h.send_error = Some(libc::EPIPE);
        });
    }

    /// The host socket takes at most `bytes` more from sends (`None`: any number).
    pub fn room(&self, bytes: Option<usize>) {
        self.fake.with_host(self.fd, |h| h.room = bytes);
    }

    /// The next connect of the socket fails with `errno` (`EINPROGRESS`: in progress).
    pub fn connect_result(&self, errno: i32) {
        self.fake
            .with_host(self.fd, |h| h.connect_result = Some(errno));
    }

    /// A connect in progress ends: `SO_ERROR` becomes `errno` (0: connected).
    pub fn connect_outcome(&self, errno: i32) {
        self.fake.with_host(self.fd, |h| {
            h.so_error = errno;
            if errno != 0 {
                h.peer = None;
            }
            if h.connecting.is_some() {
                h.connecting = Some(true);
            }
        });
    }

    /// A connect in progress failed, and another call took its error: `SO_ERROR` is
    /// 0 but there is no peer.
    pub fn connect_error_taken(&self) {
        self.fake.with_host(self.fd, |h| {
            h.so_error = 0;
            h.peer = None;
            if h.connecting.is_some() {
                h.connecting = Some(true);
            }
        });
    }

    /// A connection from `peer` waits on listener the socket's host socket.
    pub fn connection(&self, peer: SocketAddr) {
        let conn = self
            .fake
            .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
            .expect("fake fd");
        self.fake
            .with_host(self.fd, |h| h.backlog.push_back((conn, peer)));
    }

    /// What the server did on the socket's host socket so far.
    pub fn view(&self) -> HostView {
        self.fake.with_host(self.fd, |h| HostView {
            sent: h.sent.clone(),
            datagrams: h.sent_dgrams.clone(),
            connects: h.connects.clone(),
            unspecs: h.unspecs,
            shut_rd: h.shut_rd,
            shut_wr: h.shut_wr,
            lingered: h.lingered,
        })
    }
}

/// A harness socket's program side ([`Harness::app`]): what the program does with its
/// end of the pair, and what the server did to the pair.
#[derive(Debug)]
pub struct AppSide {
    fake: &'static Fake,
    fd: RawFd,
}

impl AppSide {
    /// The program writes `bytes` straight into its end of the socket's pair (a `write` the
    /// shim cannot see).
    pub fn write(&self, bytes: &[u8]) {
        self.fake.with_pair(self.fd, |p| {
            p.from_app.extend(bytes.iter().map(|b| Seg::Byte(*b)));
        });
    }

    /// The shim fills the program's end of the socket's pair (`WantRoom`, `REQ_FILLED`): the
    /// out-of-band marker, then filler bytes.
    pub fn filler(&self) {
        self.fake.with_pair(self.fd, |p| {
            p.from_app.push_back(Seg::Mark);
            p.from_app.extend(std::iter::repeat_n(Seg::Byte(0), 4096));
        });
    }

    /// The program's end of the socket's pair has room for `bytes` more (`None`: any number).
    pub fn room(&self, bytes: Option<usize>) {
        self.fake.with_pair(self.fd, |p| p.room = bytes);
    }

    /// The program closes its last descriptor of the socket (with unread bytes: `reset`). The
    /// event that tells the server is the caller's to deliver.
    pub fn close(&self) {
        let fd = self.fd;
        let name = self.fake.with_pair(fd, |p| {
            p.reset = !p.to_app.is_empty();
            p.app_closed = true;
            p.name.clone()
        });
        self.fake.st().names.insert(name, false);
    }

    /// What the server did to the socket's pair so far.
    pub fn view(&self) -> PairView {
        self.fake.with_pair(self.fd, |p| PairView {
            to_app: p.to_app.clone(),
            oob: p.oob_to_app.clone(),
            eof: p.shut_wr,
            eof_after: p.eof_at,
            hup: p.shut_rd,
            unread: p.from_app.len(),
            detached: p.orphan,
        })
    }

    /// Takes what the server wrote to the program through the socket's pair (the program
    /// reads it): the room it used is free again.
    pub fn take_output(&self) -> Vec<u8> {
        self.fake.with_pair(self.fd, |p| {
            let out = std::mem::take(&mut p.to_app);
            if let Some(r) = p.room.as_mut() {
                *r += out.len();
            }
            out
        })
    }
}
