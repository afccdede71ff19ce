"""Helpers shared by the workloads (train_*.py, bug_*.py): the RESULT line, PyTorch's memory
history, device memory sampling, the planted-bug kernels.

Workloads print exactly one `RESULT {json}` line; the driver (common.parse_result) reads it.
torch, CuPy and Triton are imported lazily, so `--help` works anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def emit(result: dict) -> None:
    """The workload's one machine-readable line."""
    sys.stdout.flush()
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)


# --------------------------------------------------------------------------------------------
# PyTorch's memory history (`torch.cuda.memory._record_memory_history`), the tool users pick
# to find out what allocated what.


def add_history_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--history",
        choices=["off", "python", "all"],
        default="off",
        help="record PyTorch's memory history; 'all' is the default of "
        "_record_memory_history() (Python and C++ frames), 'python' Python frames only",
    )
    parser.add_argument("--snapshot", help="where to dump the snapshot (pickle)")


def start_history(args) -> None:
    import torch

    if args.history == "all":
        torch.cuda.memory._record_memory_history()  # the defaults, as users call it
    elif args.history == "python":
        torch.cuda.memory._record_memory_history(stacks="python")


def finish_history(args, result: dict) -> None:
    """Dump the snapshot and put its size and the dump time into `result`."""
    if args.history == "off":
        return
    import torch

    path = args.snapshot or f"/tmp/isolate-snapshot-{os.getpid()}.pickle"
    start = time.perf_counter()
    try:
        torch.cuda.memory._dump_snapshot(path)
        result["snapshot"] = {
            "bytes": os.path.getsize(path),
            "dump_s": time.perf_counter() - start,
            "stacks": args.history,
        }
    except Exception as err:  # a dump that fails is reported, not fatal
        result["snapshot"] = {"error": f"{type(err).__name__}: {err}"}
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


# --------------------------------------------------------------------------------------------
# Device memory as the driver sees it (what the process holds, not what PyTorch thinks it holds:
# quarantine and guard mappings live outside PyTorch's allocator).


class DeviceMemory:
    def __init__(self):
        import torch

        self._torch = torch
        self.start = self.used()
        self.peak = self.start

    def used(self) -> int:
        free, total = self._torch.cuda.mem_get_info()
        return total - free

    def sample(self) -> None:
        self.peak = max(self.peak, self.used())

    def as_dict(self) -> dict:
        return {
            "device_used_start": self.start,
            "device_used_peak": self.peak,
            "device_used_delta": self.peak - self.start,
        }


# --------------------------------------------------------------------------------------------
# Kernels that write through a raw device pointer, the way a stale pointer is used in real code
# (a custom extension, a CuPy or Triton kernel handed an address PyTorch has freed).

FILL_SOURCE = r"""
extern "C" __global__ void stale_fill(float* p, int begin, int end, float value) {
    int i = begin + blockIdx.x * blockDim.x + threadIdx.x;
    if (i < end) p[i] = value;
}
"""


def cupy_fill(ptr: int, begin: int, end: int, value: float) -> None:
    """`p[begin:end] = value` with a CuPy RawKernel named `stale_fill`, on the legacy stream.

    The pointer goes in as a plain 64-bit integer: no CuPy memory object is built over it, so
    CuPy asks the driver nothing about the address (in guard mode it is unmapped).
    """
    import cupy
    import numpy

    kernel = cupy.RawKernel(FILL_SOURCE, "stale_fill")
    threads = 256
    blocks = max(1, (end - begin + threads - 1) // threads)
    kernel(
        (blocks,),
        (threads,),
        (numpy.uint64(ptr), numpy.int32(begin), numpy.int32(end), numpy.float32(value)),
    )


def triton_fill(ptr: int, begin: int, end: int, value: float) -> None:
    """The same write with a Triton kernel named `stale_fill_triton`."""
    import triton_kernels

    triton_kernels.fill(ptr, begin, end, value)


def memset_bytes(ptr: int, nbytes: int, byte: int = 0) -> None:
    """`cudaMemset(ptr, byte, nbytes)` through the runtime PyTorch loaded (no kernel launch)."""
    import ctypes

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise RuntimeError("no libcudart found for cudaMemset")
    cudart.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    cudart.cudaMemset.restype = ctypes.c_int
    err = cudart.cudaMemset(ctypes.c_void_p(ptr), byte, nbytes)
    if err != 0:
        raise RuntimeError(f"cudaMemset returned {err}")


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip()[:2000]
