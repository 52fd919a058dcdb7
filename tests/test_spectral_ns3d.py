"""Pseudo-spectral 3-D Navier-Stokes, velocity form (``simpar.grid.spectral_ns3d``), float64.

Measured here (tolerances keep a margin of about 10x):

- ABC (Beltrami) flow: the exact decay ``exp(-nu t)`` to 1e-15 after 40 steps;
  its energy, enstrophy and helicity equal the analytic values to round-off.
- Taylor-Green + ABC mix, 16^3, dt = 0.02, T = 1: ``E(0) - E(T) = int 2 nu Z dt`` (Simpson) to
  1.2e-10 relative (1.8e-11 at dt = 0.01); inviscid, energy and helicity drift by 2.2e-11 over
  T = 1 (2.6e-13 / 7.6e-13 over T = 0.5 at dt = 0.01) while the enstrophy grows 14%; the
  divergence bound stays below 1e-15.
- Every engine equals ``single`` to 1e-12 on (8,) (slab) and (2, 4) (pencil); a sharded step
  on the pencil is 16 all-to-alls (8 transform calls x 2 transposes) and nothing else.
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
from simpar.grid import spectral_ns as S
from simpar.grid import spectral_ns3d as S3
from simpar.parallel import fft as F
from simpar.parallel.hlo import count

SHAPE = (16, 16, 16)
CUBE = (2 * math.pi,) * 3


def _single(shape=SHAPE):
    return F.make_ops("single", shape, real=True)[1]


def _mixed(shape=SHAPE):
    """Taylor-Green plus an ABC flow: helical, and the nonlinear term is busy."""
    return S3.taylor_green(shape) + 0.3 * S3.abc_flow(shape)


@pytest.mark.slow
def test_abc_flow_decays_exactly():
    ops = _single()
    nu, dt, steps = 0.1, 0.05, 40
    p = S.make_params(nu, dt, CUBE)
    u0 = S3.abc_flow(SHAPE)
    run = jax.jit(lambda u: S3.to_physical(S3.advance(S3.to_state(u, p, ops), p, ops, steps), ops))
    exact = S3.abc_flow(SHAPE, nu=nu, t=dt * steps)
    assert np.abs(np.asarray(run(u0)) - exact).max() < 1e-13 * np.abs(exact).max()
    d = jax.jit(lambda u: S3.diagnostics(S3.to_state(u, p, ops), p, ops))(u0)
    e = (1 + 0.7**2 + 0.4**2) / 2  # (A^2 + B^2 + C^2) / 2
    for key, value in [("energy", e), ("enstrophy", e), ("helicity", 2 * e)]:
        assert abs(float(d[key]) - value) < 1e-14, key
    assert abs(float(d["spectrum"][1]) - e) < 1e-14 and float(d["divergence_bound"]) < 1e-14
    np.testing.assert_allclose(
        np.asarray(S3.vorticity(S3.to_state(u0, p, ops), p, ops)), u0, atol=1e-13
    )


@partial(jax.jit, static_argnums=(2, 3))
def _history(u0, p, steps, ops):
    def body(u, _):
        return S3.step(u, p, ops), S3.diagnostics(u, p, ops)

    u_end, hist = jax.lax.scan(body, S3.to_state(u0, p, ops), None, length=steps)
    last = S3.diagnostics(u_end, p, ops)
    return {k: jnp.concatenate([hist[k], last[k][None]]) for k in last}


@pytest.mark.slow
def test_energy_balance_and_conservation():
    ops = _single()
    u0 = _mixed()
    nu, dt, steps = 0.05, 0.02, 50
    h = _history(u0, S.make_params(nu, dt, CUBE), steps, ops)
    e, z = np.asarray(h["energy"]), np.asarray(h["enstrophy"])
    lost = dt / 3 * (2 * nu) * (z[0] + z[-1] + 4 * z[1:-1:2].sum() + 2 * z[2:-1:2].sum())
    assert e[-1] < 0.95 * e[0]
    assert abs((e[0] - e[-1]) - lost) <= 2e-9 * lost, (e[0] - e[-1], lost)
    assert np.asarray(h["divergence_bound"]).max() < 1e-14
    h = _history(u0, S.make_params(0.0, dt, CUBE), steps, ops)  # inviscid, T = 1
    for key in ("energy", "helicity"):
        v = np.asarray(h[key])
        assert abs(v[-1] / v[0] - 1) < 3e-10, (key, v[0], v[-1])
    assert np.asarray(h["enstrophy"])[-1] > 1.05 * np.asarray(h["enstrophy"])[0]  # stretching


@pytest.mark.slow
def test_kolmogorov_shear_flow_spins_up():
    amp, n_f, nu, mu, dt, steps = 0.7, 2, 0.05, 0.1, 0.05, 20
    length = (2 * math.pi, 4 * math.pi, 2 * math.pi)
    p = S.make_params(nu, dt, length, drag=mu, forcing_amplitude=amp, forcing_wavenumber=n_f)
    ops = _single((8, 16, 8))
    u = np.asarray(
        jax.jit(lambda v: S3.to_physical(S3.advance(S3.to_state(v, p, ops), p, ops, steps), ops))(
            np.zeros((3, 8, 16, 8))
        )
    )
    k = 2 * math.pi * n_f / length[1]
    lam = nu * k * k + mu
    y = np.arange(16) * length[1] / 16
    ux = amp / lam * (1 - math.exp(-lam * dt * steps)) * np.sin(k * y)
    assert np.abs(u[0] - ux[None, :, None]).max() < 1e-8 * np.abs(ux).max()
    assert np.abs(u[1:]).max() < 1e-14


def _program(p, ops, steps, comm):
    def run(u):
        st = S3.advance(S3.to_state(u, p, ops), p, ops, steps)
        return S3.to_physical(st, ops), S3.diagnostics(st, p, ops, comm)

    return run


def _run_on(engine, mesh, u0, p, steps):
    plan, ops = F.make_ops(engine, SHAPE, mesh, real=True)
    spec = plan.spec(False, 1)
    if engine == "single":
        out, d = jax.jit(_program(p, ops, steps, None))(u0)
    elif engine == "sharded":
        x = jax.device_put(u0, NamedSharding(F.device_mesh(plan.mesh), spec))
        out, d = jax.jit(_program(p, ops, steps, None))(x)
    elif engine == "shard_map":
        fn = jax.shard_map(
            _program(p, ops, steps, F.grid_comm(plan, engine)),
            mesh=F.device_mesh(plan.mesh),
            in_specs=spec,
            out_specs=(spec, P()),
            check_vma=False,  # sums over every mesh axis meet blocks constant along size-1 axes
        )
        out, d = jax.jit(fn)(u0)
    else:
        fn = jax.pmap(_program(p, ops, steps, F.grid_comm(plan, engine)), axis_name=F.PMAP_AXIS)
        blocks, d = fn(F.split_blocks(u0, plan, False))
        out = F.join_blocks(blocks, plan, False)
        d = jax.tree.map(lambda v: v[0], d)
    return np.asarray(out), {k: np.asarray(v) for k, v in d.items()}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(8,), (2, 4)], ids=["8-slab", "2x4-pencil"])
def test_every_engine_equals_single(mesh):
    p = S.make_params(0.02, 0.05, CUBE, drag=0.05, forcing_amplitude=0.5, forcing_wavenumber=1)
    u0 = _mixed()
    ref, dref = _run_on("single", (1,), u0, p, 3)
    assert np.abs(ref - u0).max() > 1e-3
    for engine in ("pmap", "shard_map", "sharded"):
        out, d = _run_on(engine, mesh, u0, p, 3)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12 * np.abs(ref).max(), err_msg=engine)
        for k, v in dref.items():
            np.testing.assert_allclose(d[k], v, rtol=1e-12, atol=1e-14, err_msg=f"{engine} {k}")


def test_bad_input():
    p2 = S.make_params(0.1, 0.1)
    with pytest.raises(ConfigError, match="grid.length.*3 box sizes"):
        S3.step(jnp.zeros((3, 8, 8, 5), jnp.complex128), p2, _single((8, 8, 8)))
    p3 = S.make_params(0.1, 0.1, CUBE)
    with pytest.raises(ConfigError, match="grid.shape.*3-D"):
        S3.step(jnp.zeros((3, 8, 5), jnp.complex128), p3, _single((8, 8)))
    with pytest.raises(ConfigError, match="grid.length.*2 box sizes"):
        S.step(jnp.zeros((8, 5), jnp.complex128), p3, _single((8, 8)))
    with pytest.raises(ConfigError, match="physics.scheme"):
        S3.step(jnp.zeros((3, 8, 8, 5), jnp.complex128), p3, _single((8, 8, 8)), "ab2")


def test_sharded_pencil_step_moves_only_the_transposes():
    plan, ops = F.make_ops("sharded", SHAPE, (2, 4), real=True)
    p = S.make_params(0.01, 0.02, CUBE)
    sharding = NamedSharding(F.device_mesh(plan.mesh), plan.spec(True, 1))
    u = jax.device_put(jnp.zeros((3, *plan.fourier_shape), jnp.complex128), sharding)
    n = count(jax.jit(lambda v: S3.step(v, p, ops)).lower(u).compile().as_text())
    assert n["all-to-all"] == 8 * plan.n_transposes == 16, n
    assert n["all-gather"] == n["collective-permute"] == n["all-reduce"] == 0, n
