//! E6's two ends (`ferry bench E6`): file → socket through a program in the sandbox.
//!
//! `ferry-e6 requester --listen IP:PORT` runs in the remote namespace: for each
//! connection it reads `E6 <file bytes> <responses>\n`, then `responses` times sends
//! `GET\n` and times the whole response (an HTTP/1.1 header, then `Content-Length` bytes
//! of body, checked against the expected pattern), and answers
//! `STATS <p50 µs> <p99 µs> <MB/s> <mean µs>\n` before closing.
//!
//! `ferry-e6 serve --way rw|sendfile|module|module-keep --file F --connect IP:PORT
//! --responses N` is the program in the sandbox: it connects out, and answers each
//! request with the same header and the file — with a 64 KiB `pread`/send loop, with
//! `sendfile`, by binding http_file per response (`module`: ferry's native API,
//! `bind_module_refs_nowait`: the binding goes on the ring in order, without waiting for
//! the answer; the server sends header and file itself, as in S3), or by binding
//! http_file once for the connection in its `lines` mode and sending it each request
//! line (`module-keep`: the kept-alive connection; no instance is made per response).
//! Every way opens the file once, before the first request, as a server that serves the
//! same file again and again would: read/write and sendfile read it at offset 0 each
//! time (`pread`, `sendfile` with an offset), the module way registers it with the
//! server once (`register_file`) and names it by handle in each binding, so no
//! descriptor travels per response. It prints the requester's line, and for the module
//! way the p50 of its bind calls. The sockets are libc's (so the shim serves them), the
//! module way's are the native API's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

const HTTP_FILE: &[u8] = include_bytes!("../../../modules/examples/http_file.wat");
const CONTENT_TYPE: &str = "application/octet-stream";

fn header(len: u64) -> String {
    format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: {CONTENT_TYPE}\r\n\r\n")
}

/// The byte at offset `i` of E6's files.
pub fn byte_at(i: u64) -> u8 {
    b'a' + (i % 26) as u8
}

fn arg<'a>(args: &'a [String], name: &str) -> Result<&'a str, String> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].as_str())
        .ok_or_else(|| format!("missing {name}"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let r = match args.get(1).map(String::as_str) {
        Some("requester") => requester(&args),
        Some("serve") => serve(&args),
        _ => Err("usage: ferry-e6 requester --listen IP:PORT | serve --way rw|sendfile|module --file F --connect IP:PORT --responses N".into()),
    };
    if let Err(e) = r {
        eprintln!("ferry-e6: {e}");
        std::process::exit(1);
    }
}

fn requester(args: &[String]) -> Result<(), String> {
    let at: SocketAddr = arg(args, "--listen")?
        .parse()
        .map_err(|e| format!("--listen: {e}"))?;
    let l = TcpListener::bind(at).map_err(|e| format!("listen {at}: {e}"))?;
    for c in l.incoming() {
        let Ok(c) = c else { continue };
        std::thread::spawn(move || {
            if let Err(e) = measure(c) {
                eprintln!("ferry-e6 requester: {e}");
            }
        });
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn measure(c: TcpStream) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    c.set_nodelay(true).map_err(io)?;
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    let mut w = c.try_clone().map_err(io)?;
    let mut r = BufReader::with_capacity(256 * 1024, c);
    let mut line = String::new();
    r.read_line(&mut line).map_err(io)?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let [size, count] = f[..] else {
        return Err(format!("bad hello {line:?}"));
    };
    let want_head = header(size);
    let mut lat = Vec::with_capacity(count as usize);
    let mut body = vec![0u8; size.min(1 << 20) as usize];
    let mut head = Vec::new();
    let t0 = Instant::now();
    for n in 0..count {
        let t = Instant::now();
        w.write_all(b"GET\n").map_err(io)?;
        head.clear();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            r.read_exact(&mut b)
                .map_err(|e| format!("response {n}: header: {e}"))?;
            head.push(b[0]);
            if head.len() > 4096 {
                return Err("header too long".into());
            }
        }
        if head != want_head.as_bytes() {
            return Err(format!(
                "response {n}: header {:?}",
                String::from_utf8_lossy(&head)
            ));
        }
        let mut got = 0u64;
        while got < size {
            let k = ((size - got) as usize).min(body.len());
            r.read_exact(&mut body[..k])
                .map_err(|e| format!("response {n}: body at {got}: {e}"))?;
            // Check a few bytes of every piece (all of them would cost more than the
            // transfer).
            for i in [0, k / 2, k - 1] {
                if body[i] != byte_at(got + i as u64) {
                    return Err(format!("response {n}: wrong byte at {}", got + i as u64));
                }
            }
            got += k as u64;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let secs = t0.elapsed().as_secs_f64();
    let mean = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    lat.sort_by(f64::total_cmp);
    let mbps = (size + want_head.len() as u64) as f64 * count as f64 / secs / 1e6;
    let msg = format!(
        "STATS {:.2} {:.2} {mbps:.2} {mean:.2}\n",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    w.write_all(msg.as_bytes()).map_err(io)
}

/// Reads one request line (`GET` or the closing `STATS …`) byte by byte.
fn request(read: &mut dyn FnMut(&mut [u8]) -> Result<usize, String>) -> Result<String, String> {
    let mut line = Vec::new();
    let mut b = [0u8; 64];
    loop {
        let n = read(&mut b)?;
        if n == 0 {
            return Err("requester closed".into());
        }
        line.extend_from_slice(&b[..n]);
        if line.ends_with(b"\n") {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

fn serve(args: &[String]) -> Result<(), String> {
    let way = arg(args, "--way")?;
    let file = arg(args, "--file")?;
    let to: SocketAddr = arg(args, "--connect")?
        .parse()
        .map_err(|e| format!("--connect: {e}"))?;
    let count: u64 = arg(args, "--responses")?
        .parse()
        .map_err(|e| format!("--responses: {e}"))?;
    let size = std::fs::metadata(file)
        .map_err(|e| format!("{file}: {e}"))?
        .len();
    let hello = format!("E6 {size} {count}\n");
    let mut binds = Vec::new();
    let stats = match way {
        "rw" | "sendfile" => {
            let mut c = TcpStream::connect(to).map_err(|e| format!("connect {to}: {e}"))?;
            c.set_nodelay(true).map_err(|e| e.to_string())?;
            c.write_all(hello.as_bytes()).map_err(|e| e.to_string())?;
            let mut rd = c.try_clone().map_err(|e| e.to_string())?;
            let mut read = |b: &mut [u8]| rd.read(b).map_err(|e| e.to_string());
            let mut buf = vec![0u8; 64 * 1024];
            let f = std::fs::File::open(file).map_err(|e| format!("{file}: {e}"))?;
            loop {
                let line = request(&mut read)?;
                if line.starts_with("STATS") {
                    break line;
                }
                respond_libc(&c, &f, size, way == "sendfile", &mut buf)?;
            }
        }
        "module" | "module-keep" => {
            let keep = way == "module-keep";
            let path = std::env::var_os("FERRY_SOCKET")
                .ok_or("the module way needs ferry (FERRY_SOCKET is not set)")?;
            let mut cl = ferry_client::Client::connect(std::path::Path::new(&path))
                .map_err(|e| format!("ferry channel: {e}"))?;
            let domain = if to.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            };
            let s = cl
                .socket(domain, libc::SOCK_STREAM)
                .map_err(|e| e.to_string())?;
            cl.connect_to(&s, to)
                .map_err(|e| format!("connect {to}: {e}"))?;
            cl.set_nodelay(&s, true).map_err(|e| e.to_string())?;
            cl.send(&s, hello.as_bytes()).map_err(|e| e.to_string())?;
            let len = size.to_string();
            let mut props = vec![
                ("content-length", len.as_str()),
                ("content-type", CONTENT_TYPE),
            ];
            if keep {
                props.push(("mode", "lines"));
            }
            let reg = {
                let f = std::fs::File::open(file).map_err(|e| format!("{file}: {e}"))?;
                cl.register_file(std::os::fd::AsFd::as_fd(&f))
                    .map_err(|e| format!("register {file}: {e}"))?
            };
            if keep {
                cl.bind_module_refs(&s, HTTP_FILE, &props, &[], &[reg])
                    .map_err(|e| format!("bind_module: {e}"))?;
            }
            loop {
                let line = {
                    let mut read = |b: &mut [u8]| cl.recv(&s, b).map_err(|e| e.to_string());
                    request(&mut read)?
                };
                if line.starts_with("STATS") {
                    break line;
                }
                if keep {
                    // The request line goes to the module, which answers it.
                    cl.send(&s, line.as_bytes()).map_err(|e| e.to_string())?;
                    continue;
                }
                let t = Instant::now();
                cl.bind_module_refs_nowait(&s, HTTP_FILE, &props, &[], &[reg])
                    .map_err(|e| format!("bind_module: {e}"))?;
                binds.push(t.elapsed().as_secs_f64() * 1e6);
                if let Some((_, e)) = cl.async_errors.first() {
                    return Err(format!("binding failed: errno {}", -e));
                }
            }
        }
        other => return Err(format!("unknown way {other}")),
    };
    print!("{}", stats);
    if !binds.is_empty() {
        binds.sort_by(f64::total_cmp);
        println!("BIND {:.2}", percentile(&binds, 0.5));
    }
    Ok(())
}

/// One response with libc's calls (the shim's, under ferry): header with `MSG_MORE`,
/// then the file (open already) from offset 0 by pread/send or by `sendfile`.
fn respond_libc(
    c: &TcpStream,
    f: &std::fs::File,
    size: u64,
    sendfile: bool,
    buf: &mut [u8],
) -> Result<(), String> {
    let fd = c.as_raw_fd();
    send_all(fd, header(size).as_bytes(), libc::MSG_MORE)?;
    if sendfile {
        let mut off: libc::off_t = 0;
        while (off as u64) < size {
            // SAFETY: both descriptors are open for the call; `off` is a valid pointer.
            let n = unsafe {
                libc::sendfile(fd, f.as_raw_fd(), &mut off, (size - off as u64) as usize)
            };
            if n <= 0 {
                return Err(format!("sendfile: {}", std::io::Error::last_os_error()));
            }
        }
    } else {
        let mut at = 0u64;
        loop {
            let n = f.read_at(buf, at).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            at += n as u64;
            send_all(fd, &buf[..n], 0)?;
        }
    }
    Ok(())
}

fn send_all(fd: i32, mut b: &[u8], flags: i32) -> Result<(), String> {
    while !b.is_empty() {
        // SAFETY: `b` is valid for `b.len()` bytes; `fd` is an open socket.
        let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), flags | libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("send: {e}"));
        }
        b = &b[n as usize..];
    }
    Ok(())
}
