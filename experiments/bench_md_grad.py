"""Memory and cost of a gradient through MD (issue 30, item 3): rematerialisation per chunk.

What it measures: LJ at density 0.8442 (fcc ``--cells``; cutoff 2.5, skin 0.3, T 1.44,
dt 0.005, float64) on ``--engine`` (``single`` by default: XLA's buffer assignment of the
one-device program is the per-device figure). For each of ``--steps`` it compiles
``jax.grad`` of a loss of the run (``simpar.particles.differentiable.rollout``) with chunks of
``--chunk`` steps under ``jax.checkpoint`` (``remat``) and, up to ``--plain-max`` steps,
without (``plain``), and reports XLA's temporary bytes (``memory_analysis()``): ``plain``
grows with the steps (every step's intermediates are kept), ``remat`` with the number of
checkpoints (one state + neighbour list per chunk) plus one chunk's intermediates. It times the
forward run and the gradient (best of ``--repeats`` calls, compiled) and reports the cost of a
gradient in forward-step equivalents: ``t_grad / t_forward`` (about 2 for the backward pass
+ 1 for the recomputed forward under remat, ideally).

Prints one JSON object per line, then a summary line.

Run (2 CPU cores, loaded, 2,048 atoms, steps 25..200: ~10 min; the issue's 32,000 atoms x
1,000 steps: --cells 20 20 20 --steps 1000 --chunk 32 --plain-max 0):
    python experiments/bench_md_grad.py --cells 8 8 8 --steps 25 50 100 200 --chunk 25
Bad arguments exit 2 with one line before JAX starts.
"""

from __future__ import annotations

import json
import sys
import time

from simpar.benchmark import ScriptParser, int_in, mesh_arg


def parse_args(argv=None):
    ap = ScriptParser(prog="bench_md_grad.py", description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int_in(2, 64), nargs=3, default=[8, 8, 8])
    ap.add_argument("--steps", type=int_in(1, 100000), nargs="+", default=[25, 50, 100, 200])
    ap.add_argument("--chunk", type=int_in(1), default=25, help="steps per remat chunk")
    ap.add_argument("--plain-max", type=int_in(0), default=100,
                    help="largest --steps also compiled without remat (0: none)")  # fmt: skip
    ap.add_argument("--engine", choices=["single", "pmap", "shard_map"], default="single")
    ap.add_argument("--mesh", type=mesh_arg, default="2x4", help="decomposed engines: device grid, e.g. 2x4")
    ap.add_argument("--devices", type=int_in(0, 4096), default=8, help="virtual CPU devices")
    ap.add_argument("--repeats", type=int_in(1, 100), default=2)
    args = ap.parse_args(argv)
    if any(s % args.chunk for s in args.steps):
        ap.error(f"every --steps must be a multiple of --chunk {args.chunk}")
    return args


def main(argv=None):
    args = parse_args(argv)
    from simpar.benchmark import best_time, start_jax

    jax = start_jax(args.devices)
    import jax.numpy as jnp

    from simpar.particles import differentiable as D
    from simpar.particles import potentials

    spc, r, v = D.lj_start(args.cells)
    n = r.shape[0]
    pot = potentials.lennard_jones(cutoff=2.5)
    mesh = (1,) if args.engine == "single" else args.mesh
    rows = []
    for steps in args.steps:
        for remat in (True, False):
            if not remat and steps > args.plain_max:
                continue
            chunk = args.chunk if remat else None
            run = D.rollout(args.engine, spc, pot, r, v, n_steps=steps, dt=0.005, mesh=mesh,
                            checkpoint=chunk)  # fmt: skip

            def loss(p, run=run):
                t = run(p, r, v)
                return jnp.mean(t.kinetic) + t.e_pair

            t0 = time.perf_counter()
            grad = jax.jit(jax.grad(loss)).lower(pot).compile()
            compile_s = time.perf_counter() - t0
            mem = grad.memory_analysis()
            temp = None if mem is None else int(mem.temp_size_in_bytes)
            fwd = jax.jit(loss).lower(pot).compile()
            t_fwd = best_time(lambda fwd=fwd: fwd(pot), args.repeats)
            t_grad = best_time(lambda grad=grad: grad(pot), args.repeats)
            row = {"engine": args.engine, "mesh": list(mesh), "atoms": n, "steps": steps,
                   "remat": remat, "chunk": chunk,
                   "checkpoints": steps // chunk if remat else steps,
                   "temp_bytes": temp, "compile_s": round(compile_s, 1),
                   "forward_s": round(t_fwd, 4), "grad_s": round(t_grad, 4),
                   "grad_in_forward_equivalents": round(t_grad / t_fwd, 2)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"summary": {
        "remat_temp_bytes_by_steps": {x["steps"]: x["temp_bytes"] for x in rows if x["remat"]},
        "plain_temp_bytes_by_steps": {x["steps"]: x["temp_bytes"] for x in rows
                                      if not x["remat"]},
        "state_bytes": int(r.nbytes * 3),
    }}), flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
