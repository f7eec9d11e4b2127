#!/usr/bin/env bash
# Model-check the ring's index protocol and sleep/wake handshake with loom
# (src/loom_tests.rs): exhaustive by default (about 30 s on 2 cores); set
# LOOM_MAX_PREEMPTIONS=3 for a quick bounded run. --cfg loom rebuilds every dependency,
# so it gets its own target dir (LOOM_TARGET_DIR, default <target>/loom).
set -euo pipefail
cd "$(dirname "$0")"
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-$target/loom}"
export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
exec cargo test -p ferry-ring --release --lib loom -- --test-threads=1 "$@"
