//! `ferry-burner SECONDS`: a CPU-bound floating-point loop (S0's FLOPS process). Runs for
//! SECONDS of wall time and prints `seconds S` and `MFlops M` (million floating-point
//! operations per second of wall time), so a burner that shares its CPU reports less.
#![deny(unsafe_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Multiply-adds per inner block: 8 independent chains × 2 flops × 4096 iterations.
const LANES: usize = 8;
const INNER: u64 = 4096;

fn main() {
    let secs: f64 = match std::env::args().nth(1).map(|s| s.parse()) {
        Some(Ok(s)) if s > 0.0 => s,
        _ => {
            eprintln!("usage: ferry-burner SECONDS");
            std::process::exit(2);
        }
    };
    let span = Duration::from_secs_f64(secs);
    let mut acc = [1.0f64; LANES];
    let mul = black_box(0.999_999_9f64);
    let add = black_box(1e-7f64);
    let mut blocks = 0u64;
    let start = Instant::now();
    while start.elapsed() < span {
        for _ in 0..INNER {
            for a in &mut acc {
                *a = *a * mul + add;
            }
        }
        acc = black_box(acc);
        blocks += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let flops = blocks as f64 * INNER as f64 * LANES as f64 * 2.0;
    println!("seconds {elapsed:.3}");
    println!("MFlops {:.1}", flops / elapsed / 1e6);
    // Keep the result observable so the loop is not optimized away.
    if acc.iter().sum::<f64>().is_nan() {
        eprintln!("nan");
    }
}
