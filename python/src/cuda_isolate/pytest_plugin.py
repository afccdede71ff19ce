"""The pytest plugin of cuda-isolate (entry point ``pytest11``).

Each test runs inside a region named by its node id, and these markers are checked when
libisolate.so is loaded (``pytest --isolate``, ``isolate run -- pytest``, or ``LD_PRELOAD``):

- ``@pytest.mark.isolate_no_findings``: fail if a stale write, a stale launch or an invalid free
  (double frees included) was found while the test ran (the quarantine is checked at the end of
  the test, ``isolate_check_now``, so a stale write the test made is found then); the failure
  names them as the analyzer does (``1 stale write``), the trace's path and, when the analyzer
  ``isolate`` is found (``CUDA_ISOLATE_ANALYZER``, else on ``PATH``), where in the code their
  calls were (``allocated at test_x.py:12 in test_x``). Log mode cannot see stale writes or
  stale launches (no poison, no quarantine): a marked test run in log mode **fails**, saying
  so, instead of passing unchecked; ``pytest --isolate`` runs in isolate mode unless
  ``--isolate-mode`` or ``ISOLATE_MODE`` says otherwise;
- ``@pytest.mark.isolate_limit_peak("2 GiB")``: fail if device memory held at once during the
  test went above the limit;
- ``@pytest.mark.isolate_limit_leak("100 MiB")``: fail if the test left more than that much more
  device memory held than it started with.

Without the library the tests run as usual and the markers are not checked; the run's header
says so.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

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
        help="with --isolate: ISOLATE_MODE for the run (default: as the environment says, else "
        "isolate, so that isolate_no_findings can see stale writes)",
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
    env["ISOLATE_MODE"] = config.getoption("isolate_mode") or env.get("ISOLATE_MODE") or "isolate"
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
# the trace has them (`isolate summary`). Leaks (growth) do not count, as for the analyzer;
# `isolate_limit_leak` limits memory a test leaves held.
_KINDS = (
    ("stale_writes", "stale write", "stale writes"),
    ("stale_launches", "stale launch", "stale launches"),
    ("freed_in_use", "unordered free", "unordered frees"),
    ("invalid_frees", "invalid free", "invalid frees"),
)


# Modes that cannot see stale writes or stale launches (no poison, no quarantine).
_BLIND = ("log", "off")


def _mode():
    """The library's mode, as the environment it started with says (its default: log)."""
    return (os.environ.get("ISOLATE_MODE") or "log").strip().lower()


def _trace_path(config):
    """This process's trace, as the library names it from ``ISOLATE_TRACE`` (``%p`` the pid,
    ``%r`` the rank, ``%h`` the host, ``%%`` a ``%``; default ``isolate-%p.trace``)."""
    pat = os.environ.get("ISOLATE_TRACE") or "isolate-%p.trace"
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    out, i = [], 0
    while i < len(pat):
        c = pat[i]
        if c == "%" and i + 1 < len(pat):
            n = pat[i + 1]
            rep = {"p": str(os.getpid()), "r": rank, "h": socket.gethostname(), "%": "%"}.get(n)
            if rep is not None:
                out.append(rep)
                i += 2
                continue
        out.append(c)
        i += 1
    return os.path.join(str(config.invocation_params.dir), "".join(out))


def _analyzer():
    return os.environ.get("CUDA_ISOLATE_ANALYZER") or shutil.which("isolate")


# (counter, the summary JSON's list of them, its stacks as (what, key)).
_PLACES = (
    ("stale_writes", "poison_violations", (("allocated", "alloc_stack"), ("freed", "free_stack"))),
    (
        "stale_launches",
        "stale_launches",
        (("launched", "launch_stack"), ("allocated", "alloc_stack"), ("freed", "free_stack")),
    ),
    (
        "freed_in_use",
        "freed_in_use",
        (("freed", "free_stack"), ("used", "use_stack"), ("allocated", "alloc_stack")),
    ),
    ("invalid_frees", "invalid_frees", (("freed", "stack"), ("first freed", "first_free_stack"), ("allocated", "alloc_stack"))),
)


def _code(trace, before, after):
    """Where in the code the findings made between two readings were (``allocated at
    t.py:3 in f``), each once, read with ``isolate summary --json`` from the trace as written so
    far (the analyzer names each stack's ``place``); an empty list when the analyzer is not found
    or the trace does not have them yet."""
    tool = _analyzer()
    if not tool or not os.path.isfile(trace):
        return []
    deadline = time.monotonic() + 5.0
    while True:
        try:
            out = subprocess.run(
                [tool, "summary", "--json", trace], capture_output=True, timeout=60, check=False
            )
            s = json.loads(out.stdout.decode("utf-8", "replace"))
        except (OSError, ValueError, subprocess.SubprocessError):
            return []
        # The records may still be on their way to the file: wait a little for them.
        have = all(len(s.get(lst, [])) >= min(after.get(k, 0), 1000) for k, lst, _ in _PLACES)
        if have or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    places = []
    for k, lst, stacks in _PLACES:
        for f in s.get(lst, [])[before.get(k, 0) : after.get(k, 0)]:
            for what, key in stacks:
                p = (f.get(key) or {}).get("place")
                if p and "%s at %s" % (what, p) not in places:
                    places.append("%s at %s" % (what, p))
    return places


def _findings(c):
    # .get: a library older than a kind has no counter for it.
    return sum(c.get(k, 0) for k, _, _ in _KINDS)


def _describe(before, after):
    """``1 stale write, 2 invalid frees``: the findings made between two readings."""
    parts = []
    for k, one, many in _KINDS:
        n = after.get(k, 0) - before.get(k, 0)
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
    if no_findings and _mode() in _BLIND:
        pytest.fail(
            "isolate_no_findings: libisolate.so runs in %s mode, which cannot see stale writes or "
            "stale launches (no poison, no quarantine): this test was NOT checked. Run it in "
            "isolate mode: `pytest --isolate` (isolate mode unless --isolate-mode says "
            "otherwise) or ISOLATE_MODE=isolate" % _mode(),
            pytrace=False,
        )
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
        trace = _trace_path(item.config)
        code = _code(trace, before, after)
        problems.append(
            "isolate_no_findings: new findings during the test: %s (see the trace: isolate "
            "summary %s)%s"
            % (
                _describe(before, after),
                trace,
                "".join("\n  " + p for p in code)
                if code
                else "\n  (where in the code: `isolate summary %s`)" % trace,
            )
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
