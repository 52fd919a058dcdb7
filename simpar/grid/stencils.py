"""Finite-difference stencils on padded blocks.

Every stencil takes a block padded by (at least) its radius on each of the trailing ``d``
spatial axes and returns values on the block shrunk by that radius: ``padded -> interior``.
No stencil knows where the halo came from (wrap, wall or neighbour device).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax import lax


def shifted(u: jax.Array, offsets: Sequence[int], d: int, r: int = 1) -> jax.Array:
    """View of ``u`` shifted by ``offsets`` cells, cropped by ``r`` on every spatial axis.

    Args:
      u: padded block ``(*lead, n_0 + 2r, ..., n_{d-1} + 2r)``.
      offsets: one integer in ``[-r, r]`` per spatial axis.
      d: number of trailing spatial axes.
      r: halo width consumed.

    Returns:
      ``(*lead, n_0, ..., n_{d-1})``: entry ``i`` is ``u[i + offsets]`` in interior indexing.
    """
    lead = u.ndim - d
    starts = [0] * lead + [r + o for o in offsets]
    limits = list(u.shape[:lead]) + [u.shape[lead + a] - r + o for a, o in enumerate(offsets)]
    return lax.slice(u, starts, limits)


def laplacian(u: jax.Array, inv_dx2: Sequence[jax.Array], d: int) -> jax.Array:
    """Second-order (2d+1)-point Laplacian, ``sum_i (u[+e_i] - 2u + u[-e_i]) / dx_i^2``.

    Args:
      u: block padded by 1, ``(*lead, n_0 + 2, ...)``, units of u.
      inv_dx2: per axis ``1 / dx_i^2`` (scalars, 1/length^2).
      d: 2 or 3.

    Returns:
      ``(*lead, n_0, ...)``, units of u / length^2.
    """
    centre = shifted(u, (0,) * d, d)
    out = None
    for a in range(d):
        e = [0] * d
        e[a] = 1
        plus = shifted(u, e, d)
        e[a] = -1
        minus = shifted(u, e, d)
        term = (plus + minus - 2 * centre) * inv_dx2[a]
        out = term if out is None else out + term
    return out


def laplacian_9pt(u: jax.Array, inv_dx2: jax.Array) -> jax.Array:
    """Isotropic 9-point 2-D Laplacian (Patra & Karttunen 2006, the "Mehrstellen" weights).

    ``(4 (E + W + N + S) + (NE + NW + SE + SW) - 20 C) / (6 h^2)``; its leading error term is
    rotation invariant. Needs ``dx == dy = h`` and uses the corner cells of the halo.

    Args:
      u: block padded by 1, ``(*lead, nx + 2, ny + 2)``.
      inv_dx2: ``1 / h^2``.
    """
    s = lambda i, j: shifted(u, (i, j), 2)  # noqa: E731
    faces = s(1, 0) + s(-1, 0) + s(0, 1) + s(0, -1)
    corners = s(1, 1) + s(1, -1) + s(-1, 1) + s(-1, -1)
    return (4 * faces + corners - 20 * s(0, 0)) * (inv_dx2 / 6)


def crop(u: jax.Array, r: int, d: int) -> jax.Array:
    """The interior of a block padded by ``r`` on its trailing ``d`` axes."""
    return shifted(u, (0,) * d, d, r)
