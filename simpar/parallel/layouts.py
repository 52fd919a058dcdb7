"""The layout vocabulary of ``simpar.parallel.mapping``: what each input and output of a
per-block program is, and how a global value becomes a ``pmap`` stack and back.

- :data:`REPLICATED` (or ``None``): one value everywhere (parameters, step counts, reduced
  diagnostics).
- :class:`Blocks`: a field ``(*lead, N_0, ..., N_{d-1})`` split into blocks over mesh axes:
  :func:`grid_blocks` (axis ``a`` over mesh axis ``a``; the program pads its own halo) and
  :func:`pencils` (the real or Fourier layout of an ``fft.FFTPlan``).
- :data:`PARTICLES`: per-particle arrays ``(N, ...)`` split into equal contiguous slices along
  axis 0, one per device.
- :data:`SLOTS`: one entry per device on a leading device axis ``(n_dev, ...)``.

This module knows no engine: the mapping decides what a layout means on each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from simpar.parallel.halo import from_blocks, to_blocks


class Layout:
    """How one input or output of a per-block program splits over the devices."""


@dataclass(frozen=True)
class Replicated(Layout):
    """One value on every device (per member in an ensemble)."""


@dataclass(frozen=True)
class Blocks(Layout):
    """A field ``(*lead, N_0, ..., N_{d-1})`` split into blocks.

    Attributes:
      split: per spatial axis, the mesh axes that split it, major first (``((0,), (1,))``:
        x over mesh axis 0, y over mesh axis 1). A mesh axis that splits no spatial axis holds
        copies of the block.
      nlead: leading axes, never split; ``None``: every axis before the trailing
        ``len(split)`` ones.
    """

    split: tuple[tuple[int, ...], ...]
    nlead: int | None = None


@dataclass(frozen=True)
class Particles(Layout):
    """Per-particle arrays ``(N, ...)`` in equal contiguous slices along axis 0, one per device
    (``sharded``: split along ``N`` when it divides, else replicated).

    Attributes:
      even: the devices always divide ``N`` (the ring): ``sharded`` results are then split
        along ``N`` too; else XLA places them (``N`` may not divide).
    """

    even: bool = False


@dataclass(frozen=True)
class Slots(Layout):
    """One entry per device on a leading device axis ``(n_dev, ...)``; the program sees its own
    entry without the axis."""


REPLICATED = Replicated()
PARTICLES = Particles()
SLOTS = Slots()


def grid_blocks(d: int, nlead: int | None = None) -> Blocks:
    """A grid field whose spatial axis ``a`` is split over mesh axis ``a`` (``d`` axes)."""
    return Blocks(tuple((a,) for a in range(d)), nlead)


def pencils(plan, fourier: bool, nlead: int | None = 0) -> Blocks:
    """The real-space (``fourier=False``) or Fourier layout of an ``fft.FFTPlan``."""
    return Blocks(plan.fourier_split if fourier else plan.real_split, nlead)


def norm(layout) -> Layout:
    """``layout`` itself, or :data:`REPLICATED` for ``None``."""
    return REPLICATED if layout is None else layout


def each(layouts, fn):
    """``fn`` of each layout in a pytree of layouts (tuples, lists, dicts; ``None`` is
    :data:`REPLICATED`)."""
    if layouts is None or isinstance(layouts, Layout):
        return fn(norm(layouts))
    if isinstance(layouts, dict):
        return {k: each(v, fn) for k, v in layouts.items()}
    return type(layouts)(each(v, fn) for v in layouts)


def each2(layouts, values, fn):
    """``fn(layout, value)`` over a layout prefix of the ``values`` pytree."""
    if layouts is None or isinstance(layouts, Layout):
        return jax.tree.map(lambda v: fn(norm(layouts), v), values)
    if isinstance(layouts, dict):
        return {k: each2(layouts[k], values[k], fn) for k in values}
    return type(layouts)(each2(a, v, fn) for a, v in zip(layouts, values, strict=True))


def slot_view(fn, in_layouts):
    """``fn`` seeing each :data:`SLOTS` argument's one entry (``(1, ...)`` -> ``(...)``), its
    results given a leading device axis again (as under ``pmap``)."""
    if not any_of(in_layouts, Slots):
        return fn

    def one(*args):
        args = tuple(
            each2(ls, a, lambda l_, v: v[0] if isinstance(l_, Slots) else v)
            for ls, a in zip(in_layouts, args, strict=True)
        )
        return jax.tree.map(lambda v: v[None], fn(*args))

    return one


def any_of(layouts, cls) -> bool:
    """Whether a pytree of layouts holds at least one instance of the layout class ``cls``."""
    found = []
    each(layouts, lambda ls: found.append(isinstance(ls, cls)))
    return any(found)


def particle_count(layout, v) -> int | None:
    """Number of particles (leading axis) of ``v`` under a :class:`Particles` layout, else
    None."""
    return np.shape(v)[0] if isinstance(layout, Particles) else None


# --------------------------------------------------------------------------------------------
# Blocks <-> stacks (pmap), for any split
# --------------------------------------------------------------------------------------------
def to_stack(u, split, mesh, nlead: int):
    """Global ``(*lead, *spatial)`` -> ``(prod(mesh), *lead, *block)`` (C order over ``mesh``).

    NumPy or JAX arrays (reshape/transpose only). For a grid split it equals
    ``halo.to_blocks`` flattened."""
    if all(s == (a,) for a, s in enumerate(split)) and len(split) == len(mesh):
        b = to_blocks(u, mesh, len(split))
        return b.reshape(math.prod(mesh), *b.shape[len(mesh) :])
    xp = np if isinstance(u, np.ndarray) else jnp
    shape, pos, blk = list(u.shape[:nlead]), {}, []
    for a, s in enumerate(split):
        n = u.shape[nlead + a]
        for g in s:
            pos[g] = len(shape)
            shape.append(mesh[g])
        blk.append(len(shape))
        shape.append(n // math.prod(mesh[g] for g in s))
    r = u.reshape(shape)
    r = r.transpose([pos[g] for g in sorted(pos)] + list(range(nlead)) + blk)
    for g, m in enumerate(mesh):  # a mesh axis that splits nothing holds copies
        if g not in pos:
            r = xp.broadcast_to(xp.expand_dims(r, g), r.shape[:g] + (m,) + r.shape[g:])
    return r.reshape(math.prod(mesh), *r.shape[len(mesh) :])


def from_stack(b, split, mesh, nlead: int):
    """Inverse of :func:`to_stack`: ``(prod(mesh), *lead, *block)`` -> ``(*lead, *spatial)``."""
    d = len(split)
    if all(s == (a,) for a, s in enumerate(split)) and d == len(mesh):
        return from_blocks(b.reshape(*mesh, *b.shape[1:]), mesh, d)
    r = b.reshape(*mesh, *b.shape[1:])
    r = r[tuple(slice(None) if any(g in s for s in split) else 0 for g in range(len(mesh)))]
    kept = [g for g in range(len(mesh)) if any(g in s for s in split)]
    at = {g: i for i, g in enumerate(kept)}
    k = len(kept)
    order = [k + i for i in range(nlead)]
    for a, s in enumerate(split):
        order += [at[g] for g in s] + [k + nlead + a]
    r = r.transpose(order)
    full = [b.shape[1 + nlead + a] * math.prod(mesh[g] for g in s) for a, s in enumerate(split)]
    return r.reshape(*b.shape[1 : 1 + nlead], *full)


def stack(x, layout: Layout, grid_shape, members: int | None = None):
    """A global value in ``layout`` -> the ``pmap`` stack ``(n_dev, ...)`` over a device grid
    of ``grid_shape`` (NumPy or JAX, traced too); ``members``: a leading member axis, member
    ``k`` on the ``k``-th group of ``prod(grid_shape)`` devices."""
    n, m = math.prod(grid_shape), members
    if isinstance(layout, Slots):
        return x
    if isinstance(layout, Particles):
        return x.reshape((n, x.shape[0] // n) + x.shape[1:])
    if isinstance(layout, Replicated):
        return x if m is None else jnp.repeat(x, n, axis=0)  # each member's on its devices
    nl = np.ndim(x) - len(layout.split) if layout.nlead is None else layout.nlead + (m is not None)
    b = to_stack(x, layout.split, grid_shape, nl)
    if m is None:
        return b
    b = b.swapaxes(0, 1)  # member-major: member k on the k-th group of devices
    return b.reshape(m * n, *b.shape[2:])


def unstack(b, layout: Layout, grid_shape, members: int | None = None):
    """Inverse of :func:`stack` (host stacks of every process's blocks)."""
    n, m = math.prod(grid_shape), members
    if isinstance(layout, Slots):
        return b
    if isinstance(layout, Particles):
        return b.reshape((-1,) + b.shape[2:])
    if isinstance(layout, Replicated):
        return b if m is None else b.reshape(m, n, *b.shape[1:])[:, 0]
    if m is not None:
        b = b.reshape(m, n, *b.shape[1:]).swapaxes(0, 1)
        b = b.reshape(n, *b.shape[1:])
    nl = b.ndim - 1 - len(layout.split) if layout.nlead is None else layout.nlead + (m is not None)
    return from_stack(b, layout.split, grid_shape, nl)
