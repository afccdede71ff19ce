#!/usr/bin/env bash
# Can the trace be trusted? Three checks on the GPU machine, each judged by `isolate summary`:
#
#   bash tests/gpu/trust.sh [ROUNDS]      (default 3; run from anywhere)
#
# 1. threads: tests/gpu/threads_many.cu (built here with nvcc -O2) runs ROUNDS times under
#    ISOLATE_MODE=log: 16 threads x 5,000 cudaMalloc / tiny cudaMemset / cudaFree pairs
#    (80,000 in all). Every call must succeed, and the trace must hold every allocation and free
#    with 0 invalid frees, 0 double frees and 0 lost allocations, and be complete. The summary's
#    sequence figures (records late / sequence gaps / reordered) are shown, not judged.
# 2. doublefree: `threads_many doublefree` (cudaMalloc; cudaFree; cudaFree) without the preload,
#    in log mode and in isolate mode: the second free returns the same error code in all three,
#    and the summary of each trace reports it (invalid_free_count >= 1, or double_free_count >= 1).
# 3. jax: tests/gpu/jax_check.py (50 jit SGD steps of an MLP, fixed keys) for each allocator
#    (default BFC; platform = XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false)
#    x {no preload, log, isolate}: every run exits 0 with the RESULT line of the no-preload run of
#    its allocator, and every trace has 0 invalid frees, 0 lost allocations and is complete.
#    A run killed by a signal has its stderr tail saved in OUT/jax_crashes.txt and, when
#    cuda-gdb is on the PATH, is run once more under it (OUT/jax_<alloc>_<mode>_gdb.txt).
#
# Prints one table per check and the checks that failed; writes OUT/trust.log (every step:
# environment, command, status, output tails), OUT/trust.txt (the tables and checks),
# OUT/trust_traces.tar.gz (summaries, and the traces that fit in 15 MiB), and the crash files
# above: at most 8 files. OUT defaults to a new directory under /tmp.
#
# Environment: ISOLATE_LIB (libisolate.so; default REPO/target/release/libisolate.so),
# ISOLATE_CLI (the analyzer; default REPO/target/release/isolate) -- both are read, then removed
# from the environment with every other ISOLATE_* variable (the library refuses unknown ISOLATE_*
# settings); TRUST_THREADS (16), TRUST_PAIRS (5000 per thread), TRUST_MEMSET (1),
# TRUST_THREAD_MODES ("log"; add "isolate" for isolate-mode rounds too), TRUST_CUDART ("static";
# "static shared" also builds against the shared runtime), TRUST_JAX_ALLOCATORS
# ("default platform"; "cuda_async" may be added), TRUST_JAX_STEPS (50), TRUST_JAX_TIMEOUT (240 s
# a run), TRUST_THREADS_TIMEOUT (180 s a run), TRUST_BUDGET_S (480 s for everything: steps that
# no longer fit are skipped).
#
# Exit status: 0 when every check passed, 1 when one failed, 3 when none failed but some step
# was skipped (budget, missing tool), 2 on bad usage.
set -uo pipefail
shopt -s nullglob

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
usage() { echo "usage: bash tests/gpu/trust.sh [ROUNDS]   (ROUNDS >= 1, default 3)" >&2; exit 2; }
rounds=${1:-3}
case $rounds in '' | *[!0-9]*) usage ;; esac
(( rounds >= 1 )) || usage

abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
LIB=$(abspath "${ISOLATE_LIB:-$repo/target/release/libisolate.so}")
CLI=$(abspath "${ISOLATE_CLI:-$repo/target/release/isolate}")
threads=${TRUST_THREADS:-16}
pairs_per_thread=${TRUST_PAIRS:-5000}
memset_on=${TRUST_MEMSET:-1}
thread_modes=${TRUST_THREAD_MODES:-log}
cudarts=${TRUST_CUDART:-static}
jax_allocs=${TRUST_JAX_ALLOCATORS:-default platform}
jax_steps=${TRUST_JAX_STEPS:-50}
jax_timeout=${TRUST_JAX_TIMEOUT:-240}
threads_timeout=${TRUST_THREADS_TIMEOUT:-180}
budget=${TRUST_BUDGET_S:-480}
total_pairs=$(( threads * pairs_per_thread ))

# The caller's settings must not leak into the steps: each step sets what it needs.
for v in $(compgen -e | grep '^ISOLATE_' || true); do unset "$v"; done
unset LD_PRELOAD PYTORCH_CUDA_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING \
    XLA_PYTHON_CLIENT_ALLOCATOR XLA_PYTHON_CLIENT_PREALLOCATE XLA_PYTHON_CLIENT_MEM_FRACTION \
    XLA_CLIENT_MEM_FRACTION
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/isolate-trust-out.XXXXXX")}
mkdir -p "$OUT"
work=$(mktemp -d "${TMPDIR:-/tmp}/isolate-trust.XXXXXX")
mkdir -p "$work/traces" "$work/logs" "$work/bin"
log=$OUT/trust.log
report=$OUT/trust.txt
crashes=$OUT/jax_crashes.txt
rm -f "$crashes" "$OUT"/jax_*_gdb.txt "$OUT/trust_traces.tar.gz"
: >"$log"
: >"$report"
started=$(date +%s)

fails=()   # checks that failed, one line each
skips=()   # steps not run
say() { printf '%s\n' "$*" | tee -a "$log"; }
fail() { fails+=("$1"); echo "CHECK FAIL: $1" >>"$log"; }
skip() { skips+=("$1"); echo "SKIP: $1" >>"$log"; }
left() { echo $(( budget - ($(date +%s) - started) )); }

# step NAME TIMEOUT [VAR=VALUE...] -- CMD ARGS...
# Runs CMD in $work under `timeout`, capped by what is left of the budget (10 s kept for the
# end). Sets step_rc ("skip" when it did not fit), step_secs, step_timeout, step_out, step_err.
step() {
    local name=$1 want=$2
    shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    step_out=$work/logs/$name.out
    step_err=$work/logs/$name.err
    : >"$step_out"
    : >"$step_err"
    local t=$(( $(left) - 10 ))
    (( t > want )) && t=$want
    step_timeout=$t
    if (( t < 15 )); then
        step_rc=skip
        step_secs=0
        skip "$name (out of time: $(left)s of the budget left)"
        printf '  %-8s %7s  %s\n' "SKIP" "-" "$name (budget)"
        return
    fi
    local t0 t1
    t0=$(date +%s.%N)
    (cd "$work" && env ${envs[@]+"${envs[@]}"} timeout -k 10 "$t" "$@") \
        >"$step_out" 2>"$step_err" </dev/null
    step_rc=$?
    t1=$(date +%s.%N)
    step_secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    {
        echo "=== $name"
        echo "env:  ${envs[*]:-}"
        echo "cmd:  $(printf '%q ' "$@")"
        echo "cwd:  $work; timeout ${t}s; rc=$step_rc ($(rc_text "$step_rc")); ${step_secs}s"
        echo "--- stdout (last 150 lines of $(wc -l <"$step_out"))"
        tail -n 150 "$step_out"
        echo "--- stderr (last 150 lines of $(wc -l <"$step_err"))"
        tail -n 150 "$step_err"
        echo
    } >>"$log"
    printf '  %-8s %6ss  %s\n' "rc=$step_rc" "$step_secs" "$name"
}

# The exit status of a step in words: 0, N, timeout, SIGSEGV, ...
rc_text() {
    local rc=$1
    case $rc in
        skip) echo "skipped" ;;
        124) echo "timeout" ;;
        *)
            if (( rc > 128 && rc < 160 )); then
                if (( rc == 137 )) && awk -v s="$step_secs" -v t="$step_timeout" 'BEGIN { exit !(s + 0 >= t) }'; then
                    echo "timeout"
                else
                    echo "SIG$(kill -l $(( rc - 128 )) 2>/dev/null || echo $(( rc - 128 )))"
                fi
            else
                echo "$rc"
            fi ;;
    esac
}

# summarize NAME: `isolate summary --json` of the traces $work/traces/NAME.*.trace*, then sets
# s_ok (1 when a summary was read), s_events, s_invalid, s_double ("-" when the analyzer has no
# such field), s_lost, s_allocs, s_frees, s_complete, s_failed_frees, s_order (the summary's
# sequence: late/gaps/reordered records), s_note.
summarize() {
    local name=$1
    s_ok=0 s_events=- s_invalid=- s_double=- s_lost=- s_allocs=- s_frees=- s_complete=-
    s_failed_frees=- s_order=- s_note=""
    local traces=("$work/traces/$name".*.trace "$work/traces/$name".*.trace.[0-9]*)
    if [ ${#traces[@]} -eq 0 ]; then
        s_note="no trace written"
        echo "summary $name: no trace" >>"$log"
        return
    fi
    if [ ! -x "$CLI" ]; then
        s_note="no analyzer at $CLI"
        return
    fi
    local json=$work/logs/$name.summary.json rc
    timeout -k 5 120 "$CLI" summary --json "${traces[@]}" >"$json" 2>"$work/logs/$name.summary.err"
    rc=$?
    echo "summary $name: ${#traces[@]} trace(s), isolate summary rc=$rc $(head -c 400 "$work/logs/$name.summary.err")" >>"$log"
    if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
        s_note="isolate summary rc=$rc: $(tail -n 1 "$work/logs/$name.summary.err" | cut -c1-200)"
        return
    fi
    local line
    line=$(python3 - "$json" <<'PY' 2>>"$log"
import json, sys

s = json.load(open(sys.argv[1]))


def count(v):
    if v is None:
        return None
    if isinstance(v, dict):
        return int(v["count"]) if "count" in v else len(v)
    if isinstance(v, (list, tuple)):
        return len(v)
    return int(v)


def show(v):
    return "-" if v is None else str(v)


invalid = s.get("invalid_free_count")
if invalid is None:
    invalid = count(s.get("invalid_frees"))
double = s.get("double_free_count")
if double is None:
    double = count(s.get("double_frees"))
failed = s.get("failed") or {}
failed_frees = sum(int(n) for api, n in failed.items() if "free" in api.lower())
seq = s.get("sequence")  # {reordered, gaps, late}: file order against sequence order
order = "-" if not isinstance(seq, dict) else f"{seq.get('late', '-')}/{seq.get('gaps', '-')}/{seq.get('reordered', '-')}"
print(
    show(s.get("events")), show(invalid), show(double), show(s.get("lost")),
    show(s.get("allocations")), show(s.get("frees")),
    "yes" if s.get("complete") else "no", failed_frees, order,
)
PY
)
    if [ -z "$line" ]; then
        s_note="summary JSON unreadable (see trust.log)"
        return
    fi
    read -r s_events s_invalid s_double s_lost s_allocs s_frees s_complete s_failed_frees s_order <<<"$line"
    s_ok=1
    echo "summary $name: events=$s_events invalid=$s_invalid double=$s_double lost=$s_lost allocations=$s_allocs frees=$s_frees complete=$s_complete failed_frees=$s_failed_frees late/gaps/reordered=$s_order" >>"$log"
}

is_zero_or_absent() { [ "$1" = "-" ] || [ "$1" = 0 ]; }

# A table: rows are '|'-separated strings; columns padded to their widest cell.
table() {
    local title=$1
    shift
    {
        echo
        echo "$title"
        printf '%s\n' "$@" | awk -F'|' '
            { n[NR] = NF; for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } }
            END {
                for (r = 1; r <= NR; r++) {
                    line = ""
                    for (i = 1; i <= n[r]; i++) line = line sprintf("%-" w[i] "s  ", c[r, i])
                    sub(/ +$/, "", line); print line
                    if (r == 1) { line = ""; for (i = 1; i <= n[1]; i++) line = line sprintf("%s  ", substr("----------------------------------------", 1, w[i])); sub(/ +$/, "", line); print line }
                }
            }'
    } | tee -a "$log" "$report"
}

# ---------------------------------------------------------------------------------------------
{
    echo "isolate trust check: $(date -u +%FT%TZ) rounds=$rounds threads=$threads pairs/thread=$pairs_per_thread"
    echo "lib: $LIB $( [ -e "$LIB" ] && ls -l --time-style=+%FT%T "$LIB" | awk '{print $6, $5 " bytes"}' || echo MISSING)"
    echo "cli: $CLI $( [ -e "$CLI" ] && ls -l --time-style=+%FT%T "$CLI" | awk '{print $6}' || echo MISSING)"
    echo "gpu: $(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1)"
    echo "nvcc: $(timeout 30 nvcc --version 2>&1 | tail -n 1)"
    echo "cuda-gdb: $(command -v cuda-gdb || echo 'not on PATH')"
    echo "git: $(git -C "$repo" log -1 --format='%h %s' 2>/dev/null | cut -c1-100)"
    echo "OUT: $OUT  work: $work  budget: ${budget}s"
} | tee -a "$log" "$report"
if [ ! -e "$LIB" ] || [ ! -x "$CLI" ]; then
    echo "trust.sh: libisolate.so ($LIB) or the analyzer ($CLI) is missing: build them first (cargo build --release)" | tee -a "$log" "$report" >&2
    exit 1
fi

# ---------------------------------------------------------------------------------------------
say ""
say "## build"
built=()
if command -v nvcc >/dev/null; then
    cuda_lib=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)/lib64
    for cudart in $cudarts; do
        flags=(-O2)
        case $cudart in
            static) ;;
            shared) flags+=(-cudart shared -Xlinker -rpath -Xlinker "$cuda_lib") ;;
            *) fail "TRUST_CUDART: unknown runtime '$cudart' (static, shared)"; continue ;;
        esac
        step "nvcc_$cudart" 180 -- nvcc "${flags[@]}" -o "$work/bin/threads_many_$cudart" "$here/threads_many.cu"
        if [ "$step_rc" = 0 ] && [ -x "$work/bin/threads_many_$cudart" ]; then
            built+=("$cudart")
        elif [ "$step_rc" != skip ]; then
            fail "nvcc ($cudart runtime) failed: rc=$step_rc $(tail -n 3 "$step_err" | tr '\n' ' ' | cut -c1-300)"
        fi
    done
else
    fail "nvcc not found (PATH, /usr/local/cuda/bin): threads and doublefree not run"
fi
# The double free runs on the first binary built (static unless TRUST_CUDART says otherwise).
df_bin=""
[ ${#built[@]} -gt 0 ] && df_bin=$work/bin/threads_many_${built[0]}

preload_env() {  # preload_env MODE NAME -> the preload's settings for one step, in pre_env
    pre_env=()
    [ "$1" = none ] && return
    pre_env=(LD_PRELOAD="$LIB" ISOLATE_MODE="$1" ISOLATE_TRACE="$work/traces/$2.%p.trace")
}

# ---------------------------------------------------------------------------------------------
say ""
say "## doublefree (cudaMalloc; cudaFree; cudaFree)"
df_rows=("mode|rc|second_free|invalid_frees|double_frees|failed_frees|events|reported|verdict")
df_base_code=""
if [ -n "$df_bin" ]; then
    for mode in none log isolate; do
        name=doublefree_$mode
        preload_env "$mode" "$name"
        step "$name" 60 ${pre_env[@]+"${pre_env[@]}"} -- "$df_bin" doublefree
        code=$(grep -o 'second_free=[0-9-]*' "$step_out" | head -n 1 | cut -d= -f2)
        code=${code:--}
        verdict=ok
        reported=-
        s_invalid=- s_double=- s_failed_frees=- s_events=-
        if [ "$step_rc" = skip ]; then
            verdict=SKIP
        elif [ "$step_rc" != 0 ] || [ "$code" = - ]; then
            verdict=FAIL
            fail "doublefree/$mode: rc=$(rc_text "$step_rc"), no second_free line: $(tail -n 2 "$step_err" "$step_out" | tr '\n' ' ' | cut -c1-200)"
        fi
        if [ "$mode" = none ]; then
            df_base_code=$code
            if [ "$code" = 0 ]; then
                echo "note: without the preload the second cudaFree returned 0 (the driver took the double free)" | tee -a "$log"
            fi
        elif [ "$step_rc" != skip ]; then
            summarize "$name"
            if [ "$s_ok" = 1 ]; then
                if { [ "$s_invalid" != - ] && (( s_invalid >= 1 )); } || { [ "$s_double" != - ] && (( s_double >= 1 )); }; then
                    reported=yes
                else
                    reported=NO
                    verdict=FAIL
                    fail "doublefree/$mode: the summary reports no invalid/double free (invalid_free_count=$s_invalid, double_frees=$s_double, failed frees=$s_failed_frees)"
                fi
            else
                verdict=FAIL
                fail "doublefree/$mode: no summary: $s_note"
            fi
            if [ -n "$df_base_code" ] && [ "$df_base_code" != - ] && [ "$code" != "$df_base_code" ]; then
                verdict=FAIL
                fail "doublefree/$mode: the second free returned $code, without the preload $df_base_code"
            fi
        fi
        df_rows+=("$mode|$(rc_text "$step_rc")|$code|$s_invalid|$s_double|$s_failed_frees|$s_events|$reported|$verdict")
    done
else
    skip "doublefree: no binary"
fi
table "doublefree: second free's code (same with and without the preload), and does the summary report it?" "${df_rows[@]}"

# ---------------------------------------------------------------------------------------------
say ""
say "## threads ($rounds rounds of $threads threads x $pairs_per_thread pairs = $total_pairs)"
th_rows=("round|runtime|mode|rc|secs|threads|pairs|failures|events|allocs|frees|invalid_frees|double_frees|lost|complete|late/gaps/reord|verdict")
th_runs=0 th_ok=0
for r in $(seq 1 "$rounds"); do
    for cudart in ${built[@]+"${built[@]}"}; do
        for mode in $thread_modes; do
            case $mode in log | isolate) ;; *) fail "TRUST_THREAD_MODES: unknown mode '$mode'"; continue ;; esac
            name=threads_r${r}_${cudart}_$mode
            preload_env "$mode" "$name"
            step "$name" "$threads_timeout" "${pre_env[@]}" -- \
                "$work/bin/threads_many_$cudart" "$threads" "$pairs_per_thread" "$memset_on"
            th_runs=$(( th_runs + 1 ))
            line=$(grep '^threads=' "$step_out" | tail -n 1)
            p_threads=$(grep -o 'threads=[0-9]*' <<<"$line" | cut -d= -f2)
            p_pairs=$(grep -o 'pairs=[0-9]*' <<<"$line" | cut -d= -f2)
            p_fail=$(grep -o 'failures=[0-9]*' <<<"$line" | cut -d= -f2)
            p_secs=$(grep -o '^seconds=[0-9.]*' "$step_out" | cut -d= -f2)
            s_ok=0 s_events=- s_invalid=- s_double=- s_lost=- s_allocs=- s_frees=- s_complete=- s_order=- s_note=""
            why=()
            if [ "$step_rc" = skip ]; then
                verdict=SKIP
            else
                summarize "$name"
                [ "$step_rc" = 0 ] || why+=("rc=$(rc_text "$step_rc")")
                [ -n "$p_fail" ] || why+=("no result line")
                [ -n "$p_fail" ] && [ "$p_fail" != 0 ] && why+=("$p_fail failed calls")
                if [ "$s_ok" = 1 ]; then
                    [ "$s_invalid" = 0 ] || why+=("invalid_frees=$s_invalid")
                    is_zero_or_absent "$s_double" || why+=("double_frees=$s_double")
                    [ "$s_lost" = 0 ] || why+=("lost=$s_lost")
                    [ "$s_complete" = yes ] || why+=("trace incomplete")
                    # Every pair must be in the trace (the summary's allocations/frees are of
                    # device memory: cudaMalloc/cudaFree, or the cuMemAlloc/cuMemFree they become).
                    if [ "$step_rc" = 0 ]; then
                        [ "$s_allocs" != - ] && (( s_allocs >= total_pairs )) || why+=("allocations=$s_allocs < $total_pairs")
                        [ "$s_frees" != - ] && (( s_frees >= total_pairs )) || why+=("frees=$s_frees < $total_pairs")
                    fi
                else
                    why+=("no summary: $s_note")
                fi
                if [ ${#why[@]} -eq 0 ]; then
                    verdict=ok
                    th_ok=$(( th_ok + 1 ))
                else
                    verdict=FAIL
                    fail "threads round $r ($cudart runtime, $mode): ${why[*]}"
                fi
            fi
            th_rows+=("$r|$cudart|$mode|$(rc_text "$step_rc")|${p_secs:-$step_secs}|${p_threads:--}|${p_pairs:--}|${p_fail:--}|$s_events|$s_allocs|$s_frees|$s_invalid|$s_double|$s_lost|$s_complete|$s_order|$verdict")
        done
    done
done
[ ${#built[@]} -gt 0 ] || skip "threads: no binary"
table "threads: $th_ok of $th_runs runs ok (each: $threads threads x $pairs_per_thread cudaMalloc/cudaMemset/cudaFree, trace summarised)" "${th_rows[@]}"

# ---------------------------------------------------------------------------------------------
say ""
say "## jax ($jax_steps jit SGD steps per run; allocators: $jax_allocs)"
py=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || command -v python3)
gdb=$(command -v cuda-gdb || true)
gdb_runs=0
jx_rows=("allocator|mode|rc|secs|result|events|invalid_frees|double_frees|lost|complete|late/gaps/reord|verdict")
declare -A baseline
for alloc in $jax_allocs; do
    alloc_env=()
    case $alloc in
        default) ;;
        platform) alloc_env=(XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false) ;;
        *) alloc_env=(XLA_PYTHON_CLIENT_ALLOCATOR="$alloc") ;;
    esac
    for mode in none log isolate; do
        name=jax_${alloc}_$mode
        preload_env "$mode" "$name"
        step "$name" "$jax_timeout" ${alloc_env[@]+"${alloc_env[@]}"} ${pre_env[@]+"${pre_env[@]}"} -- \
            "$py" "$here/jax_check.py" --steps "$jax_steps"
        rc=$step_rc
        secs=$step_secs
        jax_rc_text=$(rc_text "$rc")
        result=$(grep '^RESULT ' "$step_out" | tail -n 1)
        s_ok=0 s_events=- s_invalid=- s_double=- s_lost=- s_complete=- s_order=- s_note=""
        why=()
        match=-
        if [ "$rc" = skip ]; then
            verdict=SKIP
        else
            [ "$rc" = 0 ] || why+=("rc=$jax_rc_text")
            [ -n "$result" ] || why+=("no RESULT line")
            if [ "$mode" = none ]; then
                baseline[$alloc]=$result
                [ -n "$result" ] && match=baseline
            elif [ -n "$result" ]; then
                if [ -z "${baseline[$alloc]:-}" ]; then
                    match="no-baseline"
                    why+=("no baseline RESULT to compare with")
                elif [ "$result" = "${baseline[$alloc]}" ]; then
                    match=same
                else
                    match=DIFF
                    why+=("RESULT differs: '${result#RESULT }' vs '${baseline[$alloc]#RESULT }'")
                fi
            fi
            if [ "$mode" != none ]; then
                summarize "$name"
                if [ "$s_ok" = 1 ]; then
                    [ "$s_invalid" = 0 ] || why+=("invalid_frees=$s_invalid")
                    is_zero_or_absent "$s_double" || why+=("double_frees=$s_double")
                    [ "$s_lost" = 0 ] || why+=("lost=$s_lost")
                    [ "$s_complete" = yes ] || why+=("trace incomplete")
                    [ "$s_events" != - ] && (( s_events > 0 )) || why+=("no events in the trace")
                else
                    why+=("no summary: $s_note")
                fi
            fi
            if [ ${#why[@]} -eq 0 ]; then verdict=ok; else verdict=FAIL; fail "jax $alloc/$mode: ${why[*]}"; fi
            if [ "$rc" != 0 ]; then
                {
                    echo "===== $name: rc=$rc ($jax_rc_text) after ${secs}s; env: ${alloc_env[*]:-} ${pre_env[*]:-}"
                    echo "--- stdout (last 20 lines)"
                    tail -n 20 "$step_out"
                    echo "--- stderr (last 120 lines)"
                    tail -n 120 "$step_err"
                    echo
                } >>"$crashes"
            fi
            if [[ $jax_rc_text == SIG* ]]; then
                if [ -z "$gdb" ]; then
                    echo "$name died of $jax_rc_text; cuda-gdb is not on the PATH: no backtrace" | tee -a "$log"
                elif (( gdb_runs >= 4 )); then
                    echo "$name died of $jax_rc_text; already 4 cuda-gdb reruns: not rerun" | tee -a "$log"
                else
                    gdb_runs=$(( gdb_runs + 1 ))
                    gdb_ex=(-batch -ex 'set pagination off' -ex 'set confirm off')
                    # The preload goes to the program only, not to cuda-gdb itself.
                    [ "$mode" != none ] && gdb_ex+=(-ex "set environment LD_PRELOAD=$LIB")
                    gdb_ex+=(-ex run -ex bt -ex 'info sharedlibrary')
                    gdb_env=()
                    [ "$mode" != none ] && gdb_env=(ISOLATE_MODE="$mode" ISOLATE_TRACE="$work/traces/${name}_gdb.%p.trace")
                    step "${name}_gdb" "$jax_timeout" ${alloc_env[@]+"${alloc_env[@]}"} ${gdb_env[@]+"${gdb_env[@]}"} -- \
                        "$gdb" "${gdb_ex[@]}" --args "$py" "$here/jax_check.py" --steps "$jax_steps"
                    {
                        echo "# $name under cuda-gdb: rc=$step_rc ($(rc_text "$step_rc")) ${step_secs}s"
                        echo "# env: ${alloc_env[*]:-} ${gdb_env[*]:-} LD_PRELOAD(inferior)=$([ "$mode" != none ] && echo "$LIB")"
                        echo "# cmd: $(printf '%q ' "$gdb" "${gdb_ex[@]}" --args "$py" "$here/jax_check.py" --steps "$jax_steps")"
                        echo "# ---- stdout"
                        cat "$step_out"
                        echo "# ---- stderr"
                        cat "$step_err"
                    } >"$OUT/${name}_gdb.txt"
                    echo "$name: cuda-gdb output in $OUT/${name}_gdb.txt" | tee -a "$log"
                fi
            fi
        fi
        jx_rows+=("$alloc|$mode|$jax_rc_text|$secs|$match|$s_events|$s_invalid|$s_double|$s_lost|$s_complete|$s_order|$verdict")
    done
done
table "jax: jax_check.py per allocator x mode (result: the RESULT line against the no-preload run of the same allocator)" "${jx_rows[@]}"
{
    echo
    for alloc in $jax_allocs; do echo "baseline $alloc: ${baseline[$alloc]:-(none)}"; done
} | tee -a "$log" "$report"

# ---------------------------------------------------------------------------------------------
# Summaries and traces, into one tarball of at most 15 MiB (threads traces go last: they are big).
keep=$work/keep
mkdir -p "$keep"
cp "$work"/logs/*.summary.json "$keep/" 2>/dev/null
for f in "$work"/traces/doublefree_* "$work"/traces/jax_*; do cp "$f" "$keep/"; done
tar -czf "$OUT/trust_traces.tar.gz" -C "$work" keep 2>>"$log"
for f in "$work"/traces/threads_r1_* "$work"/traces/threads_*; do
    [ -e "$keep/$(basename "$f")" ] && continue
    cp "$f" "$keep/"
    tar -czf "$work/try.tar.gz" -C "$work" keep 2>>"$log"
    if (( $(stat -c %s "$work/try.tar.gz") > 15 * 1024 * 1024 )); then
        rm -f "$keep/$(basename "$f")"
        echo "traces: $(basename "$f") left out of the tarball (size)" >>"$log"
    else
        mv "$work/try.tar.gz" "$OUT/trust_traces.tar.gz"
    fi
done

# ---------------------------------------------------------------------------------------------
{
    echo
    echo "## verdict"
    if [ ${#fails[@]} -gt 0 ]; then
        echo "${#fails[@]} check(s) FAILED:"
        printf '  FAIL %s\n' "${fails[@]}"
    fi
    if [ ${#skips[@]} -gt 0 ]; then
        echo "${#skips[@]} step(s) skipped:"
        printf '  SKIP %s\n' "${skips[@]}"
    fi
    [ ${#fails[@]} -eq 0 ] && [ ${#skips[@]} -eq 0 ] && echo "all checks passed"
    echo "files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
    echo "trust.sh: $(( $(date +%s) - started ))s; traces and logs in $work"
} | tee -a "$log" "$report"
if [ ${#fails[@]} -gt 0 ]; then exit 1; fi
if [ ${#skips[@]} -gt 0 ]; then exit 3; fi
exit 0
