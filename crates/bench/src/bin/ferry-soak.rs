//! `ferry-soak`: TCP traffic whose every byte is checked at both ends, and many
//! connections held at once (see the `ferry_bench::soak` module for the wire format).
//!
//! - `ferry-soak verify --listen IP:PORT` is the verifier: it accepts soak connections,
//!   checks what it receives, sends its own streams, and exits after the driver's
//!   closing connection: status 0 when every check passed.
//! - `ferry-soak drive --connect IP:PORT --bytes 10G` is the driver: connections with
//!   random sizes and interleavings, both directions, until `--bytes` have moved; it
//!   prints progress on stderr and a closing `soak: OK …` / `soak: BAD …` line on stdout
//!   (its status says the same).
//! - `ferry-soak hold --connect IP:PORT --conns N` opens N connections, holds them all,
//!   sends and checks one request on each, then closes them all; `ferry-soak
//!   hold-serve --listen IP:PORT --conns N` is its server. `--pause` waits for a line of
//!   input at each phase, for measuring.
//! - `ferry-soak ends --connect IP:PORT` runs the end cases (see the
//!   `ferry_bench::soak::ends` module): sends racing a close from another thread,
//!   sends into connections the peer reset or closed, `sendfile` to a peer that
//!   closes mid-transfer; one `race: OK …` / `dead: …` / `sendfile: …` line per case
//!   on stdout (its status says whether all passed). `ferry-soak ends-peer --listen
//!   IP:PORT` is its peer (it also listens on PORT+1), serving until killed.
//!
//! The sockets are libc's (std's), so under `ferry run` the shim serves them.

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ferry_bench::soak::conn::Calls;
use ferry_bench::soak::ends::{self, Case, Method, send::Bounds};
use ferry_bench::soak::{self, Direction, hold, run};

#[derive(Debug, Parser)]
#[command(name = "ferry-soak")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The driver: connects to a verifier and moves --bytes through checked streams.
    Drive {
        /// The verifier's address.
        #[arg(long, value_name = "IP:PORT")]
        connect: SocketAddr,
        /// Payload to move, both ways added (e.g. 300M, 10G).
        #[arg(long, default_value = "100M", value_parser = soak::parse_size)]
        bytes: u64,
        /// Seed of every random choice.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Connections open at once.
        #[arg(long, default_value_t = 16)]
        parallel: usize,
        /// Largest payload of one connection, each way.
        #[arg(long, default_value = "64Mi", value_parser = soak::parse_size)]
        max_conn: u64,
        /// Which ways payload goes: up (to the verifier), down, both.
        #[arg(long, default_value = "both", value_parser = Direction::parse)]
        direction: Direction,
        /// Seconds between progress lines.
        #[arg(long, default_value_t = 5.0)]
        progress: f64,
        /// Give up when no byte has moved for this many seconds.
        #[arg(long, default_value_t = 60.0)]
        stall: f64,
        /// Calls that move the bytes: all (read, readv, peek+read, write, writev),
        /// no-peek, plain (read and write).
        #[arg(long, default_value = "all", value_parser = Calls::parse)]
        calls: Calls,
    },
    /// The verifier: serves soak connections until the driver's closing one.
    Verify {
        /// Where to listen.
        #[arg(long, value_name = "IP:PORT")]
        listen: SocketAddr,
        /// Seed of its random choices.
        #[arg(long, default_value_t = 2)]
        seed: u64,
        /// Seconds between progress lines.
        #[arg(long, default_value_t = 5.0)]
        progress: f64,
        /// Calls that move the bytes (as for drive).
        #[arg(long, default_value = "all", value_parser = Calls::parse)]
        calls: Calls,
    },
    /// Opens --conns connections at once, one checked request on each, closes them.
    Hold {
        /// The server's address.
        #[arg(long, value_name = "IP:PORT")]
        connect: SocketAddr,
        /// Connections.
        #[arg(long)]
        conns: usize,
        /// Body bytes of each request.
        #[arg(long, default_value_t = 1000)]
        body: usize,
        /// Seed of the request bodies.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Wait for a line of input after `held` and after `closed`.
        #[arg(long)]
        pause: bool,
    },
    /// The end cases: sends racing closes, sends into dead connections, sendfile to a
    /// peer that closes mid-transfer (against `ends-peer`).
    Ends {
        /// The peer's address (the sendfile case uses the next port).
        #[arg(long, value_name = "IP:PORT")]
        connect: SocketAddr,
        /// Cases to run, in order: race, dead, sendfile.
        #[arg(long, value_delimiter = ',', default_value = "race,dead,sendfile", value_parser = Case::parse)]
        cases: Vec<Case>,
        /// Payload of the race case (connections of 64-256 KiB until this much).
        #[arg(long, default_value = "64M", value_parser = soak::parse_size)]
        bytes: u64,
        /// Connections of the dead case, and of the sendfile case.
        #[arg(long, default_value_t = 2000)]
        conns: u64,
        /// Calls the payload may go by (to narrow a failure down): send, write,
        /// send-nb, sendfile, sendfile-nb (the sendfile case takes the last two).
        #[arg(long, value_delimiter = ',', default_value = "send,write,send-nb,sendfile,sendfile-nb", value_parser = Method::parse)]
        methods: Vec<Method>,
        /// Connections at once.
        #[arg(long, default_value_t = 16)]
        parallel: usize,
        /// Busy (spinning) processes beside the driver for the run.
        #[arg(long, default_value_t = 2)]
        busy: usize,
        /// Seed of every plan.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// A connection whose sends go on succeeding this many bytes past the peer's
        /// stop is a send into a dead connection...
        #[arg(long, default_value = "32Mi", value_parser = soak::parse_size)]
        dead_bytes: u64,
        /// ...and so is one with no error this many seconds after it passed the stop.
        #[arg(long, default_value_t = 2.0)]
        dead_after: f64,
        /// A connection with no room to send for this many seconds has stalled.
        #[arg(long, default_value_t = 20.0)]
        stall: f64,
        /// Seconds between progress lines.
        #[arg(long, default_value_t = 5.0)]
        progress: f64,
    },
    /// The peer of `ends`: checks every byte, resets or closes as told, judges.
    EndsPeer {
        /// Where to listen (and on the next port, with a 1 KiB SO_RCVBUF).
        #[arg(long, value_name = "IP:PORT")]
        listen: SocketAddr,
    },
    /// Spins until killed (the busy processes of `ends`).
    #[command(hide = true)]
    Busy,
    /// Serves `hold`: answers each request, returns after --conns have closed.
    HoldServe {
        /// Where to listen.
        #[arg(long, value_name = "IP:PORT")]
        listen: SocketAddr,
        /// Connections to wait for.
        #[arg(long)]
        conns: usize,
        /// Wait for a line of input once all have closed.
        #[arg(long)]
        pause: bool,
    },
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.001))
}

fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).map_err(|e| format!("listen on {addr}: {e}"))
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Drive {
            connect,
            bytes,
            seed,
            parallel,
            max_conn,
            direction,
            progress,
            stall,
            calls,
        } => {
            let o = run::DriveOptions {
                connect,
                seed,
                bytes,
                parallel: parallel.max(1),
                max_conn,
                direction,
                progress: secs(progress),
                stall: secs(stall),
                calls,
            };
            run::drive(&o).and_then(|s| {
                println!("{}", s.line());
                if s.ok() {
                    Ok(())
                } else {
                    for f in &s.totals.failures {
                        eprintln!("soak: {f}");
                    }
                    Err("integrity check failed".into())
                }
            })
        }
        Command::Verify {
            listen,
            seed,
            progress,
            calls,
        } => bind(listen).and_then(|l| {
            println!(
                "listening on {}",
                l.local_addr().map_err(|e| e.to_string())?
            );
            let line = run::verify(&l, seed, secs(progress), calls)?;
            print!("{line}");
            if line.starts_with("verifier: OK") {
                Ok(())
            } else {
                Err("integrity check failed".into())
            }
        }),
        Command::Hold {
            connect,
            conns,
            body,
            seed,
            pause,
        } => hold::hold_client(connect, conns, body, seed, pause),
        Command::HoldServe {
            listen,
            conns,
            pause,
        } => bind(listen).and_then(|l| hold::hold_server(l, conns, pause)),
        Command::Ends {
            connect,
            cases,
            bytes,
            conns,
            methods,
            parallel,
            busy,
            seed,
            dead_bytes,
            dead_after,
            stall,
            progress,
        } => {
            let o = ends::drive::Options {
                connect,
                cases,
                bytes,
                conns,
                methods,
                parallel,
                busy,
                seed,
                bounds: Bounds {
                    bytes: dead_bytes,
                    time: secs(dead_after),
                    stall: secs(stall),
                },
                progress: secs(progress),
            };
            ends::drive::drive(&o).and_then(|all| {
                let bad = all.iter().filter(|s| !s.ok()).count();
                if bad == 0 {
                    Ok(())
                } else {
                    Err(format!("{bad} of {} cases failed", all.len()))
                }
            })
        }
        Command::EndsPeer { listen } => ends::peer::serve(listen),
        Command::Busy => ends::drive::busy(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry-soak: {e}");
            ExitCode::FAILURE
        }
    }
}
