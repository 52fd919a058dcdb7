"""Block mapping of a spatially decomposed particle run: ``_Mapper`` puts per-device
buffers on the devices, gathers them back and maps a block function over the devices
(``pmap`` over a flat axis, ``shard_map`` over a named mesh, or one device with
``LocalComm``).

The decomposed MD model itself lives in ``simpar.particles.decomposed`` (the block step) and
``simpar.particles.decomposed_sim`` (``DomainSimulation``, ``make_domain_simulation``); the
ghost exchange and migration in ``simpar.parallel.ghosts``; capacity sizing in
``simpar.parallel.capacity``. This module knows nothing of particles: block functions are
passed in.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from simpar.parallel import blocks
from simpar.parallel.blocks import gather_blocks, put_blocks, put_global, to_host
from simpar.parallel.capacity import check_mesh, min_sub_box
from simpar.parallel.comm import LocalComm, PmapComm, ShardMapComm
from simpar.parallel.topology import DeviceGrid

ENGINES = ("local", *blocks.PER_BLOCK)  # "local": one device through LocalComm (tests, benches)
__all__ = ["ENGINES", "check_mesh", "min_sub_box"]


class _Mapper:
    """Runs block functions on the devices; every mapped leaf has a leading device axis.

    ``pmap``: one flat axis ``"dev"`` over the grid (C order); ``shard_map``: a named mesh
    ``grid.axis_names`` with the device axis split over all its axes; ``local``: one device,
    ``LocalComm``.
    """

    def __init__(self, engine: str, grid: DeviceGrid, devices):
        self.engine, self.grid, self.devices = engine, grid, list(devices)
        if engine == "pmap":
            self.comm = PmapComm(grid, blocks.PMAP_AXIS)
        elif engine == "shard_map":
            self.comm = ShardMapComm(grid)
            self.mesh = blocks.make_mesh(grid.shape, grid.axis_names, self.devices)
            self.spec = P(grid.axis_names)
        else:
            self.comm = LocalComm(3)

    def put(self, tree):
        """Place host arrays ``(n_dev, ...)`` (each process only its own devices' blocks)."""
        if self.engine == "pmap":
            return jax.tree.map(lambda x: put_blocks(x, self.devices), tree)
        if self.engine == "shard_map":
            sh = blocks.sharding(self.mesh, *self.spec)
            return jax.tree.map(lambda x: put_global(x, sh), tree)
        return jax.tree.map(lambda x: jax.device_put(np.asarray(x), self.devices[0]), tree)

    def get(self, tree):
        """Host arrays ``(n_dev, ...)`` on every process (a collective across processes)."""
        fn = gather_blocks if self.engine == "pmap" else to_host
        return jax.tree.map(fn, tree)

    def map(self, fn, n_mapped: int, n_rep: int):
        """``fn(*mapped, *replicated)`` over the devices; outputs mapped."""
        if self.engine == "pmap":
            return blocks.pmap(fn, self.devices, in_axes=(0,) * n_mapped + (None,) * n_rep)

        def squeezed(*args):
            mapped = [jax.tree.map(lambda x: x[0], a) for a in args[:n_mapped]]
            out = fn(*mapped, *args[n_mapped:])
            return jax.tree.map(lambda x: x[None], out)

        if self.engine == "shard_map":
            specs = (self.spec,) * n_mapped + (P(),) * n_rep
            # check_vma off: flags reduced over all devices (pmax) meet per-device values
            # in lax.cond / while_loop carries; they are equal on every device by design
            return jax.jit(blocks.shard_map(squeezed, self.mesh, specs, self.spec, check_vma=False))
        return jax.jit(squeezed)
