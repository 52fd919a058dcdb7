"""Grid output (netCDF4-compatible HDF5 + XDMF sidecar) and ``simpar plot``.

Files are read back with the readers users have (xarray + h5netcdf, plain h5py, an XML
parser for the sidecar), never only with simpar's own reader.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

from simpar.errors import ConfigError
from simpar.io.netcdf import GridWriter, open_frames, read_attrs
from simpar.io.plot import PLOTTERS, plot_file

REPO = Path(__file__).resolve().parents[1]
CONFIG = "[grid]\nshape = [6, 8]\n# units: µm\n[time]\ndt = 0.01\n" + "# pad\n" * 2000


def _attrs() -> dict[str, object]:
    return {
        "config": CONFIG,
        "engine": "shard_map",
        "device_mesh": np.array([2, 4], np.int32),
        "process_count": np.int32(1),
        "dtype": "float32",
        "seed": np.int64(42),
        "model": "diffusion",
        "simpar_version": "0.1.0",
    }


def _coords(shape):
    names = ("z", "y", "x")[3 - len(shape) :]
    # Uniform cell centres with different spacings per axis.
    return {
        n: (np.arange(s) + 0.5) * (0.5 + i) + i
        for i, (n, s) in enumerate(zip(names, shape, strict=True))
    }


def _frames(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        out.append(
            {
                "rho": rng.random(shape).astype(np.float32),
                "u": rng.standard_normal(shape).astype(np.float32),
                "u_mean_x": rng.random(shape[-2]).astype(np.float32),
                "energy": np.float64(1.0 + 0.5 * k),
            }
        )
    return out


def _variables(shape):
    spatial = ("z", "y", "x")[3 - len(shape) :]
    return {
        "rho": {"dims": ("time", *spatial), "units": "kg m-3", "long_name": "density"},
        "u": {"dims": ("time", *spatial), "units": "m s-1"},
        "u_mean_x": {"dims": ("time", spatial[-2]), "long_name": "row mean of u"},
        "energy": {"dims": ("time",), "dtype": "float64", "units": "J"},
    }


def _write(path, shape, n=4, *, close=True, **kw):
    frames = _frames(shape, n)
    w = GridWriter(
        path,
        coords=_coords(shape),
        variables=_variables(shape),
        attrs=_attrs(),
        time_units="s",
        length_units="m",
        **kw,
    )
    times = 0.1 * np.arange(n) + 0.05
    steps = 10 * np.arange(n)
    for k in range(n):
        w.append(steps[k], times[k], frames[k])
    if close:
        w.set_status("complete")
        w.close()
    return w, times, steps, frames


@pytest.mark.parametrize("shape,ext", [((6, 8), ".h5"), ((4, 6, 8), ".nc")], ids=["2d", "3d"])
def test_xarray_reads_file(tmp_path, shape, ext):
    path = tmp_path / f"run{ext}"
    _, times, steps, frames = _write(path, shape)
    coords = _coords(shape)
    spatial = tuple(coords)
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        assert ds["rho"].dims == ("time", *spatial)
        assert ds["u"].dims == ("time", *spatial)
        assert ds["u_mean_x"].dims == ("time", spatial[-2])
        assert ds["energy"].dims == ("time",)
        assert ds["step"].dims == ("time",)
        assert dict(ds.sizes) == {"time": 4, **dict(zip(spatial, shape, strict=True))}
        for n, c in coords.items():
            np.testing.assert_array_equal(ds[n].values, c)
            assert ds[n].attrs["units"] == "m"
            assert "axis" not in ds[n].attrs
        np.testing.assert_array_equal(ds["time"].values, times)
        assert ds["time"].dtype == np.float64  # not decoded to datetime
        assert ds["time"].attrs["axis"] == "T"
        assert ds["time"].attrs["units"] == "s"
        np.testing.assert_array_equal(ds["step"].values, steps)
        for name in ("rho", "u", "u_mean_x", "energy"):
            want = np.stack([fr[name] for fr in frames])
            np.testing.assert_array_equal(ds[name].values, want)
        assert ds["rho"].dtype == np.float32 and ds["energy"].dtype == np.float64
        assert ds["rho"].attrs["units"] == "kg m-3"
        assert ds["rho"].attrs["long_name"] == "density"
        a = ds.attrs
        assert a["Conventions"] == "CF-1.8"
        assert a["config"] == CONFIG  # long text with non-ASCII survives
        assert a["engine"] == "shard_map"
        np.testing.assert_array_equal(a["device_mesh"], [2, 4])
        assert int(a["seed"]) == 42
        assert a["run_status"] == "complete"

    # Low-level recipe facts (the layout list in simpar/io/netcdf.py).
    with h5py.File(path, "r") as f:
        assert f["time"].maxshape == (None,)
        assert np.isnan(f["time"].fillvalue)
        rho = f["rho"]
        assert rho.chunks == (1, *shape)
        assert rho.compression == "gzip" and rho.shuffle
        for name in ("Conventions", "config", "engine", "model"):
            assert f.attrs.get_id(name).get_type().get_class() == h5py.h5t.STRING
            assert not f.attrs.get_id(name).get_type().is_variable_str()  # NC_CHAR
        gcpl = f["/"].id.get_create_plist()  # track_order=True
        assert gcpl.get_link_creation_order() and gcpl.get_attr_creation_order()

    t, s, vals = open_frames(path)
    np.testing.assert_array_equal(t, times)
    np.testing.assert_array_equal(s, steps)
    np.testing.assert_array_equal(vals["rho"], np.stack([fr["rho"] for fr in frames]))
    attrs = read_attrs(path)
    assert attrs["config"] == CONFIG and attrs["model"] == "diffusion"


@pytest.mark.parametrize("shape", [(6, 8), (4, 6, 8)], ids=["2d", "3d"])
def test_xdmf_sidecar(tmp_path, shape):
    path = tmp_path / "run.nc"
    _, times, steps, _ = _write(path, shape)
    xdmf = Path(str(path) + ".xdmf")
    root = ET.parse(xdmf).getroot()
    assert root.tag == "Xdmf" and root.get("Version") == "3.0"
    (coll,) = root.find("Domain").findall("Grid")
    assert coll.get("CollectionType") == "Temporal"
    grids = coll.findall("Grid")
    assert len(grids) == 4
    dims3 = (1,) * (3 - len(shape)) + shape
    c = _coords(shape)
    origin = [0.0] * (3 - len(shape)) + [v[0] for v in c.values()]
    spacing = [1.0] * (3 - len(shape)) + [v[1] - v[0] for v in c.values()]
    for k, g in enumerate(grids):
        assert float(g.find("Time").get("Value")) == times[k]
        assert g.get("Name") == f"step{steps[k]}"
        topo = g.find("Topology")
        assert topo.get("TopologyType") == "3DCoRectMesh"
        assert tuple(map(int, topo.get("Dimensions").split())) == dims3
        geo = g.find("Geometry")
        assert geo.get("GeometryType") == "ORIGIN_DXDYDZ"
        o, d = (list(map(float, it.text.split())) for it in geo.findall("DataItem"))
        np.testing.assert_allclose(o, origin)  # z y x order
        np.testing.assert_allclose(d, spacing)
        atts = {a.get("Name"): a for a in g.findall("Attribute")}
        assert set(atts) == {"rho", "u"}  # profiles and series are not on the mesh
        for name, a in atts.items():
            assert a.get("Center") == "Node"
            slab = a.find("DataItem")
            assert slab.get("ItemType") == "HyperSlab"
            assert tuple(map(int, slab.get("Dimensions").split())) == dims3
            sel, src = slab.findall("DataItem")
            nums = list(map(int, sel.text.split()))
            rank = len(shape) + 1
            assert sel.get("Dimensions") == f"3 {rank}"
            assert nums[:rank] == [k] + [0] * len(shape)  # start: frame k
            assert nums[rank : 2 * rank] == [1] * rank
            assert nums[2 * rank :] == [1, *shape]
            assert src.text == f"{path.name}:/{name}"  # relative: movable pair
            assert tuple(map(int, src.get("Dimensions").split())) == (4, *shape)
            assert src.get("Precision") == "4"
    assert not list(tmp_path.glob("*.tmp"))


def test_xdmf_nonuniform_coordinates(tmp_path):
    path = tmp_path / "stretched.nc"
    y = np.array([0.1, 0.3, 0.7, 1.5])
    x = np.linspace(0, 1, 5)
    with GridWriter(
        path, coords={"y": y, "x": x}, variables={"c": {"dims": ("time", "y", "x")}}
    ) as w:
        w.append(0, 0.0, {"c": np.ones((4, 5))})
    g = ET.parse(str(path) + ".xdmf").getroot().find("Domain/Grid/Grid")
    assert g.find("Topology").get("TopologyType") == "3DRectMesh"
    geo = g.find("Geometry")
    assert geo.get("GeometryType") == "VXVYVZ"
    vx, vy, vz = geo.findall("DataItem")  # x first
    assert vx.text == f"{path.name}:/x" and vy.text == f"{path.name}:/y"
    assert vz.text.strip() == "0.0"


def test_refuses_to_overwrite(tmp_path):
    path = tmp_path / "run.h5"
    _write(path, (6, 8), n=1)
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"already exists.*--out") as e:
        _write(path, (6, 8), n=1)
    assert e.value.key == "--out" and str(path) in str(e.value)
    assert "overwrite" in str(e.value)
    assert path.read_bytes() == before
    _write(path, (6, 8), n=2, overwrite=True)
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        assert ds.sizes["time"] == 2


def test_append_checks_values(tmp_path):
    w, *_ = _write(tmp_path / "run.h5", (6, 8), n=1, close=False)
    good = _frames((6, 8), 1)[0]
    with pytest.raises(ValueError, match="missing values for \\['energy'\\]"):
        w.append(1, 1.0, {k: v for k, v in good.items() if k != "energy"})
    with pytest.raises(ValueError, match="'rho' has shape \\(8, 6\\)"):
        w.append(1, 1.0, {**good, "rho": np.zeros((8, 6))})
    w.close()
    assert open_frames(tmp_path / "run.h5")[0].size == 1
    with pytest.raises(ValueError, match="dims"):
        GridWriter(
            tmp_path / "bad.h5",
            coords={"y": np.arange(3.0), "x": np.arange(2.0)},
            variables={"a": {"dims": ("time", "x", "y")}},
        )


def test_failed_run_status(tmp_path):
    path = tmp_path / "run.h5"
    with pytest.raises(RuntimeError):
        with GridWriter(
            path, coords={"x": np.arange(4.0)}, variables={"a": {"dims": ("time", "x")}}
        ) as w:
            w.append(0, 0.0, {"a": np.zeros(4)})
            raise RuntimeError("NaN in a")
    assert read_attrs(path)["run_status"] == "failed: RuntimeError: NaN in a"


CRASH = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from simpar.io.netcdf import GridWriter
    y = np.arange(6) + 0.5; x = np.arange(8) + 0.5
    w = GridWriter(sys.argv[1], coords={"y": y, "x": x},
                   variables={"rho": {"dims": ("time", "y", "x")},
                              "energy": {"dims": ("time",)}},
                   attrs={"config": "a = 1", "engine": "single"})
    for k in range(3):
        w.append(k, 0.5 * k, {"rho": np.full((6, 8), k, np.float32), "energy": k})
    if sys.argv[2] == "partial":  # a 4th frame cut short: data but no time
        w._f["rho"].resize(4, axis=0); w._f["rho"][3] = 99.0; w._f.flush()
    print("written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("mode", ["clean", "partial"])
def test_killed_writer_leaves_readable_file(tmp_path, mode):
    path = tmp_path / "crash.nc"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(path), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    assert "written" in proc.stdout

    t, s, vals = open_frames(path)
    np.testing.assert_array_equal(t, [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(s, [0, 1, 2])
    np.testing.assert_array_equal(vals["rho"][:, 0, 0], [0, 1, 2])
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        if mode == "clean":
            assert ds.sizes["time"] == 3
        else:  # netCDF sizes the unlimited dim by the longest variable: NaN time
            assert ds.sizes["time"] == 4 and np.isnan(ds["time"].values[3])
        ok = ds.isel(time=np.flatnonzero(np.isfinite(ds["time"].values)))
        np.testing.assert_array_equal(ok["time"].values, [0.0, 0.5, 1.0])
        np.testing.assert_array_equal(ok["energy"].values, [0, 1, 2])
        assert ds.attrs["run_status"] == "running"
    grids = ET.parse(str(path) + ".xdmf").getroot().findall("Domain/Grid/Grid")
    assert len(grids) == 3

    # Resume: drop the cut frame and every frame after step 1, then append.
    w = GridWriter.open_existing(path, step=1)
    assert w.frames == 2 and w.last_step == 1
    w.append(2, 0.75, {"rho": np.full((6, 8), 7, np.float32), "energy": 7.0})
    w.set_status("complete")
    w.close()
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        np.testing.assert_array_equal(ds["time"].values, [0.0, 0.5, 0.75])
        np.testing.assert_array_equal(ds["step"].values, [0, 1, 2])
        np.testing.assert_array_equal(ds["rho"].values[:, 0, 0], [0, 1, 7])
        assert ds.attrs["run_status"] == "complete"
    grids = ET.parse(str(path) + ".xdmf").getroot().findall("Domain/Grid/Grid")
    assert [g.find("Time").get("Value") for g in grids] == ["0.0", "0.5", "0.75"]


def test_open_existing_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        GridWriter.open_existing(tmp_path / "nope.nc")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["a"] = np.arange(3)
    with pytest.raises(ConfigError, match="not a simpar grid file"):
        GridWriter.open_existing(other)


# --------------------------------------------------------------------------- plot
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_png(p: Path) -> None:
    import matplotlib.image

    assert p.is_file() and p.stat().st_size > 0
    assert p.read_bytes()[:8] == PNG_MAGIC
    img = matplotlib.image.imread(p)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
    assert np.ptp(img[..., :3]) > 0.1  # not a blank image


@pytest.mark.parametrize("shape", [(6, 8), (4, 6, 8)], ids=["2d", "3d"])
def test_plot_grid_file(tmp_path, shape):
    path = tmp_path / "run.h5"
    _write(path, shape)
    written = plot_file(path)
    names = sorted(p.name for p in written)
    assert names == sorted(["run_rho.png", "run_u.png", "run_u_mean_x.png", "run_timeseries.png"])
    for p in written:
        assert p.parent == tmp_path
        _check_png(p)


def test_plot_model_hook(tmp_path, monkeypatch):
    path = tmp_path / "cavity.nc"
    _write(path, (6, 8), n=2)
    calls = []

    def extra(f, p):
        calls.append((f["time"].shape[0], p))
        return []

    monkeypatch.setitem(PLOTTERS, "diffusion", extra)
    plot_file(path)
    assert calls == [(2, path)]


def test_plot_h5md_file(tmp_path):
    path = tmp_path / "traj.h5md"
    T, N = 5, 50
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        f.create_group("h5md").attrs["version"] = np.array([1, 1], np.int32)
        g = f.create_group("particles/trajectory")
        pos = g.create_group("position")
        pos["value"] = rng.random((T, N, 3)) * 10
        pos["step"] = np.arange(T, dtype=np.int64) * 100
        pos["time"] = np.arange(T, dtype=np.float64)
        pos["time"].attrs["unit"] = "ps"
        edges = g.create_group("box/edges")
        edges["value"] = np.full((T, 3), 10.0)
        g["species"] = (np.arange(N) % 2).astype(np.int32)
        for name in ("potential_energy", "temperature"):
            o = f.create_group(f"observables/{name}")
            o["value"] = rng.random(T)
            o["step"], o["time"] = pos["step"], pos["time"]
    written = plot_file(path)
    assert sorted(p.name for p in written) == [
        "traj_observables.png",
        "traj_positions.png",
    ]
    for p in written:
        _check_png(p)


def test_plot_rejects_other_files(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["a"] = np.arange(3)
    with pytest.raises(ConfigError, match="neither a simpar grid file"):
        plot_file(other)
    text = tmp_path / "notes.h5"
    text.write_text("not hdf5")
    with pytest.raises(ConfigError, match="cannot open as HDF5"):
        plot_file(text)
    with pytest.raises(ConfigError, match="does not exist"):
        plot_file(tmp_path / "missing.h5")
    empty = tmp_path / "empty.nc"
    GridWriter(
        empty, coords={"x": np.arange(3.0)}, variables={"a": {"dims": ("time", "x")}}
    ).close()
    with pytest.raises(ConfigError, match="no complete frame"):
        plot_file(empty)


def test_extra_dims(tmp_path):
    """A non-spatial dimension (``k``) opens in xarray as a coordinate, stays out of the XDMF
    mesh on create and after a reopen, and bad specs are refused."""
    path = tmp_path / "spec.nc"
    y, x = np.arange(3.0), np.arange(4.0)
    k = np.array([0.0, 1.5, 3.0])
    extra = {"k": {"data": k, "units": "m-1", "long_name": "wavenumber"}}
    variables = {
        "rho": {"dims": ("time", "y", "x")},
        "spectrum": {"dims": ("time", "k"), "dtype": "float64", "units": "m3 s-2"},
        "spec_y": {"dims": ("time", "k", "y")},
    }
    with GridWriter(path, coords={"y": y, "x": x}, variables=variables, extra_dims=extra) as w:
        assert list(w.coords) == ["y", "x"]
        w.append(0, 0.0, {"rho": np.ones((3, 4)), "spectrum": k, "spec_y": np.ones((3, 3))})
    with GridWriter.open_existing(path) as w:
        assert list(w.coords) == ["y", "x"] and w.variables["spectrum"] == ("time", "k")
        w.append(1, 1.0, {"rho": np.ones((3, 4)), "spectrum": 2 * k, "spec_y": np.ones((3, 3))})
        w.set_status("complete")
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        assert ds.spectrum.dims == ("time", "k") and ds.spec_y.dims == ("time", "k", "y")
        np.testing.assert_array_equal(ds.k.values, k)
        assert ds.k.attrs["units"] == "m-1" and ds.k.attrs["long_name"] == "wavenumber"
        np.testing.assert_array_equal(ds.spectrum.values, [k, 2 * k])
    with h5py.File(path, "r") as f:
        assert f["spectrum"].compression is None and f["rho"].compression == "gzip"
    grids = ET.parse(str(path) + ".xdmf").getroot().find("Domain").find("Grid").findall("Grid")
    assert len(grids) == 2
    for g in grids:
        assert {a.get("Name") for a in g.findall("Attribute")} == {"rho"}
        assert g.find("Topology").get("Dimensions") == "1 3 4"
    coords = {"y": y, "x": x}
    bad = [
        ({"x": {"data": k}}, variables, "reserved or taken"),
        ({"k": {"data": np.zeros((2, 2))}}, variables, "1-D numbers"),
        (extra, {"s": {"dims": ("time", "y", "k")}}, "'time', then any of"),
    ]
    for i, (ex, var, match) in enumerate(bad):
        with pytest.raises(ValueError, match=match):
            GridWriter(tmp_path / f"bad{i}.nc", coords=coords, variables=var, extra_dims=ex)


def test_reopen_keeps_an_unmarked_dimension_added_after_step_off_the_mesh(tmp_path):
    """Files from before ``extra_dims`` (the spectral writer added ``k`` after creation, with
    no marker) reopen with only the spatial axes."""
    import h5netcdf

    path = tmp_path / "legacy.nc"
    coords = {"y": np.arange(3.0), "x": np.arange(4.0)}
    with GridWriter(path, coords=coords, variables={"rho": {"dims": ("time", "y", "x")}}) as w:
        nc = h5netcdf.File(w._f, "r+")  # what the former SpectrumWriter did
        nc.dimensions["k"] = 2
        nc.create_variable("k", ("k",), "f8", data=np.array([0.0, 1.0]))
        nc.create_variable("spectrum", ("time", "k"), "f8", chunks=(1, 2), fillvalue=np.nan)
        nc.close()
    with GridWriter.open_existing(path) as w:
        assert list(w.coords) == ["y", "x"] and w.variables["spectrum"] == ("time", "k")
        w.append(0, 0.0, {"rho": np.ones((3, 4)), "spectrum": np.ones(2)})
    grid = ET.parse(str(path) + ".xdmf").getroot().find("Domain").find("Grid").find("Grid")
    assert grid.find("Topology").get("Dimensions") == "1 3 4"
