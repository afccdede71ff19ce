#!/usr/bin/env bash
# The eleventh session's GPU calls: parts run in order, each under its own time limit, every
# log into one tarball ($OUT/all.tgz) so that the device tool's 8-file limit holds.
#   bash tests/gpu/session11_call.sh part[:seconds] ...
# parts: golden uaf leak race patterns sanitizer models edges tiers memviz report diag
# Needs target/gpu/{libisolate.so,isolate} (carry target/gpu).
#
# Run in the eleventh session (one call; ~21 of its 30 device minutes went to starts that
# failed): golden:70 uaf:90 race:140 patterns:220. Run in the twelfth (H100, all of it, results
# in docs/gpu-results.md "Twelfth session"): diag:90 uaf:50 patterns:220 models:200; tiers:560
# (5 configs, 2 rounds fit); sanitizer:260 memviz:120 report:120; torch_tests.sh shard 1/2 and
# part of 2/2. Left for the next session, in this order (each line one call):
#   1. diag:60 uaf:50 MODEL_RUNS=3 models:300   the destroyed-stream and guard-exit fixes on the
#      GPU; issue 30's models, 3 runs each (0 findings; the growth script's leak named)
#   2. TIER_PLANTED=0 TIER_CONFIGS=default,isolate,isolate-noorder TIER_STEPS=100 tiers:560   issue 34's cost,
#      3 full rounds in a new order each
#   3. TIER_PLANTED=0 TIER_CONFIGS=default,log,fast TIER_STEPS=100 tiers:560   issue 31's fast tier and log mode
#   4. torch_tests.sh --budget 540 --shard 1/2, then 2/2 (carry tests/gpu/ext): the graph-memory
#      fixes, with the harness's corrected verdicts and TEST_CUDAMALLOCASYNC
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
FINAL=${OUT:-/tmp/s11-out}
export OUT=/tmp/s11-work
rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
G="$root/target/gpu"
t0=$(date +%s)
for spec in "$@"; do
    part=${spec%%:*}; lim=${spec#*:}; [ "$lim" = "$spec" ] && lim=300
    echo "##### $part (limit ${lim}s, at $(( $(date +%s) - t0 ))s)"
    case $part in
    golden) cmd=(bash "$here/golden_record.sh") ;;
    uaf|leak) cmd=(bash "$here/uaf_check.sh" "$part") ;;
    race|patterns|sanitizer|cost) cmd=(bash "$here/order_check.sh" "$part") ;;
    models) cmd=(python3 "$here/models_check.py" --lib "$G/libisolate.so" --isolate "$G/isolate"
                 --runs ${MODEL_RUNS:-1} --steps ${MODEL_STEPS:-12} --jobs ${MODEL_JOBS:-4} --modes ${MODEL_MODES:-isolate}
                 --workloads ${MODELS:-bert,gpt2,resnet50,vit,compiled,cudagraph,dataloader,growth,stale_launch}) ;;
    edges) cmd=(bash "$here/edges.sh") ;;
    diag) cmd=(bash "$here/diag_patterns.sh") ;;
    tiers) cmd=(bash "$here/tier_bench.sh") ;;
    memviz) cmd=(bash "$here/memviz_size.sh") ;;
    report) cmd=(bash "$here/report_gpt2.sh") ;;
    *) echo "no part $part"; continue ;;
    esac
    export ORDER_BUDGET_S=$(( lim - 15 ))
    (cd "$root" && timeout -k 5 "$lim" "${cmd[@]}") 2>&1 | tee "$OUT/part-$part.log"
    echo "##### $part rc=${PIPESTATUS[0]} ($(( $(date +%s) - t0 ))s)"
done
tar -czf "$FINAL/all.tgz" -C "$OUT" . 2>/dev/null
ls -l "$FINAL/all.tgz"
