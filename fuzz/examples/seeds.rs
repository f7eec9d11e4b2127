//! Writes the starting corpus of every fuzz target: `cargo run --example seeds [DIR]`
//! (default: `corpus/` beside this crate's manifest).

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
    ferry_fuzz::seeds::write_all(&dir)?;
    println!("seeds written to {}", dir.display());
    Ok(())
}
