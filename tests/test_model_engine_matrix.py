"""Every model runs on every engine in the fast tier; the particle models here, small.

Where each model meets single, pmap, shard_map and sharded in ``pytest -m "not slow"``:

- heat: tests/test_engines.py (2-D on 11 mesh/halo cases, 3-D on 2x2x2), tests/test_cli.py
  (every engine through the command line);
- wave, advection, gray_scott: ``test_every_engine_equals_single*`` in their files;
- lbm: tests/test_lbm.py (cavity, one case per engine; periodic);
- ensembles: tests/test_ensemble.py (each member equals its run alone, every engine);
- lj and nbody: this file, through ``simpar.cli.main`` in this process (8 CPU devices,
  conftest), against ``single``: the same frame steps and the same last frame, Lennard-Jones
  bitwise (atoms summed in id order on every engine, README), N-body to 1e-12 of the largest
  coordinate (the ring sums blocks in another order; tests/test_nbody.py). Their thorough
  engine tests (bigger systems, every mesh, two processes) are in the slow tier.

Budget: about 15 s of CPU on 2 cores, mostly compilation.
"""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("pmap", "shard_map", "sharded")

# experiment -> (--set overrides for a small run, --mesh of the per-block engines, steps)
PARTICLES = {
    "lj_melt": (["system.cells=[4,4,4]", "output.every=2"], "2", 4),
    "nbody_plummer": (["particles.n=64", "output.every=2"], "8", 4),
}


def _run(capsys, exp, sets, steps, out, *extra):
    args = ["run", str(ROOT / f"experiments/{exp}.toml"), "--out", str(out), "--quiet"]
    for s in sets:
        args += ["--set", s]
    code = main([*args, "--steps", str(steps), *extra])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["run_status"] == "complete" and summary["steps"] == steps
    return summary


def _trajectory(path):
    with h5py.File(path, "r") as f:
        t = f["particles/trajectory"]
        return t["position/step"][:], t["position/value"][-1], t["velocity/value"][-1]


@pytest.mark.parametrize("exp", list(PARTICLES))
def test_particle_model_on_every_engine_equals_single(tmp_path, capsys, exp):
    sets, mesh, steps = PARTICLES[exp]
    _run(capsys, exp, sets, steps, tmp_path / "single.h5md", "--engine", "single")
    ref_steps, ref_x, ref_v = _trajectory(tmp_path / "single.h5md")
    assert len(ref_steps) == steps // 2 + 1
    for engine in ENGINES:
        out = tmp_path / f"{engine}.h5md"
        s = _run(capsys, exp, sets, steps, out, "--engine", engine, "--mesh", mesh)
        assert s["engine"] == engine
        steps_, x, v = _trajectory(out)
        np.testing.assert_array_equal(steps_, ref_steps)
        if exp == "lj_melt":
            np.testing.assert_array_equal(x, ref_x, err_msg=engine)
            np.testing.assert_array_equal(v, ref_v, err_msg=engine)
        else:
            scale = np.abs(ref_x).max()
            np.testing.assert_allclose(x, ref_x, rtol=0, atol=1e-12 * scale, err_msg=engine)
            np.testing.assert_allclose(v, ref_v, rtol=0, atol=1e-12 * np.abs(ref_v).max())
