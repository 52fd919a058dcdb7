"""Thermodynamic observables in LJ reduced units, normalised per atom like LAMMPS.

LAMMPS conventions (``units lj``, ``thermo_modify norm yes``): energies are per atom;
the temperature counts ``3N - 3`` degrees of freedom (total momentum removed); the pressure
is ``P = (2 KE + W) / (3 V)`` with the pair virial ``W = sum_{i<j} r_ij . f_ij``, which is
the same as LAMMPS's ``(dof * T + W) / (3 V)`` since ``dof * T = 2 KE``. Only slots with
``valid == True`` count. In free space the "pressure" uses the nominal box volume.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NAMES = ("temperature", "potential_energy", "kinetic_energy", "total_energy", "pressure")
"""Observables written to H5MD ``/observables`` (energies per atom)."""


def kinetic_energy(velocity, mass, valid) -> jax.Array:
    """Total kinetic energy ``sum m v^2 / 2`` over valid slots (epsilon).

    Args:
      velocity: float[N, 3] (sigma / tau).
      mass: float[N] or scalar.
      valid: bool[N].
    """
    m = jnp.broadcast_to(jnp.asarray(mass, velocity.dtype), valid.shape)
    return 0.5 * jnp.sum(jnp.where(valid, m * jnp.sum(velocity * velocity, -1), 0.0))


def degrees_of_freedom(valid) -> jax.Array:
    """``3N - 3`` for N valid particles (int32)."""
    return 3 * jnp.sum(valid, dtype=jnp.int32) - 3


def thermo(velocity, mass, valid, e_pair, virial, volume) -> dict[str, jax.Array]:
    """LAMMPS-style thermo quantities.

    Args:
      velocity: float[N, 3]; mass: float[N]; valid: bool[N].
      e_pair: total pair energy (epsilon).
      virial: total pair virial ``sum_{i<j} r_ij . f_ij`` (epsilon).
      volume: box volume (sigma^3).

    Returns:
      dict with scalar ``temperature``, ``potential_energy``, ``kinetic_energy`` and
      ``total_energy`` (per atom, epsilon) and ``pressure`` (epsilon / sigma^3).
    """
    n = jnp.sum(valid, dtype=jnp.int32)
    return thermo_from_sums(kinetic_energy(velocity, mass, valid), n, e_pair, virial, volume)


def thermo_from_sums(ke, n, e_pair, virial, volume) -> dict[str, jax.Array]:
    """``thermo`` from totals (a domain-decomposed run sums them over its devices).

    Args:
      ke: total kinetic energy (epsilon); n: int32 number of particles.
      e_pair, virial, volume: as in ``thermo``.
    """
    dof = (3 * n - 3).astype(ke.dtype)
    temp = 2.0 * ke / dof
    n = n.astype(ke.dtype)
    return {
        "temperature": temp,
        "potential_energy": e_pair / n,
        "kinetic_energy": ke / n,
        "total_energy": (e_pair + ke) / n,
        "pressure": (2.0 * ke + virial) / (3.0 * volume.astype(ke.dtype)),
    }


def format_thermo(step: int, values: dict, header: bool = False) -> str:
    """A LAMMPS-like thermo line ``Step Temp E_pair TotEng Press``."""
    line = (
        f"{step:>10d} {float(values['temperature']):>14.8g} "
        f"{float(values['potential_energy']):>14.8g} "
        f"{float(values['total_energy']):>14.8g} {float(values['pressure']):>14.8g}"
    )
    if header:
        head = f"{'Step':>10} {'Temp':>14} {'E_pair':>14} {'TotEng':>14} {'Press':>14}"
        return head + "\n" + line
    return line
