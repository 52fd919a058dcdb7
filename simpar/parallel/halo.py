"""Halo fill: one call answered by a local wrap, a boundary condition, or a neighbour's data.

A block of a field has shape ``(*lead, n_0, ..., n_{d-1})``: leading component axes (e.g. the 9
populations of D2Q9) are never split; the trailing ``d`` spatial axes are. ``pad(x, w, ...)``
returns the block with ``w`` halo cells on each side of every spatial axis, including edges and
corners: axes are padded one after the other, so the slabs exchanged along axis 1 already carry
axis 0's halo (the standard two-pass corner trick).

Where the halo comes from is the ``Comm``'s business:

- ``LocalComm``: the block is the whole domain (``single``, and ``sharded``, where XLA partitions
  the global-view code). Periodic axes wrap locally.
- ``PmapComm``: one flat ``pmap`` axis over a ``DeviceGrid``; neighbours by ``lax.ppermute`` with
  pairs computed from the grid shape; row/column reductions with ``axis_index_groups``.
- ``ShardMapComm``: named mesh axes under ``jax.shard_map``; ``ppermute`` along one mesh axis.
- ``BlockedComm``: the global view of every block at once (the ``sharded`` engine): fields carry
  the device-grid axes in front, ``(*grid.shape, *lead, n_0, ...)``, sharded one block per
  device; a neighbour's slab arrives by a roll along a grid axis, which XLA's partitioner turns
  into one collective-permute of the slab.

At non-periodic outer edges ``ppermute`` delivers zeros; ``fill_edges`` then overwrites the halo
with the physical boundary condition (selected with ``jnp.where`` on the device's coordinate,
so every device runs the same program).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
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


def to_blocks(u, grid_shape: Sequence[int], d: int):
    """Global ``(*lead, N_0, ..., N_{d-1})`` -> ``(*grid_shape, *lead, n_0, ..., n_{d-1})``.

    Works on NumPy and JAX arrays (``reshape`` and ``transpose`` only; on a JAX array sharded
    along ``N_a`` over ``grid_shape[a]`` devices it moves no data between devices).
    """
    nl = u.ndim - d
    lead = u.shape[:nl]
    split = []
    for N, m in zip(u.shape[nl:], grid_shape, strict=True):
        split += [m, N // m]
    order = [nl + 2 * a for a in range(d)] + list(range(nl)) + [nl + 2 * a + 1 for a in range(d)]
    return u.reshape(*lead, *split).transpose(order)


def from_blocks(b, grid_shape: Sequence[int], d: int):
    """Inverse of :func:`to_blocks`: ``(*grid_shape, *lead, n_0, ...)`` -> ``(*lead, N_0, ...)``."""
    nl = b.ndim - 2 * d
    blk = b.shape[b.ndim - d :]
    order = list(range(d, d + nl))
    for a in range(d):
        order += [a, d + nl + a]
    return b.transpose(order).reshape(
        *b.shape[d : d + nl], *(n * m for n, m in zip(blk, grid_shape, strict=True))
    )


def crop(x: jax.Array, k: int, d: int) -> jax.Array:
    """The interior of a block padded by ``k`` on its trailing ``d`` axes (inverse of ``pad``).

    Args:
      x: padded block ``(*lead, n_0 + 2k, ..., n_{d-1} + 2k)``.
      k: halo width to drop.
      d: number of trailing spatial axes.

    Returns:
      ``(*lead, n_0, ..., n_{d-1})``.
    """
    lead = x.ndim - d
    limits = list(x.shape[:lead]) + [x.shape[lead + a] - k for a in range(d)]
    return lax.slice(x, [0] * lead + [k] * d, limits)


def _slice(x, axis: int, start: int, stop: int):
    return lax.slice_in_dim(x, start, stop, axis=axis)


def pad(x: jax.Array, w: int, bcs, comm, sides=None) -> jax.Array:
    """Add a halo of width ``w`` on every spatial axis of one block, corners included.

    Args:
      x: block, shape ``(*lead, n_0, ..., n_{d-1})``, any dtype.
      w: halo width in cells (>= 0; every split axis needs ``n_i >= w``).
      bcs: per spatial axis a ``(lower, upper)`` pair of boundary conditions
        (``simpar.grid.boundary``).
      comm: ``LocalComm``, ``PmapComm`` or ``ShardMapComm``.
      sides: optional per spatial axis ``(lower, upper)`` bools: the halo sides the caller
        reads. On an axis split over devices a side not read is not received: it holds the
        block's own edge slab (no communication). None: every side.

    Returns:
      Shape ``(*lead, n_0 + 2w, ..., n_{d-1} + 2w)``, halo filled everywhere (the sides not
      read with stand-ins).
    """
    if w == 0:
        return x
    d = len(bcs)
    for a in range(d):
        ax = x.ndim - d + a
        n = x.shape[ax]
        lo_bc, hi_bc = bcs[a]
        inner_lo, inner_hi = _slice(x, ax, 0, w), _slice(x, ax, n - w, n)
        if comm.extent(a) == 1:
            if lo_bc.periodic:
                lo, hi = inner_hi, inner_lo
            else:
                lo, hi = lo_bc.fill(inner_lo, ax, -1), hi_bc.fill(inner_hi, ax, +1)
        else:
            want_lo, want_hi = (True, True) if sides is None else sides[a]
            lo = comm.shift(inner_hi, a, +1) if want_lo else inner_lo
            hi = comm.shift(inner_lo, a, -1) if want_hi else inner_hi
            if not lo_bc.periodic:  # ppermute delivered zeros at the outer edges
                c = comm.coord(a, x.ndim)
                if want_lo:
                    lo = jnp.where(c == 0, lo_bc.fill(inner_lo, ax, -1), lo)
                if want_hi:
                    hi = jnp.where(c == comm.extent(a) - 1, hi_bc.fill(inner_hi, ax, +1), hi)
        x = lax.concatenate([lo, x, hi], ax)
    return x


def fill_edges(x: jax.Array, k: int, bcs, comm) -> jax.Array:
    """Overwrite the ``k``-wide halo at physical (non-periodic) edges with the boundary condition.

    Called after ``pad`` and after every sub-step of a multi-step exchange, when the stencil has
    consumed part of the halo: values computed in the halo at a physical edge are meaningless and
    are refilled from the cells just inside.

    Args:
      x: padded block, shape ``(*lead, n_0 + 2k, ...)``.
      k: current halo width.
    """
    if k == 0:
        return x
    d = len(bcs)
    for a in range(d):
        lo_bc, hi_bc = bcs[a]
        if lo_bc.periodic:
            continue
        ax = x.ndim - d + a
        n = x.shape[ax]
        lo = lo_bc.fill(_slice(x, ax, k, 2 * k), ax, -1)
        hi = hi_bc.fill(_slice(x, ax, n - 2 * k, n - k), ax, +1)
        if comm.extent(a) > 1:
            c = comm.coord(a, x.ndim)
            lo = jnp.where(c == 0, lo, _slice(x, ax, 0, k))
            hi = jnp.where(c == comm.extent(a) - 1, hi, _slice(x, ax, n - k, n))
        # in-place updates rather than a concatenate: under the sharded engine XLA keeps the
        # array's sharding and touches only the edge shards (a concatenate of x[k:n-k] made it
        # all-gather the whole axis)
        x = lax.dynamic_update_slice_in_dim(x, lo, 0, ax)
        x = lax.dynamic_update_slice_in_dim(x, hi, n - k, ax)
    return x


def fold(x: jax.Array, w: int, d: int, comm) -> jax.Array:
    """Sum a ``w``-wide halo back onto the blocks that own those cells (the transpose of ``pad``).

    Used by scatter operations (particle-mesh deposit): a block accumulates into its interior
    and a halo, and each halo cell is added onto the neighbour's interior cell it stands for.
    Axes are folded in the reverse order of ``pad`` (last spatial axis first), so corner and
    edge contributions reach the diagonal neighbour in two or three hops, as in ``pad``. Every
    spatial axis is periodic (a local wrap on axes the comm does not split).

    Args:
      x: padded block ``(*lead, n_0 + 2w, ..., n_{d-1} + 2w)``, any numeric dtype.
      w: halo width (>= 0; every axis needs ``n_a >= w``).
      d: number of trailing spatial axes.
      comm: ``LocalComm``, ``PmapComm``, ``ShardMapComm`` or ``BlockedComm``.

    Returns:
      ``(*lead, n_0, ..., n_{d-1})``: the interior plus the halos sent to it.
    """
    if w == 0:
        return x
    for a in reversed(range(d)):
        ax = x.ndim - d + a
        n = x.shape[ax]
        lo, hi = _slice(x, ax, 0, w), _slice(x, ax, n - w, n)
        x = _slice(x, ax, w, n - w)
        m = n - 2 * w
        if m < w:
            raise ValueError(f"fold: block of {m} cells along axis {a} is thinner than w={w}")
        if comm.extent(a) == 1:
            from_lo, from_hi = hi, lo  # the wrap: the high halo stands for the first cells
        else:
            from_lo = comm.shift(hi, a, +1)  # the lower neighbour's high halo: my first cells
            from_hi = comm.shift(lo, a, -1)  # the upper neighbour's low halo: my last cells
        x = lax.dynamic_update_slice_in_dim(x, _slice(x, ax, 0, w) + from_lo, 0, ax)
        x = lax.dynamic_update_slice_in_dim(x, _slice(x, ax, m - w, m) + from_hi, m - w, ax)
    return x
