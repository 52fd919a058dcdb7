"""Placement of particle buffers for the ``sharded`` engine.

Particle arrays (leading axis = buffer capacity) are split over a 1-D ``Auto``-axes mesh;
everything else (box, parameters, RNG keys) is replicated. The unchanged jitted MD code then
runs partitioned by XLA.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec


def shard_particles(tree, n_devices: int, capacity: int):
    """Place a pytree: leaves with leading axis ``capacity`` split over ``n_devices``.

    Args:
      tree: any pytree of arrays (state, parameters).
      n_devices: devices on the 1-D mesh axis ``"particles"`` (must divide ``capacity``).
      capacity: particle buffer length (valid + padding slots).
    """
    mesh = jax.make_mesh(
        (n_devices,), ("particles",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n_devices]
    )

    def put(x):
        if not isinstance(x, jax.Array | np.ndarray):
            return x
        if x.ndim >= 1 and x.shape[0] == capacity:
            spec = PartitionSpec("particles", *([None] * (x.ndim - 1)))
        else:
            spec = PartitionSpec()
        return jax.device_put(x, NamedSharding(mesh, spec))

    return jax.tree.map(put, tree)
