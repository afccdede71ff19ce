#!/usr/bin/env bash
# Issue 14's side-by-side on the H200 in one device call, inside a time budget:
#   BUDGET_S=<seconds> bash tests/gpu/issue14_call.sh
# Set BUDGET_S to the device time left (`status`: budget_left_s) less ~150 s for the start-up
# and the end, and give the call a timeout_s above it. In that budget, in order:
#   1. fast_isolate.py: default, isolate (this library's defaults), no caching and isolate as it
#      was (target/gpu/libisolate-old.so, built at 564ab3f) in 3 interleaved rounds of all four
#      (60 steps; the slow two 20), on ResNet-50, GPT-2 and the LM (~90% of the budget: the
#      seventh session's call A took 539 s for exactly this; it saves after every run, so a cut
#      call loses at most one run);
#   2. the planted bugs under the defaults (stacks_check.py --only stale,stream), if 90 s are
#      left.
# Writes $OUT/fast_isolate.json, $OUT/fast_isolate-logs.tgz, $OUT/stacks.tgz (within the
# device's 8 returned files).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/isolate-gpu-out}
BUDGET_S=${BUDGET_S:?set BUDGET_S to the device seconds this call may use}
t0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
OLD=()
[ -f target/gpu/libisolate-old.so ] && OLD=(--old-lib target/gpu/libisolate-old.so)
BUDGET_S=$(( BUDGET_S * 9 / 10 )) OUT=$OUT python3 tests/gpu/fast_isolate.py \
    --lib target/gpu/libisolate.so "${OLD[@]}" --isolate target/gpu/isolate \
    --models resnet50,gpt2,lm --configs default,isolate-stacks,nocache,isolate-old \
    --full-rounds 3 --rounds 3 --steps 60 --warmup 15 --slow-steps 20 2>&1 | tail -40
if [ "$(left)" -gt 90 ]; then
    W=$(mktemp -d)
    timeout $(( $(left) - 10 )) python3 tests/gpu/stacks_check.py --isolate target/gpu/isolate \
        --out "$W" --only stale,stream 2>&1 | grep -E "^(PASS|FAIL)|stacks_check|result:"
    tar czf "$OUT/stacks.tgz" -C "$W" --exclude='*.trace' .
fi
echo "issue14_call: $(( $(date +%s) - t0 )) s of $BUDGET_S"
