//! The sandbox init: pid 1 of the sandbox's PID namespace.
//!
//! Theory of operation. The launcher `clone`s this process straight into new network,
//! PID (and user) namespaces, from a process that may have other threads. The init
//! therefore runs on a copy of the launcher's memory in which any lock another thread
//! held (the allocator's included) stays held forever: everything in this file is
//! async-signal-safe — raw syscalls on data the launcher prepared before cloning, no
//! allocation, no panics, no `fork(3)` (its atfork handlers take locks), no `raise` or
//! `abort` (they use the launcher's cached thread id).
//!
//! Sequence: wait for "go" (id maps written) → make itself non-dumpable (so the
//! command, root in the same user namespace, cannot ptrace it or steal its fds) →
//! reset inherited signal handlers and block SIGCHLD and the forwarded signals → bring
//! `lo` up → make mounts private and mount the sandbox's own `/proc` → clone the
//! command (which, with a user namespace, unshares its own user and mount namespaces —
//! the init writes their id maps — so that the init's mounts are locked for it; then
//! sets no-new-privileges, installs the socket watch's seccomp filter (or raw_icmp.rs's)
//! and sends its
//! listener to the init over a socket pair made before the clone (see watch.rs; a
//! kernel that refuses the filter leaves the command without it), unblocks signals and
//! `execve`s) → take the listener (or the pair's hang-up) → close every fd but stdio,
//! the channel and the listener → signalfd, open its netns → "ready" (saying whether
//! the watch is on) → serve.
//!
//! Each step is a function: the init's are listed in `set_up`, the command's in
//! `prepare_command`. A failed init step is a `Failed` (its `Stage`, told to the
//! launcher with errno, which turns it into the caller's error); a failed command step
//! is a `CommandError`, whose `exit` is the one place the command's exit status (127 not
//! found, 126 not executable, 1 given up) and its line on stderr are decided.
//!
//! Serving: one `poll` on the channel, the signalfd and the watch's listener. SIGCHLD
//! reaps every child (orphans of the command are re-parented here); a forwarded signal
//! is sent on to the command; a channel datagram is a socket factory request; a
//! notification is a process of the command's making an inet socket, answered at once
//! (the call proceeds) and told on stderr when ferry cannot serve it — or, with
//! `Spec::raw_icmp`, a raw ICMP socket the init makes in the caller's place. When the command
//! exits the init exits with its status (exit code, or 128 + signal), which makes the
//! kernel kill everything else in the PID namespace. When the launcher's end hangs up
//! (the launcher died), the init exits too, with 137.

use std::ffi::CString;
use std::os::fd::{IntoRawFd, RawFd};

use libc::{c_char, c_int, pid_t};

use crate::factory::wire;
use crate::guard;
use crate::mounts::{self, Mounts};
use crate::sys::{self, errno};
use crate::volume::MAX_VOLUMES;
use crate::watch::{self, Watch};

/// Signals the init passes on to the command. Others sent to the init are ignored
/// (the kernel drops unhandled signals to a PID namespace's init), except SIGKILL.
pub(crate) const FORWARDED: [c_int; 7] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// The fd number the channel is moved to before all others are closed.
const CHAN_FD: RawFd = 3;
/// The fd number the watch's listener is moved to, right above the channel.
const WATCH_FD: RawFd = CHAN_FD + 1;
/// The fd number the hand-off's request path is moved to, right above the listener.
const HANDOFF_FD: RawFd = WATCH_FD + 1;

/// Setup step that failed inside the init, reported to the launcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Stage {
    Dumpable = 1,
    Signals = 2,
    Loopback = 3,
    ForkCommand = 4,
    CloseFds = 5,
    SignalFd = 6,
    Netns = 7,
    Proc = 8,
    NestUserns = 9,
    Identity = 10,
    /// A volume step (mounts.rs); the step's index is in the wire word's upper bits.
    Volume = 11,
}

impl Stage {
    pub(crate) fn from_wire(v: i32) -> Option<Self> {
        Some(match v {
            1 => Self::Dumpable,
            2 => Self::Signals,
            3 => Self::Loopback,
            4 => Self::ForkCommand,
            5 => Self::CloseFds,
            6 => Self::SignalFd,
            7 => Self::Netns,
            8 => Self::Proc,
            9 => Self::NestUserns,
            10 => Self::Identity,
            11 => Self::Volume,
            _ => return None,
        })
    }
}

/// Everything the command's `execve` needs, built by the launcher before cloning.
pub(crate) struct Exec {
    /// Paths to try in order (`PATH` search already expanded).
    pub(crate) candidates: Vec<CString>,
    /// Keeps the strings behind `argv` alive.
    pub(crate) _argv: Vec<CString>,
    /// Null-terminated.
    pub(crate) argv: Vec<*const c_char>,
    /// Keeps the strings behind `envp` alive.
    pub(crate) _envp: Vec<CString>,
    /// Null-terminated.
    pub(crate) envp: Vec<*const c_char>,
    /// "ferry: CMD: command not found\n".
    pub(crate) not_found: Vec<u8>,
    /// "ferry: CMD: cannot execute: " (the reason and a newline follow).
    pub(crate) cannot_exec: Vec<u8>,
    /// (read, write) ends of the gate a held command waits on before `execve`.
    pub(crate) gate: Option<(RawFd, RawFd)>,
    /// When > 0, the command gets a user namespace of its own (and a mount namespace)
    /// inside the sandbox's, mapping ids `0..nest` to the same ids: the init's mounts are
    /// then locked for it (it cannot unmount the sandbox's `/proc` to find the host's).
    pub(crate) nest: u32,
    /// The socket watch (watch.rs), when asked for: what it does (tell, with the path of
    /// the library that relays the command's sockets, empty for none; or make its raw
    /// ICMP sockets).
    pub(crate) watch: Option<watch::Mode>,
    /// The destinations the guard asks ferry's side about (`Spec::handoff_scope`).
    pub(crate) handoff_scope: Option<crate::handoff::HandoffScope>,
    /// The sandbox's mounts besides `/proc` (mounts.rs).
    pub(crate) mounts: Mounts,
    /// With idmapped volumes, the filter that keeps set-id files and file capabilities
    /// out of them (guard.rs).
    pub(crate) guard: Option<Vec<libc::sock_filter>>,
    /// Where the command changes directory to before `execve` (the caller's working
    /// directory, so that a volume mounted there is its working directory), if anywhere.
    pub(crate) cwd: Option<CString>,
    /// The init's end of the hand-off's request path (handoff.rs; -1: none).
    pub(crate) handoff: RawFd,
}

/// Entry point of the init, in the child of the launcher's `clone`. Never returns.
///
/// Its steps: wait for "go" → [`set_up`] (each step's failure a [`Failed`] the launcher
/// is told of, with errno) → say "ready" → [`serve`].
pub(crate) fn run(exec: &Exec, chan: RawFd, launcher_end: RawFd) -> ! {
    // SAFETY: the launcher's end is a copy this process never uses.
    unsafe { libc::close(launcher_end) };

    let mut trees: [RawFd; MAX_VOLUMES] = [-1; MAX_VOLUMES];
    let received = await_go(chan, &mut trees);
    let mut chan = chan;
    let ready = match set_up(exec, &mut chan, &trees[..received]) {
        Ok(ready) => ready,
        Err(failed) => fail(chan, failed),
    };
    let msg = wire::encode([
        wire::READY as i32,
        ready.cmd,
        wire::ready_flags(
            ready.listener.is_some(),
            ready.sysfs.err(),
            ready.shadow.err(),
        ),
    ]);
    if sys::send_with_fd(ready.chan, &msg, Some(ready.netns)).is_err() {
        exit(1);
    }
    // SAFETY: netns is ours and no longer needed; the launcher has its own copy.
    unsafe { libc::close(ready.netns) };
    let watch = ready.listener.zip(exec.watch.as_ref());
    serve(
        ready.chan,
        ready.sigfd,
        ready.cmd,
        watch.map(|(fd, mode)| Watch::new(fd, mode, ready.handoff, exec.handoff_scope.as_ref())),
    )
}

/// A setup step that failed, as the launcher is told: its [`Stage`] (and for a volume
/// the step's index, [`Stage::with_index`]); errno is the failed call's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Failed(i32);

impl From<Stage> for Failed {
    fn from(stage: Stage) -> Failed {
        Failed(stage.into())
    }
}

/// What the init holds once set up, for "ready" and serving.
struct Ready {
    /// The channel, at [`CHAN_FD`].
    chan: RawFd,
    sigfd: RawFd,
    /// The command's pid.
    cmd: pid_t,
    /// The socket watch's listener, at [`WATCH_FD`].
    listener: Option<RawFd>,
    /// The hand-off's request path, at [`HANDOFF_FD`] (-1: none).
    handoff: RawFd,
    /// The sandbox's network namespace, for the launcher.
    netns: RawFd,
    /// The sandbox's own sysfs and the substitute shadow.
    sysfs: Warned,
    shadow: Warned,
}

/// A step whose failure (errno) the launcher only warns of.
type Warned = Result<(), c_int>;

/// The init's setup, in order: its identity, signals and `lo` ([`harden`]) → the
/// mounts → ping sockets → the command, held ([`start_command`]) → the watch's listener
/// → only its own fds kept (`chan` is then the channel's new number, on which a later
/// failure is told) → the signalfd → its network namespace opened.
fn set_up(exec: &Exec, chan: &mut RawFd, trees: &[RawFd]) -> Result<Ready, Failed> {
    harden(exec)?;
    let (sysfs, shadow) = mount_filesystems(exec, trees)?;
    allow_ping_sockets();
    let (cmd, watch_end) = start_command(exec)?;
    let received = receive_listener(watch_end);
    let listener;
    let handoff = if received.is_some() { exec.handoff } else { -1 };
    (*chan, listener) = keep_only(*chan, received, handoff).map_err(|()| Stage::CloseFds)?;
    let handoff = if listener.is_some() && handoff >= 0 {
        HANDOFF_FD
    } else {
        -1
    };
    let sigfd = signalfd().map_err(|()| Stage::SignalFd)?;
    // SAFETY: the path is a NUL-terminated literal.
    let netns = unsafe {
        libc::open(
            c"/proc/self/ns/net".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if netns == -1 {
        return Err(Stage::Netns.into());
    }
    Ok(Ready {
        chan: *chan,
        sigfd,
        cmd,
        listener,
        handoff,
        netns,
        sysfs,
        shadow,
    })
}

/// The init's own state: the ids of its user namespace's root, its name, not
/// dumpable, signals reset and blocked, `lo` up.
fn harden(exec: &Exec) -> Result<(), Stage> {
    if exec.nest > 0 && become_root().is_err() {
        return Err(Stage::Identity);
    }
    // Visible in ps as "ferry-init" rather than as a copy of the launcher. Cosmetic.
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"ferry-init".as_ptr(), 0, 0, 0) };
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } == -1 {
        return Err(Stage::Dumpable);
    }
    setup_signals().map_err(|()| Stage::Signals)?;
    bring_up_loopback().map_err(|()| Stage::Loopback)
}

/// Clones the command (which runs [`exec_command`] up to its `execve`, held until the
/// launcher says go) and, when it gets a user namespace of its own, writes its id maps.
/// Returns its pid and the init's end of the pair its watch's listener comes on (-1:
/// no watch).
fn start_command(exec: &Exec) -> Result<(pid_t, RawFd), Failed> {
    // The command's own user namespace is set up in two steps: it unshares, then the
    // init (which has the capabilities in the sandbox's namespace) writes its id maps.
    let mut up = [-1; 2];
    let mut down = [-1; 2];
    if exec.nest > 0 && (pipe(&mut up).is_err() || pipe(&mut down).is_err()) {
        return Err(Stage::NestUserns.into());
    }
    // The command sends the watch's listener on this pair; without it, no watch.
    let mut watch_pair = [-1; 2];
    if exec.watch.is_some() {
        // SAFETY: a valid out-array of two ints; failure leaves it at -1.
        unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                watch_pair.as_mut_ptr(),
            )
        };
    }
    // SAFETY: this process is single-threaded; the child only runs `exec_command`,
    // which is async-signal-safe and ends in execve or _exit.
    let cmd = match unsafe { sys::fork_raw(0) } {
        Ok(0) => {
            // SAFETY: the init's ends of the pipes and the pair (-1 when unused: EBADF,
            // harmless).
            unsafe {
                libc::close(up[0]);
                libc::close(down[1]);
                libc::close(watch_pair[0]);
            }
            exec_command(exec, (up[1], down[0]), watch_pair[1])
        }
        Ok(pid) => pid,
        Err(_) => return Err(Stage::ForkCommand.into()),
    };
    // SAFETY: our copy of the child's end of the pair (-1 when unused).
    unsafe { libc::close(watch_pair[1]) };
    if exec.nest > 0 {
        // SAFETY: our copies of the child's ends.
        unsafe {
            libc::close(up[1]);
            libc::close(down[0]);
        }
        if let Err(e) = map_command(cmd, exec.nest, up[0], down[1]) {
            // SAFETY: errno slot of this thread.
            unsafe { *libc::__errno_location() = e };
            return Err(Stage::NestUserns.into());
        }
    }
    Ok((cmd, watch_pair[0]))
}

/// Waits for "go", taking the volumes' idmapped copies that come before it (one a
/// message) into `trees`; returns how many came. Exits if the launcher gives up.
fn await_go(chan: RawFd, trees: &mut [RawFd; MAX_VOLUMES]) -> usize {
    let mut received = 0;
    loop {
        let mut msg = [0u8; 4];
        match sys::recv_with_fd(chan, &mut msg) {
            Ok((1, None)) if msg[0] == wire::GO[0] => return received,
            Ok((1, Some(tree))) if msg[0] == wire::TREE[0] && received < MAX_VOLUMES => {
                trees[received] = tree.into_raw_fd();
                received += 1;
            }
            // The launcher gave up (or died) before the sandbox started.
            _ => exit(1),
        }
    }
}

/// The sandbox's mounts (mounts.rs): private propagation, the substitute
/// `/etc/shadow`, `/proc`, `/sys`, the volumes (`trees`: the launcher's idmapped
/// copies). Fails the setup if `/proc` or a volume cannot be mounted; returns the
/// outcomes of the sysfs and the shadow, which only warn.
fn mount_filesystems(exec: &Exec, trees: &[RawFd]) -> Result<(Warned, Warned), Failed> {
    make_private().map_err(|()| Stage::Proc)?;
    // Before the sandbox's /proc: its tmpfs is made on /proc for a moment.
    let shadow = exec
        .mounts
        .shadow
        .as_ref()
        .map_or(Ok(()), mounts::fake_shadow);
    mount_proc().map_err(|()| Stage::Proc)?;
    let sysfs = mounts::own_sysfs(&exec.mounts.sys_kept);
    if let Err((step, e)) = mounts::volumes(&exec.mounts.steps, trees) {
        // SAFETY: errno slot of this thread.
        unsafe { *libc::__errno_location() = e };
        return Err(Failed(Stage::Volume.with_index(step)));
    }
    Ok((sysfs, shadow))
}

/// The watch's listener, as the command sends it on `pair` (closed here); `None` when
/// the command hung up without one (the kernel refused the filter) or there is no pair.
fn receive_listener(pair: RawFd) -> Option<RawFd> {
    if pair < 0 {
        return None;
    }
    let mut buf = [0u8; 4];
    // Blocks only until the command has tried: it does so before anything that waits.
    let got = sys::recv_with_fd(pair, &mut buf);
    // SAFETY: our end of the pair, no longer needed.
    unsafe { libc::close(pair) };
    match got {
        Ok((_, Some(fd))) => Some(std::os::fd::IntoRawFd::into_raw_fd(fd)),
        _ => None,
    }
}

impl From<Stage> for i32 {
    fn from(stage: Stage) -> i32 {
        stage as i32
    }
}

impl Stage {
    /// The wire word for this stage at step `index` (volumes).
    fn with_index(self, index: usize) -> i32 {
        self as i32 | ((index as i32) << 8)
    }
}

/// Reports a failed setup step with the current errno, then exits.
fn fail(chan: RawFd, failed: Failed) -> ! {
    let msg = wire::encode([wire::SETUP_FAILED as i32, failed.0, errno()]);
    let _ = sys::send_with_fd(chan, &msg, None);
    exit(1)
}

fn exit(code: c_int) -> ! {
    // SAFETY: _exit ends the process without running any user-space cleanup.
    unsafe { libc::_exit(code) }
}

/// Resets inherited handlers to the default (they are launcher code that must not run
/// here), makes sure SIGCHLD is not ignored, and blocks SIGCHLD and the forwarded
/// signals so that they queue for the signalfd. Ignored signals stay ignored, and are
/// inherited as such by the command, as `exec` would.
fn setup_signals() -> Result<(), ()> {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sigaction is plain data; all-zero is a valid value to be overwritten.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying only; old is a valid out-pointer. Signals libc reserves
        // for itself fail with EINVAL, which is fine to skip.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == -1 {
            continue;
        }
        let custom = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
        if custom || sig == libc::SIGCHLD {
            set_default(sig)?;
        }
    }
    let mut set = empty_sigset();
    for sig in FORWARDED.into_iter().chain([libc::SIGCHLD]) {
        // SAFETY: set is an initialised sigset_t.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    // SAFETY: set is initialised; the old mask is not needed.
    sys::cvt(unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) })
        .map(drop)
        .map_err(drop)
}

fn set_default(sig: c_int) -> Result<(), ()> {
    // SAFETY: sigaction is plain data; all-zero means SIG_DFL, no flags, empty mask.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: dfl is a valid, initialised sigaction.
    sys::cvt(unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) })
        .map(drop)
        .map_err(drop)
}

fn empty_sigset() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    set
}

/// `ifconfig lo up` via SIOCSIFFLAGS.
fn bring_up_loopback() -> Result<(), ()> {
    // SAFETY: plain socket(2) call.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock == -1 {
        return Err(());
    }
    // SAFETY: ifreq is plain data; all-zero is valid (empty name, zero flags).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as c_char;
    }
    // SAFETY: ifr is a valid ifreq naming "lo"; SIOCGIFFLAGS fills ifru_flags.
    let mut ok = unsafe { libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut ifr) } != -1;
    if ok {
        // SAFETY: SIOCGIFFLAGS initialised the flags member of the union.
        unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
        // SAFETY: ifr is a valid ifreq with the flags to set.
        ok = unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS, &ifr) } != -1;
    }
    let saved = errno();
    // SAFETY: sock is ours.
    unsafe { libc::close(sock) };
    if ok {
        Ok(())
    } else {
        // Report the ioctl's errno, not close's.
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = saved };
        Err(())
    }
}

/// In a user namespace, takes the ids of its root (mapped to the sandbox's host
/// identity): a process made by root's `clone` is still the host's uid 0, unmapped
/// inside, with the host root's groups. Supplementary groups are dropped where the
/// namespace allows it (a namespace made by an ordinary user denies `setgroups`; its
/// caller's groups then stay, as they are the caller's own).
///
/// Raw system calls: glibc's wrappers change every thread's ids, signalling the threads
/// it believes exist (the launcher's, which this clone does not have) and waiting for
/// them forever.
fn become_root() -> Result<(), ()> {
    // SAFETY: setgroups with no groups; failure (EPERM: denied) is allowed.
    unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) };
    // SAFETY: integer arguments.
    let gid = unsafe { libc::syscall(libc::SYS_setresgid, 0, 0, 0) };
    // SAFETY: integer arguments.
    let uid = unsafe { libc::syscall(libc::SYS_setresuid, 0, 0, 0) };
    if gid == -1 || uid == -1 {
        Err(())
    } else {
        Ok(())
    }
}

/// Lets every group of the sandbox make ICMP echo ("ping") sockets in its network
/// namespace (`net.ipv4.ping_group_range`, per namespace, none by default): its root
/// has no `CAP_NET_RAW` there (it lives in a nested user namespace), and `ping` falls
/// back to these. Best effort: a kernel without the setting keeps its default.
fn allow_ping_sockets() {
    // The range is of the sandbox's group ids: the widest its id map has (65,536 ids
    // for root's subordinate range, one for an ordinary user's own).
    for range in [&b"0 65535"[..], b"0 0"] {
        // SAFETY: a NUL-terminated literal path and integer flags.
        let fd = unsafe {
            libc::open(
                c"/proc/sys/net/ipv4/ping_group_range".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return;
        }
        // SAFETY: `range` is live for its length; `fd` is ours and closed once.
        let written = unsafe {
            let n = libc::write(fd, range.as_ptr().cast(), range.len());
            libc::close(fd);
            n
        };
        if written == range.len() as isize {
            return;
        }
    }
}

/// A private mount propagation: nothing the sandbox mounts reaches the host.
fn make_private() -> Result<(), ()> {
    // SAFETY: mount(2) with NUL-terminated literals and null data.
    let private = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    if private == -1 { Err(()) } else { Ok(()) }
}

/// A fresh `/proc` for the sandbox's PID namespace: it shows the sandbox's processes
/// only, not the host's (whose `ns/net` or `mem` a program could otherwise open).
fn mount_proc() -> Result<(), ()> {
    // SAFETY: mount(2) with NUL-terminated literals and null data.
    let proc = unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    };
    if proc == -1 { Err(()) } else { Ok(()) }
}

/// Writes the id maps of the command's own user namespace once it has made it: ids
/// `0..count` inside are the same ids in the sandbox's namespace. Reads the command's
/// word on `from_cmd` (0, or the errno its `unshare` failed with), answers on `to_cmd`.
/// Returns an errno on failure.
fn map_command(cmd: pid_t, count: u32, from_cmd: RawFd, to_cmd: RawFd) -> Result<(), c_int> {
    let mut word = [0u8; 4];
    // SAFETY: a valid 4-byte buffer.
    let n = unsafe { libc::read(from_cmd, word.as_mut_ptr().cast(), 4) };
    if n != 4 {
        return Err(libc::ECHILD);
    }
    let e = c_int::from_ne_bytes(word);
    if e != 0 {
        return Err(e);
    }
    // "/proc/PID/uid_map" and "0 0 COUNT\n", built on the stack.
    let mut line = [0u8; 32];
    let mut len = put(&mut line, 0, b"0 0 ");
    len = put_num(&mut line, len, count as u64);
    len = put(&mut line, len, b"\n");
    for file in [&b"/uid_map\0"[..], &b"/gid_map\0"[..]] {
        let mut path = [0u8; 48];
        let mut at = put(&mut path, 0, b"/proc/");
        at = put_num(&mut path, at, cmd as u64);
        put(&mut path, at, file);
        // SAFETY: path is NUL-terminated.
        let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd == -1 {
            return Err(errno());
        }
        // SAFETY: line holds len bytes.
        let w = unsafe { libc::write(fd, line.as_ptr().cast(), len) };
        let saved = errno();
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
        if w != len as isize {
            return Err(saved);
        }
    }
    // SAFETY: one byte from a valid buffer.
    if unsafe { libc::write(to_cmd, [1u8].as_ptr().cast(), 1) } != 1 {
        return Err(errno());
    }
    // SAFETY: our ends, no longer needed.
    unsafe {
        libc::close(from_cmd);
        libc::close(to_cmd);
    }
    Ok(())
}

/// `pipe2(O_CLOEXEC)` into `ends`.
fn pipe(ends: &mut [RawFd; 2]) -> Result<(), ()> {
    // SAFETY: a valid out-array of two ints.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        Err(())
    } else {
        Ok(())
    }
}

/// Copies `src` into `buf` at `at`, as far as it fits; returns the new end.
pub(crate) fn put(buf: &mut [u8], at: usize, src: &[u8]) -> usize {
    let n = src.len().min(buf.len().saturating_sub(at));
    buf[at..at + n].copy_from_slice(&src[..n]);
    at + n
}

/// Writes `n` in decimal into `buf` at `at`; returns the new end.
pub(crate) fn put_num(buf: &mut [u8], at: usize, mut n: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    put(buf, at, &digits[i..])
}

/// Moves the channel to [`CHAN_FD`], the watch's listener (if any) to [`WATCH_FD`] and
/// with it the hand-off's request path (`handoff`, if any) to [`HANDOFF_FD`], and closes
/// every fd above them: the init must not keep the launcher's files (pipe ends, host
/// sockets) alive, nor offer them to anyone.
fn keep_only(
    chan: RawFd,
    listener: Option<RawFd>,
    handoff: RawFd,
) -> Result<(RawFd, Option<RawFd>), ()> {
    // Out of every other's way first (above all of them: a free number).
    let handoff = match handoff {
        -1 => -1,
        // SAFETY: fcntl with integer arguments on our fd.
        fd => match unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, HANDOFF_FD + 1) } {
            -1 => return Err(()),
            high => high,
        },
    };
    let mut listener = listener;
    if listener == Some(CHAN_FD) {
        // Out of the channel's way first.
        // SAFETY: fcntl with integer arguments on our fd.
        let moved = unsafe { libc::fcntl(CHAN_FD, libc::F_DUPFD_CLOEXEC, WATCH_FD) };
        if moved == -1 {
            return Err(());
        }
        // SAFETY: the old number is now a duplicate we do not need.
        unsafe { libc::close(CHAN_FD) };
        listener = Some(moved);
    }
    move_fd(chan, CHAN_FD)?;
    if let Some(fd) = listener {
        move_fd(fd, WATCH_FD)?;
    }
    let last = match listener {
        Some(_) if handoff >= 0 => {
            move_fd(handoff, HANDOFF_FD)?;
            HANDOFF_FD
        }
        Some(_) => WATCH_FD,
        None => CHAN_FD,
    };
    let first = (last + 1) as libc::c_uint;
    // SAFETY: close_range with integer arguments.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) };
    if ret == -1 {
        // Kernels before 5.9: close one by one up to the fd limit.
        // SAFETY: rlimit is plain data; getrlimit fills it.
        let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: lim is a valid out-pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == -1 {
            return Err(());
        }
        let max = lim.rlim_cur.min(1 << 20) as RawFd;
        for fd in first as RawFd..max {
            // SAFETY: closing fds we own (this process's copies); EBADF is harmless.
            unsafe { libc::close(fd) };
        }
    }
    Ok((CHAN_FD, listener.map(|_| WATCH_FD)))
}

/// Moves `fd` to number `to` (CLOEXEC); whatever was at `to` is closed.
fn move_fd(fd: RawFd, to: RawFd) -> Result<(), ()> {
    if fd != to {
        // SAFETY: dup3 onto a fixed number; whatever was there is closed by it.
        if unsafe { libc::dup3(fd, to, libc::O_CLOEXEC) } == -1 {
            return Err(());
        }
        // SAFETY: the old number is now a duplicate we do not need.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

fn signalfd() -> Result<RawFd, ()> {
    let mut set = empty_sigset();
    for sig in FORWARDED.into_iter().chain([libc::SIGCHLD]) {
        // SAFETY: set is an initialised sigset_t.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    // SAFETY: set is initialised.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd == -1 { Err(()) } else { Ok(fd) }
}

/// The init's event loop; exits the process when the command exits.
fn serve(chan: RawFd, sigfd: RawFd, cmd: pid_t, mut watch: Option<Watch>) -> ! {
    // The command may have exited before the signalfd existed; its SIGCHLD is still
    // pending, but reaping once here costs nothing.
    if let Some(code) = reap(cmd) {
        end(code, watch.as_mut());
    }
    let pollfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // A negative fd (no watch, no kept call) is skipped by poll.
    let mut fds = [pollfd(-1); 3 + crate::host_guard::PENDING];
    (fds[0].fd, fds[1].fd) = (chan, sigfd);
    loop {
        fds[2].fd = watch.as_ref().map_or(-1, Watch::fd);
        if let Some(w) = watch.as_ref() {
            w.kept_fds(&mut fds[3..]);
        }
        let timeout = watch.as_ref().map_or(-1, Watch::timeout);
        // SAFETY: fds is a valid array of pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if ready == -1 {
            continue; // EINTR
        }
        if let Some(w) = watch.as_mut() {
            // Before the signals: a caller waits for this answer.
            w.serve_kept(&fds[3..]);
            w.serve(fds[2].revents);
        }
        if fds[1].revents != 0
            && let Some(code) = drain_signals(sigfd, cmd)
        {
            end(code, watch.as_mut());
        }
        if fds[0].revents & libc::POLLIN != 0 {
            serve_request(chan);
        } else if fds[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            launcher_gone();
        }
    }
}

/// The command has exited: the watch says what it has not said yet, and the init exits
/// with the command's status (which kills everything left in the PID namespace).
fn end(code: c_int, watch: Option<&mut Watch>) -> ! {
    if let Some(w) = watch {
        w.finish();
    }
    exit(code)
}

/// Reads every queued signal: SIGCHLD reaps, anything else goes to the command. Returns
/// the command's exit code once it has been reaped.
fn drain_signals(sigfd: RawFd, cmd: pid_t) -> Option<c_int> {
    loop {
        // SAFETY: signalfd_siginfo is plain data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let len = size_of::<libc::signalfd_siginfo>();
        // SAFETY: info is a writable buffer of len bytes.
        let n = unsafe { libc::read(sigfd, (&raw mut info).cast(), len) };
        if n != len as isize {
            return None; // EAGAIN: drained
        }
        let sig = info.ssi_signo as c_int;
        if sig == libc::SIGCHLD {
            if let Some(code) = reap(cmd) {
                return Some(code);
            }
        } else {
            // SAFETY: kill with integer arguments; the command is our unreaped child
            // (the init exits as soon as it is reaped), so its pid is not reused.
            unsafe { libc::kill(cmd, sig) };
        }
    }
}

/// Reaps every exited child; returns the command's exit code once it is among them.
fn reap(cmd: pid_t) -> Option<c_int> {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return None; // 0: children remain, none exited; -1: no children
        }
        if pid == cmd {
            return Some(sys::exit_code(status));
        }
    }
}

/// Answers one socket factory request.
fn serve_request(chan: RawFd) {
    let mut buf = [0u8; wire::MSG_LEN + 4];
    // SAFETY: buf is a valid buffer of the given length. Any fds a peer attached are
    // discarded by the kernel since no control buffer is given.
    let n = unsafe { libc::recv(chan, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n == 0 {
        launcher_gone();
    }
    if n < 0 {
        match errno() {
            libc::EINTR | libc::EAGAIN => return,
            _ => launcher_gone(),
        }
    }
    let (errno, sock) = match wire::decode(&buf[..n as usize]) {
        Some([wire::OPEN_TUN, _, _]) => {
            // SAFETY: a NUL-terminated static path and integer flags.
            let fd = unsafe {
                libc::open(
                    c"/dev/net/tun".as_ptr(),
                    libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
                )
            };
            if fd == -1 {
                (errno(), None)
            } else {
                (0, Some(fd))
            }
        }
        Some([domain, ty, protocol]) => {
            // SAFETY: socket(2) with integer arguments.
            let sock = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, protocol) };
            if sock == -1 {
                (errno(), None)
            } else {
                (0, Some(sock))
            }
        }
        None => (libc::EINVAL, None),
    };
    let _ = sys::send_with_fd(chan, &errno.to_ne_bytes(), sock);
    if let Some(sock) = sock {
        // SAFETY: the launcher received its own copy; ours is no longer needed.
        unsafe { libc::close(sock) };
    }
}

/// The launcher is gone: nobody will wait for the sandbox, so end it.
fn launcher_gone() -> ! {
    exit(128 + libc::SIGKILL)
}

/// In the command's child: its own user and mount namespaces when asked for (see
/// [`Exec::nest`]; `nest` = (write end to the init, read end from it)), no new
/// privileges, a clean signal state, then `execve`, trying each candidate path in turn.
/// `watch` is the command's end of the pair the watch's listener goes to (-1: no
/// watch). Never returns: the exit status of a failure is its [`CommandError`]'s.
fn exec_command(exec: &Exec, nest: (RawFd, RawFd), watch: RawFd) -> ! {
    let failed = match prepare_command(exec, nest, watch) {
        Ok(()) => execve_any(exec),
        Err(e) => e,
    };
    failed.exit(exec)
}

/// Why the command's child did not become the command. [`CommandError::exit`] is the
/// one place its exit status (as shells have them: 127 not found, 126 found but not
/// executable) and its line on stderr are decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CommandError {
    /// Its own user namespace could not be made, or the init did not map it.
    Nest,
    /// The filter that keeps set-id files out of the volumes could not be installed
    /// (errno).
    Guard(c_int),
    /// The socket watch's listener could not be handed to the init.
    Watch,
    /// The guard of handed-off host sockets could not be installed (host_guard.rs).
    HostGuard,
    /// The launcher gave up before letting the held command go.
    Gate,
    /// No candidate path exists.
    NotFound,
    /// A candidate exists but cannot be executed (errno).
    CannotExec(c_int),
}

impl CommandError {
    fn exit_code(self) -> c_int {
        match self {
            CommandError::Gate => 1,
            CommandError::NotFound => 127,
            CommandError::Nest
            | CommandError::Guard(_)
            | CommandError::Watch
            | CommandError::HostGuard
            | CommandError::CannotExec(_) => 126,
        }
    }

    /// Says why on stderr (nothing for a failure the launcher reports, or caused) and
    /// exits with [`exit_code`](Self::exit_code).
    fn exit(self, exec: &Exec) -> ! {
        match self {
            CommandError::Nest | CommandError::Gate => {}
            CommandError::Guard(e) => {
                // Without it, a volume would let the command make set-id root programs.
                write_stderr(b"ferry: cannot keep set-id files out of the volumes: ");
                write_stderr(errno_text(e));
                write_stderr(b"\n");
            }
            CommandError::HostGuard => {
                write_stderr(
                    b"ferry: --handoff needs a seccomp filter with a listener (Linux 5.14, x86_64 or aarch64, no other listener on the process); the kernel refused it\n",
                );
            }
            CommandError::Watch => {
                write_stderr(b"ferry: cannot hand the socket watch to the sandbox's init\n");
            }
            CommandError::NotFound => write_stderr(&exec.not_found),
            CommandError::CannotExec(e) => {
                write_stderr(&exec.cannot_exec);
                write_stderr(errno_text(e));
                write_stderr(b"\n");
            }
        }
        exit(self.exit_code())
    }
}

/// The command's steps before `execve`: its own user namespace → [`restrict`] → the
/// socket watch → a clean signal state → the launcher's go ([`Exec::gate`]).
fn prepare_command(exec: &Exec, nest: (RawFd, RawFd), watch: RawFd) -> Result<(), CommandError> {
    if exec.nest > 0 {
        enter_own_userns(nest)?;
    }
    restrict(exec)?;
    if let Some(mode) = exec.watch.as_ref().filter(|_| watch >= 0) {
        hand_over_watch(mode, watch)?;
    }
    let empty = empty_sigset();
    // SAFETY: empty is an initialised sigset_t.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) };
    // The launcher (a Rust program) ignores SIGPIPE; the command should not inherit
    // that, as std::process::Command also arranges.
    let _ = set_default(libc::SIGPIPE);
    if let Some((read_end, write_end)) = exec.gate {
        await_gate(read_end, write_end)?;
    }
    Ok(())
}

/// Makes the command's own user and mount namespaces and waits for the init to write
/// the user namespace's id maps (`(to_init, from_init)`: the pipes' ends).
fn enter_own_userns((to_init, from_init): (RawFd, RawFd)) -> Result<(), CommandError> {
    // The init is not dumpable, and so neither is this copy of it: its /proc files
    // would belong to the host's root, and the init could not write its id maps.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    // SAFETY: unshare with integer flags.
    let e = if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } == -1 {
        errno()
    } else {
        0
    };
    let word = e.to_ne_bytes();
    // SAFETY: a valid 4-byte buffer.
    let told = unsafe { libc::write(to_init, word.as_ptr().cast(), 4) } == 4;
    // The init answers once the maps are written.
    let mut ok = [0u8; 1];
    // SAFETY: a valid 1-byte buffer.
    if !told || e != 0 || unsafe { libc::read(from_init, ok.as_mut_ptr().cast(), 1) } != 1 {
        return Err(CommandError::Nest);
    }
    // SAFETY: our ends, no longer needed.
    unsafe {
        libc::close(to_init);
        libc::close(from_init);
    }
    Ok(())
}

/// Installs the socket watch's filter and sends its listener to the init on `pair`
/// (closed here). A kernel that refuses the filter (old, no seccomp, another listener
/// already) leaves the command unwatched; once installed, the listener must reach the
/// init: without one, the kernel fails every inet socket() of the command's with ENOSYS.
fn hand_over_watch(mode: &watch::Mode, pair: RawFd) -> Result<(), CommandError> {
    if let Some(listener) = watch::install(mode) {
        if sys::send_with_fd(pair, b"L", Some(listener)).is_err() {
            return Err(CommandError::Watch);
        }
        // SAFETY: our copy (CLOEXEC, but no process of the sandbox may hold one: the
        // init's is the only listener).
        unsafe { libc::close(listener) };
    } else if matches!(mode, watch::Mode::Guard(_)) {
        // Handed-off host sockets without their guard: the command must not run.
        return Err(CommandError::HostGuard);
    }
    // SAFETY: our end of the pair.
    unsafe { libc::close(pair) };
    Ok(())
}

/// Held: waits for the launcher's byte on the gate. EOF means it gave up: do not run.
fn await_gate(read_end: RawFd, write_end: RawFd) -> Result<(), CommandError> {
    // SAFETY: closing our copy of the write end (so EOF can be seen); async-signal-safe.
    unsafe { libc::close(write_end) };
    let mut b = [0u8; 1];
    loop {
        // SAFETY: reading into a valid one-byte buffer; async-signal-safe.
        let n = unsafe { libc::read(read_end, b.as_mut_ptr().cast(), 1) };
        if n == 1 {
            return Ok(());
        }
        if n == -1 && errno() == libc::EINTR {
            continue;
        }
        return Err(CommandError::Gate);
    }
}

/// `execve`s each candidate path in turn; returns only if none could be executed.
fn execve_any(exec: &Exec) -> CommandError {
    let mut denied = false;
    for path in &exec.candidates {
        // SAFETY: path, argv and envp are NUL-terminated strings / null-terminated
        // pointer arrays that `exec` keeps alive.
        unsafe { libc::execve(path.as_ptr(), exec.argv.as_ptr(), exec.envp.as_ptr()) };
        match errno() {
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE => {}
            // A file that is there but not executable counts; a PATH directory we
            // may not search does not (as in shells: that is "not found").
            // SAFETY: path is a NUL-terminated string; access only inspects it.
            libc::EACCES if unsafe { libc::access(path.as_ptr(), libc::F_OK) } == 0 => {
                denied = true;
            }
            libc::EACCES => {}
            e => return CommandError::CannotExec(e),
        }
    }
    if denied {
        CommandError::CannotExec(libc::EACCES)
    } else {
        CommandError::NotFound
    }
}

/// In the command's child, before the watch: its working directory as the sandbox sees
/// it, no new privileges, and with volumes the guard (guard.rs).
fn restrict(exec: &Exec) -> Result<(), CommandError> {
    if let Some(cwd) = &exec.cwd {
        // Best effort: where it cannot, the command keeps the directory it inherited.
        // SAFETY: a NUL-terminated path.
        unsafe { libc::chdir(cwd.as_ptr()) };
    }
    // Set-uid and file-capability binaries gain nothing in the sandbox.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    match &exec.guard {
        Some(prog) => guard::install(prog).map_err(CommandError::Guard),
        None => Ok(()),
    }
}

fn write_stderr(mut msg: &[u8]) {
    while !msg.is_empty() {
        // SAFETY: msg is a valid buffer of the given length.
        let n = unsafe { libc::write(libc::STDERR_FILENO, msg.as_ptr().cast(), msg.len()) };
        if n <= 0 {
            return;
        }
        msg = &msg[n as usize..];
    }
}

/// A static description of the errors `execve` commonly reports (strerror is not
/// async-signal-safe).
fn errno_text(e: c_int) -> &'static [u8] {
    match e {
        libc::EACCES => b"permission denied",
        libc::ENOEXEC => b"exec format error",
        libc::ETXTBSY => b"text file busy",
        libc::ELOOP => b"too many levels of symbolic links",
        libc::ENAMETOOLONG => b"file name too long",
        libc::E2BIG => b"argument list too long",
        libc::ENOMEM => b"out of memory",
        libc::EISDIR => b"is a directory",
        libc::EPERM => b"operation not permitted",
        libc::ELIBBAD => b"bad ELF interpreter",
        _ => b"execve failed",
    }
}
