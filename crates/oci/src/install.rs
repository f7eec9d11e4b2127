//! `ferry oci install`: an engine's registration of ferry as a runtime, as text (the
//! caller writes it; a pure core).
//!
//! Docker: `daemon.json`'s `runtimes.NAME = {path: FERRY, runtimeArgs: ["oci",
//! "--preset", …]}`, merged into what the file holds. Podman: a `containers.conf`
//! drop-in, `[engine.runtimes] NAME = [LINK]`. containerd (and so Kubernetes): the
//! `runtimes.NAME` table of the CRI plugin, `io.containerd.runc.v2` with `BinaryName =
//! LINK`, and a RuntimeClass whose handler is NAME. LINK is a link to ferry named
//! `ferry-oci` (engines that take one path); presets there come from a drop-in of
//! their own in a later version (not yet: say them as annotations).

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
/// running `ferry oci` with `presets`: the `ferry-oci` `link` itself when there are
/// none and it is given (dockerd wraps a runtime that has `runtimeArgs` in a shell
/// script: one more exec on each of its runtime calls), else `ferry` with
/// `runtimeArgs`.
pub fn docker(
    current: Option<&str>,
    name: &str,
    ferry: &str,
    link: Option<&str>,
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
    let entry = match link {
        Some(link) if presets.is_empty() => json!({ "path": link }),
        _ => {
            let mut args = vec![json!("oci")];
            for (k, v) in presets {
                args.extend([json!("--preset"), json!(format!("{k}={v}"))]);
            }
            json!({"path": ferry, "runtimeArgs": args})
        }
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
        let out = docker(
            Some(current),
            "ferry",
            "/usr/bin/ferry",
            Some("/l"),
            &presets,
        )
        .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["debug"], true);
        assert_eq!(v["runtimes"]["other"]["path"], "/x");
        assert_eq!(
            v["runtimes"]["ferry"],
            json!({"path": "/usr/bin/ferry", "runtimeArgs": ["oci", "--preset", "ferry.deny=10.0.0.0/8"]})
        );
        let fresh: Value =
            serde_json::from_str(&docker(None, "f", "/f", None, &[]).unwrap()).unwrap();
        assert_eq!(
            fresh,
            json!({"runtimes": {"f": {"path": "/f", "runtimeArgs": ["oci"]}}})
        );
        // No presets: the link, which dockerd runs without a wrapper script.
        let linked: Value =
            serde_json::from_str(&docker(None, "f", "/f", Some("/l"), &[]).unwrap()).unwrap();
        assert_eq!(linked, json!({"runtimes": {"f": {"path": "/l"}}}));
    }

    #[test]
    fn bad_files_and_names_are_refused() {
        assert!(matches!(
            docker(Some("{"), "f", "/f", None, &[]),
            Err(InstallError::Config(_))
        ));
        assert!(matches!(
            docker(Some("[]"), "f", "/f", None, &[]),
            Err(InstallError::Config(_))
        ));
        assert!(matches!(
            docker(Some(r#"{"runtimes": 1}"#), "f", "/f", None, &[]),
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
