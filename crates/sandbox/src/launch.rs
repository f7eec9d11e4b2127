//! Launching a sandbox and controlling it from the host side.
//!
//! `launch` prepares every string the command's `execve` needs, creates the channel,
//! and `clone`s the init (see `init.rs`) straight into new network, PID and — unless
//! running as root — user namespaces. The launcher then writes the id maps, says "go",
//! and waits for "ready" (or the init's report of which setup step failed). The
//! returned [`Sandbox`] owns the init: dropping it unwaited kills and reaps the whole
//! sandbox.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::Arc;

use libc::pid_t;
use tracing::{debug, warn};

use crate::factory::{SocketFactory, wire};
use crate::handoff::{HandoffRequests, HandoffScope};
use crate::init::{self, Exec, Stage};
use crate::mounts::{self, Mounts};
use crate::sys;
use crate::volume::{self, Step, Volume};
use crate::watch;

/// What to run and how to isolate it.
#[derive(Clone, Debug, Default)]
pub struct Spec {
    /// The command: a path, or a name looked up in `PATH` (the sandbox's `PATH`, i.e.
    /// after `env` is applied). Also passed as `argv[0]`.
    pub program: OsString,
    /// Arguments after `argv[0]`.
    pub args: Vec<OsString>,
    /// Variables set in the sandbox on top of the inherited environment (replacing
    /// inherited ones of the same name). Nothing else is added.
    pub env: Vec<(OsString, OsString)>,
    /// Whether to create a user namespace.
    pub userns: UserNs,
    /// Hold the command before its `execve` until [`Sandbox::start`] (so the caller can
    /// finish what the command relies on, e.g. DNS inside the sandbox). Dropping the
    /// sandbox unstarted ends it.
    pub hold: bool,
    /// Watch the command's inet sockets: the init says on stderr, once per process,
    /// which of them make an inet socket through the kernel where the shim cannot serve
    /// it (a static or Go program, raw and ICMP sockets); see [`SocketWatch`]. Needs
    /// Linux 5.5 (seccomp user notifications that let the call continue) and x86_64 or
    /// aarch64; elsewhere, or when the kernel refuses the filter, the command runs
    /// unwatched ([`Sandbox::watching`] says which).
    pub watch: Option<SocketWatch>,
    /// Host paths the sandbox sees as its own (see [`Volume`]): for root's sandbox,
    /// idmapped bind mounts (host root is the sandbox's root there); otherwise only the
    /// read-only ones change anything.
    pub volumes: Vec<Volume>,
    /// Let the command make raw ICMP sockets (`socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)`,
    /// ICMPv6 alike: busybox's `ping` has no other way), which its nested user namespace
    /// may not: the init makes each in its place (raw_icmp.rs); whole IP headers
    /// (`IP_HDRINCL`) stay refused. Needs Linux 5.14 and x86_64 or aarch64; ignored with
    /// [`Spec::watch`] (one listener per process), which tells of ICMP sockets instead.
    pub raw_icmp: bool,
    /// Guard the host sockets handed to the command (ferry's `--handoff`): its
    /// `connect`, `bind`, `listen`, fast-open sends and source-routing options on an
    /// inet socket of another network namespace than the sandbox's fail with `EPERM`
    /// (host_guard.rs). Replaces [`Spec::raw_icmp`] (one listener per process); keeps
    /// [`Spec::watch`]'s telling. Needs Linux 5.14 and x86_64 or aarch64; the command
    /// does not run without it.
    pub guard_host_sockets: bool,
    /// With [`Spec::guard_host_sockets`]: the destinations a connect made without the
    /// shim is asked about as a hand-off ([`HandoffScope`]; None: every TCP connect).
    pub handoff_scope: Option<HandoffScope>,
}

/// What the socket watch needs to know ([`Spec::watch`]).
#[derive(Clone, Debug, Default)]
pub struct SocketWatch {
    /// The library that relays the command's TCP and UDP sockets (ferry's shim), as the
    /// sandbox's processes map it (an absolute path, symbolic links resolved). In a
    /// process that maps it, such sockets made from libc's own code (its resolver, which
    /// no preloaded library can interpose) are expected and not told. `None`: every inet
    /// socket is told.
    pub shim: Option<OsString>,
}

/// Whether the sandbox gets its own user namespace, and so which host identity its
/// processes have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UserNs {
    /// A user namespace whose root is an unprivileged host identity: for a caller that
    /// is not root, the caller's own uid and gid; for root, a range of 65536
    /// subordinate ids ([`subordinate_ids`]), so that the sandbox's root (and the users
    /// its programs switch to) own nothing of the host's.
    #[default]
    Auto,
    /// The same as [`UserNs::Auto`] (kept for compatibility).
    Always,
    /// No user namespace: the sandbox's root is the host's root (creating the
    /// namespaces then needs root). Its programs can leave the sandbox: opt-in only.
    Never,
}

/// A range of host ids mapped into the sandbox (from 0 inside): its first host id and
/// how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRange {
    /// The host id of the sandbox's id 0.
    pub base: u32,
    /// How many ids are mapped.
    pub count: u32,
}

/// The ids root's sandboxes use when `/etc/subuid` (`/etc/subgid`) has no range for
/// root: 65536 ids in a block that no Linux distribution hands out (above systemd's
/// container ranges, below its "foreign" range).
pub const FALLBACK_IDS: IdRange = IdRange {
    base: 2_000_000_000,
    count: 65536,
};

/// The subordinate id range for `user` (name or numeric id) in `file` (`/etc/subuid` or
/// `/etc/subgid`: lines `NAME:FIRST:COUNT`): its first range, as rootless engines and
/// `newuidmap` read it.
pub fn subordinate_ids(file: &str, user: &str, id: u32) -> Option<IdRange> {
    let text = std::fs::read_to_string(file).ok()?;
    parse_subordinate(&text, user, id)
}

fn parse_subordinate(text: &str, user: &str, id: u32) -> Option<IdRange> {
    text.lines().find_map(|line| {
        let mut f = line.trim().split(':');
        let (name, base, count) = (f.next()?, f.next()?, f.next()?);
        if name != user && name.parse::<u32>().ok() != Some(id) {
            return None;
        }
        let (base, count) = (base.parse().ok()?, count.parse::<u32>().ok()?);
        (count > 0).then_some(IdRange { base, count })
    })
}

/// The (uid, gid) ranges a sandbox launched by root maps: root's subordinate ids, else
/// [`FALLBACK_IDS`]. Root of a user namespace other than the host's (`podman
/// unshare`, a rootless engine's runtime) may map only the ids its own namespace has:
/// there the largest range of them other than its 0 (the user who made it), as
/// [`nested_ids`] picks from `/proc/self/uid_map` and `gid_map`.
pub fn root_sandbox_ids() -> (IdRange, IdRange) {
    let nested = |file: &str| {
        let text = std::fs::read_to_string(file).ok()?;
        (!is_initial_map(&text)).then(|| nested_ids(&text))
    };
    let uids = nested("/proc/self/uid_map")
        .unwrap_or_else(|| subordinate_ids("/etc/subuid", "root", 0).unwrap_or(FALLBACK_IDS));
    let gids = nested("/proc/self/gid_map")
        .unwrap_or_else(|| subordinate_ids("/etc/subgid", "root", 0).unwrap_or(FALLBACK_IDS));
    (uids, gids)
}

/// Whether an id map (`/proc/self/uid_map`'s text) is the initial namespace's: every
/// id, unchanged.
fn is_initial_map(text: &str) -> bool {
    let lines: Vec<Vec<u64>> = text
        .lines()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .filter(|v: &Vec<u64>| !v.is_empty())
        .collect();
    lines.len() == 1 && lines[0] == [0, 0, u64::from(u32::MAX)]
}

/// The ids (of this namespace) a sandbox made by this namespace's root maps, from its
/// id map's `text` (lines `INSIDE OUTSIDE COUNT`): the largest range of mapped ids
/// without 0, or 0 alone where nothing else is mapped (`unshare -r`: the sandbox's
/// root is then the user who made the namespace, as for an ordinary user).
pub fn nested_ids(text: &str) -> IdRange {
    let mut best = IdRange { base: 0, count: 1 };
    for line in text.lines() {
        let v: Vec<u32> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let &[inside, _, count] = v.as_slice() else {
            continue;
        };
        let (base, count) = if inside == 0 {
            (1, count.saturating_sub(1))
        } else {
            (inside, count)
        };
        if count > best.count || best.base == 0 && count > 0 {
            best = IdRange { base, count };
        }
    }
    best
}

/// Failures of [`launch`] and of [`Sandbox`] operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program, an argument or an environment entry contains a NUL byte.
    #[error("{what} contains a NUL byte")]
    Nul {
        /// Which string ("program", "argument", "environment variable").
        what: &'static str,
    },
    /// Creating the launcher ↔ init socket pair failed.
    #[error("creating the sandbox control socket pair: {0}")]
    SocketPair(#[source] io::Error),
    /// `clone(2)` with the namespace flags failed (EPERM/EINVAL/ENOSPC: namespaces not
    /// permitted here, or user namespaces disabled).
    #[error("creating the sandbox namespaces (clone): {0}")]
    Clone(#[source] io::Error),
    /// `pidfd_open(2)` on the init failed (Linux 5.3 or later is required).
    #[error("opening a pidfd for the sandbox init: {0}")]
    PidFd(#[source] io::Error),
    /// Writing `/proc/PID/setgroups` failed.
    #[error("writing the sandbox's setgroups policy: {0}")]
    SetGroups(#[source] io::Error),
    /// Writing `/proc/PID/uid_map` failed.
    #[error("writing the sandbox's uid map: {0}")]
    UidMap(#[source] io::Error),
    /// Writing `/proc/PID/gid_map` failed.
    #[error("writing the sandbox's gid map: {0}")]
    GidMap(#[source] io::Error),
    /// Sending "go" to or receiving "ready" from the init failed.
    #[error("talking to the sandbox init during setup: {0}")]
    Handshake(#[source] io::Error),
    /// The init exited during setup without saying why.
    #[error("the sandbox init exited during setup (status {0})")]
    InitDied(i32),
    /// The init could not make itself non-dumpable.
    #[error("sandbox init: prctl(PR_SET_DUMPABLE): {0}")]
    InitDumpable(#[source] io::Error),
    /// The init could not reset or block signals.
    #[error("sandbox init: setting up signal handling: {0}")]
    InitSignals(#[source] io::Error),
    /// The init could not bring up `lo`.
    #[error("sandbox init: bringing up the loopback interface: {0}")]
    Loopback(#[source] io::Error),
    /// The init could not create the command's process.
    #[error("sandbox init: creating the command process: {0}")]
    ForkCommand(#[source] io::Error),
    /// The init could not close the launcher's file descriptors.
    #[error("sandbox init: closing inherited file descriptors: {0}")]
    InitCloseFds(#[source] io::Error),
    /// The init could not create its signalfd.
    #[error("sandbox init: creating the signalfd: {0}")]
    InitSignalFd(#[source] io::Error),
    /// The init could not open its network namespace.
    #[error("sandbox init: opening /proc/self/ns/net: {0}")]
    InitNetns(#[source] io::Error),
    /// The init could not mount the sandbox's own `/proc` (inside a container that
    /// masks parts of its `/proc`, the kernel refuses: "too revealing").
    #[error(
        "sandbox init: mounting the sandbox's own /proc: {0} (inside a container that masks /proc the kernel refuses this)"
    )]
    Proc(#[source] io::Error),
    /// The init could not take the ids of its user namespace's root.
    #[error("sandbox init: taking the sandbox's root ids (setresuid/setresgid): {0}")]
    Identity(#[source] io::Error),
    /// The command could not get its own user namespace inside the sandbox's.
    #[error("sandbox init: the command's user namespace: {0}")]
    NestUserns(#[source] io::Error),
    /// A volume cannot be shared as asked (named twice, changed, or its filesystem does
    /// not support idmapped mounts).
    #[error("volume {0}")]
    Volume(String),
    /// The init could not mount a volume (or the tmpfs over a directory above one).
    #[error("sandbox init: mounting {at} for the volumes: {source}")]
    VolumeMount {
        /// Where.
        at: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// `waitpid(2)` on the init failed.
    #[error("waiting for the sandbox: {0}")]
    Wait(#[source] io::Error),
    /// Sending a signal to the init failed.
    #[error("signalling the sandbox: {0}")]
    Signal(#[source] io::Error),
}

impl Error {
    fn from_stage(stage: Stage, errno: i32) -> Self {
        let e = io::Error::from_raw_os_error(errno);
        match stage {
            Stage::Dumpable => Self::InitDumpable(e),
            Stage::Signals => Self::InitSignals(e),
            Stage::Loopback => Self::Loopback(e),
            Stage::ForkCommand => Self::ForkCommand(e),
            Stage::CloseFds => Self::InitCloseFds(e),
            Stage::SignalFd => Self::InitSignalFd(e),
            Stage::Netns => Self::InitNetns(e),
            Stage::Proc => Self::Proc(e),
            Stage::NestUserns => Self::NestUserns(e),
            Stage::Identity => Self::Identity(e),
            // Named by the launcher, which knows its steps.
            Stage::Volume => Self::VolumeMount {
                at: String::new(),
                source: e,
            },
        }
    }
}

/// A running sandbox: its init process and the host-side handles to it.
///
/// Dropping it without [`wait`](Self::wait)ing kills the sandbox (SIGKILL to the init,
/// which takes the whole PID namespace with it) and reaps the init.
#[derive(Debug)]
pub struct Sandbox {
    pid: pid_t,
    pidfd: Arc<OwnedFd>,
    netns: OwnedFd,
    factory: SocketFactory,
    status: Option<i32>,
    /// Write end of the gate a held command waits on ([`Spec::hold`]).
    gate: Option<OwnedFd>,
    /// Whether the socket watch is on ([`Spec::watch`]).
    watching: bool,
    /// The launcher's end of the hand-off's request path ([`Spec::guard_host_sockets`],
    /// until [`Sandbox::handoff_requests`] takes it).
    handoff: Option<OwnedFd>,
}

/// Sends signals to a sandbox from any thread (e.g. a Ctrl-C handler while another
/// thread waits). Refers to the init through a pidfd, so it never signals a recycled
/// pid; fails with ESRCH once the sandbox is reaped.
#[derive(Clone, Debug)]
pub struct Signaller {
    pidfd: Arc<OwnedFd>,
}

impl Signaller {
    /// Delivers `sig` to the init, which forwards SIGHUP, SIGINT, SIGQUIT, SIGTERM,
    /// SIGUSR1, SIGUSR2 and SIGWINCH to the command. SIGKILL ends the whole sandbox at
    /// once; SIGSTOP and SIGCONT act on the init itself; other signals are ignored.
    pub fn signal(&self, sig: i32) -> Result<(), Error> {
        sys::pidfd_send_signal(self.pidfd.as_raw_fd(), sig).map_err(Error::Signal)
    }
}

impl Sandbox {
    /// Lets a held command ([`Spec::hold`]) go on to its `execve`; does nothing
    /// otherwise, or the second time.
    pub fn start(&mut self) -> Result<(), Error> {
        if let Some(gate) = self.gate.take() {
            // SAFETY: writes one byte from a valid buffer to our own pipe end.
            let n = unsafe { libc::write(gate.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
            if n != 1 {
                return Err(Error::Handshake(io::Error::last_os_error()));
            }
        }
        Ok(())
    }

    /// Whether the init watches the command's inet sockets ([`Spec::watch`]): false when
    /// not asked for, or when this kernel or architecture does not allow it.
    pub fn watching(&self) -> bool {
        self.watching
    }

    /// With [`Spec::guard_host_sockets`], the init's questions about the command's TCP
    /// connects made without the shim (handoff.rs): whoever takes this answers each
    /// (a thread of ferry's, with the policy). `None` without the guard, or the second
    /// time. Whoever launches with the guard must take and serve it: a request nobody
    /// answers holds its connect for 2 s before the init makes it on the sandbox's
    /// socket.
    pub fn handoff_requests(&mut self) -> Option<HandoffRequests> {
        self.handoff.take().map(HandoffRequests)
    }

    /// The init's pid as seen from the host (pid 1 inside the sandbox).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A pidfd of the init: becomes readable when the sandbox has exited, so it can sit
    /// in an event loop; then call [`wait`](Self::wait).
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// The sandbox's network namespace (`/proc/PID/ns/net`, opened while the sandbox
    /// runs; it stays valid, and keeps the namespace, for as long as it is open).
    pub fn netns_fd(&self) -> BorrowedFd<'_> {
        self.netns.as_fd()
    }

    /// A handle that creates sockets inside the sandbox's network namespace.
    pub fn factory(&self) -> SocketFactory {
        self.factory.clone()
    }

    /// A handle for signalling the sandbox from other threads.
    pub fn signaller(&self) -> Signaller {
        Signaller {
            pidfd: Arc::clone(&self.pidfd),
        }
    }

    /// Delivers `sig` to the init; see [`Signaller::signal`].
    pub fn signal(&self, sig: i32) -> Result<(), Error> {
        self.signaller().signal(sig)
    }

    /// Waits for the sandbox to end and returns the exit code to pass on: the command's
    /// exit status, or 128 + the signal that killed it. Repeated calls return the same.
    pub fn wait(&mut self) -> Result<i32, Error> {
        if let Some(code) = self.status {
            return Ok(code);
        }
        let status = sys::waitpid_blocking(self.pid).map_err(Error::Wait)?;
        let code = sys::exit_code(status);
        debug!(pid = self.pid, code, "sandbox exited");
        self.status = Some(code);
        Ok(code)
    }

    /// Like [`wait`](Self::wait) but returns `None` at once if the sandbox still runs.
    pub fn try_wait(&mut self) -> Result<Option<i32>, Error> {
        if let Some(code) = self.status {
            return Ok(Some(code));
        }
        let mut status = 0;
        // SAFETY: status is a valid out-pointer.
        let pid = sys::cvt(unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) })
            .map_err(Error::Wait)?;
        if pid == 0 {
            return Ok(None);
        }
        let code = sys::exit_code(status);
        self.status = Some(code);
        Ok(Some(code))
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.status.is_none() {
            if let Err(e) = sys::pidfd_send_signal(self.pidfd.as_raw_fd(), libc::SIGKILL) {
                warn!(pid = self.pid, error = %e, "killing the sandbox");
            }
            if let Err(e) = sys::waitpid_blocking(self.pid) {
                warn!(pid = self.pid, error = %e, "reaping the sandbox");
            }
        }
    }
}

/// Kills and reaps a half-launched init unless disarmed.
struct InitGuard(pid_t);

impl Drop for InitGuard {
    fn drop(&mut self) {
        // SAFETY: kill with integer arguments; the pid is our unreaped child.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
        let _ = sys::waitpid_blocking(self.0);
    }
}

/// Starts `spec.program` in a new sandbox (see the crate docs) and returns once the
/// sandbox is set up and the command has been started. A command that cannot be found
/// or executed is not an error here: the sandbox exits with 127 or 126 and says why on
/// stderr, as a shell would.
///
/// Its steps, each failing with its own [`Error`] variant: the sandbox's identity → the
/// volumes' plan → what the init and the command need ([`exec_for`]) → the gate of a
/// held command → the channel → `clone` of the init → its pidfd → [`handshake`].
pub fn launch(spec: &Spec) -> Result<Sandbox, Error> {
    let (userns, ids) = identity(spec);
    let steps = volume_steps(&spec.volumes, ids)?;
    let mut exec = exec_for(spec, userns, ids, &steps)?;
    let gate = if spec.hold {
        Some(gate(&mut exec)?)
    } else {
        None
    };
    let (ours, theirs) = channel()?;
    // The hand-off's request path: the init asks, the launcher's side answers.
    let handoff = if exec.watch.as_ref().is_some_and(watch::Mode::guards) {
        let (ours, theirs) = channel()?;
        exec.handoff = theirs.as_raw_fd();
        Some((ours, theirs))
    } else {
        None
    };
    let mut flags = libc::CLONE_NEWNET | libc::CLONE_NEWPID | libc::CLONE_NEWNS;
    if userns {
        flags |= libc::CLONE_NEWUSER;
    }
    // SAFETY: the child runs only `init::run`, which is async-signal-safe (see
    // init.rs) and never returns; it uses only `exec`, prepared above.
    let pid = unsafe { sys::fork_raw(flags) }.map_err(Error::Clone)?;
    if pid == 0 {
        init::run(&exec, theirs.as_raw_fd(), ours.as_raw_fd());
    }
    let guard = InitGuard(pid);
    drop(theirs);
    let handoff = handoff.map(|(ours, _theirs)| ours);
    // The launcher keeps only the write end of the gate.
    let gate = gate.map(|(_read, write)| write);
    let pidfd = sys::pidfd_open(pid).map_err(Error::PidFd)?;
    let (netns, watching) = handshake(guard, ours.as_raw_fd(), (userns, ids), &steps)?;
    debug!(pid, userns, watching, program = ?spec.program, "sandbox launched");
    Ok(Sandbox {
        pid,
        pidfd: Arc::new(pidfd),
        netns,
        factory: SocketFactory::new(ours),
        status: None,
        gate,
        watching,
        handoff,
    })
}

/// Whether the sandbox gets a user namespace, and for root's the ids it maps.
fn identity(spec: &Spec) -> (bool, Option<(IdRange, IdRange)>) {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let userns = spec.userns != UserNs::Never;
    let ids = match (userns, euid) {
        (false, _) => None,
        (true, 0) => Some(root_sandbox_ids()),
        (true, _) => None,
    };
    (userns, ids)
}

/// Everything the init and the command's `execve` need, prepared before the clone: the
/// strings, the command's own user namespace, the mounts, the volumes' guard and the
/// working directory.
fn exec_for(
    spec: &Spec,
    userns: bool,
    ids: Option<(IdRange, IdRange)>,
    steps: &[Step],
) -> Result<Exec, Error> {
    let mut exec = prepare(spec)?;
    // The command gets a user namespace of its own inside the sandbox's, mapping the
    // same ids: the mounts the init made (the sandbox's /proc) are then locked for it.
    exec.nest = match (userns, ids) {
        (false, _) => 0,
        (true, Some((u, g))) => u.count.min(g.count),
        (true, None) => 1,
    };
    exec.mounts = mounts_for(ids, steps)?;
    if steps.iter().any(|s| matches!(s, Step::Attach { .. })) {
        let prog = crate::guard::native_filter().ok_or_else(|| {
            Error::Volume("needs x86_64 or aarch64 (to keep set-id files out of it)".into())
        })?;
        exec.guard = Some(prog);
    }
    if !steps.is_empty() {
        exec.cwd = std::env::current_dir()
            .ok()
            .and_then(|d| CString::new(d.into_os_string().into_vec()).ok());
    }
    Ok(exec)
}

/// The gate a held command waits on before its `execve` ([`Spec::hold`]): (read, write).
fn gate(exec: &mut Exec) -> Result<(OwnedFd, OwnedFd), Error> {
    let mut p = [0; 2];
    // SAFETY: p is a valid out-array of two ints.
    sys::cvt(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }).map_err(Error::SocketPair)?;
    // SAFETY: pipe2 returned two fresh fds that nothing else owns.
    let ends = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    exec.gate = Some((ends.0.as_raw_fd(), ends.1.as_raw_fd()));
    Ok(ends)
}

/// The launcher ↔ init channel: (ours, the init's).
fn channel() -> Result<(OwnedFd, OwnedFd), Error> {
    let mut pair = [0; 2];
    // SAFETY: pair is a valid out-array of two ints.
    sys::cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    })
    .map_err(Error::SocketPair)?;
    // SAFETY: socketpair returned two fresh fds that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) })
}

/// The launcher's side of the init's setup: the id maps (with a user namespace, of
/// `ids`), the volumes' idmapped trees, "go", then "ready" (the sandbox's network
/// namespace, and whether the watch is on) or the init's report of the step that
/// failed. Until "ready", `guard` kills the init on any failure; an init that exited by
/// itself is reaped for its status.
fn handshake(
    guard: InitGuard,
    chan: RawFd,
    (userns, ids): (bool, Option<(IdRange, IdRange)>),
    steps: &[Step],
) -> Result<(OwnedFd, bool), Error> {
    let pid = guard.0;
    if userns {
        write_id_maps(pid, ids)?;
    }
    send_trees(chan, pid, steps)?;
    sys::send_with_fd(chan, &wire::GO, None).map_err(Error::Handshake)?;
    match await_ready(chan, steps) {
        Ok(ready) => {
            std::mem::forget(guard);
            Ok(ready)
        }
        Err(None) => {
            std::mem::forget(guard);
            let status = sys::waitpid_blocking(pid).map_err(Error::Wait)?;
            Err(Error::InitDied(sys::exit_code(status)))
        }
        Err(Some(e)) => Err(e),
    }
}

/// The init's volume steps: idmapped (root's sandbox, `ids`) or read-only bind mounts.
fn volume_steps(volumes: &[Volume], ids: Option<(IdRange, IdRange)>) -> Result<Vec<Step>, Error> {
    let search = |p: &Path| match ids {
        Some((u, g)) => volume::Perm::of(p).is_some_and(|m| volume::allows(m, u, g, 1)),
        None => true,
    };
    volume::plan(volumes, ids.is_some(), &search).map_err(Error::Volume)
}

/// What the init mounts besides `/proc`: the volume `steps`, root's substitute
/// `/etc/shadow` (root's sandbox, `ids`, on a host that has one), the sysfs's kept
/// mounts.
fn mounts_for(ids: Option<(IdRange, IdRange)>, steps: &[Step]) -> Result<Mounts, Error> {
    use std::os::unix::fs::MetadataExt;
    let nul = || Error::Nul { what: "volume" };
    let shadow = ids.and_then(|(_, gids)| {
        let meta = std::fs::metadata("/etc/shadow")
            .ok()
            .filter(|m| m.is_file())?;
        let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
        Some(mounts::shadow(&passwd, meta.gid(), gids.count))
    });
    let sys_kept = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| mounts::sys_children(&t))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| CString::new(p.into_os_string().into_vec()).ok())
        .collect();
    Ok(Mounts {
        steps: mounts::init_steps(steps).ok_or_else(nul)?,
        shadow,
        sys_kept,
    })
}

/// Writes the sandbox's id maps: root's subordinate `ids`, or the caller's own ids.
fn write_id_maps(pid: pid_t, ids: Option<(IdRange, IdRange)>) -> Result<(), Error> {
    let proc = format!("/proc/{pid}");
    let (uid_map, gid_map) = match ids {
        // Root may map any ids (and keep setgroups, which programs that switch users
        // need).
        Some((u, g)) => (
            format!("0 {} {}\n", u.base, u.count),
            format!("0 {} {}\n", g.base, g.count),
        ),
        None => {
            // SAFETY: geteuid and getegid cannot fail.
            let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
            std::fs::write(format!("{proc}/setgroups"), "deny").map_err(Error::SetGroups)?;
            (format!("0 {euid} 1\n"), format!("0 {egid} 1\n"))
        }
    };
    std::fs::write(format!("{proc}/uid_map"), uid_map).map_err(Error::UidMap)?;
    std::fs::write(format!("{proc}/gid_map"), gid_map).map_err(Error::GidMap)
}

/// Makes the idmapped copy of each volume `Attach`es (through the user namespace of
/// the init `pid`, whose maps are written) and hands them to the init, in order.
fn send_trees(chan: RawFd, pid: pid_t, steps: &[Step]) -> Result<(), Error> {
    let mut userns = None;
    for step in steps {
        let Step::Attach { at, read_only } = step else {
            continue;
        };
        if userns.is_none() {
            let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))
                .map_err(|e| Error::Volume(format!("opening the sandbox's user namespace: {e}")))?;
            userns = Some(OwnedFd::from(ns));
        }
        let ns = userns
            .as_ref()
            .map(AsFd::as_fd)
            .ok_or(Error::Handshake(bad_message()))?;
        let tree = volume::idmapped_copy(at, *read_only, ns).map_err(Error::Volume)?;
        sys::send_with_fd(chan, &wire::TREE, Some(tree.as_raw_fd())).map_err(Error::Handshake)?;
    }
    Ok(())
}

/// Waits for the init's "ready": the sandbox's network namespace and whether the watch
/// is on; warns of a sysfs or `/etc/shadow` the init could not mount. `Err(None)`: the
/// init exited without a word.
fn await_ready(chan: RawFd, steps: &[Step]) -> Result<(OwnedFd, bool), Option<Error>> {
    let mut buf = [0u8; wire::MSG_LEN + 4];
    let (n, netns) = sys::recv_with_fd(chan, &mut buf).map_err(|e| Some(Error::Handshake(e)))?;
    match (wire::decode(&buf[..n]), netns) {
        (Some([kind, _cmd, flags]), Some(netns)) if kind == wire::READY as i32 => {
            let (watching, sysfs, shadow) = wire::parse_ready_flags(flags);
            if sysfs != 0 {
                warn!(
                    "the sandbox keeps the host's /sys (its /sys/class/net lists the host's interfaces): mounting its own sysfs: {}",
                    io::Error::from_raw_os_error(sysfs)
                );
            }
            if shadow != 0 {
                warn!(
                    "`su` in the sandbox will fail: its substitute /etc/shadow: {}",
                    io::Error::from_raw_os_error(shadow)
                );
            }
            Ok((netns, watching))
        }
        (Some([kind, stage, errno]), _) if kind == wire::SETUP_FAILED as i32 => {
            Err(Some(match Stage::from_wire(stage & 0xff) {
                Some(Stage::Volume) => Error::VolumeMount {
                    at: steps
                        .get((stage >> 8) as usize)
                        .map_or_else(String::new, |s| s.at().display().to_string()),
                    source: io::Error::from_raw_os_error(errno),
                },
                Some(stage) => Error::from_stage(stage, errno),
                None => Error::Handshake(bad_message()),
            }))
        }
        _ if n == 0 => Err(None),
        _ => Err(Some(Error::Handshake(bad_message()))),
    }
}

fn bad_message() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "malformed message from the sandbox init",
    )
}

/// Builds every C string the command's `execve` needs, so that the init allocates
/// nothing.
fn prepare(spec: &Spec) -> Result<Exec, Error> {
    let cstring =
        |s: &OsStr, what| CString::new(s.as_bytes().to_vec()).map_err(|_| Error::Nul { what });

    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !spec.env.iter().any(|(sk, _)| sk == k))
        .collect();
    env.extend(spec.env.iter().cloned());
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_os_str());

    let program = cstring(&spec.program, "program")?;
    let mut argv_strings = vec![program];
    for arg in &spec.args {
        argv_strings.push(cstring(arg, "argument")?);
    }
    let mut envp_strings = Vec::with_capacity(env.len());
    for (k, v) in &env {
        let mut entry = k.clone().into_vec();
        entry.push(b'=');
        entry.extend_from_slice(v.as_bytes());
        envp_strings.push(CString::new(entry).map_err(|_| Error::Nul {
            what: "environment variable",
        })?);
    }
    let candidates = candidates(&spec.program, path)
        .into_iter()
        .map(|p| cstring(&p, "program"))
        .collect::<Result<Vec<_>, _>>()?;

    let shown = spec.program.to_string_lossy();
    let not_found = if spec.program.as_bytes().contains(&b'/') {
        format!("ferry: {shown}: no such file or directory\n")
    } else {
        format!("ferry: {shown}: command not found\n")
    };
    let argv = argv_strings
        .iter()
        .map(|s| s.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp = envp_strings
        .iter()
        .map(|s| s.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    Ok(Exec {
        candidates,
        _argv: argv_strings,
        argv,
        _envp: envp_strings,
        envp,
        not_found: not_found.into_bytes(),
        cannot_exec: format!("ferry: {shown}: cannot execute: ").into_bytes(),
        gate: None,
        nest: 0,
        mounts: Mounts::default(),
        guard: None,
        cwd: None,
        handoff: -1,
        handoff_scope: spec.handoff_scope.clone(),
        watch: match &spec.watch {
            _ if spec.guard_host_sockets => {
                Some(watch::Mode::Guard(spec.watch.as_ref().map(|w| {
                    w.shim
                        .as_ref()
                        .map_or_else(Vec::new, |s| s.as_bytes().to_vec())
                })))
            }
            Some(w) if kernel_at_least(5, 5) => Some(watch::Mode::Tell(
                w.shim
                    .as_ref()
                    .map_or_else(Vec::new, |s| s.as_bytes().to_vec()),
            )),
            Some(_) => None,
            None => (spec.raw_icmp && kernel_at_least(5, 14)).then_some(watch::Mode::RawIcmp),
        },
    })
}

/// Whether the running kernel's release is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: utsname is plain data; uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uts is a valid out-pointer.
    if unsafe { libc::uname(&mut uts) } == -1 {
        return false;
    }
    // SAFETY: uname NUL-terminates the release.
    let release = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) };
    release_at_least(&release.to_string_lossy(), major, minor)
}

/// `release` ("6.1.0-18-amd64") is at least `major.minor`.
fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// The paths `execvp` would try for `program`, in order.
pub(crate) fn candidates(program: &OsStr, path: Option<&OsStr>) -> Vec<OsString> {
    let bytes = program.as_bytes();
    if bytes.is_empty() {
        return Vec::new();
    }
    if bytes.contains(&b'/') {
        return vec![program.to_owned()];
    }
    let path = path.map_or(&b"/bin:/usr/bin"[..], OsStr::as_bytes);
    path.split(|&b| b == b':')
        .map(|dir| {
            // An empty PATH entry means the current directory.
            let mut full = if dir.is_empty() {
                b".".to_vec()
            } else {
                dir.to_vec()
            };
            full.push(b'/');
            full.extend_from_slice(bytes);
            OsString::from_vec(full)
        })
        .collect()
}

/// Whether unprivileged processes may create user namespaces here (Debian's
/// `kernel.unprivileged_userns_clone`, `user.max_user_namespaces`, Ubuntu's AppArmor
/// restriction). Probes the sysctls only; `launch` is the real test.
pub fn userns_available() -> bool {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    if read("/proc/sys/kernel/unprivileged_userns_clone").is_some_and(|v| v == "0") {
        return false;
    }
    if read("/proc/sys/user/max_user_namespaces").is_some_and(|v| v == "0") {
        return false;
    }
    read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").is_none_or(|v| v != "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_search_order() {
        let got = candidates(OsStr::new("sh"), Some(OsStr::new("/a::/b")));
        assert_eq!(got, ["/a/sh", "./sh", "/b/sh"].map(OsString::from));
        assert_eq!(candidates(OsStr::new("./x"), None), [OsString::from("./x")]);
        assert_eq!(
            candidates(OsStr::new("ls"), None),
            ["/bin/ls", "/usr/bin/ls"].map(OsString::from)
        );
        assert!(candidates(OsStr::new(""), None).is_empty());
    }

    #[test]
    fn subordinate_ranges() {
        let text = "ferrytest:100000:65536\nroot:200000:65536\n0:1:0\n# x\n";
        assert_eq!(
            parse_subordinate(text, "root", 0),
            Some(IdRange {
                base: 200000,
                count: 65536
            })
        );
        assert_eq!(
            parse_subordinate("1000:300000:10\n", "bob", 1000),
            Some(IdRange {
                base: 300000,
                count: 10
            })
        );
        assert_eq!(parse_subordinate("root:5:0\n", "root", 0), None);
        assert_eq!(parse_subordinate("alice:5:5\n", "root", 0), None);
    }

    #[test]
    fn nested_namespaces_map_their_own_ids() {
        assert!(is_initial_map("         0          0 4294967295\n"));
        let podman = "0 1001 1\n1 100000 65536\n";
        assert!(!is_initial_map(podman));
        assert_eq!(
            nested_ids(podman),
            IdRange {
                base: 1,
                count: 65536
            }
        );
        // One range from 0: its ids but 0.
        assert_eq!(
            nested_ids("0 100000 65536\n"),
            IdRange {
                base: 1,
                count: 65535
            }
        );
        // `unshare -r`: 0 alone.
        assert_eq!(nested_ids("0 1000 1\n"), IdRange { base: 0, count: 1 });
        assert_eq!(nested_ids(""), IdRange { base: 0, count: 1 });
    }

    #[test]
    fn kernel_releases() {
        assert!(release_at_least("6.1.0-18-amd64", 5, 5));
        assert!(release_at_least("5.5.0", 5, 5));
        assert!(release_at_least("5.10.0-28-amd64", 5, 5));
        assert!(!release_at_least("5.4.0-150-generic", 5, 5));
        assert!(!release_at_least("4.19.0", 5, 5));
        assert!(!release_at_least("weird", 5, 5));
    }

    #[test]
    fn nul_bytes_rejected() {
        let spec = Spec {
            program: "true".into(),
            args: vec![OsString::from_vec(b"a\0b".to_vec())],
            ..Spec::default()
        };
        assert!(matches!(
            prepare(&spec),
            Err(Error::Nul { what: "argument" })
        ));
    }

    #[test]
    fn env_overrides_inherited() {
        let spec = Spec {
            program: "true".into(),
            env: vec![("PATH".into(), "/nowhere".into())],
            ..Spec::default()
        };
        let exec = prepare(&spec).unwrap();
        let paths: Vec<_> = exec
            ._envp
            .iter()
            .map(|e| e.to_str().unwrap())
            .filter(|e| e.starts_with("PATH="))
            .collect();
        assert_eq!(paths, ["PATH=/nowhere"]);
        assert_eq!(exec.candidates, [CString::new("/nowhere/true").unwrap()]);
    }
}
