"""Lattice Boltzmann set-ups: the ``lbm`` config reader and config-free set-ups.

The physics (lattices, the fused update, moments, output fields) is :mod:`simpar.grid.lbm`;
this module imports it (``simpar.drive.grid.lbm`` runs ``lbm_config.from_config``).

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

Units of the output: ``GridSetup.dt`` is ``dx`` (the cell size in length units), so
``time = steps * dx``; the fields stay in lattice units and say so: the velocities written
(``ux``, ``uy``[, ``uz``]) are cells per time step (``units = "1"``, Mach number
``u sqrt(3)``), the density is relative to ``rho0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid import boundary
from simpar.grid.domain import Domain, domain_from_config
from simpar.grid.lbm import (
    AXES,
    D2Q9,
    D3Q19,
    LATTICES,
    MAX_LID_SPEED,
    WALL_KINDS,
    init_state,
    make_model,
    make_params,
    output_fields,
    tau_from_viscosity,
)
from simpar.grid.model import GridSetup

__all__ = ["SteadyCriterion", "from_config", "lattice_setup", "walls_from_config"]


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
