"""Decomposed Lennard-Jones MD, one block: the state of a device's owned atoms, its ghosts
and neighbour list, and the chunk program that runs the one MD step (``step.md_step``) with
ghosts + migration as its neighbour provider (``domain_provider``).

The exchanges themselves (ghost selection and forwarding, migration) are the comm layer's
(``simpar.parallel.ghosts``); the capacities and the static layout ``DomainSpec`` are
``simpar.parallel.capacity``'s; the host loop is ``decomposed_sim.DomainSimulation``.

Forces use *full* neighbour lists of the owned atoms over owned + ghost atoms (LAMMPS
``newton off``): every pair that straddles a face is computed on both devices, costing up
to twice the pair work there but needing no reverse force communication (one exchange per
step). Rows are sorted by global id, so each atom's force is summed in the same order as on
one device: in float64 without FMA the decomposed trajectory equals ``single``'s bitwise.

At each rebuild atoms migrate, then ghosts and the neighbour list are rebuilt. When to
rebuild is the run's neighbour policy (``step.Provider``: LAMMPS's ``every N check yes|no``;
the default is the exact one, any atom moved more than ``skin / 2``), decided from values
reduced over all devices (the step counter, the largest displacement), so every device
rebuilds together and at the steps ``single`` does. Any policy keeps the ghost slab exact:
ghosts are selected anew at every build from the positions at that build, the list holds
the pairs within cutoff + skin *at the build* (the owned atoms are inside the sub-box then,
so each partner lies in the slab), and between builds the list and the ghost set are fixed
while the ghosts' positions follow, whatever distance the atoms travel. A longer policy
misses the same pairs as on one device (LAMMPS's "dangerous builds"), no more. What it
changes is how far an atom may travel between builds: a migrating atom moves one sub-box
per axis, so one that crossed a whole sub-box since the last build stops the run with
"lost atoms" (as in LAMMPS), and more atoms migrate per build (a repairable overflow). Langevin noise is drawn for every atom of the system from the replicated key
and picked by id, so a seed gives the same trajectory on every mesh.

Nothing is lost: owned, migration, send and neighbour capacities are static; any overflow
sets a bit of ``DomainLists.error`` (``error_codes``) reduced over all devices, the chunk
stops, and the host regrows the capacities and redoes the chunk from its saved start. The
relayout rebuilds the ghosts and list from the positions at the last build
(``ref_position``), which gives the same list as before, so a regrow does not change the
trajectory. When a ghost slab wraps around a short box, a block may receive two images of
one atom, or images of its own atoms: the neighbour build keeps only the image that equals
the minimum image (``neighbors.build``), so no pair is counted twice.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simpar.parallel import capacity as caps
from simpar.parallel import ghosts
from simpar.parallel.topology import DeviceGrid
from simpar.particles import domain_spec, error_codes, neighbors, observables
from simpar.particles.domain_spec import DomainSpec
from simpar.particles.forces import pair_forces
from simpar.particles.neighbors import NeighborSpec
from simpar.particles.space import Space, volume
from simpar.particles.step import Provider, md_step, run_steps


class DomainState(NamedTuple):
    """Per-device atoms (a pytree); C = ``spec.capacity``. Slots are sorted by id.

    Attributes:
      position: float[C, 3] wrapped positions (sigma); velocity, force: float[C, 3].
      mass: float[C]; ids: int32[C] global atom ids, -1 for empty slots.
      ref_position: float[C, 3] positions at the last neighbour build (sigma).
      key: uint32[2] Langevin key (the same on every device); step: int32[].
      e_pair, virial: float[] whole-system pair energy and virial (every device).
    """

    position: jax.Array
    velocity: jax.Array
    force: jax.Array
    mass: jax.Array
    ids: jax.Array
    ref_position: jax.Array
    key: jax.Array
    step: jax.Array
    e_pair: jax.Array
    virial: jax.Array


class DomainLists(NamedTuple):
    """Ghosts and neighbour list of one device, fixed between rebuilds (a pytree).

    Attributes:
      sends: int32[S_k] slot indices sent at each stage of ``DomainSpec.stages`` (into
        owned + earlier ghosts; ``capacity + ghosts so far`` marks an unused entry).
      ghost_ids: int32[G] global ids of the ghost slots (-1 unused).
      ghost_position: float[G, 3] current wrapped positions of the ghosts.
      idx: int32[C, M] neighbour list of the owned atoms over owned + ghost slots.
      needed: int32[len(spec.capacities())] largest need of every capacity seen (all devices).
      error: int32[] ``error_codes`` bits (all devices; sticky): a capacity was exceeded
        (``OWNED``, ``MIGRATE``, ``GHOSTS``, ``NEIGHBORS``, ``CELLS``) or atoms went missing
        or jumped more than one sub-box (``LOST``).
      n_builds: int32[] neighbour builds so far.
    """

    sends: tuple
    ghost_ids: jax.Array
    ghost_position: jax.Array
    idx: jax.Array
    needed: jax.Array
    error: jax.Array
    n_builds: jax.Array


def build_block() -> int:
    """Neighbour-build rows per pass for the default backend: ``neighbors.BUILD_BLOCK_CPU``
    on CPU (as ``neighbors.allocate`` for ``single``), 4,096 on accelerators."""
    return neighbors.BUILD_BLOCK_CPU if jax.default_backend() == "cpu" else 4096


def make_spec(grid: DeviceGrid, box, n_atoms: int, *, cutoff: float, skin: float,
              capacity: int, migrate: int, send, max_neighbors: int, column_capacity: int,
              block: int | None = None) -> DomainSpec:  # fmt: skip
    """The static layout for given capacities (``cell_layout``'s ghost axes and cells).

    Args:
      grid: the device grid; box: float[3] box lengths (sigma); n_atoms: atoms in the system.
      cutoff, skin: interaction cutoff and Verlet skin (sigma).
      capacity, migrate, send, max_neighbors, column_capacity: the capacities (``send`` one
        per ghost stage, or one for all); block: neighbour-build rows at once (None:
        ``build_block()``; the list does not depend on it).
    """
    block = build_block() if block is None else int(block)
    radius = float(cutoff) + float(skin)
    ghost_axes, cells, reach, width, _ = caps.cell_layout(grid.shape, box, radius)
    hops = caps.ghost_hops(grid.shape, box, radius, ghost_axes)
    st = caps.stages(hops)
    send = (int(send),) * len(st) if np.ndim(send) == 0 else tuple(send)
    if len(send) != len(st):
        raise ValueError(f"send needs {len(st)} capacities (one per stage), got {len(send)}")
    send = tuple(int(s) if ghost_axes[g[0]] else 0 for s, g in zip(send, st, strict=True))
    n_ext = int(capacity) + int(sum(send))
    wrap = None if all(ghost_axes) else tuple(not g for g in ghost_axes)
    images = None
    if width is not None:  # the image check only where (reach + 2) cells span half the box:
        # elsewhere every candidate is closer than half a box, so it is the minimum image
        box3 = np.broadcast_to(np.asarray(box, np.float64), (3,))
        images = tuple(bool(g and (reach + 2) * w >= 0.5 * b)
                       for g, w, b in zip(ghost_axes, width, box3, strict=True))  # fmt: skip
    nspec = NeighborSpec(
        n_ext, int(max_neighbors), radius, float(skin), False, cells, reach,
        int(column_capacity), (0.0, 0.0, 0.0), width, int(block), int(capacity), wrap,
        images,
    )  # fmt: skip
    return DomainSpec(grid, int(capacity), int(migrate), send, nspec, int(n_atoms),
                      float(skin), ghost_axes, hops)  # fmt: skip


def empty_lists(spec: DomainSpec, dtype) -> DomainLists:
    """Placeholder lists (host, leading device axis) for ``chunk_block(init=True)``."""
    n_dev, cap, g = spec.grid.size, spec.capacity, spec.n_ghosts

    def rep(x):
        x = np.asarray(x)
        return np.broadcast_to(x, (n_dev,) + x.shape).copy()

    ext = cap + g
    return DomainLists(
        tuple(rep(np.full(k, cap, np.int32)) for k in spec.send),
        rep(np.full(g, -1, np.int32)), rep(np.zeros((g, 3), dtype)),
        rep(np.full((cap, spec.nbr.max_neighbors), ext, np.int32)),
        rep(np.zeros(len(spec.capacities()), np.int32)), rep(np.int32(0)), rep(np.int32(0)),
    )  # fmt: skip


def _error_bits(spec: DomainSpec, needed):
    """int32[] ``error_codes`` bits of the capacities ``needed`` (all devices) exceeds."""
    bits = np.zeros(len(spec.capacities()), np.int32)
    bits[domain_spec.NEED_OWNED] = error_codes.OWNED
    bits[domain_spec.NEED_MIGRATE] = error_codes.MIGRATE
    bits[domain_spec.NEED_SEND : domain_spec.NEED_NBR] = error_codes.GHOSTS
    bits[domain_spec.NEED_NBR] = error_codes.NEIGHBORS
    bits[domain_spec.NEED_COL] = error_codes.CELLS
    return error_codes.overflow(needed, spec.capacities(), bits)


def _relist(spec: DomainSpec, comm, space: Space, state: DomainState, lists: DomainLists,
            init):  # fmt: skip
    """Migrate, then ghosts and neighbour list from the reference positions (the current
    ones, or with ``init`` those laid out by the host); errors and needs accumulate."""
    box = space.box.astype(state.position.dtype)
    ref = jnp.where(init, state.ref_position, state.position)
    pos, vel, mass, ref, ids, need, count, far = ghosts.migrate(
        spec, comm, box, state.position, state.velocity, state.mass, ref, state.ids
    )
    s = state._replace(position=pos, velocity=vel, mass=mass, ids=ids, ref_position=ref)
    sends, e_ref, e_img, e_ids, counts = ghosts.borders(spec, comm, box, ref, ids)
    lo = jnp.stack([ghosts.bounds(spec, comm, box, a)[0] for a in range(3)])
    rl = spec.nbr.radius * (1.0 + caps.MARGIN)
    origin = jnp.where(jnp.asarray(spec.ghost_axes), lo - rl, 0.0)  # wrapping axes: 0
    nb = neighbors.build(spec.nbr, space, e_ref, e_ids >= 0, cell_r=e_img - origin, ids=e_ids,
                         id_bound=spec.n_atoms)  # fmt: skip
    needed = jnp.concatenate([jnp.stack([count, need]), counts, nb.needed,
                              far.astype(jnp.int32)[None]]).astype(jnp.int32)  # fmt: skip
    needed = comm.pmax(needed)  # one all-reduce for the needs and the far flag
    needed, far = needed[:-1], needed[-1]
    error = _error_bits(spec, needed)
    total = comm.psum(jnp.sum(ids >= 0, dtype=jnp.int32))
    lost = (far > 0) | ((total != spec.n_atoms) & (error == 0))
    error = error | jnp.where(lost, error_codes.LOST, 0).astype(jnp.int32)
    # the ghosts' positions: their reference positions, which are the positions (and need
    # no second exchange) unless ``init`` laid out reference positions of an earlier build
    ghost_position = jax.lax.cond(init, lambda: ghosts.forward(spec, comm, sends, pos),
                                  lambda: e_ref[spec.capacity :])  # fmt: skip
    new = DomainLists(
        sends, e_ids[spec.capacity :], ghost_position, nb.idx,
        jnp.maximum(needed, lists.needed), error | lists.error, lists.n_builds + 1,
    )  # fmt: skip
    return s, new


def domain_provider(spec: DomainSpec, comm, space: Space,
                    policy: tuple[int, bool] = (1, True)) -> Provider:  # fmt: skip
    """The neighbour provider of the decomposed engines: owned atoms + ghosts over ``comm``,
    migration and a new list at each rebuild, ghost positions forwarded between builds;
    ``policy``: the static ``(every, check)`` neighbour policy (``step.Provider``)."""

    def refresh(s, lists, _init):
        return s, lists._replace(ghost_position=ghosts.forward(spec, comm, lists.sends,
                                                               s.position))  # fmt: skip

    return Provider(
        skin=spec.skin,
        n_draw=spec.n_atoms,
        valid=lambda s: s.ids >= 0,
        ids=lambda s: s.ids,
        reference=lambda s, _lists: s.ref_position,
        reduce_max=comm.pmax,
        rebuild=functools.partial(_relist, spec, comm, space),
        refresh=refresh,
        others=lambda s, lists: jnp.concatenate([s.position, lists.ghost_position]),
        rows=lambda s: neighbors.used_rows(s.ids >= 0),
        every=int(policy[0]),
        check=bool(policy[1]),
    )


def forces_block(spec, comm, space, pot, state: DomainState, lists: DomainLists) -> DomainState:
    """``state`` with forces, whole-system pair energy and virial at its positions."""
    f, e, w = pair_forces(pot, space, state.position, lists.idx, rows=neighbors.used_rows(state.ids >= 0),
                          others=jnp.concatenate([state.position, lists.ghost_position]))  # fmt: skip
    f = jnp.where(state.ids[:, None] >= 0, f, 0.0)
    e, w = comm.psum(jnp.stack([e, w]))  # one all-reduce, each a synchronisation point
    return state._replace(force=f, e_pair=e, virial=w)


def chunk_block(ensemble, spec, comm, space, pot, params, state, lists, n_steps, init,
                policy=(1, True)):  # fmt: skip
    """Up to ``n_steps`` steps of one block (``step.md_step``), stopping at the first error.

    With ``init`` (a traced bool) an extra first iteration rebuilds the ghosts, the
    neighbour list and the forces of a state laid out by ``distribute`` (``lists`` may
    then be ``empty_lists``). The pair energy and virial are refreshed at the end.
    ``policy``: static ``(every, check)`` (``step.Provider``; default the exact policy).
    """
    prov = domain_provider(spec, comm, space, policy)
    step_fn = functools.partial(md_step, ensemble, space, pot, params, prov)
    state, lists = run_steps(step_fn, state, lists, n_steps, init=init)
    return forces_block(spec, comm, space, pot, state, lists)._replace(force=state.force), lists


def thermo_block(comm, space, state: DomainState) -> dict:
    """LAMMPS-style thermo values of the whole system from one device's block.

    Kinetic energy, atom count, pair energy and virial are summed over every device with
    ``comm.psum``; the result (scalars) is the same on every device.
    """
    valid = state.ids >= 0
    ke = comm.psum(observables.kinetic_energy(state.velocity, state.mass, valid))
    n = comm.psum(jnp.sum(valid, dtype=jnp.int32))
    return observables.thermo_from_sums(ke, n, state.e_pair, state.virial, volume(space))
