#!/usr/bin/env bash
# DistributedDataParallel over NCCL under libisolate.so, one trace per rank (README-ddp.md):
#
#   bash tests/gpu/run_ddp.sh [NPROC]     NPROC: GPUs to use (default: all nvidia-smi lists, >= 1)
#
# Runs tests/gpu/ddp_train.py under torchrun four times, each under `timeout`:
#   baseline    no preload
#   log-cumem1  ISOLATE_MODE=log,     NCCL_CUMEM_ENABLE=1
#   log-cumem0  ISOLATE_MODE=log,     NCCL_CUMEM_ENABLE=0
#   isolate     ISOLATE_MODE=isolate, NCCL_CUMEM_ENABLE=1
# with ISOLATE_TRACE=$work/<run>/ddp-<mode>-r%r-%p.trace, then judges them with ddp_check.py
# (traces per rank, summary, calls by API, peer mappings, losses, violations, graph, check,
# report). Writes OUT/ddp.log (everything), OUT/ddp-report.html, OUT/ddp-summary-<run>.json and
# OUT/ddp-traces.tar.gz (when small); prints a short table and the checks that did not pass.
# OUT defaults to /tmp/isolate-ddp-out. Knobs: DDP_STEPS (100), DDP_TIMEOUT_S (240 per run),
# DDP_LOSS_RTOL (1e-6), DDP_VERBOSE=1 (print passing checks too).
# Exit status: 0 when every check passed, 1 when one failed, 2 on bad usage or missing binaries.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
lib=$repo/target/release/libisolate.so
cli=$repo/target/release/isolate

usage() { echo "usage: bash tests/gpu/run_ddp.sh [NPROC]" >&2; exit 2; }
[ $# -le 1 ] || usage
if [ $# -eq 1 ]; then
    case $1 in ''|*[!0-9]*) usage ;; esac
    nproc=$1
else
    nproc=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
[ "${nproc:-0}" -ge 1 ] 2>/dev/null || nproc=1

# Every process, baseline included: NVLink multicast stays off (it can take the host's shared
# GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# NCCL says which transports and allocations it used; the log keeps it.
export NCCL_DEBUG=${NCCL_DEBUG:-INFO} NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,ENV,P2P,ALLOC}
# The caller's own settings must not leak into the runs (each run sets what it needs).
unset LD_PRELOAD PYTORCH_CUDA_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING NCCL_CUMEM_ENABLE
for v in $(env | grep -o '^ISOLATE_[A-Z_]*' || true); do unset "$v"; done

OUT=${OUT:-${TMPDIR:-/tmp}/isolate-ddp-out}
mkdir -p "$OUT"
log=$OUT/ddp.log
: > "$log"
work=$(mktemp -d "${TMPDIR:-/tmp}/isolate-ddp.XXXXXX")
steps=${DDP_STEPS:-100}
run_timeout=${DDP_TIMEOUT_S:-240}
started=$(date +%s)

say() { echo "$*" | tee -a "$log"; }

for f in "$lib" "$cli"; do
    if [ ! -e "$f" ]; then
        say "MISSING: $f (build it first: cargo build --release)"
        exit 2
    fi
done

probe() { printf '%-14s %s\n' "$1" "$(shift; timeout 60 "$@" 2>&1 | head -n 3 | tr '\n' ' ')"; }
{
    echo "isolate DDP run: $nproc process(es), $steps steps; $(date -u +%FT%TZ); $(uname -srm)"
    probe "gpus" nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    probe "topology" bash -c 'nvidia-smi topo -m | head -n 4'
    probe "torch" python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version(), torch.cuda.device_count(), "GPUs")'
    probe "isolate" ls -l "$lib" "$cli"
    probe "git" git -C "$repo" log -1 --format='%h %s'
    echo "work: $work"
} 2>&1 | tee -a "$log"

# run NAME MODE CUMEM: MODE none|log|isolate; CUMEM 1|0|default
run() {
    local name=$1 mode=$2 cumem=$3 dir=$work/$1
    mkdir -p "$dir"
    local -a envs=()
    [ "$cumem" = default ] || envs+=("NCCL_CUMEM_ENABLE=$cumem")
    if [ "$mode" != none ]; then
        envs+=("LD_PRELOAD=$lib" "ISOLATE_MODE=$mode" "ISOLATE_TRACE=$dir/ddp-$mode-r%r-%p.trace")
    fi
    local -a cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc"
        "$here/ddp_train.py" --steps "$steps")
    printf '%s\n' "${envs[@]}" > "$dir/env"
    {
        echo
        echo "===== run $name"
        echo "\$ timeout -k 10 $run_timeout env ${envs[*]} ${cmd[*]}"
    } >> "$log"
    local t0 t1 rc
    t0=$(date +%s.%N)
    # The launcher inherits the preload and passes it to every worker; it makes no CUDA call
    # itself, so it leaves no trace (ddp_check.py counts the files per rank to be sure).
    (cd "$repo" && timeout -k 10 "$run_timeout" env "${envs[@]}" "${cmd[@]}") > "$dir/out.txt" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    echo "$rc" > "$dir/rc"
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }' > "$dir/seconds"
    {
        echo "rc=$rc  $(cat "$dir/seconds")s"
        echo "--- output (first and last 400 lines)"
        if [ "$(wc -l < "$dir/out.txt")" -le 800 ]; then cat "$dir/out.txt"
        else head -n 400 "$dir/out.txt"; echo "[... $(( $(wc -l < "$dir/out.txt") - 800 )) lines left out ...]"; tail -n 400 "$dir/out.txt"; fi
        echo "--- traces"
        find "$dir" -maxdepth 1 -name '*.trace*' -printf '%s bytes  %f\n' | sort -k 3 | grep . || echo "(none)"
    } >> "$log"
    local note=""
    case $rc in 124|137) note=" (TIMED OUT after ${run_timeout}s)" ;; esac
    say "$(printf 'rc=%-3s %6ss  %-11s mode %-7s NCCL_CUMEM_ENABLE=%s' "$rc" "$(cat "$dir/seconds")" "$name" "$mode" "$cumem")$note"
}

run baseline none default
run log-cumem1 log 1
run log-cumem0 log 0
run isolate isolate 1

echo | tee -a "$log"
timeout -k 10 600 python3 "$here/ddp_check.py" --work "$work" --out "$OUT" --nproc "$nproc" \
    --isolate "$cli" --log "$log" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
case $rc in
    0) verdict="every check passed" ;;
    1) verdict="some checks FAILED (see above and $log)" ;;
    *) verdict="ddp_check.py exited with status $rc (a bug in the checker? see $log)"; rc=1 ;;
esac
say "files in $OUT: $(find "$OUT" -maxdepth 1 -type f -printf '%f\n' | sort | tr '\n' ' ')"
say "run_ddp.sh: $verdict; $(( $(date +%s) - started ))s"
exit "$rc"
