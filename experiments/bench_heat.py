"""Benchmark: 2-D heat (5-point, float32) per engine, device count and halo width.

What it shows: M cell-updates/s for each engine on 1 and 2 (virtual CPU) devices and halo widths
1, 2 and 4 (w steps per exchange), a NumPy baseline (np.roll stencil), the machine's memory
bandwidth (``simpar.benchmark.memory_bandwidth``: 512 MiB arrays copied by NumPy on one thread
and on every core, a jitted in-place pass and a jitted pass into a second buffer; bytes read +
written per second; the largest is the roofline) and the roofline ratio: an update reads and
writes one float32 (8 bytes), so the bandwidth bound is BW / 8 updates/s.
For the multi-device engines it also reports the bytes each device sends per step, read from
the compiled HLO (``simpar.benchmark.bytes_per_step``), and ``sharded_vs_shard_map``: the
``sharded`` rate over the ``shard_map`` rate at the same halo width and device count.
Compare ratios measured in one run; absolute figures drift on shared machines.

Run (about 2-3 minutes on 2 cores):
    python experiments/bench_heat.py [--n 4096] [--steps 20] [--devices 2] [--repeats 3]
    python experiments/bench_heat.py --walls     # Dirichlet / Neumann walls on x (split axis)
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os

from simpar.benchmark import environment  # noqa: E402


def heat_setup(n: int, walls: bool = False, dtype: str = "float32"):
    """(model, state, params, dt) of the benchmark: n x n, periodic or walls on x."""
    import numpy as np

    from simpar.grid import heat
    from simpar.grid.boundary import Dirichlet, Neumann, Periodic
    from simpar.grid.domain import Domain

    dom = Domain((n, n), (1.0, 1.0), dtype)
    per = (Periodic(), Periodic())
    bcs = ((Dirichlet(1.0), Neumann()), per) if walls else (per, per)
    model = heat.make_model(2, bcs)
    dt = 0.2 / sum(1 / h**2 for h in dom.dx)
    params = heat.make_params(dom, 1.0, dt)
    u0 = np.random.default_rng(0).random((n, n), dtype=np.float32).astype(dtype)
    return model, {"u": u0}, params, dt


def bench_case(model, state, params, engine: str, ndev: int, halo: int, steps: int, repeats: int):
    """One engine on ``ndev`` devices along x: M cell-updates/s and bytes sent per step."""
    from simpar.benchmark import bytes_per_step, time_engine
    from simpar.parallel.engines import make_engine

    shape = state["u"].shape
    mesh = None if engine == "single" else (ndev,)
    e = make_engine(engine, model, shape, mesh, halo)
    rate = shape[0] * shape[1] / time_engine(e, state, params, steps, repeats) / 1e6
    out = {"engine": engine, "devices": ndev, "halo": e.halo, "Mcell_updates_per_s": rate}
    if ndev > 1:
        out["bytes_per_step_per_device"] = bytes_per_step(e, state, params)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="grid is n x n")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed chunk")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--halos", default="1,2,4")
    ap.add_argument("--walls", action="store_true", help="Dirichlet/Neumann walls on x")
    args = ap.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)  # only affects the CPU backend
    import numpy as np

    n, steps = args.n, args.steps
    model, state, params, dt = heat_setup(n, args.walls)
    u0 = state["u"]
    cells = n * n

    from simpar.benchmark import best_time, memory_bandwidth

    bw = memory_bandwidth()
    bandwidth = bw["roofline_GBps"] * 1e9

    # NumPy baseline: the same update with np.roll (periodic)
    a = np.float32(dt * n * n)

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
                cases.append(("sharded", ndev, h))
    for engine, ndev, h in cases:
        r = bench_case(model, state, params, engine, ndev, h, steps, args.repeats)
        rate = r["Mcell_updates_per_s"]
        r["Mcell_updates_per_s"] = round(rate, 1)
        r["roofline_ratio"] = round(rate * 1e6 * 8 / bandwidth, 3)
        r["vs_numpy"] = round(rate / numpy_rate, 2)
        results.append(r)
        print(json.dumps(r), flush=True, file=__import__("sys").stderr)

    single = max(r["Mcell_updates_per_s"] for r in results if r["engine"] == "single")
    for r in results:
        r["vs_single"] = round(r["Mcell_updates_per_s"] / single, 3)
    rate_of = {(r["engine"], r["devices"], r["halo"]): r["Mcell_updates_per_s"] for r in results}
    sharded_vs = {
        f"devices {nd}, halo {h}": round(v / rate_of[("shard_map", nd, h)], 3)
        for (e, nd, h), v in rate_of.items()
        if e == "sharded" and ("shard_map", nd, h) in rate_of
    }
    print(
        json.dumps(
            {
                "benchmark": f"heat2d_5pt_{'walls_x' if args.walls else 'periodic'}_float32",
                "grid": [n, n],
                "steps_per_chunk": steps,
                **environment(),
                "backend": jax.default_backend(),
                "cpu_count": os.cpu_count(),
                "memory_bandwidth_GBps": {k: round(v, 2) for k, v in bw.items()},
                "roofline_Mcell_updates_per_s": round(bandwidth / 8 / 1e6, 1),
                "numpy_Mcell_updates_per_s": round(numpy_rate, 1),
                "best_single_Mcell_updates_per_s": single,
                "sharded_vs_shard_map": sharded_vs,
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
