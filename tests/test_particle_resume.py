"""Restart of particle runs (``--resume``): LJ and N-body continue bit for bit on the same
engine and mesh, to round-off on another; a real SIGKILL at a random moment, then
``--resume``, gives the uninterrupted file frame for frame. Also the tolerance of the
other continuation path (``system.init = "h5md"``). Budget: about 40 s on 2 CPU cores."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar import run as drive
from simpar.cli import main
from simpar.config import dumps
from simpar.io import checkpoint, h5md

ROOT = Path(__file__).resolve().parents[1]
TRAJ = "particles/trajectory"


def lj_config(path, steps, **over):
    cfg = {
        "name": "t",
        "model": {"name": "lj"},
        "system": {"lattice": "fcc", "density": 0.8442, "cells": [5, 5, 5],
                   "temperature": 1.44, "seed": 1, "dtype": "float64"},
        "time": {"dt": 0.005, "steps": steps},
        "output": {"every": 10, "path": str(path), "force": True},
    }  # fmt: skip
    for key, value in over.items():
        sec, name = key.split(".")
        cfg.setdefault(sec, {})[name] = value
    return cfg


def run_lj(path, steps, engine="single", mesh=None, resume=False, run_steps=None, **over):
    cfg = lj_config(path, steps, **over)  # fresh dict: the reader fills in defaults
    return drive.run_config(cfg, dumps(cfg), engine=engine, mesh=mesh, steps=run_steps,
                             out=None, progress=False, resume=resume)  # fmt: skip


def frames(path) -> dict[str, np.ndarray]:
    """Every time-dependent dataset of an H5MD file (steps, values, observables, keys)."""
    out = {}

    def walk(group, prefix):  # not visititems: it visits hard-linked step/time only once
        for name, obj in group.items():
            if isinstance(obj, h5py.Group):
                walk(obj, f"{prefix}{name}/")
            elif obj.maxshape and obj.maxshape[0] is None:
                out[prefix + name] = obj[()]

    with h5py.File(path, "r") as f:
        walk(f, "")
    return out


def assert_same_frames(a, b, extra_steps=()):
    """``b`` holds exactly ``a``'s frames (bitwise) plus frames at ``extra_steps``."""
    fa, fb = frames(a), frames(b)
    assert sorted(fa) == sorted(fb)
    sa, sb = fa[f"{TRAJ}/position/step"], fb[f"{TRAJ}/position/step"]
    assert sorted(set(sb) - set(sa)) == sorted(extra_steps) and set(sa) <= set(sb)
    assert list(sb) == sorted(sb)  # no duplicated frame
    keep = np.isin(sb, sa)
    for name, va in fa.items():
        np.testing.assert_array_equal(fb[name][keep], va, err_msg=name)


LANGEVIN = {"integrator.ensemble": "langevin", "integrator.temperature": 1.2,
            "integrator.seed": 3}  # fmt: skip


@pytest.mark.slow
def test_lj_langevin_resume_is_bitwise(tmp_path):
    full, part = tmp_path / "full.h5md", tmp_path / "part.h5md"
    ref = run_lj(full, 50, **LANGEVIN)
    run_lj(part, 50, run_steps=25, **LANGEVIN)  # stopped at step 25
    ck, step, _, model = checkpoint.load(checkpoint.checkpoint_path(part))
    assert (step, model, int(ck["step"]), ck["position"].shape) == (25, "lj", 25, (500, 3))
    res = run_lj(part, 50, resume=True, **LANGEVIN)
    assert res["resumed_from"] == 25 and res["details"]["regrows"] == ref["details"]["regrows"]
    assert (
        res["details"]["neighbor_builds"] == ref["details"]["neighbor_builds"]
        and res["final"] == ref["final"]
    )
    # frames 0, 10, 20, 25 (the stop), 30, 40, 50: every frame of the straight run, bitwise,
    # RNG keys included
    assert_same_frames(full, part, extra_steps=[25])


@pytest.mark.slow
def test_lj_sharded_resume_bitwise_and_on_single_to_round_off(tmp_path):
    full, part = tmp_path / "full.h5md", tmp_path / "part.h5md"
    ref = run_lj(full, 40, "sharded", (8,))
    run_lj(part, 40, "sharded", (8,), run_steps=20)  # 500 atoms in 504 slots
    ck = checkpoint.load(checkpoint.checkpoint_path(part))[0]
    assert bytes(ck["layout"]) == b"sharded:8:504" and ck["layout_nbr_idx"].shape[0] == 504
    one = tmp_path / "one.h5md"  # the step-20 output and checkpoint, for another layout
    one.write_bytes(part.read_bytes())
    checkpoint.checkpoint_path(one).write_bytes(checkpoint.checkpoint_path(part).read_bytes())
    res = run_lj(part, 40, "sharded", (8,), resume=True)
    assert (
        res["final"] == ref["final"]
        and res["details"]["neighbor_builds"] == ref["details"]["neighbor_builds"]
    )
    assert_same_frames(full, part)
    # the 8-device checkpoint (504 slots) on `single` (500 slots; 2 devices work the same way)
    cfg = lj_config(part, 40)  # the config text names the original output path
    drive.run_config(cfg, dumps(cfg), engine="single", mesh=None, steps=None, out=str(one),
                      progress=False, resume=True)  # fmt: skip
    x, y = h5md.read_frame(one), h5md.read_frame(full)
    assert x["step"] == y["step"] == 40
    # another summation order: round-off (measured <= 1e-15 sigma)
    np.testing.assert_allclose(x["position"], y["position"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(x["velocity"], y["velocity"], rtol=0, atol=1e-11)


def test_lj_resume_refuses_changed_config_and_missing_checkpoint(tmp_path, capsys):
    # the small lj_melt run of tests/test_faults.py and others: its programs are compiled once
    # per test session (JAX's persistent cache, conftest) and loaded here
    out = tmp_path / "x.h5md"
    args = ["run", str(ROOT / "experiments/lj_melt.toml"), "--out", str(out), "--quiet",
            "--set", "system.cells=[4,4,4]", "--set", "output.every=5"]  # fmt: skip
    assert main([*args, "--resume"]) == 2
    assert "does not exist; nothing to resume" in capsys.readouterr().err
    assert main([*args, "--steps", "10"]) == 0
    assert main([*args, "--resume", "--set", "potential.cutoff=2.0"]) == 2
    assert "only time.steps may change" in capsys.readouterr().err
    assert main([*args, "--resume", "--steps", "10"]) == 2
    assert "ask for more steps" in capsys.readouterr().err
    assert h5md.n_frames(out) == 3  # steps 0, 5, 10: untouched by the refusals


def nbody_config(path, engine, devices):
    return {
        "model": {"name": "nbody"},
        "particles": {"n": 64, "seed": 3, "dtype": "float64"},
        "time": {"dt": 0.01, "steps": 40},
        "physics": {"softening": 0.05, "G": 1.0},
        "output": {"every": 10, "path": str(path)},
        "parallel": {"engine": engine, "devices": devices},
    }


@pytest.mark.filterwarnings("ignore:there is no reference attributes")
@pytest.mark.parametrize(
    "engine,devices",
    [
        ("single", 1),
        pytest.param("pmap", 4, marks=pytest.mark.slow),
        ("shard_map", 8),
        ("sharded", 2),
    ],
)
def test_nbody_resume_is_bitwise_on_every_engine(tmp_path, engine, devices):
    def run(path, steps=None, resume=False):
        cfg = nbody_config(path, engine, devices)
        return drive.run_config(cfg, dumps(cfg), engine=None, mesh=None, steps=steps,
                                    out=None, progress=False, resume=resume)  # fmt: skip

    full, part = tmp_path / "full.h5md", tmp_path / "part.h5md"
    ref = run(full)
    run(part, steps=20)
    res = run(part, resume=True)
    assert res["resumed_from"] == 20 and res["frames"] == 5
    assert res["details"]["energy_initial"] == ref["details"]["energy_initial"]
    assert res["details"]["energy_max_rel_error"] == ref["details"]["energy_max_rel_error"]
    assert_same_frames(full, part)
    with h5py.File(part) as f:
        assert f["parameters"].attrs["run_status"] == "complete"


def test_h5md_open_existing_drops_cut_and_later_frames(tmp_path):
    path = tmp_path / "t.h5md"
    w = h5md.H5MDWriter(path, 2, observables=["temperature"], rng_key=True)
    for k in range(3):
        w.append(k, 0.5 * k, np.full((2, 3), k), box=np.ones(3), velocity=np.zeros((2, 3)),
                 observables={"temperature": k}, rng_key=np.array([k, k], np.uint32))  # fmt: skip
    w.elements["position"].resize(4, axis=0)  # a 4th frame cut short by a kill: no step
    w.close()
    with pytest.raises(ValueError, match="no frame at the checkpoint.s step 7"):
        h5md.H5MDWriter.open_existing(path, step=7)
    w = h5md.H5MDWriter.open_existing(path, step=1)  # checkpoint at step 1
    assert w.frames == 2 and sorted(w.elements) == [
        "edges", "position", "rng_key", "temperature", "velocity"]  # fmt: skip
    w.append(2, 1.0, np.full((2, 3), 7), box=np.ones(3), velocity=np.zeros((2, 3)),
             observables={"temperature": 7}, rng_key=np.array([7, 7], np.uint32))  # fmt: skip
    w.close()
    f = frames(path)
    np.testing.assert_array_equal(f[f"{TRAJ}/position/step"], [0, 1, 2])
    np.testing.assert_array_equal(f[f"{TRAJ}/position/value"][:, 0, 0], [0, 1, 7])
    np.testing.assert_array_equal(f["observables/temperature/value"], [0, 1, 7])
    np.testing.assert_array_equal(f["parameters/rng_key/value"][:, 0], [0, 1, 7])
    assert all(v.shape[0] == 3 for v in f.values())


@pytest.mark.slow
def test_lj_killed_at_a_random_moment_then_resumed_equals_uninterrupted(tmp_path):
    steps, over = 1200, {"output.every": 50, **LANGEVIN}
    cfg = tmp_path / "kill.toml"
    cfg.write_text(dumps(lj_config(tmp_path / "killed.h5md", steps, **over)))
    env = dict(  # XLA_FLAGS (no FMA) as in this process; the resumed run reuses the
        os.environ,  # killed one's compiled programs (persistent cache: ~3x less CPU)
        PYTHONUNBUFFERED="1",
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    cmd = [sys.executable, "-m", "simpar", "run", str(cfg), "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ckpt = checkpoint.checkpoint_path(tmp_path / "killed.h5md")
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(random.Random().uniform(0.0, 0.8))  # a random moment after the first frame
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = checkpoint.load(ckpt)[1]
    assert 0 <= killed_at < steps
    resumed = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert not list(tmp_path.glob("*.tmp"))
    ref = tmp_path / "ref.h5md"
    run_lj(ref, steps, **over)
    assert_same_frames(ref, tmp_path / "killed.h5md")  # no frame lost or duplicated
