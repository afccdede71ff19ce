#!/usr/bin/env bash
# Builds what a device call carries (run here, where the Rust toolchain is; the GPU machine has
# none): target/gpu/{libisolate.so,isolate} from the working tree, and, given a revision, the
# library of that revision as target/gpu/base/libisolate.so (what tier_bench.sh's `-base`
# configurations preload) from a worktree of its own, with its own target directory, so that
# the working tree's build is not touched. Debug information is stripped (the carry's limit is
# 64 MiB in all; symbols stay).
#
#   bash tests/gpu/build_gpu_libs.sh [BASE_REV]
#   # then: run(..., carry=["target/gpu"])
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
cargo build --release -p isolate-interposer -p isolate-analyzer
mkdir -p target/gpu
strip --strip-debug -o target/gpu/libisolate.so target/release/libisolate.so
strip --strip-debug -o target/gpu/isolate target/release/isolate
if [ $# -ge 1 ]; then
    rev=$(git rev-parse --verify "$1^{commit}")
    wt="$repo/target/base-worktree"
    git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
    git worktree prune
    git worktree add --detach "$wt" "$rev" >/dev/null
    (cd "$wt" && CARGO_TARGET_DIR="$repo/target/base-build" cargo build --release -p isolate-interposer)
    mkdir -p target/gpu/base
    strip --strip-debug -o target/gpu/base/libisolate.so target/base-build/release/libisolate.so
    git worktree remove --force "$wt"
    echo "target/gpu/base/libisolate.so: ${rev:0:7}"
fi
echo "target/gpu/libisolate.so: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
ls -l target/gpu target/gpu/base 2>/dev/null
