"""Planted bug: a kernel writes element n of an n-element float32 tensor (one past the end).

RESULT: the tensor's address and size, the address written, and the CUDA error if the write
faulted (guard mode, compute-sanitizer). Exit status 3 when a CUDA error was caught.
"""

import argparse
import sys

import workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="elements (float32)")
    workload.add_history_args(parser)
    args = parser.parse_args()

    import torch

    workload.start_history(args)
    t = torch.zeros(args.n, device="cuda")
    ptr = t.data_ptr()
    nbytes = t.numel() * t.element_size()
    result = {
        "bug": "oob",
        "n": args.n,
        "ptr": hex(ptr),
        "nbytes": nbytes,
        "multiple_of_2mib": nbytes % (2 << 20) == 0,
        "written": hex(ptr + nbytes),
        "target": hex(ptr),
        "target_bytes": nbytes + 4,
        "error": None,
    }
    try:
        workload.cupy_fill(ptr, args.n, args.n + 1, 1.0)  # p[n] = 1.0
        torch.cuda.synchronize()
    except Exception as err:
        result["error"] = workload.error_text(err)
    workload.finish_history(args, result)
    workload.emit(result)
    return 0 if result["error"] is None else 3


if __name__ == "__main__":
    sys.exit(main())
