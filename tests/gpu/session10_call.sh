#!/usr/bin/env bash
# The tenth session's GPU calls (issues 30, 31, 32, 34): one command, logs to $OUT.
#   bash tests/gpu/session10_call.sh [parts]
# parts: models record, or any tests/gpu/<part>.sh by name. The tenth session was lent no GPU;
# the calls prepared for the next (about 30 minutes of device time in all):
#   1. session10_call.sh models uaf_check edges        (issue 30 must-shows, 33-style host checks)
#   2. order_check.sh race patterns ; order_check.sh cost   (issue 34)
#   3. tier_bench.sh                                   (issue 31)
#   4. torch_tests.sh --budget 540 --shard 1/2 (then 2/2; carry tests/gpu/ext)   (issue 30.6)
#   5. memviz_size.sh ; report_gpt2.sh ; order_check.sh sanitizer   (issues 32, 34)
# Needs target/gpu/{libisolate.so,isolate}.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/s10-out}
mkdir -p "$OUT"
parts=${*:-models record}
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
G="$root/target/gpu"
for part in $parts; do
    echo "##### $part ($(date +%T))"
    case $part in
    models)
        python3 "$here/models_check.py" --lib "$G/libisolate.so" --isolate "$G/isolate" \
            --runs ${MODEL_RUNS:-1} --steps ${MODEL_STEPS:-12} --jobs ${MODEL_JOBS:-3} \
            --modes ${MODEL_MODES:-isolate} \
            --workloads ${MODELS:-bert,gpt2,resnet50,vit,compiled,cudagraph,dataloader,growth}
        ;;
    record)
        mkdir -p "$OUT/record"
        LD_PRELOAD="$G/libisolate.so" ISOLATE_TRACE="$OUT/record/gpt2-%p.trace" \
            python3 "$here/record_gpt2.py" --steps 10 --snapshot "$OUT/record/gpt2-torch.pickle"
        python3 -m torch.cuda._memory_viz trace_plot "$OUT/record/gpt2-torch.pickle" \
            -o "$OUT/record/gpt2-torch-trace.html" && ls -l "$OUT/record"
        "$G/isolate" summary "$OUT"/record/gpt2-*.trace | head -20
        ;;
    *)
        if [ -f "$here/$part.sh" ]; then bash "$here/$part.sh"; else echo "no part $part"; fi
        ;;
    esac
done
