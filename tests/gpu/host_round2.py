"""Issue 33, item 2, with PyTorch: frees made on threads that have made no CUDA call before.

  thread-free   64 tensors allocated on the main thread, each deleted (its last reference dropped)
                on a fresh threading.Thread; then a new tensor is allocated and summed
  pin-workers   a DataLoader with 2 workers and pin_memory=True (the pin-memory thread allocates
                and frees pinned host memory on a thread of its own): 20 batches moved to the GPU
                and summed

Prints one line `case=... result=<number> error=<none|text>`; exit 0 when no exception was raised.

Usage: python3 tests/gpu/host_round2.py thread-free|pin-workers
"""

import sys
import threading


def thread_free(torch) -> float:
    holders = [[torch.full((1 << 18,), float(i), device="cuda")] for i in range(64)]
    torch.cuda.synchronize()
    errors = []

    def drop(h):
        try:
            h.pop()  # the tensor's last reference: its memory is freed on this thread
        except Exception as e:  # noqa: BLE001 - any error is the result
            errors.append(repr(e))

    threads = [threading.Thread(target=drop, args=(h,)) for h in holders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    z = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    return float(z.sum().item())


def pin_workers(torch) -> float:
    from torch.utils.data import DataLoader, Dataset

    class Numbers(Dataset):
        def __len__(self):
            return 20 * 8

        def __getitem__(self, i):
            return torch.full((4096,), float(i))

    loader = DataLoader(Numbers(), batch_size=8, num_workers=2, pin_memory=True)
    total = 0.0
    for batch in loader:
        total += float(batch.to("cuda", non_blocking=True).sum().item())
    return total


def main() -> int:
    import torch

    case = sys.argv[1]
    fn = {"thread-free": thread_free, "pin-workers": pin_workers}[case]
    try:
        result = fn(torch)
        print(f"case={case} result={result} error=none", flush=True)
        return 0
    except Exception as e:  # noqa: BLE001
        print(f"case={case} result=nan error={str(e)[:200]!r}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
