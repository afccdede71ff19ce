#!/usr/bin/env python3
"""The memory_viz size comparison's two halves (tests/gpu/memviz_size.sh runs them).

    python3 tests/gpu/memviz_size.py train [--steps 10] [--torch-snapshot PATH]
    python3 tests/gpu/memviz_size.py measure PICKLE

`train`: a GPT-2 (transformers, 6 layers, d_model 512, 8 heads, 256 positions, GPT-2's
vocabulary) trained for `--steps` AdamW steps on random tokens, batch 16 x 256, on cuda:0;
built from its config (no download). With `--torch-snapshot`, PyTorch records its allocator's
history with Python stacks (`torch.cuda.memory._record_memory_history(stacks="python")`) from
before the model is made to the end, and `_dump_snapshot`s it to PATH. Prints one `RESULT` line.

`measure`: one JSON line about a snapshot pickle: its bytes, its `device_traces` entries, how
many are `alloc`, the frames they carry in all and the distinct frames, and the bytes of
`pickle.dumps` of what `pickle.load` gave (what `_memory_viz trace_plot` embeds in its page).
"""

import argparse
import json
import pickle
import sys
import time


def train(a):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if a.torch_snapshot:
        torch.cuda.memory._record_memory_history(stacks="python")
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=256)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.time()
    loss = None
    for _ in range(a.steps):
        x = torch.randint(0, cfg.vocab_size, (16, 256), device="cuda")
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = time.time() - t0
    if a.torch_snapshot:
        torch.cuda.memory._dump_snapshot(a.torch_snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    print(f"RESULT steps={a.steps} loss={loss.item():.3f} seconds={dt:.2f} "
          f"peak_allocated={torch.cuda.max_memory_allocated()}", flush=True)


def measure(a):
    with open(a.pickle, "rb") as f:
        raw = f.read()
    s = pickle.loads(raw)
    entries = allocs = frames_total = 0
    distinct = set()
    for dev in s.get("device_traces", []):
        for e in dev:
            entries += 1
            allocs += e.get("action") == "alloc"
            fs = e.get("frames", [])
            frames_total += len(fs)
            for f in fs:
                distinct.add((f["filename"], f["line"], f["name"]))
    for seg in s.get("segments", []):
        for f in seg.get("frames", []):
            distinct.add((f["filename"], f["line"], f["name"]))
    print(json.dumps({
        "bytes": len(raw),
        "entries": entries,
        "allocs": allocs,
        "segments": len(s.get("segments", [])),
        "frames_in_entries": frames_total,
        "distinct_frames": len(distinct),
        "dumps_bytes": len(pickle.dumps(s)),
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--torch-snapshot")
    m = sub.add_parser("measure")
    m.add_argument("pickle")
    a = ap.parse_args()
    {"train": train, "measure": measure}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
