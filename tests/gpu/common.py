"""Driver-side helpers of the GPU suite: run a step, read a trace, medians, tables, checks.

Nothing here imports torch: the driver only starts workloads (train_*.py, bug_*.py, the static
CUDA program) as child processes, each under one *tool* (no preload, `ISOLATE_MODE=log`,
isolation, guard mode, PyTorch's memory history, compute-sanitizer, ...), and judges what
they print and the traces they leave.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parent
REPO = GPU_DIR.parents[1]
LIB = REPO / "target" / "release" / "libisolate.so"
CLI = REPO / "target" / "release" / "isolate"
PYTHON = sys.executable or "python3"

# Kept in every child's environment, whatever the tool: NVLink multicast can take the host's
# shared GPUs out of service (see the device notes), so it stays off everywhere.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}

# Settings a step must not inherit from the caller's shell: each tool sets exactly what it needs.
SCRUBBED_PREFIXES = ("ISOLATE_", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")
SCRUBBED_NAMES = ("LD_PRELOAD",)

# How much of a step's stdout/stderr goes into the section log (head and tail).
LOG_KEEP_CHARS = 12_000


# --------------------------------------------------------------------------------------------
# Tools: how a workload is run.


@dataclasses.dataclass(frozen=True)
class Tool:
    """One way of running a workload."""

    name: str  # short id, used in file names and as a key
    label: str  # column header in tables
    env: tuple[tuple[str, str], ...] = ()  # extra environment
    preload: bool = False  # LD_PRELOAD libisolate.so and write a trace
    args: tuple[str, ...] = ()  # extra workload arguments (memory history)
    sanitizer: bool = False  # run under compute-sanitizer --tool memcheck

    @property
    def history(self) -> bool:
        return "--history" in self.args


def _tool(name, label, env=None, **kw) -> Tool:
    return Tool(name, label, tuple(sorted((env or {}).items())), **kw)


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        _tool("baseline", "baseline"),
        _tool("log", "isolate log", {"ISOLATE_MODE": "log"}, preload=True),
        # `_record_memory_history()` records C++ frames too by default (stacks="all" is the
        # default in 2.11); stacks="python" is the cheaper variant users reach for.
        _tool("history-python", "history py", args=("--history", "python")),
        _tool("history", "history all", args=("--history", "all")),
        _tool("nocache", "no caching", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
        _tool(
            "isolate-nolaunch",
            "isolate -launch",
            {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK_LAUNCH": "off"},
            preload=True,
        ),
        _tool(
            "isolate",
            "isolate",
            {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK_LAUNCH": "on"},
            preload=True,
        ),
        _tool("guard", "guard", {"ISOLATE_MODE": "isolate", "ISOLATE_GUARD": "on"}, preload=True),
        _tool(
            "sanitizer",
            "memcheck",
            {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
            sanitizer=True,
        ),
    ]
}


def find_tool_binary(name: str) -> str | None:
    """A CUDA tool (nvcc, compute-sanitizer) from PATH or the usual install folder."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/local/cuda/bin", "/usr/local/cuda-13.0/bin"):
        candidate = Path(folder) / name
        if candidate.exists():
            return str(candidate)
    return None


# --------------------------------------------------------------------------------------------
# Time budget.


class Deadline:
    """The wall-clock budget of one suite run; every step's timeout is capped by it."""

    def __init__(self, budget_s: float):
        self.end = time.monotonic() + budget_s

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def cap(self, timeout_s: float, reserve_s: float = 0.0) -> float:
        """The timeout a step may have now (at most `timeout_s`, never past the deadline)."""
        return max(0.0, min(timeout_s, self.remaining() - reserve_s))


# --------------------------------------------------------------------------------------------
# Running one step.


@dataclasses.dataclass
class Run:
    """What one step did."""

    name: str
    cmd: list[str]
    env_delta: dict[str, str]
    rc: int | None = None  # None: not started (skipped) or killed at its timeout
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    skipped: str | None = None  # why it was not run
    result: dict | None = None  # the workload's RESULT line
    traces: list[str] = dataclasses.field(default_factory=list)
    trace_bytes: int = 0
    summary: dict | None = None  # `isolate summary --json` of its traces
    summary_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and self.skipped is None

    def status(self) -> str:
        if self.skipped:
            return f"skipped ({self.skipped})"
        if self.timed_out:
            return "TIMEOUT"
        if self.rc is not None and self.rc < 0:
            return f"killed by signal {-self.rc}"
        return f"rc={self.rc}"

    def output(self) -> str:
        return self.stdout + "\n" + self.stderr

    def describe(self) -> str:
        """Everything about the step, for the section log."""
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env_delta.items()))
        lines = [
            f"=== step {self.name}: {self.status()} in {self.seconds:.1f}s",
            f"    env: {env or '(none)'}",
            f"    cmd: {' '.join(self.cmd)}",
        ]
        if self.traces:
            lines.append(f"    traces: {', '.join(self.traces)} ({self.trace_bytes} bytes)")
        if self.summary_error:
            lines.append(f"    summary error: {self.summary_error}")
        for label, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text.strip():
                lines.append(f"--- {label}:")
                lines.append(clip(text.rstrip()))
        return "\n".join(lines)


def build_shared(source: str, out: str) -> str:
    """`source`, a C file, built into the shared library `out` with the machine's gcc (the
    suite's own preloads and PyTorch's pluggable allocator: no CUDA toolkit needed, the
    runtime's functions found by name)."""
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", out, source, "-ldl", "-lpthread"],
                   check=True)
    return out


def preload_of(name: str, folder: str) -> str:
    """The suite's preload `name` (`backend_pool.so`), built from its source beside this file
    into `folder`."""
    here = os.path.dirname(os.path.abspath(__file__))
    return build_shared(os.path.join(here, name[:-3] + ".c"), os.path.join(folder, name))


def clip(text: str, keep: int = LOG_KEEP_CHARS) -> str:
    """Head and tail of a long text."""
    if len(text) <= 2 * keep:
        return text
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters left out ...]\n{text[-keep:]}"


def child_env(delta: dict[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(SCRUBBED_PREFIXES) and k not in SCRUBBED_NAMES
    }
    env.update(SAFE_ENV)
    env.update(delta)
    return env


def run_cmd(name: str, cmd: list[str], env_delta: dict[str, str], timeout_s: float) -> Run:
    """Run one command in its own process group; kill the whole group at the timeout."""
    run = Run(name=name, cmd=[str(c) for c in cmd], env_delta=dict(env_delta))
    if timeout_s < 1:
        run.skipped = "no time left"
        return run
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            run.cmd,
            env=child_env(env_delta),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as err:
        run.skipped = f"could not start: {err}"
        return run
    try:
        run.stdout, run.stderr = proc.communicate(timeout=timeout_s)
        run.rc = proc.returncode
    except subprocess.TimeoutExpired:
        run.timed_out = True
        # The step's own process group (it may have children: compute-sanitizer, ptxas).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            run.stdout, run.stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild outside the group holds the pipes
            run.stdout, run.stderr = "", ""
        run.stderr += f"\n[suite] killed after {timeout_s:.0f}s"
    run.seconds = time.monotonic() - start
    run.result = parse_result(run.stdout)
    return run


def parse_result(stdout: str) -> dict | None:
    """The last `RESULT {json}` line a workload printed."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            try:
                return json.loads(line[len("RESULT ") :])
            except json.JSONDecodeError:
                return None
    return None


def parallel_map(func, items, jobs: int, on_done=None):
    """`[func(x) for x in items]`, `jobs` at a time, in the order of `items`;
    `on_done(item, value)` is called as each one finishes."""
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(func, x): i for i, x in enumerate(items)}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            if on_done is not None:
                on_done(items[i], results[i])
    return [results[i] for i in range(len(items))]


# --------------------------------------------------------------------------------------------
# Traces and the analyzer.


# `isolate` exits 3 when it analysed a trace that was cut short (a process killed by a fault):
# the output is still whole, up to the cut.
CLI_OK = (0, 3)


def analyzer(args: list[str], timeout_s: float = 120) -> tuple[dict | None, str | None]:
    """`isolate ARGS… --json`-style call → (parsed JSON, error)."""
    if not CLI.exists():
        return None, f"{CLI} is missing"
    run = run_cmd("isolate", [str(CLI), *args], {}, timeout_s)
    if run.rc not in CLI_OK or run.timed_out:
        return None, f"isolate {args[0]} {run.status()}: {run.stderr.strip()[-500:]}"
    try:
        return json.loads(run.stdout), None
    except json.JSONDecodeError as err:
        return None, f"isolate {args[0]} printed no JSON ({err}): {run.stdout[:300]!r}"


def summarize(traces: list[str], timeout_s: float = 120) -> tuple[dict | None, str | None]:
    """`isolate summary --json TRACE…` → (summary, error)."""
    if not traces:
        return None, "no trace file was written"
    return analyzer(["summary", "--json", *traces], timeout_s)


def find_traces(pattern_prefix: str) -> list[str]:
    """Trace files a step wrote (`ISOLATE_TRACE=<prefix>.%p.trace`)."""
    return sorted(glob.glob(glob.escape(pattern_prefix) + ".*trace"))


def calls(summary: dict | None, *names: str) -> int:
    """Sum of `calls[name]` over `names` (0 for absent names or no summary)."""
    if not summary:
        return 0
    table = summary.get("calls") or {}
    return sum(int(table.get(n, 0)) for n in names)


def total(value) -> int:
    """A count, or the sum of a map of counts (`failed` is API name → failed calls)."""
    if isinstance(value, dict):
        return sum(int(v) for v in value.values())
    return int(value or 0)


def count_of(value) -> int:
    """A field that may be a count or a list of entries."""
    if value is None:
        return 0
    if isinstance(value, (list, tuple, dict)):
        return len(value)
    return int(value)


def as_int(value) -> int | None:
    """An address or number as the analyzer prints it ("0x…" or an integer)."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def violations(summary: dict | None) -> list[dict]:
    """The poison violations listed (the analyzer caps the list; see violation_count)."""
    return list((summary or {}).get("poison_violations") or [])


def stale_launches(summary: dict | None) -> list[dict]:
    return list((summary or {}).get("stale_launches") or [])


def violation_count(summary: dict) -> int:
    return int(summary.get("poison_violation_count", len(violations(summary))))


def stale_launch_count(summary: dict) -> int:
    return int(summary.get("stale_launch_count", len(stale_launches(summary))))


def hits_range(summary: dict | None, start: int, nbytes: int) -> list[str]:
    """Violations and stale launches of the trace that touch [start, start + nbytes)."""
    found = []
    for v in violations(summary):
        ptr, size = as_int(v.get("ptr")), as_int(v.get("size")) or 1
        if ptr is not None and ptr < start + nbytes and start < ptr + size:
            found.append(f"poison violation at {v.get('ptr')}+{v.get('first_offset')}")
    for s in stale_launches(summary):
        ptr = as_int(s.get("ptr"))
        if ptr is not None and start <= ptr < start + nbytes:
            found.append(f"stale launch {s.get('kernel')} ptr {s.get('ptr')}")
    return found


# --------------------------------------------------------------------------------------------
# Numbers.


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def fmt_ratio(value) -> str:
    return fmt(value, ".2f") + ("x" if value is not None else "")


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# --------------------------------------------------------------------------------------------
# Tables and checks.


def format_table(headers: list[str], rows: list[list], markdown: bool = False) -> str:
    """A plain-text (aligned) or Markdown table."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    line = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(row) for row in cells[1:]])


PASS, FAIL, INFO, SKIP = "PASS", "FAIL", "INFO", "SKIP"
GOAL_MET, GOAL_MISSED = "GOAL-MET", "GOAL-MISSED"


@dataclasses.dataclass
class Check:
    name: str
    status: str  # PASS, FAIL, INFO, SKIP, GOAL-MET, GOAL-MISSED
    detail: str = ""


class Section:
    """One section's log file, progress lines, checks and tables."""

    def __init__(self, name: str, out_dir: Path):
        self.name = name
        self.checks: list[Check] = []
        self.tables: list[str] = []
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._log = open(out_dir / f"{name}.log", "a", encoding="utf-8")

    # Logging -----------------------------------------------------------------------------
    def log(self, text: str) -> None:
        """Full detail: the section's log file only."""
        with self._lock:
            self._log.write(text.rstrip() + "\n")
            self._log.flush()

    def say(self, text: str) -> None:
        """A short line: stdout and the log."""
        with self._lock:
            print(f"[{self.name}] {text}", flush=True)
            self._log.write(text.rstrip() + "\n")
            self._log.flush()

    def step(self, run: Run) -> None:
        """Record a finished step: full output to the log, one line to stdout."""
        self.log(run.describe())
        note = ""
        if run.summary_error and run.env_delta.get("LD_PRELOAD"):
            note = f"  (trace: {run.summary_error})"
        self.say(f"  {run.status():<10} {run.seconds:6.1f}s  {run.name}{note}")

    # Checks and tables -------------------------------------------------------------------
    def check(self, name: str, ok: bool | None, detail: str = "", goal: bool = False) -> bool:
        """A check (goal=False) or a performance goal (goal=True); ok=None means 'not run'."""
        if ok is None:
            status = SKIP
        elif goal:
            status = GOAL_MET if ok else GOAL_MISSED
        else:
            status = PASS if ok else FAIL
        self.checks.append(Check(name, status, detail))
        self.log(f"CHECK {status}: {name} — {detail}")
        return bool(ok)

    def info(self, name: str, detail: str) -> None:
        self.checks.append(Check(name, INFO, detail))
        self.log(f"INFO: {name} — {detail}")

    def expect_rc(self, run: Run, expected: int = 0) -> bool:
        """Every step's exit status is judged: a step that should succeed and did not fails."""
        return self.check(
            f"{run.name} exits {expected}",
            run.rc == expected and not run.timed_out if run.skipped is None else None,
            run.status() + (f": {last_line(run.stderr)}" if run.rc != expected else ""),
        )

    def table(self, title: str, headers: list[str], rows: list[list]) -> str:
        text = f"{title}\n{format_table(headers, rows)}"
        self.tables.append(text)
        self.log(text)
        return text

    def failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)

    def report(self, compact: bool = False) -> str:
        """The section's tables and checks; `compact` lists only checks that did not pass."""
        elapsed = time.monotonic() - self.started
        counts = {s: sum(c.status == s for c in self.checks) for s in (PASS, FAIL, SKIP, GOAL_MET, GOAL_MISSED)}
        parts = [
            f"##### section {self.name}: {counts[PASS]} passed, {counts[FAIL]} failed, "
            f"{counts[SKIP]} skipped, goals {counts[GOAL_MET]} met / {counts[GOAL_MISSED]} missed, "
            f"{elapsed:.0f}s"
        ]
        parts += self.tables
        shown = [c for c in self.checks if not compact or c.status in (FAIL, SKIP, GOAL_MET, GOAL_MISSED)]
        if shown:
            rows = [[c.status, c.name, c.detail[:120] if compact else c.detail] for c in shown]
            parts.append(format_table(["status", "check", "detail"], rows))
        return "\n\n".join(parts)

    def close(self) -> None:
        self.log(self.report())
        self._log.close()


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
