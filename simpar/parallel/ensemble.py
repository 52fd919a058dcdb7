"""Ensembles: several members of one grid model advanced at once, each on its own devices.

Every state leaf and parameter leaf gets a leading member axis ``(members, ...)``; the members
share the model (the same per-block program) and differ in parameter values and initial
fields. How the engines hold them:

============= ===============================================================================
``single``    ``jax.vmap`` over the member axis on one device.
``pmap``      one flat axis of ``members x grid.size`` devices, member ``m`` on devices
              ``m * grid.size ... (m + 1) * grid.size - 1`` (the device groups of the JAX
              documentation). Halos move only inside a member (``ppermute`` pairs offset per
              member); each member's diagnostics are reduced over its own devices with
              ``axis_index_groups``.
``shard_map`` a mesh ``("member", "x", "y"[, "z"])``: the member is a mesh axis; the per-block
              program runs unchanged (its ``ppermute``/``psum`` name only the spatial axes).
``sharded``   the same mesh with ``Auto`` axes; the vmapped global-view step is jit-compiled
              and XLA partitions it.
============= ===============================================================================

Each member equals the same run done alone with the same engine and mesh (bitwise in the
fields; ``tests/test_ensemble.py``).
"""

from __future__ import annotations

import jax

from simpar.errors import ConfigError
from simpar.parallel import blocks, mapping
from simpar.parallel.comm import GroupedPmapComm
from simpar.parallel.engines import Engine, engine_grid
from simpar.parallel.mapping import MEMBER_AXIS

__all__ = ["MEMBER_AXIS", "GroupedPmapComm", "make_ensemble_engine"]


def make_ensemble_engine(
    name: str,
    model,
    domain_shape,
    members: int,
    mesh=None,
    halo: int | None = None,
    devices=None,
):
    """An engine for ``members`` copies of ``model``, each on ``prod(mesh)`` devices.

    Args: as ``make_engine``, plus ``members`` (>= 1). ``mesh`` is the device grid of *one*
      member (default: ``len(devices) // members`` devices along x); ``single`` vmaps the
      members on one device.

    Returns:
      An engine whose ``place``/``advance``/``observe``/``gather`` take and give a leading
      member axis on every state leaf, parameter leaf and diagnostic (the members are the
      ``members`` argument of ``simpar.parallel.mapping.Mapping``).

    Raises:
      ConfigError: too few devices for ``members x prod(mesh)``, or as ``make_engine``.
    """
    available = list(devices) if devices is not None else jax.devices()
    if members < 1:
        raise ConfigError("ensemble.members", f"must be >= 1, got {members}")
    halo, grid = engine_grid(name, model, domain_shape, mesh, halo, available, members)
    if not mapping.kind(name).one_device:  # single vmaps every member on one device
        blocks.require_devices(grid.shape, len(available), "--mesh")
        blocks.require_devices(grid.shape, len(available), "ensemble.members", members)
    return Engine(name, model, domain_shape, grid, halo, available, members=members)
