"""Benchmark: lattice Boltzmann D2Q9 (BGK), 1024^2 float32, in M lattice updates per second.

What it shows: the throughput of the LBM step on each engine and how far it is from the
memory roofline. One D2Q9 update reads and writes the 9 populations of a cell:
2 x 9 x 4 = 72 bytes in float32, so ``roofline MLUPS = bandwidth / 72 bytes``. The bandwidths
are measured in the same run by ``simpar.benchmark.memory_bandwidth`` (512 MiB float32 arrays,
bytes read + written per second): ``roofline_ratio`` uses the largest of them (a jitted
in-place pass, on this machine 50-94 GB/s from run to run), ``roofline_ratio_copy_bw`` the
STREAM-Copy-like one (threaded ``np.copyto`` between two arrays, 41-52 GB/s), which is the
access pattern of a two-buffer LBM step. ``streaming_copy_ratio`` compares with
``xla_streaming_copy_mlups``: the 9 planes shifted by their ``c_i`` and nothing else, jitted by
the same XLA (:func:`streaming_copy_mlups`): the data movement every D2Q9 step has to do.
Multi-device cases also report ``bytes_per_step_per_device`` (from the compiled HLO,
``simpar.benchmark.bytes_per_step``); ``sharded_vs_shard_map`` is the ``sharded`` rate over the
``shard_map`` rate on the same mesh and halo width.

Measured on the 2-core AMD EPYC CI box (2026-11-30, one run each, +-15% run to run; in-place
bandwidth 54 GB/s = roofline 756 MLUPS, threaded copy 42-45 GB/s = 583-623 MLUPS):

==================== ========= ========= ==================== ========= ======================
case                 single h1 single h4 pmap / shard_map x2  sharded   streaming copy (XLA)
==================== ========= ========= ==================== ========= ======================
periodic             187       230       179 / 179            59        265
cavity (``--walls``) 159       125       132 / 128            56        305
==================== ========= ========= ==================== ========= ======================

Periodic single with halo 4 is 30% of the roofline, 37% of the copy one and 87% of XLA's
streaming copy: the step runs nearly as fast as XLA:CPU moves its data here. XLA's out-of-place
kernels do not reach the machine's copy bandwidth (``jax_copy_GBps``, 15-23 GB/s, against
41-52 for ``np.copyto``; in some processes the in-place pass reads up to 94 GB/s, which raises
the roofline further), so the 50% roofline target of the issue is out of reach for any XLA:CPU
formulation on this machine; a GPU run of this script is the open check. History on the same
box (single, halo 1, periodic / cavity): 52 / 27 MLUPS for the first version (one stacked
``(9, nx, ny)`` field, the natural formulation), 70 / 55 after writing the moments once,
187 / 159 with one field per population and one fused loop (``simpar.grid.lbm.fused``).

Every case is warmed up (compiled and run once), then timed over ``--repeats`` chunks of
``--steps`` steps; the best chunk counts. Prints one JSON object.

Run (about 1-2 min on 2 CPU cores):
    python experiments/bench_lbm.py                    # periodic box (pure streaming + BGK)
    python experiments/bench_lbm.py --walls            # lid-driven cavity (bounce-back + lid)
    python experiments/bench_lbm.py --size 512 --steps 20
On CPU, ``--devices N`` (default 2) virtual devices are created before JAX starts; they share
the machine's cores and memory bandwidth, so multi-device numbers on one CPU show overhead,
not speed-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from simpar.benchmark import environment  # noqa: E402

CASES = (  # (engine, mesh, halo): halo 1 = one exchange per step, what the LBM configs use
    ("single", (1,), 1),
    ("single", (1,), 4),  # the engines' default width, for comparison
    ("pmap", (1,), 1),
    ("pmap", (2,), 1),
    ("shard_map", (1,), 1),
    ("shard_map", (2,), 1),
    ("sharded", (2,), 1),
)


def bench_case(setup, engine: str, mesh, halo, steps: int, repeats: int, model=None) -> dict:
    from simpar.benchmark import bytes_per_step, time_engine
    from simpar.parallel.engines import make_engine

    e = make_engine(engine, model or setup.model, setup.domain.shape, mesh, halo)
    s_per_step = time_engine(e, setup.state, setup.params, steps, repeats)
    cells = 1
    for n in setup.domain.shape:
        cells *= n
    out = {
        "engine": engine,
        "mesh": list(mesh),
        "halo": e.halo,
        "mlups": cells / s_per_step / 1e6,
        "s_per_step": s_per_step,
    }
    if e.grid.size > 1:  # what each device sends per step, from the compiled HLO
        out["bytes_per_step_per_device"] = bytes_per_step(e, setup.state, setup.params)
    return out


def streaming_copy_mlups(n: int, steps: int, repeats: int) -> float:
    """Updates/s of D2Q9 streaming alone: 9 float32 planes, each shifted by its ``c_i``.

    No collision and no halo logic, one jitted ``fori_loop`` (``jnp.roll``, periodic): the data
    movement every D2Q9 step must do, compiled by the same XLA. It bounds what any JAX
    formulation of the step can reach on this machine.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from simpar.benchmark import best_time
    from simpar.grid.lbm import D2Q9

    def stream(planes):
        return tuple(
            jnp.roll(p, c, (0, 1)) if any(c) else p for p, c in zip(planes, D2Q9.c, strict=True)
        )

    f = jax.jit(lambda s: lax.fori_loop(0, steps, lambda i, x: stream(x), s), donate_argnums=0)
    rng = np.random.default_rng(0)
    box = {"s": tuple(jnp.asarray(rng.random((n, n), dtype=np.float32)) for _ in range(9))}

    def run():
        box["s"] = f(box["s"])
        return box["s"]

    return n * n * steps / best_time(run, repeats) / 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20, help="steps per timed chunk")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument(
        "--walls", action="store_true", help="lid-driven cavity instead of a periodic box"
    )
    p.add_argument("--engines", default=None, help="comma-separated subset, e.g. single,pmap")
    p.add_argument("--halo", type=int, default=None, help="override the halo width of every case")
    p.add_argument(
        "--before-after", type=int, default=0, metavar="ROUNDS",
        help="multi-device cases: also time the full exchange of every population (before "
        "issue 29 item 6) against the crossing-only one, ROUNDS interleaved rounds, best of each",
    )  # fmt: skip
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    if jax.config.jax_platforms in (None, "", "cpu"):
        jax.config.update("jax_num_cpu_devices", args.devices)
    import numpy as np

    from simpar.grid import lbm_config

    n = args.size
    walls = (("wall", "wall"), ("wall", "lid")) if args.walls else (("periodic",) * 2,) * 2
    rng = np.random.default_rng(0)
    u0 = [0.01 * rng.standard_normal((n, n)) for _ in range(2)]
    setup = lbm_config.lattice_setup(
        (n, n),
        walls=walls,
        viscosity=0.05,
        u_lid=0.1 if args.walls else 0.0,
        dtype="float32",
        u0=u0,
    )
    from simpar.benchmark import memory_bandwidth

    bw = memory_bandwidth()
    bytes_per_update = 2 * 9 * 4
    mlups = lambda gbps: gbps * 1e9 / bytes_per_update / 1e6  # noqa: E731
    roof = mlups(bw["roofline_GBps"])
    roof_copy = mlups(bw["numpy_copy_threads_GBps"])
    ceiling = streaming_copy_mlups(n, args.steps, args.repeats)
    print(json.dumps({"xla_streaming_copy_mlups": ceiling}), file=sys.stderr, flush=True)
    results = []
    wanted = set(args.engines.split(",")) if args.engines else None
    for engine, mesh, halo in CASES:
        if wanted and engine not in wanted:
            continue
        if np.prod(mesh) > len(jax.devices()):
            continue
        h = args.halo if args.halo else halo
        r = bench_case(setup, engine, mesh, h, args.steps, args.repeats)
        if args.before_after and np.prod(mesh) > 1:
            # the same code with every population exchanged both ways (no ``halo_sides``)
            full = dataclasses.replace(setup.model, halo_sides={})
            before = bench_case(setup, engine, mesh, h, args.steps, args.repeats, full)
            for _ in range(args.before_after - 1):
                b = bench_case(setup, engine, mesh, h, args.steps, args.repeats, full)
                a = bench_case(setup, engine, mesh, h, args.steps, args.repeats)
                before["mlups"] = max(before["mlups"], b["mlups"])
                r["mlups"] = max(r["mlups"], a["mlups"])
            r["full_exchange"] = {k: before[k] for k in ("mlups", "bytes_per_step_per_device")}
            r["speedup_vs_full_exchange"] = r["mlups"] / before["mlups"]
        r["roofline_ratio"] = r["mlups"] / roof
        r["roofline_ratio_copy_bw"] = r["mlups"] / roof_copy
        r["streaming_copy_ratio"] = r["mlups"] / ceiling
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    rate = {(r["engine"], tuple(r["mesh"]), r["halo"]): r["mlups"] for r in results}
    sharded_vs = {
        f"mesh {'x'.join(map(str, m))}, halo {h}": rate[key] / rate[("shard_map", m, h)]
        for key in rate
        for e, m, h in [key]
        if e == "sharded" and ("shard_map", m, h) in rate
    }
    out = {
        "model": "lbm D2Q9 BGK",
        "case": "cavity (bounce-back + lid)" if args.walls else "periodic",
        "shape": [n, n],
        "dtype": "float32",
        "bytes_per_update": bytes_per_update,
        "bandwidth": bw,
        "roofline_mlups_copy_bw": roof_copy,
        "xla_streaming_copy_mlups": ceiling,
        "roofline_mlups": roof,
        **environment(),
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "cpu_count": os.cpu_count(),
        "sharded_vs_shard_map": sharded_vs,
        "results": results,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
