"""The GPU suite's driver: `python3 suite.py --out DIR --work DIR SECTION…` (run.sh calls it).

Sections (sec_*.py) ask the Suite for two kinds of runs, both memoised so a run that several
sections need happens once per call:

  jobs   a workload (planted bug, short training) under one tool; these are not timed
         against each other, so they run GPU_JOBS at a time. The first section that asks
         runs every job that any requested section declared (JOBS below), in one batch.
  bench  train_small.py for both models under each tool that a requested section declared
         (BENCH below), interleaved: round 1 runs every tool once, round 2 again (in a
         rotated order), ..., so slow drift of the machine hits every tool alike.

Each section writes OUT/<section>.log (every step's command, environment, exit status, output)
and ends with a table and its checks on stdout; the end of the run prints all of them again,
writes OUT/summary.txt and OUT/results.json, and copies the traces worth keeping to WORK/keep.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import sys
import time
from pathlib import Path

import common
from common import GPU_DIR, LIB, PYTHON, TOOLS, Deadline, Run, Section, Tool

SECTIONS = ("log", "isolate", "guard", "compare")


@dataclasses.dataclass(frozen=True)
class Workload:
    """A program the suite runs under a tool."""

    id: str
    label: str
    script: str
    args: tuple[str, ...] = ()
    timeout_s: float = 90


WORKLOADS = {
    w.id: w
    for w in [
        Workload("stale", "stale write", "bug_stale_write.py", ("--writer", "cupy")),
        Workload("stale-triton", "stale write (Triton)", "bug_stale_write.py", ("--writer", "triton")),
        Workload("record_stream", "missing record_stream", "bug_record_stream.py"),
        # 4,000,000 bytes: a multiple of 256 (no alignment slack) but not of 2 MiB.
        Workload("oob-4000000", "OOB write, 4,000,000 B", "bug_oob.py", ("--n", "1000000")),
        Workload("oob-2MiB", "OOB write, 2 MiB", "bug_oob.py", ("--n", str(2**19))),
        # 4,000 bytes: not even a multiple of 256, so alignment padding may hide the write.
        Workload("oob-4000", "OOB write, 4,000 B", "bug_oob.py", ("--n", "1000")),
        Workload(
            "train-lm-short",
            "LM training, 5 steps",
            "train_small.py",
            ("--model", "lm", "--steps", "5", "--warmup", "1"),
            timeout_s=240,
        ),
        Workload(
            "train-resnet-short",
            "ResNet training, 5 steps",
            "train_small.py",
            ("--model", "resnet", "--steps", "5", "--warmup", "1"),
            timeout_s=240,
        ),
    ]
}

SANITIZER_TIMEOUT_S = 180  # a planted bug under compute-sanitizer

# What each section needs; the union over the requested sections runs once.
COMPARE_TOOLS = ("baseline", "log", "history", "nocache", "sanitizer", "isolate-nolaunch", "isolate", "guard")
JOBS: dict[str, list[tuple[str, str]]] = {
    "log": [],
    "isolate": [
        (bug, tool)
        for bug in ("stale", "record_stream")
        for tool in ("baseline", "log", "nocache", "isolate-nolaunch", "isolate")
    ],
    "guard": [("stale", "guard"), ("stale", "isolate"), ("stale", "isolate-nolaunch"), ("stale-triton", "isolate")]
    + [(oob, tool) for oob in ("oob-4000000", "oob-2MiB", "oob-4000") for tool in ("baseline", "guard")],
    "compare": [(bug, tool) for bug in ("stale", "record_stream", "oob-4000000") for tool in COMPARE_TOOLS]
    + [("train-lm-short", "sanitizer"), ("train-resnet-short", "sanitizer")],
}
BENCH_ORDER = ("baseline", "log", "history-python", "history", "nocache", "isolate-nolaunch", "isolate", "guard")
BENCH: dict[str, tuple[str, ...]] = {
    "log": (),
    "isolate": ("baseline", "nocache", "isolate"),
    "guard": ("baseline", "isolate-nolaunch", "isolate", "guard"),
    "compare": BENCH_ORDER,
}
BENCH_MODELS = ("lm", "resnet")


class Suite:
    def __init__(self, args):
        self.out = Path(args.out)
        self.work = Path(args.work)
        self.deadline = Deadline(args.budget)
        self.sections = args.sections
        self.rounds = args.rounds
        self.steps = args.steps
        self.warmup = args.warmup
        self.jobs_at_once = args.jobs
        self.ab_rounds = args.ab_rounds
        self.models = BENCH_MODELS
        self.sanitizer = common.find_tool_binary("compute-sanitizer")
        self.nvcc = common.find_tool_binary("nvcc")
        for sub in ("traces", "snapshots", "keep", "bin"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        self._jobs: dict[tuple[str, str], Run] = {}
        self._kept: set[str] = set()
        self._kept_bytes = 0
        self._bench: dict[tuple[str, str], list[Run]] | None = None
        self.bench_rounds_done = 0
        self.planned_jobs = list(dict.fromkeys(k for s in self.sections for k in JOBS[s]))
        wanted = {t for s in self.sections for t in BENCH[s]}
        self.planned_bench = [t for t in BENCH_ORDER if t in wanted]

    # ----------------------------------------------------------------------------------
    # One step.

    def trace_prefix(self, name: str) -> str:
        return str(self.work / "traces" / re.sub(r"[^A-Za-z0-9_.-]", "_", name))

    def tool_env(self, name: str, tool: Tool) -> dict[str, str]:
        """The environment `tool` adds for step `name` (the preload writes NAME.<pid>.trace)."""
        env = dict(tool.env)
        if tool.preload:
            env["LD_PRELOAD"] = str(LIB)
            env["ISOLATE_TRACE"] = self.trace_prefix(name) + ".%p.trace"
        return env

    def command(self, name: str, tool: Tool, script: str, args) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of the Python workload `script args` under `tool`."""
        cmd = [PYTHON, str(GPU_DIR / script), *args, *tool.args]
        env = self.tool_env(name, tool)
        if tool.history:
            snap = self.work / "snapshots" / (Path(self.trace_prefix(name)).name + ".pickle")
            cmd += ["--snapshot", str(snap)]
        if tool.sanitizer:
            # API calls that fail on purpose (probing for entry points) are not memory errors.
            cmd = [self.sanitizer or "compute-sanitizer", "--tool", "memcheck", "--leak-check", "no",
                   "--report-api-errors", "no", "--print-limit", "20", *cmd]
        return cmd, env

    def run(self, section: Section, name: str, cmd, env: dict[str, str], timeout_s: float) -> Run:
        """Run a step (capped by the deadline), read its traces, log it."""
        run = common.run_cmd(name, cmd, env, self.deadline.cap(timeout_s))
        if "ISOLATE_TRACE" in env and run.skipped is None:
            run.traces = common.find_traces(env["ISOLATE_TRACE"][: -len(".%p.trace")])
            run.trace_bytes = sum(os.path.getsize(t) for t in run.traces)
            run.summary, run.summary_error = common.summarize(run.traces)
        section.step(run)
        return run

    def run_tool(self, section: Section, name: str, tool: Tool, script: str, args, timeout_s: float) -> Run:
        if tool.preload and not LIB.exists():
            run = Run(name=name, cmd=[script, *args], env_delta=dict(tool.env), skipped=f"{LIB} missing")
            section.step(run)
            return run
        if tool.sanitizer and not self.sanitizer:
            run = Run(name=name, cmd=[script, *args], env_delta={}, skipped="compute-sanitizer not found")
            section.step(run)
            return run
        cmd, env = self.command(name, tool, script, args)
        return self.run(section, name, cmd, env, timeout_s)

    # ----------------------------------------------------------------------------------
    # Jobs: workloads under tools, several at a time.

    def jobs(self, section: Section, keys) -> dict[tuple[str, str], Run]:
        """The runs of (workload, tool) `keys`; the first call runs every planned job."""
        todo = [k for k in dict.fromkeys([*self.planned_jobs, *keys]) if k not in self._jobs]
        if todo:
            # Longest first (compute-sanitizer), so the batch ends as early as it can.
            todo.sort(key=lambda k: (TOOLS[k[1]].sanitizer, WORKLOADS[k[0]].timeout_s), reverse=True)
            section.say(f"running {len(todo)} jobs, {self.jobs_at_once} at a time")
            done = common.parallel_map(self._run_job, todo, self.jobs_at_once,
                                       on_done=lambda key, run: section.step(run))
            self._jobs.update(zip(todo, done))
        for key in keys:  # a job another section ran: its full record goes in this log too
            if key not in todo:
                section.log(f"(from an earlier section)\n{self._jobs[key].describe()}")
        return {k: self._jobs[k] for k in keys}

    def _run_job(self, key: tuple[str, str]) -> Run:
        workload, tool = WORKLOADS[key[0]], TOOLS[key[1]]
        name = f"{workload.id}/{tool.name}"
        timeout = max(workload.timeout_s, SANITIZER_TIMEOUT_S) if tool.sanitizer else workload.timeout_s
        quiet = _QuietSection()
        return self.run_tool(quiet, name, tool, workload.script, workload.args, timeout)

    # ----------------------------------------------------------------------------------
    # The interleaved training benchmark.

    def bench(self, section: Section) -> dict[tuple[str, str], list[Run]]:
        """train_small.py, both models, every planned tool, `rounds` interleaved rounds."""
        if self._bench is not None:
            section.log("(benchmark runs: in the log of the section that ran them first)")
            return self._bench
        tools = self.planned_bench
        results: dict[tuple[str, str], list[Run]] = {(t, m): [] for t in tools for m in self.models}
        dropped: set[tuple[str, str]] = set()
        args = ("--steps", str(self.steps), "--warmup", str(self.warmup))
        section.say(f"benchmark: {len(tools)} tools x {len(self.models)} models x {self.rounds} rounds, "
                    f"{self.warmup}+{self.steps} steps each")
        last_round_s = 0.0
        for r in range(self.rounds):
            if r > 0 and self.deadline.remaining() < last_round_s * 1.1 + 20:
                section.say(f"benchmark: stopping after {r} rounds (time budget)")
                break
            round_start = time.monotonic()
            for tool_name in tools[r % len(tools):] + tools[: r % len(tools)]:  # rotated each round
                for model in self.models:
                    if (tool_name, model) in dropped:
                        continue
                    run = self.run_tool(section, f"bench/{tool_name}/{model}/r{r}", TOOLS[tool_name],
                                        "train_small.py", ("--model", model, *args), timeout_s=150)
                    results[(tool_name, model)].append(run)
                    if not run.ok:  # a tool that hangs or fails once is not run again
                        dropped.add((tool_name, model))
            last_round_s = time.monotonic() - round_start
            self.bench_rounds_done = r + 1
        self._bench = results
        return results

    # ----------------------------------------------------------------------------------
    # Keeping traces.

    def keep_traces(self, runs, limit_bytes: int = 14 << 20) -> list[str]:
        """Copy small traces of `runs` to WORK/keep (run.sh tars them), at most `limit_bytes`."""
        kept, left_out = [], []
        for run in runs:
            for trace in run.traces:
                name, size = Path(trace).name, os.path.getsize(trace)
                if name in self._kept:
                    continue
                if size > 4 << 20 or self._kept_bytes + size > limit_bytes:
                    left_out.append(f"{name} ({size} bytes)")
                    continue
                shutil.copy(trace, self.work / "keep" / name)
                self._kept.add(name)
                self._kept_bytes += size
                kept.append(name)
        return kept + [f"left out: {x}" for x in left_out]


class _QuietSection:
    """Jobs run on worker threads; their steps are logged by `Suite.jobs` once they finish."""

    def step(self, run: Run) -> None:
        pass


def parse_args(argv):
    env = os.environ.get
    p = argparse.ArgumentParser(description="isolate GPU suite driver")
    p.add_argument("sections", nargs="+", choices=[*SECTIONS, "all"])
    p.add_argument("--out", required=True, help="where section logs and tables go")
    p.add_argument("--work", required=True, help="scratch: traces, snapshots, binaries")
    p.add_argument("--budget", type=float, default=float(env("GPU_BUDGET_S", 560)),
                   help="seconds for the whole run; steps are cut to fit")
    p.add_argument("--rounds", type=int, default=int(env("GPU_ROUNDS", 3)), help="benchmark rounds")
    p.add_argument("--steps", type=int, default=int(env("GPU_STEPS", 200)), help="timed training steps")
    p.add_argument("--warmup", type=int, default=int(env("GPU_WARMUP", 20)), help="untimed first steps")
    p.add_argument("--jobs", type=int, default=int(env("GPU_JOBS", 4)), help="jobs at a time")
    p.add_argument("--ab-rounds", type=int, default=int(env("GPU_AB_ROUNDS", 5)),
                   help="rounds of the with/without-preload MLP comparison")
    args = p.parse_args(argv)
    if "all" in args.sections:
        args.sections = list(SECTIONS)
    args.sections = [s for s in SECTIONS if s in args.sections]  # fixed order, no repeats
    return args


def main(argv=None) -> int:
    import sec_compare
    import sec_guard
    import sec_isolate
    import sec_log

    modules = {"log": sec_log, "isolate": sec_isolate, "guard": sec_guard, "compare": sec_compare}
    args = parse_args(argv)
    suite = Suite(args)
    reports, results, failed = [], {}, []
    for name in suite.sections:
        section = Section(name, suite.out)
        section.say(f"start ({suite.deadline.remaining():.0f}s of the budget left)")
        try:
            results[name] = modules[name].run(suite, section)
        except Exception as err:  # a bug in the suite itself: report it, go on with the next
            import traceback

            section.log(traceback.format_exc())
            section.check(f"section {name} ran to its end", False, common.last_line(traceback.format_exc()) or repr(err))
        print("\n" + section.report(compact=True) + "\n", flush=True)
        reports.append((section.report(), section.report(compact=True)))
        if section.failed():
            failed.append(name)
        results.setdefault(name, {})["checks"] = [dataclasses.asdict(c) for c in section.checks]
        section.close()

    versions = suite.work / "versions.txt"
    header = versions.read_text() if versions.exists() else ""
    (suite.out / "summary.txt").write_text(header + "\n" + "\n\n".join(full for full, _ in reports) + "\n")
    common.write_json(suite.out / "results.json", results)
    print("=" * 100)
    print("RECAP: checks that did not pass, and every table (all checks: summary.txt)\n")
    print("\n\n".join(compact for _, compact in reports))
    print("=" * 100)
    print(f"sections failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
