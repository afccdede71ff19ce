"""The pytest plugin of cuda-isolate (entry point ``pytest11``).

Each test runs inside a region named by its node id, and these markers are checked when
libisolate.so is loaded (``pytest --isolate``, ``isolate run -- pytest``, or ``LD_PRELOAD``):

- ``@pytest.mark.isolate_no_findings``: fail if a stale write, a stale launch or an invalid free
  (double frees included) was found while the test ran (the quarantine is checked at the end of
  the test, ``isolate_check_now``, so a stale write the test made is found then); the failure
  names them as the analyzer does (``1 stale write``);
- ``@pytest.mark.isolate_limit_peak("2 GiB")``: fail if device memory held at once during the
  test went above the limit;
- ``@pytest.mark.isolate_limit_leak("100 MiB")``: fail if the test left more than that much more
  device memory held than it started with.

Without the library the tests run as usual and the markers are not checked; the run's header
says so.
"""

import os
import sys

import pytest

import cuda_isolate

_REEXEC = "CUDA_ISOLATE_REEXEC"


def pytest_addoption(parser):
    g = parser.getgroup("cuda-isolate")
    g.addoption(
        "--isolate",
        action="store_true",
        default=False,
        help="run pytest again with libisolate.so preloaded (when it is not already), so that "
        "the isolate_* markers are checked",
    )
    g.addoption(
        "--isolate-mode",
        default=None,
        choices=["log", "isolate"],
        help="with --isolate: ISOLATE_MODE for the run (default: as the environment says, else log)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "isolate_no_findings: fail the test if libisolate.so found a stale write, a stale launch "
        "or an invalid free while it ran",
    )
    config.addinivalue_line(
        "markers",
        "isolate_limit_peak(size): fail the test if device memory held during it went above "
        "size ('2 GiB')",
    )
    config.addinivalue_line(
        "markers",
        "isolate_limit_leak(size): fail the test if it left more than size ('100 MiB') more "
        "device memory held than before it",
    )
    if config.getoption("isolate") and not cuda_isolate.loaded():
        _reexec(config)


def _reexec(config):
    lib = cuda_isolate.library_path()
    if os.environ.get(_REEXEC):
        raise pytest.UsageError(
            "cuda-isolate: pytest was run again with LD_PRELOAD=%s, but libisolate.so is still "
            "not loaded" % lib
        )
    if not lib or not os.path.isfile(lib):
        raise pytest.UsageError(
            "cuda-isolate: libisolate.so not found (%s): install the wheel or set "
            "CUDA_ISOLATE_LIB" % lib
        )
    env = dict(os.environ)
    env[_REEXEC] = "1"
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    # NVTX ranges become regions too (as under `isolate run`), unless another tool is named.
    env.setdefault("NVTX_INJECTION64_PATH", lib)
    mode = config.getoption("isolate_mode")
    if mode:
        env["ISOLATE_MODE"] = mode
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.stop_global_capturing()
    sys.stdout.flush()
    sys.stderr.flush()
    args = [sys.executable, "-m", "pytest"] + list(config.invocation_params.args)
    os.chdir(str(config.invocation_params.dir))
    os.execve(sys.executable, args, env)


def pytest_report_header(config):
    if cuda_isolate.loaded():
        c = cuda_isolate.counters() or {}
        state = "recording" if c.get("recording") else "loaded, recording off"
        return "cuda-isolate: libisolate.so %s; isolate_* markers are checked" % state
    return (
        "cuda-isolate: libisolate.so is not loaded: isolate_* markers are NOT checked "
        "(run `pytest --isolate`, or `isolate run -- pytest ...`)"
    )


# The findings the library's counters hold, with the names and plurals the analyzer gives them
# (analyzer/src/words.rs, analyzer/src/finding.rs). All of them count, as they do for
# `isolate summary --error-exitcode` (invalid frees include double frees here: the library's
# counter does not tell them apart). Device faults are findings too but not among the counters:
# the trace has them (`isolate summary`). Possible leaks do not count, as for the analyzer;
# `isolate_limit_leak` limits memory a test leaves held.
_KINDS = (
    ("stale_writes", "stale write", "stale writes"),
    ("stale_launches", "stale launch", "stale launches"),
    ("invalid_frees", "invalid free", "invalid frees"),
)


def _findings(c):
    return sum(c[k] for k, _, _ in _KINDS)


def _describe(before, after):
    """``1 stale write, 2 invalid frees``: the findings made between two readings."""
    parts = []
    for k, one, many in _KINDS:
        n = after[k] - before[k]
        if n > 0:
            parts.append("%d %s" % (n, one if n == 1 else many))
    return ", ".join(parts)


def _limit(item, name):
    m = item.get_closest_marker(name)
    if m is None:
        return None
    if not m.args:
        raise pytest.UsageError("%s: @pytest.mark.%s needs a size, e.g. '2 GiB'" % (item.nodeid, name))
    return cuda_isolate.parse_size(m.args[0])


def _mib(n):
    return "%d bytes (%.1f MiB)" % (n, n / 1048576.0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not cuda_isolate.loaded():
        return (yield)
    api = cuda_isolate
    peak_limit = _limit(item, "isolate_limit_peak")
    leak_limit = _limit(item, "isolate_limit_leak")
    api.peak_reset()
    before = api.counters()
    no_findings = item.get_closest_marker("isolate_no_findings") is not None
    with api.region(item.nodeid):
        result = yield
    checked = None
    if no_findings:
        # The quarantine checked now, so that a stale write made during this test fails this
        # test (not only found when its memory leaves quarantine, or at exit).
        checked = api.check_now()
    after = api.counters()
    if before is None or after is None:
        return result
    problems = []
    if checked is not None and checked > after["stale_writes"]:
        after["stale_writes"] = checked
    if no_findings and _findings(after) > _findings(before):
        problems.append(
            "isolate_no_findings: new findings during the test: %s (see the trace: isolate "
            "summary)" % _describe(before, after)
        )
    if peak_limit is not None:
        peak = after.get("window_peak_device_bytes", after["peak_device_bytes"])
        if peak > peak_limit:
            problems.append(
                "isolate_limit_peak: device memory peaked at %s, above the limit of %s"
                % (_mib(peak), _mib(peak_limit))
            )
    if leak_limit is not None:
        grown = after["live_device_bytes"] - before["live_device_bytes"]
        if grown > leak_limit:
            problems.append(
                "isolate_limit_leak: %s more device memory held after the test than before, "
                "above the limit of %s" % (_mib(grown), _mib(leak_limit))
            )
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    return result
