"""The leapfrog wave model: analytic standing waves, convergence order, energy, engines.

References and tolerances (float64):
- a Dirichlet-0 standing wave ``sin(pi k x / L)`` is an exact discrete eigenmode, and the
  Taylor start makes the run equal the exact discrete solution ``cos(omega_d t) phi`` to
  round-off: max error < 1e-12 (seen: ~1e-15);
- against the continuous ``cos(c |k| t) phi`` the error is O(h^2) at a fixed Courant number:
  the measured order between 16/32/64 cells must lie in [1.9, 2.1] (seen: 1.99-2.00);
- the discrete leapfrog energy (``GridModel.local_sums``) is conserved to 1e-12 relative over
  1500 steps of a random field (seen: ~1e-15);
- every engine equals ``single``: bitwise without FMA (same per-cell arithmetic), to 1e-14
  with it (see ``assert_same_field``).
"""

import math
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.config import Section, apply_overrides
from simpar.errors import ConfigError
from simpar.grid import wave
from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.grid.domain import Domain
from simpar.parallel.engines import advance_block, make_engine
from simpar.parallel.halo import LocalComm
from simpar.testing import assert_same_field, run_engine

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "wave2d.toml"


# a subset of ENGINE_CASES_2D/3D that still covers every engine, 1-D and 2-D meshes, both
# orientations and halo widths 1-3 (the suite runs on 2 CI cores)
CASES_2D = (
    ("pmap", (8,), 1),
    ("pmap", (2, 4), 3),
    ("shard_map", (2, 4), 2),
    ("shard_map", (1, 8), 1),
    ("sharded", (2, 4), 1),
    ("sharded", (4, 2), 1),
)
CASES_3D = (
    ("pmap", (2, 2, 2), 2),
    ("shard_map", (2, 2, 2), 1),
    ("sharded", (2, 2, 2), 1),
)


def _config(shape, length, dt, boundary=None, initial=None, c=1.0):
    return Section(
        {
            "model": {"name": "wave"},
            "grid": {"shape": list(shape), "length": list(length), "dtype": "float64"},
            "boundary": boundary or {"x": "dirichlet", "y": "dirichlet"},
            "physics": {"c": c},
            "initial": initial or {"kind": "sine", "modes": [1, 2]},
            "time": {"dt": dt},
        }
    )


def test_standing_wave_equals_exact_discrete_solution():
    modes = [1, 2]
    setup = wave.from_config(
        _config((32, 48), (1.0, 1.5), 0.5 / 32, initial={"kind": "sine", "modes": modes})
    )
    n = 200
    out, _ = run_engine("single", setup.model, setup.state, setup.params, n)
    exact = wave.standing_wave(setup.domain, modes, 1.0, 1.0, n * setup.dt, dt=setup.dt)
    assert np.max(np.abs(out["u"] - exact)) < 1e-12
    # and the wave really moved: cos(omega_d t) has changed sign since t = 0
    assert np.max(np.abs(out["u"] - setup.state["u"])) > 0.5


@pytest.mark.slow
def test_standing_wave_converges_at_second_order():
    modes, T = [1, 2], 0.25
    errors = []
    for n in (16, 32, 64):
        setup = wave.from_config(
            _config((n, 3 * n // 2), (1.0, 1.5), 0.5 / n, initial={"kind": "sine", "modes": modes})
        )
        steps = round(T / setup.dt)
        assert math.isclose(steps * setup.dt, T)
        out, _ = run_engine("single", setup.model, setup.state, setup.params, steps)
        exact = wave.standing_wave(setup.domain, modes, 1.0, 1.0, T)
        errors.append(np.max(np.abs(out["u"] - exact)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all((orders > 1.9) & (orders < 2.1)), (errors, orders)


@pytest.mark.parametrize(
    "boundary,engine,mesh",
    [
        pytest.param({"x": "periodic", "y": "neumann"}, "pmap", (2, 4), marks=pytest.mark.slow),
        ({"x": "dirichlet", "y": "periodic"}, "single", None),
    ],
)
def test_discrete_energy_is_conserved(boundary, engine, mesh):
    setup = wave.from_config(
        _config((32, 48), (1.0, 1.5), 0.9 / (32 * math.sqrt(2)), boundary=boundary)
    )
    rng = np.random.default_rng(0)
    state = {"u": rng.standard_normal((32, 48)), "u_prev": rng.standard_normal((32, 48))}
    eng = make_engine(engine, setup.model, (32, 48), mesh, 2)
    x = eng.place(state)
    energy = [eng.observe(x, setup.params)["energy"]]
    kinetic = [eng.observe(x, setup.params)["kinetic_energy"]]
    for _ in range(5):
        x = eng.advance(x, setup.params, 300)
        obs = eng.observe(x, setup.params)
        energy.append(obs["energy"])
        kinetic.append(obs["kinetic_energy"])
    energy = np.array(energy)
    assert energy[0] > 0
    assert np.max(np.abs(energy / energy[0] - 1)) < 1e-12
    # the parts are not conserved separately: energy really moves between them
    assert np.ptp(kinetic) > 1e-3 * energy[0]


def test_energy_is_positive_and_matches_numpy():
    d = Domain((16, 24), (1.0, 1.5), "float64")
    bcs = ((Dirichlet(), Dirichlet()), (Neumann(), Neumann()))
    rng = np.random.default_rng(3)
    u, up = rng.standard_normal(d.shape), rng.standard_normal(d.shape)
    params = wave.make_params(d, 1.3, 0.01)
    eng = make_engine("single", wave.make_model(2, bcs), d.shape)
    obs = eng.observe(eng.place({"u": u, "u_prev": up}), params)
    dv = math.prod(d.dx)
    kin = 0.5 * dv * np.sum(((u - up) / 0.01) ** 2)
    pot = -0.5 * dv * 1.3**2 * np.sum(up * wave.laplacian_np(u, d, bcs))
    np.testing.assert_allclose(
        [obs["kinetic_energy"], obs["potential_energy"]], [kin, pot], rtol=1e-12
    )


def assert_engines_equal_single(model, state, params, n, cases):
    """Every (engine, mesh, halo) case gives the fields of ``single`` after ``n`` steps.

    (Like ``simpar.testing.run_engines``, without compiling the diagnostics of each case.)
    """

    def final(engine, mesh, halo):
        eng = make_engine(engine, model, state["u"].shape, mesh, halo)
        return eng.gather(eng.advance(eng.place(state), params, n))

    ref = final("single", None, model.radius)
    for engine, mesh, halo in cases:
        got = final(engine, mesh, halo)
        for f in ref:
            assert_same_field(got[f], ref[f], f"{engine} {mesh} halo {halo}: {f}")


def _random_state(shape, seed=0):
    rng = np.random.default_rng(seed)
    return {"u": rng.standard_normal(shape), "u_prev": rng.standard_normal(shape)}


def test_every_engine_equals_single_2d():
    bcs = ((Dirichlet(0.5), Neumann()), (Periodic(), Periodic()))
    d = Domain((32, 48), (1.0, 1.5), "float64")
    model = wave.make_model(2, bcs)
    params = wave.make_params(d, 1.0, 0.5 / 48)
    assert_engines_equal_single(model, _random_state(d.shape), params, 12, CASES_2D)


def test_every_engine_equals_single_3d():
    bcs = ((Periodic(), Periodic()), (Dirichlet(), Neumann()), (Neumann(), Dirichlet(0.25)))
    d = Domain((8, 8, 12), (1.0, 1.0, 1.5), "float64")
    model = wave.make_model(3, bcs)
    params = wave.make_params(d, 1.0, 0.3 / 8)
    assert_engines_equal_single(model, _random_state(d.shape, 1), params, 6, CASES_3D)


def test_grad_through_a_run_matches_finite_difference():
    """``c`` is an array leaf: d(u . w)/dc through 20 jitted steps equals a central difference."""
    d = Domain((16, 16), (1.0, 1.0), "float64")
    bcs = ((Dirichlet(), Dirichlet()), (Periodic(), Periodic()))
    model = wave.make_model(2, bcs)
    setup_state = wave.initial_state(wave.sine_mode(d, [1, 2]), d, bcs, 1.0, 0.02)
    weight = np.random.default_rng(5).standard_normal(d.shape)

    def loss(c):
        params = {**wave.make_params(d, 1.0, 0.02), "c": c}
        out = advance_block(setup_state, params, 20, model=model, comm=LocalComm(2), w=1)
        return jnp.sum(out["u"] * weight)

    g = jax.jit(jax.grad(loss))(jnp.float64(1.0))
    h = 1e-6
    fd = (loss(jnp.float64(1.0 + h)) - loss(jnp.float64(1.0 - h))) / (2 * h)
    np.testing.assert_allclose(float(g), float(fd), rtol=1e-6)


def test_unstable_dt_is_rejected_with_the_allowed_value():
    with pytest.raises(
        ConfigError, match=r"time\.dt: .*Courant number .* must be below 1.*use time\.dt < 0\.0221"
    ):
        wave.from_config(_config((32, 32), (1.0, 1.0), 0.025))  # C = 0.025 * 32 * sqrt(2) = 1.13
    with pytest.raises(ConfigError, match=r"physics\.c"):
        wave.from_config(_config((32, 32), (1.0, 1.0), 0.01, c=-1.0))
    with pytest.raises(ConfigError, match=r"initial\.kind"):
        wave.from_config(_config((32, 32), (1.0, 1.0), 0.01, initial={"kind": "square"}))


def test_experiment_config_runs():
    data = tomllib.loads(EXPERIMENT.read_text())
    assert data["model"]["name"] == "wave"
    apply_overrides(data, ["grid.shape=[32, 32]", "time.dt=0.01"])
    cfg = Section(data)
    setup = wave.from_config(cfg)
    out, obs = run_engine(
        "pmap", setup.model, setup.state, setup.params, 4, (2, 4), data["parallel"]["halo"]
    )
    assert np.all(np.isfinite(out["u"])) and obs["energy"] > 0
