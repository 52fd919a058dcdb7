"""Time integrators as pure functions of arrays (one step each).

Contract: ``force_fn(position) -> (force, aux)`` computes forces (epsilon / sigma) for new
positions and may carry anything else in ``aux`` (neighbour list, energies); ``shift_fn``
maps positions back into the space (``space.wrap``). Masses are float[N] (or a scalar);
``dt`` and thermostat parameters are array leaves of the state dtype, so they can be swept
or differentiated and a float64 run never rounds ``dt`` to float32.

* ``velocity_verlet``: symplectic NVE (kick-drift-kick, one force evaluation per step).
* ``langevin_baoab``: Langevin NVT in the BAOAB splitting (Leimkuhler & Matthews), with
  the exact Ornstein-Uhlenbeck step ``v <- c v + sqrt((1 - c^2) kT / m) xi``,
  ``c = exp(-gamma dt)``. The random key is part of the state: same key, same trajectory.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def _inv_mass(mass, velocity):
    m = jnp.asarray(mass, velocity.dtype)
    return (1.0 / m)[..., None] if m.ndim else 1.0 / m


def kick(velocity, force, mass, dt):
    """Half kick ``v + (dt / 2) f / m`` (the last stage of both integrators)."""
    return velocity + (0.5 * dt) * force * _inv_mass(mass, velocity)


def verlet_drift(position, velocity, force, mass, dt, shift_fn):
    """The velocity-Verlet stages before the force evaluation: half kick, then drift.

    Returns:
      (position, velocity) at the drifted positions, velocity after the first half kick.
    """
    velocity = kick(velocity, force, mass, dt)
    position = shift_fn(position + dt * velocity)
    return position, velocity


def noise(key, n_draw: int, ids, dtype):
    """Standard normal Langevin noise picked by atom id, float[C, 3].

    One normal triple is drawn for each of ``n_draw`` atoms of the whole system and slot
    ``k`` takes the row of its atom ``ids[k]``, so a seed gives the same trajectory on every
    engine and mesh, whatever slot an atom sits in.

    Args:
      key: ``jax.random`` key (used once).
      n_draw: static, rows drawn (atoms in the system; slots on one device).
      ids: int32[C] global atom id per slot (-1: empty slot, gets row 0), or None when slot
        ``k`` holds atom ``k`` (then ``C == n_draw`` and no gather is done).
      dtype: float dtype of the result.
    """
    # the barrier keeps the draw one loop of its own on every engine: fused into different
    # consumers XLA:CPU may evaluate its log/erf-inverse differently (1 ulp; measured)
    draw = jax.lax.optimization_barrier(jax.random.normal(key, (n_draw, 3), dtype))
    return draw if ids is None else draw[jnp.maximum(ids, 0)]


def baoab_drift(position, velocity, force, mass, dt, gamma, kt, noise, shift_fn):
    """The BAOAB stages before the force evaluation (B, A, O, A).

    Args:
      noise: float[N, 3] standard normal numbers (one per velocity component).

    Returns:
      (position, velocity) before the force evaluation at ``position``.
    """
    inv_m = _inv_mass(mass, velocity)
    velocity = velocity + (0.5 * dt) * force * inv_m
    position = position + (0.5 * dt) * velocity
    c = jnp.exp(-gamma * dt)
    velocity = c * velocity + jnp.sqrt((1.0 - c * c) * kt * inv_m) * noise
    position = shift_fn(position + (0.5 * dt) * velocity)
    return position, velocity


def velocity_verlet(position, velocity, force, mass, dt, force_fn: Callable, shift_fn):
    """One velocity-Verlet step.

    Args:
      position, velocity, force: float[N, 3] at time t.
      mass: float[N] or scalar.
      dt: time step (tau), scalar of the state dtype.
      force_fn: ``r -> (force, aux)``.
      shift_fn: ``r -> r`` (wrap into the box).

    Returns:
      (position, velocity, force, aux) at t + dt.
    """
    position, velocity = verlet_drift(position, velocity, force, mass, dt, shift_fn)
    force, aux = force_fn(position)
    return position, kick(velocity, force, mass, dt), force, aux


def langevin_baoab(
    position, velocity, force, mass, dt, gamma, kt, key, force_fn: Callable, shift_fn
):
    """One BAOAB Langevin step at temperature ``kt`` with friction ``gamma``.

    Args:
      position, velocity, force: float[N, 3] at time t.
      mass: float[N] or scalar.
      dt: time step (tau); gamma: friction (1 / tau); kt: temperature (epsilon).
      key: ``jax.random`` key (consumed; the next key is returned).
      force_fn, shift_fn: as in ``velocity_verlet``.

    Returns:
      (position, velocity, force, aux, key) at t + dt.
    """
    key, sub = jax.random.split(key)
    xi = noise(sub, velocity.shape[0], None, velocity.dtype)
    position, velocity = baoab_drift(position, velocity, force, mass, dt, gamma, kt, xi, shift_fn)
    force, aux = force_fn(position)
    return position, kick(velocity, force, mass, dt), force, aux, key
