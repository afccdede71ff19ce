#!/usr/bin/env bash
# The eleventh session's GPU calls: parts run in order, each under its own time limit, every
# log into one tarball ($OUT/all.tgz) so that the device tool's 8-file limit holds.
#   bash tests/gpu/session11_call.sh part[:seconds] ...
# parts: golden uaf leak race patterns sanitizer models edges tiers launchroom memviz report diag
# freecost freecostcold paramcost
# Needs target/gpu/{libisolate.so,isolate} (carry target/gpu).
#
# Run in the eleventh session (one call; ~21 of its 30 device minutes went to starts that
# failed): golden:70 uaf:90 race:140 patterns:220. Run in the twelfth (H100, all of it, results
# in docs/gpu-results.md "Twelfth session"): diag:90 uaf:50 patterns:220 models:200; tiers:560
# (5 configs, 2 rounds fit); sanitizer:260 memviz:120 report:120; torch_tests.sh shard 1/2 and
# part of 2/2. Run in the thirteenth (H100, results in docs/gpu-results.md "Thirteenth
# session"): MODEL_RUNS=3 TIER_CONFIGS=default,isolate-ab,fast-prof,log-prof
# TIER_MODELS=resnet50,bert TIER_ROUNDS=1 TIER_STEPS=60 TIER_PLANTED=0 BUDGET_S=120
# BENCH_LIMIT_S=150 ... diag:55 uaf:50 models:290 tiers:165; TIER_CONFIGS=default,log,isolate-ab,fast
# TIER_MODELS=gpt2,resnet50,bert,vit TIER_ROUNDS=3 TIER_STEPS=100 TIER_PLANTED=0 BUDGET_S=470
# BENCH_LIMIT_S=540 ... tiers:560; torch_tests.sh --only (the 23 tests isolate changed).
# Run in the fourteenth (H100, docs/gpu-results.md "Fourteenth session"): profile calls
# TIER_CONFIGS=default,fast-prof TIER_MODELS=resnet50[,bert] TIER_ROUNDS=1 TIER_STEPS=30..60
# ... tiers:100..260; the table: TIER_CONFIGS=default,isolate,fast
# TIER_MODELS=gpt2,resnet50,bert,vit TIER_ROUNDS=3 TIER_STEPS=60 TIER_PLANTED=0 BUDGET_S=330
# BENCH_LIMIT_S=360 ... tiers:380 (300 s).
# Run in the fifteenth (docs/gpu-results.md "Fifteenth session"): MODEL_RUNS=1
# TIER_CONFIGS=default,fast TIER_MODELS=resnet50 TIER_ROUNDS=1 TIER_STEPS=20 TIER_PLANTED=1
# BUDGET_S=200 BENCH_LIMIT_S=230 ... tiers:250 models:300 (122 s); profile calls
# TIER_CONFIGS=default,isolate,fast TIER_MODELS=resnet50,bert TIER_ROUNDS=1 TIER_STEPS=40
# BUDGET_S=130 BENCH_LIMIT_S=160 ... tiers:170; the table: TIER_CONFIGS=default,log,isolate,fast
# TIER_MODELS=gpt2,resnet50,bert,vit TIER_ROUNDS=3 TIER_STEPS=60 TIER_PLANTED=0 BUDGET_S=450
# BENCH_LIMIT_S=480 ... tiers:500 (392 s).
# Run in the sixteenth (H100, docs/gpu-results.md "Sixteenth session"): MODEL_RUNS=1
# MODEL_MODES=isolate,fast TIER_CONFIGS=default,backend,isolate-bare,fast-nostacks,fast
# TIER_MODELS=resnet50,bert TIER_ROUNDS=2 TIER_STEPS=40 ... tiers:235 models:300 (a slow host);
# the table: MODEL_RUNS=1 MODEL_MODES=isolate,fast TIER_CONFIGS=default,backend,log,isolate,fast
# TIER_MODELS=gpt2,resnet50,bert,vit TIER_ROUNDS=3 TIER_STEPS=45 TIER_PLANTED=0 BUDGET_S=360
# BENCH_LIMIT_S=390 ... models:120 tiers:400 (441 s; two rounds fit); the decomposition again
# (TIER_CONFIGS=default,backend,isolate-bare,fast-nostacks,fast TIER_MODELS=resnet50,bert
# TIER_ROUNDS=2 TIER_STEPS=45 BUDGET_S=150 BENCH_LIMIT_S=175 ... tiers:180).
# Left for the next call: the model set in both tiers, four at a time on an 80 GiB H100
# (MODEL_RUNS=1 MODEL_MODES=isolate,fast ... models:120, kind nvidia-h100-x1): a launch that runs
# out of memory now gets the library's memory back and runs again (GPT-2 and BERT failed so
# this session); the table with three full rounds (four configurations, or five with
# BUDGET_S=450 in a call of its own); and whether PyTorch's pluggable allocator avoids the
# stream-ordered backend's own cost: TIER_CONFIGS=default,backend,pluggable,fast,fast-pluggable
# TIER_MODELS=resnet50,bert TIER_ROUNDS=3 ... tiers (tier_bench.py builds its C library with gcc;
# checked on the stand-in only, with and without the library preloaded).
# Run in the seventeenth (H100, docs/gpu-results.md "Seventeenth session"): the pluggable
# experiment (TIER_CONFIGS=default,backend,pluggable,fast,fast-pluggable TIER_MODELS=resnet50,bert
# TIER_ROUNDS=2 ... tiers:270 models:200, a slow host); CUDA_LOG_FILE=stderr MODEL_JOBS=4
# MODEL_MODES=isolate,fast MODELS=gpt2,bert,resnet50,vit ... launchroom:120 models:200 (which call
# failed: none; the runtime's last error left by a successful retry); then the same with the
# fixes, and the table: OUT=$OUT/a ... models:150 launchroom:70; OUT=$OUT/b
# TIER_CONFIGS=default,log,isolate,fast TIER_MODELS=gpt2,resnet50,bert,vit TIER_ROUNDS=3
# TIER_STEPS=45 TIER_PLANTED=0 BUDGET_S=330 BENCH_LIMIT_S=360 ... tiers:370.
# Run in the eighteenth (H100, docs/gpu-results.md "Eighteenth session"): the table in two
# calls on one warm machine (TIER_CONFIGS=default,log,isolate,fast
# TIER_MODELS=gpt2,resnet50,bert,vit TIER_STEPS=40 TIER_PLANTED=0, TIER_ROUNDS=2
# TIER_ROUND_FROM=0 BUDGET_S=450 ... tiers:520, then TIER_ROUNDS=1 TIER_ROUND_FROM=2
# BUDGET_S=300 ... tiers:340; tier_bench_table.py renders both files as one table);
# CUDA_LOG_FILE=stderr MODEL_RUNS=1 MODEL_JOBS=4 MODEL_MODES=isolate,fast
# MODELS=gpt2,bert,resnet50,vit ... models:130.
# Run in the nineteenth (H100, docs/performance.md "Nineteenth session"): the table side by side
# in one call (TIER_LOCKSTEP=5 TIER_CONFIGS=default,default-again,log,isolate,fast
# TIER_MODELS=gpt2,resnet50,bert,vit TIER_ROUNDS=3 TIER_STEPS=40 TIER_PLANTED=0 BUDGET_S=470
# BENCH_LIMIT_S=540 ... tiers:560, 323 s); the decomposition (TIER_CONFIGS=default,
# default-again,backend,pluggable,fast-nostacks,fast TIER_MODELS=resnet50,bert TIER_ROUNDS=3 ...
# tiers:270); the model set four at a time (CUDA_LOG_FILE=stderr MODEL_JOBS=4 ... models:130);
# the pluggable interface's floor (TIER_PIN=gpu ... TIER_CONFIGS=default,default-again,
# default-third,backend,pluggable,pluggable-pool ... TIER_ROUNDS=2 ... tiers:230) and
# default,default-again,pluggable-pool,fast-pluggable,fast,fast-nostacks (tiers:180).
# Run in the twentieth (H100; the H200 never started; docs/gpu-results.md "Twentieth
# session"): OUT=$OUT/ab TIER_LOCKSTEP=5 TIER_CONFIGS=default,default-again,fast,fast-base,log,log-base
# TIER_MODELS=resnet50,bert TIER_ROUNDS=3 TIER_STEPS=40 TIER_PLANTED=0 BUDGET_S=150
# BENCH_LIMIT_S=175 ... tiers:185 (target/gpu/base/libisolate.so: bf7bd3a's);
# OUT=$OUT/drv bash tests/gpu/driver_log_baseline.sh; OUT=$OUT/table TIER_LOCKSTEP=5
# TIER_CONFIGS=default,default-again,log,isolate,fast TIER_MODELS=gpt2,resnet50,bert,vit
# TIER_ROUNDS=3 TIER_STEPS=40 TIER_PLANTED=0 BUDGET_S=250 BENCH_LIMIT_S=300 ... tiers:310.
# Run in the twenty-first: nothing (no machine started in 22 tries; docs/gpu-results.md
# "Twenty-first session" has the two calls meant for it: the table, then fast/isolate against
# fast-base/isolate-base with the session's starting build in target/gpu/base).
# Run in the twenty-second (H200, docs/gpu-results.md "Twenty-second session"; 5 failed starts
# first): OUT=$OUT/table TIER_LOCKSTEP=5 TIER_CONFIGS=default,default-again,backend,log,isolate,fast
# TIER_MODELS=gpt2,resnet50,bert,vit TIER_ROUNDS=3 TIER_STEPS=40 TIER_PLANTED=0 BUDGET_S=470
# BENCH_LIMIT_S=540 ... tiers:560 (357 s); OUT=$OUT/ab TIER_LOCKSTEP=5
# TIER_CONFIGS=default,default-again,fast,fast-base,isolate,isolate-base TIER_MODELS=resnet50,bert
# TIER_ROUNDS=3 TIER_STEPS=40 TIER_PLANTED=0 BUDGET_S=330 BENCH_LIMIT_S=380 ... tiers:390 (158 s;
# target/gpu/base/libisolate.so: fd286f2's).
# Run in the twenty-third (H100; the H200 never came; ten failed starts first;
# docs/gpu-results.md "Twenty-third session"): OUT=$OUT/floor FREECOST_ROUNDS=3 FREECOST_DEPTH=30
# FREECOST_CONFIGS=native,none,backend-pool,fast-nostacks,fast-python,fast TIER_LOCKSTEP=5
# TIER_CONFIGS=default,default-again,backend,backend-pool,fast-python,fast TIER_MODELS=resnet50,bert
# TIER_ROUNDS=3 TIER_STEPS=40 TIER_PLANTED=0 BUDGET_S=170 BENCH_LIMIT_S=200 ... freecost:110 tiers:210
# (183 s); OUT=$OUT/parts FREECOST_ROUNDS=2 FREECOST_CONFIGS=backend-pool,fast-nostacks,isolate,
# isolate-nolaunch TIER_CONFIGS=default,fast-prof TIER_MODELS=resnet50 TIER_ROUNDS=1 TIER_STEPS=40
# BUDGET_S=60 BENCH_LIMIT_S=80 ... freecost:70 tiers:90 (52 s).
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
    launchroom) cmd=(bash "$here/launch_room.sh") ;;
    memviz) cmd=(bash "$here/memviz_size.sh") ;;
    report) cmd=(bash "$here/report_gpt2.sh") ;;
    freecost) cmd=(python3 "$here/free_cost.py" --lib "$G/libisolate.so" --no-pieces
                   --rounds ${FREECOST_ROUNDS:-3} --pairs ${FREECOST_PAIRS:-20000} --depth ${FREECOST_DEPTH:-30}
                   --configs ${FREECOST_CONFIGS:-native,none,backend-pool,log,fast-nostacks,fast-python,fast}) ;;
    # The same, the caches cold: FREECOST_THRASH_KB (2048) KiB written before each pair.
    freecostcold) cmd=(python3 "$here/free_cost.py" --lib "$G/libisolate.so" --no-pieces
                   --rounds ${FREECOST_ROUNDS:-3} --pairs ${FREECOST_PAIRS:-20000} --depth ${FREECOST_DEPTH:-30}
                   --thrash-kb ${FREECOST_THRASH_KB:-2048}
                   --configs ${FREECOST_CONFIGS:-native,none,backend-pool,log,fast-nostacks,fast-python,fast}) ;;
    # A launch's host cost by its parameters' size (16 B to 4,000 B): param_cost.cu.
    paramcost) cmd=(bash -c "nvcc -O2 -o $OUT/param_cost $here/param_cost.cu && $OUT/param_cost ${PARAMCOST_ROUNDS:-40}") ;;
    *) echo "no part $part"; continue ;;
    esac
    export ORDER_BUDGET_S=$(( lim - 15 ))
    (cd "$root" && timeout -k 5 "$lim" "${cmd[@]}") 2>&1 | tee "$OUT/part-$part.log"
    echo "##### $part rc=${PIPESTATUS[0]} ($(( $(date +%s) - t0 ))s)"
done
tar -czf "$FINAL/all.tgz" -C "$OUT" . 2>/dev/null
ls -l "$FINAL/all.tgz"
