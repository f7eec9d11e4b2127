//! A container's options: `ferry.*` annotations over the runtime's presets
//! (`--preset KEY=VALUE`), turned into `ferry run`'s flags.
//!
//! Keys: `ferry.allow` and `ferry.deny` (comma-separated `CIDR[:PORT]` lists; a
//! preset's rules and the container's add up, and a deny wins over an allow, so a
//! container cannot lift its runtime's deny), `ferry.net` (socket|nic|both),
//! `ferry.servers`, `ferry.nic-servers`, `ferry.spin`, `ferry.server-spin`,
//! `ferry.dns`, `ferry.mtu` (a container's value replaces the preset's) and
//! `ferry.publish` (comma-separated `[IP:]HOST_PORT:PORT[/udp]`, published in the
//! namespace the engine gave the container). Any other `ferry.*` key is an error; other
//! annotations are the engine's and ignored. Values are checked by `ferry run`'s own
//! parser; [`Flag::source`] names where a refused value came from.

/// One option's flags and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    /// "annotation ferry.net=…" or "preset ferry.net=…", for errors.
    pub source: String,
    /// `ferry run`'s flags for it, e.g. `["--net", "nic"]`.
    pub args: Vec<String>,
}

/// An option ferry does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OptionError {
    /// A `ferry.*` key that is not one of [`KEYS`].
    #[error("{origin} {key}: unknown ferry option (known: {})", KEYS.map(|(k, _)| k).join(", "))]
    Unknown {
        /// "annotation" or "preset".
        origin: &'static str,
        /// The key.
        key: String,
    },
    /// A value ferry parses but does not support yet.
    #[error("{origin} {key}={value}: {why}")]
    Unsupported {
        /// "annotation" or "preset".
        origin: &'static str,
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Why.
        why: &'static str,
    },
    /// An empty value.
    #[error("{origin} {key}: empty value")]
    Empty {
        /// "annotation" or "preset".
        origin: &'static str,
        /// The key.
        key: String,
    },
}

/// The keys ferry knows and the flag each sets.
pub const KEYS: [(&str, &str); 10] = [
    ("ferry.allow", "--allow"),
    ("ferry.deny", "--deny"),
    ("ferry.net", "--net"),
    ("ferry.servers", "--servers"),
    ("ferry.nic-servers", "--nic-servers"),
    ("ferry.spin", "--spin"),
    ("ferry.server-spin", "--server-spin"),
    ("ferry.dns", "--dns"),
    ("ferry.mtu", "--mtu"),
    ("ferry.publish", "--publish"),
];

/// Keys whose values are lists that add up (presets and annotations both apply).
const LISTS: [&str; 3] = ["ferry.allow", "ferry.deny", "ferry.publish"];

/// The flags for `presets` and then `annotations` (those not starting with `ferry.`
/// are ignored): a single-valued key set by both takes the annotation's value.
pub fn flags(
    presets: &[(String, String)],
    annotations: &[(String, String)],
) -> Result<Vec<Flag>, OptionError> {
    let mut out: Vec<(String, Flag)> = Vec::new();
    for (origin, list) in [("preset", presets), ("annotation", annotations)] {
        for (key, value) in list.iter().filter(|(k, _)| k.starts_with("ferry.")) {
            let flag = flag(origin, key, value)?;
            if !LISTS.contains(&key.as_str()) {
                out.retain(|(k, _)| k != key);
            }
            out.push((key.clone(), flag));
        }
    }
    Ok(out.into_iter().map(|(_, f)| f).collect())
}

fn flag(origin: &'static str, key: &str, value: &str) -> Result<Flag, OptionError> {
    let Some((_, name)) = KEYS.iter().find(|(k, _)| *k == key) else {
        return Err(OptionError::Unknown {
            origin,
            key: key.to_owned(),
        });
    };
    let value = value.trim();
    if value.is_empty() {
        return Err(OptionError::Empty {
            origin,
            key: key.to_owned(),
        });
    }
    if key == "ferry.publish" && value == "auto" {
        return Err(OptionError::Unsupported {
            origin,
            key: key.to_owned(),
            value: value.to_owned(),
            why: "publishing every listening port is not implemented yet; name the ports ([IP:]HOST_PORT:PORT,…)",
        });
    }
    let mut args = Vec::new();
    if LISTS.contains(&key) {
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            args.extend([name.to_string(), item.to_owned()]);
        }
    } else {
        args.extend([name.to_string(), value.to_owned()]);
    }
    Ok(Flag {
        source: format!("{origin} {key}={value}"),
        args,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn args(f: &[Flag]) -> Vec<String> {
        f.iter().flat_map(|f| f.args.clone()).collect()
    }

    #[test]
    fn lists_add_up_and_single_values_are_replaced() {
        let f = flags(
            &kv(&[("ferry.deny", "10.0.0.0/8"), ("ferry.net", "nic")]),
            &kv(&[
                ("ferry.deny", "192.0.2.1/32, 198.51.100.0/24"),
                ("ferry.net", "both"),
                ("org.opencontainers.image.title", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(
            args(&f),
            [
                "--deny",
                "10.0.0.0/8",
                "--deny",
                "192.0.2.1/32",
                "--deny",
                "198.51.100.0/24",
                "--net",
                "both"
            ]
        );
        assert_eq!(f[2].source, "annotation ferry.net=both");
    }

    #[test]
    fn unknown_empty_and_unsupported_are_refused() {
        let e = flags(&[], &kv(&[("ferry.alow", "1.2.3.4/32")])).unwrap_err();
        assert!(
            e.to_string()
                .contains("annotation ferry.alow: unknown ferry option")
        );
        assert!(e.to_string().contains("ferry.allow"));
        assert_eq!(
            flags(&kv(&[("ferry.net", " ")]), &[]),
            Err(OptionError::Empty {
                origin: "preset",
                key: "ferry.net".into()
            })
        );
        assert!(matches!(
            flags(&[], &kv(&[("ferry.publish", "auto")])),
            Err(OptionError::Unsupported { .. })
        ));
    }
}
