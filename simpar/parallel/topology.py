"""Device grids: how the devices tile the domain, who neighbours whom, which devices form a row.

A ``DeviceGrid`` of shape ``(a, b[, c])`` splits spatial axis ``i`` of every field into
``shape[i]`` blocks. Devices are numbered in C order over the grid (the last grid axis fastest),
which is the order of the flat ``pmap`` axis and of ``Mesh.devices``. Everything here is plain
Python on the host: neighbour pairs for ``lax.ppermute`` and ``axis_index_groups`` for grouped
collectives are computed once, at trace time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simpar.axes import AXIS_NAMES
from simpar.errors import ConfigError

__all__ = ["AXIS_NAMES", "DeviceGrid", "make_device_grid", "parse_mesh"]


@dataclass(frozen=True)
class DeviceGrid:
    """A 1-, 2- or 3-D grid of devices.

    Attributes:
      shape: devices along each spatial axis, e.g. ``(2, 4)``. Changing it recompiles.
      periodic: per axis, whether the last block's neighbour is the first one.
    """

    shape: tuple[int, ...]
    periodic: tuple[bool, ...]

    def __post_init__(self):
        if len(self.shape) != len(self.periodic):
            raise ValueError(f"shape {self.shape} and periodic {self.periodic} differ in length")
        if not 1 <= len(self.shape) <= 3 or any(n < 1 for n in self.shape):
            raise ValueError(
                f"device grid shape must have 1 to 3 positive entries, got {self.shape}"
            )

    @property
    def ndim(self) -> int:
        """Number of grid axes (1 to 3)."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of devices in the grid."""
        return math.prod(self.shape)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Mesh axis names, ``("x", "y", "z")[:ndim]``."""
        return AXIS_NAMES[: self.ndim]

    def coords(self, index: int) -> tuple[int, ...]:
        """Grid coordinates of flat device ``index`` (C order)."""
        return tuple(int(c) for c in np.unravel_index(index, self.shape))

    def index(self, coords: Sequence[int]) -> int:
        """Flat device index (C order) of grid ``coords``; inverse of ``coords``."""
        return int(np.ravel_multi_index(tuple(coords), self.shape))

    def shift_pairs(self, axis: int, direction: int) -> list[tuple[int, int]]:
        """``ppermute`` pairs sending each device's data to its neighbour along ``axis``.

        Args:
          axis: grid axis.
          direction: +1 sends to the neighbour with the larger coordinate, -1 to the smaller.

        Returns:
          ``(source, destination)`` flat indices. On a non-periodic axis the pairs that would
          wrap around are left out, so the devices at the edge receive zeros: the caller must
          overwrite those with the physical boundary condition.
        """
        pairs = []
        n = self.shape[axis]
        for src in range(self.size):
            c = list(self.coords(src))
            c[axis] += direction
            if not 0 <= c[axis] < n:
                if not self.periodic[axis]:
                    continue
                c[axis] %= n
            pairs.append((src, self.index(c)))
        return pairs

    def axis_pairs(self, axis: int, direction: int) -> list[tuple[int, int]]:
        """The same pairs as ``shift_pairs`` in the coordinates of one grid axis (shard_map)."""
        n = self.shape[axis]
        pairs = []
        for src in range(n):
            dst = src + direction
            if not 0 <= dst < n:
                if not self.periodic[axis]:
                    continue
                dst %= n
            pairs.append((src, dst))
        return pairs

    def groups(self, reduce_axes: Sequence[int]) -> list[list[int]]:
        """``axis_index_groups`` whose members differ only along ``reduce_axes``.

        ``groups((0,))`` on a ``(2, 4)`` grid gives the 4 columns ``[[0, 4], [1, 5], ...]``:
        a psum over each group sums over grid axis 0 and keeps the coordinate along axis 1.
        """
        keep = [a for a in range(self.ndim) if a not in reduce_axes]
        out: dict[tuple[int, ...], list[int]] = {}
        for i in range(self.size):
            c = self.coords(i)
            out.setdefault(tuple(c[a] for a in keep), []).append(i)
        return [out[k] for k in sorted(out)]


def parse_mesh(text: str) -> tuple[int, ...]:
    """Parse ``--mesh 2x4`` into ``(2, 4)``."""
    try:
        shape = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not 1 <= len(shape) <= 3 or any(n < 1 for n in shape):
        raise ConfigError(
            "--mesh",
            f"expected 1 to 3 positive integers joined by 'x' (e.g. 8, 2x4, 2x2x2), got {text!r}",
        )
    return shape


def make_device_grid(
    mesh: Sequence[int], domain_shape: Sequence[int], periodic: Sequence[bool], halo: int
) -> DeviceGrid:
    """Check that ``mesh`` tiles ``domain_shape`` and build the device grid.

    A mesh with fewer entries than the domain has dimensions is padded with 1s
    (``(8,)`` on a 2-D domain splits x into 8 and leaves y whole).

    Raises:
      ConfigError: the mesh has too many axes, does not divide the domain, or makes blocks
        thinner than the halo width.
    """
    ndim = len(domain_shape)
    mesh = tuple(int(n) for n in mesh)
    if len(mesh) > ndim:
        raise ConfigError(
            "--mesh",
            f"mesh {_fmt(mesh)} has more axes than the {ndim}-D domain {_fmt(domain_shape)}",
        )
    mesh = mesh + (1,) * (ndim - len(mesh))
    for axis, (n, m) in enumerate(zip(domain_shape, mesh, strict=True)):
        if n % m:
            raise ConfigError(
                "--mesh",
                f"grid shape {_fmt(domain_shape)} does not divide over device mesh {_fmt(mesh)}: "
                f"axis {AXIS_NAMES[axis]} has {n} cells for {m} devices; choose a mesh whose entries "
                f"divide the grid shape, or change grid.shape",
            )
        if m > 1 and n // m < halo:
            raise ConfigError(
                "parallel.halo",
                f"halo width {halo} exceeds the block size {n // m} along {AXIS_NAMES[axis]} "
                f"(grid {_fmt(domain_shape)} on mesh {_fmt(mesh)}); use a smaller halo or fewer devices",
            )
    return DeviceGrid(mesh, tuple(bool(p) for p in periodic))


def _fmt(shape: Sequence[int]) -> str:
    return "x".join(str(n) for n in shape)
