#!/usr/bin/env bash
# Renders the report of a trace and saves its first-screen screenshots (headless Chromium,
# playwright-core as tests/browser/package-lock.json locks it):
#
#   tests/browser/screenshot.sh TRACE OUTDIR [NAME]
#
# writes OUTDIR/NAME.png (the first screen at 1400x900), NAME-sites.png (the allocation-site
# table and icicle) and, when the page draws steps, NAME-timeline.png; NAME defaults to
# report-<the trace's file name without .trace>. The `isolate` used is $ISOLATE, else
# the newer of target/release/isolate and target/debug/isolate, else the one on PATH; Chromium is
# $ISOLATE_CHROMIUM, else chromium on PATH. Needs node and `npm --prefix tests/browser ci`.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 TRACE OUTDIR [NAME]" >&2
  exit 2
fi
trace=$1 out=$2
name=${3:-report-$(basename "$trace" .trace)}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${ISOLATE:-}
if [ -z "$bin" ]; then
  # the newer of the release and debug builds (an old release build would show an old page)
  for c in "$root/target/release/isolate" "$root/target/debug/isolate"; do
    if [ -x "$c" ] && { [ -z "$bin" ] || [ "$c" -nt "$bin" ]; }; then bin=$c; fi
  done
fi
bin=${bin:-$(command -v isolate || true)}
if [ -z "$bin" ]; then
  echo "$0: no isolate binary: build it (cargo build -p isolate-analyzer) or set ISOLATE" >&2
  exit 2
fi
chrome=${ISOLATE_CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$chrome" ]; then
  echo "$0: no Chromium: apt-get install -y chromium, or set ISOLATE_CHROMIUM" >&2
  exit 2
fi
if [ ! -d "$here/node_modules/playwright-core" ]; then
  echo "$0: the browser driver is not installed: run npm --prefix $here ci" >&2
  exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" report "$trace" -o "$tmp/page.html"
(cd "$here" && node screenshot.mjs --chromium "$chrome" --page "$tmp/page.html" --out "$out" --name "$name")
