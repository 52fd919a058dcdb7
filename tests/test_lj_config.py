"""The LJ neighbour policy as config keys (``neighbors.every``, ``neighbors.check``; issue 18).

Bad values exit 2 through ``simpar.cli.main`` naming the key and what is allowed, with no
output file; good ones reach every engine (``single``, ``sharded``, the decomposed
``shard_map``), which follow ``single`` bitwise (FMA off, conftest), rebuild at the steps
the policy gives, and record the policy in the H5MD file's ``/parameters``; a resumed run
keeps the policy's build steps (counted from step 0) and equals an uninterrupted one.
"""

from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar.cli import main
from simpar.config import dumps
from simpar.run import run_config

ROOT = Path(__file__).resolve().parents[1]
LJ = str(ROOT / "experiments/lj_melt.toml")
SMALL = ["--set", "system.cells=[4,4,4]", "--steps", "2", "--quiet"]


@pytest.mark.parametrize(
    "override,allowed",
    [
        ("neighbors.every=0", "must be an integer >= 1"),
        ("neighbors.every=-3", "must be an integer >= 1"),
        ("neighbors.every=2.5", "must be an integer >= 1"),
        ("neighbors.every=true", "must be an integer >= 1"),
        ('neighbors.every="20"', "must be an integer >= 1"),
        ('neighbors.check="no"', "must be true or false"),
        ("neighbors.check=0", "must be true or false"),
    ],
)
def test_bad_policy_names_its_key(tmp_path, capsys, override, allowed):
    out = tmp_path / "out.h5md"
    code = main(["run", LJ, *SMALL, "--set", override, "--out", str(out)])
    stdout, err = capsys.readouterr()
    key = override.split("=")[0]
    assert code == 2, err
    assert "Traceback" not in err and stdout == ""
    assert f"invalid input: {key}:" in err and allowed in err, err
    assert "neigh_modify" in err, err  # says what the key means, as LAMMPS names it
    assert not out.exists()


def test_unknown_potential_kind_names_the_built_ins(tmp_path, capsys):
    """``potential.kind`` keeps the built-ins (a user's own pair potential is a Python
    ``potentials.pair``); anything else exits 2 naming them, with no output file."""
    out = tmp_path / "out.h5md"
    code = main(["run", LJ, *SMALL, "--set", 'potential.kind="yukawa"', "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err and stdout == "", err
    assert "invalid input: potential.kind: 'yukawa' is not allowed" in err, err
    assert "'lj', 'morse'" in err, err
    assert not out.exists()


def _config(tmp_path, every, check, steps=40):
    return {
        "name": "policy",
        "model": {"name": "lj"},
        "system": {"lattice": "fcc", "density": 0.8442, "cells": [8, 4, 4],
                   "temperature": 1.44, "seed": 1, "dtype": "float64"},
        "neighbors": {"skin": 0.3, "every": every, "check": check},
        "time": {"dt": 0.005, "steps": steps},
        "output": {"every": 20, "path": str(tmp_path / "p.h5md")},
    }  # fmt: skip


@pytest.mark.slow
def test_policy_reaches_every_engine_and_the_file(tmp_path):
    """``every = 4``, ``check = false`` on 512 atoms for 40 steps: 10 rebuilds after the
    first build (the exact policy needs about 5 here) on ``single``, ``sharded`` (8
    devices) and ``shard_map`` (2 sub-boxes along x), the same positions bit for bit, the
    policy in ``/parameters``."""
    cfg = _config(tmp_path, 4, False)
    res = {}
    for engine, mesh in (("single", None), ("sharded", (8,)), ("shard_map", (2,))):
        res[engine] = run_config(cfg, dumps(cfg), engine=engine, mesh=mesh, steps=None,
                                 out=str(tmp_path / f"{engine}.h5md"), progress=False)  # fmt: skip
        assert res[engine]["details"]["neighbor_builds"] == 1 + 10, engine
    exact = _config(tmp_path, 1, True)
    res["exact"] = run_config(exact, dumps(exact), engine="single", mesh=None, steps=None,
                              out=str(tmp_path / "exact.h5md"), progress=False)  # fmt: skip
    assert res["exact"]["details"]["neighbor_builds"] < 1 + 10
    traj = "particles/trajectory/position/value"
    pos = {}
    for name, r in res.items():
        with h5py.File(r["path"]) as f:
            pos[name] = f[traj][-1]
            every, check = (1, True) if name == "exact" else (4, False)
            assert int(f["parameters"].attrs["neighbors_every"]) == every
            assert bool(f["parameters"].attrs["neighbors_check"]) is check
    np.testing.assert_array_equal(pos["sharded"], pos["single"])
    np.testing.assert_array_equal(pos["shard_map"], pos["single"])


@pytest.mark.parametrize(
    ("engine", "mesh"),
    [("single", None), pytest.param("shard_map", (2,), marks=pytest.mark.slow)],
    ids=str,
)
def test_policy_resume_equals_uninterrupted(tmp_path, engine, mesh):
    """``every = 7``, ``check = false``: builds at steps 7, 14, 21, ... counted from step 0,
    so a run stopped at step 20 (between two builds) and resumed to 40 gives the
    uninterrupted run's file bit for bit, and the same build count."""
    cfg = _config(tmp_path, 7, False, steps=40)
    cfg["output"]["every"] = 10
    ref, part = tmp_path / "ref.h5md", tmp_path / "part.h5md"
    kw = dict(engine=engine, mesh=mesh, progress=False)
    whole = run_config(cfg, dumps(cfg), steps=40, out=str(ref), **kw)
    run_config(cfg, dumps(cfg), steps=20, out=str(part), **kw)
    resumed = run_config(cfg, dumps(cfg), steps=40, out=str(part), resume=True, **kw)
    assert resumed["resumed_from"] == 20 and resumed["steps"] == 40
    assert whole["details"]["neighbor_builds"] == 1 + 5
    traj = "particles/trajectory/"
    with h5py.File(ref) as a, h5py.File(part) as b:
        for k in ("position", "velocity"):
            assert a[traj + k + "/value"].shape == (5, 512, 3)
            np.testing.assert_array_equal(b[traj + k + "/value"][:], a[traj + k + "/value"][:])
