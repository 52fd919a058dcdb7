"""Spaces: how a displacement between two particles is measured and positions are kept.

Contract: a ``Space`` is a pytree whose ``box`` (float[3], LJ length units sigma; the
constructors also take one number for a cube) is an array leaf and whose ``periodic`` flag is static (changing it recompiles).

* periodic orthorhombic box ``[0, L_x) x [0, L_y) x [0, L_z)``: displacements follow the
  minimum-image convention, ``wrap`` maps positions back into the box. The minimum image is
  only unique for pair distances below ``min(box) / 2``; neighbour lists check this.
* free space (``periodic=False``): plain differences, ``wrap`` is the identity, ``box`` is
  only used to size cell lists and as the H5MD box (with ``boundary = "none"``).

Both functions are pure and work on any leading batch shape.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from simpar import precision
from simpar.errors import ConfigError


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Space:
    """A simulation space.

    Attributes:
      box: float[3], edge lengths of the orthorhombic box (sigma). For free space, the
        extent used for cell lists and output only.
      periodic: static; True for a periodic box in all three directions, False for free
        space. Changing it recompiles.
    """

    box: jax.Array
    periodic: bool = dataclasses.field(default=True, metadata=dict(static=True))


def _edges(box, dtype, what: str) -> jax.Array:
    """float[3] edge lengths from a scalar (a cube) or 3 values; anything else is refused."""
    dtype = precision.resolve(dtype, like=box)
    edges = jnp.asarray(box, dtype=dtype)
    if edges.ndim == 0 or edges.shape == (1,):
        return jnp.broadcast_to(edges.reshape(()), (3,))
    if edges.shape != (3,):
        raise ConfigError(
            "box",
            f"space.{what}(box): box must be one edge length (a cube) or 3 edge lengths, "
            f"got shape {edges.shape}",
        )
    return edges


def periodic(box, dtype=None) -> Space:
    """A periodic orthorhombic box.

    Args:
      box: edge lengths (sigma): a scalar for a cube (``space.periodic(10.0)``, JAX-MD's
        usual call) or float[3].
      dtype: None keeps the dtype of an array ``box`` (else JAX's default float; see
        ``simpar.precision``); float64 with 64-bit JAX off raises ``ConfigError``.

    Returns:
      A periodic ``Space`` whose ``box`` is float[3].

    Raises:
      ConfigError (``box``): ``box`` is neither a scalar nor 3 values.
    """
    return Space(_edges(box, dtype, "periodic"), True)


def free(box, dtype=None) -> Space:
    """Free space; ``box`` (a scalar for a cube, or float[3], sigma) is the extent reported in
    outputs and used to size cell lists (dtype and errors as ``periodic``)."""
    return Space(_edges(box, dtype, "free"), False)


def displacement(space: Space, ra: jax.Array, rb: jax.Array) -> jax.Array:
    """Displacement ``ra - rb`` (minimum image in a periodic box).

    Args:
      space: the space.
      ra, rb: float[..., 3] positions (broadcastable), sigma.

    Returns:
      float[..., 3], same dtype as the positions.
    """
    dr = ra - rb
    if space.periodic:
        box = space.box.astype(dr.dtype)
        dr = dr - box * jnp.round(dr / box)
    return dr


def wrap(space: Space, r: jax.Array) -> jax.Array:
    """Positions mapped into ``[0, L)`` along each axis (identity in free space)."""
    if not space.periodic:
        return r
    box = space.box.astype(r.dtype)
    return r - box * jnp.floor(r / box)


def volume(space: Space) -> jax.Array:
    """Box volume (sigma^3), a scalar of the box dtype."""
    return jnp.prod(space.box)
