#!/usr/bin/env python3
"""Measures a memory snapshot pickle, for tests/gpu/memviz_size.sh.

    python3 tests/gpu/memviz_size.py PICKLE

One JSON line: the pickle's bytes, its `device_traces` entries, how many are `alloc`, its
segments, the frames its entries carry in all and the distinct frames, and the bytes of
`pickle.dumps` of what `pickle.load` gave (what `_memory_viz trace_plot` embeds in its page, in
base64). Needs no torch.
"""

import argparse
import json
import pickle
import sys


def measure(a):
    with open(a.pickle, "rb") as f:
        raw = f.read()
    s = pickle.loads(raw)
    entries = allocs = frames_total = 0
    distinct = set()
    for dev in s.get("device_traces", []):
        for e in dev:
            entries += 1
            allocs += e.get("action") == "alloc"
            fs = e.get("frames", [])
            frames_total += len(fs)
            for f in fs:
                distinct.add((f["filename"], f["line"], f["name"]))
    for seg in s.get("segments", []):
        for f in seg.get("frames", []):
            distinct.add((f["filename"], f["line"], f["name"]))
    print(json.dumps({
        "bytes": len(raw),
        "entries": entries,
        "allocs": allocs,
        "segments": len(s.get("segments", [])),
        "frames_in_entries": frames_total,
        "distinct_frames": len(distinct),
        "dumps_bytes": len(pickle.dumps(s)),
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pickle")
    measure(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
