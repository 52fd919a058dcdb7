"""Halo fill: one call answered by a local wrap, a boundary condition, or a neighbour's data.

A block of a field has shape ``(*lead, n_0, ..., n_{d-1})``: leading component axes (e.g. the 9
populations of D2Q9) are never split; the trailing ``d`` spatial axes are. ``pad(x, w, ...)``
returns the block with ``w`` halo cells on each side of every spatial axis, including edges and
corners: axes are padded one after the other, so the slabs exchanged along axis 1 already carry
axis 0's halo (the standard two-pass corner trick).

Where the halo comes from is the ``Comm``'s business (``simpar.parallel.comm``: a local wrap,
a neighbour by ``ppermute`` under ``pmap``/``shard_map``, or a roll of the blocked global view
under ``sharded``; the comm classes are re-exported here for older imports).

At non-periodic outer edges ``ppermute`` delivers zeros; ``fill_edges`` then overwrites the halo
with the physical boundary condition (selected with ``jnp.where`` on the device's coordinate,
so every device runs the same program).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from simpar.parallel.comm import (  # noqa: F401  (re-exported: the Comm layer used to live here)
    BlockedComm,
    Comm,
    LocalComm,
    PmapComm,
    ShardMapComm,
)


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
