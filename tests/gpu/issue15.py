#!/usr/bin/env python3
"""Issue 15 on a real GPU: NVTX ranges, CuPy's pool, JAX's allocator and NCCL under isolate.

    python3 tests/gpu/issue15.py [--lib target/release/libisolate.so]
                                 [--isolate target/release/isolate] [--out DIR] [--only a,b,c,d]

(or LIB=… ISOLATE=… OUT=… python3 tests/gpu/issue15.py). Four cases, each in its own
subprocesses under `isolate run` with its own timeout; a case that fails, times out or cannot
import its framework does not stop the others (a missing framework is SKIP). Each prints one
line, `PASS`/`FAIL`/`SKIP <case>: numbers`, and writes its logs and traces under
OUT/issue15/<case>/:

a  nvtx   a small torchvision (else MLP) training loop with `torch.cuda.nvtx.range("step i")`,
          `"forward"`/`"backward"` inside, and one step under `emit_nvtx()`, run by
          `isolate run --mode log` (which sets NVTX_INJECTION64_PATH): `isolate summary --json`
          lists every step as a region, forward/backward with a peak > 0, and `aten::` regions
          from emit_nvtx.
b  cupy   a CuPy stale write with CuPy's pool on by default (nothing switched off by the
          program): x allocated and freed, y allocated, x's old pointer written through by a
          RawKernel. Under isolate mode the wheel's start-up hook (python/cuda_isolate.pth,
          processed with site.addsitedir as at start-up) switches the pool off: y is intact and
          the summary has a stale write (and the launch check names `stale_fill`). Log mode is
          the control (pool on: y gets x's address and is corrupted).
c  jax    JAX in isolate mode with XLA_PYTHON_CLIENT_ALLOCATOR unset by the user: the library
          sets it to `platform` (stderr line), the trace holds one allocation and one free per
          array (>= 20 of each for 20 arrays made and dropped), and a small computation is right.
d  nccl   a single-rank NCCL all-reduce (torch.distributed, backend nccl, world size 1) under
          log and isolate mode: completes, the result is right, and the trace holds NCCL's own
          driver allocations (cuMem* calls).

Total well under 4 minutes on an H200 (each case has its own timeout: --timeout, 150 s by
default for the whole case). Exit status 0 when no case failed, 1 otherwise.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# ---- the child programs (written to files, run under `isolate run`) ----

NVTX_CHILD = r'''
import sys, time
import torch
import torch.nn as nn
steps = int(sys.argv[1])
torch.manual_seed(0)
try:
    import torchvision
    model = torchvision.models.resnet18(weights=None, num_classes=10).cuda()
    make = lambda: (torch.randn(16, 3, 64, 64, device="cuda"), torch.randint(0, 10, (16,), device="cuda"))
    kind = "resnet18"
except Exception:
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    make = lambda: (torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda"))
    kind = "mlp"
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
for i in range(steps):
    with torch.cuda.nvtx.range(f"step {i}"):
        x, y = make()
        with torch.cuda.nvtx.range("forward"):
            loss = loss_fn(model(x), y)
        with torch.cuda.nvtx.range("backward"):
            opt.zero_grad()
            loss.backward()
        opt.step()
with torch.autograd.profiler.emit_nvtx():
    x, y = make()
    loss_fn(model(x), y).backward()
torch.cuda.synchronize()
torch.cuda.nvtx.mark("done")
print("MODEL", kind, "LOSS", float(loss))
'''

CUPY_CHILD = r'''
import os, site, sys
# What the installed wheel's .pth does at start-up (a no-op if the wheel is installed: install()
# is idempotent).
site.addsitedir(sys.argv[1])
import cupy, numpy
N = 2**20
FILL = r"""extern "C" __global__ void stale_fill(float *p, int begin, int end, float v) {
    int i = begin + blockIdx.x * blockDim.x + threadIdx.x; if (i < end) p[i] = v; }"""
x = cupy.zeros(N, dtype=cupy.float32)
cupy.cuda.Device().synchronize()
p = x.data.ptr
del x
y = cupy.full(N, 7.0, dtype=cupy.float32)
cupy.cuda.Device().synchronize()
k = cupy.RawKernel(FILL, "stale_fill")
k(((1024 + 255) // 256,), (256,), (numpy.uint64(p), numpy.int32(1024), numpy.int32(2048), numpy.float32(1.0)))
cupy.cuda.Device().synchronize()
bad = int((y != 7.0).sum())
print("SAME_ADDRESS", int(y.data.ptr == p), "CORRUPTED", bad)
# A few arrays made and dropped: with the pool off each is its own cudaMalloc/cudaFree.
for i in range(50):
    z = cupy.ones(1 << 16, dtype=cupy.float32)
    del z
cupy.cuda.Device().synchronize()
'''

JAX_CHILD = r'''
import os
print("ENV", os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR"))
import jax, jax.numpy as jnp, numpy as np
print("DEVICES", jax.devices())
for i in range(20):
    a = jnp.full((1 << 20,), float(i), dtype=jnp.float32)   # 4 MiB each
    a.block_until_ready()
    del a
x = jnp.arange(1_000_000, dtype=jnp.float32)
s = float(jnp.sum(x * 2.0))
want = float(np.sum(np.arange(1_000_000, dtype=np.float64) * 2.0))
m = jnp.ones((512, 512)) @ jnp.ones((512, 512))
ok = abs(s - want) / want < 1e-5 and float(m[0, 0]) == 512.0
print("RESULT", s, want, float(m[0, 0]), "OK" if ok else "WRONG")
'''

NCCL_CHILD = r'''
import os
import torch, torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
t = torch.full((1 << 20,), 3.0, device="cuda")
dist.all_reduce(t)
u = torch.arange(1000, dtype=torch.float32, device="cuda")
dist.all_reduce(u, op=dist.ReduceOp.MAX)
torch.cuda.synchronize()
ok = bool((t == 3.0).all()) and bool((u == torch.arange(1000, dtype=torch.float32, device="cuda")).all())
print("NCCL", torch.cuda.nccl.version(), "RESULT", "OK" if ok else "WRONG")
dist.destroy_process_group()
'''


class Case:
    def __init__(self, name, out, isolate, lib, deadline):
        self.name = name
        self.dir = out / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.isolate = isolate
        self.lib = lib
        self.deadline = deadline
        self.log = open(self.dir / "log.txt", "w")

    def left(self):
        return max(5.0, self.deadline - time.monotonic())

    def child(self, name, source):
        p = self.dir / name
        p.write_text(textwrap.dedent(source))
        return p

    def run(self, tag, mode, argv, env_delta=None, unset=()):
        """`isolate run --mode MODE --trace DIR/TAG-%p.trace -- argv`: (rc, stdout, stderr, traces)."""
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("ISOLATE_") or k in unset:
                del env[k]
        env.update(env_delta or {})
        for t in self.dir.glob(f"{tag}-*.trace*"):
            t.unlink()
        cmd = [str(self.isolate), "run", "--mode", mode, "--trace", str(self.dir / f"{tag}-%p.trace"), "--", *argv]
        t0 = time.monotonic()
        # Its own session, so that a timeout kills the command too (SIGKILL to `isolate` alone
        # would leave the command running).
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=self.left())
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            out, err = p.communicate()
        dt = time.monotonic() - t0
        self.log.write(f"$ {' '.join(cmd)}\nrc={rc} {dt:.1f}s\n--- stdout\n{out}\n--- stderr\n{err}\n\n")
        self.log.flush()
        traces = sorted(self.dir.glob(f"{tag}-*.trace"))
        return rc, out, err, traces

    def summary(self, traces):
        """`isolate summary --json` of the traces (all processes summed), or None."""
        if not traces:
            return None
        p = subprocess.run(
            [str(self.isolate), "summary", "--json", *map(str, traces)],
            capture_output=True, text=True, timeout=max(10.0, min(60.0, self.left())),
        )
        (self.dir / f"summary-{traces[0].stem}.json").write_text(p.stdout)
        if p.returncode not in (0, 1):
            self.log.write(f"summary rc={p.returncode}: {p.stderr}\n")
            return None
        try:
            return json.loads(p.stdout)
        except ValueError:
            return None


def field(text, key):
    """The word after KEY on the first line holding it."""
    for line in text.splitlines():
        words = line.split()
        if key in words and words.index(key) + 1 < len(words):
            return words[words.index(key) + 1]
    return None


def importable(module):
    try:
        p = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=60)
        return p.returncode == 0
    except Exception:
        return False


# ---- the cases: each returns (status, numbers) ----

def case_nvtx(c):
    if not importable("torch"):
        return "SKIP", "torch not importable"
    steps = 5
    child = c.child("nvtx_child.py", NVTX_CHILD)
    rc, out, err, traces = c.run("nvtx", "log", [sys.executable, str(child), str(steps)], unset=("NVTX_INJECTION64_PATH",))
    s = c.summary(traces)
    if rc != 0 or s is None:
        return "FAIL", f"rc={rc}, {len(traces)} traces"
    regions = {r["name"]: r for r in s.get("regions", [])}
    step_names = [f"step {i}" for i in range(steps)]
    have_steps = sum(1 for n in step_names if n in regions)
    fwd = regions.get("forward", {})
    bwd = regions.get("backward", {})
    aten = [n for n in regions if n.startswith("aten::")]
    marks = [m.get("text") for m in s.get("marks", [])]
    nums = (f"model {field(out, 'MODEL')}, {have_steps}/{steps} step regions, forward x{fwd.get('count', 0)} "
            f"peak {fwd.get('peak_live_bytes', 0)} B, backward x{bwd.get('count', 0)}, {len(aten)} aten:: region names "
            f"(emit_nvtx), {s.get('region_count', 0)} regions in all, mark 'done' {'done' in marks}")
    ok = (have_steps == steps and fwd.get("count") == steps and bwd.get("count") == steps
          and fwd.get("peak_live_bytes", 0) > 0 and len(aten) > 0 and "done" in marks)
    return ("PASS" if ok else "FAIL"), nums


def case_cupy(c):
    if not importable("cupy"):
        return "SKIP", "cupy not importable"
    pth_dir = c.dir / "site"
    pth_dir.mkdir(exist_ok=True)
    shutil.copy(REPO / "python" / "cuda_isolate.pth", pth_dir / "cuda_isolate.pth")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "python" / "src"), os.environ.get("PYTHONPATH")]))}
    child = c.child("cupy_child.py", CUPY_CHILD)
    res = {}
    for mode in ("log", "isolate"):
        rc, out, err, traces = c.run(f"cupy-{mode}", mode, [sys.executable, str(child), str(pth_dir)], env_delta=env)
        s = c.summary(traces)
        res[mode] = {
            "rc": rc,
            "same": field(out, "SAME_ADDRESS"),
            "bad": field(out, "CORRUPTED"),
            "said": "CuPy's memory pools off" in err,
            "stale_writes": (s or {}).get("poison_violation_count"),
            "stale_launches": (s or {}).get("stale_launch_count"),
            "allocs": (s or {}).get("allocations"),
        }
    lg, iso = res["log"], res["isolate"]
    nums = (f"log: same address {lg['same']}, {lg['bad']} elements of y corrupted, {lg['allocs']} allocations; "
            f"isolate: same address {iso['same']}, {iso['bad']} corrupted, {iso['stale_writes']} stale writes, "
            f"{iso['stale_launches']} stale launches, {iso['allocs']} allocations, pool-off line {iso['said']}")
    ok = (iso["rc"] == 0 and iso["bad"] == "0" and iso["same"] == "0" and (iso["stale_writes"] or 0) >= 1
          and iso["said"] and (iso["allocs"] or 0) >= 50)
    return ("PASS" if ok else "FAIL"), nums


def case_jax(c):
    if not importable("jax"):
        return "SKIP", "jax not importable"
    child = c.child("jax_child.py", JAX_CHILD)
    rc, out, err, traces = c.run(
        "jax", "isolate", [sys.executable, str(child)],
        env_delta={"JAX_PLATFORMS": "cuda"},
        unset=("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION"),
    )
    s = c.summary(traces)
    env_seen = field(out, "ENV")
    said = "set XLA_PYTHON_CLIENT_ALLOCATOR=platform" in err
    result = "OK" if " OK" in out and "RESULT" in out else "WRONG"
    allocs = (s or {}).get("allocations", 0)
    frees = (s or {}).get("frees", 0)
    calls = (s or {}).get("calls", {})
    nums = (f"rc={rc}, env {env_seen}, stderr line {said}, result {result}, {allocs} allocations, {frees} frees, "
            f"{(s or {}).get('poison_violation_count')} stale writes; calls "
            + ", ".join(f"{k} {v}" for k, v in sorted(calls.items()) if "Free" in k or "Alloc" in k or "Create" in k))
    ok = rc == 0 and env_seen == "platform" and said and result == "OK" and allocs >= 20 and frees >= 20
    return ("PASS" if ok else "FAIL"), nums


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def case_nccl(c):
    if not importable("torch.distributed"):
        return "SKIP", "torch.distributed not importable"
    child = c.child("nccl_child.py", NCCL_CHILD)
    parts, ok = [], True
    for mode in ("log", "isolate"):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
               "LOCAL_RANK": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
        rc, out, err, traces = c.run(f"nccl-{mode}", mode, [sys.executable, str(child)], env_delta=env)
        s = c.summary(traces)
        calls = (s or {}).get("calls", {})
        cumem = {k: v for k, v in calls.items() if k.startswith("cuMem")}
        right = " OK" in out
        parts.append(f"{mode}: rc={rc} result {'OK' if right else 'WRONG'} NCCL {field(out, 'NCCL')}, cuMem* calls "
                     + (", ".join(f"{k} {v}" for k, v in sorted(cumem.items())) or "none")
                     + f", {(s or {}).get('poison_violation_count')} stale writes")
        ok = ok and rc == 0 and right and sum(cumem.values()) > 0
    return ("PASS" if ok else "FAIL"), "; ".join(parts)


CASES = {"a": ("nvtx", case_nvtx), "b": ("cupy", case_cupy), "c": ("jax", case_jax), "d": ("nccl", case_nccl)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", default=os.environ.get("LIB") or str(REPO / "target" / "release" / "libisolate.so"),
                   help="libisolate.so (default: $LIB, else target/release/libisolate.so)")
    p.add_argument("--isolate", default=os.environ.get("ISOLATE") or str(REPO / "target" / "release" / "isolate"),
                   help="the isolate binary (default: $ISOLATE, else target/release/isolate); "
                        "`isolate run` preloads the libisolate.so beside it")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(tempfile.gettempdir(), "isolate-gpu-out"),
                   help="logs and traces go to OUT/issue15/ (default: $OUT)")
    p.add_argument("--only", default="a,b,c,d", help="cases to run, by letter or name (a,b,c,d = nvtx,cupy,jax,nccl)")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per case (default 150)")
    p.add_argument("--dry-run", action="store_true", help="check the arguments and write the child programs only")
    a = p.parse_args(argv)
    names = {v[0]: k for k, v in CASES.items()}
    picked = []
    for w in filter(None, (x.strip() for x in a.only.split(","))):
        key = w if w in CASES else names.get(w)
        if key is None:
            p.error(f"--only: unknown case {w!r} (a, b, c, d or nvtx, cupy, jax, nccl)")
        picked.append(key)
    a.only = picked
    return a


def main(argv=None):
    a = parse_args(argv)
    isolate = Path(a.isolate).resolve()
    lib = Path(a.lib).resolve()
    out = Path(a.out) / "issue15"
    out.mkdir(parents=True, exist_ok=True)
    problems = []
    if not isolate.is_file():
        problems.append(f"isolate binary not found: {isolate}")
    beside = isolate.with_name("libisolate.so")
    if not beside.is_file():
        problems.append(f"libisolate.so not found beside {isolate} (isolate run preloads that one)")
    elif lib.is_file() and beside.resolve() != lib:
        print(f"NOTE: isolate run preloads {beside}, not --lib {lib}", flush=True)
    if problems:
        for m in problems:
            print(f"FAIL setup: {m}", flush=True)
        return 1
    failed = 0
    t_all = time.monotonic()
    for key in a.only:
        name, fn = CASES[key]
        c = Case(name, out, isolate, lib, time.monotonic() + a.timeout)
        if a.dry_run:
            for src, fname in ((NVTX_CHILD, "nvtx_child.py"), (CUPY_CHILD, "cupy_child.py"),
                               (JAX_CHILD, "jax_child.py"), (NCCL_CHILD, "nccl_child.py")):
                c.child(fname, src)
            print(f"SKIP {key} {name}: dry run ({c.dir})", flush=True)
            continue
        t0 = time.monotonic()
        try:
            status, nums = fn(c)
        except Exception as e:  # a case's own failure never stops the others
            status, nums = "FAIL", f"{type(e).__name__}: {e}"
        c.log.write(f"{status} {name}: {nums}\n")
        c.log.close()
        failed += status == "FAIL"
        print(f"{status} {key} {name}: {nums} ({time.monotonic() - t0:.1f} s)", flush=True)
    print(f"issue15: {failed} failed, {time.monotonic() - t_all:.1f} s; logs in {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
