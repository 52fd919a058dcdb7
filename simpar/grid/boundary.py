"""Boundary conditions as halo fills.

A boundary condition answers one question: given the ``k`` cells just inside a physical edge,
what goes into the ``k`` halo cells just outside it? Stencils never branch on boundary type;
they read a padded block. Between devices the same halo is filled by ``ppermute``
(``simpar.parallel.halo``), so "halo exchange is a boundary condition".

The grid is cell-centred: cell ``i`` of ``n`` covers ``[i dx, (i+1) dx]`` and its value sits at
``(i + 1/2) dx``. Walls lie on cell faces, halfway between the last cell and the first halo cell.

Boundary conditions are static (hashable): changing one recompiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp


@dataclass(frozen=True)
class Periodic:
    """The domain wraps around on this axis. Filled by wrap (one device) or exchange."""

    periodic = True


@dataclass(frozen=True)
class Dirichlet:
    """Fixed value on the wall: halo = 2 g - mirror image (second-order at the face)."""

    value: float = 0.0
    periodic = False

    def fill(self, inner: jnp.ndarray, axis: int, side: int) -> jnp.ndarray:
        """Halo cells from the ``w`` interior cells next to the wall.

        Args:
          inner: the interior slab next to the wall, width ``w`` along ``axis``.
          axis: the array axis normal to the wall.
          side: 0 for the lower wall, 1 for the upper (unused: the rule is symmetric).

        Returns:
          The halo slab, same shape and dtype as ``inner``.
        """
        return jnp.asarray(2 * self.value, inner.dtype) - jnp.flip(inner, axis)


@dataclass(frozen=True)
class Neumann:
    """Zero normal gradient (no flux) through the wall: halo = mirror image."""

    periodic = False

    def fill(self, inner: jnp.ndarray, axis: int, side: int) -> jnp.ndarray:
        """Halo cells: the mirror image of ``inner`` (arguments as ``Dirichlet.fill``)."""
        return jnp.flip(inner, axis)


BoundaryCondition = Periodic | Dirichlet | Neumann

KINDS = ("periodic", "dirichlet", "neumann")


def from_config(spec: object, key: str):
    """Build a boundary condition from a config value.

    Accepts ``"periodic"``, ``"neumann"``, ``"dirichlet"`` (value 0) or a table
    ``{kind = "dirichlet", value = 1.0}``.
    """
    from simpar.errors import ConfigError

    if isinstance(spec, str):
        kind, value = spec, 0.0
    elif isinstance(spec, dict) and "kind" in spec:
        kind = spec["kind"]
        value = spec.get("value", 0.0)
        extra = set(spec) - {"kind", "value"}
        if extra:
            raise ConfigError(key, f"unknown entries {sorted(extra)}; allowed: kind, value")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(key + ".value", f"must be a number, got {value!r}")
    else:
        raise ConfigError(
            key,
            f'must be one of {", ".join(KINDS)} or a table {{kind = "dirichlet", value = 1.0}}, got {spec!r}',
        )
    if kind == "periodic":
        return Periodic()
    if kind == "neumann":
        return Neumann()
    if kind == "dirichlet":
        return Dirichlet(float(value))
    raise ConfigError(key, f"unknown boundary kind {kind!r}; choose one of {', '.join(KINDS)}")
