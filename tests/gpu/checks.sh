#!/usr/bin/env bash
# The GPU checks of issues 13, 15 and 18 in one call, each under its own time limit:
#   bash tests/gpu/checks.sh [stacks] [issue15] [memviz] [host]   (default: all four)
# Needs target/gpu/{libisolate.so,isolate} (or LIB/ISOLATE set). Prints each check's PASS/FAIL
# lines; logs go to $OUT/checks.tgz (one file: the device returns at most 8).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/isolate-gpu-out}
LIB=${LIB:-$PWD/target/gpu/libisolate.so}
ISOLATE=${ISOLATE:-$PWD/target/gpu/isolate}
W=$(mktemp -d)
want=${*:-stacks issue15 memviz host}
step() { # name seconds command...
    local name=$1 secs=$2; shift 2
    echo "=== $name"
    local t0=$(date +%s)
    OUT=$W/$name timeout -k 5 "$secs" "$@" > "$W/$name.log" 2>&1
    local rc=$?
    grep -E "^(PASS|FAIL|SKIP|GOAL|INFO)|passed|failed|^stacks_check|^---|^  " "$W/$name.log" | head -120
    echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"
}
for w in $want; do
    case $w in
    stacks) step stacks 300 python3 tests/gpu/stacks_check.py --isolate "$ISOLATE" --out "$W/stacks" ;;
    issue15) step issue15 300 python3 tests/gpu/issue15.py --lib "$LIB" --isolate "$ISOLATE" --out "$W/issue15" ;;
    memviz)
        mkdir -p "$W/memviz"
        # A real model (transformers' GPT-2), isolate mode: allocations and frees both.
        step memviz-run 180 "$ISOLATE" run --mode isolate --trace "$W/memviz/gpt2-%p.trace" -- \
            python3 tests/gpu/train_small.py --model gpt2 --steps 4 --warmup 2
        step memviz 180 bash -c "python3 tests/gpu/memviz_check.py '$ISOLATE' $W/memviz/gpt2-*.trace --out '$W/memviz'" ;;
    host) step host 240 env ISOLATE_LIB_PATH="$LIB" ISOLATE_CLI_PATH="$ISOLATE" python3 tests/gpu/host_first.py --out "$W/host" ;;
    esac
done
mkdir -p "$OUT"
find "$W" -name '*.trace' -size +20M -delete
tar czf "$OUT/checks.tgz" -C "$W" . 2>/dev/null
ls -la "$OUT"
