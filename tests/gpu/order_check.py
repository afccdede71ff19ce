#!/usr/bin/env python3
"""The stream-order check on the H200 (issue 34): a missing record_stream named with its three
sites, correctly ordered multi-stream programs with none, compute-sanitizer side by side, and
the check's cost on three models.

    python3 tests/gpu/order_check.py --lib target/gpu/libisolate.so --isolate target/gpu/isolate \
        [race] [patterns] [sanitizer] [cost]        (none: all four)

Sections (each fits one device call of under 10 minutes; ORDER_BUDGET_S, 540 by default, stops a
section's later runs before the limit):
  race       the missing-record_stream script (a side stream computes y = x * 3, optionally after
             torch.cuda._sleep; the main stream does `del x` and allocates at once), 5 runs without
             and 5 with the sleep, in isolate mode: each run must report one unordered free
             naming the free (`del x`), the use (the x * 3 line) and the allocation by file:line.
  patterns   correctly ordered multi-stream programs (record_stream, wait_stream, event wait,
             stream/event/device synchronize, event query, CUDA graph capture + replay with a
             side-stream fork and join, DataLoader with pin_memory, torch.compile, FSDP-style
             untyped_storage().resize_(0) after a wait, side-stream H2D copy with wait and
             record_stream, the legacy default stream with a blocking stream, an NCCL all_reduce
             on a side stream): 0 unordered frees each.
  sanitizer  the race scripts and four patterns under `compute-sanitizer --tool memcheck
             --track-stream-ordered-races all` with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
             and no library: its error count and wall time, beside isolate mode's.
  cost       GPT-2, ResNet-50 and BERT (bf16 autocast) training step times in isolate mode with
             ISOLATE_TEST_ORDER=off and on, 3 interleaved rounds; the unordered frees of each run
             (0 expected). The models are tests/gpu/models_check.py's (ORDER_MODELS picks some,
             ORDER_WARM and ORDER_STEPS the steps: 8 and 30).

Prints one short table a section; writes $OUT/order_check.json and every run's log under
$OUT/order/.
"""
import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

WORKER = r'''
import os, sys, time
import torch

name = sys.argv[1]
N = 1 << 20
dev = "cuda"
SLEEP = 200_000_000  # GPU cycles: ~0.1 s at the H200's clocks


def warm():
    # CUDA loads modules lazily; loading one while a sleep kernel runs would serialise streams.
    w = torch.full((N,), 1.0, device=dev)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(1000)
        (w * 3).sum().item()
    torch.cuda.synchronize()


def race(sleep):
    main = torch.cuda.current_stream()
    s = torch.cuda.Stream()
    x = torch.full((N,), 1.0, device=dev)
    s.wait_stream(main)
    with torch.cuda.stream(s):
        if sleep:
            torch.cuda._sleep(SLEEP)
        y = x * 3
    del x  # BUG: x.record_stream(s) is missing
    z = torch.full((N,), -1.0, device=dev)
    torch.cuda.synchronize()
    return float(y.sum().item()), float(z[0].item())


def side(main, s, x):
    s.wait_stream(main)
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP // 4)
        return x * 3


def p_record_stream():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((N,), 1.0, device=dev)
    y = side(main, s, x)
    x.record_stream(s)
    del x
    z = torch.full((N,), -1.0, device=dev)
    main.wait_stream(s)
    return float((y + z).sum().item())


def p_wait_stream():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((N,), 1.0, device=dev)
    y = side(main, s, x)
    main.wait_stream(s)
    del x
    return float(y.sum().item())


def p_event_wait():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((N,), 1.0, device=dev)
    y = side(main, s, x)
    e = torch.cuda.Event()
    e.record(s)
    main.wait_event(e)
    del x
    return float(y.sum().item())


def p_stream_sync():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((N,), 1.0, device=dev)
    y = side(main, s, x)
    s.synchronize()
    del x
    return float(y.sum().item())


def p_event_sync():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((N,), 1.0, device=dev)
    y = side(main, s, x)
    e = torch.cuda.Event()
    e.record(s)
    e.synchronize()
    del x
    return float(y.sum().item())


def p_event_query():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((N,), 1.0, device=dev)
    y = side(main, s, x)
    e = torch.cuda.Event()
    e.record(s)
    while not e.query():
        time.sleep(0.001)
    del x
    return float(y.sum().item())


def p_device_sync():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((N,), 1.0, device=dev)
    y = side(main, s, x)
    torch.cuda.synchronize()
    del x
    return float(y.sum().item())


def p_graph():
    main = torch.cuda.current_stream()
    static_x = torch.ones(N, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(main)
    with torch.cuda.stream(s):  # warm-up on a side stream, as PyTorch's docs do it
        for _ in range(3):
            a = static_x * 2
            b = static_x + 1
            out = a + b
    main.wait_stream(s)
    g = torch.cuda.CUDAGraph()
    fork = torch.cuda.Stream()
    with torch.cuda.graph(g):
        cap = torch.cuda.current_stream()
        fork.wait_stream(cap)
        with torch.cuda.stream(fork):
            a = static_x * 2
        b = static_x + 1
        cap.wait_stream(fork)
        out = a + b
    total = 0.0
    for i in range(5):
        static_x.fill_(float(i))
        g.replay()
        total += float(out.sum().item())
    return total


def p_dataloader():
    from torch.utils.data import DataLoader, TensorDataset
    ds = TensorDataset(torch.randn(1024, 256), torch.randint(0, 10, (1024,)))
    dl = DataLoader(ds, batch_size=64, pin_memory=True, num_workers=2)
    w = torch.randn(256, 10, device=dev, requires_grad=True)
    total = 0.0
    for xb, yb in dl:
        xb = xb.to(dev, non_blocking=True)
        yb = yb.to(dev, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(xb @ w, yb)
        loss.backward()
        total += float(loss.item())
    return total


def p_compile():
    m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)).to(dev)
    cm = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(5):
        x = torch.randn(64, 512, device=dev)
        loss = cm(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return float(loss.item())


def p_fsdp_resize():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    src = torch.randn(N, device=dev)
    total = 0.0
    for _ in range(5):
        buf = torch.empty(N, device=dev)
        s.wait_stream(main)
        with torch.cuda.stream(s):  # the "all-gather" into the unsharded buffer
            torch.cuda._sleep(SLEEP // 4)
            buf.copy_(src)
        main.wait_stream(s)
        total += float((buf * 2).sum().item())
        buf.untyped_storage().resize_(0)  # freed after the wait, as FSDP frees a parameter
    return total


def p_h2d_side():
    main, s = torch.cuda.current_stream(), torch.cuda.Stream()
    total = 0.0
    for _ in range(5):
        cpu = torch.randn(N).pin_memory()
        with torch.cuda.stream(s):
            g = cpu.to(dev, non_blocking=True)
        main.wait_stream(s)
        g.record_stream(main)  # used on the main stream, allocated (and freed) on s
        total += float((g * 2).sum().item())
        del g
    return total


def legacy_blocking(early_destroy):
    import cupy
    cs = cupy.cuda.Stream(non_blocking=False)  # a blocking stream: ordered with the legacy one
    b = torch.cuda.ExternalStream(cs.ptr)
    total = 0.0
    for _ in range(5):
        x = torch.full((N,), 1.0, device=dev)  # on the legacy default stream
        with torch.cuda.stream(b):
            torch.cuda._sleep(SLEEP // 4)
            y = x * 3
        del x  # freed on the legacy stream, which waits for the blocking stream's work first
        z = torch.full((N,), -1.0, device=dev)
        total += float((y + z).sum().item())
    if early_destroy:
        # As the first version of this pattern ended (SIGSEGV under isolate mode on the H200,
        # eleventh session): CuPy's stream may be destroyed before `y`, which PyTorch's
        # stream-ordered backend frees on it (its creation stream) — a free on a destroyed
        # stream. Kept for diag_patterns.sh: plain / backend alone / isolate say whose crash.
        del cs
        return total
    del y, z  # freed on their streams while CuPy's stream still exists
    torch.cuda.synchronize()
    return total


def p_legacy_blocking():
    return legacy_blocking(False)


def p_legacy_blocking_early_destroy():
    return legacy_blocking(True)


def p_nccl():
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device(dev, 0))
    main, comm = torch.cuda.current_stream(), torch.cuda.Stream()
    total = 0.0
    for _ in range(5):
        g = torch.randn(N, device=dev)
        comm.wait_stream(main)
        with torch.cuda.stream(comm):
            work = dist.all_reduce(g, async_op=True)
            done = g * 1  # the side stream's own use of g
        work.wait()
        main.wait_stream(comm)
        total += float((done + g).sum().item())
        del g, done
    dist.destroy_process_group()
    return total


PATTERNS = {k[2:]: v for k, v in globals().items() if k.startswith("p_")}

warm()
t0 = time.perf_counter()
if name in ("race", "race_sleep"):
    r = race(name == "race_sleep")
else:
    r = PATTERNS[name]()
torch.cuda.synchronize()
print("RESULT", name, r, "%.3f" % (time.perf_counter() - t0), flush=True)
'''

RACES = ["race", "race_sleep"]
PATTERNS = ["record_stream", "wait_stream", "event_wait", "stream_sync", "event_sync",
            "event_query", "device_sync", "graph", "dataloader", "compile", "fsdp_resize",
            "h2d_side", "legacy_blocking", "nccl"]
SANITIZED = RACES + ["record_stream", "wait_stream", "event_wait", "fsdp_resize"]
MODELS = [m for m in os.environ.get("ORDER_MODELS", "gpt2,resnet50,bert").split(",") if m]


class Ctx:
    def __init__(self, args):
        self.lib = os.path.abspath(args.lib)
        self.isolate = os.path.abspath(args.isolate)
        self.out = os.environ.get("OUT", "/tmp/order-check-out")
        self.logs = os.path.join(self.out, "order")
        os.makedirs(self.logs, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="order-check-")
        self.worker = os.path.join(self.work, "worker.py")
        with open(self.worker, "w") as f:
            f.write(WORKER)
        self.start = time.monotonic()
        self.budget = float(os.environ.get("ORDER_BUDGET_S", "540"))
        self.results = {}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)


def run(ctx, tag, cmd, env_delta, timeout):
    """Runs one command; returns (rc, wall seconds, stdout, stderr), the log written."""
    env = dict(os.environ)
    env.update(env_delta)
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=max(5, min(timeout, ctx.left())))
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        rc, out, err = 124, text(e.stdout), text(e.stderr)
    wall = time.monotonic() - t0
    with open(os.path.join(ctx.logs, tag + ".log"), "w") as f:
        f.write(f"$ {' '.join(cmd)}\nenv {env_delta}\nrc {rc} wall {wall:.1f}s\n--- stdout\n{out}\n"
                f"--- stderr\n{err[-40000:]}\n")
    return rc, wall, out, err


def isolated(ctx, tag, args, extra=None, timeout=300):
    """A run under the library in isolate mode; returns (rc, wall, stdout, stderr, summary)."""
    tdir = os.path.join(ctx.work, tag)
    os.makedirs(tdir, exist_ok=True)
    env = {"LD_PRELOAD": ctx.lib, "ISOLATE_MODE": "isolate",
           "ISOLATE_TRACE": os.path.join(tdir, "t-%p.trace")}
    env.update(extra or {})
    rc, wall, out, err = run(ctx, tag, [sys.executable] + args, env, timeout)
    traces = sorted(os.path.join(tdir, f) for f in os.listdir(tdir) if f.endswith(".trace"))
    summary = None
    if traces:
        p = subprocess.run([ctx.isolate, "summary", "--json"] + traces, capture_output=True,
                           text=True, timeout=300)
        try:
            summary = json.loads(p.stdout)
        except ValueError:
            summary = None
        text = subprocess.run([ctx.isolate, "summary"] + traces, capture_output=True, text=True,
                              timeout=300).stdout
        with open(os.path.join(ctx.logs, tag + ".log"), "a") as f:
            f.write("--- isolate summary\n" + text)
    return rc, wall, out, err, summary


def place(stack):
    return (stack or {}).get("place") or "-"


def unordered(summary):
    if not isinstance(summary, dict):
        return None, []
    return summary.get("freed_in_use_count"), summary.get("freed_in_use") or []


def table(headers, rows):
    widths = [max(len(str(x)) for x in [h] + [r[i] for r in rows]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))
    print(line(headers))
    for r in rows:
        print(line(r))
    sys.stdout.flush()


def section_race(ctx):
    rows, data = [], []
    for name in RACES:
        for i in range(5):
            if ctx.left() < 30:
                break
            rc, wall, out, err, s = isolated(ctx, f"race-{name}-{i}", [ctx.worker, name])
            n, found = unordered(s)
            f = found[0] if found else {}
            sites = (place(f.get("free_stack")), place(f.get("use_stack")), place(f.get("alloc_stack")))
            live = sum(1 for l in err.splitlines() if "FREED IN USE" in l)
            result = next((l.split(None, 2)[2] for l in out.splitlines() if l.startswith("RESULT")), "-")
            ok = rc == 0 and n == 1 and live == 1 and all(":" in x for x in sites)
            rows.append([name, i, rc, n, live, sites[0], sites[1], sites[2], result[:40],
                         "PASS" if ok else "FAIL"])
            data.append({"script": name, "run": i, "rc": rc, "unordered": n, "lines": live,
                         "freed_at": sites[0], "used_at": sites[1], "allocated_at": sites[2],
                         "result": result, "wall_s": round(wall, 1), "pass": ok,
                         "use": f.get("use_name"), "free_stream": f.get("free_stream"),
                         "use_stream": f.get("use_stream")})
    print("\n== race: the missing record_stream, isolate mode (1 unordered free each, three sites)")
    table(["script", "run", "rc", "found", "lines", "freed at", "used at", "allocated at",
           "y.sum(), z[0]", "check"], rows)
    ctx.results["race"] = data


def section_patterns(ctx):
    rows, data = [], []
    for name in PATTERNS:
        if ctx.left() < 30:
            break
        rc, wall, out, err, s = isolated(ctx, f"pattern-{name}", [ctx.worker, name])
        n, found = unordered(s)
        counted = (s or {}).get("findings") if isinstance(s, dict) else None
        ok = rc == 0 and n == 0
        note = ""
        if found:
            f = found[0]
            note = f"{f.get('use_name')} freed at {place(f.get('free_stack'))}"
        rows.append([name, rc, n, counted, f"{wall:.1f}", "PASS" if ok else "FAIL", note[:80]])
        data.append({"pattern": name, "rc": rc, "unordered": n, "findings": counted,
                     "wall_s": round(wall, 1), "pass": ok, "first": found[:1]})
    print("\n== patterns: correctly ordered programs, isolate mode (0 unordered frees each)")
    table(["pattern", "rc", "unordered", "findings", "wall s", "check", "first finding"], rows)
    ctx.results["patterns"] = data


def section_sanitizer(ctx):
    tool = os.environ.get("COMPUTE_SANITIZER") or "compute-sanitizer"
    rows, data = [], []

    def one(name):
        env = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
        rc, wall, out, err = run(ctx, f"sanitizer-{name}",
                                 [tool, "--tool", "memcheck", "--track-stream-ordered-races", "all",
                                  sys.executable, ctx.worker, name], env, 480)
        text = out + err
        m = re.search(r"ERROR SUMMARY: (\d+) error", text)
        uaf = len(re.findall(r"use-after-free|after it is free|potentially accessed after", text,
                             re.IGNORECASE))
        prc, pwall, _, _ = run(ctx, f"plain-{name}", [sys.executable, ctx.worker, name], env, 300)
        irc, iwall, _, _, s = isolated(ctx, f"isolate-{name}", [ctx.worker, name])
        n, found = unordered(s)
        return name, rc, wall, (int(m.group(1)) if m else None), uaf, prc, pwall, n, iwall

    # All at once (one GPU, 16 cores): a sanitized PyTorch start-up takes minutes.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(SANITIZED)) as pool:
        got = list(pool.map(one, SANITIZED))
    for name, rc, wall, errors, uaf, prc, pwall, n, iwall in got:
        rows.append([name, rc, errors if errors is not None else "-", uaf, f"{wall:.1f}",
                     f"{pwall:.1f}", n if n is not None else "-", f"{iwall:.1f}"])
        data.append({"script": name, "rc": rc, "errors": errors, "use_after_free_lines": uaf,
                     "wall_s": round(wall, 1), "plain_wall_s": round(pwall, 1),
                     "isolate_unordered": n, "isolate_wall_s": round(iwall, 1)})
    print("\n== sanitizer: compute-sanitizer memcheck --track-stream-ordered-races all "
          "(backend:cudaMallocAsync, no library) beside isolate mode")
    table(["script", "rc", "errors", "uaf lines", "sanitizer s", "plain s", "isolate found",
           "isolate s"], rows)
    ctx.results["sanitizer"] = data


COST_WORKER = r'''
import sys, time, torch
sys.path.insert(0, sys.argv[4])
import models_check
work, warm, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ns = {}
sys.argv = ["worker", work, str(warm)]
exec(models_check.WORKER, ns)  # builds the model and trains `warm` steps (prints LOSS)
step = ns["step"]
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    l = step()
torch.cuda.synchronize()
print("STEP_MS", (time.perf_counter() - t0) * 1e3 / steps, flush=True)
'''


def section_cost(ctx):
    path = os.path.join(ctx.work, "cost_worker.py")
    with open(path, "w") as f:
        f.write(COST_WORKER)
    warm, steps = int(os.environ.get("ORDER_WARM", "8")), int(os.environ.get("ORDER_STEPS", "30"))
    times = {(m, o): [] for m in MODELS for o in ("off", "on")}
    found = {(m, o): [] for m in MODELS for o in ("off", "on")}
    for rnd in range(3):
        for m in MODELS:
            order = ("off", "on") if (rnd + MODELS.index(m)) % 2 == 0 else ("on", "off")
            for o in order:
                if ctx.left() < 45:
                    break
                rc, wall, out, err, s = isolated(
                    ctx, f"cost-{m}-{o}-{rnd}", [path, m, str(warm), str(steps), HERE],
                    {"ISOLATE_TEST_ORDER": o}, timeout=400)
                ms = next((float(l.split()[1]) for l in out.splitlines() if l.startswith("STEP_MS")), None)
                if ms is not None and rc == 0:
                    times[(m, o)].append(ms)
                n, _ = unordered(s)
                found[(m, o)].append(n)
    rows, data = [], []
    for m in MODELS:
        off, on = times[(m, "off")], times[(m, "on")]
        mo = statistics.median(off) if off else None
        mn = statistics.median(on) if on else None
        ratio = (mn / mo) if mo and mn else None
        rows.append([m, " ".join(f"{x:.1f}" for x in off) or "-", " ".join(f"{x:.1f}" for x in on) or "-",
                     f"{mo:.2f}" if mo else "-", f"{mn:.2f}" if mn else "-",
                     f"{ratio:.3f}" if ratio else "-", found[(m, "on")],
                     ("GOAL-MET" if ratio <= 1.03 else "GOAL-MISSED") if ratio else "-"])
        data.append({"model": m, "off_ms": off, "on_ms": on, "off_median": mo, "on_median": mn,
                     "ratio": ratio, "unordered_on": found[(m, "on")], "unordered_off": found[(m, "off")]})
    print(f"\n== cost: isolate mode step time, ISOLATE_TEST_ORDER=off vs on, 3 interleaved rounds "
          f"({warm} warm-up + {steps} timed steps)")
    table(["model", "off ms (rounds)", "on ms (rounds)", "off med", "on med", "on/off",
           "unordered (on)", "goal <=1.03"], rows)
    ctx.results["cost"] = data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--isolate", required=True)
    ap.add_argument("sections", nargs="*")
    args = ap.parse_args()
    ctx = Ctx(args)
    sections = args.sections or ["race", "patterns", "sanitizer", "cost"]
    for s in sections:
        {"race": section_race, "patterns": section_patterns, "sanitizer": section_sanitizer,
         "cost": section_cost}[s](ctx)
    path = os.path.join(ctx.out, "order_check.json")
    old = {}
    if os.path.exists(path):
        try:
            old = json.load(open(path))
        except ValueError:
            old = {}
    old.update(ctx.results)
    json.dump(old, open(path, "w"), indent=1)
    failed = [d for k in ("race", "patterns") for d in ctx.results.get(k, []) if not d["pass"]]
    print(f"\nlogs: {ctx.logs}; {len(failed)} checks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
