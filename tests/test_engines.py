"""Every engine equals ``single`` for the heat equation, on several device meshes.

Fields are compared bitwise in float64: each engine applies the same per-cell arithmetic in
the same order (the halo only moves data), so no tolerance is needed. Global sums differ in
the order of summation across devices and are compared with rtol = 1e-12.
"""

import numpy as np
import pytest

from simpar.grid import heat
from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.grid.domain import Domain
from simpar.parallel.engines import make_engine
from simpar.testing import (
    ENGINE_CASES_2D,
    ENGINE_CASES_3D,
    assert_same_field,
    run_engine,
    run_engines,
)

PER = (Periodic(), Periodic())
WALLS = (Dirichlet(0.5), Neumann())


def _heat(shape, bcs, stencil="5pt", dtype="float64", steps=7):
    dom = Domain(shape, tuple(0.1 * n for n in shape), dtype)
    model = heat.make_model(len(shape), bcs, stencil)
    r = 0.35 if stencil == "9pt" else 0.45
    params = heat.make_params(dom, 0.7, r / (0.7 * sum(1 / h**2 for h in dom.dx)))
    u0 = np.random.default_rng(3).random(shape).astype(dtype)
    return model, {"u": u0}, params


@pytest.mark.slow
@pytest.mark.parametrize(
    "bcs",
    [(PER, PER), (WALLS, PER), (WALLS, (Neumann(), Dirichlet(-1.0)))],
    ids=["periodic", "mixed", "walls"],
)
def test_heat2d_every_engine_equals_single_bitwise(bcs):
    model, state, params = _heat((48, 32), bcs)
    results = run_engines(model, state, params, 7, ENGINE_CASES_2D)
    ref = results[("single", (1,), 1)]["u"]
    for case, out in results.items():
        assert_same_field(out["u"], ref, str(case))


@pytest.mark.slow
def test_heat2d_9point_stencil_uses_corners_and_matches():
    model, state, params = _heat((32, 32), (WALLS, PER), stencil="9pt")
    cases = [
        ("pmap", (2, 4), 1),
        ("shard_map", (4, 2), 2),
        ("sharded", (2, 4), 1),
        ("pmap", (4, 2), 3),
    ]
    results = run_engines(model, state, params, 6, cases)
    ref = results[("single", (1,), 1)]["u"]
    for case, out in results.items():
        assert_same_field(out["u"], ref, str(case))


@pytest.mark.slow
@pytest.mark.parametrize("periodic", [True, False])
def test_heat3d_every_engine_equals_single_bitwise(periodic):
    bcs = (PER, PER, PER) if periodic else (WALLS, PER, (Neumann(), Dirichlet(1.0)))
    model, state, params = _heat((16, 12, 8), bcs, steps=5)
    results = run_engines(model, state, params, 5, ENGINE_CASES_3D)
    ref = results[("single", (1,), 1)]["u"]
    for case, out in results.items():
        assert_same_field(out["u"], ref, str(case))


@pytest.mark.slow
def test_float32_engines_agree():
    model, state, params = _heat((32, 32), (WALLS, PER), dtype="float32")
    ref, _ = run_engine("single", model, state, params, 9)
    for engine, mesh, halo in [("pmap", (2, 4), 3), ("shard_map", (8,), 1), ("sharded", (4, 2), 2)]:
        out, _ = run_engine(engine, model, state, params, 9, mesh, halo)
        assert out["u"].dtype == np.float32
        assert_same_field(out["u"], ref["u"], engine)


@pytest.mark.slow
def test_diagnostics_and_row_profiles_agree():
    """Sums psum'd over devices; x-averaged profiles reduced over grid columns only
    (axis_index_groups under pmap, one mesh axis under shard_map)."""
    model, state, params = _heat((48, 32), (WALLS, PER))
    _, ref = run_engine("single", model, state, params, 4)
    prof = ref["u_profile"]
    assert prof.shape == (32,)
    for engine, mesh in [
        ("pmap", (2, 4)),
        ("pmap", (4, 2)),
        ("shard_map", (2, 4)),
        ("sharded", (2, 4)),
        ("pmap", (8,)),
        ("shard_map", (1, 8)),
    ]:
        _, obs = run_engine(engine, model, state, params, 4, mesh)
        np.testing.assert_allclose(obs["u_profile"], prof, rtol=1e-12, err_msg=engine)
        np.testing.assert_allclose(obs["u_sum"], ref["u_sum"], rtol=1e-12)
        assert obs["u_max"] == ref["u_max"] and obs["u_min"] == ref["u_min"]
        assert obs["nonfinite"] == 0


def test_chunks_compile_once_and_state_stays_on_devices():
    model, state, params = _heat((32, 32), (PER, PER))
    e = make_engine("pmap", model, (32, 32), (2, 4), 2)
    st = e.place(state)
    st = e.advance(st, params, 4)
    st = e.advance(st, params, 4)
    assert list(e._advance) == [(4, False)]  # one compiled chunk program reused
    assert len(st["u"].sharding.device_set) == 8
    ref, _ = run_engine("single", model, state, params, 8)
    np.testing.assert_array_equal(e.gather(st)["u"], ref["u"])
