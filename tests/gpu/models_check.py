#!/usr/bin/env python3
"""Real models under the library, for a session's sanity check of findings (issues 29, 30).

    python3 tests/gpu/models_check.py --lib target/gpu/libisolate.so --isolate target/gpu/isolate \
        [--runs 1] [--steps 12] [--workloads bert,gpt2,resnet50] [--modes isolate]

Each workload trains a model from an installed library with random weights:
  bert      transformers BertForMaskedLM (6 layers, d512, 8 heads), AdamW, batch 32 x 128, under
            torch.autocast(bfloat16)
  gpt2      transformers GPT2LMHeadModel (6 layers, d512), AdamW, batch 16 x 256
  resnet50  torchvision resnet50, SGD, batch 32 x 128^2
  vit       timm vit_small_patch16_224, AdamW, batch 32 x 224^2, bf16 autocast
  compiled  torch.compile(torchvision resnet18), SGD, batch 32 x 128^2
  cudagraph a whole training step of an MLP captured in a CUDA graph (side-stream warm-up), replayed
  dataloader torchvision resnet18 fed by a DataLoader with 2 workers and pin_memory
  growth    a correct step, plus one tensor with its graph kept per step (a leak: must be named)
  stale_launch  a planted bug: a kept raw pointer of a freed tensor wrapped again and filled by a
            PyTorch kernel (a stale launch and a stale write: must be named with the fill_ line)
Each run's trace is summarised (`isolate summary --json`); the table gives the exit status, the
losses' last value and the findings by kind (stale writes, stale launches, suspects, leaks...).
Writes $OUT/models_check.json and the logs to $OUT/models/.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import sys, torch
work, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
dev = "cuda"
if work == "bert":
    from transformers import BertConfig, BertForMaskedLM
    m = BertForMaskedLM(BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                                   intermediate_size=2048)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    x = torch.randint(0, 30000, (32, 128), device=dev)
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=x, labels=x).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
elif work == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    x = torch.randint(0, 50000, (16, 256), device=dev)
    def step():
        loss = m(input_ids=x, labels=x).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
elif work == "vit":
    import timm
    m = timm.create_model("vit_small_patch16_224", num_classes=1000).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    x = torch.randn(32, 3, 224, 224, device=dev); y = torch.randint(0, 1000, (32,), device=dev)
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
elif work == "compiled":
    import torchvision
    m = torch.compile(torchvision.models.resnet18().to(dev))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(32, 3, 128, 128, device=dev); y = torch.randint(0, 1000, (32,), device=dev)
    def step():
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
elif work == "cudagraph":
    # The whole training step captured once and replayed (PyTorch's "whole network capture").
    m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    sx = torch.randn(64, 1024, device=dev); sy = torch.randn(64, 1024, device=dev)
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(m(sx), sy).backward(); opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        sloss = torch.nn.functional.mse_loss(m(sx), sy)
        sloss.backward(); opt.step()
    def step():
        sx.copy_(torch.randn(64, 1024, device=dev)); g.replay()
        return sloss
elif work == "dataloader":
    import torchvision
    class Data(torch.utils.data.Dataset):
        def __len__(self): return 100000
        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return torch.randn(3, 64, 64, generator=g), i % 10
    it = iter(torch.utils.data.DataLoader(Data(), batch_size=32, num_workers=2, pin_memory=True))
    m = torchvision.models.resnet18(num_classes=10).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    def step():
        x, y = next(it)
        x = x.to(dev, non_blocking=True); y = y.to(dev, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
elif work == "stale_launch":
    # A planted bug: a raw pointer kept past its tensor's free (a stale data_ptr()), wrapped as a
    # tensor again (__cuda_array_interface__, zero-copy) and written by a PyTorch kernel: in
    # isolate mode a STALE LAUNCH naming the fill kernel and this file's fill_ line, and a STALE
    # WRITE naming the lines of the allocation and the free. Planted once, at the first step.
    class Raw:
        def __init__(self, ptr, n):
            self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False),
                                             "version": 3}
    m = torch.nn.Linear(256, 256).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(64, 256, device=dev)
    planted = []
    def step():
        if not planted:
            dead = torch.empty(1 << 18, device=dev)
            ptr = dead.data_ptr()
            del dead  # freed: its memory is quarantined in isolate mode
            stale = torch.as_tensor(Raw(ptr, 1 << 18), device=dev)
            stale.fill_(1.0)  # PLANTED: a kernel launched on the freed memory
            planted.append(ptr)
        loss = m(x).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
elif work == "growth":
    # A leak as users have it: each step's loss kept with its graph (`losses.append(loss)`).
    m = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device=dev)
    losses = []
    def step():
        loss = m(x).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        losses.append(m(x).sum())  # kept each step, with its graph
        return loss
else:
    import torchvision
    m = torchvision.models.resnet50().to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(32, 3, 128, 128, device=dev); y = torch.randint(0, 1000, (32,), device=dev)
    def step():
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
for i in range(steps):
    l = step()
print("LOSS", float(l.item()), flush=True)
'''


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--isolate", required=True)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--workloads", default="bert,gpt2,resnet50")
    ap.add_argument("--modes", default="isolate", help="isolate, fast (isolate mode's fast tier), guard, log, or none (no library)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (findings, not timings)")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    out = os.environ.get("OUT", "/tmp/models-out")
    logs = os.path.join(out, "models")
    os.makedirs(logs, exist_ok=True)
    work = tempfile.mkdtemp()
    wpath = os.path.join(work, "worker.py")
    open(wpath, "w").write(WORKER)
    rows = []
    jobs = [(run, w, mode) for run in range(args.runs) for w in args.workloads.split(",")
            for mode in args.modes.split(",")]

    def one(job):
        run, w, mode = job
        tdir = os.path.join(work, f"{w}-{mode}-{run}")
        os.makedirs(tdir)
        env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.lib), ISOLATE_MODE=mode,
                   ISOLATE_TRACE=os.path.join(tdir, "t-%p.trace"))
        if mode == "none":
            env.pop("LD_PRELOAD"); env.pop("ISOLATE_MODE")
        elif mode == "fast":  # isolate mode's fast tier (docs/isolation.md)
            env.update(ISOLATE_MODE="isolate", ISOLATE_CHECK="fast")
        elif mode == "guard":  # guard mode is isolate mode with ISOLATE_GUARD=on
            env.update(ISOLATE_MODE="isolate", ISOLATE_GUARD="on")
        try:
            p = subprocess.run([sys.executable, wpath, w, str(args.steps)], env=env,
                               capture_output=True, text=True, timeout=args.timeout)
            rc, stdout, stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = "T/O", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), \
                (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        loss = next((l.split()[1] for l in stdout.splitlines() if l.startswith("LOSS")), "-")
        traces = sorted(os.path.join(tdir, f) for f in os.listdir(tdir) if f.endswith(".trace"))
        text = subprocess.run([args.isolate, "summary"] + traces, capture_output=True,
                              text=True).stdout if traces else ""
        js = subprocess.run([args.isolate, "summary", "--json"] + traces, capture_output=True,
                            text=True).stdout if traces else ""
        head = next((l for l in text.splitlines() if l.lower().startswith("findings")), "(no trace)")
        live = [l for l in stderr.splitlines() if l.startswith("isolate:") and
                ("STALE" in l or "LEAK" in l.upper() or "FAULT" in l.upper())]
        with open(os.path.join(logs, f"{w}-{mode}-{run}.log"), "w") as f:
            f.write(stdout + "\n--- stderr\n" + stderr[-20000:] + "\n--- summary\n" + text)
        try:
            summary = json.loads(js) if js else None
        except ValueError:
            summary = None
        leak = [l.strip() for l in text.splitlines() if "leak" in l.lower() or "grow" in l.lower()][:3]
        print(f"{w:10} {mode:8} {run:3} {str(rc):4} {loss:>10}  {head[:110]}  live-lines={len(live)}"
              + (f"  | {' / '.join(leak)[:200]}" if leak else ""), flush=True)
        return {"workload": w, "mode": mode, "run": run, "rc": rc, "loss": loss,
                "findings_line": head, "live_lines": len(live), "leak_lines": leak,
                "findings": (summary or {}).get("findings") if isinstance(summary, dict) else None}

    print(f"{'workload':10} {'mode':8} {'run':3} {'rc':4} {'loss':>10}  findings", flush=True)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(one, jobs))
    json.dump(rows, open(os.path.join(out, "models_check.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
