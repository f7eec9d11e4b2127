//! `ferry oci install`: an engine's registration of ferry as a runtime, as text (the
//! caller writes it; a pure core).
//!
//! Docker: `daemon.json`'s `runtimes.NAME = {path: LEAN}` or, with presets, `{path:
//! LEAN, runtimeArgs: ["--preset", …]}`, merged into what the file holds. Podman: a
//! `containers.conf` drop-in, `[engine.runtimes] NAME = [LEAN]`. containerd (and so
//! Kubernetes): the `runtimes.NAME` table of the CRI plugin, `io.containerd.runc.v2`
//! with `BinaryName = LEAN`, and a RuntimeClass whose handler is NAME. LEAN is the
//! `ferry-oci` executable next to ferry (or, without one, a link to ferry so named:
//! engines that take one path; Docker may run `ferry` with `runtimeArgs: ["oci", …]`);
//! presets for the one-path engines come from a drop-in of their own in a later version
//! (not yet: say them as annotations).

use serde_json::{Value, json};

/// A registration that cannot be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InstallError {
    /// The engine's file is not what it should be.
    #[error("{0}")]
    Config(String),
    /// A runtime name engines would refuse.
    #[error("runtime name {0:?}: expected letters, digits, '-' and '_'")]
    Name(String),
}

/// Checks a runtime's name (a key in the engines' configurations).
pub fn check_name(name: &str) -> Result<(), InstallError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(InstallError::Name(name.to_owned()))
    }
}

/// Docker's `daemon.json` (`current`: the file's text, if any) with runtime `name`
/// running `program` with the arguments `args` (`ferry-oci`: none; `ferry`: `oci`) and
/// `presets`: `path` alone when there are neither (dockerd wraps a runtime that has
/// `runtimeArgs` in a shell script: one more exec on each of its runtime calls).
pub fn docker(
    current: Option<&str>,
    name: &str,
    program: &str,
    args: &[&str],
    presets: &[(String, String)],
) -> Result<String, InstallError> {
    check_name(name)?;
    let mut config: Value = match current.map(str::trim) {
        None | Some("") => json!({}),
        Some(text) => serde_json::from_str(text)
            .map_err(|e| InstallError::Config(format!("daemon.json is not JSON: {e}")))?,
    };
    let obj = config
        .as_object_mut()
        .ok_or_else(|| InstallError::Config("daemon.json is not an object".into()))?;
    let runtimes = obj.entry("runtimes").or_insert_with(|| json!({}));
    let runtimes = runtimes
        .as_object_mut()
        .ok_or_else(|| InstallError::Config("daemon.json: runtimes is not an object".into()))?;
    let mut argv: Vec<Value> = args.iter().map(|a| json!(a)).collect();
    for (k, v) in presets {
        argv.extend([json!("--preset"), json!(format!("{k}={v}"))]);
    }
    let entry = if argv.is_empty() {
        json!({ "path": program })
    } else {
        json!({"path": program, "runtimeArgs": argv})
    };
    runtimes.insert(name.into(), entry);
    serde_json::to_string_pretty(&config)
        .map(|s| s + "\n")
        .map_err(|e| InstallError::Config(e.to_string()))
}

/// TOML's basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Podman's `containers.conf` drop-in for runtime `name` at `link`.
pub fn podman(name: &str, link: &str) -> Result<String, InstallError> {
    check_name(name)?;
    Ok(format!(
        "# ferry as an OCI runtime: podman --runtime {name} (written by `ferry oci install --podman`)\n[engine.runtimes]\n{name} = [{}]\n",
        toml_string(link)
    ))
}

/// containerd's CRI table for runtime `name` at `link`, and the Kubernetes
/// RuntimeClass that selects it.
pub fn containerd(name: &str, link: &str) -> Result<(String, String), InstallError> {
    check_name(name)?;
    let table = format!(
        "# ferry as an OCI runtime (written by `ferry oci install --containerd`)\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{name}]\n  runtime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{name}.options]\n  BinaryName = {}\n",
        toml_string(link)
    );
    let class = format!(
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: {name}\nhandler: {name}\n"
    );
    Ok((table, class))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_merges_and_replaces_its_own_entry() {
        let current =
            r#"{"debug": true, "runtimes": {"other": {"path": "/x"}, "ferry": {"path": "/old"}}}"#;
        let presets = [("ferry.deny".to_owned(), "10.0.0.0/8".to_owned())];
        let out = docker(Some(current), "ferry", "/usr/bin/ferry", &["oci"], &presets).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["debug"], true);
        assert_eq!(v["runtimes"]["other"]["path"], "/x");
        assert_eq!(
            v["runtimes"]["ferry"],
            json!({"path": "/usr/bin/ferry", "runtimeArgs": ["oci", "--preset", "ferry.deny=10.0.0.0/8"]})
        );
        let fresh: Value =
            serde_json::from_str(&docker(None, "f", "/f", &["oci"], &[]).unwrap()).unwrap();
        assert_eq!(
            fresh,
            json!({"runtimes": {"f": {"path": "/f", "runtimeArgs": ["oci"]}}})
        );
        // The lean executable with presets: its own globals.
        let lean: Value =
            serde_json::from_str(&docker(None, "f", "/l", &[], &presets).unwrap()).unwrap();
        assert_eq!(
            lean,
            json!({"runtimes": {"f": {"path": "/l", "runtimeArgs": ["--preset", "ferry.deny=10.0.0.0/8"]}}})
        );
        // Nothing to add: the path alone, which dockerd runs without a wrapper script.
        let linked: Value =
            serde_json::from_str(&docker(None, "f", "/l", &[], &[]).unwrap()).unwrap();
        assert_eq!(linked, json!({"runtimes": {"f": {"path": "/l"}}}));
    }

    #[test]
    fn bad_files_and_names_are_refused() {
        assert!(matches!(
            docker(Some("{"), "f", "/f", &[], &[]),
            Err(InstallError::Config(_))
        ));
        assert!(matches!(
            docker(Some("[]"), "f", "/f", &[], &[]),
            Err(InstallError::Config(_))
        ));
        assert!(matches!(
            docker(Some(r#"{"runtimes": 1}"#), "f", "/f", &[], &[]),
            Err(InstallError::Config(_))
        ));
        assert_eq!(podman("a b", "/l"), Err(InstallError::Name("a b".into())));
        assert!(containerd("x]\n[y", "/l").is_err());
    }

    #[test]
    fn podman_and_containerd_text() {
        let p = podman("ferry", "/usr/local/bin/ferry-oci").unwrap();
        assert!(p.contains("[engine.runtimes]\nferry = [\"/usr/local/bin/ferry-oci\"]\n"));
        let (t, k) = containerd("ferry", "/a\"b").unwrap();
        assert!(
            t.contains("containerd.runtimes.ferry]\n  runtime_type = \"io.containerd.runc.v2\"")
        );
        assert!(t.contains("BinaryName = \"/a\\\"b\""));
        assert!(k.contains("kind: RuntimeClass") && k.contains("handler: ferry"));
    }
}
