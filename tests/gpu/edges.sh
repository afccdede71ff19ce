#!/usr/bin/env bash
# Issue 32, rough edges on the GPU: what isolate mode says about frameworks (said only when
# PyTorch or JAX is loaded, not to a C program), a command that changes directory before its
# first CUDA call (its trace still found), a bad setting (the command not run).
#   bash tests/gpu/edges.sh          (or: bash tests/gpu/session10_call.sh edges)
# Needs target/gpu/{libisolate.so,isolate}, nvcc, python3 with torch and jax. Logs to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-/tmp/edges-out}
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
I="$root/target/gpu/isolate"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
cat > plain.cu <<'EOF'
#include <cuda_runtime.h>
int main() { void *p; if (cudaMalloc(&p, 4096)) return 1; return cudaFree(p) ? 1 : 0; }
EOF
nvcc -o plain plain.cu > "$OUT/nvcc.log" 2>&1 || echo "nvcc failed: see $OUT/nvcc.log"
rows=()
row() { rows+=("$(printf '%-34s %-52s %s' "$1" "$2" "$3")"); }
said() { grep -c "isolate: isolate mode: set $1" "$2"; }

# 1-3: the frameworks' lines.
"$I" run --mode isolate --trace 'c-%p.trace' -- ./plain > "$OUT/plain.out" 2> "$OUT/plain.err"
n=$(grep -c "isolate: isolate mode: set " "$OUT/plain.err")
row "C program, isolate mode" "no 'isolate mode: set' line (got $n)" "$([ -x plain ] && [ "$n" = 0 ] && [ -n "$(ls c-*.trace 2>/dev/null)" ] && echo PASS || echo FAIL)"
"$I" run --mode isolate --trace 't-%p.trace' -- python3 -c \
    'import torch; x = torch.ones(1024, device="cuda"); print(float(x.sum()))' \
    > "$OUT/torch.out" 2> "$OUT/torch.err"
p=$(said PYTORCH "$OUT/torch.err"); j=$(said XLA "$OUT/torch.err")
row "PyTorch, isolate mode" "1 PyTorch line, 0 JAX lines (got $p, $j)" "$([ "$p" = 1 ] && [ "$j" = 0 ] && echo PASS || echo FAIL)"
"$I" run --mode isolate --trace 'j-%p.trace' -- python3 -c \
    'import jax.numpy as jnp; print(float(jnp.ones(1024).sum()))' \
    > "$OUT/jax.out" 2> "$OUT/jax.err"
p=$(said PYTORCH "$OUT/jax.err"); j=$(said XLA "$OUT/jax.err")
row "JAX, isolate mode" "1 JAX line, 0 PyTorch lines (got $j, $p)" "$([ "$j" = 1 ] && [ "$p" = 0 ] && echo PASS || echo FAIL)"

# 4: a command that changes directory before its first CUDA call.
mkdir -p sub
"$I" run --trace 'cd-%p.trace' -- sh -c 'cd sub && exec python3 -c "import torch; torch.zeros(1, device=\"cuda\")"' \
    > "$OUT/chdir.out" 2> "$OUT/chdir.err"
f=$(sed -n 's/^isolate: trace written: \([^ ]*\) .*/\1/p' "$OUT/chdir.err")
ok=FAIL; [ -n "$f" ] && [ -f "$f" ] && [ -z "$(ls sub)" ] && "$I" summary "$f" > "$OUT/chdir.summary" && ok=PASS
row "chdir before the first CUDA call" "trace found in the start directory (${f:-none})" "$ok"

# 5: a bad setting: one line, the command not run.
ISOLATE_MODE=LOG "$I" run -- sh -c 'touch ran' > "$OUT/bad.out" 2> "$OUT/bad.err"; rc=$?
ok=FAIL; [ "$rc" = 2 ] && [ ! -e ran ] && [ "$(wc -l < "$OUT/bad.err")" = 1 ] && ok=PASS
row "ISOLATE_MODE=LOG isolate run" "exit 2, one line, not run (exit $rc)" "$ok"

printf '%-34s %-52s %s\n' case expected result | tee "$OUT/edges.txt"
printf '%s\n' "${rows[@]}" | tee -a "$OUT/edges.txt"
for e in plain torch jax chdir bad; do echo "== $e.err"; cat "$OUT/$e.err"; done > "$OUT/edges-stderr.txt"
