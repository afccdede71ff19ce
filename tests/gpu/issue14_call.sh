#!/usr/bin/env bash
# Issue 14's side-by-side on the H200 in one device call, inside a time budget:
#   BUDGET_S=<seconds> bash tests/gpu/issue14_call.sh
# Set BUDGET_S to the device time left (`status`: budget_left_s) less ~150 s for the start-up
# and the end, and give the call a timeout_s above it. In that budget, in order:
#   1. fast_isolate.py: default and isolate (this library's defaults) in up to 4 interleaved
#      rounds of 60 steps, no caching and isolate as it was (target/gpu/libisolate-old.so,
#      built at 564ab3f) in the first round only, on ResNet-50, GPT-2 and the LM
#      (~75% of the budget; it saves after every run, so a cut call loses at most one run);
#   2. one round with ISOLATE_PROFILE=on (where the hooks' time goes), if 60 s are left;
#   3. the planted bugs under the defaults (checks.sh stacks), if 60 s are left.
# Writes $OUT/fast_isolate.json, $OUT/fast_isolate-logs.tgz, $OUT/profile/…, $OUT/checks.tgz
# (within the device's 8 returned files).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/isolate-gpu-out}
BUDGET_S=${BUDGET_S:?set BUDGET_S to the device seconds this call may use}
t0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
OLD=()
[ -f target/gpu/libisolate-old.so ] && OLD=(--old-lib target/gpu/libisolate-old.so)
BUDGET_S=$(( BUDGET_S * 3 / 4 )) OUT=$OUT python3 tests/gpu/fast_isolate.py \
    --lib target/gpu/libisolate.so "${OLD[@]}" --isolate target/gpu/isolate \
    --models resnet50,gpt2,lm --configs default,isolate-stacks,nocache,isolate-old \
    --full-rounds 1 --rounds 4 --steps 60 --warmup 15 --slow-steps 20 2>&1 | tail -40
if [ "$(left)" -gt 60 ]; then
    mkdir -p "$OUT/profile"
    BUDGET_S=$(( $(left) - 45 )) OUT=$OUT/profile python3 tests/gpu/fast_isolate.py \
        --lib target/gpu/libisolate.so --isolate target/gpu/isolate --models resnet50,gpt2,lm \
        --configs isolate-profile --rounds 1 --steps 40 --warmup 10 2>&1 | tail -12
fi
if [ "$(left)" -gt 60 ]; then
    OUT=$OUT timeout $(( $(left) - 10 )) bash tests/gpu/checks.sh stacks 2>&1 | tail -6
fi
echo "issue14_call: $(( $(date +%s) - t0 )) s of $BUDGET_S"
