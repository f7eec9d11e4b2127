#!/usr/bin/env bash
# Builds ferry's fuzz targets (fuzz/: cargo-fuzz, libFuzzer, the stable toolchain without
# a sanitizer) and runs each; fails on any crash, hang (-timeout) or memory blow-up
# (-rss_limit_mb). New inputs go to a scratch corpus, never into fuzz/corpus/.
#
#   scripts/fuzz.sh --smoke            CI: every committed input once, then a few
#                                      seconds of new inputs per target
#   scripts/fuzz.sh SECONDS [TARGET…]  SECONDS of fuzzing per target (all by default),
#                                      with the final statistics of each
#
# Targets: records binding cmsg ring modules server core frame dns (see fuzz/src/lib.rs).
# `server` needs root (a network namespace of its own) and is skipped, saying so,
# without it; `frame` (a NIC server over the in-process harness, its flows carrying
# data) and `dns` (the DNS forwarder over a scripted wire) need nothing.
# Needs cargo-fuzz (scripts/install-deps.sh installs it) and a C++ compiler.
# Environment: FUZZ_JOBS=N runs N targets at once (default 1); FUZZ_OUT=DIR keeps the
# scratch corpora and logs there (default: a temporary directory, removed);
# FUZZ_TARGET_DIR=DIR is the build directory, kept between runs (default: one per
# checkout under ~/.cache/ferry/fuzz-target, as two checkouts must not share one; a
# fresh build takes 5-6 minutes on a busy 2-CPU machine, a rebuild after a change to
# ferry's crates well under one; emptied past 6 GiB, and other checkouts' builds unused
# for a week are removed).
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(records binding cmsg ring modules server core frame dns rings)
SMOKE_SECONDS=8

say() { printf 'fuzz: %s\n' "$*"; }
die() { printf 'fuzz: error: %s\n' "$*" >&2; exit 1; }

mode=${1:---smoke}
shift || true
case "$mode" in
    --smoke) seconds=$SMOKE_SECONDS ;;
    '' | *[!0-9]*) die "usage: scripts/fuzz.sh [--smoke | SECONDS [TARGET...]]" ;;
    *) seconds=$mode ;;
esac
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=("${ALL[@]}")

cargo fuzz --version >/dev/null 2>&1 || die "cargo-fuzz is missing: run scripts/install-deps.sh"
command -v c++ >/dev/null || die "libfuzzer-sys needs a C++ compiler (c++)"

# The same flags for build and run, or cargo-fuzz rebuilds: no sanitizer (stable), the
# shared build directory. Debug assertions and overflow checks for ferry's crates come
# from fuzz/Cargo.toml's profile; the wrapper keeps coverage instrumentation to the
# crates worth exploring.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/ferry/fuzz-target
if [ -n "${FUZZ_TARGET_DIR:-}" ]; then
    target_dir=$FUZZ_TARGET_DIR
else
    # Cargo would take one checkout's build of ferry's crates for another's.
    target_dir=$cache/$(printf '%s' "$PWD" | sha1sum | cut -c1-12)
    find "$cache" -mindepth 1 -maxdepth 1 -type d -mtime +7 -exec rm -rf {} + 2>/dev/null || true
fi
if [ -d "$target_dir" ] && [ "$(du -sm "$target_dir" | cut -f1)" -gt 6144 ]; then
    say "emptying $target_dir (over 6 GiB)"
    rm -rf "$target_dir"
fi
mkdir -p "$target_dir"
touch "$target_dir"
FLAGS=(--sanitizer none --target-dir "$target_dir")
export RUSTC_WRAPPER="$PWD/scripts/fuzz-rustc.sh"

out=${FUZZ_OUT:-}
if [ -z "$out" ]; then
    out=$(mktemp -d -t ferry-fuzz.XXXXXX)
    trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"

start=$(date +%s)
say "building ${targets[*]}"
cargo fuzz build "${FLAGS[@]}"
say "built in $(($(date +%s) - start)) s"

run_one() {
    local t=$1
    local log=$out/$t.log
    local args=(
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$out/$t-"
    )
    [ -f "fuzz/dict/$t.dict" ] && args+=(-dict="fuzz/dict/$t.dict")
    mkdir -p "$out/corpus-$t"
    # libFuzzer runs every committed input first (a regression run), then new ones.
    if ! cargo fuzz run "${FLAGS[@]}" "$t" "$out/corpus-$t" "fuzz/corpus/$t" -- "${args[@]}" \
        >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        say "FAILED: $t (log: $log; the input is in $out/$t-*)"
        return 1
    fi
    local execs cov ft rate
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    say "ok: $t: ${execs:-?} execs, ${rate:-?}/s, cov ${cov:-?}, ft ${ft:-?}," \
        "corpus $(find "$out/corpus-$t" "fuzz/corpus/$t" -type f | wc -l)"
}

failed=0
jobs=${FUZZ_JOBS:-1}
pids=()
for t in "${targets[@]}"; do
    if [ "$t" = server ] && [ "$(id -u)" -ne 0 ]; then
        say "skipped: server (needs root for a network namespace of its own)"
        continue
    fi
    if [ "$jobs" -le 1 ]; then
        run_one "$t" || failed=1
    else
        run_one "$t" &
        pids+=($!)
        if [ "${#pids[@]}" -ge "$jobs" ]; then
            wait "${pids[0]}" || failed=1
            pids=("${pids[@]:1}")
        fi
    fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
say "done in $(($(date +%s) - start)) s"
exit "$failed"
