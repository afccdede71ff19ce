"""A stand-in for tier_bench.py's worker (TIER_WORKER=tests/gpu/tier_bench_fake.py), with no
torch and no GPU, for the CI test of the benchmark's plumbing (tests/tests/gpu_scripts.rs).
Same arguments and result file as the real worker, and the same turn-taking under
--lockstep; a "step" sleeps FAKE_STEP_MS and appends "<config> <model> <step>" to FAKE_LOG,
the config being ISOLATE_MODE (or "default"). With FAKE_CUDART (the stand-in's libcudart), a
step also allocates and frees 1 MiB through it, so that a run with the library leaves a
trace for the benchmark's summary. FAKE_CRASH=<config>: that configuration's process dies in
its second timed step."""
import json
import os
import sys
import time

from tier_counters import library_counters, timed

args = sys.argv[1:]
if args[0] == "single":
    args = args[1:]
models, warmup, steps, outdir = args[0].split(","), int(args[1]), int(args[2]), args[3]
probe = args[4] == "1"
name = os.environ.get("ISOLATE_MODE", "default")
step_s = float(os.environ.get("FAKE_STEP_MS", "2")) / 1e3
turns = os.environ.get("TIER_TURNS")
if turns:
    go_fd, ready_fd, burst = (int(x) for x in turns.split(","))


cudart = None
if os.environ.get("FAKE_CUDART"):
    import ctypes
    cudart = ctypes.CDLL(os.environ["FAKE_CUDART"])


def cuda_step():
    p = ctypes.c_void_p()
    if cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)) != 0:
        sys.exit(5)
    if cudart.cudaFree(p) != 0:
        sys.exit(6)


def turn():
    os.write(ready_fd, b"r")
    if os.read(go_fd, 1) != b"g":
        sys.exit(4)


for model in models:
    times, res = [], {"model": model}
    events0 = None
    for i in range(warmup + steps):
        if turns and i >= warmup and (i - warmup) % burst == 0:
            turn()
            if probe and "bandwidth" not in res:
                res["bandwidth"] = 1e12
        if i == warmup:
            events0 = library_counters()
        if os.environ.get("FAKE_CRASH") == name and i == warmup + 1:
            os._exit(7)  # a configuration's process dying mid-run (FAKE_CRASH=<config>)
        t0 = time.perf_counter()
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(f"{name} {model} {i}\n")
        time.sleep(step_s)
        if cudart:
            cuda_step()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    events1 = library_counters()
    res.update(timed(events0, events1))
    if turns:
        turn()
    times.sort()
    res.update(ms_per_step=times[len(times) // 2], ms_steps=times, losses=["1.0"] * (warmup + steps),
               total_steps=warmup + steps, device_used_start=0, device_used_peak=None,
               max_memory_allocated=1 << 20)
    with open(os.path.join(outdir, f"result-{model}.json"), "w") as f:
        json.dump(res, f)
