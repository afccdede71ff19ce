"""How one run of a planted bug is judged: did the tool report it, and was the result right.

A tool *found* the bug when it reported something about the bug's memory: a poison violation
or a stale launch in the trace that touches the bug's target range, compute-sanitizer errors,
or a CUDA fault at the bad access (guard mode, memcheck). The result is *right* when the
program's own check passed (y intact, `out` correct); out-of-bounds writes have no such check.
"""

from __future__ import annotations

import dataclasses
import re

import common
from common import Run, Tool

FAULT_WORDS = ("illegal memory access", "illegal address", "ILLEGAL_ADDRESS", "unspecified launch failure",
               "misaligned address", "LAUNCH_FAILED")


def sanitizer_errors(text: str) -> int | None:
    """N from compute-sanitizer's "ERROR SUMMARY: N errors" (None when it printed none)."""
    found = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    return int(found[-1]) if found else None


def fault_of(run: Run) -> str | None:
    """The CUDA fault the program hit, if any (its caught error, or a crash)."""
    error = (run.result or {}).get("error")
    if error:
        return error
    if run.rc is not None and run.rc < 0:
        return f"killed by signal {-run.rc}"
    text = run.output()
    for word in FAULT_WORDS:
        if word.lower() in text.lower():
            return next(line for line in text.splitlines() if word.lower() in line.lower())[:300]
    return None


def is_illegal_address(text: str | None) -> bool:
    return bool(text) and any(w.lower() in text.lower() for w in FAULT_WORDS[:3])


@dataclasses.dataclass
class Verdict:
    found: bool | None  # None: the run itself went wrong, nothing to judge
    correct: bool | None  # None: not applicable (OOB) or the program did not get that far
    reports: list[str]
    seconds: float
    problem: str | None = None  # why there is no verdict

    def cell(self) -> str:
        """A table cell: 'FOUND, ok 3.1s', 'missed, wrong 2.9s', 'ERROR (rc=1)'."""
        if self.found is None:
            return f"ERROR ({self.problem})"
        text = "FOUND" if self.found else "missed"
        if self.correct is not None:
            text += ", ok" if self.correct else ", wrong"
        return f"{text} {self.seconds:.1f}s"


def judge(run: Run, tool: Tool) -> Verdict:
    result = run.result or {}
    if run.skipped:
        return Verdict(None, None, [], 0.0, run.skipped)
    if run.timed_out:
        return Verdict(None, None, [], run.seconds, "timeout")
    reports: list[str] = []
    target = common.as_int(result.get("target"))
    if tool.preload:
        if run.summary is None:
            return Verdict(None, None, [], run.seconds, f"no trace: {run.summary_error}")
        if target is not None:
            reports += common.hits_range(run.summary, target, int(result.get("target_bytes") or 1))
    if tool.sanitizer:
        errors = sanitizer_errors(run.output())
        if errors is None:
            return Verdict(None, None, [], run.seconds, "no ERROR SUMMARY")
        if errors:
            reports.append(f"memcheck: {errors} errors")
    fault = fault_of(run)
    if fault:
        reports.append(f"fault: {fault}")
    if not result and not fault:
        return Verdict(None, None, reports, run.seconds, f"{run.status()}, no RESULT")
    return Verdict(bool(reports), result.get("correct"), reports, run.seconds)
