"""Gradients through MD trajectories (``simpar.particles.differentiable``, issue 30).

References: central finite differences of the same run (float64, a 30-step horizon that
crosses neighbour rebuilds), and ``single``'s gradients for the decomposed engines (the same
trajectory bit for bit in the forward pass; the backward sums in another order: 1e-10
relative). One system serves every mesh: fcc at density 0.5, 10 x 5 x 3 cells (600 atoms,
box 20 x 10 x 6, jittered), LJ cut at 2.0, skin 0.3, dt 0.01, T 1.5: the sub-boxes of (2, 4),
(2, 2, 2) and (8,) are thicker than cutoff + skin, atoms migrate.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.errors import SimulationError
from simpar.particles import differentiable as D
from simpar.particles import error_codes, lattice, potentials
from simpar.particles import space as sp

STEPS, DT = 30, 0.01


def _system():
    r, box = lattice.cubic_lattice("fcc", 0.5, (10, 5, 3))
    # jittered: on the lattice second neighbours sit exactly at the cutoff (2.0), where the
    # truncated energy jumps and finite differences of the positions would see the jump
    r = r + 0.05 * jax.random.normal(jax.random.PRNGKey(4), r.shape, r.dtype)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(1), r.shape[0], 1.5)
    return sp.periodic(box), r, v


def _loss(traj, w):
    """Every output of the run: kinetic energies, final pair energy, virial, velocities."""
    return (jnp.mean(traj.kinetic) + traj.e_pair + 0.1 * traj.virial
            + jnp.sum(w * traj.velocity))  # fmt: skip


def _grads(engine, mesh, pot, ensemble="nve", checkpoint=10):
    spc, r, v = _system()
    w = jax.random.normal(jax.random.PRNGKey(2), r.shape, r.dtype)
    run = D.rollout(engine, spc, pot, r, v, n_steps=STEPS, dt=DT, mesh=mesh, ensemble=ensemble,
                    kt=1.5, gamma=1.0, checkpoint=checkpoint)  # fmt: skip

    def loss(p, x, u):
        t = run(p, x, u)
        return _loss(t, w), t

    vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (val, traj), g = vg(pot, r, v)
    D.check(traj)
    return {"value": val, "traj": traj, "grads": g, "run": run, "loss": loss, "r": r, "v": v,
            "vg": vg}


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.fixture(scope="module")
def single_nve():
    return _grads("single", (1,), potentials.lennard_jones(cutoff=2.0))


def test_single_gradient_equals_central_differences(single_nve):
    """d loss / d (epsilon, sigma) and the derivative along a random direction of the initial
    positions and velocities (reverse mode) equal central differences of the same compiled
    run; the run crosses neighbour rebuilds."""
    ref, pot = single_nve, potentials.lennard_jones(cutoff=2.0)
    assert int(ref["traj"].builds) >= 3, int(ref["traj"].builds)

    def f(p, x, u):  # the compiled value_and_grad, its value
        return float(ref["vg"](p, x, u)[0][0])

    for name in ("epsilon", "sigma"):
        h = 1e-6
        up, dn = _set(pot, name, pot.params[name] + h), _set(pot, name, pot.params[name] - h)
        fd = (f(up, ref["r"], ref["v"]) - f(dn, ref["r"], ref["v"])) / (2 * h)
        assert _rel(ref["grads"][0].params[name], fd) < 1e-6, (name, fd)
    dx, dv = (jax.random.normal(k, ref["r"].shape, ref["r"].dtype)
              for k in jax.random.split(jax.random.PRNGKey(3)))  # fmt: skip
    h = 1e-7
    fd = (f(pot, ref["r"] + h * dx, ref["v"] + h * dv)
          - f(pot, ref["r"] - h * dx, ref["v"] - h * dv)) / (2 * h)  # fmt: skip
    rev = jnp.sum(ref["grads"][1] * dx) + jnp.sum(ref["grads"][2] * dv)
    assert _rel(rev, fd) < 1e-6, (rev, fd)


@pytest.mark.slow
def test_forward_mode_equals_reverse_mode(single_nve):
    """``jax.jvp`` of the run along a direction of (epsilon, x0, v0) equals the reverse-mode
    gradient's projection."""
    ref, pot = single_nve, potentials.lennard_jones(cutoff=2.0)
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    dx, dv = (jax.random.normal(k, ref["r"].shape, ref["r"].dtype) for k in (k1, k2))
    dp = jax.tree.map(jnp.zeros_like, pot)
    dp = _set(dp, "epsilon", jnp.asarray(0.3, ref["r"].dtype))
    f = jax.jit(lambda p, x, u: ref["loss"](p, x, u)[0])
    _, tangent = jax.jvp(f, (pot, ref["r"], ref["v"]), (dp, dx, dv))
    g = ref["grads"]
    rev = 0.3 * g[0].params["epsilon"] + jnp.sum(g[1] * dx) + jnp.sum(g[2] * dv)
    assert _rel(tangent, rev) < 1e-10, (tangent, rev)


@pytest.mark.slow
def test_checkpointing_changes_nothing(single_nve):
    """Rematerialised chunks (``checkpoint``) give the gradients of the plain scan."""
    plain = _grads("single", (1,), potentials.lennard_jones(cutoff=2.0), checkpoint=None)
    for a, b in zip(jax.tree.leaves(plain["grads"]), jax.tree.leaves(single_nve["grads"]),
                    strict=True):  # fmt: skip
        assert _rel(a, b) < 1e-12


def _set(pot, name, value):
    return dataclasses.replace(pot, params={**pot.params, name: value})


def _user_energy(r2, p):
    """A soft user potential a / r^4 - b / r^2 (``potentials.pair``)."""
    inv = 1.0 / r2
    return p["a"] * inv * inv - p["b"] * inv


@pytest.mark.slow
@pytest.mark.parametrize(
    "pot",
    [potentials.morse(d0=1.0, alpha=3.0, r0=1.1, cutoff=2.0),
     potentials.pair(_user_energy, 2.0, {"a": 1.0, "b": 1.0}, shift=True)],
    ids=["morse", "user"],
)
def test_other_potentials_match_differences(pot):
    """Morse and a user's ``potentials.pair`` (forces by autodiff): parameter gradients of
    a Langevin run (noise fixed by the key) equal central differences."""
    ref = _grads("single", (1,), pot, ensemble="langevin")
    f = jax.jit(lambda p: ref["loss"](p, ref["r"], ref["v"])[0])
    for name, x in pot.params.items():
        h = 1e-6 * max(1.0, abs(float(x)))
        fd = (f(_set(pot, name, x + h)) - f(_set(pot, name, x - h))) / (2 * h)
        assert _rel(ref["grads"][0].params[name], fd) < 1e-6, (name, fd)


def _compare(single, engine, mesh, ensemble="nve"):
    dec = _grads(engine, mesh, potentials.lennard_jones(cutoff=2.0), ensemble=ensemble)
    assert float(dec["value"]) == pytest.approx(float(single["value"]), rel=1e-13)
    assert int(dec["traj"].builds) == int(single["traj"].builds)
    for a, b in zip(jax.tree.leaves(dec["grads"]), jax.tree.leaves(single["grads"]), strict=True):
        assert _rel(a, b) < 1e-10


@pytest.mark.slow
def test_shard_map_gradients_equal_single(single_nve):
    """shard_map (2, 2, 2): ghosts on three axes, migration, the same gradients."""
    _compare(single_nve, "shard_map", (2, 2, 2))


@pytest.mark.slow
@pytest.mark.parametrize("engine,mesh", [("pmap", (2, 4))])
def test_decomposed_gradients_equal_single(single_nve, engine, mesh):
    _compare(single_nve, engine, mesh)


@pytest.mark.slow
def test_decomposed_langevin_gradients_equal_single():
    """Langevin (noise drawn for every atom from the replicated key, picked by id) on
    shard_map (8,): the same gradients as single's Langevin run."""
    single = _grads("single", (1,), potentials.lennard_jones(cutoff=2.0), ensemble="langevin")
    _compare(single, "shard_map", (8,), ensemble="langevin")


def test_overflow_inside_a_differentiated_run_is_reported(single_nve):
    """A run sized for cutoff 2.0 called with cutoff 3.0 (its lists would miss pairs) and
    one called from compressed positions (more neighbours per atom than the list holds):
    the error bits are set, value and gradients are NaN, ``check`` and
    ``value_and_grad`` raise; never a silent wrong gradient."""
    ref = single_nve
    pot = potentials.lennard_jones(cutoff=2.0)
    big = dataclasses.replace(pot, cutoff=jnp.asarray(3.0, ref["r"].dtype))
    dense = ref["r"] * 0.6  # the same box, atoms in 0.2 of its volume
    for p, r in ((big, ref["r"]), (pot, dense)):
        (val, traj), g = ref["vg"](p, r, ref["v"])
        assert int(traj.error) & error_codes.NEIGHBORS, int(traj.error)
        assert np.isnan(float(val)) and np.isnan(float(g[0].params["epsilon"]))
        assert np.all(np.isnan(np.asarray(g[1])))
        with pytest.raises(SimulationError, match="neighbo"):
            D.check(traj)


def test_value_and_grad_raises_on_error_bits():
    """``differentiable.value_and_grad`` raises the decoded error of the trajectory."""
    z = jnp.zeros(3)
    bad = D.Trajectory(z, z, z, z[0], z[0], jnp.int32(error_codes.GHOSTS), jnp.int32(1))

    def loss(x):
        return 2.0 * x, bad

    with pytest.raises(SimulationError, match="ghost"):
        D.value_and_grad(loss)(1.0)
    assert D.value_and_grad(lambda x: (2.0 * x, bad._replace(error=jnp.int32(0))))(1.0)[1] == 2.0


@pytest.mark.slow
def test_reused_capacities_give_the_same_run_bit_for_bit(single_nve):
    """``rollout(..., capacities=run.capacities)`` skips the forward sizing run and gives
    the same trajectory and gradients bit for bit: ``single`` (value and gradients) and
    shard_map (2, 2, 2) (the forward trajectory); capacities of another mesh are refused."""
    spc, r, v = _system()
    pot = potentials.lennard_jones(cutoff=2.0)
    w = jax.random.normal(jax.random.PRNGKey(2), r.shape, r.dtype)
    again = D.rollout("single", spc, pot, r, v, n_steps=STEPS, dt=DT, checkpoint=10,
                      capacities=single_nve["run"].capacities)  # fmt: skip
    assert again.capacities == single_nve["run"].capacities

    def loss(p, x, u):
        t = again(p, x, u)
        return _loss(t, w), t

    (val, traj), g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(pot, r, v)
    assert float(val) == float(single_nve["value"])
    for a, b in zip(jax.tree.leaves((traj, g)),
                    jax.tree.leaves((single_nve["traj"], single_nve["grads"])), strict=True):  # fmt: skip
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    sized = D.rollout("shard_map", spc, pot, r, v, n_steps=STEPS, dt=DT, mesh=(2, 2, 2))
    reused = D.rollout("shard_map", spc, pot, r, v, n_steps=STEPS, dt=DT, mesh=(2, 2, 2),
                       capacities=sized.capacities)  # fmt: skip
    a, b = jax.jit(sized)(pot, r, v), jax.jit(reused)(pot, r, v)
    assert int(a.error) == 0
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(ValueError, match="mesh"):
        D.rollout("shard_map", spc, pot, r, v, n_steps=STEPS, dt=DT, mesh=(8,),
                  capacities=sized.capacities)  # fmt: skip


def test_capacities_of_another_engine_kind_are_refused(single_nve):
    """A one-device list layout given to a decomposed rollout: ValueError before any run."""
    spc, r, v = _system()
    with pytest.raises(ValueError, match="DomainSpec"):
        D.rollout("shard_map", spc, potentials.lennard_jones(cutoff=2.0), r, v, n_steps=STEPS,
                  dt=DT, mesh=(2, 2, 2), capacities=single_nve["run"].capacities)  # fmt: skip
