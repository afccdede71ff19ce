#!/usr/bin/env python3
"""Isolation's tiers on real models (issue 31): step time, the floor, memory, losses, findings.

    python3 tests/gpu/tier_bench.py --lib target/gpu/libisolate.so --isolate target/gpu/isolate \\
        [--rounds 3] [--steps 20] [--warmup 5] [--models gpt2,resnet50,bert,vit]
    python3 tests/gpu/tier_bench.py --table $OUT/tier_bench.json     # the table again, from the file

Models (random weights, fixed seeds, fixed batches):
  gpt2      transformers GPT2LMHeadModel, 6 layers, d512, 8 heads, batch 16 x 256, AdamW
  resnet50  torchvision resnet50, batch 32 x 128^2, SGD with momentum
  bert      transformers BertForMaskedLM, 6 layers, d512, 8 heads, batch 32 x 128, AdamW, under
            torch.autocast(bfloat16)
  vit       timm vit_small_patch16_224, batch 32 x 224^2, AdamW
Configurations: default (no preload, PyTorch's caching allocator), log (ISOLATE_MODE=log),
isolate (ISOLATE_MODE=isolate: full coverage, the default tier), fast (isolate with
ISOLATE_CHECK=fast); with --configs also fast-nostacks (ISOLATE_STACKS=none), fast-python
(ISOLATE_STACKS=python) and isolate-nopoison (ISOLATE_POISON=off: the quarantine without its
device work), to say where a tier's remaining time goes; backend (no library, PyTorch's
stream-ordered backend, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: what isolate mode
switches PyTorch to, the floor of any design that sees every tensor) and isolate-bare (the
library's quarantine alone: no stacks, poison, check or launch check). Each round runs every configuration once (the order rotated by round);
a configuration's run is one Python process that imports torch, transformers, torchvision and
timm once and then forks one child per model before any CUDA call (so every model has a fresh
CUDA context and its own trace and exit notes, without paying the imports four times). Each
child: 5 warm-up steps, 20 timed ones, each timed to torch.cuda.synchronize; deterministic
algorithms (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8) so that every
configuration's losses can be compared bit for bit with the default's.

Reported per model and configuration: the median step time over the rounds and its ratio to
the default's in the same round (median of the per-round ratios, each round listed), peak
device memory (cudaMemGetInfo, sampled every step) and torch.cuda.max_memory_allocated, whether
every loss equals the default's of the same round, findings (`isolate summary --json`:
stale writes, stale launches, leaks, invalid frees, device faults; 0 expected), and the floor:
the bytes the library's exit notes say its poisons wrote and its checks read (`device_work`),
a step's share of them (the trace's steps as the summary finds them, else the run's steps),
over the device's bandwidth as measured here once (a device-to-device copy of 1 GiB, bytes
read plus written over the time), and the floor's ratio: 1 + floor / default step.

Time: 4 configurations x 3 rounds = 12 processes of ~20-25 s (imports ~6 s, then per model a
CUDA context, the model, 25 steps and the exit) = about 4.5 minutes on the H200, plus the
bandwidth probe (~3 s). BUDGET_S (default 330) stops starting runs once spent; the JSON is
rewritten after every run, so a call cut short keeps what finished.

Writes $OUT/tier_bench.json (every child's result, the summaries' device work and findings,
the bandwidth) and $OUT/tier_bench-logs.tgz; prints the table (tier_bench_table.py renders it
as markdown for docs/performance.md).
"""
import argparse
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import tier_bench_table  # noqa: E402

CONFIGS = {
    "default": None,
    # The default again, as a configuration of its own: the ratio it gets is the method's noise
    # (an A/A test).
    "default-again": None,
    "default-third": None,
    "log": {"ISOLATE_MODE": "log"},
    "isolate": {"ISOLATE_MODE": "isolate"},
    "fast": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast"},
    # Not run by default (--configs): where the rest of a tier's time goes, for a second call.
    "fast-nostacks": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_STACKS": "none"},
    "fast-python": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_STACKS": "python"},
    "isolate-nopoison": {"ISOLATE_MODE": "isolate", "ISOLATE_POISON": "off"},
    # The floor of any per-allocation design on a host-bound model: PyTorch's stream-ordered
    # backend without the library (what isolate mode switches PyTorch to), and the library's
    # quarantine alone (records and fresh memory; no stacks, poison, check or launch check).
    "backend": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync", "_NO_LIBRARY": "1"},
    "isolate-bare": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_STACKS": "none",
                     "ISOLATE_POISON": "off", "ISOLATE_CHECK_LAUNCH": "off"},
    # PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator) calling
    # cudaMallocAsync / cudaFreeAsync straight from a small C library (PLUGGABLE_C, built with
    # gcc in the run's folder): whether a tier that sees every tensor can avoid the
    # stream-ordered backend's own cost (10-14% on ResNet-50 and BERT on the H100, sixteenth
    # session). Without the library, and with it in the fast tier.
    "pluggable": {"TIER_PLUGGABLE": "1", "_NO_LIBRARY": "1"},
    # The same C library keeping every freed block for the next request of its size (a free
    # list by exact size, no driver call once warm, stream order ignored: one-stream models
    # only): the pluggable interface's own floor, what a sub-allocator inside the library
    # behind it could reach at best.
    "pluggable-pool": {"TIER_PLUGGABLE": "1", "TIER_PLUGGABLE_POOL": "1", "_NO_LIBRARY": "1"},
    # The stream-ordered backend with its cudaMallocAsync / cudaFreeAsync answered from blocks
    # freed before, by exact size and stream (backend_pool.c, preloaded without the library):
    # PyTorch's own bookkeeping with the driver's pool taken out, the floor of a tier that
    # serves the backend's allocations itself (as the library's kept memory does).
    "backend-pool": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync", "_NO_LIBRARY": "1",
                     "_PRELOAD": "backend_pool.so"},
    # PYTORCH_NO_CUDA_MEMORY_CACHING=1: the library leaves PyTorch's variables alone (a
    # backend named in PYTORCH_CUDA_ALLOC_CONF makes PyTorch refuse a pluggable allocator).
    "fast-pluggable": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "TIER_PLUGGABLE": "1",
                       "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    # Full coverage without the stream-order check (issue 34: its cost is isolate / this).
    "isolate-noorder": {"ISOLATE_MODE": "isolate", "ISOLATE_TEST_ORDER": "off"},
    # Where the host's time goes (the summary's `cost` lines, in the run's log): not for ratios,
    # profiling adds two clock reads a hook and a part.
    "isolate-prof": {"ISOLATE_MODE": "isolate", "ISOLATE_PROFILE": "on"},
    "fast-prof": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_PROFILE": "on"},
    "log-prof": {"ISOLATE_MODE": "log", "ISOLATE_PROFILE": "on"},
    # Issue 34's cost inside one process: isolate mode, the stream-order check paused on every
    # other timed step (the library's test-only isolate_test_order_pause); the run reports
    # the median of the steps with it and of those without, and their ratio. Two processes
    # (isolate against isolate-noorder) differ by up to 10% on a host-bound model for reasons
    # of their own; steps of one process, alternated, do not.
    "isolate-ab": {"ISOLATE_MODE": "isolate", "TIER_AB": "order"},
    # The same tiers with another build of the library ($TIER_LIB_BASE, by default
    # target/gpu/base/libisolate.so): a change measured against the build before it, side by
    # side in one call.
    "log-base": {"ISOLATE_MODE": "log", "_LIB": "base"},
    "isolate-base": {"ISOLATE_MODE": "isolate", "_LIB": "base"},
    "fast-base": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "_LIB": "base"},
    "fast-prof-base": {"ISOLATE_MODE": "isolate", "ISOLATE_CHECK": "fast", "ISOLATE_PROFILE": "on",
                       "_LIB": "base"},
    "isolate-prof-base": {"ISOLATE_MODE": "isolate", "ISOLATE_PROFILE": "on", "_LIB": "base"},
}

# The pluggable allocator's two functions (PyTorch's signatures), calling the runtime PyTorch
# already loaded (found by its name, not linked: no CUDA toolkit is needed to build it; with the
# library preloaded, its dlsym hands out the library's hooks as for any caller).
PLUGGABLE_C = r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <sys/types.h>
typedef int (*malloc_async_t)(void **, size_t, void *);
typedef int (*free_async_t)(void *, void *);
#include <pthread.h>
#include <stdlib.h>
static malloc_async_t m;
static free_async_t f;
/* TIER_PLUGGABLE_POOL=1: freed blocks kept by exact size (a chained hash of free lists). */
struct blk { void *p; size_t size; struct blk *next; };
#define SLOTS 4096
static struct blk *slot[SLOTS];
static struct blk *spare;
static int pool = -1;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t h(size_t n) { return (n * 0x9E3779B97F4A7C15ull) >> 52; }
static void init(void) {
    if (pool < 0) {
        const char *e = getenv("TIER_PLUGGABLE_POOL");
        pool = e && e[0] == '1';
    }
    if (m && f)
        return;
    const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    void *h = NULL;
    for (int i = 0; i < 3 && !h; i++)
        h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        h = RTLD_DEFAULT;
    m = (malloc_async_t)dlsym(h, "cudaMallocAsync");
    f = (free_async_t)dlsym(h, "cudaFreeAsync");
}
void *tier_malloc(ssize_t size, int device, void *stream) {
    (void)device;
    void *p = NULL;
    init();
    if (pool) {
        pthread_mutex_lock(&lock);
        for (struct blk **b = &slot[h((size_t)size) % SLOTS]; *b; b = &(*b)->next)
            if ((*b)->size == (size_t)size) {
                struct blk *k = *b;
                *b = k->next;
                p = k->p;
                k->next = spare;
                spare = k;
                break;
            }
        pthread_mutex_unlock(&lock);
        if (p)
            return p;
    }
    if (!m || m(&p, (size_t)size, stream) != 0)
        return NULL;
    return p;
}
void tier_free(void *p, ssize_t size, int device, void *stream) {
    (void)device;
    init();
    if (pool) {
        pthread_mutex_lock(&lock);
        struct blk *k = spare;
        if (k)
            spare = k->next;
        else
            k = malloc(sizeof *k);
        if (k) {
            struct blk **b = &slot[h((size_t)size) % SLOTS];
            k->p = p;
            k->size = (size_t)size;
            k->next = *b;
            *b = k;
        }
        pthread_mutex_unlock(&lock);
        if (k)
            return;
    }
    if (f)
        f(p, stream);
}
'''

WORKER = r'''
import json, os, statistics, sys, time
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# torch.cuda.is_available() through NVML, not cuInit: nothing may initialise CUDA before the fork.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
import torch, torchvision, timm, transformers  # once, before any CUDA call: the children share them
from tier_counters import library_counters, timed
single = sys.argv[1] == "single"
if single:
    del sys.argv[1]
models, warmup, steps, outdir, probe = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"

def build(work):
    torch.manual_seed(0)
    dev = "cuda"
    g = torch.Generator().manual_seed(1)
    if work == "gpt2":
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=6, n_embd=512, n_head=8)).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        x = torch.randint(0, 50257, (16, 256), generator=g).to(dev)
        def step():
            return m(input_ids=x, labels=x).loss
    elif work == "bert":
        cfg = transformers.BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                                      intermediate_size=2048)
        m = transformers.BertForMaskedLM(cfg).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        x = torch.randint(0, 30000, (32, 128), generator=g).to(dev)
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return m(input_ids=x, labels=x).loss
    elif work == "resnet50":
        m = torchvision.models.resnet50(weights=None).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(32, 3, 128, 128, generator=g).to(dev)
        y = torch.randint(0, 1000, (32,), generator=g).to(dev)
        def step():
            return torch.nn.functional.cross_entropy(m(x), y)
    else:
        m = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        x = torch.randn(32, 3, 224, 224, generator=g).to(dev)
        y = torch.randint(0, 1000, (32,), generator=g).to(dev)
        def step():
            return torch.nn.functional.cross_entropy(m(x), y)
    m.train()
    return opt, step

def bandwidth():
    """Bytes read plus written a second by a device-to-device copy of 1 GiB (median of 10)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    out = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); b.copy_(a); e.record(); e.synchronize()
        out.append(2 * a.numel() / (s.elapsed_time(e) / 1e3))
    return statistics.median(out)

_nvml = []

def own_device_memory():
    """The device memory NVML says this process uses on device 0 (bytes), or None."""
    try:
        if not _nvml:
            import pynvml
            pynvml.nvmlInit()
            _nvml.append((pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)))
        nv, h = _nvml[0]
        for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return p.usedGpuMemory
    except Exception:
        pass
    return None

def child(work):
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # Attention without the memory-efficient and cuDNN kernels, whose backward passes are
    # not deterministic (PyTorch warns so): with them GPT-2's losses differed between two runs
    # without the library in the eighteenth session's first call. Math and flash remain.
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    # warn_only: an operator without a deterministic version runs anyway (its losses may then
    # differ from the default's, which the table says) instead of stopping the run.
    torch.use_deterministic_algorithms(True, warn_only=True)
    if os.environ.get("TIER_PLUGGABLE"):
        # Before the first allocation: PyTorch's allocator from then on is the C library's.
        torch.cuda.memory.change_current_allocator(torch.cuda.memory.CUDAPluggableAllocator(
            os.environ["TIER_PLUGGABLE"], "tier_malloc", "tier_free"))
    torch.zeros(1, device="cuda")
    used = lambda: (lambda f, t: t - f)(*torch.cuda.mem_get_info())
    if os.environ.get("TIER_TURNS"):
        # Side by side the device's used memory is every process's: this process's own, from
        # NVML (None where NVML cannot be had or does not see this pid, as in a pid namespace).
        used = own_device_memory
    start_used = used()
    peak = start_used
    res = {"model": work}
    # --lockstep: this process takes turns with the other configurations' (TIER_TURNS = the fd
    # it reads "go" from, the fd it says "ready" on, the steps of a turn); the device is its
    # own only during its turns.
    turns = os.environ.get("TIER_TURNS")
    if turns:
        go_fd, ready_fd, burst = (int(x) for x in turns.split(","))
        def turn():
            os.write(ready_fd, b"r")
            if os.read(go_fd, 1) != b"g":
                sys.exit(4)  # the controller is gone
        res["lockstep_burst"] = burst
    if probe and not turns:
        res["bandwidth"] = bandwidth()
    opt, step = build(work)
    losses, times, host = [], [], []
    # isolate-ab: odd steps without the order check, even ones with it (warm-up steps with).
    pause = None
    if os.environ.get("TIER_AB") == "order":
        import ctypes
        pause = ctypes.CDLL(None).isolate_test_order_pause
        res["ab_active"] = pause(0) == 0
    on_ms, off_ms = [], []
    events0 = None
    for i in range(warmup + steps):
        if turns and i >= warmup and (i - warmup) % burst == 0:
            turn()
            if probe and "bandwidth" not in res:
                res["bandwidth"] = bandwidth()  # alone on the device: in its first turn
                # The probe's two 1 GiB blocks leave the cache and the peak, as if never made.
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                peak = used()
        if i == warmup:
            events0 = library_counters()
        off = pause is not None and i >= warmup and i % 2 == 1
        if pause is not None:
            pause(1 if off else 0)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step()
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            (off_ms if off else on_ms).append(times[-1])
            host.append((t1 - t0) * 1e3)
        losses.append(float(loss.detach().float().item()))
        now = used()
        peak = None if peak is None or now is None else max(peak, now)
    # Calls the library recorded during the timed steps (none where it is not loaded): a tier's
    # work on the program's threads is at most that many hooks' worth, whatever the host's noise.
    events1 = library_counters()
    res.update(timed(events0, events1))
    if turns:
        turn()  # the last turn: the others' timed steps are not to share the device with an exit
    if pause is not None:
        pause(0)
        res.update(ab_on_ms=statistics.median(on_ms), ab_off_ms=statistics.median(off_ms),
                   ab_ratio=statistics.median(on_ms) / statistics.median(off_ms),
                   ab_on_steps=on_ms, ab_off_steps=off_ms)
    res.update(ms_per_step=statistics.median(times), host_ms_per_step=statistics.median(host),
               ms_steps=times, losses=[repr(v) for v in losses], total_steps=warmup + steps,
               device_used_start=start_used, device_used_peak=peak)
    try:
        res["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    except Exception:  # a pluggable allocator keeps no statistics
        res["max_memory_allocated"] = None
    with open(os.path.join(outdir, f"result-{work}.json"), "w") as f:
        json.dump(res, f)

if single:  # the fallback: this process runs the one model itself
    child(models[0])
    sys.exit(0)
if torch.cuda.is_initialized():
    print("CUDA was initialised before the fork: the children cannot use it", file=sys.stderr)
    sys.exit(3)
for work in models:
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            child(work)
        except BaseException as e:
            print(f"child {work}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        sys.exit(code)  # a normal exit: the library's exit check and notes run
    _, status = os.waitpid(pid, 0)
    print(f"model {work} pid {pid} status {status}", flush=True)
'''


def summary(isolate, traces):
    if not traces:
        return None, ""
    js = subprocess.run([isolate, "summary", "--json"] + traces, capture_output=True, text=True)
    text = subprocess.run([isolate, "summary"] + traces, capture_output=True, text=True).stdout
    try:
        return json.loads(js.stdout), text
    except ValueError:
        return None, text + js.stderr


def attach_summary(args, r, traces):
    """The run's findings, device work and trace size into `r` from its traces (then removed);
    returns the summary's text."""
    summ, text = summary(args.isolate, traces)
    r["findings"] = findings(summ)
    r["device_work"] = (summ or {}).get("device_work")
    r["trace_bytes"] = sum(os.path.getsize(t) for t in traces)
    for t in traces:
        os.remove(t)
    return text


def findings(s):
    if s is None:
        return None
    return int(s.get("findings") or 0)


@functools.lru_cache(maxsize=None)  # asked once, in the controller; never in a preexec_fn
def pinned_cpus():
    """TIER_PIN (a CPU list, "2-9" or "2,3,8-11"): every run's processes on those CPUs only, so
    that every configuration runs on the same ones (None: anywhere)."""
    spec = os.environ.get("TIER_PIN", "").strip()
    if not spec:
        return None
    if spec == "gpu":
        spec = gpu_cpulist()
    cpus = set()
    for part in spec.split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def gpu_cpulist():
    """The CPUs next to device 0 (its PCI device's NUMA node, from sysfs): TIER_PIN=gpu. A
    process on them gets its memory there too (first touch), on a host with more than one
    node. (The nineteenth session's H100 host had one: all 16 CPUs, and the processes' ±10%
    spread stayed as it was unpinned.)"""
    bus = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True, check=True).stdout.strip()
    # "00000000:19:00.0" (an 8-digit domain) is "0000:19:00.0" in sysfs.
    path = f"/sys/bus/pci/devices/{bus[-12:].lower()}/local_cpulist"
    with open(path) as f:
        return f.read().strip()


def pin():
    cpus = pinned_cpus()
    if cpus:
        os.sched_setaffinity(0, cpus)


def uses_library(cfg):
    return CONFIGS[cfg] is not None and "_NO_LIBRARY" not in CONFIGS[cfg]


def config_env(cfg, base, lib, trace_dir, pluggable_so):
    """The environment of configuration `cfg`'s run: `base` without any variable a
    configuration sets, then the configuration's own; the library preloaded, its traces in
    `trace_dir`, wherever the configuration uses it (every one but default, backend and
    pluggable)."""
    env = dict(base)
    for k in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
              "LD_PRELOAD", "ISOLATE_MODE", "ISOLATE_CHECK", "ISOLATE_STACKS", "ISOLATE_POISON",
              "ISOLATE_TEST_ORDER", "ISOLATE_PROFILE", "ISOLATE_CHECK_LAUNCH", "ISOLATE_TRACE",
              "ISOLATE_TENANTS",
              "TIER_AB", "TIER_PLUGGABLE", "TIER_PLUGGABLE_POOL"):
        env.pop(k, None)
    env.update({k: v for k, v in (CONFIGS[cfg] or {}).items() if not k.startswith("_")})
    if (CONFIGS[cfg] or {}).get("_LIB") == "base":
        lib = os.environ.get("TIER_LIB_BASE", "target/gpu/base/libisolate.so")
    if uses_library(cfg):
        # (From the seventeenth session's first call until the eighteenth's first, this was
        # done for pluggable configurations only: those calls' log, isolate and fast rows ran
        # without the library, and their findings read "–".)
        env["LD_PRELOAD"] = os.path.abspath(lib)
        env["ISOLATE_TRACE"] = os.path.join(trace_dir, "t-%p.trace")
    if env.get("TIER_PLUGGABLE") == "1":
        env["TIER_PLUGGABLE"] = pluggable_so
    if (CONFIGS[cfg] or {}).get("_PRELOAD"):
        # Built beside the pluggable allocator's library (main()).
        env["LD_PRELOAD"] = os.path.join(os.path.dirname(pluggable_so), CONFIGS[cfg]["_PRELOAD"])
    return env


def run_config(args, cfg, rnd, models, work, logs, probe):
    d = tempfile.mkdtemp(dir=work, prefix=f"{cfg}-r{rnd}-")
    env = config_env(cfg, os.environ, args.lib, d, os.path.join(work, "pluggable.so"))
    t0 = time.time()
    p = subprocess.run([sys.executable, os.path.join(work, "worker.py"), ",".join(models),
                        str(args.warmup), str(args.steps), d, "1" if probe else "0"],
                       env=env, capture_output=True, text=True, timeout=240, preexec_fn=pin)
    wall = time.time() - t0
    out = []
    traces = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".trace"):
            pid = f[2:-6]
            traces[pid] = os.path.join(d, f)
    texts = []
    extra = ""
    for work_ in models:
        rpath = os.path.join(d, f"result-{work_}.json")
        r = {"config": cfg, "round": rnd, "model": work_, "rc": p.returncode}
        if not os.path.exists(rpath) and time.time() - t0 < 200:
            # The forked child failed (CUDA initialised before the fork?): the model again in
            # a process of its own, said in the log and the result.
            q = subprocess.run([sys.executable, os.path.join(work, "worker.py"), "single", work_,
                                str(args.warmup), str(args.steps), d, "1" if probe else "0"],
                               env=env, capture_output=True, text=True, timeout=240)
            extra += f"\n--- {work_} again in a process of its own: rc {q.returncode}\n{q.stdout}\n{q.stderr[-20000:]}"
            r["own_process"] = True
            r["rc"] = q.returncode
            for f in os.listdir(d):
                if f.endswith(".trace") and f[2:-6] not in traces:
                    traces[f[2:-6]] = os.path.join(d, f)
                    r["_pid"] = f[2:-6]
        if os.path.exists(rpath):
            r.update(json.load(open(rpath)))
        out.append(r)
    # Each child's trace, by the pid the worker printed for it.
    child_pid = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) >= 6 and f[0] == "model" and f[2] == "pid":
            child_pid[f[1]] = f[3]
    for r in out:
        pid = r.pop("_pid", None) or child_pid.get(r["model"])
        if pid not in traces:
            if uses_library(cfg):
                # A configuration with the library that left no trace did not run with it:
                # said in the table (its findings column), never counted as 0 findings.
                r["no_trace"] = True
            continue
        text = attach_summary(args, r, [traces[pid]])
        texts.append(f"--- {r['model']} ({traces[pid]})\n{text}")
    with open(os.path.join(logs, f"{cfg}-r{rnd}.log"), "w") as f:
        f.write(f"wall {wall:.1f}s rc {p.returncode}\n{p.stdout}\n--- stderr\n{p.stderr[-30000:]}\n{extra}\n" + "\n".join(texts))
    for r in out:
        r["wall_s"] = wall
    return out


def run_lockstep(args, configs, rnd, model, work, logs, probe):
    """One process per configuration for `model`, all alive at once, taking turns on the device:
    each warms up on its own, then runs `--lockstep` timed steps per turn, the configurations'
    order shuffled every turn (seeded), until each has run its steps; then all exit. A host
    that slows down for seconds (the H100 hosts did: the same process 16 or 35 ms a ResNet-50
    step) then slows every configuration alike, where sequential runs put it all on one."""
    import select
    procs = {}
    for cfg in configs:
        d = tempfile.mkdtemp(dir=work, prefix=f"{cfg}-r{rnd}-{model}-")
        go_r, go_w = os.pipe()
        ready_r, ready_w = os.pipe()
        env = config_env(cfg, os.environ, args.lib, d, os.path.join(work, "pluggable.so"))
        env["TIER_TURNS"] = f"{go_r},{ready_w},{args.lockstep}"
        if uses_library(cfg):
            # Each its whole quarantine, as when it runs alone: side by side, isolate and fast
            # would otherwise split the device's share (ISOLATE_TENANTS=share, the default).
            env["ISOLATE_TENANTS"] = "alone"
        out = open(os.path.join(d, "stdout"), "w")
        err = open(os.path.join(d, "stderr"), "w")
        p = subprocess.Popen([sys.executable, os.path.join(work, "worker.py"), "single", model,
                              str(args.warmup), str(args.steps), d,
                              "1" if probe and cfg == "default" else "0"],
                             env=env, stdout=out, stderr=err, pass_fds=(go_r, ready_w),
                             preexec_fn=pin)
        os.close(go_r)
        os.close(ready_w)
        procs[cfg] = {"p": p, "d": d, "go": go_w, "ready": ready_r, "alive": True, "out": out,
                      "err": err}
    t0 = time.time()

    def wait_ready(cfg, timeout=180):
        q = procs[cfg]
        if not q["alive"]:
            return False
        r, _, _ = select.select([q["ready"]], [], [], timeout)
        if not r or os.read(q["ready"], 1) != b"r":
            q["alive"] = False  # died, or hung: no more turns
            return False
        return True

    def go(cfg):
        try:
            os.write(procs[cfg]["go"], b"g")
        except OSError:
            procs[cfg]["alive"] = False

    for cfg in configs:
        wait_ready(cfg)
    turns = -(-args.steps // args.lockstep)
    for k in range(turns):
        order = list(configs)
        random.Random(f"{rnd}-{model}-{k}").shuffle(order)
        for cfg in order:
            if procs[cfg]["alive"]:
                go(cfg)
                wait_ready(cfg)
    for cfg in configs:  # the last "go": each writes its result and exits
        if procs[cfg]["alive"]:
            go(cfg)
    out = []
    for cfg in configs:
        q = procs[cfg]
        try:
            rc = q["p"].wait(timeout=120)
        except subprocess.TimeoutExpired:
            q["p"].kill()
            rc = "timeout"
        for k in ("go", "ready"):
            os.close(q[k])
        q["out"].close()
        q["err"].close()
        d = q["d"]
        r = {"config": cfg, "round": rnd, "model": model, "rc": rc, "lockstep": True}
        rpath = os.path.join(d, f"result-{model}.json")
        if os.path.exists(rpath):
            r.update(json.load(open(rpath)))
        traces = [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".trace")]
        text = ""
        if traces:
            text = attach_summary(args, r, traces)
        elif uses_library(cfg):
            r["no_trace"] = True
        r["wall_s"] = time.time() - t0
        with open(os.path.join(logs, f"{cfg}-r{rnd}-{model}.log"), "w") as f:
            f.write(f"lockstep rc {rc}\n--- stdout\n" + open(os.path.join(d, "stdout")).read()
                    + "\n--- stderr\n" + open(os.path.join(d, "stderr")).read()[-30000:]
                    + "\n--- summary\n" + text)
        out.append(r)
    return out


def save(path, data, logs, out):
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    with tarfile.open(os.path.join(out, "tier_bench-logs.tgz"), "w:gz") as t:
        t.add(logs, arcname="logs")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default="target/gpu/libisolate.so")
    ap.add_argument("--isolate", default="target/gpu/isolate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--round-from", type=int, default=0,
                    help="the first round's number (a call that runs later rounds of the same "
                         "benchmark: tier_bench_table.py renders the files together)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="gpt2,resnet50,bert,vit")
    ap.add_argument("--configs", default="default,log,isolate,fast")
    ap.add_argument("--lockstep", type=int, default=0, metavar="STEPS",
                    help="run each model's configurations side by side, taking turns of STEPS "
                         "timed steps on the device (see run_lockstep); 0: one after another")
    ap.add_argument("--table", help="print the table of this JSON file and stop")
    ap.add_argument("--env", metavar="CONFIG",
                    help="print the variables CONFIG's runs get (as set by it) and stop")
    args = ap.parse_args()
    if args.env:
        env = config_env(args.env, {}, args.lib, "TRACES", "PLUGGABLE.so")
        for k in sorted(env):
            print(f"{k}={env[k]}")
        return 0
    if args.table:
        print(tier_bench_table.render(json.load(open(args.table))))
        return 0
    out = os.environ.get("OUT", "/tmp/tier-bench-out")
    os.makedirs(out, exist_ok=True)
    budget = float(os.environ.get("BUDGET_S", "330"))
    work = tempfile.mkdtemp(prefix="tier-bench-")
    logs = os.path.join(work, "logs")
    os.makedirs(logs)
    # TIER_WORKER: another worker script (the CI test's stand-in, tier_bench_fake.py, which
    # needs no torch and no GPU).
    worker = open(os.environ["TIER_WORKER"]).read() if os.environ.get("TIER_WORKER") else WORKER
    open(os.path.join(work, "worker.py"), "w").write(worker)
    # The workers' one helper module, beside them (a script's folder is on its import path).
    shutil.copy(os.path.join(HERE, "tier_counters.py"), work)
    if any("TIER_PLUGGABLE" in (CONFIGS[c] or {}) for c in args.configs.split(",")):
        open(os.path.join(work, "pluggable.c"), "w").write(PLUGGABLE_C)
        common.build_shared(os.path.join(work, "pluggable.c"), os.path.join(work, "pluggable.so"))
    for so in {(CONFIGS[c] or {}).get("_PRELOAD") for c in args.configs.split(",")} - {None}:
        common.preload_of(so, work)
    models = args.models.split(",")
    configs = args.configs.split(",")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    device = smi.stdout.strip().splitlines()[0] if smi and smi.stdout.strip() else "unknown"
    data = {"command": " ".join(sys.argv), "models": models, "configs": configs,
            "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "runs": [],
            "devices": [(f"round {args.round_from}" if args.rounds == 1 else
                         f"rounds {args.round_from}-{args.round_from + args.rounds - 1}")
                        + f" on {device}"]}
    path = os.path.join(out, "tier_bench.json")
    t_start = time.time()
    # Side by side, each library process holds its whole quarantine (a quarter of the device):
    # four of them overcommit it, and a run beside them may run out of memory (a default run
    # did on an 80 GiB H100 in the twenty-fifth session: the reserve does not protect a process
    # without the library). Said in the log and the data, so that such a failure is read as the
    # benchmark's.
    side_by_side = [c for c in configs
                    if (CONFIGS[c] or {}).get("ISOLATE_MODE") == "isolate"] if args.lockstep else []
    if len(side_by_side) > 3:
        print(f"tier_bench: warning: {len(side_by_side)} isolate-mode configurations side by side "
              f"({','.join(side_by_side)}), each with a quarter of the device: together more "
              "than the device; a run beside them may run out of memory. Run at most three.",
              file=sys.stderr, flush=True)
        data["overcommitted"] = side_by_side
    data["lockstep"] = args.lockstep
    data["pinned"] = sorted(pinned_cpus() or [])
    for rnd in range(args.round_from, args.round_from + args.rounds):
        # What a round runs, as (name, the call that runs it): side by side, each model's
        # configurations at once; else each configuration's process with every model. A new
        # order each round (seeded: the run can be repeated), so that nothing always follows
        # the same one: with the order rotated by round, isolate followed log in every round of
        # the twelfth session's call, and one round can differ by 0.5x.
        order = list(models if args.lockstep else configs)
        random.Random(rnd).shuffle(order)
        first = rnd == args.round_from
        if args.lockstep:
            units = [(m, lambda m=m: run_lockstep(args, configs, rnd, m, work, logs,
                                                  first and m == order[0]))
                     for m in order]
        else:
            units = [(c, lambda c=c: run_config(args, c, rnd, models, work, logs,
                                                first and c == "default"))
                     for c in order]
        for name, run in units:
            if time.time() - t_start > budget:
                print(f"budget of {budget:.0f} s spent: {name} round {rnd} and later not run",
                      flush=True)
                data["cut_short"] = True
                save(path, data, logs, out)
                print(tier_bench_table.render(data))
                return 0
            try:
                rs = run()
            except subprocess.TimeoutExpired:  # run_config's process (run_lockstep waits itself)
                rs = [{"config": name, "round": rnd, "model": m, "rc": "timeout"} for m in models]
            for r in rs:
                if "bandwidth" in r:
                    data.setdefault("bandwidth_samples", []).append(r["bandwidth"])
                print(f"round {rnd} {r['config']:8} {r['model']:9} rc={r['rc']} "
                      f"ms={r.get('ms_per_step', float('nan')):.2f} "
                      f"findings={r.get('findings')} wall={r.get('wall_s', 0):.0f}s", flush=True)
            data["runs"].extend(rs)
            save(path, data, logs, out)
    data["elapsed_s"] = time.time() - t_start
    save(path, data, logs, out)
    print(tier_bench_table.render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
