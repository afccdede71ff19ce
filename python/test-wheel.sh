#!/usr/bin/env bash
# Builds the cuda-isolate wheel (python/build-wheel.sh), installs it into a fresh venv, and checks
# what it gives: `isolate --version`, `python -m cuda_isolate --lib` naming the libisolate.so
# installed beside `isolate`, `isolate run` finding it, the start-up hook (cuda_isolate.pth) in
# site-packages, and the module under that preload (a mark recorded, counters read, the hook
# naming the library as the NVTX injection). Needs
# maturin (pip install maturin); CI runs it (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -f target/wheels/cuda_isolate-*.whl
python/build-wheel.sh
whl=$(ls target/wheels/cuda_isolate-*.whl)
echo "test-wheel: $whl"
case "$whl" in
*-manylinux_*_x86_64.whl) ;;
*) echo "test-wheel: not a manylinux x86-64 wheel: $whl" >&2; exit 1 ;;
esac
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --no-index --no-deps "$whl"
want=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
"$venv/bin/isolate" --version | grep -qx "isolate $want"
[ "$("$venv/bin/python" -m cuda_isolate --version)" = "$want" ]
lib=$("$venv/bin/python" -m cuda_isolate --lib)
[ -f "$lib" ] && [ "$lib" = "$venv/bin/libisolate.so" ]
# The start-up hook's line is in site-packages, and without the preload it imports nothing.
"$venv/bin/python" -c '
import os, sys, sysconfig
assert os.path.isfile(os.path.join(sysconfig.get_paths()["purelib"], "cuda_isolate.pth")), "no cuda_isolate.pth"
assert "cuda_isolate" not in sys.modules, "the .pth imported cuda_isolate without the preload"
'
cd "$venv"
LD_PRELOAD="$lib" ISOLATE_TRACE="$venv/t.trace" "$venv/bin/python" -c '
import cuda_isolate as c
assert c.loaded(), "libisolate.so not loaded"
assert c.mark("wheel") == 0
with c.region("r"):
    pass
assert c.counters()["recording"] is True
import os
# The start-up hook named the preloaded library as the NVTX injection.
assert os.path.realpath(os.environ.get("NVTX_INJECTION64_PATH", "")) == os.path.realpath(os.environ["LD_PRELOAD"]), "NVTX_INJECTION64_PATH not set by the .pth"
'
"$venv/bin/isolate" summary "$venv/t.trace" >/dev/null
# isolate run finds the library beside itself.
"$venv/bin/isolate" run --trace "$venv/r-%p.trace" -- "$venv/bin/python" -c 'import cuda_isolate as c; assert c.mark("run") == 0'
ls "$venv"/r-*.trace >/dev/null
echo "test-wheel: ok ($want, $lib)"
