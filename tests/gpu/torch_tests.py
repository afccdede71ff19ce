#!/usr/bin/env python3
"""PyTorch's own CUDA tests (test/test_cuda.py), test by test, in several configurations:
plain, PyTorch's stream-ordered backend alone (`backend:cudaMallocAsync`), and isolate mode.

    python3 tests/gpu/torch_tests.py run --module tests/gpu/ext/test_cuda.py --out $OUT \
        [--budget 540] [--configs plain,async,isolate] [--only REGEX] [--shard K/N] ...

(`bash tests/gpu/torch_tests.sh` runs this with the H200's defaults.)

How it runs:
1. Collect: one process imports the module (through tests/gpu/torch_tests_shim.py, which
   fills names the installed torch lacks) and lists `Class.test_method` ids with the unittest
   loader (no pytest needed). Tests marked `@serialTest()` / `@largeTensorTest` / skipped
   without a large GPU are "serial": run alone, after the others. When the shim fills
   `TEST_CUDAMALLOCASYNC` (the stored test file imports it from common_utils, which torch 2.11
   lacks), each worker sets it from the PYTORCH_CUDA_ALLOC_CONF it runs under (True under
   `backend:cudaMallocAsync`, so under async and isolate), as PyTorch's CI has it for that
   backend: the tests gated on it upstream skip, or take their other branch, there.
2. For each configuration, worker processes (`--workers` per configuration, all
   configurations at once, tests handed out one at a time in the same order) each run tests
   in sequence, in-process, and report one JSON line per test (id, outcome
   pass/fail/error/skip, seconds, first line of the error); the driver appends it to
   `results/<config>.jsonl` as it comes. A worker that dies (signal, abort) makes that test
   `crash`; a test whose error names a sticky CUDA error (illegal memory access, unspecified
   launch failure, "CUDA error", ...) ends its worker; a test past `--timeout` is killed with
   its worker (`timeout`); in every case the next test gets a fresh worker, so nothing
   cascades.
3. Serial tests: one worker at a time on the whole GPU.
4. Confirm: every test whose outcome under isolate differs from plain is re-run alone, in its
   own process, under isolate and under the backend alone (`results/confirm.jsonl`), those
   where isolate also differs from the backend first. A test the backend alone fails too is
   the backend's; one isolate fails alone too is isolate's; one isolate passes alone depends
   on earlier tests in its worker (torch_tests_table.verdict).
5. Everything fits `--budget` seconds: no test starts after its phase's deadline, tests still
   running at the end are stopped, and what was not run is printed.

Outputs (at most 8 files, as the device tool brings back): `$OUT/results/{<config>,confirm}.jsonl`,
`$OUT/results/meta.json`, `$OUT/summary.txt` (the printed tables), `$OUT/table.md` (for
docs/reliability.md, also `torch_tests_table.py`), `$OUT/logs.tar.gz` (worker logs, then the
traces of the re-runs alone, up to `--logs-cap` MiB).
"""

import argparse
import ast
import importlib.util
import io
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
import unittest
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch_tests_table as table  # noqa: E402

THIS = os.path.abspath(__file__)

# An error whose text matches leaves the CUDA context unusable (or may): the worker ends
# after reporting it, and the next test gets a fresh process.
STICKY = re.compile(
    r"illegal memory access|unspecified launch failure|CUDA error|CUDA driver error|"
    r"cudaError|device-side assert|misaligned address|illegal instruction|"
    r"uncorrectable ECC|hipError",
    re.I,
)

# Static marks of a test that must run alone (decorators in the test file's source).
SERIAL_DECORATORS = re.compile(r"\bserialTest\b|\blargeTensorTest\b|\bTEST_LARGE_TENSOR\b|\bTEST_MEDIUM_TENSOR\b")

# Environment variables that choose PyTorch's allocator: cleared before each configuration
# sets its own.
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")

# The flag PyTorch's tests read to know they run on the stream-ordered backend
# (upstream: `TEST_CUDA and torch.cuda.get_allocator_backend() == "cudaMallocAsync"`).
ASYNC_FLAG = "TEST_CUDAMALLOCASYNC"

# What a worker keeps of the library's stderr lines per test: findings whole, others cut.
KEEP_FINDINGS, KEEP_OTHERS = 40, 8
FINDING_WIDTH, OTHER_WIDTH = 2000, 300


def now():
    return time.monotonic()


def first_line(s, limit=300):
    s = str(s).strip()
    line = s.splitlines()[0] if s else ""
    return line[:limit]


# ---------------------------------------------------------------------------------------
# Static analysis of the test file: which tests are serial.


def static_tests(path):
    """{class: {"all": set(func names), "serial": set(func names)}} from the file's source."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        entry = out.setdefault(node.name, {"all": set(), "serial": set()})
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                entry["all"].add(item.name)
                for d in item.decorator_list:
                    if SERIAL_DECORATORS.search(ast.unparse(d)):
                        entry["serial"].add(item.name)
    return out


def static_function(static, tid):
    """(class, function) of the source definition a (possibly instantiated) test id comes from."""
    cls, meth = tid.split(".", 1)
    cands = [c for c in static if cls == c or cls.startswith(c)]
    if not cands:
        return None, None
    acls = max(cands, key=len) if cls not in static else cls
    funcs = [f for f in static[acls]["all"] if meth == f or meth.startswith(f + "_")]
    if not funcs:
        return acls, None
    return acls, max(funcs, key=len)


# ---------------------------------------------------------------------------------------
# Worker side: import the module, run tests one by one in this process.


def _statement_name(stmt):
    if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        kind = "class" if isinstance(stmt, ast.ClassDef) else "def"
        return f"{kind} {stmt.name}"
    return f"statement `{first_line(ast.unparse(stmt), 80)}`"


def alloc_backend(env):
    """(backend, variable): the allocator backend named by `backend:` in PYTORCH_CUDA_ALLOC_CONF
    (else PYTORCH_ALLOC_CONF), and that variable; ("native", None) when neither names one."""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for opt in (env.get(var) or "").split(","):
            key, sep, value = opt.partition(":")
            if sep and key.strip() == "backend":
                return value.strip(), var
    return "native", None


def derive_async_flag(filled, env=None):
    """Give TEST_CUDAMALLOCASYNC, where the shim filled it (with False), the value PyTorch's CI
    has for the worker's allocator: True when PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF)
    names backend:cudaMallocAsync, as under async and under isolate mode (whose library sets it
    in the environment before Python starts). Rewrites the filled entry's `value` to say what
    was set and why; notes when torch.cuda.get_allocator_backend() says otherwise."""
    env = os.environ if env is None else env
    for f in filled:
        if f.get("name") != ASYNC_FLAG:
            continue
        mod = sys.modules.get(f["module"])
        backend, var = alloc_backend(env)
        test_cuda = bool(getattr(mod, "TEST_CUDA", True))
        value = test_cuda and backend == "cudaMallocAsync"
        if mod is not None:
            setattr(mod, ASYNC_FLAG, value)
        why = f"{var} names backend:{backend}" if var else \
            "no backend in PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF: native"
        if not test_cuda:
            why += "; TEST_CUDA is False"
        try:
            torch = sys.modules.get("torch")
            said = torch.cuda.get_allocator_backend()
            if isinstance(said, str) and said != backend:
                why += f"; torch.cuda.get_allocator_backend() says {said}"
        except Exception:  # noqa: BLE001 - the environment decides; torch's word is a check only
            pass
        f["value"] = f"{value} (from the environment: {why})"
    return filled


def shim_strings(filled):
    return [f"{f['module']}.{f['name']} = {f['value']}" if f["name"] else f"{f['module']}: {f['value']}"
            for f in filled]


def load_module(path):
    """Import the test file at `path` as a module, after the shim.

    The file's top-level statements run one by one in the module's namespace, compiled from
    the file itself (same file name and lines in tracebacks and frames): a statement that
    fails on this torch (a class decorated with a config key 2.11 lacks, say) costs only its
    own tests, reported, instead of the whole file. Returns (module, filled, failed): what the
    shim filled, and "class X (line N): Error: message" for each statement that failed."""
    sys.argv = [path]
    import torch_tests_shim

    filled = derive_async_flag(torch_tests_shim.install(path))
    cu = sys.modules.get("torch.testing._internal.common_utils")
    if cu is not None and hasattr(cu, "parse_cmd_line_args"):
        try:
            cu.parse_cmd_line_args()
        except SystemExit:
            pass
        except Exception:  # noqa: BLE001 - older/newer signatures: the import still stands
            traceback.print_exc()
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = path
    sys.modules[name] = mod
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    failed = []
    for stmt in tree.body:
        code = compile(ast.Module(body=[stmt], type_ignores=[]), path, "exec")
        try:
            exec(code, mod.__dict__)  # noqa: S102 - the test file itself, statement by statement
        except Exception as e:  # noqa: BLE001 - reported per statement
            traceback.print_exc()
            failed.append(f"{_statement_name(stmt)} (line {stmt.lineno}): {type(e).__name__}: {first_line(e)}")
    return mod, filled, failed


def list_tests(mod):
    """(ids, uncollected): `Class.method` for every TestCase class the module defines."""
    loader = unittest.TestLoader()
    ids, broken = [], []
    for name, obj in sorted(vars(mod).items()):
        if not (isinstance(obj, type) and issubclass(obj, unittest.TestCase)):
            continue
        if obj.__module__ != mod.__name__:
            continue
        try:
            names = loader.getTestCaseNames(obj)
        except Exception as e:  # noqa: BLE001
            broken.append(f"{name}: {type(e).__name__}: {first_line(e)}")
            continue
        for m in names:
            ids.append(f"{name}.{m}")
    return ids, broken


def runtime_serial(mod, tid):
    """True when the test function carries pytest's `serial` mark (serialTest under pytest)."""
    cls, meth = tid.split(".", 1)
    fn = getattr(getattr(mod, cls, None), meth, None)
    for m in getattr(fn, "pytestmark", []) or []:
        if getattr(m, "name", None) == "serial":
            return True
    return False


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.events = []

    def addSuccess(self, test):
        super().addSuccess(test)
        self.events.append(("pass", None))

    def addError(self, test, err):
        super().addError(test, err)
        self.events.append(("error", err))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.events.append(("fail", err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.events.append(("skip", reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.events.append(("xfail", err))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.events.append(("xpass", None))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self.events.append((kind, err))


class _Noted(tuple):
    """An error known only by its text, shaped as an exc_info."""

    def __new__(cls, text):
        return super().__new__(cls, (RuntimeError, RuntimeError(text), None))


def _err_text(err):
    """'Type: first line' of an exc_info, and the whole chain's text (for the sticky check)."""
    etype, value, tb = err
    msg = first_line(value)
    head = f"{etype.__name__}: {msg}" if msg else etype.__name__
    chain, seen, v = [], set(), value
    while v is not None and id(v) not in seen:
        seen.add(id(v))
        chain.append(f"{type(v).__name__}: {v}")
        v = v.__cause__ or v.__context__
    detail = "".join(traceback.format_exception(etype, value, tb))[-3000:]
    return head, "\n".join(chain), detail


def run_one(mod, tid):
    """Run one test in this process; a dict with outcome, seconds, error, sticky, note, detail."""
    cls_name, meth = tid.split(".", 1)
    t0 = now()
    result = _Result()
    try:
        cls = getattr(mod, cls_name)
        case = cls(meth)
        case.run(result)
    except BaseException as e:  # noqa: BLE001 - the runner itself must survive the test
        result.events.append(("error", (type(e), e, e.__traceback__)))
    # failures put straight into the lists, not through addFailure (torch's TestCase appends
    # "TestSuite execution was aborted early" when torch.cuda.synchronize() fails after a test)
    seen = sum(1 for k, _ in result.events if k in ("fail", "error"))
    for _, text in (result.errors + result.failures)[seen:]:
        result.events.append(("error", _Noted(first_line(text) or "a failure was recorded")))
    # a context the test left broken is this test's fault, not the next one's
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            result.events.append(("error", _Noted(
                f"after the test, torch.cuda.synchronize() failed: {type(e).__name__}: {first_line(e)}")))
    secs = round(now() - t0, 3)
    rec = {"id": tid, "seconds": secs, "outcome": "pass", "error": "", "sticky": False}
    kinds = [k for k, _ in result.events]
    bad = [(k, e) for k, e in result.events if k in ("error", "fail")]
    if bad:
        # the first error wins over failures for the outcome; the first bad event gives the line
        rec["outcome"] = "error" if "error" in kinds else "fail"
        pick = next((e for k, e in bad if k == rec["outcome"]), bad[0][1])
        head, chain, detail = _err_text(pick)
        rec["error"] = head
        rec["detail"] = detail
        rec["sticky"] = any(STICKY.search(_err_text(e)[1]) for _, e in bad)
    elif "xpass" in kinds:
        rec["outcome"] = "fail"
        rec["error"] = "unexpected success (the test is marked expectedFailure)"
    elif "skip" in kinds and "pass" not in kinds:
        rec["outcome"] = "skip"
        rec["error"] = first_line(next(r for k, r in result.events if k == "skip"))
    elif "xfail" in kinds:
        rec["outcome"] = "pass"
        rec["note"] = "expected failure"
    elif not kinds:
        rec["outcome"] = "error"
        rec["error"] = "the test reported no outcome"
    return rec


def keep_isolate_lines(lines):
    """The library's lines (`isolate: ...`) among `lines`, in order: up to KEEP_FINDINGS findings,
    whole (a finding's `allocated at FILE:LINE` comes late in the line), and KEEP_OTHERS others."""
    out, nf, no = [], 0, 0
    for line in lines:
        if "isolate:" not in line:
            continue
        if table.FINDING.search(line):
            if nf < KEEP_FINDINGS:
                out.append(line[:FINDING_WIDTH])
                nf += 1
        elif no < KEEP_OTHERS:
            out.append(line[:OTHER_WIDTH])
            no += 1
    return out


def isolate_lines(log_path, offset):
    """Lines the library wrote (`isolate: ...`) to the worker's log since `offset`."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            return keep_isolate_lines(raw.decode("utf-8", "replace").rstrip() for raw in f)
    except OSError:
        return []


def log_tail(log_path):
    """What the worker's log says after its last test marker: {"after": the last test that
    finished, "during": a test that started and never finished (the worker died or was killed
    in it), "lines": the library's lines since that marker}. The library checks its quarantine
    again at exit: a finding printed then concerns memory of an earlier test."""
    tail = {"after": None, "during": None, "lines": []}
    try:
        with open(log_path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return tail
    last = 0
    for i, line in enumerate(lines):
        m = table.DONE.match(line)
        if m:
            tail["after"], tail["during"], last = m.group(1), None, i + 1
            continue
        m = table.START.match(line)
        if m:
            tail["during"], last = m.group(1), i + 1
    tail["lines"] = keep_isolate_lines(lines[last:])
    return tail


def worker_main(a):
    ctl_in = os.fdopen(os.dup(0), "r")
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    logfd = os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)

    def send(**kw):
        proto.write(json.dumps(kw) + "\n")
        proto.flush()

    t0 = now()
    try:
        mod, filled, failed = load_module(a.module)
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        send(ev="import_error", error=f"{type(e).__name__}: {first_line(e)}")
        return 3
    send(ev="ready", pid=os.getpid(), import_s=round(now() - t0, 2), shimmed=len(filled),
         shim=shim_strings(filled), failed=failed)
    end = None  # the log's size after the previous test's last line
    for line in ctl_in:
        tid = line.strip()
        if not tid:
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # printed after the previous test ended (a check of memory freed earlier, say)
        before = isolate_lines(a.log, end) if end is not None else []
        print(f"===== {tid}", flush=True)
        offset = os.fstat(1).st_size
        send(ev="start", id=tid)
        rec = run_one(mod, tid)
        sys.stdout.flush()
        sys.stderr.flush()
        rec["isolate"] = isolate_lines(a.log, offset)
        if before:
            rec["isolate_before"] = before
        print(f"===== {tid}: {rec['outcome']} in {rec['seconds']} s {rec['error']}", flush=True)
        end = os.fstat(1).st_size
        send(ev="done", **rec)
        if rec["sticky"]:
            return 0
    return 0


def collect_main(a):
    out = {"ids": [], "serial": [], "uncollected": [], "shimmed": [], "import_error": None}
    try:
        mod, filled, failed = load_module(a.module)
        out["shimmed"] = shim_strings(filled)
        ids, broken = list_tests(mod)
        out["ids"] = ids
        out["uncollected"] = failed + broken
        out["serial"] = [t for t in ids if runtime_serial(mod, t)]
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "__version__"):
            out["torch"] = torch.__version__
            try:
                out["cuda"] = torch.version.cuda
                if torch.cuda.is_available():
                    out["device"] = torch.cuda.get_device_name(0)
            except Exception:  # noqa: BLE001
                pass
    except BaseException as e:  # noqa: BLE001
        out["import_error"] = f"{type(e).__name__}: {first_line(e)}"
        out["import_traceback"] = traceback.format_exc()[-4000:]
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0 if out["import_error"] is None else 3


# ---------------------------------------------------------------------------------------
# Driver side.


def config_envs(a, work):
    """{name: env dict} for the configurations; `--config NAME=VAR=VAL,VAR=VAL` replaces one."""
    base = dict(os.environ)
    for v in ALLOC_VARS:
        base.pop(v, None)
    base.pop("LD_PRELOAD", None)
    user_isolate = {k: v for k, v in base.items() if k.startswith("ISOLATE_")}
    for k in list(base):
        if k.startswith("ISOLATE_"):
            del base[k]
    base["PYTHONUNBUFFERED"] = "1"
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    base["PYTORCH_DISABLE_RUNNING_SCRIPT_CHK"] = "1"
    if a.slow:
        base["PYTORCH_TEST_WITH_SLOW"] = "1"
    # the test file's folder (a spawned child unpickles `test_cuda.X` by module name), then --pythonpath
    front = [os.path.dirname(os.path.abspath(a.module))] + ([a.pythonpath] if a.pythonpath else [])
    base["PYTHONPATH"] = os.pathsep.join(front + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else []))
    envs = {}
    envs["plain"] = dict(base)
    envs["async"] = dict(base, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    iso = dict(base)
    iso.update(user_isolate)
    iso["LD_PRELOAD"] = a.lib
    iso["ISOLATE_MODE"] = "isolate"
    iso["ISOLATE_TRACE"] = os.path.join(work, "traces", "isolate-%p.trace")
    envs["isolate"] = iso
    for spec in a.config or []:
        name, _, rest = spec.partition("=")
        env = dict(base)
        for kv in filter(None, rest.split(",")):
            k, _, v = kv.partition("=")
            env[k] = v
        envs[name] = env
    return envs


class Worker:
    def __init__(self, drv, config, tag, env_extra=None):
        self.drv = drv
        self.config = config
        drv.nworkers += 1
        self.name = f"{config}-{tag}{drv.nworkers}"
        self.log = os.path.join(drv.work, "logs", self.name + ".log")
        env = dict(drv.envs[config])
        for k, v in (env_extra or {}).items():
            # the library's settings only where the library is loaded
            if not k.startswith("ISOLATE_") or "LD_PRELOAD" in env:
                env[k] = v
        if "ISOLATE_TRACE" in env:
            env["ISOLATE_TRACE"] = os.path.join(drv.work, "traces", self.name + "-%p.trace")
        errf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, THIS, "worker", "--module", drv.module, "--log", self.log],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errf,
            env=env,
            cwd=drv.cwd,
            start_new_session=True,
        )
        errf.close()
        self.buf = b""
        self.state = "starting"  # starting, idle, busy, closing, dead
        self.closed_by_us = False
        self.import_error = None
        self.test = None
        self.t_start = now()
        self.started = now()
        self.ran = 0
        self.tail = None
        os.set_blocking(self.proc.stdout.fileno(), False)
        drv.sel.register(self.proc.stdout, selectors.EVENT_READ, self)

    def send(self, tid):
        self.state = "busy"
        self.test = tid
        self.t_start = now()
        try:
            self.proc.stdin.write((tid + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # noticed as a death when its stdout closes

    def close(self):
        if self.state in ("closing", "dead"):
            return
        self.state = "closing"
        self.closed_by_us = True
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def read_events(self):
        """Events parsed from what is readable now; [('eof', None)] at the end."""
        evs = []
        eof = False
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self.buf += chunk
        # every whole line first: a worker's last report comes before the end of its output
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                evs.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        if eof:
            evs.append({"ev": "eof"})
        return evs

    def reap(self):
        try:
            self.drv.sel.unregister(self.proc.stdout)
        except (KeyError, ValueError):
            pass
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.wait()
        self.state = "dead"
        if self.tail is None:
            self.tail = dict(log_tail(self.log), config=self.config, worker=self.name)
            self.drv.tails.append(self.tail)
        return rc

    def take_tail_of(self, tid):
        """The library's lines printed in `tid` when the worker died or was killed in it (for its
        crash or timeout record); they are then no longer kept as printed after the last test."""
        t = self.tail
        if t is None or t.get("during") != tid:
            return []
        lines, t["lines"] = t["lines"], []
        return lines

    def last_words(self):
        """The last meaningful line of the worker's log (what it printed as it died)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            line = line.strip()
            if line and not line.startswith("===== "):
                return line[:300]
        return ""


def describe_rc(rc):
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


class Driver:
    def __init__(self, a):
        self.a = a
        self.t0 = now()
        # the outputs are written in the reserve: at most a tenth of a small budget
        self.deadline = self.t0 + a.budget - min(a.reserve, 0.1 * a.budget)
        self.out = os.path.abspath(a.out)
        self.work = os.path.abspath(a.work)
        self.module = os.path.abspath(a.module)
        self.cwd = os.path.join(self.work, "cwd")
        for d in (self.out, os.path.join(self.out, "results"), self.work,
                  os.path.join(self.work, "logs"), os.path.join(self.work, "traces"), self.cwd):
            os.makedirs(d, exist_ok=True)
        self.envs = config_envs(a, self.work)
        self.configs = [c for c in a.configs.split(",") if c]
        for c in self.configs:
            if c not in self.envs:
                sys.exit(f"torch_tests: unknown configuration {c!r}; known: {', '.join(self.envs)}")
        self.sel = selectors.DefaultSelector()
        self.nworkers = 0
        self.results = {}  # (config, id) -> record, main phases
        self.confirm = {}  # (config, id) -> record
        self.files = {}
        self.broken = {}  # config -> reason it could not start
        self.collect_failed = []  # statements of the test file that failed at collection
        self.import_failures = {}  # config -> statements that failed only there
        self.startfail = {}
        self.shim_by_config = {}  # config -> what the shim filled in its workers
        self.tails = []  # log_tail() of every worker that ended

    def elapsed(self):
        return now() - self.t0

    def say(self, msg):
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def write(self, name, rec):
        f = self.files.get(name)
        if f is None:
            f = self.files[name] = open(os.path.join(self.out, "results", name + ".jsonl"), "a", encoding="utf-8")
        f.write(json.dumps(rec) + "\n")
        f.flush()

    def record(self, phase, config, rec):
        rec = dict(rec)
        rec["config"] = config
        rec["phase"] = phase
        rec.pop("sticky", None) if not rec.get("sticky") else None
        if phase == "confirm":
            self.confirm[(config, rec["id"])] = rec
            self.write("confirm", rec)
        else:
            self.results[(config, rec["id"])] = rec
            self.write(config, rec)
        mark = "" if rec["outcome"] in ("pass", "skip") else f"  {rec.get('error', '')[:160]}"
        if rec["outcome"] not in ("pass", "skip") or self.a.verbose:
            self.say(f"{phase:8} {config:8} {rec['outcome']:8} {rec['id']}{mark}")

    # -- collection --------------------------------------------------------------------

    def collect(self):
        path = os.path.join(self.work, "collect.json")
        env = dict(self.envs["plain"])
        cmd = [sys.executable, THIS, "collect", "--module", self.module, "--json", path]
        left = max(10, self.deadline - now())
        log = os.path.join(self.work, "logs", "collect.log")
        with open(log, "wb") as lf:
            try:
                subprocess.run(cmd, env=env, cwd=self.cwd, stdout=lf, stderr=subprocess.STDOUT,
                               timeout=min(left, self.a.collect_timeout))
            except subprocess.TimeoutExpired:
                return None, f"collection took longer than {min(left, self.a.collect_timeout):.0f} s"
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            with open(log, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-2000:]
            return None, f"collection wrote no result ({e}); its output ends:\n{tail}"
        if info.get("import_error"):
            return info, f"the module does not import: {info['import_error']}\n{info.get('import_traceback', '')}"
        return info, None

    # -- phases ------------------------------------------------------------------------

    def run_jobs(self, phase, jobs, per_config, total, stop_at, alone_env=None, fresh_each=False):
        """Run [(config, id)] in order. per_config: workers per configuration; total: workers
        at once overall; no job starts after stop_at; running ones end by self.deadline.
        fresh_each: one process per job (confirm). Returns the jobs that did not run."""
        pending = deque(jobs)
        workers = []
        not_run = []

        def live(cfg=None):
            return [w for w in workers if w.state != "dead" and (cfg is None or w.config == cfg)]

        def mark_broken(cfg, why):
            self.broken[cfg] = why
            self.say(f"{phase}: configuration {cfg} cannot start a worker: {why}")
            keep = deque()
            for c, t in pending:
                if c == cfg:
                    self.record(phase, c, {"id": t, "outcome": "crash", "seconds": 0.0,
                                           "error": f"no worker could start: {why}"})
                else:
                    keep.append((c, t))
            pending.clear()
            pending.extend(keep)

        while True:
            t = now()
            accepting = t < stop_at and t < self.deadline
            # hand jobs to idle workers; start workers where needed
            if accepting:
                for w in live():
                    if w.state == "idle":
                        job = next(((c, i) for c, i in pending if c == w.config), None)
                        if job is None or (fresh_each and w.ran):
                            w.close()
                            continue
                        busy = sum(1 for x in live() if x.state == "busy")
                        if busy >= total:
                            continue
                        pending.remove(job)
                        w.ran += 1
                        w.send(job[1])
                # start workers (all at once: each takes seconds to import) for configurations
                # with more pending jobs than workers starting or idle, within the limits
                waiting = {}
                for c, _ in pending:
                    waiting[c] = waiting.get(c, 0) + 1
                for c in self.configs:
                    if c in self.broken or not waiting.get(c):
                        continue
                    ready = sum(1 for w in live(c) if w.state in ("starting", "idle"))
                    while (ready < waiting[c] and len(live(c)) < per_config and len(live()) < total):
                        workers.append(Worker(self, c, "w" if phase != "confirm" else "alone", alone_env))
                        ready += 1
            else:
                for w in live():
                    if w.state in ("idle", "starting"):
                        w.close()
                        if w.state == "closing" and w.test is None:
                            w.kill()
            # hard end: stop everything still running
            if now() >= self.deadline:
                for w in live():
                    if w.state == "busy":
                        not_run.append((w.config, w.test))
                        self.say(f"{phase}: budget reached; stopped {w.config} {w.test} (not run)")
                    w.kill()
                    w.reap()
                    w.test = None
                break
            if not live():
                if not pending or not accepting or all(c in self.broken for c, _ in pending):
                    break
            # events
            timeout = 0.2
            for key, _ in self.sel.select(timeout):
                w = key.data
                if w not in workers:
                    continue
                for ev in w.read_events():
                    kind = ev.get("ev")
                    if w.state == "dead":
                        break
                    if kind == "ready":
                        w.state = "idle" if w.state == "starting" else w.state
                        self.startfail[w.config] = 0
                        if w.config not in self.shim_by_config and ev.get("shim") is not None:
                            self.shim_by_config[w.config] = ev["shim"]
                        extra = sorted(set(ev.get("failed", [])) - set(self.collect_failed))
                        if extra and w.config not in self.import_failures:
                            self.import_failures[w.config] = extra
                            for x in extra:
                                self.say(f"{w.config}: the test file imports differently here: {x}")
                    elif kind == "import_error":
                        w.import_error = f"{ev.get('error')} (log: {os.path.basename(w.log)})"
                    elif kind == "start":
                        pass
                    elif kind == "done":
                        ev.pop("ev", None)
                        self.record(phase, w.config, dict(ev, worker=w.name))
                        w.test = None
                        if ev.get("sticky"):
                            w.state = "closing"  # it exits by itself
                        elif w.state == "busy":
                            w.state = "idle"
                    elif kind == "eof":
                        rc = w.reap()
                        if w.test is not None:
                            self.record(phase, w.config, {
                                "id": w.test, "outcome": "crash",
                                "seconds": round(now() - w.t_start, 3),
                                "error": f"worker died ({describe_rc(rc)}) during the test; last output: {w.last_words()}",
                                "worker": w.name, "isolate": w.take_tail_of(w.test)})
                            w.test = None
                        elif w.ran == 0 and w.import_error is None and rc != 0 and not w.closed_by_us:
                            w.import_error = f"worker ended ({describe_rc(rc)}) before it was ready: {w.last_words()}"
                        if w.ran == 0 and w.import_error and not w.closed_by_us:
                            n = self.startfail.get(w.config, 0) + 1
                            self.startfail[w.config] = n
                            if n >= 2:
                                mark_broken(w.config, w.import_error)
            # timeouts
            for w in live():
                if w.state == "busy" and now() - w.t_start > self.a.timeout:
                    w.kill()
                    w.reap()
                    self.record(phase, w.config, {
                        "id": w.test, "outcome": "timeout", "seconds": round(now() - w.t_start, 3),
                        "error": f"still running after {self.a.timeout:.0f} s; killed with its worker",
                        "worker": w.name, "isolate": w.take_tail_of(w.test)})
                    w.test = None
                elif w.state == "starting" and now() - w.started > self.a.start_timeout:
                    w.kill()
                    w.reap()
                    w.import_error = f"not ready after {self.a.start_timeout:.0f} s"
                    n = self.startfail.get(w.config, 0) + 1
                    self.startfail[w.config] = n
                    if n >= 2:
                        mark_broken(w.config, w.import_error)
        for w in workers:
            if w.state != "dead":
                w.kill()
                w.reap()
        not_run.extend(pending)
        return not_run

    def main(self):
        a = self.a
        self.say(f"collecting {self.module}")
        info, err = self.collect()
        meta = {"configs": self.configs, "source": a.source, "module": self.module, "budget_s": a.budget,
                "workers_per_config": a.workers, "timeout_s": a.timeout, "ids": [],
                "uncollected": [], "shimmed": []}
        if info and not err and not info.get("ids"):
            err = "the module gave no tests"
        if info:
            self.collect_failed = list(info.get("uncollected", []))
            for k in ("torch", "cuda", "device"):
                if info.get(k):
                    meta[k] = info[k]
            meta["shimmed"] = info.get("shimmed", [])
            meta["uncollected"] = list(info.get("uncollected", []))
        if err:
            meta["uncollected"].append(f"{os.path.basename(self.module)}: {first_line(err, 500)}")
            self.finish(meta)
            print(f"torch_tests: {err}", file=sys.stderr)
            return 3
        ids = sorted(info["ids"])
        if a.only:
            rx = re.compile(a.only)
            ids = [t for t in ids if rx.search(t)]
        if a.shard:
            k, n = (int(x) for x in a.shard.split("/"))
            ids = [t for i, t in enumerate(ids) if i % n == k - 1]
        static = static_tests(self.module)
        extra = re.compile(a.serial_regex) if a.serial_regex else None
        serial = set(info.get("serial", []))
        for t in ids:
            acls, fn = static_function(static, t)
            if fn and fn in static[acls]["serial"]:
                serial.add(t)
            if extra and extra.search(t):
                serial.add(t)
        par_ids = [t for t in ids if t not in serial]
        ser_ids = [t for t in ids if t in serial]
        meta["ids"] = ids
        meta["serial"] = ser_ids
        self.say(f"{len(ids)} tests ({len(par_ids)} in parallel, {len(ser_ids)} alone), "
                 f"configurations {', '.join(self.configs)}; shimmed {len(meta['shimmed'])}, "
                 f"uncollected {len(meta['uncollected'])}")
        for s in meta["shimmed"]:
            self.say(f"  shim: {s}")
        for u in meta["uncollected"]:
            self.say(f"  could not be collected: {u}")

        budget_left = self.deadline - now()
        confirm_reserve = a.confirm_share * budget_left if "isolate" in self.configs and "plain" in self.configs else 0
        main_stop = self.deadline - confirm_reserve

        # parallel phase, then the serial one, sharing main_stop (serial gets a share first)
        ser_share = min(0.35, 0.05 + 0.02 * len(ser_ids)) * (main_stop - now()) if ser_ids else 0
        par_stop = main_stop - ser_share
        jobs = [(c, t) for t in par_ids for c in self.configs]
        iso_extra = None
        self.say(f"parallel phase: {len(jobs)} runs, {a.workers} workers per configuration, "
                 f"no start after {par_stop - self.t0:.0f}s")
        par_env = {}
        if a.parallel_quarantine and "isolate" in self.configs and "ISOLATE_QUARANTINE" not in os.environ:
            par_env = {"ISOLATE_QUARANTINE": a.parallel_quarantine}
        self.par_env = par_env
        self._run_with_env("parallel", jobs, a.workers, a.workers * len(self.configs), par_stop, par_env)
        if ser_ids:
            self.say(f"serial phase: {len(ser_ids)} tests x {len(self.configs)} configurations, one at a time")
            for c in self.configs:
                self.run_jobs("serial", [(c, t) for t in ser_ids], 1, 1, main_stop, iso_extra)

        # confirm phase
        diff = []
        if "plain" in self.configs and "isolate" in self.configs:
            for t in ids:
                p = self.results.get(("plain", t))
                i = self.results.get(("isolate", t))
                b = self.results.get(("async", t))
                if p and i and p["outcome"] != i["outcome"]:
                    if i["outcome"] == "skip" and b and b["outcome"] == "skip":
                        continue  # skipped under the backend (an upstream gate): nothing to re-run
                    diff.append(t)

            def backend_fails_too(t):
                b = self.results.get(("async", t))
                return b is not None and (b["outcome"] in table.BAD
                                          or b["outcome"] == self.results[("isolate", t)]["outcome"])

            # where isolate differs from the backend too first: the budget may not reach the rest
            diff.sort(key=backend_fails_too)
        if diff:
            cc = [c for c in ("isolate", "async") if c in self.configs]
            jobs = [(c, t) for t in diff for c in cc]
            self.say(f"confirm phase: {len(diff)} tests differ between plain and isolate; "
                     f"re-running each alone under {' and '.join(cc)}")
            alone = {"TORCH_TESTS_ALONE": "1"}
            conf_ser = [(c, t) for c, t in jobs if t in serial]
            conf_par = [(c, t) for c, t in jobs if t not in serial]
            self.run_jobs("confirm", conf_par, a.confirm_workers, a.confirm_workers, self.deadline, alone, fresh_each=True)
            self.run_jobs("confirm", conf_ser, 1, 1, self.deadline, alone, fresh_each=True)
        self.finish(meta)
        return 0

    def _run_with_env(self, phase, jobs, per, total, stop, extra):
        return self.run_jobs(phase, jobs, per, total, stop, extra or None)

    def finish(self, meta):
        for f in self.files.values():
            f.close()
        self.files = {}
        meta["broken_configs"] = self.broken
        meta["import_failures_by_config"] = self.import_failures
        meta["parallel_env"] = getattr(self, "par_env", {})
        meta["shimmed_by_config"] = self.shim_by_config
        meta["after_last_test"] = [{k: t[k] for k in ("config", "worker", "after", "during", "lines")}
                                   for t in self.tails if t["lines"]]
        meta["elapsed_s"] = round(self.elapsed(), 1)
        with open(os.path.join(self.out, "results", "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        rdir = os.path.join(self.out, "results")
        main, confirm, m = table.load([rdir])
        text = table.render_text(main, confirm, m)
        with open(os.path.join(self.out, "summary.txt"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        with open(os.path.join(self.out, "table.md"), "w", encoding="utf-8") as f:
            f.write(table.render_markdown(main, confirm, m))
        self.bundle_logs()
        print()
        print(text)
        print(f"\n(elapsed {self.elapsed():.1f} s of a {self.a.budget:.0f} s budget; results in {rdir})")

    def bundle_logs(self):
        cap = int(self.a.logs_cap * 1024 * 1024)
        path = os.path.join(self.out, "logs.tar.gz")
        logs = sorted(os.path.join(self.work, "logs", n) for n in os.listdir(os.path.join(self.work, "logs")))
        traces = [os.path.join(self.work, "traces", n) for n in os.listdir(os.path.join(self.work, "traces"))]
        # traces of the re-runs alone first (one test each), smallest first
        traces.sort(key=lambda p: (0 if "-alone" in os.path.basename(p) else 1, os.path.getsize(p)))
        total = 0
        left_out = []
        with tarfile.open(path, "w:gz") as tar:
            for p in logs + traces:
                size = os.path.getsize(p)
                # compressed size is unknown until written; count raw size against 4x the cap
                if total + size > 4 * cap:
                    left_out.append(os.path.basename(p))
                    continue
                tar.add(p, arcname=os.path.relpath(p, self.work))
                total += size
        if os.path.getsize(path) > cap:
            with tarfile.open(path, "w:gz") as tar:
                for p in logs:
                    tar.add(p, arcname=os.path.relpath(p, self.work))
            left_out = [os.path.basename(p) for p in traces]
        if left_out:
            print(f"logs.tar.gz: left out {len(left_out)} files over the {self.a.logs_cap} MiB cap "
                  f"(in {self.work})", flush=True)


def run_main(a):
    if a.fresh_out and os.path.isdir(os.path.join(a.out, "results")):
        shutil.rmtree(os.path.join(a.out, "results"))
    if "isolate" in a.configs.split(",") and not any(s.startswith("isolate=") for s in (a.config or [])):
        if not os.path.exists(a.lib):
            print(f"torch_tests: isolate configuration needs the library: {a.lib} does not exist "
                  f"(build it, or pass --lib, or leave isolate out of --configs)", file=sys.stderr)
            return 2
    d = Driver(a)
    return d.main()


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="collect, run every configuration, confirm, print the tables")
    r.add_argument("--module", required=True, help="the test file (tests/gpu/ext/test_cuda.py)")
    r.add_argument("--out", default=os.environ.get("OUT", "/tmp/torch-tests-out"))
    r.add_argument("--work", default="/tmp/torch-tests-work", help="scratch: logs, traces, cwd")
    r.add_argument("--budget", type=float, default=540, help="wall-clock seconds for everything")
    r.add_argument("--reserve", type=float, default=8, help="seconds kept for writing outputs")
    r.add_argument("--configs", default="plain,async,isolate")
    r.add_argument("--config", action="append", help="NAME=VAR=VAL,VAR=VAL: define or replace a configuration")
    r.add_argument("--lib", default=os.path.abspath("target/gpu/libisolate.so"))
    r.add_argument("--only", help="regex on Class.test_method")
    r.add_argument("--shard", help="K/N: every N-th test starting at the K-th (1-based)")
    r.add_argument("--workers", type=int, default=4, help="workers per configuration")
    r.add_argument("--confirm-workers", type=int, default=3)
    r.add_argument("--confirm-share", type=float, default=0.15, help="share of the budget kept for re-runs alone")
    r.add_argument("--timeout", type=float, default=150, help="seconds per test")
    r.add_argument("--start-timeout", type=float, default=120, help="seconds for a worker to import")
    r.add_argument("--collect-timeout", type=float, default=180)
    r.add_argument("--serial-regex", default=r"out_of_memory|memory_fraction",
                   help="more tests to run alone (regex on the id)")
    r.add_argument("--parallel-quarantine", default="8GiB",
                   help="ISOLATE_QUARANTINE for isolate workers run side by side (unset: the library's "
                        "25%% each); re-runs alone use the default")
    r.add_argument("--slow", action="store_true", help="PYTORCH_TEST_WITH_SLOW=1 (run @slowTest tests)")
    r.add_argument("--pythonpath", help="prepended to PYTHONPATH (a folder or a pure-Python wheel)")
    r.add_argument("--source", default="pytorch/pytorch test/test_cuda.py")
    r.add_argument("--logs-cap", type=float, default=15, help="MiB for logs.tar.gz")
    r.add_argument("--fresh-out", action="store_true", help="remove $OUT/results first")
    r.add_argument("-v", "--verbose", action="store_true", help="print passing tests too")
    w = sub.add_parser("worker")
    w.add_argument("--module", required=True)
    w.add_argument("--log", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--module", required=True)
    c.add_argument("--json", required=True)
    return ap.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    if a.cmd == "worker":
        return worker_main(a)
    if a.cmd == "collect":
        return collect_main(a)
    return run_main(a)


if __name__ == "__main__":
    sys.exit(main())
