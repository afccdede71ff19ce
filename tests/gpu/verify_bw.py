#!/usr/bin/env python3
"""The release's verification kernels on the device: the same answers, and how fast they read.

    python3 tests/gpu/verify_bw.py

Loads interposer/src/policy/verify.ptx as the library does (cuModuleLoadData: the driver JITs
it), fills a 4 GiB buffer with the poison (0xFF), changes known bytes in it (aligned words,
single bytes, the last byte of odd-length tails), and checks batches of allocations with both
`isolate_verify_many` (32-bit loads) and `isolate_verify_many16` (128-bit loads, what the
asynchronous release launches when every allocation of a batch starts 16-byte aligned):
  1. both kernels must report, for every allocation, exactly the changed bytes and the first
     changed offset the host computes (FAIL otherwise, exit status 1);
  2. each kernel's read rate (GB/s, median of 5 timed launches with CUDA events) next to the
     driver's cuMemsetD8Async over the same bytes, for several batch shapes and grid widths.
"""
import ctypes
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PTX = open(os.path.join(HERE, "../../interposer/src/policy/verify.ptx"), "rb").read() + b"\0"
POISON = 0xFF


def main() -> int:
    torch.cuda.init()
    total = 4 << 30
    buf = torch.full((total,), POISON, dtype=torch.uint8, device="cuda")  # makes the context
    base = buf.data_ptr()
    cu = ctypes.CDLL("libcuda.so.1")
    mod = ctypes.c_void_p()
    assert cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX)) == 0, "PTX did not load"
    fns = {}
    for name in (b"isolate_verify_many", b"isolate_verify_many16"):
        f = ctypes.c_void_p()
        assert cu.cuModuleGetFunction(ctypes.byref(f), mod, name) == 0, name
        fns[name.decode()] = f
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def prepare(items):
        descs = torch.tensor([v for it in items for v in it], dtype=torch.int64, device="cuda")
        out = torch.tensor([v for _ in items for v in (0, -1)], dtype=torch.int64, device="cuda")
        return descs, out

    def launch(fn, items, bx, prepared=None):
        n = len(items)
        descs, out = prepared if prepared else prepare(items)
        d, c, pat, o = (ctypes.c_uint64(descs.data_ptr()), ctypes.c_uint32(n),
                        ctypes.c_uint32(0xFFFFFFFF), ctypes.c_uint64(out.data_ptr()))
        args = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in (d, c, pat, o)])
        r = cu.cuLaunchKernel(fns[fn], bx, n, 1, 256, 1, 1, 0, stream, args, None)
        assert r == 0, f"launch {fn}: {r}"
        return out, descs

    def grid(fn, items):
        longest = max(l for _, l in items)
        if fn == "isolate_verify_many":
            return min(max(-(-longest // 4 // 256), 1), 64)
        return min(max(-(-longest // (16 * 256 * 4)), 1), max(64, 16384 // len(items)))

    # 1. Correctness: a batch of allocations of awkward lengths, with known changes.
    failures = 0
    items, expect = [], []
    at = 0
    host_changes = []
    for i, length in enumerate([1, 15, 16, 17, 255, 4096 + 3, (1 << 20) + 7, 1 << 20, 3 << 24, 64 << 20]):
        at = (at + 255) // 256 * 256
        items.append((base + at, length))
        changes = []
        if i % 3 == 1:
            changes = [length - 1]
        elif i % 3 == 2 and length > 64:
            changes = [5, 6, 40, length // 2, length - 1]
        for c in changes:
            buf[at + c] = 0x00
        first = min(changes) if changes else -1
        expect.append((len(changes), first))
        at += length
    torch.cuda.synchronize()
    for fn in fns:
        for bx in (1, 7, grid(fn, items)):
            out, _ = launch(fn, items, bx)
            torch.cuda.synchronize()
            got = out.view(-1, 2).tolist()
            for (cnt, first), (gc, gf) in zip(expect, got):
                if gc != cnt or (cnt and gf != first):
                    failures += 1
                    print(f"FAIL {fn} bx={bx}: expected {cnt} changed from {first}, got {gc} from {gf}")
    print(f"correctness: {len(fns) * 3} launches x {len(items)} allocations, {failures} wrong")
    buf.fill_(POISON)
    torch.cuda.synchronize()

    # 2. Read rates.
    shapes = {
        "256 x 1 MiB": [(base + i * (1 << 20), 1 << 20) for i in range(256)],
        "256 x 8 MiB": [(base + i * (8 << 20), 8 << 20) for i in range(256)],
        "64 x 64 MiB": [(base + i * (64 << 20), 64 << 20) for i in range(64)],
        "4 x 1 GiB": [(base + i * (1 << 30), 1 << 30) for i in range(4)],
    }
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(f, nbytes):
        ts = []
        for _ in range(5):
            start.record()
            f()
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end) / 1e3)
        return nbytes / statistics.median(ts) / 1e9

    print(f"{'batch':<14}{'kernel':<24}{'grid x':>8}{'GB/s':>9}")
    for label, its in shapes.items():
        nbytes = sum(l for _, l in its)
        rate = timed(lambda: cu.cuMemsetD8Async(ctypes.c_uint64(base), POISON, ctypes.c_size_t(nbytes),
                                                stream), nbytes)
        print(f"{label:<14}{'cuMemsetD8Async (write)':<24}{'-':>8}{rate:9.0f}")
        for fn in fns:
            for bx in sorted({grid(fn, its), 64, 256}):
                prepared = prepare(its)
                rate = timed(lambda: launch(fn, its, bx, prepared), nbytes)
                bad = sum(int(x[0]) for x in prepared[1].view(-1, 2).tolist())
                if bad:
                    failures += 1
                    print(f"FAIL {fn}: {bad} changed bytes reported on an untouched poison")
                print(f"{label:<14}{fn:<24}{bx:>8}{rate:9.0f}")
    print("verify_bw: " + ("PASS" if failures == 0 else f"FAIL ({failures})"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
