"""Gray-Scott reaction-diffusion (Pearson 1993), explicit Euler with the (2d+1)-point Laplacian.

::

    du/dt = Du lap(u) - u v^2 + F (1 - u)
    dv/dt = Dv lap(v) + u v^2 - (F + k) v

``u`` is the substrate, ``v`` the autocatalyst (dimensionless concentrations); ``F`` is the
feed rate and ``k`` the kill rate (1/time); ``Du``, ``Dv`` are diffusivities (length^2/time).
One ``update`` is one forward-Euler step with the second-order Laplacian (radius 1)::

    u' = u + dt (Du L u - u v v + F (1 - u))
    v' = v + dt (Dv L v + u v v - (F + k) v)

Defaults follow Pearson (Science 261, 189, 1993): a periodic box of side 2.5 with 256^2 cells,
``Du = 2e-5``, ``Dv = 1e-5``, ``dt = 1``; the whole box starts in the trivial state
``(u, v) = (1, 0)`` except a central square (side 0.2, about 20 cells) set to
``(1/2, 1/4)``; every cell is then perturbed by a seeded ``+-1 %`` random factor.

Presets (``physics.preset``; ``physics.F`` / ``physics.k`` override them). Points inside the
named regimes of the F-k map, with the initial condition above:

============ ======= ======= ====================================================================
preset       F       k       pattern
============ ======= ======= ====================================================================
``spots``    0.035   0.065   spots that split and fill the box (Rougier, From Python to NumPy)
``stripes``  0.050   0.065   worms aligning into parallel stripes (Munafo's Xmorphia, Pearson mu)
``mitosis``  0.0367  0.0649  dividing spots (Sims, "Reaction-Diffusion Tutorial")
``coral``    0.0545  0.062   branching coral-like growth (Sims)
============ ======= ======= ====================================================================

Stability: forward Euler is linearly stable about the uniform state ``(1, 0)`` (where most of
the box sits) when ``dt (4 Du sum_i 1/dx_i^2 + F) <= 2`` and ``dt (4 Dv sum_i 1/dx_i^2 + F + k)
<= 2``; checked when the config is read.

Config (see ``experiments/gray_scott.toml``)::

    [model]   name = "gray_scott"
    [physics] preset = "spots"          # optional; or give F and k
              F = 0.035                 # feed rate, 1/time (overrides the preset)
              k = 0.065                 # kill rate, 1/time (overrides the preset)
              Du = 2e-5                 # length^2/time
              Dv = 1e-5
    [initial] size = [0.2, 0.2]         # sides of the central square (length; default 8 % of
                                        # the box: 0.2 for Pearson's 2.5)
              noise = 0.01              # relative amplitude of the random factor
              seed = 0
    [time]    dt = 1.0
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid import stencils
from simpar.grid.domain import Domain, boundaries_from_config, domain_from_config, param_dtype
from simpar.grid.model import GridModel, GridSetup

PRESETS = {
    "spots": (0.035, 0.065),
    "stripes": (0.050, 0.065),
    "mitosis": (0.0367, 0.0649),
    "coral": (0.0545, 0.062),
}


def make_model(ndim: int, bcs: tuple) -> GridModel:
    """The Gray-Scott model on a ``ndim``-D grid.

    Args:
      ndim: 2 or 3.
      bcs: per spatial axis ``(lower, upper)`` boundary conditions, used for ``u`` and ``v``.

    Returns:
      A radius-1 ``GridModel`` with fields ``u`` and ``v`` (``(n_0, ..., n_{d-1})``,
      dimensionless). Params (array leaves, state dtype): ``Du``, ``Dv`` (length^2/time),
      ``F``, ``k`` (1/time), ``dt`` (time), ``dx`` (``(ndim,)``, length).
    """

    def update(state, params):
        u, v = state["u"], state["v"]
        inv_dx2 = 1 / (params["dx"] * params["dx"])
        inv = [inv_dx2[a] for a in range(ndim)]
        lap_u = stencils.laplacian(u, inv, ndim)
        lap_v = stencils.laplacian(v, inv, ndim)
        u = stencils.crop(u, 1, ndim)
        v = stencils.crop(v, 1, ndim)
        uvv = u * v * v
        dt, F, k = params["dt"], params["F"], params["k"]
        return {
            "u": u + dt * (params["Du"] * lap_u - uvv + F * (1 - u)),
            "v": v + dt * (params["Dv"] * lap_v + uvv - (F + k) * v),
        }

    return GridModel(
        name="gray_scott",
        ndim=ndim,
        radius=1,
        bcs={"u": bcs, "v": bcs},
        update=update,
        units={"u": "1", "v": "1"},
        long_names={"u": "substrate concentration", "v": "autocatalyst concentration"},
        param_units={
            "physics.Du": "m2 s-1",
            "physics.Dv": "m2 s-1",
            "physics.F": "s-1",
            "physics.k": "s-1",
            "time.dt": "s",
        },  # fmt: skip
    )


def make_params(
    domain: Domain, Du: float, Dv: float, F: float, k: float, dt: float, *, dtype=None
) -> dict[str, jax.Array]:
    """Params in the domain dtype or ``dtype`` (see ``make_model``): diffusivities ``Du``,
    ``Dv`` (m2 s-1), feed ``F`` and kill ``k`` rates (s-1), ``dt`` (s), ``dx`` (m)."""
    dt_ = param_dtype(domain, dtype)
    values = {"Du": Du, "Dv": Dv, "F": F, "k": k, "dt": dt, "dx": domain.dx}
    return {name: jnp.asarray(value, dt_) for name, value in values.items()}


def max_stable_dt(domain: Domain, Du: float, Dv: float, F: float, k: float) -> float:
    """Largest forward-Euler step that is linearly stable about ``(u, v) = (1, 0)`` (time)."""
    s = sum(1 / h**2 for h in domain.dx)
    return min(2 / (4 * Du * s + F), 2 / (4 * Dv * s + F + k))


def initial_state(
    domain: Domain, size, noise: float = 0.01, seed: int = 0
) -> dict[str, np.ndarray]:
    """Pearson's start: ``(1, 0)`` outside and ``(1/2, 1/4)`` inside a central box of sides
    ``size`` (length), each cell multiplied by ``1 + noise * xi``, ``xi`` uniform in
    ``[-1, 1)`` from ``numpy.random.default_rng(seed)`` (``u`` first, then ``v``).

    Returns:
      ``{"u", "v"}``: ``(n_0, ..., n_{d-1})`` in the domain dtype.
    """
    inside = np.ones(domain.shape, bool)
    for x, L, s in zip(domain.mesh(), domain.length, size, strict=True):
        inside &= np.abs(x - L / 2) <= s / 2
    u = np.where(inside, 0.5, 1.0)
    v = np.where(inside, 0.25, 0.0)
    rng = np.random.default_rng(seed)
    u = u * (1 + noise * rng.uniform(-1, 1, domain.shape))
    v = v * (1 + noise * rng.uniform(-1, 1, domain.shape))
    return {"u": u.astype(domain.dtype), "v": v.astype(domain.dtype)}


def from_config(cfg: Section) -> GridSetup:
    """Read ``[grid]``, ``[boundary]``, ``[physics]``, ``[initial]``, ``[time]``.

    Raises:
      ConfigError: an unstable ``time.dt`` (the message gives the largest stable dt), F and k
        given neither directly nor by a preset, or an invalid key (named, with what is allowed).
    """
    domain = domain_from_config(cfg)
    d = domain.ndim
    bcs = boundaries_from_config(cfg, d)
    ph = cfg.section("physics")
    preset = ph.get("preset", None, kind=str, choices=tuple(PRESETS))
    F0, k0 = PRESETS[preset] if preset is not None else (None, None)
    for name, value in (("F", F0), ("k", k0)):
        if value is None and name not in ph:
            raise ConfigError(
                ph.key(name),
                f"missing; set physics.{name} or choose physics.preset from {', '.join(PRESETS)}",
            )
    F = ph.get("F", F0, min=0.0)
    k = ph.get("k", k0, min=0.0)
    Du = ph.get("Du", 2e-5, min=0.0)
    Dv = ph.get("Dv", 1e-5, min=0.0)
    t = cfg.section("time")
    dt = t.get("dt", 1.0, min=0.0, exclusive_min=True)
    limit = max_stable_dt(domain, Du, Dv, F, k)
    if dt > limit:
        raise ConfigError(
            t.key("dt"),
            f"time step {dt:g} is unstable for forward Euler: dt*(4*D*sum(1/dx^2) + rate) must be "
            f"<= 2 for (D, rate) = (Du, F) and (Dv, F + k) (Du = {Du:g}, Dv = {Dv:g}, F = {F:g}, "
            f"k = {k:g}, dx = {', '.join(f'{h:g}' for h in domain.dx)}); use time.dt <= {limit:.4g}",
        )
    ini = cfg.section("initial")
    size = ini.get("size", [0.08 * L for L in domain.length], length=d, min=0.0)
    noise = ini.get("noise", 0.01, min=0.0)
    seed = ini.get("seed", 0, kind=int, min=0, max=2**63 - 1)
    return GridSetup(
        model=make_model(d, bcs),
        domain=domain,
        params=make_params(domain, Du, Dv, F, k, dt),
        state=initial_state(domain, size, noise, seed),
        dt=dt,
        seed=seed,
    )
