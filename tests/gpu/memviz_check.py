#!/usr/bin/env python3
"""Checks `isolate export --format memory-viz` against PyTorch's own `torch.cuda._memory_viz`.

    python3 tests/gpu/memviz_check.py ISOLATE TRACE [--out DIR] [--max-events N]

Exports TRACE with the `isolate` binary ISOLATE, loads the pickle with `pickle`, runs
`python -m torch.cuda._memory_viz trace_plot` (also `-s`), `segment_plot`, `stats` and `trace`
on it, calls `memory()` and `segments()` in-process (their command-line forms download
flamegraph.pl, which a machine without a network cannot), and compares the figures the
snapshot gives (allocations, peak, held at end; `stats`' segments and total_reserved) with
`isolate summary --json` of the same trace. Prints one PASS or FAIL line a check and
`N passed, M failed`; exits 1 on a failure. Needs PyTorch (no GPU: the plots are HTML written
from the pickle).
"""

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def replay(snap):
    """Figures of the snapshot, as the viewer's Active Memory Timeline takes them."""
    merged = []
    for dev, entries in enumerate(snap["device_traces"]):
        for i, e in enumerate(entries):
            merged.append((e.get("time_us", 0), dev, i, e))
    merged.sort(key=lambda x: (x[0], x[1], x[2]))
    live, delta, top, initial, allocs = {}, 0, 0, 0, 0
    for _, dev, _, e in merged:
        if e["action"] == "alloc":
            allocs += 1
            live[(dev, e["addr"])] = e["size"]
            delta += e["size"]
            top = max(top, delta)
        elif e["action"] == "free_completed":
            size = live.pop((dev, e["addr"]), None)
            if size is None:
                size = e["size"]
                initial += size
            delta -= size
    at_end = {(s["device"], s["address"]): s["total_size"] for s in snap["segments"]}
    initial += sum(v for k, v in at_end.items() if k not in live)
    return {
        "allocations": allocs,
        "peak": initial + top,
        "initial": initial,
        "held": len(snap["segments"]),
        "held_bytes": sum(s["total_size"] for s in snap["segments"]),
        "entries": sum(len(t) for t in snap["device_traces"]),
        "consistent": all(at_end.get(k) == v for k, v in live.items()),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("isolate", help="the isolate binary")
    ap.add_argument("trace", help="a trace file")
    ap.add_argument("--out", help="directory for the pickle and the plots (default: a temporary one)")
    ap.add_argument("--max-events", type=int, help="passed to isolate export")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="memviz-")
    os.makedirs(out, exist_ok=True)
    snap_path = os.path.join(out, "snap.pickle")

    s = subprocess.run([a.isolate, "summary", "--json", a.trace], capture_output=True, text=True)
    if not check("isolate summary --json", s.returncode in (0, 3), s.stderr.strip()):
        return
    summary = json.loads(s.stdout)

    cmd = [a.isolate, "export", "--format", "memory-viz", a.trace, "-o", snap_path]
    if a.max_events is not None:
        cmd += ["--max-events", str(a.max_events)]
    x = subprocess.run(cmd, capture_output=True, text=True)
    print(x.stderr.strip())
    if not check("isolate export --format memory-viz", x.returncode in (0, 3), x.stderr.strip()):
        return
    dropped = "older entries dropped" in x.stderr

    try:
        with open(snap_path, "rb") as f:
            snap = pickle.load(f)
        check("pickle.load", isinstance(snap, dict) and "segments" in snap and "device_traces" in snap)
    except Exception as e:  # noqa: BLE001
        check("pickle.load", False, repr(e))
        return

    r = replay(snap)
    print(f"snapshot: {json.dumps(r)}")
    print(
        "summary: "
        + json.dumps(
            {
                "allocations": summary["allocations"],
                "peak_live_bytes": summary["peak_live_bytes"],
                "live_at_end": summary["live_at_end"],
            }
        )
    )
    check("history consistent with the segments at the end", r["consistent"])
    check(
        "held at end = summary live_at_end",
        (r["held"], r["held_bytes"]) == (summary["live_at_end"]["count"], summary["live_at_end"]["bytes"]),
        f"{r['held']} / {r['held_bytes']} vs {summary['live_at_end']}",
    )
    if dropped:
        print("note: older entries were dropped: allocations and peak cover the kept window only")
        check("peak of the kept window <= summary peak", r["peak"] <= summary["peak_live_bytes"])
    else:
        check("allocations = summary allocations", r["allocations"] == summary["allocations"],
              f"{r['allocations']} vs {summary['allocations']}")
        check("peak = summary peak_live_bytes", r["peak"] == summary["peak_live_bytes"],
              f"{r['peak']} vs {summary['peak_live_bytes']}")

    try:
        import torch  # noqa: F401
        from torch.cuda import _memory_viz as mv
    except Exception as e:  # noqa: BLE001
        check("import torch.cuda._memory_viz", False, repr(e))
        return
    print(f"torch {torch.__version__}")

    def cli(name, *args, output=None):
        argv = [sys.executable, "-m", "torch.cuda._memory_viz", *args, snap_path]
        if output:
            argv += ["-o", os.path.join(out, output)]
        p = subprocess.run(argv, capture_output=True, text=True)
        ok = p.returncode == 0
        if ok and output:
            path = os.path.join(out, output)
            ok = os.path.exists(path) and os.path.getsize(path) > 0
            if ok and output.endswith(".html"):
                with open(path) as f:
                    ok = "snapshot.pickle" in f.read()
        check(name, ok, (p.stderr or "").strip()[-2000:])
        return p.stdout

    cli("_memory_viz trace_plot", "trace_plot", output="trace_plot.html")
    cli("_memory_viz trace_plot -s", "trace_plot", "-s", output="trace_plot_segments.html")
    cli("_memory_viz segment_plot", "segment_plot", output="segment_plot.html")
    stats = cli("_memory_viz stats", "stats")
    lines = {l.split(":")[0]: l.split(":", 1)[1].strip() for l in stats.splitlines() if ":" in l}
    check("stats: segments = held at end", lines.get("segments") == str(r["held"]), lines.get("segments", "?"))
    want = repr(mv.Bytes(summary["live_at_end"]["bytes"]))
    check("stats: total_reserved = summary live_at_end bytes", lines.get("total_reserved") == want,
          f"{lines.get('total_reserved')} vs {want}")
    check("stats: total_allocated = summary live_at_end bytes", lines.get("total_allocated") == want,
          f"{lines.get('total_allocated')} vs {want}")
    cli("_memory_viz trace", "trace")

    for name in ("memory", "segments"):
        try:
            folded = getattr(mv, name)(snap, format_flamegraph=lambda lines: lines)
            total = sum(int(l.rsplit(" ", 1)[1]) for l in folded.splitlines() if l.strip())
            check(f"_memory_viz.{name} (flamegraph lines) sum = held at end bytes",
                  total == summary["live_at_end"]["bytes"], f"{total}")
        except Exception as e:  # noqa: BLE001
            check(f"_memory_viz.{name}", False, repr(e))


if __name__ == "__main__":
    main()
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
