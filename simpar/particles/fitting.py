"""Fitting pair-potential parameters to equilibrium targets: Langevin samples, observables
with reweighting (DiffTRe) Jacobians, a weighted chi-square and capped Gauss-Newton steps
(issue 30, item 5: LJ epsilon and sigma fitted to LAMMPS's g(r), pressure and energy).

Contract:
  * ``langevin_samples(engine, space, pot, position, velocity, ...) -> (float[S, N, 3],
    (position, velocity))``: Langevin MD at ``kt`` on any engine (``single``, ``pmap``,
    ``shard_map``), ``equil`` steps then ``n_samples`` snapshots ``every`` steps apart; the
    last state is returned to start the next run from.
  * ``per_sample(space, pot, positions, bins, r_max) -> dict``: per sample, ``energy`` U/N,
    ``pressure_virial`` W / 3V (``sum r.f / 3V``, LAMMPS's ``compute pressure NULL virial``)
    and ``rdf`` g(r) normalised as LAMMPS's ``compute rdf`` (pair density (N - 1) / V); their
    explicit parameter derivatives (``d_obs``) and ``d_energy`` (total pair energy).
  * ``averages(samples, kt, blocks, log_w=None) -> dict``: name -> ``mean``, ``se`` (block
    standard error) and ``jac`` {param: d<O>/dparam} (the DiffTRe estimator, optionally with
    reweighting ``log_w`` of samples drawn at other parameters; the standard errors are then
    scaled by sqrt(S / ESS)).
  * ``chi_square(model, target)``, ``gauss_newton(theta, model, target, cap)``: residuals in
    units of the combined standard errors (target and samples); one Gauss-Newton step on the
    parameters, scaled so no parameter moves by more than ``cap`` (relative).
  * ``ess(log_w)``: the effective sample size of reweighted samples (decides when to resample).
  * ``lammps_target()``: the stored LAMMPS target (``data/reference/lammps_lj_target``).
  * ``fit(engine, target, start, ...)``: the loop (sample, average, step; reuse the samples
    while their reweighted ESS at the new parameters stays above ``ess_min``).

Units are LJ reduced units (sigma, epsilon, tau, m).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from simpar.particles import potentials, reweight
from simpar.particles.space import volume

PARAMS = ("epsilon", "sigma")
OBSERVABLES = ("energy", "pressure_virial", "rdf")
TARGET_DIR = Path(__file__).resolve().parents[2] / "data" / "reference" / "lammps_lj_target"


def lammps_target(path=None) -> dict:
    """The LAMMPS target: ``system`` (atoms, density, kt, epsilon, sigma, cutoff, ...) and
    observables name -> (mean, standard error): ``energy`` float[] (U/N, epsilon),
    ``pressure_virial`` float[] (epsilon / sigma^3), ``rdf`` float[50] (g at ``r``).

    Args:
      path: folder holding ``target.json`` (default the stored one).

    Returns:
      dict with ``system``, ``r`` float[K] bin centres (sigma), ``r_max``, ``bins``, ``obs``.
    """
    d = json.loads((Path(path or TARGET_DIR) / "target.json").read_text())
    obs = {
        "energy": (np.float64(d["potential_energy_per_atom"]["mean"]),
                   np.float64(d["potential_energy_per_atom"]["se"])),
        "pressure_virial": (np.float64(d["virial_pressure"]["mean"]),
                            np.float64(d["virial_pressure"]["se"])),
        "rdf": (np.asarray(d["rdf"]["g"], np.float64), np.asarray(d["rdf"]["g_se"], np.float64)),
    }  # fmt: skip
    return {"system": d["system"], "r": np.asarray(d["rdf"]["r"], np.float64),
            "r_max": float(d["rdf"]["r_max"]), "bins": int(d["rdf"]["bins"]), "obs": obs}  # fmt: skip


def langevin_samples(engine: str, space, pot, position, velocity, *, n_samples: int, every: int,
                     equil: int, kt: float, gamma: float = 1.0, dt: float = 0.005, key=None,
                     mesh=(1,), devices=None):  # fmt: skip
    """Langevin MD on ``engine`` and ``n_samples`` configurations ``every`` steps apart.

    Args:
      engine: ``"single"``, ``"pmap"`` or ``"shard_map"``; mesh, devices: the decomposed
        engines' device grid.
      space, pot: periodic space and pair potential; position, velocity: float[N, 3] start.
      n_samples, every, equil: samples, steps between them, steps before the first.
      kt, gamma, dt: thermostat temperature (epsilon), friction (1 / tau), time step (tau).
      key: raw uint32[2] noise key (default ``PRNGKey(0)``).

    Returns:
      (positions float[S, N, 3] host, (position, velocity) float[N, 3] the last state).
    """
    from simpar.parallel import mapping
    from simpar.particles import md
    from simpar.particles.decomposed_sim import make_domain_simulation

    kw = dict(dt=dt, ensemble="langevin", kt=kt, gamma=gamma, key=key)
    if mapping.kind(engine).one_device:
        sim = md.make_simulation(space, pot, position, velocity, **kw)
    else:
        sim = make_domain_simulation(engine, mesh, space, pot, position, velocity,
                                     devices=devices, **kw)  # fmt: skip
    if equil:
        sim.advance(equil)
    pos = reweight.sample(sim, n_samples, every)
    snap = sim.snapshot()
    return pos, (np.asarray(snap["position"]), np.asarray(snap["velocity"]))


def per_sample(space, pot, positions, bins: int, r_max: float, rdf=None) -> dict:
    """The fitted observables of each sample and their explicit parameter derivatives.

    Args:
      space, pot: periodic space and pair potential (``pot.params``: the fitted leaves).
      positions: float[S, N, 3] samples (sigma).
      bins, r_max: g(r) histogram (``bins`` bins on [0, r_max]).
      rdf: float[S, K] g(r) already computed for these positions (it does not depend on the
        parameters), or None.

    Returns:
      dict: ``obs`` name -> float[S] / float[S, K]; ``d_obs`` name -> pytree like
      ``pot.params`` of float[S(, K)] or None; ``e_pair`` float[S] total pair energy and
      ``d_energy`` its parameter gradients (epsilon).
    """
    positions = np.asarray(positions)
    n = positions.shape[1]
    vol = float(volume(space))
    t = reweight.pair_terms(space, pot, positions)
    if rdf is None:
        rdf = reweight.rdf(space, positions, bins, r_max)[1] * n / (n - 1)  # LAMMPS: (N-1)/V
    scale = {"energy": 1.0 / n, "pressure_virial": 1.0 / (3.0 * vol)}
    src = {"energy": "energy", "pressure_virial": "virial"}
    obs = {k: np.asarray(t[src[k]]) * s for k, s in scale.items()}
    d_obs = {k: {p: np.asarray(t["d_" + src[k]][p]) * s for p in t["d_" + src[k]]}
             for k, s in scale.items()}  # fmt: skip
    obs["rdf"], d_obs["rdf"] = np.asarray(rdf), None
    d_energy = {p: np.asarray(x) for p, x in t["d_energy"].items()}
    return {"obs": obs, "d_obs": d_obs, "e_pair": np.asarray(t["energy"]), "d_energy": d_energy}


def ess(log_w) -> float:
    """Effective sample size ``(sum w)^2 / sum w^2`` of weights ``exp(log_w)`` (float[S])."""
    lw = np.asarray(log_w, np.float64)
    w = np.exp(lw - lw.max())
    return float(w.sum() ** 2 / (w * w).sum())


def averages(samples: dict, kt: float, blocks: int = 10, log_w=None) -> dict:
    """Means, block standard errors and DiffTRe Jacobians of ``per_sample``'s observables.

    Args:
      samples: ``per_sample``'s dict; kt: temperature (epsilon); blocks: block averages.
      log_w: None (samples drawn at ``samples``' parameters) or float[S] log weights
        ``-(U_theta - U_drawn) / kt`` of samples drawn at other parameters.

    Returns:
      dict name -> {``mean``, ``se``: float[] / float[K]; ``jac``: {param: float[] / [K]}}.
      With weights the standard errors are the unweighted ones times sqrt(S / ESS).
    """
    d_energy = samples["d_energy"]
    out = {}
    for k, o in samples["obs"].items():
        o = np.asarray(o, np.float64)
        s = o.shape[0]
        mean, se = reweight.mean_se(o, blocks)
        if log_w is None:
            jac, _ = reweight.estimate(o, samples["d_obs"][k], d_energy, kt, blocks)
        else:
            lw = np.asarray(log_w, np.float64)
            w = np.exp(lw - lw.max())
            w = (w / w.sum()).reshape((-1,) + (1,) * (o.ndim - 1))
            mean = (w * o).sum(0)
            se = se * np.sqrt(s / ess(lw))
            jac = {}
            for p, du in d_energy.items():
                du = np.asarray(du, np.float64).reshape(w.shape)
                g = -((w * o * du).sum(0) - mean * (w * du).sum(0)) / kt
                if samples["d_obs"][k] is not None:
                    g = g + (w * np.asarray(samples["d_obs"][k][p])).sum(0)
                jac[p] = g
        out[k] = {"mean": mean, "se": se, "jac": jac}
    return out


def _stack(model: dict, target: dict):
    """Residual vector (model - target) / combined error and its Jacobian rows (entries
    with zero combined error, g(r) inside the core, dropped)."""
    res, err, rows = [], [], []
    for k in OBSERVABLES:
        if k not in target:
            continue
        t, t_se = (np.atleast_1d(np.asarray(x, np.float64)) for x in target[k])
        m = np.atleast_1d(np.asarray(model[k]["mean"], np.float64))
        m_se = np.atleast_1d(np.asarray(model[k]["se"], np.float64))
        res.append(m - t)
        err.append(np.hypot(t_se, m_se))
        rows.append(np.stack([np.atleast_1d(model[k]["jac"][p]) for p in PARAMS], axis=-1))
    res, err, rows = np.concatenate(res), np.concatenate(err), np.concatenate(rows)
    keep = err > 0
    return res[keep] / err[keep], rows[keep] / err[keep, None]


def chi_square(model: dict, target: dict) -> float:
    """``sum (model - target)^2 / (se_target^2 + se_model^2)`` over every observable entry
    (``target``: name -> (mean, se), e.g. ``lammps_target()["obs"]``; ``model``:
    ``averages``' dict; entries whose combined error is zero are skipped)."""
    r, _ = _stack(model, target)
    return float(r @ r)


def gauss_newton(theta, model: dict, target: dict, cap: float = 0.1):
    """One Gauss-Newton step on ``theta`` = (epsilon, sigma) for ``chi_square``.

    Args:
      theta: float[2] current (epsilon, sigma); model: ``averages`` at ``theta``;
      target: name -> (mean, se); cap: largest relative change of any parameter (the step
        is scaled down as a whole, its direction kept).

    Returns:
      float[2] the new parameters.
    """
    theta = np.asarray(theta, np.float64)
    r, j = _stack(model, target)
    step = np.linalg.lstsq(j, -r, rcond=None)[0]
    rel = np.max(np.abs(step / theta))
    if rel > cap:
        step = step * (cap / rel)
    return theta + step


def _lj(theta, cutoff):
    return potentials.lennard_jones(epsilon=float(theta[0]), sigma=float(theta[1]),
                                    cutoff=cutoff)  # fmt: skip


def fit(engine: str, target: dict, start, *, cells=(5, 5, 5), samples: int = 300,
        every: int = 20, equil: int = 1000, re_equil: int = 500, iterations: int = 7,
        blocks: int = 10, cap: float = 0.1, ess_min: float = 0.5, seed: int = 0, mesh=(1,),
        devices=None, log=None) -> dict:  # fmt: skip
    """Fit LJ (epsilon, sigma) to ``target`` by Gauss-Newton on reweighted averages.

    Each iteration averages the observables over the current samples (DiffTRe Jacobians),
    takes a capped Gauss-Newton step, and keeps the samples (reweighted) while their ESS at
    the new parameters is at least ``ess_min * samples``; otherwise it samples anew, starting
    from the last configuration (``re_equil`` steps of equilibration; ``equil`` the first time).

    Args:
      engine, mesh, devices: where the MD runs; target: ``lammps_target()``;
      start: (epsilon, sigma); cells: fcc cells (4 atoms each) at the target's density;
      samples, every: snapshots per sampling and steps between them; iterations: steps;
      blocks: block averages; cap: relative step cap; seed: noise keys; log: callable(str).

    Returns:
      dict: ``fitted`` {epsilon, sigma}, ``history`` (per iteration: loss, epsilon, sigma
      used, ess, resampled, energy, pressure_virial), ``samplings``.
    """
    import jax

    from simpar.particles.differentiable import lj_start

    sysd = target["system"]
    kt, cutoff = float(sysd["kt"]), float(sysd["cutoff"])
    space, r, v = lj_start(tuple(cells), density=float(sysd["density"]), kt=kt, seed=seed + 1)
    theta = np.asarray(start, np.float64)
    pos = drawn = rdf = None
    history, samplings = [], 0
    for it in range(iterations):
        pot = _lj(theta, cutoff)
        resample = pos is None
        if not resample:
            cur = per_sample(space, pot, pos, target["bins"], target["r_max"], rdf)
            log_w = -(cur["e_pair"] - drawn) / kt
            resample = ess(log_w) < ess_min * len(pos)
        if resample:
            key = jax.random.PRNGKey(1000 * seed + samplings)
            pos, (r, v) = langevin_samples(engine, space, pot, r, v, n_samples=samples,
                                           every=every, equil=equil if samplings == 0
                                           else re_equil, kt=kt, key=key, mesh=mesh,
                                           devices=devices)  # fmt: skip
            samplings += 1
            cur = per_sample(space, pot, pos, target["bins"], target["r_max"])
            rdf, drawn, log_w = cur["obs"]["rdf"], cur["e_pair"], None
        model = averages(cur, kt, blocks, log_w)
        loss = chi_square(model, target["obs"])
        row = {"iteration": it, "epsilon": float(theta[0]), "sigma": float(theta[1]),
               "loss": loss, "resampled": bool(resample),
               "ess": len(pos) if log_w is None else round(ess(log_w), 1),
               "energy": float(model["energy"]["mean"]),
               "pressure_virial": float(model["pressure_virial"]["mean"])}  # fmt: skip
        theta = gauss_newton(theta, model, target["obs"], cap)
        history.append(row)
        if log is not None:
            log(json.dumps(row))
    return {"fitted": {"epsilon": float(theta[0]), "sigma": float(theta[1])},
            "history": history, "samplings": samplings}  # fmt: skip
