#!/usr/bin/env bash
# The runner of PyTorch's CUDA tests (tests/gpu/torch_tests.py) checked without a GPU or torch,
# on a fake test module: see tests/gpu/torch_tests_selftest.py. CI runs it (tests/tests/gpu_scripts.rs).
set -euo pipefail
exec python3 "$(dirname "${BASH_SOURCE[0]}")/torch_tests_selftest.py" "$@"
