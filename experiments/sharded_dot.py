"""The book's dot product over sharded vectors, on today's API.

What it shows: many dot products at once, ``jax.vmap(jnp.vdot)`` over the rows of two
``(rows, n)`` matrices whose rows are spread over 8 devices. Older texts build the layout with
``PositionalSharding``, which JAX has removed; here it is ``jax.make_mesh`` + ``NamedSharding``
with ``PartitionSpec("rows")``. The unchanged vmapped function is jit-compiled and XLA runs each
device's rows where they live: the result equals the unsharded one and is itself sharded by
rows (no gather). The layouts are printed with ``jax.debug.visualize_array_sharding``.

Run (a second on 2 CPU cores; ``rich`` is needed for the pictures, ``pip install rich``):
    python experiments/sharded_dot.py                 # 8 virtual CPU devices
    python experiments/sharded_dot.py --devices 4 --rows 16 --n 1000
On N accelerators pass ``--devices N`` equal to the number of devices you have.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P


def sharded_dots(x: np.ndarray, y: np.ndarray, devices: int):
    """Row-wise dot products of ``x`` and ``y`` (``(rows, n)`` each) with rows on ``devices``.

    Returns:
      ``(result, xs, ys)``: the ``(rows,)`` result (a sharded ``jax.Array``) and the placed
      inputs.
    """
    mesh = jax.make_mesh((devices,), ("rows",), axis_types=(AxisType.Explicit,))
    xs = jax.device_put(x, NamedSharding(mesh, P("rows", None)))
    ys = jax.device_put(y, NamedSharding(mesh, P("rows", None)))
    dots = jax.jit(jax.vmap(jnp.vdot))
    return dots(xs, ys), xs, ys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--n", type=int, default=100_000)
    args = ap.parse_args(argv)
    jax.config.update("jax_num_cpu_devices", args.devices)  # affects the CPU backend only
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.n)).astype(np.float32)
    y = rng.standard_normal((args.rows, args.n)).astype(np.float32)
    out, xs, ys = sharded_dots(x, y, args.devices)
    ref = jax.vmap(jnp.vdot)(jnp.asarray(x), jnp.asarray(y))  # one device, unsharded
    for name, a in (("x", xs), ("y", ys), ("vdot(x, y) per row", out)):
        print(f"{name}: shape {a.shape}, sharding {a.sharding.spec}")
        try:
            jax.debug.visualize_array_sharding(a)
        except ImportError:
            print("  (pip install rich to draw the layout)")
    print(
        json.dumps(
            {
                "devices": args.devices,
                "result_devices": len(out.sharding.device_set),
                "result_spec": str(out.sharding.spec),
                "max_abs_diff_vs_unsharded": float(jnp.max(jnp.abs(out - ref))),
                "max_abs_diff_vs_numpy_float64": float(
                    np.max(np.abs(np.asarray(out) - np.einsum("ij,ij->i", x * 1.0, y * 1.0)))
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
