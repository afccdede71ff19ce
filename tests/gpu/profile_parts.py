#!/usr/bin/env python3
"""The profile's parts per tensor, side by side, from the exit notes of runs with
ISOLATE_PROFILE=on (tier_bench's `-prof` configurations): on a shared host whose step times
spread more than a change moves them, these are what compares two builds (each part is timed
on the calling threads, inflated alike by the profile's own clock reads).

    python3 tests/gpu/profile_parts.py tier_bench-logs.tgz        (or log files)

Columns: each run (configuration, round, model, by its log's name `CONFIG-rR-MODEL.log`); rows:
the library's part of the hooks a tensor (allocations, frees and launches, against the
allocations' count), then each part's total time over the allocations' count, in µs.
"""
import io
import re
import sys
import tarfile

HOOKS = re.compile(r"(allocations|frees|launches) (\d+), ([\d.]+) us each \(([\d.]+) in the real "
                   r"function, ([\d.]+) the library's\)")
PART = re.compile(r"(?:: |; )([a-z][A-Za-z' ,\-]+?) (\d+), ([\d.]+) us each \(([\d.]+) ms")
NAME = re.compile(r"(?:^|/)([A-Za-z0-9_.\-]+?)-r(\d+)-([A-Za-z0-9_]+)\.log$")


def parse(text):
    """(hooks, parts) of one run's log: hooks {kind: (calls, library us each)}, parts
    {name: (calls, total ms)}; None where the log has no profile."""
    hooks_line = next((l for l in text.splitlines() if "hooks' time on the calling threads" in l), None)
    parts_line = next((l for l in text.splitlines() if "hooks' own time by part" in l), None)
    if hooks_line is None or parts_line is None:
        return None
    hooks = {m.group(1): (int(m.group(2)), float(m.group(5))) for m in HOOKS.finditer(hooks_line)}
    parts = {m.group(1): (int(m.group(2)), float(m.group(4))) for m in PART.finditer(parts_line)}
    return hooks, parts


def logs(paths):
    """(name, text) of every log in `paths` (files, or .tgz archives of them)."""
    for p in paths:
        if p.endswith((".tgz", ".tar.gz")):
            with tarfile.open(p) as t:
                for m in t.getmembers():
                    if m.isfile() and m.name.endswith(".log"):
                        yield m.name, t.extractfile(m).read().decode("utf-8", "replace")
        else:
            with open(p, encoding="utf-8", errors="replace") as f:
                yield p, f.read()


def table(paths):
    runs = []
    for name, text in logs(paths):
        m = NAME.search(name)
        got = parse(text)
        if m and got:
            runs.append(((m.group(1), int(m.group(2)), m.group(3)), got))
    if not runs:
        return "no run with a profile (ISOLATE_PROFILE=on) among the logs"
    runs.sort(key=lambda r: (r[0][2], r[0][0], r[0][1]))
    head = ["µs a tensor"] + [f"{c} r{r} {m}" for (c, r, m), _ in runs]
    rows = []
    lib = []
    for _, (hooks, _) in runs:
        n = hooks.get("allocations", (0, 0))[0]
        total = sum(c * each for c, each in hooks.values())
        lib.append(f"{total / n:.2f}" if n else "-")
    rows.append(["**the library's part of the hooks**"] + lib)
    names = []
    for _, (_, parts) in runs:
        for k in parts:
            if k not in names:
                names.append(k)
    for k in names:
        row = [k]
        for _, (hooks, parts) in runs:
            n = hooks.get("allocations", (0, 0))[0]
            row.append(f"{parts[k][1] * 1000 / n:.2f}" if k in parts and n else "-")
        rows.append(row)
    out = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(table(sys.argv[1:]))
