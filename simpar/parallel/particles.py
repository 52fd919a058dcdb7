"""Placement of particle buffers for the ``sharded`` engine.

Particle arrays (leading axis = buffer capacity) are split over a 1-D ``Auto``-axes mesh;
everything else (box, parameters, RNG keys) is replicated. The unchanged jitted MD code then
runs partitioned by XLA.
"""

from __future__ import annotations

import jax
import numpy as np

from simpar.parallel import blocks

AXIS = "particles"


def shard_particles(tree, n_devices: int, capacity: int):
    """Place a pytree: leaves with leading axis ``capacity`` split over ``n_devices``.

    Args:
      tree: any pytree of arrays (state, parameters).
      n_devices: devices on the 1-D mesh axis ``"particles"`` (must divide ``capacity``).
      capacity: particle buffer length (valid + padding slots).

    Returns:
      ``tree`` with every array leaf a ``jax.Array``: ``(capacity, ...)`` leaves sharded along
      their first axis, the others replicated; non-array leaves unchanged.
    """
    mesh = blocks.make_mesh((n_devices,), (AXIS,), jax.devices()[:n_devices])

    def put(x):
        if not isinstance(x, jax.Array | np.ndarray):
            return x
        where = blocks.sharding(mesh)
        if x.ndim >= 1 and x.shape[0] == capacity:
            where = blocks.sharding(mesh, AXIS, *([None] * (x.ndim - 1)))
        if (not where.is_fully_addressable and isinstance(x, jax.Array) and x.committed
                and x.is_fully_addressable):  # fmt: skip
            x = np.asarray(x)  # a mesh over several processes takes host data, the same on each
        return jax.device_put(x, where)

    return jax.tree.map(put, tree)


def replicated(x):
    """``x`` unsplit on every device inside a program partitioned by XLA (``sharded``).

    A sharding constraint to the replicated layout of the mesh ``x`` was placed on (an
    ``Auto``-axes mesh of several devices): what is computed from it is then computed on
    each device whole, from one all-gather of ``x``, instead of partitioned and combined
    afterwards. The identity elsewhere (one device, host arrays, ``shard_map`` / ``pmap``
    bodies, ``Explicit`` axes). The value is unchanged.

    Args:
      x: an array or tracer.

    Returns:
      ``x``, constrained to be replicated where it is split over an ``Auto`` mesh.
    """
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    if mesh is None or mesh.size <= 1:
        return x
    if any(t != jax.sharding.AxisType.Auto for t in mesh.axis_types):
        return x
    return jax.lax.with_sharding_constraint(x, blocks.sharding(mesh))
