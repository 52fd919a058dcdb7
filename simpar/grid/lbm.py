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

The config reader (``from_config``, ``lattice_setup``, ``walls_from_config``,
``SteadyCriterion``) is :mod:`simpar.grid.lbm_config`, which imports this module (and not
the other way round).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simpar.grid import boundary, stencils
from simpar.grid.domain import Domain, param_dtype
from simpar.grid.model import GridModel

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

    # lattice units, stated as such: density relative to the reference density, velocity in
    # cells per time step (the Mach number is u sqrt(3)); both dimensionless ("1")
    units = {name: "1" for name in names}
    units.update({"wall": "1", "rho": "1"})
    units.update({f"u{AXES[a]}": "1" for a in range(d)})
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
    long_names.update(
        {
            f"u{AXES[a]}": f"{AXES[a]} velocity in lattice units (cells per time step)"
            for a in range(d)
        }
    )
    # population i streams in from x - c_i: it reads the lower halo of axis a when c_i[a] > 0,
    # the upper one when c_i[a] < 0, so at halo width 1 each face sends only the populations
    # that cross it (D2Q9: 3 of 9, D3Q19: 5 of 19), as XLB's ``distribute`` does; the corner
    # cells a diagonal population reads come with the later axes' slabs (axis by axis)
    halo_sides = {
        name: tuple((ci[a] > 0, ci[a] < 0) for a in range(d))
        for name, ci in zip(names, vels, strict=True)
    }
    return GridModel(
        name="lbm",
        ndim=d,
        radius=1,
        bcs=model_bcs,
        halo_sides=halo_sides,
        update=update,
        local_sums=local_sums,
        units=units,
        long_names=long_names,
        diagnosed=(),
        diagnostics={
            "mass": ("1", "sum of the density over all cells (lattice units)"),
            "kinetic_energy": ("1", "sum of rho |u|^2 / 2 over all cells (lattice units)"),
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
