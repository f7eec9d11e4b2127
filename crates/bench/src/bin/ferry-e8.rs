//! E8's client program (`ferry bench E8`): one VM guest run of one configuration.
//!
//! `ferry-e8 --backend ferry|passt|user|tap-vhost|tap [--bin PATH] [--queues N]
//! --remote IP --remote-ns NS --accel kvm|tcg --kernel FILE --initrd FILE --secs N`
//! starts the backend (ferry vm or passt from `--bin`; none for QEMU's user-mode stack;
//! a TAP in the remote namespace), boots the guest, which runs iperf3 both ways (one
//! stream and four), sockperf's 64 B ping-pong and a ping against the remote, and prints
//! one `E8 KEY VALUE` line per metric (the backend's CPU time per byte among them).
//! `--timed` (ferry only): the ping-pong alone, ferry's NIC servers timing their stages;
//! `E8 stage:NAME µs` and `E8 calls:NAME n` per round trip.

use std::path::PathBuf;

use ferry_bench::experiments::e8::run::{Backend, Opts, run};
use ferry_bench::guest::{Accel, Image};

const USAGE: &str = "usage: ferry-e8 --backend ferry|passt|user|tap-vhost|tap [--bin PATH] \
    [--queues N] [--timed] --remote IP --remote-ns NS --accel kvm|tcg --kernel FILE --initrd FILE --secs N";

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].as_str())
}

fn need<'a>(args: &'a [String], name: &str) -> Result<&'a str, String> {
    arg(args, name).ok_or_else(|| format!("missing {name}; {USAGE}"))
}

fn opts(args: &[String]) -> Result<Opts, String> {
    let backend = need(args, "--backend")?;
    let accel = need(args, "--accel")?;
    let number = |name: &str, default: u32| -> Result<u32, String> {
        arg(args, name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| format!("{name} {v}: not a number"))
        })
    };
    Ok(Opts {
        backend: Backend::parse(backend).ok_or_else(|| format!("unknown backend {backend}"))?,
        bin: arg(args, "--bin").map(PathBuf::from),
        queues: u16::try_from(number("--queues", 1)?).map_err(|_| "--queues: too many")?,
        remote: need(args, "--remote")?.to_owned(),
        remote_ns: need(args, "--remote-ns")?.to_owned(),
        accel: Accel::parse(accel).ok_or_else(|| format!("unknown accelerator {accel}"))?,
        image: Image {
            kernel: need(args, "--kernel")?.into(),
            initrd: need(args, "--initrd")?.into(),
        },
        secs: number("--secs", 2)?,
        timed: args.iter().any(|a| a == "--timed"),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match opts(&args).and_then(|o| run(&o)) {
        Ok(out) => print!("{out}"),
        Err(e) => {
            eprintln!("ferry-e8: {e}");
            std::process::exit(1);
        }
    }
}
