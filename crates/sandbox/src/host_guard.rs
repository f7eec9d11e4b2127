//! The hand-off guard (`Spec::guard_host_sockets`, ferry's `--handoff`): a handed-off
//! socket is the host's own connected TCP socket, put into the command at its fd
//! number; the guard keeps it from being re-aimed (docs/DESIGN.md, "Hand-off").
//!
//! Theory of operation. Whoever holds a socket of the host's network namespace can
//! dissolve its connection (`connect` with `AF_UNSPEC`) and connect it anywhere the host
//! reaches (the host's loopback services, destinations the policy denies), `bind` and
//! `listen` on the host, connect it implicitly (`MSG_FASTOPEN` on a send) or route it
//! through other hosts (`IP_OPTIONS`, `IPV6_RTHDR`). Options that need privilege over
//! the host's network are checked against the user namespace that owns it, which the
//! command's is not: they fail already. So the command's filter ([`filter`], in place of
//! the socket watch's and with it) fails fast-open sends and those two options with
//! `EPERM` for every socket (no judgement, nothing to race), fails `io_uring_setup`
//! (`ENOSYS`: io_uring's connect, bind and listen bypass seccomp) and `clone3`
//! (`ENOSYS`: libc falls back to `clone`), refuses a `clone` that would share a
//! descriptor table between two processes (`CLONE_FILES` without `CLONE_THREAD`),
//! kills a process that makes a system call of another architecture (a 32-bit
//! program's `socketcall` would name none of these calls), and makes `connect`, `bind`
//! and `listen` user notifications, which the init answers ([`Guard::answer`]).
//!
//! The init never judges a descriptor number or an address and then lets the kernel
//! look again (`SECCOMP_USER_NOTIF_FLAG_CONTINUE` would: another thread could `dup2` a
//! handed-off socket onto the number, or rewrite the address, in between). It takes
//! the caller's file (`pidfd_getfd`: a copy of the descriptor, the same open file)
//! and asks the kernel what it is:
//!
//! - an inet socket of another network namespace than the sandbox's
//!   (`SO_NETNS_COOKIE`): a handed-off one, `EPERM` (a `connect` that would not move
//!   it, `EISCONN`/`EALREADY` as the kernel's, [`host_connect`]); not a socket:
//!   `ENOTSOCK`; gone: `EBADF`;
//! - an inet socket of the sandbox: the init makes the call itself, on its copy, with
//!   the address it read once from the caller (`process_vm_readv`); the result is the
//!   answer. A TCP connect that may be a hand-off is first asked about (handoff.rs):
//!   kept until ferry's side answers with a host socket, which the init puts at the
//!   caller's fd number (carry.rs), or with "not a hand-off". A port below `ip_unprivileged_port_start` is refused as the kernel would
//!   refuse the command (which has no privilege over the sandbox's namespace, the
//!   init's). A blocking connect is begun without waiting (`O_NONBLOCK` for the call)
//!   and kept in a table of [`PENDING`] until the copy polls writable; then finished
//!   as the kernel would finish it (`SO_ERROR`, one more `connect`). `SO_SNDTIMEO` is
//!   not honoured for it. A full table answers `EAGAIN`;
//! - a socket of another family (unix, netlink, …): never a host socket. If no other
//!   task shares the caller's descriptor table ([`private_table`]: none of its threads
//!   does, by `kcmp`, and no other process can, by the filter), nobody can change what
//!   the number names before the kernel makes the call, and whatever address the
//!   kernel then reads is for that socket: the call proceeds. Otherwise a stand-in
//!   (stand_in.rs) makes it on the copy in the caller's view, and its result is the
//!   answer.
//!
//! So every answer is about the file the init judged, and every address the kernel
//! uses on a sandbox inet socket is the one the init read: no swap or rewrite changes a
//! decision. Kept calls whose caller stops waiting (killed, or interrupted by a
//! signal: the kernel then makes the call again, judged anew) are dropped.

use libc::{c_int, sock_filter};

use crate::sys::errno;
use crate::watch::X32_SYSCALL_BIT;

/// `SO_NETNS_COOKIE` (Linux 5.14; not in the libc crate).
const SO_NETNS_COOKIE: c_int = 71;
/// `PIDFD_THREAD` (Linux 6.9: a pidfd of a thread, not only of a process leader).
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// Where a jump goes: an action, or a named block of [`program`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum To {
    Allow,
    Notify,
    Eperm,
    Enosys,
    Kill,
    /// The next instruction.
    Next,
    Block(Block),
}

/// The blocks of [`program`] that look at arguments.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Block {
    Calls,
    Socket,
    /// Flags in argument 3 (`sendto`, `sendmmsg`).
    Flags3,
    /// Flags in argument 2 (`sendmsg`).
    Flags2,
    Setsockopt,
    SetsockoptV6,
    /// `clone`'s flags (argument 0).
    Clone,
}

/// One instruction, jumps by name.
#[derive(Clone, Copy, Debug)]
enum Op {
    Label(Block),
    Load(u32),
    And(u32),
    Eq(u32, To, To),
    Ret(To),
}

/// `seccomp_data`: nr at 0, arch at 4, args[i] at 16 + 8i (their low halves on
/// little-endian machines; the arguments compared are ints).
const fn arg(i: u32) -> u32 {
    16 + 8 * i
}

/// The program: see the module's docs. `tell`: `socket` with an inet family notifies
/// too (the socket watch's call).
fn program(arch: u32, tell: bool) -> Vec<Op> {
    use Block::*;
    let socket = if tell { To::Block(Socket) } else { To::Allow };
    let calls: [(i64, To); 10] = [
        (libc::SYS_clone, To::Block(Clone)),
        (libc::SYS_clone3, To::Enosys),
        (libc::SYS_connect, To::Notify),
        (libc::SYS_bind, To::Notify),
        (libc::SYS_listen, To::Notify),
        (libc::SYS_sendto, To::Block(Flags3)),
        (libc::SYS_sendmmsg, To::Block(Flags3)),
        (libc::SYS_sendmsg, To::Block(Flags2)),
        (libc::SYS_setsockopt, To::Block(Setsockopt)),
        (libc::SYS_io_uring_setup, To::Enosys),
    ];
    let mut p = vec![
        Op::Load(4),
        Op::Eq(arch, To::Block(Calls), To::Kill),
        Op::Label(Calls),
        Op::Load(0),
    ];
    for (nr, to) in [(libc::SYS_socket, socket)].into_iter().chain(calls) {
        let nr = nr as u32;
        p.push(Op::Eq(nr, to, To::Next));
        p.push(Op::Eq(nr | X32_SYSCALL_BIT, to, To::Next));
    }
    p.push(Op::Ret(To::Allow));
    let fastopen = libc::MSG_FASTOPEN as u32;
    p.extend([
        Op::Label(Socket),
        Op::Load(arg(0)),
        Op::Eq(libc::AF_INET as u32, To::Notify, To::Next),
        Op::Eq(libc::AF_INET6 as u32, To::Notify, To::Allow),
        Op::Label(Flags3),
        Op::Load(arg(3)),
        Op::And(fastopen),
        Op::Eq(0, To::Allow, To::Eperm),
        Op::Label(Flags2),
        Op::Load(arg(2)),
        Op::And(fastopen),
        Op::Eq(0, To::Allow, To::Eperm),
        Op::Label(Setsockopt),
        Op::Load(arg(1)),
        Op::Eq(libc::IPPROTO_IPV6 as u32, To::Block(SetsockoptV6), To::Next),
        Op::Eq(libc::IPPROTO_IP as u32, To::Next, To::Allow),
        Op::Load(arg(2)),
        Op::Eq(libc::IP_OPTIONS as u32, To::Eperm, To::Allow),
        Op::Label(SetsockoptV6),
        Op::Load(arg(2)),
        Op::Eq(libc::IPV6_RTHDR as u32, To::Eperm, To::Allow),
        // A descriptor table shared by tasks of two processes: refused, so that only
        // threads of one process share one (`private_table` counts on it).
        Op::Label(Clone),
        Op::Load(arg(0)),
        Op::And((libc::CLONE_FILES | libc::CLONE_THREAD) as u32),
        Op::Eq(libc::CLONE_FILES as u32, To::Eperm, To::Allow),
    ]);
    p
}

/// [`program`] for `arch` as BPF (labels resolved; jumps are forward and relative; the
/// actions are the last five instructions).
pub(crate) fn filter(arch: u32, tell: bool) -> Vec<sock_filter> {
    let ops: Vec<Op> = program(arch, tell);
    let code: Vec<Op> = ops
        .iter()
        .copied()
        .filter(|o| !matches!(o, Op::Label(_)))
        .collect();
    // Index of each label's next instruction, in `code`.
    let mut at = Vec::new();
    let mut n = 0;
    for o in &ops {
        match o {
            Op::Label(b) => at.push((*b, n)),
            _ => n += 1,
        }
    }
    let actions = [To::Allow, To::Notify, To::Eperm, To::Enosys, To::Kill];
    let end = code.len();
    let index = |to: To, i: usize| -> usize {
        match to {
            To::Next => i + 1,
            To::Block(b) => at.iter().find(|(l, _)| *l == b).map_or(end, |(_, n)| *n),
            action => end + actions.iter().position(|a| *a == action).unwrap_or(0),
        }
    };
    let ret = |to: To| match to {
        To::Allow => libc::SECCOMP_RET_ALLOW,
        To::Notify => libc::SECCOMP_RET_USER_NOTIF,
        To::Eperm => libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        To::Enosys => libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        _ => libc::SECCOMP_RET_KILL_PROCESS,
    };
    let ins = |code: u32, jt: u8, jf: u8, k: u32| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let mut out = Vec::with_capacity(end + actions.len());
    for (i, op) in code.iter().enumerate() {
        // Targets are later instructions of this short program: the offsets fit a u8.
        let rel = |to: To| (index(to, i) - i - 1) as u8;
        out.push(match *op {
            Op::Load(k) => ins(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, k),
            Op::And(k) => ins(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 0, 0, k),
            Op::Eq(k, yes, no) => ins(
                libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
                rel(yes),
                rel(no),
                k,
            ),
            Op::Ret(to) => ins(libc::BPF_RET | libc::BPF_K, 0, 0, ret(to)),
            Op::Label(_) => unreachable!("labels were removed"),
        });
    }
    for a in actions {
        out.push(ins(libc::BPF_RET | libc::BPF_K, 0, 0, ret(a)));
    }
    out
}

/// The sandbox's network namespace as `SO_NETNS_COOKIE` names it (the init's own), or
/// `None` on kernels before 5.14 (then every inet socket counts as the host's).
pub(crate) fn own_netns_cookie() -> Option<u64> {
    // SAFETY: socket(2) with integer arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    let cookie = netns_cookie(fd);
    // SAFETY: our socket, closed once.
    unsafe { libc::close(fd) };
    cookie
}

fn netns_cookie(fd: c_int) -> Option<u64> {
    let mut v = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live local.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

fn int_opt(fd: c_int, name: c_int) -> Result<c_int, c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live local.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut v).cast(), &mut len) };
    if r == 0 { Ok(v) } else { Err(errno()) }
}

/// What kind of socket a call is on, judged on the init's copy of the caller's file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An inet socket of the sandbox: the init makes the call on its copy.
    SandboxInet,
    /// Another family (unix, netlink, …): never a host socket.
    NotInet,
    /// An inet socket of another namespace (a handed-off one): never re-aimed; a
    /// `connect` on it learns what the kernel would say without one being made
    /// ([`host_connect`]), every other call `EPERM`.
    Host,
    /// Refused with this errno: not a socket (`ENOTSOCK`), unreadable (`EPERM`).
    Refused(c_int),
}

/// The kind of `fd` (the init's duplicate of the caller's descriptor): `own` is the
/// sandbox's namespace cookie.
fn kind_of(fd: c_int, own: Option<u64>) -> Kind {
    let domain = match int_opt(fd, libc::SO_DOMAIN) {
        Ok(d) => d,
        Err(libc::ENOTSOCK) => return Kind::Refused(libc::ENOTSOCK),
        Err(_) => return Kind::Refused(libc::EPERM),
    };
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Kind::NotInet;
    }
    match (netns_cookie(fd), own) {
        (Some(c), Some(o)) if c == o => Kind::SandboxInet,
        (Some(_), Some(_)) => Kind::Host,
        _ => Kind::Refused(libc::EPERM),
    }
}

/// The answer to a `connect` on host socket `fd` (a handed-off one) to an address of
/// family `family` (`None`: shorter than a family): what the kernel answers a connect
/// that cannot move the socket — `EISCONN` once connected, `EALREADY` while
/// connecting — and `EPERM` for every connect that would move it (`AF_UNSPEC`
/// dissolves the connection, and a closed socket would connect anew). Nothing is made
/// on the socket: only its state is read.
fn host_connect(fd: c_int, family: Option<c_int>) -> c_int {
    if matches!(family, None | Some(libc::AF_UNSPEC)) {
        return libc::EPERM;
    }
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, a live local.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    // tcp_info's first byte is the state (include/net/tcp_states.h).
    const SYN_SENT: u8 = 2;
    const CLOSE: u8 = 7;
    const LISTEN: u8 = 10;
    match (r, len, info[0]) {
        (0, 1.., SYN_SENT) => libc::EALREADY,
        (0, 1.., CLOSE | LISTEN) => libc::EPERM,
        (0, 1.., _) => libc::EISCONN,
        _ => libc::EPERM,
    }
}

/// A call the guard judges (argument 0 is the descriptor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Connect,
    Bind,
    Listen,
}

impl Call {
    fn of(nr: c_int) -> Option<Call> {
        match i64::from(nr & !(X32_SYSCALL_BIT as c_int)) {
            libc::SYS_connect => Some(Call::Connect),
            libc::SYS_bind => Some(Call::Bind),
            libc::SYS_listen => Some(Call::Listen),
            _ => None,
        }
    }
}

/// The longest address a call takes (`sockaddr_storage`; the kernel refuses longer).
pub(crate) const ADDR_MAX: usize = 128;

/// The address a call names, copied once from the caller's memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Addr {
    pub bytes: [u8; ADDR_MAX],
    pub len: u32,
}

impl Addr {
    const NONE: Addr = Addr {
        bytes: [0; ADDR_MAX],
        len: 0,
    };

    fn ptr(&self) -> *const libc::sockaddr {
        self.bytes.as_ptr().cast()
    }

    /// The address family (`None`: the address is shorter than one).
    fn family(&self) -> Option<c_int> {
        (self.len >= 2).then(|| c_int::from(u16::from_ne_bytes([self.bytes[0], self.bytes[1]])))
    }

    /// The port of an inet address (0 for others).
    fn inet_port(&self) -> u16 {
        let family = c_int::from(u16::from_ne_bytes([self.bytes[0], self.bytes[1]]));
        let inet = family == libc::AF_INET || family == libc::AF_INET6;
        if inet && self.len >= 4 {
            u16::from_be_bytes([self.bytes[2], self.bytes[3]])
        } else {
            0
        }
    }
}

/// `connect`, `bind` or `listen` on `fd` with `addr` (the backlog is `backlog`):
/// the call's result, 0 or `-errno`.
pub(crate) fn make(call: Call, fd: c_int, addr: &Addr, backlog: c_int) -> i64 {
    // SAFETY: addr.bytes holds addr.len (≤ ADDR_MAX) initialised bytes; the kernel
    // copies them before returning.
    let r = unsafe {
        match call {
            Call::Connect => libc::connect(fd, addr.ptr(), addr.len),
            Call::Bind => libc::bind(fd, addr.ptr(), addr.len),
            Call::Listen => libc::listen(fd, backlog),
        }
    };
    if r == 0 { 0 } else { -i64::from(errno()) }
}

/// Calls the guard keeps while they wait: blocking connects it began, calls a stand-in
/// makes (stand_in.rs). Past that, a call that would wait gets `EAGAIN`.
pub(crate) const PENDING: usize = 32;

/// What a kept call waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// A blocking connect the init began on its copy `fd`: `fd` polls writable.
    Connect,
    /// A stand-in (its pidfd) makes the call; its result comes on the pipe `fd`.
    StandIn { pidfd: c_int },
    /// A connect on a sandbox TCP socket (the init's copy `copy`, at fd number
    /// `target` of thread `tid`) asked about (handoff.rs): the answer comes on `fd`,
    /// asked at `since` (ms).
    Ask {
        copy: c_int,
        tid: u32,
        target: c_int,
        since: u64,
    },
    /// A blocking connect handed off: the host socket `fd` connects; put in place of
    /// `copy` once connected.
    HostConnect {
        copy: c_int,
        tid: u32,
        target: c_int,
    },
}

/// A kept call: notification `id`, the fd polled, and (for a connect) the address.
#[derive(Clone, Copy, Debug)]
struct Pending {
    id: u64,
    fd: c_int,
    wait: Wait,
    addr: Addr,
}

/// What the init answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The call's result: 0 or `-errno`.
    Done(i64),
    /// The call proceeds in the kernel: only for a socket of another family whose
    /// caller's descriptor table no other task shares ([`private_table`]).
    Continue,
    /// Kept in the table; answered when it ends.
    Kept,
}

/// The guard's state in the init: the sandbox's namespace cookie, its lowest
/// unprivileged port, the calls kept.
#[derive(Debug)]
pub(crate) struct Guard {
    own: Option<u64>,
    low_ports: u16,
    pending: [Option<Pending>; PENDING],
    /// The hand-off's request path (handoff.rs; -1: none), non-blocking.
    requests: c_int,
    /// The destinations worth asking about (None: every one).
    scope: Option<crate::handoff::HandoffScope>,
    /// A new TCP socket's values of [`crate::handoff::CARRIED_OPTS`] (-1: unreadable).
    defaults: [c_int; crate::handoff::MAX_OPTS],
}

impl Guard {
    /// In the init, in the sandbox's network namespace; `requests` is the hand-off's
    /// request path (-1: none).
    pub(crate) fn new(requests: c_int, scope: Option<crate::handoff::HandoffScope>) -> Guard {
        if requests >= 0 {
            // SAFETY: fcntl(2) with integer arguments on our descriptor.
            unsafe {
                let flags = libc::fcntl(requests, libc::F_GETFL);
                libc::fcntl(requests, libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
        }
        Guard {
            own: own_netns_cookie(),
            low_ports: unprivileged_port_start(),
            pending: [None; PENDING],
            requests,
            scope,
            defaults: new_socket_options(),
        }
    }

    /// Answers notification `req` (a call on a descriptor, argument 0) on `listener`,
    /// now or, for a call that waits, later ([`Guard::serve_pending`]).
    pub(crate) fn answer(&mut self, listener: c_int, req: &libc::seccomp_notif) {
        let verdict = match Call::of(req.data.nr) {
            Some(call) => self.judge(listener, req, call),
            None => Verdict::Done(-i64::from(libc::ENOSYS)),
        };
        match verdict {
            Verdict::Done(v) => respond(listener, req.id, v),
            Verdict::Continue => proceed(listener, req.id),
            Verdict::Kept => {}
        }
    }

    fn judge(&mut self, listener: c_int, req: &libc::seccomp_notif, call: Call) -> Verdict {
        let fd = req.data.args[0] as u32 as c_int;
        let copy = match their_fd(listener, req, fd) {
            Ok(copy) => copy,
            Err(e) => return Verdict::Done(-i64::from(e)),
        };
        let backlog = req.data.args[1] as u32 as c_int;
        match kind_of(copy.raw(), self.own) {
            Kind::Refused(e) => Verdict::Done(-i64::from(e)),
            Kind::Host if call == Call::Connect => match read_addr(listener, req) {
                Ok(addr) => Verdict::Done(-i64::from(host_connect(copy.raw(), addr.family()))),
                Err(e) => Verdict::Done(-i64::from(e)),
            },
            Kind::Host => Verdict::Done(-i64::from(libc::EPERM)),
            Kind::SandboxInet if call == Call::Listen => {
                Verdict::Done(make(call, copy.raw(), &Addr::NONE, backlog))
            }
            Kind::SandboxInet => match read_addr(listener, req) {
                Ok(addr) if call == Call::Bind => self.bind(req.pid, copy.raw(), &addr),
                Ok(addr) => self.connect_or_ask(req, copy, addr),
                Err(e) => Verdict::Done(-i64::from(e)),
            },
            Kind::NotInet if private_table(req.pid) => Verdict::Continue,
            Kind::NotInet => {
                let addr = match call {
                    Call::Listen => Ok(Addr::NONE),
                    _ => read_addr(listener, req),
                };
                match addr {
                    Ok(addr) => self.stand_in(req, call, copy.raw(), &addr, backlog),
                    Err(e) => Verdict::Done(-i64::from(e)),
                }
            }
        }
    }

    /// `bind` on the init's copy, refused as the kernel would refuse the caller a port
    /// below `ip_unprivileged_port_start` (the init may bind those; the command, in a
    /// user namespace of its own, may not).
    fn bind(&self, tid: u32, fd: c_int, addr: &Addr) -> Verdict {
        let port = addr.inet_port();
        if port != 0 && port < self.low_ports && !may_bind_low(tid) {
            return Verdict::Done(-i64::from(libc::EACCES));
        }
        Verdict::Done(make(Call::Bind, fd, addr, 0))
    }

    /// A connect on a sandbox inet socket: one that may be a hand-off (a TCP socket not
    /// bound nor connected, to an inet address of its family) is asked about first
    /// (handoff.rs) and kept until the answer comes; otherwise, or when it cannot be
    /// asked (no request path, a full table or queue), made as [`Guard::connect`].
    fn connect_or_ask(&mut self, req: &libc::seccomp_notif, copy: Fd, addr: Addr) -> Verdict {
        let target = req.data.args[0] as u32 as c_int;
        if let Some(to) = self.may_hand_off(copy.raw(), &addr)
            && let Some(slot) = self.free_slot()
            && let Some(answer) = self.ask(copy.raw(), &to)
        {
            self.pending[slot] = Some(Pending {
                id: req.id,
                fd: answer,
                wait: Wait::Ask {
                    copy: copy.keep(),
                    tid: req.pid,
                    target,
                    since: crate::watch::now_ms(),
                },
                addr,
            });
            return Verdict::Kept;
        }
        self.connect(req.id, copy, addr)
    }

    /// The destination, when a connect on `fd` to `addr` could be a hand-off.
    fn may_hand_off(&self, fd: c_int, addr: &Addr) -> Option<std::net::SocketAddr> {
        if self.requests < 0 {
            return None;
        }
        let to = crate::handoff::inet_addr(&addr.bytes, addr.len as usize)?;
        if self.scope.as_ref().is_some_and(|s| !(s.0)(&to))
            || int_opt(fd, libc::SO_TYPE) != Ok(libc::SOCK_STREAM)
            || int_opt(fd, libc::SO_PROTOCOL) != Ok(libc::IPPROTO_TCP)
        {
            return None;
        }
        let domain = if to.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        (int_opt(fd, libc::SO_DOMAIN) == Ok(domain) && unbound(fd)).then_some(to)
    }

    /// Sends the request for a connect on `copy` to `to`; the end its answer comes on.
    fn ask(&self, copy: c_int, to: &std::net::SocketAddr) -> Option<c_int> {
        let mut pair = [-1; 2];
        // SAFETY: pair is a valid out-array of two ints.
        let made = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
                pair.as_mut_ptr(),
            )
        };
        if made != 0 {
            return None;
        }
        let (ours, theirs) = (Fd(pair[0]), Fd(pair[1]));
        let mut opts = [(0, 0, 0); crate::handoff::MAX_OPTS];
        let n = set_options(copy, &self.defaults, &mut opts);
        let mut msg = [0u8; crate::handoff::REQ_LEN];
        crate::handoff::encode(to, &opts[..n], &mut msg);
        crate::sys::send_with_fd(self.requests, &msg, Some(theirs.raw())).ok()?;
        Some(ours.keep())
    }

    /// `connect` on the init's copy. A blocking connect that is not done at once is kept
    /// (the init must not wait): answered when the copy polls writable.
    fn connect(&mut self, id: u64, copy: Fd, addr: Addr) -> Verdict {
        let fd = copy.raw();
        // SAFETY: fcntl(2) with integer arguments on our descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let ty = int_opt(fd, libc::SO_TYPE).unwrap_or(libc::SOCK_DGRAM);
        let blocking = flags >= 0
            && flags & libc::O_NONBLOCK == 0
            && ty != libc::SOCK_DGRAM
            && ty != libc::SOCK_RAW;
        let slot = match self.free_slot() {
            Some(slot) => slot,
            None if blocking => return Verdict::Done(-i64::from(libc::EAGAIN)),
            None => 0,
        };
        let r = connect_without_waiting(fd, &addr);
        let waits = r == -i64::from(libc::EINPROGRESS) || r == -i64::from(libc::EALREADY);
        if !(blocking && waits) {
            return Verdict::Done(r);
        }
        self.pending[slot] = Some(Pending {
            id,
            fd: copy.keep(),
            wait: Wait::Connect,
            addr,
        });
        Verdict::Kept
    }

    /// A call on a socket of another family in a caller whose descriptor table is
    /// shared: a stand-in process makes it in the caller's view (stand_in.rs).
    fn stand_in(
        &mut self,
        req: &libc::seccomp_notif,
        call: Call,
        fd: c_int,
        addr: &Addr,
        backlog: c_int,
    ) -> Verdict {
        let Some(slot) = self.free_slot() else {
            return Verdict::Done(-i64::from(libc::EAGAIN));
        };
        match crate::stand_in::start(req.pid, call, fd, addr, backlog) {
            Ok((pipe, pidfd)) => {
                self.pending[slot] = Some(Pending {
                    id: req.id,
                    fd: pipe,
                    wait: Wait::StandIn { pidfd },
                    addr: Addr::NONE,
                });
                Verdict::Kept
            }
            Err(e) => Verdict::Done(-i64::from(e)),
        }
    }

    fn free_slot(&self) -> Option<usize> {
        self.pending.iter().position(Option::is_none)
    }

    /// Whether calls are kept (the init then wakes at least once a second to drop those
    /// whose caller has gone).
    pub(crate) fn waiting(&self) -> bool {
        self.pending.iter().any(Option::is_some)
    }

    /// The kept calls' fds for the init's `poll`, one per slot (-1: none).
    pub(crate) fn poll_fds(&self, out: &mut [libc::pollfd]) {
        for (p, o) in self.pending.iter().zip(out.iter_mut()) {
            *o = libc::pollfd {
                fd: p.map_or(-1, |p| p.fd),
                events: match p.map(|p| p.wait) {
                    Some(Wait::Connect | Wait::HostConnect { .. }) => libc::POLLOUT,
                    _ => libc::POLLIN,
                },
                revents: 0,
            };
        }
    }

    /// After `poll` on [`Guard::poll_fds`]: answers the kept calls that have ended and
    /// drops those whose caller no longer waits (it died, or a signal interrupted it:
    /// the kernel then makes the call again, and it is judged anew).
    pub(crate) fn serve_pending(&mut self, listener: c_int, fds: &[libc::pollfd]) {
        for (slot, pfd) in fds.iter().enumerate().take(PENDING) {
            let Some(p) = self.pending[slot] else {
                continue;
            };
            let ready = pfd.fd == p.fd && pfd.revents != 0;
            match p.wait {
                Wait::Ask { since, .. }
                    if ready
                        || crate::watch::now_ms().saturating_sub(since)
                            > crate::handoff::ANSWER_MS =>
                {
                    self.pending[slot] = None;
                    self.answered(listener, p);
                    continue;
                }
                Wait::HostConnect { .. } if ready => {
                    self.pending[slot] = None;
                    respond(listener, p.id, connected(listener, &p));
                    release(&p);
                    continue;
                }
                _ if ready => respond(listener, p.id, finish(&p)),
                _ if id_valid(listener, p.id) => continue,
                _ => {}
            }
            release(&p);
            self.pending[slot] = None;
        }
    }

    /// The answer to kept call `p` (a [`Wait::Ask`]) has come, or will not: a host
    /// socket is put in place, now or (a blocking connect) once connected; "not a
    /// hand-off" makes the call on the sandbox's socket as before.
    fn answered(&mut self, listener: c_int, p: Pending) {
        let Wait::Ask {
            copy, tid, target, ..
        } = p.wait
        else {
            return;
        };
        let (code, host) = read_answer(p.fd);
        // SAFETY: our fd, closed once (the answer's end).
        unsafe { libc::close(p.fd) };
        let copy = Fd(copy);
        if !id_valid(listener, p.id) {
            return;
        }
        let Some(host) = host else {
            if code < 0 && code != -libc::EINPROGRESS {
                return respond(listener, p.id, i64::from(code));
            }
            if let Verdict::Done(v) = self.connect(p.id, copy, p.addr) {
                respond(listener, p.id, v);
            }
            return;
        };
        // SAFETY: fcntl(2) with integer arguments on our descriptor.
        let blocking = unsafe { libc::fcntl(copy.raw(), libc::F_GETFL) } & libc::O_NONBLOCK == 0;
        if blocking && code == -libc::EINPROGRESS {
            if let Some(slot) = self.free_slot() {
                self.pending[slot] = Some(Pending {
                    id: p.id,
                    fd: host.keep(),
                    wait: Wait::HostConnect {
                        copy: copy.keep(),
                        tid,
                        target,
                    },
                    addr: p.addr,
                });
                return;
            }
            return respond(listener, p.id, -i64::from(libc::EAGAIN));
        }
        let put = put_in(listener, p.id, (tid, target), copy.raw(), host.raw());
        respond(listener, p.id, if put < 0 { put } else { i64::from(code) });
    }
}

/// A kept blocking connect of a host socket ([`Wait::HostConnect`]) has ended: put in
/// place if connected (0), else its error (the program's socket stays the sandbox's).
fn connected(listener: c_int, p: &Pending) -> i64 {
    let Wait::HostConnect { copy, tid, target } = p.wait else {
        return -i64::from(libc::EIO);
    };
    match int_opt(p.fd, libc::SO_ERROR) {
        Ok(0) => put_in(listener, p.id, (tid, target), copy, p.fd),
        Ok(e) | Err(e) => -i64::from(e),
    }
}

/// Puts host socket `host` at fd number `target` of thread `tid`, the caller of
/// notification `id`, in place of `old` (carry.rs): 0 or `-errno`.
fn put_in(listener: c_int, id: u64, (tid, target): (u32, c_int), old: c_int, host: c_int) -> i64 {
    crate::carry::hand_in(listener, id, (tid, target), old, host)
}

/// The answer on `fd` (handoff.rs): its code and the host socket with it; a missing
/// or malformed answer is "not a hand-off".
fn read_answer(fd: c_int) -> (i32, Option<Fd>) {
    let mut buf = [0u8; 8];
    let Ok((n, sock)) = crate::sys::recv_with_fd(fd, &mut buf) else {
        return (crate::handoff::NOT_HANDOFF, None);
    };
    let sock = sock.map(|s| Fd(std::os::fd::IntoRawFd::into_raw_fd(s)));
    let code = match n {
        4 => i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]),
        _ => return (crate::handoff::NOT_HANDOFF, None),
    };
    match (code, sock) {
        (0, Some(s)) => (0, Some(s)),
        (c, Some(s)) if c == -libc::EINPROGRESS => (c, Some(s)),
        (c, None) if c < 0 && c != -libc::EINPROGRESS => (c, None),
        _ => (crate::handoff::NOT_HANDOFF, None),
    }
}

/// Whether socket `fd` is neither bound to a port nor connected (a hand-off's host
/// socket could keep neither).
fn unbound(fd: c_int) -> bool {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname writes at most len bytes into ss.
    if unsafe { libc::getsockname(fd, (&raw mut ss).cast(), &mut len) } != 0 || len < 4 {
        return false;
    }
    let bytes: &[u8] = {
        // SAFETY: ss is len (≥ 4) initialised bytes, read as bytes.
        unsafe { std::slice::from_raw_parts((&raw const ss).cast::<u8>(), len as usize) }
    };
    let port = u16::from_be_bytes([bytes[2], bytes[3]]);
    let addr = crate::handoff::inet_addr(bytes, len as usize);
    port == 0 && addr.is_some_and(|a| a.ip().is_unspecified())
}

/// A new sandbox TCP socket's values of [`crate::handoff::CARRIED_OPTS`].
fn new_socket_options() -> [c_int; crate::handoff::MAX_OPTS] {
    let mut out = [-1; crate::handoff::MAX_OPTS];
    // SAFETY: socket(2) with integer arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return out;
    }
    let fd = Fd(fd);
    for (o, &(level, name, _)) in out.iter_mut().zip(&crate::handoff::CARRIED_OPTS) {
        *o = opt(fd.raw(), level, name).unwrap_or(-1);
    }
    out
}

/// The options of [`crate::handoff::CARRIED_OPTS`] socket `fd` has set (they differ
/// from `defaults`), into `out` as they are to be set; how many.
fn set_options(fd: c_int, defaults: &[c_int], out: &mut [crate::handoff::SockOpt]) -> usize {
    let mut n = 0;
    for (&(level, name, halved), &d) in crate::handoff::CARRIED_OPTS.iter().zip(defaults) {
        if let Ok(v) = opt(fd, level, name)
            && v != d
            && n < out.len()
        {
            out[n] = (level, name, if halved { v / 2 } else { v });
            n += 1;
        }
    }
    n
}

fn opt(fd: c_int, level: c_int, name: c_int) -> Result<c_int, c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live local.
    let r = unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) };
    if r == 0 { Ok(v) } else { Err(errno()) }
}

/// The result of kept call `p`, which has ended.
fn finish(p: &Pending) -> i64 {
    match p.wait {
        Wait::Connect => {
            let err = int_opt(p.fd, libc::SO_ERROR).unwrap_or(libc::EIO);
            // The kernel's side of the connect ends with one more call, as for the
            // caller's own blocking connect: connected (`EISCONN` next time), or back to
            // unconnected after a failure (so that the program may connect again).
            let again = connect_without_waiting(p.fd, &p.addr);
            match err {
                0 if again == 0 || again == -i64::from(libc::EISCONN) => 0,
                0 => again,
                e => -i64::from(e),
            }
        }
        Wait::StandIn { .. } => crate::stand_in::result(p.fd),
        Wait::Ask { .. } | Wait::HostConnect { .. } => -i64::from(libc::EIO),
    }
}

/// Closes what kept call `p` held; a stand-in still at work is killed.
fn release(p: &Pending) {
    if let Wait::StandIn { pidfd } = p.wait {
        // SAFETY: pidfd_send_signal(2) on our pidfd; a null siginfo is kill(2)'s.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        // SAFETY: our pidfd, closed once.
        unsafe { libc::close(pidfd) };
    }
    if let Wait::Ask { copy, .. } | Wait::HostConnect { copy, .. } = p.wait {
        // SAFETY: our copy of the caller's file, closed once.
        unsafe { libc::close(copy) };
    }
    // SAFETY: our fd, closed once.
    unsafe { libc::close(p.fd) };
}

/// `connect` on `fd` with `addr`, never waiting: on a blocking file `O_NONBLOCK` is set
/// for the call and cleared after. The file is the caller's too: another thread of it
/// that reads the flags meanwhile sees `O_NONBLOCK` (a few µs).
fn connect_without_waiting(fd: c_int, addr: &Addr) -> i64 {
    // SAFETY: fcntl(2) with integer arguments on our descriptor.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    let toggle = flags >= 0 && flags & libc::O_NONBLOCK == 0;
    if toggle {
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    }
    let r = make(Call::Connect, fd, addr, 0);
    if toggle {
        // SAFETY: as above.
        unsafe {
            let now = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, now & !libc::O_NONBLOCK);
        }
    }
    r
}

/// An fd the init owns, closed on drop unless kept.
pub(crate) struct Fd(c_int);

impl Fd {
    pub(crate) fn raw(&self) -> c_int {
        self.0
    }

    fn keep(self) -> c_int {
        let fd = self.0;
        std::mem::forget(self);
        fd
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: our fd, closed once.
        unsafe { libc::close(self.0) };
    }
}

fn id_valid(listener: c_int, id: u64) -> bool {
    // SAFETY: ID_VALID reads the u64 id.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0 }
}

/// The caller's descriptor `fd` (thread `req.pid`), duplicated into the init: the same
/// open file, which the init judges and calls on (nothing the caller does to its
/// descriptor table later changes which file that is).
fn their_fd(listener: c_int, req: &libc::seccomp_notif, fd: c_int) -> Result<Fd, c_int> {
    let pidfd = pidfd_of(listener, req.id, req.pid)?;
    // SAFETY: pidfd_getfd(2) with integer arguments; the result is a new CLOEXEC fd.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.raw(), fd, 0) };
    if dup < 0 {
        return Err(match errno() {
            libc::EBADF => libc::EBADF,
            _ => libc::EPERM,
        });
    }
    Ok(Fd(dup as c_int))
}

/// A pidfd of thread `tid`, checked to be the caller of notification `id`.
pub(crate) fn pidfd_of(listener: c_int, id: u64, tid: u32) -> Result<Fd, c_int> {
    // SAFETY: pidfd_open(2) with integer arguments.
    let mut pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
    if pidfd < 0 {
        // Before Linux 6.9: a process leader only (a single-threaded caller).
        // SAFETY: as above.
        pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, 0) };
    }
    if pidfd < 0 {
        return Err(libc::EPERM);
    }
    let pidfd = Fd(pidfd as c_int);
    // The pidfd names the caller only if it still waits (its tid may be another's
    // since).
    if !id_valid(listener, id) {
        return Err(libc::EPERM);
    }
    Ok(pidfd)
}

/// The address of `req` (arguments 1 and 2), copied once from the caller's memory, as
/// the kernel would: a length past [`ADDR_MAX`] or negative is `EINVAL`, memory that
/// cannot be read `EFAULT`.
fn read_addr(listener: c_int, req: &libc::seccomp_notif) -> Result<Addr, c_int> {
    let len = req.data.args[2] as u32 as c_int;
    if !(0..=ADDR_MAX as c_int).contains(&len) {
        return Err(libc::EINVAL);
    }
    let mut addr = Addr {
        bytes: [0; ADDR_MAX],
        len: len as u32,
    };
    if len == 0 {
        return Ok(addr);
    }
    let local = libc::iovec {
        iov_base: addr.bytes.as_mut_ptr().cast(),
        iov_len: len as usize,
    };
    let remote = libc::iovec {
        iov_base: req.data.args[1] as *mut libc::c_void,
        iov_len: len as usize,
    };
    // SAFETY: process_vm_readv writes at most len bytes into addr.bytes; the remote
    // side is the caller's memory, which the kernel checks.
    let n = unsafe { libc::process_vm_readv(req.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    // What was read belongs to the caller only if it still waits.
    if !id_valid(listener, req.id) {
        return Err(libc::EPERM);
    }
    if n != len as isize {
        return Err(libc::EFAULT);
    }
    Ok(addr)
}

/// Whether thread `tid`'s descriptor table is its alone, so that the fd number it
/// called on names the same file when the kernel makes the call: no other thread of its
/// process shares it (`kcmp(KCMP_FILES)`; a task sharing it but not a thread cannot
/// exist, the filter refuses `clone(CLONE_FILES)` without `CLONE_THREAD` and `clone3`).
/// Only a task that shares the table can make another one share it, so while the
/// caller waits the answer holds. Unsure (more than [`TASKS_SCANNED`] threads, `kcmp`
/// refused, `/proc` unreadable): `false`.
fn private_table(tid: u32) -> bool {
    let Some(dir) = crate::watch::open_proc(tid, b"/task\0") else {
        return false;
    };
    let dir = Fd(dir);
    let mut buf = [0u8; 4096];
    let mut seen = 0;
    loop {
        // SAFETY: getdents64 writes at most buf.len() bytes into buf.
        let n =
            unsafe { libc::syscall(libc::SYS_getdents64, dir.raw(), buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            return false;
        }
        if n == 0 {
            return true;
        }
        let mut at = 0;
        while at + 19 < n as usize {
            let reclen = usize::from(u16::from_ne_bytes([buf[at + 16], buf[at + 17]]));
            let name = &buf[at + 19..(at + reclen).min(n as usize)];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(t) = parse_u32(name)
                && t != tid
            {
                seen += 1;
                if seen > TASKS_SCANNED || shares_files(tid, t) {
                    return false;
                }
            }
            if reclen == 0 {
                return false;
            }
            at += reclen;
        }
    }
}

/// Threads [`private_table`] compares at most.
const TASKS_SCANNED: usize = 1024;

/// Whether tasks `a` and `b` share a descriptor table (a task that has gone shares
/// nothing; an unanswered question counts as shared).
fn shares_files(a: u32, b: u32) -> bool {
    const KCMP_FILES: c_int = 2;
    // SAFETY: kcmp(2) with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FILES, 0, 0) };
    r == 0 || (r < 0 && errno() != libc::ESRCH)
}

fn parse_u32(s: &[u8]) -> Option<u32> {
    if s.is_empty() || s.len() > 9 {
        return None;
    }
    s.iter().try_fold(0u32, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u32::from(b - b'0'))
    })
}

/// `net.ipv4.ip_unprivileged_port_start` of the init's (the sandbox's) namespace; 1024
/// when unreadable.
fn unprivileged_port_start() -> u16 {
    let path = b"/proc/sys/net/ipv4/ip_unprivileged_port_start\0";
    // SAFETY: path is NUL-terminated.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return 1024;
    }
    let fd = Fd(fd);
    let mut buf = [0u8; 16];
    // SAFETY: reading into buf.
    let n = unsafe { libc::read(fd.raw(), buf.as_mut_ptr().cast(), buf.len()) };
    let text = &buf[..n.max(0) as usize];
    let digits = &text[..text
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(text.len())];
    parse_u32(digits).map_or(1024, |p| p.min(65535) as u16)
}

/// Whether thread `tid` may bind a port below the unprivileged start in the sandbox's
/// namespace: only with `CAP_NET_BIND_SERVICE` in the namespace's owner, the init's user
/// namespace (the command is there only when ferry runs it without one of its own).
fn may_bind_low(tid: u32) -> bool {
    let same_userns = match (
        ns_ino(crate::watch::open_proc(tid, b"/ns/user\0")),
        ns_ino(open_self(b"/proc/self/ns/user\0")),
    ) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    };
    let mut buf = [0u8; 2048];
    same_userns
        && crate::watch::read_proc(tid, b"/status\0", &mut buf).is_some_and(|n| {
            // CAP_NET_BIND_SERVICE is capability 10.
            crate::stand_in::status_hex(&buf[..n], b"CapEff:\t")
                .is_some_and(|caps| caps & (1 << 10) != 0)
        })
}

pub(crate) fn open_self(path: &[u8]) -> Option<c_int> {
    // SAFETY: path is NUL-terminated.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

fn ns_ino(fd: Option<c_int>) -> Option<u64> {
    let fd = Fd(fd?);
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    (unsafe { libc::fstat(fd.raw(), &mut st) } == 0).then_some(st.st_ino)
}

/// Answers notification `id` with `v` (0 or `-errno`).
fn respond(listener: c_int, id: u64, v: i64) {
    // SAFETY: seccomp_notif_resp is plain data; all-zero is "no error, value 0".
    let mut resp: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
    resp.id = id;
    if v < 0 {
        resp.error = v as i32;
    } else {
        resp.val = v;
    }
    // SAFETY: SEND reads resp, a valid seccomp_notif_resp. ENOENT (the caller is gone)
    // needs nothing.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
}

/// Lets notification `id`'s call proceed in the kernel.
fn proceed(listener: c_int, id: u64) {
    // SAFETY: seccomp_notif_resp is plain data.
    let mut resp: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
    resp.id = id;
    resp.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32;
    // SAFETY: as in respond.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86_64: u32 = 0xC000_003E;

    /// The filter's verdict on (arch, nr, args), as the kernel would reach it.
    fn verdict(tell: bool, arch: u32, nr: i64, args: [u64; 4]) -> u32 {
        crate::bpf_test::verdict(&filter(X86_64, tell), arch, nr as u32, &args)
    }

    #[test]
    fn re_aiming_calls_notify_and_the_data_path_does_not() {
        let notify = libc::SECCOMP_RET_USER_NOTIF;
        let allow = libc::SECCOMP_RET_ALLOW;
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let fo = libc::MSG_FASTOPEN as u64;
        for tell in [false, true] {
            let v = |nr: i64, args: [u64; 4]| verdict(tell, X86_64, nr, args);
            for nr in [libc::SYS_connect, libc::SYS_bind, libc::SYS_listen] {
                assert_eq!(v(nr, [3, 0, 0, 0]), notify, "{nr}");
                assert_eq!(v(nr | i64::from(X32_SYSCALL_BIT), [3, 0, 0, 0]), notify);
            }
            assert_eq!(v(libc::SYS_sendto, [3, 0, 0, fo]), eperm);
            assert_eq!(v(libc::SYS_sendto, [3, 0, 0, 0x40]), allow, "no fast open");
            assert_eq!(v(libc::SYS_sendmmsg, [3, 0, 0, fo | 0x40]), eperm);
            assert_eq!(v(libc::SYS_sendmsg, [3, 0, fo, 0]), eperm);
            assert_eq!(
                v(libc::SYS_sendmsg, [3, 0, 0, fo]),
                allow,
                "flags are arg 2"
            );
            let ip = libc::IPPROTO_IP as u64;
            let ip6 = libc::IPPROTO_IPV6 as u64;
            let opt = |level: u64, name: c_int| v(libc::SYS_setsockopt, [3, level, name as u64, 0]);
            assert_eq!(opt(ip, libc::IP_OPTIONS), eperm);
            assert_eq!(opt(ip6, libc::IPV6_RTHDR), eperm);
            assert_eq!(opt(ip, libc::IP_TTL), allow);
            assert_eq!(opt(libc::SOL_SOCKET as u64, libc::IP_OPTIONS), allow);
            assert_eq!(
                v(libc::SYS_io_uring_setup, [1, 0, 0, 0]),
                libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
            );
            for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_recvfrom] {
                assert_eq!(v(nr, [3, 0, 0, 0]), allow, "{nr}");
            }
            // Threads may share a descriptor table; two processes may not; clone3's
            // flags are out of the filter's sight.
            let thread = (libc::CLONE_VM | libc::CLONE_FILES | libc::CLONE_THREAD) as u64;
            assert_eq!(v(libc::SYS_clone, [thread | 0x100, 0, 0, 0]), allow);
            assert_eq!(v(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0]), allow);
            let shared = (libc::CLONE_VM | libc::CLONE_FILES) as u64;
            assert_eq!(v(libc::SYS_clone, [shared, 0, 0, 0]), eperm);
            assert_eq!(
                v(libc::SYS_clone3, [0, 88, 0, 0]),
                libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
            );
            let inet = v(libc::SYS_socket, [libc::AF_INET as u64, 1, 0, 0]);
            assert_eq!(inet, if tell { notify } else { allow });
            assert_eq!(v(libc::SYS_socket, [libc::AF_UNIX as u64, 1, 0, 0]), allow);
        }
        // Another architecture's calls kill the process.
        assert_eq!(
            verdict(false, 0x4000_0003, 102, [0; 4]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }

    #[test]
    fn a_socket_of_another_namespace_is_refused_and_the_sandboxs_is_made_here() {
        let own = own_netns_cookie();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
        if own.is_none() {
            eprintln!("skipped: no SO_NETNS_COOKIE (Linux < 5.14)");
            return;
        }
        assert_eq!(kind_of(fd, own), Kind::SandboxInet);
        assert_eq!(kind_of(fd, own.map(|c| c + 1)), Kind::Host);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let ufd = std::os::fd::AsRawFd::as_raw_fd(&a);
        assert_eq!(kind_of(ufd, own.map(|c| c + 1)), Kind::NotInet);
        let f = std::fs::File::open("/dev/null").unwrap();
        let ffd = std::os::fd::AsRawFd::as_raw_fd(&f);
        assert_eq!(kind_of(ffd, own), Kind::Refused(libc::ENOTSOCK));
    }

    #[test]
    fn a_connect_on_a_host_socket_learns_its_state_and_never_moves_it() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&c);
        let (inet, inet6) = (Some(libc::AF_INET), Some(libc::AF_INET6));
        assert_eq!(host_connect(fd, inet), libc::EISCONN);
        assert_eq!(host_connect(fd, inet6), libc::EISCONN);
        assert_eq!(host_connect(fd, Some(libc::AF_UNSPEC)), libc::EPERM);
        assert_eq!(host_connect(fd, None), libc::EPERM);
        let lfd = std::os::fd::AsRawFd::as_raw_fd(&l);
        assert_eq!(host_connect(lfd, inet), libc::EPERM);
        let fresh = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let ufd = std::os::fd::AsRawFd::as_raw_fd(&fresh);
        assert_eq!(host_connect(ufd, inet), libc::EPERM, "not TCP: no TCP_INFO");
        // A socket reset by its peer (closed) would connect anew: refused.
        c.set_nonblocking(true).unwrap();
        let (a, _) = l.accept().unwrap();
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt reads `size_of::<linger>()` bytes of a live local.
        unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&a),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        drop(a);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut b = [0u8; 1];
        let _ = std::io::Read::read(&mut &c, &mut b);
        assert_eq!(host_connect(fd, inet), libc::EPERM);
    }

    #[test]
    fn a_table_shared_with_another_thread_is_not_private() {
        // SAFETY: gettid has no arguments.
        let me = unsafe { libc::gettid() } as u32;
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        // A thread that shares this test's table, then one with a table of its own.
        let shared = std::thread::spawn(move || {
            tx.send(()).unwrap();
            done_rx.recv().ok();
        });
        rx.recv().unwrap();
        assert!(!private_table(me), "another thread shares the table");
        done_tx.send(()).unwrap();
        shared.join().unwrap();
        let own = std::thread::spawn(|| {
            // SAFETY: unshare with an integer flag, for this thread only.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_FILES) }, 0);
            // SAFETY: as above.
            private_table(unsafe { libc::gettid() } as u32)
        });
        assert!(own.join().unwrap(), "a thread's own table");
    }

    #[test]
    fn an_address_port_and_the_calls() {
        let mut a = Addr::NONE;
        a.bytes[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        a.bytes[2..4].copy_from_slice(&80u16.to_be_bytes());
        a.len = 16;
        assert_eq!(a.inet_port(), 80);
        a.len = 2;
        assert_eq!(a.inet_port(), 0, "too short for a port");
        a.bytes[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        a.len = 16;
        assert_eq!(a.inet_port(), 0, "not inet");
        assert_eq!(Call::of(libc::SYS_connect as c_int), Some(Call::Connect));
        let x32 = (libc::SYS_bind as u32 | X32_SYSCALL_BIT) as c_int;
        assert_eq!(Call::of(x32), Some(Call::Bind));
        assert_eq!(Call::of(libc::SYS_read as c_int), None);
    }
}
