"""The temperature bias of the BAOAB Langevin integrator follows ``c dt^2`` (issue 17, item 10).

``experiments/langevin_bias.py`` measures it (its docstring holds the 4,000-atom table); here a
500-atom LJ liquid at three time steps. The full-step kinetic temperature (what simpar reports)
reads low by ``c dt^2`` with ``c`` the harmonic-theory value ``-<|F|^2> / (12 N m)``; the
velocities after the O stage show no bias. The friction is 10 per tau here, not the config's 1:
BAOAB's kinetic bias does not depend on gamma (exactly so for a harmonic oscillator, and the
4,000-atom gamma = 1 table agrees), and gamma = 10 shortens the kinetic-energy correlation time
to ~0.05 tau, so 10 tau per dt give standard errors of 0.003.
Budget: about 60 s on 2 busy CPU cores (slow tier).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "langevin_bias", ROOT / "experiments" / "langevin_bias.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_analysis_helpers_on_synthetic_data():
    lb = _script()
    dts = np.array([0.005, 0.01, 0.015])
    fit = lb.fit_dt2(dts, -80.0 * dts**2, np.full(3, 1e-3))
    assert fit["c"] == pytest.approx(-80.0) and fit["chi2"] == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(0)
    x = rng.normal(size=40_000)
    mean, se, nb = lb.block_mean(x, 100)
    assert nb == 400 and se == pytest.approx(1 / np.sqrt(40_000), rel=0.15)
    assert abs(lb.tau_int(x) - 0.5) < 0.1  # white noise: half a sample
    ar = np.zeros(40_000)  # AR(1), phi = 0.9: tau_int = (1 + phi) / (2 (1 - phi)) = 9.5
    for i in range(1, len(ar)):
        ar[i] = 0.9 * ar[i - 1] + x[i]
    assert lb.tau_int(ar) == pytest.approx(9.5, rel=0.2)
    with pytest.raises(ValueError, match="run longer"):
        lb.block_mean(x[:150], 100)


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--atoms", "501"], "--atoms must be 4 k^3"),
        (["--dt", "0.005,-1"], "--dt must be positive"),
        (["--dt", "abc"], "--dt must be comma-separated numbers"),
        (["--tau", "nan"], "--tau must be a positive finite number"),
    ],
)
def test_bad_arguments_exit_2(args, msg, capsys):
    lb = _script()
    with pytest.raises(SystemExit) as e:
        lb.main(args)
    assert e.value.code == 2 and msg in capsys.readouterr().err


@pytest.mark.slow
def test_full_step_kinetic_temperature_bias_follows_dt_squared():
    lb = _script()
    dts = [0.005, 0.01, 0.015]
    res = lb.measure(500, dts, tau=10.0, equil=5.0, requil=1.0, gamma=10.0, kt=1.0,
                     block_tau=1.0, seed=2017, stride_tau=0.05, shell=0.05)  # fmt: skip
    rows, fit = res["rows"], res["fit"]
    for row in rows:  # blocks much longer than the correlation time: honest standard errors
        assert row["block_tau"] >= 5 * row["tau_int_kinetic_tau"] and row["blocks"] >= 10
    kin, paired = fit["kinetic"], fit["kinetic_minus_post_o"]
    # the reported temperature: bias = c dt^2 within the standard errors, c clearly negative
    assert max(abs(z) for z in kin["residual_z"]) < 3, kin
    assert kin["c"] < -3 * kin["c_se"], kin
    # the paired estimate (same samples) has the same c, 15x tighter, and follows dt^2 too
    assert max(abs(z) for z in paired["residual_z"]) < 3, paired
    assert abs(kin["c"] - paired["c"]) < 3 * np.hypot(kin["c_se"], paired["c_se"])
    # ... and equals the harmonic theory -<|F|^2> / (12 N m) within 10 %
    assert paired["c"] == pytest.approx(res["c_theory_kinetic"], rel=0.1)
    # the post-O velocities: no bias within the standard errors
    for row in rows:
        post = row["kinetic_post_o"]
        assert abs(post["bias"]) < 3 * post["se"], (row["dt"], post)
