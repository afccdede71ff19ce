#!/usr/bin/env bash
# Builds the cuda-isolate wheel into target/wheels/: libisolate.so (release) copied into the
# wheel's scripts, then maturin builds the `isolate` binary and the wheel (manylinux tag chosen by
# maturin's audit from the glibc symbols the binary needs). Needs maturin (pip install maturin).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p isolate-interposer
# Into the wheel's scripts: installed beside `isolate`, where `isolate run` looks for it.
mkdir -p python/cuda_isolate.data/scripts
cp target/release/libisolate.so python/cuda_isolate.data/scripts/libisolate.so
cd python
exec maturin build --release --out ../target/wheels "$@"
