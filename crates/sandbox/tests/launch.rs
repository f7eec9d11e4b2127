//! Launching real sandboxes. Needs root, or unprivileged user namespaces; each test
//! prints a skip message and passes when the machine cannot run it.

use std::ffi::OsString;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ferry_sandbox::{
    Sandbox, SocketWatch, Spec, UserNs, launch, testbed::is_root, userns_available,
};

fn can_launch(test: &str) -> bool {
    if is_root() || userns_available() {
        return true;
    }
    eprintln!("skipping {test}: needs root or unprivileged user namespaces");
    false
}

fn spec(program: &str, args: &[&str]) -> Spec {
    Spec {
        program: program.into(),
        args: args.iter().map(OsString::from).collect(),
        ..Spec::default()
    }
}

/// A fresh path under the temp dir, unique per test process and call.
fn temp_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("ferry-sandbox-{}-{tag}-{n}", std::process::id()))
}

/// Runs `script` with `sh -c` in a sandbox; returns its status and its stdout+stderr.
fn run_sh(script: &str, userns: UserNs) -> (i32, String) {
    let out = temp_path("out");
    let mut spec = spec("sh", &["-c", &format!("( {script} ) >\"$OUT\" 2>&1")]);
    spec.env.push(("OUT".into(), out.clone().into()));
    spec.userns = userns;
    let code = launch(&spec).unwrap().wait().unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    (code, text)
}

fn inode(path: impl AsRef<Path>) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

fn fd_inode(fd: i32) -> u64 {
    inode(format!("/proc/self/fd/{fd}"))
}

fn fcntl(fd: i32, cmd: i32) -> i32 {
    // SAFETY: F_GETFD/F_GETFL take no argument and only read the fd's flags.
    let flags = unsafe { libc::fcntl(fd, cmd) };
    assert!(flags >= 0, "fcntl: {}", std::io::Error::last_os_error());
    flags
}

/// (read end, write end)
fn pipe(flags: i32) -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out-array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), flags) }, 0);
    // SAFETY: pipe2 returned two fresh fds that nothing else owns.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Interface names listed in /proc/net/dev output.
fn interfaces(proc_net_dev: &str) -> Vec<String> {
    proc_net_dev
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| !name.contains('|'))
        .map(|(name, _)| name.trim().to_owned())
        .collect()
}

#[test]
fn only_loopback_and_it_is_up() {
    if !can_launch("only_loopback_and_it_is_up") {
        return;
    }
    // Connecting to a closed port on an up lo is refused; with lo down the network is
    // unreachable. bash may be missing; then only /proc/net/dev is checked.
    let probe = if Path::new("/bin/bash").exists() {
        "echo ---; bash -c 'exec 3<>/dev/tcp/127.0.0.1/1' 2>&1; true"
    } else {
        "true"
    };
    let (code, out) = run_sh(&format!("cat /proc/net/dev; {probe}"), UserNs::Auto);
    assert_eq!(code, 0, "{out}");
    let (dev, probe_out) = out.split_once("---").unwrap_or((&out, ""));
    assert_eq!(interfaces(dev), ["lo"], "{out}");
    if !probe_out.is_empty() {
        assert!(probe_out.contains("refused"), "lo not up? {probe_out}");
    }
    if Path::new("/usr/sbin/ip").exists() || Path::new("/sbin/ip").exists() {
        let (code, out) = run_sh("PATH=/usr/sbin:/sbin:$PATH ip -o link show", UserNs::Auto);
        assert_eq!(code, 0, "{out}");
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(out.contains(": lo: <LOOPBACK,UP"), "{out}");
    }
}

#[test]
fn the_sandboxs_root_is_an_unprivileged_host_identity() {
    if !can_launch("the_sandboxs_root_is_an_unprivileged_host_identity") {
        return;
    }
    // A file the sandbox's root makes shows its host identity: the caller's uid, or
    // for root the subordinate range's first id.
    let dir = temp_path("ids");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let file = dir.join("made");
    let (code, out) = run_sh(
        &format!("id -u; id -g; touch {}", file.display()),
        UserNs::Auto,
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["0", "0"], "{out}");
    let meta = std::fs::metadata(&file).unwrap();
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let want = if euid == 0 {
        ferry_sandbox::root_sandbox_ids().0.base
    } else {
        euid
    };
    assert_eq!(meta.uid(), want);
    assert_ne!(meta.uid(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_sandbox_has_its_own_proc_and_cannot_remove_it() {
    if !can_launch("the_sandbox_has_its_own_proc_and_cannot_remove_it") {
        return;
    }
    // Its /proc lists its own processes (the init, the shell, ls); the host's pid 1 is
    // not there. Unmounting it (to find the host's underneath) is refused.
    let (code, out) = run_sh(
        "cat /proc/1/comm; ls /proc | grep -c '^[0-9]'; umount /proc 2>/dev/null && echo unmounted; umount -l /proc 2>/dev/null && echo detached; cat /proc/1/comm",
        UserNs::Auto,
    );
    assert_eq!(code, 0, "{out}");
    let lines: Vec<_> = out.lines().collect();
    assert_eq!(lines[0], "ferry-init", "{out}");
    let n: usize = lines[1].parse().unwrap();
    assert!(n <= 8, "{out}");
    assert_eq!(lines[2..], ["ferry-init"], "{out}");
}

#[test]
fn exit_status_passthrough() {
    if !can_launch("exit_status_passthrough") {
        return;
    }
    let status = |s: Spec| launch(&s).unwrap().wait().unwrap();
    assert_eq!(status(spec("sh", &["-c", "exit 7"])), 7);
    assert_eq!(status(spec("sh", &["-c", "kill -TERM $$"])), 143);
    assert_eq!(status(spec("true", &[])), 0);
    assert_eq!(status(spec("ferry-no-such-command-xyz", &[])), 127);
    assert_eq!(status(spec("/nonexistent/dir/cmd", &[])), 127);

    let not_executable = temp_path("noexec");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let code = status(spec(not_executable.to_str().unwrap(), &[]));
    let _ = std::fs::remove_file(&not_executable);
    assert_eq!(code, 126);
}

#[test]
fn environment_is_inherited_plus_spec() {
    if !can_launch("environment_is_inherited_plus_spec") {
        return;
    }
    let mut s = spec(
        "sh",
        &[
            "-c",
            r#"[ "$FERRY_TEST_VAR" = "yes please" ] && [ -n "$HOME$PATH" ]"#,
        ],
    );
    s.env.push(("FERRY_TEST_VAR".into(), "yes please".into()));
    assert_eq!(launch(&s).unwrap().wait().unwrap(), 0);
    // PATH from the spec is the one searched.
    let mut s = spec("sh", &["-c", "true"]);
    s.env.push(("PATH".into(), "/nonexistent".into()));
    assert_eq!(launch(&s).unwrap().wait().unwrap(), 127);
}

#[test]
fn factory_socket_lives_in_sandbox_netns() {
    if !can_launch("factory_socket_lives_in_sandbox_netns") {
        return;
    }
    let mut sandbox = launch(&spec("sleep", &["30"])).unwrap();
    let sock = sandbox
        .factory()
        .socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)
        .unwrap();
    // SAFETY: sock is a valid socket; SIOCGSKNS returns a new fd of its netns.
    let ns = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGSKNS) };
    assert!(ns >= 0, "SIOCGSKNS: {}", std::io::Error::last_os_error());
    // SAFETY: the ioctl returned a fresh fd that nothing else owns.
    let ns = unsafe { OwnedFd::from_raw_fd(ns) };
    let sandbox_ns = fd_inode(sandbox.netns_fd().as_raw_fd());
    assert_eq!(fd_inode(ns.as_raw_fd()), sandbox_ns);
    assert_ne!(inode("/proc/self/ns/net"), sandbox_ns);

    // Host-side fds are close-on-exec; the nonblocking flag made it through.
    for fd in [
        sock.as_raw_fd(),
        sandbox.netns_fd().as_raw_fd(),
        sandbox.pidfd().as_raw_fd(),
    ] {
        assert_eq!(
            fcntl(fd, libc::F_GETFD) & libc::FD_CLOEXEC,
            libc::FD_CLOEXEC
        );
    }
    assert_ne!(fcntl(sock.as_raw_fd(), libc::F_GETFL) & libc::O_NONBLOCK, 0);

    // Errors come back as errno.
    let err = sandbox
        .factory()
        .socket(libc::AF_INET, 12345, 0)
        .unwrap_err();
    assert!(
        matches!(
            err.raw_os_error(),
            Some(libc::EINVAL | libc::ESOCKTNOSUPPORT)
        ),
        "{err}"
    );

    sandbox.signal(libc::SIGKILL).unwrap();
    assert_eq!(sandbox.wait().unwrap(), 128 + libc::SIGKILL);
    let err = sandbox
        .factory()
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe, "{err}");
}

#[test]
fn factory_listener_is_on_the_sandbox_loopback() {
    if !can_launch("factory_listener_is_on_the_sandbox_loopback") {
        return;
    }
    if !Path::new("/bin/bash").exists() {
        eprintln!("skipping factory_listener_is_on_the_sandbox_loopback: no bash");
        return;
    }
    let port_file = temp_path("port");
    // Wait for the port, then connect from inside the sandbox with bash's /dev/tcp.
    let script = r#"while [ ! -s "$PORT_FILE" ]; do sleep 0.02; done
        exec bash -c 'echo hello-from-inside >/dev/tcp/127.0.0.1/$(cat "$PORT_FILE")'"#;
    let mut s = spec("sh", &["-c", script]);
    s.env.push(("PORT_FILE".into(), port_file.clone().into()));
    let mut sandbox = launch(&s).unwrap();

    let listener = bind_listener(&sandbox, Ipv4Addr::LOCALHOST);
    let port = listener.local_addr().unwrap().port();
    // The host's 127.0.0.1 is a different loopback: nothing listens there.
    let host = TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(2),
    );
    assert!(host.is_err(), "host loopback reached the sandbox listener");

    let tmp = port_file.with_extension("tmp");
    std::fs::write(&tmp, port.to_string()).unwrap();
    std::fs::rename(&tmp, &port_file).unwrap();

    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "no connection from the sandbox");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).unwrap();
    let mut got = String::new();
    conn.read_to_string(&mut got).unwrap();
    assert_eq!(got, "hello-from-inside\n");
    assert_eq!(sandbox.wait().unwrap(), 0);
    let _ = std::fs::remove_file(&port_file);
}

/// A listening TCP socket created through the factory and bound to `ip:0`.
fn bind_listener(sandbox: &Sandbox, ip: Ipv4Addr) -> TcpListener {
    let sock = sandbox
        .factory()
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
        .unwrap();
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: addr is a valid sockaddr_in of the given length.
    let ret = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&raw const addr).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(ret, 0, "bind: {}", std::io::Error::last_os_error());
    // SAFETY: listen on a valid, bound socket.
    assert_eq!(unsafe { libc::listen(sock.as_raw_fd(), 8) }, 0);
    TcpListener::from(sock)
}

#[test]
fn sigterm_is_forwarded_and_nothing_survives() {
    if !can_launch("sigterm_is_forwarded_and_nothing_survives") {
        return;
    }
    // A background child that would outlive the command without the PID namespace.
    let mut sandbox = launch(&spec("sh", &["-c", "sleep 1000 & exec sleep 30"])).unwrap();
    let pid = sandbox.pid();
    // Only root may read a non-dumpable process's namespace links.
    let pidns = is_root().then(|| inode(format!("/proc/{pid}/ns/pid")));
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    sandbox.signal(libc::SIGTERM).unwrap();
    assert_eq!(sandbox.wait().unwrap(), 143);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!alive(pid), "init {pid} still exists");
    if let Some(pidns) = pidns {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let p = entry.path().join("ns/pid");
            if let Ok(meta) = std::fs::metadata(&p) {
                assert_ne!(
                    meta.ino(),
                    pidns,
                    "{} survived the sandbox",
                    entry.path().display()
                );
            }
        }
    }
    // Signalling a reaped sandbox fails cleanly (pidfd: no pid reuse).
    assert!(sandbox.signal(libc::SIGTERM).is_err());
}

#[test]
fn sigint_from_another_thread() {
    if !can_launch("sigint_from_another_thread") {
        return;
    }
    let mut sandbox = launch(&spec("sleep", &["30"])).unwrap();
    let signaller = sandbox.signaller();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        signaller.signal(libc::SIGINT).unwrap();
    });
    assert_eq!(sandbox.wait().unwrap(), 128 + libc::SIGINT);
    t.join().unwrap();
}

#[test]
fn drop_kills_the_sandbox() {
    if !can_launch("drop_kills_the_sandbox") {
        return;
    }
    let mut sandbox = launch(&spec("sleep", &["30"])).unwrap();
    assert_eq!(sandbox.try_wait().unwrap(), None);
    let pid = sandbox.pid();
    drop(sandbox);
    assert!(!alive(pid));
}

#[test]
fn launcher_fds_are_not_held_by_init() {
    if !can_launch("launcher_fds_are_not_held_by_init") {
        return;
    }
    let (read_end, write_end) = pipe(libc::O_CLOEXEC);
    let mut sandbox = launch(&spec("sleep", &["30"])).unwrap();
    drop(write_end);
    // EOF must come at once: neither the init nor the command holds the write end.
    let mut pfd = libc::pollfd {
        fd: read_end.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: pfd is a valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, 5000) };
    assert_eq!(ready, 1, "write end still open somewhere");
    let mut buf = [0u8; 1];
    assert_eq!(std::fs::File::from(read_end).read(&mut buf).unwrap(), 0);
    sandbox.signal(libc::SIGTERM).unwrap();
    assert_eq!(sandbox.wait().unwrap(), 143);
}

#[test]
fn inheritable_fds_reach_the_command() {
    if !can_launch("inheritable_fds_reach_the_command") {
        return;
    }
    // No O_CLOEXEC on purpose.
    let (read_end, write_end) = pipe(0);
    let script = format!("echo through-the-pipe >&{}", write_end.as_raw_fd());
    let mut sandbox = launch(&spec("sh", &["-c", &script])).unwrap();
    drop(write_end);
    assert_eq!(sandbox.wait().unwrap(), 0);
    let mut got = String::new();
    std::fs::File::from(read_end)
        .read_to_string(&mut got)
        .unwrap();
    assert_eq!(got, "through-the-pipe\n");
}

#[test]
fn many_concurrent_launches() {
    if !can_launch("many_concurrent_launches") {
        return;
    }
    // Launch from several threads at once: clone from a multi-threaded process.
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                for j in 0..5 {
                    let code = i * 10 + j;
                    let s = spec("sh", &["-c", &format!("exit {code}")]);
                    assert_eq!(launch(&s).unwrap().wait().unwrap(), code);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// The `sbx` example, built by `cargo test` next to this test binary.
fn sbx_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("examples").join("sbx");
    path.exists().then_some(path)
}

#[test]
fn sbx_reports_missing_command() {
    if !can_launch("sbx_reports_missing_command") {
        return;
    }
    let Some(sbx) = sbx_binary() else {
        eprintln!("skipping sbx_reports_missing_command: examples/sbx not built");
        return;
    };
    let out = Command::new(&sbx)
        .arg("ferry-no-such-command-xyz")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ferry: ferry-no-such-command-xyz: command not found"),
        "{stderr}"
    );
}

/// Whether `pid` is gone or a zombie nobody has reaped yet.
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn launcher_death_ends_the_sandbox() {
    let test = "launcher_death_ends_the_sandbox";
    if !is_root() {
        // Reading a non-dumpable init's /proc entries needs root.
        eprintln!("skipping {test}: needs root to inspect the sandbox processes");
        return;
    }
    let Some(sbx) = sbx_binary() else {
        eprintln!("skipping {test}: examples/sbx not built");
        return;
    };
    let mut launcher = Command::new(sbx).args(["sleep", "30"]).spawn().unwrap();
    let launcher_pid = launcher.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(10);
    // Wait for launcher -> init -> sleep.
    let (init, cmd) = loop {
        let init = children(launcher_pid).first().copied();
        if let Some((init, Some(cmd))) = init.map(|init| (init, children(init).first().copied())) {
            break (init, cmd);
        }
        assert!(Instant::now() < deadline, "sandbox did not start");
        std::thread::sleep(Duration::from_millis(10));
    };
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    while !(dead(init) && dead(cmd)) {
        assert!(Instant::now() < deadline, "sandbox outlived its launcher");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn unprivileged_user_gets_root_and_only_loopback() {
    let test = "unprivileged_user_gets_root_and_only_loopback";
    if !is_root() {
        eprintln!("skipping {test}: needs root to switch to an unprivileged user");
        return;
    }
    let Some(sbx) = sbx_binary() else {
        eprintln!("skipping {test}: examples/sbx not built");
        return;
    };
    let setpriv = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let probe = Command::new("setpriv")
        .args(setpriv)
        .args(["unshare", "--user", "--map-root-user", "true"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipping {test}: setpriv missing or nobody cannot create user namespaces");
        return;
    }
    // Copy the binary to where nobody (uid 65534) can run it.
    let dir = temp_path("sbx");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("sbx");
    // With cp, not std::fs::copy: a write fd to the binary open in this process would be
    // inherited by sandboxes that other tests clone meanwhile, and exec would fail with
    // ETXTBSY.
    assert!(
        Command::new("cp")
            .arg(&sbx)
            .arg(&bin)
            .status()
            .unwrap()
            .success()
    );
    let out = Command::new("setpriv")
        .args(setpriv)
        .arg(&bin)
        .args([
            "--factory-check",
            "sh",
            "-c",
            "id -u; cat /proc/net/dev; exit 5",
        ])
        .current_dir("/")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(5),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("factory ok"), "{stdout}");
    assert_eq!(lines.next(), Some("0"), "{stdout}");
    let rest: Vec<_> = lines.collect();
    assert_eq!(interfaces(&rest.join("\n")), ["lo"], "{stdout}");
}

#[test]
fn run_sh_helper_captures_output() {
    if !can_launch("run_sh_helper_captures_output") {
        return;
    }
    let (code, out) = run_sh("echo out; echo err >&2; exit 3", UserNs::Auto);
    assert_eq!(code, 3);
    assert_eq!(out, "out\nerr\n");
}

#[test]
fn a_held_command_runs_only_after_start() {
    if !can_launch("a_held_command_runs_only_after_start") {
        return;
    }
    let marker = temp_path("held");
    let mut s = spec("sh", &["-c", &format!("echo ran > {}", marker.display())]);
    s.hold = true;
    let mut sandbox = launch(&s).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!marker.exists(), "the command ran before start");
    sandbox.start().unwrap();
    assert_eq!(sandbox.wait().unwrap(), 0);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran\n");
    let _ = std::fs::remove_file(&marker);
    // Never started: the command never runs, and dropping the sandbox ends it.
    let marker = temp_path("never");
    let mut s = spec("sh", &["-c", &format!("echo ran > {}", marker.display())]);
    s.hold = true;
    let sandbox = launch(&s).unwrap();
    let pid = sandbox.pid();
    drop(sandbox);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!marker.exists(), "an unstarted command ran");
    assert!(!alive(pid));
}

/// Runs `script` with `sh -c` in a sandbox with the socket watch when `watch`; returns
/// whether the watch is on, the status and the script's stdout+stderr.
fn run_watched(script: &str, watch: bool) -> (bool, i32, String) {
    let out = temp_path("out");
    let mut spec = spec("sh", &["-c", &format!("( {script} ) >\"$OUT\" 2>&1")]);
    spec.env.push(("OUT".into(), out.clone().into()));
    spec.watch = watch.then(SocketWatch::default);
    let mut sandbox = launch(&spec).unwrap();
    // The init is not watched: its socket factory makes inet sockets at any time.
    drop(
        sandbox
            .factory()
            .socket(libc::AF_INET, libc::SOCK_DGRAM, 0)
            .unwrap(),
    );
    let code = sandbox.wait().unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    (sandbox.watching(), code, text)
}

/// A bash command that makes an IPv4 TCP socket through the kernel and connects it to a
/// closed port of the sandbox's loopback.
const BASH_CONNECT: &str = "bash -c 'exec 3<>/dev/tcp/127.0.0.1/1' 2>/dev/null; echo connect $?";

#[test]
fn the_watch_filters_the_command_and_not_the_init() {
    if !can_launch("the_watch_filters_the_command_and_not_the_init") {
        return;
    }
    if !Path::new("/bin/bash").exists() {
        eprintln!("skipping: bash is not installed");
        return;
    }
    let script = format!("grep ^Seccomp: /proc/self/status /proc/1/status; {BASH_CONNECT}");
    let (watching, code, out) = run_watched(&script, true);
    assert!(watching, "the kernel refused the filter here? {out}");
    assert_eq!(code, 0, "{out}");
    // The command (and its children) run under a filter, the init under none; the
    // watched socket is made and connects as it would (refused: nothing listens).
    assert_eq!(
        out,
        "/proc/self/status:Seccomp:\t2\n/proc/1/status:Seccomp:\t0\nconnect 1\n"
    );
    let (watching, code, out) = run_watched(&script, false);
    assert!(!watching);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        "/proc/self/status:Seccomp:\t0\n/proc/1/status:Seccomp:\t0\nconnect 1\n"
    );
}

#[test]
fn sbx_tells_of_each_process_that_makes_an_inet_socket() {
    if !can_launch("sbx_tells_of_each_process_that_makes_an_inet_socket") {
        return;
    }
    let Some(sbx) = sbx_binary() else {
        eprintln!("skipping: examples/sbx not built");
        return;
    };
    if !Path::new("/bin/bash").exists() {
        eprintln!("skipping: bash is not installed");
        return;
    }
    // Two processes, the first with two sockets; sbx has no shim, so both are told.
    let script = format!(
        "{BASH_CONNECT}; bash -c 'exec 3<>/dev/tcp/127.0.0.1/1; exec 4<>/dev/tcp/127.0.0.1/2' 2>/dev/null; {BASH_CONNECT}"
    );
    let out = Command::new(&sbx)
        .args(["sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines: Vec<_> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    for l in &lines {
        assert!(
            l.starts_with("ferry: pid ")
                && l.ends_with(" (bash): made an IPv4 socket without ferry's shim (a static or Go program?): it sees only the sandbox's loopback (--net nic or both serves it)"),
            "{stderr}"
        );
    }
}

#[test]
fn a_full_stderr_does_not_stop_the_watch() {
    if !can_launch("a_full_stderr_does_not_stop_the_watch") {
        return;
    }
    let Some(sbx) = sbx_binary() else {
        eprintln!("skipping: examples/sbx not built");
        return;
    };
    if !Path::new("/bin/bash").exists() {
        eprintln!("skipping: bash is not installed");
        return;
    }
    // The sandbox's stderr is a pipe nobody reads, filled up first: the init must not
    // wait to write its lines, or the watched sockets would wait with it.
    let script =
        format!("head -c 65536 /dev/zero >&2; for i in 1 2 3; do {BASH_CONNECT}; done; echo done");
    let mut child = Command::new(&sbx)
        .args(["sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        let _ = tx.send(out);
    });
    let out = rx.recv_timeout(Duration::from_secs(20));
    if out.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    let out = out.expect("the sandbox stalled on its full stderr");
    assert_eq!(out, "connect 1\nconnect 1\nconnect 1\ndone\n");
    assert_eq!(status.code(), Some(0));
}
