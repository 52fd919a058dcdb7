"""The advection model: convergence orders, mass conservation, max principle, engines.

References and tolerances (float64):
- translation of the smooth periodic profile ``1 + sin(2 pi x) sin(2 pi y)`` by the uniform
  velocity ``(1, 0.5)`` over one period of the box in y (t = 2, the profile returns home) at
  Courant number 0.8 on 32/64/128 cells, L1 error against the initial profile:
  upwind order in [0.8, 1.1] (seen: 0.80, 0.89); MUSCL + van Leer order in [1.8, 2.2] between
  64 and 128 cells (seen: 1.85, 1.96); MUSCL + minmod above 1.5 (seen: 1.75, 1.70: minmod
  clips the smooth extrema hardest). (MUSCL + MC, not tested, gives 1.94, 2.03);
- total mass is conserved to 1e-13 relative with periodic walls and with walls that the
  rotation does not cross (seen: ~2e-16);
- no new extrema with the limited scheme (each limiter), on a discontinuous square and on a
  Gaussian, up to round-off (1e-14 of the amplitude);
- every engine equals ``single``: bitwise without FMA (same per-cell arithmetic), to 1e-14
  with it (see ``assert_same_field``).
"""

import tomllib
from pathlib import Path

import numpy as np
import pytest

from simpar.config import Section, apply_overrides
from simpar.errors import ConfigError
from simpar.grid import advection
from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.grid.domain import Domain
from simpar.grid.heat import gaussian
from simpar.parallel.engines import make_engine
from simpar.testing import assert_same_field, run_engine

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "advection2d.toml"


# radius 2 (muscl): halo >= 2, block >= halo; every engine, 1-D and 2-D meshes, halo 2-4
# (3: one step and a spare cell per exchange, 4: two steps per exchange)
CASES_MUSCL = (
    ("pmap", (8,), 2),
    ("pmap", (2, 4), 4),
    ("shard_map", (2, 4), 2),
    ("shard_map", (1, 8), 3),
    ("sharded", (2, 4), 2),
    ("sharded", (4, 2), 2),
)
# the velocity-field flow on fewer (the uniform flow above covers every case)
CASES_MUSCL_FIELD = (("pmap", (2, 4), 4), ("shard_map", (1, 8), 3), ("sharded", (4, 2), 2))
# radius 1 (upwind): halo 1-3
CASES_UPWIND = (
    ("pmap", (2, 4), 3),
    ("shard_map", (4, 2), 1),
    ("sharded", (1, 8), 1),
)


def _config(
    n, physics, initial=None, boundary=None, courant=0.8, dtype="float64", length=(1.0, 1.0)
):
    if physics.get("flow", "uniform") == "uniform":
        physics = {"velocity": [1.0, 0.5], **physics}
    speed = max(abs(v) for v in physics["velocity"]) if "velocity" in physics else 1.0
    return Section(
        {
            "model": {"name": "advection"},
            "grid": {"shape": list(n), "length": list(length), "dtype": dtype},
            "boundary": boundary or {"x": "periodic", "y": "periodic"},
            "physics": physics,
            "initial": initial or {"kind": "sine", "modes": [1, 1], "offset": 1.0},
            "time": {"dt": courant * min(length[a] / n[a] for a in range(len(n))) / speed},
        }
    )


def _run(setup, steps):
    eng = make_engine("single", setup.model, setup.domain.shape)
    return eng.gather(eng.advance(eng.place(setup.state), setup.params, steps))["q"]


def _orders(scheme, limiter="van_leer"):
    errors = []
    for n in (32, 64, 128):
        setup = advection.from_config(_config((n, n), {"scheme": scheme, "limiter": limiter}))
        steps = round(2.0 / setup.dt)
        assert abs(steps * setup.dt - 2.0) < 1e-12
        q = _run(setup, steps)
        errors.append(np.mean(np.abs(q - setup.state["q"])))
    return np.log2(np.array(errors[:-1]) / np.array(errors[1:]))


def test_upwind_converges_at_first_order():
    orders = _orders("upwind")
    assert np.all((orders > 0.75) & (orders < 1.1)), orders
    assert orders[-1] > 0.85, orders


@pytest.mark.slow
@pytest.mark.parametrize("limiter,low", [("van_leer", 1.8), ("minmod", 1.5)])
def test_muscl_converges_at_second_order_on_a_smooth_profile(limiter, low):
    orders = _orders("muscl", limiter)
    assert low < orders[-1] < 2.2, orders


@pytest.mark.parametrize("scheme", ["upwind", "muscl"])
def test_mass_is_conserved_with_periodic_walls(scheme):
    setup = advection.from_config(
        _config(
            (32, 48),
            {"scheme": scheme, "velocity": [0.7, -0.4]},
            initial={"kind": "gaussian", "center": [0.3, 0.6]},
        )
    )
    q0 = setup.state["q"]
    out, obs = run_engine("shard_map", setup.model, setup.state, setup.params, 300, (2, 4), 2)
    mass0 = q0.sum() * np.prod(setup.domain.dx)
    assert abs(obs["mass"] / mass0 - 1) < 1e-13
    assert abs(out["q"].sum() / q0.sum() - 1) < 1e-13
    assert np.max(np.abs(out["q"] - q0)) > 0.1  # it moved


def test_mass_is_conserved_in_a_rotating_flow_between_walls():
    cfg = _config(
        (48, 48),
        {"flow": "rotation", "omega": 2 * np.pi},
        initial={"kind": "gaussian", "center": [0.5, 0.75], "width": 0.06},
        boundary={"x": "dirichlet", "y": "neumann"},
    )
    cfg.data["time"]["dt"] = 0.005  # max |v| < omega / 2 = pi: Courant < 0.76
    setup = advection.from_config(cfg)
    assert set(setup.state) == {"q", "vx", "vy"}
    steps = 50  # a quarter turn
    out, obs = run_engine("pmap", setup.model, setup.state, setup.params, steps, (2, 4), 2)
    mass0 = setup.state["q"].sum() * np.prod(setup.domain.dx)
    assert abs(obs["mass"] / mass0 - 1) < 1e-13
    np.testing.assert_array_equal(out["vx"], setup.state["vx"])  # the flow is never changed
    # a quarter turn counter-clockwise about the centre takes the blob from (0.5, 0.75) to (0.25, 0.5)
    x, y = setup.domain.mesh()
    t = steps * setup.dt
    com = [np.sum(g * out["q"]) / out["q"].sum() for g in (x, y)]
    angle = 2 * np.pi * t
    expected = [0.5 - 0.25 * np.sin(angle), 0.5 + 0.25 * np.cos(angle)]
    np.testing.assert_allclose(com, expected, atol=0.01)


@pytest.mark.parametrize("limiter", advection.LIMITERS)
def test_limited_scheme_creates_no_new_extrema(limiter):
    """A discontinuous square and a Gaussian, 200 steps at Courant number 0.95."""
    d = Domain((32, 48), (1.0, 1.5), "float64")
    bcs = ((Periodic(), Periodic()), (Periodic(), Periodic()))
    eng = make_engine("single", advection.make_model(2, bcs, "muscl", limiter), d.shape)
    params = advection.make_params(d, 0.95 / 32 / 0.7, [0.7, -0.4])
    square = advection.square_profile(d, [0.4, 0.5], 0.3, 2.0)
    blob = gaussian(d, [0.4, 0.5], 0.1, 2.0)
    for q0 in (square, blob):
        q = eng.gather(eng.advance(eng.place({"q": q0}), params, 200))["q"]
        eps = 1e-14 * 2.0
        assert q.min() >= q0.min() - eps and q.max() <= q0.max() + eps, (q.min(), q.max())
        assert np.max(np.abs(q - q0)) > 0.1  # it moved


def _assert_engines_equal_single(model, state, params, n, cases):
    """Each case gives the fields of ``single`` (see ``assert_same_field``)."""

    def final(engine, mesh, halo):
        eng = make_engine(engine, model, state["q"].shape, mesh, halo)
        return eng.gather(eng.advance(eng.place(state), params, n))

    ref = final("single", None, model.radius)
    for engine, mesh, halo in cases:
        got = final(engine, mesh, halo)
        for f in ref:
            assert_same_field(got[f], ref[f], f"{engine} {mesh} halo {halo}: {f}")


@pytest.mark.slow
def test_every_engine_equals_single_muscl_uniform():
    d = Domain((32, 48), (1.0, 1.5), "float64")
    bcs = ((Periodic(), Periodic()), (Dirichlet(0.5), Neumann()))
    model = advection.make_model(2, bcs, "muscl", "van_leer", "uniform")
    state = {"q": np.random.default_rng(0).random(d.shape)}
    params = advection.make_params(d, 0.004, [1.2, -2.5])
    _assert_engines_equal_single(model, state, params, 8, CASES_MUSCL)


def test_every_engine_equals_single_muscl_rotation_with_walls():
    """Velocity fields as state, walls on both axes.

    (With FMA on, ``single`` fuses this step differently from every other program: ~3 % of
    the cells differ by an ulp per step, while the parallel programs agree with each other
    bitwise. Without FMA all are bitwise equal.)
    """
    d = Domain((32, 48), (1.0, 1.5), "float64")
    bcs = ((Dirichlet(0.5), Neumann()), (Dirichlet(), Dirichlet()))
    model = advection.make_model(2, bcs, "muscl", "van_leer", "rotation")
    rng = np.random.default_rng(0)
    state = {"q": rng.random(d.shape), **advection.rotation_velocity(d, 3.0, [0.4, 0.8])}
    params = advection.make_params(d, 0.004)
    _assert_engines_equal_single(model, state, params, 8, CASES_MUSCL_FIELD)


def test_every_engine_equals_single_upwind_uniform():
    d = Domain((32, 48), (1.0, 1.5), "float64")
    bcs = ((Periodic(), Periodic()), (Dirichlet(1.0), Neumann()))
    model = advection.make_model(2, bcs, "upwind", flow="uniform")
    state = {"q": np.random.default_rng(1).random(d.shape)}
    params = advection.make_params(d, 0.01, [1.5, -0.8])
    _assert_engines_equal_single(model, state, params, 9, CASES_UPWIND)


def test_every_engine_equals_single_3d():
    d = Domain((8, 8, 12), (1.0, 1.0, 1.5), "float64")
    bcs = ((Periodic(), Periodic()), (Periodic(), Periodic()), (Neumann(), Dirichlet(0.3)))
    model = advection.make_model(3, bcs, "muscl", "mc")
    state = {"q": np.random.default_rng(2).random(d.shape)}
    params = advection.make_params(d, 0.02, [1.0, -2.0, 0.5])
    _assert_engines_equal_single(
        model, state, params, 5, (("pmap", (2, 2, 2), 2), ("shard_map", (2, 2, 2), 3))
    )


def test_unstable_dt_is_rejected_with_the_allowed_value():
    cfg = _config((32, 32), {"velocity": [2.0, 0.5]})
    cfg.data["time"]["dt"] = 0.02  # Courant 2 * 0.02 * 32 = 1.28
    with pytest.raises(
        ConfigError, match=r"time\.dt: .*Courant number .* 1\.28 exceeds 1.*use time\.dt <= 0\.0156"
    ):
        advection.from_config(cfg)
    cfg = _config((32, 32), {"flow": "rotation", "omega": 10.0})
    cfg.data["time"]["dt"] = 0.01  # max |v| = 4.84, Courant 4.84 * 0.01 * 32 = 1.55
    with pytest.raises(ConfigError, match=r"time\.dt: .* 1\.55 exceeds 1"):
        advection.from_config(cfg)
    with pytest.raises(ConfigError, match=r"physics\.limiter"):
        advection.from_config(_config((32, 32), {"limiter": "superbee"}))
    with pytest.raises(ConfigError, match=r"physics\.velocity"):
        advection.from_config(_config((32, 32), {"velocity": [1.0]}))


def test_experiment_config_runs():
    data = tomllib.loads(EXPERIMENT.read_text())
    assert data["model"]["name"] == "advection"
    apply_overrides(data, ["grid.shape=[32, 32]", "time.dt=0.004"])
    setup = advection.from_config(Section(data))
    halo = data["parallel"]["halo"]
    out, obs = run_engine("pmap", setup.model, setup.state, setup.params, 4, (2, 4), halo)
    assert np.all(np.isfinite(out["q"])) and obs["mass"] > 0
