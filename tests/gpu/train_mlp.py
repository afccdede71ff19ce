"""The MLP of the notes: 1024-4096-1024, batch 256, AdamW, MSE on fixed random data.

RESULT: ms/step (median over the steps after warm-up, each step timed to
torch.cuda.synchronize), the final loss, torch.cuda.max_memory_allocated, and the caching
allocator's own counters (segments and device allocations) for cross-checks with the trace.
"""

import argparse
import statistics
import sys
import time

import workload

STAT_KEYS = (
    "segment.all.allocated",
    "segment.all.freed",
    "num_device_alloc",
    "num_device_free",
    "num_alloc_retries",
    "allocation.all.allocated",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps in all, warm-up included")
    parser.add_argument("--warmup", type=int, default=5, help="steps not timed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    target = torch.randn(256, 1024, device="cuda")

    times = []
    loss = None
    for step in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)

    stats = torch.cuda.memory_stats()
    workload.emit(
        {
            "model": "mlp",
            "steps": args.steps,
            "timed_steps": len(times),
            "ms_per_step": statistics.median(times) if times else None,
            "final_loss": float(loss.item()) if loss is not None else None,
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "allocator_stats": {k: stats.get(k) for k in STAT_KEYS},
            "allocator_backend": torch.cuda.get_allocator_backend(),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
