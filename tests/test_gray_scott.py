"""The Gray-Scott model: equal to a plain NumPy implementation, engines, presets, stability.

Reference and tolerance (float64): 400 forward-Euler steps of Pearson's scheme written with
``np.roll`` (same operations, same order) agree with the model bitwise without FMA and to
1e-12 absolute with it, on fields of order 1 (seen: ~3e-15: XLA:CPU contracts ``a * b + c``
into one FMA, NumPy does not). Every engine equals ``single``: bitwise without FMA, to 1e-14
with it (see ``assert_same_field``); ``test_engines_bitwise_without_fma`` checks the bitwise
claim in a subprocess with ``XLA_FLAGS=--xla_cpu_max_isa=AVX`` (AVX has no FMA).
"""

import tomllib
from pathlib import Path

import numpy as np
import pytest

from simpar.config import Section, apply_overrides
from simpar.errors import ConfigError
from simpar.grid import gray_scott
from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.grid.domain import Domain
from simpar.parallel.engines import make_engine
from simpar.testing import FMA_OFF, assert_same_field, run_engine

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "gray_scott.toml"
# a subset of simpar.testing.ENGINE_CASES_2D: every engine, 1-D and 2-D meshes of both
# orientations, halo widths 1-3 (the suite runs on 2 CI cores)
CASES_2D = (
    ("pmap", (8,), 1),
    ("pmap", (2, 4), 2),
    ("shard_map", (2, 4), 1),
    ("shard_map", (1, 8), 3),
    ("sharded", (2, 4), 1),
    ("sharded", (4, 2), 1),
)


H = 2.5 / 256  # Pearson's cell size


def _config(shape=(32, 48), physics=None, dt=1.0, initial=None, boundary=None):
    return Section(
        {
            "model": {"name": "gray_scott"},
            "grid": {"shape": list(shape), "length": [n * H for n in shape], "dtype": "float64"},
            "boundary": boundary or {"x": "periodic", "y": "periodic"},
            "physics": physics if physics is not None else {"preset": "mitosis"},
            "initial": initial or {"seed": 3, "size": [0.1, 0.1]},
            "time": {"dt": dt},
        }
    )


def numpy_gray_scott(u, v, Du, Dv, F, k, dt, dx, steps):
    """Forward Euler + 5-point Laplacian with ``np.roll`` (periodic), float64."""
    inv_dx2 = [1 / (h * h) for h in dx]

    def lap(a):
        out = None
        for ax, inv in enumerate(inv_dx2):
            term = (np.roll(a, -1, ax) + np.roll(a, 1, ax) - 2 * a) * inv
            out = term if out is None else out + term
        return out

    for _ in range(steps):
        lu, lv = lap(u), lap(v)
        uvv = u * v * v
        u, v = (
            u + dt * (Du * lu - uvv + F * (1 - u)),
            v + dt * (Dv * lv + uvv - (F + k) * v),
        )
    return u, v


@pytest.mark.parametrize("preset", ["mitosis", "coral"])
def test_run_equals_numpy_implementation(preset):
    setup = gray_scott.from_config(_config(physics={"preset": preset}))
    steps = 400
    out, _ = run_engine("single", setup.model, setup.state, setup.params, steps)
    F, k = gray_scott.PRESETS[preset]
    u, v = numpy_gray_scott(
        setup.state["u"], setup.state["v"], 2e-5, 1e-5, F, k, 1.0, setup.domain.dx, steps
    )
    tol = 0.0 if FMA_OFF else 1e-12
    assert np.max(np.abs(out["u"] - u)) <= tol
    assert np.max(np.abs(out["v"] - v)) <= tol
    # the reaction really ran: the central square has changed a lot
    assert np.max(np.abs(v - setup.state["v"])) > 0.05


def test_every_engine_equals_single():
    d = Domain((32, 48), (32 * H, 48 * H), "float64")
    bcs = ((Periodic(), Periodic()), (Neumann(), Dirichlet(0.5)))
    model = gray_scott.make_model(2, bcs)
    state = gray_scott.initial_state(d, [0.15, 0.2], noise=0.05, seed=7)
    params = gray_scott.make_params(d, 2e-5, 1e-5, 0.0367, 0.0649, 1.0)
    n = 12

    def final(engine, mesh, halo):
        eng = make_engine(engine, model, d.shape, mesh, halo)
        return eng.gather(eng.advance(eng.place(state), params, n))

    ref = final("single", None, 1)
    assert np.max(np.abs(ref["v"] - state["v"])) > 1e-3
    for engine, mesh, halo in CASES_2D:
        got = final(engine, mesh, halo)
        for f in ref:
            assert_same_field(got[f], ref[f], f"{engine} {mesh} halo {halo}: {f}")


def test_initial_state_is_pearsons():
    d = Domain((64, 64), (64 * H, 64 * H), "float64")
    st = gray_scott.initial_state(d, [20 * H, 20 * H], noise=0.01, seed=1)
    inside = st["v"] > 0
    assert inside.sum() == 20 * 20
    np.testing.assert_allclose(st["u"][inside], 0.5, rtol=0.0100001)
    np.testing.assert_allclose(st["v"][inside], 0.25, rtol=0.0100001)
    np.testing.assert_allclose(st["u"][~inside], 1.0, rtol=0.0100001)
    # seeded: the same seed gives the same state, another seed another one
    again = gray_scott.initial_state(d, [20 * H, 20 * H], noise=0.01, seed=1)
    other = gray_scott.initial_state(d, [20 * H, 20 * H], noise=0.01, seed=2)
    np.testing.assert_array_equal(st["u"], again["u"])
    assert not np.array_equal(st["u"], other["u"])


def test_presets_and_overrides():
    s = gray_scott.from_config(_config(physics={"preset": "coral", "k": 0.06}))
    assert float(s.params["F"]) == 0.0545 and float(s.params["k"]) == 0.06
    s = gray_scott.from_config(_config(physics={"F": 0.03, "k": 0.062, "Du": 1e-5, "Dv": 5e-6}))
    assert float(s.params["F"]) == 0.03 and float(s.params["Dv"]) == 5e-6
    assert all(s.params[p].dtype == np.float64 for p in s.params)
    with pytest.raises(
        ConfigError, match=r"physics\.F: missing; .*preset from spots, stripes, mitosis, coral"
    ):
        gray_scott.from_config(_config(physics={"k": 0.06}))
    with pytest.raises(ConfigError, match=r"physics\.preset: 'zebra' is not allowed"):
        gray_scott.from_config(_config(physics={"preset": "zebra"}))


def test_unstable_dt_is_rejected_with_the_allowed_value():
    # Pearson's grid: 4 Du (2 / dx^2) + F = 1.678 + 0.0367, so dt <= 2 / 1.714 = 1.167
    assert gray_scott.max_stable_dt(
        Domain((32, 32), (32 * H, 32 * H)), 2e-5, 1e-5, 0.0367, 0.0649
    ) == pytest.approx(1.1666, abs=1e-4)
    with pytest.raises(
        ConfigError, match=r"time\.dt: time step 1\.5 is unstable .*use time\.dt <= 1\.167"
    ):
        gray_scott.from_config(_config(dt=1.5))


def test_experiment_config_runs():
    data = tomllib.loads(EXPERIMENT.read_text())
    assert data["model"]["name"] == "gray_scott"
    apply_overrides(
        data, ["grid.shape=[32, 32]", "grid.length=[0.3125, 0.3125]", "initial.size=[0.05, 0.05]"]
    )
    setup = gray_scott.from_config(Section(data))
    assert setup.seed == data["initial"]["seed"]
    out, obs = run_engine(
        "pmap", setup.model, setup.state, setup.params, 4, (2, 4), data["parallel"]["halo"]
    )
    assert np.all(np.isfinite(out["u"])) and obs["v_max"] > 0
