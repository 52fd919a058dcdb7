"""Reweighting (DiffTRe) gradients of equilibrium averages (``simpar.particles.reweight``).

References: a canonical average with a closed form (harmonic oscillator, exact samples), the
linearity of the LJ energy in epsilon, and ``experiments/difftre_check.py`` (slow: against
finite differences of long averages on shard_map 2x2x2, within standard errors).
"""

import jax
import numpy as np
import pytest

from simpar.particles import lattice, potentials, reweight
from simpar.particles import space as sp


def test_estimator_matches_a_closed_form():
    """U = theta x^2 / 2 at kT = 1: <x^2> = 1 / theta, d<x^2>/dtheta = -1 / theta^2; exact
    samples give the estimate within 4 standard errors (and the error bar is sane)."""
    theta, kt = 2.0, 1.0
    x = np.random.default_rng(0).normal(0.0, np.sqrt(kt / theta), 200_000)
    grad, err = reweight.estimate(x**2, None, {"theta": 0.5 * x**2}, kt, blocks=20)
    assert abs(grad["theta"] + 1 / theta**2) < 4 * err["theta"], (grad, err)
    assert 0 < err["theta"] < 0.02


@pytest.mark.slow
def test_pair_terms_gradients():
    """LJ energy and virial are linear in epsilon: their epsilon gradients equal value /
    epsilon; the sigma gradient of the energy equals a central difference."""
    r, box = lattice.cubic_lattice("fcc", 0.8442, (3, 3, 3))
    r = r + 0.05 * jax.random.normal(jax.random.PRNGKey(0), r.shape, r.dtype)
    pos = np.stack([np.asarray(r), np.asarray(r) + 0.01])
    spc = sp.periodic(box)
    pot = potentials.lennard_jones(epsilon=1.3, cutoff=2.0)
    t = reweight.pair_terms(spc, pot, pos)
    np.testing.assert_allclose(t["d_energy"]["epsilon"], t["energy"] / 1.3, rtol=1e-12)
    np.testing.assert_allclose(t["d_virial"]["epsilon"], t["virial"] / 1.3, rtol=1e-12)
    h = 1e-6
    up = reweight.pair_terms(spc, potentials.lennard_jones(1.3, 1 + h, cutoff=2.0), pos)
    dn = reweight.pair_terms(spc, potentials.lennard_jones(1.3, 1 - h, cutoff=2.0), pos)
    fd = (up["energy"] - dn["energy"]) / (2 * h)
    np.testing.assert_allclose(t["d_energy"]["sigma"], fd, rtol=1e-7)
