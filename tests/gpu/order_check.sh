#!/usr/bin/env bash
# The stream-order check on the GPU machine (issue 34): a missing record_stream named with its
# three sites, correctly ordered multi-stream programs with none, compute-sanitizer beside it,
# and the check's cost on GPT-2, ResNet-50 and BERT. From the repository root:
#
#   bash tests/gpu/order_check.sh race patterns     # one device call (~4-6 min)
#   bash tests/gpu/order_check.sh sanitizer         # one call (compute-sanitizer is slow)
#   bash tests/gpu/order_check.sh cost              # one call (18 training runs)
#   bash tests/gpu/order_check.sh                   # all four, for a machine without the limit
#
# Needs target/gpu/libisolate.so and target/gpu/isolate (release builds). Prints one short
# table a section; writes $OUT/order_check.json and every run's log under $OUT/order/
# (tests/gpu/order_check.py says what each section runs and checks). Exits 1 when a check of
# race or patterns failed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export OUT=${OUT:-/tmp/order-check-out}
mkdir -p "$OUT"
lib=${ISOLATE_LIB:-$repo/target/gpu/libisolate.so}
cli=${ISOLATE_CLI:-$repo/target/gpu/isolate}
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
for f in "$lib" "$cli"; do
    [ -e "$f" ] || { echo "missing $f (build the release library and CLI first)"; exit 2; }
done
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' \
    2>&1 | tee "$OUT/order_versions.txt"
command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -1 | tee -a "$OUT/order_versions.txt"
python3 "$here/order_check.py" --lib "$lib" --isolate "$cli" "$@" 2>&1 | tee "$OUT/order_check.txt"
exit "${PIPESTATUS[0]}"
