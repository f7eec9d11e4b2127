//! runc's command line answered: the one dispatch of `ferry oci` and of the lean
//! `ferry-oci` executable. Every command but [`FULL`]'s (`install`, which reads ferry's
//! own path, and the network side itself, `ferry run`'s servers) is answered here —
//! `create` (which starts the network side: [`crate::create`]), the real runtime's
//! commands, `delete` stopping the network side and removing the container's state,
//! `hook` showing the engine's hooks the network side's pid — so the lean executable,
//! which links none of ferry's servers, answers them without loading the full `ferry`
//! (a 140 MB binary whose loading took 2–3 ms of each runtime call). Errors go to stderr and, as runc's do,
//! to the engine's `--log` (JSON with `--log-format json`), where engines read them.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::args::{self, Globals, Invocation};
use crate::state;

/// The commands only the full `ferry` binary answers (`ferry oci COMMAND`).
pub const FULL: [&str; 2] = ["install", crate::side::SERVE];

/// Why `ferry oci` failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// A bad command line.
    #[error(transparent)]
    Args(#[from] args::ArgsError),
    /// An unknown option key.
    #[error(transparent)]
    Options(#[from] crate::options::OptionError),
    /// A bundle ferry cannot run.
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    /// A bad container id.
    #[error(transparent)]
    Id(#[from] state::IdError),
    /// A bad option value (`source` names the annotation or preset).
    #[error("{origin}: {message}")]
    Value {
        /// Where it came from.
        origin: String,
        /// What `ferry run`'s parser said.
        message: String,
    },
    /// The real runtime (or ferry) cannot be found.
    #[error("{0}")]
    Runtime(String),
    /// A container with this id exists already.
    #[error("container {0} already exists")]
    Exists(String),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The network side failed to start: what it said.
    #[error("the container's network side failed: {0}")]
    Side(String),
    /// The real runtime failed with this status (it said why itself).
    #[error("the real runtime exited with status {0}")]
    Failed(i32),
}

impl OciError {
    /// A mapper from an I/O error to [`OciError::Io`] saying `what` was done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> OciError {
        let what = what.into();
        move |source| OciError::Io { what, source }
    }
}

/// `ferry oci ARGS…` or `ferry-oci ARGS…`: runc's `argv` (without the program's name);
/// returns the exit status. `full` answers the [`FULL`] commands.
pub fn main(argv: &[String], full: impl FnOnce(&Invocation) -> Result<i32, OciError>) -> i32 {
    let inv = match args::parse(argv) {
        Ok(inv) => inv,
        Err(e) => {
            eprintln!("ferry oci: {e}");
            return 2;
        }
    };
    if inv.version {
        return version(&inv.globals);
    }
    let Some(command) = inv.command.as_deref() else {
        print!("{USAGE}");
        return if inv.help { 0 } else { 2 };
    };
    let result = match command {
        c if FULL.contains(&c) => full(&inv),
        "create" => crate::create::create(&inv),
        "start" => start(&inv),
        "delete" => delete(&inv),
        "hook" => hook(&inv.args),
        c => passthrough(&inv, c),
    };
    match result {
        Ok(code) => code,
        Err(OciError::Failed(code)) => code,
        Err(e) => {
            report(&inv.globals, &e.to_string());
            1
        }
    }
}

const USAGE: &str = "\
ferry oci: ferry as an OCI runtime (runc's command line; the real runtime does the rest)

usage: ferry oci [GLOBAL…] COMMAND [OPTION…] ID   (or ferry-oci [GLOBAL…] COMMAND …)
  commands: create start state kill delete exec ps features pause resume events update
            (all but create and delete go to the real runtime unchanged), install
  runc's globals: --root DIR --log FILE --log-format text|json --systemd-cgroup --debug
  ferry's globals: --runtime PATH (the real runtime; default runc in PATH, or
            FERRY_OCI_RUNTIME), --preset KEY=VALUE (a ferry.* option for every container)
  container options (annotations): ferry.allow ferry.deny ferry.net ferry.servers
            ferry.nic-servers ferry.spin ferry.server-spin ferry.dns ferry.mtu
            ferry.publish (auto: the default, none, or [IP:]HOST_PORT:PORT,…)
  install: ferry oci install --docker|--podman|--containerd [--name NAME] [--preset K=V…]
";

/// Says `msg` on stderr and in the engine's log (where engines read a runtime's error).
pub fn report(g: &Globals, msg: &str) {
    eprintln!("ferry oci: {msg}");
    let Some(log) = &g.log else { return };
    let line = log_line("error", &format!("ferry oci: {msg}"), g.log_json);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// A line of the runtime's log at `level`, in runc's format (`--log-format json` or
/// text), where engines read a runtime's errors and warnings.
pub fn log_line(level: &str, msg: &str, json: bool) -> String {
    if json {
        serde_json::json!({"level": level, "msg": msg}).to_string()
    } else {
        format!("level={level} msg=\"{}\"", msg.replace('"', "'"))
    }
}

/// The programs that answer for ferry as a runtime, found from the one running: the
/// full `ferry` and, next to it, the lean `ferry-oci` executable (a file of its own,
/// not a link to ferry), when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programs {
    /// The full ferry binary.
    pub ferry: PathBuf,
    /// The lean `ferry-oci`, if installed next to ferry.
    pub lean: Option<PathBuf>,
}

/// The lean executable's name.
pub const LEAN: &str = "ferry-oci";

impl Programs {
    /// From the running executable (`ferry` or `ferry-oci`, links resolved).
    pub fn find() -> Result<Programs, OciError> {
        let me = std::env::current_exe().map_err(OciError::io("locating ferry"))?;
        let ferry = match me.file_name() {
            Some(n) if n == LEAN => me.with_file_name("ferry"),
            _ => me.clone(),
        };
        let lean = me.with_file_name(LEAN);
        let lean = std::fs::symlink_metadata(&lean)
            .is_ok_and(|m| m.is_file())
            .then_some(lean);
        if !ferry.is_file() {
            return Err(OciError::Runtime(format!(
                "cannot find ferry next to {} (install both in one directory)",
                me.display()
            )));
        }
        Ok(Programs { ferry, lean })
    }

    /// The runtime command line's program and the arguments before runc's: the lean
    /// executable's, else `ferry oci`.
    pub fn runtime(&self) -> (&Path, &'static [&'static str]) {
        match &self.lean {
            Some(l) => (l, &[LEAN]),
            None => (&self.ferry, &["ferry", "oci"]),
        }
    }
}

/// The real runtime: `--runtime`, `FERRY_OCI_RUNTIME`, else `runc` in `PATH` or the
/// usual system directories.
pub fn real_runtime(g: &Globals) -> Result<PathBuf, OciError> {
    let named = g
        .runtime
        .clone()
        .or_else(|| std::env::var_os("FERRY_OCI_RUNTIME").map(PathBuf::from));
    if let Some(p) = named {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(OciError::Runtime(format!(
                "the real OCI runtime {} does not exist (--runtime or FERRY_OCI_RUNTIME)",
                p.display()
            )))
        };
    }
    let me = std::env::current_exe().and_then(|p| p.canonicalize()).ok();
    // Engines may run their runtime with a short PATH (conmon): the usual places too.
    let usual = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain(usual.iter().map(PathBuf::from))
        .map(|d| d.join("runc"))
        .find(|c| c.is_file() && c.canonicalize().ok() != me)
        .ok_or_else(|| {
            OciError::Runtime(
                "cannot find the real OCI runtime: no runc in PATH or /usr/sbin, /usr/bin, /usr/local/… (install runc, or name it with --runtime PATH or FERRY_OCI_RUNTIME)".into(),
            )
        })
}

/// The real runtime with the engine's global options.
pub fn runtime_command(g: &Globals) -> Result<Command, OciError> {
    let mut cmd = Command::new(real_runtime(g)?);
    cmd.args(&g.forward);
    Ok(cmd)
}

/// Runs `command` on the real runtime in this process's place.
fn passthrough(inv: &Invocation, command: &str) -> Result<i32, OciError> {
    let mut cmd = runtime_command(&inv.globals)?;
    let e = cmd.arg(command).args(&inv.args).exec();
    Err(OciError::io("starting the real runtime")(e))
}

/// `--version`: ferry's, then the real runtime's.
fn version(g: &Globals) -> i32 {
    println!("ferry oci version {}", env!("CARGO_PKG_VERSION"));
    println!("spec: 1.0.2");
    if let Ok(mut cmd) = runtime_command(g) {
        let _ = std::io::stdout().flush();
        let _ = cmd.arg("--version").status();
    }
    0
}

/// `start ID`: once the container's network side serves (`create` does not wait for
/// it), the real runtime's start.
fn start(inv: &Invocation) -> Result<i32, OciError> {
    if let [id] = &inv.args[..]
        && state::check_id(id).is_ok()
    {
        crate::side::wait_serving(&state::dir(inv.globals.root.as_deref(), id))?;
    }
    passthrough(inv, "start")
}

/// `delete [--force] ID`: the real runtime's delete, then the network side stopped and
/// the container's state removed (whatever the runtime said). When the network side
/// has ended already (it does when the container's first process ends), what is left of
/// it goes first and the real runtime's delete takes this process's place.
fn delete(inv: &Invocation) -> Result<i32, OciError> {
    let (force, id) = args::parse_delete(&inv.args)?;
    state::check_id(&id)?;
    let mut cmd = runtime_command(&inv.globals)?;
    cmd.arg("delete");
    if force {
        cmd.arg("--force");
    }
    cmd.arg(&id);
    let dir = state::dir(inv.globals.root.as_deref(), &id);
    if !state::side_alive(&dir) {
        state::stop_side(&dir);
        state::remove(&dir);
        let e = cmd.exec();
        return Err(OciError::io("starting the real runtime's delete")(e));
    }
    let status = cmd
        .status()
        .map_err(OciError::io("running the real runtime's delete"))?;
    state::stop_side(&dir);
    state::remove(&dir);
    match status.code() {
        Some(0) => Ok(0),
        Some(c) => Err(OciError::Failed(c)),
        None => Err(OciError::Failed(1)),
    }
}

/// `hook --pid PID -- PATH ARGV…`: runs an engine's hook with the state it reads on
/// stdin showing `PID` (the network side) as the container's process.
fn hook(argv: &[String]) -> Result<i32, OciError> {
    let bad = || OciError::Runtime("hook: expected --pid PID -- PATH [ARGV…]".into());
    let (pid, rest) = match argv {
        [flag, pid, dashes, rest @ ..] if flag == "--pid" && dashes == "--" => (pid, rest),
        _ => return Err(bad()),
    };
    let pid: u32 = pid.parse().map_err(|_| bad())?;
    let (path, hook_argv) = rest.split_first().ok_or_else(bad)?;
    let mut state = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin(), &mut state)
        .map_err(OciError::io("hook: reading the state"))?;
    let state = crate::spec::hook_state(&state, pid)?;
    let mut cmd = Command::new(path);
    if let Some((arg0, args)) = hook_argv.split_first() {
        cmd.arg0(arg0).args(args);
    }
    // The state fits a pipe (it always does: a few hundred bytes): the hook takes this
    // process's place, its stdin that pipe (the runtime waits for one process less).
    if let Ok(stdin) = state_in_pipe(&state) {
        let e = cmd.stdin(stdin).exec();
        return Err(OciError::io(format!("hook: starting {path}"))(e));
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(OciError::io(format!("hook: starting {path}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&state);
    }
    let status = child
        .wait()
        .map_err(OciError::io(format!("hook: waiting for {path}")))?;
    Ok(status.code().unwrap_or(1))
}

/// A pipe's read end holding `data`, written without blocking (an error if it does
/// not fit).
fn state_in_pipe(data: &[u8]) -> std::io::Result<std::io::PipeReader> {
    use std::os::fd::AsRawFd;
    let (r, mut w) = std::io::pipe()?;
    // SAFETY: fcntl on a descriptor we own; no memory is passed.
    if unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    w.write_all(data)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_as_runc_writes_them() {
        let j: serde_json::Value =
            serde_json::from_str(&log_line("warning", "ferry: a \"b\"", true)).unwrap();
        assert_eq!(j["level"], "warning");
        assert_eq!(j["msg"], "ferry: a \"b\"");
        assert_eq!(
            log_line("warning", "ferry: a \"b\"", false),
            "level=warning msg=\"ferry: a 'b'\""
        );
    }
}
