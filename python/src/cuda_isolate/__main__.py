"""python -m cuda_isolate --lib: prints the path of libisolate.so, for
``LD_PRELOAD=$(python -m cuda_isolate --lib) python train.py``.

``LD_PRELOAD`` is split at spaces and colons (tabs and newlines too): a library installed under
such a path (a virtual environment in ``~/My Projects``) would be looked for in pieces, nothing
preloaded, and the program run unrecorded without a word. So ``--lib`` then prints a link to it
that has no such byte, in a directory of this user's own (``$XDG_RUNTIME_DIR/cuda-isolate`` or
``/tmp/cuda-isolate-UID``, mode 0700), and says so on stderr; when no such link can be made it
prints nothing and exits 1 (``isolate run`` makes its own link for each run)."""

import argparse
import hashlib
import os
import shutil
import stat
import sys

from . import __version__, library_path

# The bytes the loader splits LD_PRELOAD on.
PRELOAD_SPLITS = " :\t\n"


def preloadable(path):
    """True when ``path`` can stand in LD_PRELOAD as one item."""
    return bool(path) and not any(c in path for c in PRELOAD_SPLITS)


def _private_dir(base, name):
    """``base/name``, made mode 0700 when missing; None unless it is a directory of this user's
    own that no one else can write to (never a link)."""
    d = os.path.join(base, name)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return d


def preload_path(lib):
    """A path of ``lib`` that LD_PRELOAD takes as one item: its own, else a link to it in a
    private directory (None when none can be made)."""
    if preloadable(lib):
        return lib
    target = os.path.realpath(lib)
    key = hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    bases = []
    if os.environ.get("XDG_RUNTIME_DIR"):
        bases.append((os.environ["XDG_RUNTIME_DIR"], "cuda-isolate"))
    bases.append(("/tmp", "cuda-isolate-%d" % os.getuid()))
    for base, name in bases:
        d = _private_dir(base, name)
        if d is None or not preloadable(d):
            continue
        d = _private_dir(d, key)
        if d is None:
            continue
        link = os.path.join(d, "libisolate.so")
        try:
            if os.path.islink(link) and os.readlink(link) == target:
                return link
            tmp = link + ".%d" % os.getpid()
            os.symlink(target, tmp)
            os.replace(tmp, link)
            return link
        except OSError:
            continue
    return None


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m cuda_isolate",
        description="The libisolate.so of this package, and the isolate command beside it.",
    )
    p.add_argument("--lib", action="store_true", help="print the path of libisolate.so")
    p.add_argument("--version", action="store_true", help="print the package version")
    a = p.parse_args(argv)
    if a.version:
        print(__version__)
        return 0
    lib = library_path()
    if not lib or not os.path.isfile(lib):
        print("cuda_isolate: libisolate.so not found (%s): install the package "
              "(pip install . in a checkout) or set CUDA_ISOLATE_LIB" % lib, file=sys.stderr)
        return 1
    if a.lib:
        safe = preload_path(lib)
        if safe is None:
            print("cuda_isolate: %s cannot be preloaded: LD_PRELOAD splits paths at spaces and "
                  "colons, and no link to it could be made in a private directory; install the "
                  "package under a path without them, or use `isolate run`" % lib,
                  file=sys.stderr)
            return 1
        if safe != lib:
            print("cuda_isolate: %s has a space or colon, which LD_PRELOAD splits on: printing "
                  "a link to it instead" % lib, file=sys.stderr)
        print(safe)
        return 0
    print("libisolate.so: %s" % lib)
    print("isolate:       %s" % (shutil.which("isolate") or "not on PATH"))
    print("use:           LD_PRELOAD=$(python -m cuda_isolate --lib) python train.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
