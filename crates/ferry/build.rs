//! Links `ferry` with packed relative relocations (`DT_RELR`): its ~23,000 relocations
//! take a few kilobytes instead of 560 KB, which the loader reads and applies on every
//! start (measured in docs/DESIGN.md, "Start-up"). Needs binutils 2.38 and glibc 2.36
//! (Debian 12).

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
