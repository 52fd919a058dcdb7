"""Cell lists and Verlet neighbour lists with a skin, at fixed capacity.

Contract (JAX-MD style): ``allocate`` runs on the host, measures how many neighbours and
cell-column entries the configuration needs and returns a static ``NeighborSpec`` (hashable;
changing it recompiles) with some head-room, plus a built ``NeighborList``. ``build`` and
``update`` are jittable and never change shapes. When a capacity is too small the list sets
a bit of its int32 ``error`` (``error_codes.NEIGHBORS`` / ``CELLS``; sticky) and records in
``needed`` what it would have needed; entries are then missing, so the caller must regrow
(``regrow``) and redo the work. Nothing is dropped silently.

The list is a *full* list: row i holds every j != i with ``|r_i - r_j| < cutoff + skin``,
sorted by the particles' global ids (by index when no ids are given) and padded with the
sentinel ``capacity``. The fixed order makes the per-row force sums independent of how the
particles are laid out in memory, so a domain-decomposed run (``simpar.particles.decomposed``)
sums every atom's force in the same order as a single-device run and follows it bitwise.
Forces are gathered per row, so no scatter is needed. ``needs_rebuild`` implements the exact policy: rebuild as soon as any
particle moved more than ``skin / 2`` since the last build, which guarantees that no pair
within the cutoff is missing.

Cell list (``cells``): particles are sorted by cell (cell width >= radius / reach), so each column of
``2 * reach + 1`` cells along z is a contiguous range of the sorted order; the candidates
of a particle are ``(2 * reach + 1)**2`` such ranges of at most ``column_capacity``
entries each. Particles with ``valid == False`` (empty slots of a fixed-capacity buffer)
take part in nothing. Small systems use all pairs as candidates.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simpar.memory import lean_jit, release_free_memory
from simpar.particles import cells, error_codes
from simpar.particles.space import Space, displacement

_BIG = np.iinfo(np.int32).max  # sort key of the sentinel entries
# particles per pass of the build on CPU (``allocate``): in.lj (32,000 atoms, float64, one
# pinned core) builds in 0.25 s at 256 against 0.29 s at 4,096 (best of 5, three interleaved
# pairs), with smaller temporaries; the list is the same
BUILD_BLOCK_CPU = 256


@dataclasses.dataclass(frozen=True)
class NeighborSpec:
    """Static layout of a neighbour list (hashable; changing any field recompiles).

    Attributes:
      capacity: number of particle slots N.
      max_neighbors: row length M of the list.
      radius: list radius ``cutoff + skin`` (sigma).
      skin: skin (sigma).
      periodic: whether the space is periodic.
      cells: cells per axis, or None for all-pairs candidates.
      reach: cells searched on each side (1 or 2).
      column_capacity: most sorted entries read per column of cells.
      origin: free space only, lower corner of the cell grid (sigma).
      width: free space only, cell widths (sigma).
      block: particles processed at once while building (memory bound).
      rows: build rows only for the first ``rows`` particles (the owned atoms of a
        domain block; the others are candidates only); None: every particle.
      wrap: free-space grids only, the axes along which the cell grid wraps around (a
        domain block's unsplit axes: its grid spans the whole periodic box there, with
        ``origin`` 0 and ``width`` box / cells); None: none.
      images: with ``cell_r``, the axes where a candidate may be another periodic image
        than the minimum one (``build`` checks there); None: every axis that does not wrap.
    """

    capacity: int
    max_neighbors: int
    radius: float
    skin: float
    periodic: bool
    cells: tuple[int, int, int] | None
    reach: int
    column_capacity: int
    origin: tuple[float, float, float] | None = None
    width: tuple[float, float, float] | None = None
    block: int = 4096
    rows: int | None = None
    wrap: tuple[bool, bool, bool] | None = None
    images: tuple[bool, bool, bool] | None = None


class NeighborList(NamedTuple):
    """A Verlet list (a pytree).

    Attributes:
      idx: int32[R, M], neighbour indices, padded with N (R = ``spec.rows`` or N).
      ref_position: float[R, 3], positions of the rows at the last build (sigma).
      error: int32[], ``error_codes`` bits: a capacity was too small at some build
        (``NEIGHBORS``: max_neighbors, ``CELLS``: column_capacity; sticky).
      needed: int32[2], largest (neighbours per row, column entries) seen at any build.
      n_builds: int32[], number of builds since allocation.
    """

    idx: jax.Array
    ref_position: jax.Array
    error: jax.Array
    needed: jax.Array
    n_builds: jax.Array

    @property
    def did_overflow(self):
        """bool[]: some capacity overflowed (``error != 0``; the former field)."""
        return self.error != 0


def build(
    spec: NeighborSpec,
    space: Space,
    r: jax.Array,
    valid: jax.Array,
    *,
    cell_r: jax.Array | None = None,
    ids: jax.Array | None = None,
    id_bound: int | None = None,
) -> NeighborList:
    """Build a neighbour list from scratch (jittable, ``spec`` static).

    Args:
      spec: static layout from ``allocate``.
      space: the space; distances use its minimum image when it is periodic.
      r: float[N, 3], positions (sigma).
      valid: bool[N], occupied slots.
      cell_r: float[N, 3], positions used to bin particles into cells (default ``r``);
        a domain block passes periodic images here (unwrapped across the box edge, in a
        free-space cell grid, ``spec.periodic`` False) while ``r`` keeps the wrapped
        positions, so the distances are computed exactly as on one device.
      ids: int32[N] global ids (rows are sorted by them); default the slot index.
      id_bound: static; the ids lie in ``[0, id_bound)`` (the system's atom count): the id
        order is then found with one packed-key sort (``stable_order``) when it fits int32.

    Returns:
      A fresh ``NeighborList`` (``n_builds`` = 1, overflow flags of this build only).
    """
    # the list is integer bookkeeping: no tangent flows through it (``jax.grad`` of a run
    # follows the positions through the forces, ``simpar.particles.differentiable``)
    r = jax.lax.stop_gradient(r)
    cell_r = None if cell_r is None else jax.lax.stop_gradient(cell_r)
    n, m = spec.capacity, spec.max_neighbors
    nrow = spec.rows or n
    rad2 = jnp.asarray(spec.radius**2, r.dtype)
    blk = min(spec.block, nrow)
    nblk = -(-nrow // blk)
    npad = nblk * blk

    def pad(x):
        x = x[:nrow]
        return jnp.concatenate([x, jnp.zeros((npad - nrow,) + x.shape[1:], x.dtype)])

    if spec.cells is None:
        order = jnp.arange(n, dtype=jnp.int32)
        rs, vs = r, valid
        nw, ns = cells.split_words(n)
        cand = jnp.arange(nw * ns, dtype=jnp.int32).reshape(nw, ns)
        per_particle = (pad(jnp.arange(n, dtype=jnp.int32)),)

        def candidates(blocked):
            (i,) = blocked
            ok = jnp.broadcast_to(cand < n, (blk, nw, ns))
            sidx = jnp.broadcast_to(jnp.minimum(cand, n - 1), (blk, nw, ns))

            def locate(src, _picked):  # the candidates of the outputs: a gather
                flat = sidx.reshape(blk, -1)
                return jnp.take_along_axis(flat, jnp.minimum(src, flat.shape[1] - 1), axis=1)

            return sidx, ok, i, (), locate, None, lambda a: a[sidx]

    else:
        copies, start, crow = cells.bin_cells(
            spec, space, r if cell_r is None else cell_r, valid
        )
        kc = copies.shape[0]
        # each row's own copy (q < n): excluded from its candidates
        inv = jnp.zeros(kc, jnp.int32).at[copies].set(jnp.arange(kc, dtype=jnp.int32))[:n]
        order = copies % n if kc > n else copies  # copy q is slot q % n (z images: q >= n)
        rs, vs = r[order], None  # invalid slots sit in a sentinel cell: never candidates
        nw, ns = cells.split_words(spec.column_capacity)
        slot = jnp.arange(nw * ns, dtype=jnp.int32)
        per_particle = tuple(map(pad, (inv, crow)))

        def candidates(blocked):
            i_sorted, cb = blocked
            s0, ln = cells.row_columns(spec, start, cb)
            s0e, lne = s0[..., None], ln[..., None]
            ok = slot < lne
            ncol = s0.shape[1]
            sidx = jnp.where(ok, s0e + slot, 0).reshape(blk, ncol * nw, ns)
            words = ncol * nw
            if words > cells.UNROLL_WORDS:
                picks = ()

                def locate(src, _picked):
                    flat = sidx.reshape(blk, -1)
                    return jnp.take_along_axis(flat, jnp.minimum(src, words * ns - 1), axis=1)

            else:
                # each output's column start read at its word (no gather of the (B, W * S)
                # candidates): its sorted index from the column's range
                picks = (jnp.repeat(s0, nw, axis=1),)

                def locate(src, picked):
                    (p_s,) = picked
                    return p_s + src - (src // (nw * ns)) * (nw * ns)  # + slot in column

            def fetch(a):  # a[sidx]: one contiguous slice of ``a`` per column
                return cells.column_slices(a, s0, nw * ns).reshape(sidx.shape)

            return sidx, ok.reshape(blk, words, ns), i_sorted, picks, locate, ln, fetch

    rpad, vpad = pad(r), pad(valid)
    # padded past the last column's slice (``cells.column_slices``)
    tail = 0 if spec.cells is None else nw * ns
    rs_soa = [jnp.concatenate([rs[:, d], jnp.zeros(tail, rs.dtype)]) for d in range(3)]
    images = cell_r is not None and space.periodic
    image_axes = spec.images or tuple(not (spec.wrap and spec.wrap[d]) for d in range(3))
    images = images and any(image_axes)
    if images:  # periodic images: keep the image a candidate stands for, not its copies
        cpad = pad(cell_r)
        cs_soa = [(cell_r if spec.cells is None else cell_r[order])[:, d] for d in range(3)]
        cs_soa = [jnp.concatenate([x, jnp.zeros(tail, x.dtype)]) for x in cs_soa]

    by_id = rank = None
    if ids is not None:
        # rows sorted by each slot's rank in id order: a one-array int32 sort of the rows, as
        # without ids (sorting (id, slot) pairs costs 2.5x the whole build on XLA:CPU);
        # ids within a row are distinct, so the rank order is the id order
        if id_bound is None:
            by_id = cells.stable_order(jnp.where(ids >= 0, ids, _BIG), 0)
        else:
            by_id = cells.stable_order(jnp.where(ids >= 0, ids, id_bound), id_bound + 1)
        by_id = jnp.concatenate([by_id, jnp.full(1, n, jnp.int32)])  # the sentinel n stays n
        rank = jnp.zeros(n + 1, jnp.int32).at[by_id].set(jnp.arange(n + 1, dtype=jnp.int32))
        rank_of_sorted = rank[order]

    def one_block(b):
        sl = lambda x: jax.lax.dynamic_slice_in_dim(x, b * blk, blk)  # noqa: E731
        blocked = tuple(map(sl, per_particle))
        ri, vi = sl(rpad), sl(vpad)
        same = True
        ci = sl(cpad) if images else None
        sidx, ok, i_sorted, picks, locate, col_len, fetch = candidates(blocked)
        r2 = jnp.zeros(sidx.shape, r.dtype)
        for d in range(3):  # one coordinate at a time: vectorises better on CPU
            dx = ri[:, d, None, None] - fetch(rs_soa[d])
            if space.periodic:
                box = space.box[d].astype(r.dtype)
                dx = dx - box * jnp.round(dx * (1.0 / box))  # one division, not one per pair
            r2 = r2 + dx * dx
            if images and image_axes[d]:
                # image and minimum-image displacements differ by 0 or a box length
                dxi = ci[:, d, None, None] - fetch(cs_soa[d])
                same = same & (jnp.abs(dxi - dx) < 0.5 * space.box[d].astype(r.dtype))
        mask = ok & (r2 < rad2) & (sidx != i_sorted[:, None, None]) & same
        if vs is not None:
            mask = mask & vs[sidx]
        mask = mask & vi[:, None, None]
        src, cnt, picked = cells.compact_words(mask, m, picks)
        got = locate(src, picked)
        have = src < sidx.shape[1] * sidx.shape[2]
        # sorted copies, not yet their keys: those are gathered one iteration later with the
        # row sort (``fill``): a gather in the compaction's loop keeps LLVM from vectorising
        # it where vector gathers are slow (AVX2 on AMD: the whole build 2x slower)
        rows = jnp.where(have, got, -1)  # -1: no neighbour
        if spec.cells is None:
            col = jnp.int32(0)
        else:
            col = jnp.max(jnp.where(vi[:, None], col_len, 0))
        return rows, jnp.max(cnt), col

    key = order if by_id is None else rank_of_sorted

    def finish(got):  # each row's keys sorted (by slot, or by id rank: the sentinel's is n)
        rows = jnp.where(got >= 0, key[jnp.maximum(got, 0)], n)  # n: last
        rows = cells.sort_rows(rows, n)
        return rows if by_id is None else by_id[rows]

    def fill(b, carry):  # each block's rows written in place into the list (no stacking)
        # software-pipelined: block b - 1's rows, carried over from the last iteration, are
        # sorted here while block b is compacted. The carry is a buffer XLA cannot fuse
        # through: fused into the sorting network, the compaction was recomputed by its
        # passes (in.lj: the build 2.9x slower). At b = 0 the carry's sentinel rows land on
        # block 0, which b = 1 overwrites.
        out, pend, c_max, col_max = carry
        prev = jnp.maximum(b - 1, 0) * blk
        out = jax.lax.dynamic_update_slice_in_dim(out, finish(pend), prev, axis=0)
        rows, c, co = one_block(b)
        return out, rows, jnp.maximum(c_max, c), jnp.maximum(col_max, co)

    zero = jnp.zeros((), jnp.int32)
    init = (jnp.full((npad, m), n, jnp.int32), jnp.full((blk, m), -1, jnp.int32), zero, zero)
    # blocks up to the last valid row only (a domain block's empty slots trail its atoms)
    used = used_rows(valid[:nrow])
    nb = jnp.minimum(nblk, -(-used // blk))
    idx, pend, cnt, col = jax.lax.fori_loop(0, nb, fill, init)
    last = jnp.maximum(nb - 1, 0) * blk  # no rows (nb = 0): the sentinel rows on block 0
    idx = jax.lax.dynamic_update_slice_in_dim(idx, finish(pend), last, axis=0)
    idx = idx[:nrow]
    needed = jnp.stack([jnp.max(cnt), jnp.max(col)]).astype(jnp.int32)
    return NeighborList(idx, r[:nrow], error_bits(spec, needed), needed, jnp.int32(1))


def error_bits(spec: NeighborSpec, needed):
    """int32[] ``error_codes`` bits of the capacities that ``needed`` (int32[2]: neighbours
    per row, column entries) exceeds."""
    err = jnp.where(needed[0] > spec.max_neighbors, error_codes.NEIGHBORS, 0)
    if spec.cells is not None:
        err = err | jnp.where(needed[1] > spec.column_capacity, error_codes.CELLS, 0)
    return err.astype(jnp.int32)


def used_rows(valid):
    """int32[]: the leading rows holding every valid particle (the last valid index + 1; a
    domain block's free slots trail its atoms, as migration and ``distribute`` pack them)."""
    n = valid.shape[0]
    return jnp.max(jnp.where(valid, jnp.arange(1, n + 1, dtype=jnp.int32), 0))


def merge(old: NeighborList, new: NeighborList) -> NeighborList:
    """A fresh list ``new`` carrying ``old``'s sticky errors, needs and build count."""
    return NeighborList(
        new.idx,
        new.ref_position,
        old.error | new.error,
        jnp.maximum(old.needed, new.needed),
        old.n_builds + 1,
    )


def needs_rebuild(spec: NeighborSpec, space: Space, nbrs: NeighborList, r, valid):
    """True when any valid particle moved more than ``skin / 2`` since the last build."""
    dr = displacement(space, r, nbrs.ref_position)
    d2 = jnp.where(valid, jnp.sum(dr * dr, axis=-1), 0.0)
    return jnp.max(d2) > jnp.asarray((0.5 * spec.skin) ** 2, r.dtype)


def update(spec: NeighborSpec, space: Space, nbrs: NeighborList, r, valid) -> NeighborList:
    """Rebuild the list if ``needs_rebuild`` (jittable); flags and needs accumulate."""

    def rebuild(_):
        return merge(nbrs, build(spec, space, r, valid))

    return jax.lax.cond(needs_rebuild(spec, space, nbrs, r, valid), rebuild, lambda _: nbrs, None)


def _layout(space: Space, r: np.ndarray, valid: np.ndarray, radius: float, force_all_pairs):
    """Cells, reach, origin and width for a configuration (host side)."""
    box = np.asarray(space.box, dtype=np.float64)
    if space.periodic and np.any(box < 2.0 * radius):
        raise ValueError(
            f"box {box.tolist()} is smaller than twice the list radius {radius:g}; the "
            "minimum image would miss pairs (use a larger box or a smaller cutoff/skin)"
        )
    if space.periodic:
        origin = None
        extent = box
    else:
        rv = r[valid] if valid.any() else np.zeros((1, 3))
        lo, hi = rv.min(axis=0), rv.max(axis=0)
        origin = tuple(float(x) for x in lo - 0.5 * radius)
        extent = hi - lo + radius
    if force_all_pairs:
        return None, 1, None, None
    for reach in (2, 1):
        cells = np.maximum(np.floor(extent * reach / radius).astype(int), 1)
        if not space.periodic or np.all(cells >= 2 * reach + 1):
            width = None if space.periodic else tuple(float(x) for x in extent / cells)
            if int(np.prod(cells)) < 27:
                break
            return tuple(int(c) for c in cells), reach, origin, width
    return None, 1, None, None


@functools.cache
def lean_build():
    """``build`` jitted lean (``simpar.memory.lean_jit``: a fifth of the compiler's memory,
    the same list): for set-up and regrows; the time steps' rebuilds use their own program."""
    return lean_jit(build, static_argnums=0)


def _sharding(x):
    """Where ``x`` lives (its ``sharding``; None for host arrays)."""
    return getattr(x, "sharding", None)


def size_list(
    space: Space,
    r,
    valid=None,
    *,
    cutoff: float,
    skin: float,
    capacity_factor: float = 1.2,
    max_neighbors: int | None = None,
    column_capacity: int | None = None,
    all_pairs: bool = False,
    block: int | None = None,
) -> NeighborSpec:
    """The layout of a neighbour list for positions ``r``, measured on the host with NumPy
    (``cells.host_needs``: no program compiled or run). Arguments as ``allocate``'s; the
    capacities not given are the needs times ``capacity_factor``, rounded up (rows to 8,
    columns to 4) so that similar systems share compiled code."""
    if block is None:
        block = BUILD_BLOCK_CPU if jax.default_backend() == "cpu" else 4096
    r = np.asarray(r)
    n = r.shape[0]
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    radius = float(cutoff) + float(skin)
    cell_grid, reach, origin, width = _layout(space, r, valid, radius, all_pairs)
    spec = NeighborSpec(n, 1, radius, float(skin), space.periodic, cell_grid, reach, 1,
                        origin, width, int(block))  # fmt: skip
    needs = cells.host_needs(spec, space, r, valid)
    fitted = regrow(spec, NeighborList(None, None, None, np.asarray(needs), None),
                    capacity_factor, shrink=True)  # fmt: skip
    m = max_neighbors or fitted.max_neighbors
    c = column_capacity or fitted.column_capacity
    return dataclasses.replace(spec, max_neighbors=int(min(m, n)), column_capacity=int(c))


def unbuilt(spec: NeighborSpec, like) -> NeighborList:
    """A list of ``spec``'s shapes holding no pairs and no build, placed as ``like`` (float[N,
    3] positions): what a first build is merged into (``merge``), by a program that donates
    it (``md.lean_programs``' ``rebuild_list`` writes the list in its buffer)."""
    rows, m = spec.rows or spec.capacity, spec.max_neighbors
    host = NeighborList(np.full((rows, m), spec.capacity, np.int32),
                        np.zeros((rows, 3), like.dtype), np.int32(0), np.zeros(2, np.int32),
                        np.int32(0))  # fmt: skip
    return jax.device_put(host, _sharding(like))


def allocate(space: Space, r, valid=None, **kw) -> tuple[NeighborSpec, NeighborList]:
    """Size (``size_list``, on the host) and build a neighbour list for positions ``r`` (host
    side, not jittable).

    Args:
      space: the space.
      r: float[N, 3] positions (sigma).
      valid: bool[N] occupied slots (default all).
      cutoff: interaction cutoff rc (sigma).
      skin: Verlet skin (sigma); the list radius is ``cutoff + skin``.
      capacity_factor: head-room applied to the measured needs.
      max_neighbors, column_capacity: fixed capacities (skip measuring; may overflow,
        which the caller must then detect and repair).
      all_pairs: use all particles as candidates (small systems, tests).
      block: particles processed at once while building; None: ``BUILD_BLOCK_CPU`` on CPU,
        4,096 on accelerators (which want wide passes). The list does not depend on it.

    Returns:
      (spec, nbrs): the static layout and a list built for ``r`` (check ``nbrs.error``
      when capacities were given).
    """
    valid = np.ones(np.shape(r)[0], bool) if valid is None else valid
    spec = size_list(space, r, valid, **kw)
    nbrs = jax.block_until_ready(lean_build()(spec, space, jnp.asarray(r), valid))
    release_free_memory()  # the build's freed compiler memory, which the C heap would keep
    return spec, nbrs


def regrow(
    spec: NeighborSpec, nbrs: NeighborList, factor: float = 1.2, shrink: bool = False
) -> NeighborSpec:
    """A layout with room for ``factor`` times what ``nbrs`` needed (host side).

    Args:
      spec: the current layout.
      nbrs: a list built (or updated) with ``spec``; its ``needed`` is used.
      factor: head-room (>= 1).
      shrink: allow capacities below the current ones (used by ``allocate``).
    """
    need_m, need_c = (int(x) for x in np.asarray(nbrs.needed))
    m = -(-int(math.ceil(need_m * factor)) // 8) * 8
    c = -(-int(math.ceil(need_c * factor)) // 4) * 4 if spec.cells is not None else 0
    if not shrink:
        m, c = max(m, spec.max_neighbors), max(c, spec.column_capacity)
    m = min(max(m, 1), spec.capacity)
    return dataclasses.replace(spec, max_neighbors=m, column_capacity=max(c, 1))
