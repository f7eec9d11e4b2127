//! `ferry oci`: ferry as an OCI runtime for container engines (also run as `ferry-oci`,
//! the lean executable of that name, or a link so named to ferry).
//!
//! runc's command line is answered by `ferry_oci::cli` (`create`, the real runtime's
//! commands, `delete`, `hook`); ferry answers what needs its servers: the container's
//! network side (`side.rs`, started by `create`): `ferry run`'s servers, sandbox, TAP
//! and DNS, in the network namespace the engine gave the container, for the
//! container's lifetime; the container's processes join the sandbox's namespace.
//! `install` writes the engines' registrations (it names ferry's own path).

use ferry_oci::cli;

mod install;
mod report;
mod side;

/// `ferry oci ARGS…` (or `ferry-oci ARGS…`, a link to ferry); returns the exit status.
pub fn main(argv: Vec<String>) -> i32 {
    cli::main(&argv, |inv| match inv.command.as_deref() {
        Some("install") => install::install(inv),
        _ => Ok(side::serve(&inv.args)),
    })
}
