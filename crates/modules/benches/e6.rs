//! E6 (S3): sending a file with a header to a socket — the application's read/write
//! loop, the application's sendfile, and a module (http_file: header + EmitFile) — for a
//! 2,322-byte file and 1–6 MB files, over TCP on 127.0.0.1; plus the module start-up
//! breakdown (start, init, drop) and the cost of the two interruption schemes.
//!
//! `cargo bench -p ferry-modules --bench e6` (env `FERRY_BENCH_QUICK=1` for a short run,
//! `FERRY_BENCH_ONLY=start,interrupt,e6` for some sections, `FERRY_BENCH_JSON=path` to
//! also write JSON rows `{"name","metric","value"}`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use ferry_modules::{Action, Interrupt, Limits, ModuleHost, ModuleId, perform};
use rustix::net::SendFlags;

struct Rows(Vec<(String, String, f64)>);

impl Rows {
    fn add(&mut self, name: &str, metric: &str, value: f64) {
        self.0.push((name.to_string(), metric.to_string(), value));
    }

    fn write_json(&self, path: &Path) -> io::Result<()> {
        let mut s = String::from("[\n");
        for (i, (n, m, v)) in self.0.iter().enumerate() {
            let sep = if i + 1 == self.0.len() { "" } else { "," };
            s.push_str(&format!(
                "  {{\"name\": \"{n}\", \"metric\": \"{m}\", \"value\": {v}}}{sep}\n"
            ));
        }
        s.push_str("]\n");
        std::fs::write(path, s)
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn example(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.wat"));
    std::fs::read(p).expect("example module")
}

/// Module start-up: instantiate (store + pooled slot), init, drop; p50/p99.
fn bench_start(rows: &mut Rows, quick: bool) {
    let n = if quick { 2000 } else { 10_000 };
    let h = ModuleHost::new(Limits::default()).expect("host");
    let id = h.load(&example("http_file")).expect("load");
    let dir = std::env::temp_dir().join(format!("ferry-e6-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("f");
    std::fs::write(&path, vec![b'x'; 2322]).expect("file");
    let file = File::open(&path).expect("open");
    let props = [("content-length", "2322"), ("content-type", "text/html")];

    let (mut start, mut init, mut drop_t, mut total) = (vec![], vec![], vec![], vec![]);
    let (mut spare_start, mut prewarm_t) = (vec![], vec![]);
    for i in 0..n + 500 {
        let fd: OwnedFd = file.try_clone().expect("dup").into();
        let t0 = Instant::now();
        let mut inst = h.instantiate(id, &props, vec![fd]).expect("instantiate");
        let t1 = Instant::now();
        let actions = inst.init().expect("init");
        let t2 = Instant::now();
        drop(actions);
        drop(inst);
        let t3 = Instant::now();
        // The same through a spare built ahead of time.
        h.prewarm(id, 1).expect("prewarm");
        let t4 = Instant::now();
        let fd: OwnedFd = file.try_clone().expect("dup").into();
        let t5 = Instant::now();
        let (inst, actions) = h.start(id, &props, vec![fd]).expect("start");
        let t6 = Instant::now();
        drop(actions);
        drop(inst);
        if i >= 500 {
            start.push(t1 - t0);
            init.push(t2 - t1);
            drop_t.push(t3 - t2);
            total.push(t2 - t0);
            prewarm_t.push(t4 - t3);
            spare_start.push(t6 - t5);
        }
    }
    println!("\n## Module start ({n} starts of http_file, after 500 warm-up)\n");
    println!("| phase | p50 µs | p99 µs |");
    println!("|---|---:|---:|");
    for (name, key, v) in [
        (
            "instantiate (store + pooled slot + link)",
            "module_start",
            &mut start,
        ),
        (
            "init (builds the header, emits 2 actions)",
            "module_init",
            &mut init,
        ),
        (
            "start = instantiate + init",
            "module_start_init",
            &mut total,
        ),
        ("drop (slot back to the pool)", "module_drop", &mut drop_t),
        (
            "prewarm one spare (off the request path)",
            "module_prewarm",
            &mut prewarm_t,
        ),
        (
            "start from a spare (inputs + init)",
            "module_start_spare",
            &mut spare_start,
        ),
    ] {
        v.sort();
        let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
        println!("| {name} | {:.2} | {:.2} |", us(p50), us(p99));
        rows.add(key, "p50_us", us(p50));
        rows.add(key, "p99_us", us(p99));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// gzip throughput with epoch vs fuel interruption: what checking the deadline costs.
fn bench_interrupt(rows: &mut Rows, quick: bool) {
    let size = if quick { 4 << 20 } else { 16 << 20 };
    let mut text = Vec::with_capacity(size);
    let words = [
        "ferry ", "module ", "socket ", "kernel ", "buffer\n", "wasm ", "the ",
    ];
    let mut x = 12345u32;
    while text.len() < size {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        text.extend_from_slice(words[(x >> 16) as usize % words.len()].as_bytes());
    }
    text.truncate(size);
    println!(
        "\n## Interruption cost (gzip module, {} MiB of text, 64 KiB buffers)\n",
        size >> 20
    );
    println!("| interruption | MB/s | compressed % |");
    println!("|---|---:|---:|");
    for (name, interrupt) in [
        ("epoch", Interrupt::Epoch),
        ("fuel", Interrupt::Fuel(u64::MAX / 2)),
    ] {
        let h = ModuleHost::new(Limits {
            interrupt,
            deadline: Duration::from_secs(1),
            ..Limits::default()
        })
        .expect("host");
        let id = h.load(&example("gzip")).expect("load gzip");
        let mut best = Duration::MAX;
        let mut out_len = 0;
        for _ in 0..3 {
            let t = Instant::now();
            let (mut inst, _) = h
                .start(id, &[] as &[(&str, &str)], Vec::new())
                .expect("start");
            let mut n = 0;
            for c in text.chunks(64 * 1024) {
                n += inst
                    .feed(c.to_vec())
                    .expect("feed")
                    .iter()
                    .map(Action::len)
                    .sum::<u64>();
            }
            n += inst
                .close()
                .expect("close")
                .iter()
                .map(Action::len)
                .sum::<u64>();
            best = best.min(t.elapsed());
            out_len = n;
        }
        let mbs = size as f64 / best.as_secs_f64() / 1e6;
        let ratio = out_len as f64 * 100.0 / size as f64;
        println!("| {name} | {mbs:.1} | {ratio:.1} |");
        rows.add(&format!("gzip_{name}"), "MB_per_s", mbs);
        rows.add(&format!("gzip_{name}"), "compressed_pct", ratio);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    ReadWrite,
    Sendfile,
    Module,
    /// The module from a spare built after the previous response (as a server would
    /// when idle).
    ModuleSpare,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::ReadWrite => "app read/write",
            Way::Sendfile => "app sendfile",
            Way::Module => "module",
            Way::ModuleSpare => "module, spare",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Way::ReadWrite => "app_rw",
            Way::Sendfile => "app_sendfile",
            Way::Module => "module",
            Way::ModuleSpare => "module_spare",
        }
    }
}

fn header(len: u64) -> String {
    format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: text/html\r\n\r\n")
}

/// Sends all of `b`; MSG_MORE when `more` (the body follows).
fn send_all(s: &TcpStream, mut b: &[u8], more: bool) -> io::Result<()> {
    let flags = if more {
        SendFlags::MORE
    } else {
        SendFlags::empty()
    };
    while !b.is_empty() {
        let n = rustix::net::send(s, b, flags)?;
        b = &b[n..];
    }
    Ok(())
}

#[derive(Default)]
struct Breakdown {
    /// Module: instantiate.
    start: Vec<Duration>,
    /// Module: `init`.
    init: Vec<Duration>,
    /// Writing the response (header + body) to the socket.
    data: Vec<Duration>,
    /// Server time per request: open the file .. response written (and instance dropped).
    server: Vec<Duration>,
}

/// Serves requests on `s` from `path` in way `way` (one response per request line)
/// until the client closes.
fn serve(
    way: Way,
    s: TcpStream,
    path: &Path,
    host: &ModuleHost,
    id: ModuleId,
    pin_to: Option<usize>,
) -> Breakdown {
    pin(pin_to);
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut buf = vec![0u8; 64 * 1024];
    let mut bd = Breakdown::default();
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).expect("request") == 0 {
            break;
        }
        let t_req = Instant::now();
        let f = File::open(path).expect("open");
        let len = f.metadata().expect("stat").len();
        match way {
            Way::ReadWrite => {
                let t0 = Instant::now();
                let mut f = f;
                send_all(&s, header(len).as_bytes(), true).expect("header");
                loop {
                    let k = f.read(&mut buf).expect("read");
                    if k == 0 {
                        break;
                    }
                    send_all(&s, &buf[..k], false).expect("write");
                }
                bd.data.push(t0.elapsed());
            }
            Way::Sendfile => {
                let t0 = Instant::now();
                send_all(&s, header(len).as_bytes(), true).expect("header");
                let mut off = 0u64;
                while off < len {
                    let count = (len - off) as usize;
                    let k = rustix::fs::sendfile(&s, &f, Some(&mut off), count).expect("sendfile");
                    assert!(k > 0);
                }
                bd.data.push(t0.elapsed());
            }
            Way::Module => {
                let l = len.to_string();
                let props = [
                    ("content-length", l.as_str()),
                    ("content-type", "text/html"),
                ];
                // Fresh instance each time (the spare path is measured in the start
                // table): the server-side cost here is the whole cost.
                let t0 = Instant::now();
                let mut inst = host
                    .instantiate(id, &props, vec![f.into()])
                    .expect("instantiate");
                let t1 = Instant::now();
                let actions = inst.init().expect("init");
                let t2 = Instant::now();
                perform(actions, s.as_fd()).expect("perform");
                let t3 = Instant::now();
                drop(inst);
                bd.start.push(t1 - t0);
                bd.init.push(t2 - t1);
                bd.data.push(t3 - t2);
            }
            Way::ModuleSpare => {
                let l = len.to_string();
                let props = [
                    ("content-length", l.as_str()),
                    ("content-type", "text/html"),
                ];
                let t0 = Instant::now();
                let (inst, actions) = host.start(id, &props, vec![f.into()]).expect("start");
                let t2 = Instant::now();
                perform(actions, s.as_fd()).expect("perform");
                let t3 = Instant::now();
                drop(inst);
                bd.server.push(t_req.elapsed());
                host.prewarm(id, 1).expect("prewarm");
                bd.init.push(t2 - t0);
                bd.data.push(t3 - t2);
                continue;
            }
        }
        bd.server.push(t_req.elapsed());
    }
    bd
}

/// Pins the calling thread to `cpu` (server threads on 0, the client on 1), or lets it
/// run anywhere (`None`). Only with at least two CPUs; `FERRY_BENCH_NOPIN` turns it off.
fn pin(cpu: Option<usize>) {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    if std::env::var_os("FERRY_BENCH_NOPIN").is_some() || cpus < 2 {
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    match cpu {
        Some(c) => set.set(c),
        None => (0..cpus.min(rustix::thread::CpuSet::MAX_CPU)).for_each(|c| set.set(c)),
    }
    let _ = rustix::thread::sched_setaffinity(None, &set);
}

/// Whether responses of `size` bytes are measured with pinned threads: the large ones
/// (throughput: a fixed placement makes the ways comparable; unpinned, each run lands
/// either on one CPU or on two and the figures are bimodal), not the small one
/// (latency: there the scheduler's usual choice, both threads on one CPU, is the case
/// to measure; pinned, every response pays a cross-CPU wake-up of ~70 µs on this VM).
fn pinned(size: u64) -> bool {
    size >= 1_000_000
}

/// The client end of one persistent connection.
struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
    sink: Vec<u8>,
    line: String,
}

impl Client {
    fn connect(addr: std::net::SocketAddr) -> Client {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        let r = BufReader::with_capacity(256 * 1024, s.try_clone().expect("clone"));
        Client {
            r,
            w: s,
            sink: vec![0u8; 256 * 1024],
            line: String::new(),
        }
    }

    /// `n` requests, one at a time: request, whole response. Per-response times.
    fn run(&mut self, n: usize, size: u64) -> Vec<Duration> {
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            self.w.write_all(b"GET /file\n").expect("request");
            let mut len = None;
            loop {
                self.line.clear();
                self.r.read_line(&mut self.line).expect("header line");
                if self.line == "\r\n" {
                    break;
                }
                if let Some(v) = self.line.strip_prefix("Content-Length: ") {
                    len = v.trim().parse::<u64>().ok();
                }
            }
            let mut left = len.expect("content-length");
            assert_eq!(left, size);
            while left > 0 {
                let want = left.min(self.sink.len() as u64) as usize;
                let k = self.r.read(&mut self.sink[..want]).expect("body");
                assert!(k > 0, "eof");
                left -= k as u64;
            }
            times.push(t.elapsed());
        }
        times
    }
}

fn bench_e6(rows: &mut Rows, quick: bool) {
    let host = ModuleHost::new(Limits::default()).expect("host");
    let id = host.load(&example("http_file")).expect("load");
    let dir = std::env::temp_dir().join(format!("ferry-e6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut sizes = vec![2322u64];
    sizes.extend((1..=6).map(|m| m * 1_000_000));

    println!("\n## E6: header + file to a TCP client on 127.0.0.1 (persistent connection)\n");
    println!("Per response: client sends a request line, reads header + body. Times are the");
    println!("client's (request sent → last byte read), over interleaved rounds; MB/s is the");
    println!("median over rounds of each round's bytes / time, × sendfile the median of the");
    println!(
        "per-round ratios; server = open .. response written (and instance dropped). Every way"
    );
    println!("sends the header with MSG_MORE so it leaves with the first body bytes. One");
    println!("persistent connection per way; for the MB files the server threads are pinned to");
    println!("CPU 0 and the client to CPU 1, the 2,322-byte runs are not pinned.\n");
    println!(
        "| file | way | p50 µs | p99 µs | MB/s | × sendfile | server p50 µs | instantiate p50 µs | init p50 µs (spare: start) | data p50 µs |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &size in &sizes {
        let path = dir.join(format!("f{size}"));
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 13) as u8).collect();
        std::fs::write(&path, &data).expect("file");
        let n = match (size, quick) {
            (2322, false) => 30_000,
            (2322, true) => 3000,
            (_, false) => 600,
            (_, true) => 60,
        };
        let rounds = if quick { 3 } else { 9 };
        let ways = [Way::ReadWrite, Way::Sendfile, Way::Module, Way::ModuleSpare];
        let mut all: Vec<(Vec<Duration>, Breakdown)> = ways
            .iter()
            .map(|_| (vec![], Breakdown::default()))
            .collect();
        // Throughput of each way in each round; rounds rotate the order of the ways.
        let mut round_mbs: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
        thread::scope(|sc| {
            // One server thread and one persistent connection per way, for all rounds.
            let mut servers = Vec::new();
            let mut clients = Vec::new();
            for &w in &ways {
                let l = TcpListener::bind("127.0.0.1:0").expect("bind");
                let addr = l.local_addr().expect("addr");
                let (path, host) = (&path, &host);
                servers.push(sc.spawn(move || {
                    let (s, _) = l.accept().expect("accept");
                    s.set_nodelay(true).expect("nodelay");
                    serve(w, s, path, host, id, pinned(size).then_some(0))
                }));
                clients.push(Client::connect(addr));
            }
            pin(pinned(size).then_some(1));
            // Warm-up (connections, caches, TCP windows), then interleaved rounds so
            // that drift and load from elsewhere hit every way alike.
            for c in clients.iter_mut() {
                c.run(n / 10 + 1, size);
            }
            for r in 0..rounds {
                for k in 0..ways.len() {
                    let i = (k + r) % ways.len();
                    let t = clients[i].run(n / rounds, size);
                    let total: Duration = t.iter().sum();
                    round_mbs[i].push(size as f64 * t.len() as f64 / total.as_secs_f64() / 1e6);
                    all[i].0.extend(t);
                }
            }
            drop(clients);
            for (i, h) in servers.into_iter().enumerate() {
                all[i].1 = h.join().expect("server thread");
            }
        });
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        for (i, (t, b)) in all.iter_mut().enumerate() {
            let w = ways[i];
            t.sort();
            let (p50, p99) = (pct(t, 0.5), pct(t, 0.99));
            let mbs = median(round_mbs[i].clone());
            // Paired per round, so that load from elsewhere hits both sides alike.
            let rel = median(
                round_mbs[i]
                    .iter()
                    .zip(&round_mbs[1])
                    .map(|(a, b)| a / b)
                    .collect(),
            );
            let cell = |v: &mut Vec<Duration>| {
                if v.is_empty() {
                    "–".to_string()
                } else {
                    v.sort();
                    format!("{:.2}", us(pct(v, 0.5)))
                }
            };
            let (srv, s, ini, d) = (
                cell(&mut b.server),
                cell(&mut b.start),
                cell(&mut b.init),
                cell(&mut b.data),
            );
            let label = if size == 2322 {
                "2,322 B".to_string()
            } else {
                format!("{} MB", size / 1_000_000)
            };
            println!(
                "| {label} | {} | {:.1} | {:.1} | {mbs:.0} | {rel:.3} | {srv} | {s} | {ini} | {d} |",
                w.name(),
                us(p50),
                us(p99)
            );
            let name = format!("e6_{}_{}", w.key(), size);
            rows.add(&name, "p50_us", us(p50));
            rows.add(&name, "p99_us", us(p99));
            rows.add(&name, "MB_per_s", mbs);
            rows.add(&name, "throughput_vs_sendfile", rel);
            rows.add(&name, "server_p50_us", us(pct(&b.server, 0.5)));
            rows.add(&name, "data_p50_us", us(pct(&b.data, 0.5)));
            if w == Way::Module {
                rows.add(&name, "module_start_p50_us", us(pct(&b.start, 0.5)));
                rows.add(&name, "module_init_p50_us", us(pct(&b.init, 0.5)));
            }
            if w == Way::ModuleSpare {
                rows.add(&name, "module_start_init_p50_us", us(pct(&b.init, 0.5)));
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing useful either.
    let quick =
        std::env::var_os("FERRY_BENCH_QUICK").is_some() || std::env::args().any(|a| a == "--quick");
    // FERRY_BENCH_ONLY=start,interrupt,e6 picks sections.
    let only = std::env::var("FERRY_BENCH_ONLY").unwrap_or_default();
    let want = |s: &str| only.is_empty() || only.split(',').any(|o| o.trim() == s);
    let mut rows = Rows(Vec::new());
    if want("start") {
        bench_start(&mut rows, quick);
    }
    if want("interrupt") {
        bench_interrupt(&mut rows, quick);
    }
    if want("e6") {
        bench_e6(&mut rows, quick);
    }
    if let Some(p) = std::env::var_os("FERRY_BENCH_JSON") {
        rows.write_json(Path::new(&p)).expect("write JSON");
        println!("\nJSON rows written to {}", Path::new(&p).display());
    }
}
