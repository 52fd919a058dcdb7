"""Lattice Boltzmann (D2Q9, D3Q19): engines equal single, conservation, analytic decay, Ghia.

Budget: about a minute on 2 CPU cores. The full Ghia check (128^2, Re = 100, bound 0.02) is
``experiments/validate_cavity.py``; here a 48^2 cavity at Re = 100 is run to its steady state
(12 000 steps) and held to the looser bound 0.015 (it gives 0.0070 for u and 0.0025 for v).

Slow tier: the 12-case engine matrix of the cavity (its fast twin runs one case per engine),
the periodic box on every engine (the shear wave runs periodic on shard_map 1x8 in the fast
tier), D3Q19 on 2x2x2 and the gradient through a run (compilation is most of their time).
"""

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar import config as cfgmod
from simpar.errors import ConfigError
from simpar.grid import lbm, lbm_config
from simpar.io.cavity_plot import ghia_deviation, load_ghia, plot_cavity
from simpar.parallel.engines import advance_block, make_engine
from simpar.parallel.halo import LocalComm
from simpar.testing import assert_same_field, run_engine, run_engines

CAVITY = (("wall", "wall"), ("wall", "lid"))
PERIODIC = (("periodic", "periodic"), ("periodic", "periodic"))

# every engine on the four meshes of the brief, halo 1 or 2 (halo 3 once)
CASES_2D = (
    ("pmap", (2, 4), 1),
    ("pmap", (4, 2), 2),
    ("pmap", (8,), 2),
    ("pmap", (1, 8), 3),
    ("shard_map", (2, 4), 2),
    ("shard_map", (4, 2), 1),
    ("shard_map", (8,), 1),
    ("shard_map", (1, 8), 2),
    ("sharded", (2, 4), 1),
    ("sharded", (4, 2), 1),
    ("sharded", (8,), 1),
    ("sharded", (1, 8), 1),
)
CASES_2D_PERIODIC = (("pmap", (2, 4), 2), ("shard_map", (1, 8), 1), ("sharded", (4, 2), 1))
# the fast twin of CASES_2D: one case per engine, halo 2 once
CASES_2D_FAST = (("pmap", (4, 2), 2), ("shard_map", (2, 4), 1), ("sharded", (8,), 1))
CASES_3D = (("pmap", (2, 2, 2), 1), ("shard_map", (2, 2, 2), 2), ("sharded", (2, 2, 2), 1))
STEPS = 6  # a multiple of every halo width: one compiled loop body per case


def _noisy(shape, walls, seed=0, u_lid=0.08, dtype="float64", viscosity=0.05):
    rng = np.random.default_rng(seed)
    u0 = [0.02 * rng.standard_normal(shape) for _ in shape]
    return lbm_config.lattice_setup(
        shape, walls=walls, viscosity=viscosity, u_lid=u_lid, dtype=dtype, u0=u0
    )


def _assert_all_equal(results):
    """Every engine equals ``single`` bitwise (FMA off, as conftest sets on x86)."""
    ref = results[("single", (1,), 1)]
    for key, out in results.items():
        assert set(out) == set(ref)
        for name in ref:
            assert_same_field(out[name], ref[name], f"{key} {name}")


@pytest.mark.parametrize(
    "walls, cases",
    [
        pytest.param(CAVITY, CASES_2D, marks=pytest.mark.slow),
        (CAVITY, CASES_2D_FAST),
        pytest.param(PERIODIC, CASES_2D_PERIODIC, marks=pytest.mark.slow),
    ],
    ids=["cavity", "cavity-fast", "periodic"],
)
def test_d2q9_every_engine_equals_single_bitwise(walls, cases):
    s = _noisy((32, 32), walls)
    _assert_all_equal(run_engines(s.model, s.state, s.params, STEPS, cases))


@pytest.mark.slow
def test_d3q19_on_a_2x2x2_device_grid_equals_single_bitwise():
    """Walls on every face (edges and corners of the block meet walls and neighbours), the
    lid on the upper y face."""
    walls = (("wall", "wall"), ("wall", "lid"), ("wall", "wall"))
    s = _noisy((8, 8, 8), walls)
    _assert_all_equal(run_engines(s.model, s.state, s.params, STEPS, CASES_3D))


def test_lattices_are_consistent():
    for lat in (lbm.D2Q9, lbm.D3Q19):
        c, w = np.array(lat.c), np.array(lat.w)
        assert c.shape == (lat.q, lat.d) and lat.q == (9 if lat.d == 2 else 19)
        np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-15)
        np.testing.assert_allclose(c.T @ w, 0.0, atol=1e-15)
        np.testing.assert_allclose(np.einsum("i,ia,ib->ab", w, c, c), np.eye(lat.d) / 3, atol=1e-15)
        assert all(tuple(-a for a in c[i]) == lat.c[lat.opp[i]] for i in range(lat.q))


@pytest.mark.parametrize("walls", [CAVITY, PERIODIC], ids=["cavity", "periodic"])
def test_mass_is_conserved_to_round_off(walls):
    s = _noisy((24, 20), walls, seed=1)
    e = make_engine("single", s.model, (24, 20), None, 1)
    st = e.place(s.state)
    m0 = float(e.observe(st, s.params)["mass"])
    st = e.advance(st, s.params, 2000)
    obs = e.observe(st, s.params)
    assert obs["nonfinite"] == 0
    assert abs(float(obs["mass"]) - m0) / m0 < 1e-13
    # and the moving lid put momentum in: the flow is not at rest
    if walls is CAVITY:
        assert float(obs["kinetic_energy"]) > 1e-3


def _shear_amplitude(f, lattice, n):
    _, u = lbm.host_moments(lattice, f)
    y = np.arange(n) + 0.5
    return 2 * np.mean(u[0] * np.sin(2 * np.pi * y / n)[None, :])


def test_shear_wave_decays_at_nu_k2():
    """u_x = A sin(k y) in a periodic box decays as exp(-nu k^2 t); LBM's error is O(k^2)
    (about 0.1% at 64 cells per wavelength): the rate must match to 0.5%."""
    n, amp, nu, steps = 64, 0.01, 0.1, 400
    y = np.arange(n) + 0.5
    u0 = [np.broadcast_to(amp * np.sin(2 * np.pi * y / n), (4, n)), np.zeros((4, n))]
    s = lbm_config.lattice_setup((4, n), walls=PERIODIC, viscosity=nu, dtype="float64", u0=u0)
    out, _ = run_engine("shard_map", s.model, s.state, s.params, steps, (1, 8), 2)
    a = _shear_amplitude(lbm.populations(out, s.lattice), s.lattice, n)
    k = 2 * np.pi / n
    rate = -np.log(a / amp) / steps
    assert rate == pytest.approx(nu * k * k, rel=5e-3)


@pytest.mark.slow
def test_grad_and_vmap_through_a_run_with_respect_to_viscosity():
    """The decay rate is differentiable in the viscosity param and vmaps over a sweep.

    The gradient is that of the discrete run: it equals a central finite difference of the
    same jitted run to 1e-8 (measured 2.6e-10 at h = 1e-5, float64), and the continuum
    ``d/dnu A exp(-nu k^2 t)`` to 2% (LBM's O(k^2) error)."""
    n, amp, steps = 32, 0.01, 100
    y = np.arange(n) + 0.5
    u0 = [np.broadcast_to(amp * np.sin(2 * np.pi * y / n), (2, n)), np.zeros((2, n))]
    s = lbm_config.lattice_setup((2, n), walls=PERIODIC, viscosity=0.1, dtype="float64", u0=u0)
    sin = jnp.asarray(np.sin(2 * np.pi * y / n))

    def amplitude(nu):
        params = dict(s.params, viscosity=nu)
        st0 = {k: jnp.asarray(v) for k, v in s.state.items()}
        st = advance_block(st0, params, steps, model=s.model, comm=LocalComm(2), w=1)
        df = lbm.populations(st, s.lattice)
        rho = 1 + df.sum(0)
        ux = (df[1] + df[5] + df[8] - df[3] - df[6] - df[7]) / rho
        return 2 * jnp.mean(ux * sin[None, :])

    k2 = (2 * np.pi / n) ** 2
    nu = jnp.asarray(0.1)
    g = jax.jit(jax.grad(amplitude))(nu)
    run, h = jax.jit(amplitude), 1e-5
    fd = (float(run(0.1 + h)) - float(run(0.1 - h))) / (2 * h)
    assert float(g) == pytest.approx(fd, rel=1e-8)
    exact = -k2 * steps * amp * np.exp(-0.1 * k2 * steps)
    assert float(g) == pytest.approx(exact, rel=0.02)
    sweep = jax.vmap(amplitude)(jnp.asarray([0.05, 0.1, 0.2]))
    assert np.all(np.diff(np.asarray(sweep)) < 0)  # more viscous, faster decay


def _cavity_cfg(n=48, re=100.0, **extra):
    cfg = {
        "model": {"name": "lbm"},
        "grid": {"shape": [n, n], "length": [1.0, 1.0], "dtype": "float64"},
        "boundary": {"x": "wall", "y": {"lower": "wall", "upper": "lid"}},
        "physics": {"u_lid": 0.1, "reynolds": re},
        "steady": {"tol": 1e-6, "every": 500},
    }
    for k, v in extra.items():
        cfg.setdefault(k, {}).update(v)
    return cfg


def test_cavity_re100_matches_ghia_on_a_small_grid():
    """48^2, Re = 100, run until max|du| over 500 steps < 1e-6 u_lid: within 0.015 of Ghia
    (measured: u 0.0070, v 0.0025; the experiment holds 128^2 to 0.02)."""
    s = lbm_config.from_config(cfgmod.Section(_cavity_cfg()))
    e = make_engine("single", s.model, s.domain.shape, None, 1)
    st = e.place(s.state)
    u_prev, steps, res = None, 0, np.inf
    while res > s.steady.tol and steps < 40_000:
        st = e.advance(st, s.params, s.steady.every)
        steps += s.steady.every
        _, u = lbm.host_moments(s.lattice, lbm.populations(e.gather(st), s.lattice))
        if u_prev is not None:
            res = max(np.abs(a - b).max() for a, b in zip(u, u_prev, strict=True)) / 0.1
        u_prev = u
    assert res <= s.steady.tol, f"not steady after {steps} steps (residual {res:.2e})"
    dev = ghia_deviation(u[0], u[1], 0.1, 100)
    assert dev["n_u"] == 17 and dev["n_v"] == 17
    assert dev["u_max_abs_dev"] < 0.015 and dev["v_max_abs_dev"] < 0.015, dev


def test_from_config_outputs_and_units():
    s = lbm_config.from_config(cfgmod.Section(_cavity_cfg(n=16)))
    names = tuple(f"f{i}" for i in range(9))
    assert lbm.population_names(s.lattice) == names
    assert set(s.model.fields) == {*names, "wall"}
    f = lbm.populations(s.state, s.lattice)
    assert f.shape == (9, 16, 16) and f.dtype == np.float64
    assert s.state["wall"].dtype == np.uint8
    assert s.dt == pytest.approx(1 / 16)
    assert float(s.params["viscosity"]) == pytest.approx(0.1 * 16 / 100)
    for name in ("rho", "ux", "uy"):
        arr = s.output[name](s.state)
        assert arr.shape == (16, 16) and arr.dtype == np.float64
    np.testing.assert_allclose(s.output["rho"](s.state), 1.0, rtol=1e-15)


@pytest.mark.parametrize(
    "change, key, text",
    [
        ({"physics": {"reynolds": 1e6}}, "physics.reynolds", "tau"),
        ({"physics": {"u_lid": 0.3}}, "physics.u_lid", "<= 0.1"),
        ({"physics": {"lattice": "D3Q19"}}, "physics.lattice", "D2Q9"),
        ({"grid": {"length": [1.0, 2.0]}}, "grid.length", "cubic"),
        ({"physics": {"viscosity": 0.1}}, "physics.reynolds", "exactly one"),
        ({"boundary": {"x": "slip"}}, "boundary.x", "'wall'"),
        ({"boundary": {"x": {"lower": "wall", "upper": "lid"}}}, "boundary.x", "normal to y or z"),
    ],
)
def test_config_errors_name_the_key(change, key, text):
    with pytest.raises(ConfigError) as err:
        lbm_config.from_config(cfgmod.Section(_cavity_cfg(n=16, **change)))
    assert err.value.key == key and text in err.value.message


def test_cavity_plot_draws_profiles_against_ghia(tmp_path):
    s = lbm_config.from_config(cfgmod.Section(_cavity_cfg(n=16)))
    ux = s.output["ux"](s.state)
    path = tmp_path / "cav.nc"
    with h5py.File(path, "w") as f:
        f.attrs["config"] = cfgmod.dumps(_cavity_cfg(n=16))
        f.attrs["model"] = "lbm"
        f["time"] = np.array([0.0, 1.0])
        f["ux"] = np.stack([ux.T, ux.T + 0.01])
        f["uy"] = np.stack([ux.T, ux.T])
        out = plot_cavity(f, path)
    assert [p.name for p in out] == ["cav_cavity_centerlines.png"] and out[0].stat().st_size > 1000
    ref = load_ghia(1000)
    assert ref["u"].shape == ref["y"].shape == (17,) and ref["v"].shape == (17,)


def test_shear_wave_config_is_periodic_without_a_wall_field():
    cfg = {
        "model": {"name": "lbm"},
        "grid": {"shape": [8, 16], "length": [0.5, 1.0]},
        "physics": {"tau": 0.8},
        "initial": {"kind": "shear_wave", "amplitude": 0.02, "mode": 2},
    }
    s = lbm_config.from_config(cfgmod.Section(cfg))
    assert set(s.model.fields) == set(lbm.population_names(s.lattice))
    assert s.model.periodic == (True, True)
    assert float(s.params["viscosity"]) == pytest.approx(0.1)
    ux = s.output["ux"](s.state)
    y = (np.arange(16) + 0.5) / 16
    np.testing.assert_allclose(
        ux, np.broadcast_to(0.02 * np.sin(4 * np.pi * y), (8, 16)), atol=1e-7
    )


def test_fused_returns_its_inputs_bitwise():
    """``lbm.fused`` only changes how XLA schedules the loop, never a value (NaN and inf too)."""
    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        planes = [rng.standard_normal((5, 7)).astype(dt) for _ in range(3)]
        planes[0][1, 2] = np.nan
        planes[1][0, 0] = -np.inf
        out = jax.jit(lbm.fused)(planes)
        for got, want in zip(out, planes, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(np.asarray(got), want)
    with pytest.raises(ValueError, match="one shape and dtype"):
        lbm.fused([np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float64)])
