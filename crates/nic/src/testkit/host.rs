//! [`FakeHost`]: the host's sockets as the harness models them, behind [`HostIo`].
//!
//! Each socket the server makes is the read end of a pipe (a cheap kernel object the
//! server may register with its epoll and close, as it would a socket); the model keeps
//! the write end, which polls `POLLERR` once the server has closed its end: that is how
//! the model knows a socket was closed. Sockets are never forgotten: a test looks at a
//! closed one as at an open one ([`HostSock`] is its index).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::hostio::HostIo;

fn err<T>(code: i32) -> io::Result<T> {
    Err(io::Error::from_raw_os_error(code))
}

/// A socket of the model (an index, in the order the server made them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostSock(pub usize);

/// What the server did to a host socket, and where it stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostView {
    /// `(domain, type, protocol)` it was made with.
    pub kind: (i32, i32, i32),
    /// Where it was bound (the bond's address), connected to, or (accepted) came from.
    pub bound: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    /// Stream bytes the server sent.
    pub sent: Vec<u8>,
    /// Datagrams (or ICMP messages) the server sent.
    pub datagrams: Vec<Vec<u8>>,
    /// `shutdown(SHUT_WR)` was called: the peer reads the end of the stream.
    pub shut_wr: bool,
    /// `SO_LINGER` 0 was set: its close resets the connection.
    pub lingered: bool,
    pub no_delay: bool,
    /// The server has closed it.
    pub closed: bool,
}

#[derive(Debug)]
struct Model {
    /// The write end of the pipe whose read end the server holds.
    probe: OwnedFd,
    view: HostView,
    listening: bool,
    /// Connections waiting on a listener: the server's end and its model.
    backlog: VecDeque<(OwnedFd, usize)>,
    /// A connect under way.
    connecting: bool,
    so_error: i32,
    rx: VecDeque<u8>,
    dgrams: VecDeque<Vec<u8>>,
    fin: bool,
    /// A reset arrived: reads report it once, then the stream ends.
    error: Option<i32>,
    /// Bytes sends may still put in (`None`: any number).
    room: Option<usize>,
    /// Epoll news not delivered yet.
    events: u32,
}

impl Model {
    fn new(probe: OwnedFd, kind: (i32, i32, i32)) -> Model {
        Model {
            probe,
            view: HostView {
                kind,
                ..HostView::default()
            },
            listening: false,
            backlog: VecDeque::new(),
            connecting: false,
            so_error: 0,
            rx: VecDeque::new(),
            dgrams: VecDeque::new(),
            fin: false,
            error: None,
            room: None,
            events: 0,
        }
    }

    fn stream(&self) -> bool {
        self.view.kind.1 == libc::SOCK_STREAM
    }

    /// Whether the server has closed its end.
    fn closed(&mut self) -> bool {
        if !self.view.closed {
            let r = ferry_sys::poll_now(self.probe.as_fd(), libc::POLLOUT).unwrap_or(0);
            self.view.closed = r & libc::POLLERR != 0;
        }
        self.view.closed
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.stream() {
            let Some(d) = self.dgrams.pop_front() else {
                return err(libc::EAGAIN);
            };
            let n = d.len().min(buf.len());
            buf[..n].copy_from_slice(&d[..n]);
            return Ok(n);
        }
        if self.rx.is_empty() {
            if let Some(e) = self.error.take() {
                self.fin = true;
                return err(e);
            }
            return if self.fin { Ok(0) } else { err(libc::EAGAIN) };
        }
        let n = self.rx.len().min(buf.len());
        for (b, x) in buf.iter_mut().zip(self.rx.drain(..n)) {
            *b = x;
        }
        Ok(n)
    }

    fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.stream() {
            self.view.datagrams.push(buf.to_vec());
            return Ok(buf.len());
        }
        if self.error.is_some() || self.view.shut_wr {
            return err(libc::EPIPE);
        }
        let n = self.room.map_or(buf.len(), |r| r.min(buf.len()));
        if n == 0 && !buf.is_empty() {
            return err(libc::EAGAIN);
        }
        if let Some(r) = self.room.as_mut() {
            *r -= n;
        }
        self.view.sent.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

#[derive(Debug, Default)]
struct State {
    socks: Vec<Model>,
    /// The open sockets, by the server's descriptor.
    live: HashMap<RawFd, usize>,
    /// What a connect to an address answers (0: at once; `EINPROGRESS`: later).
    connects: HashMap<SocketAddr, i32>,
    /// `socket()` of this type fails with this error.
    refuse: HashMap<(i32, i32), i32>,
}

impl State {
    fn model(&mut self, fd: BorrowedFd<'_>) -> io::Result<&mut Model> {
        let raw = fd.as_raw_fd();
        let i = *self
            .live
            .get(&raw)
            .ok_or(io::Error::from_raw_os_error(libc::EBADF))?;
        if self.socks[i].closed() {
            self.live.remove(&raw);
            return err(libc::EBADF);
        }
        Ok(&mut self.socks[i])
    }

    fn make(&mut self, kind: (i32, i32, i32)) -> io::Result<(OwnedFd, usize)> {
        let (ours, probe) = ferry_sys::pipe_sized(4096)?;
        let i = self.socks.len();
        self.socks.push(Model::new(probe, kind));
        self.live.insert(ours.as_raw_fd(), i);
        Ok((ours, i))
    }
}

/// The model of the host's sockets (see the module's header).
#[derive(Debug, Default)]
pub struct FakeHost {
    st: Mutex<State>,
}

impl FakeHost {
    fn st(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with<R>(&self, s: HostSock, f: impl FnOnce(&mut Model) -> R) -> R {
        let mut st = self.st();
        let m = st.socks.get_mut(s.0).expect("a socket of the model");
        m.closed();
        f(m)
    }

    /// Every socket made so far.
    pub fn all(&self) -> Vec<HostSock> {
        (0..self.st().socks.len()).map(HostSock).collect()
    }

    /// What socket `s` saw.
    pub fn view(&self, s: HostSock) -> HostView {
        self.with(s, |m| m.view.clone())
    }

    /// The latest socket connected to `to`, if any.
    pub fn to(&self, to: SocketAddr) -> Option<HostSock> {
        let mut st = self.st();
        let i = st
            .socks
            .iter()
            .rposition(|m| m.view.peer == Some(to) && !m.listening)?;
        st.socks[i].closed();
        Some(HostSock(i))
    }

    /// A connect to `to` answers `errno` from now on (0: connected at once;
    /// `EINPROGRESS`, the default for streams: later, see [`FakeHost::connect_done`]).
    pub fn script_connect(&self, to: SocketAddr, errno: i32) {
        self.st().connects.insert(to, errno);
    }

    /// `socket()` of `domain` and `protocol` fails with `errno` from now on (0: no more).
    pub fn refuse_sockets(&self, domain: i32, protocol: i32, errno: i32) {
        let mut st = self.st();
        if errno == 0 {
            st.refuse.remove(&(domain, protocol));
        } else {
            st.refuse.insert((domain, protocol), errno);
        }
    }

    /// A connect under way on `s` ends: `errno` 0 connected, else refused.
    pub fn connect_done(&self, s: HostSock, errno: i32) {
        self.with(s, |m| {
            m.connecting = false;
            m.so_error = errno;
            m.events |= (libc::EPOLLOUT
                | if errno != 0 {
                    libc::EPOLLERR | libc::EPOLLHUP
                } else {
                    0
                }) as u32;
        });
    }

    /// Bytes (a stream) arrive on `s`.
    pub fn data(&self, s: HostSock, bytes: &[u8]) {
        self.with(s, |m| {
            m.rx.extend(bytes);
            m.events |= libc::EPOLLIN as u32;
        });
    }

    /// A datagram (or ICMP message, on a ping socket) arrives on `s`.
    pub fn datagram(&self, s: HostSock, bytes: &[u8]) {
        self.with(s, |m| {
            m.dgrams.push_back(bytes.to_vec());
            m.events |= libc::EPOLLIN as u32;
        });
    }

    /// The peer's end of stream arrives on `s` (after its bytes).
    pub fn fin(&self, s: HostSock) {
        self.with(s, |m| {
            m.fin = true;
            m.events |= (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        });
    }

    /// The peer resets `s` (`ECONNRESET`).
    pub fn reset(&self, s: HostSock) {
        self.with(s, |m| {
            m.error = Some(libc::ECONNRESET);
            m.events |= (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32;
        });
    }

    /// `s` takes at most `bytes` more from sends (`None`: any number).
    pub fn room(&self, s: HostSock, bytes: Option<usize>) {
        self.with(s, |m| {
            m.room = bytes;
            m.events |= libc::EPOLLOUT as u32;
        });
    }

    /// A connection from `client` waits on the listener bound to `at`; its socket.
    pub fn incoming(&self, at: SocketAddr, client: SocketAddr) -> HostSock {
        let mut st = self.st();
        let l = st
            .socks
            .iter()
            .rposition(|m| m.listening && m.view.bound == Some(at))
            .expect("a listener on that address");
        let domain = st.socks[l].view.kind.0;
        let (fd, i) = st
            .make((domain, libc::SOCK_STREAM, 0))
            .expect("a pipe for the connection");
        st.live.remove(&fd.as_raw_fd());
        st.socks[i].view.peer = Some(client);
        st.socks[l].backlog.push_back((fd, i));
        st.socks[l].events |= libc::EPOLLIN as u32;
        HostSock(i)
    }

    /// The epoll news of every open socket not delivered yet, taken: (server's
    /// descriptor, events).
    pub fn take_events(&self) -> Vec<(RawFd, u32)> {
        let mut st = self.st();
        let live: Vec<(RawFd, usize)> = st.live.iter().map(|(f, i)| (*f, *i)).collect();
        let mut out = Vec::new();
        for (fd, i) in live {
            let m = &mut st.socks[i];
            if m.closed() {
                st.live.remove(&fd);
                continue;
            }
            if m.events != 0 {
                out.push((fd, std::mem::take(&mut m.events)));
            }
        }
        out.sort_unstable();
        out
    }

    /// Sockets the server holds open now (listeners included, connections not
    /// accepted yet not).
    pub fn open(&self) -> Vec<HostSock> {
        let mut st = self.st();
        let waiting: Vec<usize> = st
            .socks
            .iter()
            .flat_map(|m| m.backlog.iter().map(|(_, i)| *i))
            .collect();
        st.socks
            .iter_mut()
            .enumerate()
            .filter_map(|(i, m)| (!m.closed() && !waiting.contains(&i)).then_some(HostSock(i)))
            .collect()
    }
}

impl HostIo for FakeHost {
    fn socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
        let mut st = self.st();
        if let Some(e) = st.refuse.get(&(domain, protocol)) {
            return err(*e);
        }
        st.make((domain, ty, protocol)).map(|(fd, _)| fd)
    }

    fn bind(&self, fd: BorrowedFd<'_>, at: &SocketAddr) -> io::Result<()> {
        self.st().model(fd)?.view.bound = Some(*at);
        Ok(())
    }

    fn connect(&self, fd: BorrowedFd<'_>, to: &SocketAddr) -> io::Result<()> {
        let mut st = self.st();
        let scripted = st.connects.get(to).copied();
        let m = st.model(fd)?;
        m.view.peer = Some(*to);
        let answer = scripted.unwrap_or(if m.stream() { libc::EINPROGRESS } else { 0 });
        match answer {
            0 => Ok(()),
            libc::EINPROGRESS => {
                m.connecting = true;
                err(libc::EINPROGRESS)
            }
            e => err(e),
        }
    }

    fn connect_result(&self, fd: BorrowedFd<'_>) -> io::Result<i32> {
        // Read once, as the kernel's `SO_ERROR`.
        Ok(std::mem::take(&mut self.st().model(fd)?.so_error))
    }

    fn no_delay(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.st().model(fd)?.view.no_delay = true;
        Ok(())
    }

    fn send(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
        self.st().model(fd)?.send(buf)
    }

    fn recv(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
        self.st().model(fd)?.recv(buf)
    }

    fn shutdown_write(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.st().model(fd)?.view.shut_wr = true;
        Ok(())
    }

    fn linger_reset(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.st().model(fd)?.view.lingered = true;
        Ok(())
    }

    fn listener(&self, at: &SocketAddr) -> io::Result<OwnedFd> {
        let domain = if at.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let mut st = self.st();
        let (fd, i) = st.make((domain, libc::SOCK_STREAM, 0))?;
        st.socks[i].listening = true;
        st.socks[i].view.bound = Some(*at);
        Ok(fd)
    }

    fn accept(&self, fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
        let mut st = self.st();
        let (conn, i) = st
            .model(fd)?
            .backlog
            .pop_front()
            .ok_or(io::Error::from_raw_os_error(libc::EAGAIN))?;
        st.live.insert(conn.as_raw_fd(), i);
        Ok((conn, st.socks[i].view.peer))
    }

    fn peer(&self, fd: BorrowedFd<'_>) -> io::Result<Option<SocketAddr>> {
        Ok(self.st().model(fd)?.view.peer)
    }
}
