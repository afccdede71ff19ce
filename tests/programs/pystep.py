"""A PyTorch-like training step's host side, from Python, on the stand-in CUDA (issue 31): what
the library's hooks cost a thread that runs Python, with Python frames to walk, measured by hand.

    STANDIN_SYNC=1 LD_LIBRARY_PATH=<stand-in> [LD_PRELOAD=libisolate.so ISOLATE_MODE=...] \\
        python3 pystep.py STEPS TENSORS [DEPTH [BYTES [THRASH_KB]]]

Each step makes TENSORS tensors, each a cudaMallocAsync on one stream (sizes cycling through a
fixed list, as a model's repeat every step), a kernel launch naming it and the two before it,
and a cudaFreeAsync four tensors later, all DEPTH (10) Python calls deep; then the stream is
synchronised. BYTES, when given, is every tensor's size instead (256: the stand-in's device
work, poisons and checks done by its CPU, then costs next to nothing; `-`: the list's sizes,
to give THRASH_KB after it). The kernel is a no-op. Prints the time per step and per tensor, timed inside the
program after 5 warm-up steps: run it without the library and with it, and the difference is
the hooks' time (docs/performance.md, "Hot path from Python"). THRASH_KB (default 0): before each
tensor's calls, that many KiB of the program's own memory are written, as a framework's own work
between two allocations evicts the library's data from the caches (the hooks then run cold, as in
a real step; counted with callgrind's cache simulation, docs/performance.md).
"""

import ctypes
import sys
import time

SIZES = [512, 4096, 1024, 16384, 32768, 512, 8192, 2048, 65536, 1024, 16384, 4096, 49152, 2048,
         32768, 8192]
LAG = 4

KERNEL = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


@KERNEL
def nothing(params):
    pass


def setup():
    rt = ctypes.CDLL("libcudart.so.13")
    drv = ctypes.CDLL("libcuda.so.1")
    rt.cudaMallocAsync.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]
    rt.cudaFreeAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    rt.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    drv.standin_register_kernel.restype = ctypes.c_void_p
    drv.standin_register_kernel.argtypes = [ctypes.c_char_p, KERNEL, ctypes.c_uint,
                                            ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    offsets = (ctypes.c_size_t * 3)(0, 8, 16)
    sizes = (ctypes.c_size_t * 3)(8, 8, 8)
    kernel = drv.standin_register_kernel(b"pystep_kernel", nothing, 3, offsets, sizes)
    fn = ctypes.c_void_p()
    status = ctypes.c_int()
    rt.cudaGetDriverEntryPoint.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                           ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
    if rt.cudaFree(None) != 0 or rt.cudaGetDriverEntryPoint(b"cuLaunchKernel", ctypes.byref(fn),
                                                            0, ctypes.byref(status)) != 0:
        sys.exit("no cuLaunchKernel")
    launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7),
                              ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                              ctypes.c_void_p)(fn.value)
    stream = ctypes.c_void_p()
    if rt.cudaStreamCreate(ctypes.byref(stream)) != 0:
        sys.exit("no stream")
    return rt, kernel, launch, stream


def step(rt, kernel, launch, stream, tensors, sizes, junk):
    held = [ctypes.c_void_p() for _ in range(tensors)]
    words = [ctypes.c_uint64() for _ in range(3)]
    params = (ctypes.c_void_p * 3)(*[ctypes.addressof(w) for w in words])
    failed = 0
    for i in range(tensors):
        if junk is not None:
            ctypes.memset(junk, i & 255, len(junk))
        failed += rt.cudaMallocAsync(ctypes.byref(held[i]), sizes[i % 16], stream) != 0
        words[0].value = held[i].value or 0
        words[1].value = held[max(i - 1, 0)].value or 0
        words[2].value = held[max(i - 2, 0)].value or 0
        failed += launch(kernel, 1, 1, 1, 1, 1, 1, 0, stream, params, None) != 0
        if i >= LAG:
            failed += rt.cudaFreeAsync(held[i - LAG], stream) != 0
    for i in range(max(tensors - LAG, 0), tensors):
        failed += rt.cudaFreeAsync(held[i], stream) != 0
    failed += rt.cudaStreamSynchronize(stream) != 0
    return failed


def deep(depth, *args):
    if depth > 1:
        return deep(depth - 1, *args)
    return step(*args)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    tensors = int(sys.argv[2]) if len(sys.argv) > 2 else 600
    depth = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    sizes = [int(sys.argv[4])] * 16 if len(sys.argv) > 4 and sys.argv[4] != "-" else SIZES
    thrash = int(sys.argv[5]) * 1024 if len(sys.argv) > 5 else 0
    junk = ctypes.create_string_buffer(thrash) if thrash > 0 else None
    rt, kernel, launch, stream = setup()
    failed = 0
    for _ in range(5):
        failed += deep(depth, rt, kernel, launch, stream, tensors, sizes, junk)
    t0 = time.perf_counter()
    for _ in range(steps):
        failed += deep(depth, rt, kernel, launch, stream, tensors, sizes, junk)
    dt = time.perf_counter() - t0
    print(f"steps {steps} tensors {tensors} us_per_step {dt / steps * 1e6:.1f} "
          f"ns_per_tensor {dt / steps / tensors * 1e9:.1f} failed {failed}")


if __name__ == "__main__":
    main()
