#!/usr/bin/env bash
# Triage of order_check.py's patterns that failed on the GPU (eleventh session): each named
# pattern under plain PyTorch, its stream-ordered backend alone, and isolate mode with parts of
# the library turned off, with Python's faulthandler on (a crash names its Python line) and,
# where gdb is installed, the isolate run under gdb for the native backtrace.
#   bash tests/gpu/diag_patterns.sh [pattern ...]      (default: legacy_blocking nccl)
# Needs target/gpu/{libisolate.so,isolate}. Prints one line a run; logs to $OUT/diag/.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/diag-out}
mkdir -p "$OUT/diag"
LIB="$root/target/gpu/libisolate.so"
CLI="$root/target/gpu/isolate"
work=$(mktemp -d)
# order_check.py's own worker (its module runs nothing on import).
python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import order_check; open(sys.argv[2], "w").write(order_check.WORKER)' \
    "$here" "$work/worker.py"
pats=${*:-legacy_blocking_early_destroy legacy_blocking nccl}
printf '%-16s %-22s %4s %6s %s\n' pattern config rc wall "findings / last lines"
for p in $pats; do
    for cfg in plain async isolate isolate-noorder isolate-nolaunch isolate-nostacks; do
        envs=()
        case $cfg in
        plain) ;;
        async) envs=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) ;;
        isolate) envs=(LD_PRELOAD="$LIB" ISOLATE_MODE=isolate) ;;
        isolate-noorder) envs=(LD_PRELOAD="$LIB" ISOLATE_MODE=isolate ISOLATE_TEST_ORDER=off) ;;
        isolate-nolaunch) envs=(LD_PRELOAD="$LIB" ISOLATE_MODE=isolate ISOLATE_CHECK_LAUNCH=off) ;;
        isolate-nostacks) envs=(LD_PRELOAD="$LIB" ISOLATE_MODE=isolate ISOLATE_STACKS=none) ;;
        esac
        log="$OUT/diag/$p-$cfg.log"
        rm -f "$work"/t-*.trace
        t0=$(date +%s.%N)
        env "${envs[@]}" ISOLATE_TRACE="$work/t-%p.trace" timeout 120 python3 -X faulthandler "$work/worker.py" "$p" >"$log" 2>&1
        rc=$?
        wall=$(python3 -c "import time; print('%.1f' % (time.time() - $t0))")
        f=-
        if ls "$work"/t-*.trace >/dev/null 2>&1; then
            "$CLI" summary "$work"/t-*.trace >>"$log" 2>&1
            f=$("$CLI" summary --json "$work"/t-*.trace 2>/dev/null | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s.get("findings"))' 2>/dev/null)
        fi
        printf '%-16s %-22s %4s %6s %s | %s\n' "$p" "$cfg" "$rc" "$wall" "$f" "$(grep -v '^isolate: isolate mode' "$log" | grep -m3 -E 'RESULT|Fatal|File|Error|error' | tr '\n' ' ' | cut -c1-150)"
    done
    if command -v gdb >/dev/null; then
        # The preload is the debuggee's alone (gdb itself runs without it).
        ISOLATE_MODE=isolate ISOLATE_TRACE="$work/g-%p.trace" timeout 120 \
            gdb -q -batch -ex 'set pagination off' -ex "set environment LD_PRELOAD=$LIB" \
            -ex run -ex bt -ex 'info sharedlibrary' \
            --args python3 "$work/worker.py" "$p" >"$OUT/diag/$p-gdb.log" 2>&1
        echo "gdb $p: $(grep -m1 -E 'SIGSEGV|exited' "$OUT/diag/$p-gdb.log")"
        grep -m12 -E '^#[0-9]+' "$OUT/diag/$p-gdb.log"
    else
        echo "gdb: not installed"
    fi
done
rm -rf "$work"
