"""Diffusion (the heat equation) ``du/dt = D lap(u)`` by explicit finite differences.

Forward Euler in time; in space the second-order (2d+1)-point Laplacian (5-point in 2-D,
7-point in 3-D) or, in 2-D with ``dx == dy``, the isotropic 9-point Laplacian, which uses the
corner cells of the halo. Stable when the diffusion number ``D dt sum_i 1/dx_i^2`` is at most
1/2 (5/7-point) or 3/8 (9-point): checked when the config is read.

Config (see ``experiments/heat2d.toml``)::

    [model]   name = "heat"
    [physics] diffusivity = 1.0      # D, length^2 / time
              stencil = "5pt"        # or "9pt" (2-D, square cells)
    [initial] kind = "gaussian"      # center (length), width (sigma, length), amplitude
              # kind = "sine": modes = [1, 1], amplitude   (a discrete eigenmode: decays as
              #                exp(-D k^2 t) with Dirichlet-0 or periodic walls)
              # kind = "random": amplitude, seed
    [time]    dt = 1e-5
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simpar.axes import AXIS_NAMES
from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid import stencils
from simpar.grid.domain import (
    Domain,
    boundaries_from_config,
    domain_from_config,
    outer_product,
    param_dtype,
    uniform_random,
)
from simpar.grid.model import GridModel, GridSetup

STENCILS = ("5pt", "9pt")
STABILITY_LIMIT = {"5pt": 0.5, "9pt": 0.375}


def make_model(ndim: int, bcs: tuple, stencil: str = "5pt") -> GridModel:
    """The heat model on a ``ndim``-D grid.

    Params (array leaves, state dtype): ``diffusivity`` (D, length^2/time), ``dt`` (time),
    ``dx`` (``(ndim,)``, length).
    """

    def update(state, params):
        u = state["u"]
        inv_dx2 = 1 / (params["dx"] * params["dx"])
        if stencil == "9pt":
            lap = stencils.laplacian_9pt(u, inv_dx2[0])
        else:
            lap = stencils.laplacian(u, [inv_dx2[a] for a in range(ndim)], ndim)
        return {"u": stencils.crop(u, 1, ndim) + (params["diffusivity"] * params["dt"]) * lap}

    return GridModel(
        name="heat",
        ndim=ndim,
        radius=1,
        bcs={"u": bcs},
        update=update,
        units={"u": "K"},
        long_names={"u": "temperature"},
        param_units={"physics.diffusivity": "m2 s-1", "time.dt": "s", "initial.amplitude": "K"},
    )


def make_params(domain: Domain, diffusivity: float, dt: float, *, dtype=None) -> dict:
    """Params of ``make_model`` (array leaves: ``jax.grad`` / ``vmap`` over them work).

    Args:
      domain: the box (gives ``dx`` and the dtype).
      diffusivity: D (m2 s-1).
      dt: time step (s).
      dtype: override of the domain's dtype.

    Returns:
      ``{"diffusivity": (), "dt": (), "dx": (ndim,)}`` arrays of the dtype.
    """
    dt_ = param_dtype(domain, dtype)
    return {
        "diffusivity": jnp.asarray(diffusivity, dt_),
        "dt": jnp.asarray(dt, dt_),
        "dx": jnp.asarray(domain.dx, dt_),
    }


def diffusion_number(domain: Domain, diffusivity: float, dt: float) -> float:
    """``D dt sum_i 1/dx_i^2``; the explicit scheme is stable up to ``STABILITY_LIMIT``."""
    return diffusivity * dt * sum(1 / h**2 for h in domain.dx)


def gaussian(
    domain: Domain,
    center,
    width: float,
    amplitude: float = 1.0,
    t: float = 0.0,
    diffusivity: float = 0.0,
    images: int = 2,
    dtype=np.float64,
) -> np.ndarray:
    """A Gaussian in a periodic box, exact for the heat equation at time ``t``.

    ``amplitude * (w^2 / (w^2 + 2 D t))^(d/2) * sum_images exp(-|r - c|^2 / (2 (w^2 + 2 D t)))``
    with ``images`` periodic copies each way (enough when ``width << length``). The sum over
    the image lattice factorises into one 1-D sum per axis, evaluated in float64; the full
    array is their outer product, written in ``dtype`` (no float64 temporary of the grid's
    size: 4096^2 float32 needs one 64 MiB array).
    """
    s2 = width**2 + 2 * diffusivity * t
    shifts = np.arange(-images, images + 1)
    factors = [
        np.exp(-((x[:, None] - c - shifts[None, :] * L) ** 2) / (2 * s2)).sum(axis=1)
        for x, c, L in zip(domain.coords(), center, domain.length, strict=True)
    ]
    return outer_product(factors, amplitude * (width**2 / s2) ** (domain.ndim / 2), dtype)


MAX_WIDTH = 1e3  # box lengths: a wider bump is a constant field (and width^2 must not overflow)


def bump_from_config(ini: Section, domain: Domain, bcs, default_width: float):
    """``initial.center`` and ``initial.width`` of a Gaussian (or square) start, checked.

    Args:
      ini: the ``[initial]`` table.
      domain: the grid (lengths per axis, length units).
      bcs: per axis ``(lower, upper)`` boundary conditions.
      default_width: ``initial.width`` when absent (length units).

    Returns:
      (center: list of floats per axis, width: float), in length units.

    Raises:
      ConfigError: a centre outside the box ``[0, L]`` along an axis with walls (a
        periodic axis wraps), or a width that is not in ``(0, 1000 L_max]``.
    """
    center = ini.get("center", [L / 2 for L in domain.length], length=domain.ndim)
    width = ini.get(
        "width", default_width, min=0.0, exclusive_min=True, max=MAX_WIDTH * max(domain.length)
    )
    for a, (c, L, (lo, _)) in enumerate(zip(center, domain.length, bcs, strict=True)):
        if not getattr(lo, "periodic", False) and not 0.0 <= c <= L:
            raise ConfigError(
                ini.key("center"),
                f"{c:g} along {AXIS_NAMES[a]} lies outside the box [0, {L:g}], whose "
                f"{AXIS_NAMES[a]} edges are walls; give a centre inside the box",
            )
    return center, width


def from_config(cfg: Section) -> GridSetup:
    """Read ``[grid]``, ``[boundary]``, ``[physics]``, ``[initial]``, ``[time]``.

    Raises:
      ConfigError: an unstable ``time.dt`` (the message gives the largest stable dt), a
        9-point stencil in 3-D or on non-square cells, or an invalid key.
    """
    domain = domain_from_config(cfg)
    d = domain.ndim
    bcs = boundaries_from_config(cfg, d)
    ph = cfg.section("physics")
    D = ph.get("diffusivity", 1.0, min=0.0, exclusive_min=True)
    stencil = ph.get("stencil", "5pt", kind=str, choices=STENCILS)
    if stencil == "9pt":
        if d != 2:
            raise ConfigError(
                ph.key("stencil"), 'the 9-point stencil is 2-D only; use "5pt" in 3-D'
            )
        if not np.isclose(domain.dx[0], domain.dx[1], rtol=1e-12):
            raise ConfigError(
                ph.key("stencil"), f"the 9-point stencil needs square cells; dx = {domain.dx}"
            )
    t = cfg.section("time")
    dt = t.get("dt", min=0.0, exclusive_min=True)
    r = diffusion_number(domain, D, dt)
    limit = STABILITY_LIMIT[stencil]
    if r > limit:
        raise ConfigError(
            t.key("dt"),
            f"time step {dt:g} is unstable: the diffusion number D*dt*sum(1/dx^2) = {r:.4g} exceeds "
            f"{limit} for the {stencil} stencil (D = {D:g}, dx = {', '.join(f'{h:g}' for h in domain.dx)}); "
            f"use time.dt <= {dt * limit / r:.4g}",
        )
    ini = cfg.section("initial")
    kind = ini.get("kind", "gaussian", kind=str, choices=("gaussian", "sine", "random"))
    amplitude = ini.get("amplitude", 1.0)
    seed = None
    if kind == "gaussian":
        center, width = bump_from_config(ini, domain, bcs, 0.05 * min(domain.length))
        u0 = gaussian(domain, center, width, amplitude, dtype=domain.dtype)
    elif kind == "sine":
        modes = ini.get("modes", [1] * d, kind=int, length=d, min=0)
        u0 = outer_product(
            [
                np.sin(np.pi * k * x / L)
                for k, x, L in zip(modes, domain.coords(), domain.length, strict=True)
            ],
            amplitude,
            domain.dtype,
        )
    else:
        seed = ini.get("seed", 0, kind=int, min=0, max=2**63 - 1)
        u0 = uniform_random(domain.shape, seed, amplitude, domain.dtype)
    return GridSetup(
        model=make_model(d, bcs, stencil),
        domain=domain,
        params=make_params(domain, D, dt),
        state={"u": u0.astype(domain.dtype, copy=False)},
        dt=dt,
        seed=seed,
    )
