//! A container's state directory and the record of its network side.
//!
//! The directory is `<root>.ferry/<id>` beside the real runtime's `--root` (so that
//! engines with their own roots never meet), or [`default_base`]`/<id>`. It holds the
//! rewritten bundle, the sandbox's directory (mounted into the container), the network
//! side's log and its record ([`Record`]); `delete` removes it.

use std::path::{Path, PathBuf};

/// Where state lives without `--root`, and the network sides' directories: under
/// `/run/ferry-oci`, or, in a user namespace of an ordinary user (a rootless engine runs
/// its runtime there, as root of a namespace that may not write `/run`), under
/// `$XDG_RUNTIME_DIR/ferry-oci` (as runc's rootless default is `$XDG_RUNTIME_DIR/runc`).
pub fn base() -> &'static Path {
    static BASE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let uid_map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if rootless(&uid_map) && !d.is_empty() => PathBuf::from(d).join("ferry-oci"),
            _ => PathBuf::from("/run/ferry-oci"),
        }
    })
}

/// Whether `uid_map` (`/proc/self/uid_map`) is a user namespace's that does not map
/// the host's root (the initial namespace maps all ids from 0).
pub fn rootless(uid_map: &str) -> bool {
    !uid_map.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 3 && f[1] == "0"
    })
}

/// Where state lives without `--root`: [`base`]`/containers`.
pub fn default_base() -> PathBuf {
    base().join("containers")
}

/// Where the network sides make their run's directories: [`base`]`/net` (the control
/// socket's path must be short: a container id alone is 64 characters).
pub fn net_base() -> PathBuf {
    base().join("net")
}

/// The real runtime's state without `--root`: runc's default, `/run/runc`, or rootless
/// `$XDG_RUNTIME_DIR/runc`.
pub fn runtime_default_root() -> PathBuf {
    match base().parent() {
        Some(p) if p != Path::new("/run") => p.join("runc"),
        _ => PathBuf::from("/run/runc"),
    }
}

/// The run's directories of a network side whose sandbox directory is `sandbox` (as
/// it said), if that is one a network side makes: `net_base()/ferry-…` and
/// `net_base()/ferry-….sandbox`. Anything else is `None` (never removed).
pub fn net_dirs(sandbox: &Path) -> Option<[PathBuf; 2]> {
    let name = sandbox.file_name()?.to_str()?;
    let stem = name.strip_suffix(".sandbox")?;
    let plain = stem.starts_with("ferry-")
        && stem[6..].bytes().all(|b| b.is_ascii_digit() || b == b'-')
        && sandbox.parent() == Some(net_base().as_path());
    plain.then(|| [sandbox.with_extension(""), sandbox.to_path_buf()])
}

/// A container id runc would refuse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid container id {0:?}: expected 1–1024 characters of letters, digits, '_', '+', '-' and '.', not \".\" or \"..\""
)]
pub struct IdError(pub String);

/// Checks a container id as runc does.
pub fn check_id(id: &str) -> Result<(), IdError> {
    let ok = !id.is_empty()
        && id.len() <= 1024
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(IdError(id.to_owned()))
    }
}

/// The state directory of container `id` (checked) under the runtime's `root`.
pub fn dir(root: Option<&Path>, id: &str) -> PathBuf {
    let base = match root {
        Some(r) => {
            let mut s = r.as_os_str().to_owned();
            s.push(".ferry");
            PathBuf::from(s)
        }
        None => default_base(),
    };
    base.join(id)
}

/// The network side's process: its pid and start time (`/proc/PID/stat` field 22),
/// so that a pid the kernel gave to another process since is never signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Its pid.
    pub pid: u32,
    /// Its start time in clock ticks after boot.
    pub start: u64,
}

impl Record {
    /// The file's text.
    pub fn encode(&self) -> String {
        format!("{} {}\n", self.pid, self.start)
    }

    /// Parses [`Record::encode`]'s text.
    pub fn decode(text: &str) -> Option<Record> {
        let mut it = text.split_whitespace();
        let rec = Record {
            pid: it.next()?.parse().ok()?,
            start: it.next()?.parse().ok()?,
        };
        (it.next().is_none() && rec.pid > 1).then_some(rec)
    }

    /// Whether the process is still the one recorded.
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
}

/// A process's start time, from `/proc/PID/stat`.
pub fn start_time(pid: u32) -> Option<u64> {
    parse_start(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 of a `/proc/PID/stat` line (the name in parentheses may hold anything).
fn parse_start(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The network side's record ([`Record`]) in the container's state directory.
pub const RECORD: &str = "network.pid";
/// The sandbox's directory the network side made (removed by `delete` if it could not).
pub const NET_DIR: &str = "network.dir";
/// The network side's word to `start` ([`crate::side::Pending`]): locked by it from
/// "ready" until it serves, then holding "serving".
pub const SERVING: &str = "network.serving";

/// Whether the network side recorded in `dir` still runs (false without a record).
pub fn side_alive(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(RECORD))
        .ok()
        .and_then(|t| Record::decode(&t))
        .is_some_and(|r| r.alive())
}

/// Stops the network side of the container whose state is in `dir`, if it still runs
/// (SIGTERM: its sandbox ends, its servers drain; SIGKILL after a second), and removes
/// the directories it made if it could not.
pub fn stop_side(dir: &Path) {
    signal_out(dir);
    let made = std::fs::read_to_string(dir.join(NET_DIR)).ok();
    for d in made
        .and_then(|m| net_dirs(Path::new(m.trim())))
        .into_iter()
        .flatten()
    {
        remove(&d);
    }
}

fn signal_out(dir: &Path) {
    use crate::sys;
    use std::os::fd::AsFd;
    let Some(rec) = std::fs::read_to_string(dir.join(RECORD))
        .ok()
        .and_then(|t| Record::decode(&t))
    else {
        return;
    };
    let Ok(pidfd) = sys::pidfd_open(rec.pid) else {
        return;
    };
    // Checked after the pidfd is open: it then names the recorded process or none.
    if !rec.alive() {
        return;
    }
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        if sys::pidfd_signal(pidfd.as_fd(), sig).is_err() {
            return;
        }
        let second = Some(std::time::Duration::from_secs(1));
        if let Ok(Some(_)) = sys::wait_any(&[pidfd.as_fd()], second) {
            return;
        }
    }
}

/// Removes a container's state directory or a network side's directory (made by ferry;
/// never a mount point); says so on stderr if it cannot.
pub fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        eprintln!("ferry oci: cannot remove {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["a", "abc-1.2_x+y", &"f".repeat(64)] {
            assert_eq!(check_id(ok), Ok(()));
        }
        for bad in ["", ".", "..", "a/b", "a b", "../x", &"f".repeat(1025)] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dirs() {
        assert_eq!(
            dir(Some(Path::new("/run/docker/runtime-runc/moby")), "c1"),
            PathBuf::from("/run/docker/runtime-runc/moby.ferry/c1")
        );
        assert_eq!(
            dir(None, "net"),
            PathBuf::from("/run/ferry-oci/containers/net")
        );
    }

    #[test]
    fn a_namespace_that_does_not_map_the_hosts_root_is_rootless() {
        assert!(!rootless("         0          0 4294967295\n"));
        // A rootless engine's namespace: its root is the user, the rest subordinate ids.
        assert!(rootless(
            "         0       1001          1\n         1     100000      65536\n"
        ));
        // Root's sandbox namespace maps host root too (`--userns never` aside).
        assert!(!rootless("0 0 1\n1 2000000000 65536\n"));
    }

    #[test]
    fn only_network_sides_dirs_are_named_for_removal() {
        let ok = Path::new("/run/ferry-oci/net/ferry-12-345.sandbox");
        assert_eq!(
            net_dirs(ok),
            Some([
                PathBuf::from("/run/ferry-oci/net/ferry-12-345"),
                ok.to_path_buf()
            ])
        );
        for bad in [
            "/run/ferry-oci/net/ferry-12-345",
            "/etc.sandbox",
            "/run/ferry-oci/net/../ferry-1.sandbox",
            "/run/ferry-oci/ferry-1-2.sandbox",
            "/run/ferry-oci/net/ferry-1/x.sandbox",
        ] {
            assert_eq!(net_dirs(Path::new(bad)), None, "{bad}");
        }
    }

    #[test]
    fn records() {
        let r = Record {
            pid: 42,
            start: 12345,
        };
        assert_eq!(Record::decode(&r.encode()), Some(r));
        assert_eq!(Record::decode("1 5"), None);
        assert_eq!(Record::decode("42"), None);
        assert_eq!(Record::decode("42 5 6"), None);
        let me = std::process::id();
        let mine = Record {
            pid: me,
            start: start_time(me).unwrap(),
        };
        assert!(mine.alive());
        assert!(
            !Record {
                start: mine.start + 1,
                ..mine
            }
            .alive()
        );
    }

    #[test]
    fn stat_with_odd_names() {
        let line = "7 (a) b) c) S 1 7 7 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987 0 0";
        assert_eq!(parse_start(line), Some(987));
        assert_eq!(parse_start("garbage"), None);
    }
}
