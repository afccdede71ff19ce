#!/usr/bin/env bash
# PyTorch's own CUDA tests (test/test_cuda.py), test by test, plain / stream-ordered backend /
# isolate mode, on the GPU machine, from the repository root:
#
#   bash tests/gpu/torch_tests.sh [--budget 540] [--shard 1/2] [--only REGEX] [--configs plain,async,isolate] ...
#
# Needs tests/gpu/ext/test_cuda.py (public code, git-ignored: pass `tests/gpu/ext` in the device
# tool's carry) and, for the isolate configuration, target/gpu/libisolate.so (carry
# `target/gpu`). Every option goes to tests/gpu/torch_tests.py (`--help` there lists them).
# TEST_CUDAMALLOCASYNC, which the stored test file imports and torch 2.11 lacks, follows each
# configuration's PYTORCH_CUDA_ALLOC_CONF (True under async and isolate, as in PyTorch's CI for
# that backend): see tests/gpu/README-torch-tests.md.
# Writes $OUT/results/{plain,async,isolate,confirm}.jsonl, $OUT/results/meta.json,
# $OUT/summary.txt, $OUT/table.md and $OUT/logs.tar.gz, and prints the tables.
# Exit status: 0 when the run completed (whatever the tests' outcomes), 2 on bad usage or a
# missing file, 3 when the test file does not import.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

module=${TORCH_TESTS_MODULE:-$here/ext/test_cuda.py}
if [ ! -f "$module" ]; then
    echo "torch_tests.sh: $module is missing: it is PyTorch's test/test_cuda.py, kept out of git;" \
         "carry tests/gpu/ext (see tests/gpu/README-torch-tests.md)" >&2
    exit 2
fi

OUT=${OUT:-${TMPDIR:-/tmp}/torch-tests-out}
mkdir -p "$OUT"
work=$(mktemp -d "${TMPDIR:-/tmp}/torch-tests.XXXXXX")

# expecttest (imported by torch.testing._internal.common_utils) is not in every image: the
# pure-Python wheel in tests/gpu/ext/wheels is importable straight from the zip.
extra=()
if ! python3 -c 'import expecttest' 2>/dev/null; then
    whl=$(ls "$here"/ext/wheels/expecttest-*.whl 2>/dev/null | head -n 1)
    if [ -n "$whl" ]; then
        extra=(--pythonpath "$whl")
    else
        echo "torch_tests.sh: python3 has no expecttest and tests/gpu/ext/wheels has no wheel of it;" \
             "common_utils will not import" >&2
    fi
fi

{
    echo "torch tests: $(date -u +%FT%TZ); $(uname -srm)"
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2
    timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -n 1
    python3 -c 'import pytest; print("pytest", pytest.__version__)' 2>/dev/null || echo "pytest: not installed (not needed)"
    ls -l "$repo/target/gpu/libisolate.so" 2>&1
    echo "test file: $module ($(wc -c < "$module") bytes, sha256 $(sha256sum "$module" | cut -c1-16))"
    git -C "$repo" log -1 --format='git: %h %s' 2>/dev/null
}
echo

exec python3 "$here/torch_tests.py" run --module "$module" --out "$OUT" --work "$work" \
    --lib "$repo/target/gpu/libisolate.so" "${extra[@]}" "$@"
