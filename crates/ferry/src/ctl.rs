//! `ferry ctl`: talks to a running `ferry run` over its admin socket — live per-server
//! counters, and moving a protocol server to another CPU (S4's process transfer).
//!
//! The admin socket lives in the run's private directory (`ferry-PID-*` in the temporary
//! directory, mode 0700; the sandbox's control socket is in a directory of its own
//! beside it), mode 0600: only the user who started the run may use it, and never a
//! process of the sandbox (which may run as that same user: each connection's peer is
//! checked). One request line per connection, one answer: `stats`, `stats-json`, `move
//! SERVER CPU`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};
use ferry_counters::{live_json, live_table};
use ferry_server::{Control, parse_server, server_name};

/// File name of the admin socket in a run's directory.
pub const ADMIN_SOCKET: &str = "admin.sock";

/// Beside the admin socket of a container's network side (`ferry oci`): its id.
pub const CONTAINER: &str = "container";

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The run to talk to: the process id of its `ferry run`, its admin socket path, or
    /// (a prefix of) the id of a container run by `ferry oci` (default: the only run of
    /// this user).
    #[arg(long, value_name = "PID|PATH|CONTAINER")]
    pub run: Option<String>,
    #[command(subcommand)]
    pub what: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// List the running sandboxes (their `ferry run` process ids).
    List,
    /// Per-server live counters: CPU, sockets, channels, requests, bytes.
    Stats {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pin a protocol server (`proto-K` or `K`) to a CPU; it keeps every socket and
    /// request it holds.
    Move {
        /// The server.
        server: String,
        /// The CPU.
        cpu: usize,
    },
}

/// Makes this run's admin socket at `path` (mode 0600).
pub fn listen(path: &Path) -> std::io::Result<UnixListener> {
    let listener = UnixListener::bind(path)?;
    ferry_sys::chmod(path, 0o600)?;
    Ok(listener)
}

/// Serves the admin socket on a background thread; connections from the sandbox
/// (`sandbox_init` and its descendants) are refused.
pub fn serve(
    listener: UnixListener,
    control: Control,
    nics: Vec<(String, Arc<ferry_nic::NicLive>)>,
    sandbox_init: i32,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("ferry-admin".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                use std::os::fd::AsFd;
                match ferry_sys::peer_pid(conn.as_fd()) {
                    Ok(pid) if !ferry_server::descends_from(pid, sandbox_init) => {
                        let _ = answer(conn, &control, &nics);
                    }
                    Ok(pid) => {
                        tracing::warn!("admin socket: pid {pid} is in the sandbox; refused");
                    }
                    Err(e) => tracing::warn!("admin socket: peer without credentials ({e})"),
                }
            }
        })?;
    Ok(())
}

/// The NIC servers of a run, by id, with their live counters.
type Nics = [(String, Arc<ferry_nic::NicLive>)];

fn answer(conn: UnixStream, control: &Control, nics: &Nics) -> std::io::Result<()> {
    conn.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    let mut line = String::new();
    // One line, at most 256 bytes.
    BufReader::new(&conn).take(256).read_line(&mut line)?;
    let reply = handle(line.trim(), control, nics);
    (&conn).write_all(reply.as_bytes())
}

/// The answer to one request line.
fn handle(line: &str, control: &Control, nics: &Nics) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let snapshot = || {
        let mut all = control.snapshot();
        all.extend(nics.iter().map(|(id, l)| l.snapshot(id)));
        all
    };
    match words.as_slice() {
        ["stats"] => live_table(&snapshot()),
        ["stats-json"] => live_json(&snapshot()) + "\n",
        ["move", server, cpu] => {
            let nic = nics.iter().find(|(id, _)| id == server);
            let k = parse_server(server);
            let Ok(cpu) = cpu.parse::<usize>() else {
                return format!("error: `{cpu}` is not a CPU number\n");
            };
            let allowed = ferry_sys::allowed_cpus().unwrap_or_default();
            if !allowed.is_empty() && !allowed.contains(&cpu) {
                return format!(
                    "error: CPU {cpu} is not available (use {})\n",
                    crate::args::format_cpus(&allowed)
                );
            }
            let (moved, name) = match (nic, k) {
                (Some((id, live)), _) => (live.move_to(cpu), id.clone()),
                (None, Some(k)) => (control.move_server(k, cpu), server_name(k)),
                (None, None) => {
                    return format!("error: `{server}` is not a server id (proto-K, nic-K)\n");
                }
            };
            match moved {
                Ok(()) => format!("ok: {name} pinned to CPU {cpu}\n"),
                Err(e) => format!("error: {e}\n"),
            }
        }
        _ => format!("error: unknown request `{line}` (stats, stats-json, move SERVER CPU)\n"),
    }
}

/// Admin sockets of this user's runs whose `ferry run` is alive, with its pid: those
/// in the temporary directory, and the network sides of containers (`ferry oci`).
fn runs() -> Vec<(u32, PathBuf)> {
    let mut out: Vec<(u32, PathBuf)> = [std::env::temp_dir(), ferry_oci::state::net_base()]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|dir| dir.flatten())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid: u32 = name
                .strip_prefix("ferry-")?
                .split('-')
                .next()?
                .parse()
                .ok()?;
            let sock = e.path().join(ADMIN_SOCKET);
            (sock.exists() && Path::new(&format!("/proc/{pid}")).exists()).then_some((pid, sock))
        })
        .collect();
    out.sort();
    out
}

/// The container a run serves (`ferry oci`), if it is one.
fn container(sock: &Path) -> Option<String> {
    std::fs::read_to_string(sock.with_file_name(CONTAINER)).ok()
}

fn pick_run(run: Option<&str>) -> Result<PathBuf, String> {
    let all = runs();
    match run {
        Some(r) if r.contains('/') => Ok(PathBuf::from(r)),
        Some(r) if r.parse::<u32>().is_err() => all
            .into_iter()
            .find(|(_, s)| container(s).is_some_and(|c| c.starts_with(r)))
            .map(|(_, s)| s)
            .ok_or_else(|| {
                format!("--run: `{r}` is not a process id, a path or a running container's id")
            }),
        Some(r) => {
            let pid: u32 = r
                .parse()
                .map_err(|_| format!("--run: `{r}` is not a process id or a path"))?;
            all.into_iter()
                .find(|(p, _)| *p == pid)
                .map(|(_, s)| s)
                .ok_or_else(|| {
                    format!("no running `ferry run` with pid {pid} (see `ferry ctl list`)")
                })
        }
        None => match all.as_slice() {
            [] => Err("no running `ferry run` found".into()),
            [(_, s)] => Ok(s.clone()),
            many => Err(format!(
                "{} runs are going ({}): choose one with --run PID",
                many.len(),
                many.iter()
                    .map(|(p, _)| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
    }
}

/// Sends one request line to an admin socket and returns the answer.
pub fn request(sock: &Path, line: &str) -> Result<String, String> {
    let mut conn =
        UnixStream::connect(sock).map_err(|e| format!("cannot reach {}: {e}", sock.display()))?;
    conn.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut out = String::new();
    conn.read_to_string(&mut out)
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    Ok(out)
}

pub fn main(a: CtlArgs) -> i32 {
    if let CtlCommand::List = a.what {
        for (pid, sock) in runs() {
            match container(&sock) {
                Some(id) => println!("{pid}\t{}\tcontainer {id}", sock.display()),
                None => println!("{pid}\t{}", sock.display()),
            }
        }
        return 0;
    }
    let line = match &a.what {
        CtlCommand::List => unreachable!("handled above"),
        CtlCommand::Stats { json: false } => "stats".to_string(),
        CtlCommand::Stats { json: true } => "stats-json".to_string(),
        CtlCommand::Move { server, cpu } => format!("move {server} {cpu}"),
    };
    let answer = pick_run(a.run.as_deref()).and_then(|sock| request(&sock, &line));
    match answer {
        Ok(text) if text.starts_with("error: ") => {
            eprint!("ferry: {}", &text["error: ".len()..]);
            1
        }
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("ferry: {e}");
            1
        }
    }
}
