#!/usr/bin/env bash
# Model-check the ring's index protocol and sleep/wake handshake with loom
# (src/loom_tests.rs). Uses its own target dir: --cfg loom rebuilds every dependency.
set -euo pipefail
cd "$(dirname "$0")"
export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/loom}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
exec cargo test -p ferry-ring --release --lib loom -- "$@"
