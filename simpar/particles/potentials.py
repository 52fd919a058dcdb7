"""Pair potentials as pure functions of the squared distance: an open family.

Contract: a pair potential is a pair energy ``e(r2, params) -> u`` of the squared distance
``r2`` (float[...], sigma^2; ``e`` is elementwise) and a pytree of parameters, cut at
``cutoff`` and optionally shifted to zero there. ``pair(energy_fn, cutoff, params)`` builds
one; Lennard-Jones and Morse are two instances. The forces come from ``jax`` (forward-mode
derivative of ``e`` with respect to ``r2``) unless a ``force_fn(r2, params) -> -u'(r) / r``
is given (the built-ins give theirs: the same bits as before the family was opened).

A ``PairPotential`` is a pytree: ``params``, ``cutoff`` and ``shift`` are array leaves (so
they can be swept, placed on devices or differentiated: ``jax.grad`` with respect to
``params`` passes through a whole run); the functions and the name are static (a new
function recompiles; define it once, at module level or before the run, not per call).

``pair_terms(pot, r2)`` returns, for squared distances ``r2``, the pair energy ``u(r)``
(epsilon) and ``-u'(r) / r`` (epsilon / sigma^2), both zero at and beyond the cutoff. The
force on particle i from j is ``(-u'(r) / r) * (r_i - r_j)``. Every force kernel
(``forces.pair_forces``), the neighbour lists (``cutoff``) and every engine (``single``,
``sharded``, the decomposed ``pmap`` / ``shard_map``) take any ``PairPotential``.

Built-ins (``KINDS``, the config's ``potential.kind``):
  * ``"lj"``: Lennard-Jones ``4 eps ((s/r)^12 - (s/r)^6)`` cut at ``cutoff``; with
    ``shift`` the energy is shifted to zero at the cutoff (forces unchanged). LAMMPS
    ``pair_style lj/cut`` is ``shift=False`` (``pair_modify shift no``, the default).
  * ``"morse"``: ``D0 (exp(-2 a (r - r0)) - 2 exp(-a (r - r0)))`` cut at ``cutoff``,
    optionally shifted; LAMMPS ``pair_style morse`` with ``D0 = epsilon``,
    ``alpha = a``, ``r0 = sigma``.

Example (Yukawa, forces by differentiation)::

    def yukawa(r2, p):
        r = jnp.sqrt(r2)
        return p["a"] * jnp.exp(-p["kappa"] * r) / r

    pot = potentials.pair(yukawa, cutoff=2.5, params={"a": 1.0, "kappa": 1.5}, shift=True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from simpar import precision

KINDS = ("lj", "morse")
"""The built-in potentials by name (``potential.kind`` in an LJ config)."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PairPotential:
    """A truncated pair potential: its parameters (leaves) and its functions (static).

    Attributes:
      params: pytree of array leaves passed to the functions (e.g. a dict
        ``{"epsilon": ..., "sigma": ...}``); scalars of the state dtype.
      cutoff: cutoff radius rc (sigma), scalar.
      shift: scalar, 1.0 to shift the energy to zero at rc, 0.0 for a plain cut.
      energy_fn: static, ``(r2, params) -> u`` (epsilon), elementwise over ``r2``; called
        only with ``0 < r2 <= cutoff**2``.
      force_fn: static, ``(r2, params) -> -u'(r) / r`` (epsilon / sigma^2), or None: the
        derivative of ``energy_fn`` (``-2 de/d(r2)``, forward mode).
      kind: static name (``"lj"``, ``"morse"``, or the user's).
    """

    params: Any
    cutoff: jax.Array
    shift: jax.Array
    energy_fn: Callable = dataclasses.field(metadata=dict(static=True))
    force_fn: Callable | None = dataclasses.field(default=None, metadata=dict(static=True))
    kind: str = dataclasses.field(default="pair", metadata=dict(static=True))

    def __getattr__(self, name: str):
        # the parameters by name (``pot.epsilon``) when ``params`` is a dict
        params = self.__dict__.get("params")
        if isinstance(params, dict) and name in params:
            return params[name]
        kind = self.__dict__.get("kind")
        raise AttributeError(f"{type(self).__name__} ({kind!r}) has no attribute {name!r}")


def pair(
    energy_fn: Callable,
    cutoff,
    params: Any = None,
    *,
    force_fn: Callable | None = None,
    shift: bool = False,
    kind: str | None = None,
    dtype=None,
) -> PairPotential:
    """A pair potential from a pair energy of the squared distance (JAX-MD's ``pair``).

    Args:
      energy_fn: ``(r2, params) -> u``: pair energy (epsilon) of squared distances
        ``r2`` float[...] (sigma^2), elementwise, differentiable in ``r2`` unless
        ``force_fn`` is given; pure (no numbers closed over that a user may want to sweep
        or differentiate: put them in ``params``).
      cutoff: cutoff radius rc (sigma); pairs at ``r >= rc`` contribute nothing.
      params: pytree of numbers (a dict, a NamedTuple, ...; None: none); each leaf
        becomes an array of ``dtype`` (scalars; an array leaf keeps its shape and must
        broadcast against ``r2`` in ``energy_fn``).
      force_fn: optional ``(r2, params) -> -u'(r) / r`` (epsilon / sigma^2); None: from
        ``energy_fn`` by ``jax.jvp``.
      shift: shift the energy to zero at rc (forces unchanged).
      kind: static name shown in errors and outputs (default ``energy_fn.__name__``).
      dtype: float dtype of the leaves; None: JAX's default float (float64 with
        ``jax_enable_x64``, else float32; see ``simpar.precision``).

    Returns:
      A ``PairPotential``.

    Raises:
      ConfigError: ``dtype`` is float64 and 64-bit JAX is off.
      ValueError: ``energy_fn`` or ``force_fn`` is not callable.
    """
    if not callable(energy_fn) or (force_fn is not None and not callable(force_fn)):
        raise ValueError("energy_fn (and force_fn when given) must be functions (r2, params)")
    dtype = precision.resolve(dtype)
    a = lambda x: jnp.asarray(x, dtype=dtype)  # noqa: E731
    params = jax.tree.map(a, {} if params is None else params)
    name = kind or getattr(energy_fn, "__name__", "pair")
    return PairPotential(params, a(cutoff), a(float(shift)), energy_fn, force_fn, name)


# Lennard-Jones -----------------------------------------------------------------------------
def lj_energy(r2, p):
    """Lennard-Jones pair energy ``4 eps s6 (s6 - 1)``, ``s6 = (sigma^2 / r2)^3``."""
    inv_r2 = 1.0 / r2  # one division per pair
    s2 = p["sigma"] * p["sigma"] * inv_r2
    s6 = s2 * s2 * s2
    return 4.0 * p["epsilon"] * s6 * (s6 - 1.0)


def lj_force(r2, p):
    """Lennard-Jones ``-u'(r) / r = 24 eps s6 (2 s6 - 1) / r2``."""
    inv_r2 = 1.0 / r2
    s2 = p["sigma"] * p["sigma"] * inv_r2
    s6 = s2 * s2 * s2
    return 24.0 * p["epsilon"] * s6 * (2.0 * s6 - 1.0) * inv_r2


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
      A ``PairPotential`` of kind ``"lj"``, params ``{"epsilon", "sigma"}``.

    Raises:
      ConfigError: ``dtype`` is float64 and 64-bit JAX is off.
    """
    params = {"epsilon": epsilon, "sigma": sigma}
    return pair(lj_energy, cutoff, params, force_fn=lj_force, shift=shift, kind="lj",
                dtype=dtype)  # fmt: skip


# Morse -------------------------------------------------------------------------------------
def morse_energy(r2, p):
    """Morse pair energy ``d0 (e1^2 - 2 e1)``, ``e1 = exp(-alpha (r - r0))``."""
    e1 = jnp.exp(-p["alpha"] * (jnp.sqrt(r2) - p["r0"]))
    return p["d0"] * (e1 * e1 - 2.0 * e1)


def morse_force(r2, p):
    """Morse ``-u'(r) / r = 2 d0 alpha (e1^2 - e1) / r``."""
    r = jnp.sqrt(r2)
    e1 = jnp.exp(-p["alpha"] * (r - p["r0"]))
    return 2.0 * p["d0"] * p["alpha"] * (e1 * e1 - e1) / r


def morse(d0=1.0, alpha=5.0, r0=1.0, cutoff=2.5, shift=False, dtype=None) -> PairPotential:
    """Morse potential with depth ``d0``, stiffness ``alpha``, minimum at ``r0``.

    Args:
      d0: well depth (epsilon); alpha: stiffness (1 / sigma); r0: minimum (sigma).
      cutoff: cutoff radius (sigma); shift: shift the energy to zero at the cutoff.
      dtype: as for ``lennard_jones`` (None: JAX's default float).

    Returns:
      A ``PairPotential`` of kind ``"morse"``, params ``{"d0", "alpha", "r0"}``.
    """
    params = {"d0": d0, "alpha": alpha, "r0": r0}
    return pair(morse_energy, cutoff, params, force_fn=morse_force, shift=shift, kind="morse",
                dtype=dtype)  # fmt: skip


BUILTIN = {"lj": lennard_jones, "morse": morse}
"""The factories of ``KINDS``."""


# the kernel -------------------------------------------------------------------------------
def _terms(pot: PairPotential, r2: jax.Array, params) -> tuple[jax.Array, jax.Array]:
    """Untruncated energy and -u'(r)/r; ``r2`` must be > 0."""
    if pot.force_fn is not None:
        return pot.energy_fn(r2, params), pot.force_fn(r2, params)
    energy, de_dr2 = jax.jvp(lambda x: pot.energy_fn(x, params), (r2,), (jnp.ones_like(r2),))
    return energy, -2.0 * de_dr2  # d/d(r2) = u'(r) / (2 r)


def pair_terms(pot: PairPotential, r2: jax.Array, mask=None) -> tuple[jax.Array, jax.Array]:
    """Truncated pair energy and ``-u'(r) / r``.

    Args:
      pot: the potential.
      r2: float[...], squared distances (sigma^2).
      mask: optional bool[...]; False entries contribute zero (padding, self pairs).

    Returns:
      (energy, f_over_r): float[...] each (epsilon, epsilon / sigma^2), zero where
      ``r2 >= cutoff**2`` or masked.
    """
    rc = pot.cutoff.astype(r2.dtype)
    inside = r2 < rc * rc
    if mask is not None:
        inside = inside & mask
    safe = jnp.where(inside, r2, rc * rc)
    params = jax.tree.map(lambda x: jnp.asarray(x).astype(r2.dtype), pot.params)
    energy, f_over_r = _terms(pot, safe, params)
    e_cut = pot.energy_fn(rc * rc, params)
    energy = energy - pot.shift.astype(r2.dtype) * e_cut
    zero = jnp.zeros((), r2.dtype)
    return jnp.where(inside, energy, zero), jnp.where(inside, f_over_r, zero)
