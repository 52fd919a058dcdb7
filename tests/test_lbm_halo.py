"""LBM exchanges only what crosses (issue 29 item 6), read from the compiled HLO (compile only).

At halo width 1 population ``i`` reads only the faces it streams in from (``x - c_i``): each
face sends the populations with ``c_i`` pointing out of it (D2Q9: 3 of 9, D3Q19: 5 of 19),
as XLB's ``distribute``. Per device and step the collective-permutes then move exactly those
slabs (an axis's slab includes the halo of the axes exchanged before it, for the corners);
wider halos keep the full exchange. The fields equal ``single`` bitwise: ``test_lbm.py``
(every engine, walls on split axes, halo 1, 2 and 3).
"""

from __future__ import annotations

import math

import pytest

from simpar.grid import lbm, lbm_config
from simpar.parallel.engines import make_engine
from simpar.parallel.hlo import collectives

PER = ("periodic", "periodic")


def _permuted_bytes(engine, shape, mesh, w, walls):
    s = lbm_config.lattice_setup(shape, walls=walls, viscosity=0.05, dtype="float32")
    e = make_engine(engine, s.model, shape, mesh, w)
    text = e.lowered_advance(e.place(s.state), s.params, w).compile().as_text()
    found = collectives(text)
    assert {c.op for c in found} <= {"collective-permute", "all-reduce"}
    return sum(c.nbytes for c in found if c.op == "collective-permute"), s


def _crossing_bytes(shape, mesh, lattice_c, w=1, itemsize=4, populations=True):
    """Bytes one device receives per exchange: per split axis ``a`` and side, the slabs of the
    populations that stream across it (``w`` cells thick, padded on the axes before ``a``);
    ``populations=False``: every population on both sides (the full exchange)."""
    grid = tuple(mesh) + (1,) * (len(shape) - len(mesh))
    block = [n // m for n, m in zip(shape, grid, strict=True)]
    total = 0
    for a, m in enumerate(grid):
        if m == 1:
            continue
        slab = w * math.prod(b + 2 * w if j < a else b for j, b in enumerate(block) if j != a)
        sides = sum((c[a] > 0) + (c[a] < 0) for c in lattice_c) if populations else (
            2 * len(lattice_c))  # fmt: skip
        total += sides * slab
    return total * itemsize


@pytest.mark.parametrize(
    "shape,mesh",
    [
        pytest.param((32, 16), (8,), id="d2q9-8"),
        pytest.param((32, 16), (2, 4), id="d2q9-2x4"),
        pytest.param((8, 8, 8), (8, 1, 1), id="d3q19-8x1x1"),
        pytest.param((8, 8, 8), (2, 2, 2), id="d3q19-2x2x2", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("engine", ["shard_map", "sharded"])
def test_halo_1_sends_only_the_crossing_populations(engine, shape, mesh):
    walls = (PER,) * len(shape)
    got, s = _permuted_bytes(engine, shape, mesh, 1, walls)
    lattice_c = [tuple(c[: len(shape)]) for c in (lbm.D2Q9 if len(shape) == 2
                                                  else lbm.D3Q19).c]  # fmt: skip
    want = _crossing_bytes(shape, mesh, lattice_c)
    assert got == want, (got, want)
    if mesh == (8,):  # D2Q9 on (8,): 3 populations of 9 per face, 2 x 3 slabs of 16 cells
        assert got == 2 * 3 * 16 * 4
    if mesh == (8, 1, 1):  # D3Q19: 5 of 19 per face, 2 x 5 slabs of 8 x 8 cells
        assert got == 2 * 5 * 64 * 4


@pytest.mark.slow
def test_wider_halo_and_wall_flags_keep_the_full_exchange():
    """Halo 2 (two updates per exchange) sends every population both ways; a walled split
    axis also sends its uint8 wall flags in full, and the populations only where they cross."""
    shape, mesh = (32, 16), (8,)
    c2 = [tuple(c) for c in lbm.D2Q9.c]
    got, _ = _permuted_bytes("shard_map", shape, mesh, 2, (PER, PER))
    assert got <= _crossing_bytes(shape, mesh, c2, w=2, populations=False)
    assert got > 2 * _crossing_bytes(shape, mesh, c2, w=2)  # more than the crossing ones
    walled, _ = _permuted_bytes("shard_map", shape, mesh, 1, (("wall", "wall"), PER))
    assert walled == _crossing_bytes(shape, mesh, c2) + 2 * 16  # + both uint8 flag slabs
