"""The simulated box of a grid run: cells, lengths, dtype, coordinates, boundary conditions.

Reads the ``[grid]`` and ``[boundary]`` tables shared by every grid model::

    [grid]
    shape = [256, 256]        # cells along x, y[, z]   (changing this recompiles)
    length = [1.0, 1.0]       # box size along x, y[, z] (length units)
    dtype = "float32"         # or "float64"

    [boundary]                # per axis: "periodic", "neumann", "dirichlet" or
    x = "periodic"            # {kind = "dirichlet", value = 1.0}; a table
    y = {lower = "dirichlet", upper = {kind = "dirichlet", value = 1.0}}  # per side
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simpar import precision
from simpar.axes import AXIS_NAMES
from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid import boundary

DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Domain:
    """A cell-centred box.

    Axis order: in Python every field on this domain is an array of shape ``shape`` indexed
    ``(x, y)`` or ``(x, y, z)`` (``u[i, j]`` is the cell centred at ``(coords()[0][i],
    coords()[1][j])``, ``mesh()`` uses ``indexing="ij"``). Output files store the same field
    in netCDF/CF order, time first and the slowest spatial axis next: ``u(time, y, x)`` or
    ``u(time, z, y, x)``, so ``h5py.File(path)["u"][t].T`` is the Python array of frame ``t``
    (README "Output files").

    Attributes:
      shape: cells per axis (x, y[, z]).
      length: box size per axis (length units).
      dtype: ``"float32"`` or ``"float64"`` (float64 needs 64-bit JAX: a ``ConfigError``
        names the fix when ``jax_enable_x64`` is off, see ``simpar.precision``).
    """

    shape: tuple[int, ...]
    length: tuple[float, ...]
    dtype: str = "float32"

    def __post_init__(self):
        precision.require(self.dtype, "Domain.dtype")

    @property
    def ndim(self) -> int:
        """Number of spatial axes (2 or 3)."""
        return len(self.shape)

    @property
    def dx(self) -> tuple[float, ...]:
        """Cell size per axis (length units)."""
        return tuple(L / n for L, n in zip(self.length, self.shape, strict=True))

    def coords(self) -> list[np.ndarray]:
        """Cell-centre coordinates per axis, float64, ``(n_i,)`` each."""
        return [(np.arange(n) + 0.5) * h for n, h in zip(self.shape, self.dx, strict=True)]

    def mesh(self) -> list[np.ndarray]:
        """``np.meshgrid(..., indexing="ij")`` of the cell centres."""
        return np.meshgrid(*self.coords(), indexing="ij")


def param_dtype(domain, dtype=None) -> np.dtype:
    """The dtype of a grid model's params: ``dtype`` if given, else the domain's.

    Every grid model's ``make_params(domain, <physics by name>, dt, *, dtype=None)`` uses
    it, so params and state share one dtype (a float64 run never rounds ``dt``).

    Args:
      domain: a :class:`Domain`, or (older ``lbm.make_params`` calls) a dtype.
      dtype: optional override.

    Raises:
      ConfigError: float64 with 64-bit JAX off (``simpar.precision``).
    """
    if dtype is None:
        dtype = domain.dtype if isinstance(domain, Domain) else domain
    return precision.require(dtype, "dtype")


def outer_product(factors, scale: float = 1.0, dtype=np.float64) -> np.ndarray:
    """``scale * f0[i] * f1[j] (* f2[k])`` as an array of ``dtype``, built in slabs.

    Args:
      factors: one 1-D float64 array per axis, ``(n_0,)``, ``(n_1,)`` ...
      scale: a constant factor.
      dtype: dtype of the result.

    Returns:
      ``(n_0, n_1, ...)`` array; products are taken in float64 and rounded once to
      ``dtype``, a slab of at most 16 MiB at a time (set-up memory: the result only).
    """
    shape = tuple(len(f) for f in factors)
    out = np.empty(shape, dtype)
    rest = np.float64(scale)
    for f in factors[1:]:
        rest = np.multiply.outer(rest, np.asarray(f, np.float64))
    rest = np.asarray(rest)
    rows = max(1, (16 * 2**20) // (8 * max(rest.size, 1)))
    f0 = np.asarray(factors[0], np.float64).reshape(-1, *([1] * (len(shape) - 1)))
    with np.errstate(over="ignore"):  # an overflow to inf is reported by the driver's check
        for i in range(0, shape[0], rows):
            out[i : i + rows] = f0[i : i + rows] * rest
    return out


def uniform_random(shape, seed: int, scale: float = 1.0, dtype=np.float64) -> np.ndarray:
    """``scale * default_rng(seed).random(shape)`` rounded to ``dtype``, built in slabs.

    The values equal those of the one-shot float64 expression (the generator fills the
    array in C order, slab after slab); only a 16 MiB float64 slab exists at a time.
    """
    rng = np.random.default_rng(seed)
    out = np.empty(shape, dtype)
    row = math.prod(shape[1:])
    rows = max(1, (16 * 2**20) // (8 * max(row, 1)))
    for i in range(0, shape[0], rows):
        n = min(rows, shape[0] - i)
        out[i : i + n] = scale * rng.random((n, *shape[1:]))
    return out


def domain_from_config(cfg: Section, ndims=(2, 3)) -> Domain:
    """The ``[grid]`` table as a :class:`Domain`.

    Raises:
      ConfigError: a bad shape, length or dtype (``grid.dtype = "float64"`` with 64-bit JAX
        off names the fix).
    """
    g = cfg.section("grid", required=True)
    shape = g.get("shape", kind=int, length=ndims, min=1)
    length = g.get(
        "length", [1.0] * len(shape), kind=float, length=len(shape), min=0.0, exclusive_min=True
    )
    dtype = g.get("dtype", "float32", kind=str, choices=DTYPES)
    precision.require(dtype, g.key("dtype"))
    return Domain(tuple(shape), tuple(length), dtype)


def boundaries_from_config(cfg: Section, ndim: int, default="periodic") -> tuple:
    """Per axis ``(lower, upper)`` boundary conditions from ``[boundary]``."""
    b = cfg.section("boundary")
    out = []
    for a in range(ndim):
        name = AXIS_NAMES[a]
        spec = b.get(name, default, kind=object)
        key = b.key(name)
        if isinstance(spec, dict) and ("lower" in spec or "upper" in spec):
            extra = set(spec) - {"lower", "upper"}
            if extra:
                raise ConfigError(key, f"unknown entries {sorted(extra)}; allowed: lower, upper")
            lo = boundary.from_config(spec.get("lower", default), key + ".lower")
            hi = boundary.from_config(spec.get("upper", default), key + ".upper")
            if lo.periodic != hi.periodic:
                raise ConfigError(
                    key, "periodic must be set on both sides (lower and upper) or neither"
                )
        else:
            lo = hi = boundary.from_config(spec, key)
        out.append((lo, hi))
    for extra in b.data:
        if extra not in AXIS_NAMES[:ndim]:
            b.get(extra, kind=object)  # mark as read, then report clearly
            raise ConfigError(
                b.key(extra),
                f"unknown axis; a {ndim}-D grid has axes {', '.join(AXIS_NAMES[:ndim])}",
            )
    return tuple(out)
