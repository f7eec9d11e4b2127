//! A "remote host" for tests and benchmarks: a named network namespace joined to the
//! host namespace by veth pairs. Root only; uses the `ip` binary (iproute2).
//!
//! The caller picks the namespace name and the addresses (so parallel tests can use
//! disjoint subnets); [`free_subnet`] picks an unused /30 for callers that do not care.
//! Interface names derive from the namespace name. Everything is deleted on drop.
//! [`terminate`] ends a daemon the caller started (dockerd, for tests and C1).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use tracing::{debug, warn};

/// Ends `child` (a daemon the caller started and has not reaped): SIGTERM, up to `grace`
/// for it to exit, then SIGKILL; reaped either way.
pub fn terminate(child: &mut Child, grace: std::time::Duration) {
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped, so its
    // pid is not reused.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let t = std::time::Instant::now();
    while t.elapsed() < grace {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Whether the effective uid is 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// One veth pair between the host and the remote namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    /// Interface name on the host side.
    pub host_if: String,
    /// Interface name inside the remote namespace.
    pub remote_if: String,
    /// Address of the host side.
    pub host_ip: Ipv4Addr,
    /// Address of the remote side.
    pub remote_ip: Ipv4Addr,
}

/// A network namespace `name` reachable from the host over one or more veth pairs.
#[derive(Debug)]
pub struct Remote {
    name: String,
    prefix: u8,
    /// `/run/netns/NAME`, for `setns`.
    netns: File,
    paths: Vec<Path>,
}

impl Remote {
    /// Creates namespace `name` (it must not exist) with `lo` up and one veth pair:
    /// `host_ip/prefix` on the host side, `remote_ip/prefix` on the remote side, both up.
    pub fn create(
        name: &str,
        host_ip: Ipv4Addr,
        remote_ip: Ipv4Addr,
        prefix: u8,
    ) -> io::Result<Remote> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid namespace name {name:?}"),
            ));
        }
        let file = format!("/run/netns/{name}");
        if std::path::Path::new(&file).exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("network namespace {name} already exists"),
            ));
        }
        ip(&["netns", "add", name])?;
        let netns = match File::open(&file) {
            Ok(f) => f,
            Err(e) => {
                let _ = ip(&["netns", "del", name]);
                return Err(e);
            }
        };
        let mut remote = Remote {
            name: name.to_owned(),
            prefix,
            netns,
            paths: Vec::new(),
        };
        // From here on, Drop cleans up whatever was created.
        remote.ip_in(&["link", "set", "lo", "up"])?;
        remote.add_path(host_ip, remote_ip)?;
        debug!(name, %host_ip, %remote_ip, prefix, "remote namespace created");
        Ok(remote)
    }

    /// Adds another veth pair (same prefix length as the first), e.g. a second path
    /// for egress bonding tests. The addresses should be in a subnet of their own.
    pub fn add_path(&mut self, host_ip: Ipv4Addr, remote_ip: Ipv4Addr) -> io::Result<&Path> {
        let tag = if_tag(&self.name);
        let index = self.paths.len();
        let path = Path {
            host_if: format!("fh{tag}{index}"),
            remote_if: format!("fr{tag}{index}"),
            host_ip,
            remote_ip,
        };
        ip(&[
            "link",
            "add",
            &path.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &path.remote_if,
            "netns",
            &self.name,
        ])?;
        // Recorded right away so that Drop deletes it if what follows fails.
        self.paths.push(path.clone());
        let host_cidr = format!("{}/{}", path.host_ip, self.prefix);
        let remote_cidr = format!("{}/{}", path.remote_ip, self.prefix);
        ip(&["addr", "add", &host_cidr, "dev", &path.host_if])?;
        ip(&["link", "set", &path.host_if, "up"])?;
        self.ip_in(&["addr", "add", &remote_cidr, "dev", &path.remote_if])?;
        self.ip_in(&["link", "set", &path.remote_if, "up"])?;
        Ok(&self.paths[index])
    }

    /// The namespace's name (as in `ip netns exec NAME`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The veth pairs, in the order they were added.
    pub fn paths(&self) -> &[Path] {
        &self.paths
    }

    /// Host-side address of the first path.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.paths[0].host_ip
    }

    /// Remote-side address of the first path.
    pub fn remote_ip(&self) -> Ipv4Addr {
        self.paths[0].remote_ip
    }

    /// Spawns `cmd` inside the namespace (it `setns`es before `exec`; the network
    /// namespace only, so `/sys/class/net` still shows the host — use
    /// [`command`](Self::command) when that matters). Adds a `pre_exec` hook to `cmd`.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<Child> {
        let path = CString::new(format!("/run/netns/{}", self.name))?;
        // SAFETY: the hook only makes async-signal-safe syscalls (open, setns, close)
        // on a string allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd == -1 {
                    return Err(io::Error::last_os_error());
                }
                let ret = libc::setns(fd, libc::CLONE_NEWNET);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if ret == -1 { Err(err) } else { Ok(()) }
            });
        }
        cmd.spawn()
    }

    /// `ip netns exec NAME program`: runs with `/sys` remounted for the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(ip_binary());
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `f` on a short-lived thread that has joined the namespace: sockets it
    /// creates (e.g. a `TcpListener` on [`remote_ip`](Self::remote_ip)) live there for
    /// good and can be used from any thread afterwards.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        let fd = self.netns.as_raw_fd();
        std::thread::scope(|scope| {
            let worker = scope.spawn(move || {
                // SAFETY: fd is a namespace file kept open by self for the whole scope;
                // setns changes only this thread's network namespace.
                if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            });
            worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn ip_in(&self, args: &[&str]) -> io::Result<()> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        ip(&full)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // Deleting the host ends first is synchronous; namespace teardown is not.
        for path in &self.paths {
            if let Err(e) = ip(&["link", "del", &path.host_if]) {
                warn!(name = %self.name, host_if = %path.host_if, error = %e, "deleting veth");
            }
        }
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            warn!(name = %self.name, error = %e, "deleting network namespace");
        }
    }
}

/// Picks a /30 in 10.111.0.0/16 that no host interface uses yet and that this process
/// has not handed out before: returns (host address, remote address), prefix 30.
/// Another process may pick the same one at the same moment; tests that run in
/// several processes at once should choose their subnets themselves.
pub fn free_subnet() -> io::Result<(Ipv4Addr, Ipv4Addr)> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let out = Command::new(ip_binary())
        .args(["-o", "-4", "addr", "show"])
        .stderr(Stdio::inherit())
        .output()?;
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    // Start at a pid-dependent block so that concurrent test binaries spread out.
    let start = std::process::id() % 16384;
    for _ in 0..16384 {
        let block = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % 16384;
        let base = u32::from(Ipv4Addr::new(10, 111, 0, 0)) + block * 4;
        let (host, remote) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
        let taken = |a: Ipv4Addr| used.contains(&format!(" {a}/"));
        if !taken(host) && !taken(remote) {
            return Ok((host, remote));
        }
    }
    Err(io::Error::other("no free /30 left in 10.111.0.0/16"))
}

/// Runs `ip ARGS…`, turning a non-zero exit into an error carrying its stderr.
fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new(ip_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// `ip` from PATH, or from the sbin directories that are not always in it.
fn ip_binary() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("ip")
}

/// 8 hex digits derived from the namespace name (FNV-1a), so that interface names
/// (at most 15 bytes) are unique per namespace: `fh<tag><n>` / `fr<tag><n>`.
fn if_tag(name: &str) -> String {
    let hash = name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_fit() {
        let tag = if_tag("a-rather-long-namespace-name-for-tests");
        assert_eq!(tag.len(), 8);
        assert!(format!("fh{tag}9").len() <= 15);
        assert_ne!(if_tag("a"), if_tag("b"));
    }
}
