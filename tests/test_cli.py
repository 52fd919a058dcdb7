"""The command line as users run it: files xarray opens, exit codes, messages, no debris."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from simpar.cli import main

SMALL = [
    "--set",
    "grid.shape=[32,32]",
    "--set",
    "time.dt=5e-5",
    "--set",
    "output.every=10",
    "--steps",
    "30",
]


def _run(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "simpar", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_every_engine_writes_files_xarray_opens_with_equal_last_frames(tmp_path):
    files = {}
    for engine in ("single", "pmap", "shard_map", "sharded"):
        out = tmp_path / f"{engine}.h5"
        r = _run(
            "run",
            "experiments/heat2d.toml",
            "--engine",
            engine,
            "--devices",
            "8",
            "--mesh",
            "2x4",
            "--out",
            str(out),
            *SMALL,
        )
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        assert summary["engine"] == engine and summary["steps"] == 30
        assert "Traceback" not in r.stderr
        files[engine] = out
    ds = {e: xr.open_dataset(p, engine="h5netcdf") for e, p in files.items()}
    ref = ds["single"]
    assert ref.u.dims == ("time", "y", "x")
    assert ref.sizes["time"] == 4
    np.testing.assert_allclose(ref.time.values, [0, 10 * 5e-5, 20 * 5e-5, 30 * 5e-5])
    np.testing.assert_allclose(ref.x.values[:2], [1 / 64, 3 / 64])
    assert ref.u_profile.dims == ("time", "y")
    for e, d in ds.items():
        assert d.attrs["engine"] == e
        assert d.attrs["run_status"] == "complete"
        assert "[grid]" in d.attrs["config"] and "shape = [32, 32]" in d.attrs["config"]
        np.testing.assert_array_equal(d.u.isel(time=-1).values, ref.u.isel(time=-1).values)
        np.testing.assert_allclose(d.u_profile.values, ref.u_profile.values, rtol=1e-6)
    assert list(ds["pmap"].attrs["device_mesh"]) == [2, 4]
    assert (tmp_path / "pmap.h5.xdmf").exists()


def _main(capsys, *args):
    code = main(list(args))
    return code, capsys.readouterr().err


def test_unknown_key_exit_2_names_key_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x.nc"
    code, err = _main(
        capsys, "run", "experiments/heat2d.toml", "--out", str(out), "--set", "physics.difusivity=2"
    )
    assert code == 2
    assert "physics.difusivity: unknown key; did you mean 'physics.diffusivity'?" in err
    assert "Traceback" not in err
    assert not out.exists() and not (tmp_path / "x.nc.xdmf").exists()


def test_mesh_that_does_not_divide_exit_2(tmp_path, capsys):
    out = tmp_path / "x.nc"
    code, err = _main(
        capsys,
        "run",
        "experiments/heat2d.toml",
        "--engine",
        "pmap",
        "--mesh",
        "3x2",
        "--out",
        str(out),
        "--set",
        "grid.shape=[32,32]",
    )
    assert code == 2
    assert "grid shape 32x32 does not divide over device mesh 3x2" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--engine", "gpu"],
            "--engine: unknown engine 'gpu'; choose one of single, pmap, shard_map, sharded",
        ),
        (["--set", "time.dt=1e-3"], "time.dt: time step 0.001 is unstable"),
        (
            ["--set", "grid.dtype='half'"],
            "grid.dtype: 'half' is not allowed; choose one of 'float32', 'float64'",
        ),
        (["--mesh", "2x"], "--mesh: expected 1 to 3 positive integers"),
        (["--set", "boundary.w='periodic'"], "boundary.w"),
    ],
)
def test_invalid_options_exit_2(tmp_path, capsys, args, message):
    out = tmp_path / "x.nc"
    code, err = _main(capsys, "run", "experiments/heat2d.toml", "--out", str(out), *args)
    assert code == 2, err
    assert message in err
    assert not out.exists()


def test_missing_config_and_existing_output(tmp_path, capsys):
    code, err = _main(capsys, "run", str(tmp_path / "nope.toml"))
    assert code == 2 and "config file not found" in err
    out = tmp_path / "x.nc"
    out.write_bytes(b"precious")
    code, err = _main(capsys, "run", "experiments/heat2d.toml", "--out", str(out), *SMALL)
    assert code == 2 and "--overwrite" in err
    assert out.read_bytes() == b"precious"


def test_blow_up_exit_1_with_step_and_keeps_good_frames(tmp_path, capsys):
    out = tmp_path / "x.nc"
    code, err = _main(
        capsys,
        "run",
        "experiments/heat2d.toml",
        "--out",
        str(out),
        "--quiet",
        *SMALL,
        "--set",
        "initial.amplitude=3e38",
        "--set",
        "boundary.y='neumann'",
    )
    assert code == 1
    # the first chunk is 1 step (every chunk is time-bounded from the first): the overflow
    # of the first step is reported at step 1
    assert "run failed at step 1:" in err and "reduce time.dt" in err
    ds = xr.open_dataset(out, engine="h5netcdf")
    assert ds.sizes["time"] == 1  # frame 0 kept, nothing non-finite written
    # one status format for every model: "failed: <reason>" (the reason names the step)
    status = ds.attrs["run_status"]
    assert status.startswith("failed: ") and "non-finite values" in status
    assert status.endswith("after step 1")


def test_info_lists_devices(capsys):
    assert main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["device_count"] == 8 and info["process_count"] == 1


def test_resume_continues_to_the_same_final_state(tmp_path, capsys):
    full, part = tmp_path / "full.nc", tmp_path / "part.nc"
    args = [
        "run",
        "experiments/heat2d.toml",
        "--engine",
        "pmap",
        "--mesh",
        "2x4",
        "--quiet",
        *SMALL[:-2],
    ]
    assert main([*args, "--out", str(full), "--steps", "30"]) == 0
    assert main([*args, "--out", str(part), "--steps", "20"]) == 0
    assert (tmp_path / "part.nc.ckpt").exists()
    # a changed physics setting is refused: only time.steps may change
    code = main(
        [*args, "--out", str(part), "--steps", "30", "--resume", "--set", "physics.diffusivity=2.0"]
    )
    assert code == 2 and "only time.steps may change" in capsys.readouterr().err
    assert main([*args, "--out", str(part), "--steps", "30", "--resume"]) == 0
    a, b = xr.open_dataset(full, engine="h5netcdf"), xr.open_dataset(part, engine="h5netcdf")
    np.testing.assert_array_equal(a.step.values, b.step.values)
    np.testing.assert_array_equal(a.u.values, b.u.values)
    assert b.attrs["run_status"] == "complete"


def test_nan_initial_state_is_invalid_input(tmp_path, capsys):
    out = tmp_path / "x.nc"
    code, err = _main(
        capsys,
        "run",
        "experiments/heat2d.toml",
        "--out",
        str(out),
        *SMALL,
        "--set",
        "initial.amplitude=1e300",  # finite in the config, inf once rounded to float32
    )
    assert code == 2 and "initial: the initial state has" in err
    assert not out.exists()
