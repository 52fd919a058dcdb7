"""Benchmark: lattice Boltzmann D2Q9 (BGK), 1024^2 float32, in M lattice updates per second.

What it shows: the throughput of the LBM step on each engine and how far it is from the
memory roofline. One D2Q9 update reads and writes the 9 populations of a cell:
2 x 9 x 4 = 72 bytes in float32, so ``roofline MLUPS = bandwidth / 72 bytes``. The bandwidth is
measured on the same machine by ``simpar.benchmark.memory_bandwidth`` (a 512 MiB float32
array: a jitted in-place ``x * c`` pass and numpy's single-threaded ``copyto``, bytes read +
written per second; the larger is the roofline, the ratio against numpy's is reported too).

Measured on the 2-core AMD EPYC CI box (2026-11-30, +-10% run to run), periodic 1024^2, halo 1:
single 70, pmap 83, shard_map 78 (2 devices), sharded 52 MLUPS, i.e. 9-11% of the jax-copy
roofline (~740 MLUPS at ~53 GB/s), 18-21% of the numpy-copy one (~390 MLUPS); single with halo 4:
90. Cavity (``--walls``), halo 1: single 55, pmap 93, shard_map 86 (2 devices), sharded 33; halo 4:
single 57. (Before the plane-by-plane update of 2026-11-30: periodic single 52 / halo 4 34, cavity
single 27 / halo 4 41.) XLA:CPU does not emit one pass: the engines' halo pad (a concatenate along
the minor axis, materialised) takes about half of a step, then the update runs a density pass, a
velocity pass and one collision pass per population (see ``simpar.grid.lbm.make_model``). The 50%
target is not met on CPU.

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
import json
import os
import sys

CASES = (  # (engine, mesh, halo): halo 1 = one exchange per step, what the LBM configs use
    ("single", (1,), 1),
    ("single", (1,), 4),  # the engines' default width, for comparison
    ("pmap", (1,), 1),
    ("pmap", (2,), 1),
    ("shard_map", (1,), 1),
    ("shard_map", (2,), 1),
    ("sharded", (2,), 1),
)


def bench_case(setup, engine: str, mesh, halo, steps: int, repeats: int) -> dict:
    from simpar.benchmark import time_engine
    from simpar.parallel.engines import make_engine

    e = make_engine(engine, setup.model, setup.domain.shape, mesh, halo)
    s_per_step = time_engine(e, setup.state, setup.params, steps, repeats)
    cells = 1
    for n in setup.domain.shape:
        cells *= n
    return {
        "engine": engine,
        "mesh": list(mesh),
        "halo": e.halo,
        "mlups": cells / s_per_step / 1e6,
        "s_per_step": s_per_step,
    }


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
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    if jax.config.jax_platforms in (None, "", "cpu"):
        jax.config.update("jax_num_cpu_devices", args.devices)
    import numpy as np

    from simpar.grid import lbm

    n = args.size
    walls = (("wall", "wall"), ("wall", "lid")) if args.walls else (("periodic",) * 2,) * 2
    rng = np.random.default_rng(0)
    u0 = [0.01 * rng.standard_normal((n, n)) for _ in range(2)]
    setup = lbm.lattice_setup(
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
    roof = bw["roofline_GBps"] * 1e9 / bytes_per_update / 1e6
    roof_np = bw["numpy_copy_GBps"] * 1e9 / bytes_per_update / 1e6
    results = []
    wanted = set(args.engines.split(",")) if args.engines else None
    for engine, mesh, halo in CASES:
        if wanted and engine not in wanted:
            continue
        if np.prod(mesh) > len(jax.devices()):
            continue
        r = bench_case(
            setup, engine, mesh, args.halo if args.halo else halo, args.steps, args.repeats
        )
        r["roofline_ratio"] = r["mlups"] / roof
        r["roofline_ratio_numpy_bw"] = r["mlups"] / roof_np
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    out = {
        "model": "lbm D2Q9 BGK",
        "case": "cavity (bounce-back + lid)" if args.walls else "periodic",
        "shape": [n, n],
        "dtype": "float32",
        "bytes_per_update": bytes_per_update,
        "bandwidth": bw,
        "roofline_mlups": roof,
        "roofline_mlups_numpy_bw": roof_np,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "cpu_count": os.cpu_count(),
        "results": results,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
