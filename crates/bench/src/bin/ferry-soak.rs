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
//!
//! The sockets are libc's (std's), so under `ferry run` the shim serves them.

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ferry_bench::soak::conn::Calls;
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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry-soak: {e}");
            ExitCode::FAILURE
        }
    }
}
