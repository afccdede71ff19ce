"""Section `isolate`: planted bugs and real training under ISOLATE_MODE=isolate.

1. Stale write (bug_stale_write.py): corrupts y by default; under isolation y stays intact and
   the trace holds a poison violation at p, first_offset 4096, changed_bytes 4096.
2. Missing record_stream (bug_record_stream.py): wrong result by default, right under isolation.
3. train_small.py (LM and ResNet-18) interleaved: baseline, PYTORCH_NO_CUDA_MEMORY_CACHING=1,
   isolation: same loss curve, no violation, step time and memory as ratios; goal: isolation
   within 1.25x of no caching.
"""

from __future__ import annotations

import benchstats
import common
from common import fmt, fmt_bytes, fmt_ratio, ratio

STALE_TOOLS = ("baseline", "log", "nocache", "isolate-nolaunch", "isolate")
RECORD_TOOLS = ("baseline", "log", "nocache", "isolate-nolaunch", "isolate")
EXPECTED_FIRST_OFFSET = 1024 * 4
EXPECTED_CHANGED = 1024 * 4


def run(suite, section) -> dict:
    section.check("libisolate.so present", common.LIB.exists(), str(common.LIB))
    jobs = suite.jobs(section, [(b, t) for b in ("stale", "record_stream") for t in STALE_TOOLS])
    suite.keep_traces(jobs.values())
    out = {
        "stale": stale_write(section, {t: jobs[("stale", t)] for t in STALE_TOOLS}),
        "record_stream": record_stream(section, {t: jobs[("record_stream", t)] for t in RECORD_TOOLS}),
    }
    out["training"] = training(suite, section)
    return out


def violation_at(run, ptr: int | None) -> dict | None:
    for v in common.violations(run.summary):
        if ptr is not None and common.as_int(v.get("ptr")) == ptr:
            return v
    return None


def stale_write(section, runs) -> dict:
    rows = []
    for tool, run in runs.items():
        r = run.result or {}
        v = violation_at(run, common.as_int(r.get("p")))
        rows.append([
            tool, run.status(), r.get("same_address", "-"), r.get("corrupted", "-"),
            len(common.violations(run.summary)) if run.summary else "-",
            f"{v.get('ptr')} +{v.get('first_offset')} changed {v.get('changed_bytes')}" if v else "-",
            len(common.stale_launches(run.summary)) if run.summary else "-",
            f"{run.seconds:.1f}s",
        ])
    section.table(
        "stale write: y = full(7.0) after del x, then 1.0 written at x's elements 1024..2047",
        ["tool", "status", "y at x's address", "y corrupted", "violations", "violation at p", "stale launches", "time"],
        rows,
    )
    base = runs["baseline"].result or {}
    section.expect_rc(runs["baseline"])
    section.check("stale write reproduces by default (y gets x's address, 1024 elements corrupted)",
                  base.get("same_address") is True and base.get("corrupted") == 1024, str(base.get("corrupted")))
    log = runs["log"].result or {}
    section.info("stale write under log mode", f"same address {log.get('same_address')}, corrupted {log.get('corrupted')}")
    section.info("stale write with PYTORCH_NO_CUDA_MEMORY_CACHING=1 alone",
                 f"same address {(runs['nocache'].result or {}).get('same_address')}, "
                 f"corrupted {(runs['nocache'].result or {}).get('corrupted')}")
    for tool in ("isolate", "isolate-nolaunch"):
        run, r = runs[tool], runs[tool].result or {}
        section.expect_rc(run)
        section.check(f"{tool}: y intact", r.get("corrupted") == 0 if r else None,
                      f"corrupted {r.get('corrupted')}, y at x's address {r.get('same_address')}")
        v = violation_at(run, common.as_int(r.get("p")))
        section.check(f"{tool}: poison violation at p", v is not None,
                      f"p {r.get('p')}; violations {common.violations(run.summary)[:3]}")
        if v is not None:
            section.check(
                f"{tool}: violation first_offset 4096, changed_bytes 4096",
                common.as_int(v.get("first_offset")) == EXPECTED_FIRST_OFFSET
                and common.as_int(v.get("changed_bytes")) == EXPECTED_CHANGED,
                f"first_offset {v.get('first_offset')} changed_bytes {v.get('changed_bytes')} size {v.get('size')}",
            )
    return {t: {"result": r.result, "violations": common.violations(r.summary),
                "stale_launches": common.stale_launches(r.summary)} for t, r in runs.items()}


def record_stream(section, runs) -> dict:
    rows = []
    for tool, run in runs.items():
        r = run.result or {}
        rows.append([tool, run.status(), r.get("same_address", "-"), r.get("wrong", "-"),
                     len(common.violations(run.summary)) if run.summary else "-", f"{run.seconds:.1f}s"])
    section.table("missing record_stream: t freed on s2 while s1 still reads it; out should be 6.0",
                  ["tool", "status", "u at t's address", "wrong elements of out", "violations", "time"], rows)
    base = runs["baseline"].result or {}
    section.expect_rc(runs["baseline"])
    section.check("missing record_stream reproduces by default (wrong result)",
                  (base.get("wrong") or 0) > 0, f"wrong {base.get('wrong')}, same address {base.get('same_address')}")
    for tool in ("log", "nocache", "isolate-nolaunch"):
        r = runs[tool].result or {}
        section.info(f"missing record_stream under {tool}", f"wrong {r.get('wrong')}, error {r.get('error')}")
    iso = runs["isolate"].result or {}
    section.expect_rc(runs["isolate"])
    section.check("isolate: missing record_stream gives the right result", iso.get("wrong") == 0 if iso else None,
                  f"wrong {iso.get('wrong')}")
    return {t: r.result for t, r in runs.items()}


def training(suite, section) -> dict:
    bench = suite.bench(section)
    stats = benchstats.all_stats(bench)
    rows = []
    for model in suite.models:
        base, nocache, iso = (stats[(t, model)] for t in ("baseline", "nocache", "isolate"))
        for s in (base, nocache, iso):
            same, detail = benchstats.same_losses(s, base) if s is not base else (None, "")
            rows.append([
                model, s.tool, f"{s.runs}/{len(bench[(s.tool, model)])}", fmt(s.ms, ".3f"),
                fmt_ratio(ratio(s.ms, base.ms)), fmt_ratio(ratio(s.ms, nocache.ms)),
                fmt_bytes(s.device_delta), fmt_ratio(ratio(s.device_delta, base.device_delta)),
                fmt_bytes(s.reserved),
                fmt(benchstats.max_abs_diff(s.losses, base.losses), ".1e"),
                fmt(s.losses[-1] if s.losses else None, ".4f"),
                "-" if s.violations is None else s.violations,
                fmt_bytes(s.quarantine_peak),
            ])
        for s in (base, nocache, iso):
            if s.failed:
                section.check(f"{model}/{s.tool}: every benchmark run succeeded", False, "; ".join(s.failed))
        ok, detail = benchstats.same_losses(iso, base)
        section.check(f"{model}: isolate loss curve == baseline", ok, detail)
        ok, detail = benchstats.same_losses(nocache, base)
        section.check(f"{model}: no-caching loss curve == baseline", ok, detail)
        section.check(f"{model}: no poison violation in the isolate traces",
                      iso.violations == 0 if iso.violations is not None else None, f"{iso.violations}")
        section.check(f"{model}: no stale launch in the isolate traces (launch check on)",
                      iso.stale_launches == 0 if iso.stale_launches is not None else None, f"{iso.stale_launches}")
        section.check(f"{model}: isolate traces complete", iso.traces_complete, f"{iso.traces_complete}")
        r = ratio(iso.ms, nocache.ms)
        section.check(f"{model}: isolate step time <= 1.25x no caching", r <= 1.25 if r else None,
                      f"{fmt(r, '.3f')}x ({fmt(iso.ms, '.3f')} vs {fmt(nocache.ms, '.3f')} ms)", goal=True)
    section.table(
        f"training, {suite.warmup}+{suite.steps} steps, {suite.bench_rounds_done} interleaved rounds (medians)",
        ["model", "tool", "runs ok", "ms/step", "vs base", "vs nocache", "device mem", "vs base",
         "max reserved", "loss diff", "last loss", "violations", "quarantine peak"],
        rows,
    )
    return {f"{t}/{m}": vars(s) for (t, m), s in stats.items() if t in ("baseline", "nocache", "isolate")}
