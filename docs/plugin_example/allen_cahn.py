# file: allen_cahn.py
"""Allen-Cahn phase separation, du/dt = M (eps^2 lap(u) + u - u^3), as a simpar model."""

import numpy as np

from simpar.errors import ConfigError
from simpar.grid.domain import boundaries_from_config, domain_from_config
from simpar.models import GridModel, GridSetup, grid_model


def update(state, params):  # "u": blocks (..., x, y) padded by k >= 1 halo cells
    u = state["u"]
    c = u[..., 1:-1, 1:-1]  # what it returns is padded by k - 1: radius = 1
    lap = (u[..., 2:, 1:-1] + u[..., :-2, 1:-1] - 2 * c) * params["idx2"][0] + (
        u[..., 1:-1, 2:] + u[..., 1:-1, :-2] - 2 * c
    ) * params["idx2"][1]
    return {"u": c + params["dt"] * params["mobility"] * (params["eps2"] * lap + c - c**3)}


def from_config(cfg):  # reads [grid], [boundary], [physics], [initial], [time]
    domain = domain_from_config(cfg, ndims=(2,))
    ph, ini, t = cfg.section("physics"), cfg.section("initial"), cfg.section("time")
    mobility = ph.get("mobility", 1.0, min=0.0, exclusive_min=True)
    eps = ph.get("epsilon", 0.01, min=0.0, exclusive_min=True)
    dt = t.get("dt", min=0.0, exclusive_min=True)
    limit = 1 / (mobility * (2 + 4 * eps**2 * sum(1 / h**2 for h in domain.dx)))  # Euler
    if dt > limit:
        raise ConfigError(t.key("dt"), f"{dt:g} is unstable; use time.dt <= {limit:.3g}")
    ini.get("kind", "random", kind=str, choices=("random",))
    seed = ini.get("seed", 0, kind=int, min=0)
    noise = ini.get("amplitude", 0.1, min=0.0)
    u0 = noise * (2 * np.random.default_rng(seed).random(domain.shape) - 1)
    dtype, idx2 = np.dtype(domain.dtype), [1 / h**2 for h in domain.dx]
    model = GridModel(
        name="allen_cahn", ndim=2, radius=1, bcs={"u": boundaries_from_config(cfg, 2)},
        update=update, units={"u": "1"}, long_names={"u": "order parameter"},
    )
    params = {
        "dt": np.asarray(dt, dtype), "mobility": np.asarray(mobility, dtype),
        "eps2": np.asarray(eps**2, dtype), "idx2": np.asarray(idx2, dtype),
    }
    return GridSetup(model, domain, params, {"u": u0.astype(dtype)}, dt, seed=seed)


model = grid_model("allen_cahn", from_config, "Allen-Cahn phase separation (plugin)")
