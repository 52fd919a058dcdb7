"""Scalar advection ``dq/dt + div(v q) = 0`` in a prescribed velocity field, finite volumes.

Conservative flux form: a cell changes only by the difference of the fluxes through its two
faces along each axis, so with periodic boundaries (or walls with no normal velocity) the total
``sum(q) dV`` is conserved to round-off. The axes are swept one after the other within a step
(x, then y[, then z]: dimensional splitting); each sweep keeps the halo of the axes not yet
swept, so one ``update`` is still a per-cell stencil on the padded block and runs unchanged on
every engine. For a uniform velocity the one-dimensional operators commute and splitting adds
no error.

Schemes (one sweep along axis ``a`` with face velocity ``a_f`` and ``nu_f = a_f dt / dx_a``):

- ``"upwind"`` (radius 1): ``F_f = max(a_f, 0) q_f + min(a_f, 0) q_{f+1}``. First order.
- ``"muscl"`` (radius 2): MUSCL-Hancock, i.e. the flux-limited Lax-Wendroff scheme of Sweby
  (1984): the upwind face value is ``q_f + (1 - nu_f) s_f / 2`` (``a_f >= 0``) or
  ``q_{f+1} - (1 + nu_f) s_{f+1} / 2`` (``a_f < 0``), with the limited slope ``s`` from the
  ``limiter``: ``"minmod"``, ``"van_leer"`` (default) or ``"mc"`` (monotonized central). Second
  order where the profile is smooth and monotone; at smooth extrema the limiters clip the slope
  and the accuracy there drops towards first order. All three limiters lie in Sweby's TVD region,
  so for ``|nu| <= 1`` each sweep with a uniform velocity writes every new value as a convex
  combination of old neighbours: no new extrema (max principle), no spurious oscillations.

Both are stable for ``max_a max|v_a| dt / dx_a <= 1`` (checked when the config is read).

Velocity:

- ``flow = "uniform"``: a constant vector, the array leaf ``velocity`` ``(ndim,)`` of params
  (differentiable, sweepable).
- ``flow = "rotation"``: solid-body rotation ``v = omega e_z x (r - center)`` stored as state
  fields ``vx``, ``vy``[, ``vz``] (cell centres; the face velocity is the mean of the two cells,
  exact for this linear field, so the discrete divergence is zero). They are never changed by
  ``update``; their halos are filled like any field: at a wall the normal component is
  antisymmetric (no flow through the wall, so mass stays conserved), the tangential one
  mirrored.

Config (see ``experiments/advection2d.toml``)::

    [model]   name = "advection"
    [physics] scheme = "muscl"          # or "upwind"
              limiter = "van_leer"      # or "minmod", "mc" (muscl only)
              flow = "uniform"          # velocity = [1.0, 0.5]  (length / time)
              # flow = "rotation": omega (1/time), center (length; default: box centre)
    [initial] kind = "gaussian"         # center, width (length), amplitude
              # kind = "sine": modes = [1, 1], amplitude, offset: offset + amplitude *
              #                prod sin(2 pi k_i x_i / L_i) (periodic, smooth)
              # kind = "square": center, width (side, length), amplitude (a discontinuous box)
    [time]    dt = 1e-3                 # max_a max|v_a| dt / dx_a <= 1
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid import stencils
from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.grid.domain import Domain, boundaries_from_config, domain_from_config, param_dtype
from simpar.grid.heat import bump_from_config, gaussian
from simpar.grid.model import GridModel, GridSetup

SCHEMES = ("upwind", "muscl")
LIMITERS = ("minmod", "van_leer", "mc")
FLOWS = ("uniform", "rotation")
INITIAL_KINDS = ("gaussian", "sine", "square")
VELOCITY_FIELDS = ("vx", "vy", "vz")
AXIS_NAMES = ("x", "y", "z")


def _limited_slope(dm: jax.Array, dp: jax.Array, limiter: str) -> jax.Array:
    """Limited cell slope from the backward and forward differences ``dm``, ``dp``.

    Zero where they differ in sign (at an extremum). Differentiable everywhere it is smooth
    (the van Leer quotient never divides by zero, even in the branch ``where`` discards).
    """
    if limiter == "minmod":
        return jnp.where(dm * dp > 0, jnp.sign(dp) * jnp.minimum(jnp.abs(dm), jnp.abs(dp)), 0)
    if limiter == "van_leer":
        prod = dm * dp
        pos = prod > 0
        den = jnp.where(pos, dm + dp, 1)
        return jnp.where(pos, 2 * prod / den, 0)
    if limiter == "mc":
        m = jnp.minimum(jnp.minimum(2 * jnp.abs(dm), 2 * jnp.abs(dp)), 0.5 * jnp.abs(dm + dp))
        return jnp.where(dm * dp > 0, jnp.sign(dp) * m, 0)
    raise ValueError(f"unknown limiter {limiter!r}")  # pragma: no cover


def _sl(x: jax.Array, ax: int, start: int, stop: int) -> jax.Array:
    return lax.slice_in_dim(x, start, stop, axis=ax)


def _sweep(q, vel_a, ax: int, courant_factor, scheme: str, limiter: str):
    """One conservative 1-D step along array axis ``ax``, consuming the scheme's radius there.

    Args:
      q: ``(..., m, ...)``, padded by at least the radius along ``ax``.
      vel_a: the velocity component along this axis: a scalar, or an array shaped like ``q``.
      ax: array axis of the sweep.
      courant_factor: ``dt / dx_a`` (time / length).

    Returns:
      ``q`` advanced, ``m - 2 r`` cells along ``ax``.
    """
    m = q.shape[ax]
    field = jnp.ndim(vel_a) > 0
    if scheme == "upwind":
        a = 0.5 * (_sl(vel_a, ax, 0, m - 1) + _sl(vel_a, ax, 1, m)) if field else vel_a
        flux = jnp.maximum(a, 0) * _sl(q, ax, 0, m - 1) + jnp.minimum(a, 0) * _sl(q, ax, 1, m)
        return _sl(q, ax, 1, m - 1) - courant_factor * (
            _sl(flux, ax, 1, m - 1) - _sl(flux, ax, 0, m - 2)
        )
    # muscl: slopes in cells 1..m-2, faces f = 1..m-3 (between cells f and f+1), new cells 2..m-3
    diff = _sl(q, ax, 1, m) - _sl(q, ax, 0, m - 1)
    slope = _limited_slope(_sl(diff, ax, 0, m - 2), _sl(diff, ax, 1, m - 1), limiter)
    a = 0.5 * (_sl(vel_a, ax, 1, m - 2) + _sl(vel_a, ax, 2, m - 1)) if field else vel_a
    nu = a * courant_factor
    q_left = _sl(q, ax, 1, m - 2) + 0.5 * (1 - nu) * _sl(slope, ax, 0, m - 3)
    q_right = _sl(q, ax, 2, m - 1) - 0.5 * (1 + nu) * _sl(slope, ax, 1, m - 2)
    flux = jnp.maximum(a, 0) * q_left + jnp.minimum(a, 0) * q_right
    return _sl(q, ax, 2, m - 2) - courant_factor * (
        _sl(flux, ax, 1, m - 3) - _sl(flux, ax, 0, m - 4)
    )


def make_model(
    ndim: int, bcs: tuple, scheme: str = "muscl", limiter: str = "van_leer", flow: str = "uniform"
) -> GridModel:
    """The advection model on a ``ndim``-D grid.

    Args:
      ndim: 2 or 3.
      bcs: per spatial axis ``(lower, upper)`` boundary conditions of ``q``. A Dirichlet value
        is the inflow value; the outflow side needs none (the upwind side is inside).
      scheme: ``"upwind"`` (radius 1) or ``"muscl"`` (radius 2). Static.
      limiter: ``"minmod"``, ``"van_leer"`` or ``"mc"`` (``muscl`` only). Static.
      flow: ``"uniform"`` (params ``velocity``) or ``"rotation"`` (state fields ``vx``, ``vy``
        [, ``vz``], from ``rotation_velocity``). Static.

    Returns:
      A ``GridModel`` with field ``q`` (``(n_0, ..., n_{d-1})``, amount per volume) and, for a
      velocity field, ``vx``, ``vy``[, ``vz``] (length/time). Params (array leaves, state
      dtype): ``dt`` (time), ``dx`` (``(ndim,)``, length), and ``velocity`` (``(ndim,)``,
      length/time) for a uniform flow.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose one of {SCHEMES}")
    if limiter not in LIMITERS:
        raise ValueError(f"unknown limiter {limiter!r}; choose one of {LIMITERS}")
    if flow not in FLOWS:
        raise ValueError(f"unknown flow {flow!r}; choose one of {FLOWS}")
    radius = 1 if scheme == "upwind" else 2
    vnames = VELOCITY_FIELDS[:ndim] if flow == "rotation" else ()

    def update(state, params):
        q = state["q"]
        vel = {n: state[n] for n in vnames}
        lead = q.ndim - ndim
        for a in range(ndim):
            ax = lead + a
            vel_a = vel[vnames[a]] if vnames else params["velocity"][a]
            q = _sweep(q, vel_a, ax, params["dt"] / params["dx"][a], scheme, limiter)
            m = next(iter(vel.values())).shape[ax] if vel else 0
            vel = {n: _sl(v, ax, radius, m - radius) for n, v in vel.items()}
        return {"q": q, **vel}

    def local_sums(state, params):
        q = stencils.crop(state["q"], radius, ndim)
        return {"mass": jnp.prod(params["dx"]) * jnp.sum(q)}

    field_bcs = {"q": bcs}
    for a, name in enumerate(vnames):
        field_bcs[name] = tuple(
            _velocity_bcs(lo, hi, normal=(b == a)) for b, (lo, hi) in enumerate(bcs)
        )
    return GridModel(
        name="advection",
        ndim=ndim,
        radius=radius,
        bcs=field_bcs,
        update=update,
        local_sums=local_sums,
        units={"q": "1", **{n: "m s-1" for n in vnames}},
        long_names={
            "q": "advected scalar (dimensionless concentration)",
            **{n: f"velocity along {AXIS_NAMES[a]}" for a, n in enumerate(vnames)},
        },
        diagnostics={"mass": (f"m{ndim}", "integral of q over the domain")},
        param_units={"physics.omega": "rad s-1", "time.dt": "s"},
    )


def _velocity_bcs(lo, hi, normal: bool) -> tuple:
    """Halo rules of a velocity component on one axis: periodic stays periodic; at a wall the
    normal component is antisymmetric (zero on the face), the tangential one mirrored."""
    if lo.periodic:
        return (Periodic(), Periodic())
    wall = Dirichlet(0.0) if normal else Neumann()
    return (wall, wall)


def make_params(domain: Domain, dt: float, velocity=None, *, dtype=None) -> dict[str, jax.Array]:
    """Params in the domain dtype (or ``dtype``): ``dt`` (s), ``dx`` (``(ndim,)``, m) and,
    for a uniform flow, ``velocity`` (``(ndim,)``, m s-1)."""
    dt_ = param_dtype(domain, dtype)
    params = {"dt": jnp.asarray(dt, dt_), "dx": jnp.asarray(domain.dx, dt_)}
    if velocity is not None:
        params["velocity"] = jnp.asarray(velocity, dt_)
    return params


def rotation_velocity(domain: Domain, omega: float, center) -> dict[str, np.ndarray]:
    """Solid-body rotation about the axis ``z`` through ``center``: ``vx = -omega (y - cy)``,
    ``vy = omega (x - cx)`` (``vz = 0`` in 3-D), at cell centres, in the domain dtype."""
    grids = domain.mesh()
    out = {
        "vx": -omega * (grids[1] - center[1]),
        "vy": omega * (grids[0] - center[0]),
    }
    if domain.ndim == 3:
        out["vz"] = np.zeros(domain.shape)
    return {k: v.astype(domain.dtype) for k, v in out.items()}


def courant_number(domain: Domain, dt: float, max_speed) -> float:
    """``max_a max|v_a| dt / dx_a`` (``max_speed``: per axis ``max|v_a|``); stable when <= 1."""
    return max(s * dt / h for s, h in zip(max_speed, domain.dx, strict=True))


def sine_profile(
    domain: Domain,
    modes,
    amplitude: float = 1.0,
    offset: float = 0.0,
    t: float = 0.0,
    velocity=None,
) -> np.ndarray:
    """``offset + amplitude * prod_i sin(2 pi k_i (x_i - v_i t) / L_i)``, float64: periodic and
    smooth; with a uniform ``velocity`` the exact solution at time ``t``."""
    v = velocity if velocity is not None else [0.0] * domain.ndim
    factors = [
        np.sin(2 * np.pi * k * (x - vi * t) / L)
        for k, x, vi, L in zip(modes, domain.mesh(), v, domain.length, strict=True)
    ]
    return offset + amplitude * np.prod(factors, axis=0)


def square_profile(domain: Domain, center, width: float, amplitude: float = 1.0) -> np.ndarray:
    """``amplitude`` inside the axis-aligned cube of side ``width`` around ``center``, else 0."""
    inside = np.ones(domain.shape, bool)
    for x, c in zip(domain.mesh(), center, strict=True):
        inside &= np.abs(x - c) <= width / 2
    return amplitude * inside.astype(np.float64)


def from_config(cfg: Section) -> GridSetup:
    """Read ``[grid]``, ``[boundary]``, ``[physics]``, ``[initial]``, ``[time]``.

    Raises:
      ConfigError: ``time.dt`` above the Courant limit (the message gives the largest stable
        dt), a flow that does not fit the grid, or an invalid key (named, with what is allowed).
    """
    domain = domain_from_config(cfg)
    d = domain.ndim
    bcs = boundaries_from_config(cfg, d)
    ph = cfg.section("physics")
    scheme = ph.get("scheme", "muscl", kind=str, choices=SCHEMES)
    limiter = ph.get("limiter", "van_leer", kind=str, choices=LIMITERS)
    flow = ph.get("flow", "uniform", kind=str, choices=FLOWS)
    state = {}
    velocity = None
    if flow == "uniform":
        velocity = ph.get("velocity", [1.0] + [0.0] * (d - 1), length=d)
        max_speed = [abs(v) for v in velocity]
    else:
        omega = ph.get("omega", 2 * np.pi)
        center = ph.get("center", [L / 2 for L in domain.length], length=d)
        state.update(rotation_velocity(domain, omega, center))
        max_speed = [float(np.max(np.abs(state[n]))) for n in VELOCITY_FIELDS[:d]]
    t = cfg.section("time")
    dt = t.get("dt", min=0.0, exclusive_min=True)
    courant = courant_number(domain, dt, max_speed)
    if courant > 1:
        speeds = ", ".join(f"{s:g}" for s in max_speed)
        raise ConfigError(
            t.key("dt"),
            f"time step {dt:g} is unstable: the Courant number max_a max|v_a|*dt/dx_a = "
            f"{courant:.4g} exceeds 1 (max |v| per axis = {speeds}; "
            f"dx = {', '.join(f'{h:g}' for h in domain.dx)}); use time.dt <= {dt / courant:.4g}",
        )
    ini = cfg.section("initial")
    kind = ini.get("kind", "gaussian", kind=str, choices=INITIAL_KINDS)
    amplitude = ini.get("amplitude", 1.0)
    if kind == "sine":
        modes = ini.get("modes", [1] * d, kind=int, length=d, min=0)
        offset = ini.get("offset", 0.0)
        q0 = sine_profile(domain, modes, amplitude, offset)
    else:
        center, width = bump_from_config(ini, domain, bcs, 0.1 * min(domain.length))
        if kind == "gaussian":
            q0 = gaussian(domain, center, width, amplitude)
        else:
            q0 = square_profile(domain, center, width, amplitude)
    state = {"q": q0.astype(domain.dtype), **state}
    return GridSetup(
        model=make_model(d, bcs, scheme, limiter, flow),
        domain=domain,
        params=make_params(domain, dt, velocity),
        state=state,
        dt=dt,
    )
