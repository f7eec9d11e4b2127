//! The peer of the end cases (`ferry-soak ends-peer`), outside the sandbox: a thread
//! per connection reads what the driver sends, checks every byte against its stream,
//! and ends the connection as the head says (reads to the end of stream, or reads its
//! `stop` bytes and resets or closes). It listens twice: on the given port for the
//! race and dead cases, on the next one for the sendfile case, with a 1 KiB
//! `SO_RCVBUF` (as asyncio's test has it). The driver's closing connection lists what
//! each connection's sends reported; the peer answers with its verdict
//! ([`super::tally::judge`]) once every listed connection has ended (or 30 s).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::tally::{PeerEnd, PeerVerdict, Record, judge, short};
use super::wire::{END_MAGIC, HEAD_LEN, Head, MAX_LISTED, decode_sent};
use super::{Act, Case, CloseWay, Method, sys};
use crate::soak::fill;

/// A connection that moves nothing for this long is given up (`Timeout`).
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a verdict waits for the listed connections to end.
const VERDICT_WAIT: Duration = Duration::from_secs(30);
/// The sendfile case's listener's `SO_RCVBUF`.
const SMALL_RCVBUF: i32 = 1024;

/// Connection records by (run, case, id), and a wake-up when one ends.
#[derive(Default)]
struct Book {
    records: Mutex<HashMap<(u64, Case, u64), Record>>,
    ended: Condvar,
}

impl Book {
    fn put(&self, h: &Head, r: Record) {
        let mut m = self.records.lock().unwrap_or_else(|e| e.into_inner());
        m.insert((h.run, h.case, h.id), r);
        self.ended.notify_all();
    }

    /// Waits until every listed connection has ended (or the wait is over), then takes
    /// their records out.
    fn take(&self, run: u64, case: Case, ids: &[(u64, u64)]) -> HashMap<u64, Record> {
        let until = Instant::now() + VERDICT_WAIT;
        let mut m = self.records.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let open = ids.iter().any(|(id, _)| {
                m.get(&(run, case, *id))
                    .is_none_or(|r| r.end == PeerEnd::Open)
            });
            let left = until.saturating_duration_since(Instant::now());
            if !open || left.is_zero() {
                break;
            }
            m = match self.ended.wait_timeout(m, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        ids.iter()
            .filter_map(|(id, _)| Some((*id, m.remove(&(run, case, *id))?)))
            .collect()
    }
}

/// Serves the end cases on `listen` (and the next port) until killed.
pub fn serve(listen: SocketAddr) -> Result<(), String> {
    let bind = |a: SocketAddr| TcpListener::bind(a).map_err(|e| format!("listen on {a}: {e}"));
    let mut next = listen;
    next.set_port(listen.port().wrapping_add(1));
    serve_on(bind(listen)?, bind(next)?)
}

/// Serves the race and dead cases on `main`, the sendfile case on `small` (whose
/// `SO_RCVBUF` it sets first), until killed; says `listening on …` once it is ready.
pub fn serve_on(main: TcpListener, small: TcpListener) -> Result<(), String> {
    sys::set_int(
        small.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_RCVBUF,
        SMALL_RCVBUF,
    )
    .map_err(|e| format!("SO_RCVBUF: {e}"))?;
    let addr = |l: &TcpListener| l.local_addr().map_err(|e| e.to_string());
    println!(
        "listening on {} and {} (the sendfile case)",
        addr(&main)?,
        addr(&small)?
    );
    let _ = io::stdout().flush();
    let book = Arc::new(Book::default());
    let b = book.clone();
    std::thread::spawn(move || accept(&small, &b));
    accept(&main, &book);
    Err("the listener failed".into())
}

fn accept(l: &TcpListener, book: &Arc<Book>) {
    loop {
        match l.accept() {
            Ok((s, _)) => {
                let b = book.clone();
                std::thread::spawn(move || connection(s, &b));
            }
            Err(e) => {
                eprintln!("ends-peer: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn connection(mut s: TcpStream, book: &Book) {
    let _ = s.set_read_timeout(Some(READ_TIMEOUT));
    let mut raw = [0u8; HEAD_LEN];
    if let Err(e) = s.read_exact(&mut raw) {
        eprintln!("ends-peer: no head: {e}");
        return;
    }
    let Some(h) = Head::decode(&raw) else {
        eprintln!(
            "ends-peer: a connection without a valid head: {:02x?}",
            &raw[..16]
        );
        return;
    };
    if h.magic == END_MAGIC {
        if let Err(e) = verdict(s, &h, book) {
            eprintln!("ends-peer: closing connection: {e}");
        }
        return;
    }
    let open = Record {
        method: h.method,
        close: h.close,
        stop: h.stop,
        received: 0,
        bad: 0,
        end: PeerEnd::Open,
    };
    book.put(&h, open);
    let r = receive(s, &h);
    book.put(&h, r);
}

/// Reads and checks the payload until the end of stream or the head's stop, then
/// acts as the head says.
fn receive(mut s: TcpStream, h: &Head) -> Record {
    let mut buf = vec![0u8; 64 << 10];
    let mut expect = vec![0u8; 64 << 10];
    let mut r = Record {
        method: h.method,
        close: h.close,
        stop: h.stop,
        received: 0,
        bad: 0,
        end: PeerEnd::Open,
    };
    while r.received < h.stop {
        let want = (h.stop - r.received).min(buf.len() as u64) as usize;
        match s.read(&mut buf[..want]) {
            Ok(0) => {
                r.end = PeerEnd::Eof;
                return r;
            }
            Ok(n) => {
                fill(h.key, h.start + r.received, &mut expect[..n]);
                let differ = buf[..n].iter().zip(&expect[..n]).filter(|(a, b)| a != b);
                r.bad += differ.count() as u64;
                r.received += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                r.end = PeerEnd::Timeout;
                return r;
            }
            Err(_) => {
                r.end = PeerEnd::Reset;
                return r;
            }
        }
    }
    if h.act == Act::Reset
        && let Err(e) = sys::linger_zero(s.as_fd())
    {
        eprintln!("ends-peer: SO_LINGER: {e}");
    }
    r.end = PeerEnd::Acted;
    r
}

/// Says (stderr) which connections lost bytes: the first few, and the losses by
/// method and closing way.
fn tell_losses(h: &Head, sent: &[(u64, u64)], records: &HashMap<u64, Record>) {
    let lost = short(h.case, sent, records);
    let mut by: Vec<((Method, CloseWay), u64, u64)> = Vec::new();
    for (id, r, n) in &lost {
        let due = if h.case == Case::Race {
            *n
        } else {
            (*n).min(r.stop)
        };
        if by.len() < 5 {
            eprintln!(
                "ends-peer {}: connection {id} ({}, {:?}): received {} of {due} bytes reported sent, then {:?}",
                h.case.name(),
                r.method.name(),
                r.close,
                r.received,
                r.end
            );
        }
        let key = (r.method, r.close);
        match by.iter_mut().find(|(k, _, _)| *k == key) {
            Some(e) => (e.1, e.2) = (e.1 + 1, e.2 + due - r.received),
            None => by.push((key, 1, due - r.received)),
        }
    }
    for ((m, c), conns, bytes) in by {
        eprintln!(
            "ends-peer {}: {} / {c:?}: {conns} connections lost {bytes} bytes",
            h.case.name(),
            m.name()
        );
    }
}

/// The closing connection: reads the list, waits for those connections, answers.
fn verdict(mut s: TcpStream, h: &Head, book: &Book) -> Result<(), String> {
    if h.id > MAX_LISTED {
        return Err(format!("{} connections listed, at most {MAX_LISTED}", h.id));
    }
    let mut raw = vec![0u8; h.id as usize * 16];
    s.read_exact(&mut raw)
        .map_err(|e| format!("the list: {e}"))?;
    let sent = decode_sent(&raw);
    let records = book.take(h.run, h.case, &sent);
    let v: PeerVerdict = judge(h.case, &sent, &records);
    tell_losses(h, &sent, &records);
    println!(
        "peer {}: run {:x}: conns={} missing={} received={} lost={} extra={} bad_bytes={} unfinished={} resets={}",
        h.case.name(),
        h.run,
        v.conns,
        v.missing,
        v.received,
        v.lost,
        v.extra,
        v.bad,
        v.unfinished,
        v.resets
    );
    let _ = io::stdout().flush();
    s.write_all(&v.encode())
        .map_err(|e| format!("the verdict: {e}"))
}
