//! The `ferry` command: `run` a program in a network sandbox served over shared memory,
//! `demo` it against a remote namespace, `bench` it, `ctl` a running sandbox. Owns
//! argument parsing, wiring the sandbox to its protocol servers, exit statuses and user-facing messages; the work itself lives in the
//! library crates.
#![deny(unsafe_code)]

mod args;
mod bench;
mod ctl;
mod demo;
mod demo_vm;
mod oci;
mod run;
mod stop;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run unmodified programs in a network sandbox whose sockets are served by ferry's
/// protocol servers outside it, over shared memory.
#[derive(Debug, Parser)]
#[command(name = "ferry", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD in a sandbox (own network namespace with only `lo`); its inet sockets are
    /// served by ferry's protocol servers in the caller's namespace.
    Run(Box<run::RunArgs>),
    /// Show ferry at work: a remote host, the same client natively and through ferry,
    /// and ferry's counters (needs root for the remote namespace).
    Demo(demo::DemoArgs),
    /// Measure ferry against native sockets and its peers (slirp4netns, pasta) on a
    /// remote namespace: experiments E1–E4, E7 and R1, with CSV, plots and a report (root).
    Bench(bench::BenchArgs),
    /// Serve a VM guest's network: ferry is its vhost-user-net backend, each queue pair
    /// served by a NIC server under the same rules as `ferry run`'s TAP.
    Vm(vm::VmArgs),
    /// Talk to a running `ferry run`: live per-server counters, move a server to a CPU.
    Ctl(ctl::CtlArgs),
    /// Be an OCI runtime for container engines (runc's command line, delegating to the
    /// real runc): the container's processes get ferry's sandbox network. `ferry oci
    /// --help` says more; also run as `ferry-oci` (a link so named).
    Oci {
        /// runc's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// `ferry oci ARGS…` or `ferry-oci ARGS…`: runc's command line, which clap does not
/// parse (its global options come before the command).
fn oci_argv() -> Option<Vec<String>> {
    let mut argv = std::env::args_os().map(|a| a.to_string_lossy().into_owned());
    let name = argv.next()?;
    if std::path::Path::new(&name).file_name()? == "ferry-oci" {
        return Some(argv.collect());
    }
    (argv.next()? == "oci").then(|| argv.collect())
}

/// `RLIMIT_NOFILE`'s soft limit when ferry started and after [`ferry_sys::raise_nofile_limit`]
/// (`None`: it could not be read).
pub(crate) static NOFILE: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();

/// Logs (at debug level, once logging is set up) what happened to the descriptor limit.
pub(crate) fn log_nofile() {
    match NOFILE.get() {
        Some(Some((before, after))) if before != after => {
            tracing::debug!(
                "RLIMIT_NOFILE: soft limit raised from {before} to {after} (the hard limit)"
            )
        }
        Some(Some((before, _))) => {
            tracing::debug!("RLIMIT_NOFILE: soft limit {before} is already the hard limit")
        }
        _ => tracing::debug!("RLIMIT_NOFILE: could not be raised"),
    }
}

fn main() -> ExitCode {
    run::timing::started();
    let oci = oci_argv();
    let cli = match oci {
        Some(_) => None,
        None => Some(Cli::parse()),
    };
    // Two descriptors per sandbox connection (host socket, pair end): raise the soft
    // limit to the hard one before anything opens. The program gets the limit ferry
    // was started with back (`run`).
    let _ = NOFILE.set(ferry_sys::raise_nofile_limit().ok());
    // The server writes to sockets the sandbox may have closed: it must get EPIPE.
    let _ = ferry_sys::ignore_sigpipe();
    let Some(cli) = cli else {
        let code = oci::main(oci.unwrap_or_default());
        return ExitCode::from(code.clamp(0, 255) as u8);
    };
    let code = match cli.command {
        Command::Oci { args } => oci::main(args),
        Command::Run(a) => run::main(*a),
        Command::Demo(a) => demo::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Ctl(a) => ctl::main(a),
        Command::Vm(a) => vm::main(a),
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}
