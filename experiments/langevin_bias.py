"""Measurement: the temperature bias of simpar's BAOAB Langevin integrator against dt.

What it shows (issue 17, item 10): an lj_melt-like Lennard-Jones liquid (fcc start at density
0.8442, cutoff 2.5 unshifted, float64; 4,000 atoms by default, ``--atoms`` 500, 864, 1372,
2048, ... for smaller) held at T = 1.0 by BAOAB (``integrate.langevin``) with the default friction of the
config (``integrator.gamma = 1.0`` per tau), run at several time steps. For each dt it reports
the mean of five temperature estimators, each with a standard error from block averages:

* ``kinetic``: ``2 KE / (3N - 3)`` from the full-step velocities, the ``temperature`` that
  simpar reports (LAMMPS's 3N - 3 degrees of freedom). Langevin noise does not conserve the
  total momentum, so even an exact integrator gives ``T * N / (N - 1)`` here: that, not T, is
  the dt -> 0 value the bias is measured against (``t_expected``).
* ``kinetic_post_o``: the same formula applied to the velocities right after the O
  (Ornstein-Uhlenbeck) stage, ``v - (dt / 2) f / m`` from the stored state (BAOAB's "half
  step" velocities; exact for a harmonic oscillator, Leimkuhler & Matthews 2013).
* ``kinetic_pre_o``: the velocities right before the next O stage, ``v + (dt / 2) f / m``.
* ``configurational``: ``<|grad U|^2> / <lap U>`` (no momenta involved). The Laplacian of
  the LJ pair term is ``2 (u'' + 2 u' / r) = 2 (528 r^-14 - 120 r^-8)``; the plain cut at rc
  makes the force jump there, adding ``-2 u'(rc) dNpairs/dr (rc)`` to ``lap U``, estimated
  from the pair counts in two shells below rc (linear extrapolation to rc).
* ``kinetic_minus_post_o``: the paired difference of the first two on the same samples
  (most of the kinetic-energy fluctuation cancels, so its standard error is several times
  smaller); its mean is the bias of ``kinetic`` if ``kinetic_post_o`` has none.

The standard error of each mean comes from non-overlapping blocks of ``block_tau`` tau
(default 2 tau; the JSON gives the integrated correlation time ``tau_int_kinetic_tau`` of the
kinetic temperature to compare with, 0.22-0.76 tau in the run below); the bias of each
estimator is fitted with ``bias = c * dt^2`` (weighted least squares through the origin) and
the fit's chi^2 is reported, with the harmonic-oscillator prediction for the full-step
estimator, ``c = -<|F|^2> / (12 N m)`` (``c_theory_kinetic``).

Result (``data/reference/langevin_bias_4000.json``; the command below, 566 s on 2 busy CPU
cores): the ``lj_melt`` liquid, 4,000 atoms, T = 1.0, ``gamma = 1.0``, 50 tau per dt after 10 tau
(then 2 tau per dt) of equilibration, standard errors from 25 blocks of 2 tau. The reference is
``T N / (N - 1) = 1.00025``; "paired" is ``kinetic_minus_post_o``:

    dt (tau)  steps   <T> reported  std. error  bias      bias/dt^2  paired/dt^2   <T> post-O         <T> configurational
    0.0025    20,000  0.99918       0.00130     -0.00107  -171 +- 208  -79.7 +- 1.0  0.99968 +- 0.00130  1.00084 +- 0.00146
    0.005     10,000  0.99774       0.00112     -0.00251  -100 +- 45   -81.3 +- 0.5  0.99977 +- 0.00112  1.00109 +- 0.00176
    0.0075     6,667  0.99721       0.00148     -0.00304   -54 +- 26   -80.5 +- 0.5  1.00173 +- 0.00149  1.00499 +- 0.00142
    0.01       5,000  0.99267       0.00088     -0.00758   -76 +- 9    -80.8 +- 0.3  1.00075 +- 0.00089  1.00519 +- 0.00136

Fits ``bias = c dt^2``: the reported (full-step kinetic) temperature c = -75 +- 8 (chi^2 1.2 for
3 degrees of freedom); paired c = -80.8 +- 0.2, the harmonic-oscillator prediction
``-<|F|^2> / (12 N m)`` = -80.6 for this liquid; the post-O velocities show no bias
(c = 6 +- 8); the configurational temperature reads slightly high (c = +60 +- 12): the
configurations are sampled far more accurately than the full-step velocities, but not exactly.

Recommendation: at the default dt = 0.005 the reported temperature is low by 0.2% (81 dt^2).
For a better figure use dt <= 0.0025, or compute ``2 KE(v - dt f / (2 m)) / (3N - 3)`` from a
frame's velocities and forces (``output.force = true``), which is unbiased within 8 dt^2.
``tests/test_langevin_bias.py`` (slow tier) checks the dt^2 law, the harmonic coefficient and
the unbiased post-O estimator on 500 atoms.

Run (one device; the measurement is per system, not per engine):
    python experiments/langevin_bias.py --atoms 4000 --dt 0.0025,0.005,0.0075,0.01
        --tau 50 --equil 10 --requil 2 [--out data/runs/langevin_bias.json]  # the table above
    python experiments/langevin_bias.py --atoms 500 --dt 0.005,0.01 --tau 10 --block-tau 1
On N devices the integrator is the same step (``simpar.particles.step.md_step``); the bias
does not depend on the engine.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from simpar.particles import lattice, md, potentials, space  # noqa: E402

ESTIMATORS = (
    "kinetic",
    "kinetic_post_o",
    "kinetic_pre_o",
    "configurational",
    "kinetic_minus_post_o",
)
CUTOFF = 2.5
DENSITY = 0.8442


def _fail(msg: str) -> None:
    print(f"langevin_bias.py: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _lap_pair(r2):
    """``u'' + 2 u' / r`` of the LJ pair term (epsilon = sigma = 1) at squared distance r2."""
    inv2 = 1.0 / r2
    inv8 = inv2 * inv2 * inv2 * inv2
    return inv8 * (132.0 * 4.0 * inv2 * inv2 * inv2 - 30.0 * 4.0)


def _du(r):
    """``u'(r)`` of the LJ pair term."""
    return 4.0 * (-12.0 * r**-13 + 6.0 * r**-7)


@jax.jit
def sample(box, dt, position, velocity, force, mass, idx, shell):
    """The sums behind the four estimators for one state (float64 scalars).

    Args:
      box: float[3] box edges (sigma); dt: time step (tau).
      position, velocity, force: float[N, 3]; mass: float[N].
      idx: int32[N, M] full neighbour list padded with N (each pair listed twice).
      shell: width (sigma) of the shells below rc that count pairs for the cut's delta term.

    Returns:
      (2 KE full, 2 KE post-O, 2 KE pre-O, sum |F|^2, smooth lap U, pairs in
      [rc - shell, rc), pairs in [rc - 2 shell, rc - shell)).
    """
    inv_m = (1.0 / mass)[:, None]
    half = 0.5 * dt * force * inv_m
    m = mass[:, None]
    ke2 = jnp.sum(m * velocity * velocity)
    ke2_post = jnp.sum(m * (velocity - half) ** 2)
    ke2_pre = jnp.sum(m * (velocity + half) ** 2)
    f2 = jnp.sum(force * force)
    n = position.shape[0]
    mask = idx < n
    nb = position[jnp.minimum(idx, n - 1)]
    d = position[:, None, :] - nb
    d = d - box * jnp.round(d / box)
    r2 = jnp.sum(d * d, -1)
    rc2 = CUTOFF * CUTOFF
    inside = mask & (r2 < rc2)
    lap = jnp.sum(jnp.where(inside, _lap_pair(jnp.where(inside, r2, 1.0)), 0.0))  # 2x per pair
    r = jnp.sqrt(jnp.where(mask, r2, 4 * rc2))
    n1 = 0.5 * jnp.sum(mask & (r >= CUTOFF - shell) & (r < CUTOFF))
    n2 = 0.5 * jnp.sum(mask & (r >= CUTOFF - 2 * shell) & (r < CUTOFF - shell))
    return ke2, ke2_post, ke2_pre, f2, lap, n1, n2


def tau_int(x: np.ndarray) -> float:
    """Integrated autocorrelation time of ``x`` in samples (Sokal's window, c = 6)."""
    x = np.asarray(x, float) - np.mean(x)
    n = len(x)
    f = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(f * np.conj(f))[:n]
    acf /= acf[0]
    tau = 0.5
    for w in range(1, n):
        tau += acf[w]
        if w >= 6 * tau:
            break
    return float(tau)


def block_mean(x: np.ndarray, block: int) -> tuple[float, float, int]:
    """(mean, standard error from non-overlapping blocks of ``block`` samples, blocks)."""
    nb = len(x) // block
    if nb < 2:
        raise ValueError(f"only {nb} block(s) of {block} samples; run longer")
    means = np.asarray(x[: nb * block], float).reshape(nb, block).mean(1)
    return float(means.mean()), float(means.std(ddof=1) / math.sqrt(nb)), nb


def fit_dt2(dts, bias, se) -> dict:
    """Weighted least-squares ``bias = c dt^2`` through the origin.

    Args:
      dts, bias, se: float[K] time steps (tau), measured biases and their standard errors.

    Returns:
      dict with ``c`` and its standard error ``c_se``, ``chi2`` and ``dof`` (K - 1), and
      ``residual_z`` (``(bias - c dt^2) / se`` per dt).
    """
    dts, bias, se = (np.asarray(a, float) for a in (dts, bias, se))
    x, w = dts**2, 1.0 / se**2
    c = float(np.sum(w * x * bias) / np.sum(w * x * x))
    c_se = float(1.0 / math.sqrt(np.sum(w * x * x)))
    z = (bias - c * x) / se
    return {"c": c, "c_se": c_se, "chi2": float(np.sum(z * z)), "dof": len(dts) - 1,
            "residual_z": [float(v) for v in z]}  # fmt: skip


def measure(n_atoms, dts, tau, equil, requil, gamma, kt, block_tau, seed, stride_tau, shell):
    """Run the Langevin liquid at each dt in turn; returns the JSON-ready result dict."""
    cells = round((n_atoms / 4) ** (1 / 3))
    if 4 * cells**3 != n_atoms:
        _fail(f"--atoms must be 4 k^3 (an fcc box of k^3 cells: 500, 864, 1372, ...), "
              f"got {n_atoms}")  # fmt: skip
    r, box = lattice.cubic_lattice("fcc", DENSITY, (cells,) * 3, jnp.float64)
    # start hot (T = 3, as lj_melt) so the lattice melts at once; the thermostat cools it
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(seed), n_atoms, 3.0, dtype=jnp.float64)
    spc = space.periodic(box, jnp.float64)
    pot = potentials.lennard_jones(cutoff=CUTOFF, shift=False, dtype=jnp.float64)
    t_expected = kt * n_atoms / (n_atoms - 1)  # 3N dof sampled, 3N - 3 counted
    du_rc = float(_du(CUTOFF))
    rows, state, key = [], None, jax.random.PRNGKey(seed + 1)
    for i, dt in enumerate(dts):
        t0 = time.perf_counter()
        pos, vel = (r, v) if state is None else (state.position, state.velocity)
        key, sub = jax.random.split(key)
        sim = md.make_simulation(spc, pot, pos, vel, dt=dt, ensemble="langevin", kt=kt,
                                 gamma=gamma, key=sub)  # fmt: skip
        stride = max(1, round(stride_tau / dt))
        sim.advance(round((equil if i == 0 else requil) / dt))
        n_samples = round(tau / (stride * dt))
        data = np.empty((n_samples, 7))
        for k in range(n_samples):
            sim.advance(stride)
            s = sim.state
            out = sample(box, jnp.float64(dt), s.position, s.velocity, s.force, s.mass,
                         sim.nbrs.idx, jnp.float64(shell))  # fmt: skip
            data[k] = [float(o) for o in out]
        state = sim.state
        dof = 3 * n_atoms - 3
        # the cut's delta term: -2 u'(rc) * (pairs per unit r at rc), linear extrapolation
        dens = (1.5 * data[:, 5] - 0.5 * data[:, 6]) / shell
        series = {
            "kinetic": data[:, 0] / dof,
            "kinetic_post_o": data[:, 1] / dof,
            "kinetic_pre_o": data[:, 2] / dof,
        }
        block = max(1, round(block_tau / (stride * dt)))
        row = {"dt": dt, "steps": round(tau / dt), "samples": n_samples,
               "sample_every_tau": stride * dt, "block_tau": block * stride * dt,
               "tau_int_kinetic_tau": tau_int(series["kinetic"]) * stride * dt}  # fmt: skip
        for name, x in series.items():
            mean, se, nb = block_mean(x, block)
            row[name] = {"mean": mean, "se": se, "bias": mean - t_expected}
        row["blocks"] = nb
        # paired: the full-step minus the post-O estimate of the same samples (most of the
        # kinetic-energy fluctuation cancels; its mean is the bias if post-O has none)
        diff = series["kinetic"] - series["kinetic_post_o"]
        mean, se, _ = block_mean(diff, block)
        row["kinetic_minus_post_o"] = {"mean": mean, "se": se, "bias": mean}
        row["tau_int_difference_tau"] = tau_int(diff) * stride * dt
        # ratio of means: per-block ratios, then mean and spread of the blocks (delta method)
        nb_all = n_samples // block
        f2 = data[: nb_all * block, 3].reshape(nb_all, block).mean(1)
        lap = (
            (data[: nb_all * block, 4] - 2.0 * du_rc * dens[: nb_all * block])
            .reshape(nb_all, block)
            .mean(1)
        )
        t_conf = float(f2.mean() / lap.mean())
        ratio = f2 / lap
        se_conf = float(ratio.std(ddof=1) / math.sqrt(nb_all))
        t_conf_exp = kt  # configurational: no momentum constraint involved
        row["configurational"] = {"mean": t_conf, "se": se_conf, "bias": t_conf - t_conf_exp,
                                  "cut_term_fraction": float(np.mean(2.0 * du_rc * dens)
                                                             / np.mean(data[:, 4]))}  # fmt: skip
        row["force_sq_per_atom"] = float(np.mean(data[:, 3]) / n_atoms)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(json.dumps({"dt": dt, **{k: row[k]["mean"] for k in ESTIMATORS},
                          "se": row["kinetic"]["se"], "wall_s": round(row["wall_s"], 1)}),
              file=sys.stderr, flush=True)  # fmt: skip
    # harmonic theory: full-step <v^2> = (kT / m) (1 - dt^2 w^2 / 4) with w^2 the mean
    # curvature <lap U> / (3 N m) = <|F|^2> / (3 N m kT): bias = -dt^2 <|F|^2> / (12 N m)
    f2_mean = float(np.mean([r_["force_sq_per_atom"] for r_ in rows]))
    fits = {
        name: fit_dt2(dts, [r_[name]["bias"] for r_ in rows], [r_[name]["se"] for r_ in rows])
        for name in ESTIMATORS
    }
    return {"atoms": n_atoms, "density": DENSITY, "kt": kt, "gamma": gamma, "cutoff": CUTOFF,
            "t_expected_kinetic": t_expected, "tau_per_dt": tau, "equil_tau": equil,
            "requil_tau": requil, "rows": rows, "fit": fits,
            "c_theory_kinetic": -f2_mean / 12.0}  # fmt: skip


def _floats(text: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{flag} must be comma-separated numbers, got {text!r}")
    if not vals or not all(math.isfinite(x) and x > 0 for x in vals):
        _fail(f"{flag} must be positive finite numbers, got {text!r}")
    return vals


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--atoms", type=int, default=4000, help="4 k^3 atoms (default 4000)")
    p.add_argument("--dt", default="0.0025,0.005,0.0075", help="time steps (tau), comma list")
    p.add_argument("--tau", type=float, default=100.0, help="production time per dt (tau)")
    p.add_argument("--equil", type=float, default=10.0, help="equilibration before the first dt")
    p.add_argument("--requil", type=float, default=2.0, help="re-equilibration per later dt")
    p.add_argument("--gamma", type=float, default=1.0, help="friction (1/tau), config default")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--block-tau", type=float, default=2.0, help="block length (tau)")
    p.add_argument("--sample-tau", type=float, default=0.05, help="sampling interval (tau)")
    p.add_argument("--shell", type=float, default=0.05, help="shell width at rc (sigma)")
    p.add_argument("--seed", type=int, default=2017)
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    dts = _floats(a.dt, "--dt")
    for flag, val in (("--tau", a.tau), ("--equil", a.equil), ("--requil", a.requil),
                      ("--gamma", a.gamma), ("--temperature", a.temperature),
                      ("--block-tau", a.block_tau), ("--sample-tau", a.sample_tau),
                      ("--shell", a.shell)):  # fmt: skip
        if not (math.isfinite(val) and val > 0) and not (flag == "--requil" and val == 0):
            _fail(f"{flag} must be a positive finite number, got {val}")
    if a.atoms < 32:
        _fail(f"--atoms must be at least 32, got {a.atoms}")
    t0 = time.perf_counter()
    res = measure(a.atoms, dts, a.tau, a.equil, a.requil, a.gamma, a.temperature, a.block_tau,
                  a.seed, a.sample_tau, a.shell)  # fmt: skip
    res["wall_s"] = time.perf_counter() - t0
    res["command"] = "python experiments/langevin_bias.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    text = json.dumps(res, indent=1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    print(text)
    return res


if __name__ == "__main__":
    main()
