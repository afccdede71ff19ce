"""Section `guard`: guard mode (ISOLATE_GUARD=on) and the stale-pointer check at kernel launch.

1. The stale write under guard mode must fault (illegal address) at that kernel; the trace's
   summary has `last_events`, and `isolate who <p>` names the allocation.
2. bug_oob.py writes element n of an n-element tensor: guard mode must fault, for a size that is
   not a multiple of 2 MiB and one that is (and, for information, a 4,000-byte one).
3. The launch check: the stale pointer handed to a CuPy and a Triton kernel shows in
   `stale_launches` under that kernel's name; with ISOLATE_CHECK_LAUNCH=off it does not; real
   training (LM, ResNet-18) under isolation reports no stale launch at all.
4. Cost, interleaved: isolation with the launch check off / on and guard mode against the
   baseline, step time and device memory.
"""

from __future__ import annotations

import benchstats
import common
from common import fmt, fmt_bytes, fmt_ratio, ratio
from judge import fault_of, is_illegal_address

OOB_SIZES = ("oob-4000000", "oob-2MiB", "oob-4000")
OOB_MUST_FAULT = ("oob-4000000", "oob-2MiB")


def run(suite, section) -> dict:
    section.check("libisolate.so present", common.LIB.exists(), str(common.LIB))
    keys = [("stale", "guard"), ("stale", "isolate"), ("stale", "isolate-nolaunch"), ("stale-triton", "isolate")]
    keys += [(oob, tool) for oob in OOB_SIZES for tool in ("baseline", "guard")]
    jobs = suite.jobs(section, keys)
    suite.keep_traces(jobs.values())
    return {
        "stale_guard": stale_under_guard(suite, section, jobs[("stale", "guard")]),
        "oob": out_of_bounds(section, jobs),
        "launch_check": launch_check(section, jobs),
        "cost": cost(suite, section),
    }


def stale_under_guard(suite, section, run) -> dict:
    r = run.result or {}
    fault = fault_of(run)
    section.table("stale write under guard mode", ["status", "p", "error / fault", "time"],
                  [[run.status(), r.get("p", "-"), (fault or "none")[:120], f"{run.seconds:.1f}s"]])
    section.check("guard: the stale write faults with an illegal address", is_illegal_address(fault),
                  f"{run.status()}: {fault}")
    section.check("guard: the stale write's trace was read back", run.summary is not None, run.summary_error or "")
    last = (run.summary or {}).get("last_events")
    section.check("guard: summary shows last_events", bool(last), f"{common.count_of(last)} entries")
    section.log(f"last_events: {last}")
    # The fault names its kernel: the stale value handed to stale_fill became a stale launch.
    fault_lines = [l for l in run.stderr.splitlines() if "DEVICE FAULT" in l or "suspect:" in l]
    section.log("stderr fault lines: " + " | ".join(fault_lines))
    section.check("guard: stderr says DEVICE FAULT once, with error 700",
                  sum("DEVICE FAULT" in l for l in fault_lines) == 1 and "700" in "".join(fault_lines),
                  " | ".join(fault_lines)[:300])
    section.check("guard: stderr names stale_fill as the suspect",
                  any("suspect: kernel stale_fill" in l for l in fault_lines), " | ".join(fault_lines)[:300])
    launches = common.stale_launches(run.summary)
    faulted = [s for s in launches if "stale_fill" in str(s.get("kernel")) and s.get("fault") == 700]
    section.check("guard: summary's stale_launches has stale_fill with fault 700", bool(faulted),
                  f"{launches[:2]}; device_faults {(run.summary or {}).get('device_faults')}"[:300])
    p = r.get("p")
    if not p or not run.traces:
        section.check("isolate who <p> names the allocation", None, "no pointer or no trace")
        return {"result": r, "fault": fault}
    text = suite.run(section, "guard/who", [str(common.CLI), "who", p, *run.traces], {}, 60)
    section.check("isolate who <p> exits 0 (3: trace cut short)", text.rc in common.CLI_OK, text.status())
    who, error = common.analyzer(["who", p, "--json", *run.traces], timeout_s=60)
    section.log(f"isolate who --json: {who if who is not None else error}")
    p_int, nbytes = common.as_int(p), r.get("nbytes")
    occupants = [o for t in (who or {}).get("traces", []) for o in t.get("history", [])]
    named = [o for o in occupants if common.as_int(o.get("ptr")) == p_int and o.get("size") == nbytes]
    section.check(
        "isolate who <p> names the allocation (ptr p, 4 MiB)",
        bool(named) if who is not None else None,
        f"{len(occupants)} allocations covered p; first: {occupants[:1] or error}"[:300],
    )
    return {"result": r, "fault": fault, "who": text.stdout[:2000], "who_json": who, "last_events": last}


def out_of_bounds(section, jobs) -> dict:
    rows, out = [], {}
    for size in OOB_SIZES:
        base, guard = jobs[(size, "baseline")], jobs[(size, "guard")]
        r = guard.result or base.result or {}
        fb, fg = fault_of(base), fault_of(guard)
        rows.append([size, r.get("nbytes", "-"), r.get("multiple_of_2mib", "-"),
                     (fb or "silent")[:60], (fg or "silent")[:60], f"{guard.seconds:.1f}s"])
        section.expect_rc(base)
        if size in OOB_MUST_FAULT:
            section.check(f"guard: {size} write one past the end faults", is_illegal_address(fg), f"{guard.status()}: {fg}")
        else:
            section.info(f"guard: {size} write one past the end (alignment slack may hide it)", f"{guard.status()}: {fg}")
        out[size] = {"baseline": base.result, "guard": guard.result, "guard_fault": fg}
    section.table("write one element past the end of a tensor", ["case", "bytes", "2 MiB multiple",
                  "default", "guard mode", "guard time"], rows)
    return out


def launch_check(section, jobs) -> dict:
    rows, out = [], {}
    cases = [
        ("stale", "isolate", "stale_fill", True),
        ("stale-triton", "isolate", "stale_fill_triton", True),
        ("stale", "isolate-nolaunch", "stale_fill", False),
    ]
    for bug, tool, kernel, expected in cases:
        run = jobs[(bug, tool)]
        r = run.result or {}
        p = common.as_int(r.get("p"))
        launches = common.stale_launches(run.summary)
        match = [s for s in launches if kernel in str(s.get("kernel", "")) and common.as_int(s.get("ptr")) == p]
        rows.append([f"{bug} ({tool})", run.status(), len(launches),
                     "; ".join(f"{s.get('kernel')} @{s.get('param_offset')} {s.get('ptr')}" for s in launches[:2]) or "-"])
        section.expect_rc(run)
        if expected:
            section.check(f"launch check names {kernel} with ptr p ({bug}, {tool})", bool(match),
                          f"p {r.get('p')}; stale_launches {launches[:3]}")
            if match:
                section.check(f"launch check: {kernel} pointer is parameter 0 (param_offset 0)",
                              common.as_int(match[0].get("param_offset")) == 0, f"{match[0].get('param_offset')}")
        else:
            section.check("ISOLATE_CHECK_LAUNCH=off reports no stale launch", run.summary is not None and not launches,
                          f"{len(launches)} stale launches")
        out[f"{bug}/{tool}"] = launches
    section.table("stale pointer passed to a kernel", ["case", "status", "stale launches", "first entries"], rows)
    return out


def cost(suite, section) -> dict:
    bench = suite.bench(section)
    stats = benchstats.all_stats(bench)
    tools = ("baseline", "isolate-nolaunch", "isolate", "guard")
    rows = []
    for model in suite.models:
        base = stats[("baseline", model)]
        for tool in tools:
            s = stats[(tool, model)]
            rows.append([model, tool, f"{s.runs}/{len(bench[(tool, model)])}", fmt(s.ms, ".3f"),
                         fmt_ratio(ratio(s.ms, base.ms)), fmt_bytes(s.device_peak), fmt_bytes(s.device_delta),
                         fmt_ratio(ratio(s.device_delta, base.device_delta)),
                         "-" if s.stale_launches is None else s.stale_launches,
                         "-" if s.stale_values is None else s.stale_values,
                         "-" if s.violations is None else s.violations])
            if s.failed:
                section.check(f"{model}/{tool}: every benchmark run succeeded", False, "; ".join(s.failed))
        for tool in ("isolate", "guard"):
            s = stats[(tool, model)]
            section.check(f"{model}: zero stale launches in training under {tool} (no false reports)",
                          s.stale_launches == 0 if s.stale_launches is not None else None, f"{s.stale_launches}")
            section.check(f"{model}: no poison violation in training under {tool}",
                          s.violations == 0 if s.violations is not None else None, f"{s.violations}")
            # Reported, not checked: guard mode's right-aligned addresses may be less aligned than
            # cudaMalloc's, and libraries may pick other kernels for them.
            ok, detail = benchstats.same_losses(s, base)
            section.info(f"{model}: {tool} loss curve == baseline: {ok}", detail)
    section.table(
        f"cost of isolation, launch check and guard mode, {suite.warmup}+{suite.steps} steps, "
        f"{suite.bench_rounds_done} interleaved rounds (medians)",
        ["model", "tool", "runs ok", "ms/step", "vs base", "device peak", "above start", "vs base",
         "stale launches", "stale values", "violations"],
        rows,
    )
    return {f"{t}/{m}": vars(s) for (t, m), s in stats.items() if t in tools}
