"""python -m cuda_isolate --lib: prints the path of libisolate.so, for
``LD_PRELOAD=$(python -m cuda_isolate --lib) python train.py``."""

import argparse
import os
import shutil
import sys

from . import __version__, library_path


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
        print(lib)
        return 0
    print("libisolate.so: %s" % lib)
    print("isolate:       %s" % (shutil.which("isolate") or "not on PATH"))
    print("use:           LD_PRELOAD=$(python -m cuda_isolate --lib) python train.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
