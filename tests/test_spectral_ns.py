"""Pseudo-spectral 2-D Navier-Stokes (``simpar.grid.spectral_ns``): exact solutions, orders,
energy/enstrophy balance, and every engine equal to ``single`` (float64).

Measured here (the tolerances below keep a margin of about 10x over these):

- Taylor-Green, ``ifrk4``: the exact decay ``exp(-nu |k|^2 t)`` to 4e-15 (relative, max norm)
  after 200 steps at any ``dt`` (the integrating factor is exact, advection vanishes).
- Taylor-Green, ``rk4``: error slope 4.04 in ``dt`` (1.5e-7, 8.8e-9, 5.4e-10 at dt = 0.2, 0.1,
  0.05).
- Decaying turbulence, ``ifrk4``: error slope 4.09 in ``dt`` against a ``dt / 4`` reference
  (2.1e-5, 1.2e-6, 7.3e-8 at dt = T/10, T/20, T/40).
- ``E(0) - E(T) = int (2 nu Z + 2 mu E) dt`` (Simpson's rule on the per-step diagnostics,
  T = 1, CFL 0.44 / 0.22) to 8e-10 relative at dt = 0.02, 7e-11 at dt = 0.01; inviscid, the
  energy drifts 7e-10 / 5e-11 and the enstrophy 2e-9 / 5e-11 over T = 1.
"""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from simpar.errors import ConfigError
from simpar.grid import poisson
from simpar.grid import spectral_ns as S
from simpar.parallel import fft as F
from simpar.parallel.hlo import count

SHAPE = (32, 64)
LENGTH = (2 * math.pi, 4 * math.pi)  # non-square: x and y must not be swapped anywhere


def _single(shape=SHAPE):
    return F.make_ops("single", shape, real=True)[1]


@pytest.fixture(scope="module")
def advance_single():
    """``jit((omega0, params, n, scheme) -> (omega_T))`` on one device, compiled once per
    scheme (params and ``n`` are traced)."""
    ops = _single()
    fns = {
        sc: jax.jit(
            lambda w, p, n, sc=sc: S.to_physical(S.advance(S.to_state(w, ops), p, ops, n, sc), ops)
        )
        for sc in S.SCHEMES
    }
    return lambda w, p, n, scheme="ifrk4": np.asarray(fns[scheme](w, p, n))


def test_taylor_green_decays_exactly(advance_single):
    nu, n = 0.05, 2
    w0 = S.taylor_green(SHAPE, LENGTH, n)
    for dt, steps in [(0.01, 200), (0.5, 4)]:  # the integrating factor is exact at any dt
        p = S.make_params(nu, dt, LENGTH)
        w = advance_single(w0, p, steps)
        exact = S.taylor_green(SHAPE, LENGTH, n, nu=nu, t=dt * steps)
        assert np.abs(w - exact).max() <= 5e-14 * np.abs(exact).max(), dt


def _slope(dts, errs):
    return np.polyfit(np.log(dts), np.log(errs), 1)[0]


def test_taylor_green_rk4_is_fourth_order(advance_single):
    nu, n, t_end = 0.02, 4, 1.0  # nu |k_max|^2 dt = 0.5 at most (RK4 limit 2.78)
    w0 = S.taylor_green(SHAPE, LENGTH, n)
    exact = S.taylor_green(SHAPE, LENGTH, n, nu=nu, t=t_end)
    dts, errs = [0.2, 0.1, 0.05], []
    for dt in dts:
        w = advance_single(w0, S.make_params(nu, dt, LENGTH), round(t_end / dt), "rk4")
        errs.append(np.abs(w - exact).max() / np.abs(exact).max())
    assert 3.8 < _slope(dts, errs) < 4.2, errs


def test_ifrk4_is_fourth_order_on_turbulence(advance_single):
    nu, t_end = 0.01, 0.5
    w0 = S.random_turbulence(SHAPE, LENGTH, seed=3, peak_wavenumber=3.0)
    ref = advance_single(w0, S.make_params(nu, t_end / 160, LENGTH), 160)
    dts, errs = [t_end / 10, t_end / 20, t_end / 40], []
    for dt in dts:
        w = advance_single(w0, S.make_params(nu, dt, LENGTH), round(t_end / dt))
        errs.append(np.abs(w - ref).max() / np.abs(ref).max())
    assert 3.7 < _slope(dts, errs) < 4.3, errs


@partial(jax.jit, static_argnums=(2, 3))
def _history(w0, p, steps, ops):
    """Diagnostics before every step and after the last: dict of ``(steps + 1, ...)``."""

    def body(w, _):
        return S.step(w, p, ops), S.diagnostics(w, p, ops)

    w_end, hist = jax.lax.scan(body, S.to_state(w0, ops), None, length=steps)
    last = S.diagnostics(w_end, p, ops)
    return {k: jnp.concatenate([hist[k], last[k][None]]) for k in last}


def _simpson(y, dt):
    return dt / 3 * (y[0] + y[-1] + 4 * y[1:-1:2].sum() + 2 * y[2:-1:2].sum())


def test_energy_and_enstrophy_balance():
    ops = _single()
    w0 = S.random_turbulence(SHAPE, LENGTH, seed=5, peak_wavenumber=3.0)
    nu, mu, dt, steps = 0.02, 0.1, 0.02, 50  # steps even for Simpson's rule
    h = _history(w0, S.make_params(nu, dt, LENGTH, drag=mu), steps, ops)
    e, z = np.asarray(h["energy"]), np.asarray(h["enstrophy"])
    lost = _simpson(2 * nu * z + 2 * mu * e, dt)
    assert e[-1] < 0.9 * e[0]  # it really dissipates
    assert abs((e[0] - e[-1]) - lost) <= 1e-8 * lost, (e[0] - e[-1], lost)
    # inviscid, unforced: the truncated system conserves both; the drift falls like dt^4
    drifts = []
    for dt in (0.02, 0.01):  # 50 steps each: T = 1 and 0.5, drift ~ T dt^4
        h = _history(w0, S.make_params(0.0, dt, LENGTH), steps, ops)
        drifts.append(
            max(abs(h[k][-1] / h[k][0] - 1) for k in ("energy", "enstrophy")),
        )
    assert drifts[0] < 1e-8 and drifts[1] < drifts[0] / 8, drifts


def test_kolmogorov_flow_spins_up_to_the_laminar_profile(advance_single):
    """From rest the forced shear flow is linear: ``u(y, t) = F / lam (1 - exp(-lam t))
    sin(k y)``, ``lam = nu k^2 + mu`` (advection vanishes for a flow along x that depends on y)."""
    amp, n_f, nu, mu, dt, steps = 0.7, 3, 0.05, 0.1, 0.05, 40
    p = S.make_params(nu, dt, LENGTH, drag=mu, forcing_amplitude=amp, forcing_wavenumber=n_f)
    ops = _single()
    w = jnp.asarray(advance_single(np.zeros(SHAPE), p, steps))
    uv = np.asarray(jax.jit(lambda w: S.velocity(S.to_state(w, ops), p, ops))(w))  # one program
    k = 2 * math.pi * n_f / LENGTH[1]
    lam = nu * k * k + mu
    y = np.arange(SHAPE[1]) * LENGTH[1] / SHAPE[1]
    u = amp / lam * (1 - math.exp(-lam * dt * steps)) * np.sin(k * y)
    assert np.abs(uv[0] - u[None, :]).max() < 1e-8 * np.abs(u).max()
    assert np.abs(uv[1]).max() < 1e-14


def test_velocity_spectrum_and_initial_fields():
    ops = _single()
    p = S.make_params(0.01, 0.1, LENGTH)
    w0 = S.random_turbulence(SHAPE, LENGTH, seed=7, peak_wavenumber=4.0, energy=0.3)
    np.testing.assert_array_equal(w0, S.random_turbulence(SHAPE, LENGTH, seed=7, energy=0.3))
    assert not np.allclose(w0, S.random_turbulence(SHAPE, LENGTH, seed=8, energy=0.3))
    st = S.to_state(jnp.asarray(w0), ops)
    d, uv = jax.jit(lambda w: (S.diagnostics(w, p, ops), S.velocity(w, p, ops)))(st)
    uv = np.asarray(uv)
    # Parseval == grid means; the spectrum sums to the energy and peaks near k_p
    assert abs(float(d["energy"]) - 0.3) < 1e-13
    assert abs(0.5 * np.mean(uv[0] ** 2 + uv[1] ** 2) - 0.3) < 1e-13
    assert abs(float(d["enstrophy"]) - 0.5 * np.mean(w0**2)) < 1e-12 * np.mean(w0**2)
    assert abs(float(np.sum(d["spectrum"])) - 0.3) < 1e-13
    assert 2 <= int(np.argmax(d["spectrum"])) <= 6
    speed = np.sqrt(uv[0] ** 2 + uv[1] ** 2).max()
    assert abs(float(d["max_speed"]) - speed) < 1e-13
    cfl = 0.1 * (
        np.abs(uv[0]).max() * SHAPE[0] / LENGTH[0] + np.abs(uv[1]).max() * SHAPE[1] / LENGTH[1]
    )
    assert abs(float(d["cfl"]) - cfl) < 1e-13
    # u is divergence-free and its curl is omega (spectral derivatives, NumPy)
    ops_c = poisson.local_ops(SHAPE, real=False)
    kx = 2j * math.pi * np.fft.fftfreq(SHAPE[0], LENGTH[0] / SHAPE[0])[:, None]
    ky = 2j * math.pi * np.fft.fftfreq(SHAPE[1], LENGTH[1] / SHAPE[1])[None, :]
    uh, vh = np.fft.fft2(uv[0]), np.fft.fft2(uv[1])
    assert np.abs(np.fft.ifft2(kx * uh + ky * vh)).max() < 1e-12
    np.testing.assert_allclose(np.fft.ifft2(kx * vh - ky * uh).real, w0, atol=1e-12)
    # complex transforms give the same step as real ones
    pr = S.make_params(0.01, 0.05, LENGTH, forcing_amplitude=1.0)

    def one_step(o):
        return jax.jit(lambda w: S.to_physical(S.step(S.to_state(w, o), pr, o), o))

    a = one_step(ops)(jnp.asarray(w0))
    b = one_step(ops_c)(jnp.asarray(w0 + 0j))
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-12)


# -- every engine equals single ------------------------------------------------------------------


def _program(p, ops, steps, comm):
    def run(w):
        st = S.advance(S.to_state(w, ops), p, ops, steps)
        return S.to_physical(st, ops), S.diagnostics(st, p, ops, comm)

    return run


def _run_on(engine, mesh, w0, p, steps):
    """Vorticity after ``steps`` (global NumPy array) and the diagnostics, under ``engine``."""
    plan, ops = F.make_ops(engine, SHAPE, mesh, real=True)
    if engine == "single":
        out, d = jax.jit(_program(p, ops, steps, None))(w0)
    elif engine == "sharded":
        x = jax.device_put(w0, NamedSharding(F.device_mesh(plan.mesh), plan.spec(False)))
        out, d = jax.jit(_program(p, ops, steps, None))(x)
    elif engine == "shard_map":
        fn = jax.shard_map(
            _program(p, ops, steps, F.grid_comm(plan, engine)),
            mesh=F.device_mesh(plan.mesh),
            in_specs=plan.spec(False),
            out_specs=(plan.spec(False), P()),
            # the sums over all mesh axes meet blocks that do not vary along a size-1 axis
            check_vma=False,
        )
        out, d = jax.jit(fn)(w0)
    else:
        fn = jax.pmap(_program(p, ops, steps, F.grid_comm(plan, engine)), axis_name=F.PMAP_AXIS)
        blocks, d = fn(F.split_blocks(w0, plan, False))
        out = F.join_blocks(blocks, plan, False)
        d = jax.tree.map(lambda v: v[0], d)
    return np.asarray(out), {k: np.asarray(v) for k, v in d.items()}


@pytest.mark.parametrize(
    "mesh", [pytest.param((8,), marks=pytest.mark.slow), (2, 4)], ids=["8", "2x4"]
)
def test_every_engine_equals_single(mesh):
    p = S.make_params(0.01, 0.02, LENGTH, drag=0.05, forcing_amplitude=0.5, forcing_wavenumber=2)
    w0 = S.random_turbulence(SHAPE, LENGTH, seed=11, peak_wavenumber=4.0)
    steps = 6
    ref, dref = _run_on("single", (1,), w0, p, steps)
    assert np.abs(ref - w0).max() > 1e-3  # the flow moved
    for engine in ("pmap", "shard_map", "sharded"):
        out, d = _run_on(engine, mesh, w0, p, steps)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12 * np.abs(ref).max(), err_msg=engine)
        for k, v in dref.items():
            np.testing.assert_allclose(d[k], v, rtol=1e-12, atol=1e-14, err_msg=f"{engine} {k}")


def test_sharded_step_moves_only_the_transposes():
    """Fourier state: 8 transform calls per RK4 step; a physical-space state needs 10."""
    plan, ops = F.make_ops("sharded", SHAPE, (2, 4), real=True)
    p = S.make_params(0.01, 0.02, LENGTH)
    sharding = NamedSharding(F.device_mesh(plan.mesh), plan.spec(True))
    w = jax.device_put(jnp.zeros(plan.fourier_shape, jnp.complex128), sharding)

    def n_collectives(fn, x):
        return count(jax.jit(fn).lower(x).compile().as_text())

    n = n_collectives(lambda v: S.step(v, p, ops), w)
    assert n["all-to-all"] == 8 * plan.n_transposes, n
    assert n["all-gather"] == n["collective-permute"] == n["all-reduce"] == 0, n
    x = jax.device_put(
        jnp.zeros(plan.shape), NamedSharding(F.device_mesh(plan.mesh), plan.spec(False))
    )
    n_phys = n_collectives(lambda v: S.to_physical(S.step(S.to_state(v, ops), p, ops), ops), x)
    assert n_phys["all-to-all"] == 10 * plan.n_transposes, n_phys


def test_grad_through_a_run():
    ops = _single((16, 16))
    w0 = jnp.asarray(S.random_turbulence((16, 16), seed=2, peak_wavenumber=2.0))

    def final_energy(nu, mu):
        p = S.make_params(nu, 0.05, drag=mu)
        return S.diagnostics(S.advance(S.to_state(w0, ops), p, ops, 10), p, ops)["energy"]

    f = jax.jit(final_energy)
    g = jax.jit(jax.grad(final_energy, argnums=(0, 1)))(0.02, 0.1)
    h = 1e-6
    for i, (a, b) in enumerate(
        [((0.02 + h, 0.1), (0.02 - h, 0.1)), ((0.02, 0.1 + h), (0.02, 0.1 - h))]
    ):
        fd = (f(*a) - f(*b)) / (2 * h)
        assert abs(g[i] - fd) <= 1e-6 * abs(fd), (i, g[i], fd)


def test_bad_input():
    with pytest.raises(ConfigError, match="physics.viscosity"):
        S.make_params(-1.0, 0.1)
    with pytest.raises(ConfigError, match="time.dt"):
        S.make_params(0.1, 0.0)
    with pytest.raises(ConfigError, match="physics.drag"):
        S.make_params(0.1, 0.1, drag=-0.5)
    with pytest.raises(ConfigError, match="forcing.wavenumber.*positive integer"):
        S.make_params(0.1, 0.1, forcing_wavenumber=2.5)
    with pytest.raises(ConfigError, match="grid.length"):
        S.make_params(0.1, 0.1, length=(1.0, -1.0))
    p = S.make_params(0.1, 0.1)
    with pytest.raises(ConfigError, match="physics.scheme.*ifrk4"):
        S.step(jnp.zeros((8, 5), jnp.complex128), p, _single((8, 8)), "euler")
    with pytest.raises(ConfigError, match="grid.shape.*2-D"):
        S.step(jnp.zeros((8, 8, 5), jnp.complex128), p, _single((8, 8, 8)))


def test_validation_script_runs_without_jax_cfd(capsys):
    """``experiments/validate_spectral_ns.py`` reports simpar's numbers alone when jax-cfd is
    not installed (the project's environment), or compares when it is."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "validate_spectral_ns.py"
    spec = importlib.util.spec_from_file_location("validate_spectral_ns", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(mod)
    argv = ["--n", "16", "--t-end", "0.1", "--dt", "0.01", "--no-refine", "--frames"]
    assert mod.main([*argv, "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    energy = report["simpar"]["energy"]
    assert len(energy) == 3 and energy[0] == pytest.approx(0.5) and energy[-1] < energy[0]
    if importlib.util.find_spec("jax_cfd") is None:
        assert report["jax_cfd"].startswith("absent")
    assert mod.main([*argv, "3"]) == 2  # 10 steps in 3 frames: refused
