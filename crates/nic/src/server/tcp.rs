//! TCP flows once they carry bytes: a stack socket (the sandbox's end) and a host
//! socket, with the bytes moved between them ([`pump`]) and the flow's [`Phase`] moved
//! by what passes (`phase.rs`). A flow becomes one when its host connect succeeds
//! ([`NicServer::establish`], from `pending.rs`) or when a published connection comes
//! (`published.rs`); it ends when its stack socket is done ([`NicServer::end_tcp`]).
//!
//! Bytes move between the stack socket's buffers and the host socket with no other
//! copy; a full buffer on either side stops reading the other (back-pressure is the TCP
//! window). An end of stream on one side is a FIN or a `shutdown(SHUT_WR)` on the
//! other; a reset or a failure on one side resets the other.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use ferry_egress::Lease;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;

use super::NicServer;
use super::flows::{Flow, FlowTable, Key};
use super::phase::{Move, Phase};
use super::stack::Stack;
use crate::hostio::HostIo;
use crate::timing::{Stage, Timing};

/// A TCP flow: a stack socket (the sandbox's end) and a host socket.
#[derive(Debug)]
pub(crate) struct TcpFlow {
    pub handle: SocketHandle,
    pub host: OwnedFd,
    /// What the sandbox opened; `None` for published connections.
    pub key: Option<Key>,
    pub phase: Phase,
    /// The host socket's readiness as edge-triggered epoll last told it (cleared when
    /// a call would block).
    pub readable: bool,
    pub writable: bool,
    pub lease: Option<Lease>,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl TcpFlow {
    /// A flow in `phase` on stack socket `handle` and host socket `host`.
    pub fn new(handle: SocketHandle, host: OwnedFd, key: Option<Key>, phase: Phase) -> TcpFlow {
        TcpFlow {
            handle,
            host,
            key,
            phase,
            readable: true,
            writable: true,
            lease: None,
            bytes_out: 0,
            bytes_in: 0,
        }
    }
}

/// What one move between a host socket and a stack socket's buffer did.
enum Step {
    /// `n` bytes moved (0: the host side's end of stream).
    Moved(usize),
    /// The host socket would block.
    Blocked,
    /// The host socket failed: the connection is reset.
    Failed,
    /// The stack socket takes or gives nothing now.
    Stopped,
}

impl Step {
    fn of<E>(r: Result<io::Result<usize>, E>) -> Step {
        match r {
            Ok(Ok(n)) => Step::Moved(n),
            Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => Step::Blocked,
            Ok(Err(_)) => Step::Failed,
            Err(_) => Step::Stopped,
        }
    }
}

/// A host call's result as what a stack buffer's closure returns: bytes taken or given.
fn taken(r: io::Result<usize>) -> (usize, io::Result<usize>) {
    (*r.as_ref().unwrap_or(&0), r)
}

/// Moves what it can between flow `f`'s host socket and its stack socket `s`; whether
/// anything moved (bytes, an end, a reset).
pub(crate) fn pump(
    f: &mut TcpFlow,
    s: &mut tcp::Socket<'_>,
    io: &dyn HostIo,
    timing: &mut Timing,
) -> bool {
    if f.phase.calling().is_some() && s.may_send() {
        // The sandbox answered a published connection.
        f.phase.make(Move::Answered);
    }
    match to_host(f, s, io, timing) {
        Some(moved) => moved | to_sandbox(f, s, io, timing),
        None => true,
    }
}

/// Sandbox → host: the stack's received bytes, then its FIN; `None` when the host
/// socket failed (the stack socket is reset).
fn to_host(
    f: &mut TcpFlow,
    s: &mut tcp::Socket<'_>,
    io: &dyn HostIo,
    timing: &mut Timing,
) -> Option<bool> {
    let mut moved = false;
    while f.writable && s.can_recv() {
        let host = f.host.as_fd();
        let sent = s.recv(|b| {
            let t0 = timing.start();
            let r = io.send(host, b);
            timing.end(Stage::HostSend, t0, matches!(r, Ok(n) if n > 0));
            taken(r)
        });
        match Step::of(sent) {
            Step::Moved(n) => {
                f.bytes_out += n as u64;
                moved = true;
            }
            Step::Blocked => f.writable = false,
            Step::Failed => {
                s.abort();
                return None;
            }
            Step::Stopped => break,
        }
    }
    let fin_in = matches!(
        s.state(),
        tcp::State::CloseWait | tcp::State::LastAck | tcp::State::Closing | tcp::State::TimeWait
    );
    if !f.phase.sandbox_done() && !s.can_recv() && fin_in && f.phase.make(Move::SandboxFin) {
        let _ = io.shutdown_write(f.host.as_fd());
        moved = true;
    }
    Some(moved)
}

/// Host → sandbox: the host's bytes into the stack, then its end of stream (the stack
/// closes: a FIN).
fn to_sandbox(
    f: &mut TcpFlow,
    s: &mut tcp::Socket<'_>,
    io: &dyn HostIo,
    timing: &mut Timing,
) -> bool {
    let mut moved = false;
    while f.readable && !f.phase.host_done() && s.can_send() {
        let host = f.host.as_fd();
        let mut room = 0;
        let got = s.send(|b| {
            room = b.len();
            let t0 = timing.start();
            let r = io.recv(host, b);
            timing.end(Stage::HostRecv, t0, matches!(r, Ok(n) if n > 0));
            taken(r)
        });
        match Step::of(got) {
            Step::Moved(0) => {
                f.phase.make(Move::HostFin);
                s.close();
                moved = true;
            }
            Step::Moved(n) => {
                f.bytes_in += n as u64;
                moved = true;
                if n < room {
                    // The host socket had no more just now: the stack sends these
                    // bytes first; the next pump reads on (to its end of stream or
                    // "would block"), after the frame has gone.
                    break;
                }
            }
            Step::Blocked => f.readable = false,
            Step::Failed => {
                s.abort();
                return true;
            }
            Step::Stopped => break,
        }
    }
    moved
}

/// Whether flow `f`'s bytes wait for one side to take what the other holds (as the
/// last pump left it): the host's behind a full stack buffer towards the sandbox, or the
/// sandbox's behind a host socket that takes no more. Bulk, not a round trip: the side
/// that must move next has a buffer's worth of work already.
pub(crate) fn backlogged(f: &TcpFlow, s: &tcp::Socket<'_>) -> bool {
    let to_sandbox_full =
        s.may_send() && s.send_queue() == s.send_capacity() && f.readable && !f.phase.host_done();
    to_sandbox_full || (!f.writable && s.can_recv())
}

/// What [`pump_all`] did: whether any bytes moved, whether any flow is
/// [`backlogged`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pumped {
    pub moved: bool,
    pub backlogged: bool,
}

/// Moves bytes between every open TCP flow's two sockets.
pub(crate) fn pump_all(
    flows: &mut FlowTable,
    stack: &mut Stack,
    io: &dyn HostIo,
    timing: &mut Timing,
) -> Pumped {
    let mut p = Pumped::default();
    for f in flows.values_mut() {
        if let Flow::Tcp(f) = f {
            let s = stack.get_mut(f.handle);
            p.moved |= pump(f, s, io, timing);
            p.backlogged |= backlogged(f, s);
        }
    }
    p
}

/// Whether a stack socket in `state` is done: closed (reset either way), in TIME-WAIT,
/// or listening again (the stack never took the sandbox's SYN, or the sandbox reset the
/// handshake: nothing more will come of it).
pub(crate) fn done(state: tcp::State) -> bool {
    matches!(
        state,
        tcp::State::Closed | tcp::State::TimeWait | tcp::State::Listen
    )
}

impl NicServer {
    /// Flow `id` (keyed `key`, host socket `host` connected) from now on carried by a
    /// stack socket listening on its destination, to take the sandbox's SYN. Whether it
    /// could be made (else the flow is gone).
    pub(super) fn establish(
        &mut self,
        id: u64,
        key: Key,
        host: OwnedFd,
        lease: Option<Lease>,
    ) -> bool {
        let Some(handle) = self.stack.listen(key.remote) else {
            self.stats.malformed += 1;
            let _ = self.epoll.delete(host.as_fd());
            return false;
        };
        let mut f = TcpFlow::new(handle, host, Some(key), Phase::Open);
        f.lease = lease;
        self.add_flow(id, Flow::Tcp(f));
        true
    }

    /// Ends TCP flow `f` (its stack socket done, already out of the table): a cut
    /// connection is reset on the host, a published one the sandbox never answered is
    /// asked again or reset, the bytes are counted.
    pub(super) fn end_tcp(&mut self, mut f: TcpFlow) {
        let _ = self.epoll.delete(f.host.as_fd());
        // Closed or listening: reset (by the sandbox, by us), or never taken.
        let closed = matches!(
            self.stack.state(f.handle),
            tcp::State::Closed | tcp::State::Listen
        );
        self.stack.remove(f.handle);
        if let Some(u) = f.phase.calling() {
            let now = self.clock.now();
            self.published.unanswered(&*self.io, f.host, u, now);
            return;
        }
        if closed && f.phase != Phase::BothDone {
            let _ = self.io.linger_reset(f.host.as_fd());
        }
        if let Some(l) = f.lease.as_mut() {
            l.set_bytes(f.bytes_out, f.bytes_in);
        }
        self.stats.bytes_out += f.bytes_out;
        self.stats.bytes_in += f.bytes_in;
    }
}
