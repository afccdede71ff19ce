#!/usr/bin/env bash
# The GPU suite's entry point, run from anywhere on the GPU machine:
#
#   bash tests/gpu/run.sh SECTION...     SECTION: log isolate guard compare all
#
# Writes OUT/<section>.log (every step in full), OUT/summary.txt (all tables and checks),
# OUT/results.json, OUT/compare.md (compare section) and OUT/traces.tar.gz (the small traces
# worth keeping); prints each section's table and the checks that did not pass.
# OUT defaults to /tmp/isolate-gpu-out when unset. Knobs (environment): GPU_BUDGET_S (seconds for the
# whole call, default 560), GPU_ROUNDS (3), GPU_STEPS (200), GPU_WARMUP (20), GPU_JOBS (4),
# GPU_AB_ROUNDS (5). Exit status: 0 when every section passed, 1 when a check failed,
# 2 on bad usage, 124 when the suite ran out of time.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
usage() { echo "usage: bash tests/gpu/run.sh {log|isolate|guard|compare|all}..." >&2; exit 2; }
# `trust`: the trace-trust check, run on its own (it is not a suite.py section; see README.md):
#   bash tests/gpu/run.sh trust [ROUNDS]   is   bash tests/gpu/trust.sh [ROUNDS]
if [ "${1:-}" = trust ]; then shift; exec bash "$here/trust.sh" "$@"; fi
[ $# -ge 1 ] || usage
for s in "$@"; do
    case $s in log|isolate|guard|compare|all) ;; *) echo "unknown section: $s" >&2; usage ;; esac
done

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
# The caller's own settings must not leak into the steps (each step sets what it needs).
unset LD_PRELOAD PYTORCH_CUDA_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING
for v in $(env | grep -o '^ISOLATE_[A-Z_]*' || true); do unset "$v"; done

OUT=${OUT:-${TMPDIR:-/tmp}/isolate-gpu-out}
mkdir -p "$OUT"
work=$(mktemp -d "${TMPDIR:-/tmp}/isolate-gpu.XXXXXX")
budget=${GPU_BUDGET_S:-560}
started=$(date +%s)

# Versions, once (each probe with its own timeout: a hung nvidia-smi must not eat the call).
probe() { local label=$1; shift; printf '%-18s %s\n' "$label" "$(timeout 30 "$@" 2>&1 | head -n 3 | tr '\n' ' ')"; }
{
    echo "isolate GPU suite: sections $*; $(date -u +%FT%TZ); $(uname -srm)"
    probe "gpu / driver" nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    probe "torch / cuda" python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO GPU")'
    probe "cupy / triton" python3 -c 'import cupy, triton; print("cupy", cupy.__version__, "triton", triton.__version__)'
    probe "nvcc" bash -c 'nvcc --version | tail -n 2'
    probe "compute-sanitizer" bash -c 'compute-sanitizer --version | head -n 2'
    probe "python" python3 --version
    for f in target/release/libisolate.so target/release/isolate; do
        if [ -e "$repo/$f" ]; then probe "$(basename "$f")" ls -l --time-style=+%FT%T "$repo/$f"
        else printf '%-18s %s\n' "$(basename "$f")" "MISSING: $repo/$f"; fi
    done
    probe "git" git -C "$repo" log -1 --format='%h %s'
} | tee "$work/versions.txt"
echo

# The driver gets what is left of the budget; every step inside has its own timeout, capped by
# that budget, and this timeout is only the backstop.
left=$(( budget - ($(date +%s) - started) ))
timeout -k 5 $((left + 20)) python3 "$here/suite.py" --out "$OUT" --work "$work" --budget "$left" "$@"
rc=$?
case $rc in
    0) verdict="all sections passed" ;;
    1) verdict="some checks FAILED (see above and summary.txt)" ;;
    124|137) verdict="suite.py TIMED OUT after $((left + 20))s (logs so far are in $OUT)" ;;
    *) verdict="suite.py exited with status $rc (a bug in the suite? see the section logs)" ;;
esac

# Traces worth keeping (the driver copied them to $work/keep, at most 14 MiB in all).
if [ -n "$(ls -A "$work/keep" 2>/dev/null)" ]; then
    if tar -czf "$OUT/traces.tar.gz" -C "$work" keep; then
        echo "traces: $OUT/traces.tar.gz ($(ls "$work/keep" | wc -l) files, $(du -h "$OUT/traces.tar.gz" | cut -f1))"
    else
        echo "traces: tar failed with status $?"
    fi
else
    echo "traces: none kept"
fi
echo "files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
echo "run.sh: $verdict; $(( $(date +%s) - started ))s"
exit $rc
