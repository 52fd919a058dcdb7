"""The per-block programs of a grid model, the same under every engine (only ``comm`` differs).

``advance_block`` fills a halo of width ``w`` (``simpar.parallel.halo.pad``: a boundary
condition, a local wrap or a neighbour's data through the ``Comm``) and takes ``w // radius``
steps on the shrinking halo; ``observe_block`` gives global diagnostics from one block, reduced
over the devices by the ``Comm``. The model is passed in (``GridModel`` states what is asked of
it); nothing here imports ``simpar.grid``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Protocol

import jax
import jax.numpy as jnp
from jax import lax

from simpar.parallel.halo import crop, fill_edges, pad

__all__ = ["GridModel", "Params", "State", "advance_block", "observe_block"]

State = dict[str, jax.Array]  # field name -> block (or whole field) ``(*lead, n_0, ...)``
Params = dict[str, jax.Array]  # parameter name -> array leaf (replicated)


class GridModel(Protocol):
    """What the engines ask of a grid model; ``simpar.grid.model.GridModel`` answers it.

    The engines never import a model: it is passed in (``make_engine(name, model, ...)``).

    Attributes:
      name: model name, for messages.
      ndim: number of spatial axes.
      radius: halo cells one ``update`` consumes per side.
      bcs: field name -> per spatial axis ``(lower, upper)`` boundary conditions (objects with
        ``periodic`` and ``fill(slab, axis, side)``).
      update: ``(padded state, params) -> state padded by radius fewer cells``.
      local_sums: ``(state padded by radius, params) -> {name: block sum}``, or None.
      diagnosed: fields whose sum/min/max/profile are reported (None: every float field).
    """

    name: str
    ndim: int
    radius: int
    bcs: Mapping
    update: Callable
    local_sums: Callable | None
    diagnosed: tuple[str, ...] | None

    @property
    def periodic(self) -> tuple[bool, ...]:
        """Per spatial axis, whether it is periodic (the same for every field)."""


# --------------------------------------------------------------------------------------------
# Per-block programs (the same for every engine; only ``comm`` differs)
# --------------------------------------------------------------------------------------------
def _exchange_and_steps(state: State, params: Params, model: GridModel, comm, w: int, nsub: int):
    """Fill a halo of width ``w`` once, then take ``nsub`` steps on the shrinking halo.

    With one update per exchange (``w == model.radius``) a field's halo sides that the update
    does not read (``model.halo_sides``, e.g. LBM's populations) are not exchanged."""
    reads = getattr(model, "halo_sides", None) or {}
    one = w == model.radius and nsub == 1
    padded = {f: pad(u, w, model.bcs[f], comm, reads.get(f) if one else None)
              for f, u in state.items()}  # fmt: skip
    k = w
    for _ in range(nsub):
        padded = model.update(padded, params)
        k -= model.radius
        padded = {f: fill_edges(u, k, model.bcs[f], comm) for f, u in padded.items()}
    return {f: crop(u, k, model.ndim) for f, u in padded.items()}


def advance_block(state: State, params: Params, n: int, *, model: GridModel, comm, w: int) -> State:
    """Advance one block by ``n`` steps, exchanging a halo of width ``w`` every ``w // r`` steps.

    Args:
      state: field name -> block ``(*lead, n_0, ..., n_{d-1})`` (no halo).
      params: model parameters (array leaves, replicated).
      n: number of steps (static).
      model: the grid model.
      comm: ``LocalComm`` / ``PmapComm`` / ``ShardMapComm``.
      w: halo width (a multiple of ``model.radius`` is most efficient).
    """
    per = max(w // model.radius, 1)
    n_full, rem = divmod(int(n), per)
    body = functools.partial(_exchange_and_steps, params=params, model=model, comm=comm, w=w)
    if n_full:
        state = lax.fori_loop(0, n_full, lambda i, s: body(s, nsub=per), state)
    if rem:
        state = body(state, nsub=rem)
    return state


def observe_block(state: State, params: Params, *, model: GridModel, comm, global_shape) -> dict:
    """Global diagnostics from one block: per field sum/min/max, a profile, model sums.

    The profile ``<field>_profile`` is the mean over every spatial axis but the last (for 2-D
    fields: the x-average as a function of y). Per-block engines reduce it over the devices of
    one grid column only (``axis_index_groups`` under pmap, a mesh sub-axis under shard_map).
    """
    d = model.ndim
    out = {}
    bad = jnp.zeros((), jnp.int32)
    for f, u in state.items():
        if not jnp.issubdtype(u.dtype, jnp.floating):
            continue  # flags and masks (e.g. the LBM wall field) are not observables
        bad = bad + jnp.sum(~jnp.isfinite(u)).astype(jnp.int32)
        if model.diagnosed is not None and f not in model.diagnosed:
            continue
        out[f"{f}_sum"] = comm.psum(jnp.sum(u))
        out[f"{f}_min"] = comm.pmin(jnp.min(u))
        out[f"{f}_max"] = comm.pmax(jnp.max(u))
        if u.ndim == d:
            lead_axes = tuple(range(d - 1))
            prof = comm.psum_over(jnp.sum(u, axis=lead_axes), lead_axes)
            out[f"{f}_profile"] = prof / math.prod(global_shape[:-1])
    out["nonfinite"] = comm.psum(bad)
    if model.local_sums is not None:
        padded = {f: pad(u, model.radius, model.bcs[f], comm) for f, u in state.items()}
        for key, value in model.local_sums(padded, params).items():
            out[key] = comm.psum(value)
    return out
