"""Lid-driven cavity against Ghia, Ghia & Shin (1982): max absolute centre-line deviation.

What it shows: the D2Q9 BGK model with halfway bounce-back and a moving lid, run to a steady
state, reproduces u(x=0.5, y) and v(x, y=0.5) of Ghia et al. (their Tables I and II, in
``data/reference/``). The simulation is interpolated linearly at the Ghia points; the
deviation is in units of the lid speed. Prints one JSON object per Reynolds number.

Run (on 2 CPU cores, 128^2 float32: Re = 100 about 5 s, Re = 1000 about 15 s):
    python experiments/validate_cavity.py                       # Re = 100
    python experiments/validate_cavity.py --re 100 1000         # both
    python experiments/validate_cavity.py --engine pmap --devices 8 --mesh 2x4
    python experiments/validate_cavity.py --from data/runs/cavity_re100.nc   # a finished run
    python experiments/validate_cavity.py --set grid.shape=[256,256] --set grid.dtype=\\"float64\\"

The run stops when ``max |u(t) - u(t - every)| / u_lid < steady.tol`` (config ``[steady]``) or
after ``time.steps`` steps (reported as ``converged: false``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from simpar.benchmark import mesh_arg

HERE = Path(__file__).resolve().parent
CONFIGS = {100: HERE / "cavity_re100.toml", 1000: HERE / "cavity_re1000.toml"}


def run_steady(setup, engine="single", mesh=None, halo=None, max_steps=None, log=None) -> dict:
    """Advance a cavity setup until ``setup.steady`` holds (or ``max_steps``).

    Returns:
      ``{"ux", "uy": (nx, ny) float64 (lattice units), "steps", "residual", "converged",
      "wall_s", "mlups", "mass_drift"}``.
    """
    import numpy as np

    from simpar.grid.lbm import host_moments, populations
    from simpar.parallel.engines import make_engine

    crit = setup.steady
    model, params = setup.model, setup.params
    e = make_engine(engine, model, setup.domain.shape, mesh, halo)
    st = e.place(setup.state)
    mass0 = float(e.observe(st, params)["mass"])
    _, u_prev = host_moments(setup.lattice, populations(e.gather(st), setup.lattice))
    steps, residual, t_run = 0, float("inf"), 0.0
    max_steps = max_steps or 10**9
    while steps < max_steps:
        n = min(crit.every, max_steps - steps)
        t0 = time.perf_counter()
        st = e.advance(st, params, n)
        f = populations(e.gather(st), setup.lattice)
        t_run += time.perf_counter() - t0 if steps else 0.0  # first chunk compiles
        steps += n
        _, u = host_moments(setup.lattice, f)
        if not np.isfinite(u[0]).all():
            raise RuntimeError(f"non-finite velocity after {steps} steps")
        residual = (
            max(float(np.max(np.abs(a - b))) for a, b in zip(u, u_prev, strict=True)) / crit.u_ref
        )
        u_prev = u
        if log and steps % (10 * crit.every) == 0:
            log(f"  step {steps}: residual {residual:.3e}")
        if crit.tol > 0 and residual < crit.tol:
            break
    mass = float(e.observe(st, params)["mass"])
    cells = np.prod(setup.domain.shape)
    return {
        "ux": u_prev[0],
        "uy": u_prev[1],
        "steps": steps,
        "residual": residual,
        "converged": bool(crit.tol > 0 and residual < crit.tol),
        "wall_s": t_run,
        "mlups": float(cells * (steps - crit.every) / t_run / 1e6) if t_run > 0 else None,
        "mass_rel_drift": abs(mass - mass0) / mass0,
    }


def validate(re: int, args) -> dict:
    from simpar import config as cfgmod
    from simpar.grid import lbm_config
    from simpar.io.cavity_plot import ghia_deviation

    data, _ = cfgmod.load(CONFIGS[re], args.set)
    setup = lbm_config.from_config(cfgmod.Section(data))
    u_lid = float(setup.params["u_wall"][0])
    out = {
        "reynolds": re,
        "grid": list(setup.domain.shape),
        "dtype": setup.domain.dtype,
        "engine": args.engine,
        "mesh": args.mesh,
    }
    log = (lambda s: print(s, file=sys.stderr)) if args.verbose else None
    halo = args.halo if args.halo is not None else data.get("parallel", {}).get("halo")
    res = run_steady(setup, args.engine, args.mesh, halo, data["time"]["steps"], log)
    out.update({k: v for k, v in res.items() if k not in ("ux", "uy")})
    out.update(ghia_deviation(res["ux"], res["uy"], u_lid, re))
    return out


def from_file(path: str, re: int | None) -> dict:
    import h5py

    from simpar.io.cavity_plot import _config, _last_frame, ghia_deviation

    with h5py.File(path, "r") as f:
        cfg = _config(f)
        ux, uy = _last_frame(f, "ux").T, _last_frame(f, "uy").T
        steps = int(f["step"][-1]) if "step" in f else None
    ph = cfg["physics"]
    u_lid = float(ph["u_lid"])
    re = re or int(
        round(ph.get("reynolds", u_lid * cfg["grid"]["shape"][0] / ph.get("viscosity", 1.0)))
    )
    out = {"reynolds": re, "file": path, "grid": list(ux.shape), "steps": steps}
    out.update(ghia_deviation(ux, uy, u_lid, re))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--re", type=int, nargs="+", default=[100], choices=sorted(CONFIGS))
    p.add_argument("--engine", default="single")
    p.add_argument("--mesh", type=mesh_arg, default=None, help="device grid, e.g. 2x4")
    p.add_argument("--devices", type=int, default=None, help="number of virtual CPU devices")
    p.add_argument("--halo", type=int, default=None, help="default: the config's parallel.halo")
    p.add_argument("--set", action="append", default=[], help="config override key.sub=value")
    p.add_argument(
        "--from", dest="path", default=None, help="read the last frame of an output file"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.path:
        print(json.dumps(from_file(args.path, args.re[0] if len(args.re) == 1 else None)))
        return 0
    import jax

    jax.config.update("jax_enable_x64", True)  # honour grid.dtype = "float64"
    if args.devices:
        jax.config.update("jax_num_cpu_devices", args.devices)
    for re in args.re:
        print(json.dumps(validate(re, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
