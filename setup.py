"""Builds the `cuda-isolate` package (pyproject.toml has its metadata) with setuptools-rust,
which builds two crates of the Cargo workspace in release mode, from the Cargo.lock:

- the `isolate` command (the `isolate` binary of analyzer/Cargo.toml), installed as a script;
- `libisolate.so` (the cdylib of interposer/Cargo.toml), installed beside it, in the scripts
  directory, under its own name: `isolate run` looks for it beside its own executable, and
  `python -m cuda_isolate --lib` finds it among the package's files.

Neither links libpython, so the wheel is tagged py3-none-<platform> (one wheel for every
Python 3); `auditwheel show` gives its manylinux tag (python/build-wheel.sh). The start-up hook
cuda_isolate.pth goes to the root of site-packages. docs/user-guide.md ("Build and install")
says why setuptools-rust.
"""

import os
import re

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustBin, RustExtension
from setuptools_rust.build import build_rust

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "cuda_isolate.pth"


def workspace_version():
    """`version` of Cargo.toml's [workspace.package]: the one version of every crate."""
    with open(os.path.join(HERE, "Cargo.toml"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^\[workspace\.package\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    version = section and re.search(r'^version\s*=\s*"([^"]+)"', section.group(1), re.M)
    if not version:
        raise RuntimeError("Cargo.toml: no version in [workspace.package]")
    return version.group(1)


class build_rust_lib_beside_isolate(build_rust):
    """libisolate.so into the scripts directory, named as the preload names it (setuptools-rust
    would put it into the package as a Python extension, libisolate.cpython-…so)."""

    def get_dylib_ext_path(self, ext, target_fname):
        if ext.name == "libisolate":
            scripts = self.get_finalized_command("build_scripts").build_dir
            return os.path.join(scripts, "libisolate.so")
        return super().get_dylib_ext_path(ext, target_fname)


class build_py_with_pth(build_py):
    """The start-up hook's one line (python/cuda_isolate.pth) into the root of site-packages."""

    def run(self):
        super().run()
        self.copy_file(os.path.join("python", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


class bdist_wheel_py3(bdist_wheel):
    """py3-none-<platform>: the binaries do not depend on the Python version or its ABI."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    version=workspace_version(),
    rust_extensions=[
        RustBin("isolate", path="analyzer/Cargo.toml", cargo_manifest_args=["--locked"]),
        RustExtension(
            "libisolate",
            path="interposer/Cargo.toml",
            binding=Binding.NoBinding,
            cargo_manifest_args=["--locked"],
        ),
    ],
    cmdclass={
        "build_rust": build_rust_lib_beside_isolate,
        "build_py": build_py_with_pth,
        "bdist_wheel": bdist_wheel_py3,
    },
)
