//! COMPAT 8 (part 1) — the other ways into a socket: `accept4`, `readv`/`writev`,
//! `sendfile`, `splice`, `getsockname`/`getpeername`, `shutdown`, `ioctl`, plain
//! `read`/`write`/`close`, zero-length calls, `recvfrom` on TCP, the glibc `__*_chk`
//! fortified entry points and stdio on a socket.

use libc::{c_int, c_long, c_void, size_t, ssize_t};

use super::{Case, Res};
use crate::flags::poll_names;
use crate::net::{
    Addr, at_mark, fionread, listener, local_addr, peer_addr, recv, recv_exact, recv_text, send,
    tcp_pair, tcp_socket, wait_for,
};
use crate::sys::{Ctx, Fd, cloexec_state, nonblock_state, pipe, show};

pub const CASES: &[Case] = &[
    Case::new("io.accept4_flags", accept4_flags),
    Case::new("io.accept_peer_addr", accept_peer_addr),
    Case::new("io.accept_short_addrlen", accept_short_addrlen),
    Case::new(
        "io.listen_backlog_multiple_accepts",
        listen_backlog_multiple_accepts,
    ),
    Case::new("io.readv_writev", readv_writev),
    Case::new("io.sendfile_file_to_socket", sendfile_file_to_socket),
    Case::new("io.splice_socket_to_pipe", splice_socket_to_pipe),
    Case::new("io.splice_pipe_to_socket", splice_pipe_to_socket),
    Case::new("io.getsockname_getpeername", getsockname_getpeername),
    Case::new("io.shutdown_wr_half_close", shutdown_wr_half_close),
    Case::new("io.shutdown_rd", shutdown_rd),
    Case::new("io.ioctl_fionread_siocatmark", ioctl_fionread_siocatmark),
    Case::new("io.read_write_close", read_write_close),
    Case::new("io.zero_length_calls", zero_length_calls),
    Case::new("io.recvfrom_tcp", recvfrom_tcp),
    Case::new("io.sendto_connected_tcp", sendto_connected_tcp),
    Case::new("io.msg_trunc_discards_tcp", msg_trunc_discards_tcp),
    Case::new("io.seek_espipe", seek_espipe),
    Case::new("io.fortified_chk", fortified_chk),
    Case::new("io.fortified_poll_fdelt", fortified_poll_fdelt),
    Case::new("io.stdio_fdopen", stdio_fdopen),
    Case::new("io.stdio_mixed_with_send", stdio_mixed_with_send),
    Case::new("io.stdio_header_then_sendfile", stdio_header_then_sendfile),
];

unsafe extern "C" {
    fn __recv_chk(
        fd: c_int,
        buf: *mut c_void,
        len: size_t,
        buflen: size_t,
        flags: c_int,
    ) -> ssize_t;
    fn __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t;
    fn __recvfrom_chk(
        fd: c_int,
        buf: *mut c_void,
        len: size_t,
        buflen: size_t,
        flags: c_int,
        from: *mut libc::sockaddr,
        fromlen: *mut libc::socklen_t,
    ) -> ssize_t;
    fn __poll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int, fdslen: size_t)
    -> c_int;
    fn __fdelt_chk(fd: c_long) -> c_long;
}

fn accept4_flags() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    crate::net::connect(c.raw(), &addr).ctx("connect")?;
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    let (na, nl) = (std::ptr::null_mut(), std::ptr::null_mut());
    let a = Fd::new(sys!(libc::accept4(l.raw(), na, nl, flags)).ctx("accept4")?);
    let bad = show(sys!(libc::accept4(l.raw(), na, nl, 0x1234)));
    Ok(format!(
        "{} {} recv={} bad_flags={bad}",
        nonblock_state(a.raw()),
        cloexec_state(a.raw()),
        recv_text(a.raw(), 8, 0)
    ))
}

fn accept_peer_addr() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    crate::net::connect(c.raw(), &addr).ctx("connect")?;
    let mut peer = Addr::empty();
    let _a = Fd::new(sys!(libc::accept(l.raw(), peer.ptr_mut(), peer.len_mut())).ctx("accept")?);
    let client_port = local_addr(c.raw()).ctx("getsockname")?.port();
    Ok(format!(
        "peer={} len={} is_client={}",
        peer.describe(),
        peer.len(),
        peer.port() == client_port
    ))
}

fn accept_short_addrlen() -> Res {
    let (l, addr) = listener(libc::AF_INET6)?;
    let c = tcp_socket(libc::AF_INET6).ctx("socket")?;
    crate::net::connect(c.raw(), &addr).ctx("connect")?;
    let mut buf = [0xffu8; 32];
    let mut len: libc::socklen_t = 4;
    let p = buf.as_mut_ptr().cast();
    let _a = Fd::new(sys!(libc::accept(l.raw(), p, &mut len)).ctx("accept")?);
    let untouched = buf[4..].iter().all(|&b| b == 0xff);
    let family = u16::from_ne_bytes([buf[0], buf[1]]);
    Ok(format!(
        "addrlen_in=4 out={len} family={} bytes_past_4_untouched={untouched}",
        crate::net::family_name(c_int::from(family))
    ))
}

/// Several clients connect before anyone accepts; `accept` hands them out in order.
fn listen_backlog_multiple_accepts() -> Res {
    let l = tcp_socket(libc::AF_INET).ctx("socket")?;
    crate::net::bind(l.raw(), &Addr::loopback(libc::AF_INET, 0)).ctx("bind")?;
    crate::net::listen(l.raw(), 4).ctx("listen")?;
    let addr = local_addr(l.raw()).ctx("getsockname")?;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let c = tcp_socket(libc::AF_INET).ctx("socket")?;
        crate::net::connect(c.raw(), &addr).ctx("connect")?;
        clients.push(c);
    }
    let mut in_order = true;
    for c in &clients {
        let a = crate::net::accept(l.raw()).ctx("accept")?;
        let want = local_addr(c.raw()).ctx("getsockname")?.port();
        in_order &= peer_addr(a.raw()).ctx("getpeername")?.port() == want;
    }
    let none_left = crate::net::poll1(l.raw(), libc::POLLIN, 0).ctx("poll")? == 0;
    Ok(format!(
        "backlog=4 connected=4 accepted_in_connect_order={in_order} queue_empty={none_left}"
    ))
}

fn readv_writev() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let parts: [&[u8]; 3] = [b"one,", b"two,", b"three"];
    let iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        })
        .collect();
    let w = show(sys!(libc::writev(c.raw(), iov.as_ptr(), 3)));
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    crate::sys::sleep_ms(5);
    let (mut a, mut b) = ([0u8; 6], [0u8; 16]);
    let riov = [
        libc::iovec {
            iov_base: a.as_mut_ptr().cast(),
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        },
    ];
    let r = sys!(libc::readv(s.raw(), riov.as_ptr(), 2)).ctx("readv")? as usize;
    let second = String::from_utf8_lossy(&b[..r.saturating_sub(6)]).into_owned();
    Ok(format!(
        "writev={w} readv={r} iov0={:?} iov1={second:?}",
        String::from_utf8_lossy(&a)
    ))
}

fn sendfile_file_to_socket() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let content: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let f = crate::sys::scratch_file("sendfile", &content)?;
    let mut off: libc::off_t = 1000;
    let mut total = 0usize;
    while total < 50_000 {
        let n = sys!(libc::sendfile(c.raw(), f.raw(), &mut off, 50_000 - total)).ctx("sendfile")?;
        if n == 0 {
            break;
        }
        total += n as usize;
    }
    let got = crate::net::recv_exact(s.raw(), total)?;
    Ok(format!(
        "sent={total} offset_now={off} bytes_match={}",
        got[..] == content[1000..1000 + total]
    ))
}

fn splice_socket_to_pipe() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (pr, pw) = pipe(0).ctx("pipe")?;
    send(c.raw(), b"spliced-data", 0).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    let null = std::ptr::null_mut();
    let n = show(sys!(libc::splice(s.raw(), null, pw.raw(), null, 64, 0)));
    let mut buf = [0u8; 64];
    let r = sys!(libc::read(pr.raw(), buf.as_mut_ptr().cast(), 64)).ctx("read")? as usize;
    Ok(format!(
        "splice={n} pipe_read={:?}",
        String::from_utf8_lossy(&buf[..r])
    ))
}

fn splice_pipe_to_socket() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (pr, pw) = pipe(0).ctx("pipe")?;
    sys!(libc::write(pw.raw(), b"from-pipe".as_ptr().cast(), 9)).ctx("write")?;
    let null = std::ptr::null_mut();
    let n = show(sys!(libc::splice(pr.raw(), null, c.raw(), null, 64, 0)));
    Ok(format!("splice={n} peer_got={}", recv_text(s.raw(), 16, 0)))
}

fn getsockname_getpeername() -> Res {
    let mut out = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        let (c, s) = tcp_pair(family)?;
        let cl = local_addr(c.raw()).ctx("getsockname")?;
        let cp = peer_addr(c.raw()).ctx("getpeername")?;
        let sl = local_addr(s.raw()).ctx("getsockname")?;
        let sp = peer_addr(s.raw()).ctx("getpeername")?;
        out.push(format!(
            "local={} peer={} mirrored={}",
            cl.describe(),
            cp.describe(),
            cl.port() == sp.port() && cp.port() == sl.port()
        ));
    }
    let fresh = tcp_socket(libc::AF_INET).ctx("socket")?;
    let unbound = show(local_addr(fresh.raw()).map(|a| a.describe()));
    Ok(format!("{}; unbound={unbound}", out.join("; ")))
}

fn shutdown_wr_half_close() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"last", 0).ctx("send")?;
    sys!(libc::shutdown(c.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    let got = recv_text(s.raw(), 16, 0);
    let eof = recv_text(s.raw(), 16, 0);
    send(s.raw(), b"reply", 0).ctx("send")?;
    Ok(format!(
        "peer: {got} then {eof}; reverse={}",
        recv_text(c.raw(), 16, 0)
    ))
}

fn shutdown_rd() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let r = show(sys!(libc::shutdown(s.raw(), libc::SHUT_RD)));
    let rd = recv_text(s.raw(), 16, 0);
    let ev = show(crate::net::poll1(s.raw(), libc::POLLIN | libc::POLLRDHUP, 0).map(poll_names));
    send(s.raw(), b"still-sends", 0).ctx("send")?;
    Ok(format!(
        "shutdown={r} recv={rd} poll={ev} peer_got={}",
        recv_text(c.raw(), 16, 0)
    ))
}

fn ioctl_fionread_siocatmark() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let empty = show(fionread(s.raw()));
    send(c.raw(), b"hello world", 0).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    let full = show(fionread(s.raw()));
    let mut buf = [0u8; 5];
    recv(s.raw(), &mut buf, 0).ctx("recv")?;
    let rest = show(fionread(s.raw()));
    let atmark = show(at_mark(s.raw()));
    Ok(format!(
        "empty={empty} after_send={full} after_recv5={rest} SIOCATMARK={atmark}"
    ))
}

fn read_write_close() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let w = show(sys!(libc::write(c.raw(), b"written".as_ptr().cast(), 7)));
    let mut buf = [0u8; 16];
    let r = sys!(libc::read(s.raw(), buf.as_mut_ptr().cast(), 16)).ctx("read")? as usize;
    let closed = show(c.close());
    let eof = show(sys!(libc::read(s.raw(), buf.as_mut_ptr().cast(), 16)));
    Ok(format!(
        "write={w} read={:?} close={closed} read_after_close={eof}",
        String::from_utf8_lossy(&buf[..r])
    ))
}

fn zero_length_calls() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let send0 = show(send(c.raw(), &[], 0));
    let write0 = show(sys!(libc::write(c.raw(), b"".as_ptr().cast(), 0)));
    // A zero-length blocking recv waits for data like any other (target is 1 byte).
    let recv0 = show(recv(s.raw(), &mut [], libc::MSG_DONTWAIT));
    let queued = show(fionread(s.raw()));
    send(c.raw(), b"x", 0).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    let recv0_data = show(recv(s.raw(), &mut [], 0));
    Ok(format!(
        "send0={send0} write0={write0} recv0_dontwait_empty={recv0} queued={queued} recv0_with_data={recv0_data} then={}",
        recv_text(s.raw(), 8, 0)
    ))
}

fn recvfrom_tcp() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"null-addr", 0).ctx("send")?;
    let mut buf = [0u8; 32];
    let (na, nl) = (std::ptr::null_mut(), std::ptr::null_mut());
    let n = sys!(libc::recvfrom(
        s.raw(),
        buf.as_mut_ptr().cast(),
        32,
        0,
        na,
        nl
    ))
    .ctx("recvfrom")? as usize;
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();
    send(c.raw(), b"with-addr", 0).ctx("send")?;
    let mut from = Addr::empty();
    let p = buf.as_mut_ptr().cast();
    let m = show(sys!(libc::recvfrom(
        s.raw(),
        p,
        32,
        0,
        from.ptr_mut(),
        from.len_mut()
    )));
    Ok(format!(
        "null_addr={first:?} with_addr={m} addrlen_out={}",
        from.len()
    ))
}

fn sendto_connected_tcp() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let elsewhere = Addr::loopback(libc::AF_INET, 9);
    let r = show(crate::net::sendto(c.raw(), b"sendto", 0, &elsewhere));
    let null = show(sys!(libc::sendto(
        c.raw(),
        b"!".as_ptr().cast(),
        1,
        0,
        std::ptr::null(),
        0
    )));
    // Both sends, however the stream splits them.
    let got = recv_exact(s.raw(), 7).map(|b| format!("{:?}", String::from_utf8_lossy(&b)));
    Ok(format!(
        "sendto_other_addr={r} sendto_null={null} peer_got={}",
        got.unwrap_or_else(|e| e)
    ))
}

fn msg_trunc_discards_tcp() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"discard-keep", 0).ctx("send")?;
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    let n = show(sys!(libc::recv(
        s.raw(),
        std::ptr::null_mut(),
        8,
        libc::MSG_TRUNC
    )));
    Ok(format!(
        "recv(NULL,8,MSG_TRUNC)={n} rest={}",
        recv_text(s.raw(), 16, 0)
    ))
}

fn seek_espipe() -> Res {
    let (_c, s) = tcp_pair(libc::AF_INET)?;
    let seek = show(sys!(libc::lseek(s.raw(), 0, libc::SEEK_CUR)));
    let mut buf = [0u8; 4];
    let pread = show(sys!(libc::pread(s.raw(), buf.as_mut_ptr().cast(), 4, 0)));
    let pwrite = show(sys!(libc::pwrite(s.raw(), buf.as_ptr().cast(), 4, 0)));
    Ok(format!("lseek={seek} pread={pread} pwrite={pwrite}"))
}

fn fortified_chk() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let mut buf = [0u8; 32];
    let p = buf.as_mut_ptr().cast();
    send(c.raw(), b"chk1", 0).ctx("send")?;
    let a = show(sys!(__recv_chk(s.raw(), p, 32, 32, 0)));
    send(c.raw(), b"chk22", 0).ctx("send")?;
    let b = show(sys!(__read_chk(s.raw(), p, 32, 32)));
    send(c.raw(), b"chk333", 0).ctx("send")?;
    let (na, nl) = (std::ptr::null_mut(), std::ptr::null_mut());
    let d = show(sys!(__recvfrom_chk(s.raw(), p, 32, 32, 0, na, nl)));
    Ok(format!("__recv_chk={a} __read_chk={b} __recvfrom_chk={d}"))
}

fn fortified_poll_fdelt() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(c.raw(), b"x", 0).ctx("send")?;
    let mut p = libc::pollfd {
        fd: s.raw(),
        events: libc::POLLIN,
        revents: 0,
    };
    let n = show(sys!(__poll_chk(&mut p, 1, 2000, size_of::<libc::pollfd>())));
    // SAFETY: an integer in, an integer out (glibc aborts on an fd beyond FD_SETSIZE;
    // a fresh socket's number is far below it).
    let word = unsafe { __fdelt_chk(c_long::from(s.raw())) };
    let bits = 8 * size_of::<c_long>() as c_long;
    Ok(format!(
        "__poll_chk={n} revents={} __fdelt_chk=fd/{bits}:{}",
        poll_names(p.revents),
        word == c_long::from(s.raw()) / bits
    ))
}

/// Writes `rounds` times on one end of a TCP pair, through stdio (a `FILE` on a `dup`
/// of the socket) and otherwise as `round` likes; `round` returns the bytes it wrote.
/// The peer reads to the end: the case says whether it got them all, in program order.
fn stdio_in_order(
    rounds: usize,
    mut round: impl FnMut(usize, *mut libc::FILE, &Fd) -> Result<Vec<u8>, String>,
) -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let dup = sys!(libc::dup(c.raw())).ctx("dup")?;
    // SAFETY: `dup` is a new descriptor nothing else owns (the stream takes it over and
    // `fclose` below closes it); the mode is a C string literal.
    let f = unsafe { libc::fdopen(dup, c"w".as_ptr()) };
    if f.is_null() {
        return Err(format!("fdopen={}", crate::sys::Errno::last()));
    }
    let reader = std::thread::spawn({
        let s = s.raw();
        move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                // SAFETY: `buf` is this thread's live local array, written for at most
                // its own length.
                let n = unsafe { libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n <= 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n as usize]);
            }
            got
        }
    });
    let mut want = Vec::new();
    for i in 0..rounds {
        want.extend(round(i, f, &c)?);
    }
    // SAFETY: `f` is the stream opened above, not yet closed (the rounds only write
    // through it), and is not used after this.
    let closed = unsafe { libc::fclose(f) };
    sys!(libc::shutdown(c.raw(), libc::SHUT_WR)).ctx("shutdown")?;
    let got = reader.join().map_err(|_| "reader panicked".to_string())?;
    drop(s);
    Ok(format!(
        "fclose={closed} bytes={} in_order={}",
        got.len(),
        got == want
    ))
}

/// `fputs` + `fflush`: `text` leaves through stdio now.
fn put_flushed(f: *mut libc::FILE, text: &str) {
    let c_text = std::ffi::CString::new(text).expect("no NUL");
    // SAFETY: `c_text` is a live NUL-terminated string; `f` is an open stream: the only
    // callers are `stdio_in_order`'s rounds, which get the stream it opened and closes
    // only after the last round.
    unsafe {
        libc::fputs(c_text.as_ptr(), f);
        libc::fflush(f);
    }
}

/// Lines written in turn through stdio (`fprintf` + `fflush` on a `dup` of the socket)
/// and with `send`, in program order: the peer gets them in that order.
fn stdio_mixed_with_send() -> Res {
    stdio_in_order(300, |i, f, c| {
        let line = format!("line {i}\n");
        if i % 3 == 0 {
            put_flushed(f, &line);
        } else {
            send(c.raw(), line.as_bytes(), 0).ctx("send")?;
        }
        Ok(line.into_bytes())
    })
}

/// The classic small HTTP server: a header through stdio (`fprintf` + `fflush`), then
/// the body with `sendfile`, over and over: the peer gets them in that order.
fn stdio_header_then_sendfile() -> Res {
    let body = b"<body bytes from a file>\n";
    let file = crate::sys::scratch_file("stdio-sendfile", body)?;
    stdio_in_order(100, |i, f, c| {
        let head = format!("HTTP/1.0 200 OK\r\nX-N: {i}\r\n\r\n");
        put_flushed(f, &head);
        let mut off: libc::off_t = 0;
        let n = sys!(libc::sendfile(c.raw(), file.raw(), &mut off, body.len())).ctx("sendfile")?;
        if n as usize != body.len() {
            return Err(format!("sendfile={n}"));
        }
        Ok([head.as_bytes(), body].concat())
    })
}

fn stdio_fdopen() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let fd = c.into_raw();
    // SAFETY: `fd` was given up by its `Fd` (`into_raw`), so the stream is its only
    // owner; the mode is a C string literal.
    let f = unsafe { libc::fdopen(fd, c"r+".as_ptr()) };
    if f.is_null() {
        return Err(format!("fdopen={}", crate::sys::Errno::last()));
    }
    // SAFETY: a C string literal, and `f`, the open stream checked non-null above.
    let put = unsafe { libc::fputs(c"stdio line\n".as_ptr(), f) };
    // SAFETY: `f` is the open stream.
    let flushed = unsafe { libc::fflush(f) };
    let got = recv_text(s.raw(), 32, 0);
    send(s.raw(), b"reply line\nextra", 0).ctx("send")?;
    let mut line = [0 as libc::c_char; 64];
    // SAFETY: `line` is a live 64-char array and fgets writes at most 64 chars
    // (with the NUL); `f` is the open stream.
    let r = unsafe { libc::fgets(line.as_mut_ptr(), 64, f) };
    let read = if r.is_null() {
        "NULL".to_string()
    } else {
        crate::sys::c_buf_str(&line)
    };
    // SAFETY: `f` is the open stream, not used after this; it closes `fd` with it.
    let closed = unsafe { libc::fclose(f) };
    Ok(format!(
        "fputs_ok={} fflush={flushed} peer_got={got} fgets={read:?} fclose={closed} peer_then={}",
        put >= 0,
        recv_text(s.raw(), 8, 0)
    ))
}
