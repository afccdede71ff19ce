"""The stand-in CUDA runtime (libcudart.so.13 on LD_LIBRARY_PATH) through ctypes, shared by the
plugin's case files: ``rt`` with cudaMalloc, cudaFree and cudaMemset typed, and ``malloc``."""

import ctypes

MiB = 1 << 20

rt = ctypes.CDLL("libcudart.so.13")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaMalloc.restype = ctypes.c_int
rt.cudaFree.argtypes = [ctypes.c_void_p]
rt.cudaFree.restype = ctypes.c_int
rt.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
rt.cudaMemset.restype = ctypes.c_int


def malloc(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), n) == 0
    return p.value
