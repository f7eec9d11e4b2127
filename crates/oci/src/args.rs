//! runc's command line, as engines call a runtime: `[GLOBAL…] COMMAND [OPTION…] ID`.
//!
//! Global options runc knows are kept to be forwarded to the real runtime; ferry's own
//! (`--runtime PATH`, `--preset KEY=VALUE`) are taken out. Long options may be written
//! `--name value`, `--name=value` or with one dash (as runc's parser allows).

use std::path::PathBuf;

/// A bad command line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    /// An option that takes a value came last.
    #[error("option {0} needs a value")]
    MissingValue(String),
    /// A global option neither runc nor ferry knows.
    #[error(
        "unknown global option {0} (runc's: --root, --log, --log-format, --systemd-cgroup, --debug, --criu, --rootless; ferry's: --runtime, --preset)"
    )]
    UnknownGlobal(String),
    /// An option of `create`/`delete` that is not runc's.
    #[error("{command}: unknown option {option}")]
    UnknownOption {
        /// Which command.
        command: &'static str,
        /// The option.
        option: String,
    },
    /// No container id, or more than one.
    #[error("{0}: expects exactly one container id")]
    Id(&'static str),
    /// `--preset` without `=`.
    #[error("--preset {0}: expected KEY=VALUE (e.g. --preset ferry.deny=10.0.0.0/8)")]
    Preset(String),
    /// `--log-format` other than text or json.
    #[error("--log-format {0}: expected text or json")]
    LogFormat(String),
}

/// Global options: runc's, to forward, and ferry's.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Globals {
    /// runc's global options as given (normalized to `--name`, values separate).
    pub forward: Vec<String>,
    /// `--root`: the real runtime's state directory.
    pub root: Option<PathBuf>,
    /// `--log`: where the engine reads the runtime's errors.
    pub log: Option<PathBuf>,
    /// `--log-format json`.
    pub log_json: bool,
    /// ferry's `--runtime`: the real runtime (default: `runc` in `PATH`).
    pub runtime: Option<PathBuf>,
    /// ferry's `--preset KEY=VALUE`: options for every container, under its annotations.
    pub presets: Vec<(String, String)>,
}

/// A parsed command line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    /// The global options.
    pub globals: Globals,
    /// The command (`create`, `start`, …); `None` with `--version`/`--help` or nothing.
    pub command: Option<String>,
    /// What follows the command.
    pub args: Vec<String>,
    /// `--version`/`-v` was given.
    pub version: bool,
    /// `--help`/`-h` was given.
    pub help: bool,
}

const RUNC_VALUED: [&str; 5] = ["root", "log", "log-format", "criu", "rootless"];
const RUNC_FLAGS: [&str; 2] = ["systemd-cgroup", "debug"];

/// `--name=value` / `-name` split into (name, inline value); `None` for a non-option.
fn split_option(arg: &str) -> Option<(String, Option<String>)> {
    let body = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    if body.is_empty() {
        return None;
    }
    Some(match body.split_once('=') {
        Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
        None => (body.to_owned(), None),
    })
}

/// Parses `[GLOBAL…] COMMAND ARGS…`.
pub fn parse(argv: &[String]) -> Result<Invocation, ArgsError> {
    let mut inv = Invocation::default();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let Some((name, inline)) = split_option(arg) else {
            inv.command = Some(arg.clone());
            inv.args = it.cloned().collect();
            break;
        };
        let mut value = |n: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| ArgsError::MissingValue(format!("--{n}")))
        };
        match name.as_str() {
            "v" | "version" => inv.version = true,
            "h" | "help" => inv.help = true,
            "runtime" => inv.globals.runtime = Some(value("runtime")?.into()),
            "preset" => {
                let v = value("preset")?;
                let (k, val) = v
                    .split_once('=')
                    .ok_or_else(|| ArgsError::Preset(v.clone()))?;
                inv.globals.presets.push((k.to_owned(), val.to_owned()));
            }
            n if RUNC_FLAGS.contains(&n) => inv.globals.forward.push(format!("--{n}")),
            n if RUNC_VALUED.contains(&n) => {
                let v = value(n)?;
                match n {
                    "root" => inv.globals.root = Some(v.clone().into()),
                    "log" => inv.globals.log = Some(v.clone().into()),
                    "log-format" => match v.as_str() {
                        "json" => inv.globals.log_json = true,
                        "text" => inv.globals.log_json = false,
                        _ => return Err(ArgsError::LogFormat(v)),
                    },
                    _ => {}
                }
                inv.globals.forward.extend([format!("--{n}"), v]);
            }
            _ => return Err(ArgsError::UnknownGlobal(arg.clone())),
        }
    }
    Ok(inv)
}

/// `create`'s options.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Create {
    /// `--bundle`/`-b` (default: the working directory).
    pub bundle: PathBuf,
    /// `--pid-file`.
    pub pid_file: Option<PathBuf>,
    /// The other options, forwarded as given (`--console-socket S`, `--no-pivot`, …).
    pub forward: Vec<String>,
    /// The container's id.
    pub id: String,
}

const CREATE_VALUED: [&str; 4] = ["bundle", "b", "pid-file", "console-socket"];
const CREATE_MORE_VALUED: [&str; 1] = ["preserve-fds"];
const CREATE_FLAGS: [&str; 2] = ["no-pivot", "no-new-keyring"];

/// Parses `create`'s arguments.
pub fn parse_create(args: &[String]) -> Result<Create, ArgsError> {
    let mut c = Create {
        bundle: PathBuf::from("."),
        ..Create::default()
    };
    let mut ids = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let Some((name, inline)) = split_option(arg) else {
            ids.push(arg.clone());
            continue;
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| ArgsError::MissingValue(format!("--{name}")))
        };
        match name.as_str() {
            "bundle" | "b" => c.bundle = value()?.into(),
            "pid-file" => c.pid_file = Some(value()?.into()),
            n if CREATE_VALUED.contains(&n) || CREATE_MORE_VALUED.contains(&n) => {
                let v = value()?;
                c.forward.extend([format!("--{n}"), v]);
            }
            n if CREATE_FLAGS.contains(&n) => c.forward.push(format!("--{n}")),
            _ => {
                return Err(ArgsError::UnknownOption {
                    command: "create",
                    option: arg.clone(),
                });
            }
        }
    }
    c.id = one_id("create", ids)?;
    Ok(c)
}

/// `delete`'s options: (`--force`, id).
pub fn parse_delete(args: &[String]) -> Result<(bool, String), ArgsError> {
    let mut force = false;
    let mut ids = Vec::new();
    for arg in args {
        match split_option(arg) {
            None => ids.push(arg.clone()),
            Some((n, None)) if n == "force" || n == "f" => force = true,
            Some(_) => {
                return Err(ArgsError::UnknownOption {
                    command: "delete",
                    option: arg.clone(),
                });
            }
        }
    }
    Ok((force, one_id("delete", ids)?))
}

fn one_id(command: &'static str, mut ids: Vec<String>) -> Result<String, ArgsError> {
    match (ids.pop(), ids.is_empty()) {
        (Some(id), true) => Ok(id),
        _ => Err(ArgsError::Id(command)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn engine_globals_forwarded_ferry_globals_taken() {
        let inv = parse(&v(
            "--root /run/x --log /l.json --log-format json --systemd-cgroup --preset ferry.deny=10.0.0.0/8 --runtime=/usr/sbin/runc create --bundle /b id1",
        ))
        .unwrap();
        assert_eq!(
            inv.globals.forward,
            v("--root /run/x --log /l.json --log-format json --systemd-cgroup")
        );
        assert_eq!(inv.globals.root, Some("/run/x".into()));
        assert!(inv.globals.log_json);
        assert_eq!(inv.globals.runtime, Some("/usr/sbin/runc".into()));
        assert_eq!(
            inv.globals.presets,
            [("ferry.deny".to_owned(), "10.0.0.0/8".to_owned())]
        );
        assert_eq!(inv.command.as_deref(), Some("create"));
        assert_eq!(inv.args, v("--bundle /b id1"));
    }

    #[test]
    fn single_dash_and_inline_values() {
        let inv = parse(&v("-root=/r -debug state x")).unwrap();
        assert_eq!(inv.globals.forward, v("--root /r --debug"));
        assert_eq!(inv.args, v("x"));
        assert!(parse(&v("--version")).unwrap().version);
    }

    #[test]
    fn bad_globals_are_named() {
        assert_eq!(
            parse(&v("--bogus create x")),
            Err(ArgsError::UnknownGlobal("--bogus".into()))
        );
        assert_eq!(
            parse(&v("--root")),
            Err(ArgsError::MissingValue("--root".into()))
        );
        assert_eq!(
            parse(&v("--preset nokey create")),
            Err(ArgsError::Preset("nokey".into()))
        );
        assert_eq!(
            parse(&v("--log-format xml")),
            Err(ArgsError::LogFormat("xml".into()))
        );
    }

    #[test]
    fn create_options() {
        let c = parse_create(&v(
            "--bundle /b --pid-file /p --console-socket /s --no-pivot --preserve-fds=2 id",
        ))
        .unwrap();
        assert_eq!(c.bundle, PathBuf::from("/b"));
        assert_eq!(c.pid_file, Some("/p".into()));
        assert_eq!(
            c.forward,
            v("--console-socket /s --no-pivot --preserve-fds 2")
        );
        assert_eq!(c.id, "id");
        assert_eq!(parse_create(&v("-b /b")), Err(ArgsError::Id("create")));
        assert_eq!(parse_create(&v("a b")), Err(ArgsError::Id("create")));
        assert!(matches!(
            parse_create(&v("--weird x")),
            Err(ArgsError::UnknownOption { .. })
        ));
    }

    #[test]
    fn delete_options() {
        assert_eq!(parse_delete(&v("--force x")), Ok((true, "x".into())));
        assert_eq!(parse_delete(&v("x")), Ok((false, "x".into())));
        assert_eq!(parse_delete(&v("")), Err(ArgsError::Id("delete")));
    }
}
