#!/usr/bin/env bash
# The GPU host's CPU side (issue 31): what a clock read costs there, and the hooks' time per
# tensor on the stand-in CUDA from Python (tests/programs/pystep.py), off / log / full / fast,
# interleaved rounds. No GPU work: it says what the host alone costs the hooks.
#   bash tests/gpu/host_probe.sh [ROUNDS]   (needs target/gpu/{libisolate.so,standin/})
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
G="$root/target/gpu"
OUT=${OUT:-/tmp/host-probe}; mkdir -p "$OUT"
rounds=${1:-3}
lscpu | grep -E 'Model name|^CPU\(s\)|Hypervisor|MHz' | head -6
cc -O2 -o /tmp/clock_probe "$root/tests/gpu/clock_probe.c" && /tmp/clock_probe
command -v perf >/dev/null && echo "perf: $(command -v perf)" || echo "perf: none"
PY=${PY:-python3}; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
for r in $(seq 1 "$rounds"); do
  for m in "ISOLATE_MODE=off" "ISOLATE_MODE=log" "ISOLATE_MODE=isolate ISOLATE_CHECK=full" "ISOLATE_MODE=isolate ISOLATE_CHECK=fast"; do
    line=$(env $m STANDIN_SYNC=1 LD_LIBRARY_PATH="$G/standin" LD_PRELOAD="$G/libisolate.so" \
      ISOLATE_TRACE="$OUT/ps-%p.trace" "$PY" "$root/tests/programs/pystep.py" 100 600 10 256 2>&1 | tail -1)
    echo "round $r  $m: $line"
  done
done
rm -f "$OUT"/ps-*.trace
if command -v perf >/dev/null; then
  echo "=== perf, fast tier (self time, top symbols)"
  env ISOLATE_MODE=isolate ISOLATE_CHECK=fast STANDIN_SYNC=1 LD_LIBRARY_PATH="$G/standin" \
    LD_PRELOAD="$G/libisolate.so" ISOLATE_TRACE="$OUT/pp-%p.trace" \
    perf record -F 4999 -o "$OUT/perf.data" "$PY" "$root/tests/programs/pystep.py" 100 600 10 256 >/dev/null 2>&1
  perf report -i "$OUT/perf.data" --stdio --no-children --sort dso,sym 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45
  perf report -i "$OUT/perf.data" --stdio --no-children --sort dso 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
  rm -f "$OUT"/pp-*.trace "$OUT/perf.data"
fi
