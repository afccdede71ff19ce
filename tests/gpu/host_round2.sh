#!/usr/bin/env bash
# Issue 33 on the H200: items 2 (a free that is a fresh thread's first CUDA call), 3 (stream-ordered
# allocations near the memory limit), 8 (findings at ends other than exit) and 9 (a failed
# oversized allocation and the quarantine), each run without the library, then in isolate mode
# under the library as it was (target/gpu/libisolate-old.so, when present) and as it is
# (target/gpu/libisolate.so). Prints one table; logs and traces' summaries go to $OUT.
#
#   bash tests/gpu/host_round2.sh            (on the device machine, carry ["target/gpu"])
#
# Columns: rc and the program's own line (ok/failed counts, results), and for the library runs
# the summary's findings line. Without the library a stale write is not reported by anyone: the
# "plain" column shows what the program sees.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/host-round2-out}
mkdir -p "$OUT"
work=$(mktemp -d)
log="$OUT/host_round2.log"
: >"$log"
ISO="$root/target/gpu/isolate"
NEW="$root/target/gpu/libisolate.so"
OLD="$root/target/gpu/libisolate-old.so"
PY=${PY:-python3}
export PATH="$PATH:/usr/local/cuda/bin"

nvcc -O2 -o "$work/host_round2" "$here/host_round2.cu" -lpthread >>"$log" 2>&1 || {
    echo "nvcc failed"; tail -n 20 "$log"; exit 1; }

cfgs=(plain new)
[ -f "$OLD" ] && cfgs=(plain old new)
# CFGS="plain old" runs only those (a first look at the library as it was).
[ -n "${CFGS:-}" ] && read -r -a cfgs <<<"$CFGS"

row() { printf '%-22s %-5s %-5s %-70s %s\n' "$@"; }
row case cfg rc "program" "findings (isolate summary)"

run_case() { # name, timeout spec, command...
    local name=$1 tmo=$2
    shift 2
    local cfg
    for cfg in "${cfgs[@]}"; do
        local tdir="$work/$name-$cfg"
        mkdir -p "$tdir"
        local env=()
        case $cfg in
        plain) env=() ;;
        old) env=(LD_PRELOAD="$OLD" ISOLATE_MODE=isolate ISOLATE_TRACE="$tdir/t-%p.trace") ;;
        new) env=(LD_PRELOAD="$NEW" ISOLATE_MODE=isolate ISOLATE_TRACE="$tdir/t-%p.trace") ;;
        esac
        local t0=$SECONDS
        # shellcheck disable=SC2086
        env "${env[@]}" timeout $tmo "$@" >"$tdir/stdout" 2>"$tdir/stderr"
        local rc=$?
        local line
        line=$(grep -m1 '^case=' "$tdir/stdout" | cut -c1-70)
        local findings="-"
        if [ "$cfg" != plain ]; then
            local traces=("$tdir"/t-*.trace)
            if [ -e "${traces[0]}" ]; then
                "$ISO" summary "${traces[@]}" >"$tdir/summary.txt" 2>&1
                findings=$(grep -m1 -iE '^(findings|FINDINGS)' "$tdir/summary.txt" | cut -c1-60)
                [ -n "$findings" ] || findings="(no findings line)"
            else
                findings="(no trace)"
            fi
        fi
        row "$name" "$cfg" "$rc" "${line:-"(no line)"}" "$findings"
        {
            echo "=== $name / $cfg: rc=$rc $((SECONDS - t0)) s: ${env[*]} $*"
            echo "--- stdout"; cat "$tdir/stdout"
            echo "--- stderr (last 30)"; tail -n 30 "$tdir/stderr"
            [ -f "$tdir/summary.txt" ] && { echo "--- summary (first 30)"; head -n 30 "$tdir/summary.txt"; }
        } >>"$log"
    done
}

run_case fresh-free-256 60 "$work/host_round2" fresh-free 256
run_case near-limit-200 120 "$work/host_round2" near-limit 200
run_case near-limit-4x200 120 "$work/host_round2" near-limit 200 200 4
run_case near-limit-64m 120 "$work/host_round2" near-limit 400 64 1
run_case probe 60 "$work/host_round2" probe
run_case end-exec 60 "$work/host_round2" end-exec
run_case end-term 60 "$work/host_round2" end-term
run_case end-abort 60 "$work/host_round2" end-abort
run_case end-timeout "-s TERM 8" "$work/host_round2" end-hang
run_case py-thread-free 120 "$PY" "$here/host_round2.py" thread-free
run_case py-pin-workers 120 "$PY" "$here/host_round2.py" pin-workers
echo "log: $log"
rm -rf "$work"
