"""``initial.kind = "file"`` (issue 27, item 4): grid and spectral runs start from a frame of a
netCDF file (an earlier output, or any file with the right variables) or a ``.npy``; names,
shapes (a transpose named as such), dtypes and frames are checked against the plan, and the
file is untrusted input (links, external storage refused), each as one line, exit 2."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from simpar.cli import main
from simpar.config import dumps, load
from simpar.errors import ConfigError
from simpar.run import run_config

HEAT = "experiments/heat2d.toml"
SMALL = ["grid.shape=[16,12]", "output.every=4"]


def _heat(out, steps, initial=None, **kw):
    data, _ = load(HEAT, SMALL)
    if initial is not None:
        data["initial"] = initial
    data["time"]["steps"] = steps
    return run_config(data, dumps(data), out=str(out), progress=False, **kw)


def test_a_grid_run_continues_bit_for_bit_from_its_own_output(tmp_path):
    _heat(tmp_path / "eight.nc", 8)  # frames at steps 0, 4, 8
    with h5py.File(tmp_path / "eight.nc") as f:
        first, mid, last = f["u"][0], f["u"][1], f["u"][2]
    # frame -2 (step 4) of the earlier output, 4 more steps: its last frame, bit for bit
    s = _heat(tmp_path / "more.nc", 4, {"kind": "file", "path": str(tmp_path / "eight.nc"),
                                        "frame": -2})  # fmt: skip
    assert s["frames"] == 2
    # a .npy in file order (y, x)
    np.save(tmp_path / "u.npy", first)
    _heat(tmp_path / "g.nc", 4, {"kind": "file", "path": str(tmp_path / "u.npy")})
    with h5py.File(tmp_path / "more.nc") as f, h5py.File(tmp_path / "g.nc") as g:
        np.testing.assert_array_equal(f["u"][0], mid)
        np.testing.assert_array_equal(f["u"][-1], last)
        np.testing.assert_array_equal(g["u"][0], first)
        np.testing.assert_array_equal(g["u"][-1], mid)


def _refusal(tmp_path, initial, capsys) -> str:
    args = ["run", HEAT, "--steps", "2", "--quiet", "--out", str(tmp_path / "bad.nc")]
    for s in SMALL:
        args += ["--set", s]
    init = ",".join(f"{k}={v!r}".replace("'", '"') for k, v in initial.items())
    assert main([*args, "--set", "initial={" + init + "}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not (tmp_path / "bad.nc").exists()
    return err


def test_a_file_that_does_not_fit_the_plan_is_refused_in_one_line(tmp_path, capsys):
    p = str(tmp_path / "x.npy")
    np.save(p, np.zeros((16, 12), np.float32))  # (x, y): the transpose of the file order
    assert "the transpose of the run's field: files store (time, [z,] y, x)" in _refusal(
        tmp_path, {"kind": "file", "path": p}, capsys
    )
    np.save(p, np.zeros((12, 16), np.float64))
    assert "u is float64; the run's field is float32" in _refusal(
        tmp_path, {"kind": "file", "path": p}, capsys
    )
    np.save(p, np.zeros((3, 12, 16), np.float32))
    assert "holds 3 frames (0 .. 2); got frame 5" in _refusal(
        tmp_path, {"kind": "file", "path": p, "frame": 5}, capsys
    )
    np.save(p, np.array([None, 1], dtype=object), allow_pickle=True)
    assert "not a readable .npy file" in _refusal(tmp_path, {"kind": "file", "path": p}, capsys)
    nc = tmp_path / "other.nc"
    with h5py.File(nc, "w") as f:
        f["v"] = np.zeros((2, 12, 16), np.float32)
    assert "no variable 'u' (the run's fields: u; the file has: v)" in _refusal(
        tmp_path, {"kind": "file", "path": str(nc)}, capsys
    )
    with h5py.File(nc, "a") as f:
        f["u"] = h5py.ExternalLink("elsewhere.h5", "/u")
    assert "/u is an external link; links are refused" in _refusal(
        tmp_path, {"kind": "file", "path": str(nc)}, capsys
    )
    assert "no such file" in _refusal(tmp_path, {"kind": "file", "path": "nope.nc"}, capsys)
    err = _refusal(tmp_path, {"kind": "file", "path": HEAT}, capsys)
    assert "not a netCDF4/HDF5 or .npy file" in err
    np.save(p, np.zeros((12, 16), np.float32))
    err = _refusal(tmp_path, {"kind": "file", "path": p, "center": [0.5, 0.5]}, capsys)
    assert "initial.center: unknown key" in err


def test_a_multi_field_model_needs_a_netcdf_not_a_npy(tmp_path):
    data, _ = load("experiments/wave2d.toml", ["grid.shape=[16,16]"])
    np.save(tmp_path / "u.npy", np.zeros((16, 16), np.float32))
    data["initial"] = {"kind": "file", "path": str(tmp_path / "u.npy")}
    with pytest.raises(ConfigError, match="a .npy file holds one array; this model has the"):
        run_config(data, dumps(data), out=str(tmp_path / "w.nc"), progress=False)


@pytest.mark.slow
def test_a_spectral_run_starts_from_its_own_output(tmp_path):
    """2-D spectral_ns from the vorticity of an earlier output: the continued run matches the
    uninterrupted one to round-off (the file holds the field sampled on the grid)."""
    sets = ["grid.shape=[16,16]", "output.every=3"]
    data, _ = load("experiments/taylor_green.toml", sets)
    data["time"]["steps"] = 6
    run_config(data, dumps(data), out=str(tmp_path / "six.nc"), progress=False)
    data["time"]["steps"] = 3
    data["initial"] = {"kind": "file", "path": str(tmp_path / "six.nc"), "frame": 1}
    run_config(data, dumps(data), out=str(tmp_path / "more.nc"), progress=False)
    with h5py.File(tmp_path / "six.nc") as a, h5py.File(tmp_path / "more.nc") as b:
        assert b["vorticity"].dtype == np.float64
        np.testing.assert_allclose(b["vorticity"][-1], a["vorticity"][-1], rtol=0, atol=1e-12)


@pytest.mark.slow
def test_a_pm_run_continues_bit_for_bit_from_an_h5md_frame(tmp_path):
    """``physics.force = "pm"`` with ``initial.kind = "file"``: the H5MD read LJ has
    (``simpar.io.h5md_read``, untrusted input), checked against particles.dtype."""
    data, _ = load("experiments/pm_plane_wave.toml", ["output.every=5"])
    data["time"]["steps"] = 10
    run_config(data, dumps(data), out=str(tmp_path / "ten.h5md"), progress=False)
    data["time"]["steps"] = 5
    data["initial"] = {"kind": "file", "path": str(tmp_path / "ten.h5md"), "frame": 1}
    data["particles"] = {"dtype": "float64"}
    s = run_config(data, dumps(data), out=str(tmp_path / "more.h5md"), progress=False)
    assert s["frames"] == 2
    pos = "particles/trajectory/position/value"
    with h5py.File(tmp_path / "ten.h5md") as a, h5py.File(tmp_path / "more.h5md") as b:
        np.testing.assert_array_equal(b[pos][0], a[pos][1])
        np.testing.assert_array_equal(b[pos][-1], a[pos][-1])
    data["particles"] = {"dtype": "float32"}
    with pytest.raises(ConfigError, match=r"position is float64 \(1024, 3\); the run needs"):
        run_config(data, dumps(data), out=str(tmp_path / "x.h5md"), progress=False)
    data["particles"] = {"dtype": "float64", "lattice": [64, 4, 4]}
    with pytest.raises(ConfigError, match="particles.lattice: the particles come from"):
        run_config(data, dumps(data), out=str(tmp_path / "x.h5md"), progress=False)
