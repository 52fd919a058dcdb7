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

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from simpar.errors import ConfigError
from simpar.parallel import blocks
from simpar.parallel.blocks import gather_blocks
from simpar.parallel.engines import (
    Engine,
    PmapEngine,
    ShardedEngine,
    ShardMapEngine,
    SingleEngine,
    advance_block,
    make_engine,
    observe_block,
)
from simpar.parallel.comm import PmapComm

MEMBER_AXIS = "member"


class GroupedPmapComm(PmapComm):
    """``PmapComm`` for ``members`` copies of ``grid`` on one flat pmap axis.

    Flat index ``m * grid.size + i`` is device ``i`` of member ``m``; neighbours and
    reductions never cross members.
    """

    def __init__(self, grid, members: int, axis_name: str = "dev"):
        super().__init__(grid, axis_name)
        self.members = members

    def _offset(self, groups):
        g = self.grid.size
        return [[i + m * g for i in grp] for m in range(self.members) for grp in groups]

    def shift(self, x, axis: int, direction: int):
        pairs = self._offset([list(p) for p in self.grid.shift_pairs(axis, direction)])
        return lax.ppermute(x, self.axis_name, [tuple(p) for p in pairs])

    def ring_pairs(self):
        return [tuple(p) for p in self._offset([list(p) for p in super().ring_pairs()])]

    # coord: (flat // stride) % shape[axis] is already the member-local coordinate, since
    # grid.size is a multiple of stride * shape[axis]

    def _grouped(self, fn, x, groups):
        if self.grid.size == 1:
            return x
        return fn(x, self.axis_name, axis_index_groups=self._offset(groups))

    def psum(self, x):
        return self._grouped(lax.psum, x, [list(range(self.grid.size))])

    def pmax(self, x):
        return self._grouped(lax.pmax, x, [list(range(self.grid.size))])

    def pmin(self, x):
        return self._grouped(lax.pmin, x, [list(range(self.grid.size))])

    def psum_over(self, x, axes):
        axes = [a for a in axes if self.grid.shape[a] > 1]
        if not axes:
            return x
        return self._grouped(lax.psum, x, self.grid.groups(axes))


def _ensemble_mesh(members: int, grid, devices):
    return blocks.make_mesh((members, *grid.shape), (MEMBER_AXIS, *grid.axis_names), devices)


class _VmappedMembers:
    """The member count, and the whole-domain programs vmapped over the member axis (for the
    engines that run the global view: ``single`` and ``sharded``)."""

    members: int

    def _init_members(self, members: int):
        self.members = int(members)

    def _whole_domain_advance(self, n: int):
        return jax.vmap(super()._whole_domain_advance(n))

    def _whole_domain_observe(self):
        return jax.vmap(super()._whole_domain_observe())


class SingleEnsemble(_VmappedMembers, SingleEngine):
    """Members vmapped on one device."""

    def __init__(self, model, domain_shape, grid, halo, devices, members):
        super().__init__(model, domain_shape, grid, halo, devices)
        self._init_members(members)


class ShardedEnsemble(_VmappedMembers, ShardedEngine):
    """Members on a mesh axis; the vmapped global-view step partitioned by XLA."""

    def __init__(self, model, domain_shape, grid, halo, devices, members):
        self._init_members(members)
        Engine.__init__(self, model, domain_shape, grid, halo, devices)
        self.mesh = _ensemble_mesh(self.members, grid, self.devices)

    def sharding(self, ndim: int) -> NamedSharding:
        """``NamedSharding`` of an ensemble field ``(members, *lead, *spatial)``: members over
        the member axis, spatial axes over the grid axes."""
        lead = (None,) * (ndim - 1 - self.model.ndim)
        return blocks.sharding(self.mesh, MEMBER_AXIS, *lead, *self.grid.axis_names)

    def _compile_advance(self, n, donate=False):
        # the vmapped whole-domain step (not ShardedEngine's blocked view, which has no member
        # axis); its halo traffic is not covered by tests/test_sharded_hlo.py
        f = self._whole_domain_advance(n)

        def step(state, params):
            out = f(state, params)
            return {
                k: lax.with_sharding_constraint(v, self.sharding(v.ndim)) for k, v in out.items()
            }

        return jax.jit(step, donate_argnums=0 if donate else ())

    def _compile_observe(self):
        # the vmapped whole-domain diagnostics (ShardedEngine's blocked model sums have no
        # member axis)
        return jax.jit(self._whole_domain_observe())


def _squeeze(tree):
    return jax.tree.map(lambda a: a[0], tree)


def _expand(tree):
    return jax.tree.map(lambda a: a[None], tree)


class ShardMapEnsemble(ShardMapEngine):
    """Members on a mesh axis; the unchanged per-block program under ``shard_map``."""

    def __init__(self, model, domain_shape, grid, halo, devices, members):
        self.members = int(members)
        Engine.__init__(self, model, domain_shape, grid, halo, devices)
        self.mesh = _ensemble_mesh(self.members, grid, self.devices)

    sharding = ShardedEnsemble.sharding

    params_spec = P(MEMBER_AXIS)

    def _per_block(self, fn):
        def f(state, params):  # one member's block: strip and restore the member axis
            return _expand(fn(_squeeze(state), _squeeze(params)))

        return f

    def _observe_specs(self, state, params):
        shapes = jax.eval_shape(jax.vmap(self._whole_domain_observe()), state, params)
        last = self.grid.axis_names[-1]
        return {
            k: (P(MEMBER_AXIS, last) if v.ndim == 2 else P(MEMBER_AXIS)) for k, v in shapes.items()
        }


class PmapEnsemble(PmapEngine):
    """``members x grid.size`` devices on one flat pmap axis; member ``m`` on the ``m``-th
    group of ``grid.size`` consecutive devices."""

    def __init__(self, model, domain_shape, grid, halo, devices, members):
        super().__init__(model, domain_shape, grid, halo, devices)
        self.members = int(members)

    def _blocks(self, u):
        # the member axis as a leading axis of the block layout, then member-major
        b = super()._blocks(u)  # (grid.size, members, *lead, *block)
        b = b.swapaxes(0, 1)
        return b.reshape(self.members * self.grid.size, *b.shape[2:])

    def _unblocks(self, b):
        b = b.reshape(self.members, self.grid.size, *b.shape[1:]).swapaxes(0, 1)
        return super()._unblocks(b)

    def _per_device(self, params):
        return jax.tree.map(lambda p: jnp.repeat(p, self.grid.size, axis=0), params)

    def _compile_advance(self, n, donate=False):
        comm = GroupedPmapComm(self.grid, self.members, blocks.PMAP_AXIS)
        f = functools.partial(advance_block, n=n, model=self.model, comm=comm, w=self.halo)
        pm = blocks.pmap(f, self.devices, in_axes=(0, 0), donate=donate)
        return lambda state, params: pm(state, self._per_device(params))

    def _compile_observe(self):
        comm = GroupedPmapComm(self.grid, self.members, blocks.PMAP_AXIS)
        obs = blocks.pmap(
            functools.partial(
                observe_block, model=self.model, comm=comm, global_shape=self.domain_shape
            ),
            self.devices,
            in_axes=(0, 0),
        )
        g = self.grid
        column = [g.index((0,) * (g.ndim - 1) + (j,)) for j in range(g.shape[-1])]

        def run(state, params):
            out = {k: gather_blocks(v) for k, v in obs(state, self._per_device(params)).items()}
            res = {}
            for k, v in out.items():
                per = v.reshape(self.members, g.size, *v.shape[1:])
                res[k] = per[:, column].reshape(self.members, -1) if v.ndim == 2 else per[:, 0]
            return res

        return run


_CLASSES = {
    "single": SingleEnsemble,
    "pmap": PmapEnsemble,
    "shard_map": ShardMapEnsemble,
    "sharded": ShardedEnsemble,
}


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
      member axis on every state leaf, parameter leaf and diagnostic.

    Raises:
      ConfigError: too few devices for ``members x prod(mesh)``, or as ``make_engine``.
    """
    available = list(devices) if devices is not None else jax.devices()
    if members < 1:
        raise ConfigError("ensemble.members", f"must be >= 1, got {members}")
    mesh = blocks.default_mesh(name, mesh, len(available), members)
    base = make_engine(name, model, domain_shape, mesh, halo, available)
    if name != "single":  # single vmaps every member on one device
        blocks.require_devices(base.grid.shape, len(available), "ensemble.members", members)
    need = members * base.grid.size if name != "single" else 1
    return _CLASSES[name](model, domain_shape, base.grid, base.halo, available[:need], members)
