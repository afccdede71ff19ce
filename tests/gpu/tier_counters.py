"""What libisolate.so says of itself from inside the measured process, for tier_bench.py's
workers (the real one and tier_bench_fake.py): copied beside the worker in the run's folder."""
import ctypes

# struct isolate_counters' fields read here, by index (every field a uint64_t; docs/user-guide.md).
_FIELDS = {"events": 1, "device_allocs": 4, "kept_allocs": 11}


def library_counters():
    """{events, device_allocs, kept_allocs} from libisolate.so's C API (`isolate_counters`), a
    field the library does not fill in (an older build) left out; None where the library is
    not loaded or not recording."""
    try:
        f = ctypes.CDLL(None).isolate_counters
    except (OSError, AttributeError):
        return None
    buf = (ctypes.c_uint64 * 12)()
    if f(buf, ctypes.sizeof(buf)) != 0 or buf[0] < 16:
        return None
    filled = int(buf[0]) // 8
    return {k: int(buf[i]) for k, i in _FIELDS.items() if i < filled}


def timed(before, after):
    """What the worker stores of the timed steps: the calls recorded, and the allocations the
    driver made (device allocations less those kept memory served; None from a library without
    the kept_allocs counter)."""
    if before is None or after is None:
        return {}
    out = {"library_events_timed": after["events"] - before["events"]}
    if "kept_allocs" in before and "kept_allocs" in after:
        out["driver_allocs_timed"] = ((after["device_allocs"] - before["device_allocs"])
                                      - (after["kept_allocs"] - before["kept_allocs"]))
    return out
