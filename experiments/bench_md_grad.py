"""Memory and cost of a gradient through MD (issue 30, item 3): rematerialisation per chunk.

What it measures: LJ at density 0.8442 (fcc ``--cells``; cutoff 2.5, skin 0.3, T 1.44,
dt 0.005, float64) on ``--engine`` (``single`` by default: the one-device program is the
per-device figure). Each case (``--steps`` with chunks of ``--chunk`` steps under
``jax.checkpoint``, and up to ``--plain-max`` steps without remat) runs in a fresh Python
process, which compiles ``jax.grad`` of a loss of the run
(``simpar.particles.differentiable.rollout``), runs it once and reports:

  * ``peak_rss_mib``: the process's peak resident memory (Linux ``VmHWM``), and
    ``sizing_rss_mib`` the same before the gradient was compiled (after the forward sizing
    run), so the gradient's own share is the difference;
  * ``temp_bytes``: XLA's temporary buffers of the compiled gradient (``memory_analysis``);
    ``plain`` grows with the steps (every step's intermediates are kept), ``remat`` with the
    number of checkpoints (one state + neighbour list per chunk) plus one step's
    intermediates (two levels of ``jax.checkpoint``);
  * ``grad_in_forward_equivalents``: ``t_grad / t_forward`` of the same steps (compiled, one
    call each, ``--repeats`` for the best of several, alternated): the cost of a gradient in
    forward steps.

Prints one JSON object per case, then ``{"summary": ...}`` with the peak memory by steps, the
slope of the peak per kept checkpoint and the costs.

Run (2 CPU cores; the issue's 32,000 atoms x 100, 300, 1,000 steps: ~40 min at load 11-19,
~20 min at load 5):
    python experiments/bench_md_grad.py --cells 20 20 20 --steps 100 300 1000 --chunk 25 --plain-max 0
    python experiments/bench_md_grad.py --cells 8 8 8 --steps 25 50 100 --chunk 25
Bad arguments exit 2 with one line before JAX starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from simpar.benchmark import ScriptParser, int_in, mesh_arg


def parse_args(argv=None):
    ap = ScriptParser(prog="bench_md_grad.py", description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int_in(2, 64), nargs=3, default=[8, 8, 8])
    ap.add_argument("--steps", type=int_in(1, 100000), nargs="+", default=[25, 50, 100])
    ap.add_argument("--chunk", type=int_in(1), default=25, help="steps per remat chunk")
    ap.add_argument("--plain-max", type=int_in(0), default=50,
                    help="largest --steps also compiled without remat (0: none)")  # fmt: skip
    ap.add_argument("--engine", choices=["single", "pmap", "shard_map"], default="single")
    ap.add_argument("--mesh", type=mesh_arg, default="2x4",
                    help="decomposed engines: device grid, e.g. 2x4")  # fmt: skip
    ap.add_argument("--devices", type=int_in(0, 4096), default=8, help="virtual CPU devices")
    ap.add_argument("--repeats", type=int_in(1, 100), default=1)
    ap.add_argument("--case", type=int_in(0), default=None, help=argparse_suppress())
    ap.add_argument("--plain", action="store_true", help=argparse_suppress())
    args = ap.parse_args(argv)
    if any(s % args.chunk for s in args.steps):
        ap.error(f"every --steps must be a multiple of --chunk {args.chunk}")
    return args


def argparse_suppress():
    """argparse's marker of a hidden option (the per-case child's flags)."""
    import argparse

    return argparse.SUPPRESS


def one_case(args) -> dict:
    """One case in this (fresh) process: compile and run the gradient and the forward."""
    from simpar.benchmark import best_time, start_jax

    jax = start_jax(args.devices)
    import jax.numpy as jnp

    from simpar.memory import peak_memory_mib
    from simpar.particles import differentiable as D
    from simpar.particles import potentials

    spc, r, v = D.lj_start(args.cells)
    n = r.shape[0]
    pot = potentials.lennard_jones(cutoff=2.5)
    mesh = (1,) if args.engine == "single" else args.mesh
    steps, remat = args.case, not args.plain
    chunk = args.chunk if remat else None
    t0 = time.perf_counter()
    run = D.rollout(args.engine, spc, pot, r, v, n_steps=steps, dt=0.005, mesh=mesh,
                    checkpoint=chunk)  # fmt: skip
    sizing_s = time.perf_counter() - t0
    sizing_rss = peak_memory_mib()

    def loss(p):
        t = run(p, r, v)
        return jnp.mean(t.kinetic) + t.e_pair

    t0 = time.perf_counter()
    grad = jax.jit(jax.grad(loss)).lower(pot).compile()
    compile_s = time.perf_counter() - t0
    mem = grad.memory_analysis()
    temp = None if mem is None else int(mem.temp_size_in_bytes)
    fwd = jax.jit(loss).lower(pot).compile()
    t_grad = t_fwd = float("inf")
    grad_rss = None
    for _ in range(args.repeats):  # alternated: a change of the box's load hits both
        t_grad = min(t_grad, best_time(lambda: grad(pot), 1, warmup=False))
        grad_rss = grad_rss or peak_memory_mib()  # before the forward's own peak
        t_fwd = min(t_fwd, best_time(lambda: fwd(pot), 1, warmup=False))
    return {"engine": args.engine, "mesh": list(mesh), "atoms": n, "steps": steps,
            "remat": remat, "chunk": chunk,
            "checkpoints": steps // chunk if remat else steps,
            "sizing_rss_mib": sizing_rss, "peak_rss_mib": grad_rss,
            "peak_rss_after_forward_mib": peak_memory_mib(), "temp_bytes": temp,
            "sizing_s": round(sizing_s, 1), "compile_s": round(compile_s, 1),
            "forward_s": round(t_fwd, 3), "grad_s": round(t_grad, 3),
            "grad_in_forward_equivalents": round(t_grad / t_fwd, 2),
            "forward_step_ms": round(1e3 * t_fwd / steps, 2)}  # fmt: skip


def main(argv=None):
    args = parse_args(argv)
    if args.case is not None:
        print(json.dumps(one_case(args)), flush=True)
        return 0
    base = [sys.executable, __file__, "--cells", *map(str, args.cells), "--steps",
            *map(str, args.steps), "--chunk", str(args.chunk), "--engine", args.engine,
            "--mesh", "x".join(map(str, args.mesh)), "--devices", str(args.devices),
            "--repeats", str(args.repeats)]  # fmt: skip
    rows = []
    for steps in args.steps:
        for plain in (False, True):
            if plain and steps > args.plain_max:
                continue
            cmd = base + ["--case", str(steps)] + (["--plain"] if plain else [])
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                row = {"steps": steps, "remat": not plain, "error": out.stderr.strip()[-400:]}
            else:
                row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    ok = [x for x in rows if "error" not in x and x["remat"]]
    summary = {
        "peak_rss_mib_by_steps": {x["steps"]: x["peak_rss_mib"] for x in ok},
        "temp_bytes_by_steps": {x["steps"]: x["temp_bytes"] for x in ok},
        "grad_in_forward_equivalents_by_steps": {
            x["steps"]: x["grad_in_forward_equivalents"] for x in ok},
        "plain_peak_rss_mib_by_steps": {x["steps"]: x["peak_rss_mib"] for x in rows
                                        if "error" not in x and not x["remat"]},
    }  # fmt: skip
    if len(ok) > 1:
        a, b = ok[0], ok[-1]
        dk = b["checkpoints"] - a["checkpoints"]
        if dk and a["temp_bytes"] is not None and b["temp_bytes"] is not None:
            summary["temp_bytes_per_checkpoint"] = round((b["temp_bytes"] - a["temp_bytes"]) / dk)
        if dk:
            summary["peak_rss_mib_per_checkpoint"] = round(
                (b["peak_rss_mib"] - a["peak_rss_mib"]) / dk, 2
            )
    print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
