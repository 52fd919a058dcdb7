"""The package used from Python as a new user meets it: precision, summaries, discoverability."""

import contextlib
import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from simpar.testing import fresh_python

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (x64 off): ``simpar.testing.fresh_python``."""
    return fresh_python(code, ROOT, **env)


PRECISION = """
import json, sys, warnings
from pathlib import Path

import numpy as np
import pytest
warnings.simplefilter("error")  # a truncated float64 request would warn: make it fail
import jax, numpy as np
assert not jax.config.jax_enable_x64
import simpar
from simpar.errors import ConfigError
from simpar.particles import lattice, md, nbody, potentials, space

out = {}
# kernels without a dtype: JAX's default float, never a truncated float64 request
pot = potentials.lennard_jones()
out["kernels"] = sorted({str(pot.epsilon.dtype), str(potentials.morse().alpha.dtype),
    str(space.periodic(np.ones(3)).box.dtype), str(space.free([2.0, 2.0, 2.0]).box.dtype),
    str(md.make_params(0.005, 1.0).dt.dtype), str(nbody.make_params(0.01).G.dtype),
    str(lattice.cubic_lattice("fcc", 0.8442, (2, 2, 2))[0].dtype),
    str(lattice.maxwell_boltzmann(jax.random.PRNGKey(0), 8, 1.0).dtype)})
# an explicit float64 request is refused with the fix
try:
    potentials.lennard_jones(dtype="float64")
except ConfigError as e:
    out["kernel_f64"] = str(e)
# every config-taking entry point refuses float64, naming the key and the fix; no file
tmp = Path(sys.argv[1])
cases = {
    "heat": ("experiments/heat2d.toml", ["grid.dtype='float64'", "grid.shape=[16,16]"]),
    "lj": ("experiments/lj_melt.toml", ["system.dtype='float64'"]),
    "nbody": ("experiments/nbody_plummer.toml", ["particles.dtype='float64'"]),
}
for name, (cfg, sets) in cases.items():
    path = tmp / (name + (".nc" if name == "heat" else ".h5md"))
    try:
        simpar.run_file(cfg, sets, out=str(path), progress=False)
        out[name] = "ran"
    except ConfigError as e:
        out[name] = [e.key, str(e), path.exists()]
# float32 stays float32, labelled float32
s = simpar.run_file("experiments/heat2d.toml", ["grid.shape=[16,16]", "time.dt=1e-4"],
                    out=str(tmp / "f32.nc"), steps=4, progress=False)
import h5py
with h5py.File(tmp / "f32.nc") as f:
    out["f32"] = [str(f["u"].dtype), f.attrs["dtype"].tobytes().decode()]
# `simpar info` reports x64 as a run uses it
from simpar.cli import main
import io, contextlib
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    main(["info"])
out["info_x64"] = json.loads(buf.getvalue())["x64"]
# ... and with x64 on (as the command line sets it) the float64 domain is accepted
from simpar.grid.domain import Domain
out["f64"] = Domain((4, 4), (1.0, 1.0), "float64").dtype
print(json.dumps(out))
"""


def test_float64_is_refused_without_x64_and_kernels_never_truncate(tmp_path):
    r = _python(PRECISION.replace("sys.argv[1]", repr(str(tmp_path))))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["kernels"] == ["float32"]
    assert "jax_enable_x64" in out["kernel_f64"]
    for name, key in (("heat", "grid.dtype"), ("lj", "system.dtype"), ("nbody", "particles.dtype")):
        got_key, msg, exists = out[name]
        assert got_key == key and not exists
        assert 'jax.config.update("jax_enable_x64", True)' in msg and "float32" in msg
    assert out["f32"] == ["float32", "float32"]
    assert out["info_x64"] is True
    assert out["f64"] == "float64"


def _status(path) -> str:
    import h5py

    with h5py.File(path) as f:
        attrs = f["parameters"].attrs if "parameters" in f else f.attrs
        value = attrs["run_status"]
    return value.tobytes().decode() if hasattr(value, "tobytes") else str(value)


RUNS = {
    "heat": ("experiments/heat2d.toml", "nc", ["grid.shape=[16,16]", "output.every=2"]),
    "wave": ("experiments/wave2d.toml", "nc", ["grid.shape=[16,16]", "output.every=2"]),
    "lj": ("experiments/lj_melt.toml", "h5md", ["system.cells=[4,4,4]", "output.every=2"]),
    "nbody": ("experiments/nbody_plummer.toml", "h5md", ["particles.n=32", "output.every=2"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each model run once through the command line (4 steps, 3 frames): name -> (output
    path, stdout, stderr). Shared by the summary, status and units tests."""
    from simpar.cli import main

    tmp = tmp_path_factory.mktemp("runs")
    out = {}
    for name, (cfg, ext, sets) in RUNS.items():
        path = tmp / f"{name}.{ext}"
        args = ["run", cfg, "--steps", "4", "--out", str(path)]
        for s in sets:
            args += ["--set", s]
        with (
            contextlib.redirect_stdout(io.StringIO()) as o,
            contextlib.redirect_stderr(io.StringIO()) as e,
        ):
            code = main(args)
        assert code == 0, e.getvalue()
        out[name] = (path, o.getvalue(), e.getvalue())
    return out


def test_one_summary_and_one_status_for_every_model(runs):
    from simpar.io.meta import SUMMARY_KEYS

    summaries = {}
    for name, (path, stdout, stderr) in runs.items():
        lines = stdout.strip().splitlines()
        assert len(lines) == 1, stdout  # stdout holds the JSON summary and nothing else
        summaries[name] = s = json.loads(lines[0])
        assert tuple(s) == SUMMARY_KEYS
        assert (s["model"], s["steps"], s["frames"], s["run_status"]) == (name, 4, 3, "complete")
        assert s["path"] == str(path) and _status(path) == "complete"
        if name == "lj":  # a LAMMPS-like thermo row per frame on stderr, header once
            rows = [ln.split() for ln in stderr.splitlines()]
            rows = [r for r in rows if r and (r[0] == "Step" or r[0].isdigit())]
            assert [r[0] for r in rows] == ["Step", "0", "2", "4"]
            assert float(rows[1][3]) == pytest.approx(s["initial"]["total_energy"], rel=1e-7)
            assert float(rows[-1][3]) == pytest.approx(s["final"]["total_energy"], rel=1e-7)
    assert summaries["heat"]["rate_unit"] == "Mcell_updates/s"
    assert summaries["lj"]["details"]["n_atoms"] == 256
    assert summaries["nbody"]["details"]["n"] == 32
    assert summaries["nbody"]["final"]["total_energy"] == pytest.approx(
        summaries["nbody"]["initial"]["total_energy"], rel=1e-3
    )


# UDUNITS spellings simpar writes; "1" only for dimensionless quantities (named in DIMLESS)
UDUNITS = {"K", "m", "s", "m s-1", "m2", "m3", "m4 s-2", "m2 s-2", "1"}


def test_grid_files_state_their_units_for_every_variable(runs):
    import getpass
    import platform

    import xarray as xr

    for name in ("heat", "wave"):
        ds = xr.open_dataset(runs[name][0], engine="h5netcdf")
        assert "u_prev" not in ds.variables  # internal field: checkpoint only
        assert "step" in ds.coords and ds.step.dims == ("time",)
        assert ds.step.values.tolist() == [0, 2, 4]
        for v in ds.variables.values():
            assert v.attrs["units"] in UDUNITS, (name, v.name, v.attrs)
            assert v.attrs.get("long_name"), (name, v.name)
        assert [ds[c].attrs["units"] for c in ("x", "y", "time")] == ["m", "m", "s"]
        assert ds.time.dtype == np.float64  # "s" is not decoded as a timedelta
        dimensionless = {k for k, v in ds.variables.items() if v.attrs["units"] == "1"}
        assert dimensionless == {"step"}, dimensionless
        assert "host" not in ds.attrs and "author" not in ds.attrs
        text = " ".join(str(v) for v in ds.attrs.values())
        assert platform.node() not in text and f"'{getpass.getuser()}'" not in text
    heat = xr.open_dataset(runs["heat"][0], engine="h5netcdf")
    assert heat.u.attrs["units"] == "K" and heat.u_max.attrs["units"] == "K"
    assert heat.u_max.attrs["long_name"] == "maximum of temperature"
    wave = xr.open_dataset(runs["wave"][0], engine="h5netcdf")
    assert wave.u.attrs["units"] == "m" and wave.energy.attrs["units"] == "m4 s-2"


def test_particle_files_open_in_mdanalysis_and_state_reduced_units(runs, tmp_path):
    """Issue 17 item 8: reduced-unit files claim no Angstrom/ps; MDAnalysis opens them with
    the README's call and returns the stored numbers; files written before the change
    (compatibility labels "A"/"ps") still read with simpar's own reader."""
    import shutil

    import h5py
    import MDAnalysis

    from simpar.io import h5md
    from simpar.io.plot import _h5md_unit

    truth = {
        "lj": ("lj", " [sigma]", " [tau]", {"temperature": "epsilon kB-1", "pressure": "epsilon sigma-3"}),
        "nbody": ("nbody", " [L]", " [T]", {"total_energy": "M L+2 T-2", "virial_ratio": "1"}),
    }  # fmt: skip
    for name, (system, length, time_, obs) in truth.items():
        path = runs[name][0]
        with pytest.raises(ValueError, match="readable units"):  # nothing to convert from
            MDAnalysis.Universe(str(path))
        with h5py.File(path) as f:
            n = f["particles/trajectory/position/value"].shape[1]
        u = MDAnalysis.Universe(str(path), n_atoms=n, convert_units=False)  # README's call
        assert set(u.trajectory.units.values()) == {None}  # not Angstrom, not ps
        with h5py.File(path) as f:
            stored = f["particles/trajectory/position/value"][-1]
            t_stored = f["particles/trajectory/position/time"][-1]
            assert f["h5md/modules/units"].attrs["system"] == system
            assert "Angstrom" not in f["h5md/modules/units"].attrs["description"]
            assert f["h5md/author"].attrs["name"] == "anonymous"
            traj = f["particles/trajectory"]
            for el in ("position/value", "position/time", "velocity/value", "box/edges/value"):
                assert "unit" not in traj[el].attrs, (name, el)
                assert traj[el].attrs["reduced_unit"], (name, el)
            pos = traj["position"]
            assert _h5md_unit(pos["value"]) == length and _h5md_unit(pos["time"]) == time_
            for k, unit in obs.items():
                assert f["observables"][k]["value"].attrs["unit"] == unit
            assert "host" not in f["parameters"].attrs and "author" not in f["parameters"].attrs
        u.trajectory[-1]
        np.testing.assert_allclose(u.atoms.positions, stored, rtol=1e-6)  # nothing converted
        assert u.trajectory.ts.time == pytest.approx(t_stored)
        fr = h5md.read_frame(path)
        assert fr["unit_system"] == system
        old = tmp_path / f"old_{name}.h5md"  # as written before: compatibility labels
        shutil.copy(path, old)
        with h5py.File(old, "a") as f:
            traj = f["particles/trajectory"]
            traj["position/value"].attrs["unit"] = "A"
            traj["position/time"].attrs["unit"] = "ps"
            traj["box/edges/value"].attrs["unit"] = "A"
        np.testing.assert_array_equal(h5md.read_frame(old)["position"], fr["position"])


def test_version_and_run_help_list_models_and_exit_codes(capsys):
    import pytest as _pytest

    import simpar
    from simpar import cli, models

    with _pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"simpar {simpar.__version__}"
    with _pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = capsys.readouterr().out
    assert set(models.BUILTIN) <= set(models.available())
    for name in models.available():
        assert f"\n  {name} " in text
    for code in ("0  success", "1  failed run", "2  invalid input"):
        assert code in text


def test_single_ignores_a_mesh_from_the_command_line_and_from_python(tmp_path, capsys):
    import h5py

    from simpar.cli import main
    from simpar.grid import heat
    from simpar.grid.boundary import Dirichlet, Neumann
    from simpar.grid.domain import Domain
    from simpar.parallel.engines import make_engine

    out = tmp_path / "single.nc"
    args = ["run", "experiments/heat2d.toml", "--engine", "single", "--mesh", "2x4"]
    sets = ["grid.shape=[16,16]", "time.dt=1e-4", "initial.center=[0.3,0.4]"]
    assert (
        main([*args, "--steps", "5", "--out", str(out), *sum((["--set", s] for s in sets), [])])
        == 0
    )
    assert set(json.loads(capsys.readouterr().out)["mesh"]) == {1}
    with h5py.File(out) as f:
        cli_u = f["u"][-1].T  # stored (y, x)
        u0 = f["u"][0].T
    dom = Domain((16, 16), (1.0, 1.0), "float32")
    model = heat.make_model(2, ((Neumann(), Neumann()), (Dirichlet(0.0), Dirichlet(1.0))))
    params = heat.make_params(dom, diffusivity=1.0, dt=1e-4)
    for mesh in (None, (2, 4)):
        eng = make_engine("single", model, dom.shape, mesh=mesh)
        assert eng.grid.size == 1
        u = eng.gather(eng.advance(eng.place({"u": u0}), params, 5))["u"]
        np.testing.assert_array_equal(u, cli_u)


def test_every_public_module_function_class_and_method_has_a_docstring():
    """As ``help()`` shows them (a method inherits its base class's docstring)."""
    import importlib
    import inspect
    import pkgutil

    import simpar

    names = ["simpar"] + [m.name for m in pkgutil.walk_packages(simpar.__path__, "simpar.")]
    missing, total = [], 0
    for modname in names:
        if any(p.startswith("_") for p in modname.split(".")[1:]):
            continue
        mod = importlib.import_module(modname)
        objs = [(modname, mod)]
        for name, obj in vars(mod).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != modname:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                objs.append((f"{modname}.{name}", obj))
                if inspect.isclass(obj):
                    for m, v in vars(obj).items():
                        if not m.startswith("_") and (
                            inspect.isfunction(v) or isinstance(v, property)
                        ):
                            doc_of = getattr(obj, m) if inspect.isfunction(v) else v
                            objs.append((f"{modname}.{name}.{m}", doc_of))
        for qual, obj in objs:
            total += 1
            if not inspect.getdoc(obj):
                missing.append(qual)
    assert total > 300 and not missing, missing


def test_space_takes_a_scalar_box_as_jax_md_does():
    """``space.periodic(10.0)`` (JAX-MD's usual call) is a cube; other shapes are refused."""
    import jax

    from simpar.errors import ConfigError
    from simpar.particles import space

    cube = space.periodic(10.0)
    assert cube.periodic and cube.box.shape == (3,) and cube.box.tolist() == [10.0] * 3
    assert space.periodic(np.float32(2.5)).box.tolist() == [2.5] * 3
    assert space.periodic(np.array([2.0])).box.tolist() == [2.0] * 3
    assert space.free(4.0).box.tolist() == [4.0] * 3 and not space.free(4.0).periodic
    assert space.periodic([1.0, 2.0, 3.0]).box.tolist() == [1.0, 2.0, 3.0]
    r = np.array([[9.5, 0.0, 0.0]])
    np.testing.assert_allclose(space.displacement(cube, r, np.zeros(3)), [[-0.5, 0.0, 0.0]])
    assert jax.jit(lambda b: space.periodic(b).box)(3.0).tolist() == [3.0] * 3
    for bad in ([1.0, 2.0], np.ones((3, 3))):
        with pytest.raises(ConfigError, match="one edge length .* or 3 edge lengths"):
            space.periodic(bad)
