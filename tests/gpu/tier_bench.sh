#!/usr/bin/env bash
# Issue 31 in one GPU call: the fast tier's kernels assembled, the planted-write detection table
# on the GPU, then the tiers on four real models (default / log / isolate / fast, 3 interleaved
# rounds), printed as one table from $OUT/tier_bench.json.
#   bash tests/gpu/tier_bench.sh            (from the repository root)
# Needs target/gpu/{libisolate.so,isolate} (or LIB/ISOLATE set). Estimated time on the H200:
# ptxas ~1 s, planted ~40 s (three processes), the benchmark ~4.5 min (12 processes of ~20-25 s;
# BUDGET_S, default 330, stops starting new runs once spent): about 5.5 minutes in all, at
# most 8.7 (the planted writes are cut at 120 s, the benchmark at 400 s). Files in $OUT:
# TIER_CONFIGS (default,log,isolate,fast), TIER_MODELS (gpt2,resnet50,bert,vit), TIER_ROUNDS (3),
# TIER_ROUND_FROM (0: the first round's number, for a call that runs the later rounds),
# TIER_LOCKSTEP (0; N: each model's configurations side by side, in turns of N timed steps),
# TIER_PIN (a CPU list such as 2-9: every run's processes on those CPUs only),
# TIER_STEPS (20 timed steps), TIER_PLANTED (1: run the planted writes; 0: skip them) and
# BENCH_LIMIT_S (400) change the benchmark's set, rounds, steps and limit.
# tier_bench.json, tier_bench.md (the table, markdown), tier_bench.log, tier_bench-logs.tgz,
# planted_gpu.json, planted_gpu.log.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/isolate-gpu-out}
LIB=${LIB:-$PWD/target/gpu/libisolate.so}
ISOLATE=${ISOLATE:-$PWD/target/gpu/isolate}
mkdir -p "$OUT"
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
echo "=== ptxas: the fast tier's module (interposer/src/policy/sparse.ptx)"
if command -v ptxas >/dev/null; then
    ptxas -arch=sm_90 interposer/src/policy/sparse.ptx -o /dev/null && echo "PASS sparse.ptx assembles"
else
    echo "SKIP no ptxas"
fi
if [ "${TIER_PLANTED:-1}" = 1 ]; then
    echo "=== planted stale writes ($(( $(date +%s) - t0 )) s)"
    timeout -k 5 120 python3 tests/gpu/planted_gpu.py --lib "$LIB" --isolate "$ISOLATE" 2>&1 | tee "$OUT/planted_gpu.log" | grep -v '^$'
fi
echo "=== tiers on real models ($(( $(date +%s) - t0 )) s)"
BUDGET_S=${BUDGET_S:-330} OUT="$OUT" timeout -k 5 ${BENCH_LIMIT_S:-400} python3 tests/gpu/tier_bench.py --lib "$LIB" --isolate "$ISOLATE" \
    --configs "${TIER_CONFIGS:-default,log,isolate,fast}" --models "${TIER_MODELS:-gpt2,resnet50,bert,vit}" \
    --rounds "${TIER_ROUNDS:-3}" --round-from "${TIER_ROUND_FROM:-0}" --lockstep "${TIER_LOCKSTEP:-0}" --steps "${TIER_STEPS:-20}" 2>&1 | tee "$OUT/tier_bench.log" | grep -Ev '^round '
rc=${PIPESTATUS[0]}
if [ -f "$OUT/tier_bench.json" ]; then
    python3 tests/gpu/tier_bench_table.py "$OUT/tier_bench.json" > "$OUT/tier_bench.md"
    # Cut short by the time limit: the table of the runs that finished.
    [ "$rc" -ne 0 ] && { echo "tier_bench.py rc=$rc: the runs that finished:"; cat "$OUT/tier_bench.md"; }
fi
echo "=== done in $(( $(date +%s) - t0 )) s; files in $OUT"
ls -la "$OUT"
