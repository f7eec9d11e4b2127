//! `ferry oci` as a container runtime: with Docker (Debian's docker.io, a dockerd of
//! the test's own in a private mount namespace, its containers on a bridge of the
//! test's with a "remote" namespace on it) and with runc alone (bad input).
//!
//! Images are built from this machine's packages by scripts/oci-image.sh (glibc + curl:
//! the shim's case; static busybox: the TAP's). No registry is reached. dockerd runs
//! with `--iptables=false --ip-forward=false --ip-masq=false` and a bridge the test
//! makes and removes, so the host's firewall, forwarding and docker0 stay as they were;
//! it is stopped (with every container) even when a check fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{TempDir, can_run};
use serde_json::{Value, json};

/// The tests here compare the machine's ferry-oci leftovers before and after: one at a
/// time.
static SERIAL: Mutex<()> = Mutex::new(());

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
/// The lean runtime executable (`ferry oci install` registers it).
const LEAN: &str = env!("CARGO_BIN_EXE_ferry-oci");
const NET_BASE: &str = "/run/ferry-oci/net";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a container run leaves on the machine: network sides of this ferry, their
/// directories.
#[derive(Debug, PartialEq, Eq)]
struct Leftovers {
    sides: Vec<u32>,
    net_dirs: Vec<String>,
}

fn leftovers() -> Leftovers {
    let mut sides = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args.len() > 2
            && args[0] == FERRY.as_bytes()
            && args[1] == b"oci"
            && args[2] == b"_serve"
        {
            sides.push(pid);
        }
    }
    // The sandbox's init and held command are forks of a network side (same command
    // line): a side is one whose parent is not one.
    let parent = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
        after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
    };
    let all = sides.clone();
    sides.retain(|&p| parent(p).is_none_or(|pp| !all.contains(&pp)));
    let mut net_dirs: Vec<String> = std::fs::read_dir(NET_BASE)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    net_dirs.sort();
    Leftovers { sides, net_dirs }
}

/// Waits up to 3 s for the leftovers to be `before` again.
fn assert_clean(before: &Leftovers, what: &str) {
    let t = Instant::now();
    loop {
        let now = leftovers();
        if &now == before {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{what} left {now:?} (before: {before:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// ---------------------------------------------------------------------------------
// Bad input, with runc alone.

/// A bundle of the static busybox image with `runc spec`'s config, the process
/// `args`, and `edit` applied to the config.
fn bundle(dir: &Path, args: &[&str], edit: impl FnOnce(&mut Value)) -> PathBuf {
    let b = dir.join("bundle");
    let _ = std::fs::remove_dir_all(&b);
    std::fs::create_dir_all(&b).unwrap();
    let st = Command::new(script("oci-image.sh"))
        .arg("busybox")
        .arg(b.join("rootfs"))
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("runc")
        .arg("spec")
        .current_dir(&b)
        .status()
        .unwrap();
    assert!(st.success());
    let path = b.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["process"]["terminal"] = json!(false);
    spec["process"]["args"] = json!(args);
    edit(&mut spec);
    std::fs::write(&path, spec.to_string()).unwrap();
    b
}

/// `ferry oci --root ROOT ARGS…`. Its output goes through files: a created
/// container's stdio is the runtime's, and would hold pipes open until it ends.
fn oci(root: &Path, args: &[&str]) -> Output {
    let out = root.with_extension(format!("out-{}", args.len()));
    let err = root.with_extension(format!("err-{}", args.len()));
    let status = Command::new(FERRY)
        .arg("oci")
        .arg("--root")
        .arg(root)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .status()
        .unwrap();
    Output {
        status,
        stdout: std::fs::read(&out).unwrap(),
        stderr: std::fs::read(&err).unwrap(),
    }
}

/// A container id of this test process's own (runc names the cgroup after it).
fn id(tag: &str) -> String {
    format!("ferry-{tag}-{}", std::process::id())
}

fn annotate(key: &'static str, value: &'static str) -> impl FnOnce(&mut Value) {
    move |s| s["annotations"] = json!({ key: value })
}

/// A refused `create`: status 1, `want` in its error (stderr and the JSON log),
/// nothing left behind.
fn refused(dir: &Path, bundle: &Path, runtime: &[&str], want: &str) {
    let before = leftovers();
    let root = dir.join("root");
    let log = dir.join("log.json");
    let _ = std::fs::remove_file(&log);
    let mut args = runtime.to_vec();
    let b = bundle.to_str().unwrap();
    let l = log.to_str().unwrap();
    let c = id("bad");
    args.extend([
        "--log",
        l,
        "--log-format",
        "json",
        "create",
        "--bundle",
        b,
        &c,
    ]);
    let out = oci(&root, &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(want), "wanted {want:?} in: {err}");
    let line: Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
    assert_eq!(line["level"], "error");
    assert!(line["msg"].as_str().unwrap().contains(want));
    assert!(!dir.join("root.ferry").join(&c).exists(), "state left");
    assert!(!root.join(&c).exists(), "runc's state left");
    assert_clean(&before, "a refused create");
}

#[test]
fn bad_options_are_refused_clearly_and_leave_nothing() {
    if !can_run(&["runc", "busybox"]) {
        return;
    }
    let _one = serial();
    let dir = TempDir::new("oci-bad");
    let d = dir.path();
    let b = bundle(d, &["true"], annotate("ferry.bogus", "1"));
    refused(d, &b, &[], "annotation ferry.bogus: unknown ferry option");
    let b = bundle(d, &["true"], annotate("ferry.net", "wifi"));
    refused(
        d,
        &b,
        &[],
        "annotation ferry.net=wifi: invalid value 'wifi'",
    );
    let b = bundle(d, &["true"], annotate("ferry.allow", "300.1.1.1/8"));
    refused(
        d,
        &b,
        &[],
        "annotation ferry.allow=300.1.1.1/8: --allow 300.1.1.1/8",
    );
    // Auto (the default) beside ports contradicts them.
    let b = bundle(d, &["true"], annotate("ferry.publish", "8080:80"));
    refused(
        d,
        &b,
        &["--preset", "ferry.publish=auto"],
        "preset ferry.publish=auto and annotation ferry.publish=8080:80: ferry.publish is auto, none or a list of ports",
    );
    let b = bundle(d, &["true"], |s| {
        let ns = s["linux"]["namespaces"].as_array_mut().unwrap();
        ns.retain(|n| n["type"] != "network");
    });
    refused(d, &b, &[], "no network namespace");
    let b = bundle(d, &["true"], |_| {});
    // A preset is checked like an annotation.
    refused(
        d,
        &b,
        &["--preset", "ferry.spin=fast"],
        "preset ferry.spin=fast",
    );
}

#[test]
fn a_missing_runtime_a_bad_id_and_a_refused_create_leave_nothing() {
    if !can_run(&["runc", "busybox"]) {
        return;
    }
    let _one = serial();
    let dir = TempDir::new("oci-bad2");
    let d = dir.path();
    let b = bundle(d, &["true"], |_| {});
    refused(
        d,
        &b,
        &["--runtime", "/nonexistent/runc"],
        "/nonexistent/runc does not exist",
    );
    // Named by the environment; through the lean executable, which hands `create` to
    // ferry.
    let root = d.join("root");
    let out = Command::new(LEAN)
        .arg("--root")
        .arg(&root)
        .args(["create", "--bundle"])
        .arg(&b)
        .arg(id("bad"))
        .env("FERRY_OCI_RUNTIME", "/nonexistent/crun")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains("/nonexistent/crun does not exist"), "{said}");
    let out = oci(&root, &["create", "--bundle", b.to_str().unwrap(), "../x"]);
    assert!(
        text(&out.stderr).contains("invalid container id"),
        "{}",
        text(&out.stderr)
    );
    // The real runtime refuses (no such program): its status and word, nothing of
    // ferry's left (the network side had made its directories: they went with it).
    let before = leftovers();
    let b = bundle(d, &["/nonexistent"], |_| {});
    let out = oci(
        &root,
        &["create", "--bundle", b.to_str().unwrap(), &id("noexec")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("/nonexistent"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !d.join("root.ferry").join(id("noexec")).exists(),
        "state left"
    );
    assert_clean(&before, "a create the real runtime refused");
}

/// Deletes a container (`ferry oci delete --force`) on drop, so that a failed check
/// leaves none.
struct Deleted(PathBuf, String);

impl Drop for Deleted {
    fn drop(&mut self) {
        let _ = oci(&self.0, &["delete", "--force", &self.1]);
    }
}

#[test]
fn same_id_twice_is_refused_and_delete_cleans_up() {
    if !can_run(&["runc", "busybox"]) {
        return;
    }
    let _one = serial();
    let before = leftovers();
    let dir = TempDir::new("oci-twice");
    let d = dir.path();
    let root = d.join("root");
    let b = bundle(d, &["sh", "-c", "exit 3"], |_| {});
    let bs = b.to_str().unwrap();
    let c = id("twice");
    let out = oci(&root, &["create", "--bundle", bs, &c]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let _gone = Deleted(root.clone(), c.clone());
    assert!(d.join("root.ferry").join(&c).join("network.pid").exists());
    assert_eq!(
        leftovers().sides.len(),
        before.sides.len() + 1,
        "one network side"
    );
    let again = oci(&root, &["create", "--bundle", bs, &c]);
    assert_eq!(again.status.code(), Some(1));
    let said = text(&again.stderr);
    assert!(
        said.contains(&format!("container {c} already exists")),
        "{said}"
    );
    // The first is untouched: it runs, and exits with its own status.
    let state = oci(&root, &["state", &c]);
    let state: Value = serde_json::from_slice(&state.stdout).unwrap();
    assert_eq!(state["status"], "created");
    assert!(oci(&root, &["start", &c]).status.success());
    let out = oci(&root, &["delete", "--force", &c]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!d.join("root.ferry").join(&c).exists(), "state left");
    assert_clean(&before, "create + delete");
}

// ---------------------------------------------------------------------------------
// Docker.

/// The test's network: a bridge (the engine's containers and the host on it) and a
/// "remote" namespace on it too, serving HTTP.
struct Net {
    bridge: String,
    remote: String,
    prefix: String,
    _http: Option<common::Guard>,
}

impl Net {
    fn make(tag: &str, www: &Path) -> Net {
        let used = text(
            &Command::new("ip")
                .args(["-o", "-4", "addr"])
                .output()
                .unwrap()
                .stdout,
        );
        let third = (200..250)
            .find(|t| !used.contains(&format!("172.31.{t}.")))
            .expect("a free 172.31.x.0/24");
        let mut net = Net {
            bridge: format!("{tag}b"),
            remote: format!("{tag}r"),
            prefix: format!("172.31.{third}"),
            _http: None,
        };
        let ip = |args: &[&str]| {
            let st = Command::new("ip").args(args).status().unwrap();
            assert!(st.success(), "ip {args:?}");
        };
        let (b, r, p) = (net.bridge.clone(), net.remote.clone(), net.prefix.clone());
        ip(&["link", "add", &b, "type", "bridge"]);
        ip(&["addr", "add", &format!("{p}.1/24"), "dev", &b]);
        ip(&["link", "set", &b, "up"]);
        ip(&["netns", "add", &r]);
        let veth = format!("{tag}v");
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &r,
        ]);
        ip(&["link", "set", &veth, "master", &b, "up"]);
        ip(&[
            "-n",
            &r,
            "addr",
            "add",
            &format!("{p}.254/24"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &r, "link", "set", "eth0", "up"]);
        ip(&["-n", &r, "link", "set", "lo", "up"]);
        let http = Command::new("ip")
            .args([
                "netns",
                "exec",
                &r,
                "python3",
                "-m",
                "http.server",
                "8000",
                "--bind",
            ])
            .arg(net.remote_ip())
            .current_dir(www)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        net._http = Some(common::Guard(http));
        common::wait_port(net.remote_ip().parse().unwrap(), 8000);
        net
    }

    fn remote_ip(&self) -> String {
        format!("{}.254", self.prefix)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self._http = None;
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.remote])
            .status();
    }
}

/// A dockerd of the test's own (in a private mount namespace), with ferry's runtimes.
struct Docker {
    dir: PathBuf,
    daemon: Child,
}

impl Docker {
    fn start(dir: &Path, bridge: &str, remote_ip: &str) -> Docker {
        // Registered as users would: `ferry oci install --docker`, into a daemon.json
        // that has something of its own already.
        let config = dir.join("daemon.json");
        std::fs::write(&config, r#"{"debug": false}"#).unwrap();
        let deny = format!("ferry.deny={remote_ip}/32");
        for (name, preset) in [
            ("ferry", None),
            ("ferry-deny", Some(deny.as_str())),
            ("ferry-pub", Some("ferry.publish=8080:8080")),
            ("ferry-nopub", Some("ferry.publish=none")),
            ("ferry-socket", Some("ferry.net=socket")),
        ] {
            let mut c = Command::new(FERRY);
            c.arg("oci");
            if let Some(p) = preset {
                c.args(["--preset", p]);
            }
            let out = c
                .args(["install", "--docker", "--name", name, "--config"])
                .arg(&config)
                .output()
                .unwrap();
            assert!(out.status.success(), "install: {}", text(&out.stderr));
        }
        let written: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        assert_eq!(written["debug"], false);
        // The lean executable, the presets its own globals.
        assert_eq!(written["runtimes"]["ferry"], json!({"path": LEAN}));
        assert_eq!(
            written["runtimes"]["ferry-pub"]["runtimeArgs"],
            json!(["--preset", "ferry.publish=8080:8080"])
        );
        let p = |n: &str| dir.join(n).to_str().unwrap().to_owned();
        let daemon = Command::new("unshare")
            .args(["-m", "--propagation", "private", "--", "dockerd"])
            .args([
                "--data-root",
                &p("data"),
                "--exec-root",
                &p("exec"),
                "--pidfile",
                &p("pid"),
            ])
            .args([
                "-H",
                &format!("unix://{}", p("sock")),
                "--config-file",
                &p("daemon.json"),
            ])
            .args([
                "--bridge",
                bridge,
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("dockerd.log")).unwrap())
            .spawn()
            .unwrap();
        let docker = Docker {
            dir: dir.to_path_buf(),
            daemon,
        };
        let t = Instant::now();
        while !docker.cmd(&["info"]).status.success() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "dockerd did not come up"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        docker
    }

    fn command(&self) -> Command {
        let mut c = Command::new("docker");
        c.arg("-H")
            .arg(format!("unix://{}", self.dir.join("sock").display()))
            .stdin(Stdio::null());
        c
    }

    fn cmd(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    /// `docker run -d --name NAME --runtime RUNTIME EXTRA… IMAGE_AND_COMMAND…`, which
    /// must start.
    fn run_detached(&self, name: &str, runtime: &str, extra: &[&str], image_and_command: &[&str]) {
        let mut args = vec!["run", "-d", "--name", name, "--runtime", runtime];
        args.extend_from_slice(extra);
        args.extend_from_slice(image_and_command);
        let out = self.cmd(&args);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }

    fn import(&self, kind: &str) {
        let root = self.dir.join(format!("img-{kind}"));
        let sock = format!("unix://{}", self.dir.join("sock").display());
        let st = Command::new(script("oci-image.sh"))
            .args([
                kind,
                root.to_str().unwrap(),
                "docker",
                "-H",
                &sock,
                "import",
                "-",
            ])
            .arg(format!("ferry-{kind}"))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "importing {kind}");
    }

    /// `docker run --rm --runtime RUNTIME IMAGE ARGS…`.
    fn run(&self, runtime: &str, image: &str, args: &[&str]) -> Output {
        let mut all = vec!["run", "--rm", "--runtime", runtime, image];
        all.extend(args);
        self.cmd(&all)
    }

    /// The state directory of the runtime for container `id`.
    fn state(&self, id: &str) -> PathBuf {
        self.dir.join("exec/runtime-runc/moby.ferry").join(id)
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        let ids = self.cmd(&["ps", "-aq"]);
        for id in text(&ids.stdout).split_whitespace() {
            let _ = self.cmd(&["rm", "-f", id]);
        }
        ferry_sandbox::testbed::terminate(&mut self.daemon, Duration::from_secs(15));
    }
}

#[test]
fn docker_runs_containers_on_ferry() {
    if !can_run(&[
        "dockerd", "docker", "runc", "unshare", "busybox", "curl", "python3",
    ]) {
        return;
    }
    let _one = serial();
    let before = leftovers();
    let dir = TempDir::new("oci-docker");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let blob = common::pattern(3 << 20, 27);
    std::fs::write(www.join("blob"), &blob).unwrap();
    let net = Net::make(&format!("fo{}", std::process::id() % 100_000), &www);
    let docker = Docker::start(dir.path(), &net.bridge, &net.remote_ip());
    docker.import("glibc");
    docker.import("busybox");
    let url = format!("http://{}:8000/blob", net.remote_ip());

    fetches_like_native(&docker, &url, &blob);
    assert_clean(&before, "docker run --rm");
    denied_destination_refused(&docker, &url);
    exit_codes_passed_through(&docker);
    published_port_reaches_the_container(&docker);
    assert_clean(&before, "docker run --rm / rm -f");
    kill_9_in_between_leaves_nothing(&docker);
    assert_clean(&before, "kill -9 and docker rm");
    containerd_ctr_runs_with_ferry_oci(&docker, dir.path());
    assert_clean(&before, "ctr run --rm");
    if common::have("podman") {
        podman_runs_containers_on_ferry(&net, dir.path(), &url, &blob);
        assert_clean(&before, "podman run --rm");
    } else {
        eprintln!("podman: skipped (not installed; scripts/install-deps.sh installs it)");
    }
    start_up(&docker);
    drop(docker);
    drop(net);
    assert_clean(&before, "the docker test");
}

/// `ferry-oci`, a link to the lean executable (which finds ferry next to itself, not
/// the link): what engines that take one path run, at a path of the user's (`install
/// --link`).
fn ferry_oci_link(dir: &Path) -> PathBuf {
    let link = dir.join("ferry-oci");
    if !link.exists() {
        std::os::unix::fs::symlink(LEAN, &link).unwrap();
    }
    link
}

/// `ctr` on dockerd's own containerd, in the tests' namespace.
fn ctr_command(docker: &Docker) -> Command {
    let mut c = Command::new("ctr");
    c.arg("-a")
        .arg(docker.dir.join("exec/containerd/containerd.sock"))
        .args(["-n", "ferrytest"]);
    c
}

/// Docker's `ferry-busybox` image, saved and imported into containerd.
fn ctr_imports_busybox(docker: &Docker) {
    let mut save = docker.command();
    let mut save = save
        .args(["save", "ferry-busybox"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let st = ctr_command(docker)
        .args(["images", "import", "-"])
        .stdin(save.stdout.take().unwrap())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(save.wait().unwrap().success(), "docker save");
    assert!(st.success(), "ctr images import");
}

/// containerd (dockerd's own) with `ctr run --runtime io.containerd.runc.v2
/// --runc-binary ferry-oci` (the Kubernetes RuntimeClass path): a new namespace of the
/// runtime's (no path in the spec), the TAP in it, the status passed on.
fn containerd_ctr_runs_with_ferry_oci(docker: &Docker, dir: &Path) {
    let ctr = || ctr_command(docker);
    ctr_imports_busybox(docker);
    let link = ferry_oci_link(dir);
    let out = ctr()
        .args([
            "run",
            "--rm",
            "--runtime",
            "io.containerd.runc.v2",
            "--runc-binary",
        ])
        .arg(&link)
        .args([
            "docker.io/library/ferry-busybox:latest",
            &format!("ctr-{}", std::process::id()),
        ])
        .args(["sh", "-c", "grep -c eth0 /proc/net/dev; exit 5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "1", "the TAP in the container");
}

/// Podman, rootful, with its own storage and configuration, each call inside a mount
/// namespace of its own.
struct Podman {
    /// Its storage (a run root of at most 50 characters: a short scratch directory).
    store: TempDir,
    /// The configuration `ferry oci install --podman` wrote.
    conf: PathBuf,
}

impl Podman {
    fn new(dir: &Path) -> Podman {
        let conf = dir.join("containers.conf");
        let out = Command::new(FERRY)
            .args(["oci", "install", "--podman", "--config"])
            .arg(&conf)
            .arg("--link")
            .arg(ferry_oci_link(dir))
            .output()
            .unwrap();
        assert!(out.status.success(), "install: {}", text(&out.stderr));
        Podman {
            store: TempDir::new("pm"),
            conf,
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let pm = self.store.path();
        let mut c = Command::new("unshare");
        c.env("CONTAINERS_CONF", &self.conf)
            .args(["-m", "--propagation", "private", "--", "podman"])
            .arg("--root")
            .arg(pm.join("root"))
            .arg("--runroot")
            .arg(pm.join("run"))
            .args(["--storage-driver", "vfs", "--cgroup-manager", "cgroupfs"])
            .args(["--events-backend", "file"])
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Imports the rootfs the Docker test built as `ferry-KIND`.
    fn import(&self, dir: &Path, kind: &str) {
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(dir.join(format!("img-{kind}")))
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = self
            .cmd(&["import", "-", &format!("ferry-{kind}")])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(tar.wait().unwrap().success(), "tar {kind}");
        assert!(
            out.status.success(),
            "podman import {kind}: {}",
            text(&out.stderr)
        );
    }

    /// `podman run --rm --network NETNS --runtime ferry EXTRA… IMAGE CMD…`, with limits
    /// this root can set (it lacks CAP_SYS_RESOURCE: podman's defaults are above the
    /// hard limits, with runc as with ferry).
    fn run(&self, netns: &str, extra: &[&str], image: &str, cmd: &[&str]) -> Output {
        let mut args = vec!["run", "--rm", "--network", netns, "--runtime", "ferry"];
        args.extend([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ]);
        args.extend(extra);
        args.push(image);
        args.extend(cmd);
        self.cmd(&args).output().unwrap()
    }
}

/// Podman with the runtime `ferry oci install --podman` registered and `--network
/// ns:PATH`: a namespace the engine names (the CNI/Kubernetes case), annotations, the
/// shim's and the TAP's fetches, a refusal, the status.
fn podman_runs_containers_on_ferry(net: &Net, dir: &Path, url: &str, blob: &[u8]) {
    let ns = engine_netns(net, "p", 10);
    let netns = format!("ns:/run/netns/{}", ns.0);
    let podman = Podman::new(dir);
    podman.import(dir, "glibc");
    podman.import(dir, "busybox");
    let run = |extra: &[&str], image: &str, cmd: &[&str]| podman.run(&netns, extra, image, cmd);
    let shim = run(&[], "ferry-glibc", &["curl", "-sS", url]);
    assert!(shim.stdout == blob, "podman curl: {}", text(&shim.stderr));
    let tap = run(&[], "ferry-busybox", &["wget", "-O", "-", url]);
    assert!(tap.stdout == blob, "podman wget: {}", text(&tap.stderr));
    let remote = url.split('/').nth(2).unwrap().replace(":8000", "");
    let deny = format!("ferry.deny={remote}/32");
    let denied = run(
        &["--annotation", &deny],
        "ferry-glibc",
        &["curl", "-sS", url],
    );
    assert_eq!(denied.status.code(), Some(7), "{}", text(&denied.stderr));
    let bad = run(
        &["--annotation", "ferry.bogus=1"],
        "ferry-busybox",
        &["true"],
    );
    assert_ne!(bad.status.code(), Some(0));
    let said = text(&bad.stderr);
    assert!(
        said.contains("annotation ferry.bogus: unknown ferry option"),
        "{said}"
    );
    let code = run(&[], "ferry-busybox", &["sh", "-c", "exit 9"]);
    assert_eq!(code.status.code(), Some(9), "{}", text(&code.stderr));
}

/// A namespace as an engine's network plugin would make it: on the test's bridge, at
/// PREFIX.`host` (`tag` names it and its veth apart from the others').
fn engine_netns(net: &Net, tag: &str, host: u8) -> NetnsGone {
    let ns = format!("{}{tag}", net.remote);
    let veth = format!("{}{tag}", net.bridge);
    let ip = |args: &[&str]| assert!(Command::new("ip").args(args).status().unwrap().success());
    ip(&["netns", "add", &ns]);
    let gone = NetnsGone(ns.clone());
    let addr = format!("{}.{host}/24", net.prefix);
    ip(&[
        "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
    ]);
    ip(&["link", "set", &veth, "master", &net.bridge, "up"]);
    ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
    ip(&["-n", &ns, "link", "set", "eth0", "up"]);
    gone
}

/// Removes a network namespace on drop.
struct NetnsGone(String);

impl Drop for NetnsGone {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// glibc's curl (the shim) and static busybox's wget (the TAP) fetch the remote's
/// bytes, as the host does natively.
fn fetches_like_native(docker: &Docker, url: &str, blob: &[u8]) {
    let native = Command::new("curl").args(["-sS", url]).output().unwrap();
    assert_eq!(native.stdout, blob, "native fetch");
    let shim = docker.run("ferry", "ferry-glibc", &["curl", "-sS", url]);
    assert!(shim.status.success(), "{}", text(&shim.stderr));
    assert_eq!(shim.stdout.len(), blob.len());
    assert!(shim.stdout == blob, "curl through ferry: other bytes");
    let tap = docker.run("ferry", "ferry-busybox", &["wget", "-O", "-", url]);
    assert!(tap.status.success(), "{}", text(&tap.stderr));
    assert!(tap.stdout == blob, "wget through ferry's TAP: other bytes");
    // The container's processes are in ferry's sandbox network: lo and its TAP.
    let ifs = docker.run("ferry", "ferry-busybox", &["cat", "/proc/net/dev"]);
    let ifs = text(&ifs.stdout);
    assert!(ifs.contains("eth0") && ifs.contains("lo:"), "{ifs}");
    let env = docker.run(
        "ferry",
        "ferry-glibc",
        &["sh", "-c", "echo $LD_PRELOAD $FERRY_SOCKET"],
    );
    assert_eq!(
        text(&env.stdout).trim(),
        "/.ferry/libferry_preload.so /.ferry/ctl.sock"
    );
    // busybox is static: no preload.
    let env = docker.run(
        "ferry",
        "ferry-busybox",
        &["sh", "-c", "echo \"[$LD_PRELOAD]\""],
    );
    assert_eq!(text(&env.stdout).trim(), "[]");
}

/// A runtime whose preset denies the remote: refused for the shim's and the TAP's
/// programs, while the default runtime reaches it.
fn denied_destination_refused(docker: &Docker, url: &str) {
    let runc = docker.run(
        "runc",
        "ferry-glibc",
        &["curl", "-sS", "-o", "/dev/null", url],
    );
    assert!(runc.status.success(), "runc: {}", text(&runc.stderr));
    let shim = docker.run(
        "ferry-deny",
        "ferry-glibc",
        &["curl", "-sS", "--max-time", "5", url],
    );
    assert_eq!(shim.status.code(), Some(7), "curl: {}", text(&shim.stderr));
    assert!(shim.stdout.is_empty());
    let host = url.split('/').nth(2).unwrap().replace(":8000", "");
    let probe = format!("echo GET | nc -w 3 {host} 8000 && echo reached || echo refused");
    let tap = docker.run("ferry-deny", "ferry-busybox", &["sh", "-c", &probe]);
    assert_eq!(text(&tap.stdout).trim(), "refused");
    let tap = docker.run("ferry", "ferry-busybox", &["sh", "-c", &probe]);
    assert!(
        text(&tap.stdout).contains("reached"),
        "{}",
        text(&tap.stdout)
    );
}

/// The container's status, as with runc (a child killed by a signal included).
fn exit_codes_passed_through(docker: &Docker) {
    for (args, code) in [
        (&["sh", "-c", "exit 42"][..], 42),
        (&["false"][..], 1),
        (&["true"][..], 0),
        (&["sh", "-c", "exit 255"][..], 255),
        (&["sh", "-c", "sleep 5 & kill -9 $!; wait $!"][..], 137),
        (&["/nonexistent"][..], 127),
    ] {
        for runtime in ["runc", "ferry"] {
            let out = docker.run(runtime, "ferry-busybox", args);
            assert_eq!(
                out.status.code(),
                Some(code),
                "{runtime} {args:?}: {}",
                text(&out.stderr)
            );
        }
    }
}

/// Docker's `-p` arrives at the engine's namespace, where ferry publishes the
/// container's port (preset `ferry.publish`): the static busybox httpd answers.
fn published_port_reaches_the_container(docker: &Docker) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let publish = format!("127.0.0.1:{port}:8080");
    let serve = "mkdir /tmp/w && echo served-by-the-container > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w";
    let out = docker.cmd(&[
        "run",
        "-d",
        "--name",
        "web",
        "--runtime",
        "ferry-pub",
        "-p",
        &publish,
        "ferry-busybox",
        "sh",
        "-c",
        serve,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let url = format!("http://127.0.0.1:{port}/");
    let t = Instant::now();
    let body = loop {
        let got = Command::new("curl")
            .args(["-sS", "--max-time", "2", &url])
            .output()
            .unwrap();
        if got.status.success() || t.elapsed() > Duration::from_secs(10) {
            break text(&got.stdout);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let rm = docker.cmd(&["rm", "-f", "web"]);
    assert!(rm.status.success());
    assert_eq!(body.trim(), "served-by-the-container");
}

/// The network side killed (SIGKILL) under a running container, and a container's
/// first process killed: `docker rm` leaves nothing.
fn kill_9_in_between_leaves_nothing(docker: &Docker) {
    let out = docker.cmd(&[
        "run",
        "-d",
        "--runtime",
        "ferry",
        "ferry-busybox",
        "sleep",
        "60",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    // `ferry ctl` finds the container's servers by its id.
    let list = common::ferry().args(["ctl", "list"]).output().unwrap();
    assert!(
        text(&list.stdout).contains(&format!("container {id}")),
        "{}",
        text(&list.stdout)
    );
    let stats = common::ferry()
        .args(["ctl", "--run", &id[..12], "stats"])
        .output()
        .unwrap();
    assert!(
        text(&stats.stdout).contains("nic-0"),
        "{}",
        text(&stats.stderr)
    );
    let record = std::fs::read_to_string(docker.state(&id).join("network.pid")).unwrap();
    let side: i32 = record.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: kill with integer arguments.
    assert_eq!(unsafe { libc::kill(side, libc::SIGKILL) }, 0);
    let running = docker.cmd(&["inspect", "-f", "{{.State.Running}}", &id]);
    assert_eq!(text(&running.stdout).trim(), "true");
    assert!(docker.cmd(&["rm", "-f", &id]).status.success());
    assert!(!docker.state(&id).exists(), "state left");

    let out = docker.cmd(&[
        "run",
        "-d",
        "--runtime",
        "ferry",
        "ferry-busybox",
        "sleep",
        "60",
    ]);
    let id = text(&out.stdout).trim().to_owned();
    assert!(docker.cmd(&["kill", "-s", "KILL", &id]).status.success());
    let waited = docker.cmd(&["wait", &id]);
    assert_eq!(text(&waited.stdout).trim(), "137");
    assert!(docker.cmd(&["rm", &id]).status.success());
    assert!(!docker.state(&id).exists(), "state left");
}

/// `docker run --rm IMAGE true`, 5 each with runc and ferry: the medians, printed.
fn start_up(docker: &Docker) {
    let median = |runtime: &str| {
        let mut t: Vec<Duration> = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                let out = docker.run(runtime, "ferry-busybox", &["true"]);
                assert!(out.status.success(), "{}", text(&out.stderr));
                t0.elapsed()
            })
            .collect();
        t.sort();
        t[2]
    };
    let (runc, ferry) = (median("runc"), median("ferry"));
    eprintln!("docker run --rm ferry-busybox true: runc {runc:?}, ferry {ferry:?} (median of 5)");
}

// ---------------------------------------------------------------------------------
// Docker: what containers listen on, what ferry refuses, what a container cannot do.

#[test]
fn docker_publishes_listeners_logs_refusals_and_keeps_containers_in() {
    if !can_run(&[
        "dockerd", "docker", "runc", "unshare", "busybox", "curl", "python3", "nginx",
    ]) {
        return;
    }
    let _one = serial();
    let before = leftovers();
    let dir = TempDir::new("oci-docker2");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("hello"), b"hello from the remote\n").unwrap();
    let net = Net::make(&format!("fp{}", std::process::id() % 100_000), &www);
    let docker = Docker::start(dir.path(), &net.bridge, &net.remote_ip());
    docker.import("glibc");
    docker.import("busybox");
    let url = format!("http://{}:8000/hello", net.remote_ip());

    listeners_are_published_without_p(&docker);
    assert_clean(&before, "auto-published containers removed");
    refusals_reach_docker_logs(&docker, &url, &net.remote_ip());
    assert_clean(&before, "refused containers removed");
    escapes_fail_inside_a_container(&docker, &url, &net.remote_ip());
    assert_clean(&before, "probing containers removed");
    exec_gets_the_tap_under_the_policy(&docker, &url);
    assert_clean(&before, "exec'd containers removed");
    drop(docker);
    drop(net);
    assert_clean(&before, "the docker test");
}

/// `docker inspect`'s address of a container.
fn container_ip(docker: &Docker, name: &str) -> String {
    let out = docker.cmd(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        name,
    ]);
    let ip = text(&out.stdout).trim().to_owned();
    if ip.is_empty() {
        let logs = docker.cmd(&["logs", name]);
        let state = docker.cmd(&["inspect", "-f", "{{json .State}}", name]);
        panic!(
            "no address for {name}: {} {} {}",
            text(&state.stdout),
            text(&logs.stdout),
            text(&logs.stderr)
        );
    }
    ip
}

/// curl's exit status and body for `url` (2 s at most).
fn curl(url: &str) -> (Option<i32>, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "2", url])
        .output()
        .unwrap();
    (out.status.code(), text(&out.stdout))
}

/// Asks `url` until it answers (10 s at most): its body.
fn reach(url: &str) -> String {
    let t = Instant::now();
    loop {
        let (code, body) = curl(url);
        if code == Some(0) || t.elapsed() > Duration::from_secs(10) {
            assert_eq!(code, Some(0), "{url} never answered");
            return body;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `docker logs NAME` says `word` (10 s at most).
fn logs_say(docker: &Docker, name: &str, word: &str) -> String {
    let t = Instant::now();
    loop {
        let out = docker.cmd(&["logs", name]);
        let all = text(&out.stdout) + &text(&out.stderr);
        if all.contains(word) {
            return all;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{name} never said {word:?}: {all}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const NGINX: &str = "echo served-by-nginx > /tmp/index.html && \
    echo 'user root; daemon off; error_log stderr; pid /tmp/nginx.pid; events {} http { access_log off; client_body_temp_path /tmp; proxy_temp_path /tmp; fastcgi_temp_path /tmp; server { listen 80; root /tmp; } }' > /tmp/n.conf && \
    exec nginx -c /tmp/n.conf -e stderr";

/// busybox's httpd on 8080 (the TAP's case) for 8 s, one on loopback's 8082 (never
/// published), then nothing on 8080.
const HTTPD: &str = "mkdir -p /tmp/w; echo served-by-busybox > /tmp/w/index.html; \
    httpd -f -p 127.0.0.1:8082 -h /tmp/w & httpd -f -p 8080 -h /tmp/w & pid=$!; \
    echo up; sleep 8; kill $pid; echo down; sleep 60";

/// Without `-p`: nginx (the shim's) and busybox httpd (the TAP's) are reached at the
/// container's address from the host, as with runc; a loopback listener is not; a
/// port is withdrawn when its server closes; `ferry.publish=none` publishes nothing;
/// with `ferry.net=socket` (no TAP) the protocol servers publish nginx's port.
fn listeners_are_published_without_p(docker: &Docker) {
    for (name, runtime, image, cmd) in [
        ("ngx", "ferry", "ferry-glibc", NGINX),
        ("ngx-sock", "ferry-socket", "ferry-glibc", NGINX),
        ("bb", "ferry", "ferry-busybox", HTTPD),
        ("ngx-none", "ferry-nopub", "ferry-glibc", NGINX),
    ] {
        docker.run_detached(name, runtime, &[], &[image, "sh", "-c", cmd]);
    }
    for name in ["ngx", "ngx-sock"] {
        let ip = container_ip(docker, name);
        assert_eq!(
            reach(&format!("http://{ip}/")).trim(),
            "served-by-nginx",
            "{name}"
        );
    }
    let bb = container_ip(docker, "bb");
    assert_eq!(
        reach(&format!("http://{bb}:8080/")).trim(),
        "served-by-busybox"
    );
    // Nothing publishes a loopback listener: refused at once, as with runc.
    assert_eq!(curl(&format!("http://{bb}:8082/")).0, Some(7));
    // httpd ends after 4 s: its port is withdrawn (refused, not reset after a wait).
    logs_say(docker, "bb", "down");
    let t = Instant::now();
    let withdrawn = loop {
        let (code, _) = curl(&format!("http://{bb}:8080/"));
        if code == Some(7) || t.elapsed() > Duration::from_secs(3) {
            break code;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        withdrawn,
        Some(7),
        "port 8080 still published after httpd ended"
    );
    // ferry.publish=none: nginx serves inside, nothing outside.
    let none = container_ip(docker, "ngx-none");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(curl(&format!("http://{none}/")).0, Some(7));
    for name in ["ngx", "ngx-sock", "bb", "ngx-none"] {
        assert!(docker.cmd(&["rm", "-f", name]).status.success());
    }
}

/// A connection the policy refuses is said on the container's stderr — `docker logs`
/// for a detached container, `docker run`'s stderr otherwise — for the shim's curl and
/// the TAP's busybox nc alike, and in the runtime's JSON log.
fn refusals_reach_docker_logs(docker: &Docker, url: &str, remote: &str) {
    let said = format!("to {remote}:8000 denied by policy");
    let shim = docker.run(
        "ferry-deny",
        "ferry-glibc",
        &["curl", "-sS", "--max-time", "5", url],
    );
    assert_eq!(shim.status.code(), Some(7));
    let err = text(&shim.stderr);
    assert!(
        err.contains("ferry: ") && err.contains(&said),
        "docker run's stderr: {err}"
    );
    let probe = format!("echo GET | nc -w 3 {remote} 8000; echo finished; sleep 30");
    let out = docker.cmd(&[
        "run",
        "-d",
        "--name",
        "nc",
        "--runtime",
        "ferry-deny",
        "ferry-busybox",
        "sh",
        "-c",
        &probe,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    let logs = logs_say(docker, "nc", "finished");
    let line = logs
        .lines()
        .find(|l| l.starts_with("ferry: ") && l.contains(&said))
        .unwrap_or_else(|| panic!("no refusal in docker logs: {logs}"));
    assert!(line.contains("nic-0"), "{line}");
    // The runtime's log (containerd's shim gives runc --log BUNDLE/log.json).
    let log = find_file(&docker.dir.join("exec"), &id, "log.json").expect("the runtime's log");
    let json = std::fs::read_to_string(&log).unwrap();
    let entry = json
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["msg"].as_str().is_some_and(|m| m.contains(&said)))
        .unwrap_or_else(|| panic!("no refusal in {}: {json}", log.display()));
    assert_eq!(entry["level"], "warning");
    assert!(docker.cmd(&["rm", "-f", "nc"]).status.success());
}

/// A file named `name` under a directory named `id` below `root`.
fn find_file(root: &Path, id: &str, name: &str) -> Option<PathBuf> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                stack.push(p);
            } else if e.file_name() == name && d.file_name().is_some_and(|n| n == id) {
                return Some(p);
            }
        }
    }
    None
}

/// Each probe prints `NAME ok` when it worked and `NAME no` when it did not. Arguments:
/// the remote's address, a host-loopback TCP port, a host abstract socket's name.
const PROBES: &str = r#"
t() { if (eval "$2") >/dev/null 2>&1; then echo "$1 ok"; else echo "$1 no"; fi; }
t remote-tcp "timeout 5 wget -q -O - http://$1:8000/hello | grep -q remote"
t remote-raw-icmp "ping -c 1 -W 2 $1"
t host-loopback "timeout 3 wget -q -O - http://127.0.0.1:$2/"
t host-abstract "grep -q @$3 /proc/net/unix"
t unshare-net "unshare -n true"
t setns-init "nsenter -t 1 -n true"
t write-ferry-dir "echo x > /.ferry/new"
t replace-shim "echo x > /.ferry/libferry_preload.so"
t ferry-visible "cat /proc/[0-9]*/comm | grep -q ferry"
"#;

/// The security tests' escapes and bypasses, from inside `docker run --runtime ferry`:
/// a static program (no shim) and a raw ICMP socket reach the remote only where the
/// policy admits it; the host's loopback, its abstract sockets, ferry's processes and
/// the engine's namespace stay out of reach; `/.ferry` is read-only; glibc's curl with
/// the shim turned off is refused like with it; ferry's admin socket is unreachable.
fn escapes_fail_inside_a_container(docker: &Docker, url: &str, remote: &str) {
    let lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    lo.set_nonblocking(true).unwrap();
    let lo_port = lo.local_addr().unwrap().port().to_string();
    use std::os::linux::net::SocketAddrExt;
    let name = format!("ferry-probe-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let abstract_host = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    abstract_host.set_nonblocking(true).unwrap();
    let host_unix = std::fs::read_to_string("/proc/net/unix").unwrap();
    assert!(
        host_unix.contains(&format!("@{name}")),
        "the probe's own check"
    );
    let probe = |runtime: &str| {
        let args = ["sh", "-c", PROBES, "sh", remote, &lo_port, &name];
        let out = docker.run(runtime, "ferry-busybox", &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let closed = "host-loopback no\nhost-abstract no\nunshare-net no\nsetns-init no\n\
                  write-ferry-dir no\nreplace-shim no\nferry-visible no\n";
    // Admitted: the probes can succeed (the TAP carries TCP and raw ICMP).
    assert_eq!(
        probe("ferry"),
        format!("remote-tcp ok\nremote-raw-icmp ok\n{closed}")
    );
    assert_eq!(
        probe("ferry-deny"),
        format!("remote-tcp no\nremote-raw-icmp no\n{closed}")
    );
    assert!(
        lo.accept()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "a container reached the host's loopback"
    );
    assert!(
        abstract_host.accept().is_err(),
        "a container reached the host's abstract socket"
    );
    // glibc's curl without the shim goes through the TAP, under the same policy; ferry's
    // admin socket is out of reach (`ferry-attack`, mounted into the container).
    let attack = common::sandbox_exe("ferry-attack");
    let mount = format!("{}:/attack:ro", attack.display());
    let script = format!(
        "/attack admin; LD_PRELOAD= curl -sS --max-time 5 -o /dev/null {url}; echo \"no-shim $?\""
    );
    for (runtime, curl) in [("ferry", 0), ("ferry-deny", 7)] {
        let out = docker.cmd(&[
            "run",
            "--rm",
            "--runtime",
            runtime,
            "-v",
            &mount,
            "ferry-glibc",
            "sh",
            "-c",
            &script,
        ]);
        assert_eq!(
            text(&out.stdout),
            format!("admin unreachable\nno-shim {curl}\n"),
            "{runtime}: {}",
            text(&out.stderr)
        );
    }
}

/// `docker exec`: the process joins the container's namespaces, so the sandbox's
/// network (the TAP) serves it under the container's policy; it has no shim (Docker
/// gives it the image's environment, and the servers take channels only from the first
/// process's descendants).
fn exec_gets_the_tap_under_the_policy(docker: &Docker, url: &str) {
    for (runtime, code) in [("ferry", 0), ("ferry-deny", 7)] {
        docker.run_detached("ex", runtime, &[], &["ferry-glibc", "sleep", "60"]);
        let env = docker.cmd(&["exec", "ex", "sh", "-c", "echo \"[$LD_PRELOAD]\""]);
        assert_eq!(text(&env.stdout).trim(), "[]");
        let got = docker.cmd(&[
            "exec",
            "ex",
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            url,
        ]);
        assert_eq!(
            got.status.code(),
            Some(code),
            "{runtime}: {}",
            text(&got.stderr)
        );
        // The first process's environment still names the shim.
        let first = docker.cmd(&["exec", "ex", "cat", "/proc/1/environ"]);
        assert!(
            text(&first.stdout).contains("LD_PRELOAD=/.ferry/"),
            "{runtime}"
        );
        assert!(docker.cmd(&["rm", "-f", "ex"]).status.success());
    }
}

// ---------------------------------------------------------------------------------
// ferry.publish=auto's UDP ports, with each engine.

/// The Go test program (tests/go/netprobe.go) built into `dir`, static (`CGO_ENABLED=0`):
/// the TAP's case in any image, bind-mounted into the containers.
fn netprobe(dir: &Path) -> PathBuf {
    let exe = dir.join("netprobe");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go/netprobe.go");
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&exe)
        .arg(src)
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GO111MODULE", "off")
        .output()
        .unwrap();
    assert!(out.status.success(), "go build: {}", text(&out.stderr));
    exe
}

/// Sends `msg` to UDP `addr` from the host until an answer comes (20 s at most, a
/// datagram every 0.3 s): the answer, or None.
fn udp_echo(addr: &str, msg: &str, within: Duration) -> Option<String> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 512];
    while t.elapsed() < within {
        sock.send_to(msg.as_bytes(), addr).unwrap();
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            return Some(text(&buf[..n]));
        }
    }
    None
}

/// What the containers of [`engines_publish_udp_and_tcp_ports_without_p`] run:
/// netprobe's UDP echo on 5354 and its HTTP server on 8081 (static: the TAP's), for 30 s.
const PROBE_SERVERS: &str =
    "/np udpecho 0.0.0.0:5354 & /np serve 0.0.0.0:8081 served-by-go & sleep 30";

/// Without `-p`, a container's UDP receivers (socat through the shim; a static Go
/// program through the TAP) answer at its address from the host as with runc, with
/// Docker, with containerd's `ctr` (`--runc-binary ferry-oci`, the namespace a CNI
/// plugin would make) and with Podman (`--network ns:PATH`); `ferry.publish=none`
/// publishes none.
#[test]
fn engines_publish_udp_and_tcp_ports_without_p() {
    if !can_run(&[
        "dockerd", "docker", "runc", "unshare", "busybox", "curl", "python3", "socat", "go", "ctr",
    ]) {
        return;
    }
    let _one = serial();
    let before = leftovers();
    let dir = TempDir::new("oci-udp");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let net = Net::make(&format!("fu{}", std::process::id() % 100_000), &www);
    let docker = Docker::start(dir.path(), &net.bridge, &net.remote_ip());
    docker.import("glibc");
    docker.import("busybox");
    let np = netprobe(dir.path());

    docker_publishes_udp(&docker, &np);
    assert_clean(&before, "docker's UDP containers removed");
    ctr_publishes_udp_and_tcp(&docker, &net, dir.path(), &np);
    assert_clean(&before, "ctr's container removed");
    if common::have("podman") {
        podman_publishes_udp_and_tcp(&net, dir.path(), &np);
        assert_clean(&before, "podman's container removed");
    } else {
        eprintln!("podman: skipped (not installed; scripts/install-deps.sh installs it)");
    }
    drop(docker);
    drop(net);
    assert_clean(&before, "the UDP test");
}

fn docker_publishes_udp(docker: &Docker, np: &Path) {
    let mount = format!("{}:/np:ro", np.display());
    let socat = "socat UDP-RECVFROM:5353,fork EXEC:cat";
    for (name, runtime, image, cmd) in [
        ("u-shim", "ferry", "ferry-glibc", socat),
        ("u-tap", "ferry", "ferry-busybox", PROBE_SERVERS),
        ("u-none", "ferry-nopub", "ferry-busybox", PROBE_SERVERS),
    ] {
        docker.run_detached(name, runtime, &["-v", &mount], &[image, "sh", "-c", cmd]);
    }
    let long = Duration::from_secs(20);
    let shim = container_ip(docker, "u-shim");
    assert_eq!(
        udp_echo(&format!("{shim}:5353"), "via-shim", long).as_deref(),
        Some("via-shim")
    );
    let tap = container_ip(docker, "u-tap");
    assert_eq!(
        udp_echo(&format!("{tap}:5354"), "via-tap", long).as_deref(),
        Some("via-tap")
    );
    // ferry.publish=none: the same server answers nothing from outside.
    let none = container_ip(docker, "u-none");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        udp_echo(&format!("{none}:5354"), "x", Duration::from_secs(2)),
        None
    );
    for name in ["u-shim", "u-tap", "u-none"] {
        assert!(docker.cmd(&["rm", "-f", name]).status.success());
    }
}

/// [`PROBE_SERVERS`] in the container `run` (the engine's command, its stderr piped)
/// reached at `ip` from the host: UDP and TCP; then the container's end.
fn probe_servers_answer(mut run: std::process::Child, ip: &str, engine: &str) {
    let long = Duration::from_secs(20);
    let echo = udp_echo(&format!("{ip}:5354"), engine, long);
    if echo.is_none() {
        let _ = run.kill();
        let out = run.wait_with_output().unwrap();
        panic!(
            "{engine}: no UDP answer; {}: {}",
            out.status,
            text(&out.stderr)
        );
    }
    assert_eq!(echo.as_deref(), Some(engine), "{engine}: UDP");
    assert_eq!(
        reach(&format!("http://{ip}:8081/")).trim(),
        "served-by-go",
        "{engine}: TCP"
    );
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{engine} run: {}", text(&out.stderr));
}

/// `ctr run --runc-binary ferry-oci --with-ns network:PATH`: the namespace a CNI plugin
/// made (Kubernetes' case), the servers published at its address.
fn ctr_publishes_udp_and_tcp(docker: &Docker, net: &Net, dir: &Path, np: &Path) {
    let ctr = || ctr_command(docker);
    ctr_imports_busybox(docker);
    let ns = engine_netns(net, "c", 11);
    // dockerd's containerd lives in a private mount namespace made before the
    // namespace's /run/netns mount: name it by a process of its inside instead.
    let mut holder = Command::new("ip")
        .args(["netns", "exec", &ns.0, "sleep", "120"])
        .spawn()
        .unwrap();
    let path = format!("/proc/{}/ns/net", holder.id());
    let t = Instant::now();
    let ino = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).map(|m| m.ino()).ok()
    };
    while ino(&path).is_none() || ino(&path) != ino(&format!("/run/netns/{}", ns.0)) {
        assert!(t.elapsed() < Duration::from_secs(5), "ip netns exec");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mount = format!("type=bind,src={},dst=/np,options=rbind:ro", np.display());
    let run = ctr()
        .args(["run", "--rm", "--runtime", "io.containerd.runc.v2"])
        .arg("--runc-binary")
        .arg(ferry_oci_link(dir))
        .args(["--with-ns", &format!("network:{path}")])
        .args(["--mount", &mount])
        .args([
            "docker.io/library/ferry-busybox:latest",
            &format!("ctru-{}", std::process::id()),
            "sh",
            "-c",
            PROBE_SERVERS,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    probe_servers_answer(run, &format!("{}.11", net.prefix), "ctr");
    let _ = holder.kill();
    let _ = holder.wait();
    drop(ns);
}

/// Podman (`--network ns:PATH`, the runtime `ferry oci install --podman` registered).
fn podman_publishes_udp_and_tcp(net: &Net, dir: &Path, np: &Path) {
    let ns = engine_netns(net, "q", 12);
    let podman = Podman::new(dir);
    podman.import(dir, "busybox");
    let mount = format!("{}:/np:ro", np.display());
    let netns = format!("ns:/run/netns/{}", ns.0);
    let run = podman
        .cmd(&[
            "run",
            "--rm",
            "--network",
            &netns,
            "--runtime",
            "ferry",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "-v",
            &mount,
            "ferry-busybox",
            "sh",
            "-c",
            PROBE_SERVERS,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    probe_servers_answer(run, &format!("{}.12", net.prefix), "podman");
    drop(ns);
}

// ---------------------------------------------------------------------------------
// Rootless Podman's user namespace.

/// Inside rootless Podman's user namespace (`podman unshare`, where a rootless engine
/// runs its runtime), ferry is root of a namespace that maps only the user's own id
/// and its subordinate ids: its sandbox maps those (not root's ranges of the host,
/// which the kernel refuses there with EPERM), and both the TAP and the shim fetch.
#[test]
fn rootless_podmans_namespace_runs_ferry() {
    if !can_run(&["podman", "runuser", "python3"]) || !common::have_test_user() {
        return;
    }
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    if !subuid.lines().any(|l| l.starts_with("ferrytest:")) {
        eprintln!("skipped: ferrytest has no range in /etc/subuid (podman unshare needs one)");
        return;
    }
    let _one = serial();
    let bin = TempDir::new("oci-rootless-bin");
    let exe = common::ferry_for_any_user(bin.path());
    let dir = TempDir::new("oci-rootless");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("hello"), b"hello rootless\n").unwrap();
    let net = Net::make(&format!("fr{}", std::process::id() % 100_000), &www);
    let url = format!("http://{}:8000/hello", net.remote_ip());
    let user_dirs = PodmanUser::new("oci-home");
    let (home, run) = (user_dirs.home.path(), user_dirs.run.path());
    for (net_mode, fetch) in [
        ("nic", ["busybox", "wget", "-qO-"]),
        ("both", ["curl", "-sS", "--max-time"]),
    ] {
        let mut c = Command::new("runuser");
        c.args(["-u", "ferrytest", "--", "env"])
            .arg(format!("HOME={}", home.display()))
            .arg(format!("XDG_RUNTIME_DIR={}", run.display()))
            .args(["podman", "unshare"])
            .arg(&exe)
            .args(["run", "--net", net_mode, "--"])
            .args(fetch);
        if net_mode == "both" {
            c.arg("10");
        }
        let out = c.arg(&url).current_dir("/").output().unwrap();
        assert_eq!(
            text(&out.stdout),
            "hello rootless\n",
            "--net {net_mode}: {}",
            text(&out.stderr)
        );
    }
}

/// `podman --runtime ferry-oci run` as an ordinary user (rootless Podman runs its
/// runtime in its user namespace, as that namespace's root, with no `--root`: ferry's
/// state goes to `$XDG_RUNTIME_DIR/ferry-oci`, where `/run` is not writable): a static
/// busybox fetches through the TAP and glibc's curl through the shim from a remote, the
/// same bytes as with runc; an annotation's deny is refused; nothing is left behind.
#[test]
fn rootless_podman_runs_containers_on_ferry() {
    if !can_run(&["podman", "runuser", "python3", "slirp4netns"]) || !common::have_test_user() {
        return;
    }
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    if !subuid.lines().any(|l| l.starts_with("ferrytest:")) {
        eprintln!("skipped: ferrytest has no range in /etc/subuid (rootless Podman needs one)");
        return;
    }
    let _one = serial();
    let bin = TempDir::new("oci-rootless-podman-bin");
    let exe = common::ferry_for_any_user(bin.path());
    let link = bin.path().join("ferry-oci");
    std::os::unix::fs::symlink(&exe, &link).unwrap();
    let dir = TempDir::new("oci-rootless-podman");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("hello"), b"hello rootless podman\n").unwrap();
    let net = Net::make(&format!("fp{}", std::process::id() % 100_000), &www);
    let url = format!("http://{}:8000/hello", net.remote_ip());
    let user_dirs = PodmanUser::new("oci-rootless-podman-home");
    let (home, run) = (user_dirs.home.path(), user_dirs.run.path());
    let user = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["runuser", "-u", "ferrytest", "--", "env"]
            .map(String::from)
            .to_vec();
        v.push(format!("HOME={}", home.display()));
        v.push(format!("XDG_RUNTIME_DIR={}", run.display()));
        v.extend(args.iter().map(|s| s.to_string()));
        v
    };
    for kind in ["busybox", "glibc"] {
        let name = format!("ferry-{kind}");
        let st = Command::new(script("oci-image.sh"))
            .arg(kind)
            .arg(dir.path().join(format!("img-{kind}")))
            .args(user(&["podman", "import", "-", &name]))
            .current_dir("/")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "importing {kind} as ferrytest");
    }
    let podman = |runtime: Option<&Path>, args: &[&str]| -> Output {
        let mut all = vec!["podman"];
        let rt = runtime.map(|r| r.to_str().unwrap().to_owned());
        if let Some(r) = &rt {
            all.extend(["--runtime", r]);
        }
        all.extend(["run", "--rm"]);
        all.extend(args);
        let argv = user(&all);
        Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let native = podman(None, &["ferry-glibc", "curl", "-sS", "-m", "10", &url]);
    assert_eq!(
        text(&native.stdout),
        "hello rootless podman\n",
        "runc: {}",
        text(&native.stderr)
    );
    for (image, fetch) in [
        ("ferry-busybox", &["wget", "-qO-"][..]),
        ("ferry-glibc", &["curl", "-sS", "-m", "10"][..]),
    ] {
        let mut args = vec![image];
        args.extend(fetch);
        args.push(&url);
        let out = podman(Some(&link), &args);
        assert_eq!(
            out.stdout,
            native.stdout,
            "{image} through ferry: {}",
            text(&out.stderr)
        );
    }
    let deny = format!("ferry.deny={}/32", net.remote_ip());
    let out = podman(
        Some(&link),
        &[
            "--annotation",
            &deny,
            "ferry-glibc",
            "curl",
            "-sS",
            "-m",
            "10",
            &url,
        ],
    );
    assert!(!out.status.success(), "a denied fetch succeeded");
    assert!(
        text(&out.stderr).contains("denied by policy"),
        "{}",
        text(&out.stderr)
    );
    for left in ["ferry-oci/containers", "ferry-oci/net"] {
        let n = std::fs::read_dir(run.join(left)).map_or(0, |d| d.count());
        assert_eq!(n, 0, "{left} has something left");
    }
}

/// An ordinary user's directories for rootless Podman: a home, and a run directory of
/// the test's own (short, as /run/user/UID is: the control socket's path lives under
/// it), whose pause process ends when this is dropped.
struct PodmanUser {
    // (Dropped in this order: the pause process ends before its directory goes.)
    _pause: PauseGone,
    run: TempDir,
    home: TempDir,
}

impl PodmanUser {
    fn new(home: &str) -> PodmanUser {
        let home = TempDir::new(home);
        let run = TempDir::new("r");
        let owned = Command::new("chown")
            .args(["-R", "ferrytest:"])
            .arg(home.path())
            .arg(run.path())
            .status()
            .unwrap();
        assert!(owned.success());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(run.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        PodmanUser {
            _pause: PauseGone(run.path().join("libpod/tmp/pause.pid")),
            run,
            home,
        }
    }
}

/// Ends rootless Podman's pause process (it holds the user's namespace and outlives
/// every `podman` command), named by its pid file, when dropped.
struct PauseGone(PathBuf);

impl Drop for PauseGone {
    fn drop(&mut self) {
        let pid = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if let Some(pid) = pid.filter(|p| *p > 1) {
            // SAFETY: a signal to the pause process this test's podman started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
}
