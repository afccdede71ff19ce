"""A stand-in for PyTorch's test_cuda.py, for checking tests/gpu/torch_tests.py without a GPU
(tests/gpu/torch_tests_selftest.sh). Each test does one thing the runner must handle; the
selftest's configurations only set variables (FAKE_ASYNC, FAKE_ISOLATE) that these tests read.

Every test fails if it runs in a worker that already saw a sticky error (POISONED): that is
how the selftest shows that one failure never cascades into the tests after it.
"""

import os
import sys
import time
import unittest

POISONED = False


class _FakeCudaModule:
    """What the runner asks of torch.cuda after each test (is the context still usable?)."""

    broken = False

    @staticmethod
    def is_initialized():
        return True

    @classmethod
    def synchronize(cls):
        if cls.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")


class _FakeTorch:
    cuda = _FakeCudaModule


# the fake tests never import torch: this stands in for it in the worker
sys.modules.setdefault("torch", _FakeTorch())


def serialTest(condition=True):  # the same name PyTorch uses: the runner reads it statically
    def deco(fn):
        return fn

    return deco


def _under_isolate():
    return os.environ.get("FAKE_ISOLATE") == "1"


def _under_backend():
    # isolate mode runs PyTorch's stream-ordered backend, so it sees what the backend sees
    return os.environ.get("FAKE_ASYNC") == "1" or _under_isolate()


class FakeCuda(unittest.TestCase):
    def setUp(self):
        if POISONED:
            self.fail("ran in a worker after a sticky CUDA error (the failure cascaded)")

    def test_pass(self):
        self.assertEqual(1 + 1, 2)

    def test_pass_slowish(self):
        time.sleep(0.3)

    def test_fail(self):
        self.assertEqual(1, 2, "planted failure")

    def test_error(self):
        raise ValueError("planted error")

    @unittest.skip("planted skip")
    def test_skip(self):
        pass

    def test_abort(self):
        sys.stderr.write("fake: about to abort\n")
        sys.stderr.flush()
        os.abort()

    def test_hang(self):
        time.sleep(3600)

    def test_sticky(self):
        global POISONED
        POISONED = True
        raise RuntimeError(
            "CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call"
        )

    def test_breaks_context(self):
        # passes, but leaves the context broken (as an asynchronous kernel fault does): the
        # runner's check after the test must blame this test, not the next one
        global POISONED
        POISONED = True
        _FakeCudaModule.broken = True

    def test_after_sticky_a(self):
        pass

    def test_after_sticky_b(self):
        pass

    def test_isolate_adds(self):
        # fails under isolate only, alone too: a failure isolate adds
        if _under_isolate():
            raise RuntimeError("planted isolate-only failure")

    def test_backend_changes(self):
        # fails under the stream-ordered backend, so under isolate too: the backend's
        if _under_backend():
            self.fail("planted backend-only failure")

    def test_isolate_flaky(self):
        # fails under isolate only beside other tests: interference, not isolate's
        if _under_isolate() and os.environ.get("TORCH_TESTS_ALONE") != "1":
            self.fail("planted interference failure")

    def test_race_named(self):
        # fails under isolate only, and the library named why: the test's own use-after-free
        # across streams (a FREED IN USE line during the test), whose reads then read poison
        if _under_isolate():
            sys.stderr.write("isolate: FREED IN USE: allocation 0x7f00 (64 bytes, allocated at event 1) "
                             "freed by cudaFreeAsync on stream 0x1 at event 2 while kernel k on stream 0x2 "
                             "(queued after event 1) may still use it (planted)\n")
            sys.stderr.flush()
            self.fail("Scalars are not close! (planted)")

    def test_finding_printed(self):
        # passes, and the library (here: the test itself) says it found something
        if _under_isolate():
            sys.stderr.write("isolate: STALE WRITE: 4 bytes of freed allocation 0x7f00 (planted)\n")
            sys.stderr.flush()

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(1, 2)

    def test_subtest_fail(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(i, 2)

    @serialTest()
    def test_serial_alone(self):
        # the runner must run it alone: its record says phase "serial"
        pass


class FakeCudaOther(unittest.TestCase):
    def test_pass_other(self):
        pass


if os.environ.get("FAKE_BREAK_IMPORT") == "1":
    # a worker that dies while importing the file (as a preload that aborts would make it)
    sys.stderr.write("planted import failure\n")
    sys.stderr.flush()
    os._exit(7)


class FakeCudaLaterBroken(unittest.TestCase):
    # a class this torch cannot define (here: a decorator that fails): only its own tests are
    # lost, reported as not collected; the classes before and after it still run
    @unittest.skipIf(os.environ["FAKE_NO_SUCH_VARIABLE"], "never")
    def test_never(self):
        pass


class FakeCudaAfterBroken(unittest.TestCase):
    def test_pass_after_broken_class(self):
        pass
