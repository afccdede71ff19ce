"""Triton kernels for the planted bugs (a module of its own: Triton reads the kernel's source and
resolves its globals, so it must live at module level, imported only where Triton is wanted)."""

import torch
import triton
import triton.language as tl


@triton.jit
def stale_fill_triton(ptr, begin, end, value, BLOCK: tl.constexpr):
    offsets = begin + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offsets, value, mask=offsets < end)


class RawPointer:
    """A bare device address, passed to Triton as a float32 pointer (Triton takes any object
    with `data_ptr()` and `dtype`), so nothing owns or checks the memory behind it."""

    def __init__(self, ptr: int):
        self.ptr = ptr
        self.dtype = torch.float32
        self.device = torch.device("cuda", torch.cuda.current_device())

    def data_ptr(self) -> int:
        return self.ptr


def fill(ptr: int, begin: int, end: int, value: float) -> None:
    block = 1024
    grid = (triton.cdiv(end - begin, block),)
    stale_fill_triton[grid](RawPointer(ptr), begin, end, value, BLOCK=block)
