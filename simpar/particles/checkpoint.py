"""Restart checkpoints of particle runs (Lennard-Jones MD and N-body).

The files themselves are written by ``simpar.io.checkpoint`` (HDF5, atomic replace); this
module decides what goes into them. A checkpoint is a flat ``dict`` of NumPy arrays:

* **Engine-independent part** (every name without the ``layout_`` prefix): the complete
  physical state in *global atom-id order* (row ``i`` is atom ``i``, only the ``n`` real
  atoms, no padding slots), so any engine and any mesh can start from it:

  - LJ: ``position``, ``velocity``, ``force`` float[n, 3]; ``mass`` float[n]; ``valid``
    bool[n]; ``key`` uint32[2] (Langevin noise); ``step`` int64[]; ``e_pair``,
    ``virial`` float[]; the neighbour-list state that fixes the force summation order:
    ``nbr_ref_position`` float[n, 3] (positions at the last build; the next rebuild
    happens when an atom moved more than skin / 2 from it), ``nbr_needed`` int32[2],
    ``nbr_n_builds`` int32[], and the static layout ``spec_*`` (``max_neighbors``,
    ``column_capacity``, ``cells``, ``reach``, ``radius``, ``skin``, ``periodic``,
    ``origin``, ``width``, ``block``); ``regrows`` int64[] and ``start_step`` int64[]
    (the first step of the run, for aligning frames).
  - N-body: ``pos``, ``vel``, ``acc`` float[N, 3], ``mass`` float[N], ``step``.

* **Layout-specific part** (``layout_*``): what depends on the engine and mesh, used only
  when they match the resuming run (``layout`` names them, e.g. ``b"sharded:8:504"``).
  For LJ that is the neighbour index list ``layout_nbr_idx`` int32[capacity, M] (slot
  indices). When the layout differs, the list is rebuilt from ``nbr_ref_position`` with
  the stored capacities (the same neighbours, in another engine's order).

Resuming on the same engine and mesh therefore continues *bit for bit*; on another
engine/mesh to round-off (different summation order, as between engines).

Spatial domain decomposition (``pmap`` / ``shard_map``) writes the engine-independent part
only (``domain_state_to_checkpoint``) and resumes through ``lj_global_arrays``.

Hook for other particle layouts (e.g. spatial domain decomposition with per-device
buffers holding global ids): write the engine-independent arrays in global id order
(scatter by id) plus any ``layout_*`` arrays of your own with a distinct ``layout``
string, and, when resuming, use the ``layout_*`` arrays only if ``layout`` matches;
otherwise redistribute the global arrays and rebuild from ``nbr_ref_position``.
``lj_state_to_checkpoint`` / ``lj_sim_from_checkpoint`` are that pair for the ``single``
and ``sharded`` engines (slot ``i`` holds atom ``i``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simpar.errors import ConfigError
from simpar.parallel.distributed import to_host
from simpar.particles import md, neighbors
from simpar.particles.domain_spec import NEED_COL, NEED_NBR
from simpar.particles.neighbors import NeighborList, NeighborSpec

_NONE = -1  # integer "None" for spec.cells


def layout_name(engine: str, mesh, capacity: int) -> bytes:
    """The layout tag stored in a checkpoint (``b"engine:d0xd1:capacity"``)."""
    return f"{engine}:{'x'.join(str(int(m)) for m in mesh)}:{int(capacity)}".encode()


def _spec_arrays(spec: NeighborSpec) -> dict[str, np.ndarray]:
    nan3 = np.full(3, np.nan)
    return {
        "spec_max_neighbors": np.int64(spec.max_neighbors),
        "spec_column_capacity": np.int64(spec.column_capacity),
        "spec_cells": np.asarray(spec.cells if spec.cells is not None else (_NONE,) * 3),
        "spec_reach": np.int64(spec.reach),
        "spec_radius": np.float64(spec.radius),
        "spec_skin": np.float64(spec.skin),
        "spec_periodic": np.bool_(spec.periodic),
        "spec_origin": np.asarray(spec.origin if spec.origin is not None else nan3, np.float64),
        "spec_width": np.asarray(spec.width if spec.width is not None else nan3, np.float64),
        "spec_block": np.int64(spec.block),
    }


def _spec_from(ck: dict, capacity: int) -> NeighborSpec:
    cells = tuple(int(c) for c in ck["spec_cells"])
    origin, width = np.asarray(ck["spec_origin"]), np.asarray(ck["spec_width"])
    return NeighborSpec(
        capacity=int(capacity),
        max_neighbors=min(int(ck["spec_max_neighbors"]), int(capacity)),
        radius=float(ck["spec_radius"]),
        skin=float(ck["spec_skin"]),
        periodic=bool(ck["spec_periodic"]),
        cells=None if cells[0] == _NONE else cells,
        reach=int(ck["spec_reach"]),
        column_capacity=int(ck["spec_column_capacity"]),
        origin=None if np.isnan(origin).any() else tuple(float(x) for x in origin),
        width=None if np.isnan(width).any() else tuple(float(x) for x in width),
        block=int(ck["spec_block"]),
    )


def lj_state_to_checkpoint(
    sim: md.Simulation, n: int, layout: bytes, start_step: int, to_host=np.asarray
) -> dict[str, np.ndarray]:
    """The complete state of an LJ ``Simulation`` as a checkpoint dict (see module doc).

    Args:
      sim: the simulation (``single`` / ``sharded`` layout: slot i holds atom i).
      n: number of real atoms (slots ``n:`` are padding).
      layout: ``layout_name(engine, mesh, capacity)`` of this run.
      start_step: first step of the run (frames are aligned to it).
      to_host: array -> NumPy (``distributed.to_host`` in multi-process runs: a
        collective, so every process must call this function).

    Returns:
      dict of NumPy arrays for ``simpar.io.checkpoint.save``.
    """
    s, nb = sim.state, sim.nbrs
    out = {
        "position": to_host(s.position)[:n],
        "velocity": to_host(s.velocity)[:n],
        "force": to_host(s.force)[:n],
        "mass": to_host(s.mass)[:n],
        "valid": to_host(s.valid)[:n],
        "key": to_host(s.key),
        "step": np.int64(to_host(s.step)),
        "e_pair": to_host(s.e_pair),
        "virial": to_host(s.virial),
        "nbr_ref_position": to_host(nb.ref_position)[:n],
        "nbr_needed": to_host(nb.needed),
        "nbr_n_builds": to_host(nb.n_builds),
        "regrows": np.int64(sim.regrows),
        "start_step": np.int64(start_step),
        "layout": np.bytes_(layout),
        "layout_nbr_idx": to_host(nb.idx),
    }
    out.update(_spec_arrays(sim.spec))
    return out


def _require(ck: dict, names, what: str):
    missing = [k for k in names if k not in ck]
    if missing:
        raise ConfigError("--resume", f"the checkpoint is not a {what} checkpoint (no {missing})")


def lj_sim_from_checkpoint(
    ck: dict,
    space,
    pot,
    *,
    ensemble: str,
    dt: float,
    kt: float,
    gamma: float,
    capacity: int,
    layout: bytes,
    capacity_factor: float = 1.2,
    placement=None,
) -> md.Simulation:
    """Rebuild an LJ ``Simulation`` from ``lj_state_to_checkpoint``'s dict.

    Args:
      ck: the checkpoint arrays.
      space, pot: the resuming run's space and potential (same config).
      ensemble, dt, kt, gamma: integrator settings (``md.make_simulation``).
      capacity: slots of the resuming layout (>= number of atoms).
      layout: ``layout_name`` of the resuming run; the stored neighbour index list is used
        only when it equals the checkpoint's (then the run continues bit for bit),
        otherwise the list is rebuilt from the stored reference positions.
      capacity_factor: head-room when regrowing later.
      placement: optional ``tree -> tree`` (sharding), as in ``md.make_simulation``.

    Returns:
      A ``Simulation`` in exactly the checkpointed state.
    """
    _require(ck, ("position", "nbr_ref_position", "spec_max_neighbors"), "Lennard-Jones")
    dtype = jnp.dtype(space.box.dtype)
    n = ck["position"].shape[0]
    if n > capacity:
        raise ValueError(f"{n} atoms do not fit {capacity} slots")

    def pad(x, fill=0):
        x = np.asarray(x)
        return np.concatenate([x, np.full((capacity - n,) + x.shape[1:], fill, x.dtype)])

    valid = pad(np.asarray(ck["valid"], bool), False)
    state = md.MDState(
        jnp.asarray(pad(ck["position"]), dtype),
        jnp.asarray(pad(ck["velocity"]), dtype),
        jnp.asarray(pad(ck["force"]), dtype),
        jnp.asarray(pad(ck["mass"], 1), dtype),  # never 0 on padding: v += f / m
        jnp.asarray(valid),
        jnp.asarray(ck["key"], jnp.uint32),
        jnp.int32(int(ck["step"])),
        jnp.asarray(ck["e_pair"], dtype),
        jnp.asarray(ck["virial"], dtype),
    )
    spec = _spec_from(ck, capacity)
    ref = jnp.asarray(pad(ck["nbr_ref_position"]), dtype)
    same = bytes(ck["layout"]) == bytes(layout) and "layout_nbr_idx" in ck
    if same and ck["layout_nbr_idx"].shape == (capacity, spec.max_neighbors):
        idx = jnp.asarray(ck["layout_nbr_idx"], jnp.int32)
        error = jnp.int32(0)
    else:  # another engine/mesh: the same neighbours from the same reference positions
        built = jax.jit(neighbors.build, static_argnums=0)(spec, space, ref, state.valid)
        idx, error = built.idx, built.error
    nbrs = NeighborList(
        idx,
        ref,
        error,
        jnp.asarray(ck["nbr_needed"], jnp.int32),
        jnp.asarray(ck["nbr_n_builds"], jnp.int32),
    )
    params = md.make_params(dt, kt, gamma, dtype)
    if placement is not None:
        state, nbrs, space, pot, params = placement((state, nbrs, space, pot, params))
    sim = md.Simulation(
        ensemble, space, pot, params, spec, state, nbrs, capacity_factor, placement,
        regrows=int(ck["regrows"]),
    )  # fmt: skip
    sim.nbrs = sim._repair(nbrs)  # regrows a smaller layout than the checkpoint's (rare)
    return sim


def lj_to_checkpoint(sim, layout: bytes, start_step: int, snapshot: dict | None = None) -> dict:
    """The checkpoint dict of any LJ simulation (the driver's one call).

    Args:
      sim: an ``md.Simulation`` (``single`` / ``sharded``: ``sim.hops`` is None) or a
        ``decomposed_sim.DomainSimulation``.
      layout: ``layout_name(engine, mesh, capacity)`` of this run.
      start_step: first step of the run (frames are aligned to it).
      snapshot: the decomposed run's ``snapshot()`` if already gathered (saves a gather).

    Returns:
      dict of NumPy arrays for ``simpar.io.checkpoint.save`` (a collective across processes
      in multi-process runs: every process calls it).
    """
    if sim.hops is None:
        n = int(np.sum(to_host(sim.state.valid)))
        return lj_state_to_checkpoint(sim, n, layout, start_step, to_host)
    g = sim.snapshot() if snapshot is None else snapshot
    return domain_state_to_checkpoint(sim, g, layout, start_step)


def nbody_state_to_checkpoint(state, step: int) -> dict[str, np.ndarray]:
    """An N-body whole-system ``NBodyState`` (NumPy, global order) as a checkpoint dict."""
    return {
        "pos": np.asarray(state.pos),
        "vel": np.asarray(state.vel),
        "acc": np.asarray(state.acc),
        "mass": np.asarray(state.mass),
        "step": np.int64(step),
    }


def nbody_state_from_checkpoint(ck: dict):
    """(``NBodyState`` of NumPy arrays, step) from ``nbody_state_to_checkpoint``'s dict."""
    from simpar.particles.nbody import NBodyState

    _require(ck, ("pos", "vel", "acc", "mass"), "N-body")
    return NBodyState(ck["pos"], ck["vel"], ck["acc"], ck["mass"]), int(ck["step"])


def lj_global_arrays(ck: dict) -> dict:
    """The engine-independent LJ arrays of a checkpoint, named as
    ``simpar.particles.decomposed_sim.DomainSimulation.global_state`` returns them."""
    _require(ck, ("position", "nbr_ref_position"), "Lennard-Jones")
    return {
        "position": np.asarray(ck["position"]),
        "velocity": np.asarray(ck["velocity"]),
        "force": np.asarray(ck["force"]),
        "ref_position": np.asarray(ck["nbr_ref_position"]),
        "mass": np.asarray(ck["mass"]),
        "key": np.asarray(ck["key"], np.uint32),
        "step": int(ck["step"]),
        "e_pair": np.asarray(ck["e_pair"]),
        "virial": np.asarray(ck["virial"]),
    }


def domain_state_to_checkpoint(sim, g: dict, layout: bytes, start_step: int) -> dict:
    """A checkpoint dict of a spatially decomposed run (``simpar.particles.decomposed_sim``).

    Args:
      sim: the ``DomainSimulation``; g: its ``global_state()`` (atom-id order).
      layout, start_step: as in ``lj_state_to_checkpoint``.

    The ``spec_*`` arrays describe a one-device periodic cell list with the run's
    neighbour capacities, so ``single`` / ``sharded`` can resume from it (any mesh of the
    decomposition resumes from the global arrays alone). No ``layout_*`` arrays: the
    ghosts and the list are rebuilt from ``nbr_ref_position`` (the same list).
    """
    n = g["position"].shape[0]
    nspec = sim.spec.nbr
    cells, reach, origin, width = neighbors._layout(
        sim.space, g["ref_position"], np.ones(n, bool), nspec.radius, False
    )
    spec = NeighborSpec(
        n, min(nspec.max_neighbors, n), nspec.radius, nspec.skin, True, cells, reach,
        nspec.column_capacity, origin, width, nspec.block,
    )  # fmt: skip
    needed = np.asarray(sim._first(sim.lists.needed))
    out = {
        "position": g["position"],
        "velocity": g["velocity"],
        "force": g["force"],
        "mass": g["mass"],
        "valid": np.ones(n, bool),
        "key": np.asarray(g["key"], np.uint32),
        "step": np.int64(g["step"]),
        "e_pair": np.asarray(g["e_pair"]),
        "virial": np.asarray(g["virial"]),
        "nbr_ref_position": g["ref_position"],
        "nbr_needed": needed[[NEED_NBR, NEED_COL]].astype(np.int32),
        "nbr_n_builds": np.int32(sim.builds),
        "regrows": np.int64(sim.regrows),
        "start_step": np.int64(start_step),
        "layout": np.bytes_(layout),
    }
    out.update(_spec_arrays(spec))
    return out
