#!/bin/sh
# Coverage-guided libFuzzer on a STABLE toolchain (no cargo-fuzz, no nightly): the
# SanitizerCoverage pass and libfuzzer-sys work without -Zsanitizer; only AddressSanitizer is
# missing, which safe Rust does not need. `--target` keeps build scripts uninstrumented.
#
#     trace/fuzz/run-stable.sh [SECONDS]      (default 60; needs network once for libfuzzer-sys)
#
# Seeds: tests/traces/h200/*.trace and tests/corpus/*.bin, copied into a scratch corpus that
# libFuzzer may grow. A crash is saved as trace/fuzz/artifacts/crash-*; replay it with
# `target/$TARGET/release/read artifacts/crash-…`.
set -eu
cd "$(dirname "$0")"
secs=${1:-60}
target=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
cargo build --release --bin read --target "$target"
mkdir -p corpus/read artifacts
cp ../../tests/traces/h200/*.trace corpus/read/ 2>/dev/null || true
cp ../../tests/corpus/*.bin corpus/read/ 2>/dev/null || true
exec "target/$target/release/read" corpus/read -artifact_prefix=artifacts/ \
    -max_total_time="$secs" -max_len=65536 -print_final_stats=1
