"""Cell binning for neighbour lists: particles sorted by cell, with periodic images along z
(``bin_cells``), so that each column of ``2 * reach + 1`` cells along z is one contiguous
range of the sorted order (``row_columns``; ``neighbors.build`` reads its candidates from
these ranges), the compaction of the candidates that pass the distance filter into rows
(``compact_words``) and the rows' sort (``sort_rows``).
"""

from __future__ import annotations

import math

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


def bin_cells(spec, space: Space, r, valid):
    """Particles binned into ``spec.cells``, sorted by cell, with the periodic images that
    make every candidate column one contiguous range (``row_columns``).

    The grid is padded along z with ``spec.reach`` cells on each side; where z wraps
    (periodic, or ``spec.wrap[2]``) the padding holds copies of the cells at the other end,
    so a column that crosses the box edge along z reads one range instead of two (main
    split each such column in two ranges and picked between them per candidate).

    Args:
      spec: a ``neighbors.NeighborSpec`` with ``cells`` (its ``periodic``, ``origin``,
        ``width``, ``wrap``, ``reach`` and ``rows`` fields are used).
      space: the space (its box when ``spec.periodic``).
      r: float[N, 3] positions binned (sigma); valid: bool[N] occupied slots.

    Returns:
      (order, start, c): int32[K] the copies sorted by cell (stable; copy ``q`` is slot
      ``q % N``, the slot itself for ``q < N``; K = 3N where z wraps, else N; empty slots and
      unused copies last), int32[cells + 1] the start of each padded cell in that order,
      int32[R, 3] the cells of the rows (the first ``spec.rows`` particles, or all).
    """
    nx, ny, nz = spec.cells
    k = spec.reach
    nze = nz + 2 * k
    ncell = nx * ny * nze
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
    cell = (c[:, 0] * ny + c[:, 1]) * nze + c[:, 2] + k
    keys = [jnp.where(valid, cell, ncell)]
    if spec.periodic or (spec.wrap and spec.wrap[2]):  # z images: the top cells below, ...
        keys.append(jnp.where(valid & (c[:, 2] < k), cell + nz, ncell))
        keys.append(jnp.where(valid & (c[:, 2] >= nz - k), cell - nz, ncell))
    key = jnp.concatenate(keys)
    order = stable_order(key, ncell + 1)
    counts = jnp.zeros(ncell + 1, jnp.int32).at[key].add(1)
    start = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(counts)])
    return order, start, c[: spec.rows or c.shape[0]]


def row_columns(spec, start, c):
    """Start and length in ``bin_cells``'s order of the candidate columns of rows in cells
    ``c`` (int32[B, 3]): int32[B, (2 * reach + 1)**2] each (length 0 for a column outside
    a grid axis that does not wrap). Computed per block of rows while building, so that no
    (N, columns) arrays are kept (in.lj: the build's temporaries 19.3 -> 2.1 MiB)."""
    nx, ny, nz = spec.cells
    k = spec.reach
    nze = nz + 2 * k
    d = np.arange(-k, k + 1)
    cx = c[:, 0:1] + jnp.asarray(np.repeat(d, d.size), jnp.int32)[None]
    cy = c[:, 1:2] + jnp.asarray(np.tile(d, d.size), jnp.int32)[None]
    wx, wy, _ = (True,) * 3 if spec.periodic else (spec.wrap or (False,) * 3)
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
    lo = (cx * ny + cy) * nze + c[:, 2:3]  # padded cells cz - k + k .. cz + k + k
    s = start[lo]
    return s, jnp.where(col_ok, start[lo + 2 * k + 1] - s, 0)


def column_slices(a, starts, size: int):
    """``a[starts[..., None] + arange(size)]`` as one gather of contiguous slices.

    XLA:CPU gathers element by element; a gather of (B, C) slices of ``size`` entries
    copies each slice as one contiguous run (in.lj: the build's candidate positions).
    Args:
      a: [K + size] array (padded by the caller, once: XLA would clamp a slice running
        past the end); starts: int32[B, C] in ``[0, K]``; size: static slice length.

    Returns:
      [B, C, size] array.
    """
    dn = jax.lax.GatherDimensionNumbers(
        offset_dims=(2,), collapsed_slice_dims=(), start_index_map=(0,)
    )
    return jax.lax.gather(a, starts[..., None], dn, (size,),
                          mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)  # fmt: skip


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
        grp, first, wd, picked, total = _locate_words(t, cnt, word, picks)
        rank = t[None] - first
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


def _locate_words(t, cnt, word, picks):
    """For each output t (int32[m]) of each row, the word holding it: (grp, first, wd,
    picked, total) with grp int32[B, m] its index (W past the row's entries), first the
    outputs before that word, wd its bits, picked each pick's value there and total int32[B]
    the row's entries. Two levels, elementwise over (B, m): the group of about sqrt(W)
    words holding t, whose words' counts, bits and picks are selected once per group, then
    the word within the group (in.lj, 25 words: 0.7x the selects of one level)."""
    b, w = cnt.shape
    m = t.shape[0]
    g = max(int(math.isqrt(w)), 1)
    ngrp = -(-w // g)
    pad = ngrp * g - w
    cnt = jnp.concatenate([cnt, jnp.zeros((b, pad), cnt.dtype)], axis=1)
    word = jnp.concatenate([word, jnp.zeros((b, pad), word.dtype)], axis=1)
    picks = [jnp.concatenate([p, jnp.zeros((b, pad), p.dtype)], axis=1) for p in picks]
    cols = [cnt, word, *picks]
    sel = [[jnp.zeros((b, m), c.dtype) for _ in range(g)] for c in cols]
    base = jnp.zeros((b, m), jnp.int32)
    gsel = jnp.full((b, m), ngrp, jnp.int32)
    run = jnp.zeros((b, 1), jnp.int32)
    for q in range(ngrp):  # level 1: the group holding t
        nxt = run + jnp.sum(cnt[:, q * g : (q + 1) * g], axis=1, keepdims=True, dtype=jnp.int32)
        here = (run <= t) & (t < nxt)
        for c, out in zip(cols, sel, strict=True):
            for j in range(g):
                out[j] = jnp.where(here, c[:, q * g + j : q * g + j + 1], out[j])
        base = jnp.where(here, run, base)
        gsel = jnp.where(here, q, gsel)
        run = nxt
    grp = jnp.full((b, m), w, jnp.int32)
    first = jnp.zeros((b, m), jnp.int32)
    wd = jnp.zeros((b, m), word.dtype)
    picked = [jnp.zeros((b, m), jnp.int32) for _ in picks]
    at = base
    for j in range(g):  # level 2: the word within the group
        nxt = at + sel[0][j]
        here = (at <= t) & (t < nxt)
        grp = jnp.where(here, gsel * g + j, grp)
        first = jnp.where(here, at, first)
        wd = jnp.where(here, sel[1][j], wd)
        picked = [jnp.where(here, s_[j], q) for s_, q in zip(sel[2:], picked, strict=True)]
        at = nxt
    return grp, first, wd, picked, run[:, 0]


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
    one pinned core: the rows' sort 32 -> 8 ms of the build). M need not be a power of two:
    the network is padded implicitly with +infinity and the comparisons with the padding
    are skipped. With ``bound`` (static) < 2**16, entries in ``[0, bound]``, the network
    runs on uint16 (twice the lanes per vector). Exact for integers.

    ``x`` should be a materialised buffer (``neighbors.build`` passes a loop carry): XLA
    fuses an elementwise producer into the network's first passes, where each element is
    recomputed by every pass that reads it (the compaction: the build 2.9x slower).
    """
    narrow = bound is not None and 0 <= bound < 2**16
    y = x.astype(jnp.uint16) if narrow else x
    return _sort(y.T).T.astype(x.dtype)


def split_words(n: int) -> tuple[int, int]:
    """(words, slots per word) covering ``n`` slots with at most 32 per word."""
    w = max(-(-n // 32), 1)
    return w, max(-(-n // w), 1)


def host_needs(spec, space: Space, r: np.ndarray, valid: np.ndarray, entries: int = 1 << 16):
    """What ``neighbors.build`` reports in ``needed`` for ``spec``, computed on the host with
    NumPy: (most neighbours within ``spec.radius`` of a valid row, longest candidate column
    of a valid row; 0 without cells). It lets ``neighbors.size_list`` size a list without
    compiling and running a sizing build. The same formulas in the positions' dtype; a pair
    at the radius to the last rounding may count differently, which only changes the
    head-room (a too small list is reported and regrown, never dropped).

    Args:
      spec: a ``neighbors.NeighborSpec`` without ``rows``, ``wrap`` or ``images``.
      space: the space; r: float[N, 3] positions (sigma); valid: bool[N] occupied slots.
      entries: candidates per pass (bounds the temporaries: 0.5 MiB per float64 array).

    Returns:
      (int, int).
    """
    r, valid = np.asarray(r), np.asarray(valid, bool)
    n, dt = r.shape[0], r.dtype
    box = np.asarray(space.box).astype(dt)
    rows = np.flatnonzero(valid)
    if spec.cells is None:  # all pairs: every valid particle a candidate of every row
        rs, own = r[rows], np.searchsorted(rows, np.arange(n))

        def columns(i):
            return np.zeros((i.size, 1), np.int64), np.full((i.size, 1), rows.size)

        block = max(entries // max(rows.size, 1), 1)
    else:
        nx, ny, nz = spec.cells
        k = spec.reach
        nze = nz + 2 * k
        ncell = nx * ny * nze
        if spec.periodic:
            frac = r / box
            c = np.floor((frac - np.floor(frac)) * np.asarray(spec.cells, dt)).astype(np.int64)
        else:
            c = np.floor((r - np.asarray(spec.origin, dt)) / np.asarray(spec.width, dt))
            c = c.astype(np.int64)
        c = np.clip(c, 0, np.asarray(spec.cells) - 1)
        cell = (c[:, 0] * ny + c[:, 1]) * nze + c[:, 2] + k
        keys = [np.where(valid, cell, ncell)]
        if spec.periodic:  # the z images of ``bin_cells``
            keys += [np.where(valid & (c[:, 2] < k), cell + nz, ncell),
                     np.where(valid & (c[:, 2] >= nz - k), cell - nz, ncell)]  # fmt: skip
        key = np.concatenate(keys)
        order = np.argsort(key, kind="stable")
        own = np.empty(order.size, np.int64)
        own[order] = np.arange(order.size)  # each copy's place in the sorted order
        start = np.concatenate([[0], np.cumsum(np.bincount(key, minlength=ncell + 1))])
        rs = r[order % n]
        d = np.arange(-k, k + 1)
        ox, oy = np.repeat(d, d.size)[None], np.tile(d, d.size)[None]

        def columns(i):  # ``row_columns``: start and length of the rows' candidate columns
            cx, cy = c[i, :1] + ox, c[i, 1:2] + oy
            ok = True if spec.periodic else (cx >= 0) & (cx < nx) & (cy >= 0) & (cy < ny)
            lo = ((cx % nx) * ny + cy % ny) * nze + c[i, 2:3]
            return start[lo], np.where(ok, start[lo + 2 * k + 1] - start[lo], 0)

        most_in_cell = max(int(np.diff(start)[:ncell].max(initial=1)), 1)  # not the sentinel
        block = max(entries // (d.size**3 * most_in_cell), 1)
    most = col = 0
    rad2 = dt.type(spec.radius**2)
    for b in range(0, rows.size, block):
        i = rows[b : b + block]
        s0, ln = columns(i)
        col = max(col, int(ln.max(initial=0)))
        span = np.arange(int(ln.max(initial=0)))
        q = s0[..., None] + span  # (B, columns, entries) places in the sorted order
        ok = (span < ln[..., None]) & (q != own[i][:, None, None])
        q = np.where(ok, q, 0)
        r2 = np.zeros(q.shape, dt)
        for ax in range(3):  # ``neighbors.build``'s minimum image, one axis at a time
            dx = r[i, ax][:, None, None] - rs[q, ax]
            if space.periodic:
                dx = dx - box[ax] * np.round(dx * (dt.type(1.0) / box[ax]))
            r2 = r2 + dx * dx
        most = max(most, int(np.max(np.sum(ok & (r2 < rad2), axis=(1, 2)), initial=0)))
    return most, (0 if spec.cells is None else col)
