//! `create`: make the container's state directory → start its network side (which
//! checks the container's options, then makes the sandbox) → meanwhile read what the
//! image can load → place the shim → rewrite the bundle → the real runtime's create
//! (into the sandbox's namespace) → give the network side the container's pid and
//! return (`start` waits until it serves).
//! Any failure leaves nothing: the network side is killed and the state removed.
//! Answered by the lean executable: only the network side is the full ferry.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::args::{self, Invocation};
use crate::cli::{OciError, Programs, runtime_command};
use crate::side::{Serve, Side, Targets};
use crate::spec::{self, EngineNetns, Rewrite};
use crate::{options, state};

/// `create [OPTION…] ID`.
pub fn create(inv: &Invocation) -> Result<i32, OciError> {
    let c = args::parse_create(&inv.args)?;
    state::check_id(&c.id)?;
    let programs = Programs::find()?;
    let mut runtime = runtime_command(&inv.globals)?;
    let bundle = std::path::absolute(&c.bundle)
        .map_err(OciError::io(format!("bundle {}", c.bundle.display())))?;
    let spec = read_spec(&bundle)?;
    let engine = spec::engine_netns(&spec)?;
    let flags = options::flags(&inv.globals.presets, &spec::annotations(&spec))?;
    let dir = StateDir::make(inv.globals.root.as_deref(), &c.id)?;
    let stderr = (!spec::terminal(&spec)).then(inheritable_stderr).flatten();
    let serve = Serve {
        id: c.id.clone(),
        netns: match engine {
            EngineNetns::Join(p) => Some(p),
            EngineNetns::New => None,
        },
        serving: Some(dir.0.join(state::SERVING)),
        targets: Targets {
            stderr_fd: stderr.as_ref().map(AsRawFd::as_raw_fd),
            log: inv.globals.log.clone().map(|l| (l, inv.globals.log_json)),
        },
        flags,
    };
    // The network side starts (its exec, checks, plan and sandbox: most of `create`'s
    // own time) while the image is looked at here.
    let mut side = Side::spawn(&programs.ferry, &dir.0, &serve)?;
    drop(stderr);
    let loadable = spec::rootfs(&spec, &bundle).map(|r| spec::can_load_shim(&r));
    let ready = side.ready()?;
    let preload = ready.shim.is_some() && loadable?;
    let shim = match (&ready.shim, preload) {
        (Some(installed), true) => place_shim(installed, &ready.dir, !spec::may_remount(&spec))?,
        _ => None,
    };
    side.record(&dir.0, &ready)?;
    let spec = spec::rewrite(
        spec,
        &Rewrite {
            netns: PathBuf::from(format!("/proc/{}/ns/net", ready.holder)),
            dir: &ready.dir,
            preload,
            shim: shim.as_deref(),
            runtime: programs.runtime(),
            hook_pid: side.pid(),
            bundle: &bundle,
        },
    )?;
    let ours = write_bundle(&dir.0, &spec)?;
    let pid_file = c
        .pid_file
        .clone()
        .unwrap_or_else(|| dir.0.join("container.pid"));
    let status = runtime
        .arg("create")
        .arg("--bundle")
        .arg(&ours)
        .arg("--pid-file")
        .arg(&pid_file)
        .args(&c.forward)
        .arg(&c.id)
        .status()
        .map_err(OciError::io("running the real runtime's create"))?;
    if !status.success() {
        return Err(OciError::Failed(status.code().unwrap_or(1)));
    }
    if let Err(e) = read_pid(&pid_file).and_then(|pid| side.container(pid)) {
        // The network side failed beside the runtime's create (its TAP, say): the
        // created container goes too.
        let _ = runtime_command(&inv.globals)
            .map(|mut d| d.args(["delete", "--force", &c.id]).status());
        return Err(e);
    }
    side.keep();
    dir.keep();
    Ok(0)
}

fn read_spec(bundle: &Path) -> Result<Value, OciError> {
    let path = bundle.join("config.json");
    let text = std::fs::read(&path).map_err(OciError::io(format!("reading {}", path.display())))?;
    serde_json::from_slice(&text).map_err(|e| OciError::Io {
        what: format!("parsing {}", path.display()),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

fn chmod(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The container's state directory: removed when dropped unless [`StateDir::keep`].
struct StateDir(PathBuf, bool);

impl StateDir {
    fn make(root: Option<&Path>, id: &str) -> Result<StateDir, OciError> {
        let dir = state::dir(root, id);
        let runtime_state = root
            .map_or_else(state::runtime_default_root, Path::to_path_buf)
            .join(id);
        if runtime_state.exists() {
            return Err(OciError::Exists(id.to_owned()));
        }
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)
                .map_err(OciError::io(format!("creating {}", parent.display())))?;
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(OciError::Exists(id.to_owned()));
            }
            Err(e) => return Err(OciError::io(format!("creating {}", dir.display()))(e)),
        }
        let made = StateDir(dir, false);
        // The sandbox's directory inside must be reachable by the container's users.
        chmod(&made.0, 0o711).map_err(OciError::io(format!("chmod {}", made.0.display())))?;
        Ok(made)
    }

    fn keep(mut self) {
        self.1 = true;
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        if !self.1 {
            state::remove(&self.0);
        }
    }
}

/// A copy of this process's stderr — the container's, as the engine gave it to the
/// runtime — that the network side inherits (not close-on-exec), for its lines; none
/// when stderr is closed.
fn inheritable_stderr() -> Option<OwnedFd> {
    crate::sys::inheritable_dup(std::io::stderr().as_fd()).ok()
}

/// Places the shim (`installed`, as the network side found it) in the sandbox's
/// directory (mounted into the container): an empty file there, over which the real
/// runtime bind-mounts the installed shim read-only (returned), when anyone may read
/// that and `share` (the container cannot remount it read-write: no `CAP_SYS_ADMIN`);
/// else a copy (6 MB, on `create`'s critical path).
fn place_shim(installed: &Path, dir: &Path, share: bool) -> Result<Option<PathBuf>, OciError> {
    let to = dir.join(spec::SHIM);
    let readable = share
        .then(|| installed.canonicalize().ok())
        .flatten()
        .filter(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o004 != 0)
        });
    if let Some(full) = readable {
        std::fs::File::create(&to)
            .and_then(|_| chmod(&to, 0o644))
            .map_err(OciError::io(format!("creating {}", to.display())))?;
        return Ok(Some(full));
    }
    std::fs::copy(installed, &to)
        .and_then(|_| chmod(&to, 0o644))
        .map_err(OciError::io(format!(
            "copying {} for the container",
            installed.display()
        )))?;
    Ok(None)
}

/// Writes the rewritten bundle into the state directory; returns its path.
fn write_bundle(dir: &Path, spec: &Value) -> Result<PathBuf, OciError> {
    let bundle = dir.join("bundle");
    let path = bundle.join("config.json");
    std::fs::create_dir(&bundle)
        .and_then(|()| std::fs::write(&path, spec.to_string()))
        .map_err(OciError::io(format!("writing {}", path.display())))?;
    Ok(bundle)
}

/// The container's pid, as the real runtime wrote it.
fn read_pid(path: &Path) -> Result<u32, OciError> {
    let text = std::fs::read_to_string(path)
        .map_err(OciError::io(format!("reading {}", path.display())))?;
    text.trim()
        .parse()
        .map_err(|_| OciError::Side(format!("{} holds no pid", path.display())))
}
