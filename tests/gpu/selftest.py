"""Runs the whole GPU-suite driver on simulated steps, without a GPU, torch or the library.

    python3 tests/gpu/selftest.py [--keep DIR]

Every step the suite would start (workloads, nvcc, ldd, `isolate summary`, `isolate who`) is
answered by `FakeMachine.run` with output shaped like the real thing: a well-behaved library
(bugs found, counts as the notes predict) unless `--broken` asks for a library that finds
nothing. It checks that every section runs to its end, writes its files, and that the checks
come out as the simulation implies. It exercises the parsing, judging and table code only;
what the GPU does is for run.sh on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import suite  # noqa: E402
from common import Run  # noqa: E402

P = 0x7F00_0000_0000
NBYTES = 4 << 20


class FakeMachine:
    def __init__(self, broken: bool):
        self.broken = broken
        self.rng = random.Random(0)

    # The one entry point: what common.run_cmd would have returned.
    def run(self, name, cmd, env_delta, timeout_s) -> Run:
        run = Run(name=name, cmd=[str(c) for c in cmd], env_delta=dict(env_delta), rc=0, seconds=0.5)
        if timeout_s < 1:
            run.rc, run.skipped = None, "no time left"
            return run
        exe = Path(run.cmd[0]).name
        if exe == "isolate":
            return self.cli(run)
        if exe == "nvcc":
            Path(run.cmd[run.cmd.index("-o") + 1]).write_text("fake binary")
            return run
        if exe == "ldd":
            run.stdout = "\tlinux-vdso.so.1\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6\n"
            return run
        if exe == "static_alloc":
            return self.static(run, env_delta)
        sanitizer = exe == "compute-sanitizer"
        script = next(Path(c).name for c in run.cmd if c.endswith(".py"))
        mode = self.mode(env_delta, sanitizer)
        result, summary = getattr(self, script[:-3])(run, mode, env_delta)
        if result is not None:
            run.stdout += "some noise\nRESULT " + json.dumps(result) + "\n"
        if sanitizer:
            errors = 1 if script == "bug_oob.py" else 0
            run.stdout += f"========= ERROR SUMMARY: {errors} errors\n"
        if "ISOLATE_TRACE" in env_delta:
            path = env_delta["ISOLATE_TRACE"].replace("%p", str(self.rng.randint(1000, 99999)))
            Path(path).write_text(json.dumps(self.full_summary(summary or {})))
        run.result = common.parse_result(run.stdout)
        return run

    @staticmethod
    def mode(env, sanitizer) -> str:
        if sanitizer:
            return "sanitizer"
        if env.get("ISOLATE_GUARD") == "on":
            return "guard"
        return env.get("ISOLATE_MODE") or ("nocache" if env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") else "baseline")

    @staticmethod
    def full_summary(partial: dict) -> dict:
        base = {"calls": {}, "failed": {"cuMemCreate": 1}, "allocations": 10, "frees": 9,
                "peak_live_bytes": 1 << 30, "live_at_end": {"count": 1, "bytes": 4096}, "invalid_frees": [],
                "invalid_free_count": 0, "events": 100, "poison_violations": [],
                "quarantine": {"peak_bytes": 1 << 28, "releases": 3, "early_releases": 0},
                "stale_launches": [], "last_events": [], "complete": True, "truncated": None}
        base.update(partial)
        base["poison_violation_count"] = len(base["poison_violations"])
        base["stale_launch_count"] = len(base["stale_launches"])
        return base

    # Fake `isolate` CLI ----------------------------------------------------------------------
    def cli(self, run: Run) -> Run:
        if run.cmd[1] == "summary":
            merged = None
            for path in run.cmd[3:]:
                one = json.loads(Path(path).read_text())
                merged = one if merged is None else merged
            run.stdout = json.dumps(merged)
        elif run.cmd[1] == "who" and "--json" in run.cmd:
            occupant = {"ptr": hex(P), "size": NBYTES, "api": "cudaMalloc", "alloc_seq": 12, "free_seq": 13}
            run.stdout = json.dumps({"address": run.cmd[2], "traces": [{"history": [occupant], "mappings": []}]})
        elif run.cmd[1] == "who":
            run.stdout = f"{run.cmd[2]} is inside allocation {hex(P)} ({NBYTES} bytes), cudaMalloc seq 12, freed seq 13\n"
            run.rc = 3  # a trace cut short by the fault
        return run

    # Fake workloads -----------------------------------------------------------------------
    def train_mlp(self, run, mode, env):
        alloc_conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
        setting = ("nocache" if env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") else
                   "async" if "cudaMallocAsync" in alloc_conf else
                   "expandable" if "expandable" in alloc_conf else "default")
        calls = {
            "default": {"cudaMalloc": 16, "cudaHostAlloc": 1, "cuMemAlloc_v2": 6},
            "nocache": {"cudaMalloc": 1165, "cudaFree": 1154, "cuMemAlloc_v2": 6},
            "async": {"cudaMallocAsync": 1165, "cudaFreeAsync": 1154, "cuMemAlloc_v2": 6},
            "expandable": {"cuMemAddressReserve": 2, "cuMemCreate": 18, "cuMemMap": 17, "cuMemSetAccess": 17},
        }[setting]
        ms = 2.5 * (1.004 if mode == "log" else 1.0) * self.rng.uniform(0.99, 1.01)
        stats = {"segment.all.allocated": 16, "num_device_alloc": 16, "num_alloc_retries": 0} if setting == "default" else {}
        return {"ms_per_step": ms, "final_loss": 1.01, "max_memory_allocated": 1 << 27, "allocator_stats": stats}, {
            "calls": calls}

    def static(self, run, env):
        expect = {"cuMemAlloc_v2": 100, "cuMemFree_v2": 101, "cuMemAllocAsync": 50, "cuMemFreeAsync": 50,
                  "cuMemAllocManaged": 1, "host_alloc": 1, "cuMemFreeHost": 1}
        run.stdout = "RESULT " + json.dumps({"expect_driver": expect, "kernels": 101, "kernels_ok": 101}) + "\n"
        run.result = common.parse_result(run.stdout)
        if "ISOLATE_TRACE" in env:
            calls = dict(expect)
            calls["cuMemHostAlloc"] = calls.pop("host_alloc")
            path = env["ISOLATE_TRACE"].replace("%p", "4242")
            Path(path).write_text(json.dumps(self.full_summary({"calls": calls})))
        return run

    def train_small(self, run, mode, env):
        model = run.cmd[run.cmd.index("--model") + 1]
        steps = int(run.cmd[run.cmd.index("--steps") + 1])
        warmup = int(run.cmd[run.cmd.index("--warmup") + 1])
        factor = {"baseline": 1.0, "log": 1.005, "nocache": 1.8, "isolate": 2.0, "guard": 3.0,
                  "sanitizer": 40.0}.get(mode, 1.0)
        if "--history" in run.cmd:
            factor = 1.3
        base_ms = 3.0 if model == "lm" else 5.0
        losses = [8.3 * (0.99 ** i) for i in range(steps + warmup)]
        result = {"model": model, "steps": steps, "warmup": warmup, "total_steps": steps + warmup,
                  "ms_per_step": base_ms * factor * self.rng.uniform(0.98, 1.02), "losses": losses,
                  "max_memory_reserved": 300 << 20, "max_memory_allocated": 250 << 20,
                  "device_used_start": 600 << 20, "device_used_peak": (900 + 500 * (mode == "guard")) << 20,
                  "device_used_delta": (300 + 500 * (mode == "guard")) << 20}
        if "--history" in run.cmd:
            result["snapshot"] = {"bytes": 2_000_000, "dump_s": 0.7, "stacks": run.cmd[run.cmd.index("--history") + 1]}
        return result, {"calls": {"cudaMalloc": 1000, "cudaFree": 990}}

    def bug_stale_write(self, run, mode, env):
        result = {"bug": "stale_write", "p": hex(P), "nbytes": NBYTES, "target": hex(P), "target_bytes": NBYTES,
                  "error": None}
        summary = {}
        protected = mode in ("isolate", "guard") and not self.broken
        if mode == "guard" and not self.broken:
            result.update(error="RuntimeError: CUDA error: an illegal memory access was encountered", corrupted=None,
                          correct=None)
            run.rc = 3
            summary["last_events"] = [{"seq": 1, "api": "cudaFree", "ptr": hex(P)}]
        else:
            result.update(same_address=not protected, corrupted=0 if protected else 1024, correct=protected)
        if protected and mode == "isolate":
            summary["poison_violations"] = [{"ptr": hex(P), "size": NBYTES, "first_offset": 4096, "changed_bytes": 4096}]
            if env.get("ISOLATE_CHECK_LAUNCH") == "on":
                kernel = "stale_fill_triton" if "triton" in run.cmd else "stale_fill"
                summary["stale_launches"] = [{"kernel": kernel, "param_offset": 0, "ptr": hex(P)}]
        return result, summary

    def bug_record_stream(self, run, mode, env):
        right = mode in ("nocache", "sanitizer") or (mode in ("isolate", "guard") and not self.broken)
        return {"bug": "record_stream", "t_ptr": hex(P), "target": hex(P), "target_bytes": NBYTES, "error": None,
                "same_address": not right, "wrong": 0 if right else NBYTES // 4, "correct": right}, {}

    def bug_oob(self, run, mode, env):
        n = int(run.cmd[run.cmd.index("--n") + 1])
        result = {"bug": "oob", "n": n, "ptr": hex(P), "nbytes": 4 * n, "multiple_of_2mib": (4 * n) % (2 << 20) == 0,
                  "target": hex(P), "target_bytes": 4 * n + 4, "error": None}
        if (mode == "guard" and not self.broken and n > 1000) or mode == "sanitizer":
            result["error"] = "CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered"
            run.rc = 3
        return result, {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broken", action="store_true", help="simulate a library that finds nothing")
    parser.add_argument("--keep", help="write OUT and WORK here instead of a temporary folder")
    args = parser.parse_args()

    machine = FakeMachine(args.broken)
    root = Path(args.keep or tempfile.mkdtemp(prefix="isolate-gpu-selftest."))
    out, work = root / "out", root / "work"
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    (work / "versions.txt").write_text("gpu / driver      FAKE H200, 580.00\n")
    fake_lib, fake_cli = work / "libisolate.so", work / "isolate"
    fake_lib.write_text("")
    fake_cli.write_text("")

    common.run_cmd = machine.run
    common.LIB = suite.LIB = fake_lib
    common.CLI = fake_cli
    common.find_tool_binary = lambda name: f"/usr/local/cuda/bin/{name}"
    rc = suite.main(["all", "--out", str(out), "--work", str(work), "--budget", "600", "--rounds", "2",
                     "--steps", "30", "--warmup", "3", "--jobs", "3", "--ab-rounds", "3"])

    problems = []
    files = sorted(os.listdir(out))
    expected_files = ["compare.log", "compare.md", "guard.log", "isolate.log", "log.log", "results.json", "summary.txt"]
    if files != expected_files:
        problems.append(f"OUT holds {files}, expected {expected_files}")
    results = json.loads((out / "results.json").read_text())
    failed = {s: [c["name"] for c in r["checks"] if c["status"] == "FAIL"] for s, r in results.items()}
    crashed = [s for s, names in failed.items() if any(n.startswith("section ") for n in names)]
    if crashed:
        problems.append(f"sections crashed: {crashed} (see their logs in {out})")
    if args.broken:
        if rc == 0 or not failed["isolate"] or not failed["guard"]:
            problems.append(f"a library that finds nothing must fail isolate and guard (rc {rc}, {failed})")
    elif rc != 0:
        problems.append(f"the simulated good library should pass everything, failed: {failed}")
    print("\nselftest:", "OK" if not problems else "PROBLEMS\n  " + "\n  ".join(problems), f"({root})")
    if not problems and not args.keep:
        shutil.rmtree(root)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
