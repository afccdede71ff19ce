#!/usr/bin/env python3
"""What isolate mode adds per tensor, on the host, piece by piece (issue 14's breakdown).

    python3 tests/gpu/free_cost.py --lib target/gpu/libisolate.so [--rounds 3] [--pairs 20000]
        [--depth 30] [--thrash-kb 2048] [--configs native,none,backend-pool,fast,...] [--no-pieces]

Two parts, printed as tables:
  pieces  the driver calls a stream-ordered free costs the freeing thread in isolate mode,
          timed one by one through ctypes on a PyTorch stream (no preload): cuMemsetD8Async and
          cuMemsetD32Async of 1 MiB (the poison), cuEventRecord (the stream's mark), a launch
          of a 32-bit fill kernel of 1 MiB (the poison as a kernel of our own),
          cuFuncGetParamInfo (the launch check's layout look-ups), and a cuCtxGetCurrent as the
          floor of a ctypes call.
  pairs   `x = torch.empty(n); x.fill_(1); del x` in a loop on PyTorch's stream-ordered backend
          (what isolate mode sets up), sizes 4 KiB and 1 MiB alternating: us per tensor without
          the preload, in log mode, and in isolate mode with stacks off / launch check off /
          stacks on / the fill kernel as the poison (ISOLATE_TEST_POISON_BY=kernel); the fast
          tier with its stacks and without; and the lines under them (issue 31): `native`,
          PyTorch's caching allocator, and `backend-pool`, the backend with its calls answered
          from kept blocks (backend_pool.c, no library: PyTorch's bookkeeping without the
          driver's pool). --depth puts the loop that many Python frames deeper, as a model's
          modules do. --thrash-kb writes that many KiB of the program's own memory before each
          pair (every configuration alike), as a model's own work between two allocations
          evicts the library's data from the caches: the hooks then run cold, as in a real
          step, and the difference from a run without it is what the library's cache misses
          cost. Configurations interleaved, each round in a rotated order; medians. Each run
          also times its loop by chunks of CHUNK tensors and reports their lower decile: a
          second view in which a shared host's interruptions (which only add) weigh less.
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import common  # beside this script (a script's folder is on its import path)

FILL_PTX = b"""
.version 7.0
.target sm_52
.address_size 64
.visible .entry fill32(.param .u64 p, .param .u64 n, .param .u32 v)
{
    .reg .pred %q;
    .reg .b32 %r<6>;
    .reg .b64 %rd<7>;
    ld.param.u64 %rd1, [p];
    ld.param.u64 %rd2, [n];
    ld.param.u32 %r1, [v];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    cvt.u64.u32 %rd3, %r5;
    setp.ge.u64 %q, %rd3, %rd2;
    @%q bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    shl.b64 %rd5, %rd3, 2;
    add.s64 %rd6, %rd4, %rd5;
    st.global.u32 [%rd6], %r1;
DONE:
    ret;
}
\0"""

CONFIGS = {
    # PyTorch's caching allocator, no library (the default every tier is measured against).
    "native": {"_NATIVE": "1"},
    # The stream-ordered backend without the library.
    "none": {},
    # The backend with its cudaMallocAsync / cudaFreeAsync answered from kept blocks
    # (backend_pool.c, no library): PyTorch's bookkeeping without the driver's pool.
    "backend-pool": {"_PRELOAD": "backend_pool.so"},
    # The tiers as a user runs them (stacks as by default), and the fast tier without stacks.
    "fast": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast"},
    "fast-nostacks": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_STACKS": "none"},
    "fast-python": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_STACKS": "python"},
    # The fast tier without stacks, one part more taken away each (issue 31's decomposition, no
    # profile's clock reads): the stream-order check, the whole launch check, the device-memory
    # probe of the freeing path.
    "fast-noorder": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_STACKS": "none",
                     "ISOLATE_TEST_ORDER": "off"},
    "fast-nolaunch": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_STACKS": "none",
                      "ISOLATE_CHECK_LAUNCH": "off"},
    "fast-noprobe": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_STACKS": "none",
                     "ISOLATE_RESERVE": "0"},
    # Log mode with the default stacks: recording and stacks, no policy.
    "log-stacks": {"ISOLATE_MODE": "log"},
    "log": {"ISOLATE_MODE": "log", "ISOLATE_STACKS": "none"},
    "isolate": {"ISOLATE_MODE": "isolate", "ISOLATE_STACKS": "none"},
    "isolate-nolaunch": {"ISOLATE_MODE": "isolate", "ISOLATE_STACKS": "none",
                         "ISOLATE_CHECK_LAUNCH": "off"},
    "isolate-stacks": {"ISOLATE_MODE": "isolate", "ISOLATE_STACKS": "all"},
    "isolate-kernel": {"ISOLATE_MODE": "isolate", "ISOLATE_STACKS": "none", "ISOLATE_TEST_POISON_BY": "kernel"},
}


def pieces(n):
    import torch
    torch.cuda.init()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    ptr = ctypes.c_uint64(x.data_ptr())
    ev = ctypes.c_void_p()
    assert cu.cuEventCreate(ctypes.byref(ev), 2) == 0
    ctx = ctypes.c_void_p()
    size = 1 << 20
    # A real kernel handle (the library's own verification kernel) for cuFuncGetParamInfo,
    # which the launch check calls twice per launch to see that a cached layout still fits.
    ptx = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../interposer/src/policy/verify.ptx"), "rb").read() + b"\0"
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(ptx)) == 0
    assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"isolate_verify_many") == 0
    off, sz = ctypes.c_size_t(), ctypes.c_size_t()
    # The poison as a kernel of our own (one launch, 32-bit stores) against the driver's memset.
    fmod, fill = ctypes.c_void_p(), ctypes.c_void_p()
    have_fill = (cu.cuModuleLoadData(ctypes.byref(fmod), ctypes.c_char_p(FILL_PTX)) == 0 and
                 cu.cuModuleGetFunction(ctypes.byref(fill), fmod, b"fill32") == 0)
    fp, fn_words, fv = ctypes.c_uint64(x.data_ptr()), ctypes.c_uint64(size // 4), ctypes.c_uint32(0xFFFFFFFF)
    fargs = (ctypes.c_void_p * 3)(ctypes.cast(ctypes.byref(fp), ctypes.c_void_p),
                                  ctypes.cast(ctypes.byref(fn_words), ctypes.c_void_p),
                                  ctypes.cast(ctypes.byref(fv), ctypes.c_void_p))
    calls = {
        "cuCtxGetCurrent (ctypes floor)": lambda: cu.cuCtxGetCurrent(ctypes.byref(ctx)),
        "cuMemsetD8Async 1 MiB": lambda: cu.cuMemsetD8Async(ptr, 0xFF, ctypes.c_size_t(size), stream),
        "cuMemsetD32Async 1 MiB": lambda: cu.cuMemsetD32Async(ptr, 0xFFFFFFFF, ctypes.c_size_t(size // 4), stream),
        "cuEventRecord": lambda: cu.cuEventRecord(ev, stream),
        "cuLaunchKernel fill32 1 MiB (a poison kernel)": (lambda: cu.cuLaunchKernel(
            fill, (size // 4 + 255) // 256, 1, 1, 256, 1, 1, 0, stream, fargs, None)) if have_fill else None,
        "cuFuncGetParamInfo (last)": lambda: cu.cuFuncGetParamInfo(fn, ctypes.c_size_t(3), ctypes.byref(off), ctypes.byref(sz)),
        "cuFuncGetParamInfo (one past)": lambda: cu.cuFuncGetParamInfo(fn, ctypes.c_size_t(4), ctypes.byref(off), ctypes.byref(sz)),
    }
    out = {}
    for name, f in calls.items():
        if f is None:
            continue
        best = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(n):
                f()
            best.append((time.perf_counter_ns() - t0) / n / 1e3)
            torch.cuda.synchronize()
        out[name] = statistics.median(best)
    print("RESULT " + json.dumps(out))


def pairs(n, depth=0, thrash_kb=0):
    if depth > 0:
        # `depth` more Python frames under the loop, as a model's modules put under its
        # allocations (a stack's Python part costs by the frame).
        return pairs(n, depth - 1, thrash_kb)
    import torch
    junk = ctypes.create_string_buffer(thrash_kb << 10) if thrash_kb > 0 else None
    torch.cuda.init()
    sizes = [1024, 256 << 10]  # float32 elements: 4 KiB and 1 MiB
    for _ in range(200):
        x = torch.empty(sizes[0], device="cuda")
        x.fill_(1)
        del x
    torch.cuda.synchronize()
    # Timed by chunks too: on a shared host another tenant's work lands in some chunks and not
    # others, and only adds, so the chunks' lower decile is the process's own cost with less
    # of the host's (the same estimator as tier_bench's lower-decile step).
    chunk = max(1, min(CHUNK, n))
    marks = []
    t0 = time.perf_counter_ns()
    for i in range(n):
        if i % chunk == 0:
            marks.append(time.perf_counter_ns())
        if junk is not None:
            ctypes.memset(junk, i & 255, len(junk))
        x = torch.empty(sizes[i & 1], device="cuda")
        x.fill_(1)
        del x
    torch.cuda.synchronize()
    end = time.perf_counter_ns()
    print("RESULT " + json.dumps({"us_per_tensor": (end - t0) / n / 1e3,
                                  "us_per_tensor_p10": lower_decile_of_chunks(marks, chunk)}))


# Tensors a timed chunk of the pairs' loop (`pairs`).
CHUNK = 200


def lower_decile_of_chunks(marks, chunk):
    """The lower decile of the whole chunks' time a tensor, from the times each chunk began
    (`marks`, a chunk of `chunk` tensors each; the last, cut or not, is not counted: its end
    waits for the device). None with fewer than two whole chunks."""
    per = sorted((b - a) / chunk / 1e3 for a, b in zip(marks, marks[1:]))
    if len(per) < 2:
        return None
    return per[(len(per) - 1) // 10]


def config_env(env_add, base, lib, tmp):
    """The environment of a run of the configuration `env_add`: `base` without the variables a
    configuration sets, then the backend (but for `native`), and the library preloaded with its
    trace under `tmp` (but for the configurations without it), or the configuration's own
    preload (`backend-pool`)."""
    env = dict(base)
    for k in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
              "LD_PRELOAD", "ISOLATE_TRACE"):
        env.pop(k, None)
    env_add = env_add or {}
    if not env_add.get("_NATIVE"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    if env_add.get("_PRELOAD"):
        env["LD_PRELOAD"] = os.path.join(tmp, env_add["_PRELOAD"])
    elif any(not k.startswith("_") for k in env_add):
        env.update({k: v for k, v in env_add.items() if not k.startswith("_")})
        env["LD_PRELOAD"] = os.path.abspath(lib)
        env["ISOLATE_TRACE"] = os.path.join(tmp, "traces", "free-cost-%p.trace")
    return env


def run(mode, n, env_add, lib, tmp, depth=0, thrash_kb=0):
    env = config_env(env_add, os.environ, lib, tmp)
    p = subprocess.run([sys.executable, __file__, "--child", mode, "--pairs", str(n),
                        "--depth", str(depth), "--thrash-kb", str(thrash_kb)], env=env,
                       capture_output=True, text=True, timeout=300)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"FAILED {mode} {env_add}: rc={p.returncode}\n{p.stderr[-1500:]}")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="target/gpu/libisolate.so")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--child", default=None)
    ap.add_argument("--depth", type=int, default=0,
                    help="Python frames under the pairs' loop (a model's modules: ~20-40)")
    ap.add_argument("--thrash-kb", type=int, default=0,
                    help="KiB of the program's memory written before each pair (the caches cold)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="the pairs' configurations, comma-separated (default: all)")
    ap.add_argument("--no-pieces", action="store_true", help="the pairs only")
    ap.add_argument("--env", metavar="CONFIG",
                    help="print the variables CONFIG's pairs run with (as set by it) and stop")
    a = ap.parse_args()
    if a.env:
        if a.env not in CONFIGS:
            ap.error(f"--env: no configuration {a.env}; accepted: {', '.join(CONFIGS)}")
        env = config_env(CONFIGS[a.env], {}, a.lib, "TMP")
        for k in sorted(env):
            print(f"{k}={env[k]}")
        return 0
    if a.child == "pieces":
        return pieces(a.pairs)
    if a.child == "pairs":
        return pairs(a.pairs, a.depth, a.thrash_kb)
    tmp = os.path.join(os.environ.get("OUT", "/tmp"), "free_cost")
    # The traces are not kept (FREE_COST_KEEP=1 keeps them): the pairs' time is the result.
    os.makedirs(os.path.join(tmp, "traces"), exist_ok=True)
    names = a.configs.split(",")
    unknown = [k for k in names if k not in CONFIGS]
    if unknown:
        ap.error(f"--configs: no configuration {', '.join(unknown)}; accepted: {', '.join(CONFIGS)}")
    for so in {CONFIGS[k].get("_PRELOAD") for k in names} - {None}:
        common.preload_of(so, tmp)
    if not a.no_pieces:
        got = run("pieces", a.pairs, None, a.lib, tmp)
        print("driver calls on a PyTorch stream, us per call (median of 5 x %d, no preload)"
              % a.pairs)
        for k, v in (got or {}).items():
            print(f"  {k:34s} {v:7.2f}")
    per = {k: [] for k in names}
    low = {k: [] for k in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            res = run("pairs", a.pairs, CONFIGS[k], a.lib, tmp, a.depth, a.thrash_kb)
            if res:
                per[k].append(res["us_per_tensor"])
                if res.get("us_per_tensor_p10") is not None:
                    low[k].append(res["us_per_tensor_p10"])
    print(f"\nempty + fill_ + del, {a.depth} Python frames deeper, {a.thrash_kb} KiB written "
          f"before each, us per tensor "
          f"({a.pairs} tensors, {a.rounds} interleaved rounds; native: the caching allocator, "
          f"every other on backend:cudaMallocAsync; + against none, the backend alone)")
    base = statistics.median(per["none"]) if per.get("none") else None
    for k in names:
        if not per[k]:
            print(f"  {k:18s} FAILED")
            continue
        m = statistics.median(per[k])
        added = f"{m - base:+7.2f}" if base else ""
        print(f"  {k:18s} {m:7.2f}  {added}   rounds: {', '.join(f'{x:.2f}' for x in per[k])}")
    if any(low.values()):
        print(f"the same runs, each run's lower decile of its chunks of {CHUNK} tensors (the host's "
              f"interruptions only add; median of the rounds)")
        base_low = statistics.median(low["none"]) if low.get("none") else None
        for k in names:
            if not low[k]:
                continue
            m = statistics.median(low[k])
            added = f"{m - base_low:+7.2f}" if base_low else ""
            print(f"  {k:18s} {m:7.2f}  {added}   rounds: {', '.join(f'{x:.2f}' for x in low[k])}")
    if os.environ.get("FREE_COST_KEEP") != "1":
        shutil.rmtree(os.path.join(tmp, "traces"), ignore_errors=True)
    with open(os.path.join(tmp, f"pairs-depth{a.depth}-thrash{a.thrash_kb}.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "pairs": a.pairs, "depth": a.depth,
                   "thrash_kb": a.thrash_kb,
                   "rounds": a.rounds, "us_per_tensor": per, "chunk": CHUNK,
                   "us_per_tensor_p10": low}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main() or 0)
