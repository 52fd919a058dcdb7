# file: allen_cahn.py
import numpy as np
from simpar.grid.domain import boundaries_from_config, domain_from_config
from simpar.grid.stencils import crop, laplacian
from simpar.models import GridModel, GridSetup, grid_model

def update(state, p):  # Allen-Cahn: du/dt = M (eps^2 lap(u) + u - u^3), explicit Euler
    u, c = state["u"], crop(state["u"], 1, 2)  # u padded by k >= 1 halo cells, c by k - 1
    return {"u": c + p["dt"] * p["mobility"] * (p["eps2"] * laplacian(u, p["idx2"], 2) + c - c**3)}

def from_config(cfg):  # reads [grid], [boundary], [physics], [initial], [time]
    domain, ph = domain_from_config(cfg, ndims=(2,)), cfg.section("physics")
    dt = cfg.section("time").get("dt", min=0.0, exclusive_min=True)
    p = {"dt": dt, "mobility": ph.get("mobility", 1.0, min=0.0), "idx2": [h**-2 for h in domain.dx],
         "eps2": ph.get("epsilon", 0.03, min=0.0) ** 2}  # fmt: skip
    seed = cfg.section("initial").get("seed", 0, kind=int, min=0)
    u0 = 0.1 * (2 * np.random.default_rng(seed).random(domain.shape) - 1)  # small noise
    model = GridModel("allen_cahn", 2, 1, {"u": boundaries_from_config(cfg, 2)}, update)
    p = {k: np.asarray(v, domain.dtype) for k, v in p.items()}
    return GridSetup(model, domain, p, {"u": u0.astype(domain.dtype)}, dt, seed=seed)

model = grid_model("allen_cahn", from_config, "Allen-Cahn phase separation (plugin)")
