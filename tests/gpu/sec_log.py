"""Section `log`: log mode sees every allocation path, and costs nothing measurable.

1. The MLP (train_mlp.py, 50 steps) under ISOLATE_MODE=log with each allocator setting; the
   trace's call counts against what the notes predict, and against PyTorch's own counters.
2. static_alloc.cu built by plain nvcc (static runtime): the trace must hold its allocations,
   as driver calls, with exact counts.
3. The MLP's step time with and without the preload, interleaved A B A B ..., median.
"""

from __future__ import annotations

import common
from common import TOOLS, fmt, median, ratio

MLP_STEPS = 50

ALLOCATOR_SETTINGS = [
    ("default", {}),
    ("no caching", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
    ("cudaMallocAsync", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    ("expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
]

# Rows of the calls table, always shown; other APIs are shown where any setting has them.
API_ROWS = [
    "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaHostAlloc",
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemFreeAsync",
    "cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
]
ASYNC_ALLOC = ("cudaMallocAsync", "cudaMallocAsync_ptsz")
ASYNC_FREE = ("cudaFreeAsync", "cudaFreeAsync_ptsz")
DRIVER_ALLOC = ("cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync")


def run(suite, section) -> dict:
    if not section.check("libisolate.so present", common.LIB.exists(), str(common.LIB)):
        return {}
    return {
        "allocators": allocator_paths(suite, section),
        "static": static_program(suite, section),
        "overhead": overhead(suite, section),
    }


# ------------------------------------------------------------------------------------------


def allocator_paths(suite, section) -> dict:
    runs = {}
    for label, env in ALLOCATOR_SETTINGS:
        name = f"mlp-log/{label.replace(' ', '-')}"
        cmd, tool_env = suite.command(name, TOOLS["log"], "train_mlp.py", ("--steps", str(MLP_STEPS)))
        runs[label] = suite.run(section, name, cmd, {**tool_env, **env}, timeout_s=90)
    suite.keep_traces(runs.values())

    shown = list(API_ROWS)
    for run in runs.values():
        for api, n in ((run.summary or {}).get("calls") or {}).items():
            if n and api not in shown and not api.startswith("cuLaunch"):
                shown.append(api)
    rows = [[api] + [common.calls(r.summary, api) for r in runs.values()] for api in shown]
    stat = lambda r, k: ((r.result or {}).get("allocator_stats") or {}).get(k)  # noqa: E731
    rows += [
        ["(events)"] + [(r.summary or {}).get("events", "-") for r in runs.values()],
        ["(failed calls)"] + [common.total((r.summary or {}).get("failed")) for r in runs.values()],
        ["(trace complete)"] + [(r.summary or {}).get("complete", "-") for r in runs.values()],
        ["torch segment.all.allocated"] + [fmt(stat(r, "segment.all.allocated"), "d") for r in runs.values()],
        ["torch num_device_alloc"] + [fmt(stat(r, "num_device_alloc"), "d") for r in runs.values()],
        ["torch num_alloc_retries"] + [fmt(stat(r, "num_alloc_retries"), "d") for r in runs.values()],
        ["ms/step"] + [fmt((r.result or {}).get("ms_per_step")) for r in runs.values()],
        ["final loss"] + [fmt((r.result or {}).get("final_loss"), ".5f") for r in runs.values()],
    ]
    section.table(
        f"MLP 1024-4096-1024, {MLP_STEPS} steps, ISOLATE_MODE=log: calls by API per allocator setting",
        ["API"] + list(runs), rows,
    )

    for label, run in runs.items():
        section.expect_rc(run)
        s = run.summary
        section.check(f"{label}: trace read back", s is not None, run.summary_error or "")
        if s is not None:
            section.check(
                f"{label}: trace complete, not truncated",
                bool(s.get("complete")) and s.get("truncated") is None,
                f"complete={s.get('complete')} truncated={s.get('truncated')}",
            )
            failed = (s.get("failed") or {}) if isinstance(s.get("failed"), dict) else {}
            section.info(f"{label}: failed calls", ", ".join(f"{k}={v}" for k, v in failed.items() if v) or "none")

    c = lambda label, *apis: common.calls(runs[label].summary, *apis)  # noqa: E731
    default = runs["default"]
    n_malloc = c("default", "cudaMalloc")
    section.check("default: cudaMalloc present (caching segments)", n_malloc > 0, f"cudaMalloc={n_malloc}")
    section.check("default: no cudaFree (caching keeps segments)", c("default", "cudaFree") == 0,
                  f"cudaFree={c('default', 'cudaFree')}")
    for key in ("num_device_alloc", "segment.all.allocated"):
        theirs = stat(default, key)
        section.check(
            f"default: trace cudaMalloc == torch {key}",
            n_malloc == theirs if theirs is not None else None,
            f"trace {n_malloc}, torch {theirs}",
        )
    drv = c("default", *DRIVER_ALLOC)
    section.check(
        "default: driver allocations below the runtime show (cuBLAS, notes section 2)",
        drv > 0,
        ", ".join(f"{a}={c('default', a)}" for a in DRIVER_ALLOC),
    )

    m, f = c("no caching", "cudaMalloc"), c("no caching", "cudaFree")
    section.check("no caching: cudaMalloc in the hundreds+", m >= 200, f"cudaMalloc={m} (notes: 1165)")
    section.check("no caching: cudaFree ~ cudaMalloc", m > 0 and f >= 0.9 * m, f"cudaMalloc={m} cudaFree={f}")

    am, af = c("cudaMallocAsync", *ASYNC_ALLOC), c("cudaMallocAsync", *ASYNC_FREE)
    section.check("cudaMallocAsync backend: cudaMallocAsync in the hundreds+", am >= 200, f"cudaMallocAsync={am}")
    section.check("cudaMallocAsync backend: cudaFreeAsync ~ cudaMallocAsync", am > 0 and af >= 0.9 * am,
                  f"cudaMallocAsync={am} cudaFreeAsync={af}")
    section.info("cudaMallocAsync backend: cudaMalloc", str(c("cudaMallocAsync", "cudaMalloc")))

    for api in ("cuMemAddressReserve", "cuMemCreate", "cuMemMap"):
        n = c("expandable", api)
        section.check(f"expandable: {api} present", n > 0, f"{api}={n}")
    section.check("expandable: no cudaMalloc", c("expandable", "cudaMalloc") == 0,
                  f"cudaMalloc={c('expandable', 'cudaMalloc')}")
    return {label: {"calls": (r.summary or {}).get("calls"), "result": r.result} for label, r in runs.items()}


# ------------------------------------------------------------------------------------------


def static_program(suite, section) -> dict:
    if not section.check("nvcc found", suite.nvcc is not None, suite.nvcc or "not on PATH or /usr/local/cuda/bin"):
        return {}
    binary = suite.work / "bin" / "static_alloc"
    build = suite.run(section, "static/nvcc", [suite.nvcc, "-O2", "-o", str(binary),
                                                str(common.GPU_DIR / "static_alloc.cu")], {}, 180)
    if not section.expect_rc(build):
        return {}
    ldd = suite.run(section, "static/ldd", ["ldd", str(binary)], {}, 30)
    section.expect_rc(ldd)
    section.check("static binary links no libcudart", "libcudart" not in ldd.stdout,
                  common.last_line(ldd.stdout))

    bare = suite.run(section, "static/bare", [str(binary)], {}, 60)
    section.expect_rc(bare)
    logged = suite.run(section, "static/log", [str(binary)], suite.tool_env("static/log", TOOLS["log"]), 60)
    section.expect_rc(logged)
    suite.keep_traces([logged])

    expect = (bare.result or {}).get("expect_driver") or {}
    got = {
        "cuMemAlloc_v2": common.calls(logged.summary, "cuMemAlloc_v2"),
        "cuMemFree_v2": common.calls(logged.summary, "cuMemFree_v2"),
        # cudaMallocAsync may reach the driver as cuMemAllocAsync or cuMemAllocFromPoolAsync.
        "cuMemAllocAsync": common.calls(logged.summary, "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
                                        "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"),
        "cuMemFreeAsync": common.calls(logged.summary, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"),
        "cuMemAllocManaged": common.calls(logged.summary, "cuMemAllocManaged"),
        "host_alloc": common.calls(logged.summary, "cuMemHostAlloc", "cuMemAllocHost_v2"),
        "cuMemFreeHost": common.calls(logged.summary, "cuMemFreeHost"),
    }
    runtime_seen = common.calls(logged.summary, "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
                                "cudaMallocManaged", "cudaMallocHost", "cudaHostAlloc", "cudaFreeHost")
    rows = [[api, expect.get(api, "-"), got[api], "ok" if expect.get(api) == got[api] else "DIFFERENT"]
            for api in got]
    section.table("static_alloc (nvcc, static runtime) under ISOLATE_MODE=log: driver calls",
                  ["driver API", "program made", "trace", ""], rows)
    for api, n in got.items():
        section.check(f"static: trace {api} == {expect.get(api)}", n == expect.get(api) if expect else None,
                      f"trace {n}")
    section.check("static: kernels ran right under the preload",
                  (logged.result or {}).get("kernels_ok") == (logged.result or {}).get("kernels", -1),
                  str(logged.result))
    section.info("static: runtime-level events in the trace (static runtime: expect 0)", str(runtime_seen))
    return {"expected": expect, "trace": got, "calls": (logged.summary or {}).get("calls")}


# ------------------------------------------------------------------------------------------


def overhead(suite, section) -> dict:
    """Baseline and log mode, A B A B ..., each a 300-step MLP run; median of the medians."""
    args = ("--steps", "330", "--warmup", "30")
    times = {"baseline": [], "log": []}
    per_round = []
    for r in range(suite.ab_rounds):
        pair = {}
        for tool in ("baseline", "log"):
            run = suite.run_tool(section, f"ab/{tool}/r{r}", TOOLS[tool], "train_mlp.py", args, 60)
            section.expect_rc(run)
            pair[tool] = (run.result or {}).get("ms_per_step")
            times[tool].append(pair[tool])
        per_round.append(pair)
    base, logged = median(times["baseline"]), median(times["log"])
    ratio3 = lambda a, b: fmt(ratio(a, b), ".3f")  # noqa: E731
    rows = [[f"round {i + 1}", fmt(p["baseline"], ".3f"), fmt(p["log"], ".3f"), ratio3(p["log"], p["baseline"])]
            for i, p in enumerate(per_round)]
    rows.append(["median", fmt(base, ".3f"), fmt(logged, ".3f"), ratio3(logged, base)])
    section.table("MLP step time, ms (default caching allocator), interleaved", ["", "no preload", "log mode", "ratio"], rows)
    r = ratio(logged, base)
    section.check("log mode step time within 1% of no preload", r <= 1.01 if r else None, f"ratio {fmt(r, '.4f')}", goal=True)
    return {"baseline_ms": times["baseline"], "log_ms": times["log"], "ratio": r}
