"""The geometry of the ghost exchange of a spatially decomposed particle run.

Host-side, NumPy only (no tracing): which axes get ghost slabs and how many hops ghosts
travel (``cell_layout``, ``ghost_hops``, ``stages``), and which meshes a box allows
(``check_mesh``). The run's layout itself (``DomainSpec``, the ``NEED_*`` indices, the
capacity guess and regrowth) lives with the particles, in ``simpar.particles.domain_spec``.

Requirements (``check_mesh``): every split sub-box at least ``min_sub_box``: a third of
``cutoff + skin`` (ghosts come from at most ``MAX_HOPS`` = 3 devices away) and the skin
(a migrating atom moves one device); the box at least twice ``cutoff + skin`` (minimum
image).
"""

from __future__ import annotations

import math

import numpy as np

from simpar.errors import ConfigError

MARGIN = 1e-3  # ghost slabs are (1 + MARGIN) * (cutoff + skin) thick: round-off slack
MAX_HOPS = 3  # ghosts travel at most this many devices along an axis (sub-box >= radius / 3)


def shape3(grid_shape) -> tuple[int, int, int]:
    """A device-grid shape of 1 to 3 axes as 3 axes (missing axes are 1)."""
    return tuple(grid_shape) + (1,) * (3 - len(grid_shape))


def stages(hops) -> tuple[tuple[int, int, int], ...]:
    """The ghost exchanges in order: ``(axis, hop, direction)``, ``hops[a]`` hops of two
    directions (-1: to the lower neighbour, +1: to the upper) per axis."""
    return tuple((a, j, d) for a in range(3) for j in range(hops[a]) for d in (-1, 1))


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
