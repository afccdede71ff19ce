"""A deterministic little JAX training run, for tests/gpu/trust.sh.

    python3 tests/gpu/jax_check.py [--steps 50] [--layers 4] [--width 1024] [--batch 256]

A `jax.jit` SGD step on an MLP (LAYERS dense layers WIDTH x WIDTH, tanh between them, float32)
regressing a fixed random teacher; each step draws its batch from a fixed PRNG key folded with
the step number, and the parameters are donated to the step (so buffers are freed and reused
every step). Prints, last:

    RESULT loss=<final loss, repr of the float32 as a Python float> checksum=<sum of |params|, float64 repr>

which must be identical, bit for bit, between runs of the same allocator with and without
the preload. Before it, `INFO ...` lines (versions, device, XLA flags added, seconds, the
parameters' sha256) that are not compared.

XLA autotuning picks GEMM kernels by timing them, so two runs can pick different kernels and
differ in the last bits. Unless --keep-autotune is given, the script adds
`--xla_gpu_autotune_level=0` (and `--xla_gpu_exclude_nondeterministic_ops=true`) to XLA_FLAGS,
each only when the installed jaxlib knows the flag (an unknown flag in XLA_FLAGS aborts XLA),
which is looked up as a string in jaxlib's shared libraries before jax is imported.

Exit status: 0, or 3 when JAX has no GPU backend (a CPU run would prove nothing;
JAX_CHECK_ALLOW_CPU=1 allows one, to try the script on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import mmap
import os
import sys
import time

WANTED_FLAGS = ("--xla_gpu_autotune_level=0", "--xla_gpu_exclude_nondeterministic_ops=true")


def jax_libraries() -> list[str]:
    """jaxlib's and the CUDA plugin's shared libraries, found without importing jax."""
    found = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        for pattern in ("jaxlib/**/*.so*", "jax_cuda*_plugin/**/*.so*", "jax_plugins/**/*.so*"):
            found += glob.glob(os.path.join(entry, pattern), recursive=True)
    return sorted(set(f for f in found if os.path.isfile(f)))


def known_flags(wanted: tuple[str, ...]) -> tuple[list[str], str]:
    """The flags of `wanted` whose names occur in jaxlib's libraries, and a note on the search."""
    names = {flag: flag[2:].split("=", 1)[0].encode() for flag in wanted}
    seen: set[str] = set()
    libs = jax_libraries()
    for path in libs:
        if os.path.getsize(path) < 1 << 20:  # the flags live in the big XLA libraries
            continue
        try:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                for flag, name in names.items():
                    if flag not in seen and m.find(name) != -1:
                        seen.add(flag)
        except (OSError, ValueError):
            continue
        if len(seen) == len(wanted):
            break
    return [f for f in wanted if f in seen], f"searched {len(libs)} libraries"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--keep-autotune", action="store_true", help="leave XLA_FLAGS as it is")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="parameter and activation type (bfloat16 matmuls make XLA autotune "
                         "Triton GEMMs: modules compiled, loaded and unloaded at start)")
    args = ap.parse_args()

    t0 = time.monotonic()
    if not args.keep_autotune:
        flags, note = known_flags(WANTED_FLAGS)
        current = os.environ.get("XLA_FLAGS", "")
        add = [f for f in flags if f.split("=", 1)[0] not in current]
        if add:
            os.environ["XLA_FLAGS"] = " ".join(filter(None, [current, *add]))
        missing = [f for f in WANTED_FLAGS if f not in flags]
        print(f"INFO xla_flags={os.environ.get('XLA_FLAGS', '')!r} added={add} "
              f"unknown_to_jaxlib={missing} ({note}, {time.monotonic() - t0:.1f}s)", flush=True)

    import jax
    import jax.numpy as jnp
    import numpy as np

    backend = jax.default_backend()
    dev = jax.devices()[0]
    print(f"INFO jax {jax.__version__} backend={backend} device={dev.device_kind} "
          f"allocator={os.environ.get('XLA_PYTHON_CLIENT_ALLOCATOR', '(default)')} "
          f"preallocate={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', '(default)')}", flush=True)
    if backend != "gpu" and os.environ.get("JAX_CHECK_ALLOW_CPU") != "1":
        print(f"jax_check: JAX has no GPU backend (backend={backend})", file=sys.stderr)
        return 3

    width, layers, batch = args.width, args.layers, args.batch
    dt = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    key = jax.random.PRNGKey(args.seed)
    k_params, k_teacher, k_data = jax.random.split(key, 3)

    def init(k):
        params = []
        for kk in jax.random.split(k, layers):
            w = (jax.random.normal(kk, (width, width), jnp.float32) / np.sqrt(width)).astype(dt)
            params.append((w, jnp.zeros((width,), dt)))
        return params

    params = init(k_params)
    teacher = jax.random.normal(k_teacher, (width, width), jnp.float32) / np.sqrt(width)

    def forward(params, x):
        for i, (w, b) in enumerate(params):
            x = x @ w + b
            if i < len(params) - 1:
                x = jnp.tanh(x)
        return x

    def loss_fn(params, x, y):
        return jnp.mean((forward(params, x).astype(jnp.float32) - y.astype(jnp.float32)) ** 2)

    def step(params, i):
        x = jax.random.normal(jax.random.fold_in(k_data, i), (batch, width), jnp.float32)
        y = jnp.tanh(x @ teacher).astype(dt)
        x = x.astype(dt)
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params = jax.tree_util.tree_map(lambda p, g: p - args.lr * g, params, grads)
        return params, loss

    step = jax.jit(step, donate_argnums=(0,))

    t1 = time.monotonic()
    losses = []
    for i in range(args.steps):
        params, loss = step(params, jnp.int32(i))
        losses.append(loss)
    jax.block_until_ready((params, losses))
    t2 = time.monotonic()

    final = float(np.asarray(losses[-1], dtype=np.float32)) if losses else float("nan")
    leaves = [np.asarray(p) for p in jax.tree_util.tree_leaves(params)]
    checksum = float(sum(np.abs(p.astype(np.float64)).sum() for p in leaves))
    sha = hashlib.sha256(b"".join(p.tobytes() for p in leaves)).hexdigest()[:16]
    first = float(np.asarray(losses[0])) if losses else float("nan")
    print(f"INFO steps={args.steps} layers={layers} width={width} batch={batch} "
          f"first_loss={first!r} params_sha256={sha} seconds_total={t2 - t0:.1f} "
          f"seconds_steps={t2 - t1:.2f}", flush=True)
    try:
        stats = dev.memory_stats() or {}
        keep = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "num_allocs", "pool_bytes")
        print("INFO memory_stats " + " ".join(f"{k}={stats[k]}" for k in keep if k in stats), flush=True)
    except Exception as err:  # noqa: BLE001 - informational only
        print(f"INFO memory_stats unavailable: {err}", flush=True)
    print(f"RESULT loss={final!r} checksum={checksum!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
