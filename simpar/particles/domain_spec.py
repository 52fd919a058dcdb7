"""The static layout of a spatially decomposed particle run, next to its constructor.

``DomainSpec`` (the hashable layout that fixes every buffer size), the ``NEED_*`` indices of
a chunk's capacity needs, the capacities measured from a configuration (``guess``) and regrown
from what a chunk ``needed`` (``grow``). Host-side, NumPy only. The exchange geometry it uses
(ghost slabs, hops, meshes a box allows) is ``simpar.parallel.capacity``; the neighbour layout
inside ``DomainSpec`` (``nbr``) is ``simpar.particles.neighbors.NeighborSpec``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from simpar.parallel.capacity import MARGIN, cell_layout, ghost_hops, shape3, stages
from simpar.parallel.topology import DeviceGrid

# layout of the capacity needs (DomainSpec.capacities): owned, migrate, one entry per ghost
# stage, neighbours, column
NEED_OWNED, NEED_MIGRATE, NEED_SEND, NEED_NBR, NEED_COL = 0, 1, 2, -2, -1


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
    nbr: object  # a neighbour layout: radius, max_neighbors, column_capacity
    n_atoms: int
    skin: float
    ghost_axes: tuple[bool, bool, bool] = (True, True, True)
    hops: tuple[int, int, int] = (1, 1, 1)

    @property
    def stages(self) -> tuple[tuple[int, int, int], ...]:
        """The ghost exchanges in order (``stages``): ``(axis, hop, direction)``."""
        return stages(self.hops)

    @property
    def n_ghosts(self) -> int:
        """Ghost slots per device: the sum of the send capacities of every stage."""
        return sum(self.send)

    @property
    def shape3(self) -> tuple[int, int, int]:
        """The device grid as 3 axes (missing axes are 1)."""
        return shape3(self.grid.shape)

    def capacities(self) -> np.ndarray:
        """The capacities in the order of a chunk's ``needed`` (``NEED_*`` indices)."""
        return np.array(
            [self.capacity, self.migrate, *self.send, self.nbr.max_neighbors,
             self.nbr.column_capacity],
        )  # fmt: skip


def round8(x) -> int:
    """``x`` (a non-negative float or int) rounded up to a whole number, then to a multiple
    of 8 (buffer capacities)."""
    return int(-(-int(math.ceil(x)) // 8) * 8)


def guess(grid: DeviceGrid, box, position, radius: float, skin: float, factor: float
           ) -> dict:  # fmt: skip
    """Capacities measured on the host from the positions (grown on demand later).

    The owned and ghost counts per device and stage, the largest neighbour count (a
    periodic k-d tree) and the fullest column of cells are counted exactly as the devices
    will find them. Ghost counts get ``30 (factor - 1)`` standard deviations of head-room
    (6 for the default 1.2; at least the mean density's count: a lattice start puts whole
    planes on one side of a face), owned counts half as many (3; a liquid's count in a
    sub-box fluctuates less than a Poisson count, and an overflow only regrows), the lists
    ``factor`` times the need. Tight capacities matter: the force and list kernels cost in
    proportion to the slots (every owned slot is a row: in.lj on 2 devices has 16,000 atoms
    per device, 16,392 rows at 3 standard deviations against 16,792 at 6), and on one
    device the layout is exactly ``single``'s (no ghosts, all atoms owned).
    """
    from scipy.spatial import cKDTree

    s3 = shape3(grid.shape)
    box = np.asarray(box, np.float64)
    n = int(np.shape(position)[0])
    pos = np.mod(np.asarray(position, np.float64), box)
    pos = np.where(pos >= box, 0.0, pos)
    ghost_axes, cells, reach, width, _ = cell_layout(grid.shape, box, radius)
    hops = ghost_hops(grid.shape, box, radius, ghost_axes)
    rl = radius * (1.0 + MARGIN)
    sub = box / np.asarray(s3)
    # every periodic image an extended sub-box can hold (ghost axes: -L, 0, +L)
    shifts = np.stack(np.meshgrid(*[[-1.0, 0.0, 1.0] if g else [0.0] for g in ghost_axes],
                                  indexing="ij"), -1).reshape(-1, 3) * box  # fmt: skip
    img = (pos[None] + shifts[:, None]).reshape(-1, 3)
    rho = n / float(np.prod(box))
    st = stages(hops)
    owned, send, col = 0, np.zeros(len(st)), 0
    for d in range(grid.size):
        lo = np.asarray(np.unravel_index(d, s3)) * sub
        hi = lo + sub
        inside = (img >= lo) & (img < hi)
        grown = np.where(ghost_axes, (img >= lo - rl) & (img < hi + rl), True)
        owned = max(owned, int(np.sum(np.all(inside, axis=1))))
        for i, (a, j, direction) in enumerate(st):
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
        return round8(x + sigmas * math.sqrt(x) + 32)

    return {
        "capacity": min(n, round8(owned + 0.5 * sigmas * math.sqrt(owned) + 8))
        if grid.size > 1
        else n,
        # atoms crossing one face between builds: a slab of the skin, twice (a melting start)
        "migrate": round8(max(0.05 * n / grid.size, 2 * rho * face * skin) + 32),
        "send": tuple(room(x) if x > 0 else 0 for x in send),
        "max_neighbors": round8(math.ceil(factor * max(nbr, 1))),
        "column_capacity": round8(math.ceil(factor * max(col, 1))),
    }


def grown(have: int, need: int, factor: float) -> int:
    """One capacity regrown for ``need``: ``factor * need`` and at least 1.5 times ``have``,
    rounded up to a multiple of 8 (every regrow recompiles, so few large steps beat many
    small ones). Shared by decomposed MD (:func:`grow`) and PM (``pm_sim``)."""
    return max(round8(factor * int(need)), round8(1.5 * int(have)))


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
    new = [grown(h, x, factor) if o else int(h) for h, x, o in zip(have, need, over, strict=True)]
    return {
        "capacity": new[NEED_OWNED],
        "migrate": new[NEED_MIGRATE],
        "send": tuple(new[sends]),
        "max_neighbors": new[NEED_NBR],
        "column_capacity": new[NEED_COL],
    }
