#!/usr/bin/env python3
"""Checks tests/gpu/torch_tests.py (the runner of PyTorch's CUDA tests) without a GPU or torch:
it runs the fake module tests/gpu/torch_tests_fake.py through the runner with plain python3,
three configurations that only set variables the fake tests read, and checks every outcome,
that nothing cascades after a sticky CUDA error, that a dead or hung worker costs one test,
the re-runs alone and their verdicts, the printed and Markdown tables, that `--budget` is
honoured, that a module which does not import is reported, that a configuration whose
workers cannot start is reported, and the shim that fills names the installed torch lacks.

    python3 tests/gpu/torch_tests_selftest.py        (or bash tests/gpu/torch_tests_selftest.sh)

Prints one line per check and `N passed, M failed`; exits 1 when a check failed.
Run by CI through tests/tests/gpu_scripts.rs.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "torch_tests.py")
TABLE = os.path.join(HERE, "torch_tests_table.py")
FAKE = os.path.join(HERE, "torch_tests_fake.py")
FAKE_CONFIGS = ["--config", "plain=", "--config", "async=FAKE_ASYNC=1", "--config", "isolate=FAKE_ISOLATE=1"]

passed, failed = 0, 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""))


def run(args, timeout=120):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def load(out):
    recs = {}
    for name in ("plain", "async", "isolate", "confirm"):
        path = os.path.join(out, "results", name + ".jsonl")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                key = (r["config"], r["id"]) if name != "confirm" else ("confirm-" + r["config"], r["id"])
                recs[key] = r
    return recs


# Outcome of each fake test in each configuration (plain, async, isolate).
EXPECTED = {
    "FakeCuda.test_pass": ("pass", "pass", "pass"),
    "FakeCuda.test_pass_slowish": ("pass", "pass", "pass"),
    "FakeCuda.test_fail": ("fail", "fail", "fail"),
    "FakeCuda.test_error": ("error", "error", "error"),
    "FakeCuda.test_skip": ("skip", "skip", "skip"),
    "FakeCuda.test_abort": ("crash", "crash", "crash"),
    "FakeCuda.test_hang": ("timeout", "timeout", "timeout"),
    "FakeCuda.test_sticky": ("error", "error", "error"),
    "FakeCuda.test_breaks_context": ("error", "error", "error"),
    "FakeCuda.test_after_sticky_a": ("pass", "pass", "pass"),
    "FakeCuda.test_after_sticky_b": ("pass", "pass", "pass"),
    "FakeCuda.test_isolate_adds": ("pass", "pass", "error"),
    "FakeCuda.test_backend_changes": ("pass", "fail", "fail"),
    "FakeCuda.test_isolate_flaky": ("pass", "pass", "fail"),
    "FakeCuda.test_expected_failure": ("pass", "pass", "pass"),
    "FakeCuda.test_subtest_fail": ("fail", "fail", "fail"),
    "FakeCuda.test_serial_alone": ("pass", "pass", "pass"),
    "FakeCudaOther.test_pass_other": ("pass", "pass", "pass"),
    "FakeCuda.test_finding_printed": ("pass", "pass", "pass"),
    "FakeCuda.test_race_named": ("pass", "pass", "fail"),
    "FakeCudaAfterBroken.test_pass_after_broken_class": ("pass", "pass", "pass"),
}
CONFIGS = ("plain", "async", "isolate")


def full_run(tmp):
    out = os.path.join(tmp, "full")
    # one worker per configuration, so a cascade after the sticky error would show: the tests
    # after it run in the same order in a worker that would still be the poisoned one
    p, secs = run([RUNNER, "run", "--module", FAKE, "--out", out, "--work", os.path.join(tmp, "fullwork"),
                   "--budget", "90", "--timeout", "4", "--workers", "1"] + FAKE_CONFIGS)
    check("full run exits 0", p.returncode == 0, p.stderr[-2000:])
    recs = load(out)
    for tid, outs in EXPECTED.items():
        for c, want in zip(CONFIGS, outs):
            got = recs.get((c, tid), {}).get("outcome", "not run")
            check(f"{c:8} {tid} is {want}", got == want, f"got {got}: {recs.get((c, tid))}")
    for c in CONFIGS:
        r = recs.get((c, "FakeCuda.test_sticky"), {})
        check(f"{c}: the sticky error's first line is kept",
              r.get("error") == "RuntimeError: CUDA error: an illegal memory access was encountered", r)
        r = recs.get((c, "FakeCuda.test_breaks_context"), {})
        check(f"{c}: a context left broken is blamed on the test that broke it",
              r.get("error", "").startswith("RuntimeError: after the test, torch.cuda.synchronize() failed: "
                                            "RuntimeError: CUDA error: an illegal memory access"), r)
        r = recs.get((c, "FakeCuda.test_abort"), {})
        check(f"{c}: the abort is named with the worker's last words",
              "SIGABRT" in r.get("error", "") and "about to abort" in r.get("error", ""), r)
        r = recs.get((c, "FakeCuda.test_serial_alone"), {})
        check(f"{c}: the @serialTest test ran in the serial phase", r.get("phase") == "serial", r)
        r = recs.get((c, "FakeCuda.test_pass"), {})
        check(f"{c}: a record has id, outcome, seconds, error", all(k in r for k in ("id", "outcome", "seconds", "error")), r)
        r = recs.get((c, "FakeCuda.test_expected_failure"), {})
        check(f"{c}: an expected failure passes, noted", r.get("note") == "expected failure", r)
    # the re-runs alone: exactly the three tests whose isolate outcome differs from plain
    alone = sorted({tid for (k, tid) in recs if k.startswith("confirm-")})
    check("re-run alone: the tests isolate changes",
          alone == ["FakeCuda.test_backend_changes", "FakeCuda.test_isolate_adds", "FakeCuda.test_isolate_flaky",
                    "FakeCuda.test_race_named"], alone)
    for tid, iso, be in (("FakeCuda.test_isolate_adds", "error", "pass"),
                         ("FakeCuda.test_backend_changes", "fail", "fail"),
                         ("FakeCuda.test_isolate_flaky", "pass", "pass")):
        got = (recs.get(("confirm-isolate", tid), {}).get("outcome"), recs.get(("confirm-async", tid), {}).get("outcome"))
        check(f"alone {tid}: isolate {iso}, backend {be}", got == (iso, be), got)
    text = p.stdout
    check("counts: plain", "plain                          13        2        3        1        1        1        0" in text, text[-3000:])
    check("counts: backend", "stream-ordered backend         12        3        3        1        1        1        0" in text)
    check("counts: isolate", "isolate                         9        5        4        1        1        1        0" in text)
    check("verdict: isolate adds", "FakeCuda.test_isolate_adds: pass / pass / error  [alone: async pass, isolate error]  -> ISOLATE ADDS THIS" in text)
    check("verdict: the backend's", "FakeCuda.test_backend_changes: pass / fail / fail  [alone: async fail, isolate fail]  -> stream-ordered backend" in text)
    check("verdict: interference", "FakeCuda.test_isolate_flaky: pass / pass / fail  [alone: async pass, isolate pass]  -> depends on earlier tests in the worker" in text)
    check("verdict: the test's own race, named",
          "FakeCuda.test_race_named: pass / pass / fail  [alone: async pass, isolate fail]  -> the test's own use-after-free across streams, named by isolate mode" in text, text[-3000:])
    check("exactly 4 outcomes differ", "outcomes that differ between configurations (4)" in text)
    check("a class that cannot be defined is reported as not collected",
          "could not be collected (1):" in text
          and "class FakeCudaLaterBroken (line" in text and "KeyError: 'FAKE_NO_SUCH_VARIABLE'" in text, text[:1500])
    check("nothing listed as not run", "not run (budget" not in text)
    check("a finding printed during a test is listed with the test",
          "tests during which isolate mode printed a finding (2):\n  FakeCuda.test_finding_printed: "
          "isolate: STALE WRITE: 4 bytes of freed allocation 0x7f00 (planted)" in text, text[-1500:])
    files = sorted(os.listdir(out)) + sorted("results/" + n for n in os.listdir(os.path.join(out, "results")))
    want = ["logs.tar.gz", "results", "summary.txt", "table.md", "results/async.jsonl", "results/confirm.jsonl",
            "results/isolate.jsonl", "results/meta.json", "results/plain.jsonl"]
    check("outputs: at most 8 files, the expected ones", files == want, files)
    # the Markdown table, from the jsonl files alone
    p2, _ = run([TABLE, os.path.join(out, "results")])
    md = p2.stdout
    check("table.py renders Markdown", p2.returncode == 0 and md.startswith("| configuration |"), p2.stderr)
    check("table.py: counts row", "| plain | 13 | 2 | 3 | 1 | 1 | 1 | 0 |" in md, md[:800])
    check("table.py: the isolate-added row",
          "| `FakeCuda.test_isolate_adds` | pass | pass | error | error | pass | ISOLATE ADDS THIS (ours to fix) |" in md, md)
    check("table.py: every test listed", md.count("| `FakeCuda") >= len(EXPECTED) - 1 + 3)
    with open(os.path.join(out, "table.md"), encoding="utf-8") as f:
        check("table.md is what table.py renders", f.read() == md)


def budget_run(tmp):
    out = os.path.join(tmp, "budget")
    budget = 8
    # the hang would take 60 s: the budget must stop it
    p, secs = run([RUNNER, "run", "--module", FAKE, "--out", out, "--work", os.path.join(tmp, "budgetwork"),
                   "--budget", str(budget), "--timeout", "60", "--workers", "1"] + FAKE_CONFIGS)
    check("budget run exits 0", p.returncode == 0, p.stderr[-2000:])
    check(f"budget run ends within its {budget} s budget", secs <= budget + 1.5, f"{secs:.1f} s")
    recs = load(out)
    for c in CONFIGS:
        check(f"{c}: the hang, stopped at the budget, is not run (not a timeout)",
              (c, "FakeCuda.test_hang") not in recs, recs.get((c, "FakeCuda.test_hang")))
    text = p.stdout
    check("budget run lists what was not run", "not run (budget" in text and "FakeCuda.test_hang" in text.split("not run (budget", 1)[-1], text[-2000:])
    check("budget run still writes the table", os.path.exists(os.path.join(out, "table.md")))


def broken_module(tmp):
    mod = os.path.join(tmp, "broken_mod.py")
    with open(mod, "w") as f:
        f.write("import unittest\nraise ImportError('planted: cannot import name X from torch.testing')\n")
    out = os.path.join(tmp, "broken")
    p, _ = run([RUNNER, "run", "--module", mod, "--out", out, "--work", os.path.join(tmp, "brokenwork"),
                "--budget", "30", "--configs", "plain", "--config", "plain="])
    check("a module that gives no tests: exit 3", p.returncode == 3, p.returncode)
    check("a module that gives no tests: the failing statement reported as not collected",
          "could not be collected" in p.stdout and "planted: cannot import name X" in p.stdout
          and "(line 2)" in p.stdout, p.stdout[-1500:])


def broken_config(tmp):
    # a configuration in which no worker starts: its tests are crashes that say why
    out = os.path.join(tmp, "brokencfg")
    p, _ = run([RUNNER, "run", "--module", FAKE, "--out", out, "--work", os.path.join(tmp, "brokencfgwork"),
                "--budget", "30", "--configs", "plain,broken", "--config", "plain=",
                "--config", "broken=FAKE_BREAK_IMPORT=1", "--only", r"\.test_pass$|\.test_fail$"])
    check("a configuration that cannot start: exit 0", p.returncode == 0, p.stderr[-1500:])
    path = os.path.join(out, "results", "broken.jsonl")
    recs = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    check("a configuration that cannot start: its tests are crashes saying why",
          len(recs) == 2 and all(r["outcome"] == "crash" and "no worker could start" in r["error"]
                                 and "exit status 7" in r["error"] and "planted import failure" in r["error"]
                                 for r in recs), recs)


def shim(tmp):
    # a fake `torch` package (never the real one: this runs with it first on the path)
    root = os.path.join(tmp, "faketorch")
    pkg = os.path.join(root, "torch", "testing", "_internal")
    os.makedirs(pkg)
    for d in (os.path.join(root, "torch"), os.path.join(root, "torch", "testing"), pkg):
        open(os.path.join(d, "__init__.py"), "w").close()
    with open(os.path.join(pkg, "common_utils.py"), "w") as f:
        f.write("TEST_CUDA = True\ndef serialTest(condition=True):\n    return lambda f: f\n")
    test_file = os.path.join(tmp, "uses_new_names.py")
    with open(test_file, "w") as f:
        f.write(
            "from torch.testing._internal.common_utils import (\n"
            "    TEST_CUDA, serialTest, TEST_CUDA_PYTHON_BINDINGS, MI200_ARCH,\n"
            "    skipIfRocmArch, recover_orig_fp32_precision, cuda_python_error_check)\n"
            "from torch.testing._internal.not_there import SOMETHING\n"
        )
    code = (
        "import json, sys; sys.path[:0] = [%r, %r]\n"
        "import torch_tests_shim as s\n"
        "filled = s.install(%r)\n"
        "import torch.testing._internal.common_utils as cu\n"
        "deco = cu.skipIfRocmArch(cu.MI200_ARCH)\n"
        "f = lambda: 1\n"
        "try:\n    cu.cuda_python_error_check(0); raised = ''\n"
        "except NotImplementedError as e:\n    raised = str(e)\n"
        "print(json.dumps({'filled': filled, 'flag': cu.TEST_CUDA_PYTHON_BINDINGS, 'arch': list(cu.MI200_ARCH),"
        " 'kept': cu.TEST_CUDA, 'deco_called': deco(f) is f, 'deco_bare': cu.recover_orig_fp32_precision(f) is f,"
        " 'raised': raised}))\n"
    ) % (root, HERE, test_file)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    try:
        r = json.loads(p.stdout)
    except json.JSONDecodeError:
        check("shim runs", False, p.stderr[-1500:])
        return
    names = sorted(f["name"] for f in r["filled"] if f["name"])
    check("shim fills exactly the missing names",
          names == ["MI200_ARCH", "TEST_CUDA_PYTHON_BINDINGS", "cuda_python_error_check",
                    "recover_orig_fp32_precision", "skipIfRocmArch"], names)
    check("shim: a flag is False, an *_ARCH an empty tuple", r["flag"] is False and r["arch"] == [], r)
    check("shim: a name the torch has is kept", r["kept"] is True, r)
    check("shim: decorators pass through, called or bare", r["deco_called"] and r["deco_bare"], r)
    check("shim: a missing function says what is missing", "cuda_python_error_check" in r["raised"], r)
    check("shim: a module that does not import is reported, not faked",
          any(f["name"] is None and "not_there" in f["module"] for f in r["filled"]), r["filled"])


def main():
    with tempfile.TemporaryDirectory(prefix="torch-tests-selftest.") as tmp:
        full_run(tmp)
        budget_run(tmp)
        broken_module(tmp)
        broken_config(tmp)
        shim(tmp)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
