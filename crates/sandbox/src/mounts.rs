//! The sandbox's own mounts besides `/proc`: its sysfs, root's substitute `/etc/shadow`
//! and the volumes (volume.rs). The launcher prepares them ([`Mounts`], C strings
//! only); the init makes them, async-signal-safely (see init.rs), in its mount namespace
//! before the command's is copied from it (which locks them for the command).
//!
//! - **sysfs.** A fresh sysfs on `/sys`, mounted from the sandbox's network namespace,
//!   shows that namespace's interfaces (`/sys/class/net`: `lo`, and `eth0` in nic mode),
//!   not the host's. The mounts the host has directly below `/sys` (`/sys/fs/cgroup`,
//!   with what is below them) are copied back on top. The kernel allows this only to a
//!   process with `CAP_SYS_ADMIN` over the namespace's owner, and not where parts of the
//!   host's `/sys` are hidden (some containers): then the sandbox keeps the host's
//!   `/sys`, and the launcher says so.
//! - **`/etc/shadow`.** Run by root, the sandbox's root may not read the host's
//!   `/etc/shadow`, and PAM's account check then fails every `su USER` inside
//!   ("Authentication failure"). The sandbox gets a read-only substitute: every user
//!   of `/etc/passwd` with no password (`*`) and no ageing, so `su` from the sandbox's
//!   root works and no host secret is shown.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libc::c_int;

use crate::sys::{self, errno};
use crate::volume::Step;

/// At most this many mounts below `/sys` are kept (copied back over the fresh sysfs).
const MAX_SYS_KEPT: usize = 16;

/// What the init mounts, prepared by the launcher so that the init allocates nothing.
#[derive(Default)]
pub(crate) struct Mounts {
    /// The volume steps (volume.rs), in order.
    pub(crate) steps: Vec<InitStep>,
    /// The substitute `/etc/shadow`, when the sandbox is root's.
    pub(crate) shadow: Option<Shadow>,
    /// The mount points directly below `/sys` to keep.
    pub(crate) sys_kept: Vec<CString>,
}

/// A volume step with its paths as C strings.
pub(crate) enum InitStep {
    Skeleton {
        at: CString,
        entries: Vec<(CString, bool)>,
    },
    Attach {
        at: CString,
    },
    ReadOnly {
        at: CString,
    },
}

/// The substitute `/etc/shadow`.
pub(crate) struct Shadow {
    text: Vec<u8>,
    gid: u32,
}

/// C strings for `steps`; `None` if a path holds a NUL byte (it cannot: they are
/// resolved paths of the host).
pub(crate) fn init_steps(steps: &[Step]) -> Option<Vec<InitStep>> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).ok();
    steps
        .iter()
        .map(|s| {
            Some(match s {
                Step::Skeleton { at, entries } => InitStep::Skeleton {
                    at: c(at)?,
                    entries: entries
                        .iter()
                        .map(|(p, dir)| Some((c(p)?, *dir)))
                        .collect::<Option<_>>()?,
                },
                Step::Attach { at, .. } => InitStep::Attach { at: c(at)? },
                Step::ReadOnly { at } => InitStep::ReadOnly { at: c(at)? },
            })
        })
        .collect()
}

/// The substitute for `/etc/shadow` (when the host has one): the users of `passwd`,
/// each with no password and no ageing; group `gid` when the sandbox has it (`gids`
/// ids are mapped), else root.
pub(crate) fn shadow(passwd: &str, gid: u32, gids: u32) -> Shadow {
    let mut text = Vec::new();
    for name in passwd.lines().filter_map(|l| l.split(':').next()) {
        if name.is_empty() || name.starts_with('#') || name.starts_with(['+', '-']) {
            continue;
        }
        text.extend_from_slice(name.as_bytes());
        text.extend_from_slice(b":*:::::::\n");
    }
    Shadow {
        text,
        gid: if gid < gids { gid } else { 0 },
    }
}

/// The mount points directly below the topmost mount on `/sys`, from `mountinfo`.
pub(crate) fn sys_children(mountinfo: &str) -> Vec<PathBuf> {
    let fields = |l: &str| {
        let mut f = l.split(' ');
        Some((
            f.next()?.to_owned(),
            f.next()?.to_owned(),
            f.nth(2)?.to_owned(),
        ))
    };
    let lines: Vec<_> = mountinfo.lines().filter_map(fields).collect();
    let Some(sys) = lines.iter().rev().find(|(_, _, p)| p == "/sys") else {
        return Vec::new();
    };
    lines
        .iter()
        .filter(|(_, parent, p)| *parent == sys.0 && p.starts_with("/sys/") && !p.contains('\\'))
        .map(|(_, _, p)| PathBuf::from(p))
        .take(MAX_SYS_KEPT)
        .collect()
}

/// In the init: a fresh sysfs on `/sys` (see the module's documentation), with the
/// `kept` mounts copied back. Returns the errno of a refused sysfs (the host's `/sys`
/// then stays).
pub(crate) fn own_sysfs(kept: &[CString]) -> Result<(), c_int> {
    let mut copies: [RawFd; MAX_SYS_KEPT] = [-1; MAX_SYS_KEPT];
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as u32;
    for (slot, path) in copies.iter_mut().zip(kept) {
        *slot = sys::open_tree(libc::AT_FDCWD, path, flags) as RawFd;
    }
    // SAFETY: mount(2) with NUL-terminated literals and null data.
    let mounted = unsafe {
        libc::mount(
            c"sysfs".as_ptr(),
            c"/sys".as_ptr(),
            c"sysfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY,
            std::ptr::null(),
        )
    };
    let e = errno();
    for (fd, path) in copies.iter().zip(kept) {
        if *fd >= 0 {
            if mounted == 0 {
                // Best effort: a kept mount that cannot go back is missing, no more.
                sys::move_mount(*fd, path);
            }
            // SAFETY: our copy's descriptor.
            unsafe { libc::close(*fd) };
        }
    }
    if mounted == 0 { Ok(()) } else { Err(e) }
}

/// In the init, before the sandbox's `/proc` is mounted: the substitute `/etc/shadow`,
/// made on a tmpfs briefly mounted on `/proc` (a directory every system has, covered
/// next anyway), bound read-only over `/etc/shadow`; the tmpfs is then unmounted (the
/// bound file keeps it). Returns an errno.
pub(crate) fn fake_shadow(shadow: &Shadow) -> Result<(), c_int> {
    // SAFETY: mount(2) with NUL-terminated literals.
    let scratch = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            c"/proc".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if scratch == -1 {
        return Err(errno());
    }
    let made = write_shadow(shadow).and_then(|()| {
        // SAFETY: mount(2) with NUL-terminated literals and null data.
        let bound = unsafe {
            libc::mount(
                c"/proc/shadow".as_ptr(),
                c"/etc/shadow".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        if bound == -1 {
            return Err(errno());
        }
        let ro = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
        // SAFETY: as above.
        let sealed = unsafe {
            libc::mount(
                std::ptr::null(),
                c"/etc/shadow".as_ptr(),
                std::ptr::null(),
                ro | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            )
        };
        if sealed == -1 { Err(errno()) } else { Ok(()) }
    });
    // SAFETY: a NUL-terminated literal; our own tmpfs.
    unsafe { libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH) };
    made
}

fn write_shadow(shadow: &Shadow) -> Result<(), c_int> {
    // SAFETY: a NUL-terminated literal path and integer flags.
    let fd = unsafe {
        libc::open(
            c"/proc/shadow".as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o640,
        )
    };
    if fd == -1 {
        return Err(errno());
    }
    let mut rest = &shadow.text[..];
    let mut result = Ok(());
    while !rest.is_empty() {
        // SAFETY: rest is a valid buffer of its length.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            result = Err(errno());
            break;
        }
        rest = &rest[n as usize..];
    }
    // SAFETY: fchown with integer arguments on our fd.
    if result.is_ok() && unsafe { libc::fchown(fd, 0, shadow.gid) } == -1 {
        result = Err(errno());
    }
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    result
}

/// In the init: the volume steps, `trees` holding the launcher's idmapped copies in
/// the order of the `Attach` steps. Returns the failed step's index and errno.
pub(crate) fn volumes(steps: &[InitStep], trees: &[RawFd]) -> Result<(), (usize, c_int)> {
    let mut next = 0;
    for (i, step) in steps.iter().enumerate() {
        let done = match step {
            InitStep::Skeleton { at, entries } => skeleton(at, entries),
            InitStep::Attach { at } => match trees.get(next) {
                Some(&tree) => {
                    next += 1;
                    let moved = sys::move_mount(tree, at);
                    let e = errno();
                    // SAFETY: the copy's descriptor, no longer needed once attached.
                    unsafe { libc::close(tree) };
                    if moved == -1 { Err(e) } else { Ok(()) }
                }
                _ => Err(libc::EBADF),
            },
            InitStep::ReadOnly { at } => read_only(at),
        };
        done.map_err(|e| (i, e))?;
    }
    Ok(())
}

/// A read-only tmpfs over `at` holding only `entries`.
fn skeleton(at: &CString, entries: &[(CString, bool)]) -> Result<(), c_int> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: mount(2) with NUL-terminated strings.
    let mounted = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            at.as_ptr(),
            c"tmpfs".as_ptr(),
            flags,
            c"mode=0755".as_ptr().cast(),
        )
    };
    if mounted == -1 {
        return Err(errno());
    }
    for (path, dir) in entries {
        let made = if *dir {
            // SAFETY: a NUL-terminated path.
            unsafe { libc::mkdir(path.as_ptr(), 0o755) }
        } else {
            let o = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
            // SAFETY: a NUL-terminated path and integer flags.
            let fd = unsafe { libc::open(path.as_ptr(), o, 0o644) };
            if fd >= 0 {
                // SAFETY: the fd just made, ours.
                unsafe { libc::close(fd) }
            } else {
                -1
            }
        };
        if made == -1 {
            return Err(errno());
        }
    }
    let ro = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags;
    // SAFETY: mount(2) with a NUL-terminated target and null data.
    let sealed = unsafe {
        libc::mount(
            std::ptr::null(),
            at.as_ptr(),
            std::ptr::null(),
            ro,
            std::ptr::null(),
        )
    };
    if sealed == -1 { Err(errno()) } else { Ok(()) }
}

/// `at` made read-only: a recursive bind mount of itself, then every mount of it
/// read-only (other flags kept: a namespace may not clear those it inherited).
fn read_only(at: &CString) -> Result<(), c_int> {
    // SAFETY: mount(2) with NUL-terminated paths and null data.
    let bound = unsafe {
        libc::mount(
            at.as_ptr(),
            at.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        )
    };
    if bound == -1 {
        return Err(errno());
    }
    let set = sys::mount_setattr(
        libc::AT_FDCWD,
        at,
        libc::AT_RECURSIVE as u32,
        libc::MOUNT_ATTR_RDONLY,
        None,
    );
    if set == -1 { Err(errno()) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadow_lists_users_without_secrets() {
        let s = shadow(
            "root:x:0:0::/root:/bin/bash\n\npostgres:x:101:104::/v:/bin/sh\n+nis\n",
            42,
            65536,
        );
        assert_eq!(s.text, b"root:*:::::::\npostgres:*:::::::\n");
        assert_eq!(s.gid, 42);
        // A group the sandbox does not have: root's.
        assert_eq!(shadow("", 42, 1).gid, 0);
    }

    #[test]
    fn the_mounts_directly_below_sys() {
        let mi = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
23 22 0:22 / /sys rw - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw
32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw
33 23 0:7 / /sys/kernel/debug rw - debugfs debugfs rw
34 22 0:5 / /proc rw - proc proc rw
";
        assert_eq!(
            sys_children(mi),
            [
                PathBuf::from("/sys/fs/cgroup"),
                PathBuf::from("/sys/kernel/debug")
            ]
        );
        assert!(sys_children("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n").is_empty());
    }
}
