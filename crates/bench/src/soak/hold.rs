//! The connection load: many TCP connections held open at once, each served and
//! checked, then all closed.
//!
//! Each connection carries one request, a 16-byte head (connection number, body
//! length) and a body from the stream keyed by the seed and the number; the answer is
//! the SHA-256 of the whole request, which the client compares with its own. The client
//! ([`hold_client`]) connects all of them first, then sends every request, then reads
//! every answer, so all are open and served at the same time; then it closes them all.
//! The server ([`hold_server`]) is one `epoll` loop; it answers, waits for each
//! client's end of stream, closes, and returns once it has seen as many connections
//! close as it was told.
//!
//! With `pause`, each side prints a line at each phase (the client `ready`, `held N`,
//! `closed N`; the server `closed N`) and waits
//! for a line on its standard input before going on, so that a harness can measure the
//! processes (descriptors, memory) at that point.

use std::io::{self, BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

use super::{fill, sha256};

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit; returns the new soft
/// limit.
pub fn raise_nofile() -> u64 {
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 0,
    }
}

/// Waits for one line on standard input (or its end).
fn pause(what: &str) {
    println!("{what}");
    let _ = io::stdout().flush();
    let mut line = String::new();
    let _ = io::stdin().lock().read_line(&mut line);
}

fn say(what: &str) {
    println!("{what}");
    let _ = io::stdout().flush();
}

/// The request of connection `i`.
fn request(seed: u64, i: u64, body: usize) -> Vec<u8> {
    let mut r = vec![0u8; 16 + body];
    r[..8].copy_from_slice(&i.to_le_bytes());
    r[8..16].copy_from_slice(&(body as u64).to_le_bytes());
    fill(seed ^ i, 0, &mut r[16..]);
    r
}

/// Opens `conns` connections to `to`, then sends every request, then reads and checks
/// every answer, then closes them all. Fails on the first connection that cannot be
/// made; counts wrong or missing answers and fails at the end if there were any.
pub fn hold_client(
    to: SocketAddr,
    conns: usize,
    body: usize,
    seed: u64,
    with_pause: bool,
) -> Result<(), String> {
    let limit = raise_nofile();
    eprintln!("hold: RLIMIT_NOFILE soft limit {limit}");
    if with_pause {
        // One socket first, so that what is measured at `ready` includes what a
        // process's first socket sets up once (under ferry: its channel).
        drop(TcpListener::bind(("127.0.0.1", 0)));
        pause("ready");
    }
    let start = Instant::now();
    let mut socks = Vec::with_capacity(conns);
    for i in 0..conns {
        let s = connect(to).map_err(|e| format!("connection {i} of {conns}: {e}"))?;
        socks.push(s);
        if (i + 1) % 1000 == 0 {
            eprintln!("hold: {} connected", i + 1);
        }
    }
    say(&format!(
        "connected {conns} in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    for (i, s) in socks.iter_mut().enumerate() {
        s.write_all(&request(seed, i as u64, body))
            .map_err(|e| format!("request {i}: {e}"))?;
    }
    let mut bad = 0usize;
    for (i, s) in socks.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| format!("answer {i}: {e}"))?;
        let mut answer = [0u8; 32];
        match s.read_exact(&mut answer) {
            Ok(()) if answer == sha256(&request(seed, i as u64, body)) => {}
            Ok(()) => bad += 1,
            Err(e) => {
                eprintln!("hold: answer {i}: {e}");
                bad += 1;
            }
        }
    }
    let line = format!(
        "held {conns} served {} bad {bad} in {:.1} s",
        conns - bad,
        start.elapsed().as_secs_f64()
    );
    if with_pause {
        pause(&line);
    } else {
        say(&line);
    }
    drop(socks);
    if with_pause {
        pause(&format!("closed {conns}"));
    } else {
        say(&format!("closed {conns}"));
    }
    if bad > 0 {
        return Err(format!("{bad} of {conns} answers missing or wrong"));
    }
    Ok(())
}

/// `connect`, retried for a while when the listener's queue is full.
fn connect(to: SocketAddr) -> io::Result<TcpStream> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect_timeout(&to, Duration::from_secs(10)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < until && e.raw_os_error() == Some(libc::EAGAIN) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A connection of the server.
struct Peer {
    sock: TcpStream,
    got: Vec<u8>,
    answered: bool,
}

/// Serves `conns` connections on `listener`: answers each request, closes each
/// connection after the client's end of stream, and returns once `conns` have closed
/// (`served N` and `closed N` lines on stdout; with `pause`, waits for a line of input
/// after the last).
pub fn hold_server(listener: TcpListener, conns: usize, with_pause: bool) -> Result<(), String> {
    let limit = raise_nofile();
    eprintln!("hold-serve: RLIMIT_NOFILE soft limit {limit}");
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("O_NONBLOCK: {e}"))?;
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| format!("epoll: {e}"))?;
    const LISTENER: u64 = u64::MAX;
    ep.add(
        listener.as_fd(),
        EpollEvent::new(EpollFlags::EPOLLIN, LISTENER),
    )
    .map_err(|e| format!("epoll_ctl: {e}"))?;
    say("listening");
    let mut peers: Vec<Option<Peer>> = Vec::new();
    let (mut served, mut closed, mut bad) = (0usize, 0usize, 0usize);
    let mut events = vec![EpollEvent::empty(); 256];
    let mut buf = vec![0u8; 64 << 10];
    while closed < conns {
        let n = ep
            .wait(&mut events, EpollTimeout::from(1000u16))
            .map_err(|e| format!("epoll_wait: {e}"))?;
        for ev in &events[..n] {
            let token = ev.data();
            if token == LISTENER {
                loop {
                    match listener.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(true)
                                .map_err(|e| format!("O_NONBLOCK: {e}"))?;
                            let id = peers.len() as u64;
                            ep.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, id))
                                .map_err(|e| format!("epoll_ctl: {e}"))?;
                            peers.push(Some(Peer {
                                sock: s,
                                got: Vec::new(),
                                answered: false,
                            }));
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(format!("accept: {e}")),
                    }
                }
                continue;
            }
            let Some(slot) = peers.get_mut(token as usize) else {
                continue;
            };
            let Some(p) = slot.as_mut() else { continue };
            let mut end = false;
            loop {
                match p.sock.read(&mut buf) {
                    Ok(0) => {
                        end = true;
                        break;
                    }
                    Ok(k) => p.got.extend_from_slice(&buf[..k]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        eprintln!("hold-serve: connection {token}: {e}");
                        bad += 1;
                        end = true;
                        break;
                    }
                }
            }
            if !p.answered && p.got.len() >= 16 {
                let body = u64::from_le_bytes(p.got[8..16].try_into().unwrap_or([0; 8]));
                if p.got.len() as u64 >= 16 + body {
                    let answer = sha256(&p.got);
                    p.sock
                        .write_all(&answer)
                        .map_err(|e| format!("answer on connection {token}: {e}"))?;
                    p.answered = true;
                    p.got.clear();
                    served += 1;
                    if served == conns {
                        say(&format!("served {served}"));
                    }
                }
            }
            if end {
                if !p.answered || !p.got.is_empty() {
                    bad += 1;
                }
                let _ = ep.delete(p.sock.as_fd());
                *slot = None;
                closed += 1;
            }
        }
    }
    let line = format!("closed {closed} served {served} bad {bad}");
    if with_pause {
        pause(&line);
    } else {
        say(&line);
    }
    if bad > 0 {
        return Err(format!("{bad} connections ended without a whole request"));
    }
    Ok(())
}
