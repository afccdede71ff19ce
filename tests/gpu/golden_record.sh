#!/usr/bin/env bash
# Records the golden traces of the current trace format (tests/traces/h200-v2/) on the H200 with
# target/gpu/libisolate.so: small runs whose findings carry call stacks, one per kind of program.
#
#   bash tests/gpu/golden_record.sh          (on the device machine, carry ["target/gpu"])
#
# Writes $OUT/golden/<name>.trace and $OUT/golden/record.log (each command, its exit status and
# output). The traces are then copied into tests/traces/h200-v2/ and their expected outputs made
# with `UPDATE_GOLDEN=1 cargo test -p isolate-analyzer --test golden` (tests/traces/README.md).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/golden-out}
dir="$OUT/golden"
mkdir -p "$dir"
log="$dir/record.log"
: >"$log"
LIB="$root/target/gpu/libisolate.so"
PY=${PY:-python3}
export PATH="$PATH:/usr/local/cuda/bin"
work=$(mktemp -d)
nvcc -O2 -o "$work/host_round2" "$here/host_round2.cu" -lpthread >>"$log" 2>&1 || echo "nvcc failed" >>"$log"

rec() { # name, settings (space-separated), command...
    local name=$1 settings=$2
    shift 2
    local tdir="$work/$name"
    mkdir -p "$tdir"
    # shellcheck disable=SC2086
    env LD_PRELOAD="$LIB" ISOLATE_TRACE="$tdir/t-%p.trace" $settings timeout 120 "$@" \
        >"$tdir/out" 2>&1
    local rc=$?
    local traces=("$tdir"/t-*.trace)
    echo "=== $name: rc=$rc: $settings $* (${#traces[@]} trace(s))" >>"$log"
    tail -n 15 "$tdir/out" >>"$log"
    # The first process's trace (the program itself; a child of its own, if any, is left out).
    [ -e "${traces[0]}" ] && cp "$(ls -1 "${traces[@]}" | head -n 1)" "$dir/$name.trace"
    printf '%-24s rc=%-4s %s\n' "$name" "$rc" "$(ls -l "$dir/$name.trace" 2>/dev/null | awk '{print $5 " bytes"}')"
}

cd "$here" || exit 1
rec stale_isolate "ISOLATE_MODE=isolate ISOLATE_CHECK_LAUNCH=on" "$PY" bug_stale_write.py --writer cupy
rec stale_guard "ISOLATE_MODE=isolate ISOLATE_GUARD=on" "$PY" bug_stale_write.py --writer cupy
rec probe_isolate "ISOLATE_MODE=isolate" "$work/host_round2" probe
rec end-term_isolate "ISOLATE_MODE=isolate" "$work/host_round2" end-term
rec mlp-log_no-caching "ISOLATE_MODE=log PYTORCH_NO_CUDA_MEMORY_CACHING=1" "$PY" train_mlp.py --steps 8 --warmup 2
rm -rf "$work"
ls -l "$dir"
