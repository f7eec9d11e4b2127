//! The two event loops of the soak: the driver (connects, [`drive`]) and the verifier
//! (accepts, [`verify`]). Each is one thread with `poll` over its connections; among the
//! ready ones it serves a random order, skips some for a turn, and reads or writes
//! first at random, so the interleaving of sends, receives, shutdowns and closes across
//! connections changes all the time, repeatably from the seed but for timing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::conn::{Calls, Conn, Failure, Scratch, State, Tally};
use super::{Direction, END_MAGIC, Header, Plan, Rng, mb};

/// What the driver runs.
#[derive(Clone, Debug)]
pub struct DriveOptions {
    /// The verifier.
    pub connect: SocketAddr,
    /// Seed of everything random.
    pub seed: u64,
    /// Payload bytes to move, both ways added.
    pub bytes: u64,
    /// Connections open at once.
    pub parallel: usize,
    /// Largest payload of one connection, each way.
    pub max_conn: u64,
    /// Which ways payload goes.
    pub direction: Direction,
    /// Interval of progress lines (stderr).
    pub progress: Duration,
    /// Give up when no byte moved for this long.
    pub stall: Duration,
    /// Which calls move the bytes.
    pub calls: Calls,
}

/// Totals of a loop.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// Connections finished (complete, whatever their checks said).
    pub conns: u64,
    /// Payload bytes client → server (as counted by this end).
    pub up: u64,
    /// Payload bytes server → client.
    pub down: u64,
    /// Bad bytes found by this end.
    pub bad: u64,
    /// Digest comparisons that were equal / different.
    pub digests_equal: u64,
    /// Digest comparisons that differed.
    pub digests_differ: u64,
    /// Connections that failed (error, early end), with why (first 20).
    pub failures: Vec<String>,
    /// Connections that failed.
    pub failed: u64,
}

impl Totals {
    fn add(&mut self, t: &Tally, client: bool) {
        let (up, down) = if client {
            (t.sent, t.received)
        } else {
            (t.received, t.sent)
        };
        self.up += up;
        self.down += down;
        self.bad += t.bad;
        self.digests_equal += t.digests_equal;
        self.digests_differ += t.digests_differ;
        if t.bad > 0 && self.failures.len() < 20 {
            self.failures.push(format!(
                "{} bad bytes, the first at offset {:?}",
                t.bad, t.first_bad
            ));
        }
    }

    fn fail(&mut self, f: Failure) {
        eprintln!("soak: FAILED {}", f.0);
        self.failed += 1;
        if self.failures.len() < 20 {
            self.failures.push(f.0);
        }
    }

    fn clean(&self) -> bool {
        self.bad == 0 && self.digests_differ == 0 && self.failed == 0
    }
}

/// The driver's result.
#[derive(Debug)]
pub struct Summary {
    /// What this end counted.
    pub totals: Totals,
    /// Wall time.
    pub seconds: f64,
    /// The verifier's verdict line.
    pub verifier: String,
}

impl Summary {
    /// No bad byte, every digest equal (two per connection), no failure, and the
    /// verifier agrees.
    pub fn ok(&self) -> bool {
        self.totals.clean()
            && self.totals.digests_equal == 2 * self.totals.conns
            && self.verifier.starts_with("verifier: OK")
    }

    /// The closing line: `soak: OK conns=… up=… down=… bad_bytes=… digests_equal=…/…
    /// failed=… seconds=… MB/s=… | verifier: …`.
    pub fn line(&self) -> String {
        let t = &self.totals;
        let rate = (t.up + t.down) as f64 / 1e6 / self.seconds.max(1e-9);
        format!(
            "soak: {} conns={} up={} down={} bad_bytes={} digests_equal={}/{} failed={} seconds={:.1} MB/s={:.0} | {}",
            if self.ok() { "OK" } else { "BAD" },
            t.conns,
            t.up,
            t.down,
            t.bad,
            t.digests_equal,
            t.digests_equal + t.digests_differ,
            t.failed,
            self.seconds,
            rate,
            self.verifier.trim()
        )
    }
}

/// Progress lines and stall detection shared by both loops.
struct Watch {
    who: &'static str,
    start: Instant,
    every: Duration,
    last_line: Instant,
    last_bytes: u64,
    moved: u64,
    last_move: Instant,
    stall: Duration,
}

impl Watch {
    fn new(who: &'static str, every: Duration, stall: Duration) -> Watch {
        let now = Instant::now();
        Watch {
            who,
            start: now,
            every,
            last_line: now,
            last_bytes: 0,
            moved: 0,
            last_move: now,
            stall,
        }
    }

    /// Prints a line when due; fails when no byte moved for the stall span.
    fn tick(&mut self, t: &Totals, live: u64, open: usize) -> Result<(), String> {
        let now = Instant::now();
        let bytes = t.up + t.down + live;
        if bytes != self.moved {
            self.moved = bytes;
            self.last_move = now;
        }
        if now - self.last_line >= self.every {
            let secs = (now - self.start).as_secs_f64();
            let rate = (bytes - self.last_bytes.min(bytes)) as f64
                / 1e6
                / (now - self.last_line).as_secs_f64();
            eprintln!(
                "{}: {secs:.0} s: {} up, {} down (finished connections), {} connections done, {open} open, {rate:.0} MB/s now",
                self.who,
                mb(t.up),
                mb(t.down),
                t.conns
            );
            self.last_line = now;
            self.last_bytes = bytes;
        }
        if open > 0 && now - self.last_move > self.stall {
            return Err(format!(
                "{}: stalled: no byte moved for {:.0} s with {open} connections open",
                self.who,
                self.stall.as_secs_f64()
            ));
        }
        Ok(())
    }
}

/// Connections that finished (`Ok`) or failed in a turn, by index.
type Ended = Vec<(usize, Result<State, Failure>)>;

/// Polls `conns`, then steps the ready ones in a random order; returns the indices of
/// the connections that finished or failed, with the outcome.
fn turn(
    conns: &mut [Conn],
    rng: &mut Rng,
    scratch: &mut Scratch,
    extra: Option<&TcpListener>,
) -> Result<(Ended, bool), String> {
    let mut fds: Vec<PollFd> = conns
        .iter()
        .map(|c| {
            let (r, w) = c.wants();
            let mut f = PollFlags::empty();
            if r {
                f |= PollFlags::POLLIN;
            }
            if w {
                f |= PollFlags::POLLOUT;
            }
            PollFd::new(c.sock.as_fd(), f)
        })
        .collect();
    if let Some(l) = extra {
        fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
    }
    poll(&mut fds, PollTimeout::from(1000u16)).map_err(|e| format!("poll: {e}"))?;
    let revents: Vec<PollFlags> = fds
        .iter()
        .map(|f| f.revents().unwrap_or(PollFlags::empty()))
        .collect();
    drop(fds);
    let accept = extra.is_some() && !revents[conns.len()].is_empty();
    let mut ready: Vec<usize> = (0..conns.len())
        .filter(|&i| !revents[i].is_empty())
        .collect();
    for i in (1..ready.len()).rev() {
        ready.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut done = Vec::new();
    for i in ready {
        // Left for a later turn now and then, so connections overtake each other.
        if rng.chance(1, 8) {
            continue;
        }
        let ev = revents[i];
        let c = &mut conns[i];
        let (want_r, want_w) = c.wants();
        let readable =
            want_r && ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR);
        let writable =
            want_w && ev.intersects(PollFlags::POLLOUT | PollFlags::POLLHUP | PollFlags::POLLERR);
        let mut steps: Vec<bool> = Vec::with_capacity(2);
        if readable {
            steps.push(true);
        }
        if writable {
            steps.push(false);
        }
        if steps.len() == 2 && rng.chance(1, 2) {
            steps.swap(0, 1);
        }
        for read in steps {
            let r = if read {
                c.on_readable(scratch)
            } else {
                c.on_writable()
            };
            match r {
                Ok(State::Open) => {}
                other => {
                    done.push((i, other));
                    break;
                }
            }
        }
    }
    Ok((done, accept))
}

/// Bytes moved by connections still open (for progress and stall detection).
fn live_bytes(conns: &[Conn]) -> u64 {
    conns.iter().map(|c| c.tally.sent + c.tally.received).sum()
}

/// Runs the driver: connections from the plan, `parallel` at a time, then the closing
/// connection with the totals; returns what both ends counted.
pub fn drive(o: &DriveOptions) -> Result<Summary, String> {
    let mut plan = Plan::new(o.seed, o.bytes, o.max_conn, o.direction);
    let mut rng = Rng::new(o.seed ^ 0x6472_6976);
    let mut scratch = Scratch::new();
    let mut active: Vec<Conn> = Vec::new();
    let mut totals = Totals::default();
    let mut watch = Watch::new("soak", o.progress, o.stall);
    let mut planned = true;
    loop {
        while planned && active.len() < o.parallel {
            let Some(h) = plan.next() else {
                planned = false;
                break;
            };
            let sock = TcpStream::connect(o.connect)
                .map_err(|e| format!("connect to {}: {e}", o.connect))?;
            sock.set_nonblocking(true)
                .map_err(|e| format!("O_NONBLOCK: {e}"))?;
            let mut c = Conn::client(sock, h, o.seed);
            c.calls = o.calls;
            active.push(c);
        }
        if active.is_empty() {
            break;
        }
        let (done, _) = turn(&mut active, &mut rng, &mut scratch, None)?;
        retire(&mut active, done, &mut totals, true);
        if let Err(e) = watch.tick(&totals, live_bytes(&active), active.len()) {
            for c in &active {
                eprintln!("soak: {}", c.describe());
            }
            return Err(e);
        }
    }
    let verifier = closing(o.connect, &totals)?;
    Ok(Summary {
        totals,
        seconds: watch.start.elapsed().as_secs_f64(),
        verifier,
    })
}

/// Removes finished and failed connections (highest index first), adding them up.
fn retire(active: &mut Vec<Conn>, mut done: Ended, totals: &mut Totals, client: bool) {
    done.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
    for (i, outcome) in done {
        let c = active.swap_remove(i);
        match outcome {
            Ok(_) => {
                totals.conns += 1;
                totals.add(&c.tally, client);
            }
            Err(f) => {
                totals.add(&c.tally, client);
                totals.fail(f);
            }
        }
    }
}

/// The closing connection: the driver's totals go to the verifier, its verdict comes
/// back.
fn closing(to: SocketAddr, t: &Totals) -> Result<String, String> {
    let mut s = TcpStream::connect(to).map_err(|e| format!("closing connection: {e}"))?;
    let h = Header {
        magic: END_MAGIC,
        id: t.conns + t.failed,
        key: 0,
        up: t.up,
        down: t.down,
        flags: 0,
    };
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| format!("closing connection: {e}"))?;
    s.write_all(&h.encode())
        .map_err(|e| format!("closing connection: {e}"))?;
    let mut verdict = String::new();
    s.read_to_string(&mut verdict)
        .map_err(|e| format!("closing connection: no verdict: {e}"))?;
    Ok(verdict)
}

/// Runs the verifier on `listener` until the driver's closing connection, after every
/// other connection has ended; answers it and returns the verdict line (which starts
/// with `verifier: OK` when every check passed).
pub fn verify(
    listener: &TcpListener,
    seed: u64,
    progress: Duration,
    calls: Calls,
) -> Result<String, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("O_NONBLOCK: {e}"))?;
    let mut rng = Rng::new(seed ^ 0x7665_7269);
    let mut scratch = Scratch::new();
    let mut active: Vec<Conn> = Vec::new();
    let mut totals = Totals::default();
    // Stalls are the driver's to judge: the verifier only says where it stands.
    let mut watch = Watch::new("verifier", progress, Duration::from_secs(10));
    let mut told = false;
    let mut end: Option<(Conn, Instant)> = None;
    loop {
        let (done, mut accept) = turn(&mut active, &mut rng, &mut scratch, Some(listener))?;
        retire(&mut active, done, &mut totals, false);
        if let Some(i) = active.iter().position(Conn::is_end) {
            end = Some((active.swap_remove(i), Instant::now()));
        }
        // Every connection waiting, when the listener was ready.
        while accept {
            let s = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    accept = false;
                    continue;
                }
                Err(e) => return Err(format!("accept: {e}")),
            };
            s.set_nonblocking(true)
                .map_err(|e| format!("O_NONBLOCK: {e}"))?;
            let mut c = Conn::server(s, rng.next_u64());
            c.calls = calls;
            active.push(c);
        }
        match watch.tick(&totals, live_bytes(&active), active.len()) {
            Err(e) if !told => {
                eprintln!("{e}");
                for c in &active {
                    eprintln!("verifier: {}", c.describe());
                }
                told = true;
            }
            Err(_) => {}
            Ok(()) => told = false,
        }
        let due = end.as_ref().is_some_and(|(_, since)| {
            active.is_empty() || since.elapsed() > Duration::from_secs(60)
        });
        if let Some((mut c, _)) = end.take_if(|_| due) {
            let h = c.header.unwrap_or(Header {
                magic: END_MAGIC,
                id: 0,
                key: 0,
                up: 0,
                down: 0,
                flags: 0,
            });
            let mut why = Vec::new();
            if !totals.clean() {
                why.push(format!("{} failures", totals.failed));
            }
            if !active.is_empty() {
                why.push(format!("{} connections still open", active.len()));
            }
            if totals.conns + totals.failed != h.id {
                why.push(format!("driver made {} connections", h.id));
            }
            if (totals.up, totals.down) != (h.up, h.down) {
                why.push(format!("driver counted up={} down={}", h.up, h.down));
            }
            let line = format!(
                "verifier: {} conns={} up={} down={} bad_bytes={} digests_equal={}/{} failed={}{}{}\n",
                if why.is_empty() { "OK" } else { "BAD" },
                totals.conns,
                totals.up,
                totals.down,
                totals.bad,
                totals.digests_equal,
                totals.digests_equal + totals.digests_differ,
                totals.failed,
                if why.is_empty() { "" } else { ": " },
                why.join(", ")
            );
            let _ = c.sock.set_nonblocking(false);
            let _ = c.sock.write_all(line.as_bytes());
            return Ok(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Shutdown;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn options(to: SocketAddr, bytes: u64) -> DriveOptions {
        DriveOptions {
            connect: to,
            seed: 3,
            bytes,
            parallel: 8,
            max_conn: 1 << 20,
            direction: Direction::Both,
            progress: Duration::from_secs(60),
            stall: Duration::from_secs(20),
            calls: Calls::All,
        }
    }

    fn verifier() -> (SocketAddr, std::thread::JoinHandle<Result<String, String>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || verify(&l, 4, Duration::from_secs(60), Calls::All));
        (addr, t)
    }

    #[test]
    fn a_clean_run_passes_every_check() {
        let (addr, v) = verifier();
        let s = drive(&options(addr, 20 << 20)).unwrap();
        assert!(s.ok(), "{}", s.line());
        assert!(s.totals.conns > 5, "{}", s.line());
        assert_eq!(s.totals.up + s.totals.down, 20 << 20);
        assert!(v.join().unwrap().unwrap().starts_with("verifier: OK"));
    }

    /// Copies `from` to `to`, flipping the byte at offset `flip` (if any) of the stream.
    fn pipe(mut from: TcpStream, mut to: TcpStream, flip: Option<u64>) {
        let mut buf = [0u8; 4096];
        let mut at = 0u64;
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Some(f) = flip.filter(|f| (at..at + n as u64).contains(f)) {
                buf[(f - at) as usize] ^= 0x20;
            }
            at += n as u64;
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    }

    /// A proxy in front of `upstream` that flips one byte going up (past the header)
    /// on its `nth` connection.
    fn flipping_proxy(upstream: SocketAddr, nth: u64) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let count = Arc::new(AtomicU64::new(0));
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let Ok(u) = TcpStream::connect(upstream) else {
                    return;
                };
                let i = count.fetch_add(1, Ordering::Relaxed);
                let flip = (i == nth).then_some(100);
                let (c2, u2) = (c.try_clone().unwrap(), u.try_clone().unwrap());
                std::thread::spawn(move || pipe(c, u, flip));
                std::thread::spawn(move || pipe(u2, c2, None));
            }
        });
        addr
    }

    #[test]
    fn one_flipped_byte_fails_both_ends() {
        let (addr, v) = verifier();
        let mut o = options(flipping_proxy(addr, 2), 20 << 20);
        o.direction = Direction::Up;
        let s = drive(&o).unwrap();
        assert!(!s.ok(), "{}", s.line());
        // The server counted it; the client saw the server's digest differ from its own.
        assert!(s.totals.digests_differ >= 1, "{}", s.line());
        let verdict = v.join().unwrap().unwrap();
        assert!(verdict.starts_with("verifier: BAD"), "{verdict}");
        assert!(verdict.contains("bad_bytes=1 "), "{verdict}");
    }
}
