//! `ferry bench`: the benchmark harness (crate `ferry-bench`) behind a command line.

use std::path::PathBuf;

use clap::Args;
use ferry_bench::{Error, Experiment, Options, experiments};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Experiments to run: E1 (bandwidth vs buffer size), E2 (RTT and wakes vs spin),
    /// E3 (CPU interference), E4 (batching), E5 (nic mode: per-packet overhead by stage,
    /// MTU, NIC servers), E6 (file → socket: read/write vs sendfile vs module), E7
    /// (several servers and paths), E8 (VM guests), R1 (real clients, nic mode among
    /// them), R2 (short connections, CPU and system calls per request, start-up), C1
    /// (containers: ferry as Docker's runtime vs runc, host network, slirp4netns,
    /// `ferry run`). Default: all.
    #[arg(value_name = "EXPERIMENT", value_parser = experiments::parse)]
    pub experiments: Vec<&'static dyn Experiment>,
    /// Short runs and few points (a few minutes); 2 runs unless --runs is given.
    #[arg(long)]
    pub quick: bool,
    /// Output directory: results.csv, one PNG per experiment, report.md.
    #[arg(long, value_name = "DIR", default_value = "bench-out")]
    pub out: PathBuf,
    /// Measured runs per case, after one warm-up (default 5; 2 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=100))]
    pub runs: Option<u16>,
    /// R1 also runs ferry with `--unconfined` beside the default (what the servers'
    /// seccomp filter and dropped capabilities cost, in the same run).
    #[arg(long)]
    pub unconfined_too: bool,
    /// R1, R2 and E2 also run ferry from another build (its `ferry` binary, with
    /// libferry_preload.so beside it) as `ferry-base` (and, in R1 and R2, its hand-off
    /// as `ferry-base-handoff`; in E8 its `ferry vm` as `ferry-vm-base`; in C1's
    /// start-up its `ferry-oci`, beside it, as Docker's runtime `ferry-base`),
    /// alternating with this one: a before/after comparison of a change in the same run.
    #[arg(long, value_name = "FERRY")]
    pub baseline: Option<PathBuf>,
    /// The newest pasta, run as `pasta-2026` beside Debian's `pasta` (default:
    /// $FERRY_PASTA_2026, else ../peers/pasta next to this ferry's directory, where
    /// `FERRY_PASTA_SRC=DIR scripts/build-peers.sh` puts it; skipped when none).
    #[arg(long = "pasta-2026", value_name = "PASTA")]
    pub pasta_2026: Option<PathBuf>,
}

/// The newest pasta: the flag, else $FERRY_PASTA_2026, else `../peers/pasta` beside
/// ferry's directory (target/peers/pasta for target/release/ferry), if it is a file.
fn newest_pasta(flag: Option<PathBuf>, ferry: &std::path::Path) -> Result<Option<PathBuf>, String> {
    let given = flag.or_else(|| std::env::var_os("FERRY_PASTA_2026").map(PathBuf::from));
    if let Some(p) = given {
        return match p.canonicalize() {
            Ok(c) if c.is_file() => Ok(Some(c)),
            Ok(c) => Err(format!("pasta {}: not a file", c.display())),
            Err(e) => Err(format!("pasta {}: {e}", p.display())),
        };
    }
    let near = ferry
        .parent()
        .and_then(|d| d.parent())
        .map(|t| t.join("peers/pasta"));
    Ok(near.filter(|p| p.is_file()))
}

pub fn main(a: BenchArgs) -> i32 {
    crate::run::init_logging(0);
    let mut experiments = if a.experiments.is_empty() {
        experiments::ALL.to_vec()
    } else {
        a.experiments
    };
    experiments.dedup_by_key(|e| e.id());
    let baseline = match a.baseline.map(|b| b.canonicalize().map_err(|e| (b, e))) {
        None => None,
        Some(Ok(b)) if b.is_file() => Some(b),
        Some(Ok(b)) => {
            eprintln!("ferry bench: --baseline {}: not a file", b.display());
            return 2;
        }
        Some(Err((b, e))) => {
            eprintln!("ferry bench: --baseline {}: {e}", b.display());
            return 2;
        }
    };
    let ferry = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("ferry"));
    let pasta_2026 = match newest_pasta(a.pasta_2026, &ferry) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ferry bench: --pasta-2026 / FERRY_PASTA_2026: {e}");
            return 2;
        }
    };
    let options = Options {
        experiments,
        quick: a.quick,
        out: a.out,
        runs: a.runs.map_or(if a.quick { 2 } else { 5 }, usize::from),
        ferry,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        unconfined_too: a.unconfined_too,
        baseline,
        pasta_2026,
    };
    match ferry_bench::run(&options) {
        Ok(s) => {
            println!("{}", s.tables);
            for e in &s.plot_errors {
                eprintln!("ferry bench: plot not drawn: {e}");
            }
            for k in &s.skipped {
                println!("skipped {}: {} (fix: {})", k.name, k.reason, k.fix);
            }
            println!(
                "\nferry bench: done in {:.0} s; results in {} (report.md, results.csv, *.png)",
                s.seconds,
                s.out.display()
            );
            0
        }
        Err(Error::Interrupted) => {
            eprintln!(
                "ferry bench: interrupted; everything was torn down; finished experiments are in {}",
                options.out.display()
            );
            130
        }
        Err(e @ Error::Leftover(_)) => {
            eprintln!(
                "ferry bench: teardown incomplete: {e}; finished experiments are in {}",
                options.out.display()
            );
            1
        }
        Err(e @ Error::NotRoot) => {
            eprintln!("ferry bench: {e}");
            crate::run::EXIT_SETUP
        }
        Err(e) => {
            eprintln!("ferry bench: {e}");
            1
        }
    }
}
