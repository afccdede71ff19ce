"""Planted bug: a write through a pointer to a tensor PyTorch has already freed.

    x = torch.zeros(2**20); p = x.data_ptr(); del x
    y = torch.full((2**20,), 7.0)        # the allocator hands y x's memory
    kernel(p)[1024:2048] = 1.0            # lands in y

RESULT: p, y's address, whether y got x's address, how many elements of y were corrupted, and
the CUDA error if the write faulted (guard mode). Exit status 3 when a CUDA error was caught.
"""

import argparse
import sys

import workload

N = 2**20  # float32 elements: 4 MiB
BEGIN, END = 1024, 2048  # elements written through the stale pointer: bytes 4096..8191
VALUE = 7.0


def write_stale(writer: str, ptr: int) -> None:
    if writer == "cupy":
        workload.cupy_fill(ptr, BEGIN, END, 1.0)
    elif writer == "triton":
        workload.triton_fill(ptr, BEGIN, END, 1.0)
    else:
        workload.memset_bytes(ptr + BEGIN * 4, (END - BEGIN) * 4, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writer", choices=["cupy", "triton", "memset"], default="cupy")
    workload.add_history_args(parser)
    args = parser.parse_args()

    import torch

    workload.start_history(args)
    x = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    p = x.data_ptr()
    nbytes = x.numel() * x.element_size()
    del x
    y = torch.full((N,), VALUE, device="cuda")
    result = {
        "bug": "stale_write",
        "writer": args.writer,
        "p": hex(p),
        "nbytes": nbytes,
        "y_ptr": hex(y.data_ptr()),
        "same_address": y.data_ptr() == p,
        "first_offset": BEGIN * 4,
        "write_bytes": (END - BEGIN) * 4,
        # What the driver matches tool reports against: the freed allocation.
        "target": hex(p),
        "target_bytes": nbytes,
        "error": None,
        "corrupted": None,
    }
    try:
        write_stale(args.writer, p)
        torch.cuda.synchronize()
        result["corrupted"] = int((y != VALUE).sum().item())
    except Exception as err:  # guard mode: the write faults ("illegal memory access")
        result["error"] = workload.error_text(err)
    result["correct"] = result["corrupted"] == 0 if result["error"] is None else None
    workload.finish_history(args, result)
    workload.emit(result)
    return 0 if result["error"] is None else 3


if __name__ == "__main__":
    sys.exit(main())
