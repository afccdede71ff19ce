"""Cases for the isolate_no_findings marker's check at the end of each test
(``isolate_check_now``), run by tests/tests/python_plugin.rs under pytest with the stand-in CUDA
runtime and libisolate.so preloaded in isolate mode. ``test_fail_stale_write`` writes through a
pointer to memory it freed (the memory stays in quarantine: only the end-of-test check can find
it before exit); the test after it passes: the finding is that test's alone."""

import pytest

import cuda_isolate
from standin_runtime import MiB, malloc, rt


@pytest.mark.isolate_no_findings
def test_pass_clean_before():
    rt.cudaFree(malloc(MiB))


@pytest.mark.isolate_no_findings
def test_fail_stale_write():
    a = malloc(MiB)
    assert rt.cudaMemset(a, 0, MiB) == 0
    rt.cudaFree(a)
    b = malloc(MiB)
    assert rt.cudaMemset(b, 0, MiB) == 0
    assert rt.cudaMemset(a + 4096, 0x11, 16) == 0  # through the stale pointer
    rt.cudaFree(b)


@pytest.mark.isolate_no_findings
def test_pass_clean_after():
    rt.cudaFree(malloc(MiB))


def test_pass_check_now_counts():
    n = cuda_isolate.check_now()
    assert n == 1, n  # the stale write of test_fail_stale_write, found once
