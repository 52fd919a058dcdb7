"""Benchmark: all-pairs gravitational N-body, pair interactions per second per engine.

What it shows: the throughput of the softened all-pairs force + leapfrog step on each
engine (``single``; ``pmap`` and ``shard_map`` with the ring algorithm; ``sharded`` with
XLA partitioning the unchanged kernel) on 1, 2 and 8 devices, against a NumPy all-pairs
force evaluation (one evaluation, blocked over targets to bound memory). A leapfrog step
costs one force evaluation, so one step = N^2 pair interactions (self pairs included,
as the kernel evaluates and masks them).

Run (about 1-2 minutes on 2 CPU cores; 8 *virtual* CPU devices share those cores, so
multi-device CPU figures show overhead, not speed-up):
    python experiments/bench_nbody.py                       # N = 4096 float32
    python experiments/bench_nbody.py --n 8192 --steps 5 --devices 1 2 4 8
Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from simpar.benchmark import environment  # noqa: E402

if "--gpu" not in sys.argv:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX starts


def _args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="number of particles")
    ap.add_argument("--steps", type=int, default=10, help="leapfrog steps per timing")
    ap.add_argument("--repeats", type=int, default=3, help="timings per case (best kept)")
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--engines", nargs="+", default=["single", "pmap", "shard_map", "sharded"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--gpu", action="store_true", help="use the default backend")
    return ap.parse_args()


def main() -> None:
    args = _args()
    import jax

    if not args.gpu:
        jax.config.update("jax_num_cpu_devices", max(args.devices))
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from simpar.particles.nbody import make_params, plummer_sphere

    n, dtype = args.n, np.dtype(args.dtype)
    pos, vel, mass = plummer_sphere(n, seed=1, dtype=dtype)
    params = make_params(0.001, 1.0, 0.01, dtype=dtype)

    # NumPy baseline: one all-pairs force evaluation, blocked over targets.
    def numpy_forces(block=256):
        acc = np.empty_like(pos)
        eps2 = dtype.type(0.01**2)
        for i in range(0, n, block):
            d = pos[None, :, :] - pos[i : i + block, None, :]
            r2 = np.einsum("ijk,ijk->ij", d, d)
            inv = np.where(r2 > 0, (r2 + eps2) ** dtype.type(-1.5), dtype.type(0))
            acc[i : i + block] = np.einsum("ijk,ij->ik", d, inv * mass[None, :])
        return acc

    numpy_forces()  # warm-up
    t_np = min(_timed(numpy_forces)[1] for _ in range(args.repeats))
    numpy_rate = n * n / t_np

    results = []
    n_avail = len(jax.devices())
    for engine in args.engines:
        for n_dev in args.devices:
            if (engine == "single" and n_dev != 1) or n_dev > n_avail or n % n_dev:
                continue
            r = bench_engine(engine, n_dev, pos, vel, mass, params, args.steps, args.repeats)
            rate = r["pair_interactions_per_s"]
            r["ratio_vs_numpy"] = rate / numpy_rate
            results.append(r)
            print(
                f"{engine:9s} x{n_dev}: {rate:.3e} pairs/s ({rate / numpy_rate:.1f}x NumPy)",
                file=sys.stderr,
            )

    print(
        json.dumps(
            {
                "benchmark": "nbody_all_pairs",
                "n": n,
                "dtype": args.dtype,
                "pairs_per_step": n * n,
                "numpy_pair_interactions_per_s": numpy_rate,
                "numpy_seconds_per_force": t_np,
                "results": results,
                **environment(),
                "backend": jax.default_backend(),
                "device_kind": jax.devices()[0].device_kind,
                "cpu_count": os.cpu_count(),
                "host": platform.node(),
            },
            indent=2,
        )
    )


def bench_engine(engine: str, n_dev: int, pos, vel, mass, params, steps: int, repeats: int):
    """Pair interactions per second of ``steps`` leapfrog steps of one engine (best of ``repeats``)."""
    import jax
    import numpy as np

    from simpar.particles.nbody import make_engine

    n = len(pos)
    eng = make_engine(engine, n_dev)
    d = eng.init(pos, vel, mass, params)
    t0 = time.perf_counter()
    d, o = eng.run(d, params, 1)  # compile (the step count is traced)
    jax.block_until_ready((d, o))
    compile_s = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        (d, o), t = _timed(lambda d=d: jax.block_until_ready(eng.run(d, params, steps)))
        best = min(best, t)
    return {
        "engine": engine,
        "devices": n_dev,
        "seconds": best,
        "steps": steps,
        "first_call_s": compile_s,
        "pair_interactions_per_s": n * n * steps / best,
        "energy_finite": bool(np.isfinite(float(o.kinetic + o.potential))),
    }


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


if __name__ == "__main__":
    main()
