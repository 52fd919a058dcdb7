"""The neighbour list against a brute-force list, array for array: every layout the build
compacts differently (issue 29 item 1: the unrolled, gather-free compaction of 25 or 9
column words, two words per column, the all-pairs search past 64 words) and the id order
of the rows (``ids``, as the decomposed engines pass them)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.particles import cells, neighbors, space

N, BOX, CUT, SKIN = 1500, np.array([9.0, 7.5, 12.0]), 1.2, 0.3


def _brute(r, valid, box, ids=None):
    """int32[N, M] rows of every valid j != i within cutoff + skin (minimum image; plain
    differences when ``box`` is None), sorted by id (slot by default), padded with N; M the
    longest row."""
    n = r.shape[0]
    d = r[:, None, :] - r[None, :, :]
    if box is not None:
        d -= box * np.round(d / box)
    near = (np.sum(d * d, -1) < (CUT + SKIN) ** 2) & valid[None, :] & valid[:, None]
    np.fill_diagonal(near, False)
    key = np.arange(n) if ids is None else ids
    rows = [sorted(np.nonzero(row)[0], key=lambda j: key[j]) for row in near]
    m = max(len(x) for x in rows)
    out = np.full((n, m), n, np.int32)
    for i, x in enumerate(rows):
        out[i, : len(x)] = x
    return out


@pytest.fixture(scope="module")
def system():
    r = np.asarray(jax.random.uniform(jax.random.PRNGKey(3), (N, 3), jnp.float64)) * BOX
    valid = np.arange(N) < N - 10  # the last slots are empty
    return r, valid, space.periodic(BOX), _brute(r, valid, BOX)


# one jitted build for the module: the tests below build the same layouts (the sized ones and
# their reach-1 twins), each compiled once (issue 29 item 7: compilation is the tests' cost)
_build = jax.jit(neighbors.build, static_argnums=0, static_argnames="id_bound")


def _periodic_specs(r, valid):
    """The sized layout (``size_list``: reach 2, 25 column words) and reach 1 with columns of
    40 entries (9 columns of two words each)."""
    spec = neighbors.size_list(space.periodic(BOX), r, valid, cutoff=CUT, skin=SKIN)
    cells = tuple(int(c) for c in np.floor(BOX / (CUT + SKIN)))
    return spec, dataclasses.replace(spec, cells=cells, reach=1, column_capacity=40, block=128)


def _free_specs(r, valid):
    """Free space: the sized layout (reach 2) and reach 1 on cells twice as wide."""
    spec = neighbors.size_list(space.free(BOX), r, valid, cutoff=CUT, skin=SKIN)
    one = dataclasses.replace(spec, reach=1, cells=tuple(max(c // 2, 1) for c in spec.cells),
                              width=tuple(2 * w for w in spec.width),
                              column_capacity=4 * spec.column_capacity)  # fmt: skip
    return spec, one


def _check(spec, spc, r, valid, ref, **kw):
    nb = _build(spec, spc, jnp.asarray(r), valid, **kw)
    assert int(nb.error) == 0
    idx = np.asarray(nb.idx)
    m = ref.shape[1]
    assert int(nb.needed[0]) == m
    np.testing.assert_array_equal(idx[:, :m], ref)
    assert np.all(idx[:, m:] == N)


def test_cell_lists_equal_brute_force(system):
    """The sized layout (reach 2: 25 column words) and reach 1 with columns of 40 entries
    (9 columns of two words each) give the brute-force list exactly."""
    r, valid, spc, ref = system
    spec, one = _periodic_specs(r, valid)
    assert spec.reach == 2 and spec.cells == tuple(int(c) for c in np.floor(BOX * 2 / (CUT + SKIN)))
    _check(spec, spc, r, valid, ref)
    _check(one, spc, r, valid, ref)


def test_free_space_cell_lists_equal_brute_force(system):
    """Free space (no z images: the grid's padding cells stay empty, columns past the x / y
    edges are empty) gives the brute-force list exactly, reach 2 and reach 1."""
    r, valid, _, _ = system
    spc = space.free(BOX)
    ref = _brute(r, valid, None)
    spec, one = _free_specs(r, valid)
    assert spec.cells is not None and not spec.periodic
    _check(spec, spc, r, valid, ref)
    _check(one, spc, r, valid, ref)


def test_host_sizing_equals_the_builds_needs(system):
    """``cells.host_needs`` (NumPy, what ``neighbors.size_list`` sizes with) reports the
    device build's ``needed`` exactly: periodic reach 2 and 1, free space reach 2 and 1, all
    pairs, float32; ``size_list`` puts 1.2x head-room on them (rows rounded to 8, columns to
    4). The cell layouts are the two tests' above (one compiled build each in this module)."""
    r, valid, spc, ref = system
    spec, one = _periodic_specs(r, valid)
    assert spec.max_neighbors == -(-int(np.ceil(ref.shape[1] * 1.2)) // 8) * 8
    free = space.free(BOX)
    r32, spc32 = r.astype(np.float32), space.periodic(BOX, np.float32)
    cases = [(spec, spc, r), (one, spc, r), *((sp, free, r) for sp in _free_specs(r, valid)),
             (neighbors.size_list(spc, r, valid, cutoff=CUT, skin=SKIN, all_pairs=True), spc, r),
             (neighbors.size_list(spc32, r32, valid, cutoff=CUT, skin=SKIN), spc32, r32)]  # fmt: skip
    for sp, sc, x in cases:
        nb = _build(sp, sc, jnp.asarray(x), valid)
        assert int(nb.error) == 0
        assert cells.host_needs(sp, sc, x, valid) == tuple(int(v) for v in nb.needed)
    assert cells.host_needs(spec, spc, r, valid)[0] == ref.shape[1]


@pytest.mark.slow
def test_all_pairs_past_the_unrolled_words_and_id_order(system):
    """All pairs as candidates (1,500 slots: 47 words, unrolled) and 2,100 slots (66 words:
    the (B, m, W) search), and rows in the order of shuffled ids."""
    r, valid, spc, ref = system
    spec, _ = neighbors.allocate(spc, r, valid, cutoff=CUT, skin=SKIN, all_pairs=True)
    _check(spec, spc, r, valid, ref)
    ids = np.random.default_rng(0).permutation(N).astype(np.int32)
    cell_spec, _ = neighbors.allocate(spc, r, valid, cutoff=CUT, skin=SKIN)
    _check(cell_spec, spc, r, valid, _brute(r, valid, BOX, ids), ids=jnp.asarray(ids),
           id_bound=N)  # fmt: skip
    n2 = 2100
    r2 = np.concatenate([r, np.asarray(jax.random.uniform(jax.random.PRNGKey(4), (n2 - N, 3),
                                                          jnp.float64)) * BOX])  # fmt: skip
    v2 = np.ones(n2, bool)
    ref2 = _brute(r2, v2, BOX)
    spec2, _ = neighbors.allocate(spc, r2, v2, cutoff=CUT, skin=SKIN, all_pairs=True)
    assert cells.split_words(n2)[0] > cells.UNROLL_WORDS
    nb = jax.jit(neighbors.build, static_argnums=0)(spec2, spc, jnp.asarray(r2), v2)
    np.testing.assert_array_equal(np.asarray(nb.idx)[:, : ref2.shape[1]], ref2)


_SORT = jax.jit(cells.sort_rows, static_argnums=1)


def _sort_random_rows(widths):
    rng = np.random.default_rng(0)
    for m, bound in widths:
        x = rng.integers(0, (bound or 2**31 - 2) + 1, (37, m)).astype(np.int32)
        out = _SORT(x, bound)
        assert out.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(out), np.sort(x, 1))


def test_sort_rows_network_sorts_every_row():
    """The bitonic network of the rows' sort (``cells.sort_rows``): every 0/1 row of up to
    12 entries (the 0-1 principle: a comparator network that sorts them sorts everything),
    and random rows through each path: uint16 (``bound`` < 2**16) and int32 (a bound past it,
    none), widths padded to a power of two and one that is one. The networks' compilation
    grows with the width: the widths the lists use are the slow twin's (below); the builds
    above sort their rows with it too, checked against the brute-force lists."""
    import itertools

    for m in range(1, 13):
        x = np.array(list(itertools.product([0, 1], repeat=m)), np.int32)
        np.testing.assert_array_equal(np.asarray(_SORT(x, None)), np.sort(x, 1))
    _sort_random_rows(((24, 32000), (20, 70000), (33, 5), (16, None)))


@pytest.mark.slow
def test_sort_rows_network_sorts_rows_of_the_lists_widths():
    """Random rows of the widths the lists use, int32 and the uint16 path (``bound``)."""
    _sort_random_rows(((96, 32000), (104, 70000), (33, 5), (128, None)))
