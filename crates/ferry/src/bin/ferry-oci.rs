//! `ferry-oci`: the lean OCI runtime executable engines run for each runtime call
//! (runc's command line). It links only `ferry_oci` (no servers, no wasmtime), so
//! `start`, `state`, `kill`, `delete` and the hooks cost an exec of a small binary; the
//! commands that need ferry's servers (`create`, which starts the container's network
//! side, and `install`) are handed to `ferry oci`, found next to it.
#![deny(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use ferry_oci::cli::{self, OciError, Programs};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let code = cli::main(&argv, |_| {
        let ferry = Programs::find()?.ferry;
        let e = Command::new(&ferry)
            .arg0("ferry")
            .arg("oci")
            .args(&argv)
            .exec();
        Err(OciError::io(format!("starting {}", ferry.display()))(e))
    });
    ExitCode::from(code.clamp(0, 255) as u8)
}
