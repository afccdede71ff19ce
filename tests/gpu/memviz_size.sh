#!/usr/bin/env bash
# The memory_viz export against PyTorch's own snapshot of the same training run (issue 32,
# item 4): a GPT-2 (transformers, 6 layers, d512, batch 16 x 256) trained 10 steps, recorded
#
#   torch        by PyTorch: _record_memory_history(stacks="python"), then _dump_snapshot
#   nocache/py   under libisolate.so, log mode, ISOLATE_STACKS=python (Python frames only, as
#                stacks="python"), PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc,
#                so the trace has the allocations PyTorch's history has), then
#                `isolate export --format memory-viz`
#   nocache/all  the same with ISOLATE_STACKS=all (the default: native frames too)
#   cached/py    the caching allocator on (isolate sees its segments only), ISOLATE_STACKS=python
#
# and prints a table: alloc entries, entries, distinct frames, bytes of each pickle, bytes of
# the page `python -m torch.cuda._memory_viz trace_plot` makes of it, and whether torch's tool
# read it; then tests/gpu/memviz_check.py (every _memory_viz command, figures against
# `isolate summary`) on the nocache/py trace.
#
#   bash tests/gpu/memviz_size.sh        # from the repository root
#
# Needs target/gpu/libisolate.so and target/gpu/isolate (release builds), python3 with torch
# and transformers, one GPU. Logs, pickles' measurements and pages go to $OUT/memviz_size
# (the pickles and traces themselves are deleted at the end: they are large).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
lib=${ISOLATE_LIB:-$root/target/gpu/libisolate.so}
cli=${ISOLATE_CLI:-$root/target/gpu/isolate}
out=${OUT:-/tmp/isolate-gpu-out}/memviz_size
mkdir -p "$out"
work=$(mktemp -d /tmp/memviz-size.XXXXXX)
trap 'rm -rf "$work"' EXIT
py=python3
steps=${STEPS:-10}
for f in "$lib" "$cli"; do
  [ -e "$f" ] || { echo "memviz_size: $f is missing (build it first)" >&2; exit 2; }
done

fail=0
run() { # name, then the command; output to $out/<name>.log
  local name=$1; shift
  local t0=$SECONDS
  timeout 400 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "rc=$rc $((SECONDS - t0))s $name: $(grep -m1 '^RESULT' "$out/$name.log" || tail -1 "$out/$name.log")"
  [ $rc -eq 0 ] || fail=1
  return $rc
}

# (a) PyTorch's own snapshot.
run torch $py "$here/memviz_size.py" train --steps "$steps" --torch-snapshot "$work/torch.pickle"

# (b) Under the library, then the export.
ours() { # name, ISOLATE_STACKS, caching (on/off)
  local name=$1 stacks=$2 caching=$3
  local nocache=()
  [ "$caching" = off ] && nocache=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
  mkdir -p "$work/$name"
  run "$name" env "${nocache[@]}" ISOLATE_MODE=log ISOLATE_STACKS="$stacks" \
    ISOLATE_TRACE="$work/$name/t-%p.trace" LD_PRELOAD="$lib" \
    $py "$here/memviz_size.py" train --steps "$steps" || return
  # The process's trace: the largest (a helper process that touched CUDA would have its own).
  local trace
  trace=$(ls -S "$work/$name"/t-*.trace 2>/dev/null | head -1)
  [ -n "$trace" ] || { echo "memviz_size: $name wrote no trace" >&2; fail=1; return; }
  cp "$trace" "$work/$name.trace"
  run "$name-export" "$cli" export --format memory-viz "$trace" -o "$work/$name.pickle"
  "$cli" summary --json "$trace" >"$out/$name-summary.json" 2>/dev/null
}
ours nocache-py python off
ours nocache-all all off
ours cached-py python on

# The table.
{
printf '%-12s %8s %9s %9s %13s %15s %13s  %s\n' snapshot allocs entries frames pickle_bytes trace_plot_bytes dumps_bytes "torch's trace_plot"
for name in torch nocache-py nocache-all cached-py; do
  p=$work/$name.pickle
  if [ ! -s "$p" ]; then
    printf '%-12s (no pickle: see %s.log)\n' "$name" "$out/$name"
    fail=1
    continue
  fi
  m=$($py "$here/memviz_size.py" measure "$p" 2>>"$out/$name-measure.log")
  echo "$m" >"$out/$name-measure.json"
  timeout 300 $py -m torch.cuda._memory_viz trace_plot "$p" -o "$work/$name.html" >"$out/$name-plot.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ -s "$work/$name.html" ] && grep -q snapshot.pickle "$work/$name.html"; then
    read_ok="read (rc 0)"
  else
    read_ok="FAILED (rc $rc, $out/$name-plot.log)"
    fail=1
  fi
  page=$(stat -c %s "$work/$name.html" 2>/dev/null || echo 0)
  $py - "$name" "$page" "$read_ok" <<EOF
import json, sys
m = json.loads('''$m''' or '{}')
name, page, ok = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"{name:<12} {m.get('allocs', 0):>8} {m.get('entries', 0):>9} {m.get('distinct_frames', 0):>9} "
      f"{m.get('bytes', 0):>13,} {page:>15,} {m.get('dumps_bytes', 0):>13,}  {ok}")
EOF
done
} >"$out/table.txt"
echo
cat "$out/table.txt"

# Ours as torch's tools read it: every _memory_viz command, figures against the summary.
if [ -s "$work/nocache-py.trace" ]; then
  echo
  timeout 400 $py "$here/memviz_check.py" "$cli" "$work/nocache-py.trace" --out "$work/check" \
    >"$out/memviz_check.log" 2>&1
  rc=$?
  grep -E '^(PASS|FAIL)|passed, ' "$out/memviz_check.log"
  [ $rc -eq 0 ] || fail=1
fi

python3 - "$out/table.txt" <<'EOF'
import sys
rows = {l.split()[0]: l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("snapshot")}
def num(name, col):
    try:
        return int(rows[name][col].replace(",", ""))
    except (KeyError, IndexError, ValueError):
        return None
t, o = num("torch", 4), num("nocache-py", 4)
tp, op = num("torch", 5), num("nocache-py", 5)
if t and o:
    print(f"\npickle: ours (nocache/py) {o:,} bytes = {o / t:.2f} x PyTorch's {t:,}; "
          f"trace_plot page {op:,} = {op / tp:.2f} x {tp:,}" if tp and op else "")
    print("GOAL-MET ours <= PyTorch's" if o <= t else "GOAL-MISSED ours > PyTorch's")
EOF
exit $fail
