"""Every model runs on every engine in the fast tier; heat, lj and nbody here, small.

Where each model meets single, pmap, shard_map and sharded in ``pytest -m "not slow"``:

- heat: this file, through the command line (the driver, frames and sums on every engine);
  tests/test_engines.py (diagnostics and profiles on six engine/mesh cases; the 11-case 2-D
  and the 3-D matrices are slow);
- wave, advection, gray_scott: ``test_every_engine_equals_single*`` in their files;
- lbm: tests/test_lbm.py (cavity, one case per engine; periodic);
- ensembles: tests/test_ensemble.py (each member equals its run alone, every engine);
- lj and nbody: this file. Their thorough engine tests (bigger systems, every mesh, two
  processes) are in the slow tier.

Here every run goes through ``simpar.cli.main`` in this process (8 CPU devices, conftest) and
is compared with ``single``: the same frame steps and the same last frame. Grid fields bitwise
(FMA off, conftest), sums and means over devices to 64 ulp of the largest sum the cells could
give; Lennard-Jones bitwise (atoms summed in id order on every engine, README); N-body to 1e-12
of the largest coordinate (the ring sums blocks in another order; tests/test_nbody.py).

Budget: about 20 s of CPU on 2 cores, mostly compilation.
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
GRID = {"heat2d": (["grid.shape=[32,32]", "output.every=2"], "2x4", 4)}
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


def _grid_frames(path):
    """``(steps, fields, diagnostics)``: the last frame of every variable over the whole grid,
    and of every other time series (sums, means, profiles)."""
    with h5py.File(path, "r") as f:
        spatial = tuple(int(n) for n in reversed(f.attrs["grid_shape"]))  # (ny, nx)
        series = [
            k
            for k in f
            if k not in ("time", "step") and len(f[k].dims[0]) and f[k].dims[0][0].name == "/time"
        ]
        fields = {k: f[k][-1] for k in series if f[k].shape[-len(spatial) :] == spatial}
        diags = {k: f[k][-1] for k in series if k not in fields}
        return f["step"][:], fields, diags


@pytest.mark.parametrize("exp", list(GRID))
def test_grid_model_on_every_engine_equals_single(tmp_path, capsys, exp):
    sets, mesh, steps = GRID[exp]
    _run(capsys, exp, sets, steps, tmp_path / "single.nc", "--engine", "single")
    ref_steps, ref, ref_diags = _grid_frames(tmp_path / "single.nc")
    assert len(ref_steps) == steps // 2 + 1 and ref and ref_diags
    for engine in ENGINES:
        out = tmp_path / f"{engine}.nc"
        s = _run(capsys, exp, sets, steps, out, "--engine", engine, "--mesh", mesh)
        assert s["engine"] == engine
        got_steps, got, diags = _grid_frames(out)
        np.testing.assert_array_equal(got_steps, ref_steps)
        assert set(got) == set(ref) and set(diags) == set(ref_diags)
        for name in ref:
            np.testing.assert_array_equal(got[name], ref[name], err_msg=f"{engine} {name}")
        # sums and means over devices, in another order: round-off of the state's precision,
        # relative to the largest sum a diagnostic of the cells could have (sums near 0 cancel)
        field = max(ref.values(), key=np.size)
        tol = 64 * np.finfo(field.dtype).eps
        scale = field.size * max(1.0, float(np.abs(field).max())) ** 2
        for name, want in ref_diags.items():
            np.testing.assert_allclose(
                diags[name], want, rtol=tol, atol=tol * scale, err_msg=f"{engine} {name}"
            )


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
