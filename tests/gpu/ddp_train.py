"""A small MLP trained with DistributedDataParallel over NCCL, one process per GPU.

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/gpu/ddp_train.py
    python3 -m torch.distributed.run --standalone --nproc-per-node 1 tests/gpu/ddp_train.py

Model: 1024-2048-2048-2048-1024 with ReLU (about 12.6M parameters, so DDP's 25 MB buckets make
a few all-reduces a step), SGD with momentum, MSE on 8 fixed batches of random data per rank
(seed 1000 × --seed + rank + 1: ranks see different data, so their gradients really are averaged).
Parameters start from --seed on every rank (DDP broadcasts rank 0's anyway). Deterministic
algorithms, no TF32: the loss curve depends only on the seed and the world size, whatever the
allocator or the preload, which is what run_ddp.sh compares.

Every rank prints one `RANK_RESULT {json}` line (its rank, device, losses, memory and the caching
allocator's counters); rank 0 also prints `RESULT {json}`: the losses of every 10th step and of
the last (`loss_steps`, `losses`), ms/step (median, each step timed to torch.cuda.synchronize),
the world size and torch.cuda.max_memory_allocated (rank 0's; every rank's is in
`max_memory_allocated_by_rank`).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

# Before torch loads: the same cuBLAS workspace in every run, for reproducible results under
# torch.use_deterministic_algorithms.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

WIDTHS = (1024, 2048, 2048, 2048, 1024)
BATCH = 64
BATCHES = 8


def emit(tag: str, result: dict) -> None:
    sys.stdout.flush()
    print(f"{tag} " + json.dumps(result, sort_keys=True), flush=True)


def nccl_version(torch) -> str:
    v = torch.cuda.nccl.version()  # (2, 27, 5) in recent PyTorch, 22705 in old ones
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of ms/step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=10, help="report the loss of every Nth step")
    parser.add_argument(
        "--timeout-s", type=float, default=180, help="NCCL collective timeout (a hang fails)"
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not torch.cuda.is_available():
        print(f"rank {rank}: no CUDA device", file=sys.stderr)
        return 2
    if local_rank >= torch.cuda.device_count():
        print(
            f"rank {rank}: LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs",
            file=sys.stderr,
        )
        return 2
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)

    # device_id: the NCCL communicator is created here, on this rank's GPU, not at the first
    # collective on a guessed one.
    dist.init_process_group(
        backend="nccl",
        timeout=datetime.timedelta(seconds=args.timeout_s),
        device_id=device,
    )
    if dist.get_world_size() != world:
        print(f"rank {rank}: WORLD_SIZE {world} but the group has {dist.get_world_size()}")
        return 2

    torch.manual_seed(args.seed)
    layers = []
    for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(WIDTHS) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(device)
    ddp = DDP(model, device_ids=[local_rank], output_device=local_rank)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    g = torch.Generator(device="cpu").manual_seed(args.seed * 1000 + rank + 1)
    xs = torch.randn(BATCHES, BATCH, WIDTHS[0], generator=g).to(device)
    ys = torch.randn(BATCHES, BATCH, WIDTHS[-1], generator=g).to(device)

    losses, times = [], []
    wall_start = time.perf_counter()
    for i in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(xs[i % BATCHES]), ys[i % BATCHES])
        loss.backward()  # DDP all-reduces the gradient buckets here
        opt.step()
        torch.cuda.synchronize()
        if i >= min(args.warmup, args.steps - 1):
            times.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.detach())
    wall = time.perf_counter() - wall_start

    all_losses = torch.stack(losses).float().cpu().tolist()
    reported = sorted({*range(0, args.steps, max(1, args.every)), args.steps - 1})
    stats = torch.cuda.memory_stats(device)
    mine = {
        "rank": rank,
        "local_rank": local_rank,
        "device": local_rank,
        "pid": os.getpid(),
        "loss_steps": reported,
        "losses": [all_losses[s] for s in reported],
        "final_loss": all_losses[-1],
        "ms_per_step": statistics.median(times),
        "max_memory_allocated": torch.cuda.max_memory_allocated(device),
        "max_memory_reserved": torch.cuda.max_memory_reserved(device),
        "num_device_alloc": stats.get("num_device_alloc", 0),
        "num_device_free": stats.get("num_device_free", 0),
    }
    emit("RANK_RESULT", mine)

    # Every rank's peak memory on rank 0 (a tensor all-gather over NCCL; no object pickling).
    peak = torch.tensor([mine["max_memory_allocated"]], dtype=torch.int64, device=device)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if rank == 0:
        emit(
            "RESULT",
            {
                "world_size": world,
                "steps": args.steps,
                "seed": args.seed,
                "loss_steps": mine["loss_steps"],
                "losses": mine["losses"],
                "final_loss": mine["final_loss"],
                "ms_per_step": mine["ms_per_step"],
                "train_s": wall,
                "max_memory_allocated": mine["max_memory_allocated"],
                "max_memory_allocated_by_rank": [int(p.item()) for p in peaks],
                "torch": torch.__version__,
                "nccl": nccl_version(torch),
                "parameters": sum(p.numel() for p in model.parameters()),
            },
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
