#!/usr/bin/env bash
# The memory_viz export against PyTorch's own snapshot (issue 32, item 4): GPT-2
# (tests/gpu/record_gpt2.py: transformers, 6 layers, d512, AdamW, batch 16 x 256, 10 steps)
# recorded
#
#   torch        by PyTorch: _record_memory_history(stacks="python"), then _dump_snapshot,
#   same-run     in the same process, by libisolate.so (log mode, ISOLATE_STACKS=python: Python
#                frames only, as stacks="python"; the caching allocator on, so the trace has its
#                segments, not its tensors), then `isolate export --format memory-viz`,
#   nocache-py   a second run under the library with PYTORCH_NO_CUDA_MEMORY_CACHING=1: every
#                tensor a cudaMalloc, so the trace has the allocations PyTorch's history has
#                (what the 248 MB export of 8,607 allocations was), ISOLATE_STACKS=python,
#   nocache-all  the same with ISOLATE_STACKS=all (the default: the native frames too),
#
# and prints a table: alloc entries, entries, distinct frames, bytes of each pickle, bytes of
# the page `python -m torch.cuda._memory_viz trace_plot` makes of it, bytes of pickle.dumps of
# what pickle.load read, and whether torch's tool read it; then tests/gpu/memviz_check.py
# (every _memory_viz command, figures against `isolate summary`) on the nocache-py trace, and
# GOAL lines: ours no larger than PyTorch's.
#
#   bash tests/gpu/memviz_size.sh        # from the repository root; STEPS=10 by default
#
# Needs target/gpu/libisolate.so and target/gpu/isolate (release builds), python3 with torch
# and transformers, one GPU. Logs, measurements and the table go to $OUT/memviz_size; the
# pickles, traces and pages are measured in a temporary directory and deleted (they can be
# hundreds of MB).
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
export PYTHONUNBUFFERED=1

fail=0
run() { # name, then the command; its output to $out/<name>.log
  local name=$1; shift
  local t0=$SECONDS
  timeout 400 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "rc=$rc $((SECONDS - t0))s $name: $(grep -m1 -E '^(LOSS|isolate: memory-viz)' "$out/$name.log" || tail -1 "$out/$name.log")"
  [ $rc -eq 0 ] || fail=1
  return $rc
}

# A run under the library: name, ISOLATE_STACKS, caching on/off, then record_gpt2.py's
# arguments; its trace is exported to $work/<name>.pickle.
ours() {
  local name=$1 stacks=$2 caching=$3; shift 3
  local env=(ISOLATE_MODE=log ISOLATE_STACKS="$stacks" ISOLATE_TRACE="$work/$name/t-%p.trace"
    LD_PRELOAD="$lib")
  [ "$caching" = off ] && env+=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
  mkdir -p "$work/$name"
  run "$name" env "${env[@]}" $py "$here/record_gpt2.py" --steps "$steps" "$@" || return
  # The training process's trace: the largest (a helper process that touched CUDA would have
  # its own).
  local trace
  trace=$(ls -S "$work/$name"/t-*.trace 2>/dev/null | head -1)
  [ -n "$trace" ] || { echo "memviz_size: $name wrote no trace" >&2; fail=1; return; }
  mv "$trace" "$work/$name.trace"
  run "$name-export" "$cli" export --format memory-viz "$work/$name.trace" -o "$work/$name.pickle"
  "$cli" summary --json "$work/$name.trace" >"$out/$name-summary.json" 2>/dev/null
}
ours same-run python on --snapshot "$work/torch.pickle"
ours nocache-py python off
ours nocache-all all off

# The table.
{
printf '%-12s %8s %9s %7s %14s %16s %14s  %s\n' snapshot allocs entries frames pickle_bytes trace_plot_bytes dumps_bytes "torch's trace_plot"
for name in torch same-run nocache-py nocache-all; do
  p=$work/$name.pickle
  if [ ! -s "$p" ]; then
    printf '%-12s (no pickle: see %s.log)\n' "$name" "$out/$name"
    fail=1
    continue
  fi
  m=$($py "$here/memviz_size.py" "$p" 2>"$out/$name-measure.log")
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
  MEASURE="$m" $py - "$name" "$page" "$read_ok" <<'EOF'
import json, os, sys
m = json.loads(os.environ["MEASURE"] or "{}")
name, page, ok = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"{name:<12} {m.get('allocs', 0):>8} {m.get('entries', 0):>9} {m.get('distinct_frames', 0):>7} "
      f"{m.get('bytes', 0):>14,} {page:>16,} {m.get('dumps_bytes', 0):>14,}  {ok}")
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

$py - "$out/table.txt" <<'EOF'
import sys
rows = {l.split()[0]: l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("snapshot")}
def num(name, col):
    try:
        return int(rows[name][col].replace(",", ""))
    except (KeyError, IndexError, ValueError):
        return None
t, tp = num("torch", 4), num("torch", 5)
print()
for name in ("same-run", "nocache-py", "nocache-all"):
    o, op = num(name, 4), num(name, 5)
    if not (t and o and tp and op):
        print(f"GOAL-MISSED {name}: no figures")
        continue
    verdict = "GOAL-MET" if o <= t and op <= tp else "GOAL-MISSED"
    print(f"{verdict} {name}: pickle {o:,} bytes = {o / t:.3f} x PyTorch's {t:,}; "
          f"trace_plot page {op:,} = {op / tp:.3f} x {tp:,}")
EOF
exit $fail
