//! `ferry-attack`: what a hostile program inside `ferry run` can try against the protocol
//! server, bypassing the shim (it talks to the server through the native API and raw
//! records). Each attack prints what it got; `crates/ferry/tests/security.rs` runs them
//! and says what must come out. Not a tool for users: a test fixture that ships with the
//! workspace build so the tests can run it inside a sandbox.
//!
//! ```text
//! ferry-attack ids SERIALS            act on other processes' sockets by guessing ids
//! ferry-attack squat SERIALS SECONDS  bind the abstract names a socket's pair would get
//! ferry-attack hang                   make the server block on a pair end we hold
//! ferry-attack backlog SECONDS        push requests, never read a completion
//! ferry-attack hellos N SECONDS       hold N control connections that never say Hello
//! ferry-attack admin                  use the run's admin socket
//! ```

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ferry_client::Client;
use ferry_proto::{Call, Ctl, CtlKind};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: u64| {
        args.get(i)
            .and_then(|a| a.parse::<u64>().ok())
            .unwrap_or(default)
    };
    let out = match args.first().map(String::as_str) {
        Some("ids") => ids(num(1, 64) as u32),
        Some("squat") => squat(num(1, 64) as u32, num(2, 5)),
        Some("hang") => hang(),
        Some("backlog") => backlog(num(1, 5)),
        Some("hellos") => hellos(num(1, 2000) as usize, num(2, 5)),
        Some("admin") => admin(),
        _ => Err("usage: ferry-attack ids|squat|hang|backlog|hellos|admin …".into()),
    };
    match out {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("ferry-attack: {e}");
            std::process::exit(2);
        }
    }
}

type Res = Result<String, String>;

fn control_path() -> Result<PathBuf, String> {
    std::env::var_os("FERRY_SOCKET")
        .map(PathBuf::from)
        .ok_or_else(|| "FERRY_SOCKET is not set (run me inside `ferry run`)".into())
}

fn client() -> Result<Client, String> {
    Client::connect(&control_path()?).map_err(|e| format!("cannot open a channel: {e}"))
}

/// Every socket id of serials `1..=serials` on server 0, as another process would guess
/// them (ids are small and sequential): peer name, a non-blocking receive, a send.
/// Prints how many ids answered anything but `EBADF`, and the bytes a receive took.
fn ids(serials: u32) -> Res {
    let mut c = client()?;
    let mut answered = 0;
    let mut stolen = 0usize;
    let mut claimed = 0;
    let mut buf = vec![0u8; 65536];
    for serial in 1..=serials {
        let id = serial << ferry_proto::SERVER_BITS;
        // A forged proof: a socket of our own, bound to a name of the right form.
        let (fake, _peer) =
            ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)
                .map_err(|e| e.to_string())?;
        let (name, n) = ferry_proto::pair_name(id, u64::from(serial));
        let _ = ferry_sys::bind_abstract(fake.as_fd(), &name[..n]);
        let forged = ferry_client::Socket { id, pair: fake };
        if c.claim(&forged).is_ok() {
            claimed += 1;
        }
        let peer = c.call_raw(Call::PeerName { sock: id, tag: 0 }.encode(), &mut buf);
        let recv = Call::Recv {
            sock: id,
            tag: 0,
            max: buf.len() as u32,
            flags: 0,
            nonblock: true,
        };
        let got = c.call_raw(recv.encode(), &mut buf);
        let ebadf =
            |r: &std::io::Result<ferry_proto::Cmp>| matches!(r, Ok(d) if d.result == -libc::EBADF);
        if !ebadf(&peer) || !ebadf(&got) {
            answered += 1;
        }
        if let Ok(d) = got
            && d.result > 0
        {
            stolen += d.result as usize;
        }
    }
    Ok(format!(
        "answered {answered} stolen {stolen} claimed {claimed}"
    ))
}

/// Binds the abstract names `ferry:<id>` and `ferry:<id>:<any nonce>` of the next
/// `serials` ids in the sandbox's namespace and holds them for `secs` seconds, so that
/// sockets made meanwhile would find their names taken.
fn squat(serials: u32, secs: u64) -> Res {
    let mut held = Vec::new();
    for serial in 1..=serials {
        let id = serial << ferry_proto::SERVER_BITS;
        for name in [
            format!("ferry:{id}"),
            String::from_utf8_lossy(&{
                let (b, n) = ferry_proto::pair_name(id, 0);
                b[..n].to_vec()
            })
            .into_owned(),
        ] {
            let s = ferry_sys::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
                .map_err(|e| e.to_string())?;
            if ferry_sys::bind_abstract(s.as_fd(), name.as_bytes()).is_ok() {
                held.push(s);
            }
        }
    }
    println!("squatting {}", held.len());
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(secs));
    Ok("released".into())
}

/// The stall of the first security review: hand the server, with a `Socket` request, a
/// pair end we keep, make it blocking with its peer full, and get the server to write a
/// readiness token into it. A server that used our end would block in that write, and
/// every channel it serves would stop. Prints whether a second channel was still served
/// within two seconds.
fn hang() -> Res {
    let mut c = client()?;
    let (ours, given) =
        ferry_sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)
            .map_err(|e| e.to_string())?;
    ferry_sys::set_nonblocking(given.as_fd(), true).map_err(|e| e.to_string())?;
    while ferry_sys::send_nosignal(given.as_fd(), &[0u8; 4096]).is_ok() {}
    ferry_sys::set_nonblocking(given.as_fd(), false).map_err(|e| e.to_string())?;
    let mut msg = Ctl::new(CtlKind::Socket, 0);
    (msg.a, msg.b) = (libc::AF_INET, libc::SOCK_DGRAM);
    let (r, _kept) = c
        .ctl_raw_fd(bytemuck::bytes_of(&msg), &[given.as_fd()])
        .map_err(|e| e.to_string())?;
    if r.result < 0 {
        return Err(format!("socket refused: {}", r.result));
    }
    let id = r.result as u32;
    // Bound to the sandbox's loopback, asked for tokens, sent a datagram: the server
    // writes a token into its end of the pair.
    let bind = Call::Bind {
        sock: id,
        tag: 0,
        addr: ferry_proto::WireAddr::from(
            "127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .expect("literal"),
        ),
    };
    let bound = c
        .call_raw(bind.encode(), &mut [])
        .map_err(|e| e.to_string())?;
    let name = c
        .call_raw(Call::SockName { sock: id, tag: 0 }.encode(), &mut [])
        .map_err(|e| e.to_string())?;
    if bound.result < 0 || name.result < 0 {
        return Err(format!(
            "bind {}, getsockname {}",
            bound.result, name.result
        ));
    }
    let addr = ferry_proto::WireAddr::decode(name.bytes()).map_err(|e| e.to_string())?;
    c.push_raw(Call::WantToken { sock: id }.encode())
        .map_err(|e| e.to_string())?;
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let _ = peer.send_to(b"x", addr.to_std());
    std::thread::sleep(Duration::from_millis(300));
    // Another channel: is the server still serving?
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ok = client().and_then(|mut d| {
            let s = d
                .socket(libc::AF_INET, libc::SOCK_DGRAM)
                .map_err(|e| e.to_string())?;
            d.local_addr(&s).map_err(|e| e.to_string())
        });
        let _ = tx.send(ok.is_ok());
    });
    let served = rx.recv_timeout(Duration::from_secs(2)).unwrap_or(false);
    drop((ours, given));
    Ok(if served { "served" } else { "stalled" }.into())
}

/// Pushes cheap requests (a socket option query on our own socket) for `secs` seconds
/// without ever reading a completion. Prints how many the server took: with
/// back-pressure it stops taking them once our completions back up.
fn backlog(secs: u64) -> Res {
    let mut c = client()?;
    let s = c
        .socket(libc::AF_INET, libc::SOCK_DGRAM)
        .map_err(|e| e.to_string())?;
    let req = Call::GetOpt {
        sock: s.id,
        tag: 7,
        level: libc::SOL_SOCKET,
        name: libc::SO_TYPE,
        len: 4,
    }
    .encode();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut pushed = 0u64;
    let mut last_progress = Instant::now();
    while Instant::now() < end {
        match c.try_push_raw(req) {
            Ok(true) => {
                pushed += 1;
                last_progress = Instant::now();
            }
            Ok(false) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e.to_string()),
        }
    }
    let stuck_ms = last_progress.elapsed().as_millis();
    Ok(format!("pushed {pushed} stuck_ms {stuck_ms}"))
}

/// Opens control connections that never say Hello, `n` at a time, reopening those the
/// server closes, for `secs` seconds. Prints how many it opened in all.
fn hellos(n: usize, secs: u64) -> Res {
    let path = control_path()?;
    if let Ok((_, hard)) = ferry_sys::nofile_limit() {
        let lim = libc::rlimit {
            rlim_cur: hard,
            rlim_max: hard,
        };
        // SAFETY: a valid rlimit, at most the hard limit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
    let end = Instant::now() + Duration::from_secs(secs);
    let mut held: Vec<std::os::unix::net::UnixStream> = Vec::new();
    let mut opened = 0u64;
    println!("flooding");
    let _ = std::io::stdout().flush();
    while Instant::now() < end {
        // Drop the ones the server closed.
        held.retain(|s| ferry_sys::poll_now(s.as_fd(), libc::POLLIN).unwrap_or(0) == 0);
        while held.len() < n {
            let s = ferry_sys::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0)
                .map_err(|e| e.to_string())?;
            if ferry_sys::connect_unix(s.as_fd(), &path).is_err() {
                break;
            }
            held.push(std::os::unix::net::UnixStream::from(s));
            opened += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(format!("opened {opened} held {}", held.len()))
}

/// Looks for the run's admin socket next to the control socket and asks it for stats
/// and to move a server. Prints what came back.
fn admin() -> Res {
    let dir = control_path()?
        .parent()
        .map(PathBuf::from)
        .ok_or("no directory")?;
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        found.extend(entries.flatten().map(|e| e.path()));
    }
    found.push(dir.join("admin.sock"));
    for p in found {
        if p.as_os_str() == control_path()?.as_os_str() {
            continue;
        }
        if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&p) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = writeln!(s, "move proto-0 0");
            let mut answer = String::new();
            let _ = std::io::Read::read_to_string(&mut s, &mut answer);
            let fd = s.as_raw_fd();
            return Ok(format!("admin answered on fd {fd}: {}", answer.trim()));
        }
    }
    Ok("admin unreachable".into())
}
