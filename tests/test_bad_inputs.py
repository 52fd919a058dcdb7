"""The remaining bad inputs of issue 17 (item 6), each through ``simpar.cli.main`` in-process.

Every refusal exits 2 with no traceback and names the key (or option) at fault, and not a
neighbouring one: a wave width of 1e308 names ``initial.width``; LJ temperature or epsilon of
1e308 names that key (not "overlapping atoms?"); LBM ``rho0`` and a NaN checkpoint are not
blamed on ``[initial]``; LJ ``skin`` and ``capacity_factor`` not on ``system.cells``; N-body
``--mesh 3`` not on ``parallel.devices``. A failed checkpoint write of an LJ run (disk full)
exits 1 with a clean message and status; ``--resume`` of an LJ run whose output another
process holds open exits 2 within seconds.
"""

import errno
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar.cli import main
from simpar.io import checkpoint
from simpar.io.h5md import H5MDWriter

ROOT = Path(__file__).resolve().parents[1]
HEAT = str(ROOT / "experiments/heat2d.toml")
WAVE = str(ROOT / "experiments/wave2d.toml")
CAVITY = str(ROOT / "experiments/cavity_re100.toml")
ENSEMBLE = str(ROOT / "experiments/heat_ensemble.toml")
LJ = str(ROOT / "experiments/lj_melt.toml")
NBODY = str(ROOT / "experiments/nbody_plummer.toml")
SMALL_GRID = ["--set", "grid.shape=[32,32]", "--steps", "2", "--quiet"]
SMALL_LJ = ["--set", "system.cells=[4,4,4]", "--steps", "2", "--quiet"]


def _main(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def _refused(capsys, tmp_path, suffix, *args):
    out = tmp_path / f"out{suffix}"
    code, stdout, err = _main(capsys, "run", *args, "--out", out)
    assert code == 2, err
    assert stdout == "", stdout
    assert not out.exists()
    return err


@pytest.mark.parametrize(
    "config,suffix,override,key",
    [
        (WAVE, ".nc", "initial.width=1e308", "initial.width"),
        (HEAT, ".nc", "initial.width=1e308", "initial.width"),
        (CAVITY, ".nc", "physics.rho0=1e308", "physics.rho0"),
        (CAVITY, ".nc", "physics.rho0=1e30", "physics.rho0"),  # float32: overflows the state
        (LJ, ".h5md", "system.temperature=1e308", "system.temperature"),
        (LJ, ".h5md", "system.temperature=1e30", "system.temperature"),  # blows up later
        (LJ, ".h5md", "potential.epsilon=1e308", "potential.epsilon"),
        (LJ, ".h5md", "neighbors.skin=100", "neighbors.skin"),
        (LJ, ".h5md", "neighbors.capacity_factor=1e9", "neighbors.capacity_factor"),
        (ENSEMBLE, ".nc", "ensemble.seeds=[1,2,3,-2]", "ensemble.seeds"),
        (HEAT, ".nc", 'initial.kind="random"', None),  # with initial.seed=-1 below
    ],
)
def test_bad_value_names_its_key(tmp_path, capsys, config, suffix, override, key):
    small = SMALL_LJ if suffix == ".h5md" else SMALL_GRID
    extra = ["--set", "initial.seed=-1"] if key is None else []
    err = _refused(capsys, tmp_path, suffix, config, *small, "--set", override, *extra)
    key = key or "initial.seed"
    assert f"invalid input: {key}:" in err, err
    for wrong in ("initial:", "system.cells", "overlapping atoms", "[initial]"):
        if not key.startswith(wrong.rstrip(":")):
            assert wrong not in err, err


@pytest.mark.parametrize("value", ["1e308", "1e30"])
def test_lj_langevin_temperature_names_its_key(tmp_path, capsys, value):
    err = _refused(
        capsys, tmp_path, ".h5md", LJ, *SMALL_LJ, "--set", 'integrator.ensemble="langevin"',
        "--set", f"integrator.temperature={value}",
    )  # fmt: skip
    assert "invalid input: integrator.temperature:" in err and "time.dt" in err, err


def test_ensemble_swept_negative_seed_is_refused(tmp_path, capsys):
    text = Path(ENSEMBLE).read_text().replace("seeds = [1, 2, 3, 4]", "")
    text = text.replace(
        '"physics.diffusivity" = [0.5, 1.0, 1.5, 2.0]', '"initial.seed" = [1, 2, 3, -2]'
    )
    assert '"initial.seed" = [1, 2, 3, -2]' in text and "seeds =" not in text
    config = tmp_path / "ens.toml"
    config.write_text(text)
    err = _refused(capsys, tmp_path, ".nc", config, *SMALL_GRID)
    assert "initial.seed" in err and "member 3" in err, err


@pytest.mark.parametrize(
    "center,ok",
    [("[1.5,0.5]", False), ("[-0.1,0.5]", False), ("[0.5,1.2]", False), ("[0.9,0.1]", True)],
)
def test_gaussian_centre_outside_a_walled_box_is_refused(tmp_path, capsys, center, ok):
    # wave2d: walls (Dirichlet) along x, Neumann along y; both are edges of a closed box
    out = tmp_path / "w.nc"
    code, _, err = _main(
        capsys, "run", WAVE, *SMALL_GRID, "--set", f"initial.center={center}", "--out", out
    )
    if ok:
        assert code == 0, err
    else:
        assert code == 2 and "initial.center" in err and "outside the box" in err, err
        assert not out.exists()


def test_nbody_mesh_that_does_not_divide_blames_the_mesh(tmp_path, capsys):
    err = _refused(
        capsys, tmp_path, ".h5md", NBODY, "--engine", "pmap", "--mesh", "3", "--steps", "2",
        "--set", "particles.n=64", "--quiet",
    )  # fmt: skip
    assert "invalid input: --mesh:" in err and "parallel.devices" not in err, err
    assert "63 or 66" in err, err


def test_mesh_beyond_the_device_cap_exits_2(tmp_path, capsys):
    err = _refused(capsys, tmp_path, ".nc", HEAT, "--mesh", "5000", *SMALL_GRID)
    assert "--mesh" in err and "4096" in err and "5000" in err, err


def _heat_with_checkpoint(tmp_path, capsys, engine="single"):
    out = tmp_path / "heat.nc"
    args = ["run", HEAT, *SMALL_GRID, "--set", "output.every=1", "--out", out]
    code, _, err = _main(capsys, *args, "--engine", engine)
    assert code == 0, err
    return out, args


def test_grid_resume_refuses_a_nan_checkpoint_naming_resume(tmp_path, capsys):
    out, args = _heat_with_checkpoint(tmp_path, capsys)
    ck = checkpoint.checkpoint_path(out)
    with h5py.File(ck, "a") as f:
        f["state/u"][3, 4] = np.nan
    code, _, err = _main(capsys, *args[:-2], "--steps", "4", "--out", out, "--resume")
    assert code == 2, err
    assert "invalid input: --resume:" in err and "/state/u" in err and "non-finite" in err, err
    assert "initial" not in err, err


@pytest.mark.parametrize("how", ["shape", "dtype"])
def test_grid_resume_checks_shapes_and_dtypes_from_the_config(tmp_path, capsys, how):
    out, args = _heat_with_checkpoint(tmp_path, capsys)
    ck = checkpoint.checkpoint_path(out)
    with h5py.File(ck, "a") as f:
        u = f["state/u"][()]
        del f["state/u"]
        f["state/u"] = (
            u[:16]
            if how == "shape"
            else u.astype(np.float64 if u.dtype == np.float32 else np.float32)
        )
    code, _, err = _main(capsys, *args[:-2], "--steps", "4", "--out", out, "--resume")
    assert code == 2 and "--resume" in err and "/state/u" in err, err


def test_grid_resume_still_continues(tmp_path, capsys):
    out, args = _heat_with_checkpoint(tmp_path, capsys)
    code, stdout, err = _main(capsys, *args[:-2], "--steps", "4", "--out", out, "--resume")
    assert code == 0, err
    assert '"resumed_from": 2' in stdout, stdout


def _h5md_state(path, edges, n=32):
    rng = np.random.default_rng(0)
    with H5MDWriter(path, n, observables=(), rng_key=True, mass=np.ones(n)) as w:
        w.append(
            0, 0.0, rng.random((n, 3)) * 6, box=np.asarray(edges, float),
            velocity=rng.normal(size=(n, 3)), rng_key=np.zeros(2, np.uint32),
        )  # fmt: skip


def test_lj_system_file_with_a_huge_box_is_refused(tmp_path, capsys):
    src = tmp_path / "state.h5md"
    _h5md_state(src, [1e12, 1e12, 1e12])
    err = _refused(
        capsys, tmp_path, ".h5md", LJ, "--steps", "2", "--quiet",
        "--set", 'system.init="h5md"', "--set", f'system.file="{src}"',
    )  # fmt: skip
    assert "invalid input: system.file:" in err and "box/edges" in err, err
    assert err.count("system.file") == 1, err  # the key is not repeated


def test_lj_disk_full_while_writing_the_checkpoint_exits_1_cleanly(tmp_path, capsys, monkeypatch):
    real = checkpoint.write_hdf5_atomic
    calls = []

    def full(path, build):  # HDF5's own words for ENOSPC, as h5py raises them
        calls.append(path)
        if len(calls) < 3:
            return real(path, build)
        raise OSError(
            errno.ENOSPC,
            "Unable to synchronously create dataset (file write failed: time = Tue Dec  1, "
            "filename = 'x', file descriptor = 7, errno = 28, error message = 'No space left "
            "on device', buf = 0x1, total write size = 6144, bytes this sub-write = 6144, "
            "bytes actually written = 18446744073709551615, offset = 0)",
        )

    monkeypatch.setattr(checkpoint, "write_hdf5_atomic", full)
    out = tmp_path / "lj.h5md"
    code, stdout, err = _main(
        capsys, "run", LJ, *SMALL_LJ[:2], "--steps", "10", "--set", "output.every=2",
        "--out", out, "--quiet",
    )  # fmt: skip
    assert code == 1, err
    assert stdout == ""
    assert "No space left on device" in err and "Unable to synchronously" not in err, err
    assert "frames up to step 4" in err, err
    with h5py.File(out, "r") as f:
        status = f["parameters"].attrs["run_status"]
        status = status.decode() if isinstance(status, bytes) else str(status)
        assert status.startswith("failed: cannot write") and "errno" not in status, status
        assert f["particles/trajectory/position/value"].shape[0] == 3
    assert checkpoint.load(checkpoint.checkpoint_path(out))[1] == 2  # the last good one


def test_lj_resume_while_a_reader_holds_the_output_exits_2_quickly(tmp_path, capsys):
    out = tmp_path / "lj.h5md"
    args = ["run", LJ, *SMALL_LJ[:2], "--set", "output.every=1", "--out", out, "--quiet"]
    code, _, err = _main(capsys, *args, "--steps", "2")
    assert code == 0, err
    reader = subprocess.Popen(
        [sys.executable, "-c", "import h5py, sys, time; f = h5py.File(sys.argv[1], 'r'); "
         "print('open', flush=True); time.sleep(120)", str(out)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert reader.stdout.readline().strip() == "open"
        t = time.perf_counter()
        code, _, err = _main(capsys, *args, "--steps", "4", "--resume")
        took = time.perf_counter() - t
    finally:
        reader.kill()
        reader.wait()
    assert code == 2 and "invalid input: --resume:" in err and str(out) in err, err
    assert "holding it open" in err, err
    assert took < 10, took
    code, _, err = _main(capsys, *args, "--steps", "4", "--resume")  # reader gone: resumes
    assert code == 0, err
