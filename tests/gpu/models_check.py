#!/usr/bin/env python3
"""Real models under the library, for a session's sanity check of findings (issues 29, 30).

    python3 tests/gpu/models_check.py --lib target/gpu/libisolate.so --isolate target/gpu/isolate \
        [--runs 1] [--steps 12] [--workloads bert,gpt2,resnet50] [--modes isolate]

Each workload trains a model from an installed library with random weights:
  bert      transformers BertForMaskedLM (6 layers, d512, 8 heads), AdamW, batch 32 x 128, under
            torch.autocast(bfloat16)
  gpt2      transformers GPT2LMHeadModel (6 layers, d512), AdamW, batch 16 x 256
  resnet50  torchvision resnet50, SGD, batch 32 x 128^2
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
    ap.add_argument("--modes", default="isolate")
    args = ap.parse_args()
    out = os.environ.get("OUT", "/tmp/models-out")
    logs = os.path.join(out, "models")
    os.makedirs(logs, exist_ok=True)
    work = tempfile.mkdtemp()
    wpath = os.path.join(work, "worker.py")
    open(wpath, "w").write(WORKER)
    rows = []
    print(f"{'workload':10} {'mode':8} {'run':3} {'rc':4} {'loss':>10}  findings")
    for run in range(args.runs):
        for w in args.workloads.split(","):
            for mode in args.modes.split(","):
                tdir = os.path.join(work, f"{w}-{mode}-{run}")
                os.makedirs(tdir)
                env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.lib), ISOLATE_MODE=mode,
                           ISOLATE_TRACE=os.path.join(tdir, "t-%p.trace"))
                p = subprocess.run([sys.executable, wpath, w, str(args.steps)], env=env,
                                   capture_output=True, text=True, timeout=300)
                loss = next((l.split()[1] for l in p.stdout.splitlines() if l.startswith("LOSS")), "-")
                traces = sorted(os.path.join(tdir, f) for f in os.listdir(tdir) if f.endswith(".trace"))
                text = subprocess.run([args.isolate, "summary"] + traces, capture_output=True,
                                      text=True).stdout if traces else ""
                js = subprocess.run([args.isolate, "summary", "--json"] + traces, capture_output=True,
                                    text=True).stdout if traces else ""
                head = next((l for l in text.splitlines() if l.lower().startswith("findings")), "(no trace)")
                live = [l for l in p.stderr.splitlines() if l.startswith("isolate:") and
                        ("STALE" in l or "LEAK" in l.upper() or "FAULT" in l.upper())]
                print(f"{w:10} {mode:8} {run:3} {p.returncode:4} {loss:>10}  {head[:110]}  live-lines={len(live)}",
                      flush=True)
                with open(os.path.join(logs, f"{w}-{mode}-{run}.log"), "w") as f:
                    f.write(p.stdout + "\n--- stderr\n" + p.stderr[-20000:] + "\n--- summary\n" + text)
                try:
                    summary = json.loads(js) if js else None
                except ValueError:
                    summary = None
                rows.append({"workload": w, "mode": mode, "run": run, "rc": p.returncode, "loss": loss,
                             "findings_line": head, "live_lines": len(live),
                             "findings": (summary or {}).get("findings") if isinstance(summary, dict) else None})
    json.dump(rows, open(os.path.join(out, "models_check.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
