"""cuda_isolate: the Python side of isolate.

``libisolate.so`` records every CUDA allocation of a process when it is preloaded::

    LD_PRELOAD=$(python -m cuda_isolate --lib) python train.py

Inside such a process this module writes marks and regions into the trace and reads the
library's running counters, through the library's small C API (``isolate_mark``,
``isolate_region_push``/``_pop``, ``isolate_counters``, ``isolate_peak_reset``,
``isolate_check_now``), found with
``ctypes.CDLL(None)``: only when the library is already loaded. Without it every function is a
no-op that says so once (``warnings.warn``), and :func:`counters` returns ``None``.
"""

import ctypes
import functools
import os
import threading
import warnings

__all__ = [
    "library_path",
    "loaded",
    "mark",
    "region",
    "counters",
    "peak_reset",
    "check_now",
    "parse_size",
]

try:
    from importlib.metadata import version as _version

    __version__ = _version("cuda-isolate")
except Exception:  # not installed (run from the source tree)
    __version__ = "0+source"


class _Counters(ctypes.Structure):
    # struct isolate_counters: every field a uint64_t, new ones only ever added at the end.
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("events", ctypes.c_uint64),
        ("live_device_bytes", ctypes.c_uint64),
        ("peak_device_bytes", ctypes.c_uint64),
        ("device_allocs", ctypes.c_uint64),
        ("device_frees", ctypes.c_uint64),
        ("stale_writes", ctypes.c_uint64),
        ("stale_launches", ctypes.c_uint64),
        ("invalid_frees", ctypes.c_uint64),
        ("window_peak_device_bytes", ctypes.c_uint64),
        ("freed_in_use", ctypes.c_uint64),
        ("kept_allocs", ctypes.c_uint64),
    ]


def library_path():
    """The path of libisolate.so (for ``LD_PRELOAD``): the one ``CUDA_ISOLATE_LIB`` names, else
    the one this package installed (beside the ``isolate`` command, where ``isolate run`` finds
    it), else None."""
    if os.environ.get("CUDA_ISOLATE_LIB"):
        return os.environ["CUDA_ISOLATE_LIB"]
    try:
        from importlib.metadata import files

        for f in files("cuda-isolate") or ():
            if f.name == "libisolate.so":
                return os.path.abspath(str(f.locate()))
    except Exception:  # not installed (run from the source tree)
        pass
    return None


_lock = threading.Lock()
_api = None
_looked = False
_warned = False


def _lib():
    """The library's C API if libisolate.so is loaded in this process, else None."""
    global _api, _looked
    if _looked:
        return _api
    with _lock:
        if not _looked:
            try:
                proc = ctypes.CDLL(None)
                api = {
                    "mark": proc.isolate_mark,
                    "push": proc.isolate_region_push,
                    "pop": proc.isolate_region_pop,
                    "counters": proc.isolate_counters,
                    "peak_reset": proc.isolate_peak_reset,
                }
                for name in ("mark", "push"):
                    api[name].argtypes = [ctypes.c_char_p]
                    api[name].restype = ctypes.c_int
                api["pop"].argtypes = []
                api["pop"].restype = ctypes.c_int
                api["peak_reset"].argtypes = []
                api["peak_reset"].restype = ctypes.c_int
                api["counters"].argtypes = [ctypes.POINTER(_Counters), ctypes.c_size_t]
                api["counters"].restype = ctypes.c_int
                # Newer than the rest: absent from an older library.
                check = getattr(proc, "isolate_check_now", None)
                if check is not None:
                    check.argtypes = []
                    check.restype = ctypes.c_int64
                api["check_now"] = check
                _api = api
            except (AttributeError, OSError):
                _api = None
            _looked = True
    return _api


def loaded():
    """True when libisolate.so is loaded in this process (preloaded)."""
    return _lib() is not None


def _absent():
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "cuda_isolate: libisolate.so is not loaded in this process, so marks, regions and "
            "counters do nothing; run under LD_PRELOAD=$(python -m cuda_isolate --lib) or "
            "`isolate run -- ...`",
            RuntimeWarning,
            stacklevel=3,
        )


def _text(s):
    return s.encode("utf-8", "replace") if isinstance(s, str) else bytes(s)


def mark(text):
    """Writes a point named ``text`` into the trace. Returns the library's code (0 recorded,
    negative: not recorded), or None when the library is not loaded."""
    api = _lib()
    if api is None:
        _absent()
        return None
    return api["mark"](_text(text))


class region:
    """A named region of the trace, nested per thread: ``with region("step 12"):`` or, as a
    decorator, ``@region("train")``."""

    def __init__(self, name):
        self.name = str(name)

    def __enter__(self):
        api = _lib()
        if api is None:
            _absent()
            self._pushed = False
        else:
            self._pushed = api["push"](_text(self.name)) == 0
        return self

    def __exit__(self, *exc):
        if self._pushed:
            _lib()["pop"]()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with region(self.name):
                return fn(*args, **kwargs)

        return wrapped


def counters():
    """The library's counters so far as a dict (events, live/peak device bytes, findings), or
    None when the library is not loaded."""
    api = _lib()
    if api is None:
        _absent()
        return None
    c = _Counters()
    rc = api["counters"](ctypes.byref(c), ctypes.sizeof(c))
    if rc == -2:
        return None
    filled = c.size // 8
    out = {}
    for i, (name, _) in enumerate(_Counters._fields_[1:], start=1):
        if i < filled:
            out[name] = getattr(c, name)
    out["recording"] = rc == 0
    return out


def check_now():
    """Checks the quarantine now (isolate mode): every freed allocation held so far is compared
    with its poison, instead of only when it leaves quarantine or at exit. Returns the number of
    stale writes found so far in this process (this check's included; 0 in log mode), or None
    when the library is not loaded, is too old to have the call, or is not recording."""
    api = _lib()
    if api is None:
        _absent()
        return None
    if api.get("check_now") is None:
        return None
    n = api["check_now"]()
    return n if n >= 0 else None


def peak_reset():
    """Starts a new peak window: ``counters()["window_peak_device_bytes"]`` becomes the device
    bytes live now. Returns the library's code, or None when it is not loaded."""
    api = _lib()
    if api is None:
        _absent()
        return None
    return api["peak_reset"]()


_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
}
_DIGITS = frozenset("0123456789")


def parse_size(s):
    """Bytes in a size, in the grammar of every part of isolate (a port of
    ``isolate_trace::parse_size``, checked on the same cases: trace/src/size-cases.txt): a whole
    number (``4096``), a decimal (``1.5``), or ``0x`` hex (no unit); then, after optional spaces,
    an optional unit, any case: ``B``; ``K``/``Ki``/``KiB``, ``M``…, ``G``…, ``T``… (powers of
    1024); ``KB``, ``MB``, ``GB``, ``TB`` (powers of 1000). A fraction of a byte is dropped; more
    than 2**64 - 1 bytes is refused. An int is taken as it is."""
    if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 64:
        return s
    t = str(s).strip()
    bad = ValueError("not a size: %r (e.g. 4096, 64KiB, 1.5G, 2MB)" % (s,))
    if t[:2] in ("0x", "0X"):
        h = t[2:]
        if not h or any(c not in "0123456789abcdefABCDEF" for c in h):
            raise bad
        v = int(h, 16)
    else:
        end = 0
        while end < len(t) and (t[end] in _DIGITS or t[end] == "."):
            end += 1
        num, unit = t[:end], t[end:].lstrip().lower()
        whole, _, frac = num.partition(".")
        if not whole or ("." in num and not frac) or "." in frac or unit not in _UNITS:
            raise bad
        mult = _UNITS[unit]
        v = int(whole) * mult
        if frac:
            v += int(frac) * mult // 10 ** len(frac)
    if v >= 1 << 64:
        raise bad
    return v
