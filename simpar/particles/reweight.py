"""Gradients of equilibrium averages by reweighting (DiffTRe, Thaler & Zavadlav 2021).

Backpropagating through a long chaotic trajectory is ill-conditioned (the gradient grows like
the trajectory's Lyapunov growth, ``experiments/check_md_grad.py``). For canonical averages
``<O>_theta = int O e^{-U_theta / kT} / Z`` the derivative needs no trajectory derivative:

    d<O>/dtheta = <dO/dtheta> - (<O dU/dtheta> - <O><dU/dtheta>) / kT

estimated from configurations sampled by any engine (the decomposed ones included: a
``DomainSimulation`` run with ``ensemble="langevin"``, ``snapshot()`` every few steps) and
``jax.grad`` of the pair energy of each sample with respect to the potential's parameters.

Contract:
  * ``sample(sim, n, every) -> float[S, N, 3]`` positions from any simulation with the
    driver interface (``advance``, ``snapshot``).
  * ``pair_terms(space, pot, positions, skin) -> dict`` per sample: ``energy`` float[S]
    (pair energy, epsilon), ``virial`` float[S] (epsilon), and their parameter gradients
    ``d_energy`` / ``d_virial`` (pytrees like ``pot.params`` of float[S]); one compiled
    program (a neighbour list per sample, ``lax.map`` over samples).
  * ``estimate(obs, d_obs, d_energy, kt, blocks) -> (gradient, standard_error)``: the
    estimator above for ``obs`` float[S] or float[S, K] (g(r) bins), ``d_obs`` its explicit
    parameter derivative (pytree of float[S(, K)] or None), standard errors from ``blocks``
    block averages (the samples are correlated in time).
  * ``rdf(space, positions, bins, r_max) -> (r float[K], g float[S, K])``.
  * ``mean_se(x, blocks) -> (mean, standard_error)`` of correlated samples (block averages).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from simpar.particles import error_codes, neighbors
from simpar.particles.forces import pair_forces
from simpar.particles.space import Space, displacement, volume


def sample(sim, n: int, every: int) -> np.ndarray:
    """``n`` snapshots' positions, ``every`` steps apart (host float[n, N, 3], sigma)."""
    out = []
    for _ in range(n):
        sim.advance(every)
        out.append(np.asarray(sim.snapshot()["position"]))
    return np.stack(out)


def pair_terms(space: Space, pot, positions, skin: float = 0.3) -> dict:
    """Pair energy and virial of each sample and their gradients w.r.t. ``pot.params``.

    Args:
      space: the periodic space; pot: the potential.
      positions: float[S, N, 3] samples (sigma).
      skin: neighbour-list skin (sigma); the list is sized on the first sample with
        head-room and checked on every sample.

    Returns:
      dict: ``energy``, ``virial`` float[S] (epsilon); ``d_energy``, ``d_virial``: pytrees
      like ``pot.params`` of float[S].

    Raises:
      SimulationError: a sample needs more neighbours than the list holds.
    """
    positions = jnp.asarray(positions)
    valid = jnp.ones(positions.shape[1], bool)
    spec = neighbors.size_list(space, positions[0], valid, cutoff=float(pot.cutoff),
                               skin=skin, capacity_factor=1.5)  # fmt: skip
    out = _terms(spec, space, pot, positions, valid)
    error_codes.check(int(jnp.max(out.pop("error"))), 0, "reweight.pair_terms")
    return out


@functools.partial(jax.jit, static_argnums=0)
def _terms(spec, space, pot, positions, valid):
    def energy_virial(params, r, idx):
        p = dataclasses.replace(pot, params=params)
        _, e, w = pair_forces(p, space, r, idx, block=None)
        return jnp.stack([e, w])

    def one(r):
        nb = neighbors.build(spec, space, r, valid)
        ew = energy_virial(pot.params, r, nb.idx)
        jac = jax.jacrev(energy_virial)(pot.params, r, nb.idx)
        return ew, jac, nb.error

    ew, jac, err = jax.lax.map(one, positions)
    return {"energy": ew[:, 0], "virial": ew[:, 1],
            "d_energy": jax.tree.map(lambda x: x[:, 0], jac),
            "d_virial": jax.tree.map(lambda x: x[:, 1], jac), "error": err}  # fmt: skip


def _blocked(x, blocks: int):
    """Block means of the leading axis (the trailing samples beyond a whole block dropped)."""
    x = np.asarray(x, np.float64)
    m = x.shape[0] // blocks
    return x[: m * blocks].reshape((blocks, m) + x.shape[1:]).mean(axis=1)


def mean_se(x, blocks: int = 10):
    """Mean of the leading axis of ``x`` (float[S] or float[S, K]) and its standard error
    from ``blocks`` block averages (``std(ddof=1) / sqrt(blocks)``; samples correlated in time).

    Returns:
      (mean, standard_error): float[] or float[K] each.
    """
    x = np.asarray(x, np.float64)
    return x.mean(0), _blocked(x, blocks).std(0, ddof=1) / np.sqrt(blocks)


def estimate(obs, d_obs, d_energy, kt: float, blocks: int = 10):
    """The reweighting estimate of ``d<O>/dtheta`` and its standard error.

    Args:
      obs: float[S] or float[S, K] the observable per sample.
      d_obs: None or a pytree (like ``d_energy``) of float[S(, K)]: ``dO/dtheta`` per sample.
      d_energy: pytree of float[S]: ``dU/dtheta`` per sample (``pair_terms``).
      kt: temperature (epsilon).
      blocks: block averages for the standard error (samples correlated in time).

    Returns:
      (gradient, standard_error): pytrees like ``d_energy`` of float[] or float[K].
    """
    obs = np.asarray(obs, np.float64)

    def per_block(du, do):
        du = np.asarray(du, np.float64).reshape((-1,) + (1,) * (obs.ndim - 1))
        o_b, du_b = _blocked(obs, blocks), _blocked(du, blocks)
        odu_b = _blocked(obs * du, blocks)
        # the covariance from the whole-run means inside each block's cross moment
        g = -(odu_b - o_b * du.mean(0) - obs.mean(0) * du_b + obs.mean(0) * du.mean(0)) / kt
        if do is not None:
            g = g + _blocked(do, blocks)
        return g

    leaves, tree = jax.tree.flatten(d_energy)
    dos = [None] * len(leaves) if d_obs is None else jax.tree.leaves(d_obs)
    gs = [per_block(du, do) for du, do in zip(leaves, dos, strict=True)]
    grad = [g.mean(0) for g in gs]
    err = [g.std(0, ddof=1) / np.sqrt(blocks) for g in gs]
    return jax.tree.unflatten(tree, grad), jax.tree.unflatten(tree, err)


def rdf(space: Space, positions, bins: int, r_max: float):
    """Radial distribution function of each sample (all pairs; small systems).

    Returns:
      (r float[K] bin centres (sigma), g float[S, K]).
    """
    positions = jnp.asarray(positions)
    n = positions.shape[1]
    edges = np.linspace(0.0, r_max, bins + 1)
    shell = 4.0 / 3.0 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    rho = n / float(volume(space))

    @jax.jit
    def one(r):
        d = displacement(space, r[:, None, :], r[None, :, :])
        dist = jnp.sqrt(jnp.sum(d * d, axis=-1) + jnp.eye(n) * (2 * r_max) ** 2)
        h, _ = jnp.histogram(dist.reshape(-1), bins=jnp.asarray(edges))
        return h / (n * rho * jnp.asarray(shell))

    return 0.5 * (edges[1:] + edges[:-1]), np.stack([np.asarray(one(r)) for r in positions])
