#!/bin/sh
# Coverage-guided libFuzzer on a STABLE toolchain (no cargo-fuzz, no nightly): the
# SanitizerCoverage pass and libfuzzer-sys work without -Zsanitizer; only AddressSanitizer is
# missing, which safe Rust does not need. `--target` keeps build scripts uninstrumented.
#
#     trace/fuzz/run-stable.sh [SECONDS]      (default 60; needs network once for libfuzzer-sys,
#                                              and a C++ compiler `c++`; CI runs it: .ci/run)
#
# Builds with `--locked` (trace/fuzz/Cargo.lock) into trace/fuzz/target, whatever
# CARGO_TARGET_DIR says, so the main workspace's target dir never sees these flags.
# Seeds: tests/traces/h200/*.trace and tests/corpus/*.bin, copied into a scratch corpus that
# libFuzzer may grow. An input over 10 s is a failure, like a panic or running out of memory.
#
# Exit status 0: the time ran out and no input failed. Non-zero: the build failed, or libFuzzer
# found a failing input; it is saved as trace/fuzz/artifacts/{crash,timeout,oom}-<sha1>, and the
# script prints its path, the command that replays it, and its bytes in base64 (for CI logs).
set -eu
cd "$(dirname "$0")"
here=$(pwd)
secs=${1:-60}
case $secs in
'' | *[!0-9]*)
    echo "usage: $0 [SECONDS]" >&2
    exit 2
    ;;
esac
target=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$here/target"
unset CARGO_ENCODED_RUSTFLAGS
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
t0=$(date +%s)
if ! cargo build --locked --release --bin read --target "$target"; then
    echo "run-stable: FAILED: the fuzz target did not build" >&2
    exit 1
fi
echo "run-stable: built in $(($(date +%s) - t0)) s"
bin=$CARGO_TARGET_DIR/$target/release/read
mkdir -p corpus/read artifacts
cp ../../tests/traces/h200/*.trace corpus/read/ 2>/dev/null || true
cp ../../tests/corpus/*.bin corpus/read/ 2>/dev/null || true
echo "run-stable: fuzzing for $secs s from $(ls corpus/read | wc -l) inputs in $here/corpus/read"

start=$(mktemp)
status=0
"$bin" corpus/read -artifact_prefix="$here/artifacts/" -max_total_time="$secs" -timeout=10 \
    -max_len=65536 -print_final_stats=1 || status=$?
if [ "$status" -ne 0 ]; then
    echo "run-stable: FAILED: libFuzzer exited with status $status" >&2
    find artifacts -type f -newer "$start" | while read -r f; do
        echo "run-stable: failing input saved as $here/$f ($(wc -c <"$f") bytes)" >&2
        echo "run-stable: replay it: $bin $here/$f" >&2
        echo "run-stable: its bytes in base64 (base64 -d > input):" >&2
        base64 "$f" >&2
    done
fi
rm -f "$start"
exit "$status"
