#!/usr/bin/env python3
"""Planted stale writes on the GPU, for the detection table of isolation's tiers (issue 31): the
same sizes and blocks as the stand-in's tests/tests/tiers.rs (tests/programs/planted.c), written
through PyTorch's freed pointers under the library.

    python3 tests/gpu/planted_gpu.py --lib target/gpu/libisolate.so --isolate target/gpu/isolate \\
        [--trials 300] [--big 60] [--seed 31]

Three runs, each one process under the library in isolate mode: ISOLATE_CHECK=full, =fast, and
=fast with a 256 MiB quarantine (so that blocks leave it during the run and are checked on the
release stream by the fast tier's isolate_verify_sparse; in the other two every block is held
until exit and checked there, by the synchronous path). In each: for every write size (4 B, 64 B,
1 KiB, 4 KiB, 64 KiB, 1 MiB, 16 MiB), TRIALS tensors (BIG for 1 MiB and 16 MiB) of
max(1 MiB, 2 x size) bytes are made (torch.empty on PyTorch's stream-ordered backend, which
isolate mode sets), their pointer kept and the tensor dropped (cudaFreeAsync), then
cudaMemsetAsync(ptr + offset, 0x5A, size) on the same stream, the offset uniform in
[0, block - size] (random.Random(seed)); then 4 B, 64 B and 1 KiB writes in 64 KiB blocks.

Each finding (`poison_violations` of `isolate summary --json`, in the order the checks ran,
which is the order of the frees) is matched to its trial, and held against the pattern the tier
claims (docs/isolation.md, "The fast tier"): a trial is found exactly when its write overlaps a
byte of the pattern, at the overlap's first offset. Prints one table per run and PASS/FAIL lines;
writes $OUT/planted_gpu.json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import ctypes, json, random, sys
import torch
seed, trials, big, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
    try:
        rt = ctypes.CDLL(name)
        break
    except OSError:
        continue
rt.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
rt.cudaMemsetAsync.restype = ctypes.c_int
rng = random.Random(seed)
torch.zeros(1, device="cuda")
stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
plan = []
for size in (4, 64, 1 << 10, 4 << 10, 64 << 10, 1 << 20, 16 << 20):
    plan += [(size, max(1 << 20, 2 * size))] * (big if size >= 1 << 20 else trials)
for size in (4, 64, 1 << 10):
    plan += [(size, 64 << 10)] * trials
done, bad = [], 0
for size, block in plan:
    t = torch.empty(block, dtype=torch.uint8, device="cuda")
    ptr = t.data_ptr()
    del t  # cudaFreeAsync: the block is quarantined
    off = rng.randrange(0, block - size + 1)
    bad += rt.cudaMemsetAsync(ctypes.c_void_p(ptr + off), 0x5A, size, stream) != 0
    done.append((size, block, off, ptr))
torch.cuda.synchronize()
json.dump({"trials": done, "failed_calls": bad}, open(out, "w"))
'''

RUNS = [
    ("full", {"ISOLATE_CHECK": "full"}),
    ("fast", {"ISOLATE_CHECK": "fast"}),
    ("fast, 256 MiB quarantine", {"ISOLATE_CHECK": "fast", "ISOLATE_QUARANTINE": "256MiB"}),
]


def pattern(fast, n):
    """The fast tier's pattern of a block of n bytes (docs/isolation.md, "The fast tier")."""
    if not fast or n <= 64 << 10:
        return [(0, n)]
    count = ((n - 16) >> 12) + 1
    spans = [(k << 12, 16) for k in range(count)]
    tail = max(((count - 1) << 12) + 16, n - 16)
    if tail < n:
        spans.append((tail, n - tail))
    return spans


def overlap(spans, off, n):
    first, got = None, 0
    for a, m in spans:
        lo, hi = max(a, off), min(a + m, off + n)
        if lo < hi:
            first = lo if first is None else first
            got += hi - lo
    return None if first is None else (first, got)


def predicted(spans, block, n):
    hit, reach = 0, 0
    for a, m in spans:
        lo, hi = max(max(a + 1 - n, 0), reach), min(a + m, block - n + 1)
        if lo < hi:
            hit += hi - lo
            reach = hi
    return hit / (block - n + 1)


def human(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def one(args, name, env_add, work):
    d = tempfile.mkdtemp(dir=work)
    res = os.path.join(d, "trials.json")
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.lib), ISOLATE_MODE="isolate",
               ISOLATE_TRACE=os.path.join(d, "t-%p.trace"), **env_add)
    p = subprocess.run([sys.executable, os.path.join(work, "worker.py"), str(args.seed),
                        str(args.trials), str(args.big), res], env=env, capture_output=True,
                       text=True, timeout=180)
    traces = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".trace")]
    s = json.loads(subprocess.run([args.isolate, "summary", "--json"] + traces,
                                  capture_output=True, text=True).stdout or "null")
    fast = env_add.get("ISOLATE_CHECK") == "fast"
    out = {"run": name, "rc": p.returncode, "stderr_tail": p.stderr[-3000:]}
    if p.returncode != 0 or not os.path.exists(res) or s is None:
        out["error"] = "the run failed"
        return out
    trials = json.load(open(res))["trials"]
    found = s["poison_violations"]
    # In check order, which is free order (the quarantine is a FIFO): each finding belongs to
    # the next trial at its address whose write holds the finding's first offset (an address
    # comes back once its block left quarantine, so one address can be several trials').
    match, j, unmatched, wrong = {}, 0, 0, []
    for v in found:
        ptr = int(v["ptr"], 16) if isinstance(v["ptr"], str) else v["ptr"]
        k = j
        while k < len(trials) and not (trials[k][3] == ptr and
                                       trials[k][2] <= v["first_offset"] < trials[k][2] + trials[k][0]):
            k += 1
        if k == len(trials):
            unmatched += 1
            continue
        match[k] = (v["first_offset"], v["changed_bytes"])
        j = k + 1
    table = {}
    for i, (size, block, off, ptr) in enumerate(trials):
        spans = pattern(fast, block)
        want = overlap(spans, off, size)
        got = match.get(i)
        if (want is None) != (got is None) or (got and got != want):
            wrong.append({"trial": i, "size": size, "block": block, "offset": off,
                          "expected": want, "found": got})
        row = table.setdefault((size, block), [0, 0, predicted(spans, block, size)])
        row[0] += got is not None
        row[1] += 1
    out.update(rows=[[k[0], k[1], *v] for k, v in table.items()], unmatched=unmatched,
               wrong=wrong[:20], wrong_count=len(wrong), findings=s.get("findings"),
               device_work=s.get("device_work"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default="target/gpu/libisolate.so")
    ap.add_argument("--isolate", default="target/gpu/isolate")
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--big", type=int, default=60)
    ap.add_argument("--seed", type=int, default=31)
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", "/tmp/planted-gpu-out")
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="planted-")
    open(os.path.join(work, "worker.py"), "w").write(WORKER)
    results, ok = [], True
    for name, env_add in RUNS:
        r = one(args, name, env_add, work)
        results.append(r)
        print(f"\nISOLATE_CHECK={name}: planted stale writes at random offsets of freed blocks (GPU)")
        if "error" in r:
            print(f"FAIL {name}: {r['error']} (rc {r['rc']})\n{r['stderr_tail']}")
            ok = False
            continue
        print("| write | block | found | rate | predicted |")
        print("|---:|---:|---:|---:|---:|")
        for size, block, got, n, p in r["rows"]:
            print(f"| {human(size)} | {human(block)} | {got}/{n} | {100 * got / n:.1f}% | {100 * p:.1f}% |")
            if size >= 4096 and got / n < 0.99:
                ok = False
                print(f"FAIL {name}: {human(size)} writes found {got}/{n}")
        if r["wrong_count"] or r["unmatched"]:
            ok = False
            print(f"FAIL {name}: {r['wrong_count']} trials against the pattern, {r['unmatched']} "
                  f"findings of no trial: {r['wrong'][:3]}")
        else:
            print(f"PASS {name}: every trial found exactly where the pattern says")
    json.dump(results, open(os.path.join(out_dir, "planted_gpu.json"), "w"), indent=1)
    print("PASS planted" if ok else "FAIL planted")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
