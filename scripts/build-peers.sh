#!/usr/bin/env bash
# Builds the newest peers `ferry bench` compares against, from sources you have.
# Today: pasta and passt from a source tree, for the bench configurations `pasta-2026`
# beside Debian's `pasta`, and `passt-2026` (passt's `--vhost-user` backend for E8's
# VM guests).
#
#   FERRY_PASTA_SRC=DIR scripts/build-peers.sh      (or: scripts/build-peers.sh --pasta-src DIR)
#
# The source tree is copied (never built in place: it may be shared or read-only) to
# target/peers/passt-src and built with `make`; the binary is installed as
# target/peers/pasta and target/peers/passt, where `ferry bench` looks for them (next to
# target/release/ferry: ../peers/pasta; FERRY_PASTA_2026=PATH points it elsewhere). Without a source tree
# nothing is built and `ferry bench` skips `pasta-2026` with a note in its report.
set -euo pipefail

say() { printf 'build-peers: %s\n' "$*"; }
die() { printf 'build-peers: error: %s\n' "$*" >&2; exit 1; }

src="${FERRY_PASTA_SRC:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --pasta-src) [ $# -ge 2 ] || die "--pasta-src needs a directory"; src="$2"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${CARGO_TARGET_DIR:-$root/target}/peers"

if [ -z "$src" ]; then
    say "no pasta source given (FERRY_PASTA_SRC=DIR or --pasta-src DIR): nothing built;"
    say "ferry bench will skip pasta-2026"
    exit 0
fi
[ -f "$src/Makefile" ] && [ -f "$src/passt.c" ] || die "$src is not a passt source tree (no Makefile/passt.c)"
command -v make >/dev/null || die "make not found (apt-get install make)"
command -v cc >/dev/null || die "cc not found (apt-get install gcc)"

mkdir -p "$out"
build="$out/passt-src"
# Our own copy, replaced whole on each build (a path under our target dir only).
case "$build" in */peers/passt-src) rm -rf -- "$build" ;; *) die "unexpected build dir $build" ;; esac
cp -a "$src" "$build"
# A source tree that was built in place carries its objects: start clean.
make -C "$build" clean >/dev/null 2>&1 || true
say "make -C $build (about 20 s)"
make -C "$build" -j"$(nproc)" VERSION="$(basename "$src")" passt pasta >/dev/null
for bin in pasta passt; do
    [ -x "$build/$bin" ] || die "make produced no $bin binary"
    install -m 0755 "$build/$bin" "$out/$bin"
    say "installed $out/$bin: $("$out/$bin" --version 2>/dev/null | head -n 1)"
done
