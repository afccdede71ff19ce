#!/usr/bin/env python3
"""The table of tests/gpu/tier_bench.py, rendered from its JSON file as markdown (to paste into
docs/performance.md, "Tiers on real models"):

    python3 tests/gpu/tier_bench_table.py $OUT/tier_bench.json [more.json ...]

(several files: the rounds of several calls, see tier_bench.py --round-from, as one table.)

Per model and configuration: median ms/step over the rounds; the median of the per-round
ratios to the default's step in the same round, each round's listed; the floor, a step's share
of the bytes the library's exit notes say its poisons wrote and its checks read, over the
device's measured bandwidth, as ms and as the least ratio it allows (1 + floor / default step);
for the fast tier, full coverage's floor beside it; peak device memory (cudaMemGetInfo) and
torch.cuda.max_memory_allocated, medians; whether every loss equals the default's of the same
round bit for bit; findings summed over the rounds. Where the default ran twice a round
(`default-again`), a second, steadier view: each process's lower-decile step against the
geometric mean of the round's two defaults (`steady_rows`).
"""
import json
import math
import statistics
import sys

GIB = 1 << 30
ASSUMED_BANDWIDTH = 4.3e12


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _sd_log(ratios):
    """The standard deviation of the ratios' logarithms, or None under two."""
    return statistics.stdev(math.log(x) for x in ratios) if len(ratios) > 1 else None


def _gib(x):
    return None if x is None else x / GIB


def _bytes_per_step(r):
    """(written + read, 2 x freed) bytes a step from the run's device work, or None."""
    d = r.get("device_work")
    if not d or not d.get("frees"):
        return None
    steps = d.get("steps") or r.get("total_steps") or 1
    return ((d["written_bytes"] + d["read_bytes"]) / steps, 2 * d["freed_bytes"] / steps)


def _losses(r, base):
    if not r.get("losses") or not base or not base.get("losses"):
        return "–"
    for i, (a, b) in enumerate(zip(r["losses"], base["losses"])):
        if a != b:
            return f"differ at step {i} ({float(a):.6g} vs {float(b):.6g})"
    return "equal" if len(r["losses"]) == len(base["losses"]) else "shorter"


def rows(data):
    runs = [r for r in data["runs"] if r.get("ms_per_step")]
    bw = _median(data.get("bandwidth_samples") or []) or ASSUMED_BANDWIDTH
    out = []
    for model in data["models"]:
        base = {r["round"]: r for r in runs if r["model"] == model and r["config"] == "default"}
        base_ms = _median(r["ms_per_step"] for r in base.values())
        for cfg in data["configs"]:
            rs = [r for r in runs if r["model"] == model and r["config"] == cfg]
            if not rs:
                out.append({"model": model, "config": cfg, "missing": True})
                continue
            per = [r["ms_per_step"] / base[r["round"]]["ms_per_step"] for r in rs if r["round"] in base]
            bps = [b for b in (_bytes_per_step(r) for r in rs) if b]
            floor_ms = _median(b[0] / bw * 1e3 for b in bps) if bps else None
            full_ms = _median(b[1] / bw * 1e3 for b in bps) if bps else None
            losses = [_losses(r, base.get(r["round"])) for r in rs]
            finds = [r.get("findings") for r in rs]
            out.append({
                "model": model,
                "config": cfg,
                "ms_per_step": _median(r["ms_per_step"] for r in rs),
                "ratio": _median(per),
                "per_round": per,
                "floor_ms": floor_ms,
                "floor_ratio": (1 + floor_ms / base_ms) if floor_ms is not None and base_ms else None,
                "full_floor_ms": full_ms,
                "device_peak_gib": _gib(_median(r.get("device_used_peak") for r in rs)),
                # None where the allocator keeps no statistics (a pluggable one).
                "max_allocated_gib": _gib(_median(r.get("max_memory_allocated") for r in rs)),
                "losses": "equal" if cfg == "default" or all(x == "equal" for x in losses)
                else "; ".join(sorted(set(losses))),
                # A configuration with the library that left no trace ran without it (a
                # broken environment): said loudly, never counted as 0.
                "findings": "NO TRACE" if any(r.get("no_trace") for r in rs)
                else None if cfg == "default" or any(f is None for f in finds) else sum(finds),
                "rounds": len(rs),
                # The calls the library recorded a timed step (its C API's event count before
                # and after the timed steps; None without the library).
                "calls_per_step": _median(r["library_events_timed"] / data["steps"] for r in rs
                                          if r.get("library_events_timed") is not None
                                          and data.get("steps")),
                # The allocations the driver made a timed step (device allocations less those
                # the library's kept memory served); None without the counter.
                "driver_allocs_per_step": _median(
                    r["driver_allocs_timed"] / data["steps"] for r in rs
                    if r.get("driver_allocs_timed") is not None and data.get("steps")),
            })
    return out, bw


def render(data):
    table, bw = rows(data)
    measured = bool(data.get("bandwidth_samples"))
    lines = [
        f"{data.get('rounds')} interleaved rounds, {data.get('warmup')} warm-up + "
        f"{data.get('steps')} timed steps; bandwidth {bw / 1e12:.2f} TB/s "
        f"({'measured: a 1 GiB device copy' if measured else 'assumed, not measured'})"
        + ("; CUT SHORT by the time budget" if data.get("cut_short") else "")
        + (f"; devices: {', '.join(data['devices'])}" if data.get("devices") else "")
        + (f"; side by side in turns of {data['lockstep']} steps" if data.get("lockstep") else
           "; one configuration after another")
        + (f"; pinned to CPUs {data['pinned'][0]}-{data['pinned'][-1]}" if data.get("pinned") else ""),
        "",
        "| model | config | ms/step | × default (per round) | floor ms/step (× default) | "
        "full-coverage floor ms | device peak GiB | max allocated GiB | library calls a step | "
        "driver allocations a step | losses | findings |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    f2 = lambda x: "–" if x is None else f"{x:.2f}"
    for r in table:
        if r.get("missing"):
            lines.append(f"| {r['model']} | {r['config']} | no run | | | | | | | | | |")
            continue
        ratio = "1" if r["config"] == "default" else (
            f"**{r['ratio']:.3f}×** ({', '.join(f'{x:.2f}' for x in r['per_round'])})"
            if r["ratio"] else "–")
        floor = "–" if r["floor_ms"] is None else f"{r['floor_ms']:.2f} ({r['floor_ratio']:.3f}×)"
        full = "–" if r["config"] != "fast" or r["full_floor_ms"] is None else f"{r['full_floor_ms']:.2f}"
        finds = "–" if r["findings"] is None else str(r["findings"])
        calls = "–" if r["calls_per_step"] is None else f"{r['calls_per_step']:.1f}"
        driver = "–" if r["driver_allocs_per_step"] is None else f"{r['driver_allocs_per_step']:.1f}"
        lines.append(
            f"| {r['model']} | {r['config']} | {f2(r['ms_per_step'])} | {ratio} | {floor} | {full} | "
            f"{f2(r['device_peak_gib'])} | {f2(r['max_allocated_gib'])} | {calls} | {driver} | "
            f"{r['losses']} | {finds} |")
    noise = aa_noise(table)
    if noise:
        lines += ["", "The method's own noise: the default run again as configurations of their own "
                  "(`default-again`, `default-third`: PyTorch against itself), per model: the ratios "
                  "of every round, and the standard deviation of their logarithm (a configuration's "
                  "ratio from one process pair is good to about that; the median of n rounds to "
                  "about that over the square root of n).", "",
                  "| model | A/A ratios | SD of log |", "|---|---|---:|"]
        for m, ratios, sd in noise:
            lines.append(f"| {m} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                         f"{'–' if sd is None else f'{sd:.3f}'} |")
    steady = steady_rows(data)
    if steady:
        lines += ["", "A steadier view of the same runs: each process's lower-decile step (a host-bound "
                  "step is its own work plus the host's interruptions, which only add), against the "
                  "geometric mean of the round's two default processes (`default` and "
                  "`default-again`) instead of one: the median of the rounds, each round's listed; "
                  "the A/A row is `default-again` against `default` alone, with the SD of its log "
                  "for this estimator. Not the issue's measure (the median step against the "
                  "default's), a check of it.", "",
                  "| model | config | × defaults, lower decile (per round) |", "|---|---|---|"]
        for m, cfg, per, sd in steady:
            sd_note = "" if sd is None else f"; SD of log {sd:.3f}"
            lines.append(f"| {m} | {cfg} | **{_median(per):.3f}×** "
                         f"({', '.join(f'{x:.2f}' for x in per)}{sd_note}) |")
    ab = ab_rows(data)
    if ab:
        lines += ["", "The stream-order check inside one process (`isolate-ab`: isolate mode, the check "
                  "paused on every other timed step): median ms of the steps with it and without it, "
                  "and their ratio (the check's cost), per round.", "",
                  "| model | with the check ms | without ms | cost (per round) |", "|---|---:|---:|---|"]
        for m, on, off, per in ab:
            lines.append(f"| {m} | {on:.2f} | {off:.2f} | **{(_median(per) - 1) * 100:+.1f}%** "
                         f"({', '.join(f'{(x - 1) * 100:+.1f}%' for x in per)}) |")
    return "\n".join(lines)


def aa_noise(table):
    """(model, the A/A configurations' per-round ratios to the default, SD of their log or
    None under two) for the models that ran `default-again` or `default-third`, from the
    table's rows ([`rows`]: each row's per-round ratios)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in table):
        ratios = [x for r in table if r["model"] == model and not r.get("missing")
                  and r["config"] in ("default-again", "default-third") for x in r["per_round"]]
        if ratios:
            out.append((model, ratios, _sd_log(ratios)))
    return out


def lower_decile(xs):
    """The step below which a tenth of a process's timed steps fall (nearest rank)."""
    xs = sorted(xs)
    return xs[int(0.1 * (len(xs) - 1))] if xs else None


def steady_rows(data):
    """(model, config, per-round ratios, SD of their log for the A/A row else None) for the
    models that ran both `default` and `default-again`: each run's lower-decile step over the
    geometric mean of the two defaults' of its round; the A/A row, `default-again`'s over
    `default`'s."""
    out = []
    runs = [r for r in data["runs"] if r.get("ms_steps")]
    for model in data["models"]:
        step = {(r["config"], r["round"]): lower_decile(r["ms_steps"]) for r in runs
                if r["model"] == model}
        rounds = sorted({rnd for (cfg, rnd) in step if cfg == "default"
                         and ("default-again", rnd) in step})
        if not rounds:
            continue
        for cfg in data["configs"]:
            if cfg == "default":
                continue
            if cfg == "default-again":
                # The A/A row: one default process against the other (against their geometric
                # mean it would show half its own noise).
                per = [step[(cfg, rnd)] / step[("default", rnd)] for rnd in rounds]
                out.append((model, cfg, per, _sd_log(per)))
                continue
            per = [step[(cfg, rnd)] / math.sqrt(step[("default", rnd)] * step[("default-again", rnd)])
                   for rnd in rounds if (cfg, rnd) in step]
            if per:
                out.append((model, cfg, per, None))
    return out


def ab_rows(data):
    """(model, median ms with, median ms without, per-round ratios) of the isolate-ab runs."""
    out = []
    for model in data["models"]:
        rs = [r for r in data["runs"] if r["model"] == model and r.get("ab_ratio")]
        if rs:
            out.append((model, _median(r["ab_on_ms"] for r in rs), _median(r["ab_off_ms"] for r in rs),
                        [r["ab_ratio"] for r in rs]))
    return out


def merge(datas):
    """One benchmark from the files of several calls (each ran other rounds: tier_bench.py
    --round-from): their runs, bandwidth samples and devices together. A round's ratios are to
    its own default's, on its own device."""
    if len(datas) == 1:
        return datas[0]
    out = dict(datas[0])
    out["runs"] = [r for d in datas for r in d["runs"]]
    out["bandwidth_samples"] = [b for d in datas for b in d.get("bandwidth_samples") or []]
    out["rounds"] = len({r["round"] for r in out["runs"]})
    out["devices"] = [dev for d in datas for dev in d.get("devices") or []]
    out["cut_short"] = any(d.get("cut_short") for d in datas)
    for key in ("models", "configs"):
        out[key] = list(dict.fromkeys(x for d in datas for x in d[key]))
    out["command"] = " ; ".join(d.get("command", "") for d in datas)
    return out


if __name__ == "__main__":
    print(render(merge([json.load(open(p)) for p in sys.argv[1:]])))
