#!/usr/bin/env bash
# Builds the cuda-isolate wheel into target/wheels/: libisolate.so (release) copied into the
# wheel's scripts and the start-up hook's cuda_isolate.pth into its site-packages, then maturin
# builds the `isolate` binary and the wheel (manylinux tag chosen by maturin's audit from the glibc
# symbol versions the binary needs: built on the CI image, Debian 12 with glibc 2.36, both
# binaries need GLIBC_2.34, so manylinux_2_34). Needs maturin (pip install maturin).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p isolate-interposer
# Into the wheel's scripts: installed beside `isolate`, where `isolate run` looks for it.
mkdir -p python/cuda_isolate.data/scripts python/cuda_isolate.data/purelib
cp target/release/libisolate.so python/cuda_isolate.data/scripts/libisolate.so
# Into site-packages: the start-up hook's one line (cuda_isolate/startup.py: NVTX and CuPy's
# pool off in isolate mode; it imports nothing unless LD_PRELOAD names libisolate.so).
cp python/cuda_isolate.pth python/cuda_isolate.data/purelib/cuda_isolate.pth
cd python
exec maturin build --release --out ../target/wheels "$@"
