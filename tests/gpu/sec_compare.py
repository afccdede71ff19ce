"""Section `compare`: isolate side by side with the tools users would pick instead.

For both models of train_small.py (interleaved rounds, medians): baseline, isolate log mode,
PyTorch's memory history (stacks="python", and the default, which records C++ frames too) with
the snapshot dump, PYTORCH_NO_CUDA_MEMORY_CACHING=1 alone, isolation with and without the launch
check, guard mode; compute-sanitizer memcheck (with no caching) on a 5-step run. Then each
planted bug under each tool: found or not, right result or not, how long it took.

One table, tools as columns: step time and peak device memory as ratios to the baseline,
trace/snapshot bytes per step, then a row per planted bug. Also written as OUT/compare.md.
"""

from __future__ import annotations

import benchstats
from common import TOOLS, fmt, fmt_bytes, fmt_ratio, format_table, ratio
from judge import judge, sanitizer_errors

COLUMNS = ("baseline", "log", "history-python", "history", "nocache", "isolate-nolaunch", "isolate", "guard",
           "sanitizer")
BUGS = (("stale", "stale write"), ("record_stream", "missing record_stream"), ("oob-4000000", "OOB write"))
SHORT = {"lm": "train-lm-short", "resnet": "train-resnet-short"}
MODEL_LABEL = {"lm": "LM", "resnet": "ResNet-18"}


def run(suite, section) -> dict:
    bug_tools = [t for t in COLUMNS if t != "history-python"]
    keys = [(bug, tool) for bug, _ in BUGS for tool in bug_tools]
    keys += [(SHORT[m], "sanitizer") for m in suite.models]
    jobs = suite.jobs(section, keys)
    bench = suite.bench(section)
    stats = benchstats.all_stats(bench)

    headers = ["", *(TOOLS[t].label for t in COLUMNS)]
    rows = []
    for model in suite.models:
        rows.append([f"{MODEL_LABEL[model]} step time"] + [time_cell(stats, jobs, t, model) for t in COLUMNS])
    for model in suite.models:
        rows.append([f"{MODEL_LABEL[model]} peak device mem"] + [memory_cell(stats, jobs, t, model) for t in COLUMNS])
    for model in suite.models:
        rows.append([f"{MODEL_LABEL[model]} bytes/step"] + [bytes_cell(stats, t, model) for t in COLUMNS])
    rows.append(["snapshot dump"] + [dump_cell(stats, t, suite.models) for t in COLUMNS])
    verdicts = {}
    for bug, label in BUGS:
        cells = []
        for tool in COLUMNS:
            if (bug, tool) not in jobs:
                cells.append("-")
                continue
            verdicts[(bug, tool)] = judge(jobs[(bug, tool)], TOOLS[tool])
            cells.append(verdicts[(bug, tool)].cell())
        rows.append([label] + cells)

    title = (f"side by side: {suite.warmup}+{suite.steps} training steps per run, {suite.bench_rounds_done} "
             f"interleaved rounds, medians; memcheck on {short_steps(jobs, suite.models)} steps")
    section.table(title, headers, rows)
    checks(section, stats, jobs, verdicts, suite.models)
    write_markdown(suite, title, headers, rows, stats, jobs, verdicts)
    return {
        "table": {"headers": headers, "rows": rows},
        "verdicts": {f"{b}/{t}": vars(v) for (b, t), v in verdicts.items()},
        "bench": {f"{t}/{m}": vars(s) for (t, m), s in stats.items()},
    }


# ------------------------------------------------------------------------------------------
# Cells.


def short_result(jobs, model):
    run = jobs.get((SHORT[model], "sanitizer"))
    return (run.result or {}) if run is not None and run.ok else None


def short_steps(jobs, models) -> str:
    for model in models:
        r = short_result(jobs, model)
        if r:
            return f"{r.get('warmup')}+{r.get('steps')}"
    return "0 (did not run)"


def time_cell(stats, jobs, tool, model) -> str:
    base = stats.get(("baseline", model))
    if tool == "sanitizer":
        r = short_result(jobs, model)
        return fmt_ratio(ratio(r.get("ms_per_step"), base.ms if base else None)) if r else "-"
    s = stats.get((tool, model))
    if s is None or s.ms is None:
        return "-" if s is None else "failed"
    if tool == "baseline":
        return f"{s.ms:.2f} ms"
    return fmt_ratio(ratio(s.ms, base.ms))


def memory_cell(stats, jobs, tool, model) -> str:
    base = stats.get(("baseline", model))
    if tool == "sanitizer":
        r = short_result(jobs, model)
        return fmt_ratio(ratio(r.get("device_used_delta"), base.device_delta if base else None)) if r else "-"
    s = stats.get((tool, model))
    if s is None or s.device_delta is None:
        return "-"
    if tool == "baseline":
        return fmt_bytes(s.device_delta)
    return fmt_ratio(ratio(s.device_delta, base.device_delta))


def bytes_cell(stats, tool, model) -> str:
    s = stats.get((tool, model))
    if s is None:
        return "-"
    per_step = s.trace_bytes_per_step if s.trace_bytes_per_step is not None else s.snapshot_bytes_per_step
    return fmt_bytes(per_step) if per_step is not None else "-"


def dump_cell(stats, tool, models) -> str:
    values = [stats[(tool, m)].dump_s for m in models if (tool, m) in stats]
    if not any(v is not None for v in values):
        return "-"
    return " / ".join(fmt(v, ".2f") + "s" if v is not None else "-" for v in values)


# ------------------------------------------------------------------------------------------


def checks(section, stats, jobs, verdicts, models) -> None:
    for (tool, model), s in stats.items():
        if s.failed:
            section.check(f"{model}/{tool}: every benchmark run succeeded", False, "; ".join(s.failed))
    for (bug, tool), v in verdicts.items():
        section.check(f"{bug} under {tool}: the run gave a verdict", v.found is not None, v.cell())
        if v.reports:
            section.log(f"{bug} under {tool}: {v.reports}")
    # What isolate promises is checked; what the other tools do is only reported.
    for bug, tool in (("stale", "isolate"), ("stale", "isolate-nolaunch"), ("stale", "guard"), ("oob-4000000", "guard")):
        v = verdicts.get((bug, tool))
        if v is not None and v.found is not None:
            section.check(f"{bug}: found by {tool}", v.found, v.cell())
    for (bug, tool), v in verdicts.items():
        if tool not in ("isolate", "isolate-nolaunch", "guard"):
            section.info(f"{bug} under {tool}", v.cell())
    v = verdicts.get(("record_stream", "isolate"))
    if v is not None:
        section.check("record_stream: right result under isolate", v.correct, v.cell())
    for model in models:
        run = jobs.get((SHORT[model], "sanitizer"))
        if run is not None:
            section.expect_rc(run)
            section.info(f"memcheck errors in {model} training", f"{sanitizer_errors(run.output())}")


def write_markdown(suite, title, headers, rows, stats, jobs, verdicts) -> None:
    versions = suite.work / "versions.txt"
    base = {m: stats.get(("baseline", m)) for m in suite.models}
    lines = [
        "# isolate side by side with the tools users would pick instead",
        "",
        "```",
        versions.read_text().strip() if versions.exists() else "(versions not recorded)",
        "```",
        "",
        f"{title}.",
        "",
        format_table(headers, rows, markdown=True),
        "",
        "- Step time and peak device memory are ratios to the baseline (no tool, caching allocator); the baseline "
        "column gives the absolute values. Device memory is `total - free` from `torch.cuda.mem_get_info` after each "
        "step, above what the process held before building the model, so memory the allocator never sees "
        "(quarantine, guard mappings) counts.",
        "- bytes/step: trace file bytes (isolate columns) or memory-history snapshot bytes (history columns) "
        "divided by the steps run, warm-up included. Snapshot dump: seconds for `_dump_snapshot`, LM / ResNet.",
        "- history py: `_record_memory_history(stacks=\"python\")`; history all: `_record_memory_history()` with "
        "its defaults, which in PyTorch 2.11 already means stacks=\"all\" (C++ frames too).",
        "- memcheck: `compute-sanitizer --tool memcheck` with `PYTORCH_NO_CUDA_MEMORY_CACHING=1` (so it sees each "
        "tensor as its own allocation), on a short run; its ratios compare that run's median step to the "
        "baseline's.",
        "- Planted bugs: FOUND = the tool reported the bug's memory (poison violation or stale launch in the trace, "
        "memcheck errors) or the bad access faulted; ok/wrong = the program's own check of its result (y intact, "
        "`out` right; none for the OOB write); the "
        f"time is the whole process, wall clock, with {suite.jobs_at_once} such runs at a time. "
        "History columns can never find a bug: a snapshot has no checker, it is a record to read.",
    ]
    for model, s in base.items():
        if s and s.ms is not None:
            lines.append(f"- Baseline {MODEL_LABEL[model]}: {s.ms:.3f} ms/step, peak device memory "
                         f"{fmt_bytes(s.device_peak)} ({fmt_bytes(s.device_delta)} above start), "
                         f"max_memory_reserved {fmt_bytes(s.reserved)}.")
    details = [f"  - {b} / {t}: {'; '.join(v.reports)[:300]}" for (b, t), v in verdicts.items() if v.reports]
    if details:
        lines += ["- What each tool reported:", *details]
    (suite.out / "compare.md").write_text("\n".join(lines) + "\n")
