"""Periodic Poisson kernel (``simpar.grid.poisson``) on every engine, against manufactured solutions.

Spectral: exact (round-off) for a trigonometric polynomial. Discrete: the 5-/7-point stencil
applied to the solution gives the source back to 1e-12. Engines ``single``, ``pmap``,
``shard_map`` and ``sharded`` through ``simpar.parallel.fft``; float64.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from simpar.errors import ConfigError
from simpar.grid import poisson
from simpar.grid.stencils import laplacian
from simpar.parallel import fft as F
from simpar.parallel.hlo import count

TOL = 1e-12


def _manufactured(shape, lengths):
    """A zero-mean trigonometric polynomial ``phi`` and its exact Laplacian ``f``."""
    x = np.meshgrid(
        *[np.arange(n) * (L / n) for n, L in zip(shape, lengths, strict=True)], indexing="ij"
    )
    k = [2 * np.pi / L for L in lengths]
    modes = [((1, 3, 2), 1.0, 0.3), ((5, -2, 1), 0.5, 1.0), ((0, 4, -3), -0.7, 2.0)]
    phi = np.zeros(shape)
    f = np.zeros(shape)
    for m, amp, phase in modes:
        arg = sum(m[a] * k[a] * x[a] for a in range(len(shape))) + phase
        k2 = sum((m[a] * k[a]) ** 2 for a in range(len(shape)))
        phi += amp * np.cos(arg)
        f -= amp * k2 * np.cos(arg)
    return phi, f


def _both(f, dx, ops):
    return (
        poisson.solve(f, dx, "spectral", ops),
        poisson.solve(f, dx, "discrete", ops),
    )


def _solve_on(engine, shape, mesh, real, f, dx):
    """(spectral, discrete) solutions of global ``f`` under ``engine``, as global arrays."""
    plan, ops = F.make_ops(engine, shape, mesh, real)
    if engine == "single":
        return [np.asarray(p) for p in jax.jit(lambda v: _both(v, dx, ops))(f)]
    if engine == "sharded":
        x = jax.device_put(f, NamedSharding(F.device_mesh(plan.mesh), plan.spec(False)))
        return [np.asarray(p) for p in jax.jit(lambda v: _both(v, dx, ops))(x)]
    if engine == "shard_map":
        spec = plan.spec(False)
        fn = jax.shard_map(
            lambda b: _both(b, dx, ops),
            mesh=F.device_mesh(plan.mesh),
            in_specs=spec,
            out_specs=(spec, spec),
        )
        return [np.asarray(p) for p in jax.jit(fn)(f)]
    out = jax.pmap(lambda b: _both(b, dx, ops), axis_name=F.PMAP_AXIS)(
        F.split_blocks(f, plan, False)
    )
    return [F.join_blocks(p, plan, False) for p in out]


def _stencil_laplacian(phi, dx):
    d = phi.ndim
    padded = jnp.pad(phi, 1, mode="wrap")
    return np.asarray(laplacian(padded, [1.0 / h**2 for h in dx], d))


CASES = [((32, 16), (2, 4), True), ((16, 16, 8), (8,), True), ((16, 16, 8), (2, 2, 2), False)]


@pytest.mark.parametrize(
    "shape,mesh,real",
    [CASES[0], pytest.param(*CASES[1], marks=pytest.mark.slow), CASES[2]],
    ids=["2d-2x4-r2c", "3d-8-r2c", "3d-2x2x2-c2c"],
)
def test_manufactured_solution_on_every_engine(shape, mesh, real):
    lengths = (1.0, 2.0, 0.5)[: len(shape)]
    dx = [L / n for L, n in zip(lengths, shape, strict=True)]
    phi, f = _manufactured(shape, lengths)
    for engine in ("single", "pmap", "shard_map", "sharded"):
        spectral, discrete = _solve_on(engine, shape, mesh, real, f, dx)
        assert spectral.dtype == np.float64, engine
        np.testing.assert_allclose(spectral, phi, rtol=0, atol=TOL, err_msg=engine)
        # the discrete solution solves the stencil's equation exactly
        np.testing.assert_allclose(
            _stencil_laplacian(discrete, dx), f, rtol=0, atol=TOL * np.abs(f).max(), err_msg=engine
        )
        assert abs(discrete.mean()) < TOL


def test_discrete_random_source_and_dropped_mean():
    shape, dx = (24, 20), (0.1, 0.25)
    f = np.random.default_rng(1).standard_normal(shape)
    f0 = f - f.mean()
    phi = np.asarray(poisson.solve(jnp.asarray(f), dx, "discrete"))
    np.testing.assert_allclose(_stencil_laplacian(phi, dx), f0, rtol=0, atol=TOL)
    # the mean of f is dropped: the same phi as for the zero-mean source
    np.testing.assert_allclose(poisson.solve(jnp.asarray(f0), dx, "discrete"), phi, atol=TOL)
    # complex transforms on one device give the same real phi
    ops = poisson.local_ops(shape, real=False)
    np.testing.assert_allclose(poisson.solve(jnp.asarray(f), dx, "discrete", ops), phi, atol=TOL)


def test_eigenvalues_are_the_stencils():
    """The discrete symbol is the stencil applied to a Fourier mode; zero only at k = 0."""
    shape, dx = (8, 6), (0.5, 0.2)
    ops = poisson.local_ops(shape, real=False)
    lam = np.asarray(poisson.eigenvalues(ops, dx, "discrete", jnp.float64))
    x = np.meshgrid(np.arange(8), np.arange(6), indexing="ij")
    for m in [(1, 2), (3, -1), (4, 3)]:
        mode = np.exp(2j * np.pi * (m[0] * x[0] / 8 + m[1] * x[1] / 6))
        lap = _stencil_laplacian(jnp.asarray(mode), dx)
        np.testing.assert_allclose(lap, lam[m[0] % 8, m[1] % 6] * mode, atol=1e-12)
    assert np.count_nonzero(lam == 0) == 1 and lam[0, 0] == 0
    spec = np.asarray(poisson.eigenvalues(ops, dx, "spectral", jnp.float64))
    assert math.isclose(spec[1, 0], -((2 * np.pi / 4.0) ** 2))


def test_grad_through_solve():
    shape, dx = (16, 16), (1 / 16, 1 / 16)
    f = jnp.asarray(np.random.default_rng(2).standard_normal(shape))
    loss = jax.jit(lambda v: jnp.sum(poisson.solve(v, dx, "spectral") ** 3))
    g = jax.grad(loss)(f)
    v = jnp.asarray(np.random.default_rng(3).standard_normal(shape))
    h = 1e-6
    fd = (loss(f + h * v) - loss(f - h * v)) / (2 * h)
    assert abs(fd - jnp.vdot(g, v)) <= 1e-6 * abs(fd)


def test_bad_kind_and_dx():
    with pytest.raises(ConfigError, match="poisson.kind.*spectral"):
        poisson.solve(jnp.zeros((4, 4)), (1.0, 1.0), "multigrid")
    with pytest.raises(ConfigError, match="grid.dx"):
        poisson.eigenvalues(poisson.local_ops((4, 4)), (1.0,))


def test_sharded_solve_moves_only_the_transposes():
    plan, ops = F.make_ops("sharded", (32, 32, 16), (2, 4), True)
    x = jax.device_put(
        jnp.zeros(plan.shape), NamedSharding(F.device_mesh(plan.mesh), plan.spec(False))
    )
    text = jax.jit(lambda v: poisson.solve(v, (0.1, 0.1, 0.1), "discrete", ops)).lower(x)
    n = count(text.compile().as_text())
    assert n["all-to-all"] == 2 * plan.n_transposes, n
    assert n["all-gather"] == n["collective-permute"] == n["all-reduce"] == 0, n
