"""Fill names a public test file imports from torch.testing._internal (or any torch.* module)
that the installed torch does not have, without editing the public file.

PyTorch's test/test_cuda.py is taken from a stored commit of the main branch, which may be
newer than the installed torch (2.11 on the H200 host): a `from torch.testing._internal.common_utils
import X` of a name added since then would stop the whole file from importing. `install(path)`
reads the file's own `from torch... import` statements (with `ast`, nothing is executed), imports
each module, and sets every missing name on that module to a stand-in chosen by the name's
form, so that the import succeeds and the tests that depend on the missing feature skip or fail
on their own, one by one, where the runner can see them. It returns what it filled, which the
runner prints and writes to results/meta.json: a test that fails because of a stand-in is then
explainable.

Stand-ins (by name):
- an all-caps flag (`TEST_CUDA_PYTHON_BINDINGS`, `PLATFORM_SUPPORTS_GREEN_CONTEXT`): False
- an all-caps `*_ARCH` list (`MI200_ARCH`): an empty tuple
- `skip*` / `*Test` / other decorator factories seen in test files (`serialTest`,
  `skipIfRocmArch`, `recover_orig_fp32_precision`, ...): a pass-through decorator that works
  both bare (`@name`) and called (`@name(...)`)
- anything else (a function such as `cuda_python_error_check`): a callable that raises
  NotImplementedError naming the missing name when a test calls it
"""

import ast
import importlib
import re

_FLAG = re.compile(r"^[A-Z][A-Z0-9_]*$")


class _Missing:
    """A callable stand-in that fails loudly, naming what is missing, when used."""

    def __init__(self, module, name):
        self._what = f"{module}.{name} (not in the installed torch; filled by torch_tests_shim)"

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(self._what)

    def __repr__(self):
        return f"<missing {self._what}>"


def _passthrough_decorator(*args, **kwargs):
    # @name  -> called with the function itself
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]

    # @name(...) -> returns a decorator
    def deco(fn):
        return fn

    return deco


def _looks_like_decorator(name):
    low = name.lower()
    return (
        low.startswith("skip")
        or low.startswith("only")
        or low.endswith("test")
        or low.startswith("recover_")
        or low.startswith("with_")
        or low.startswith("requires")
        or low.endswith("_and_off")
    )


def stand_in(module, name):
    """The value set for a missing `module.name`, and a word saying which kind it is."""
    if _FLAG.match(name):
        if name.endswith("_ARCH"):
            return (), "empty tuple"
        return False, "False"
    if _looks_like_decorator(name):
        return _passthrough_decorator, "pass-through decorator"
    return _Missing(module, name), "raises NotImplementedError when called"


def torch_imports(path):
    """[(module, [names])] of every `from torch... import names` in the file at `path`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "torch" or node.module.startswith("torch."):
                found.append((node.module, [a.name for a in node.names if a.name != "*"]))
    return found


def install(path):
    """Fill what `path` imports from torch.* and the installed torch lacks.

    Returns a list of dicts {module, name, value}; empty when nothing was missing. A module
    that does not import at all is reported with name None and the error; it is not faked
    (a whole missing module means the file cannot run on this torch, and that must show)."""
    filled = []
    for module, names in torch_imports(path):
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            filled.append({"module": module, "name": None, "value": f"import failed: {e!r}"})
            continue
        for name in names:
            if hasattr(mod, name):
                continue
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule imported by name
                continue
            except Exception:  # noqa: BLE001
                pass
            value, kind = stand_in(module, name)
            setattr(mod, name, value)
            filled.append({"module": module, "name": name, "value": kind})
    return filled
