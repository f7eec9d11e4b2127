//! A container's network side: the process `create` starts, in the network namespace
//! the engine gave the container, that runs `ferry run`'s steps (servers, sandbox,
//! TAP, DNS) for the container instead of a program ([`Container`], a
//! [`Workload`](crate::run::Workload)).
//!
//! Its talk with `create`, one line each on its stdin and stdout: "ready HOLDER DIR"
//! (the sandbox's namespace exists: `/proc/HOLDER/ns/net`, its directory DIR; its TAP
//! and DNS are set up while the real runtime creates the container) →
//! the container's pid (the real runtime has created it) → "serving". It ends when the
//! container's first process ends (a pidfd), when `delete` stops it (SIGTERM goes to the
//! sandbox, which then ends), or when `create` gives up (stdin closed). Its sandbox's
//! held command never runs: it holds the namespace, and exits when the network side
//! does, however that ends (its gate closes).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use clap::Parser;
use ferry_oci::spec::EngineNetns;
use ferry_oci::state::{self, NET_DIR, RECORD, Record};
use ferry_oci::sys;

use ferry_oci::cli::OciError;

use super::report;
use crate::run::{self, RunArgs, RunDirs, RunError, Workload};

use ferry_oci::cli::SERVE;
/// The sandbox's held command: never run.
const HOLDER: &str = "ferry-oci-holder";
/// The network side's log, in the container's state directory.
const LOG: &str = "network.log";

/// `ferry run`'s options, parsed as `ferry run` would.
#[derive(Debug, Parser)]
#[command(name = "ferry oci", no_binary_name = true)]
struct RunCli {
    #[command(flatten)]
    run: RunArgs,
}

/// Parses `flags` (from `ferry_oci::options`) as `ferry run`'s.
pub(super) fn parse_run(flags: &[String]) -> Result<RunArgs, String> {
    let argv = flags.iter().map(String::as_str).chain(["--", HOLDER]);
    match RunCli::try_parse_from(argv) {
        Ok(c) => Ok(c.run),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid value");
            Err(first.trim_start_matches("error: ").to_owned())
        }
    }
}

/// The network side, seen from `create`: killed when dropped unless [`Side::keep`].
pub(super) struct Side {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    log: PathBuf,
    /// The sandbox's directory, once it said "ready".
    made: Option<PathBuf>,
    kept: bool,
}

/// What "ready" says.
pub(super) struct Ready {
    /// The process holding the sandbox's network namespace.
    pub(super) holder: u32,
    /// The sandbox's directory (control socket, shim).
    pub(super) dir: PathBuf,
}

impl Side {
    /// Starts the network side for the container whose state is in `dir`.
    pub(super) fn spawn(
        dir: &Path,
        id: &str,
        engine: &EngineNetns,
        report: &report::Targets,
        flags: &[String],
    ) -> Result<Side, OciError> {
        let exe = std::env::current_exe().map_err(OciError::io("locating the ferry binary"))?;
        let log = dir.join(LOG);
        let log_file = std::fs::File::create(&log)
            .map_err(OciError::io(format!("creating {}", log.display())))?;
        let netns = match engine {
            EngineNetns::Join(p) => p.clone(),
            EngineNetns::New => PathBuf::from("new"),
        };
        let mut child = Command::new(exe)
            .args(["oci", SERVE, "--id", id, "--netns"])
            .arg(netns)
            .args(report.args())
            .arg("--")
            .args(flags)
            .env("NO_COLOR", "1")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            // Out of the engine's process group: its signals to the runtime are not ours.
            .process_group(0)
            .spawn()
            .map_err(OciError::io("starting the network side"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(OciError::Side("no pipes".into()));
        };
        Ok(Side {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            log,
            made: None,
            kept: false,
        })
    }

    /// Waits for "ready".
    pub(super) fn ready(&mut self) -> Result<Ready, OciError> {
        let line = self.line()?;
        let mut it = line.split_whitespace();
        match (it.next(), it.next().and_then(|p| p.parse().ok()), it.next()) {
            (Some("ready"), Some(holder), Some(dir)) => {
                self.made = Some(dir.into());
                Ok(Ready {
                    holder,
                    dir: dir.into(),
                })
            }
            _ => Err(self.failed()),
        }
    }

    /// Writes its record and its sandbox's directory into the state directory `dir`.
    pub(super) fn record(&self, dir: &Path, ready: &Ready) -> Result<(), OciError> {
        let pid = self.child.id();
        let start = state::start_time(pid).ok_or_else(|| OciError::Side("it exited".into()))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(OciError::io(format!("writing {}", path.display())))
        };
        write(RECORD, Record { pid, start }.encode())?;
        write(NET_DIR, ready.dir.display().to_string())
    }

    /// The pid the hooks see: the network side's.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Tells it the container's pid; waits for "serving".
    pub(super) fn container(&mut self, pid: u32) -> Result<(), OciError> {
        if let Some(mut stdin) = self.stdin.take() {
            writeln!(stdin, "{pid}").map_err(|_| self.failed())?;
        }
        match self.line()?.trim() {
            "serving" => Ok(()),
            _ => Err(self.failed()),
        }
    }

    /// Leaves it running (the container is created).
    pub(super) fn keep(mut self) {
        self.kept = true;
    }

    fn line(&mut self) -> Result<String, OciError> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(n) if n > 0 => Ok(line),
            _ => Err(self.failed()),
        }
    }

    /// The error for a network side that did not say what it should: its log's end.
    fn failed(&mut self) -> OciError {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        let said: Vec<&str> = tail.into_iter().rev().collect();
        OciError::Side(if said.is_empty() {
            "it exited without a word".into()
        } else {
            said.join("; ")
        })
    }
}

impl Drop for Side {
    /// Not kept (`create` failed): killed, and the directories it made removed (a
    /// killed process removes nothing).
    fn drop(&mut self) {
        if !self.kept {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let made = self.made.as_deref().and_then(state::net_dirs);
            for d in made.into_iter().flatten() {
                state::remove(&d);
            }
        }
    }
}

/// `_serve`'s command line: the container's id, the namespace, where lines go, and
/// `ferry run`'s flags.
fn parse_serve(argv: &[String]) -> Option<(&str, &str, report::Targets, &[String])> {
    let [i, id, n, netns, rest @ ..] = argv else {
        return None;
    };
    if i != "--id" || n != "--netns" {
        return None;
    }
    let dashes = rest.iter().position(|a| a == "--")?;
    let mut targets = report::Targets::default();
    let mut it = rest[..dashes].iter();
    while let Some(name) = it.next() {
        if !targets.parse(name, &mut it).ok()? {
            return None;
        }
    }
    Some((id, netns, targets, &rest[dashes + 1..]))
}

/// `ferry oci _serve --id ID --netns PATH|new [--stderr-fd N] [--log PATH
/// [--log-json]] -- FLAGS…`: the network side.
pub(super) fn serve(argv: &[String]) -> i32 {
    let Some((id, netns, targets, flags)) = parse_serve(argv) else {
        eprintln!("ferry oci: {SERVE} is started by `ferry oci create`");
        return 2;
    };
    // Before any thread: every thread started later is in this namespace.
    let entered = match netns {
        "new" => sys::new_netns().map(|()| allow_ping()),
        p => sys::enter_netns(Path::new(p)),
    };
    if let Err(e) = entered {
        // EINVAL: the path is no namespace here, e.g. a `/run/netns` mount made after
        // the engine's mount namespace was (a private one does not see it).
        let hint = if e.raw_os_error() == Some(libc::EINVAL) {
            " (not a network namespace in the runtime's mount namespace)"
        } else {
            ""
        };
        eprintln!("ferry oci: entering the container's network namespace {netns}: {e}{hint}");
        return 125;
    }
    let a = match parse_run(flags) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ferry oci: {e}");
            return 2;
        }
    };
    init_logging(a.verbose, report::Sink::open(&targets));
    if let Err(e) = std::fs::create_dir_all(state::net_base()) {
        eprintln!("ferry oci: creating {}: {e}", state::net_base().display());
        return 125;
    }
    let mut work = Container {
        id: id.to_owned(),
        pidfd: None,
    };
    match run::serve_workload(&a, &mut work) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("ferry oci: {e}");
            e.exit_code()
        }
    }
}

/// In a network namespace of its own (nothing else lives there), lets the network side
/// open ping sockets, through which the NIC servers carry the container's echo
/// requests: a new namespace allows no group (`net.ipv4.ping_group_range` "1 0"). An
/// engine's namespace is left as the engine set it.
fn allow_ping() {
    let path = "/proc/sys/net/ipv4/ping_group_range";
    if let Err(e) = std::fs::write(path, "0 0") {
        eprintln!("ferry oci: {path}: {e}: the container's pings will be refused");
    }
}

/// The network side's log: everything at `-v`'s level on its stderr (`network.log`),
/// and its warnings through `sink` too (the container's stderr, the runtime's log).
fn init_logging(verbose: u8, sink: Option<report::Sink>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let own = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_filter(run::log_filter(verbose));
    let theirs = sink.map(|s| {
        tracing_subscriber::fmt::layer()
            .without_time()
            .with_level(false)
            .with_target(false)
            .with_ansi(false)
            .with_writer(s)
            .with_filter(tracing_subscriber::filter::LevelFilter::WARN)
    });
    let _ = tracing_subscriber::registry()
        .with(own)
        .with(theirs)
        .try_init();
}

/// The error for a runtime that broke the talk: `what` it did.
fn gone(what: &str) -> RunError {
    RunError::Workload(format!("the container's runtime {what}"))
}

/// The container, as `ferry run`'s steps serve it.
struct Container {
    /// Its id (written beside the admin socket, for `ferry ctl list`).
    id: String,
    /// Its first process, once created.
    pidfd: Option<OwnedFd>,
}

impl Workload for Container {
    fn dirs_base(&self) -> PathBuf {
        state::net_base()
    }

    /// Says "ready" as soon as the namespace exists: the real runtime's create (tens of
    /// milliseconds) joins it while the TAP and DNS are set up; the container's
    /// processes run only at `start`, after "serving".
    fn made(&mut self, sandbox: &ferry_sandbox::Sandbox, dirs: &RunDirs) -> Result<(), RunError> {
        if let Err(e) = std::fs::write(dirs.run.join(crate::ctl::CONTAINER), &self.id) {
            tracing::warn!("`ferry ctl list` will not name this container: {e}");
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready {} {}", sandbox.pid(), dirs.sandbox.display())
            .and_then(|()| out.flush())
            .map_err(|_| gone("went away"))
    }

    fn go(&mut self, _: &mut ferry_sandbox::Sandbox, _: &RunDirs) -> Result<i32, RunError> {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|_| gone("went away"))?;
        let pid: u32 = line
            .trim()
            .parse()
            .map_err(|_| gone("gave up before the container was created"))?;
        let pidfd = sys::pidfd_open(pid)
            .map_err(|e| RunError::Workload(format!("the container's process {pid}: {e}")))?;
        self.pidfd = Some(pidfd);
        i32::try_from(pid).map_err(|_| gone("named a bad pid"))
    }

    fn serving(&mut self) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "serving").and_then(|()| out.flush());
    }

    fn wait(&mut self, sandbox: &mut ferry_sandbox::Sandbox) -> Result<i32, RunError> {
        if let Some(pidfd) = &self.pidfd {
            // The container's end, or the sandbox's (a SIGTERM from `delete`).
            let _ = sys::wait_any(&[pidfd.as_fd(), sandbox.pidfd()], None);
        }
        let _ = sandbox.signal(libc::SIGKILL);
        sandbox.wait().map_err(RunError::Wait)
    }
}
