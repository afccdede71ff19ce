#!/usr/bin/env bash
# JAX under isolate mode, A/B: one library against another on the same JAX program, rounds
# interleaved. Shows whether a JAX crash under isolate mode is gone (issue "Trust", item 3).
#
#   bash tests/gpu/jax_isolate_ab.sh ROUNDS NEW_LIB OLD_LIB [jax_check.py args...]
#
# Each round runs, with XLA_PYTHON_CLIENT_ALLOCATOR=platform (JAX's no-caching allocator):
# no preload; NEW_LIB in isolate mode; OLD_LIB in isolate mode; OLD_LIB in isolate mode with
# ISOLATE_CHECK_LAUNCH=off. Prints one line per run (status, RESULT line or the signal) and
# writes each run's output to $OUT/jax_ab/.
set -u
here=$(cd "$(dirname "$0")" && pwd)
rounds=$1 new=$2 old=$3; shift 3
out=${OUT:-/tmp}/jax_ab; mkdir -p "$out"
export XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false
printf '%-5s %-22s %4s %s\n' round config rc result
for r in $(seq 1 "$rounds"); do
  for cfg in none new old old_nocheck; do
    log=$out/r${r}_$cfg.txt
    case $cfg in
      none) env python3 "$here/jax_check.py" "$@" >"$log" 2>&1 ;;
      new) ISOLATE_MODE=isolate ISOLATE_TRACE=/tmp/ab-$cfg-%p.trace LD_PRELOAD=$new \
             timeout 300 python3 "$here/jax_check.py" "$@" >"$log" 2>&1 ;;
      old) ISOLATE_MODE=isolate ISOLATE_TRACE=/tmp/ab-$cfg-%p.trace LD_PRELOAD=$old \
             timeout 300 python3 "$here/jax_check.py" "$@" >"$log" 2>&1 ;;
      old_nocheck) ISOLATE_MODE=isolate ISOLATE_CHECK_LAUNCH=off ISOLATE_TRACE=/tmp/ab-$cfg-%p.trace \
             LD_PRELOAD=$old timeout 300 python3 "$here/jax_check.py" "$@" >"$log" 2>&1 ;;
    esac
    rc=$?
    res=$(grep -m1 '^RESULT' "$log" || echo "(no RESULT) $(grep -m1 -iE 'segmentation|signal|error' "$log" | cut -c1-80)")
    printf '%-5s %-22s %4s %s\n' "$r" "$cfg" "$rc" "$res"
  done
done
