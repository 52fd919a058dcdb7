"""Initial states: cubic lattices at a given number density and thermal velocities.

Positions follow LAMMPS ``lattice fcc|sc RHO`` + ``region box block 0 n 0 n 0 n``: the
lattice constant is ``a = (basis / RHO)**(1/3)`` (reduced units, basis = 4 for fcc, 1 for
sc) and the box edge is ``n * a``. Velocities are Maxwell-Boltzmann at temperature T with
zero total momentum, rescaled so that the kinetic temperature is exactly T with ``3N - 3``
degrees of freedom (LAMMPS ``velocity ... create T seed`` with the default ``compute temp``).
The random stream is JAX's, so the velocities differ from LAMMPS's but the temperature
and momentum constraints hold exactly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from simpar import precision
from simpar.memory import drop_compiled_if_cached, lean_jit, release_free_memory

BASIS = {
    "fcc": np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]),
    "sc": np.array([[0.0, 0.0, 0.0]]),
}


def lattice_constant(kind: str, density: float) -> float:
    """Cubic lattice constant a (sigma) for ``kind`` at number ``density`` (sigma^-3)."""
    if kind not in BASIS:
        raise ValueError(f"unknown lattice {kind!r}; choose one of {sorted(BASIS)}")
    return float((len(BASIS[kind]) / density) ** (1.0 / 3.0))


def cubic_lattice(kind: str, density: float, cells, dtype=None):
    """Atoms of an fcc or simple cubic lattice filling ``cells`` unit cells.

    Args:
      kind: ``"fcc"`` or ``"sc"``.
      density: number density (sigma^-3).
      cells: (nx, ny, nz) unit cells along each axis.
      dtype: float dtype of the result (None: JAX's default float, ``simpar.precision``).

    Returns:
      (positions float[N, 3], box float[3]) with ``N = basis * nx * ny * nz`` (sigma).
    """
    dtype = precision.resolve(dtype)
    a = lattice_constant(kind, density)
    nx, ny, nz = (int(c) for c in cells)
    grid = np.stack(
        np.meshgrid(np.arange(nx), np.arange(ny), np.arange(nz), indexing="ij"), -1
    ).reshape(-1, 1, 3)
    pos = ((grid + BASIS[kind][None]) * a).reshape(-1, 3)
    box = np.array([nx, ny, nz], np.float64) * a
    return jnp.asarray(pos, dtype), jnp.asarray(box, dtype)


def kinetic_temperature(velocity, mass, valid=None):
    """Temperature ``sum m v^2 / (3N - 3)`` of the valid particles (epsilon / k_B)."""
    v = jnp.asarray(velocity)
    valid = jnp.ones(v.shape[0], bool) if valid is None else valid
    m = jnp.broadcast_to(jnp.asarray(mass, v.dtype), valid.shape)
    n = jnp.sum(valid)
    twice_ke = jnp.sum(jnp.where(valid, m * jnp.sum(v * v, -1), 0.0))
    return twice_ke / (3 * n - 3)


def maxwell_boltzmann(key, n: int, temperature: float, mass=1.0, valid=None, dtype=None):
    """Maxwell-Boltzmann velocities, zero total momentum, temperature exactly T.

    Args:
      key: a ``jax.random`` key.
      n: number of particle slots.
      temperature: target T (epsilon / k_B), counted with 3N - 3 degrees of freedom.
      mass: scalar or float[n] masses.
      valid: bool[n] occupied slots (others get zero velocity); default all.
      dtype: float dtype (None: JAX's default float, ``simpar.precision``).

    Returns:
      float[n, 3] velocities (sigma / tau).
    """
    dtype = precision.resolve(dtype)
    mass = np.asarray(mass, dtype)
    if temperature == 0:
        return jnp.zeros((n, 3), dtype)
    # One compiled program (lean: ``simpar.memory.lean_jit``), not a dozen eager operations,
    # each of whose executables JAX would keep (~50 MB for in.lj, against ~16). The last bits
    # differ from the eager sums' (as they differ between CPU instruction sets anyway).
    v = _draw_program()(key, mass, valid, np.asarray(temperature, dtype), n, dtype)
    jax.block_until_ready(v)
    if not drop_compiled_if_cached(_draw_program()):  # reloaded from JAX's cache when on
        release_free_memory()  # the compiler's freed memory, kept by the C heap otherwise
    return v


def _draw(key, mass, valid, temperature, n: int, dtype):
    valid = jnp.ones(n, bool) if valid is None else jnp.asarray(valid, bool)
    m = jnp.broadcast_to(mass, (n,))
    v = jax.random.normal(key, (n, 3), dtype) / jnp.sqrt(m)[:, None]
    v = jnp.where(valid[:, None], v, 0.0)
    nv = jnp.sum(valid)
    p = jnp.sum(m[:, None] * v, axis=0)
    v = jnp.where(valid[:, None], v - p / (m[:, None] * nv), 0.0)
    return v * jnp.sqrt(temperature / kinetic_temperature(v, m, valid))


@functools.cache
def _draw_program():
    return lean_jit(_draw, static_argnums=(4, 5))
