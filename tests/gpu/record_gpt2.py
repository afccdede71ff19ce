#!/usr/bin/env python3
"""One GPT-2 training run recorded two ways at once, for the report's screenshots and the
memory_viz size comparison (issue 32): the library's trace (log mode, set by the caller's
LD_PRELOAD / ISOLATE_TRACE) and PyTorch's own snapshot with Python stacks.

    LD_PRELOAD=target/gpu/libisolate.so ISOLATE_TRACE=$OUT/gpt2-%p.trace \
        python3 tests/gpu/record_gpt2.py --steps 10 --snapshot $OUT/gpt2-torch.pickle

transformers GPT2LMHeadModel (6 layers, d512, 8 heads), AdamW, batch 16 x 256, no NVTX.
"""
import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--snapshot")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.snapshot:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=1_000_000)
    m = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8)).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    x = torch.randint(0, 50000, (16, 256), device="cuda")
    t0 = time.time()
    for _ in range(args.steps):
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"LOSS {loss.item():.4f} steps {args.steps} in {time.time() - t0:.2f} s", flush=True)
    if args.snapshot:
        torch.cuda.memory._dump_snapshot(args.snapshot)
        print("snapshot", args.snapshot, os.path.getsize(args.snapshot), "bytes", flush=True)


if __name__ == "__main__":
    main()
