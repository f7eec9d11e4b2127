//! `ferry oci install --docker|--podman|--containerd [--name NAME] [--config FILE]
//! [--link PATH]`: writes the engine's registration of ferry (`ferry_oci::install`
//! makes the text), naming the lean `ferry-oci` next to ferry (or, without one, a link
//! to ferry so named). Presets are the global `--preset`s (Docker's `runtimeArgs`; the
//! one-path engines take annotations instead).

use std::path::{Path, PathBuf};

use ferry_oci::args::Invocation;
use ferry_oci::cli::{LEAN, OciError, Programs};
use ferry_oci::install::{self, InstallError};

/// Which engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Docker,
    Podman,
    Containerd,
}

/// `install`'s options.
struct Options {
    engine: Engine,
    name: String,
    config: Option<PathBuf>,
    link: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Options, OciError> {
    let usage = |why: &str| {
        OciError::Runtime(format!(
            "install: {why} (usage: ferry oci [--preset K=V…] install --docker|--podman|--containerd [--name NAME] [--config FILE] [--link PATH])"
        ))
    };
    let mut engine = None;
    let (mut name, mut config, mut link) = ("ferry".to_owned(), None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--docker" | "--podman" | "--containerd" if engine.is_some() => {
                return Err(usage("one engine at a time"));
            }
            "--docker" => engine = Some(Engine::Docker),
            "--podman" => engine = Some(Engine::Podman),
            "--containerd" => engine = Some(Engine::Containerd),
            "--name" => name = value()?,
            "--config" => config = Some(PathBuf::from(value()?)),
            "--link" => link = Some(PathBuf::from(value()?)),
            _ => return Err(usage(&format!("unknown option {a}"))),
        }
    }
    let engine = engine.ok_or_else(|| usage("name an engine"))?;
    install::check_name(&name).map_err(bad)?;
    Ok(Options {
        engine,
        name,
        config,
        link,
    })
}

fn bad(e: InstallError) -> OciError {
    OciError::Runtime(format!("install: {e}"))
}

/// `install`.
pub(super) fn install(inv: &Invocation) -> Result<i32, OciError> {
    let o = parse(&inv.args)?;
    let programs = Programs::find()?;
    let presets = &inv.globals.presets;
    if o.engine != Engine::Docker && !presets.is_empty() {
        return Err(OciError::Runtime(
            "install: --preset is for --docker (its runtimeArgs); Podman and containerd take ferry.* annotations".into(),
        ));
    }
    match o.engine {
        Engine::Docker => {
            let file = o.config.unwrap_or_else(|| "/etc/docker/daemon.json".into());
            let current = std::fs::read_to_string(&file).ok();
            // dockerd runs the lean executable (or, without presets, the link to ferry)
            // directly, no wrapper script unless there are presets (`runtimeArgs`); else
            // ferry with `runtimeArgs`, an exec slower.
            let direct = (programs.lean.is_some() || presets.is_empty())
                .then(|| one_path(o.link, &programs).ok())
                .flatten();
            let (program, args): (&Path, &[&str]) = match &direct {
                Some(p) => (p, &[]),
                None => (&programs.ferry, &["oci"]),
            };
            let text = install::docker(
                current.as_deref(),
                &o.name,
                &program.to_string_lossy(),
                args,
                presets,
            )
            .map_err(bad)?;
            write(&file, &text)?;
            println!(
                "{}: runtime {n} added; reload dockerd (SIGHUP) and `docker run --runtime {n} …`",
                file.display(),
                n = o.name
            );
        }
        Engine::Podman => {
            let link = one_path(o.link, &programs)?;
            let default = format!("/etc/containers/containers.conf.d/ferry-{}.conf", o.name);
            let file = o.config.unwrap_or_else(|| default.into());
            write(
                &file,
                &install::podman(&o.name, &link.to_string_lossy()).map_err(bad)?,
            )?;
            println!("{}: `podman --runtime {} run …`", file.display(), o.name);
        }
        Engine::Containerd => {
            let link = one_path(o.link, &programs)?;
            let default = format!("/etc/containerd/ferry-{}.toml", o.name);
            let file = o.config.unwrap_or_else(|| default.into());
            let (table, class) =
                install::containerd(&o.name, &link.to_string_lossy()).map_err(bad)?;
            write(&file, &table)?;
            let manifest = file.with_extension("runtimeclass.yaml");
            write(&manifest, &class)?;
            println!(
                "{}: add `imports = [\"{}\"]` to containerd's config.toml (version 2) and restart it; Kubernetes: kubectl apply -f {}",
                file.display(),
                file.display(),
                manifest.display()
            );
        }
    }
    Ok(0)
}

fn write(file: &Path, text: &str) -> Result<(), OciError> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)
            .map_err(OciError::io(format!("creating {}", dir.display())))?;
    }
    std::fs::write(file, text).map_err(OciError::io(format!("writing {}", file.display())))
}

/// What engines that take one path run: the lean `ferry-oci` (or `link`, a link to it),
/// else a link to ferry named `ferry-oci` (`link`, or next to ferry).
fn one_path(link: Option<PathBuf>, programs: &Programs) -> Result<PathBuf, OciError> {
    match (&programs.lean, link) {
        (Some(lean), None) => Ok(lean.clone()),
        (Some(lean), Some(link)) => make_link(link, lean),
        (None, link) => make_link(
            link.unwrap_or_else(|| programs.ferry.with_file_name(LEAN)),
            &programs.ferry,
        ),
    }
}

/// A link `link`, named `ferry-oci`, to `to` (made unless it is one already).
fn make_link(link: PathBuf, to: &Path) -> Result<PathBuf, OciError> {
    if link.file_name().is_none_or(|n| n != LEAN) {
        return Err(OciError::Runtime(format!(
            "install: --link {}: the link must be named ferry-oci (that name makes ferry the runtime)",
            link.display()
        )));
    }
    match std::fs::read_link(&link) {
        Ok(target) if target == to => return Ok(link),
        Ok(_) | Err(_) if link.symlink_metadata().is_ok() => {
            return Err(OciError::Runtime(format!(
                "install: {} exists and is not a link to {}",
                link.display(),
                to.display()
            )));
        }
        _ => {}
    }
    std::os::unix::fs::symlink(to, &link)
        .map_err(OciError::io(format!("linking {}", link.display())))?;
    Ok(link)
}
