//! The bundle's `config.json`, read and rewritten for the real runtime (a pure core on
//! JSON values; the caller reads and writes the files).
//!
//! What changes: the network namespace becomes the sandbox's (`/proc/PID/ns/net` of
//! the process holding it: lo + the TAP); the sandbox's directory is bind-mounted
//! read-only at [`MOUNT`] (the servers' control socket, the shim: a copy, or the
//! installed file bind-mounted read-only over a placeholder) and the process gets
//! `FERRY_SOCKET` and, where the image can load it, `LD_PRELOAD`; `root.path` becomes
//! absolute (the rewritten file lives in another directory); the `prestart` and
//! `createRuntime` hooks — where engines configure the container's network (Docker's
//! `libnetwork-setkey`, CNI hooks) — run through `ferry oci hook`, which shows them
//! the pid of ferry's network side, so that they configure the namespace the servers
//! serve from instead of the sandbox's.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Where the container sees the sandbox's directory.
pub const MOUNT: &str = "/.ferry";
/// The shim's file name in the sandbox's directory.
pub const SHIM: &str = "libferry_preload.so";
/// The control socket's file name in the sandbox's directory.
pub const CONTROL: &str = "ctl.sock";

/// A bundle ferry cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// Not an object with the fields runc needs.
    #[error("config.json: {0}")]
    Malformed(&'static str),
    /// No network namespace: the container would share the host's network.
    #[error(
        "config.json has no network namespace: the container would use the host's network (e.g. `--network host`), which ferry cannot sandbox; give it a network namespace or use the engine's default runtime"
    )]
    NoNetworkNamespace,
}

/// The network namespace the engine gave the container.
#[derive(Debug, PartialEq, Eq)]
pub enum EngineNetns {
    /// A namespace to join (Podman, CNI, Kubernetes).
    Join(PathBuf),
    /// A new one, made by the runtime (Docker, `ctr`).
    New,
}

/// The container's network namespace as the engine asked for it.
pub fn engine_netns(spec: &Value) -> Result<EngineNetns, SpecError> {
    let namespaces = spec
        .pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .ok_or(SpecError::Malformed("no linux.namespaces"))?;
    let net = namespaces
        .iter()
        .find(|n| n.get("type").and_then(Value::as_str) == Some("network"))
        .ok_or(SpecError::NoNetworkNamespace)?;
    Ok(match net.get("path").and_then(Value::as_str) {
        Some(p) if !p.is_empty() => EngineNetns::Join(p.into()),
        _ => EngineNetns::New,
    })
}

/// The container's annotations (string values only).
pub fn annotations(spec: &Value) -> Vec<(String, String)> {
    spec.get("annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the container's processes may hold `CAP_SYS_ADMIN` (in their bounding
/// set): they could remount a read-only bind mount read-write, so the installed shim is
/// not bind-mounted into such a container (it gets a copy).
pub fn may_remount(spec: &Value) -> bool {
    spec.pointer("/process/capabilities/bounding")
        .and_then(Value::as_array)
        .is_some_and(|caps| caps.iter().any(|c| c == "CAP_SYS_ADMIN"))
}

/// Whether the container's process has a terminal (its output then goes to a console,
/// not to the runtime's stdio).
pub fn terminal(spec: &Value) -> bool {
    spec.pointer("/process/terminal").and_then(Value::as_bool) == Some(true)
}

/// The container's root filesystem on the host (`root.path` against the bundle).
pub fn rootfs(spec: &Value, bundle: &Path) -> Result<PathBuf, SpecError> {
    let root = spec
        .pointer("/root/path")
        .and_then(Value::as_str)
        .ok_or(SpecError::Malformed("no root.path"))?;
    Ok(bundle.join(root))
}

/// What [`rewrite`] puts in.
#[derive(Debug)]
pub struct Rewrite<'a> {
    /// The sandbox's network namespace (`/proc/PID/ns/net`).
    pub netns: PathBuf,
    /// The sandbox's directory on the host (mounted at [`MOUNT`]).
    pub dir: &'a Path,
    /// Whether to preload the shim.
    pub preload: bool,
    /// The installed shim, bind-mounted read-only over the sandbox directory's
    /// [`SHIM`] (an empty file) so that nothing is copied; `None`: the directory holds
    /// a copy (or no shim).
    pub shim: Option<&'a Path>,
    /// The program that runs the engine's network hooks, and the arguments before
    /// runc's (`ferry-oci`'s, or `ferry oci`: [`crate::cli::Programs::runtime`]).
    pub runtime: (&'a Path, &'a [&'a str]),
    /// The pid the hooks see: ferry's network side, in the engine's namespace.
    pub hook_pid: u32,
    /// The engine's bundle directory.
    pub bundle: &'a Path,
}

/// The spec for the real runtime (see the module's header).
pub fn rewrite(mut spec: Value, r: &Rewrite) -> Result<Value, SpecError> {
    let root = rootfs(&spec, r.bundle)?;
    spec["root"]["path"] = json!(root);
    set_netns(&mut spec, &r.netns)?;
    let mounts = spec
        .as_object_mut()
        .ok_or(SpecError::Malformed("not an object"))?
        .entry("mounts")
        .or_insert_with(|| json!([]));
    let mounts = mounts
        .as_array_mut()
        .ok_or(SpecError::Malformed("mounts is not a list"))?;
    let options = json!(["bind", "ro", "nosuid", "nodev"]);
    mounts.push(json!({
        "destination": MOUNT,
        "type": "bind",
        "source": r.dir,
        "options": options,
    }));
    if let Some(shim) = r.shim.filter(|_| r.preload) {
        // After the directory's mount, over its placeholder.
        mounts.push(json!({
            "destination": format!("{MOUNT}/{SHIM}"),
            "type": "bind",
            "source": shim,
            "options": options,
        }));
    }
    add_env(&mut spec, r.preload)?;
    wrap_hooks(&mut spec, r.runtime, r.hook_pid)?;
    Ok(spec)
}

fn set_netns(spec: &mut Value, netns: &Path) -> Result<(), SpecError> {
    let namespaces = spec
        .pointer_mut("/linux/namespaces")
        .and_then(Value::as_array_mut)
        .ok_or(SpecError::Malformed("no linux.namespaces"))?;
    let net = namespaces
        .iter_mut()
        .find(|n| n.get("type").and_then(Value::as_str) == Some("network"))
        .ok_or(SpecError::NoNetworkNamespace)?;
    *net = json!({"type": "network", "path": netns});
    Ok(())
}

fn add_env(spec: &mut Value, preload: bool) -> Result<(), SpecError> {
    let env = spec
        .pointer_mut("/process")
        .and_then(Value::as_object_mut)
        .ok_or(SpecError::Malformed("no process"))?
        .entry("env")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or(SpecError::Malformed("process.env is not a list"))?;
    let mut ours = vec![format!("FERRY_SOCKET={MOUNT}/{CONTROL}")];
    if preload {
        let theirs = env
            .iter()
            .filter_map(Value::as_str)
            .find_map(|e| e.strip_prefix("LD_PRELOAD="))
            .filter(|s| !s.is_empty());
        ours.push(match theirs {
            Some(t) => format!("LD_PRELOAD={MOUNT}/{SHIM}:{t}"),
            None => format!("LD_PRELOAD={MOUNT}/{SHIM}"),
        });
    }
    env.retain(|e| {
        let Some(e) = e.as_str() else { return true };
        !(e.starts_with("FERRY_SOCKET=") || (preload && e.starts_with("LD_PRELOAD=")))
    });
    env.extend(ours.into_iter().map(Value::from));
    Ok(())
}

/// Runs each `prestart` and `createRuntime` hook through `ferry-oci hook --pid PID --`
/// (or `ferry oci hook …`).
fn wrap_hooks(
    spec: &mut Value,
    (program, argv0): (&Path, &[&str]),
    pid: u32,
) -> Result<(), SpecError> {
    for kind in ["prestart", "createRuntime"] {
        let Some(hooks) = spec.pointer_mut(&format!("/hooks/{kind}")) else {
            continue;
        };
        let hooks = hooks
            .as_array_mut()
            .ok_or(SpecError::Malformed("a hooks entry is not a list"))?;
        for hook in hooks.iter_mut() {
            let path = hook
                .get("path")
                .and_then(Value::as_str)
                .ok_or(SpecError::Malformed("a hook has no path"))?
                .to_owned();
            let theirs: Vec<Value> = hook
                .get("args")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_else(|| vec![json!(path)]);
            let mut args: Vec<Value> = argv0.iter().map(|a| json!(a)).collect();
            args.extend([
                json!("hook"),
                json!("--pid"),
                json!(pid.to_string()),
                json!("--"),
                json!(path),
            ]);
            args.extend(theirs);
            hook["path"] = json!(program);
            hook["args"] = json!(args);
        }
    }
    Ok(())
}

/// A hook's state (on its stdin) with `pid` replaced ([`wrap_hooks`]).
pub fn hook_state(state: &[u8], pid: u32) -> Result<Vec<u8>, SpecError> {
    let mut v: Value = serde_json::from_slice(state)
        .map_err(|_| SpecError::Malformed("hook state is not JSON"))?;
    let obj = v
        .as_object_mut()
        .ok_or(SpecError::Malformed("hook state is not an object"))?;
    obj.insert("pid".into(), json!(pid));
    serde_json::to_vec(&v).map_err(|_| SpecError::Malformed("hook state"))
}

/// The libraries the shim needs (its `DT_NEEDED` besides the loader).
pub const SHIM_NEEDS: [&str; 2] = ["libc.so.6", "libgcc_s.so.1"];

/// Whether the root filesystem has the shim's libraries ([`SHIM_NEEDS`]: glibc for this
/// architecture, and libgcc's unwinder, as every Debian-based image has) in a
/// directory glibc's loader searches; looks only at names inside `rootfs` (an
/// absolute link is not followed to the host's files). A glibc older than the one the
/// shim was built against is not detected (the program would not start).
pub fn can_load_shim(rootfs: &Path) -> bool {
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    let dirs = [
        format!("lib/{triple}"),
        format!("usr/lib/{triple}"),
        "lib64".into(),
        "usr/lib64".into(),
    ];
    SHIM_NEEDS
        .iter()
        .all(|lib| dirs.iter().any(|d| inside(rootfs, &Path::new(d).join(lib))))
}

/// Whether `rel` names a file under `root`, following relative links of its
/// directories inside `root` only (the last component may be a link of any kind).
fn inside(root: &Path, rel: &Path) -> bool {
    let parts: Vec<_> = rel.iter().collect();
    let mut at = root.to_path_buf();
    let mut links = 0;
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let Ok(meta) = std::fs::symlink_metadata(&at) else {
            return false;
        };
        if !meta.file_type().is_symlink() || i + 1 == parts.len() {
            continue;
        }
        let Ok(target) = std::fs::read_link(&at) else {
            return false;
        };
        links += 1;
        let escapes = target.is_absolute()
            || target
                .components()
                .any(|c| c == std::path::Component::ParentDir);
        if escapes || links > 8 {
            return false;
        }
        at.pop();
        at.push(target);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docker_like() -> Value {
        json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "process": {"args": ["sh"], "env": ["PATH=/bin", "LD_PRELOAD=/x.so"]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "hooks": {"prestart": [{"path": "/usr/bin/dockerd", "args": ["libnetwork-setkey", "-exec-root=/r", "id"]}]},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}]},
            "annotations": {"ferry.net": "nic", "n": 1}
        })
    }

    #[test]
    fn engine_namespaces() {
        assert_eq!(engine_netns(&docker_like()), Ok(EngineNetns::New));
        let mut s = docker_like();
        s["linux"]["namespaces"][1]["path"] = json!("/run/netns/cni-1");
        assert_eq!(
            engine_netns(&s),
            Ok(EngineNetns::Join("/run/netns/cni-1".into()))
        );
        s["linux"]["namespaces"] = json!([{"type": "pid"}]);
        assert_eq!(engine_netns(&s), Err(SpecError::NoNetworkNamespace));
        assert!(matches!(
            engine_netns(&json!({})),
            Err(SpecError::Malformed(_))
        ));
        assert_eq!(
            annotations(&docker_like()),
            [("ferry.net".into(), "nic".into())]
        );
    }

    #[test]
    fn rewrite_joins_mounts_preloads_and_wraps_hooks() {
        let r = Rewrite {
            netns: "/proc/42/ns/net".into(),
            dir: Path::new("/state/net"),
            preload: true,
            shim: Some(Path::new("/usr/lib/ferry/libferry_preload.so")),
            runtime: (Path::new("/usr/bin/ferry-oci"), &["ferry-oci"]),
            hook_pid: 7,
            bundle: Path::new("/bundles/c1"),
        };
        let s = rewrite(docker_like(), &r).unwrap();
        assert_eq!(s["root"]["path"], "/bundles/c1/rootfs");
        assert_eq!(
            s["linux"]["namespaces"][1],
            json!({"type": "network", "path": "/proc/42/ns/net"})
        );
        assert_eq!(s["mounts"][1]["destination"], MOUNT);
        assert_eq!(s["mounts"][1]["source"], "/state/net");
        assert!(
            s["mounts"][1]["options"]
                .as_array()
                .unwrap()
                .contains(&json!("ro"))
        );
        // The shim over its placeholder, read-only, after the directory.
        assert_eq!(
            s["mounts"][2],
            json!({
                "destination": "/.ferry/libferry_preload.so",
                "type": "bind",
                "source": "/usr/lib/ferry/libferry_preload.so",
                "options": ["bind", "ro", "nosuid", "nodev"],
            })
        );
        let env: Vec<&str> = s["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            env,
            [
                "PATH=/bin",
                "FERRY_SOCKET=/.ferry/ctl.sock",
                "LD_PRELOAD=/.ferry/libferry_preload.so:/x.so"
            ]
        );
        let hook = &s["hooks"]["prestart"][0];
        assert_eq!(hook["path"], "/usr/bin/ferry-oci");
        assert_eq!(
            hook["args"],
            json!([
                "ferry-oci",
                "hook",
                "--pid",
                "7",
                "--",
                "/usr/bin/dockerd",
                "libnetwork-setkey",
                "-exec-root=/r",
                "id"
            ])
        );
    }

    #[test]
    fn no_preload_keeps_the_images_own() {
        let r = Rewrite {
            netns: "/proc/1/ns/net".into(),
            dir: Path::new("/d"),
            preload: false,
            shim: Some(Path::new("/s.so")),
            runtime: (Path::new("/f"), &["ferry", "oci"]),
            hook_pid: 1,
            bundle: Path::new("/b"),
        };
        let s = rewrite(docker_like(), &r).unwrap();
        let env = s["process"]["env"].as_array().unwrap();
        assert!(env.contains(&json!("LD_PRELOAD=/x.so")));
        assert!(!env.iter().any(|e| e.as_str().unwrap().contains(SHIM)));
        // No shim mounted either.
        assert_eq!(s["mounts"].as_array().unwrap().len(), 2);
        // The hook through the full binary's `oci` command.
        let hook = &s["hooks"]["prestart"][0];
        assert_eq!(hook["path"], "/f");
        let args = hook["args"].as_array().unwrap();
        assert_eq!(
            args[..4],
            [json!("ferry"), json!("oci"), json!("hook"), json!("--pid")]
        );
    }

    #[test]
    fn sys_admin_in_the_bounding_set_may_remount() {
        let mut s = docker_like();
        assert!(!may_remount(&s));
        s["process"]["capabilities"] = json!({"bounding": ["CAP_CHOWN", "CAP_NET_RAW"]});
        assert!(!may_remount(&s));
        s["process"]["capabilities"]["bounding"][1] = json!("CAP_SYS_ADMIN");
        assert!(may_remount(&s));
    }

    #[test]
    fn hook_state_pid_replaced() {
        let s = hook_state(
            br#"{"ociVersion":"1.0.2","id":"c","pid":99,"bundle":"/b"}"#,
            5,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&s).unwrap();
        assert_eq!(v["pid"], 5);
        assert_eq!(v["id"], "c");
        assert!(hook_state(b"nope", 5).is_err());
    }

    #[test]
    fn shim_libraries_found_through_relative_links_only() {
        let d = std::env::temp_dir().join(format!("ferry-oci-glibc-{}", std::process::id()));
        let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
        let libs = d.join("usr/lib").join(&triple);
        std::fs::create_dir_all(&libs).unwrap();
        assert!(!can_load_shim(&d));
        std::os::unix::fs::symlink("usr/lib", d.join("lib")).unwrap();
        std::fs::write(libs.join("libc.so.6"), b"").unwrap();
        // glibc without libgcc's unwinder: the shim would not load.
        assert!(!can_load_shim(&d));
        std::os::unix::fs::symlink("libgcc_s.so.1.real", libs.join("libgcc_s.so.1")).unwrap();
        assert!(can_load_shim(&d));
        let musl = d.with_extension("musl");
        std::fs::create_dir_all(&musl).unwrap();
        // An absolute link would name the host's libc: not the image's.
        std::os::unix::fs::symlink("/usr/lib", musl.join("lib")).unwrap();
        assert!(!can_load_shim(&musl));
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&musl).unwrap();
    }
}
