"""Validation: spatially decomposed LJ MD (pmap, shard_map) follows the single engine.

What it shows (issue 9, item 5): ``experiments/lj_melt.toml`` (4,000 atoms, float64, melting
from T = 3) run for 1,000 steps on ``single`` and on ``pmap`` / ``shard_map`` over several
device meshes; for every output frame (every 50 steps) it prints the largest position
deviation from ``single`` and the largest relative deviation of the energies, temperature
and pressure, as one JSON object. Target: positions within 1e-9, observables within 1e-10.
Neighbour rows are summed in atom-id order on every engine, so with FMA off the runs agree
bitwise (all deviations 0).

The melt box (16.8 sigma) cut into 8 slabs gives sub-boxes of 2.1 sigma, thinner than the
ghost slab cutoff + skin = 2.8: on mesh (8,) the ghosts along x come from up to two devices
away (two hops, ``DomainSpec.hops``).

Run (several minutes on 2 CPU cores, mostly the 8 virtual devices sharing them):
    python experiments/validate_md_domain.py [--steps 1000] [--cases pmap:2x4,shard_map:2x2x2]
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_cpu_max_isa" not in os.environ.get("XLA_FLAGS", ""):  # no FMA, as the tests
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX").strip()

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", True)

import h5py  # noqa: E402
import numpy as np  # noqa: E402

from simpar.benchmark import mesh_arg  # noqa: E402
from simpar.config import dumps  # noqa: E402
from simpar.run import run_config  # noqa: E402

CONFIG = Path(__file__).with_name("lj_melt.toml")
OBS = ("temperature", "potential_energy", "kinetic_energy", "total_energy", "pressure")
CASES = "pmap:8,shard_map:8,pmap:2x4,shard_map:2x4,pmap:2x2x2,shard_map:2x2x2"


def run(data, engine, mesh, steps, out):
    t0 = time.perf_counter()
    res = run_config(data, dumps(data), engine=engine, mesh=mesh, steps=steps, out=out,
                     progress=False, overwrite=True)  # fmt: skip
    with h5py.File(out) as f:
        pos = f["particles/trajectory/position/value"][:]
        obs = {k: f[f"observables/{k}/value"][:] for k in OBS}
    return pos, obs, time.perf_counter() - t0, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--cases", default=CASES)
    args = ap.parse_args()
    base = tomllib.loads(CONFIG.read_text())
    out = {"config": str(CONFIG), "steps": args.steps, "jax": jax.__version__, "cases": {}}
    refs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            engine, mesh_s = case.split(":")
            mesh = mesh_arg(mesh_s)
            data = json.loads(json.dumps(base))
            cells = tuple(data["system"]["cells"])
            if cells not in refs:
                refs[cells] = run(data, "single", None, args.steps, f"{tmp}/single.h5md")
            pos0, obs0, wall0, res0 = refs[cells]
            pos, obs, wall, res = run(data, engine, mesh, args.steps, f"{tmp}/{engine}.h5md")
            dpos = np.abs(pos - pos0).max(axis=(1, 2))
            rel = np.max(
                [np.abs(obs[k] - obs0[k]) / np.maximum(np.abs(obs0[k]), 1e-300) for k in OBS],
                axis=0,
            )
            out["cases"][case] = {
                "n_atoms": res["details"]["n_atoms"],
                "ghost_hops": res["details"].get("ghost_hops"),
                "frames": int(pos.shape[0]),
                "max_position_deviation_per_frame": dpos.tolist(),
                "max_relative_observable_deviation_per_frame": rel.tolist(),
                "max_position_deviation": float(dpos.max()),
                "max_relative_observable_deviation": float(rel.max()),
                "bitwise_positions": bool(np.array_equal(pos, pos0)),
                "neighbor_builds": [
                    res["details"]["neighbor_builds"],
                    res0["details"]["neighbor_builds"],
                ],
                "regrows": res["details"]["regrows"],
                "final_thermo": res["final"],
                "wall_s": wall,
                "single_wall_s": wall0,
            }
            print(case, out["cases"][case]["max_position_deviation"],
                  out["cases"][case]["max_relative_observable_deviation"], flush=True)  # fmt: skip
    out["passed"] = all(
        c["max_position_deviation"] <= 1e-9 and c["max_relative_observable_deviation"] <= 1e-10
        for c in out["cases"].values()
    )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
