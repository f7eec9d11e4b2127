//! Socket operations other than data transfer, each relayed as the protocol says:
//! creation and `accept` on the control socket (they carry a readiness pair's server
//! end), everything else as a tagged request on the ring.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};

use ferry_proto::{
    CMP_HANDOFF, CMP_RENEW_PAIR, Call, Ctl, CtlKind, InlineBytes, MAX_SERVERS, server_of,
};
use libc::{sockaddr, socklen_t};

use crate::addr::{family, read_sockaddr, write_sockaddr};
use crate::carry::Carried;
use crate::chan::{Channel, SLICE, Wait, fill_pair};
use crate::errno::{Errno, Res};
use crate::fdtable::{
    Entry, F_ACCEPTED, F_CLAIMED, F_DGRAM, F_DIRECT, F_INET6, F_NONBLOCK, F_PEER, F_SHUT_WR,
    F_TYPED, F_WANT, STDIO_FDS, Sock, TABLE,
};
use crate::iov::IoCursor;
use crate::log::{self, Once};
use crate::pending::PENDING;
use crate::signals::{self, Counts};
use crate::tls::{with_channel, with_channel_to, with_open_channels};

/// Whether `socket(domain, ty, protocol)` is one ferry relays: inet TCP or UDP.
pub fn relayed(domain: c_int, ty: c_int, protocol: c_int) -> bool {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    (domain == libc::AF_INET || domain == libc::AF_INET6)
        && match base {
            libc::SOCK_STREAM => protocol == 0 || protocol == libc::IPPROTO_TCP,
            libc::SOCK_DGRAM => protocol == 0 || protocol == libc::IPPROTO_UDP,
            _ => false,
        }
}

/// Flags of a newly created socket's cache entry.
fn new_flags(domain: c_int, base_ty: c_int) -> u32 {
    let mut f = F_TYPED;
    if base_ty == libc::SOCK_DGRAM {
        f |= F_DGRAM;
    }
    if domain == libc::AF_INET6 {
        f |= F_INET6;
    }
    f
}

/// The program's end of a new socket's pair, from a `Socket` or `Accept` reply; `EMFILE`
/// when it did not arrive (this process has no free descriptor: the kernel closed it,
/// and the server lets the socket go).
fn delivered(fd: Option<OwnedFd>) -> Res<OwnedFd> {
    fd.ok_or(Errno(libc::EMFILE))
}

/// Applies `SOCK_NONBLOCK`/`SOCK_CLOEXEC` to the program's end of a new socket (named by
/// the server), caches it and hands it to the program.
fn adopt(prog: OwnedFd, id: u32, ty_flags: c_int, flags: u32) -> Res<c_int> {
    let nonblock = ty_flags & libc::SOCK_NONBLOCK != 0;
    if nonblock {
        ferry_sys::set_nonblocking(prog.as_fd(), true)?;
    }
    if ty_flags & libc::SOCK_CLOEXEC == 0 {
        crate::sys::set_cloexec(prog.as_raw_fd(), false)?;
    }
    let fd = prog.into_raw_fd();
    let flags = flags
        | F_CLAIMED
        | if nonblock { F_NONBLOCK } else { 0 }
        | if fd <= STDIO_FDS { F_DIRECT } else { 0 };
    TABLE.set(fd, Entry::Ferry(Sock::new(fd, id, flags)));
    Ok(fd)
}

/// `socket()` for a relayed type.
pub fn socket(domain: c_int, ty: c_int, protocol: c_int) -> Res<c_int> {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    with_channel(|ch| {
        let mut msg = Ctl::new(CtlKind::Socket, 0);
        (msg.a, msg.b, msg.c) = (domain, base, protocol);
        // No `room_for_fd` first: at the descriptor limit the pair's end does not
        // arrive (the kernel closes it, the server hears the socket go) and this says
        // EMFILE all the same; a full table is rare, the check cost 2 calls a socket.
        // The end arrives close-on-exec only if asked, so no F_SETFD clears it.
        let cloexec = ty & libc::SOCK_CLOEXEC != 0;
        let (reply, prog) = ch.ctl_call_as(&msg, None, cloexec)?;
        let id = Errno::check(reply.result)?;
        adopt(
            delivered(prog)?,
            id,
            ty | libc::SOCK_CLOEXEC,
            new_flags(domain, base),
        )
    })
    .map_err(|e| e.down_as(libc::ENETDOWN))
}

/// `accept()`/`accept4()`.
///
/// # Safety
/// `len` null or a readable and writable `socklen_t`, and `addr` null or writable for
/// `*len` bytes (as for `accept(2)`).
pub unsafe fn accept(
    s: Sock,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> Res<c_int> {
    if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    with_channel_to(server_of(s.id), |ch| {
        let s = typed(ch, s)?;
        if s.dgram() {
            return Err(Errno(libc::EOPNOTSUPP));
        }
        let w = Wait::after(TABLE.timeouts(s.fd).0, Errno::EAGAIN);
        let start = signals::counts();
        loop {
            // Always a non-blocking accept: a blocking one waits here, on the listener's
            // readiness token, where signals and SO_RCVTIMEO can end the wait.
            ch.room_for_fd()?;
            let mut msg = Ctl::new(CtlKind::Accept, s.id);
            msg.a = 1;
            let (reply, prog) = ch.ctl_call(&msg, None)?;
            if reply.c == 1 {
                drain_token(ch, &s)?;
            }
            let id = match Errno::check(reply.result) {
                Ok(id) => id,
                Err(Errno::EAGAIN) if !s.nonblock() => {
                    wait_acceptable(ch, &s, w, start)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let fd = adopt(
                delivered(prog)?,
                id,
                flags,
                F_TYPED | F_PEER | F_ACCEPTED | (s.flags & F_INET6),
            )?;
            let peer = &reply.addr[..(reply.addr_len as usize).min(reply.addr.len())];
            // SAFETY: `len` null or valid and `addr` null or writable for `*len` bytes
            // (# Safety), as `write_sockaddr` asks. Its refusal (EFAULT: an address
            // without a length) is ignored: the connection is returned without the
            // peer's address (the kernel's accept fails with EFAULT and drops it).
            let _ = unsafe { write_sockaddr(peer, addr, len) };
            return Ok(fd);
        }
    })
    .map_err(|e| e.down_as(libc::ECONNABORTED))
}

/// Waits (at most one slice) for a listener to become readable: asks for its readiness
/// token, then sleeps in `ppoll` on the program's end. Fails with `EINTR` or the
/// timeout's error as a blocking `accept` would.
fn wait_acceptable(ch: &mut Channel, s: &Sock, w: Wait, start: Counts) -> Res<()> {
    if !matches!(TABLE.get(s.fd), Entry::Ferry(e) if e.wants_tokens()) {
        ch.push(Call::WantToken { sock: s.id })?;
        TABLE.update(s.fd, F_WANT, 0);
    }
    ch.flush();
    wait_readable(ch, s.fd, w, start)
}

/// Sleeps (at most one slice of `w`) in `ppoll` until the program's end `fd` is
/// readable. Fails with `EINTR` or the timeout's error as the kernel's blocking call
/// would, or when the channel is gone.
pub fn wait_readable(ch: &mut Channel, fd: c_int, w: Wait, start: Counts) -> Res<()> {
    let ms = w.slice().as_millis().clamp(1, SLICE.as_millis()) as i32;
    // SAFETY: `fd` is the program's end of a ferry socket, borrowed for this `ppoll`
    // only (crate docs, Borrowed descriptors).
    let r = ferry_sys::poll_wait(unsafe { ferry_sys::borrow(fd) }, libc::POLLIN, ms);
    let eintr = matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::Interrupted);
    if let Err(e) = r
        && !eintr
    {
        return Err(Errno::from_io(&e));
    }
    if w.interrupted(start, eintr) {
        return Err(Errno::EINTR);
    }
    if w.passed() {
        return Err(w.expired);
    }
    ch.check_alive()
}

/// Reads the readiness token out of the program's end and tells the server.
pub fn drain_token(ch: &mut Channel, s: &Sock) -> Res<()> {
    // The server may have written more than one byte (one per new-data edge, for
    // edge-triggered epoll): take them all.
    while let Ok(n) = crate::sys::recv_bytes(s.fd, libc::MSG_DONTWAIT) {
        if n < 64 {
            break;
        }
    }
    ch.push(Call::TokenDrained { sock: s.id })
}

/// Makes sure this process may act on socket `s` at its server: a socket this process
/// did not make or accept (inherited across `fork` or `exec`, received with
/// `SCM_RIGHTS`) is claimed once, with its descriptor as the proof.
pub fn claimed(ch: &mut Channel, s: Sock) -> Res<Sock> {
    if s.flags & F_CLAIMED != 0 {
        return Ok(s);
    }
    // SAFETY: the program's end of `s`, borrowed for the claim only (crate docs,
    // Borrowed descriptors).
    let fd = unsafe { ferry_sys::borrow(s.fd) };
    let (reply, _) = ch.ctl_call(&Ctl::new(CtlKind::Claim, s.id), Some(fd))?;
    Errno::check(reply.result)?;
    TABLE.update_id(s.id, F_CLAIMED, 0);
    Ok(Sock {
        flags: s.flags | F_CLAIMED,
        ..s
    })
}

/// Completes the cache entry of a socket identified by its name (the cache may also
/// have been cleared behind this process's back, e.g. by a `vfork` child's
/// `close_range`): type, family, timeouts and whether it has a peer come from the
/// server, once. Claims the socket first if this process has not.
pub fn typed(ch: &mut Channel, s: Sock) -> Res<Sock> {
    let s = claimed(ch, s)?;
    if s.typed() {
        return Ok(s);
    }
    let int = |ch: &mut Channel, name| {
        let b = getopt(ch, &s, libc::SOL_SOCKET, name, 4)?;
        Ok::<_, Errno>(c_int::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let ty = int(ch, libc::SO_TYPE)?;
    let domain = int(ch, libc::SO_DOMAIN)?;
    for (name, send) in [(libc::SO_RCVTIMEO, false), (libc::SO_SNDTIMEO, true)] {
        let tv = getopt(ch, &s, libc::SOL_SOCKET, name, size_of::<libc::timeval>());
        let us = tv.ok().and_then(|b| timeval_us(&b)).unwrap_or(0);
        TABLE.set_timeout(s.fd, send, us);
    }
    let mut set = new_flags(domain, ty);
    let peer = ch.call(
        Call::PeerName { sock: s.id, tag: 0 },
        Wait::FOREVER,
        &mut |_, _| {},
    )?;
    if peer.result >= 0 {
        set |= F_PEER;
    }
    TABLE.update(s.fd, set, 0);
    Ok(Sock {
        flags: s.flags | set,
        ..s
    })
}

/// A short option value (at least `len` bytes; zero-padded to 32).
fn getopt(ch: &mut Channel, s: &Sock, level: c_int, name: c_int, len: usize) -> Res<[u8; 32]> {
    let req = Call::GetOpt {
        sock: s.id,
        tag: 0,
        level,
        name,
        len: len as u32,
    };
    let done = ch.call(req, Wait::FOREVER, &mut |_, _| {})?;
    Errno::check(done.result)?;
    let b = done.bytes();
    if b.len() < len {
        return Err(Errno::EIO);
    }
    let mut out = [0u8; 32];
    out[..b.len()].copy_from_slice(b);
    Ok(out)
}

/// A tagged request about socket `s` with no data; returns the `Done` result.
fn simple(s: &Sock, call: Call, w: Wait) -> Res<(u32, ferry_proto::Cmp)> {
    let done = simple_cmp(s, call, w)?;
    Ok((Errno::check(done.result)?, done))
}

/// [`simple`], returning the completion whatever its result.
fn simple_cmp(s: &Sock, call: Call, w: Wait) -> Res<ferry_proto::Cmp> {
    with_channel_to(server_of(call.sock()), |ch| {
        claimed(ch, *s)?;
        ch.call(call, w, &mut |_, _| {})
    })
    .map_err(|e| e.down_as(libc::ECONNRESET))
}

/// A `Connect` request and its completion; for one answered with `CMP_HANDOFF`, the
/// host socket the server sends right after on the same channel (one round trip).
fn connect_cmp(s: &Sock, call: Call, w: Wait) -> Res<(ferry_proto::Cmp, Option<OwnedFd>)> {
    with_channel_to(server_of(call.sock()), |ch| {
        claimed(ch, *s)?;
        let done = ch.call(call, w, &mut |_, _| {})?;
        if done.flags & CMP_HANDOFF == 0 {
            return Ok((done, None));
        }
        let host = delivered(ch.take_handed_off(s.id)?)?;
        Ok((done, Some(host)))
    })
    .map_err(|e| e.down_as(libc::ECONNRESET))
}

/// `connect()`.
///
/// # Safety
/// `addr` null or readable for `len` bytes.
pub unsafe fn connect(s: Sock, addr: *const sockaddr, len: socklen_t) -> Res<()> {
    // SAFETY: `addr` null or readable for `len` bytes (# Safety), as `family` asks.
    if unsafe { family(addr, len) } == Some(libc::AF_UNSPEC) {
        if s.dgram() {
            // Dissolves the association: sends need an address again.
            simple(&s, Call::Disconnect { sock: s.id, tag: 0 }, Wait::FOREVER)?;
            TABLE.update_id(s.id, 0, F_PEER);
            return Ok(());
        }
        log::once(
            Once::Unsupported,
            format_args!("connect(AF_UNSPEC) on a stream (a reset) is not supported"),
        );
        return Err(Errno(libc::EAFNOSUPPORT));
    }
    // SAFETY: `addr` null or readable for `len` bytes (# Safety), as `read_sockaddr`
    // asks.
    let wa = unsafe { read_sockaddr(addr, len) }?;
    let (_, snd) = TABLE.timeouts(s.fd);
    let mut renewed = false;
    let r = loop {
        // A connection in progress polls unwritable, as the kernel's socket does
        // (programs poll for POLLOUT, then connect again or read SO_ERROR).
        let filled = s.nonblock() && !s.dgram() && (!s.has_peer() || renewed);
        if filled {
            // Filled before the request so that the server's read of the filler — when
            // the connect is answered, or when it completes — always comes after it.
            fill_pair(s.fd);
        }
        let req = Call::Connect {
            sock: s.id,
            tag: 0,
            addr: wa,
            nonblock: s.nonblock(),
            filled,
        };
        let w = Wait::after(snd, Errno(libc::EINPROGRESS));
        match connect_cmp(&s, req, w)? {
            (done, _) if done.flags & CMP_RENEW_PAIR != 0 && !renewed => {
                renew_pair(&s)?;
                renewed = true;
            }
            (done, Some(host)) => return take_handoff(&s, done.result, snd, host),
            (done, None) => break Errno::check(done.result).map(drop),
        }
    };
    match r {
        Err(Errno(libc::EINPROGRESS)) if s.dgram() => {}
        Ok(()) | Err(Errno(libc::EINPROGRESS)) => TABLE.update_id(s.id, F_PEER, 0),
        // A stream whose connect failed is unconnected again (a connected one's says
        // EISCONN; one in progress EALREADY).
        Err(Errno(libc::EISCONN | libc::EALREADY)) => {}
        Err(_) if !s.dgram() => TABLE.update_id(s.id, 0, F_PEER),
        Err(_) => {}
    }
    r
}

/// After a connect answered with `CMP_RENEW_PAIR`: asks the server for a new readiness
/// pair for stream `s` (its old end is the proof) and puts the new end in the fd's
/// place, keeping the fd's flags, signal owner and epoll registrations (`carry`). Another process holding the same socket (a fork's,
/// say) keeps the old, hung-up end.
fn renew_pair(s: &Sock) -> Res<()> {
    with_channel_to(server_of(s.id), |ch| {
        ch.room_for_fd()?;
        // SAFETY: the program's end of `s`, borrowed as the proof for this request only
        // (crate docs, Borrowed descriptors).
        let old = unsafe { ferry_sys::borrow(s.fd) };
        let (reply, prog) = ch.ctl_call(&Ctl::new(CtlKind::Renew, s.id), Some(old))?;
        Errno::check(reply.result)?;
        let prog = delivered(prog)?;
        // The fd's flags, signal owner and epoll registrations go to the new file.
        let carried = Carried::take(s.fd);
        // SAFETY: both are open descriptors of this process; the fd number stays the
        // program's (dup3 replaces what it names in one step).
        if unsafe { crate::real::dup3(prog.as_raw_fd(), s.fd, carried.cloexec()) } < 0 {
            return Err(Errno::from_io(&std::io::Error::last_os_error()));
        }
        carried.give(s.fd);
        Ok(())
    })
    .map_err(|e| e.down_as(libc::ECONNABORTED))
}

/// After a connect answered with `CMP_HANDOFF` (`result` 0 or `-EINPROGRESS`): puts
/// stream `s`'s host socket (`host`, sent by the server with the answer) in the fd's
/// place, carrying the fd's flags, signal owner and epoll registrations (`carry`);
/// from then on the fd is the kernel's socket and the shim leaves it alone. A blocking
/// connect still in progress waits here (within `SO_SNDTIMEO`, `snd` µs), as the
/// kernel's does. Other descriptors of the socket (dups made before the connect, a
/// fork's) keep the old pair, which the server no longer serves.
fn take_handoff(s: &Sock, result: i32, snd: u64, host: OwnedFd) -> Res<()> {
    let in_progress = match Errno::check(result) {
        Ok(_) => false,
        Err(Errno(libc::EINPROGRESS)) => true,
        Err(e) => return Err(e),
    };
    let (rcv, _) = TABLE.timeouts(s.fd);
    let epoll = crate::fdcalls::EPOLL_ADDED.load(std::sync::atomic::Ordering::Relaxed);
    let carried = Carried::take_with(s.fd, epoll);
    // SAFETY: both are open descriptors of this process; the fd number stays the
    // program's (dup3 replaces what it names in one step).
    if unsafe { crate::real::dup3(host.as_raw_fd(), s.fd, carried.cloexec()) } < 0 {
        return Err(Errno::from_io(&std::io::Error::last_os_error()));
    }
    drop(host);
    TABLE.set(s.fd, Entry::Other);
    // SAFETY: `s.fd` is open (just made by dup3) and stays open for this call.
    let fd = unsafe { ferry_sys::borrow(s.fd) };
    for (name, us) in [(libc::SO_RCVTIMEO, rcv), (libc::SO_SNDTIMEO, snd)] {
        if us != 0 {
            let _ = ferry_sys::setsockopt(fd.as_fd(), libc::SOL_SOCKET, name, &timeval(us));
        }
    }
    let outcome = match (in_progress, s.nonblock()) {
        (false, _) => Ok(()),
        (true, true) => Err(Errno(libc::EINPROGRESS)),
        (true, false) => finish_blocking_connect(fd.as_fd(), snd),
    };
    // The program's O_NONBLOCK (and O_ASYNC) replace the server's, whatever the outcome.
    carried.give(s.fd);
    outcome
}

/// `us` microseconds as a `timeval`'s bytes.
fn timeval(us: u64) -> [u8; std::mem::size_of::<libc::timeval>()] {
    let tv = libc::timeval {
        tv_sec: libc::time_t::try_from(us / 1_000_000).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::try_from(us % 1_000_000).unwrap_or(0),
    };
    // SAFETY: timeval is plain integers; its bytes are what setsockopt reads.
    unsafe { std::mem::transmute(tv) }
}

/// A blocking connect on a handed-off socket still in progress: waits for it to end
/// (`snd` µs at most, 0 = for ever; `EINPROGRESS` past that, as the kernel says) and
/// returns its outcome (`SO_ERROR`).
fn finish_blocking_connect(fd: std::os::fd::BorrowedFd<'_>, snd: u64) -> Res<()> {
    let ms = if snd == 0 {
        -1
    } else {
        i32::try_from(snd.div_ceil(1000)).unwrap_or(i32::MAX)
    };
    let rev = ferry_sys::poll_wait(fd, libc::POLLOUT, ms).map_err(|e| Errno::from_io(&e))?;
    if rev == 0 {
        return Err(Errno(libc::EINPROGRESS));
    }
    match ferry_sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
        Ok(0) => Ok(()),
        Ok(e) => Err(Errno(e)),
        Err(e) => Err(Errno::from_io(&e)),
    }
}

/// `bind()`.
///
/// # Safety
/// `addr` null or readable for `len` bytes.
pub unsafe fn bind(s: Sock, addr: *const sockaddr, len: socklen_t) -> Res<()> {
    // SAFETY: `addr` null or readable for `len` bytes (# Safety), as `family` asks.
    let wa = if unsafe { family(addr, len) } == Some(libc::AF_UNSPEC) && len as usize >= 16 {
        // The kernel's compatibility rule: AF_UNSPEC with INADDR_ANY means AF_INET.
        let mut b = [0u8; 16];
        // SAFETY: `family` found a family, so `addr` is non-null, and it is readable for
        // `len >= 16` bytes (checked; # Safety); `b` is a local.
        unsafe { std::ptr::copy_nonoverlapping(addr.cast::<u8>(), b.as_mut_ptr(), 16) };
        if b[4..8] != [0; 4] {
            return Err(Errno(libc::EAFNOSUPPORT));
        }
        b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        // SAFETY: `b` holds 16 bytes.
        unsafe { read_sockaddr(b.as_ptr().cast(), 16) }?
    } else {
        // SAFETY: `addr` null or readable for `len` bytes (# Safety), as `read_sockaddr`
        // asks.
        unsafe { read_sockaddr(addr, len) }?
    };
    let req = Call::Bind {
        sock: s.id,
        tag: 0,
        addr: wa,
    };
    simple(&s, req, Wait::FOREVER).map(drop)
}

/// `listen()`.
pub fn listen(s: Sock, backlog: c_int) -> Res<()> {
    let req = Call::Listen {
        sock: s.id,
        tag: 0,
        backlog,
    };
    simple(&s, req, Wait::FOREVER)?;
    // A listener never polls writable in the kernel; its pair stays full (a second
    // `listen` finds it full already).
    fill_pair(s.fd);
    Ok(())
}

/// `shutdown()`.
pub fn shutdown(s: Sock, how: c_int) -> Res<()> {
    if !(libc::SHUT_RD..=libc::SHUT_RDWR).contains(&how) {
        return Err(Errno::EINVAL);
    }
    let req = Call::Shutdown {
        sock: s.id,
        tag: 0,
        how,
    };
    simple(&s, req, Wait::FOREVER)?;
    if how != libc::SHUT_RD {
        TABLE.update_id(s.id, F_SHUT_WR, 0);
    }
    if how != libc::SHUT_WR {
        // The program's end then polls readable (EOF) for good, as the kernel's would.
        // SAFETY: the program's end of `s`, for this `shutdown` only (crate docs,
        // Borrowed descriptors).
        let _ = ferry_sys::shutdown(unsafe { ferry_sys::borrow(s.fd) }, libc::SHUT_RD);
    }
    Ok(())
}

/// `getsockname()` / `getpeername()`.
///
/// # Safety
/// `len` null or a readable and writable `socklen_t`, and `addr` null or writable for
/// `*len` bytes (as for `getsockname(2)`).
pub unsafe fn name(s: Sock, peer: bool, addr: *mut sockaddr, len: *mut socklen_t) -> Res<()> {
    if len.is_null() {
        return Err(Errno::EFAULT);
    }
    let (sock, tag) = (s.id, 0);
    let req = if peer {
        Call::PeerName { sock, tag }
    } else {
        Call::SockName { sock, tag }
    };
    let (_, done) = simple(&s, req, Wait::FOREVER)?;
    // SAFETY: `len` is non-null (checked above) and valid, `addr` null or writable for
    // `*len` bytes (# Safety), as `write_sockaddr` asks.
    unsafe { write_sockaddr(done.bytes(), addr, len) }
}

/// `ioctl(FIONREAD)`: asked of the server, or, for a connected stream whose bytes come
/// through its fd (`rx_pair`), of the fd.
pub fn pending(s: Sock) -> Res<c_int> {
    if s.reads_pair() {
        let mut n: c_int = 0;
        // SAFETY: FIONREAD on the program's own fd writes one int.
        let r = unsafe { crate::real::ioctl(s.fd, libc::FIONREAD as _, (&raw mut n).cast()) };
        return if r < 0 {
            Err(Errno::from_io(&std::io::Error::last_os_error()))
        } else {
            Ok(n)
        };
    }
    let req = Call::Pending { sock: s.id, tag: 0 };
    simple(&s, req, Wait::FOREVER).map(|(n, _)| n as c_int)
}

/// `setsockopt()`: relayed (values of at most 32 bytes); receive and send timeouts are
/// also kept in the cache, since the shim does the waiting.
///
/// # Safety
/// `val` null or readable for `len` bytes.
pub unsafe fn setsockopt(
    s: Sock,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> Res<()> {
    let len = len as usize;
    if len > InlineBytes::MAX {
        log::once(
            Once::LongOpt,
            format_args!("setsockopt({level}, {name}) with a {len}-byte value is not supported"),
        );
        return Err(Errno::EINVAL);
    }
    if val.is_null() && len > 0 {
        return Err(Errno::EFAULT);
    }
    let mut bytes = [0u8; 32];
    if len > 0 {
        // SAFETY: `val` is non-null here (checked above) and readable for `len` bytes
        // (# Safety); `bytes` is a local of 32 >= `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(val.cast::<u8>(), bytes.as_mut_ptr(), len) };
    }
    let req = Call::SetOpt {
        sock: s.id,
        tag: 0,
        level,
        name,
        value: InlineBytes::new(&bytes[..len]).ok_or(Errno::EINVAL)?,
    };
    if unanswered_opt(&s, level, name, len) {
        return with_channel_to(server_of(s.id), |ch| {
            claimed(ch, s)?;
            // This thread now has a record about the stream that may still wait in its
            // ring: another thread's `getsockopt` of the option asks for order first.
            TABLE.sender_changed(s.fd, ch.tid);
            ch.push(req)
        })
        .map_err(|e| e.down_as(libc::ECONNRESET));
    }
    simple(&s, req, Wait::FOREVER)?;
    if level == libc::SOL_SOCKET
        && (name == libc::SO_RCVTIMEO || name == libc::SO_SNDTIMEO)
        && let Some(us) = timeval_us(&bytes[..len])
    {
        TABLE.set_timeout(s.fd, name == libc::SO_SNDTIMEO, us);
    }
    if level == libc::SOL_SOCKET && name == libc::SO_SNDBUF && len >= 4 {
        let v = c_int::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        TABLE.set_send_budget(s.id, send_budget(v));
    }
    if crate::config::rx_pair()
        && level == libc::SOL_SOCKET
        && (name == libc::SO_RCVTIMEO || name == libc::SO_RCVLOWAT)
    {
        // With `rx_pair` a stream's receives are the kernel's own on this fd: give it
        // the same timeout and low-water mark.
        // SAFETY: `len` readable bytes at `bytes`.
        let _ = unsafe {
            crate::real::setsockopt(s.fd, level, name, bytes.as_ptr().cast(), len as socklen_t)
        };
    }
    Ok(())
}

/// Whether `setsockopt(level, name)` with a `len`-byte value on `s` goes out unanswered
/// (`SetOpt` with no tag), as sends do: `TCP_NODELAY` on a stream with an `int`, which
/// the kernel's TCP takes whatever its value and state (the server refuses no value of
/// it), so there is no error to wait for. Set by most clients right after `socket` or
/// `connect` (wrk, curl, libpq, redis clients): one round trip less a connection. Read
/// back by `getsockopt` only, which asks for order first when another thread set it
/// ([`getsockopt`]).
fn unanswered_opt(s: &Sock, level: c_int, name: c_int, len: usize) -> bool {
    (level, name) == (libc::IPPROTO_TCP, libc::TCP_NODELAY)
        && len >= size_of::<c_int>()
        && s.typed()
        && !s.dgram()
}

/// The bytes a stream may hold in its send buffer once the program set `SO_SNDBUF`
/// to `v`: the kernel doubles the value (for its bookkeeping) and keeps at least its
/// minimum. The upper clamp (`wmem_max`) is not applied: a large value leaves ferry's
/// own limits in charge anyway.
fn send_budget(v: c_int) -> u64 {
    /// The kernel's `SOCK_MIN_SNDBUF` on 64-bit machines.
    const MIN: u64 = 4608;
    (u64::from(v.max(0).cast_unsigned()) * 2).max(MIN)
}

/// A `struct timeval` option value in microseconds.
fn timeval_us(b: &[u8]) -> Option<u64> {
    if b.len() < size_of::<libc::timeval>() {
        return None;
    }
    let sec = i64::from_ne_bytes(b[0..8].try_into().ok()?);
    let usec = i64::from_ne_bytes(b[8..16].try_into().ok()?);
    if sec < 0 {
        return Some(0);
    }
    Some(
        (sec as u64)
            .saturating_mul(1_000_000)
            .saturating_add(usec.max(0) as u64),
    )
}

/// `getsockopt()`: relayed; a pending asynchronous error answers `SO_ERROR` first.
///
/// # Safety
/// `len` null or a readable and writable `socklen_t`; `val` null or writable for `*len`
/// bytes.
pub unsafe fn getsockopt(
    s: Sock,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> Res<()> {
    if len.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: `len` is non-null (checked above), so a readable socklen_t (# Safety).
    let room = unsafe { len.read() } as c_int;
    if room < 0 {
        return Err(Errno::EINVAL);
    }
    let room = room as usize;
    if val.is_null() && room > 0 {
        return Err(Errno::EFAULT);
    }
    let so_error = level == libc::SOL_SOCKET && name == libc::SO_ERROR;
    if so_error {
        // The kernel clears a socket's error when it is read: the error the server
        // gave the program's end of the pair after a failed connect (its POLLERR) goes
        // with the one the host socket answers.
        // SAFETY: the program's end of `s`, for this query only (crate docs, Borrowed
        // descriptors).
        let fd = unsafe { ferry_sys::borrow(s.fd) };
        let _ = ferry_sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR);
    }
    let iov = libc::iovec {
        iov_base: val,
        iov_len: room,
    };
    // SAFETY: `iov` (a local that outlives the cursor) names `val`, which is null only
    // with `room` 0 (checked above) and else writable for `room` = `*len` bytes
    // (# Safety).
    let mut cur = unsafe { IoCursor::new(&iov, 1) }?;
    let mut from_buf = None;
    let done = with_channel_to(server_of(s.id), |ch| {
        claimed(ch, s)?;
        if so_error {
            ch.reap()?;
            // EPIPE is a send-side condition: SO_ERROR never reports it.
            if let Some(e) = PENDING.take(s.id, |e| e != libc::EPIPE) {
                let v = e.to_ne_bytes();
                let n = room.min(4);
                // SAFETY: `v` is a local holding 4 >= `n` bytes, outside the program's
                // buffer.
                from_buf = Some(unsafe { cur.write_from(v.as_ptr(), n) });
                return Ok(None);
            }
        }
        if unanswered_opt(&s, level, name, size_of::<c_int>()) {
            // Another thread's unanswered `setsockopt` of it may still wait in its ring.
            crate::data::after_other_senders(ch, &s)?;
        }
        let req = Call::GetOpt {
            sock: s.id,
            tag: 0,
            level,
            name,
            len: room as u32,
        };
        let done = ch.call(req, Wait::FOREVER, &mut |bufs, span| {
            // SAFETY: `span` was checked against the region (`Buffers::span`), so its
            // `len` bytes at that pointer are inside the shim's mapping, which the
            // program's buffer is not; the buffer is lent to us until this call returns
            // it (a server writing it meanwhile changes only the bytes copied).
            from_buf = Some(unsafe { cur.write_from(bufs.as_mut_ptr(span), span.len() as usize) });
        })?;
        Errno::check(done.result)?;
        Ok(Some(done))
    })
    .map_err(|e| e.down_as(libc::ECONNRESET))?;
    let n = match (from_buf, done) {
        (Some(n), _) => n,
        (None, Some(done)) => {
            let b = done.bytes();
            // SAFETY: `b` is the completion's own bytes, readable for its length and
            // outside the program's buffer.
            unsafe { cur.write_from(b.as_ptr(), b.len()) }
        }
        (None, None) => 0,
    };
    // SAFETY: `len` is non-null (checked above), so a writable socklen_t (# Safety).
    unsafe { len.write(n as socklen_t) };
    Ok(())
}

/// Asks for readiness tokens on sockets about to be polled (first time each), then rings
/// the doorbell.
///
/// Called on the way to libc's `poll`/`select`/`epoll_*`, outside [`crate::exports::boundary`]:
/// it catches panics itself and never fails (a socket without tokens is simply never
/// reported readable, which the log says).
pub fn want_tokens(socks: &[Sock]) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // Each socket's server writes its tokens: ask each server for its own sockets.
        let mut servers = [false; MAX_SERVERS];
        for s in socks {
            servers[server_of(s.id)] = true;
        }
        for (server, _) in servers.iter().enumerate().filter(|(_, on)| **on) {
            with_channel_to(server, |ch| {
                let mine = socks.iter().filter(|s| server_of(s.id) == server);
                let mut last = None;
                for s in mine {
                    claimed(ch, *s)?;
                    ch.push(Call::WantToken { sock: s.id })?;
                    TABLE.update(s.fd, F_WANT, 0);
                    if !s.reads_pair() {
                        last = Some(s.id);
                    }
                }
                // A barrier: once a tagged request sent after them is answered, the
                // server has handled the requests for tokens (it takes records in order)
                // and written the tokens of sockets already readable, so even a poll with
                // no timeout that follows sees them. Not for a stream whose received
                // bytes come through the fd (connected, connecting or accepted, with
                // `rx_pair`): no token is written for it, the server moves its bytes
                // into the fd whenever the host socket has some, asked or not, so there
                // is nothing to wait for (wrk's `epoll_ctl` after each non-blocking
                // `connect` waited a round trip for it).
                match last {
                    Some(last) => {
                        let barrier = Call::Pending { sock: last, tag: 0 };
                        ch.call(barrier, Wait::FOREVER, &mut |_, _| {})?;
                    }
                    None => ch.flush(),
                }
                Ok(())
            })?;
        }
        Ok::<(), Errno>(())
    }));
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::once(
            Once::Internal,
            format_args!("cannot ask for readiness tokens: errno {}", e.0),
        ),
        Err(_) => log::once(
            Once::Panic,
            format_args!("internal error (panic) asking for readiness tokens"),
        ),
    }
}

/// After the program closed an fd of socket `s`: lets the server close the host socket
/// now if that was the last reference, so that `close` frees a port as the kernel's does.
/// A connected stream's port stays taken after the kernel's `close` too (the connection
/// ends after it), so its `close` does not wait for the server's: the request goes out
/// (the doorbell rung), unanswered, behind the socket's sends. Uses this thread's
/// channel to the socket's server only if it has one (never opens one just for this).
pub fn release(s: &Sock) {
    let id = s.id;
    if PENDING.has(id) && !TABLE.names(id) {
        // No descriptor can report it any more.
        PENDING.forget(id);
    }
    let connected = s.typed() && !s.dgram() && s.has_peer();
    let r = catch_unwind(AssertUnwindSafe(|| {
        with_open_channels(Some(server_of(id)), |ch| {
            let req = Call::Release { sock: id, tag: 0 };
            if connected {
                if ch.push(req).is_ok() {
                    ch.flush();
                }
                return;
            }
            let _ = ch.call(req, Wait::FOREVER, &mut |_, _| {});
        })
    }));
    if r.is_err() {
        log::once(
            Once::Panic,
            format_args!("internal error (panic) releasing a socket"),
        );
    }
}

/// Rings this thread's doorbells if records wait for them (before a call that may
/// block). Never fails, never panics (it runs outside the boundary too).
pub fn flush() {
    if catch_unwind(|| with_open_channels(None, Channel::flush)).is_err() {
        log::once(
            Once::Panic,
            format_args!("internal error (panic) ringing the doorbell"),
        );
    }
}

/// Counts a wait that spun out and now sleeps in the kernel, on this thread's first open
/// channel (see [`Channel::count_kernel_sleep`]); uncounted when the thread has none.
pub fn count_kernel_sleep() {
    let mut counted = false;
    let _ = catch_unwind(AssertUnwindSafe(|| {
        with_open_channels(None, |ch| {
            if !counted {
                ch.count_kernel_sleep();
                counted = true;
            }
        })
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_types() {
        assert!(relayed(libc::AF_INET, libc::SOCK_STREAM, 0));
        assert!(relayed(
            libc::AF_INET6,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::IPPROTO_UDP
        ));
        assert!(relayed(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_TCP));
        assert!(!relayed(
            libc::AF_INET,
            libc::SOCK_STREAM,
            libc::IPPROTO_UDP
        ));
        assert!(!relayed(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP));
        assert!(!relayed(
            libc::AF_INET,
            libc::SOCK_DGRAM,
            libc::IPPROTO_ICMP
        ));
        assert!(!relayed(libc::AF_UNIX, libc::SOCK_STREAM, 0));
        assert!(!relayed(libc::AF_NETLINK, libc::SOCK_DGRAM, 0));
        assert!(!relayed(libc::AF_INET, libc::SOCK_SEQPACKET, 0));
    }

    #[test]
    fn new_socket_flags() {
        assert_eq!(new_flags(libc::AF_INET, libc::SOCK_STREAM), F_TYPED);
        assert_eq!(
            new_flags(libc::AF_INET6, libc::SOCK_DGRAM),
            F_TYPED | F_DGRAM | F_INET6
        );
    }

    #[test]
    fn timevals() {
        let tv = |s: i64, us: i64| [s.to_ne_bytes(), us.to_ne_bytes()].concat();
        assert_eq!(timeval_us(&tv(1, 500_000)), Some(1_500_000));
        assert_eq!(timeval_us(&tv(0, 0)), Some(0));
        assert_eq!(timeval_us(&tv(-1, 0)), Some(0));
        assert_eq!(timeval_us(&tv(i64::MAX, 0)), Some(u64::MAX));
        assert_eq!(timeval_us(&[0; 8]), None);
    }
}
