//! Root's own files from root's sandbox (whose root is an unprivileged host identity):
//! the everyday cases that failed deep inside the program — a clone into a closed
//! working directory, an ssh key or a Go binary there, a toolchain under a closed
//! directory, `su` — work with `--volume`, and what stays closed is said up front. Also
//! the sandbox's own sysfs, and volumes for an ordinary user. (The attacks on volumes
//! are in security.rs.)

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A root-owned 0700 directory (what `/root` or a working directory of root's is to
/// the sandbox's root), removed on drop.
fn closed_dir(tag: &str) -> TempDir {
    let d = TempDir::new(tag);
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// `ferry run OPTS -- CMD…` from `dir`, output captured.
fn ferry_in(dir: &Path, opts: &[&str], cmd: &[&str]) -> Output {
    ferry()
        .arg("run")
        .args(opts)
        .arg("--")
        .args(cmd)
        .current_dir(dir)
        .output()
        .expect("spawn ferry")
}

fn run_ok(c: &mut Command) {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {}", text(&o));
}

/// How many lines of `o`'s stderr say the working directory is out of reach.
fn cwd_lines(o: &Output) -> usize {
    stderr(o)
        .lines()
        .filter(|l| {
            l.contains("the working directory")
                && l.contains("is not readable by the sandbox's root")
        })
        .count()
}

#[test]
fn git_clone_into_a_closed_working_directory() {
    if !can_run(&["git"]) {
        return;
    }
    let d = closed_dir("git");
    let repo = d.path().join("repo");
    run_ok(Command::new("git").args(["init", "-q"]).arg(&repo));
    run_ok(
        Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(["commit", "-q", "--allow-empty", "-m", "one"]),
    );
    let src = repo.to_str().unwrap();
    // Without a volume: refused deep inside git, but said up front, once.
    let o = ferry_in(d.path(), &[], &["git", "clone", "-q", src, "./x"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(cwd_lines(&o), 1, "{}", text(&o));
    assert!(
        stderr(&o).contains(&format!("--volume {}", d.path().display())),
        "{}",
        text(&o)
    );
    assert!(!d.path().join("x").exists());
    // The working directory shared: the clone is there, root's as if root made it.
    let o = ferry_in(
        d.path(),
        &["--volume", "."],
        &["git", "clone", "-q", src, "./x"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(cwd_lines(&o), 0, "{}", text(&o));
    let head = d.path().join("x/.git/HEAD");
    assert!(head.is_file(), "{}", text(&o));
    assert_eq!(std::fs::metadata(&head).unwrap().uid(), 0);
}

#[test]
fn an_ssh_key_in_a_closed_directory() {
    if !can_run(&["ssh-keygen"]) {
        return;
    }
    let d = closed_dir("sshkey");
    let key = d.path().join("key");
    run_ok(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key),
    );
    let public = std::fs::read_to_string(d.path().join("key.pub")).unwrap();
    let public = public.split(' ').take(2).collect::<Vec<_>>().join(" ");
    // ssh reads a private key only when it is its user's and closed to others (0600):
    // through the volume it is the sandbox's root's.
    let o = ferry_in(d.path(), &[], &["ssh-keygen", "-y", "-f", "./key"]);
    assert!(!o.status.success(), "{}", text(&o));
    let o = ferry_in(
        d.path(),
        &["--volume", ".:ro"],
        &["ssh-keygen", "-y", "-f", "./key"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with(&public),
        "{}",
        text(&o)
    );
    // A single file as a volume works too (its directory stays closed).
    let k = key.to_str().unwrap();
    let o = ferry_in(
        Path::new("/"),
        &["--volume", &format!("{k}:ro")],
        &["ssh-keygen", "-y", "-f", k],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with(&public),
        "{}",
        text(&o)
    );
}

#[test]
fn a_go_binary_in_a_closed_directory() {
    if !can_run(&["go"]) {
        return;
    }
    let d = closed_dir("gobin");
    std::fs::write(
        d.path().join("hello.go"),
        "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from go\") }\n",
    )
    .unwrap();
    let exe = d.path().join("hello");
    let build = Command::new("go")
        .args(["build", "-o"])
        .arg(&exe)
        .arg(d.path().join("hello.go"))
        .env("CGO_ENABLED", "0")
        .env("GO111MODULE", "off")
        .env("GOCACHE", std::env::temp_dir().join("ferry-test-gocache"))
        .output()
        .unwrap();
    assert!(build.status.success(), "go build: {}", text(&build));
    let exe = exe.to_str().unwrap();
    let o = ferry_in(Path::new("/"), &[], &[exe]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(
        stderr(&o).contains("the sandbox cannot run it"),
        "{}",
        text(&o)
    );
    let dir = d.path().to_str().unwrap();
    let o = ferry_in(Path::new("/"), &["--volume", &format!("{dir}:ro")], &[exe]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello from go\n");
}

#[test]
fn a_toolchain_in_a_closed_directory() {
    if !can_run(&["python3"]) {
        return;
    }
    // A virtual environment: its interpreter finds its prefix by reading pyvenv.cfg
    // beside it.
    let d = closed_dir("venv");
    let venv = d.path().join("venv");
    let made = Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .unwrap();
    if !made.status.success() {
        eprintln!(
            "skipped: python3 -m venv does not work here: {}",
            text(&made)
        );
        return;
    }
    let python = venv.join("bin/python3");
    let python = python.to_str().unwrap();
    let venv = venv.to_str().unwrap();
    let script = ["-c", "import encodings, sys; print(sys.prefix)"];
    let o = ferry_in(Path::new("/"), &[], &[&[python][..], &script].concat());
    assert!(!o.status.success(), "{}", text(&o));
    let o = ferry_in(
        Path::new("/"),
        &["--volume", &format!("{venv}:ro")],
        &[&[python][..], &script].concat(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), venv);
}

#[test]
fn pyenv_under_root() {
    // This machine's toolchain, where there is one (not on CI).
    let shim = Path::new("/root/.pyenv/shims/python3");
    if !is_root() || !shim.is_file() {
        eprintln!("skipped: no pyenv under /root");
        return;
    }
    let path = format!(
        "/root/.pyenv/shims:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    let script = "import encodings, sys; print(sys.prefix)";
    let run = |opts: &[&str]| {
        ferry()
            .arg("run")
            .args(opts)
            .args(["--", "python3", "-c", script])
            .env("PATH", &path)
            .current_dir("/")
            .output()
            .unwrap()
    };
    // Without the volume another python3 runs: said up front.
    let o = run(&[]);
    let err = stderr(&o);
    assert!(
        err.contains("python3 is /root/.pyenv/shims/python3 here")
            && err.contains("--volume /root/.pyenv:ro"),
        "{}",
        text(&o)
    );
    let o = run(&["--volume", "/root/.pyenv:ro"]);
    assert!(o.status.success(), "{}", text(&o));
    let prefix = String::from_utf8_lossy(&o.stdout);
    assert!(prefix.starts_with("/root/.pyenv/versions/"), "{}", text(&o));
    assert!(!stderr(&o).contains("cannot reach"), "{}", text(&o));
}

#[test]
fn su_to_a_system_user_works_inside() {
    if !can_run(&["su"]) {
        return;
    }
    // PAM's account check reads /etc/shadow, which the sandbox's root may not: it gets
    // a substitute without secrets. (Before: "su: Authentication failure".)
    let o = ferry_run(
        &[],
        &["su", "daemon", "-s", "/bin/sh", "-c", "id -un; id -u"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "daemon\n1\n");
    let postgres = Command::new("id")
        .arg("postgres")
        .output()
        .is_ok_and(|o| o.status.success());
    if postgres {
        let o = ferry_run(&[], &["su", "postgres", "-s", "/bin/sh", "-c", "id -un"]);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "postgres\n");
    }
    // The substitute shows no host secret and cannot be changed.
    let o = ferry_run(
        &[],
        &[
            "sh",
            "-c",
            "cut -d: -f2 /etc/shadow | sort -u; echo x >> /etc/shadow",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "*\n", "{}", text(&o));
    assert!(stderr(&o).contains("Read-only file system"), "{}", text(&o));
}

/// The sandbox's interfaces as /sys shows them, and whether `eth0` is a TAP (only tun
/// devices have `tun_flags`).
fn sys_class_net(net: &str) -> (Output, String) {
    let o = ferry_run(
        &["--net", net],
        &[
            "sh",
            "-c",
            "ls /sys/class/net | tr '\\n' ' '; [ -e /sys/class/net/eth0/tun_flags ] && echo tap; exit 0",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    (o, out)
}

#[test]
fn the_sandbox_has_its_own_sysfs() {
    if !can_run(&[]) {
        return;
    }
    let host: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let (o, out) = sys_class_net("socket");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(out, "lo", "host: {host:?}; {}", text(&o));
    let (o, out) = sys_class_net("both");
    if stderr(&o).contains("socket shim only") {
        eprintln!("skipped the TAP half: no usable TAP here");
    } else {
        assert_eq!(out, "eth0 lo tap", "host: {host:?}; {}", text(&o));
    }
    // The host's mounts below /sys are still there (cgroups).
    let host_cgroup = std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| d.count())
        .unwrap_or(0);
    let o = ferry_run(&[], &["sh", "-c", "ls /sys/fs/cgroup | wc -l"]);
    let inside: usize = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert_eq!(inside, host_cgroup, "{}", text(&o));
}

#[test]
fn where_sys_is_masked_the_hosts_stays_and_ferry_says_so() {
    if !can_run(&["unshare"]) || !Path::new("/sys/firmware").is_dir() {
        return;
    }
    // As inside a container that hides parts of /sys: the kernel refuses a fresh sysfs
    // where the existing one is not fully visible.
    let script = format!(
        "mount -t tmpfs none /sys/firmware && exec {} run --net socket -- ls /sys/class/net",
        env!("CARGO_BIN_EXE_ferry")
    );
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stderr(&o).contains("the sandbox keeps the host's /sys (its /sys/class/net lists the host's interfaces): mounting its own sysfs: Operation not permitted"),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("lo"),
        "{}",
        text(&o)
    );
}

#[test]
fn volumes_for_an_ordinary_user() {
    if !can_run(&["runuser"]) || !have_test_user() {
        return;
    }
    // The sandbox's root is the user: a volume changes nothing but :ro.
    let bin = TempDir::new("volbin");
    let exe = ferry_for_any_user(bin.path());
    let d = TempDir::new("voluser");
    let own = d.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::fs::write(own.join("f"), "kept\n").unwrap();
    run_ok(Command::new("chown").args(["-R", "ferrytest:"]).arg(&own));
    let own_s = own.to_str().unwrap();
    let ro = format!("{own_s}:ro");
    let write = format!("echo more >> '{own_s}/f' && touch '{own_s}/new'");
    let o = as_test_user(&exe, &["run", "--volume", &ro, "--", "sh", "-c", &write]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(stderr(&o).contains("Read-only file system"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(own.join("f")).unwrap(), "kept\n");
    let o = as_test_user(&exe, &["run", "--volume", own_s, "--", "sh", "-c", &write]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::metadata(own.join("new")).unwrap().uid(),
        uid_of("ferrytest")
    );
    // The same refusals, and the user's sandbox has its own sysfs too.
    let o = as_test_user(&exe, &["run", "--volume", "/etc", "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = as_test_user(
        &exe,
        &["run", "--net", "socket", "--", "ls", "/sys/class/net"],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "lo\n", "{}", text(&o));
}

fn uid_of(user: &str) -> u32 {
    let o = Command::new("id").args(["-u", user]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}
