"""Benchmark: LAMMPS in.lj (32,000 LJ atoms, fcc 0.8442, T 1.44, rc 2.5, skin 0.3, dt 0.005)
on the ``single`` engine, in float32 and float64. Prints one JSON object.

What it shows: atom-steps/s of the jitted NVE chunk (neighbour list rebuilt inside the
chunk whenever any atom moved more than skin/2, i.e. the exact policy, which rebuilds more
often than LAMMPS's "every 20 check no"). Reference points on the 2-core CPU machines:
LAMMPS serial ~1.6-1.8 M atom-steps/s, JAX-MD ~0.13 M.

Method: step-0 thermo, a warm-up chunk (compilation), then the first 100 steps timed as
chunks of ``--chunk`` steps (the melting lattice rebuilds its list most often there), and
the best of ``--repeats`` further chunks. Also reports the NVE energy drift over 100 steps.

Run (about 1-2 minutes on 2 CPU cores):
    .venv/bin/python experiments/bench_md.py [--cells 20] [--chunk 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

from simpar.particles import lattice, md, potentials, space  # noqa: E402


def bench(dtype, cells: int, chunk: int, repeats: int, skin: float) -> dict:
    r, box = lattice.cubic_lattice("fcc", 0.8442, (cells,) * 3, dtype)
    n = r.shape[0]
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(87287), n, 1.44, dtype=dtype)
    spc = space.periodic(box, dtype)
    pot = potentials.lennard_jones(cutoff=2.5, dtype=dtype)
    t0 = time.perf_counter()
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=skin)
    th0 = sim.thermo()
    setup = time.perf_counter() - t0
    start = (sim.state, sim.nbrs)
    t0 = time.perf_counter()
    sim.advance(chunk)  # compiles
    jax.block_until_ready(sim.state)
    compile_s = time.perf_counter() - t0
    sim.state, sim.nbrs = start
    builds0 = int(sim.nbrs.n_builds)
    t0 = time.perf_counter()
    done = 0
    while done < 100:
        sim.advance(min(chunk, 100 - done))
        done += min(chunk, 100 - done)
    jax.block_until_ready(sim.state)
    first100 = time.perf_counter() - t0
    th100 = sim.thermo()
    builds = int(sim.nbrs.n_builds) - builds0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        sim.advance(chunk)
        jax.block_until_ready(sim.state)
        best = min(best, time.perf_counter() - t0)
    return {
        "n_atoms": n,
        "steps_per_chunk": chunk,
        "atom_steps_per_s_best_chunk": n * chunk / best,
        "atom_steps_per_s_first_100_steps": n * 100 / first100,
        "neighbor_builds_first_100_steps": builds,
        "max_neighbors": sim.spec.max_neighbors,
        "neighbor_regrows": sim.regrows,
        "setup_s": setup,
        "compile_and_warmup_s": compile_s,
        "step0": {
            k: th0[k] for k in ("temperature", "potential_energy", "total_energy", "pressure")
        },
        "step100": {
            k: th100[k] for k in ("temperature", "potential_energy", "total_energy", "pressure")
        },
        "energy_drift_per_atom_100_steps": th100["total_energy"] - th0["total_energy"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skin", type=float, default=0.3)
    ap.add_argument("--dtypes", default="float32,float64")
    args = ap.parse_args()
    out = {
        "benchmark": "LAMMPS in.lj, single engine",
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "host": platform.node(),
        "skin": args.skin,
    }
    for name in args.dtypes.split(","):
        out[name] = bench(jnp.dtype(name), args.cells, args.chunk, args.repeats, args.skin)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
