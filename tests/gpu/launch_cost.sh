#!/usr/bin/env bash
# The launch check's cost per launch on the GPU machine (issue 4), side by side:
#
#   bash tests/gpu/launch_cost.sh [REPEATS]     (default 5; writes $OUT/launch_cost.log)
#
# Builds tests/gpu/launch_bench.cu with nvcc and runs it REPEATS times in each configuration,
# the configurations interleaved (A B C D, D C B A, ...): no preload, log mode, isolate mode with
# the launch check off, and on. Prints the median ns per launch of each, and the check's cost as
# the difference between isolate with and without it.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp}
repeats=${1:-5}
lib=$repo/target/release/libisolate.so
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
work=$(mktemp -d)
log=$OUT/launch_cost.log
nvcc -O2 -o "$work/launch_bench" "$here/launch_bench.cu" >"$log" 2>&1 || { echo "nvcc failed"; cat "$log"; exit 1; }
configs=(base log isolate-nocheck isolate-check)
run_one() {
    local c=$1 env=()
    case $c in
        base) ;;
        log) env=(LD_PRELOAD="$lib" ISOLATE_MODE=log) ;;
        isolate-nocheck) env=(LD_PRELOAD="$lib" ISOLATE_MODE=isolate ISOLATE_CHECK_LAUNCH=off) ;;
        isolate-check) env=(LD_PRELOAD="$lib" ISOLATE_MODE=isolate ISOLATE_CHECK_LAUNCH=on) ;;
    esac
    (cd "$work" && env "${env[@]}" ISOLATE_TRACE="$work/$c-%p.trace" ./launch_bench 200 2>>"$log")
}
declare -A k3 kb
for r in $(seq 1 "$repeats"); do
    order=("${configs[@]}")
    if (( r % 2 == 0 )); then order=(isolate-check isolate-nocheck log base); fi
    for c in "${order[@]}"; do
        line=$(run_one "$c" | grep '^RESULT')
        echo "round $r $c: $line" >>"$log"
        k3[$c]+="$(awk '{print $3}' <<<"$line") "
        kb[$c]+="$(awk '{print $5}' <<<"$line") "
    done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
printf '%-17s %14s %14s\n' "config" "3 ptrs ns" "256 B struct ns"
for c in "${configs[@]}"; do
    printf '%-17s %14s %14s\n' "$c" "$(median <<<"${k3[$c]}")" "$(median <<<"${kb[$c]}")"
done
a3=$(median <<<"${k3[isolate-check]}"); b3=$(median <<<"${k3[isolate-nocheck]}")
ab=$(median <<<"${kb[isolate-check]}"); bb=$(median <<<"${kb[isolate-nocheck]}")
echo "launch check cost: $(awk -v a="$a3" -v b="$b3" 'BEGIN{printf "%.1f", a-b}') ns (3 pointers), $(awk -v a="$ab" -v b="$bb" 'BEGIN{printf "%.1f", a-b}') ns (256-byte struct) per launch"
# The check really ran: its exit note counts the launches it checked.
for t in "$work"/isolate-check-*.trace; do strings "$t" | grep -m1 'launch check:' ; break; done
for t in "$work"/isolate-check-*.trace; do strings "$t" | grep -m1 'poison verified' ; break; done
echo "rounds: $repeats x ${#configs[@]} configurations; log: $log"
