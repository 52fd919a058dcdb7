"""The engines from Python: a placed state can be reused, and place -> advance -> gather
composes with ``jax.grad``, ``jax.vmap`` and ``jax.jit`` on every engine.

Gradients are checked against central finite differences in float64 on a 16x16 heat problem
(4 steps, halo 2): the scheme is linear in the field, so the loss is quadratic in it and the
difference quotient is exact up to round-off; in the diffusivity it is a polynomial, and a
relative step of 1e-5 leaves a truncation error far below the 1e-6 tolerance.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.grid import heat
from simpar.grid.boundary import Dirichlet, Neumann
from simpar.grid.domain import Domain
from simpar.parallel.blocks import DonatedStateError
from simpar.parallel.engines import make_engine
from simpar.parallel.ensemble import make_ensemble_engine

SHAPE = (16, 16)
CASES = [("single", None), ("pmap", (2, 4)), ("shard_map", (2, 4)), ("sharded", (4, 2))]


def _problem():
    dom = Domain(SHAPE, (1.0, 1.0), "float64")
    model = heat.make_model(2, ((Neumann(), Neumann()), (Dirichlet(0.0), Dirichlet(1.0))))
    params = heat.make_params(dom, 1.0, 2e-4)
    u0 = np.random.default_rng(0).random(SHAPE)
    return model, params, u0


@pytest.mark.parametrize(  # fast tier: single and sharded; every engine in the full suite
    "engine,mesh",
    [
        c if c[0] in ("single", "sharded") else pytest.param(*c, marks=pytest.mark.slow)
        for c in CASES
    ],
    ids=[c[0] for c in CASES],
)
def test_reused_state_gives_the_same_result_twice(engine, mesh):
    model, params, u0 = _problem()
    e = make_engine(engine, model, SHAPE, mesh, 2)
    st = e.place({"u": u0})
    first = e.gather(e.advance(st, params, 5))["u"]
    second = e.gather(e.advance(st, params, 5))["u"]  # the same placed state again
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(e.gather(st)["u"], u0)  # the input is untouched
    # asked for, donation consumes the input (the driver's memory saving)
    out = e.advance(st, params, 5, donate=True)
    assert st["u"].is_deleted()
    np.testing.assert_array_equal(e.gather(out)["u"], first)


def _ensemble_engine(engine, mesh):
    """Two members, each on ``mesh`` (or vmapped on one device), and their parameters."""
    model, params, u0 = _problem()
    e = make_ensemble_engine(engine, model, SHAPE, 2, mesh, 2)
    p2 = jax.tree.map(lambda p: jnp.stack([p, 2 * p]), params)
    return e, p2, np.stack([u0, 1 - u0])


@pytest.mark.parametrize(
    "ensemble", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["engine", "ensemble"]
)
@pytest.mark.parametrize("engine,mesh", CASES, ids=[c[0] for c in CASES])
def test_reusing_a_donated_state_raises_a_python_error(engine, mesh, ensemble):
    # JAX has killed the interpreter (segmentation fault) on a reused donated buffer under
    # pmap, shard_map and sharded: every engine checks its input first
    if ensemble:
        e, params, u0 = _ensemble_engine(engine, mesh if engine == "single" else (2, 2))
    else:
        model, params, u0 = _problem()
        e = make_engine(engine, model, SHAPE, mesh, 2)
    st = e.place({"u": u0})
    kept = e.gather(e.advance(st, params, 3))["u"]
    out = e.advance(st, params, 3, donate=True)
    assert st["u"].is_deleted()
    calls = {
        "advance": lambda: e.advance(st, params, 3),
        "donating advance": lambda: e.advance(st, params, 3, donate=True),
        "observe": lambda: e.observe(st, params),
        "gather": lambda: e.gather(st),
        "place": lambda: e.place(st),
    }
    for what, call in calls.items():
        with pytest.raises(DonatedStateError, match=r"donate=True") as err:
            call()
        assert f"{engine} engine" in str(err.value), what
    # the result of the donating call is valid and equals the non-donating one
    np.testing.assert_array_equal(e.gather(out)["u"], kept)
    e.observe(out, params)


def _loss(e, params):
    def loss(u, diffusivity):
        p = dict(params, diffusivity=diffusivity)
        v = e.gather(e.advance(e.place({"u": u}), p, 4))["u"]
        return jnp.sum(v**2 * jnp.linspace(0.5, 1.5, v.size).reshape(v.shape))

    return loss


@pytest.mark.slow
def test_grad_vmap_jit_through_place_advance_gather_on_every_engine():
    model, params, u0 = _problem()
    D = params["diffusivity"]
    direction = np.random.default_rng(1).standard_normal(SHAPE)
    grads = {}
    for engine, mesh in CASES:
        e = make_engine(engine, model, SHAPE, mesh, 2)
        loss = _loss(e, params)
        gu, gD = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(u0), D)
        gu = np.asarray(gu)
        # central differences: along a random direction in the field, and in D
        h = 1e-4
        fd_u = (loss(u0 + h * direction, D) - loss(u0 - h * direction, D)) / (2 * h)
        np.testing.assert_allclose(np.vdot(gu, direction), fd_u, rtol=1e-6, err_msg=engine)
        hD = 1e-5 * float(D)
        fd_D = (loss(u0, D + hD) - loss(u0, D - hD)) / (2 * hD)
        np.testing.assert_allclose(float(gD), float(fd_D), rtol=1e-6, err_msg=engine)
        # vmap of the loss (under jit) equals the loss of each member (evaluated eagerly)
        batch = np.stack([u0, 2 * u0, u0 + direction])
        vm = jax.jit(jax.vmap(loss, in_axes=(0, None)))(jnp.asarray(batch), D)
        one = [float(loss(b, D)) for b in batch]
        np.testing.assert_allclose(np.asarray(vm), one, rtol=1e-13, err_msg=engine)
        grads[engine] = (gu, float(gD))
    ref_u, ref_D = grads["single"]
    for engine, (gu, gD) in grads.items():
        np.testing.assert_allclose(gu, ref_u, rtol=1e-12, atol=1e-14, err_msg=engine)
        np.testing.assert_allclose(gD, ref_D, rtol=1e-12, err_msg=engine)
