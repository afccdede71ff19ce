"""Cases for the pytest plugin, run by tests/tests/python_plugin.rs in a pytest subprocess with
the stand-in CUDA runtime (libcudart.so.13 on LD_LIBRARY_PATH) and, mostly, libisolate.so
preloaded. Names say the outcome the Rust test expects when the library is loaded:
``test_pass_*`` pass, ``test_fail_*`` fail. Run in file order: the leaking case comes last of
those that allocate, so the peak cases see an empty device."""

import pytest

import cuda_isolate
from standin_runtime import MiB, malloc, rt


@pytest.mark.isolate_no_findings
@pytest.mark.isolate_limit_peak("2 MiB")
@pytest.mark.isolate_limit_leak("1 MiB")
def test_pass_clean():
    rt.cudaFree(malloc(MiB))


def test_pass_api():
    if not cuda_isolate.loaded():
        assert cuda_isolate.counters() is None
        assert cuda_isolate.mark("nothing") is None
        return
    assert cuda_isolate.mark("hello from python") == 0
    before = cuda_isolate.counters()
    assert before["recording"] is True
    with cuda_isolate.region("inner"):
        p = malloc(3 * MiB)
        c = cuda_isolate.counters()
        assert c["live_device_bytes"] - before["live_device_bytes"] == 3 * MiB
        assert c["peak_device_bytes"] >= 3 * MiB
        rt.cudaFree(p)

    @cuda_isolate.region("decorated")
    def f():
        return 7

    assert f() == 7
    after = cuda_isolate.counters()
    assert after["live_device_bytes"] == before["live_device_bytes"]
    assert after["events"] >= before["events"] + 2


@pytest.mark.isolate_no_findings
def test_fail_invalid_free():
    p = malloc(4096)
    rt.cudaFree(p)
    rt.cudaFree(p)  # a double free: the second is of memory not allocated


@pytest.mark.isolate_limit_peak("2 MiB")
def test_fail_peak():
    rt.cudaFree(malloc(4 * MiB))


@pytest.mark.isolate_limit_peak("5 MiB")
def test_pass_peak_below():
    rt.cudaFree(malloc(4 * MiB))


def test_pass_leak_unchecked():
    malloc(MiB)  # leaks, but no marker asks


@pytest.mark.isolate_limit_leak("1 MiB")
def test_fail_leak():
    malloc(2 * MiB)


@pytest.mark.isolate_limit_leak("3 MiB")
def test_pass_leak_below():
    malloc(2 * MiB)
