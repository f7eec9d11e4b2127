//! `ferry oci install --docker|--podman|--containerd [--name NAME] [--config FILE]
//! [--link PATH]`: writes the engine's registration of ferry (`ferry_oci::install`
//! makes the text). Presets are the global `--preset`s (Docker's `runtimeArgs`; the
//! one-path engines take annotations instead).

use std::path::{Path, PathBuf};

use ferry_oci::args::Invocation;
use ferry_oci::install::{self, InstallError};

use super::OciError;

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
    let ferry = std::env::current_exe().map_err(OciError::io("locating the ferry binary"))?;
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
            // Without presets dockerd runs the link directly (no wrapper script); where
            // no link can be made, ferry with `runtimeArgs` does as well, an exec slower.
            let link = presets
                .is_empty()
                .then(|| make_link(o.link, &ferry).ok())
                .flatten();
            let text = install::docker(
                current.as_deref(),
                &o.name,
                &ferry.to_string_lossy(),
                link.as_deref().map(Path::to_string_lossy).as_deref(),
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
            let link = make_link(o.link, &ferry)?;
            let default = format!("/etc/containers/containers.conf.d/ferry-{}.conf", o.name);
            let file = o.config.unwrap_or_else(|| default.into());
            write(
                &file,
                &install::podman(&o.name, &link.to_string_lossy()).map_err(bad)?,
            )?;
            println!("{}: `podman --runtime {} run …`", file.display(), o.name);
        }
        Engine::Containerd => {
            let link = make_link(o.link, &ferry)?;
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

/// The `ferry-oci` link engines that take one path run (`link`, or next to ferry).
fn make_link(link: Option<PathBuf>, ferry: &Path) -> Result<PathBuf, OciError> {
    let link = link.unwrap_or_else(|| ferry.with_file_name("ferry-oci"));
    if link.file_name().is_none_or(|n| n != "ferry-oci") {
        return Err(OciError::Runtime(format!(
            "install: --link {}: the link must be named ferry-oci (that name makes ferry the runtime)",
            link.display()
        )));
    }
    match std::fs::read_link(&link) {
        Ok(to) if to == ferry => return Ok(link),
        Ok(_) | Err(_) if link.symlink_metadata().is_ok() => {
            return Err(OciError::Runtime(format!(
                "install: {} exists and is not a link to {}",
                link.display(),
                ferry.display()
            )));
        }
        _ => {}
    }
    std::os::unix::fs::symlink(ferry, &link)
        .map_err(OciError::io(format!("linking {}", link.display())))?;
    Ok(link)
}
