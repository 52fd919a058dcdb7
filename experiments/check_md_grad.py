"""Gradient checks through decomposed MD (issue 30, items 1-2): engines against ``single``,
central finite differences, and the Lyapunov growth of the gradient with the horizon.

What it does: LJ at density 0.8442 (fcc ``--cells``, 10 10 10 = 4,000 atoms; cutoff 2.5,
skin 0.3, T 1.44 Maxwell-Boltzmann, dt 0.005, float64) runs ``--steps`` steps on ``single``
and on every ``--engines`` x ``--meshes`` through ``simpar.particles.differentiable.rollout``
(chunks of ``--checkpoint`` steps under ``jax.checkpoint``). The loss is the mean kinetic
energy over the run plus the final pair energy and ``w . v(T)`` (fixed random ``w``); its
gradient with respect to (epsilon, sigma, x0, v0) is compared leaf by leaf, as
``max |g - g_single| / max |g_single|``, and the final positions and velocities of the forward
run are checked for bitwise equality with ``single``'s (FMA is off on x86 as in the tests,
``--fma`` keeps it). On ``single`` the epsilon and sigma derivatives are compared with central
differences (relative step ``--fd-step``) up to ``--fd-max-steps``, and two measures of the
conditioning are recorded: the norm of ``d(w . v(T)) / d x0`` and the growth
``|x'(T) - x(T)| / 1e-10`` of two forward runs started 1e-10 apart (at every ``--steps`` and
``--separation-steps``). Both grow like ``exp(lambda T)``, the trajectory's largest Lyapunov
exponent, which is what makes long-horizon gradients ill-conditioned.

Prints one JSON object per line (a record per engine, mesh and horizon) and a final summary
line ``{"summary": ...}`` with the fitted exponents.

Run (2 CPU cores, load 10-19: 4,000 atoms x 1,000 steps on three meshes and two engines
~45 min; 10, 100 and 300 steps on three meshes ~40 min):
    python experiments/check_md_grad.py --steps 1000 --separation-steps 10 100 300 \
        --meshes 2x4 2x2x2 8 --engines shard_map pmap
    python experiments/check_md_grad.py --steps 10 100 300 --fd-max-steps 100
    python experiments/check_md_grad.py --steps 10 100 --potential lj_sf --single-only
Bad arguments exit 2 with one line before JAX starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

from simpar.benchmark import ScriptParser, int_in, mesh_arg


def lj_sf(r2, p):
    """Shifted-force LJ cut at 2.5: ``u(r) - u(rc) - (r - rc) u'(rc)`` (continuous force)."""
    import jax.numpy as jnp

    def u(x2):
        s6 = (p["sigma"] ** 2 / x2) ** 3
        return 4.0 * p["epsilon"] * s6 * (s6 - 1.0)

    rc = 2.5
    s6c = (p["sigma"] / rc) ** 6
    du_c = -24.0 * p["epsilon"] * s6c * (2.0 * s6c - 1.0) / rc
    return u(r2) - u(rc * rc) - (jnp.sqrt(r2) - rc) * du_c


def parse_args(argv=None) -> argparse.Namespace:
    ap = ScriptParser(prog="check_md_grad.py", description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int_in(2, 64), nargs=3, default=[10, 10, 10])
    ap.add_argument("--steps", type=int_in(1, 100000), nargs="+", default=[10, 100, 1000])
    ap.add_argument("--meshes", type=mesh_arg, nargs="+", default=[(2, 4), (2, 2, 2), (8,)],
                    help="device grids of the decomposed engines, e.g. 2x4 2x2x2 8")  # fmt: skip
    ap.add_argument("--engines", nargs="+", choices=["pmap", "shard_map"], default=["shard_map"])
    ap.add_argument("--devices", type=int_in(0, 4096), default=8, help="virtual CPU devices")
    ap.add_argument("--checkpoint", type=int_in(1), default=10, help="steps per remat chunk")
    ap.add_argument("--fd-step", type=float, default=1e-6, help="relative FD step")
    ap.add_argument("--fd-max-steps", type=int_in(0), default=100,
                    help="central differences only up to this horizon (beyond it the "
                         "gradient is ill-conditioned, see the separation growth)")  # fmt: skip
    ap.add_argument("--separation-steps", type=int_in(1, 100000), nargs="*", default=[],
                    help="extra horizons (forward runs only) at which the growth of a 1e-10 "
                         "separation is measured, besides every --steps")  # fmt: skip
    ap.add_argument("--potential", choices=["lj", "lj_sf"], default="lj",
                    help="lj: truncated at 2.5 (the force jumps there); lj_sf: shifted force "
                         "(energy and force continuous at the cutoff)")  # fmt: skip
    ap.add_argument("--single-only", action="store_true", help="no decomposed engines")
    ap.add_argument("--fma", action="store_true",
                    help="keep fused multiply-add (default off on x86, as in the tests: with "
                         "it the engines' forward runs differ from single's by a rounding, "
                         "which the trajectory's Lyapunov growth amplifies)")  # fmt: skip
    args = ap.parse_args(argv)
    most = max(math.prod(m) for m in args.meshes)
    if args.devices and most > args.devices:
        ap.error(f"--meshes need {most} devices; --devices is {args.devices}")
    if not 0 < args.fd_step < 1e-2:
        ap.error(f"--fd-step must be in (0, 0.01), got {args.fd_step}")
    return args


def main(argv=None):
    args = parse_args(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    if not args.fma and platform.machine().lower() in ("x86_64", "amd64") and (
        "xla_cpu_max_isa" not in flags
    ):  # before JAX starts: no FMA, every engine's forward run bitwise equal to single's
        os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_max_isa=AVX").strip()
    print(json.dumps({"xla_flags": os.environ.get("XLA_FLAGS", "")}), flush=True)
    from simpar.benchmark import start_jax

    jax = start_jax(args.devices)
    import dataclasses

    import jax.numpy as jnp
    import numpy as np

    from simpar.particles import differentiable as D
    from simpar.particles import potentials

    spc, r, v = D.lj_start(args.cells, jitter=0.02)  # off the lattice
    n = r.shape[0]
    w = jax.random.normal(jax.random.PRNGKey(2), r.shape, r.dtype) / math.sqrt(n)
    if args.potential == "lj":
        pot = potentials.lennard_jones(cutoff=2.5)
    else:
        pot = potentials.pair(lj_sf, 2.5, {"epsilon": 1.0, "sigma": 1.0})
    box = np.asarray(spc.box)

    def grads(engine, mesh, steps):
        run = D.rollout(engine, spc, pot, r, v, n_steps=steps, dt=0.005, mesh=mesh,
                        checkpoint=args.checkpoint)  # fmt: skip

        def loss(p, x, u):
            t = run(p, x, u)
            return jnp.mean(t.kinetic) + t.e_pair + jnp.sum(w * t.velocity), t

        def tail(x):
            return jnp.sum(w * run(pot, x, v).velocity)

        t0 = time.perf_counter()
        vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
        (val, traj), g = vg(pot, r, v)
        D.check(traj)
        jax.block_until_ready(g)
        wall = time.perf_counter() - t0
        return vg, float(val), traj, g, wall, tail

    def rel(a, b):
        a, b = np.asarray(a), np.asarray(b)
        return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))

    d0 = jax.random.normal(jax.random.PRNGKey(5), r.shape, r.dtype)
    d0 = 1e-10 * d0 / jnp.linalg.norm(d0)  # two starts 1e-10 apart (Euclidean, all 3N)

    def separation(steps):
        """|x'(T) - x(T)| / |x'(0) - x(0)| (minimum image) and the same for velocities
        (per unit start separation) on ``single``: the trajectory's Lyapunov growth."""
        run = jax.jit(D.rollout("single", spc, pot, r, v, n_steps=steps, dt=0.005))
        a, b = run(pot, r, v), run(pot, r + d0, v)
        dx = np.asarray(b.position) - np.asarray(a.position)
        dx -= box * np.round(dx / box)
        dv = np.asarray(b.velocity) - np.asarray(a.velocity)
        return float(np.linalg.norm(dx) / 1e-10), float(np.linalg.norm(dv) / 1e-10)

    lyap, sep = [], {}
    for steps in sorted(set(args.separation_steps) - set(args.steps)):
        sx, sv = separation(steps)
        sep[steps] = sx
        print(json.dumps({"separation": {"steps": steps, "time": steps * 0.005,
                                         "position_growth": sx, "velocity_growth": sv}}),
              flush=True)  # fmt: skip
    for steps in args.steps:
        vg, val, traj, g, wall, tail = grads("single", (1,), steps)
        rec = {"engine": "single", "mesh": [1], "atoms": n, "steps": steps, "loss": val,
               "builds": int(traj.builds), "wall_s": round(wall, 1),
               "grad": {"epsilon": float(g[0].params["epsilon"]),
                        "sigma": float(g[0].params["sigma"]),
                        "x0_norm": float(jnp.linalg.norm(g[1])),
                        "v0_norm": float(jnp.linalg.norm(g[2]))}}  # fmt: skip
        if steps <= args.fd_max_steps:
            fd = {}
            for name in ("epsilon", "sigma"):
                x = float(pot.params[name])
                h = args.fd_step * x

                def f(val, name=name, vg=vg):
                    p = dataclasses.replace(pot, params={**pot.params, name: jnp.asarray(val)})
                    return float(vg(p, r, v)[0][0])

                d = (f(x + h) - f(x - h)) / (2 * h)
                fd[name] = {"fd": d, "rel_err": abs(float(g[0].params[name]) - d) / abs(d)}
            rec["finite_differences"] = fd
        gx = jax.jit(jax.grad(tail))(r)
        rec["lyapunov_grad_norm"] = float(jnp.linalg.norm(gx))
        sx, sv = separation(steps)
        sep[steps] = sx
        rec["separation_growth"] = {"position": sx, "velocity": sv}
        lyap.append((steps * 0.005, rec["lyapunov_grad_norm"]))
        print(json.dumps(rec), flush=True)
        ref = g
        for engine in [] if args.single_only else args.engines:
            for mesh in args.meshes:
                _, dval, dtraj, dg, dwall, _ = grads(engine, mesh, steps)
                names = ["epsilon", "sigma", "x0", "v0"]
                leaves = [dg[0].params["epsilon"], dg[0].params["sigma"], dg[1], dg[2]]
                refs = [ref[0].params["epsilon"], ref[0].params["sigma"], ref[1], ref[2]]
                fwd = {k: bool(np.array_equal(np.asarray(getattr(dtraj, k)),
                                              np.asarray(getattr(traj, k))))
                       for k in ("position", "velocity", "kinetic")}  # fmt: skip
                out = {"engine": engine, "mesh": list(mesh), "atoms": n, "steps": steps,
                       "loss_rel_diff": abs(dval - val) / abs(val),
                       "forward_bitwise_equal": fwd,
                       "forward_max_abs_diff": {
                           k: float(np.max(np.abs(np.asarray(getattr(dtraj, k))
                                                  - np.asarray(getattr(traj, k)))))
                           for k in ("position", "velocity")},
                       "builds": int(dtraj.builds), "wall_s": round(dwall, 1),
                       "grad_rel_diff_vs_single": {k: rel(a, b) for k, a, b in
                                                   zip(names, leaves, refs, strict=True)}}  # fmt: skip
                print(json.dumps(out), flush=True)
    summary = {"lyapunov_norms": [{"time": t, "grad_norm": x} for t, x in lyap],
               "separation_growth": [{"time": s * 0.005, "position": x}
                                     for s, x in sorted(sep.items())]}  # fmt: skip
    if len(lyap) > 1:
        t, x = np.array(lyap).T
        summary["lyapunov_exponent_fit"] = float(np.polyfit(t, np.log(x), 1)[0])
    if len(sep) > 1:
        t, x = np.array([(s * 0.005, x) for s, x in sorted(sep.items())]).T
        summary["separation_exponent_fit"] = float(np.polyfit(t, np.log(x), 1)[0])
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
