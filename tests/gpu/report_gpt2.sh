#!/usr/bin/env bash
# Issue 32.5: GPT-2 traces for the report's screenshots, three ways: as a user runs it (log
# mode, PyTorch's caching allocator on: the trace sees its segments), with the cache off (log
# mode, every tensor its own cudaMalloc: what the steps and the site view are made from), and
# in isolate mode (the stream-ordered backend). Each trace is reported; one line a run says
# what its first screen will show (findings, steps found from the call stacks, the first view,
# the largest allocation site).
#
#   bash tests/gpu/report_gpt2.sh            # needs target/gpu/{libisolate.so,isolate}
#
# Writes to $OUT (default /tmp/report-gpt2): <run>-<pid>.trace, <run>.html, <run>.log. Send the
# .trace files back: `tests/browser/screenshot.sh TRACE docs/img NAME` makes the screenshots
# (no Chromium is needed here).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/report-gpt2}
G="$root/target/gpu"
STEPS=${STEPS:-10}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
printf '%-9s %3s %9s %8s %-52s %-44s %s\n' run rc trace_KB allocs "steps (from the call stacks)" "first view" "largest site"
for run in cache nocache isolate; do
    rm -f "$OUT/$run"-*.trace
    case $run in
    cache) envs=(ISOLATE_MODE=log) ;;
    nocache) envs=(ISOLATE_MODE=log PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
    isolate) envs=(ISOLATE_MODE=isolate) ;;
    esac
    env "${envs[@]}" LD_PRELOAD="$G/libisolate.so" ISOLATE_TRACE="$OUT/$run-%p.trace" \
        python3 "$here/record_gpt2.py" --steps "$STEPS" >"$OUT/$run.log" 2>&1
    rc=$?
    trace=$(ls "$OUT/$run"-*.trace 2>/dev/null | head -1)
    if [ -z "$trace" ]; then
        printf '%-9s %3s no trace (see %s)\n' "$run" "$rc" "$OUT/$run.log"
        continue
    fi
    "$G/isolate" report "$trace" -o "$OUT/$run.html" >>"$OUT/$run.log" 2>&1
    python3 - "$run" "$rc" "$trace" "$OUT/$run.html" <<'PY'
import json, os, sys
run, rc, trace, page = sys.argv[1:]
html = open(page, encoding="utf-8").read()
start = html.index('id="isolate-data">') + len('id="isolate-data">')
data = json.loads(html[start:html.index("</script>", start)])
t = data["traces"][0]
steps = t.get("steps")
steps = f'{steps["count"]} {steps["what"]}' if steps else f'none ({len(t["timeline"]["regions"])} regions)'
fv = t["timeline"]["first_view"]
fv = f'{fv["from_ns"]/1e9:.2f}-{fv["to_ns"]/1e9:.2f} of {t["timeline"]["span_ns"]/1e9:.2f} s' if fv else "the whole run"
sites = t.get("sites")
top = f'{sites["rows"][0]["place"].split("/")[-1]} {sites["rows"][0]["bytes"]/2**20:.0f} MiB' if sites and sites["rows"] else "-"
allocs = sum(v for k, v in t["summary"]["calls"].items() if "Alloc" in k or "Malloc" in k)
print(f'{run:<9} {rc:>3} {os.path.getsize(trace)//1024:>9} {allocs:>8} {steps[:52]:<52} {fv:<44} {top}')
print(f'{"":<9}     findings: {len(t["verdict"]["findings"])}; page {os.path.getsize(page)//1024} KB', flush=True)
PY
done
ls -l "$OUT"
