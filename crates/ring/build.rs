//! Declares the `loom` cfg (set by `loom.sh` through RUSTFLAGS) so that `cfg(loom)` is
//! not an unexpected cfg; the crate's lints come from the workspace.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
