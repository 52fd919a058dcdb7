"""Heat equation against analytic solutions, convergence order, conservation, stability."""

import numpy as np
import pytest

from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid import heat
from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.grid.domain import Domain
from simpar.testing import run_engine

PER = (Periodic(), Periodic())


def _gaussian_error(n, stencil="5pt", t_end=0.01, D=1.0):
    dom = Domain((n, n), (1.0, 1.0), "float64")
    r = 0.2
    dt0 = r / (D * sum(1 / h**2 for h in dom.dx))
    steps = int(np.ceil(t_end / dt0))
    dt = t_end / steps
    model = heat.make_model(2, (PER, PER), stencil)
    u0 = heat.gaussian(dom, (0.5, 0.5), 0.08)
    out, _ = run_engine("single", model, {"u": u0}, heat.make_params(dom, D, dt), steps)
    exact = heat.gaussian(dom, (0.5, 0.5), 0.08, t=t_end, diffusivity=D)
    return np.max(np.abs(out["u"] - exact))


@pytest.mark.parametrize("stencil", ["5pt", pytest.param("9pt", marks=pytest.mark.slow)])
def test_gaussian_matches_analytic_with_second_order_convergence(stencil):
    ns = [32, 64, 128]
    errs = [_gaussian_error(n, stencil) for n in ns]
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert errs[-1] < 2e-3  # peak value ~0.4 at t_end
    assert np.all(np.abs(orders - 2.0) < 0.15), (errs, orders)


def test_gaussian_on_pmap_matches_analytic_too():
    dom = Domain((64, 64), (1.0, 1.0), "float64")
    dt = 0.2 / sum(1 / h**2 for h in dom.dx)
    model = heat.make_model(2, (PER, PER))
    u0 = heat.gaussian(dom, (0.3, 0.6), 0.08)
    out, _ = run_engine("pmap", model, {"u": u0}, heat.make_params(dom, 1.0, dt), 100, (2, 4), 2)
    exact = heat.gaussian(dom, (0.3, 0.6), 0.08, t=100 * dt, diffusivity=1.0)
    assert np.max(np.abs(out["u"] - exact)) < 2e-3


def test_dirichlet_sine_mode_decays_at_the_discrete_rate():
    """sin(pi x / L) at cell centres is an exact eigenvector of the 5-point Laplacian with the
    antisymmetric (Dirichlet-0) halo, eigenvalue -(4/h^2) sin^2(pi h / 2L)."""
    n, L, D = 40, 2.0, 0.5
    dom = Domain((n, n), (L, L), "float64")
    h = L / n
    dt = 0.2 * h * h / D
    wall = (Dirichlet(0.0), Dirichlet(0.0))
    model = heat.make_model(2, (wall, wall))
    x, y = dom.mesh()
    u0 = np.sin(np.pi * x / L) * np.sin(2 * np.pi * y / L)
    steps = 200
    out, _ = run_engine(
        "shard_map", model, {"u": u0}, heat.make_params(dom, D, dt), steps, (2, 4), 1
    )
    lam = -(4 / h**2) * (np.sin(np.pi * h / (2 * L)) ** 2 + np.sin(2 * np.pi * h / (2 * L)) ** 2)
    np.testing.assert_allclose(out["u"], u0 * (1 + D * dt * lam) ** steps, rtol=1e-10, atol=1e-13)


def test_heat_is_conserved_with_periodic_and_neumann_walls():
    dom = Domain((24, 16, 8), (1.0, 1.0, 1.0), "float64")
    bcs = (PER, (Neumann(), Neumann()), PER)
    dt = 0.15 / sum(1 / h**2 for h in dom.dx)
    model = heat.make_model(3, bcs)
    u0 = np.random.default_rng(0).random(dom.shape)
    out, obs = run_engine(
        "pmap", model, {"u": u0}, heat.make_params(dom, 1.0, dt), 50, (2, 2, 2), 1
    )
    np.testing.assert_allclose(obs["u_sum"], u0.sum(), rtol=1e-13)
    assert out["u"].max() <= u0.max() and out["u"].min() >= u0.min()  # maximum principle


def _cfg(**over):
    data = {
        "model": {"name": "heat"},
        "grid": {"shape": [64, 64], "length": [1.0, 1.0]},
        "time": {"dt": 1e-5, "steps": 10},
        "physics": {"diffusivity": 1.0},
    }
    for k, v in over.items():
        sec, key = k.split("__")
        data.setdefault(sec, {})[key] = v
    return Section(data)


def test_unstable_time_step_is_rejected_with_the_bound():
    with pytest.raises(
        ConfigError, match=r"time\.dt: time step 0\.0001 is unstable.*use time\.dt <= 6\.10"
    ):
        heat.from_config(_cfg(time__dt=1e-4))
    with pytest.raises(ConfigError, match="exceeds 0.375 for the 9pt stencil"):
        heat.from_config(_cfg(time__dt=6e-5, physics__stencil="9pt"))
    heat.from_config(_cfg(time__dt=6e-5))  # stable for the 5-point stencil


def test_config_errors_name_the_key():
    with pytest.raises(
        ConfigError, match=r"physics\.stencil: '7pt' is not allowed; choose one of '5pt', '9pt'"
    ):
        heat.from_config(_cfg(physics__stencil="7pt"))
    with pytest.raises(ConfigError, match=r"grid\.dtype"):
        heat.from_config(_cfg(grid__dtype="float16"))
    with pytest.raises(ConfigError, match=r"boundary\.x: unknown boundary kind 'wall'"):
        heat.from_config(_cfg(boundary__x="wall"))
    with pytest.raises(ConfigError, match=r"9-point stencil is 2-D only"):
        c = _cfg(physics__stencil="9pt")
        c.data["grid"] = {"shape": [8, 8, 8]}
        heat.from_config(c)
