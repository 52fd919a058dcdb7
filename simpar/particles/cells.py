"""Cell binning for neighbour lists: particles sorted by cell, so that each column of
``2 * reach + 1`` cells along z is a contiguous range of the sorted order
(``neighbors.build`` reads its candidates from these ranges), and the compaction of the
candidates that pass the distance filter into rows (``compact_words``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simpar.particles.space import Space

# most 32-bit words of candidates per row compacted by one unrolled pass (``compact_words``;
# the cell lists' 25 or 9 columns); more (all-pairs candidates) use the (B, m, W) search
UNROLL_WORDS = 64


def stable_order(key, bound: int):
    """int32[n]: ``argsort(key, stable=True)`` of int32[n] ``key`` with values in
    ``[0, bound)`` (``bound`` static).

    When ``bound`` times the next power of two >= n fits in int32 this is one sort of the
    packed keys ``key << b | slot`` (ties keep slot order, as a stable sort): XLA:CPU sorts
    one int32 array about 6x faster than the (key, index) pairs of an argsort (23,544 keys,
    one pinned core: 0.6 against 4.2 ms). Otherwise the argsort.
    """
    n = key.shape[0]
    bits = max(n - 1, 1).bit_length()
    if bound <= 0 or bound > (2**31 - 1) >> bits:
        return jnp.argsort(key, stable=True).astype(jnp.int32)
    slot = jnp.arange(n, dtype=jnp.int32)
    return jnp.sort(jnp.left_shift(key.astype(jnp.int32), bits) | slot) & ((1 << bits) - 1)


def column_ranges(spec, space: Space, r, valid):
    """Particles binned into ``spec.cells`` and the candidate columns of the rows.

    Args:
      spec: a ``neighbors.NeighborSpec`` with ``cells`` (its ``periodic``, ``origin``,
        ``width``, ``wrap``, ``reach`` and ``rows`` fields are used).
      space: the space (its box when ``spec.periodic``).
      r: float[N, 3] positions binned (sigma); valid: bool[N] occupied slots.

    Returns:
      (order, s_a, len_a, s_b, len_b): int32[N] the slots sorted by cell (stable; empty
      slots last), and for each row (the first ``spec.rows`` particles, or all: a domain
      block's ghosts are binned but searched from by nobody) int32[R, (2 * reach + 1)**2]
      the start and length in that order of each candidate column (``_b``: the part that
      wraps around z).
    """
    nx, ny, nz = spec.cells
    ncell = nx * ny * nz
    k = spec.reach
    if spec.periodic:
        box = space.box.astype(r.dtype)
        frac = r / box
        frac = frac - jnp.floor(frac)
        c = jnp.floor(frac * jnp.asarray(spec.cells, r.dtype)).astype(jnp.int32)
    else:
        origin = jnp.asarray(spec.origin, r.dtype)
        width = jnp.asarray(spec.width, r.dtype)
        c = jnp.floor((r - origin) / width).astype(jnp.int32)
    c = jnp.clip(c, 0, jnp.asarray(spec.cells, jnp.int32) - 1)
    cell = (c[:, 0] * ny + c[:, 1]) * nz + c[:, 2]
    cell = jnp.where(valid, cell, ncell)
    order = stable_order(cell, ncell + 1)
    counts = jnp.zeros(ncell + 1, jnp.int32).at[cell].add(1)
    start = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(counts)])
    c = c[: spec.rows or c.shape[0]]
    d = np.arange(-k, k + 1)
    dx = jnp.asarray(np.repeat(d, d.size), jnp.int32)
    dy = jnp.asarray(np.tile(d, d.size), jnp.int32)
    cx = c[:, 0:1] + dx[None]
    cy = c[:, 1:2] + dy[None]
    wx, wy, wz = (True,) * 3 if spec.periodic else (spec.wrap or (False,) * 3)
    col_ok = jnp.ones(cx.shape, bool)
    if wx:
        cx = cx % nx
    else:
        col_ok = col_ok & (cx >= 0) & (cx < nx)
        cx = jnp.clip(cx, 0, nx - 1)
    if wy:
        cy = cy % ny
    else:
        col_ok = col_ok & (cy >= 0) & (cy < ny)
        cy = jnp.clip(cy, 0, ny - 1)
    base = (cx * ny + cy) * nz  # (N, ncol)
    lo = (c[:, 2] - k)[:, None]
    hi = (c[:, 2] + k)[:, None]
    s_a = start[base + jnp.maximum(lo, 0)]
    e_a = start[base + jnp.minimum(hi, nz - 1) + 1]
    len_a = jnp.where(col_ok, e_a - s_a, 0)
    if wz:
        below, above = lo < 0, hi > nz - 1
        b_lo = jnp.where(below, nz + lo, 0)
        b_hi = jnp.where(below, nz - 1, hi - nz)
        s_b = start[base + b_lo]
        e_b = start[base + jnp.clip(b_hi, 0, nz - 1) + 1]
        len_b = jnp.where((below | above) & col_ok, e_b - s_b, 0)
    else:
        s_b = jnp.zeros_like(s_a)
        len_b = jnp.zeros_like(len_a)
    return order, s_a, len_a, s_b, len_b


def compact_words(mask, m, picks=()):
    """Positions of the first ``m`` True entries of each row of ``mask``.

    ``mask`` is bool[B, W, S] with S <= 32: each (row, w) group is packed into a 32-bit
    word, so the k-th True entry is found with popcounts (a binary search inside the word)
    instead of a scatter or a sort, which are slow on CPU.

    Args:
      mask: bool[B, W, S].
      m: outputs per row.
      picks: int32[B, W] arrays (only with W <= ``UNROLL_WORDS``): each is read at the
        word of every output, without a gather.

    Returns:
      (src, count, picked): int32[B, m] flat positions ``w * S + s`` (``W * S`` where a row
      has fewer than ``m`` entries), int32[B] the number of True entries per row, and
      int32[B, m] per pick its value at the output's word (0 past the row's entries).
    """
    b, w, s = mask.shape
    one = jnp.uint32(1)
    bit = jnp.left_shift(one, jnp.arange(s, dtype=jnp.uint32))
    word = jnp.sum(jnp.where(mask, bit, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)
    cnt = jax.lax.population_count(word).astype(jnp.int32)  # (B, W)
    t = jnp.arange(m, dtype=jnp.int32)
    if w <= UNROLL_WORDS:
        # one pass over the words, elementwise over (B, m): output t lies in word k when
        # cum[k-1] <= t < cum[k]; no (B, m, W) temporary and no gathers (in.lj float64, one
        # core: the whole build 0.68x)
        grp = jnp.full((b, m), w, jnp.int32)
        first = jnp.zeros((b, m), jnp.int32)
        wd = jnp.zeros((b, m), jnp.uint32)
        picked = [jnp.zeros((b, m), jnp.int32) for _ in picks]
        run = jnp.zeros((b, 1), jnp.int32)
        for k in range(w):
            nxt = run + cnt[:, k : k + 1]
            here = (run <= t) & (t < nxt)
            grp = jnp.where(here, k, grp)
            first = jnp.where(here, run, first)
            wd = jnp.where(here, word[:, k : k + 1], wd)
            picked = [jnp.where(here, p[:, k : k + 1], q)
                      for p, q in zip(picks, picked, strict=True)]  # fmt: skip
            run = nxt
        rank, total = t[None] - first, run[:, 0]
    else:
        if picks:
            raise ValueError(f"picks need at most {UNROLL_WORDS} words, got {w}")
        cum = jnp.cumsum(cnt, axis=1)
        grp = jnp.sum(cum[:, None, :] <= t[None, :, None], axis=-1, dtype=jnp.int32)
        grp_c = jnp.minimum(grp, w - 1)
        rank = t[None] - jnp.take_along_axis(cum - cnt, grp_c, axis=1)
        wd = jnp.take_along_axis(word, grp_c, axis=1)
        total, picked = cum[:, -1], []
    pos = jnp.zeros_like(rank)
    step = 1 << (max(s - 1, 1).bit_length() - 1)
    while step >= 1:
        trial = pos + step
        low = wd & (jnp.left_shift(one, jnp.minimum(trial, 31).astype(jnp.uint32)) - one)
        low = jnp.where(trial >= 32, wd, low)
        pos = jnp.where(jax.lax.population_count(low).astype(jnp.int32) <= rank, trial, pos)
        step //= 2
    src = jnp.where(grp < w, grp * s + pos, w * s)
    return src, total, picked


def _cmp(lo, hi):
    """The compare-exchange of two equal slabs: (elementwise min, elementwise max)."""
    return jnp.minimum(lo, hi), jnp.maximum(lo, hi)


def _clean(y, length: int):
    """Half-cleaners of a bitonic network over ``length`` (a power of two) entries along
    axis 0, of which ``y`` holds the first ``y.shape[0]``: the others are +infinity, so the
    comparisons with them (no-ops) are skipped. Returns the ``y.shape[0]`` entries sorted."""
    n = y.shape[0]
    if length == 1 or n == 0:
        return y
    h = length // 2
    if n <= h:  # every partner is infinite
        return _clean(y, h)
    if n == length:  # all real: the passes as reshapes of the whole slab
        j = h
        while j >= 1:
            z = y.reshape((length // (2 * j), 2, j) + y.shape[1:])
            lo, hi = _cmp(z[:, 0], z[:, 1])
            y = jnp.stack([lo, hi], axis=1).reshape(y.shape)
            j //= 2
        return y
    r = n - h
    lo, hi = _cmp(y[:r], y[h:])
    return jnp.concatenate([_clean(jnp.concatenate([lo, y[r:h]]), h), _clean(hi, h)])


def _sort(y):
    """``y`` sorted along axis 0 by a bitonic network, padded implicitly with +infinity to
    the next power of two (the comparisons with the padding skipped)."""
    n = y.shape[0]
    if n <= 1:
        return y
    length = 1 << (n - 1).bit_length()
    h = length // 2
    if n == length:  # merge sorted runs of k // 2 into runs of k (first step: t against
        k = 2  # k - 1 - t, so every run comes out ascending), as reshapes of the whole slab
        while k <= n:
            z = y.reshape((n // k, k) + y.shape[1:])
            lo, hi = _cmp(z[:, : k // 2], z[:, k // 2 :][:, ::-1])
            y = jnp.concatenate([lo, hi[:, ::-1]], axis=1).reshape(y.shape)
            y = _clean_runs(y, k)
            k *= 2
        return y
    a, b = _sort(y[:h]), _sort(y[h:])
    r = n - h  # a[t] against b[h - 1 - t]: the b's past its end are infinite
    lo, hi = _cmp(a[h - r :], b[::-1])
    return jnp.concatenate([_clean(jnp.concatenate([a[: h - r], lo]), h), _clean(hi[::-1], h)])


def _clean_runs(y, k: int):
    """The half-cleaners (strides k / 4 .. 1) of every run of ``k`` entries of ``y``."""
    j = k // 4
    while j >= 1:
        z = y.reshape((y.shape[0] // (2 * j), 2, j) + y.shape[1:])
        lo, hi = _cmp(z[:, 0], z[:, 1])
        y = jnp.stack([lo, hi], axis=1).reshape(y.shape)
        j //= 2
    return y


def sort_rows(x, bound: int | None = None):
    """``jnp.sort(x, axis=1)`` of int32[B, M] ``x`` by a bitonic sorting network.

    The network runs on the transpose (M, B), so that every compare-exchange is an
    elementwise min / max of two contiguous (.., B) slabs: XLA:CPU vectorises it across
    the rows, where its sort compares one row's elements one after another (in.lj, float64,
    one pinned core: the rows' sort 32 -> 9 ms of the build). M need not be a power of two:
    the network is padded implicitly with +infinity and the comparisons with the padding
    are skipped (a padding materialised in the (B, M) producer's fusion kept XLA from
    vectorising the compaction feeding it: the build took 1.2x longer than with
    ``jnp.sort``). With ``bound`` (static) < 2**16, entries in ``[0, bound]``, the network
    runs on uint16 (twice the lanes per vector). Exact for integers.
    """
    narrow = bound is not None and 0 <= bound < 2**16
    y = x.astype(jnp.uint16) if narrow else x
    return _sort(y.T).T.astype(x.dtype)


def split_words(n: int) -> tuple[int, int]:
    """(words, slots per word) covering ``n`` slots with at most 32 per word."""
    w = max(-(-n // 32), 1)
    return w, max(-(-n // w), 1)
