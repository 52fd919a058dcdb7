"""Pair potentials as pure functions of the squared distance.

Contract: a ``PairPotential`` is a pytree of parameters (array leaves, so they can be swept
or differentiated) with a static ``kind``. ``pair_terms(pot, r2)`` returns, for squared
distances ``r2`` (any shape, sigma^2), the pair energy ``u(r)`` (epsilon) and
``-u'(r) / r`` (epsilon / sigma^2), both zero at and beyond the cutoff. The force on
particle i from j is ``(-u'(r) / r) * (r_i - r_j)``.

Kinds:
  * ``"lj"``: Lennard-Jones ``4 eps ((s/r)^12 - (s/r)^6)`` cut at ``cutoff``; with
    ``shift`` the energy is shifted to zero at the cutoff (forces unchanged). LAMMPS
    ``pair_style lj/cut`` is ``shift=False`` (``pair_modify shift no``, the default).
  * ``"morse"``: ``D0 (exp(-2 a (r - r0)) - 2 exp(-a (r - r0)))`` cut at ``cutoff``,
    optionally shifted; LAMMPS ``pair_style morse`` with ``D0 = epsilon``,
    ``alpha = a``, ``r0 = sigma``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from simpar import precision

KINDS = ("lj", "morse")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PairPotential:
    """Parameters of a truncated pair potential (LJ reduced units).

    Attributes:
      epsilon: energy scale (LJ: well depth; Morse: D0).
      sigma: length scale (LJ: zero crossing; Morse: equilibrium distance r0).
      cutoff: cutoff radius rc (sigma).
      alpha: Morse stiffness a (1/sigma); unused for LJ.
      shift: 1.0 to shift the energy to zero at rc, 0.0 for a plain cut.
      kind: static, one of ``KINDS``.
    """

    epsilon: jax.Array
    sigma: jax.Array
    cutoff: jax.Array
    alpha: jax.Array
    shift: jax.Array
    kind: str = dataclasses.field(default="lj", metadata=dict(static=True))


def lennard_jones(epsilon=1.0, sigma=1.0, cutoff=2.5, shift=False, dtype=None) -> PairPotential:
    """Lennard-Jones cut at ``cutoff`` (optionally energy-shifted).

    Args:
      epsilon: well depth (energy unit epsilon).
      sigma: zero crossing of the potential (length unit sigma).
      cutoff: cutoff radius rc (sigma).
      shift: shift the energy to zero at rc (forces unchanged).
      dtype: float dtype of the parameter leaves; None: JAX's default float (float64
        with ``jax_enable_x64``, else float32; see ``simpar.precision``).

    Returns:
      A ``PairPotential`` of kind ``"lj"`` with scalar leaves of ``dtype``.

    Raises:
      ConfigError: ``dtype`` is float64 and 64-bit JAX is off.
    """
    dtype = precision.resolve(dtype)
    a = lambda x: jnp.asarray(x, dtype=dtype)  # noqa: E731
    return PairPotential(a(epsilon), a(sigma), a(cutoff), a(0.0), a(float(shift)), "lj")


def morse(d0=1.0, alpha=5.0, r0=1.0, cutoff=2.5, shift=False, dtype=None) -> PairPotential:
    """Morse potential with depth ``d0``, stiffness ``alpha``, minimum at ``r0``.

    Args:
      d0: well depth (epsilon); alpha: stiffness (1 / sigma); r0: minimum (sigma).
      cutoff: cutoff radius (sigma); shift: shift the energy to zero at the cutoff.
      dtype: as for ``lennard_jones`` (None: JAX's default float).

    Returns:
      A ``PairPotential`` of kind ``"morse"``.
    """
    dtype = precision.resolve(dtype)
    a = lambda x: jnp.asarray(x, dtype=dtype)  # noqa: E731
    return PairPotential(a(d0), a(r0), a(cutoff), a(alpha), a(float(shift)), "morse")


def _raw(pot: PairPotential, r2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Untruncated energy and -u'(r)/r; ``r2`` must be > 0."""
    eps = pot.epsilon.astype(r2.dtype)
    sig = pot.sigma.astype(r2.dtype)
    if pot.kind == "lj":
        inv_r2 = 1.0 / r2  # one division per pair
        s2 = sig * sig * inv_r2
        s6 = s2 * s2 * s2
        energy = 4.0 * eps * s6 * (s6 - 1.0)
        f_over_r = 24.0 * eps * s6 * (2.0 * s6 - 1.0) * inv_r2
        return energy, f_over_r
    if pot.kind == "morse":
        alpha = pot.alpha.astype(r2.dtype)
        r = jnp.sqrt(r2)
        e1 = jnp.exp(-alpha * (r - sig))
        energy = eps * (e1 * e1 - 2.0 * e1)
        f_over_r = 2.0 * eps * alpha * (e1 * e1 - e1) / r
        return energy, f_over_r
    raise ValueError(f"unknown potential kind {pot.kind!r}; choose one of {KINDS}")


def pair_terms(pot: PairPotential, r2: jax.Array, mask=None) -> tuple[jax.Array, jax.Array]:
    """Truncated pair energy and ``-u'(r) / r``.

    Args:
      pot: the potential.
      r2: float[...], squared distances (sigma^2).
      mask: optional bool[...]; False entries contribute zero (padding, self pairs).

    Returns:
      (energy, f_over_r): float[...] each, zero where ``r2 >= cutoff**2`` or masked.
    """
    rc = pot.cutoff.astype(r2.dtype)
    inside = r2 < rc * rc
    if mask is not None:
        inside = inside & mask
    safe = jnp.where(inside, r2, rc * rc)
    energy, f_over_r = _raw(pot, safe)
    e_cut, _ = _raw(pot, rc * rc)
    energy = energy - pot.shift.astype(r2.dtype) * e_cut
    zero = jnp.zeros((), r2.dtype)
    return jnp.where(inside, energy, zero), jnp.where(inside, f_over_r, zero)
