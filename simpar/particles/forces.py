"""Pair forces from a full neighbour list (the force kernel of every MD engine).

Contract: ``pair_forces(pot, space, r, idx, others=...)`` sums, for each row ``i``, the pair
terms over the neighbours ``idx[i]`` in the order they are listed (sorted by global atom id,
see ``neighbors``), so the force of an atom does not depend on where its neighbours sit in
memory: a domain block (neighbours = its owned atoms followed by its ghosts) and one device
give the same numbers bit for bit (with FMA off).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simpar.particles.potentials import PairPotential, lj_force, pair_terms
from simpar.particles.space import Space

# neighbour rows per pass on CPU (see ``pair_forces``): in.lj (32,000 atoms, 96 slots, float64,
# one pinned core) 11.7-11.9 ms per force call at 128 against 12.7-13.1 ms at 1,024 (CPU time,
# best of 10, interleaved in one process; the (rows, 96) temporaries of a pass stay in L2), and
# its first 100 steps 2.61 s against 2.73 s, the trajectory bit for bit the same
ROW_BLOCK_CPU = 128


def _row_block() -> int | None:
    """Rows per pass of the force kernel: ``ROW_BLOCK_CPU`` on CPU, None (one pass) on
    accelerators, whose kernels want all rows at once."""
    return ROW_BLOCK_CPU if jax.default_backend() == "cpu" else None


def _pair_rows(pot, space, r, idx, cols, energy: bool, fresh=None):
    """``pair_forces`` for rows ``r`` (float[B, 3]) against ``cols``: the neighbours'
    coordinates one axis at a time, each float[K + 1] ending with the padding entry;
    ``fresh`` (bool[B]): the rows whose energy and virial count (default all)."""
    mask = idx < cols[0].shape[0] - 1
    # Structure-of-arrays gathers (one coordinate at a time) vectorise better on CPU
    # than gathering (N, M, 3) rows.
    comps, r2 = [], jnp.zeros(idx.shape, r.dtype)
    for d in range(3):
        dx = r[:, d, None] - cols[d][idx]
        if space.periodic:
            box = space.box[d].astype(r.dtype)
            dx = dx - box * jnp.round(dx * (1.0 / box))  # one division, not one per pair
        comps.append(dx)
        r2 = r2 + dx * dx
    if pot.force_fn is lj_force:
        # padding slots become pairs at the cutoff (outside it): the same terms as masking
        # them in ``pair_terms``, but the mask folds into r2's fusion instead of a pass of its
        # own (in.lj, float64, one core: 7-11% less time per force call). Only for LJ, whose
        # terms are rational: a potential with exp or sqrt (a jvp-derived Yukawa) then fused
        # differently in ``single`` and ``shard_map`` and lost their bitwise agreement
        rc = pot.cutoff.astype(r.dtype)
        e, f_over_r = pair_terms(pot, jnp.where(mask, r2, rc * rc))
    else:
        e, f_over_r = pair_terms(pot, r2, mask)
    force = jnp.stack([jnp.sum(f_over_r * dx, axis=1) for dx in comps], axis=-1)
    if not energy:
        return force
    w = f_over_r * r2
    if fresh is not None:
        e, w = (jnp.where(fresh[:, None], x, 0.0) for x in (e, w))
    return force, 0.5 * jnp.sum(e), 0.5 * jnp.sum(w)


def _passes(pot, space, r, idx, cols, block: int, energy: bool, rows=None):
    """``pair_forces`` in passes of ``block`` rows read in place: the last pass starts at
    ``N - block`` and recomputes rows of the one before (to the same bits; their energy
    is not counted twice) instead of padding a copy of ``idx`` to a multiple of ``block``
    rows (a 6 MiB copy per step for a 16,392-row block). With ``rows`` (traced) the passes
    stop after the pass holding row ``rows - 1``."""
    n_rows = r.shape[0]
    n_pass = nb = -(-n_rows // block)
    if rows is not None:
        nb = jnp.minimum(nb, -(-rows // block))

    def one(i, carry):
        start = jnp.minimum(i * block, n_rows - block)
        r_pass = jax.lax.dynamic_slice_in_dim(r, start, block)
        nbrs = jax.lax.dynamic_slice_in_dim(idx, start, block)
        if not energy:
            f = _pair_rows(pot, space, r_pass, nbrs, cols, False)
            return jax.lax.dynamic_update_slice_in_dim(carry, f, start, 0)
        out, e, w = carry
        fresh = start + jnp.arange(block) >= i * block
        f, ei, wi = _pair_rows(pot, space, r_pass, nbrs, cols, True, fresh)
        return (
            jax.lax.dynamic_update_slice_in_dim(out, f, start, 0),
            e.at[i].set(ei),
            w.at[i].set(wi),
        )

    out = jnp.zeros_like(r)
    if not energy:
        return jax.lax.fori_loop(0, nb, one, out)
    sums = jnp.zeros(n_pass, r.dtype)  # passes not run add 0
    force, e, w = jax.lax.fori_loop(0, nb, one, (out, sums, sums))
    return force, jnp.sum(e), jnp.sum(w)


def pair_forces(pot: PairPotential, space: Space, r, idx, energy: bool = True, others=None,
                block: int | None = -1, rows=None):  # fmt: skip
    """Forces, pair energy and virial from a full neighbour list.

    Args:
      pot: pair potential.
      space: the space.
      r: float[N, 3] positions (sigma) of the particles whose forces are wanted.
      idx: int32[N, M] neighbour indices into ``others``, padded with ``len(others)``.
      energy: static; False returns the force alone (the time steps need nothing else,
        and the two extra reductions cost ~40% of the kernel on CPU).
      others: float[K, 3] positions of the neighbours (default ``r``); a domain block
        passes its owned atoms followed by its ghosts.
      block: rows per pass (static): the kernel runs over ``block`` rows at a time
        (``_passes``), so its (rows, M) temporaries stay in cache: on CPU 4x faster than
        one pass over 32,000 x 96 slots (``ROW_BLOCK_CPU``). The forces equal one pass's
        bit for bit with FMA off (as the tests run); with FMA on XLA may contract
        differently per pass (float32: 4e-7 of the largest force). -1 (default):
        ``ROW_BLOCK_CPU`` (128) on CPU, one pass on accelerators; None: one pass.
      rows: int32[] (traced) or None: the rows from ``rows`` on are empty (a domain block's
        trailing free slots, whose list rows hold no neighbour): passes stop before them
        and their force is 0. None: every row is computed.

    Returns:
      (force float[N, 3], e_pair scalar, virial scalar); each pair is seen twice in a
      full list, hence the factors 1/2 (in a domain block: the block's share). Only the
      force when ``energy`` is False.
    """
    src = r if others is None else others
    cols = [jnp.concatenate([src[:, d], jnp.zeros(1, r.dtype)]) for d in range(3)]
    block = _row_block() if block == -1 else block
    n_rows = r.shape[0]
    if block is None or n_rows <= block:
        return _pair_rows(pot, space, r, idx, cols, energy)
    return _passes(pot, space, r, idx, cols, block, energy, rows)


def all_pairs(n: int) -> np.ndarray:
    """A neighbour table holding every pair: row ``i`` lists every other atom by id.

    For small systems and user force functions without a neighbour list (``integrate``'s
    pairs, gradient checks): ``pair_forces(pot, space, r, all_pairs(n))``; the cutoff still
    applies (in a periodic box, minimum image: the cutoff must stay below half the box).

    Args:
      n: number of atoms (static).

    Returns:
      int32[n, n - 1], row ``i`` = ``0 .. n-1`` without ``i``, ascending.
    """
    j = np.arange(n - 1, dtype=np.int32)[None, :]
    i = np.arange(n, dtype=np.int32)[:, None]
    return j + (j >= i)
