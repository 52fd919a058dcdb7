"""The wave equation ``u_tt = c^2 lap(u)`` by the leapfrog (central-difference) scheme.

In time the three-level leapfrog ``u^{n+1} = 2 u^n - u^{n-1} + (c dt)^2 L u^n`` (second order,
time-reversible); in space the (2d+1)-point Laplacian ``L`` (second order). The state holds
two fields, ``u`` (``u^n``) and ``u_prev`` (``u^{n-1}``), both with the boundary conditions of
``u``; one ``update`` consumes one halo cell (radius 1).

Stability (von Neumann): the Courant number ``C = c dt sqrt(sum_i 1/dx_i^2)`` must be below 1
(at ``C = 1`` the checkerboard mode grows linearly); checked when the config is read.

Conserved energy. With periodic, Neumann or homogeneous Dirichlet walls the halo fill makes
``L`` a symmetric negative semi-definite matrix, and leapfrog conserves exactly (up to
round-off) the discrete energy, written at the half step ``n - 1/2``::

    E = dV * sum_cells [ 1/2 ((u - u_prev) / dt)^2 - 1/2 c^2 u_prev * (L u) ]

(``dV = prod(dx)``). It is positive definite when ``C < 1``. ``local_sums`` returns it as
``energy`` (with its ``kinetic_energy`` and ``potential_energy`` parts, which are not
conserved separately), so it appears in the run diagnostics. With a non-zero Dirichlet value the
walls do work on the field and ``E`` is not conserved.

Start. ``u_prev`` is ``u(-dt)`` from the Taylor series ``u0 - dt v0 + (c dt)^2 / 2 L u0``
(the initial velocity ``v0`` is zero). For a discrete eigenmode ``L phi = -lam phi`` this is
the exact discrete solution ``u^n = cos(omega_d n dt) phi`` with
``cos(omega_d dt) = 1 - (c dt)^2 lam / 2``; ``sin(pi k x / L)`` at cell centres is such an
eigenmode for the Dirichlet-0 (antisymmetric mirror) halo fill, with
``lam = sum_i 4 sin^2(pi k_i dx_i / (2 L_i)) / dx_i^2``.

Config (see ``experiments/wave2d.toml``)::

    [model]   name = "wave"
    [physics] c = 1.0               # wave speed, length / time
    [initial] kind = "sine"         # modes = [1, 1], amplitude (a standing wave; Dirichlet-0)
              # kind = "gaussian": center (length), width (sigma, length), amplitude
    [time]    dt = 1e-3             # Courant number c dt sqrt(sum 1/dx^2) < 1
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid import stencils
from simpar.grid.boundary import Dirichlet, Neumann
from simpar.grid.domain import Domain, boundaries_from_config, domain_from_config, param_dtype
from simpar.grid.heat import bump_from_config, gaussian
from simpar.grid.model import GridModel, GridSetup

FIELDS = ("u", "u_prev")
INITIAL_KINDS = ("sine", "gaussian")


def make_model(ndim: int, bcs: tuple) -> GridModel:
    """The leapfrog wave model on a ``ndim``-D grid.

    Args:
      ndim: 2 or 3.
      bcs: per spatial axis ``(lower, upper)`` boundary conditions, used for ``u`` and
        ``u_prev`` alike.

    Returns:
      A radius-1 ``GridModel`` with fields ``u`` and ``u_prev`` (both ``(n_0, ..., n_{d-1})``,
      units of u). Params (array leaves, state dtype): ``c`` (wave speed, length/time),
      ``dt`` (time), ``dx`` (``(ndim,)``, length).
    """

    def update(state, params):
        u = state["u"]
        inv_dx2 = 1 / (params["dx"] * params["dx"])
        lap = stencils.laplacian(u, [inv_dx2[a] for a in range(ndim)], ndim)
        u_c = stencils.crop(u, 1, ndim)
        u_prev = stencils.crop(state["u_prev"], 1, ndim)
        cdt = params["c"] * params["dt"]
        return {"u": (2 * u_c - u_prev) + (cdt * cdt) * lap, "u_prev": u_c}

    def local_sums(state, params):
        u = state["u"]
        inv_dx2 = 1 / (params["dx"] * params["dx"])
        lap = stencils.laplacian(u, [inv_dx2[a] for a in range(ndim)], ndim)
        u_c = stencils.crop(u, 1, ndim)
        u_prev = stencils.crop(state["u_prev"], 1, ndim)
        dv = jnp.prod(params["dx"])
        rate = (u_c - u_prev) / params["dt"]
        kinetic = 0.5 * dv * jnp.sum(rate * rate)
        potential = -0.5 * dv * params["c"] * params["c"] * jnp.sum(u_prev * lap)
        return {
            "energy": kinetic + potential,
            "kinetic_energy": kinetic,
            "potential_energy": potential,
        }

    return GridModel(
        name="wave",
        ndim=ndim,
        radius=1,
        bcs={"u": bcs, "u_prev": bcs},
        update=update,
        local_sums=local_sums,
        units={"u": "m", "u_prev": "m"},
        long_names={"u": "displacement", "u_prev": "displacement one time step earlier"},
        param_units={"physics.c": "m s-1", "time.dt": "s", "initial.amplitude": "m"},
        diagnosed=("u",),
        diagnostics={
            name: (f"m{ndim + 2} s-2", f"{what} (1/2 integral of {term} dV, per unit density)")
            for name, what, term in (
                ("energy", "total energy", "u_t^2 + c^2 |grad u|^2"),
                ("kinetic_energy", "kinetic energy", "u_t^2"),
                ("potential_energy", "potential energy", "c^2 |grad u|^2"),
            )
        },
    )


def make_params(domain: Domain, c: float, dt: float, *, dtype=None) -> dict[str, jax.Array]:
    """Params in the domain dtype (or ``dtype``): ``c`` (m s-1), ``dt`` (s), ``dx``
    (``(ndim,)``, m)."""
    dt_ = param_dtype(domain, dtype)
    return {
        "c": jnp.asarray(c, dt_),
        "dt": jnp.asarray(dt, dt_),
        "dx": jnp.asarray(domain.dx, dt_),
    }


def courant_number(domain: Domain, c: float, dt: float) -> float:
    """``c dt sqrt(sum_i 1/dx_i^2)``; leapfrog is stable when it is below 1."""
    return c * dt * math.sqrt(sum(1 / h**2 for h in domain.dx))


def laplacian_np(u: np.ndarray, domain: Domain, bcs: tuple) -> np.ndarray:
    """The model's (2d+1)-point Laplacian in float64 NumPy, halo filled from ``bcs``.

    Host-side helper for initial conditions and reference solutions.

    Args:
      u: ``(n_0, ..., n_{d-1})``, units of u.
      domain: the box.
      bcs: per axis ``(lower, upper)`` boundary conditions.

    Returns:
      ``(n_0, ..., n_{d-1})`` float64, units of u / length^2.
    """
    u = np.asarray(u, np.float64)
    out = np.zeros_like(u)
    for a, ((lo, hi), h) in enumerate(zip(bcs, domain.dx, strict=True)):
        n = u.shape[a]
        if lo.periodic:
            below, above = np.roll(u, 1, a), np.roll(u, -1, a)
        else:
            below = np.concatenate([_ghost(lo, np.take(u, [0], a)), np.take(u, range(n - 1), a)], a)
            above = np.concatenate(
                [np.take(u, range(1, n), a), _ghost(hi, np.take(u, [n - 1], a))], a
            )
        out += (above + below - 2 * u) / h**2
    return out


def _ghost(bc, edge: np.ndarray) -> np.ndarray:
    """One halo cell from the cell inside the wall (``simpar.grid.boundary`` rules, NumPy)."""
    if isinstance(bc, Dirichlet):
        return 2 * bc.value - edge
    if isinstance(bc, Neumann):
        return edge
    raise TypeError(f"no NumPy halo rule for {bc!r}")  # pragma: no cover


def sine_mode(domain: Domain, modes, amplitude: float = 1.0) -> np.ndarray:
    """``amplitude * prod_i sin(pi k_i x_i / L_i)`` at cell centres, float64.

    A discrete eigenmode of the Laplacian with Dirichlet-0 walls (and with periodic walls for
    even ``k_i``): ``L phi = -discrete_eigenvalue(domain, modes) * phi``.
    """
    factors = [
        np.sin(np.pi * k * x / L)
        for k, x, L in zip(modes, domain.mesh(), domain.length, strict=True)
    ]
    return amplitude * np.prod(factors, axis=0)


def discrete_eigenvalue(domain: Domain, modes) -> float:
    """``lam = sum_i 4 sin^2(pi k_i dx_i / (2 L_i)) / dx_i^2`` (1/length^2)."""
    return sum(
        4 * math.sin(math.pi * k * h / (2 * L)) ** 2 / h**2
        for k, h, L in zip(modes, domain.dx, domain.length, strict=True)
    )


def standing_wave(
    domain: Domain, modes, amplitude: float, c: float, t: float, dt: float | None = None
):
    """The standing wave started at rest from ``sine_mode``, at time ``t``; float64.

    Args:
      dt: ``None`` for the continuous solution ``cos(c |k| t) phi`` (``|k|^2 = sum (pi k_i /
        L_i)^2``); a time step for the exact solution of the discrete scheme,
        ``cos(omega_d t) phi`` with ``cos(omega_d dt) = 1 - (c dt)^2 lam / 2``.
    """
    phi = sine_mode(domain, modes, amplitude)
    if dt is None:
        omega = c * math.sqrt(
            sum((math.pi * k / L) ** 2 for k, L in zip(modes, domain.length, strict=True))
        )
    else:
        omega = math.acos(1 - (c * dt) ** 2 * discrete_eigenvalue(domain, modes) / 2) / dt
    return math.cos(omega * t) * phi


def initial_state(u0: np.ndarray, domain: Domain, bcs: tuple, c: float, dt: float) -> dict:
    """``{"u": u0, "u_prev": u0 + (c dt)^2 / 2 L u0}`` (start at rest), in the domain dtype."""
    u0 = np.asarray(u0, np.float64)
    u_prev = u0 + 0.5 * (c * dt) ** 2 * laplacian_np(u0, domain, bcs)
    return {"u": u0.astype(domain.dtype), "u_prev": u_prev.astype(domain.dtype)}


def from_config(cfg: Section) -> GridSetup:
    """Read ``[grid]``, ``[boundary]``, ``[physics]``, ``[initial]``, ``[time]``.

    Raises:
      ConfigError: ``time.dt`` above the Courant limit (the message gives the largest stable
        dt), or an invalid key (named, with what is allowed).
    """
    domain = domain_from_config(cfg)
    d = domain.ndim
    bcs = boundaries_from_config(cfg, d)
    ph = cfg.section("physics")
    c = ph.get("c", 1.0, min=0.0, exclusive_min=True)
    t = cfg.section("time")
    dt = t.get("dt", min=0.0, exclusive_min=True)
    courant = courant_number(domain, c, dt)
    if courant >= 1:
        raise ConfigError(
            t.key("dt"),
            f"time step {dt:g} is unstable: the Courant number c*dt*sqrt(sum(1/dx^2)) = {courant:.4g} "
            f"must be below 1 for leapfrog (c = {c:g}, dx = {', '.join(f'{h:g}' for h in domain.dx)}); "
            f"use time.dt < {dt / courant:.4g}",
        )
    ini = cfg.section("initial")
    kind = ini.get("kind", "sine", kind=str, choices=INITIAL_KINDS)
    amplitude = ini.get("amplitude", 1.0)
    if kind == "sine":
        modes = ini.get("modes", [1] * d, kind=int, length=d, min=0)
        u0 = sine_mode(domain, modes, amplitude)
    else:
        center, width = bump_from_config(ini, domain, bcs, 0.05 * min(domain.length))
        u0 = gaussian(domain, center, width, amplitude)
    return GridSetup(
        model=make_model(d, bcs),
        domain=domain,
        params=make_params(domain, c, dt),
        state=initial_state(u0, domain, bcs, c, dt),
        dt=dt,
        output={"u": lambda s: s["u"]},  # u_prev is internal (kept in the checkpoint only)
    )
