"""Benchmark: 2-D heat (5-point, periodic, float32) per engine, device count and halo width.

What it shows: M cell-updates/s for each engine on 1 and 2 (virtual CPU) devices and halo widths
1, 2 and 4 (w steps per exchange), a NumPy baseline (np.roll stencil), the machine's memory
bandwidth (``simpar.benchmark.memory_bandwidth``: 512 MiB arrays copied by NumPy on one thread
and on every core, a jitted in-place pass and a jitted pass into a second buffer; bytes read +
written per second; the largest is the roofline) and the roofline ratio: an update reads and
writes one float32 (8 bytes), so the bandwidth bound is BW / 8 updates/s.
Compare ratios measured in one run; absolute figures drift on shared machines.

Run (about 2-3 minutes on 2 cores):
    python experiments/bench_heat.py [--n 4096] [--steps 20] [--devices 2] [--repeats 3]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="grid is n x n")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed chunk")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--halos", default="1,2,4")
    args = ap.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)  # only affects the CPU backend
    import numpy as np

    from simpar.grid import heat
    from simpar.grid.boundary import Periodic
    from simpar.grid.domain import Domain
    from simpar.parallel.engines import make_engine

    n, steps = args.n, args.steps
    dom = Domain((n, n), (1.0, 1.0), "float32")
    per = (Periodic(), Periodic())
    model = heat.make_model(2, (per, per))
    dt = 0.2 / sum(1 / h**2 for h in dom.dx)
    params = heat.make_params(dom, 1.0, dt)
    u0 = np.random.default_rng(0).random((n, n), dtype=np.float32)
    cells = n * n

    from simpar.benchmark import best_time, memory_bandwidth, time_engine

    bw = memory_bandwidth()
    bandwidth = bw["roofline_GBps"] * 1e9

    # NumPy baseline: the same update with np.roll (periodic)
    a = np.float32(dt / dom.dx[0] ** 2)

    k_np = max(steps // 4, 2)

    def numpy_steps():
        u = u0.copy()
        for _ in range(k_np):
            u = u + a * (
                np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1) - 4 * u
            )
        return u

    numpy_rate = cells * k_np / best_time(numpy_steps, 2) / 1e6

    results = []
    halos = [int(h) for h in args.halos.split(",")]
    cases = [("single", 1, h) for h in halos]
    for ndev in sorted({1, args.devices}):
        for h in halos:
            cases += [("pmap", ndev, h), ("shard_map", ndev, h)]
        if ndev > 1:
            cases.append(("sharded", ndev, 1))
    for engine, ndev, h in cases:
        mesh = None if engine == "single" else (ndev,)
        e = make_engine(engine, model, (n, n), mesh, h)
        rate = cells / time_engine(e, {"u": u0}, params, steps, args.repeats) / 1e6
        results.append(
            {
                "engine": engine,
                "devices": ndev,
                "halo": h,
                "Mcell_updates_per_s": round(rate, 1),
                "roofline_ratio": round(rate * 1e6 * 8 / bandwidth, 3),
                "vs_numpy": round(rate / numpy_rate, 2),
            }
        )
        print(json.dumps(results[-1]), flush=True, file=__import__("sys").stderr)

    single = max(r["Mcell_updates_per_s"] for r in results if r["engine"] == "single")
    for r in results:
        r["vs_single"] = round(r["Mcell_updates_per_s"] / single, 3)
    print(
        json.dumps(
            {
                "benchmark": "heat2d_5pt_periodic_float32",
                "grid": [n, n],
                "steps_per_chunk": steps,
                "jax": jax.__version__,
                "backend": jax.default_backend(),
                "cpu_count": os.cpu_count(),
                "memory_bandwidth_GBps": {k: round(v, 2) for k, v in bw.items()},
                "roofline_Mcell_updates_per_s": round(bandwidth / 8 / 1e6, 1),
                "numpy_Mcell_updates_per_s": round(numpy_rate, 1),
                "best_single_Mcell_updates_per_s": single,
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
