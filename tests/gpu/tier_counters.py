"""What libisolate.so says of itself from inside the measured process, for tier_bench.py's
workers (the real one and tier_bench_fake.py): copied beside the worker in the run's folder."""
import ctypes


def library_events():
    """The calls libisolate.so has recorded so far (its C API's `isolate_counters`), or None
    where it is not loaded or not recording."""
    try:
        f = ctypes.CDLL(None).isolate_counters
    except (OSError, AttributeError):
        return None
    buf = (ctypes.c_uint64 * 2)()  # size, events: the struct's first two fields
    if f(buf, ctypes.sizeof(buf)) != 0 or buf[0] < 16:
        return None
    return int(buf[1])
