"""Reweighting (DiffTRe) gradients of equilibrium averages on a decomposed engine, checked
against finite differences of long averages (issue 30, item 4).

What it does: LJ (cutoff 2.5) at density 0.8442, Langevin kT 1.44, gamma 1, dt 0.005, fcc
``--cells`` (5 5 5 = 500 atoms) on ``--engine`` ``--mesh`` (shard_map 2x2x2). One run at
epsilon = 1 samples ``--samples`` configurations ``--every`` steps apart after ``--equil``
steps; ``simpar.particles.reweight`` turns them into d<U/N>/d(epsilon, sigma) and
d<P>/d(epsilon, sigma) (P = rho kT + W / 3V) with block standard errors. Two more runs at
epsilon +- ``--delta`` (same key, same start) give central differences of the averages with
their standard errors; the JSON line reports both and the difference in combined standard
errors (``z``; |z| < 3 expected). The g(r) gradient estimate is printed for the first bins.

Run (2 CPU cores, loaded, defaults: ~10 min):
    python experiments/difftre_check.py
Bad arguments exit 2 with one line before JAX starts.
"""

from __future__ import annotations

import json
import sys
import time

from simpar.benchmark import ScriptParser, int_in, mesh_arg


def parse_args(argv=None):
    ap = ScriptParser(prog="difftre_check.py", description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int_in(3, 32), nargs=3, default=[5, 5, 5])
    ap.add_argument("--engine", choices=["pmap", "shard_map"], default="shard_map")
    ap.add_argument("--mesh", type=mesh_arg, default="2x2x2")
    ap.add_argument("--devices", type=int_in(0, 4096), default=8)
    ap.add_argument("--equil", type=int_in(0), default=1000)
    ap.add_argument("--samples", type=int_in(20), default=400)
    ap.add_argument("--every", type=int_in(1), default=20)
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--blocks", type=int_in(4, 100), default=10)
    args = ap.parse_args(argv)
    if not 0 < args.delta < 0.5:
        ap.error(f"--delta must be in (0, 0.5), got {args.delta}")
    return args


def main(argv=None):
    args = parse_args(argv)
    from simpar.benchmark import start_jax

    jax = start_jax(args.devices)
    import numpy as np

    from simpar.particles import fitting, potentials, reweight
    from simpar.particles.differentiable import lj_start

    kt = 1.44
    spc, r, v = lj_start(args.cells, kt=kt)
    n = r.shape[0]
    box = np.asarray(spc.box)
    vol = float(np.prod(box))

    def run(eps):
        pot = potentials.lennard_jones(epsilon=eps, cutoff=2.5)
        pos, _ = fitting.langevin_samples(args.engine, spc, pot, r, v, n_samples=args.samples,
                                          every=args.every, equil=args.equil, kt=kt,
                                          gamma=1.0, dt=0.005, key=jax.random.PRNGKey(7),
                                          mesh=args.mesh)  # fmt: skip
        return pot, pos, reweight.pair_terms(spc, pot, pos)

    def obs(t):
        return {"energy": np.asarray(t["energy"]) / n,
                "pressure": n * kt / vol + np.asarray(t["virial"]) / (3 * vol)}

    t0 = time.perf_counter()
    pot, pos, terms = run(1.0)
    o = obs(terms)
    d_obs = {"energy": jax.tree.map(lambda x: np.asarray(x) / n, terms["d_energy"]),
             "pressure": jax.tree.map(lambda x: np.asarray(x) / (3 * vol), terms["d_virial"])}
    est = {k: reweight.estimate(o[k], d_obs[k], terms["d_energy"], kt, args.blocks)
           for k in o}  # fmt: skip
    fd = {}
    means = {}
    for sign in (+1, -1):
        _, _, t = run(1.0 + sign * args.delta)
        ob = obs(t)
        means[sign] = {k: reweight.mean_se(x, args.blocks) for k, x in ob.items()}
    out = {"engine": args.engine, "mesh": list(args.mesh), "atoms": n, "samples": args.samples,
           "every": args.every, "equil": args.equil, "delta": args.delta}
    for k in o:
        d = (means[1][k][0] - means[-1][k][0]) / (2 * args.delta)
        se = np.hypot(means[1][k][1], means[-1][k][1]) / (2 * args.delta)
        g, ge = est[k][0]["epsilon"], est[k][1]["epsilon"]
        fd[k] = {"reweighting": float(g), "reweighting_se": float(ge), "fd": float(d),
                 "fd_se": float(se), "z": float((g - d) / np.hypot(ge, se)),
                 "d_sigma_reweighting": float(est[k][0]["sigma"]),
                 "d_sigma_se": float(est[k][1]["sigma"])}  # fmt: skip
    out["d_by_epsilon"] = fd
    rr, g = reweight.rdf(spc, pos[:: max(1, args.samples // 50)], 40, float(np.min(box)) / 2)
    du = np.asarray(terms["d_energy"]["epsilon"])[:: max(1, args.samples // 50)]
    gg, ge = reweight.estimate(g, None, {"epsilon": du}, kt, 5)
    out["rdf_d_by_epsilon_first_peak"] = {"r": float(rr[int(np.argmax(g.mean(0)))]),
                                          "dg": float(gg["epsilon"][int(np.argmax(g.mean(0)))]),
                                          "se": float(ge["epsilon"][int(np.argmax(g.mean(0)))])}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
