"""Pair potentials as an open family (``potentials.pair``) and integrators as (init, step) pairs.

A user's pair energy ``e(r2, params)`` (Yukawa and WCA here; forces by JAX) is checked against
its analytic energy and force, ``jax.grad`` of the system energy is minus the force for the
built-ins and the user potentials alike, and gradients with respect to the potential's
parameters pass through the kernel and through a trajectory. The user potentials run on
``single`` and on the decomposed engines (``pmap`` and ``shard_map``, meshes (2, 4) and (8,)),
bitwise equal to ``single`` (FMA off, conftest) as LJ and Morse are (``test_md_domain``).
``integrate.nve`` / ``integrate.langevin`` in a user's ``lax.scan`` follow ``md.Simulation``
to round-off and conserve energy to O(dt^2). The README's example (section "Your own pair
potential") runs in a fresh process.
Budget: fast tier ~20 s on 2 cores; the decomposed matrix and the snippet are ``slow``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.particles import decomposed_sim, forces, integrate, lattice, md, potentials, space

ROOT = Path(__file__).resolve().parents[1]


def yukawa(r2, p):
    """Screened Coulomb ``a exp(-kappa r) / r`` (epsilon)."""
    r = jnp.sqrt(r2)
    return p["a"] * jnp.exp(-p["kappa"] * r) / r


def wca(r2, p):
    """Weeks-Chandler-Andersen: LJ lifted by epsilon, cut at 2^(1/6) sigma."""
    s6 = (p["sigma"] ** 2 / r2) ** 3
    return 4.0 * p["epsilon"] * (s6 * s6 - s6) + p["epsilon"]


def make_yukawa(cutoff=1.5, **kw):
    return potentials.pair(yukawa, cutoff, {"a": 2.0, "kappa": 1.5}, shift=True, **kw)


def make_wca():
    return potentials.pair(wca, 2.0 ** (1 / 6), {"epsilon": 1.0, "sigma": 1.0})


terms = jax.jit(potentials.pair_terms)


def test_user_potentials_match_their_formulas():
    """Energy and -u'(r)/r (from ``jax.jvp`` of the user's energy) equal the analytic ones,
    with the shift and the cutoff applied; an explicit ``force_fn`` gives the same."""
    r = np.linspace(0.8, 1.7, 91)
    e, f = terms(make_yukawa(), jnp.asarray(r * r))
    a, k, rc = 2.0, 1.5, 1.5
    inside = r < rc
    e_ref = np.where(inside, a * np.exp(-k * r) / r - a * np.exp(-k * rc) / rc, 0.0)
    f_ref = np.where(inside, a * np.exp(-k * r) * (1 + k * r) / r**3, 0.0)
    np.testing.assert_allclose(e, e_ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(f, f_ref, rtol=1e-13, atol=1e-15)

    e, f = terms(make_wca(), jnp.asarray(r * r))
    s6 = r**-6.0
    inside = r < 2.0 ** (1 / 6)
    np.testing.assert_allclose(e, np.where(inside, 4 * (s6 * s6 - s6) + 1, 0.0), atol=1e-13)
    np.testing.assert_allclose(f, np.where(inside, 24 * (2 * s6 * s6 - s6) / r**2, 0.0),
                               rtol=1e-13, atol=1e-13)  # fmt: skip

    def yukawa_force(r2, p):  # the user's own -u'(r) / r
        x = jnp.sqrt(r2)
        return p["a"] * jnp.exp(-p["kappa"] * x) * (1 + p["kappa"] * x) / (r2 * x)

    given = potentials.pair(yukawa, 1.5, {"a": 2.0, "kappa": 1.5}, force_fn=yukawa_force)
    _, f_given = terms(given, jnp.asarray(r * r))
    np.testing.assert_allclose(f_given, f_ref, rtol=1e-13, atol=1e-15)


def test_builtins_are_instances_of_the_family():
    """LJ and Morse are ``pair`` with their energies (and given forces); the forces JAX
    derives from their energies agree with the given ones; parameters read by name."""
    lj = potentials.lennard_jones(epsilon=1.2, sigma=0.9, cutoff=2.5, shift=True)
    assert (lj.kind, lj.energy_fn, lj.force_fn) == ("lj", potentials.lj_energy, potentials.lj_force)
    assert float(lj.epsilon) == 1.2 and float(potentials.morse(alpha=3.0).alpha) == 3.0
    r2 = jnp.linspace(0.7, 7.0, 200)
    for pot in (lj, potentials.morse(d0=1.0, alpha=3.0, r0=1.1, cutoff=2.5, shift=True)):
        derived = dataclasses.replace(pot, force_fn=None)
        for a, b in zip(terms(pot, r2), terms(derived, r2), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(AttributeError, match=r"\('yukawa'\) has no attribute 'epsilon'"):
        _ = make_yukawa().epsilon


def _box(cells=(3, 3, 3), seed=0):
    """A jiggled fcc box (108 atoms at density 0.8442, edge 5.04 sigma) and an all-pairs table."""
    r, box = lattice.cubic_lattice("fcc", 0.8442, cells)
    r = r + 0.05 * jax.random.normal(jax.random.PRNGKey(seed), r.shape, r.dtype)
    return r, space.periodic(box), forces.all_pairs(r.shape[0])


@pytest.mark.parametrize(
    "pot",
    [
        potentials.lennard_jones(cutoff=2.5),
        potentials.morse(d0=1.0, alpha=3.0, r0=1.1, cutoff=2.5, shift=True),
        make_yukawa(2.5),
        make_wca(),
    ],
    ids=lambda p: p.kind,
)
def test_grad_of_energy_is_minus_force(pot):
    r, spc, idx = _box()

    @jax.jit
    def both(x, pot):
        energy = lambda x: forces.pair_forces(pot, spc, x, idx)[1]  # noqa: E731
        return forces.pair_forces(pot, spc, x, idx), jax.grad(energy)(x)

    (f, e, _), grad = both(r, pot)
    scale = float(jnp.max(jnp.abs(f)))
    assert scale > 0.1 and np.isfinite(float(e))
    np.testing.assert_allclose(grad, -f, rtol=0, atol=1e-12 * scale)


def test_grad_through_parameters():
    """The parameters are leaves: d(energy)/d(epsilon) = energy / epsilon for LJ (shifted or
    not), and d(final position)/d(kappa) through 10 Yukawa steps of a user's ``lax.scan``
    matches a central difference."""
    r, spc, idx = _box()
    for shift in (False, True):
        pot = potentials.lennard_jones(epsilon=1.3, cutoff=2.5, shift=shift)
        # jitted: one program per case (op by op, this loop compiled ~50 small programs)
        e, g = jax.jit(jax.value_and_grad(lambda p: forces.pair_forces(p, spc, r, idx)[1]))(pot)
        assert float(g.params["epsilon"]) == pytest.approx(float(e) / 1.3, rel=1e-13)

    r, spc, idx = _box(cells=(2, 2, 2))  # 32 atoms, edge 3.36
    init, step = integrate.nve(_force_fn(spc, idx), 0.005, functools.partial(space.wrap, spc))
    v = jnp.zeros_like(r)

    @jax.jit
    def final_x(kappa):
        pot = potentials.pair(yukawa, 1.6, {"a": 2.0, "kappa": kappa}, shift=True)
        s = init(r, v, pot=pot)
        s, _ = jax.lax.scan(lambda s, _: (step(s, pot=pot), None), s, length=10)
        return jnp.sum(s.position[:, 0] * jnp.arange(r.shape[0]))  # a weighted probe

    g = jax.jit(jax.grad(final_x))(1.5)
    h = 1e-5
    fd = (final_x(1.5 + h) - final_x(1.5 - h)) / (2 * h)
    assert float(g) == pytest.approx(float(fd), rel=1e-6) and abs(float(g)) > 1e-6


def _force_fn(spc, idx):
    def force(r, pot):
        return forces.pair_forces(pot, spc, r, idx, energy=False)

    return force


@pytest.mark.parametrize("ensemble", ["nve", "langevin"])
def test_integrator_pairs_follow_simpar(ensemble):
    """A user's ``lax.scan`` over ``integrate.nve`` / ``integrate.langevin`` (all pairs, same
    potential, same key) follows ``md.Simulation`` (neighbour list) to round-off: NVE with
    the user's Yukawa (forces by JAX), Langevin with LJ."""
    r, box = lattice.cubic_lattice("fcc", 0.8442, (4, 4, 4))  # 256 atoms, edge 6.72
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(1), r.shape[0], 1.44)
    pot = make_yukawa(2.0) if ensemble == "nve" else potentials.lennard_jones(cutoff=2.5)
    spc, n = space.periodic(box), 100
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, ensemble=ensemble, kt=1.0, gamma=1.0)
    sim.advance(n)
    force_fn = _force_fn(spc, forces.all_pairs(r.shape[0]))
    shift = functools.partial(space.wrap, spc)
    if ensemble == "nve":
        init, step = integrate.nve(force_fn, 0.005, shift)
        s = jax.jit(lambda r, v, pot: init(space.wrap(spc, r), v, pot=pot))(r, v, pot)
    else:
        init, step = integrate.langevin(force_fn, 0.005, 1.0, 1.0, shift)
        s = jax.jit(  # simpar's default key
            lambda r, v, pot: init(jax.random.PRNGKey(0), space.wrap(spc, r), v, pot=pot)
        )(r, v, pot)

    @jax.jit
    def run(s, pot):
        return jax.lax.scan(lambda s, _: (step(s, pot=pot), None), s, length=n)[0]

    s = run(s, pot)
    np.testing.assert_allclose(s.position, sim.state.position, rtol=0, atol=1e-9)
    np.testing.assert_allclose(s.velocity, sim.state.velocity, rtol=0, atol=1e-9)
    np.testing.assert_allclose(s.force, sim.state.force, rtol=0, atol=1e-8)
    if ensemble == "langevin":
        np.testing.assert_array_equal(s.key, sim.state.key)


def test_nve_energy_error_scales_as_dt_squared():
    """Velocity Verlet's energy error over a fixed time (0.4 tau, WCA: smooth at its cutoff)
    falls as dt^2: the slope of log(max |E(t) - E(0)|) against log(dt) is 2."""
    r, spc, idx = _box(seed=3)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(4), r.shape[0], 1.0)
    pot = make_wca()
    init, step = integrate.nve(_force_fn(spc, idx), 0.0, functools.partial(space.wrap, spc))

    def energy(s):
        e = forces.pair_forces(pot, spc, s.position, idx)[1]
        return e + 0.5 * jnp.sum(s.mass * s.velocity**2)

    @functools.partial(jax.jit, static_argnums=1)
    def drift(dt, n):
        s = init(space.wrap(spc, r), v, pot=pot)

        def body(s, _):
            s = step(s, dt=dt, pot=pot)
            return s, energy(s)

        return jnp.max(jnp.abs(jax.lax.scan(body, s, length=n)[1] - energy(s)))

    dts = np.array([0.004, 0.002, 0.001])
    errs = np.array([float(drift(dt, int(round(0.4 / dt)))) for dt in dts])
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    assert 1.8 < slope < 2.2, (errs, slope)


def _domain_system(pot):
    """336 atoms (fcc 7 x 4 x 3 cells, 11.8 x 6.7 x 5.0 sigma) for WCA, 384 (8 x 4 x 3) for
    Yukawa cut at 1.2: sub-boxes at least cutoff + skin on (8,) and (2, 4)."""
    cells = (7, 4, 3) if pot.kind == "wca" else (8, 4, 3)
    r, box = lattice.cubic_lattice("fcc", 0.8442, cells)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(5), r.shape[0], 1.0)
    return r, v, space.periodic(box)


_SINGLE: dict = {}


def _single(kind):
    """The single-engine run (positions, velocities, forces after 2 chunks of 40 steps)."""
    if kind not in _SINGLE:
        pot = make_wca() if kind == "wca" else make_yukawa(1.2)
        r, v, spc = _domain_system(pot)
        sim = md.make_simulation(spc, pot, r, v, dt=0.005)
        sim.advance(40)
        sim.advance(40)
        _SINGLE[kind] = pot, sim.snapshot(), sim.thermo(), int(sim.nbrs.n_builds)
    return _SINGLE[kind]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "engine", "mesh"),
    # WCA on shard_map (2, 4): test_readme_example_runs_standalone
    [
        ("wca", "pmap", (8,)),
        ("wca", "pmap", (2, 4)),
        ("yukawa", "shard_map", (8,)),
        ("yukawa", "shard_map", (2, 4)),
    ],
    ids=str,
)
def test_user_potential_decomposed_equals_single(kind, engine, mesh):
    """Each user potential on both meshes, each engine with both potentials (bitwise; the
    eight combinations all passed once: 4.4 min of CPU)."""
    pot, ref, ref_th, builds = _single(kind)
    r, v, spc = _domain_system(pot)
    sim = decomposed_sim.make_domain_simulation(engine, mesh, spc, pot, r, v, dt=0.005)
    sim.advance(40)
    sim.advance(40)
    got = sim.snapshot()
    for k in ("position", "velocity", "force"):
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
    th = sim.thermo()
    for k in ("potential_energy", "total_energy", "pressure"):
        assert th[k] == pytest.approx(ref_th[k], rel=1e-10, abs=1e-12), k
    assert sim.builds == builds and sim.builds > 1 and sim.error == 0


@pytest.mark.slow
def test_readme_example_runs_standalone(tmp_path):
    """The README's example (section "Your own pair potential") in a fresh process: it sets
    x64 and 8 CPU devices itself; with FMA off (inherited XLA_FLAGS) the engines agree
    bitwise (tests/test_docs.py leaves this block to this test)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Your own pair potential") :]
    code = section[
        section.index("```python\n") + 10 : section.index("\n```", section.index("```python"))
    ]
    script = tmp_path / "user_potential.py"
    script.write_text(code + "\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "largest difference 0.0;" in out.stdout, out.stdout
