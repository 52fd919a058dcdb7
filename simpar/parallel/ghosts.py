"""Ghost atoms and migration of a spatially decomposed particle run, for one block and a
``Comm`` (``LocalComm`` / ``PmapComm`` / ``ShardMapComm`` from ``simpar.parallel.comm``).

The periodic box is cut into ``grid.shape`` sub-boxes (a ``DeviceGrid`` of 1 to 3 axes;
missing axes are not split). Device ``c`` owns the atoms whose wrapped position lies in its
sub-box, in fixed-capacity buffers with the global atom id (``-1`` marks an empty slot). A
periodic one-device run is the 1x1x1 case of the same code, where each exchange is a copy.

Ghosts (LAMMPS ``borders``): at each neighbour-list rebuild, axis by axis (x,
then y over the owned atoms and the x ghosts, then z over everything so far), the atoms
within ``cutoff + skin`` of each face are selected into a fixed-capacity send buffer and
moved to the neighbour by ``ppermute``, so edge and corner ghosts arrive in 2 or 3 hops. A
sub-box thinner than the slab (e.g. 8 slabs of the 16.8-sigma melt box: 2.1 < 2.8) gets its
ghosts from further away: hop ``j`` along an axis forwards the ghosts received at hop
``j - 1`` that are still within the slab (LAMMPS's multiple swaps per dimension;
``DomainSpec.hops``, at most ``MAX_HOPS``). Axes the mesh does not split have no ghosts
(``DomainSpec.ghost_axes``): the block's cell grid wraps around the box there. Each ghost
carries its wrapped position (for distances, with the minimum image, exactly as on one
device) and its periodic image (shifted by the box length when it crosses the box edge;
used only to bin it into the block's cell grid). The selected slot indices are kept;
between rebuilds only the positions are re-sent by the same indices (``forward``). Along
an axis of 2 devices both neighbours are the other device: both directions then travel in
one ``ppermute`` (``_exchange``), halving the collectives, each a synchronisation point
between processes.

Migration (``migrate``, at each rebuild): atoms outside their sub-box go one hop per axis to
the owning neighbour, the owned buffer is compacted and sorted by id (a deterministic slot
order: runs are reproducible and checkpointable).

Host side: ``distribute`` lays global arrays in id order out into per-device buffers,
``collect`` gathers them back and checks that every id is present exactly once. Capacities
are fixed (``simpar.parallel.capacity``); every function here returns what it *needed* so the
caller can flag an overflow, nothing is dropped silently.
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from simpar.errors import SimulationError
from simpar.parallel.capacity import MARGIN
from simpar.parallel.topology import DeviceGrid


class DomainSpec(Protocol):
    """What the exchange reads of a decomposed run's static layout (answered by
    ``simpar.particles.domain_spec.DomainSpec``, which ``simpar.parallel`` does not import)."""

    grid: DeviceGrid
    capacity: int
    migrate: int
    send: tuple[int, ...]
    nbr: object  # radius, max_neighbors, column_capacity
    ghost_axes: tuple[bool, bool, bool]
    hops: tuple[int, int, int]
    stages: tuple[tuple[int, int, int], ...]
    shape3: tuple[int, int, int]


_BIG = np.iinfo(np.int32).max


def _extent(comm, a: int) -> int:
    """Devices along axis ``a`` (1 beyond the comm's axes)."""
    return comm.extent(a) if a < comm.ndim else 1


def _coord(comm, a: int):
    """This device's coordinate along axis ``a`` (traced int32; 0 on unsplit axes)."""
    return comm.coord(a) if _extent(comm, a) > 1 else jnp.int32(0)


def owner(x, length, n: int):
    """Sub-box coordinate (int32) of wrapped coordinates ``x`` along an axis of ``length``
    split into ``n``; the one formula used on the host and on the devices."""
    return jnp.clip(jnp.floor(x * (n / length)).astype(jnp.int32), 0, n - 1)


def _take(x, idx, fill=0):
    """Rows ``idx`` of ``x``; index ``len(x)`` gives ``fill`` (no padded copy of ``x``)."""
    return jnp.take(x, idx, axis=0, mode="fill", fill_value=fill)


def _id_bits(dtype):
    """The integer type as wide as ``dtype`` that carries ids through a float packet."""
    return jnp.int64 if jnp.dtype(dtype).itemsize == 8 else jnp.int32


def _with_ids(x, ids):
    """float[n, k] rows and their int32[n] ids as one float[n, k + 1] packet: the ids' bits
    in the last column (bit casts, exact for any id), so each hop moves one array, one
    synchronisation between processes instead of two."""
    bits = jax.lax.bitcast_convert_type(ids.astype(_id_bits(x.dtype)), x.dtype)
    return jnp.concatenate([x, bits[:, None]], axis=1)


def _split_ids(p):
    """``_with_ids``'s packet back into (float[n, k], int32[n])."""
    return p[:, :-1], jax.lax.bitcast_convert_type(p[:, -1], _id_bits(p.dtype)).astype(jnp.int32)


def _select(mask, cap: int):
    """(int32[cap] indices of the first ``cap`` True entries padded with len(mask), count)."""
    n = mask.shape[0]
    # a prefix sum and a scatter: a tenth of the time of a stable sort of the mask on
    # XLA:CPU (16,392 slots: 0.22 against 2.3-2.7 ms), the same indices
    pos = jnp.cumsum(mask, dtype=jnp.int32) - 1
    dest = jnp.where(mask & (pos < cap), pos, cap)
    idx = jnp.full(cap + 1, n, jnp.int32).at[dest].set(jnp.arange(n, dtype=jnp.int32))
    return idx[:cap], jnp.sum(mask, dtype=jnp.int32)


def _send(comm, a: int, direction: int, x):
    """``x`` moved one device along axis ``a`` (a copy on unsplit axes)."""
    return comm.shift(x, a, direction) if _extent(comm, a) > 1 else x


def _one_peer(comm, a: int) -> bool:
    """Whether both neighbours along axis ``a`` are the same device (2 devices, periodic)."""
    grid = getattr(comm, "grid", None)
    return _extent(comm, a) == 2 and grid is not None and bool(grid.periodic[a])


def _exchange(comm, a: int, down, up):
    """``down`` moved to the lower and ``up`` to the upper neighbour along axis ``a``:
    returns (received from the upper neighbour, received from the lower one), each a tuple
    of arrays like ``down`` / ``up``. With 2 devices on a periodic axis both neighbours are
    the other device, so both directions travel in one ``ppermute`` per array (half the
    collectives, each a synchronisation point between processes); the data are the same."""
    if not _one_peer(comm, a):
        return (tuple(_send(comm, a, -1, x) for x in down),
                tuple(_send(comm, a, +1, x) for x in up))  # fmt: skip
    both = [_send(comm, a, -1, jnp.concatenate([x, y])) for x, y in zip(down, up, strict=True)]
    return (tuple(b[: x.shape[0]] for b, x in zip(both, down, strict=True)),
            tuple(b[x.shape[0] :] for b, x in zip(both, down, strict=True)))  # fmt: skip


def _merge_order(kept, arrived, cap: int):
    """int32[cap]: the rows of ``concatenate([kept, arrived])`` in id order, the first
    ``cap`` of them (padded with the concatenation's length), as a sort of the ids would
    give: a merge, since ``kept`` (int32[C], -1 for holes) holds its valid ids in ascending
    order and only the few ``arrived`` ids (int32[A], -1 unused) need sorting. On XLA:CPU
    it takes a fraction of the time of sorting all C + A ids (16,392 slots: 3 ms).
    """
    c, a = kept.shape[0], arrived.shape[0]
    kv = kept >= 0
    a_key = jnp.where(arrived >= 0, arrived, _BIG)
    a_order = jnp.argsort(a_key).astype(jnp.int32)
    a_sorted = a_key[a_order]
    before = jnp.cumsum(kv, dtype=jnp.int32)  # valid kept slots up to and including each
    # the running maximum of the kept ids is sorted: an arrived id goes before the first
    # kept slot whose running maximum exceeds it, after the kept ids below it
    top = jax.lax.cummax(jnp.where(kv, kept, -1))
    first = jnp.searchsorted(top, a_sorted).astype(jnp.int32)
    below = jnp.where(first > 0, before[jnp.maximum(first - 1, 0)], 0)
    a_dest = jnp.where(a_sorted < _BIG, jnp.arange(a, dtype=jnp.int32) + below, cap)
    # a kept id goes after the kept ids and the arrived ids below it: those whose slot
    # ``first`` is at or before its own (a histogram and a prefix sum, no second search)
    hist = jnp.zeros(c + 1, jnp.int32).at[jnp.where(a_sorted < _BIG, first, c)].add(1)
    k_dest = jnp.where(kv, before - 1 + jnp.cumsum(hist)[:c], cap)
    dest = jnp.concatenate([k_dest, a_dest])
    src = jnp.concatenate([jnp.arange(c, dtype=jnp.int32), c + a_order])
    return jnp.full(cap, c + a, jnp.int32).at[dest].set(src, mode="drop")


def migrate(spec: DomainSpec, comm, box, pos, vel, mass, ref, ids):
    """Move atoms whose ``ref`` lies outside this sub-box one hop per axis to its owner;
    compact and sort the slots by id. The valid slots of ``ids`` must be in id order (as
    ``distribute`` and every migration leave them): the arrivals are merged in.

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
        out = {}
        for mask, direction in ((up, +1), (down, -1)):
            idx, cnt = _select(mask, spec.migrate)
            need = jnp.maximum(need, cnt)
            out[direction] = (_with_ids(_take(payload, idx), _take(ids, idx, -1)),)
        (from_up,), (from_down,) = _exchange(comm, a, out[-1], out[+1])
        from_up, from_down = _split_ids(from_up), _split_ids(from_down)
        # the order of the old code: kept, then arrivals from below, then from above
        parts = [payload, from_down[0], from_up[0]]
        part_ids = [jnp.where(up | down, -1, ids), from_down[1], from_up[1]]
        allp, alli = jnp.concatenate(parts), jnp.concatenate(part_ids)
        count = jnp.sum(alli >= 0, dtype=jnp.int32)
        order = _merge_order(part_ids[0], jnp.concatenate(part_ids[1:]), cap)
        payload, ids = _take(allp, order), _take(alli, order, -1)
    valid = (ids >= 0)[:, None]
    # empty slots: at rest at the origin with unit mass (no 0 / 0 in the kicks)
    payload = jnp.where(valid, payload, 0.0)
    mass = jnp.where(valid[:, 0], payload[:, 9], 1.0)
    return payload[:, :3], payload[:, 3:6], mass, payload[:, 6:9], ids, need, count, far


def bounds(spec: DomainSpec, comm, box, a: int):
    """(lower, upper) face of this device's sub-box along axis ``a`` (sigma, traced)."""
    n = _extent(comm, a)
    w = box[a] / n
    c = _coord(comm, a).astype(box.dtype)
    return c * w, (c + 1.0) * w


def borders(spec: DomainSpec, comm, box, ref, ids):
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
        lo, hi = bounds(spec, comm, box, a)
        prev = None  # (start, size) of the packets the last hop received, per direction
        for _ in range(spec.hops[a]):
            n_ext = e_ids.shape[0]
            x = e_img[:, a]
            packets = []
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
                packets.append((_with_ids(jnp.concatenate([_take(e_ref, idx), img], axis=1),
                                          _take(e_ids, idx, -1)),))  # fmt: skip
            recv = [(p[:, :3], p[:, 3:], i)
                    for (q,) in _exchange(comm, a, *packets) for p, i in [_split_ids(q)]]  # fmt: skip
            down = recv[0][2].shape[0]
            prev = ((n_ext, down), (n_ext + down, recv[1][2].shape[0]))
            e_ref = jnp.concatenate([e_ref] + [r[0] for r in recv])
            e_img = jnp.concatenate([e_img] + [r[1] for r in recv])
            e_ids = jnp.concatenate([e_ids] + [r[2] for r in recv])
    return tuple(sends), e_ref, e_img, e_ids, jnp.stack(counts)


def forward(spec: DomainSpec, comm, sends, pos):
    """Ghost positions by the recorded send indices (every step between rebuilds)."""
    ext, got = pos, []
    stages = [i for i in range(0, len(sends), 2) if sends[i].shape[0] + sends[i + 1].shape[0]]
    for i in stages:  # the two directions of one hop along one axis (axes with ghosts)
        a = spec.stages[i][0]
        (lo,), (hi,) = _exchange(comm, a, (_take(ext, sends[i]),), (_take(ext, sends[i + 1]),))
        got += [lo, hi]
        if i != stages[-1]:  # later hops send from the owned atoms and the ghosts so far
            ext = jnp.concatenate([ext, lo, hi])
    return jnp.concatenate(got) if got else pos[:0]


def owners(spec_shape3, box, ref_position) -> np.ndarray:
    """Flat device index (C order over the grid) owning each atom (host).

    ``owner``'s formula op for op in NumPy (IEEE operations in the positions' dtype: the
    same bits as on the devices), instead of eager JAX operations (a dozen programs to
    compile at every set-up); a non-finite coordinate clamps as XLA's conversion does."""
    ref = np.asarray(ref_position)
    box = np.asarray(box).astype(ref.dtype)
    coords = []
    for a, n in enumerate(spec_shape3):
        c = np.floor(ref[:, a] * (ref.dtype.type(n) / box[a]))
        coords.append(np.clip(np.nan_to_num(c, nan=0.0), 0, n - 1).astype(np.int32))
    return np.ravel_multi_index(coords, spec_shape3)


def distribute(spec: DomainSpec, box, arrays: dict, step: int, key, e_pair=0.0, virial=0.0):
    """Global per-atom arrays in id order -> per-device host state ``(n_dev, C, ...)``.

    Args:
      arrays: ``position``, ``velocity``, ``force``, ``ref_position`` float[N, 3] and
        ``mass`` float[N], atom ``i`` in row ``i``; atoms go to the owner of
        ``ref_position`` (where they were at the last neighbour build).

    Returns:
      (dict of host arrays with a leading device axis: ``position``, ``velocity``,
      ``force``, ``ref_position`` float[D, C, 3], ``mass`` float[D, C], ``ids`` int32[D, C]
      (-1: empty slot), ``key`` uint32[D, 2], ``step`` int32[D], ``e_pair``, ``virial``
      float[D]; the largest owned count, which may exceed C: then atoms were left out).
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
    out.update(
        ids=ids,
        key=rep(key, np.uint32),
        step=rep(step, np.int32),
        e_pair=rep(e_pair, dtype),
        virial=rep(virial, dtype),
    )
    return out, most


def collect(state, n_atoms: int, step=None) -> dict:
    """Per-device host state -> global arrays in id order (+ ``key``, ``step``, ...).

    Args:
      state: any object with the attributes of ``distribute``'s dict (leading device axis).
      n_atoms: atoms in the system; step: the step to report (default the state's).

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
