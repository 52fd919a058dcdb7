"""Fitting LJ parameters to equilibrium targets (``simpar.particles.fitting``, issue 30 item 5).

References: a synthetic least-squares problem with a known answer (Gauss-Newton, the cap), the
DiffTRe estimator of ``reweight`` (unweighted averages), a closed-form canonical average
(reweighted samples), brute-force all-pairs sums (energy, virial, g(r) with LAMMPS's (N - 1)
normalisation) and the stored LAMMPS target (slow: one Gauss-Newton step from epsilon 0.85
on 256 atoms lands near LAMMPS's epsilon 1; 108 atoms is too small a box for the cutoff 2.5
plus the 0.3 skin). The full fit is ``experiments/fit_lj_to_lammps.py``.
"""

import jax
import numpy as np
import pytest

from simpar.particles import fitting, lattice, potentials, reweight
from simpar.particles import space as sp


def _synthetic(theta):
    """A model of two parameters: a scalar, a second scalar and a 3-vector, with Jacobians."""
    e, s = theta
    x = np.array([1.0, 1.5, 2.0])
    vals = {"energy": -e * s**2, "pressure_virial": e / s**3, "rdf": e * np.exp(-x / s)}
    jacs = {
        "energy": {"epsilon": -(s**2), "sigma": -2 * e * s},
        "pressure_virial": {"epsilon": 1 / s**3, "sigma": -3 * e / s**4},
        "rdf": {"epsilon": np.exp(-x / s), "sigma": e * x / s**2 * np.exp(-x / s)},
    }
    se = {"energy": 0.01, "pressure_virial": 0.02, "rdf": np.array([0.01, 0.0, 0.03])}
    return {k: {"mean": vals[k], "se": se[k], "jac": jacs[k]} for k in vals}


def test_gauss_newton_recovers_a_known_answer():
    """Exact target at (1, 1): capped steps from (0.8, 1.1) converge to it; the first step
    moves the farthest parameter by exactly the cap (10%), the direction kept."""
    true = _synthetic((1.0, 1.0))
    target = {k: (v["mean"], np.zeros_like(np.asarray(v["se"], float))) for k, v in true.items()}
    theta = np.array([0.8, 1.1])
    first = fitting.gauss_newton(theta, _synthetic(theta), target, cap=0.1)
    free = fitting.gauss_newton(theta, _synthetic(theta), target, cap=10.0)
    rel = (first - theta) / theta
    assert np.max(np.abs(rel)) == pytest.approx(0.1, rel=1e-12)
    np.testing.assert_allclose((first - theta) / np.linalg.norm(first - theta),
                               (free - theta) / np.linalg.norm(free - theta), rtol=1e-12)  # fmt: skip
    losses = []
    for _ in range(12):
        model = _synthetic(theta)
        losses.append(fitting.chi_square(model, target))
        theta = fitting.gauss_newton(theta, model, target, cap=0.1)
    np.testing.assert_allclose(theta, [1.0, 1.0], rtol=1e-10)
    assert losses[-1] < 1e-12 * losses[0]


def test_chi_square_by_hand():
    """Residuals over the combined error sqrt(se_t^2 + se_m^2); zero-error entries skipped."""
    model = _synthetic((1.0, 1.0))
    target = {
        "energy": (-0.9, 0.02),
        "rdf": (np.array([0.3, 0.2, 0.1]), np.array([0.0, 0.0, 0.04])),
    }
    x = np.exp(-np.array([1.0, 2.0]))
    want = (-1.0 + 0.9) ** 2 / (0.01**2 + 0.02**2)
    want += (x[0] - 0.3) ** 2 / 0.01**2 + (x[1] - 0.1) ** 2 / (0.03**2 + 0.04**2)
    assert fitting.chi_square(model, target) == pytest.approx(want, rel=1e-12)


def test_unweighted_averages_are_reweights_estimate():
    """Means, block errors and Jacobians equal ``reweight.mean_se`` / ``reweight.estimate``;
    all-zero log weights change nothing (ESS = S)."""
    rng = np.random.default_rng(1)
    s = 200
    du = {"epsilon": rng.normal(size=s), "sigma": rng.normal(size=s)}
    obs = {"energy": du["epsilon"] * 0.3 + rng.normal(size=s), "rdf": rng.normal(size=(s, 4))}
    d_obs = {"energy": {"epsilon": rng.normal(size=s), "sigma": rng.normal(size=s)}, "rdf": None}
    samples = {"obs": obs, "d_obs": d_obs, "d_energy": du}
    a = fitting.averages(samples, 1.44, 10)
    b = fitting.averages(samples, 1.44, 10, log_w=np.full(s, -3.0))
    assert fitting.ess(np.zeros(s)) == pytest.approx(s)
    for k in obs:
        g, _ = reweight.estimate(obs[k], d_obs[k], du, 1.44, 10)
        m, e = reweight.mean_se(obs[k], 10)
        np.testing.assert_allclose(a[k]["mean"], m, rtol=1e-14)
        np.testing.assert_allclose(a[k]["se"], e, rtol=1e-14)
        for p in du:
            np.testing.assert_allclose(a[k]["jac"][p], g[p], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(b[k]["jac"][p], g[p], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(b[k]["mean"], m, rtol=1e-12, atol=1e-14)


def test_reweighted_averages_match_a_closed_form():
    """U = theta x^2 / 2 at kT = 1, samples drawn at theta 2, reweighted to 2.2:
    <x^2> = 1 / theta and d<x^2>/dtheta = -1 / theta^2 within 4 standard errors."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, np.sqrt(1 / 2.0), 100_000)
    theta = 2.2
    log_w = -(theta - 2.0) * x**2 / 2
    samples = {"obs": {"energy": x**2}, "d_obs": {"energy": None}, "d_energy": {"t": x**2 / 2}}
    a = fitting.averages(samples, 1.0, 20, log_w=log_w)["energy"]
    assert abs(a["mean"] - 1 / theta) < 4 * a["se"]
    assert abs(a["jac"]["t"] + 1 / theta**2) < 0.02 / theta**2
    assert 0.9 * len(x) < fitting.ess(log_w) < len(x)


def test_per_sample_against_brute_force():
    """U/N, W/3V and g(r) of two 108-atom samples equal all-pairs sums (g normalised with
    (N - 1) / V as LAMMPS); the explicit epsilon derivatives are value / epsilon."""
    r, box = lattice.cubic_lattice("fcc", 0.8442, (3, 3, 3))
    r = np.asarray(r) + 0.05 * np.asarray(jax.random.normal(jax.random.PRNGKey(2), r.shape))
    pos = np.stack([r, r + 0.02 * np.sin(r)]) % np.asarray(box)
    spc = sp.periodic(box)
    eps, sig, rc = 1.2, 0.95, 2.0
    pot = potentials.lennard_jones(epsilon=eps, sigma=sig, cutoff=rc)
    out = fitting.per_sample(spc, pot, pos, bins=20, r_max=2.5)
    n, vol, L = pos.shape[1], float(np.prod(box)), np.asarray(box)
    edges = np.linspace(0, 2.5, 21)
    shell = 4 / 3 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    for k, x in enumerate(pos):
        d = x[:, None] - x[None]
        d -= L * np.round(d / L)
        d2 = np.sum(d * d, -1)[np.triu_indices(n, 1)]
        near = d2 < rc * rc
        sr6 = (sig * sig / d2[near]) ** 3
        u = np.sum(4 * eps * (sr6 * sr6 - sr6))
        w = np.sum(24 * eps * (2 * sr6 * sr6 - sr6))  # r . f
        g = 2 * np.histogram(np.sqrt(d2), edges)[0] / (n * (n - 1) / vol * shell)
        assert out["obs"]["energy"][k] == pytest.approx(u / n, rel=1e-12)
        assert out["obs"]["pressure_virial"][k] == pytest.approx(w / (3 * vol), rel=1e-12)
        np.testing.assert_allclose(out["obs"]["rdf"][k], g, rtol=1e-12)
        assert out["e_pair"][k] == pytest.approx(u, rel=1e-12)
    for k in ("energy", "pressure_virial"):
        np.testing.assert_allclose(out["d_obs"][k]["epsilon"], out["obs"][k] / eps, rtol=1e-12)
    assert out["d_obs"]["rdf"] is None


def test_lammps_target_is_self_consistent():
    """The stored target: P = rho kT_measured + P_virial within errors; U/N and the virial
    pressure are the figures of the README; g(r) has LAMMPS's 50 bins to 2.5."""
    t = fitting.lammps_target()
    assert t["system"]["atoms"] == 500 and t["system"]["kt"] == 1.44
    assert t["obs"]["energy"][0] == pytest.approx(-4.9227, abs=1e-4)
    assert t["obs"]["pressure_virial"][0] == pytest.approx(3.672, abs=1e-3)
    assert t["bins"] == 50 and t["r_max"] == 2.5 and t["obs"]["rdf"][0].shape == (50,)
    import json

    raw = json.loads((fitting.TARGET_DIR / "target.json").read_text())
    p = raw["pressure"]["mean"]
    kin = 0.8442 * raw["temperature"]["mean"] * (1 - 1 / 500)  # LAMMPS: 3N - 3 dof
    assert abs(p - kin - t["obs"]["pressure_virial"][0]) < 3 * raw["pressure"]["se"]


@pytest.mark.slow
def test_one_gauss_newton_step_on_256_atoms():
    """256 atoms (g(r), U/N, W/3V close to 500's): from epsilon 0.85 (sigma 1), one step
    (cap 30%) on 150 samples moves epsilon to within a third of its error, sigma stays."""
    t = fitting.lammps_target()
    res = fitting.fit("single", t, (0.85, 1.0), cells=(4, 4, 4), samples=150, every=10,
                      equil=1000, iterations=1, cap=0.3, seed=3)  # fmt: skip
    eps, sig = res["fitted"]["epsilon"], res["fitted"]["sigma"]
    assert abs(eps - 1) < 0.05, res
    assert abs(sig - 1) < 0.01, res
