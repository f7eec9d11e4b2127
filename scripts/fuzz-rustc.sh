#!/bin/sh
# The rustc wrapper of the fuzz build (scripts/fuzz.sh sets RUSTC_WRAPPER to it): keeps
# libFuzzer's coverage instrumentation (cargo-fuzz's -Cpasses=sancov-module) for the
# crates whose branches the fuzzer should explore — ferry's own, the fuzz crate, the
# wasm parsers the `modules` target feeds and the TCP/IP stack (smoltcp) the `frame`
# target feeds — and drops it for every other dependency (wasmtime and cranelift above
# all): less to compile, and faster targets.
rustc=$1
shift
case " $* " in
*" --crate-name ferry"* | *" --crate-name wasmparser "* | *" --crate-name wast "* | \
    *" --crate-name wat "* | *" --crate-name smoltcp "* | *" --crate-name records "* | \
    *" --crate-name binding "* | *" --crate-name cmsg "* | *" --crate-name ring "* | \
    *" --crate-name modules "* | *" --crate-name server "* | *" --crate-name frame "*)
    exec "$rustc" "$@"
    ;;
esac
for arg; do
    shift
    [ "$arg" = "-Cpasses=sancov-module" ] || set -- "$@" "$arg"
done
exec "$rustc" "$@"
