"""Lattice Boltzmann (BGK) on D2Q9 and D3Q19 lattices: fused collide + stream per update.

Everything here is in lattice units (cell size ``dx = 1``, time step ``dt = 1``, sound speed
``c_s^2 = 1/3``). A run stores the **post-collision** populations ``f*_i`` as ``Q`` fields
``f0 .. f{Q-1}`` (:func:`population_names`), each of the spatial shape ``(nx, ny[, nz])``;
:func:`populations` stacks them into ``(Q, nx, ny[, nz])``. They are zero-centred: a field
holds ``f*_i - w_i``, the deviation from the rest equilibrium at unit density, which keeps
float32 round-off (mass drift, steady-state residual) about 100x smaller than storing
``f*_i ~ w_i`` itself. One ``update`` is one lattice time step, streaming first and colliding
second::

    f_i(x)   = f*_i(x - c_i)                              # pull from the radius-1 halo
    f*'_i(x) = f_i(x) + omega (f_i^eq(rho, u) - f_i(x)),  omega = 1 / tau,  tau = 3 nu + 1/2

with ``f_i^eq = w_i rho (1 + 3 c_i.u + 9/2 (c_i.u)^2 - 3/2 u.u)``. Diagonal populations are
read from the corner halo cells, so streaming across device boundaries only needs the standard
halo fill (faces, edges and corners included).

Why one field per population: the whole update (streaming, moments, collision of every
population) then compiles to one loop over the cells that reads each population once and
writes each once (see :func:`fused`). With one stacked ``(Q, ...)`` field XLA:CPU writes the
populations in separate loops, each re-reading all ``Q`` inputs, plus a copy for the stack:
2-3x slower (``experiments/bench_lbm.py``).

Walls: halfway bounce-back (the wall lies on the cell face between the last fluid cell and the
first ghost cell). A model with walls carries one more field ``wall`` ``(nx, ny[, nz])``,
uint8, 0 in the fluid; its boundary condition (:class:`WallFlag`) writes 1 into the ghost cells
of a resting wall and 2 into those of a moving one. Streaming then reads, for each population,
the flag of the cell it is pulled from::

    f_i(x) = f*_i(x - c_i)                                  if wall(x - c_i) == 0
           = f*_opp(i)(x)                                   if wall(x - c_i) == 1
           = f*_opp(i)(x) + 2 w_i rho0 (c_i . u_w) / c_s^2  if wall(x - c_i) == 2  (Ladd 1994)

Why a flag and not a halo fill of the populations: the engines fill each axis's halo from the
block *before* exchanging the next axis (``simpar.parallel.halo.pad``), so a fill cannot see
the tangential neighbour across a device boundary that a diagonal population at a wall needs,
and a fill of one field cannot see the opposite population in another field; the wall velocity
``u_w`` is a parameter (an array leaf, sweepable and differentiable), which a static fill
cannot see either. The flag's fill is a constant, and the bounce-back value is the cell's own
post-collision population, so every engine computes the same numbers bitwise. The ghost values
of the populations at a wall (a mirror fill, ``boundary.Neumann``) are never used by fluid
cells. Mass is conserved to round-off: every population sent into a wall comes back to its
cell, and the moving-wall terms of one cell cancel (``sum_i w_i c_i = 0``).

Corners and edges: the halo is filled axis by axis (x, then y, then z), so ghost cells on an
edge or corner take the flag of the last walled axis: in the lid-driven cavity the two upper
corners move with the lid.

Config (see ``experiments/cavity_re100.toml``)::

    [model]    name = "lbm"
    [grid]     shape = [128, 128]        # cubic cells: length / shape equal on every axis
               length = [1.0, 1.0]
    [boundary] x = "wall"                # "periodic", "wall" (resting) or "lid" (moving)
               y = {lower = "wall", upper = "lid"}
    [physics]  lattice = "D2Q9"          # or "D3Q19" (3-D)
               u_lid = 0.1               # lid speed along +x, lattice units (<= 0.1)
               reynolds = 100.0          # Re = u_lid * nx / nu; or viscosity = ... (lattice
                                         # units), or tau = ... (exactly one of the three)
               rho0 = 1.0
    [initial]  kind = "rest"             # or "shear_wave": amplitude (lattice units), mode
    [steady]   tol = 2e-6                # optional: steady when max|u - u_prev| / u_lid < tol
               every = 1000              # over this many steps (experiments/validate_cavity.py;
                                         # the driver runs time.steps)

Physical units of the output: ``GridSetup.dt`` is ``dx`` (the cell size in length units), so
one lattice speed unit (one cell per step) is one length/time unit and the velocities written
(``ux``, ``uy``[, ``uz``]) equal the lattice velocities; ``time = steps * dx``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid import boundary, stencils
from simpar.grid.domain import Domain, domain_from_config, param_dtype
from simpar.grid.model import GridModel, GridSetup

CS2 = 1.0 / 3.0
MAX_LID_SPEED = 0.1  # lattice units: Mach u/c_s = 0.17; compressibility error ~ Ma^2
AXES = ("x", "y", "z")
WALL_KINDS = ("periodic", "wall", "lid")


# --------------------------------------------------------------------------------------------
# Lattices
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lattice:
    """A DdQq velocity set (static; changing it recompiles).

    Attributes:
      name: ``"D2Q9"`` or ``"D3Q19"``.
      c: ``Q`` integer velocities, each a ``d``-tuple in ``{-1, 0, 1}``; ``c[0]`` is rest.
      w: ``Q`` weights, summing to 1.
    """

    name: str
    c: tuple[tuple[int, ...], ...]
    w: tuple[float, ...]

    @property
    def d(self) -> int:
        """Number of spatial axes (2 or 3)."""
        return len(self.c[0])

    @property
    def q(self) -> int:
        """Number of populations (9 for D2Q9, 19 for D3Q19)."""
        return len(self.c)

    @cached_property
    def opp(self) -> tuple[int, ...]:
        """Index of the opposite velocity: ``c[opp[i]] == -c[i]``."""
        where = {v: i for i, v in enumerate(self.c)}
        return tuple(where[tuple(-a for a in v)] for v in self.c)


def _d3q19() -> Lattice:
    c = [(0, 0, 0)]
    c += [v for v in itertools.product((-1, 0, 1), repeat=3) if sum(map(abs, v)) == 1]
    c += [v for v in itertools.product((-1, 0, 1), repeat=3) if sum(map(abs, v)) == 2]
    w = [1 / 3] + [1 / 18] * 6 + [1 / 36] * 12
    return Lattice("D3Q19", tuple(c), tuple(w))


D2Q9 = Lattice(
    "D2Q9",
    ((0, 0), (1, 0), (0, 1), (-1, 0), (0, -1), (1, 1), (-1, 1), (-1, -1), (1, -1)),
    (4 / 9, 1 / 9, 1 / 9, 1 / 9, 1 / 9, 1 / 36, 1 / 36, 1 / 36, 1 / 36),
)
D3Q19 = _d3q19()
LATTICES = {"D2Q9": D2Q9, "D3Q19": D3Q19}


# --------------------------------------------------------------------------------------------
# Boundary conditions (halo fills)
# --------------------------------------------------------------------------------------------
RESTING, MOVING = 1, 2  # values of the ``wall`` flag field in ghost cells


@dataclass(frozen=True)
class WallFlag:
    """Halo fill of the ``wall`` flag field: 1 in the ghost cells of a resting wall, 2 of a moving one."""

    value: int
    periodic = False

    def fill(self, inner: jax.Array, axis: int, side: int) -> jax.Array:
        """Halo cells all equal to the flag ``value`` (shape and dtype of ``inner``)."""
        return jnp.full(inner.shape, self.value, inner.dtype)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------
def equilibrium(lattice: Lattice, rho, u) -> list:
    """Second-order equilibrium ``f_i^eq = w_i rho (1 + 3 c.u + 4.5 (c.u)^2 - 1.5 u.u)``.

    Args:
      lattice: the velocity set.
      rho: density, any shape ``S`` (lattice units).
      u: ``d`` velocity components, each shape ``S`` (lattice units).

    Returns:
      ``Q`` arrays of shape ``S``.
    """
    usq = sum(ua * ua for ua in u)
    base = 1 - 1.5 * usq
    out = []
    for ci, wi in zip(lattice.c, lattice.w, strict=True):
        cu = _dot(ci, u)
        if cu is None:
            out.append(wi * rho * base)
        else:
            out.append(wi * rho * (base + cu * (3 + 4.5 * cu)))
    return out


def _dot(ci, u):
    """``c_i . u`` for an integer velocity, without multiplications (None when ``c_i == 0``)."""
    out = None
    for ca, ua in zip(ci, u, strict=True):
        if ca == 0:
            continue
        term = ua if ca > 0 else -ua
        out = term if out is None else out + term
    return out


def fused(planes: list) -> list:
    """The same arrays, computed by one loop that writes them all (values unchanged bitwise).

    XLA:CPU does not fuse sibling outputs: ``Q`` populations computed from the same ``Q`` inputs
    become ``Q`` loops, each re-reading every input and recomputing the moments. A variadic
    reduce is one loop with several outputs, so each plane ``p`` is written as the sum over a
    length-2 axis of ``[p, 0]``: ``(0 + p) + 0 == p`` exactly, in any summation order (only the
    sign of a zero can change). D2Q9 1024^2 float32 on 2 CPU cores: 2-3x faster.

    Args:
      planes: arrays of one shape ``S`` and one floating dtype.

    Returns:
      Arrays equal to ``planes``, same shape and dtype.
    """
    if len({(p.shape, p.dtype) for p in planes}) > 1:
        raise ValueError(
            "fused needs arrays of one shape and dtype; got "
            + ", ".join(f"{p.dtype}{list(p.shape)}" for p in planes)
        )
    ops = [
        lax.pad(p[None], jnp.zeros((), p.dtype), [(0, 1, 0)] + [(0, 0, 0)] * p.ndim) for p in planes
    ]
    inits = [jnp.zeros((), p.dtype) for p in planes]
    out = lax.reduce(
        ops, inits, lambda acc, x: tuple(a + b for a, b in zip(acc, x, strict=True)), (0,)
    )
    return list(out)


def population_names(lattice: Lattice) -> tuple[str, ...]:
    """Field names of the populations: ``("f0", ..., "f{Q-1}")``, in the order of ``lattice.c``."""
    return tuple(f"f{i}" for i in range(lattice.q))


def populations(state, lattice: Lattice):
    """The population fields of a state stacked into one array ``(Q, *shape)`` (NumPy or JAX)."""
    arrays = [state[name] for name in population_names(lattice)]
    if all(isinstance(a, np.ndarray) for a in arrays):
        return np.stack(arrays)
    return jnp.stack(arrays)


def moments(lattice: Lattice, df: list, *, opaque_inverse: bool = False):
    """Density and velocity ``(rho, [u_x, u_y, ...])`` from ``Q`` zero-centred populations.

    Args:
      df: ``Q`` arrays ``f_i - w_i`` (populations minus the rest equilibrium at unit density),
        all of one shape ``S``.
      opaque_inverse: multiply ``1 / rho`` by a 1 that XLA cannot see through (same values).
        The divide then has one user, which lets XLA:CPU fuse the density sum into the loop of
        its consumers instead of writing it to memory first (an expensive op with several
        users blocks the fusion of everything upstream of it).

    Returns:
      ``rho`` (``1 + sum_i df_i``) and ``d`` velocity components ``sum_i c_i df_i / rho``, shape ``S``.
    """
    drho = df[0]
    for fi in df[1:]:
        drho = drho + fi
    mom = []
    for a in range(lattice.d):
        m = None
        for ci, fi in zip(lattice.c, df, strict=True):
            if ci[a] == 0:
                continue
            m = (fi if ci[a] > 0 else -fi) if m is None else (m + fi if ci[a] > 0 else m - fi)
        mom.append(m)
    rho = 1 + drho
    inv = 1 / rho
    if opaque_inverse:
        inv = inv * lax.optimization_barrier(jnp.ones((), inv.dtype))
    return rho, [m * inv for m in mom]


def make_model(lattice: Lattice, bcs: tuple) -> GridModel:
    """The BGK lattice Boltzmann model.

    Args:
      lattice: ``D2Q9`` (2-D) or ``D3Q19`` (3-D).
      bcs: per spatial axis ``(lower, upper)``, each ``boundary.Periodic()``, ``"wall"`` (a
        resting wall) or ``"lid"`` (a wall moving with ``params["u_wall"]``).

    Returns:
      A ``GridModel`` named ``lbm`` with radius 1 and fields ``f0 .. f{Q-1}`` ``(*shape)``
      (post-collision populations minus their weights, lattice units, state dtype) and, when
      an axis has walls, ``wall`` ``(*shape)`` uint8 (0 in the fluid; its halo fill marks the
      ghost cells of walls). Params (array leaves, state dtype): ``viscosity`` (nu, lattice
      units; ``tau = 3 nu + 1/2``), ``u_wall`` ``(d,)`` (velocity of the moving walls, lattice
      units), ``rho0`` (density in the moving-wall term, lattice units). Its diagnostics are
      ``mass`` and ``kinetic_energy`` (lattice units), not per-population sums.
    """
    d = lattice.d
    if len(bcs) != d:
        raise ValueError(f"{lattice.name} needs {d} axes of boundary conditions, got {len(bcs)}")
    f_bcs, w_bcs = [], []
    for lo, hi in bcs:
        pair_f, pair_w = [], []
        for b in (lo, hi):
            if b in ("wall", "lid"):
                pair_f.append(boundary.Neumann())  # ghost populations are never read (flag)
                pair_w.append(WallFlag(MOVING if b == "lid" else RESTING))
            elif getattr(b, "periodic", False):
                pair_f.append(boundary.Periodic())
                pair_w.append(boundary.Periodic())
            else:
                raise ValueError(f"unsupported LBM boundary {b!r}; use Periodic(), 'wall' or 'lid'")
        f_bcs.append(tuple(pair_f))
        w_bcs.append(tuple(pair_w))
    has_walls = not all(lo.periodic for lo, _ in f_bcs)
    moving = any(b == "lid" for pair in bcs for b in pair)
    names = population_names(lattice)
    model_bcs = {name: tuple(f_bcs) for name in names}
    if has_walls:
        model_bcs["wall"] = tuple(w_bcs)
    vels, weights, opp = lattice.c, lattice.w, lattice.opp
    zero = (0,) * d

    # Each cell's arithmetic is fixed by this code, not by how XLA cuts it into kernels, so the
    # engines stay bitwise equal (FMA off). The populations are written by one fused loop
    # (``fused``): 2-3x faster on CPU than one loop per population (module docstring).
    def update(state, params):
        fp = [state[name] for name in names]  # each (n_0 + 2k, ...), post-collision
        if has_walls:
            wall = state["wall"]
            # keeps the walls' halo fills (flip + concatenate) out of the fused loop below, where
            # XLA would re-evaluate them at every use (D2Q9 1024^2 cavity: 130 vs 88 MLUPS)
            fp, wall = lax.optimization_barrier((fp, wall))
        if moving:
            scale = 6 * params["rho0"]  # 2 rho0 / c_s^2
            uw = params["u_wall"]
        pulled = []
        for i, ci in enumerate(vels):
            back = tuple(-a for a in ci)
            fi = stencils.shifted(fp[i], back, d)  # f*_i(x - c_i): streaming
            if has_walls and any(ci):
                # halfway bounce-back: the population that left x towards a wall comes back
                flag = stencils.shifted(wall, back, d)
                bounced = stencils.shifted(fp[opp[i]], zero, d)
                if moving:
                    cu = sum(uw[a] * ca for a, ca in enumerate(ci) if ca)
                    bounced = jnp.where(
                        flag == MOVING, bounced + (scale * weights[i]) * cu, bounced
                    )
                fi = jnp.where(flag != 0, bounced, fi)
            pulled.append(fi)
        rho, u = moments(lattice, pulled, opaque_inverse=True)
        usq = sum(ua * ua for ua in u)
        base = (rho - 1) - rho * (1.5 * usq)  # (f_eq - w) / w for c = 0; shared by every i
        omega = 1 / (3 * params["viscosity"] + 0.5)
        out = []
        for i, (ci, wi) in enumerate(zip(vels, weights, strict=True)):
            cu = _dot(ci, u)  # None for the rest population
            dfeq = wi * (base if cu is None else base + rho * (cu * (3 + 4.5 * cu)))  # f_eq - w
            p = pulled[i]
            out.append(p + omega * (dfeq - p))
        # the barrier keeps XLA from fusing consecutive updates (halo > 1) into one expression
        # that recomputes every earlier step per output element (10x slower when it did)
        out = lax.optimization_barrier(tuple(fused(out)))
        new = dict(zip(names, out, strict=True))
        if has_walls:
            new["wall"] = stencils.crop(wall, 1, d)
        return new

    def local_sums(state, params):
        f = [stencils.crop(state[name], 1, d) for name in names]
        rho, u = moments(lattice, f)
        return {
            "mass": jnp.sum(rho),
            "kinetic_energy": 0.5 * jnp.sum(rho * sum(ua * ua for ua in u)),
        }

    # lattice units: density relative to the reference density (dimensionless); one cell
    # per step is 1 m s-1 (module docstring: time = steps * dx, lengths in m)
    units = {name: "1" for name in names}
    units.update({"wall": "1", "rho": "1"})
    units.update({f"u{AXES[a]}": "m s-1" for a in range(d)})
    long_names = {
        name: f"post-collision {lattice.name} population {i} minus its weight (lattice units)"
        for i, name in enumerate(names)
    }
    long_names.update(
        {
            "wall": "wall flag (0 in the fluid; the halo marks walls)",
            "rho": "density (lattice units)",
        }
    )
    long_names.update({f"u{AXES[a]}": f"{AXES[a]} velocity (lattice units)" for a in range(d)})
    return GridModel(
        name="lbm",
        ndim=d,
        radius=1,
        bcs=model_bcs,
        update=update,
        local_sums=local_sums,
        units=units,
        long_names=long_names,
        diagnosed=(),
        diagnostics={
            "mass": ("1", "sum of the density over all cells (lattice units)"),
            "kinetic_energy": ("m2 s-2", "sum of rho |u|^2 / 2 over all cells (lattice units)"),
        },
    )


def make_params(
    domain, viscosity: float, u_wall=None, rho0: float = 1.0, d: int | None = None, *, dtype=None
) -> dict:
    """Params in the state dtype (the shape every grid model's ``make_params`` has).

    Args:
      domain: the :class:`~simpar.grid.domain.Domain` (gives the dtype and ``d``), or, as
        in older calls, a dtype ``"float32"`` / ``"float64"``.
      viscosity: kinematic viscosity nu (lattice units, > 0).
      u_wall: velocity of moving walls, ``d`` values (lattice units); default zero.
      rho0: reference density of the moving-wall term (lattice units).
      d: number of spatial axes (default: the domain's, else 2).
      dtype: override of the domain's dtype.
    """
    dt_ = param_dtype(domain, dtype)
    if d is None:
        d = domain.ndim if isinstance(domain, Domain) else 2
    uw = np.zeros(d) if u_wall is None else np.asarray(u_wall, float)
    return {
        "viscosity": jnp.asarray(viscosity, dt_),
        "u_wall": jnp.asarray(uw, dt_),
        "rho0": jnp.asarray(rho0, dt_),
    }


def tau_from_viscosity(nu: float) -> float:
    """BGK relaxation time ``tau = 3 nu + 1/2`` of kinematic viscosity ``nu`` (lattice units)."""
    return 3 * nu + 0.5


def init_state(model: GridModel, lattice: Lattice, rho, u, dtype) -> dict:
    """Equilibrium populations for given density and velocity (host arrays).

    Args:
      rho: ``(*shape)`` density (lattice units).
      u: ``d`` arrays ``(*shape)``, velocity (lattice units).
      dtype: state dtype.

    Returns:
      ``{"f0": (*shape), ..., "f{Q-1}": (*shape)[, "wall": (*shape) uint8]}``, zero-centred
      (``f_i^eq - w_i``).
    """
    rho = np.asarray(rho, np.float64)
    u = [np.broadcast_to(np.asarray(ua, np.float64), rho.shape) for ua in u]
    feq = equilibrium(lattice, rho, u)
    state = {
        name: (fi - wi).astype(dtype)
        for name, fi, wi in zip(population_names(lattice), feq, lattice.w, strict=True)
    }
    if "wall" in model.bcs:
        state["wall"] = np.zeros(rho.shape, np.uint8)
    return state


# --------------------------------------------------------------------------------------------
# Derived output fields (host side)
# --------------------------------------------------------------------------------------------
def host_moments(lattice: Lattice, f: np.ndarray):
    """``(rho, [u_x, u_y, ...])`` from the populations ``f`` ``(Q, *shape)`` (:func:`populations`).

    Returns float64 arrays of the spatial shape ``(*shape)``.

    The stored populations are post-collision and zero-centred (``f_i - w_i``); BGK conserves
    mass and momentum, so these are the density and velocity of the step (lattice units).
    """
    f = np.asarray(f, np.float64)
    rho = 1 + f.sum(axis=0)
    c = np.asarray(lattice.c, np.float64)  # (Q, d)
    mom = np.tensordot(c.T, f, axes=(1, 0))  # (d, *shape)
    return rho, [m / rho for m in mom]


def output_fields(lattice: Lattice) -> dict:
    """``name -> fn(host_state) -> (*shape) array`` for ``rho``, ``ux``, ``uy``[, ``uz``].

    Each function takes the host state (``{"f0": (*shape), ...}``) and returns a float array
    of the spatial shape ``(nx, ny[, nz])`` in the dtype of the populations: density (lattice
    units) and velocity components (lattice units = length/time of the output, see module
    docstring).
    """

    def rho(state):
        f = populations(state, lattice)
        return host_moments(lattice, f)[0].astype(f.dtype)

    def vel(a):
        def fn(state):
            f = populations(state, lattice)
            return host_moments(lattice, f)[1][a].astype(f.dtype)

        return fn

    out = {"rho": rho}
    for a in range(lattice.d):
        out[f"u{AXES[a]}"] = vel(a)
    return out


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SteadyCriterion:
    """Stop a run when ``max|u(t) - u(t - every)| / u_ref < tol`` (``tol = 0``: never)."""

    tol: float
    every: int
    u_ref: float


def walls_from_config(cfg: Section, ndim: int) -> tuple:
    """Per axis ``(lower, upper)`` from ``[boundary]``: ``"periodic"``, ``"wall"`` or ``"lid"``.

    Returns a tuple of pairs of ``boundary.Periodic()``, ``"wall"`` or ``"lid"``.
    """
    b = cfg.section("boundary")
    out = []

    def one(spec, key):
        if spec not in WALL_KINDS:
            raise ConfigError(
                key, f"must be one of {', '.join(map(repr, WALL_KINDS))}, got {spec!r}"
            )
        return boundary.Periodic() if spec == "periodic" else spec

    for a in range(ndim):
        name = AXES[a]
        spec = b.get(name, "periodic", kind=object)
        key = b.key(name)
        if isinstance(spec, dict):
            extra = set(spec) - {"lower", "upper"}
            if extra:
                raise ConfigError(key, f"unknown entries {sorted(extra)}; allowed: lower, upper")
            lo = one(spec.get("lower", "periodic"), key + ".lower")
            hi = one(spec.get("upper", "periodic"), key + ".upper")
            if (lo == "periodic" or isinstance(lo, boundary.Periodic)) != isinstance(
                hi, boundary.Periodic
            ):
                raise ConfigError(
                    key, "periodic must be set on both sides (lower and upper) or neither"
                )
        else:
            lo = hi = one(spec, key)
        if "lid" in (lo, hi) and a == 0:
            raise ConfigError(
                key, "the lid moves along +x, so it must be a wall normal to y or z, not x"
            )
        out.append((lo, hi))
    for extra in b.data:
        if extra not in AXES[:ndim]:
            b.get(extra, kind=object)
            raise ConfigError(
                b.key(extra), f"unknown axis; a {ndim}-D grid has axes {', '.join(AXES[:ndim])}"
            )
    return tuple(out)


def _model_bcs(walls) -> tuple:
    """``"periodic"``/``Periodic()``, ``"wall"``, ``"lid"`` -> what :func:`make_model` takes."""

    def one(b):
        if b == "periodic" or isinstance(b, boundary.Periodic):
            return boundary.Periodic()
        if b in ("wall", "lid"):
            return b
        raise ValueError(f"unknown LBM boundary {b!r}; use 'periodic', 'wall' or 'lid'")

    return tuple((one(lo), one(hi)) for lo, hi in walls)


def from_config(cfg: Section) -> GridSetup:
    """Read an ``lbm`` config (see module docstring) into a ``GridSetup``.

    The setup also carries ``setup.steady`` (a :class:`SteadyCriterion`) and
    ``setup.lattice``; ``setup.output`` gives ``rho``, ``ux``, ``uy``[, ``uz``] as arrays of the
    spatial shape ``(nx, ny[, nz])`` (see :func:`output_fields`).

    Raises:
      ConfigError: non-cubic cells, a lattice that does not match the grid, an unstable or
        too compressible setting (``tau <= 0.5``, ``u_lid > 0.1``), naming the key.
    """
    domain = domain_from_config(cfg)
    d = domain.ndim
    g = cfg.section("grid")
    if not np.allclose(domain.dx, domain.dx[0], rtol=1e-12):
        raise ConfigError(
            g.key("length"),
            f"lattice Boltzmann needs cubic cells (length / shape equal on every axis); dx = {domain.dx}",
        )
    walls = walls_from_config(cfg, d)
    ph = cfg.section("physics")
    name = ph.get("lattice", "D2Q9" if d == 2 else "D3Q19", kind=str, choices=tuple(LATTICES))
    lattice = LATTICES[name]
    if lattice.d != d:
        raise ConfigError(
            ph.key("lattice"),
            f"{name} is {lattice.d}-D but grid.shape is {d}-D; use {'D2Q9' if d == 2 else 'D3Q19'}",
        )
    has_lid = any(b == "lid" for pair in walls for b in pair)
    u_lid = ph.get("u_lid", 0.1 if has_lid else 0.0, min=0.0, max=MAX_LID_SPEED)
    if u_lid > 0 and not has_lid:
        # an empty or missing [boundary] means periodic on every axis: never drop a lid silently
        raise ConfigError(
            cfg.section("boundary").key(AXES[1]),
            f"physics.u_lid = {u_lid:g} but no [boundary] side is 'lid' (a missing or empty "
            '[boundary] table is periodic on every axis); set e.g. boundary.x = "wall" and '
            'boundary.y = {lower = "wall", upper = "lid"}, or remove physics.u_lid',
        )
    # the populations hold rho0-sized values and the diagnostics sum rho0 * u^2 over cells:
    # keep rho0 well inside the dtype's range (lattice units; 1 is the usual choice)
    rho_max = float(f"{math.sqrt(float(np.finfo(domain.dtype).max)):.2g}")
    rho0 = ph.get("rho0", 1.0, min=0.0, exclusive_min=True, max=rho_max)
    given = [k for k in ("reynolds", "viscosity", "tau") if k in ph]
    if len(given) != 1:
        raise ConfigError(
            ph.key("reynolds"),
            "set exactly one of physics.reynolds (Re = u_lid * nx / nu), physics.viscosity (nu, "
            f"lattice units) or physics.tau (> 0.5); got {', '.join(given) or 'none'}",
        )
    key = ph.key(given[0])
    if given[0] == "reynolds":
        re = ph.get("reynolds", min=0.0, exclusive_min=True)
        if u_lid == 0:
            raise ConfigError(
                key, "physics.reynolds needs physics.u_lid > 0; set physics.viscosity instead"
            )
        nu = u_lid * domain.shape[0] / re
    elif given[0] == "viscosity":
        nu = ph.get("viscosity", min=0.0, exclusive_min=True)
    else:
        nu = (ph.get("tau") - 0.5) / 3
    tau = tau_from_viscosity(nu)
    if tau <= 0.5 + 1e-12:
        raise ConfigError(key, f"gives tau = {tau:.6g}; BGK needs tau > 0.5 (viscosity > 0)")
    if tau < 0.5 + 1e-3:
        raise ConfigError(
            key,
            f"gives tau = {tau:.6g}, too close to 0.5 to be stable (allowed: tau >= 0.501, nu >= 3.3e-4 "
            "lattice units); use more cells (grid.shape) or a lower Reynolds number",
        )
    ini = cfg.section("initial")
    kind = ini.get("kind", "rest", kind=str, choices=("rest", "shear_wave"))
    shape = domain.shape
    rho = np.full(shape, rho0)
    u = [np.zeros(shape) for _ in range(d)]
    if kind == "shear_wave":
        amp = ini.get("amplitude", 0.01, min=-MAX_LID_SPEED, max=MAX_LID_SPEED)
        mode = ini.get("mode", 1, kind=int, min=1)
        y = np.arange(shape[1]) + 0.5
        u[0] = np.broadcast_to(
            amp * np.sin(2 * np.pi * mode * y / shape[1]).reshape(1, -1, *([1] * (d - 2))), shape
        ).copy()
    st = cfg.section("steady")
    tol = st.get("tol", 0.0, min=0.0)
    every = st.get("every", 1000, kind=int, min=1)
    model = make_model(lattice, _model_bcs(walls))
    u_wall = [u_lid] + [0.0] * (d - 1)
    setup = GridSetup(
        model=model,
        domain=domain,
        params=make_params(domain, nu, u_wall, rho0),
        state=init_state(model, lattice, rho, u, domain.dtype),
        dt=float(domain.dx[0]),
        output=output_fields(lattice),
    )
    setup.lattice = lattice
    setup.steady = SteadyCriterion(tol, every, u_lid if u_lid > 0 else 1.0)
    return setup


def lattice_setup(
    shape,
    *,
    walls,
    viscosity: float,
    u_lid: float = 0.0,
    rho0: float = 1.0,
    dtype: str = "float64",
    u0=None,
) -> GridSetup:
    """A setup without a config file (tests, benchmarks).

    Args:
      shape: cells per axis; 2 entries give D2Q9, 3 give D3Q19.
      walls: per axis ``(lower, upper)`` of ``"periodic"``, ``"wall"`` or ``"lid"``.
      viscosity: nu (lattice units).
      u_lid: lid speed along +x (lattice units).
      rho0: density (lattice units).
      dtype: state dtype.
      u0: optional initial velocity, ``d`` arrays ``(*shape)`` (lattice units).
    """
    d = len(shape)
    if "lid" in walls[0]:
        raise ValueError("the lid moves along +x: put it on a wall normal to y or z")
    lattice = D2Q9 if d == 2 else D3Q19
    model = make_model(lattice, _model_bcs(walls))
    u = u0 if u0 is not None else [np.zeros(shape)] * d
    domain = Domain(tuple(shape), tuple(float(n) for n in shape), dtype)
    setup = GridSetup(
        model=model,
        domain=domain,
        params=make_params(domain, viscosity, [u_lid] + [0.0] * (d - 1), rho0),
        state=init_state(model, lattice, np.full(shape, rho0), u, dtype),
        dt=1.0,
        output=output_fields(lattice),
    )
    setup.lattice = lattice
    return setup
