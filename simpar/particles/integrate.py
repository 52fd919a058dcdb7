"""Time integrators: their stages, and ``(init, step)`` function pairs (JAX-MD's ``simulate``).

Contract: ``force_fn(position, **kwargs) -> force`` computes forces (epsilon / sigma,
float[N, 3]) at positions float[N, 3] (sigma); ``shift_fn`` maps positions back into the
space (``space.wrap``; default: none). Masses are float[N] (or a scalar); ``dt`` and the
thermostat parameters are cast to the state dtype, so a float64 run never rounds ``dt`` to
float32.

* ``nve(force_fn, dt, shift_fn) -> (init, step)``: velocity Verlet, symplectic NVE
  (kick-drift-kick, one force evaluation per step).
* ``langevin(force_fn, dt, kt, gamma, shift_fn) -> (init, step)``: Langevin NVT in the BAOAB
  splitting (Leimkuhler & Matthews), with the exact Ornstein-Uhlenbeck step
  ``v <- c v + sqrt((1 - c^2) kT / m) xi``, ``c = exp(-gamma dt)``. The random key is part
  of the state: same key, same trajectory.

``step(state, **kwargs)`` is pure and jittable: a user composes it in a ``lax.scan`` of their
own. Keyword arguments ``dt`` (and ``kt``, ``gamma``) override the values given to the
factory for that step, the others are passed to ``force_fn``: pass the potential there
(``step(state, pot=pot)``) rather than closing over it, and ``jax.grad`` with respect to
its parameters (or ``dt``) passes through the run.

The stages (``verlet_drift``, ``baoab_drift``, ``noise``, ``kick``) are the ones every simpar
engine runs (``step.md_step``, which puts the neighbour rebuild and, decomposed, the atoms'
migration between the drift and the forces): a ``lax.scan`` over these pairs with the same
forces follows ``md.Simulation`` to round-off (the same key draws the same noise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

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


class NVEState(NamedTuple):
    """State of ``nve`` (a pytree).

    Attributes:
      position: float[N, 3] (sigma).
      velocity: float[N, 3] (sigma / tau).
      force: float[N, 3] (epsilon / sigma) at ``position``.
      mass: float[N] or scalar (m).
    """

    position: jax.Array
    velocity: jax.Array
    force: jax.Array
    mass: jax.Array


class LangevinState(NamedTuple):
    """State of ``langevin`` (a pytree): ``NVEState``'s fields and the random key.

    Attributes:
      position, velocity, force, mass: as ``NVEState``.
      key: ``jax.random`` key, split once per step.
    """

    position: jax.Array
    velocity: jax.Array
    force: jax.Array
    mass: jax.Array
    key: jax.Array


def _identity(x):
    return x


def _take(kwargs: dict, name: str, default, dtype):
    """``kwargs[name]`` (removed) or ``default``, as an array of ``dtype``."""
    return jnp.asarray(kwargs.pop(name, default), dtype)


def nve(force_fn: Callable, dt, shift_fn: Callable | None = None) -> tuple[Callable, Callable]:
    """Velocity Verlet (NVE) as an ``(init, step)`` pair.

    Args:
      force_fn: ``(position, **kwargs) -> force`` float[N, 3] (epsilon / sigma).
      dt: default time step (tau); ``step(state, dt=...)`` overrides it.
      shift_fn: ``position -> position`` (wrap into the box, ``space.wrap``); None: none.

    Returns:
      ``init(position, velocity, mass=1.0, **kwargs) -> NVEState`` (forces computed) and
      ``step(state, **kwargs) -> NVEState`` one step later (``kwargs``: ``dt``, the rest
      passed to ``force_fn``).
    """
    shift_fn = _identity if shift_fn is None else shift_fn

    def init(position, velocity, mass=1.0, **kwargs) -> NVEState:
        position = jnp.asarray(position)
        velocity = jnp.asarray(velocity, position.dtype)
        force = force_fn(position, **kwargs)
        return NVEState(position, velocity, force, jnp.asarray(mass, position.dtype))

    def step(state: NVEState, **kwargs) -> NVEState:
        h = _take(kwargs, "dt", dt, state.velocity.dtype)
        r, v = verlet_drift(state.position, state.velocity, state.force, state.mass, h, shift_fn)
        force = force_fn(r, **kwargs)
        return NVEState(r, kick(v, force, state.mass, h), force, state.mass)

    return init, step


def langevin(force_fn: Callable, dt, kt, gamma, shift_fn: Callable | None = None
             ) -> tuple[Callable, Callable]:  # fmt: skip
    """BAOAB Langevin (NVT) as an ``(init, step)`` pair.

    Args:
      force_fn: ``(position, **kwargs) -> force`` float[N, 3] (epsilon / sigma).
      dt: default time step (tau); kt: temperature (epsilon); gamma: friction (1 / tau);
        ``step(state, dt=..., kt=..., gamma=...)`` overrides them.
      shift_fn: ``position -> position`` (``space.wrap``); None: none.

    Returns:
      ``init(key, position, velocity, mass=1.0, **kwargs) -> LangevinState`` and
      ``step(state, **kwargs) -> LangevinState``. Each step splits the key as simpar's
      engines do (``key, sub = split(key)``; N normal triples from ``sub``), so the same key
      gives ``md.Simulation``'s noise.
    """
    shift_fn = _identity if shift_fn is None else shift_fn

    def init(key, position, velocity, mass=1.0, **kwargs) -> LangevinState:
        position = jnp.asarray(position)
        velocity = jnp.asarray(velocity, position.dtype)
        force = force_fn(position, **kwargs)
        return LangevinState(position, velocity, force, jnp.asarray(mass, position.dtype),
                             jnp.asarray(key))  # fmt: skip

    def step(state: LangevinState, **kwargs) -> LangevinState:
        dtype = state.velocity.dtype
        h, t, g = (
            _take(kwargs, k, x, dtype) for k, x in (("dt", dt), ("kt", kt), ("gamma", gamma))
        )
        key, sub = jax.random.split(state.key)
        xi = noise(sub, state.velocity.shape[0], None, dtype)
        r, v = baoab_drift(state.position, state.velocity, state.force, state.mass, h, g, t, xi,
                           shift_fn)  # fmt: skip
        force = force_fn(r, **kwargs)
        return LangevinState(r, kick(v, force, state.mass, h), force, state.mass, key)

    return init, step
