"""Start-up hook of cuda-isolate, run by the wheel's ``cuda_isolate.pth`` in every Python
process of an environment the wheel is installed in, but only when ``LD_PRELOAD`` names
libisolate.so (otherwise the ``.pth`` line costs one string test and imports nothing).

When libisolate.so is really loaded in the process, :func:`install`:

- sets ``NVTX_INJECTION64_PATH`` to the loaded library when it is not set, so that NVTX ranges
  (``torch.cuda.nvtx.range``, ``emit_nvtx()``, NCCL's) become regions in the trace;
- in isolate mode (``ISOLATE_MODE=isolate``), switches CuPy's memory pools off when CuPy is
  imported: ``cupy.cuda.set_allocator(None)`` and ``cupy.cuda.set_pinned_memory_allocator(None)``,
  so that each array is its own ``cudaMalloc``/``cudaFree`` and isolation sees its free (with the
  pool on, freed arrays go back to the pool and a stale pointer into one is never seen). It says
  so on stderr once per process tree. Until CuPy is imported this is one finder at the front of
  ``sys.meta_path`` that compares a module name with ``"cupy"``; it removes itself once CuPy is
  imported. If CuPy is already imported, the pools are switched off at once.

Without the wheel's ``.pth`` (libisolate.so from a workspace build), call it yourself first thing:
``import cuda_isolate.startup; cuda_isolate.startup.install()`` (with ``python/src`` on
``PYTHONPATH``), or switch CuPy's pool off by hand.
"""

import os
import sys

_SAID = "CUDA_ISOLATE_SAID_CUPY"


def _say(msg):
    try:
        sys.stderr.write("isolate: %s\n" % msg)
        sys.stderr.flush()
    except Exception:
        pass


def _loaded_path():
    """The file of the libisolate.so mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                i = line.find("/")
                if i >= 0 and "libisolate" in line:
                    path = line[i:].strip()
                    if os.path.basename(path).startswith("libisolate") and ".so" in path:
                        return path
    except OSError:
        pass
    return None


def cupy_pool_off(cupy):
    """Switches CuPy's device and pinned memory pools off (plain cudaMalloc/cudaFree per array)."""
    try:
        cupy.cuda.set_allocator(None)
        cupy.cuda.set_pinned_memory_allocator(None)
    except Exception as e:  # an unusual CuPy: say so, never break the import
        _say("isolate mode: could not switch CuPy's memory pool off (%s: %s)" % (type(e).__name__, e))
        return False
    if not os.environ.get(_SAID):
        os.environ[_SAID] = "1"
        _say(
            "isolate mode: CuPy's memory pools off (cupy.cuda.set_allocator(None), "
            "set_pinned_memory_allocator(None))"
        )
    return True


class _Loader:
    """Runs CuPy's own loader, then switches its pools off."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        cupy_pool_off(module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class CupyFinder:
    """At the front of ``sys.meta_path``: answers only for ``cupy``, with CuPy's own spec and a
    loader that switches the pools off after CuPy's ``__init__`` ran; then leaves."""

    def __init__(self):
        self._busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "cupy" or self._busy:
            return None
        self._busy = True
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        except Exception:
            spec = None
        finally:
            self._busy = False
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader)
        return spec

    def find_module(self, name, path=None):  # Python < 3.4 protocol: never used for cupy
        return None


def install():
    """What the ``.pth`` line runs (see the module docs). Never raises."""
    try:
        import cuda_isolate

        if not cuda_isolate.loaded():
            return
        if not os.environ.get("NVTX_INJECTION64_PATH"):
            path = _loaded_path()
            if path:
                os.environ["NVTX_INJECTION64_PATH"] = path
        if os.environ.get("ISOLATE_MODE", "").strip().lower() != "isolate":
            return
        if "cupy" in sys.modules:
            cupy_pool_off(sys.modules["cupy"])
        elif not any(isinstance(f, CupyFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, CupyFinder())
    except Exception:
        pass
