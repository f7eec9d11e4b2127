//! A container's network side: the process `create` starts (`ferry oci _serve`, its
//! command line and lines declared in `ferry_oci::side`), in the network namespace the
//! engine gave the container, that runs `ferry run`'s steps (servers, sandbox, TAP,
//! DNS) for the container instead of a program ([`Container`], a
//! [`Workload`](crate::run::Workload)).
//!
//! It checks the container's options first ("refused", naming the source), says
//! "ready" once the sandbox's namespace exists (its TAP and DNS are set up while the
//! real runtime creates the container), reads the container's pid (`create` returns),
//! tells `start` it serves (`ferry_oci::side::Pending`). It
//! ends when the container's first process ends (a pidfd), when `delete` stops it
//! (SIGTERM goes to the sandbox, which then ends), or when `create` gives up (stdin
//! closed). Its sandbox's held command never runs: it holds the namespace, and exits
//! when the network side does, however that ends (its gate closes).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use clap::Parser;
use ferry_oci::options::Flag;
use ferry_oci::side::{self, Pending, Ready, SERVE, Said, Serve};
use ferry_oci::{state, sys};

use super::report;
use crate::run::{self, Net, RunArgs, RunDirs, RunError, Workload};

/// The sandbox's held command: never run.
const HOLDER: &str = "ferry-oci-holder";

/// `ferry run`'s options, parsed as `ferry run` would.
#[derive(Debug, Parser)]
#[command(name = "ferry oci", no_binary_name = true)]
struct RunCli {
    #[command(flatten)]
    run: RunArgs,
}

/// Parses `flags` (from `ferry_oci::options`) as `ferry run`'s.
fn parse_run(flags: &[String]) -> Result<RunArgs, String> {
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

/// Checks the options as `ferry run` would (its parser, its policy and DNS checks),
/// each alone and then together; a refused one is named by its source.
fn check(flags: &[Flag]) -> Result<RunArgs, (String, String)> {
    for f in flags {
        if let Err(message) = parse_run(&f.args).and_then(|a| run::check_plan(&a)) {
            return Err((f.source.clone(), message));
        }
    }
    let all: Vec<String> = flags.iter().flat_map(|f| f.args.clone()).collect();
    let together = |m| ("the container's ferry options together".to_owned(), m);
    let a = parse_run(&all).map_err(together)?;
    run::check_plan(&a).map_err(together)?;
    Ok(a)
}

/// `ferry oci _serve …` (`ferry_oci::side::Serve`): the network side.
pub(super) fn serve(argv: &[String]) -> i32 {
    let Some(s) = Serve::parse(argv) else {
        eprintln!("ferry oci: {SERVE} is started by `ferry oci create`");
        return 2;
    };
    // Checked before anything is made.
    let a = match check(&s.flags) {
        Ok(a) => a,
        Err((origin, message)) => {
            eprintln!("ferry oci: {origin}: {message}");
            side::say(&Said::Refused { origin, message });
            return 2;
        }
    };
    let shim = match a.net {
        Net::Nic => None,
        _ => match run::find_preload() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("ferry oci: {e}");
                return 125;
            }
        },
    };
    // Before any thread: every thread started later is in this namespace.
    let entered = match &s.netns {
        None => sys::new_netns().map(|()| allow_ping()),
        Some(p) => sys::enter_netns(p),
    };
    if let Err(e) = entered {
        // EINVAL: the path is no namespace here, e.g. a `/run/netns` mount made after
        // the engine's mount namespace was (a private one does not see it).
        let hint = if e.raw_os_error() == Some(libc::EINVAL) {
            " (not a network namespace in the runtime's mount namespace)"
        } else {
            ""
        };
        let netns = s.netns.as_deref().unwrap_or(Path::new("new")).display();
        eprintln!("ferry oci: entering the container's network namespace {netns}: {e}{hint}");
        return 125;
    }
    init_logging(a.verbose, report::Sink::open(&s.targets));
    if let Err(e) = std::fs::create_dir_all(state::net_base()) {
        eprintln!("ferry oci: creating {}: {e}", state::net_base().display());
        return 125;
    }
    let mut work = Container {
        id: s.id,
        shim,
        pidfd: None,
        serving: s.serving,
        pending: None,
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
    /// The shim `create` places, where the image can load it.
    shim: Option<PathBuf>,
    /// Its first process, once created.
    pidfd: Option<OwnedFd>,
    /// Where it tells `start` it serves.
    serving: Option<PathBuf>,
    /// That word, locked until it serves.
    pending: Option<Pending>,
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
        let holder = u32::try_from(sandbox.pid()).map_err(|_| gone("named a bad pid"))?;
        // Before "ready" (`create` returns after it), after the sandbox's clone (its init
        // must not hold the lock).
        if let Some(path) = &self.serving {
            let pending = Pending::take(path)
                .map_err(|e| RunError::Workload(format!("{}: {e}", path.display())))?;
            self.pending = Some(pending);
        }
        let ready = Ready {
            holder,
            dir: dirs.sandbox.clone(),
            shim: self.shim.clone(),
        };
        side::say(&Said::Ready(ready))
            .then_some(())
            .ok_or_else(|| gone("went away"))
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
        if let Some(p) = self.pending.take() {
            p.serving();
        }
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
