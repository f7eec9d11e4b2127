//! The socket watch: the init says, on stderr, which of the command's processes make
//! inet sockets that ferry cannot serve.
//!
//! Theory of operation. The shim relays a program's TCP and UDP sockets to ferry's
//! servers: it never asks the kernel for an inet socket of those kinds. The inet sockets
//! the kernel makes in the sandbox come from (1) programs the shim cannot reach: static
//! ones, Go programs (they make their own system calls, even when dynamically linked),
//! processes started without `LD_PRELOAD`; (2) kinds the shim passes on unrelayed: raw
//! and ICMP sockets (`ping`), SCTP…; (3) libc's own calls, which no preloaded library can
//! interpose: its resolver (ferry's DNS forwarder answers it inside the sandbox) and
//! `getaddrinfo`'s source-address probes. (1) and (2) see only the sandbox's loopback
//! and are told so; (3) is expected and passes in silence.
//!
//! The command installs a seccomp filter ([`install`], after no-new-privileges, before
//! `execve`) that makes `socket(AF_INET or AF_INET6, …)` a user notification and lets
//! every other call through, and hands its listener to the init. The filter holds for
//! the command and everything it starts, never for the init, whose socket factory makes
//! the sandbox's sockets for ferry's servers. For each notification the init
//! ([`Watch::serve`]) reads the caller's process and name (`/proc/TID/status`); for a
//! TCP or UDP socket it also finds where the call came from (`/proc/PID/maps`): from
//! libc in a process that maps the shim is (3), anything else (the program's own code,
//! a process without the shim) is (1). The call then proceeds as made
//! (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`), and (1) and (2) get a line.
//!
//! Bounds. The caller waits while the init looks, so it looks briefly: the status's
//! first KiB, at most 1 MiB of a process's maps and 4 MiB a second in all (past that
//! the call counts as libc's), and the verdict "libc" is kept per thread, process
//! and address range. One line per process (the last [`SEEN`] processes are
//! remembered by pid and name, so an `exec` is a new one), at most
//! [`LINES_PER_SECOND`] across the sandbox, then one line with the count of those
//! not shown; a line that would wait for a full stderr is not shown either. Every
//! table has a fixed size: nothing the sandbox does grows the init's memory; a program
//! delays only its own calls, and the init's other work by one answer at a time (each
//! `poll` turn serves one notification and one factory request). Everything
//! here is async-signal-safe (see init.rs): raw system calls on stack buffers.
//!
//! Limits: x86_64 and aarch64 only (elsewhere no filter is installed; a 32-bit x86
//! program's `socketcall` is not looked at), `io_uring`'s socket operation bypasses
//! seccomp, and a program that calls `syscall(SYS_socket, …)` through libc passes for
//! libc's own.

use std::os::fd::RawFd;

use libc::{c_int, sock_filter};

use crate::init::{put, put_num};
use crate::sys::errno;

/// `AUDIT_ARCH_*` of the build's architecture (linux/audit.h: `EM_*` |
/// `__AUDIT_ARCH_64BIT` | `__AUDIT_ARCH_LE`; not in the libc crate).
#[cfg(target_arch = "x86_64")]
const ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH: Option<u32> = None;

/// x86_64's x32 ABI numbers its system calls from here (`__X32_SYSCALL_BIT`).
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `SOCK_TYPE_MASK` (linux/net.h): the type without `SOCK_NONBLOCK`/`SOCK_CLOEXEC`.
pub(crate) const SOCK_TYPE_MASK: c_int = 0xf;

/// Processes remembered as told.
pub(crate) const SEEN: usize = 256;
/// (thread, process, libc's range) remembered as libc's own calls.
const QUIET: usize = 64;
/// Lines across the sandbox per second, before they are only counted.
pub(crate) const LINES_PER_SECOND: u32 = 20;
/// How much of a process's maps the init reads to find where a call came from.
const MAPS_CAP: usize = 1 << 20;
/// How much maps the init reads per second in all (about 30 ms of its time): past that,
/// calls count as libc's until the next second.
const MAPS_PER_SECOND: usize = 4 << 20;

/// The filter: `socket` with an inet family notifies, anything else is allowed.
const fn filter(arch: u32) -> [sock_filter; 10] {
    const fn stmt(code: u32, k: u32) -> sock_filter {
        sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        }
    }
    const fn jeq(k: u32, jt: u8, jf: u8) -> sock_filter {
        sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt,
            jf,
            k,
        }
    }
    const LOAD: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    // seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low half on little-endian
    // machines; socket's domain is an int).
    let socket = libc::SYS_socket as u32;
    [
        stmt(LOAD, 4),
        jeq(arch, 0, 6), // → allow
        stmt(LOAD, 0),
        jeq(socket, 1, 0),
        jeq(socket | X32_SYSCALL_BIT, 0, 3), // → allow
        stmt(LOAD, 16),
        jeq(libc::AF_INET as u32, 2, 0),  // → notify
        jeq(libc::AF_INET6 as u32, 1, 0), // → notify
        stmt(RET, libc::SECCOMP_RET_ALLOW),
        stmt(RET, libc::SECCOMP_RET_USER_NOTIF),
    ]
}

/// What the init does with the command's notified calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Tell of inet sockets ferry cannot serve; the path of the library that relays
    /// sockets (empty: none, so every inet socket is told).
    Tell(Vec<u8>),
    /// Make the command's raw ICMP sockets (raw_icmp.rs).
    RawIcmp,
    /// Guard handed-off host sockets (host_guard.rs); with the shim's path, also tell
    /// as [`Mode::Tell`] does (`None`: tell nothing).
    Guard(Option<Vec<u8>>),
}

impl Mode {
    /// Whether this is the hand-off guard ([`Mode::Guard`]).
    pub(crate) fn guards(&self) -> bool {
        matches!(self, Mode::Guard(_))
    }
}

/// In the command's process, after no-new-privileges: installs `mode`'s filter on it
/// (and so on everything it starts) and returns the listener, or `None` when the kernel
/// refuses (no seccomp, too old, or a listener already on the chain: ferry inside a
/// sandbox with a watch of its own) or the architecture is not one the filter knows.
pub(crate) fn install(mode: &Mode) -> Option<RawFd> {
    let arch = ARCH?;
    match mode {
        Mode::Tell(_) => install_filter(&filter(arch)),
        Mode::RawIcmp => install_filter(&crate::raw_icmp::filter(arch)),
        Mode::Guard(tell) => install_filter(&crate::host_guard::filter(arch, tell.is_some())),
    }
}

fn install_filter(prog: &[sock_filter]) -> Option<RawFd> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: seccomp(2) reads the program through fprog, which lives across the call;
    // the new listener is a fresh CLOEXEC fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog,
        )
    };
    (fd >= 0).then_some(fd as RawFd)
}

/// What kind of inet socket a call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// TCP or UDP: the shim relays these.
    Relayed,
    /// ICMP (`ping`), raw or datagram.
    Icmp,
    /// Raw, another protocol.
    Raw,
    /// Anything else (SCTP, UDP-Lite, …): the shim passes it on.
    Other { ty: c_int, protocol: c_int },
}

impl Kind {
    fn of(ty: c_int, protocol: c_int) -> Self {
        let ty = ty & SOCK_TYPE_MASK;
        match (ty, protocol) {
            (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => Self::Relayed,
            (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => Self::Relayed,
            (libc::SOCK_RAW | libc::SOCK_DGRAM, libc::IPPROTO_ICMP | libc::IPPROTO_ICMPV6) => {
                Self::Icmp
            }
            (libc::SOCK_RAW, _) => Self::Raw,
            _ => Self::Other { ty, protocol },
        }
    }
}

/// A process as its status names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Who {
    tgid: i32,
    /// The name as the kernel shows it (`\n` and `\\` escaped; other bytes raw).
    name: [u8; 32],
    len: u8,
}

impl Who {
    const NONE: Self = Self {
        tgid: 0,
        name: [0; 32],
        len: 0,
    };

    fn name(&self) -> &[u8] {
        &self.name[..usize::from(self.len)]
    }
}

/// `Name:` and `Tgid:` from the text of `/proc/TID/status`.
fn parse_status(text: &[u8]) -> Option<Who> {
    let mut who = Who::NONE;
    let mut named = false;
    for line in text.split(|&b| b == b'\n') {
        if let Some(name) = line.strip_prefix(b"Name:\t") {
            let n = name.len().min(who.name.len());
            who.name[..n].copy_from_slice(&name[..n]);
            who.len = n as u8;
            named = true;
        } else if let Some(tgid) = line.strip_prefix(b"Tgid:\t") {
            who.tgid = parse_dec(tgid)?;
        }
    }
    (named && who.tgid > 0).then_some(who)
}

fn parse_dec(s: &[u8]) -> Option<i32> {
    if s.is_empty() || s.len() > 9 {
        return None;
    }
    s.iter().try_fold(0i32, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + i32::from(b - b'0'))
    })
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some(n << 4 | u64::from(d))
    })
}

/// Where a socket call came from, read line by line from the caller's maps.
#[derive(Debug)]
struct Origin<'a> {
    ip: u64,
    shim: &'a [u8],
    /// The mapping that holds `ip`, once seen: its range if it is libc's.
    caller: Option<Option<(u64, u64)>>,
    shim_mapped: bool,
}

impl<'a> Origin<'a> {
    fn new(ip: u64, shim: &'a [u8]) -> Self {
        Self {
            ip,
            shim,
            caller: None,
            shim_mapped: false,
        }
    }

    /// Takes one line of maps (`START-END PERMS OFFSET DEV INODE [PATH]`); true once the
    /// verdict is known.
    fn line(&mut self, line: &[u8]) -> bool {
        let mut fields = 0;
        let mut i = 0;
        // Past the five fields before the path, and the spaces after them.
        while i < line.len() && fields < 5 {
            while i < line.len() && line[i] != b' ' {
                i += 1;
            }
            while i < line.len() && line[i] == b' ' {
                i += 1;
            }
            fields += 1;
        }
        let path = &line[i..];
        if !self.shim.is_empty() && strip_deleted(path) == self.shim {
            self.shim_mapped = true;
        }
        if self.caller.is_none() {
            let range = line.split(|&b| b == b' ').next().unwrap_or_default();
            let mut ends = range.split(|&b| b == b'-');
            if let (Some(Some(start)), Some(Some(end))) =
                (ends.next().map(parse_hex), ends.next().map(parse_hex))
                && start <= self.ip
                && self.ip < end
            {
                self.caller = Some(is_libc(path).then_some((start, end)));
            }
        }
        match self.caller {
            Some(None) => true,
            Some(Some(_)) => self.shim_mapped || self.shim.is_empty(),
            None => false,
        }
    }

    /// The range of libc the call came from when it is libc's own (in a process with the
    /// shim); `None` when the call should be told. Undecided (`complete` false: the
    /// maps were cut short) counts as libc's.
    fn libc_range(&self, complete: bool) -> Option<(u64, u64)> {
        match self.caller {
            Some(None) => None,
            Some(Some(range)) if self.shim_mapped || !complete => Some(range),
            Some(Some(_)) => None,
            None => Some((self.ip, self.ip + 1)),
        }
    }
}

fn strip_deleted(path: &[u8]) -> &[u8] {
    path.strip_suffix(b" (deleted)").unwrap_or(path)
}

/// glibc's `libc.so.6` (or an older `libc-2.NN.so`).
fn is_libc(path: &[u8]) -> bool {
    let path = strip_deleted(path);
    let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    base.starts_with(b"libc.so") || (base.starts_with(b"libc-") && base.ends_with(b".so"))
}

/// How many lines may be written now; counts the rest.
#[derive(Debug)]
struct Throttle {
    /// Start of the current one-second window, in ms.
    start: u64,
    shown: u32,
    hidden: u32,
}

impl Throttle {
    /// Whether a line may be written at `now` (ms); if not, it is counted.
    fn admit(&mut self, now: u64) -> bool {
        if now >= self.start + 1000 {
            self.start = now;
            self.shown = 0;
        }
        if self.shown < LINES_PER_SECOND {
            self.shown += 1;
            true
        } else {
            self.hidden += 1;
            false
        }
    }

    /// The count of lines not shown, once their window is over.
    fn hidden_due(&mut self, now: u64) -> Option<u32> {
        if self.hidden > 0 && now >= self.start + 1000 {
            return Some(std::mem::take(&mut self.hidden));
        }
        None
    }

    /// How long `poll` may sleep before [`Self::hidden_due`] has something: -1 = forever.
    fn timeout(&self, now: u64) -> c_int {
        if self.hidden == 0 {
            -1
        } else {
            (self.start + 1000).saturating_sub(now).min(1000) as c_int
        }
    }
}

/// A thread of a process whose calls from libc's range `start..end` are libc's own.
#[derive(Clone, Copy, Debug)]
struct Quiet {
    tid: u32,
    tgid: i32,
    start: u64,
    end: u64,
}

impl Quiet {
    const NONE: Self = Self {
        tid: 0,
        tgid: 0,
        start: 0,
        end: 0,
    };

    fn holds(&self, ip: u64) -> bool {
        self.start <= ip && ip < self.end
    }
}

/// One line to tell.
#[derive(Debug)]
struct Report {
    who: Who,
    ipv6: bool,
    kind: Kind,
    /// Under `--handoff` (the guard): its TCP connects to hand-off destinations get
    /// host sockets.
    handoff: bool,
}

/// The init's side of the watch.
#[derive(Debug)]
pub(crate) struct Watch<'a> {
    listener: RawFd,
    /// Raw ICMP sockets are made here instead ([`Mode::RawIcmp`]): nothing is told.
    raw_icmp: bool,
    /// [`Mode::Guard`]: calls other than `socket` go to host_guard.rs.
    guard: Option<crate::host_guard::Guard>,
    shim: &'a [u8],
    seen: [Who; SEEN],
    next_seen: usize,
    quiet: [Quiet; QUIET],
    next_quiet: usize,
    throttle: Throttle,
    /// Maps read since `maps_since` (ms), against [`MAPS_PER_SECOND`].
    maps_read: usize,
    maps_since: u64,
}

impl<'a> Watch<'a> {
    /// `listener` from [`install`] for `mode`; `requests` is the init's end of the
    /// hand-off's request path (handoff.rs; -1: none).
    pub(crate) fn new(
        listener: RawFd,
        mode: &'a Mode,
        requests: RawFd,
        scope: Option<&crate::handoff::HandoffScope>,
    ) -> Self {
        let (raw_icmp, shim) = match mode {
            Mode::Tell(shim) | Mode::Guard(Some(shim)) => (false, &shim[..]),
            Mode::RawIcmp | Mode::Guard(None) => (true, &[][..]),
        };
        let guard = mode
            .guards()
            .then(|| crate::host_guard::Guard::new(requests, scope.cloned()));
        Self {
            listener,
            raw_icmp,
            guard,
            shim,
            seen: [Who::NONE; SEEN],
            next_seen: 0,
            quiet: [Quiet::NONE; QUIET],
            next_quiet: 0,
            throttle: Throttle {
                start: 0,
                shown: 0,
                hidden: 0,
            },
            maps_read: 0,
            maps_since: 0,
        }
    }

    /// The fd to poll for notifications (-1 once the listener is closed).
    pub(crate) fn fd(&self) -> RawFd {
        self.listener
    }

    /// The `poll` timeout the watch needs (to write the count of lines not shown; to
    /// drop the guard's kept calls whose caller has gone).
    pub(crate) fn timeout(&self) -> c_int {
        let t = self.throttle.timeout(now_ms());
        if self.guard.as_ref().is_some_and(|g| g.waiting()) && !(0..1000).contains(&t) {
            1000
        } else {
            t
        }
    }

    /// The guard's kept calls' fds for `poll` (host_guard.rs; all -1 without a guard).
    pub(crate) fn kept_fds(&self, out: &mut [libc::pollfd]) {
        match &self.guard {
            Some(g) => g.poll_fds(out),
            None => out.iter_mut().for_each(|p| p.fd = -1),
        }
    }

    /// After `poll`: answers the guard's kept calls that have ended.
    pub(crate) fn serve_kept(&mut self, fds: &[libc::pollfd]) {
        if let Some(g) = self.guard.as_mut() {
            g.serve_pending(self.listener, fds);
        }
    }

    /// After every `poll`: answers a notification if `revents` says one is waiting, and
    /// writes the count of lines not shown when it is due.
    pub(crate) fn serve(&mut self, revents: libc::c_short) {
        if revents & libc::POLLIN != 0 {
            self.answer_one();
        } else if revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            // No process has the filter any more: nothing will notify again.
            // SAFETY: our listener, closed once.
            unsafe { libc::close(self.listener) };
            self.listener = -1;
        }
        if let Some(n) = self.throttle.hidden_due(now_ms()) {
            tell_hidden(n);
        }
    }

    /// The command has exited: writes the count of lines not shown, if any.
    pub(crate) fn finish(&mut self) {
        if self.throttle.hidden > 0 {
            tell_hidden(std::mem::take(&mut self.throttle.hidden));
        }
    }

    /// Receives one notification, lets the call proceed, and tells it if it should be.
    fn answer_one(&mut self) {
        // SAFETY: seccomp_notif is plain data; RECV requires it zeroed.
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: RECV fills req, a valid seccomp_notif. ENOENT: the caller died or was
        // interrupted before we took it; nothing to answer.
        if unsafe { libc::ioctl(self.listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) } == -1 {
            return;
        }
        if let Some(guard) = self.guard.as_mut()
            && req.data.nr & !(X32_SYSCALL_BIT as i32) != libc::SYS_socket as i32
        {
            guard.answer(self.listener, &req);
            return;
        }
        if self.raw_icmp {
            crate::raw_icmp::answer(self.listener, &req);
            return;
        }
        let report = self.judge(&req);
        // SAFETY: seccomp_notif_resp is plain data; all-zero is "no error, value 0".
        let mut resp: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
        resp.id = req.id;
        resp.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32;
        // SAFETY: SEND reads resp, a valid seccomp_notif_resp. ENOENT (the caller died or
        // a signal interrupted its call, which is then notified again) needs nothing.
        unsafe { libc::ioctl(self.listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
        let mut buf = [0u8; 400];
        if let Some(report) = report
            && self.throttle.admit(now_ms())
            && !emit(format(&report, &mut buf))
        {
            self.throttle.hidden += 1;
        }
    }

    /// Whether (and what) to tell of this call.
    fn judge(&mut self, req: &libc::seccomp_notif) -> Option<Report> {
        let args = &req.data.args;
        let kind = Kind::of(args[1] as u32 as c_int, args[2] as u32 as c_int);
        let ipv6 = args[0] as u32 as c_int == libc::AF_INET6;
        let ip = req.data.instruction_pointer;
        let relayed = kind == Kind::Relayed;
        // The common case first, without reading anything: libc's own call again, from
        // the same thread.
        if relayed && self.quiet.iter().any(|q| q.tid == req.pid && q.holds(ip)) {
            return None;
        }
        let who = status(req.pid)?;
        if self
            .seen
            .iter()
            .any(|s| s.tgid == who.tgid && s.name() == who.name())
        {
            return None;
        }
        if relayed {
            let known = self
                .quiet
                .iter()
                .find(|q| q.tgid == who.tgid && q.holds(ip));
            let range = match known {
                Some(q) => Some((q.start, q.end)),
                None => self.origin(who.tgid, ip),
            };
            if let Some((start, end)) = range {
                self.quiet[self.next_quiet] = Quiet {
                    tid: req.pid,
                    tgid: who.tgid,
                    start,
                    end,
                };
                self.next_quiet = (self.next_quiet + 1) % QUIET;
                return None;
            }
        }
        // What was read belongs to the caller only if it is still waiting (a dead
        // caller's pid may be another process's by now).
        // SAFETY: ID_VALID reads the u64 id.
        if unsafe { libc::ioctl(self.listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &req.id) } != 0 {
            return None;
        }
        self.seen[self.next_seen] = who;
        self.next_seen = (self.next_seen + 1) % SEEN;
        let handoff = self.guard.is_some();
        Some(Report {
            who,
            ipv6,
            kind,
            handoff,
        })
    }

    /// [`origin`] within the budget of maps the init reads per second.
    fn origin(&mut self, pid: i32, ip: u64) -> Option<(u64, u64)> {
        let now = now_ms();
        if now >= self.maps_since + 1000 {
            (self.maps_since, self.maps_read) = (now, 0);
        }
        let budget = MAPS_PER_SECOND.saturating_sub(self.maps_read).min(MAPS_CAP);
        let (range, read) = origin(pid, ip, self.shim, budget);
        self.maps_read += read;
        range
    }
}

/// The caller's process and name, from `/proc/TID/status`.
fn status(tid: u32) -> Option<Who> {
    let mut buf = [0u8; 1024];
    let n = read_proc(tid, b"/status\0", &mut buf)?;
    parse_status(&buf[..n])
}

/// Opens `/proc/PID{file}` and reads the start of it into `buf`.
pub(crate) fn read_proc(pid: u32, file: &[u8], buf: &mut [u8]) -> Option<usize> {
    let fd = open_proc(pid, file)?;
    let mut have = 0;
    while have < buf.len() {
        // SAFETY: reading into the unfilled rest of buf.
        let n = unsafe { libc::read(fd, buf[have..].as_mut_ptr().cast(), buf.len() - have) };
        if n <= 0 {
            break;
        }
        have += n as usize;
    }
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    Some(have)
}

pub(crate) fn open_proc(pid: u32, file: &[u8]) -> Option<RawFd> {
    let mut path = [0u8; 48];
    let mut at = put(&mut path, 0, b"/proc/");
    at = put_num(&mut path, at, u64::from(pid));
    put(&mut path, at, file);
    // SAFETY: path is NUL-terminated (file ends with a NUL).
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

/// Reads `/proc/PID/maps` (up to `cap` bytes) to find where the call at `ip` came from:
/// libc's range when it is libc's own, `None` when it should be told; and how much was
/// read. Unreadable maps (the caller is gone) count as libc's: nothing is told.
fn origin(pid: i32, ip: u64, shim: &[u8], cap: usize) -> (Option<(u64, u64)>, usize) {
    let mut origin = Origin::new(ip, shim);
    if cap == 0 {
        return (origin.libc_range(false), 0);
    }
    let Some(fd) = open_proc(pid as u32, b"/maps\0") else {
        return (Some((ip, ip + 1)), 0);
    };
    let mut buf = [0u8; 8192];
    let (mut have, mut total) = (0, 0);
    let mut complete = true;
    'read: loop {
        if total >= cap {
            complete = false;
            break;
        }
        // SAFETY: reading into the unfilled rest of buf.
        let n = unsafe { libc::read(fd, buf[have..].as_mut_ptr().cast(), buf.len() - have) };
        if n <= 0 {
            if n == -1 && errno() == libc::EINTR {
                continue;
            }
            break;
        }
        total += n as usize;
        have += n as usize;
        let mut start = 0;
        while let Some(len) = buf[start..have].iter().position(|&b| b == b'\n') {
            if origin.line(&buf[start..start + len]) {
                break 'read;
            }
            start += len + 1;
        }
        buf.copy_within(start..have, 0);
        have -= start;
        if have == buf.len() {
            have = 0; // a line longer than any maps line: drop it
        }
    }
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    (origin.libc_range(complete), total)
}

/// The line for `r`, built in `buf`.
fn format<'b>(r: &Report, buf: &'b mut [u8; 400]) -> &'b [u8] {
    let mut at = put(buf, 0, b"ferry: pid ");
    at = put_num(buf, at, r.who.tgid as u64);
    at = put(buf, at, b" (");
    for &b in r.who.name() {
        // The name is the program's to choose: printable ASCII only.
        buf[at] = if b.is_ascii_graphic() || b == b' ' {
            b
        } else {
            b'?'
        };
        at += 1;
    }
    at = put(buf, at, b"): made an ");
    at = put(buf, at, if r.ipv6 { b"IPv6 " } else { b"IPv4 " });
    at = match r.kind {
        Kind::Relayed if r.handoff => put(
            buf,
            at,
            b"socket without ferry's shim (a static or Go program?): it reaches the --handoff destinations and otherwise only the sandbox's loopback (--net nic or both serves it)",
        ),
        Kind::Relayed => put(
            buf,
            at,
            b"socket without ferry's shim (a static or Go program?): it sees only the sandbox's loopback (--net nic or both serves it)",
        ),
        Kind::Icmp => put(
            buf,
            at,
            b"ICMP socket: ICMP (ping) is not relayed in socket mode, so it reaches only the sandbox's loopback (--net nic or both serves it)",
        ),
        Kind::Raw => put(
            buf,
            at,
            b"raw socket: raw sockets are not relayed in socket mode, so it reaches only the sandbox's loopback (--net nic or both serves it)",
        ),
        Kind::Other { ty, protocol } => {
            at = put(buf, at, b"socket ferry does not relay (type ");
            at = put_num(buf, at, u64::from(ty as u32));
            at = put(buf, at, b", protocol ");
            at = put_num(buf, at, u64::from(protocol as u32));
            put(buf, at, b"): it reaches only the sandbox's loopback")
        }
    };
    at = put(buf, at, b"\n");
    &buf[..at]
}

/// The line for `n` lines not shown.
fn tell_hidden(n: u32) {
    let mut buf = [0u8; 160];
    let mut at = put(&mut buf, 0, "ferry: … and ".as_bytes());
    at = put_num(&mut buf, at, u64::from(n));
    at = put(
        &mut buf,
        at,
        b" more processes made inet sockets ferry does not serve (not shown: at most 20 lines a second)\n",
    );
    emit(&buf[..at]);
}

/// Writes a line to stderr unless that would wait (a full pipe): the init must not.
/// Returns whether it was written.
fn emit(line: &[u8]) -> bool {
    let mut pfd = libc::pollfd {
        fd: libc::STDERR_FILENO,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: pfd is a valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) } == 1 && pfd.revents & libc::POLLOUT != 0;
    if !ready {
        return false;
    }
    // One write: a line shorter than PIPE_BUF is not interleaved with other writers'.
    // SAFETY: line is a valid buffer of the given length.
    let n = unsafe { libc::write(libc::STDERR_FILENO, line.as_ptr().cast(), line.len()) };
    n == line.len() as isize
}

/// CLOCK_MONOTONIC in ms.
pub(crate) fn now_ms() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(arch: u32, nr: u32, family: u64) -> u32 {
        crate::bpf_test::verdict(&filter(0xC000_003E), arch, nr, &[family])
    }

    #[test]
    fn the_filter_notifies_inet_sockets_only() {
        let (x86_64, socket) = (0xC000_003E, libc::SYS_socket as u32);
        let notify = libc::SECCOMP_RET_USER_NOTIF;
        let allow = libc::SECCOMP_RET_ALLOW;
        assert_eq!(verdict(x86_64, socket, libc::AF_INET as u64), notify);
        assert_eq!(verdict(x86_64, socket, libc::AF_INET6 as u64), notify);
        // The kernel takes the domain as an int: high bits do not hide it.
        assert_eq!(
            verdict(x86_64, socket, 1 << 32 | libc::AF_INET as u64),
            notify
        );
        assert_eq!(verdict(x86_64, socket | X32_SYSCALL_BIT, 2), notify);
        assert_eq!(verdict(x86_64, socket, libc::AF_UNIX as u64), allow);
        assert_eq!(verdict(x86_64, socket, libc::AF_NETLINK as u64), allow);
        assert_eq!(verdict(x86_64, libc::SYS_connect as u32, 2), allow);
        // Another architecture's numbers mean other calls.
        assert_eq!(verdict(0x4000_0003, socket, 2), allow);
    }

    #[test]
    fn kinds() {
        let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        assert_eq!(Kind::of(libc::SOCK_STREAM | flags, 0), Kind::Relayed);
        assert_eq!(
            Kind::of(libc::SOCK_STREAM, libc::IPPROTO_TCP),
            Kind::Relayed
        );
        assert_eq!(Kind::of(libc::SOCK_DGRAM, libc::IPPROTO_UDP), Kind::Relayed);
        assert_eq!(Kind::of(libc::SOCK_DGRAM, libc::IPPROTO_ICMP), Kind::Icmp);
        assert_eq!(Kind::of(libc::SOCK_RAW, libc::IPPROTO_ICMPV6), Kind::Icmp);
        assert_eq!(Kind::of(libc::SOCK_RAW, libc::IPPROTO_RAW), Kind::Raw);
        assert_eq!(
            Kind::of(libc::SOCK_SEQPACKET, libc::IPPROTO_SCTP),
            Kind::Other {
                ty: libc::SOCK_SEQPACKET,
                protocol: libc::IPPROTO_SCTP
            }
        );
    }

    #[test]
    fn status_names_the_process() {
        let text = b"Name:\tworker\\n1\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\nNgid:\t0\nPid:\t43\n";
        let who = parse_status(text).unwrap();
        assert_eq!((who.tgid, who.name()), (42, &b"worker\\n1"[..]));
        assert_eq!(parse_status(b"Name:\tx\n"), None);
        assert_eq!(parse_status(b"Name:\tx\nTgid:\t4x\n"), None);
    }

    const MAPS: &[&str] = &[
        "00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/busybox",
        "7f0000000000-7f0000021000 rw-p 00000000 00:00 0",
        "7f1000000000-7f1000028000 r--p 00000000 fd:01 1234    /usr/lib/x86_64-linux-gnu/libc.so.6",
        "7f1000028000-7f100019d000 r-xp 00028000 fd:01 1234    /usr/lib/x86_64-linux-gnu/libc.so.6",
        "7f2000000000-7f2000100000 r-xp 00000000 fd:01 99      /tmp/ferry 1.sandbox/libferry_preload.so (deleted)",
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0       [stack]",
    ];

    fn origin_of(ip: u64, shim: &[u8], lines: &[&str]) -> (Option<(u64, u64)>, usize) {
        let mut o = Origin::new(ip, shim);
        let read = lines
            .iter()
            .position(|l| o.line(l.as_bytes()))
            .map_or(lines.len(), |i| i + 1);
        (o.libc_range(true), read)
    }

    #[test]
    fn a_call_from_libc_in_a_process_with_the_shim_is_libcs_own() {
        let shim = b"/tmp/ferry 1.sandbox/libferry_preload.so";
        let libc_text = (0x7f10_0002_8000, 0x7f10_0019_d000);
        // Decided at the shim's line: the stack is not read.
        assert_eq!(
            origin_of(0x7f10_0003_0000, shim, MAPS),
            (Some(libc_text), 5)
        );
        // Without the shim mapped, or without a shim at all: told.
        assert_eq!(origin_of(0x7f10_0003_0000, shim, &MAPS[..4]).0, None);
        assert_eq!(origin_of(0x7f10_0003_0000, b"", MAPS), (None, 4));
        assert_eq!(
            origin_of(0x7f10_0003_0000, b"/other/libferry_preload.so", MAPS).0,
            None
        );
        // From the program's own code (static, Go) or from anonymous memory: told at once.
        assert_eq!(origin_of(0x0040_1000, shim, MAPS), (None, 1));
        assert_eq!(origin_of(0x7f00_0000_0010, shim, MAPS), (None, 2));
        // Maps cut short before the answer: counted as libc's.
        let mut o = Origin::new(0x7f10_0003_0000, shim);
        assert!(!o.line(MAPS[3].as_bytes()));
        assert_eq!(o.libc_range(false), Some(libc_text));
        assert_eq!(Origin::new(5, shim).libc_range(false), Some((5, 6)));
        // Past the budget of a second, nothing is read.
        assert_eq!(origin(1, 5, shim, 0), (Some((5, 6)), 0));
    }

    #[test]
    fn libc_by_name() {
        assert!(is_libc(b"/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_libc(b"/lib/x86_64-linux-gnu/libc-2.31.so"));
        assert!(is_libc(b"/lib/libc.so.6 (deleted)"));
        assert!(!is_libc(b"/usr/lib/libcap.so.2"));
        assert!(!is_libc(b"/usr/lib/libc-client.so.2007e"));
        assert!(!is_libc(b"/usr/bin/libc.so.6x/busybox"));
        assert!(!is_libc(b""));
    }

    #[test]
    fn at_most_twenty_lines_a_second_then_a_count() {
        let mut t = Throttle {
            start: 0,
            shown: 0,
            hidden: 0,
        };
        let t0 = 10_000;
        assert_eq!(t.timeout(t0), -1);
        let shown = (0..50).filter(|_| t.admit(t0)).count();
        assert_eq!(shown, LINES_PER_SECOND as usize);
        assert_eq!(t.hidden_due(t0 + 999), None);
        assert_eq!(t.timeout(t0 + 400), 600);
        assert_eq!(t.hidden_due(t0 + 1000), Some(30));
        assert_eq!(t.hidden_due(t0 + 1001), None);
        assert_eq!(t.timeout(t0 + 1001), -1);
        // A new second, a new allowance.
        assert!(t.admit(t0 + 1000));
    }

    #[test]
    fn lines_name_the_process_in_printable_ascii() {
        let mut who = Who::NONE;
        who.tgid = 12;
        let name = b"bu\x1b[2Jsy box";
        who.name[..name.len()].copy_from_slice(name);
        who.len = name.len() as u8;
        let line_of = |kind, ipv6, handoff| {
            let mut buf = [0u8; 400];
            let r = Report {
                who,
                ipv6,
                kind,
                handoff,
            };
            String::from_utf8(format(&r, &mut buf).to_vec()).unwrap()
        };
        let line = |kind, ipv6| line_of(kind, ipv6, false);
        assert!(line_of(Kind::Relayed, false, true).contains(
            "it reaches the --handoff destinations and otherwise only the sandbox's loopback"
        ));
        assert_eq!(
            line(Kind::Relayed, false),
            "ferry: pid 12 (bu?[2Jsy box): made an IPv4 socket without ferry's shim (a static or Go program?): it sees only the sandbox's loopback (--net nic or both serves it)\n"
        );
        assert!(
            line(Kind::Icmp, true)
                .contains("made an IPv6 ICMP socket: ICMP (ping) is not relayed in socket mode")
        );
        assert!(line(Kind::Raw, false).contains("made an IPv4 raw socket"));
        assert!(
            line(
                Kind::Other {
                    ty: 5,
                    protocol: 132
                },
                false
            )
            .contains("socket ferry does not relay (type 5, protocol 132)")
        );
    }
}
