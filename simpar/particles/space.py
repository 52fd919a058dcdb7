"""Spaces: how a displacement between two particles is measured and positions are kept.

Contract: a ``Space`` is a pytree whose ``box`` (float[3], LJ length units sigma) is an
array leaf and whose ``periodic`` flag is static (changing it recompiles).

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


def periodic(box, dtype=None) -> Space:
    """A periodic orthorhombic box with edge lengths ``box`` (float[3], sigma).

    ``dtype`` None keeps the dtype of an array ``box`` (else JAX's default float; see
    ``simpar.precision``); float64 with 64-bit JAX off raises ``ConfigError``.
    """
    dtype = precision.resolve(dtype, like=box)
    return Space(jnp.asarray(box, dtype=dtype).reshape(3), True)


def free(box, dtype=None) -> Space:
    """Free space; ``box`` (float[3]) is the extent reported in outputs (dtype as ``periodic``)."""
    dtype = precision.resolve(dtype, like=box)
    return Space(jnp.asarray(box, dtype=dtype).reshape(3), False)


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
