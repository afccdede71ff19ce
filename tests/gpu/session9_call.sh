#!/usr/bin/env bash
# The ninth session's GPU call (issues 29, 30, 33): one command, logs to $OUT.
#   bash tests/gpu/session9_call.sh [parts]     parts: round2 golden uaf models (default: all)
# Needs target/gpu/{libisolate.so,isolate} (and libisolate-old.so for the before columns).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/s9-out}
mkdir -p "$OUT"
parts=${*:-round2 golden uaf models}
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
G="$root/target/gpu"
for part in $parts; do
    echo "##### $part ($(date +%T))"
    case $part in
    round2) bash "$here/host_round2.sh" ;;
    golden) bash "$here/golden_record.sh" ;;
    uaf)
        w=$(mktemp -d)
        nvcc -O2 -o "$w/uaf" "$here/textbook_uaf.cu" || continue
        for bytes in 4096 4194304; do
            for reset in reset noreset; do
                for cfg in plain old-isolate isolate old-guard guard; do
                    lib="$G/libisolate.so"; mode=isolate; guard=off
                    case $cfg in old-*) lib="$G/libisolate-old.so" ;; esac
                    case $cfg in *guard) guard=on ;; esac
                    t="$w/$bytes-$reset-$cfg"; mkdir -p "$t"
                    if [ $cfg = plain ]; then
                        line=$(timeout 60 "$w/uaf" $bytes $reset 2>&1 | tail -n 1); f="-"
                    else
                        line=$(LD_PRELOAD="$lib" ISOLATE_MODE=$mode ISOLATE_GUARD=$guard ISOLATE_TRACE="$t/t-%p.trace" \
                            timeout 60 "$w/uaf" $bytes $reset 2>"$t/err" | tail -n 1)
                        "$G/isolate" summary "$t"/t-*.trace >"$t/sum" 2>&1
                        f=$(grep -m1 -iE '^findings' "$t/sum" | cut -c1-90)
                        { echo "== uaf $bytes $reset $cfg"; cat "$t/err"; cat "$t/sum"; } >>"$OUT/uaf.log"
                    fi
                    printf 'uaf %-8s %-8s %-12s %-32s %s\n' $bytes $reset $cfg "$line" "$f"
                done
            done
        done
        if command -v compute-sanitizer >/dev/null; then
            timeout 120 compute-sanitizer --tool memcheck "$w/uaf" 4096 reset 2>&1 | grep -m3 -E "Invalid|ERROR SUMMARY" | sed 's/^/sanitizer: /'
        fi
        rm -rf "$w"
        ;;
    models)
        python3 "$here/models_check.py" --lib "$G/libisolate.so" --isolate "$G/isolate" \
            --runs ${MODEL_RUNS:-1} --steps ${MODEL_STEPS:-12} --workloads ${MODELS:-bert,gpt2,resnet50}
        ;;
    esac
done
