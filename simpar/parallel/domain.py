"""Spatial domain decomposition of short-range MD: owned atoms, ghost atoms, migration.

The periodic box is cut into ``grid.shape`` sub-boxes (a ``DeviceGrid`` of 1 to 3 axes; missing
axes are not split). Device ``c`` owns the atoms whose wrapped position lies in its sub-box,
in fixed-capacity buffers with the global atom id (``-1`` marks an empty slot). Everything is
written for one block and a ``Comm`` (``LocalComm`` / ``PmapComm`` / ``ShardMapComm`` from
``halo.py``): a periodic one-device run is the 1x1x1 case of the same code, where each
exchange is a local copy.

Ghosts (LAMMPS ``borders``): at each neighbour-list rebuild, axis by axis (x, then y over the
owned atoms and the x ghosts, then z over everything so far), the atoms within
``cutoff + skin`` of each face are selected into a fixed-capacity send buffer and moved to
the neighbour by ``ppermute``, so edge and corner ghosts arrive in 2 or 3 hops. A sub-box
thinner than the slab (e.g. 8 slabs of the 16.8-sigma melt box: 2.1 < 2.8) gets its ghosts
from further away: hop ``j`` along an axis forwards the ghosts received at hop ``j - 1`` that
are still within the slab (LAMMPS's multiple swaps per dimension; ``DomainSpec.hops``,
``ceil(slab / sub-box)``, at most ``MAX_HOPS``). Axes the mesh
does not split have no ghosts (``DomainSpec.ghost_axes``): the block's cell grid wraps around
the box there, as on one device (``cell_layout``; short boxes fall back to ghosts everywhere). Each ghost
carries its wrapped position (for distances, with the minimum image, exactly as on one
device) and its periodic image (position shifted by the box length when it crosses the
box edge; used only to bin it into the block's cell grid). The selected slot indices are
kept; between rebuilds the ghost set is fixed and only the positions are re-sent by the
same indices ("forward communication").

Forces use *full* neighbour lists of the owned atoms over owned + ghost atoms (LAMMPS
``newton off``): every pair that straddles a face is computed on both devices, costing up
to twice the pair work there but needing no reverse force communication (no scatter-add of
ghost forces, one exchange per step). Rows are sorted by global id, so each atom's force
is summed in the same order as on one device: in float64 without FMA the decomposed
trajectory equals ``single``'s bitwise (tested to 1e-9).

Migration: at each rebuild (exact policy: any atom moved more than ``skin / 2``, reduced
over all devices so every device rebuilds together) atoms outside their sub-box go one hop
per axis to the owning neighbour, the owned buffer is compacted and sorted by id (a
deterministic slot order: runs are reproducible and checkpointable), then ghosts and the
neighbour list are rebuilt. Langevin noise is drawn for every atom of the system from the
replicated key and picked by id, so a seed gives the same trajectory on every mesh.

Nothing is lost: owned, migration, send and neighbour capacities are static; any overflow
sets a flag reduced over all devices, the chunk stops, and the host regrows the capacities
and redoes the chunk from its saved start. The relayout rebuilds the ghosts and list from
the positions at the last build (``ref_position``), which gives the same list as before, so
a regrow does not change the trajectory. The host checks the atom count and the ids at
every frame; a mismatch is a ``SimulationError`` naming the step ("lost atoms").

Requirements (``check_mesh``): every split sub-box at least ``min_sub_box``: a third of
``cutoff + skin`` (ghosts come from at most ``MAX_HOPS`` = 3 devices away) and the skin
(a migrating atom moves one device); the box at least twice ``cutoff + skin`` (minimum
image). When a ghost slab wraps around a short box, a block may receive two images of
one atom, or images of its own atoms: the neighbour build keeps only the image that
equals the minimum image (``neighbors.build``), so no pair is counted twice.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from simpar.errors import ConfigError, SimulationError
from simpar.parallel.distributed import gather_blocks, put_blocks, put_global, to_host
from simpar.parallel.halo import LocalComm, PmapComm, ShardMapComm
from simpar.parallel.topology import DeviceGrid
from simpar.particles import integrate, md, neighbors, observables
from simpar.particles.neighbors import NeighborSpec
from simpar.particles.potentials import PairPotential
from simpar.particles.space import Space, displacement, volume, wrap

ENGINES = ("local", "pmap", "shard_map")
_BIG = np.iinfo(np.int32).max
MARGIN = 1e-3  # ghost slabs are (1 + MARGIN) * (cutoff + skin) thick: round-off slack
MAX_HOPS = 3  # ghosts travel at most this many devices along an axis (sub-box >= radius / 3)
# layout of DomainLists.needed: owned, migrate, one entry per ghost stage, neighbours, column
NEED_OWNED, NEED_MIGRATE, NEED_SEND, NEED_NBR, NEED_COL = 0, 1, 2, -2, -1


def _shape3(grid_shape) -> tuple[int, int, int]:
    """A device-grid shape of 1 to 3 axes as 3 axes (missing axes are 1)."""
    return tuple(grid_shape) + (1,) * (3 - len(grid_shape))


def _stages(hops) -> tuple[tuple[int, int, int], ...]:
    """The ghost exchanges in order: ``(axis, hop, direction)``, ``hops[a]`` hops of two
    directions (-1: to the lower neighbour, +1: to the upper) per axis."""
    return tuple((a, j, d) for a in range(3) for j in range(hops[a]) for d in (-1, 1))


@dataclasses.dataclass(frozen=True)
class DomainSpec:
    """Static layout of a decomposed run (hashable; changing any field recompiles).

    Attributes:
      grid: the device grid (1 to 3 axes; axis ``a`` splits spatial axis ``a``).
      capacity: owned-atom slots per device.
      migrate: slots per direction and axis for atoms changing device at a rebuild.
      send: ghost slots sent per stage, in the order of ``stages`` (x down, x up for each
        hop along x, then y, then z; 0 along axes without ghosts).
      nbr: neighbour layout over the ``capacity + sum(send)`` owned + ghost slots, rows for
        the owned slots only, cells over the block's sub-box grown by the ghost slabs.
      n_atoms: atoms in the whole system (ids are ``0 .. n_atoms - 1``).
      skin: Verlet skin (sigma).
      ghost_axes: the spatial axes that have ghost slabs: the split axes, and every axis
        when an unsplit one is too short for a wrapping cell grid. Along an unsplit axis
        without ghosts the block's cell grid wraps around the box (as on one device): no
        ghost is copied and no pair is computed twice there.
      hops: ghost hops per axis, ``ceil(slab / sub-box)`` (1 along axes without ghosts): a
        sub-box thinner than the ghost slab gets its ghosts from up to ``hops`` devices away.
    """

    grid: DeviceGrid
    capacity: int
    migrate: int
    send: tuple[int, ...]
    nbr: NeighborSpec
    n_atoms: int
    skin: float
    ghost_axes: tuple[bool, bool, bool] = (True, True, True)
    hops: tuple[int, int, int] = (1, 1, 1)

    @property
    def stages(self) -> tuple[tuple[int, int, int], ...]:
        """The ghost exchanges in order (``_stages``): ``(axis, hop, direction)``."""
        return _stages(self.hops)

    @property
    def n_ghosts(self) -> int:
        """Ghost slots per device: the sum of the send capacities of every stage."""
        return sum(self.send)

    @property
    def shape3(self) -> tuple[int, int, int]:
        """The device grid as 3 axes (missing axes are 1)."""
        return _shape3(self.grid.shape)

    def capacities(self) -> np.ndarray:
        """The capacities in the layout of ``DomainLists.needed``."""
        return np.array(
            [self.capacity, self.migrate, *self.send, self.nbr.max_neighbors,
             self.nbr.column_capacity],
        )  # fmt: skip


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
      overflow: bool[] some capacity was exceeded (all devices; sticky).
      lost: bool[] atoms went missing or jumped more than one sub-box (all devices).
      n_builds: int32[] neighbour builds so far.
    """

    sends: tuple
    ghost_ids: jax.Array
    ghost_position: jax.Array
    idx: jax.Array
    needed: jax.Array
    overflow: jax.Array
    lost: jax.Array
    n_builds: jax.Array


# ------------------------------------------------------------------------------ per block
def _extent(comm, a: int) -> int:
    return comm.extent(a) if a < comm.ndim else 1


def _coord(comm, a: int):
    return comm.coord(a) if _extent(comm, a) > 1 else jnp.int32(0)


def owner(x, length, n: int):
    """Sub-box coordinate (int32) of wrapped coordinates ``x`` along an axis of ``length``
    split into ``n``; the one formula used on the host and on the devices."""
    return jnp.clip(jnp.floor(x * (n / length)).astype(jnp.int32), 0, n - 1)


def _take(x, idx, fill=0):
    """Rows ``idx`` of ``x``; index ``len(x)`` gives ``fill``."""
    pad = jnp.full((1,) + x.shape[1:], fill, x.dtype)
    return jnp.concatenate([x, pad])[idx]


def _select(mask, cap: int):
    """(int32[cap] indices of the first ``cap`` True entries padded with len(mask), count)."""
    n = mask.shape[0]
    # a stable sort compiles several times faster than jnp.nonzero(size=...) on XLA:CPU
    idx = jnp.argsort(~mask, stable=True).astype(jnp.int32)[:cap]
    if cap > n:
        idx = jnp.concatenate([idx, jnp.full(cap - n, n, jnp.int32)])
    count = jnp.sum(mask, dtype=jnp.int32)
    return jnp.where(jnp.arange(cap) < count, idx, n), count


def _send(comm, a: int, direction: int, x):
    return comm.shift(x, a, direction) if _extent(comm, a) > 1 else x


def _migrate(spec: DomainSpec, comm, box, pos, vel, mass, ref, ids):
    """Move atoms whose ``ref`` lies outside this sub-box one hop per axis to its owner;
    compact and sort the slots by id.

    Returns:
      (pos, vel, mass, ref, ids, largest migration count, owned count before truncation,
      far: an atom is more than one sub-box away).
    """
    cap = spec.capacity
    need = jnp.int32(0)
    far = jnp.zeros((), bool)
    count = jnp.sum(ids >= 0, dtype=jnp.int32)
    payload = jnp.concatenate([pos, vel, ref, mass[:, None]], axis=1)
    for a in range(3):
        n = _extent(comm, a)
        if n == 1:
            continue
        c = comm.coord(a)
        valid = ids >= 0
        d = (owner(payload[:, 6 + a], box[a], n) - c) % n
        up = valid & (d == 1)
        down = valid & (d == n - 1) & ~up
        far = far | jnp.any(valid & (d != 0) & ~up & ~down)
        parts, part_ids = [payload], [jnp.where(up | down, -1, ids)]
        for mask, direction in ((up, +1), (down, -1)):
            idx, cnt = _select(mask, spec.migrate)
            need = jnp.maximum(need, cnt)
            parts.append(_send(comm, a, direction, _take(payload, idx)))
            part_ids.append(_send(comm, a, direction, _take(ids, idx, -1)))
        allp, alli = jnp.concatenate(parts), jnp.concatenate(part_ids)
        count = jnp.sum(alli >= 0, dtype=jnp.int32)
        order = jnp.argsort(jnp.where(alli >= 0, alli, _BIG))[:cap]
        payload, ids = allp[order], alli[order]
    valid = (ids >= 0)[:, None]
    # empty slots: at rest at the origin with unit mass (no 0 / 0 in the kicks)
    payload = jnp.where(valid, payload, 0.0)
    mass = jnp.where(valid[:, 0], payload[:, 9], 1.0)
    return payload[:, :3], payload[:, 3:6], mass, payload[:, 6:9], ids, need, count, far


def _bounds(spec: DomainSpec, comm, box, a: int):
    """(lower, upper) face of this device's sub-box along axis ``a`` (sigma, traced)."""
    n = _extent(comm, a)
    w = box[a] / n
    c = _coord(comm, a).astype(box.dtype)
    return c * w, (c + 1.0) * w


def _borders(spec: DomainSpec, comm, box, ref, ids):
    """Select and exchange the ghosts (at a rebuild), axis by axis, hop by hop.

    Hop 0 of an axis sends the atoms (owned and ghosts of earlier axes) within the slab of
    each face; hop ``j`` forwards, of the atoms received at hop ``j - 1`` from the same
    direction, those still within the slab of this device's face (a sub-box thinner than
    the slab needs atoms from ``j + 1`` devices away). Periodic images are shifted by the
    box length whenever a packet crosses the box edge.

    Returns:
      (sends, ext_ref, ext_image, ext_ids, counts): the send index arrays of every stage,
      the wrapped reference positions, periodic images and ids of owned + ghost slots, and
      the number of atoms each stage wanted to send.
    """
    rl = spec.nbr.radius * (1.0 + MARGIN)
    e_ref, e_img, e_ids = ref, ref, ids
    sends, counts = [], []
    for a in range(3):
        if not spec.ghost_axes[a]:
            sends += [jnp.zeros(0, jnp.int32)] * (2 * spec.hops[a])
            counts += [jnp.int32(0)] * (2 * spec.hops[a])
            continue
        n = _extent(comm, a)
        c = _coord(comm, a)
        length = box[a]
        lo, hi = _bounds(spec, comm, box, a)
        prev = None  # (start, size) of the packets the last hop received, per direction
        for _ in range(spec.hops[a]):
            n_ext = e_ids.shape[0]
            x = e_img[:, a]
            recv = []
            for k, direction in enumerate((-1, +1)):
                cap = spec.send[len(sends)]
                mask = (e_ids >= 0) & ((x < lo + rl) if direction < 0 else (x >= hi - rl))
                if prev is None:
                    idx, cnt = _select(mask, cap)
                else:
                    start, size = prev[k]
                    idx, cnt = _select(mask[start : start + size], cap)
                    idx = jnp.where(idx < size, idx + start, n_ext)
                sends.append(idx)
                counts.append(cnt)
                wraps = (c == 0) if direction < 0 else (c == n - 1)
                shift = jnp.where(wraps, -direction * length, 0.0).astype(e_img.dtype)
                img = _take(e_img, idx).at[:, a].add(shift)
                packet = jnp.concatenate([_take(e_ref, idx), img], axis=1)
                packet = _send(comm, a, direction, packet)
                recv.append(
                    (packet[:, :3], packet[:, 3:], _send(comm, a, direction, _take(e_ids, idx, -1)))
                )
            down = recv[0][2].shape[0]
            prev = ((n_ext, down), (n_ext + down, recv[1][2].shape[0]))
            e_ref = jnp.concatenate([e_ref] + [r[0] for r in recv])
            e_img = jnp.concatenate([e_img] + [r[1] for r in recv])
            e_ids = jnp.concatenate([e_ids] + [r[2] for r in recv])
    return tuple(sends), e_ref, e_img, e_ids, jnp.stack(counts)


def _forward(spec: DomainSpec, comm, sends, pos):
    """Ghost positions by the recorded send indices (every step between rebuilds)."""
    ext = pos
    for i in range(0, len(sends), 2):  # the two directions of one hop along one axis
        if sends[i].shape[0] + sends[i + 1].shape[0] == 0:
            continue  # an axis without ghosts
        a = spec.stages[i][0]
        recv = [_send(comm, a, direction, _take(ext, sends[i + k]))
                for k, direction in enumerate((-1, +1))]  # fmt: skip
        ext = jnp.concatenate([ext] + recv)
    return ext[pos.shape[0] :]


def _relist(spec: DomainSpec, comm, space: Space, state: DomainState, n_builds, extra_needs,
            lost):  # fmt: skip
    """Ghosts and neighbour list from ``state.ref_position`` (ghost positions: current)."""
    box = space.box.astype(state.position.dtype)
    sends, e_ref, e_img, e_ids, counts = _borders(spec, comm, box, state.ref_position, state.ids)
    lo = jnp.stack([_bounds(spec, comm, box, a)[0] for a in range(3)])
    rl = spec.nbr.radius * (1.0 + MARGIN)
    origin = jnp.where(jnp.asarray(spec.ghost_axes), lo - rl, 0.0)  # wrapping axes: 0
    nb = neighbors.build(spec.nbr, space, e_ref, e_ids >= 0, cell_r=e_img - origin, ids=e_ids)
    needed = jnp.concatenate([extra_needs, counts, nb.needed]).astype(jnp.int32)
    needed = comm.pmax(needed)
    overflow = jnp.any(needed > jnp.asarray(spec.capacities(), jnp.int32))
    total = comm.psum(jnp.sum(state.ids >= 0, dtype=jnp.int32))
    lost = comm.pmax(lost.astype(jnp.int32)) > 0
    lost = lost | ((total != spec.n_atoms) & ~overflow)
    return DomainLists(
        sends, e_ids[spec.capacity :], _forward(spec, comm, sends, state.position), nb.idx, needed,
        overflow, lost, n_builds + 1,
    )  # fmt: skip


def _ext(state_pos, lists: DomainLists):
    return jnp.concatenate([state_pos, lists.ghost_position])


def forces_block(spec, comm, space, pot, state: DomainState, lists: DomainLists) -> DomainState:
    """``state`` with forces, whole-system pair energy and virial at its positions."""
    f, e, w = md.pair_forces(pot, space, state.position, lists.idx,
                             others=_ext(state.position, lists))  # fmt: skip
    f = jnp.where(state.ids[:, None] >= 0, f, 0.0)
    return state._replace(force=f, e_pair=comm.psum(e), virial=comm.psum(w))


def _step(ensemble, spec: DomainSpec, comm, space, pot, params, state: DomainState,
          lists: DomainLists, init):  # fmt: skip
    """One time step of one block; with ``init`` (traced bool) no time passes: the ghosts,
    the list and the forces are rebuilt from ``state`` as laid out by ``distribute``."""
    valid = state.ids >= 0
    shift = functools.partial(wrap, space)
    key = state.key
    if ensemble == "nve":
        r, v = integrate.verlet_drift(state.position, state.velocity, state.force,
                                      state.mass, params.dt, shift)  # fmt: skip
    else:
        key, sub = jax.random.split(key)
        # the single engine's stream: one normal triple per atom of the system, by id
        noise = jax.random.normal(sub, (spec.n_atoms, 3), state.velocity.dtype)
        noise = noise[jnp.maximum(state.ids, 0)]
        r, v = integrate.baoab_drift(
            state.position, state.velocity, state.force, state.mass, params.dt,
            params.gamma, params.kt, noise, shift,
        )  # fmt: skip
        v = jnp.where(valid[:, None], v, 0.0)
        r = jnp.where(valid[:, None], r, state.position)
        key = jnp.where(init, state.key, key)
    r = jnp.where(init, state.position, r)
    v = jnp.where(init, state.velocity, v)
    dr = displacement(space, r, state.ref_position)
    d2 = jnp.where(valid, jnp.sum(dr * dr, axis=-1), 0.0)
    rebuild = (comm.pmax(jnp.max(d2)) > jnp.asarray((0.5 * spec.skin) ** 2, r.dtype)) | init
    ref = jnp.where(init, state.ref_position, r)

    def relist(_):
        box = space.box.astype(r.dtype)
        pos, vel, mass, ref2, ids, need, count, far = _migrate(
            spec, comm, box, r, v, state.mass, ref, state.ids
        )
        s = state._replace(position=pos, velocity=vel, mass=mass, ids=ids, ref_position=ref2)
        new = _relist(spec, comm, space, s, lists.n_builds, jnp.stack([count, need]), far)
        new = new._replace(
            needed=jnp.maximum(new.needed, lists.needed),
            overflow=new.overflow | lists.overflow,
            lost=new.lost | lists.lost,
        )
        return s, new

    def forward(_):
        moved = state._replace(position=r, velocity=v)
        return moved, lists._replace(ghost_position=_forward(spec, comm, lists.sends, r))

    s, lists = lax.cond(rebuild, relist, forward, None)
    valid = s.ids >= 0
    f = md.pair_forces(pot, space, s.position, lists.idx, energy=False,
                       others=_ext(s.position, lists))  # fmt: skip
    f = jnp.where(valid[:, None], f, 0.0)
    v = jnp.where(init, s.velocity, integrate.kick(s.velocity, f, s.mass, params.dt))
    if ensemble != "nve":
        v = jnp.where(valid[:, None], v, 0.0)
    step = s.step + jnp.where(init, 0, 1).astype(s.step.dtype)
    return s._replace(velocity=v, force=f, key=key, step=step), lists


def chunk_block(ensemble, spec, comm, space, pot, params, state, lists, n_steps, init):
    """Up to ``n_steps`` steps of one block, stopping early on overflow or lost atoms.

    With ``init`` (a traced bool) an extra first iteration rebuilds the ghosts, the
    neighbour list and the forces of a state laid out by ``distribute`` (``lists`` may
    then be ``empty_lists``). The pair energy and virial are refreshed at the end.
    """

    def cond(carry):
        i, _, nb, first = carry
        return ((i < n_steps) | first) & ~nb.overflow & ~nb.lost

    def body(carry):
        i, s, nb, first = carry
        s, nb = _step(ensemble, spec, comm, space, pot, params, s, nb, first)
        return i + jnp.where(first, 0, 1), s, nb, jnp.zeros((), bool)

    carry = (jnp.int32(0), state, lists, jnp.asarray(init, bool))
    _, state, lists, _ = lax.while_loop(cond, body, carry)
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


# ------------------------------------------------------------------------------ engines
class _Mapper:
    """Runs block functions on the devices; every mapped leaf has a leading device axis.

    ``pmap``: one flat axis ``"dev"`` over the grid (C order); ``shard_map``: a named mesh
    ``grid.axis_names`` with the device axis split over all its axes; ``local``: one device,
    ``LocalComm``.
    """

    def __init__(self, engine: str, grid: DeviceGrid, devices):
        self.engine, self.grid, self.devices = engine, grid, list(devices)
        if engine == "pmap":
            self.comm = PmapComm(grid, "dev")
        elif engine == "shard_map":
            self.comm = ShardMapComm(grid)
            self.mesh = Mesh(
                np.asarray(self.devices, dtype=object).reshape(grid.shape), grid.axis_names,
                axis_types=(AxisType.Auto,) * grid.ndim,
            )  # fmt: skip
            self.spec = P(grid.axis_names)
        else:
            self.comm = LocalComm(3)

    def put(self, tree):
        """Place host arrays ``(n_dev, ...)`` (each process only its own devices' blocks)."""
        if self.engine == "pmap":
            return jax.tree.map(lambda x: put_blocks(x, self.devices), tree)
        if self.engine == "shard_map":
            sh = NamedSharding(self.mesh, self.spec)
            return jax.tree.map(lambda x: put_global(x, sh), tree)
        return jax.tree.map(lambda x: jax.device_put(np.asarray(x), self.devices[0]), tree)

    def get(self, tree):
        """Host arrays ``(n_dev, ...)`` on every process (a collective across processes)."""
        fn = gather_blocks if self.engine == "pmap" else to_host
        return jax.tree.map(fn, tree)

    def map(self, fn, n_mapped: int, n_rep: int):
        """``fn(*mapped, *replicated)`` over the devices; outputs mapped."""
        if self.engine == "pmap":
            return jax.pmap(fn, axis_name="dev", devices=self.devices,
                            in_axes=(0,) * n_mapped + (None,) * n_rep)  # fmt: skip

        def squeezed(*args):
            mapped = [jax.tree.map(lambda x: x[0], a) for a in args[:n_mapped]]
            out = fn(*mapped, *args[n_mapped:])
            return jax.tree.map(lambda x: x[None], out)

        if self.engine == "shard_map":
            specs = (self.spec,) * n_mapped + (P(),) * n_rep
            # check_vma off: flags reduced over all devices (pmax) meet per-device values
            # in lax.cond / while_loop carries; they are equal on every device by design
            return jax.jit(jax.shard_map(squeezed, mesh=self.mesh, in_specs=specs,
                                         out_specs=self.spec, check_vma=False))  # fmt: skip
        return jax.jit(squeezed)


# ------------------------------------------------------------------------------ host side
def min_sub_box(radius: float, skin: float) -> float:
    """The thinnest sub-box a split axis may have (sigma): ghosts reach ``MAX_HOPS``
    devices and migrating atoms one (an atom moves about ``skin / 2`` between builds)."""
    return max(radius * (1.0 + MARGIN) / MAX_HOPS, float(skin))


def check_mesh(grid_shape, box, radius: float, skin: float = 0.0, key: str = "--mesh") -> None:
    """Refuse sub-boxes thinner than ``min_sub_box`` (a third of cutoff + skin).

    Raises:
      ConfigError: naming the mesh, the box and the smallest allowed sub-box.
    """
    box = np.asarray(box, np.float64)
    shape = _shape3(grid_shape)
    sub = box / np.asarray(shape)
    least = min_sub_box(radius, skin)
    thin = [a for a in range(3) if shape[a] > 1 and sub[a] < least]
    if thin:
        mesh = "x".join(map(str, grid_shape))
        raise ConfigError(
            key,
            f"mesh {mesh} cuts the box {np.round(box, 4).tolist()} into sub-boxes "
            f"{np.round(sub, 4).tolist()}, thinner along {', '.join('xyz'[a] for a in thin)} "
            f"than the smallest allowed sub-box {least:.4g} (ghost atoms come from at most "
            f"{MAX_HOPS} devices away: (cutoff + skin) / {MAX_HOPS} = {radius:g} / {MAX_HOPS}; "
            f"at most {[int(b // least) for b in box]} devices per axis): use fewer devices "
            "along that axis or a larger system",
        )


def ghost_hops(grid_shape, box, radius: float, ghost_axes) -> tuple[int, int, int]:
    """Hops per axis that bring every ghost: ``ceil(slab / sub-box)`` along ghost axes."""
    shape3 = _shape3(grid_shape)
    sub = np.asarray(box, np.float64) / np.asarray(shape3)
    rl = radius * (1.0 + MARGIN)
    return tuple(int(math.ceil(rl / sub[a])) if ghost_axes[a] else 1 for a in range(3))


def _round8(x) -> int:
    return int(-(-int(math.ceil(x)) // 8) * 8)


def owners(spec_shape3, box, ref_position) -> np.ndarray:
    """Flat device index (C order over the grid) owning each atom (host, device formula)."""
    ref = jnp.asarray(ref_position)
    box = jnp.asarray(box, ref.dtype)
    coords = [np.asarray(owner(ref[:, a], box[a], n)) for a, n in enumerate(spec_shape3)]
    return np.ravel_multi_index(coords, spec_shape3)


def distribute(spec: DomainSpec, box, arrays: dict, step: int, key, e_pair=0.0, virial=0.0):
    """Global per-atom arrays in id order -> per-device host state ``(n_dev, C, ...)``.

    Args:
      arrays: ``position``, ``velocity``, ``force``, ``ref_position`` float[N, 3] and
        ``mass`` float[N], atom ``i`` in row ``i``; atoms go to the owner of
        ``ref_position`` (where they were at the last neighbour build).

    Returns:
      (host DomainState with a leading device axis, largest owned count).
    """
    n_dev = spec.grid.size
    ref = np.asarray(arrays["ref_position"])
    dtype = ref.dtype
    dev = owners(spec.shape3, box, ref)
    cap = spec.capacity
    out = {k: np.zeros((n_dev, cap) + np.shape(arrays[k])[1:], dtype)
           for k in ("position", "velocity", "force", "ref_position", "mass")}  # fmt: skip
    out["mass"][:] = 1.0  # empty slots: unit mass (no 0 / 0 in the kicks)
    ids = np.full((n_dev, cap), -1, np.int32)
    most = 0
    for d in range(n_dev):
        sel = np.nonzero(dev == d)[0]
        most = max(most, sel.size)
        sel = sel[:cap]
        ids[d, : sel.size] = sel
        for k in out:
            out[k][d, : sel.size] = np.asarray(arrays[k])[sel]
    rep = lambda x, dt: np.broadcast_to(np.asarray(x, dt), (n_dev,) + np.shape(x)).copy()  # noqa: E731
    state = DomainState(
        out["position"], out["velocity"], out["force"], out["mass"], ids, out["ref_position"],
        rep(key, np.uint32), rep(step, np.int32), rep(e_pair, dtype), rep(virial, dtype),
    )  # fmt: skip
    return state, most


def collect(state: DomainState, n_atoms: int, step=None) -> dict:
    """Per-device host state -> global arrays in id order (+ ``key``, ``step``, ...).

    Raises:
      SimulationError: the ids are not exactly ``0 .. n_atoms - 1`` ("lost atoms").
    """
    ids = np.asarray(state.ids).reshape(-1)
    valid = ids >= 0
    got = ids[valid]
    order = np.argsort(got, kind="stable")
    if got.size != n_atoms or not np.array_equal(got[order], np.arange(n_atoms)):
        missing = n_atoms - np.unique(got).size
        raise SimulationError(
            int(np.asarray(state.step).reshape(-1)[0]) if step is None else step,
            f"lost atoms: {got.size} slots hold {np.unique(got).size} distinct ids of "
            f"{n_atoms} atoms ({missing} missing, {got.size - np.unique(got).size} duplicated)",
            "report this as a bug; capacities overflowing are repaired, so this should not happen",
        )

    def flat(x):
        x = np.asarray(x)
        return x.reshape((-1,) + x.shape[2:])[valid][order]

    out = {k: flat(getattr(state, k)) for k in
           ("position", "velocity", "force", "mass", "ref_position")}  # fmt: skip
    for k in ("key", "step", "e_pair", "virial"):
        out[k] = np.asarray(getattr(state, k))[0]
    return out


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
        rep(np.zeros(len(spec.capacities()), np.int32)), rep(False), rep(False), rep(np.int32(0)),
    )  # fmt: skip


def cell_layout(grid_shape, box, radius: float):
    """Ghost axes and the block's cell grid (host side).

    Split axes get ghost slabs and a cell grid over the sub-box grown by them; unsplit axes
    wrap around the whole box (no ghosts) when that grid has at least ``2 * reach + 1``
    cells (as a periodic single-device grid needs); otherwise every axis gets ghosts.

    Returns:
      (ghost_axes bool[3], cells int[3] or None, reach, width float[3] or None (sigma),
      extent float[3]: the span of the cell grid (sigma)).
    """
    rl = radius * (1.0 + MARGIN)
    shape3 = _shape3(grid_shape)
    box = np.asarray(box, np.float64)
    split = np.asarray(shape3) > 1
    for ghosts in (split, np.ones(3, bool)):
        extent = np.where(ghosts, box / np.asarray(shape3) + 2.0 * rl, box)
        for k in (2, 1):  # as neighbors._layout: the finest grid with at least 27 cells
            c = np.maximum(np.floor(extent * k / radius).astype(int), 1)
            if np.all(ghosts | (c >= 2 * k + 1)) and int(np.prod(c)) >= 27:
                width = tuple(float(x) for x in extent / c)
                return (tuple(bool(g) for g in ghosts), tuple(int(x) for x in c), k, width,
                        extent)  # fmt: skip
    return (True, True, True), None, 1, None, extent


def make_spec(grid: DeviceGrid, box, n_atoms: int, *, cutoff: float, skin: float,
              capacity: int, migrate: int, send, max_neighbors: int, column_capacity: int,
              block: int = 4096) -> DomainSpec:  # fmt: skip
    """The static layout for given capacities (``cell_layout``'s ghost axes and cells)."""
    radius = float(cutoff) + float(skin)
    ghost_axes, cells, reach, width, _ = cell_layout(grid.shape, box, radius)
    hops = ghost_hops(grid.shape, box, radius, ghost_axes)
    stages = _stages(hops)
    send = (int(send),) * len(stages) if np.ndim(send) == 0 else tuple(send)
    if len(send) != len(stages):
        raise ValueError(f"send needs {len(stages)} capacities (one per stage), got {len(send)}")
    send = tuple(int(s) if ghost_axes[st[0]] else 0 for s, st in zip(send, stages, strict=True))
    n_ext = int(capacity) + int(sum(send))
    wrap = None if all(ghost_axes) else tuple(not g for g in ghost_axes)
    nspec = NeighborSpec(
        n_ext, int(max_neighbors), radius, float(skin), False, cells, reach,
        int(column_capacity), (0.0, 0.0, 0.0), width, int(block), int(capacity), wrap,
    )  # fmt: skip
    return DomainSpec(grid, int(capacity), int(migrate), send, nspec, int(n_atoms),
                      float(skin), ghost_axes, hops)  # fmt: skip


def _guess(grid: DeviceGrid, box, position, radius: float, skin: float, factor: float
           ) -> dict:  # fmt: skip
    """Capacities measured on the host from the positions (grown on demand later).

    The owned and ghost counts per device and stage, the largest neighbour count (a
    periodic k-d tree) and the fullest column of cells are counted exactly as the devices
    will find them. Owned and ghost counts get ``30 (factor - 1)`` standard deviations of
    head-room (6 for the default 1.2; ghost counts at least the mean density's: a lattice
    start puts whole planes on one side of a face), the lists ``factor`` times the need.
    Tight capacities matter: the force and list kernels cost in proportion to the slots,
    and on one device the layout is exactly ``single``'s (no ghosts, all atoms owned).
    """
    from scipy.spatial import cKDTree

    shape3 = _shape3(grid.shape)
    box = np.asarray(box, np.float64)
    n = int(np.shape(position)[0])
    pos = np.mod(np.asarray(position, np.float64), box)
    pos = np.where(pos >= box, 0.0, pos)
    ghost_axes, cells, reach, width, _ = cell_layout(grid.shape, box, radius)
    hops = ghost_hops(grid.shape, box, radius, ghost_axes)
    rl = radius * (1.0 + MARGIN)
    sub = box / np.asarray(shape3)
    # every periodic image an extended sub-box can hold (ghost axes: -L, 0, +L)
    shifts = np.stack(np.meshgrid(*[[-1.0, 0.0, 1.0] if g else [0.0] for g in ghost_axes],
                                  indexing="ij"), -1).reshape(-1, 3) * box  # fmt: skip
    img = (pos[None] + shifts[:, None]).reshape(-1, 3)
    rho = n / float(np.prod(box))
    stages = _stages(hops)
    owned, send, col = 0, np.zeros(len(stages)), 0
    for d in range(grid.size):
        lo = np.asarray(np.unravel_index(d, shape3)) * sub
        hi = lo + sub
        inside = (img >= lo) & (img < hi)
        grown = np.where(ghost_axes, (img >= lo - rl) & (img < hi + rl), True)
        owned = max(owned, int(np.sum(np.all(inside, axis=1))))
        for i, (a, j, direction) in enumerate(stages):
            if not ghost_axes[a]:
                continue
            # axis a sends from the owned atoms and the ghosts of the earlier axes; hop j
            # (re)sends the atoms of the sub-box j devices away within the face's slab
            region = np.ones(len(img), bool)
            for b in range(3):
                region &= grown[:, b] if b < a else inside[:, b] if b > a else True
            x = img[:, a]
            # distance from the receiving face into this sub-box
            depth = (x - lo[a]) if direction < 0 else (hi[a] - x)
            slab = (depth >= j * sub[a]) & (depth < (j + 1) * sub[a]) & (depth < rl)
            area = float(np.prod(np.where(np.arange(3) < a, sub + 2 * rl, sub)[np.arange(3) != a]))
            mean = rho * area * max(min(rl - j * sub[a], sub[a]), 0.0)
            send[i] = max(send[i], np.sum(slab & region), mean)
        if cells is not None:  # the fullest window of 2 * reach + 1 cells along z
            mine = img[np.all(grown, axis=1)]
            origin = np.where(ghost_axes, lo - rl, 0.0)
            c = np.clip(np.floor((mine - origin) / np.asarray(width)).astype(int), 0,
                        np.asarray(cells) - 1)  # fmt: skip
            counts = np.zeros(cells, np.int64)
            np.add.at(counts, tuple(c.T), 1)
            win = sum(np.roll(counts, s, axis=2) if not ghost_axes[2] else
                      np.pad(counts, ((0, 0), (0, 0), (reach, reach)))[:, :, reach + s:
                                                                       reach + s + cells[2]]
                      for s in range(-reach, reach + 1))  # fmt: skip
            col = max(col, int(win.max()))
    tree = cKDTree(pos, boxsize=box)
    nbr = int(np.max(tree.query_ball_point(pos, radius, return_length=True))) - 1
    sigmas = 30.0 * (factor - 1.0)
    face = max(float(np.prod(np.delete(sub, a))) for a in range(3))

    def room(x):
        return _round8(x + sigmas * math.sqrt(x) + 32)

    return {
        "capacity": min(n, room(owned)) if grid.size > 1 else n,
        # atoms crossing one face between builds: a slab of the skin, twice (a melting start)
        "migrate": _round8(max(0.05 * n / grid.size, 2 * rho * face * skin) + 32),
        "send": tuple(room(x) if x > 0 else 0 for x in send),
        "max_neighbors": _round8(math.ceil(factor * max(nbr, 1))),
        "column_capacity": _round8(math.ceil(factor * max(col, 1))),
    }


def grow(spec: DomainSpec, needed, factor: float) -> dict:
    """Capacities with room for ``factor`` times ``needed`` (never smaller than now).

    An overflowing capacity grows to at least 1.5 times its size, and all six ghost
    stages grow together (a pile-up fills them all): every regrow recompiles, so few
    large steps beat many small ones.
    """
    need = np.asarray(needed)
    have = spec.capacities()
    over = need > have
    sends = slice(NEED_SEND, NEED_NBR)
    if over[sends].any():
        over[sends] = need[sends] > 0.8 * have[sends]
    new = [max(_round8(factor * int(x)), _round8(1.5 * int(h))) if o else int(h)
           for h, x, o in zip(have, need, over, strict=True)]  # fmt: skip
    return {
        "capacity": new[NEED_OWNED],
        "migrate": new[NEED_MIGRATE],
        "send": tuple(new[sends]),
        "max_neighbors": new[NEED_NBR],
        "column_capacity": new[NEED_COL],
    }


_COMPILED: dict = {}  # (name, engine, devices, grid, spec, ensemble) -> mapped program


@dataclasses.dataclass
class DomainSimulation:
    """Host driver of a decomposed MD run (mirrors ``md.Simulation``).

    Attributes:
      engine: ``"pmap"``, ``"shard_map"`` or ``"local"`` (one device, ``LocalComm``).
      spec: static layout (regrown on overflow); state, lists: device arrays with a
        leading device axis.
      regrows: capacity repairs so far; builds: neighbour builds so far.
    """

    engine: str
    ensemble: str
    space: Space
    pot: PairPotential
    params: md.MDParams
    spec: DomainSpec
    mapper: _Mapper
    state: DomainState = None
    lists: DomainLists = None
    capacity_factor: float = 1.2
    regrows: int = 0
    builds: int = 0
    max_regrows: int = 20
    _fns: dict = dataclasses.field(default_factory=lambda: _COMPILED)

    # compiled block functions (one chunk program per layout) ------------------------------
    def _fn(self, name):
        # shared by every run with the same engine, devices, layout and ensemble: a new
        # run (or a test) with an equal layout reuses the compiled program
        k = (name, self.engine, tuple(self.mapper.devices), self.mapper.grid, self.spec,
             self.ensemble)  # fmt: skip
        if k not in self._fns:
            comm, spec, m = self.mapper.comm, self.spec, self.mapper
            if name == "chunk":
                ens = self.ensemble

                def fn(s, nb, sp, pot, par, n, init):
                    return chunk_block(ens, spec, comm, sp, pot, par, s, nb, n, init)

                self._fns[k] = m.map(fn, 2, 5)
            elif name == "thermo":
                self._fns[k] = m.map(lambda s, sp: thermo_block(comm, sp, s), 1, 1)
        return self._fns[k]

    def _first(self, x):
        """Device 0's value of a replicated per-device leaf (host)."""
        return np.asarray(self.mapper.get(x)).reshape((-1,) + np.shape(x)[1:])[0]

    # layout -------------------------------------------------------------------------------
    def global_state(self, state=None) -> dict:
        """The state as global host arrays in atom-id order (for output and checkpoints):
        ``position``, ``velocity``, ``force``, ``ref_position`` float[N, 3], ``mass``
        float[N], and ``key``, ``step``, ``e_pair``, ``virial``.

        Raises:
          SimulationError: the ids are not exactly ``0 .. N - 1`` ("lost atoms").
        """
        return collect(self.mapper.get(self.state if state is None else state),
                       self.spec.n_atoms)  # fmt: skip

    def _launch(self, g: dict, n_steps: int):
        """Lay out global arrays on the devices, rebuild lists and forces, run n steps."""
        while True:
            host, most = distribute(self.spec, self.space.box, g, int(g["step"]), g["key"],
                                    g["e_pair"], g["virial"])  # fmt: skip
            if most <= self.spec.capacity:
                break
            self._regrow({"capacity": _round8(self.capacity_factor * most)})
        state = self.mapper.put(host)
        lists = self.mapper.put(empty_lists(self.spec, host.position.dtype))
        return self._fn("chunk")(state, lists, self.space, self.pot, self.params,
                                 jnp.int32(n_steps), True)  # fmt: skip

    def load(self, g: dict) -> None:
        """Lay out global arrays (as from ``global_state``, from any mesh) on this run's
        devices, growing capacities until everything fits. The ghosts and the list are
        rebuilt from ``ref_position``: the same list as when it was built."""
        self._run(g, 0, launch=True)

    def _run(self, g, n_steps: int, launch: bool) -> None:
        for _ in range(self.max_regrows):
            if launch:
                state, lists = self._launch(g, n_steps)
                base = 1
            else:
                state, lists = self._fn("chunk")(
                    self.state, self.lists, self.space, self.pot, self.params,
                    jnp.int32(n_steps), False,
                )  # fmt: skip
                base = int(self._first(self.lists.n_builds))
            if not bool(self._first(lists.overflow)):
                if bool(self._first(lists.lost)):
                    raise SimulationError(
                        int(self._first(state.step)),
                        "lost atoms: an atom jumped more than one sub-box between neighbour "
                        "builds, or the atom count changed",
                        "reduce time.dt (the run is unstable)",
                    )  # fmt: skip
                self.builds += int(self._first(lists.n_builds)) - base
                self.state, self.lists = state, lists
                return
            self._regrow(grow(self.spec, self._first(lists.needed), self.capacity_factor))
            if not launch:
                g = self.global_state()  # the chunk's start: redo it with the new layout
                launch = True
        raise RuntimeError(f"capacities still overflow after {self.max_regrows} regrows")

    def _regrow(self, caps: dict) -> None:
        old = {"capacity": self.spec.capacity, "migrate": self.spec.migrate,
               "send": self.spec.send, "max_neighbors": self.spec.nbr.max_neighbors,
               "column_capacity": self.spec.nbr.column_capacity}  # fmt: skip
        old.update(caps)
        self.spec = make_spec(
            self.spec.grid, np.asarray(self.space.box), self.spec.n_atoms,
            cutoff=float(self.pot.cutoff), skin=self.spec.skin, block=self.spec.nbr.block,
            **old,
        )  # fmt: skip
        self.regrows += 1

    # running ------------------------------------------------------------------------------
    def advance(self, n_steps: int) -> None:
        """Run ``n_steps`` steps; on overflow regrow and redo the chunk from its start."""
        self._run(None, n_steps, launch=False)

    def thermo(self) -> dict[str, float]:
        """Current thermo values (``observables.thermo`` keys) as Python floats."""
        out = self._fn("thermo")(self.state, self.space)
        return {k: float(self._first(v)) for k, v in out.items()}

    def current_step(self) -> int:
        """The step counter of the state (the same on every device)."""
        return int(self._first(self.state.step))

    def counts(self) -> np.ndarray:
        """Owned atoms per device (host)."""
        return (np.asarray(self.mapper.get(self.state.ids)) >= 0).sum(axis=1)


def make_domain_simulation(
    engine: str,
    mesh,
    space: Space,
    pot: PairPotential,
    position,
    velocity,
    *,
    mass=1.0,
    key=None,
    dt: float,
    ensemble: str = "nve",
    kt: float = 0.0,
    gamma: float = 0.0,
    skin: float = 0.3,
    step: int = 0,
    capacity_factor: float = 1.2,
    capacities: dict | None = None,
    devices=None,
    max_neighbors: int | None = None,
    restore: dict | None = None,
) -> DomainSimulation:
    """Set up a decomposed run (periodic box), like ``md.make_simulation``.

    Args:
      engine: ``"pmap"``, ``"shard_map"`` or ``"local"``.
      mesh: device-grid shape, 1 to 3 entries (e.g. ``(8,)``, ``(2, 4)``, ``(2, 2, 2)``).
      space: a periodic space; pot: the pair potential.
      position, velocity: float[N, 3] (atom ``i`` gets id ``i``); their dtype is the state's.
      capacities: optional initial capacities (keys of ``grow``'s result); too small values
        are repaired by regrowing.
      devices: devices to use (default ``jax.devices()[:prod(mesh)]``).
      max_neighbors: initial neighbour row length (default measured from the density).
      restore: global arrays in atom-id order as from ``DomainSimulation.global_state``
        (a checkpoint, from any mesh or engine): the run continues from them (``position``
        and ``velocity`` are then ignored), bit for bit on the same mesh.
      Others as in ``md.make_simulation``.

    Raises:
      ConfigError: a sub-box thinner than cutoff + skin or too few devices.
    """
    if not space.periodic:
        raise ConfigError("system.boundary", "domain decomposition needs a periodic box")
    if ensemble not in md.ENSEMBLES:
        raise ValueError(f"ensemble must be one of {md.ENSEMBLES}, got {ensemble!r}")
    mesh = tuple(int(m) for m in mesh)
    grid = DeviceGrid(mesh, (True,) * len(mesh))
    devices = list(devices) if devices is not None else jax.devices()
    if grid.size > len(devices):
        raise ConfigError(
            "--mesh",
            f"mesh {'x'.join(map(str, mesh))} needs {grid.size} devices but only "
            f"{len(devices)} are available (on CPU, pass --devices {grid.size})",
        )
    if engine == "local" and grid.size != 1:
        raise ConfigError("--mesh", f"the local engine runs on one device, got mesh {mesh}")
    position = jnp.asarray(position)
    dtype = position.dtype
    n = position.shape[0]
    box = np.asarray(space.box, np.float64)
    radius = float(pot.cutoff) + float(skin)
    check_mesh(mesh, box, radius, float(skin))
    position = np.asarray(wrap(space, position))
    key = jax.random.PRNGKey(0) if key is None else key
    g = {
        "position": position,
        "velocity": np.asarray(velocity, dtype),
        "force": np.zeros_like(position),
        "ref_position": position,
        "mass": np.broadcast_to(np.asarray(mass, dtype), (n,)),
        "key": np.asarray(key, np.uint32),
        "step": step,
        "e_pair": 0.0,
        "virial": 0.0,
    }
    if restore is not None:
        g = dict(restore)
    caps = _guess(grid, box, g["ref_position"], radius, float(skin), capacity_factor)
    if max_neighbors:
        caps["max_neighbors"] = int(max_neighbors)
    caps.update(capacities or {})
    spec = make_spec(grid, box, n, cutoff=float(pot.cutoff), skin=skin, **caps)
    mapper = _Mapper(engine, grid, devices[: grid.size])
    sim = DomainSimulation(engine, ensemble, space, pot, md.make_params(dt, kt, gamma, dtype),
                           spec, mapper, capacity_factor=capacity_factor)  # fmt: skip
    sim.load(g)
    sim.builds = 1
    return sim
