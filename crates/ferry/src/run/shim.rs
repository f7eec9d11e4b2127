//! `ferry run`'s shim: where the library is, where the sandbox's processes can read it,
//! and the warning for a program it cannot reach.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use tracing::{debug, warn};

use super::{Net, RunArgs, RunError};

/// The shim, unless nic mode alone (which needs none).
pub(super) fn find_shim(a: &RunArgs) -> Result<Option<PathBuf>, RunError> {
    if a.net == Net::Nic {
        return Ok(None);
    }
    find_preload().map(Some).map_err(RunError::Shim)
}

/// The shim as the sandbox's processes find it.
pub(super) struct Shim {
    /// What `LD_PRELOAD` names.
    pub(super) preload: PathBuf,
    /// The path its processes map it at (symbolic links resolved): how the socket watch
    /// knows it.
    pub(super) mapped: PathBuf,
}

impl Shim {
    /// The sandbox's processes run as another host user: the shim must be where they
    /// can read it (`sandbox_dir` when `preload` is not).
    pub(super) fn place(preload: &Path, sandbox_dir: &Path) -> Result<Shim, RunError> {
        let preload = readable_preload(preload, sandbox_dir).map_err(RunError::Shim)?;
        let mapped = preload.canonicalize().unwrap_or_else(|_| preload.clone());
        Ok(Shim { preload, mapped })
    }
}

/// Where the shim library is: `FERRY_PRELOAD`, or next to the ferry binary.
pub(crate) fn find_preload() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FERRY_PRELOAD") {
        return Ok(PathBuf::from(p));
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the ferry binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [
        dir.join("libferry_preload.so"),
        dir.join("deps/libferry_preload.so"),
        dir.join("../lib/ferry/libferry_preload.so"),
    ] {
        if cand.is_file() {
            return Ok(cand);
        }
    }
    Err(format!(
        "cannot find libferry_preload.so next to {} (build the whole workspace: `cargo build --release`), or set FERRY_PRELOAD",
        exe.display()
    ))
}

/// The shim where the sandbox's processes can read it: `preload` itself when every
/// directory above it may be searched and the file read by anyone, else a copy in the
/// sandbox's directory `dir` (which they can search).
fn readable_preload(preload: &Path, dir: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode()).ok();
    let open = preload.canonicalize().ok().is_some_and(|full| {
        mode(&full).is_some_and(|m| m & 0o004 != 0)
            && full
                .ancestors()
                .skip(1)
                .all(|d| mode(d).is_some_and(|m| m & 0o001 != 0))
    });
    if open {
        return Ok(preload.to_path_buf());
    }
    let copy = dir.join("libferry_preload.so");
    std::fs::copy(preload, &copy)
        .and_then(|_| ferry_sys::chmod(&copy, 0o644))
        .map_err(|e| format!("cannot copy {} for the sandbox: {e}", preload.display()))?;
    debug!("the shim is copied to {} for the sandbox", copy.display());
    Ok(copy)
}

/// Warns when CMD is a static binary: the shim cannot reach it, so it only sees `lo`.
/// Only when the sandbox's socket watch is off (an old kernel, or ferry inside a sandbox
/// that watches already): the watch tells every such process, when it makes a socket.
pub(super) fn warn_if_static(cmd: &OsString) {
    let path = if cmd.to_string_lossy().contains('/') {
        Some(PathBuf::from(cmd))
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(cmd))
                .find(|c| c.is_file())
        })
    };
    let Some(path) = path else { return };
    if let Ok(bytes) = std::fs::read(&path)
        && is_static_elf(&bytes)
    {
        warn!(
            "{} is statically linked: ferry's socket shim cannot serve it, so it sees only the sandbox's loopback (--net nic or both serves it)",
            path.display()
        );
    }
}

/// An ELF64 executable without a `PT_INTERP` program header.
fn is_static_elf(b: &[u8]) -> bool {
    let rd16 = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    let rd32 = |o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    let rd64 = |o: usize| {
        b.get(o..o + 8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
    };
    if b.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (rd64(32), rd16(54), rd16(56)) else {
        return false;
    };
    !(0..usize::from(phnum)).any(|i| rd32(phoff as usize + i * usize::from(phentsize)) == Some(3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_detection() {
        let sh = std::fs::read("/bin/sh").unwrap();
        assert!(!is_static_elf(&sh), "/bin/sh is dynamic");
        assert!(!is_static_elf(b"#!/bin/sh\n"));
    }
}
