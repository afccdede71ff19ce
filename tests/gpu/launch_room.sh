#!/usr/bin/env bash
# A launch that needs the driver's own device memory while the device is full (the sixteenth
# session's GPT-2, four model processes on one 80 GiB H100: "out of memory" in a kernel launch
# while every allocation succeeded). tests/gpu/launch_room.cu fills the device, frees 8 GiB and
# launches a kernel for the first time (`lazy`: its module loads then; `local`: it needs 16 KiB of
# local memory a thread: 4.4 GB on an H100, under the 8 GiB freed). Each scenario runs: plain; plain with the driver's error log
# (CUDA_LOG_FILE=stderr: which driver call failed); isolate mode with the reserve off (the freed
# 8 GiB stay quarantined); isolate mode with the default reserve.
#   bash tests/gpu/launch_room.sh        PASS when every run's launch and synchronisation
#                                        return 0 (as plain), and a retry is noted where the
#                                        isolate run needed one. Logs and traces in $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/launch-room-out}
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
G=${G:-$root/target/gpu}
bin="$OUT/launch_room"
nvcc -O2 -o "$bin" "$here/launch_room.cu" || { echo "FAIL nvcc"; exit 2; }
failed=0
printf '%-6s %-16s %-4s %s\n' scen config rc "program's line / retries"
for scen in lazy local; do
    for config in plain plain-log isolate-noreserve isolate; do
        env=()
        case $config in
        plain-log) env=(CUDA_LOG_FILE=stderr) ;;
        isolate-noreserve) env=(CUDA_LOG_FILE=stderr LD_PRELOAD="$G/libisolate.so" ISOLATE_MODE=isolate ISOLATE_RESERVE=0) ;;
        isolate) env=(CUDA_LOG_FILE=stderr LD_PRELOAD="$G/libisolate.so" ISOLATE_MODE=isolate) ;;
        esac
        dir="$OUT/$scen-$config"; rm -rf "$dir"; mkdir -p "$dir"
        (cd "$dir" && env "${env[@]}" timeout 120 "$bin" "$scen" 8192 >out.txt 2>err.txt)
        rc=$?
        retries=""
        if [ "${config#isolate}" != "$config" ]; then
            retries=$("$G/isolate" summary --json "$dir"/*.trace 2>/dev/null \
                | python3 -c 'import json,sys; d=json.load(sys.stdin); d=d[0] if isinstance(d,list) else d; q=d.get("quarantine",{}); print("oom_retries=%s launch_oom_retries=%s" % (q.get("oom_retries"), q.get("launch_oom_retries")))' 2>&1)
        fi
        printf '%-6s %-16s %-4s %s %s\n' "$scen" "$config" "$rc" "$(cat "$dir/out.txt")" "$retries"
        grep -i "error\|out of memory\|fail\|\[CUDA\]\|cu[A-Z]" "$dir/err.txt" | head -8 | sed 's/^/    stderr: /'
        [ "$rc" = 0 ] || failed=1
    done
done
[ $failed = 0 ] && echo "PASS every launch ran" || echo "FAIL a launch did not run"
exit $failed
