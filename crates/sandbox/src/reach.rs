//! What a root sandbox's programs will find out of reach, said before they start.
//!
//! Run by root, the sandbox's root is an unprivileged host identity: root's 0700
//! directories (`/root`, a working directory of root's) are closed to it, and a program
//! then fails deep inside with "Permission denied", or another program of the same name
//! runs (`python3` from `/usr/bin` where root's `PATH` finds pyenv's under `/root`).
//! [`reach_advice`] says up front which path is closed, why, and which `--volume` opens
//! it: for the working directory, the program and the paths among its arguments.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::launch::{IdRange, Spec, UserNs, candidates, root_sandbox_ids};
use crate::volume::{Perm, allows};

/// At most this many lines of advice.
const MAX_LINES: usize = 4;

/// Lines for the user, each naming a path the sandbox's root cannot reach and the
/// `--volume` that opens it: the working directory (unless readable), the program `PATH`
/// finds (unless the sandbox can run it) and arguments that name existing paths. Empty
/// unless the sandbox is root's with its own ids (an ordinary user's sandbox reaches
/// what the user does).
pub fn reach_advice(spec: &Spec) -> Vec<String> {
    // SAFETY: geteuid cannot fail.
    if spec.userns == UserNs::Never || unsafe { libc::geteuid() } != 0 {
        return Vec::new();
    }
    let (uids, gids) = root_sandbox_ids();
    let shared: Vec<PathBuf> = spec.volumes.iter().map(|v| v.path().to_owned()).collect();
    let probe = Probe {
        uids,
        gids,
        shared: &shared,
        perm: &Perm::of,
    };
    let cwd = std::env::current_dir().ok();
    let path_var = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var_os("PATH"));
    let mut args = vec![spec.program.clone()];
    args.extend(spec.args.iter().cloned());
    probe.advice(cwd.as_deref(), &args, path_var.as_deref())
}

/// The sandbox's root, the volumes, and a way to read a path's permissions (the seam
/// for tests).
struct Probe<'a> {
    uids: IdRange,
    gids: IdRange,
    shared: &'a [PathBuf],
    perm: &'a dyn Fn(&Path) -> Option<Perm>,
}

impl Probe<'_> {
    fn advice(
        &self,
        cwd: Option<&Path>,
        args: &[OsString],
        path_var: Option<&OsStr>,
    ) -> Vec<String> {
        let who = format!("the sandbox's root (uid {} on the host)", self.uids.base);
        let mut out = Vec::new();
        let cwd_closed = cwd.and_then(|d| Some((d, self.blocker(d, 5)?)));
        if let Some((dir, b)) = &cwd_closed {
            out.push(format!(
                "the working directory {} is not readable by {who}{}: programs will get \"Permission denied\" there; {}",
                dir.display(),
                closed(b, dir),
                share(dir)
            ));
        }
        if let Some((program, rest)) = args.split_first() {
            out.extend(self.program(program, path_var, &who));
            for arg in rest {
                out.extend(self.argument(arg, cwd, cwd_closed.is_some(), &who));
            }
        }
        out.dedup();
        out.truncate(MAX_LINES);
        out
    }

    /// The program `PATH` finds on the host, when the sandbox's root cannot run it.
    fn program(&self, program: &OsStr, path_var: Option<&OsStr>, who: &str) -> Option<String> {
        let found: Vec<PathBuf> = candidates(program, path_var)
            .into_iter()
            .map(PathBuf::from)
            .filter(|p| (self.perm)(p).is_some_and(|m| !m.dir()))
            .collect();
        let (host, others) = found.split_first()?;
        let b = self.blocker(host, 1)?;
        let instead = match others.iter().find(|p| self.blocker(p, 1).is_none()) {
            Some(other) => format!("the sandbox runs {} instead", other.display()),
            None => "the sandbox cannot run it".into(),
        };
        Some(format!(
            "{} is {} here, which {who} cannot reach{}: {instead}; --volume {}:ro shares it",
            program.to_string_lossy(),
            host.display(),
            closed(&b, host),
            hint(host, &b).display()
        ))
    }

    /// An argument naming an existing path (with a `/`) that the sandbox's root cannot
    /// read; relative ones only when the working directory is open to it.
    fn argument(
        &self,
        arg: &OsStr,
        cwd: Option<&Path>,
        cwd_closed: bool,
        who: &str,
    ) -> Option<String> {
        let arg = Path::new(arg);
        if !arg.as_os_str().as_encoded_bytes().contains(&b'/') || (arg.is_relative() && cwd_closed)
        {
            return None;
        }
        let full: PathBuf = match cwd {
            Some(d) if arg.is_relative() => d.join(arg),
            _ => arg.to_owned(),
        }
        .components()
        .collect();
        if Some(full.as_path()) == cwd {
            return None; // the working directory's own line says it
        }
        let perm = (self.perm)(&full)?;
        let b = self.blocker(&full, if perm.dir() { 5 } else { 4 })?;
        Some(format!(
            "{} is not readable by {who}{}: {}",
            arg.display(),
            closed(&b, &full),
            share(&full)
        ))
    }

    /// The first directory on the way to `path` that the sandbox's root may not search,
    /// else `path` itself if it may not use it for `bits`; `None` when it may (or the
    /// path is in a volume, or cannot be read here).
    fn blocker(&self, path: &Path, bits: u32) -> Option<PathBuf> {
        if self.shared.iter().any(|v| path.starts_with(v)) {
            return None;
        }
        let ok =
            |p: &Path, bits| (self.perm)(p).is_none_or(|m| allows(m, self.uids, self.gids, bits));
        let mut down: Vec<&Path> = path.ancestors().skip(1).collect();
        down.reverse();
        if let Some(dir) = down.into_iter().find(|d| !ok(d, 1)) {
            return Some(dir.to_owned());
        }
        (!ok(path, bits)).then(|| path.to_owned())
    }
}

/// The volumes that would share `path`, and what read-write means.
fn share(path: &Path) -> String {
    let p = path.display();
    format!(
        "--volume {p}:ro shares it read-only, --volume {p} read-write (the sandbox's root may then change anything in it as root could)"
    )
}

/// ": DIR is closed to it", unless the path itself is what is closed.
fn closed(blocker: &Path, path: &Path) -> String {
    if blocker == path {
        String::new()
    } else {
        format!(" ({} is closed to it)", blocker.display())
    }
}

/// What to share for a program at `path` that `blocker` closes: what is right below
/// the blocker on the way (a toolchain's root: `/root/.pyenv`), or the program itself.
fn hint(path: &Path, blocker: &Path) -> PathBuf {
    path.ancestors()
        .find(|a| a.parent() == Some(blocker))
        .unwrap_or(path)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host where /root is root's 0700, /root/.pyenv and its tree 0755, /srv/app
    /// 0755, /srv/closed 0700 (root's), and python3 is in pyenv's shims and in /usr/bin.
    fn host(p: &Path) -> Option<Perm> {
        let dir = |mode| Perm {
            uid: 0,
            gid: 0,
            mode: libc::S_IFDIR | mode,
        };
        let file = |mode| Perm {
            uid: 0,
            gid: 0,
            mode: libc::S_IFREG | mode,
        };
        Some(match p.to_str()? {
            "/" | "/usr" | "/usr/bin" | "/srv" | "/srv/app" => dir(0o755),
            "/root/.pyenv" | "/root/.pyenv/shims" => dir(0o755),
            "/root" | "/srv/closed" => dir(0o700),
            "/root/.pyenv/shims/python3" | "/usr/bin/python3" | "/srv/app/x" => file(0o755),
            "/srv/closed/key" => file(0o600),
            "/srv/app/secret" => file(0o600),
            _ => return None,
        })
    }

    fn probe(shared: &[PathBuf]) -> Probe<'_> {
        Probe {
            uids: IdRange {
                base: 100_000,
                count: 65536,
            },
            gids: IdRange {
                base: 100_000,
                count: 65536,
            },
            shared,
            perm: &host,
        }
    }

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    const PATH: &str = "/root/.pyenv/shims:/usr/bin";

    #[test]
    fn a_closed_working_directory_and_program_are_told() {
        let p = probe(&[]);
        let lines = p.advice(
            Some(Path::new("/srv/closed")),
            &args(&["python3", "-c", "pass"]),
            Some(OsStr::new(PATH)),
        );
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert_eq!(
            lines[0],
            "the working directory /srv/closed is not readable by the sandbox's root (uid 100000 on the host): programs will get \"Permission denied\" there; --volume /srv/closed:ro shares it read-only, --volume /srv/closed read-write (the sandbox's root may then change anything in it as root could)"
        );
        assert_eq!(
            lines[1],
            "python3 is /root/.pyenv/shims/python3 here, which the sandbox's root (uid 100000 on the host) cannot reach (/root is closed to it): the sandbox runs /usr/bin/python3 instead; --volume /root/.pyenv:ro shares it"
        );
    }

    #[test]
    fn volumes_and_open_paths_need_no_word() {
        let shared = [PathBuf::from("/root/.pyenv"), PathBuf::from("/srv/closed")];
        let p = probe(&shared);
        let a = args(&["python3", "/srv/closed/key", "/srv/app/x", "/nowhere/x"]);
        assert!(
            p.advice(Some(Path::new("/srv/closed")), &a, Some(OsStr::new(PATH)))
                .is_empty()
        );
        let p = probe(&[]);
        assert!(
            p.advice(
                Some(Path::new("/srv/app")),
                &args(&["/usr/bin/python3"]),
                None
            )
            .is_empty()
        );
    }

    #[test]
    fn closed_arguments_are_told() {
        let p = probe(&[]);
        let lines = p.advice(
            Some(Path::new("/srv/app")),
            &args(&["ssh", "-i", "/srv/closed/key", "./secret", "x"]),
            Some(OsStr::new("/usr/bin")),
        );
        assert_eq!(
            lines,
            [
                "/srv/closed/key is not readable by the sandbox's root (uid 100000 on the host) (/srv/closed is closed to it): --volume /srv/closed/key:ro shares it read-only, --volume /srv/closed/key read-write (the sandbox's root may then change anything in it as root could)",
                "./secret is not readable by the sandbox's root (uid 100000 on the host): --volume /srv/app/secret:ro shares it read-only, --volume /srv/app/secret read-write (the sandbox's root may then change anything in it as root could)",
            ]
        );
        // A program no one can run in the sandbox.
        let lines = p.advice(None, &args(&["/srv/closed/key"]), None);
        assert!(
            lines[0].ends_with("the sandbox cannot run it; --volume /srv/closed/key:ro shares it"),
            "{lines:?}"
        );
    }

    #[test]
    fn hints_name_the_directory_below_the_blocker() {
        let h = |p: &str, b: &str| hint(Path::new(p), Path::new(b));
        assert_eq!(
            h("/root/.pyenv/shims/python3", "/root"),
            Path::new("/root/.pyenv")
        );
        assert_eq!(h("/root/tool", "/root"), Path::new("/root/tool"));
        assert_eq!(h("/srv/tool", "/srv/tool"), Path::new("/srv/tool"));
    }
}
