"""Capacity sizing and the static layout of a spatially decomposed particle run.

Host-side, NumPy only (no tracing): which axes get ghost slabs and how many hops ghosts
travel (``cell_layout``, ``ghost_hops``), which meshes a box allows (``check_mesh``), the
capacities measured from a configuration (``guess``) and regrown from what a chunk
``needed`` (``grow``), and ``DomainSpec``, the hashable layout that fixes every buffer size.

The neighbour layout inside ``DomainSpec`` (``nbr``) is built by the particle model (e.g.
``simpar.particles.neighbors.NeighborSpec``); this module reads only its ``radius``,
``max_neighbors`` and ``column_capacity``, so ``simpar.parallel`` imports no model.

Requirements (``check_mesh``): every split sub-box at least ``min_sub_box``: a third of
``cutoff + skin`` (ghosts come from at most ``MAX_HOPS`` = 3 devices away) and the skin
(a migrating atom moves one device); the box at least twice ``cutoff + skin`` (minimum
image).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from simpar.errors import ConfigError
from simpar.parallel.topology import DeviceGrid

MARGIN = 1e-3  # ghost slabs are (1 + MARGIN) * (cutoff + skin) thick: round-off slack
MAX_HOPS = 3  # ghosts travel at most this many devices along an axis (sub-box >= radius / 3)
# layout of the capacity needs (DomainSpec.capacities): owned, migrate, one entry per ghost
# stage, neighbours, column
NEED_OWNED, NEED_MIGRATE, NEED_SEND, NEED_NBR, NEED_COL = 0, 1, 2, -2, -1


def shape3(grid_shape) -> tuple[int, int, int]:
    """A device-grid shape of 1 to 3 axes as 3 axes (missing axes are 1)."""
    return tuple(grid_shape) + (1,) * (3 - len(grid_shape))


def stages(hops) -> tuple[tuple[int, int, int], ...]:
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
    shape = shape3(grid_shape)
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
    s3 = shape3(grid_shape)
    sub = np.asarray(box, np.float64) / np.asarray(s3)
    rl = radius * (1.0 + MARGIN)
    return tuple(int(math.ceil(rl / sub[a])) if ghost_axes[a] else 1 for a in range(3))


def round8(x) -> int:
    """``x`` (a non-negative float or int) rounded up to a whole number, then to a multiple
    of 8 (buffer capacities)."""
    return int(-(-int(math.ceil(x)) // 8) * 8)


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
    s3 = shape3(grid_shape)
    box = np.asarray(box, np.float64)
    split = np.asarray(s3) > 1
    for ghosts in (split, np.ones(3, bool)):
        extent = np.where(ghosts, box / np.asarray(s3) + 2.0 * rl, box)
        for k in (2, 1):  # as neighbors._layout: the finest grid with at least 27 cells
            c = np.maximum(np.floor(extent * k / radius).astype(int), 1)
            if np.all(ghosts | (c >= 2 * k + 1)) and int(np.prod(c)) >= 27:
                width = tuple(float(x) for x in extent / c)
                return (tuple(bool(g) for g in ghosts), tuple(int(x) for x in c), k, width,
                        extent)  # fmt: skip
    return (True, True, True), None, 1, None, extent


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
    new = [max(round8(factor * int(x)), round8(1.5 * int(h))) if o else int(h)
           for h, x, o in zip(have, need, over, strict=True)]  # fmt: skip
    return {
        "capacity": new[NEED_OWNED],
        "migrate": new[NEED_MIGRATE],
        "send": tuple(new[sends]),
        "max_neighbors": new[NEED_NBR],
        "column_capacity": new[NEED_COL],
    }
