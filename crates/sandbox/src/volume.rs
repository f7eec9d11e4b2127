//! Volumes: host paths the sandbox sees as its own ([`Spec::volumes`](crate::Spec)).
//!
//! Theory of operation. Run by root, the sandbox's root is an unprivileged host identity
//! (root's subordinate ids), so root's own files are out of its reach. A volume is an
//! *idmapped* bind mount of the path: the launcher copies the mount (`open_tree`) and
//! gives the copy the sandbox's user namespace as its id mapping (`mount_setattr`,
//! `MOUNT_ATTR_IDMAP`): there, host id k (k < 65,536) is the sandbox's id k, host root its
//! root; files the sandbox makes there are the host's root's. The init moves the copy
//! into place; nothing else changes.
//!
//! Rules. A volume is a directory or a regular file; never `/`, a system directory
//! ([`SYSTEM_DIRS`]) or anything in or above one, checked by name and by place on its
//! filesystem (a bind mount of `/etc` elsewhere is refused too). It is `nosuid,nodev`,
//! read-only with `:ro`, and the command cannot clear those flags (its own mount
//! namespace locks them); mounts below a volume are not part of it.
//!
//! Reach. A volume below a directory the sandbox's root may not search (`/root`, 0700)
//! would stay out of its reach: the init covers the topmost such directory with a
//! read-only tmpfs that holds only the way to the volumes below it (nothing under that
//! directory was reachable before, so nothing is lost).
//!
//! As an ordinary user, and with [`UserNs::Never`](crate::UserNs), the sandbox's root
//! already is the caller: a volume changes nothing but `:ro`, which makes the path
//! read-only in the sandbox (a bind mount).

use std::ffi::{CString, OsStr};
use std::fs::Metadata;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use crate::launch::IdRange;
use crate::sys;

/// The top-level directories that are never shared, nor anything in or above them: the
/// host's programs, libraries, configuration, devices, kernel interfaces and state, which
/// root trusts.
pub const SYSTEM_DIRS: [&str; 14] = [
    "bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "sys",
    "usr", "var",
];

/// At most this many volumes (the init receives them into a fixed table).
pub const MAX_VOLUMES: usize = 64;

/// A host path the sandbox sees as its own (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    path: PathBuf,
    read_only: bool,
    dir: bool,
}

/// Why a path cannot be a volume.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The path does not resolve (missing, or a component may not be searched).
    #[error("{}: {source}", path.display())]
    Resolve {
        /// The path as given.
        path: PathBuf,
        /// What resolving it said.
        #[source]
        source: io::Error,
    },
    /// `/`, a system directory, or a path in or above one.
    #[error(
        "{} is {what}: never shared (in a volume the sandbox's root is the host's root)",
        path.display()
    )]
    Refused {
        /// The path, resolved.
        path: PathBuf,
        /// What it is ("the system directory /etc", …).
        what: String,
    },
    /// A device, socket or pipe.
    #[error("{} is neither a directory nor a regular file", path.display())]
    Special {
        /// The path, resolved.
        path: PathBuf,
    },
}

impl Volume {
    /// Resolves `path` (symbolic links, `..`, relative to the working directory) and
    /// checks the rules: a directory or regular file, never `/`, a system directory, or
    /// anything in or above one.
    pub fn new(path: &Path, read_only: bool) -> Result<Self, VolumeError> {
        let resolve = |source| VolumeError::Resolve {
            path: path.to_owned(),
            source,
        };
        let full = path.canonicalize().map_err(resolve)?;
        let meta = std::fs::metadata(&full).map_err(resolve)?;
        if !meta.is_dir() && !meta.is_file() {
            return Err(VolumeError::Special { path: full });
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .map(|t| parse_mountinfo(&t))
            .unwrap_or_default();
        if let Some(what) = refusal(&full, &mounts) {
            return Err(VolumeError::Refused { path: full, what });
        }
        Ok(Self {
            path: full,
            read_only,
            dir: meta.is_dir(),
        })
    }

    /// The path, resolved.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the sandbox may only read it.
    pub fn read_only(&self) -> bool {
        self.read_only
    }
}

/// Why `path` (absolute, resolved) may not be a volume, if it may not.
fn refusal(path: &Path, mounts: &[Mount]) -> Option<String> {
    let mut parts = path.components().skip(1);
    let first = match parts.next() {
        None => return Some("the whole filesystem".into()),
        Some(Component::Normal(c)) => c.to_string_lossy(),
        Some(_) => return Some("not a resolved path".into()),
    };
    if SYSTEM_DIRS.contains(&first.as_ref()) {
        return Some(match parts.next() {
            None => "a system directory".into(),
            Some(_) => format!("inside the system directory /{first}"),
        });
    }
    // By place: the same directory as a system directory (or above or inside one) on
    // its filesystem, e.g. a bind mount of /etc elsewhere.
    let here = fs_location(mounts, path)?;
    for dir in std::iter::once("").chain(SYSTEM_DIRS) {
        let Ok(sys_dir) = Path::new("/").join(dir).canonicalize() else {
            continue;
        };
        let Some(there) = fs_location(mounts, &sys_dir) else {
            continue;
        };
        if let Some(what) = overlap(&here, &there, &sys_dir) {
            return Some(what);
        }
    }
    None
}

/// How a path at `here` overlaps the system directory `sys_dir` at `there` (both
/// (device, path inside that filesystem)).
fn overlap(here: &(String, PathBuf), there: &(String, PathBuf), sys_dir: &Path) -> Option<String> {
    if here.0 != there.0 {
        return None;
    }
    let shown = sys_dir.display();
    if there.1.starts_with(&here.1) {
        return Some(format!(
            "the place of {shown} on its filesystem, or above it (a bind mount)"
        ));
    }
    (sys_dir != Path::new("/") && here.1.starts_with(&there.1))
        .then(|| format!("inside {shown} on its filesystem (a bind mount)"))
}

/// One line of `/proc/self/mountinfo`: the filesystem's device, the directory of that
/// filesystem mounted, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mount {
    dev: String,
    root: PathBuf,
    point: PathBuf,
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let (_id, _parent, dev, root, point) =
                (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
            Some(Mount {
                dev: dev.to_owned(),
                root: unescape(root),
                point: unescape(point),
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// Where `path` (absolute, resolved) is: the device of the mount it is on (the topmost
/// of the deepest mount point above it) and its path inside that filesystem.
fn fs_location(mounts: &[Mount], path: &Path) -> Option<(String, PathBuf)> {
    let m = mounts
        .iter()
        .filter(|m| path.starts_with(&m.point))
        .max_by_key(|m| m.point.components().count())?;
    let rest = path.strip_prefix(&m.point).ok()?;
    Some((m.dev.clone(), m.root.join(rest)))
}

/// One step of the init's volume mounts, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A read-only tmpfs over `at`, a directory the sandbox's root may not search,
    /// holding only `entries` (absolute paths, in order: directories, or with `false`
    /// an empty file, the mount point of a file volume).
    Skeleton {
        at: PathBuf,
        entries: Vec<(PathBuf, bool)>,
    },
    /// The launcher's next idmapped copy of `at` (read-only if asked), moved onto `at`.
    Attach { at: PathBuf, read_only: bool },
    /// `at` made read-only (a recursive bind mount of itself).
    ReadOnly { at: PathBuf },
}

impl Step {
    /// The path the step mounts on.
    pub(crate) fn at(&self) -> &Path {
        match self {
            Self::Skeleton { at, .. } | Self::Attach { at, .. } | Self::ReadOnly { at } => at,
        }
    }
}

/// The init's steps for `volumes`: with `idmapped` (root's sandbox), an `Attach` for
/// each, under skeletons where an ancestor the sandbox's root may not `search` blocks
/// the way; otherwise a `ReadOnly` for each `:ro` one. Parents come before children.
pub(crate) fn plan(
    volumes: &[Volume],
    idmapped: bool,
    search: &dyn Fn(&Path) -> bool,
) -> Result<Vec<Step>, String> {
    let mut sorted: Vec<&Volume> = volumes.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    if let Some(w) = sorted.windows(2).find(|w| w[0].path == w[1].path) {
        return Err(format!("{} is named twice", w[0].path.display()));
    }
    if sorted.len() > MAX_VOLUMES {
        return Err(format!("at most {MAX_VOLUMES} volumes"));
    }
    if !idmapped {
        return Ok(sorted
            .iter()
            .filter(|v| v.read_only)
            .map(|v| Step::ReadOnly { at: v.path.clone() })
            .collect());
    }
    // Each volume's blocking ancestor (none inside another volume: that one is the
    // sandbox's own), and each blocked directory's entries.
    let mut skeletons: Vec<(PathBuf, Vec<(PathBuf, bool)>)> = Vec::new();
    let mut blocked_by = Vec::with_capacity(sorted.len());
    for (i, v) in sorted.iter().enumerate() {
        let inside = sorted[..i].iter().any(|o| v.path.starts_with(&o.path));
        let mut down: Vec<&Path> = v.path.ancestors().skip(1).collect();
        down.reverse();
        let block = (!inside)
            .then(|| down.into_iter().skip(1).find(|a| !search(a)))
            .flatten();
        blocked_by.push(block.map(|b| skeleton_for(&mut skeletons, b, v)));
    }
    let mut steps = Vec::new();
    let mut laid = vec![false; skeletons.len()];
    for (v, block) in sorted.iter().zip(blocked_by) {
        if let Some(k) = block
            && !std::mem::replace(&mut laid[k], true)
        {
            let (at, entries) = skeletons[k].clone();
            steps.push(Step::Skeleton { at, entries });
        }
        steps.push(Step::Attach {
            at: v.path.clone(),
            read_only: v.read_only,
        });
    }
    Ok(steps)
}

/// Adds the way from `blocked` to `v` to `blocked`'s skeleton (made if new); returns
/// the skeleton's index.
fn skeleton_for(
    skeletons: &mut Vec<(PathBuf, Vec<(PathBuf, bool)>)>,
    blocked: &Path,
    v: &Volume,
) -> usize {
    let k = match skeletons.iter().position(|(at, _)| at == blocked) {
        Some(k) => k,
        None => {
            skeletons.push((blocked.to_owned(), Vec::new()));
            skeletons.len() - 1
        }
    };
    let mut way: Vec<&Path> = v.path.ancestors().take_while(|a| *a != blocked).collect();
    way.reverse();
    let entries = &mut skeletons[k].1;
    for p in way {
        let dir = p != v.path || v.dir;
        if !entries.iter().any(|(e, _)| e == p) {
            entries.push((p.to_owned(), dir));
        }
    }
    k
}

/// A file's owner, group and mode: what decides whether the sandbox's root may use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Perm {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mode: u32,
}

impl Perm {
    /// `path`'s (symbolic links followed), if it exists.
    pub(crate) fn of(path: &Path) -> Option<Self> {
        let m: Metadata = std::fs::metadata(path).ok()?;
        Some(Self {
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode(),
        })
    }

    /// Whether it is a directory.
    pub(crate) fn dir(self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// Whether the sandbox's root (host ids `uids.base`, `gids.base`, no other groups) may
/// access a file with `perm` for `bits` (4 read, 2 write, 1 search/execute), by its
/// mode: ids both mapped into the sandbox are its root's to override.
pub(crate) fn allows(perm: Perm, uids: IdRange, gids: IdRange, bits: u32) -> bool {
    let mapped = |r: IdRange, id: u32| id >= r.base && id - r.base < r.count;
    if mapped(uids, perm.uid) && mapped(gids, perm.gid) {
        return true;
    }
    let shift = if perm.uid == uids.base {
        6
    } else if perm.gid == gids.base {
        3
    } else {
        0
    };
    (perm.mode >> shift) & bits == bits
}

/// The sandbox's copy of volume `at`: a detached copy of its mount, idmapped through
/// `userns` (the sandbox's user namespace), `nosuid,nodev`, read-only if asked.
/// Opened once, without following a last symbolic link, and checked to be `at` still:
/// a path swapped since it was checked is refused.
pub(crate) fn idmapped_copy(
    at: &Path,
    read_only: bool,
    userns: BorrowedFd<'_>,
) -> Result<OwnedFd, String> {
    let shown = at.display();
    let c = CString::new(at.as_os_str().as_bytes()).map_err(|_| format!("{shown}: NUL byte"))?;
    // SAFETY: a NUL-terminated path and integer flags.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd == -1 {
        return Err(format!("{shown}: {}", io::Error::last_os_error()));
    }
    // SAFETY: open returned a fresh fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let now = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    if now.as_deref().ok() != Some(at) {
        return Err(format!("{shown} changed while ferry started"));
    }
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32;
    let tree = sys::cvt_long(sys::open_tree(fd.as_raw_fd(), c"", flags))
        .map_err(|e| format!("{shown}: copying its mount (open_tree): {e}"))?;
    // SAFETY: open_tree returned a fresh fd that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let mut attrs = libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if read_only {
        attrs |= libc::MOUNT_ATTR_RDONLY;
    }
    let set = sys::mount_setattr(
        tree.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH as u32,
        attrs,
        Some(userns.as_raw_fd()),
    );
    sys::cvt_long(set).map_err(|e| idmap_refused(at, &e))?;
    Ok(tree)
}

/// The message for a filesystem that refused an idmapped mount.
fn idmap_refused(at: &Path, e: &io::Error) -> String {
    let shown = at.display();
    if e.raw_os_error() != Some(libc::EINVAL) {
        return format!("{shown}: idmapping its mount (mount_setattr): {e}");
    }
    // SAFETY: statfs is plain data; statfs fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let c = CString::new(at.as_os_str().as_bytes()).unwrap_or_default();
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    let fs = if unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0 {
        fs_name(st.f_type as i64)
    } else {
        "unknown".into()
    };
    format!(
        "{shown}: its filesystem ({fs}) does not support idmapped mounts on this kernel (ext4, xfs and btrfs do, tmpfs from Linux 6.3; overlay, nfs, proc and sysfs do not)"
    )
}

/// A filesystem's name from its `statfs` magic number.
fn fs_name(magic: i64) -> String {
    match magic {
        0xEF53 => "ext2/3/4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x794C_7630 => "overlay".into(),
        0x6969 => "nfs".into(),
        0xFF53_4D42 | 0xFE53_4D42 => "cifs/smb".into(),
        0x6573_5546 => "fuse".into(),
        0x0102_1997 => "9p".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0x9FA0 => "proc".into(),
        0x6265_6572 => "sysfs".into(),
        m => format!("type {m:#x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(p: &str, read_only: bool, dir: bool) -> Volume {
        Volume {
            path: p.into(),
            read_only,
            dir,
        }
    }

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
23 22 0:5 / /proc rw - proc proc rw
24 22 8:2 / /var rw - ext4 /dev/sda2 rw
25 22 8:1 /etc /srv/etc\\040copy rw - ext4 /dev/sda1 rw
26 22 8:2 /lib /srv/varlib rw - ext4 /dev/sda2 rw
27 22 8:1 / /mnt/whole rw - ext4 /dev/sda1 rw
28 22 8:3 / /srv/data rw - ext4 /dev/sdb1 rw
";

    #[test]
    fn mountinfo_places() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m[3].point, Path::new("/srv/etc copy"));
        let at = |p: &str| fs_location(&m, Path::new(p)).unwrap();
        assert_eq!(at("/etc/ssl"), ("8:1".into(), "/etc/ssl".into()));
        assert_eq!(at("/srv/etc copy/ssl"), ("8:1".into(), "/etc/ssl".into()));
        assert_eq!(at("/var/lib"), ("8:2".into(), "/lib".into()));
        assert_eq!(at("/srv/data/x"), ("8:3".into(), "/x".into()));
    }

    #[test]
    fn overlaps_by_place() {
        let loc = |d: &str, p: &str| (d.to_string(), PathBuf::from(p));
        let etc = loc("8:1", "/etc");
        // A bind mount of /etc, of something in it, of the whole disk: refused.
        assert!(overlap(&loc("8:1", "/etc"), &etc, Path::new("/etc")).is_some());
        assert!(overlap(&loc("8:1", "/etc/ssl"), &etc, Path::new("/etc")).is_some());
        assert!(overlap(&loc("8:1", "/"), &etc, Path::new("/etc")).is_some());
        // Elsewhere on the same disk, or another disk: fine.
        assert!(overlap(&loc("8:1", "/srv/x"), &etc, Path::new("/etc")).is_none());
        assert!(overlap(&loc("8:3", "/etc"), &etc, Path::new("/etc")).is_none());
        // Below / is not inside a system directory; / itself is.
        let root = loc("8:1", "/");
        assert!(overlap(&loc("8:1", "/srv/x"), &root, Path::new("/")).is_none());
        assert!(overlap(&loc("8:1", "/"), &root, Path::new("/")).is_some());
    }

    #[test]
    fn system_directories_and_root_are_refused_by_name() {
        for p in [
            "/",
            "/etc",
            "/etc/ssl",
            "/usr/local/bin",
            "/var/lib/postgresql",
            "/run/user/0",
            "/lib64",
        ] {
            assert!(refusal(Path::new(p), &[]).is_some(), "{p}");
        }
        for p in [
            "/srv/app",
            "/root/work",
            "/home/u",
            "/tmp/x",
            "/opt/tool",
            "/usrlocal",
        ] {
            assert!(refusal(Path::new(p), &[]).is_none(), "{p}");
        }
        assert_eq!(
            refusal(Path::new("/etc"), &[]).as_deref(),
            Some("a system directory")
        );
    }

    #[test]
    fn plans_put_skeletons_over_blocked_directories() {
        // /root may not be searched; /srv may.
        let search = |p: &Path| !p.starts_with("/root") || p.starts_with("/root/open");
        let vols = [
            vol("/srv/app", false, true),
            vol("/root/work/key", true, false),
            vol("/root/.pyenv", true, true),
            vol("/root/.pyenv/versions/x", false, true),
        ];
        let steps = plan(&vols, true, &search).unwrap();
        let p = PathBuf::from;
        assert_eq!(
            steps,
            vec![
                Step::Skeleton {
                    at: p("/root"),
                    entries: vec![
                        (p("/root/.pyenv"), true),
                        (p("/root/work"), true),
                        (p("/root/work/key"), false)
                    ],
                },
                Step::Attach {
                    at: p("/root/.pyenv"),
                    read_only: true
                },
                // Inside a volume: no skeleton of its own.
                Step::Attach {
                    at: p("/root/.pyenv/versions/x"),
                    read_only: false
                },
                Step::Attach {
                    at: p("/root/work/key"),
                    read_only: true
                },
                Step::Attach {
                    at: p("/srv/app"),
                    read_only: false
                },
            ]
        );
        // Not idmapped: only the read-only ones, as bind mounts.
        assert_eq!(
            plan(&vols, false, &search).unwrap(),
            vec![
                Step::ReadOnly {
                    at: p("/root/.pyenv")
                },
                Step::ReadOnly {
                    at: p("/root/work/key")
                },
            ]
        );
        let twice = [vol("/srv/a", false, true), vol("/srv/a", true, true)];
        assert!(plan(&twice, true, &search).unwrap_err().contains("twice"));
    }

    #[test]
    fn mode_bits_for_the_sandboxs_root() {
        let ids = (
            IdRange {
                base: 1000,
                count: 10,
            },
            IdRange {
                base: 2000,
                count: 10,
            },
        );
        let ok = |uid, gid, mode, bits| allows(Perm { uid, gid, mode }, ids.0, ids.1, bits);
        // Root's 0700 directory: no; 0701: search only; 0750 of its group: no.
        assert!(!ok(0, 0, 0o700, 1));
        assert!(ok(0, 0, 0o701, 1));
        assert!(!ok(0, 0, 0o701, 4));
        assert!(!ok(0, 0, 0o750, 1));
        // Its own (as owner, as group).
        assert!(ok(1000, 0, 0o700, 7));
        assert!(!ok(1000, 0, 0o000, 1));
        assert!(ok(0, 2000, 0o050, 5));
        // Owned by ids mapped into the sandbox: its root overrides.
        assert!(ok(1005, 2003, 0o000, 7));
        assert!(!ok(1005, 0, 0o000, 1));
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape("/a\\040b\\134c"), Path::new("/a b\\c"));
        assert_eq!(unescape("/a\\0x"), Path::new("/a\\0x"));
    }
}
