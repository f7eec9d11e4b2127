#!/usr/bin/env bash
# The long-running checks: too slow for CI (scripts/test.sh), run before a release or
# after a change to the shim or the servers, as root, with the packages from
# scripts/install-deps.sh. Builds ferry (release), then runs each named check (all by
# default) niced, and fails if any fails.
#
#   scripts/long-checks.sh [--out DIR] [CHECK...]
#
# Checks:
#   cpython   CPython's own network suites (test_asyncio, test_os, test_socket,
#             test_selectors, test_ssl, test_subprocess, test_signal, test_httplib,
#             test_socketserver, test_urllib2_localnet) natively and through `ferry run`,
#             case for case (scripts/cpython-suites.py): fails on a difference that
#             scripts/cpython-suites-known.tsv does not explain. About 1-2 hours on a
#             busy 2-CPU machine. Results in docs/COMPAT.md.
#
# Output goes to DIR/CHECK (default target/long-checks/CHECK). Environment:
# CPYTHON_SUITES_OPTS adds options to scripts/cpython-suites.py (e.g. "--suites
# test_socket --reruns 5").
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(cpython)
out=target/long-checks

say() { printf 'long-checks: %s\n' "$*"; }
die() { printf 'long-checks: error: %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" = --out ]; then
    [ $# -ge 2 ] || die "--out needs a directory"
    out=$2
    shift 2
fi
checks=("$@")
[ "${#checks[@]}" -gt 0 ] || checks=("${ALL[@]}")
for c in "${checks[@]}"; do
    case " ${ALL[*]} " in *" $c "*) ;; *) die "unknown check '$c' (known: ${ALL[*]})" ;; esac
done
[ "$(id -u)" -eq 0 ] || die "must run as root (ferry run's sandbox and the end-to-end set-up)"

say "cargo build --workspace --release --locked"
nice cargo build --workspace --release --locked

failed=()
for c in "${checks[@]}"; do
    say "$c: output in $out/$c"
    mkdir -p "$out/$c"
    case "$c" in
        cpython)
            # shellcheck disable=SC2086  # the options are meant to split
            nice python3 scripts/cpython-suites.py --out "$out/$c" ${CPYTHON_SUITES_OPTS:-} \
                || failed+=("$c")
            ;;
    esac
done

if [ "${#failed[@]}" -gt 0 ]; then
    die "failed: ${failed[*]}"
fi
say "all passed: ${checks[*]}"
