"""Call stacks from Python (issue 13): allocations and frees through ctypes into the CUDA runtime
(the stand-in's libcudart in CI), from named Python functions, once through ctypes.CDLL (the GIL
is released during the call) and once through ctypes.PyDLL (the GIL is held), so the trace's
Python frames must come from the thread's own frame chain either way.

    python3 stacks.py cdll|pydll|both [N]
    python3 stacks.py bench N [D]  N allocations and frees D (10) Python calls deep, quietly
                                   (isolate-bench: the cost of a stack with Python frames)
    python3 stacks.py walks        allocations whose stacks differ from the one before in one
                                   frame each (the innermost, an outer one, the depth, up and
                                   down): a thread's walk reuses what the last walk read of the
                                   frames it has in common, so each stack must still be its own

Prints one line per call: "<how> <function> line <L> rc <rc>", where L is the line of the
ctypes call in that function (read from this file, so the test needs no line numbers of its own).
"""

import ctypes
import sys
import threading

HERE = open(__file__).read().splitlines()


def line_of(marker):
    return next(i + 1 for i, l in enumerate(HERE) if l.rstrip().endswith("# " + marker))


def runtime(how):
    loader = ctypes.PyDLL if how == "pydll" else ctypes.CDLL
    rt = loader("libcudart.so.13")
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    return rt


def allocate_tensor(rt, size):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), size)  # ALLOC
    return p, rc


def release_tensor(rt, p):
    return rt.cudaFree(p)  # FREE


def training_step(rt, how):
    p, rc = allocate_tensor(rt, 1 << 20)
    print(f"{how} allocate_tensor line {line_of('ALLOC')} rc {rc}", flush=True)
    rc = release_tensor(rt, p)
    print(f"{how} release_tensor line {line_of('FREE')} rc {rc}", flush=True)


def bench_level(rt, depth, n):
    if depth > 1:
        return bench_level(rt, depth - 1, n)
    p = ctypes.c_void_p()
    for _ in range(n):
        rt.cudaMalloc(ctypes.byref(p), 256)
        rt.cudaFree(p)


def site_a(rt, p):
    return rt.cudaMalloc(ctypes.byref(p), 256)  # SITE_A


def site_b(rt, p):
    return rt.cudaMalloc(ctypes.byref(p), 256)  # SITE_B


def nest(rt, depth, site):
    if depth > 0:
        return nest(rt, depth - 1, site)  # NEST
    p = ctypes.c_void_p()
    site(rt, p)  # CALL_SITE
    rt.cudaFree(p)
    return 0


def walks(rt):
    # One line a cudaMalloc: "walk <site> <nest frames> <caller line>", in order.
    for round in range(3):
        for depth, site in [(2, site_a), (2, site_b), (2, site_a), (5, site_a), (1, site_a),
                            (1, site_b), (4, site_b), (0, site_b)]:
            if round % 2 == 0:
                nest(rt, depth, site)  # CALLER_1
                caller = line_of("CALLER_1")
            else:
                nest(rt, depth, site)  # CALLER_2
                caller = line_of("CALLER_2")
            print(f"walk {site.__name__} {depth + 1} {caller}", flush=True)


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "both"
    if what == "walks":
        walks(runtime("cdll"))
        return
    if what == "bench":
        bench_level(runtime("cdll"), int(sys.argv[3]) if len(sys.argv) > 3 else 10, int(sys.argv[2]))
        return
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    hows = ["cdll", "pydll"] if what == "both" else [what]
    for how in hows:
        rt = runtime(how)
        for _ in range(n):
            training_step(rt, how)
    if what == "both":
        # And from a second thread, which has a thread state of its own.
        t = threading.Thread(target=training_step, args=(runtime("cdll"), "thread"))
        t.start()
        t.join()


if __name__ == "__main__":
    main()
