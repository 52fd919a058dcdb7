"""Fit Lennard-Jones epsilon and sigma to a LAMMPS target on a decomposed engine (issue 30,
item 5).

What it does: the target (``data/reference/lammps_lj_target``: LAMMPS 500 LJ atoms, cutoff
2.5, density 0.8442, Langevin T 1.44; its g(r), virial pressure and U/N with block standard
errors; the input ``in.lj_target`` and the command are stored beside it) is fitted from a wrong
start (``--start``, default epsilon 0.8, sigma 1.1) by ``simpar.particles.fitting.fit``:
Langevin MD on ``--engine`` ``--mesh`` at the current parameters samples configurations;
reweighting (DiffTRe) gives the averages and their Jacobians w.r.t. (epsilon, sigma); a
Gauss-Newton step on the chi-square (residuals in units of the target's and the samples'
standard errors) moves the parameters by at most 10%; the samples are reused (reweighted)
while their effective sample size at the new parameters stays above half, else resampled
from the last configuration. Prints one JSON object: ``fitted``, ``target`` (each with
``epsilon`` and ``sigma``), ``history`` (loss, epsilon, sigma, ESS per iteration), the final
averages against the target's, ``engine``, ``mesh``, ``wall_s``.

Full: 7 iterations x 300 samples 20 steps apart; ``--quick``: 6 iterations x 150 samples.

Run times on 2 cores (float64, 8 virtual CPU devices, the 2-core box shared with other jobs,
load average 6-16; docs/benchmarks.md "Fitting LJ to LAMMPS"):
    python experiments/fit_lj_to_lammps.py --quick          # shard_map 2x2x2: 233 s
    python experiments/fit_lj_to_lammps.py --quick --engine single                # 165 s
    python experiments/fit_lj_to_lammps.py --quick --engine pmap   # 2x2x2: 333 s (= shard_map's fit)
    python experiments/fit_lj_to_lammps.py                  # full, shard_map 2x2x2: 274 s
(fitted epsilon 0.9980 / 0.9973 / 0.9979, sigma 0.99997 / 0.99985 / 1.00035; on 1 device use
--engine single --devices 1).
Bad arguments exit 2 with one line before JAX starts.
"""

from __future__ import annotations

import json
import sys
import time

from simpar.benchmark import ScriptParser, int_in, mesh_arg


def parse_args(argv=None):
    ap = ScriptParser(prog="fit_lj_to_lammps.py", description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["single", "pmap", "shard_map"], default="shard_map")
    ap.add_argument("--mesh", type=mesh_arg, default=None, help="default 2x2x2 (single: 1)")
    ap.add_argument("--devices", type=int_in(0, 4096), default=8)
    ap.add_argument("--quick", action="store_true", help="6 iterations x 150 samples")
    ap.add_argument("--seed", type=int_in(0, 2**20), default=0)
    ap.add_argument("--start", type=float, nargs=2, default=[0.8, 1.1],
                    metavar=("EPS", "SIGMA"))  # fmt: skip
    args = ap.parse_args(argv)
    eps, sig = args.start
    if not (0.5 <= eps <= 2.0 and 0.8 <= sig <= 1.25):  # nan fails both
        ap.error(f"--start must be epsilon in [0.5, 2] and sigma in [0.8, 1.25], got {eps} {sig}")
    if args.mesh is None:
        args.mesh = (1,) if args.engine == "single" else (2, 2, 2)
    n_dev = 1
    for m in args.mesh:
        n_dev *= m
    if args.engine == "single" and n_dev != 1:
        ap.error(f"--mesh {'x'.join(map(str, args.mesh))} needs a decomposed --engine")
    if args.devices and n_dev > args.devices:
        ap.error(f"--mesh {'x'.join(map(str, args.mesh))} needs {n_dev} devices, "
                 f"--devices is {args.devices}")  # fmt: skip
    return args


def main(argv=None):
    args = parse_args(argv)
    from simpar.benchmark import start_jax

    start_jax(args.devices)
    from simpar.particles import fitting

    target = fitting.lammps_target()
    plan = dict(samples=150, iterations=6) if args.quick else dict(samples=300, iterations=7)
    t0 = time.perf_counter()
    res = fitting.fit(args.engine, target, args.start, mesh=args.mesh, seed=args.seed,
                      log=lambda line: print(line, file=sys.stderr, flush=True), **plan)  # fmt: skip
    obs = target["obs"]
    last = res["history"][-1]
    out = {
        "fitted": res["fitted"],
        "target": {"epsilon": target["system"]["epsilon"], "sigma": target["system"]["sigma"]},
        "error": {k: res["fitted"][k] / target["system"][k] - 1 for k in ("epsilon", "sigma")},
        "history": [{k: h[k] for k in ("loss", "epsilon", "sigma", "ess", "resampled")}
                    for h in res["history"]],  # fmt: skip
        "last_averages": {k: last[k] for k in ("energy", "pressure_virial")},
        "target_averages": {k: [float(obs[k][0]), float(obs[k][1])]
                            for k in ("energy", "pressure_virial")},  # fmt: skip
        "start": args.start, "engine": args.engine, "mesh": list(args.mesh),
        "devices": args.devices, "quick": args.quick, "seed": args.seed,
        "samplings": res["samplings"], **plan,
    }  # fmt: skip
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
