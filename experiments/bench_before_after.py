"""Interleaved before/after timings of the heat2d chunk on ``single`` and ``shard_map``.

What it shows (issue 16, item 6): whether a restructuring changed the speed of the grid
engines. One child process per measurement times ``advance`` of ``--steps`` steps of
``experiments/heat2d.toml`` (256 x 256, float32; shard_map on a 2x4 mesh of 8 virtual CPU
devices), best of ``--repeats`` after a warm-up, pinned to one core with ``taskset``. Old and
new checkouts alternate (``--rounds`` times) so that a change of machine load hits both; the
report gives each checkout's best time and the ratio new / old. On a machine shared with other
jobs the ratios carry their noise: compare with the spread of each side's rounds.

Runtime: about 1-2 minutes with the defaults.

Run::

    OLD=$(mktemp -d) && git archive 78984a9 | tar -x -C "$OLD"    # the old tree, a plain copy
    python experiments/bench_before_after.py --old "$OLD" --new . [--cpu 1] [--rounds 3]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

_CHILD = r"""
import json, sys, time, tomllib
import jax
from simpar.config import Section
from simpar.parallel.engines import make_engine
try:
    from simpar.drive.grid import grid_setup
except ImportError:
    from simpar.run import grid_setup
config, engine, steps, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = tomllib.loads(open(config).read())
setup = grid_setup(Section(data))
halo = data.get("parallel", {}).get("halo")
mesh = None if engine == "single" else (2, 4)
eng = make_engine(engine, setup.model, setup.domain.shape, mesh, halo)
state = eng.place(setup.state)
state = jax.block_until_ready(eng.advance(state, setup.params, steps, donate=True))
best = float("inf")
for _ in range(repeats):
    t0 = time.perf_counter()
    state = jax.block_until_ready(eng.advance(state, setup.params, steps, donate=True))
    best = min(best, time.perf_counter() - t0)
import simpar
print(json.dumps({"seconds": best, "simpar": simpar.__file__}))
"""


def _measure(tree: str, engine: str, a) -> float:
    tree = str(pathlib.Path(tree).resolve())
    config = str(pathlib.Path(tree) / "experiments" / "heat2d.toml")
    env = dict(
        os.environ,
        PYTHONPATH=tree,
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        JAX_PLATFORMS="cpu",
    )
    cmd = ["taskset", "-c", str(a.cpu), sys.executable, "-c", _CHILD, config, engine]
    cmd += [str(a.steps), str(a.repeats)]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, check=True, cwd="/", timeout=600
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["simpar"].startswith(tree + os.sep):
        raise RuntimeError(f"child imported {out['simpar']}, not {tree}")
    return out["seconds"]


def main() -> None:
    """Alternate old/new measurements and print best times and ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="old checkout (a plain tree)")
    p.add_argument("--new", default=".")
    p.add_argument("--cpu", type=int, default=1, help="core to pin the children to")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    report = {}
    for engine in ("single", "shard_map"):
        times: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(a.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for tag in order:
                times[tag].append(_measure(getattr(a, tag), engine, a))
        best = {k: min(v) for k, v in times.items()}
        report[engine] = {
            "rounds_s": times,
            "best_s": best,
            "ratio_new_over_old": best["new"] / best["old"],
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
