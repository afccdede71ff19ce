"""Numbers out of the interleaved training benchmark (Suite.bench), per (tool, model)."""

from __future__ import annotations

import dataclasses

import common
from common import Run, median


@dataclasses.dataclass
class Stats:
    tool: str
    model: str
    runs: int = 0  # runs that finished with a RESULT
    failed: list[str] = dataclasses.field(default_factory=list)  # status of those that failed
    skipped: int = 0  # runs the time budget left out
    ms: float | None = None  # median over rounds of each run's median ms/step
    ms_rounds: list[float] = dataclasses.field(default_factory=list)
    device_delta: float | None = None  # median peak device memory in use, above the start
    device_peak: float | None = None  # the same, absolute
    reserved: float | None = None  # median torch.cuda.max_memory_reserved
    losses: list[float] | None = None  # first round's per-step losses
    loss_rounds: list[list[float]] = dataclasses.field(default_factory=list)
    trace_bytes_per_step: float | None = None
    snapshot_bytes_per_step: float | None = None
    dump_s: float | None = None
    violations: int | None = None  # summed over rounds (None: no trace read)
    stale_launches: int | None = None
    stale_values: int | None = None  # guard mode: pointers into unmapped memory never used
    traces_complete: bool | None = None
    quarantine_peak: float | None = None


def stats_of(tool: str, model: str, runs: list[Run]) -> Stats:
    s = Stats(tool, model)
    done = [r for r in runs if r.ok and r.result]
    s.failed = [f"{r.name}: {r.status()}" for r in runs if not (r.ok and r.result) and not r.skipped]
    s.skipped = sum(1 for r in runs if r.skipped)
    s.runs = len(done)
    if not done:
        return s
    res = [r.result for r in done]
    s.ms_rounds = [x["ms_per_step"] for x in res]
    s.ms = median(s.ms_rounds)
    s.device_delta = median(x.get("device_used_delta") for x in res)
    s.device_peak = median(x.get("device_used_peak") for x in res)
    s.reserved = median(x.get("max_memory_reserved") for x in res)
    s.loss_rounds = [x.get("losses") or [] for x in res]
    s.losses = s.loss_rounds[0]
    steps = res[0].get("total_steps") or 1
    if any(r.env_delta.get("LD_PRELOAD") for r in done):
        s.trace_bytes_per_step = median(r.trace_bytes / steps for r in done)
        summaries = [r.summary for r in done]
        if all(x is not None for x in summaries):
            s.violations = sum(common.violation_count(x) for x in summaries)
            s.stale_launches = sum(common.stale_launch_count(x) for x in summaries)
            s.stale_values = sum(int(x.get("stale_value_count") or 0) for x in summaries)
            s.traces_complete = all(bool(x.get("complete")) for x in summaries)
            s.quarantine_peak = median(((x.get("quarantine") or {}).get("peak_bytes")) for x in summaries)
    snaps = [x.get("snapshot") or {} for x in res]
    if any("bytes" in x for x in snaps):
        s.snapshot_bytes_per_step = median(x.get("bytes", 0) / steps for x in snaps if "bytes" in x)
        s.dump_s = median(x.get("dump_s") for x in snaps if "dump_s" in x)
    return s


def all_stats(bench: dict[tuple[str, str], list[Run]]) -> dict[tuple[str, str], Stats]:
    return {key: stats_of(key[0], key[1], runs) for key, runs in bench.items()}


def max_abs_diff(a: list[float] | None, b: list[float] | None) -> float | None:
    """Largest |a[i] - b[i]| over the common steps (None when either is missing)."""
    if not a or not b:
        return None
    return max(abs(x - y) for x, y in zip(a, b))


def own_spread(s: Stats) -> float | None:
    """How far a tool's loss curves differ between its own rounds (run-to-run noise)."""
    if len(s.loss_rounds) < 2:
        return None
    return max(max_abs_diff(s.loss_rounds[0], other) or 0.0 for other in s.loss_rounds[1:])


def same_losses(s: Stats, base: Stats) -> tuple[bool | None, str]:
    """The loss curve of `s` matches the baseline's: equal up to 1e-3 relative, or no further
    apart than the baseline's own rounds are."""
    diff = max_abs_diff(s.losses, base.losses)
    if diff is None:
        return None, "no losses"
    scale = max(1.0, max(abs(x) for x in base.losses))
    noise = own_spread(base) or 0.0
    ok = diff <= 1e-3 * scale or diff <= 1.5 * noise
    first = f"{s.losses[0]:.4f}/{base.losses[0]:.4f}"
    last = f"{s.losses[-1]:.4f}/{base.losses[-1]:.4f}"
    return ok, f"max |diff| {diff:.2e} (baseline's own spread {noise:.2e}); first {first}, last {last}"
