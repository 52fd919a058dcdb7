"""The comm layer: what a per-block program asks of the engine, answered per engine.

A per-block program (a grid model's halo fill, the FFT's transposes, the N-body ring, the
particle ghosts and migration) talks to its neighbours only through a ``Comm``:

- ``LocalComm``: the block is the whole domain (``single``, and ``sharded``, where XLA partitions
  the global-view code). Periodic axes wrap locally.
- ``PmapComm``: one flat ``pmap`` axis over a ``DeviceGrid``; neighbours by ``lax.ppermute`` with
  pairs computed from the grid shape; row/column reductions with ``axis_index_groups``.
- ``ShardMapComm``: named mesh axes under ``jax.shard_map``; ``ppermute`` along one mesh axis.
- ``BlockedComm``: the global view of every block at once (the ``sharded`` engine): fields carry
  the device-grid axes in front, ``(*grid.shape, *lead, n_0, ...)``, sharded one block per
  device; a neighbour's slab arrives by a roll along a grid axis, which XLA's partitioner turns
  into one collective-permute of the slab.

Which ``Comm`` an engine uses is decided by ``simpar.parallel.mapping.Mapping.comm``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax import lax

from simpar.parallel.topology import DeviceGrid


class Comm:
    """What a block's halo fill and reductions ask of the engine (the methods' contract).

    ``LocalComm``, ``PmapComm`` and ``ShardMapComm`` answer it; physics code only sees it
    through ``pad`` / ``fill_edges`` and the engines' ``observe``.
    """

    ndim: int

    @property
    def size(self) -> int:
        """Number of devices (blocks) in the program."""
        return self.grid.size

    def extent(self, axis: int) -> int:
        """Number of devices along grid ``axis`` (1: the block spans the axis)."""
        raise NotImplementedError

    def ring_shift(self, x):
        """``x`` from the previous device of the flat (C) order: device ``i`` sends its ``x``
        to device ``i + 1 mod size`` (the ring of ``simpar.parallel.ring``)."""
        raise NotImplementedError

    def ring_pairs(self) -> list[tuple[int, int]]:
        """The ``(source, destination)`` pairs of :meth:`ring_shift` over the flat index."""
        n = self.size
        return [(i, (i + 1) % n) for i in range(n)]

    def shift(self, x, axis: int, direction: int):
        """``x`` from the neighbour at ``-direction`` along ``axis`` (each device sends its
        ``x`` to the neighbour at ``+direction``); zeros at a non-periodic outer edge."""
        raise NotImplementedError

    def coord(self, axis: int):
        """This device's coordinate along grid ``axis`` (a traced int under pmap/shard_map)."""
        raise NotImplementedError

    def psum(self, x):
        """Sum of ``x`` over every device."""
        raise NotImplementedError

    def pmax(self, x):
        """Maximum of ``x`` over every device."""
        raise NotImplementedError

    def pmin(self, x):
        """Minimum of ``x`` over every device."""
        raise NotImplementedError

    def psum_over(self, x, axes: Sequence[int]):
        """Sum over the devices that differ only along grid ``axes`` (rows/columns)."""
        raise NotImplementedError

    def all_to_all(self, x, axis: int, split_axis: int, concat_axis: int):
        """Transpose among the devices that differ only along grid ``axis`` (the FFT's step).

        Each device cuts ``x`` into ``extent(axis)`` equal chunks along ``split_axis`` and
        sends chunk ``j`` to the device at coordinate ``j`` along ``axis``; the chunks it
        receives are joined along ``concat_axis`` in the order of their senders' coordinates.
        Every device sends and receives one block in all.

        Args:
          x: block, any shape and dtype; ``x.shape[split_axis]`` divisible by
            ``extent(axis)``.
          axis: grid axis whose devices exchange.
          split_axis, concat_axis: array axes of ``x``.

        Returns:
          ``x.shape`` with ``split_axis`` divided and ``concat_axis`` multiplied by
          ``extent(axis)``.
        """
        raise NotImplementedError


class LocalComm(Comm):
    """The block is the whole domain on every axis."""

    def __init__(self, ndim: int):
        self.ndim = ndim

    @property
    def size(self) -> int:
        return 1

    def extent(self, axis: int) -> int:
        return 1

    def ring_shift(self, x):  # a ring of one block: it sends to itself
        return x

    def shift(self, x, axis: int, direction: int):  # pragma: no cover - never called
        raise RuntimeError("LocalComm has no neighbours")

    def coord(self, axis: int, ndim: int | None = None):
        return 0

    def psum(self, x):
        return x

    def pmax(self, x):
        return x

    def pmin(self, x):
        return x

    def psum_over(self, x, axes: Sequence[int]):
        return x

    def all_to_all(self, x, axis: int, split_axis: int, concat_axis: int):
        return x  # one device along every axis: the block already holds every chunk


class PmapComm(Comm):
    """Neighbours and reductions under ``jax.pmap`` over one flat axis.

    Args:
      grid: the device grid; flat pmap index ``i`` sits at ``grid.coords(i)``.
      axis_name: the pmap axis name.
    """

    def __init__(self, grid: DeviceGrid, axis_name: str = "dev"):
        self.grid = grid
        self.axis_name = axis_name
        self.ndim = grid.ndim

    def extent(self, axis: int) -> int:
        return self.grid.shape[axis]

    def shift(self, x, axis: int, direction: int):
        return lax.ppermute(x, self.axis_name, self.grid.shift_pairs(axis, direction))

    def ring_shift(self, x):
        return lax.ppermute(x, self.axis_name, self.ring_pairs())

    def coord(self, axis: int, ndim: int | None = None):
        stride = 1
        for n in self.grid.shape[axis + 1 :]:
            stride *= n
        return (lax.axis_index(self.axis_name) // stride) % self.grid.shape[axis]

    def psum(self, x):
        return lax.psum(x, self.axis_name)

    def pmax(self, x):
        return lax.pmax(x, self.axis_name)

    def pmin(self, x):
        return lax.pmin(x, self.axis_name)

    def psum_over(self, x, axes: Sequence[int]):
        axes = [a for a in axes if self.grid.shape[a] > 1]
        if not axes:
            return x
        if len(axes) == self.ndim:
            return self.psum(x)
        return lax.psum(x, self.axis_name, axis_index_groups=self.grid.groups(axes))

    def all_to_all(self, x, axis: int, split_axis: int, concat_axis: int):
        # one flat pmap axis: the devices of one grid row/column form one axis_index_group
        # (members in increasing flat index = increasing coordinate along ``axis``)
        if self.grid.shape[axis] == 1:
            return x
        groups = None if self.grid.shape[axis] == self.grid.size else self.grid.groups((axis,))
        return lax.all_to_all(
            x, self.axis_name, split_axis, concat_axis, axis_index_groups=groups, tiled=True
        )


class ShardMapComm(Comm):
    """Neighbours and reductions under ``jax.shard_map`` on a mesh named ``grid.axis_names``."""

    def __init__(self, grid: DeviceGrid):
        self.grid = grid
        self.ndim = grid.ndim
        self.names = grid.axis_names

    def extent(self, axis: int) -> int:
        return self.grid.shape[axis]

    def shift(self, x, axis: int, direction: int):
        return lax.ppermute(x, self.names[axis], self.grid.axis_pairs(axis, direction))

    def ring_shift(self, x):
        # over every mesh axis at once: the flat index is the C-order device index
        return lax.ppermute(x, self.names, self.ring_pairs())

    def coord(self, axis: int, ndim: int | None = None):
        return lax.axis_index(self.names[axis])

    def psum(self, x):
        return lax.psum(x, self.names)

    def pmax(self, x):
        return lax.pmax(x, self.names)

    def pmin(self, x):
        return lax.pmin(x, self.names)

    def psum_over(self, x, axes: Sequence[int]):
        names = tuple(self.names[a] for a in axes)
        return lax.psum(x, names) if names else x

    def all_to_all(self, x, axis: int, split_axis: int, concat_axis: int):
        if self.grid.shape[axis] == 1:
            return x
        return lax.all_to_all(x, self.names[axis], split_axis, concat_axis, tiled=True)


class BlockedComm(Comm):
    """Every block at once, in the global view: the ``sharded`` engine's halo exchange.

    A field is one array ``(*grid.shape, *lead, n_0, ..., n_{d-1})``: the device-grid axes in
    front (sharded one entry per device), then the block as the per-block engines see it. The
    code is global-view and XLA's partitioner inserts all communication: a neighbour's slab is
    the slab array rolled by one along a grid axis, which it compiles into one
    collective-permute of the slab. At a non-periodic edge the roll wraps around and ``pad``
    overwrites what arrived with the boundary condition (``jnp.where`` on :meth:`coord`).

    Why blocks: a halo padded onto the global field, ``(N_0 + 2w, ...)``, does not divide over
    the devices, and XLA 0.10.2 re-laid out whole fields every step (all-gathers, all-to-alls,
    block-sized permutes). Why a wrapping roll at walls too: a shift that fills the edge block
    with zeros instead (a concatenate) was compiled to all-to-alls and all-gathers.

    Args:
      grid: the device grid.
    """

    def __init__(self, grid: DeviceGrid):
        self.grid = grid
        self.ndim = grid.ndim

    def extent(self, axis: int) -> int:
        return self.grid.shape[axis]

    def shift(self, x, axis: int, direction: int):
        """Block ``i`` gets the slab of block ``i - direction`` (cyclically)."""
        return jnp.roll(x, direction, axis)

    def coord(self, axis: int, ndim: int | None = None):
        """Each block's coordinate along grid ``axis``, shaped to broadcast over ``ndim`` axes."""
        shape = [1] * ndim
        shape[axis] = self.grid.shape[axis]
        return lax.broadcasted_iota(jnp.int32, shape, axis)


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


__all__ = ["BlockedComm", "Comm", "GroupedPmapComm", "LocalComm", "PmapComm", "ShardMapComm"]
