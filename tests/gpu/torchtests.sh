#!/usr/bin/env bash
# `bash tests/gpu/session10_call.sh torchtests` runs this: PyTorch's CUDA tests
# (tests/gpu/torch_tests.sh, README-torch-tests.md) into $OUT/torchtests, so that they do not
# overwrite other parts' summary.txt. Options from TORCH_TESTS_ARGS (default: --budget 540),
# or the arguments when called directly.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OUT="${OUT:-/tmp/torch-tests-out}/torchtests"
if [ $# -eq 0 ]; then
    # shellcheck disable=SC2086
    set -- ${TORCH_TESTS_ARGS:---budget 540}
fi
exec bash "$here/torch_tests.sh" "$@"
