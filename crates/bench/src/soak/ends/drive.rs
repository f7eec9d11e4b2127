//! The driver of the end cases (`ferry-soak ends`): `parallel` slots work through a
//! case's plans, each slot one thread (the dead and sendfile cases) or two (the race
//! case: a closing thread that connects and closes, a worker that sends); then the
//! closing exchange with the peer gives the case's [`Summary`].

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::plan::{self, ConnPlan, FILE_LEN, SENDFILE_SNDBUF};
use super::send::{Bounds, Sender};
use super::tally::{Outcome, PeerVerdict, Summary, Tally};
use super::wire::{Head, encode_sent};
use super::{Case, CloseWay, Method, sys};
use crate::soak::{fill, mb, mix};

/// No connection finishing for this long ends the driver (a send or close that never
/// returns): it says so and exits with status 1.
const HUNG: Duration = Duration::from_secs(120);

/// What the driver runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The peer (the sendfile case uses the next port).
    pub connect: SocketAddr,
    /// The cases, in order.
    pub cases: Vec<Case>,
    /// Payload of the race case.
    pub bytes: u64,
    /// Connections of the dead case and of the sendfile case.
    pub conns: u64,
    /// Connections at once.
    pub parallel: usize,
    /// The calls the payload may go by (not empty).
    pub methods: Vec<Method>,
    /// Busy processes beside the driver.
    pub busy: usize,
    /// Seed of every plan.
    pub seed: u64,
    /// When a send into a dead connection counts.
    pub bounds: Bounds,
    /// Interval of progress lines (stderr).
    pub progress: Duration,
}

/// Runs the cases one after another; returns their summaries.
pub fn drive(o: &Options) -> Result<Vec<Summary>, String> {
    if o.methods.is_empty() {
        return Err("no method to send by".into());
    }
    let _busy = Busy::start(o.busy)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let run = mix(o.seed ^ mix(u64::from(std::process::id()) ^ nanos));
    let file = payload_file(run)?;
    let mut out = Vec::new();
    for &case in &o.cases {
        let s = run_case(o, case, run, &file)?;
        println!("{}", s.line());
        let _ = io::stdout().flush();
        out.push(s);
    }
    Ok(out)
}

fn run_case(o: &Options, case: Case, run: u64, file: &File) -> Result<Summary, String> {
    let plans = match case {
        Case::Race => plan::race(run, o.seed, o.bytes, &o.methods),
        Case::Dead => plan::dead(run, o.seed, o.conns, &o.methods),
        Case::Sendfile => plan::sendfile(run, o.seed, o.conns, &o.methods),
    };
    let start = Instant::now();
    let slots = Slots::new(o, case, &plans, file);
    let mut results = slots.run();
    // By connection, so that the first failures listed are the first connections'.
    results.sort_unstable_by_key(|(id, _)| *id);
    let mut tally = Tally::default();
    let mut sent = Vec::with_capacity(results.len());
    for (id, outcome) in &results {
        tally.add(case, *id, outcome);
        sent.push((*id, outcome.sent()));
    }
    let peer = closing(o.connect, run, case, &sent)?;
    for f in &tally.failures {
        eprintln!("ends: {f}");
    }
    Ok(Summary {
        case,
        tally,
        peer,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The file the `sendfile` calls read: the stream of the run's file key (made in the
/// temporary directory and unlinked at once).
fn payload_file(run: u64) -> Result<File, String> {
    let path = std::env::temp_dir().join(format!("ferry-soak-ends-{run:016x}"));
    let err = |e: io::Error| format!("{}: {e}", path.display());
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(err)?;
    let _ = std::fs::remove_file(&path);
    let mut chunk = vec![0u8; 1 << 20];
    for off in (0..FILE_LEN).step_by(chunk.len()) {
        fill(plan::file_key(run), off, &mut chunk);
        f.write_all(&chunk).map_err(err)?;
    }
    Ok(f)
}

/// The closing exchange: the list of (id, bytes sent) to the peer, its verdict back.
fn closing(
    to: SocketAddr,
    run: u64,
    case: Case,
    sent: &[(u64, u64)],
) -> Result<PeerVerdict, String> {
    let err = |e: io::Error| format!("closing connection of the {} case: {e}", case.name());
    let mut s = TcpStream::connect(to).map_err(err)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(err)?;
    let head = Head::closing(run, case, sent.len() as u64);
    s.write_all(&head.encode()).map_err(err)?;
    s.write_all(&encode_sent(sent)).map_err(err)?;
    let mut b = [0u8; PeerVerdict::LEN];
    s.read_exact(&mut b).map_err(err)?;
    PeerVerdict::decode(&b).ok_or_else(|| format!("{} case: no verdict from the peer", case.name()))
}

/// Connects for `p`: the head sent, the socket set up for the plan's method
/// (non-blocking, or blocking with `SO_SNDTIMEO` at `timeout`), and for the sendfile
/// case a 4 KiB `SO_SNDBUF`.
fn open(to: SocketAddr, p: &ConnPlan, timeout: Duration) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect(to)?;
    if p.head.case == Case::Sendfile {
        sys::set_int(
            s.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            SENDFILE_SNDBUF,
        )?;
    }
    s.write_all(&p.head.encode())?;
    if p.head.method.nonblocking() {
        s.set_nonblocking(true)?;
    } else {
        s.set_write_timeout(Some(timeout))?;
    }
    Ok(s)
}

/// Ends a race connection the plan's way, from the closing thread, the moment the
/// worker's sends returned.
fn close(sock: Arc<TcpStream>, way: CloseWay) -> Result<(), String> {
    let sock = Arc::try_unwrap(sock).map_err(|_| "the worker still holds the socket")?;
    if way == CloseWay::Close {
        drop(sock);
        return Ok(());
    }
    sock.shutdown(Shutdown::Write)
        .map_err(|e| format!("shutdown: {e}"))?;
    if way == CloseWay::ShutClose {
        drop(sock);
        return Ok(());
    }
    let err = |e: io::Error| format!("after shutdown, waiting for the peer's end: {e}");
    sock.set_nonblocking(false).map_err(err)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(err)?;
    match (&sock).read(&mut [0u8; 16]) {
        Ok(0) => Ok(()),
        Ok(_) => Err("the peer sent bytes".into()),
        Err(e) => Err(err(e)),
    }
}

/// The slots of one case and what they share.
struct Slots<'a> {
    o: &'a Options,
    case: Case,
    plans: &'a [ConnPlan],
    file: &'a File,
    next: AtomicUsize,
    done: AtomicU64,
    bytes: AtomicU64,
    idle: AtomicUsize,
}

type Results = Vec<(u64, Outcome)>;

impl<'a> Slots<'a> {
    fn new(o: &'a Options, case: Case, plans: &'a [ConnPlan], file: &'a File) -> Slots<'a> {
        Slots {
            o,
            case,
            plans,
            file,
            next: AtomicUsize::new(0),
            done: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            idle: AtomicUsize::new(0),
        }
    }

    fn take(&self) -> Option<&'a ConnPlan> {
        self.plans.get(self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn count(&self, o: &Outcome) {
        self.done.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(o.sent(), Ordering::Relaxed);
    }

    fn timeout(&self) -> Duration {
        match self.case {
            Case::Race => self.o.bounds.stall,
            _ => self.o.bounds.time,
        }
    }

    /// Runs every slot; returns each connection's outcome.
    fn run(&self) -> Results {
        let n = self.o.parallel.max(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    s.spawn(|| {
                        let r = match self.case {
                            Case::Race => self.race_slot(),
                            _ => self.refused_slot(),
                        };
                        self.idle.fetch_add(1, Ordering::Relaxed);
                        r
                    })
                })
                .collect();
            self.watch(n);
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        })
    }

    /// Progress lines until every slot is done; exits the process when nothing has
    /// finished for [`HUNG`].
    fn watch(&self, slots: usize) {
        let (start, mut said) = (Instant::now(), Instant::now());
        let (mut last_done, mut last_change) = (0, Instant::now());
        while self.idle.load(Ordering::Relaxed) < slots {
            std::thread::sleep(Duration::from_millis(50));
            let done = self.done.load(Ordering::Relaxed);
            if done != last_done {
                (last_done, last_change) = (done, Instant::now());
            }
            if said.elapsed() >= self.o.progress {
                said = Instant::now();
                eprintln!(
                    "ends {}: {:.0} s: {done} of {} connections, {} sent",
                    self.case.name(),
                    start.elapsed().as_secs_f64(),
                    self.plans.len(),
                    mb(self.bytes.load(Ordering::Relaxed))
                );
            }
            if last_change.elapsed() > HUNG {
                eprintln!(
                    "ends {}: hung: no connection ended for {} s ({done} of {} done)",
                    self.case.name(),
                    HUNG.as_secs(),
                    self.plans.len()
                );
                std::process::exit(1);
            }
        }
    }

    /// A dead or sendfile slot: connect, send until refused, close; next.
    fn refused_slot(&self) -> Results {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(p) = self.take() {
            let outcome = match open(self.o.connect_for(self.case), p, self.timeout()) {
                Ok(sock) => {
                    Sender::new(&sock, p, self.file, &mut buf).send_until_refused(&self.o.bounds)
                }
                Err(e) => Outcome::Failed {
                    sent: 0,
                    why: format!("connect: {e}"),
                },
            };
            self.count(&outcome);
            out.push((p.head.id, outcome));
        }
        out
    }

    /// A race slot: this thread connects, hands the socket to its worker, waits for
    /// the worker's sends to return and closes at once.
    fn race_slot(&self) -> Results {
        let (jobs, job_rx) = mpsc::channel::<(Arc<TcpStream>, &ConnPlan)>();
        let (done_tx, done) = mpsc::channel::<Outcome>();
        std::thread::scope(|s| {
            s.spawn(move || self.race_worker(&job_rx, &done_tx));
            let mut out = Vec::new();
            while let Some(p) = self.take() {
                let outcome = self.race_one(p, &jobs, &done);
                self.count(&outcome);
                out.push((p.head.id, outcome));
            }
            drop(jobs);
            out
        })
    }

    fn race_one(
        &self,
        p: &'a ConnPlan,
        jobs: &mpsc::Sender<(Arc<TcpStream>, &'a ConnPlan)>,
        done: &mpsc::Receiver<Outcome>,
    ) -> Outcome {
        let sock = match open(self.o.connect, p, self.timeout()) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                let why = format!("connect: {e}");
                return Outcome::Failed { sent: 0, why };
            }
        };
        let worked = jobs
            .send((sock.clone(), p))
            .ok()
            .and_then(|_| done.recv().ok());
        let Some(outcome) = worked else {
            let why = "the worker thread is gone".into();
            return Outcome::Failed { sent: 0, why };
        };
        match close(sock, p.head.close) {
            Ok(()) => outcome,
            Err(why) => Outcome::Failed {
                sent: outcome.sent(),
                why: format!("{:?}: {why}", p.head.close),
            },
        }
    }

    /// The worker: sends each connection's payload, lets go of the socket, reports.
    fn race_worker(
        &self,
        jobs: &mpsc::Receiver<(Arc<TcpStream>, &ConnPlan)>,
        done: &mpsc::Sender<Outcome>,
    ) {
        let mut buf = Vec::new();
        for (sock, p) in jobs {
            let outcome = Sender::new(&sock, p, self.file, &mut buf).send_all(&self.o.bounds);
            drop(sock);
            if done.send(outcome).is_err() {
                return;
            }
        }
    }
}

impl Options {
    /// The peer's address for `case` (the sendfile case's listener is on the next
    /// port).
    fn connect_for(&self, case: Case) -> SocketAddr {
        let mut to = self.connect;
        if case == Case::Sendfile {
            to.set_port(to.port().wrapping_add(1));
        }
        to
    }
}

/// Busy processes (`ferry-soak busy`) beside the driver, killed when dropped (and by
/// their parent-death signal if the driver dies first).
struct Busy(Vec<Child>);

impl Busy {
    fn start(n: usize) -> Result<Busy, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
        let mut kids = Busy(Vec::new());
        for _ in 0..n {
            let c = Command::new(&exe)
                .arg("busy")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("a busy process: {e}"))?;
            kids.0.push(c);
        }
        Ok(kids)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A busy process: spins until its parent is gone (it is killed first, as a rule).
pub fn busy() -> ! {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let parent = std::os::unix::process::parent_id();
    let mut x = 1u64;
    loop {
        for _ in 0..10_000_000 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
        if std::os::unix::process::parent_id() != parent {
            std::process::exit(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Two listeners on consecutive loopback ports (the peer's, or a proxy's).
    fn two_ports() -> (TcpListener, TcpListener) {
        for _ in 0..50 {
            let a = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = a.local_addr().unwrap().port().wrapping_add(1);
            if let Ok(b) = TcpListener::bind(("127.0.0.1", port)) {
                return (a, b);
            }
        }
        panic!("no two free consecutive ports");
    }

    fn peer() -> SocketAddr {
        let (main, small) = two_ports();
        let addr = main.local_addr().unwrap();
        std::thread::spawn(move || super::super::peer::serve_on(main, small));
        addr
    }

    fn options(to: SocketAddr, cases: &[Case]) -> Options {
        Options {
            connect: to,
            cases: cases.to_vec(),
            bytes: 4 << 20,
            conns: 40,
            methods: Method::ALL.to_vec(),
            parallel: 4,
            busy: 0,
            seed: 5,
            bounds: Bounds {
                bytes: 32 << 20,
                time: Duration::from_millis(1500),
                stall: Duration::from_secs(10),
            },
            progress: Duration::from_secs(60),
        }
    }

    #[test]
    fn every_case_passes_natively() {
        let all = drive(&options(peer(), &Case::ALL)).unwrap();
        assert_eq!(all.len(), 3);
        for s in &all {
            assert!(s.ok(), "{}", s.line());
        }
        assert_eq!(all[0].tally.sent, 4 << 20);
        assert_eq!(all[0].peer.received, 4 << 20);
        assert!(all[1..].iter().all(|s| s.tally.conns == 40));
    }

    /// A proxy in front of `upstream` (and of its next port, from the proxy's next
    /// port) that forwards at most `cap` bytes of each connection upstream and, when
    /// the upstream side fails, goes on reading the client: a layer that hides a reset.
    /// What comes back (the verdict, the end of stream) is passed on; a reset is not.
    fn proxy(upstream: SocketAddr, cap: u64) -> SocketAddr {
        let (main, small) = two_ports();
        let addr = main.local_addr().unwrap();
        let mut up_small = upstream;
        up_small.set_port(upstream.port() + 1);
        for (l, to) in [(main, upstream), (small, up_small)] {
            std::thread::spawn(move || {
                for c in l.incoming().flatten() {
                    std::thread::spawn(move || pipe(c, to, cap));
                }
            });
        }
        addr
    }

    fn pipe(mut from: TcpStream, to: SocketAddr, cap: u64) {
        let Ok(mut up) = TcpStream::connect(to) else {
            return;
        };
        let (mut back, mut to_client) = (up.try_clone().unwrap(), from.try_clone().unwrap());
        std::thread::spawn(move || {
            if io::copy(&mut back, &mut to_client).is_ok() {
                let _ = to_client.shutdown(Shutdown::Write);
            }
        });
        let (mut buf, mut moved, mut alive) = ([0u8; 8192], 0u64, true);
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            let take = (cap.saturating_sub(moved) as usize).min(n);
            if alive && take > 0 {
                alive = up.write_all(&buf[..take]).is_ok();
                moved += take as u64;
            }
        }
        let _ = up.shutdown(Shutdown::Write);
    }

    #[test]
    fn a_layer_that_drops_the_tail_loses_bytes() {
        // Each connection's first 100,000 bytes (its head and some payload) get
        // through, the rest is dropped, then the end of stream comes.
        let to = proxy(peer(), 100_000);
        let mut o = options(to, &[Case::Race]);
        o.bytes = 2 << 20;
        let all = drive(&o).unwrap();
        let s = &all[0];
        assert!(!s.ok(), "{}", s.line());
        assert!(s.peer.lost > 0, "{}", s.line());
        assert_eq!(s.peer.received + s.peer.lost, 2 << 20, "{}", s.line());
        assert_eq!(s.tally.failed, 0, "{}", s.line());
    }

    #[test]
    fn a_layer_that_hides_the_reset_makes_dead_sends() {
        let to = proxy(peer(), u64::MAX);
        let mut o = options(to, &[Case::Dead, Case::Sendfile]);
        o.conns = 6;
        o.bounds.time = Duration::from_millis(300);
        let all = drive(&o).unwrap();
        for s in &all {
            assert!(!s.ok(), "{}", s.line());
            assert_eq!(s.tally.dead_sends + s.tally.stalled, 6, "{}", s.line());
            assert_eq!(s.tally.epipe + s.tally.econnreset, 0, "{}", s.line());
        }
        // The sendfile case's whole file reported sent is a dead send.
        assert_eq!(all[1].tally.dead_sends, 6, "{}", all[1].line());
    }
}
