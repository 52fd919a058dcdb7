"""Issue 28 item 4: the defects a new user met, one test each (fast tier)."""

import json
import subprocess
from pathlib import Path

import pytest

from simpar.testing import fresh_python

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (x64 off): ``simpar.testing.fresh_python``."""
    return fresh_python(code, ROOT, **env)


KERNELS_F64 = """
import json, math, warnings
warnings.simplefilter("error")  # a float64 truncated to float32 warns: make it fail
import jax, numpy as np
assert not jax.config.jax_enable_x64
from simpar.errors import ConfigError
from simpar.grid import poisson, spectral_ns, spectral_ns3d
from simpar.parallel.pm_engine import PMEngine

out = {}
def refused(name, fn):
    try:
        fn()
        out[name] = "ran"
    except ConfigError as e:
        out[name] = [e.key, str(e)]

x = np.arange(16) * (2 * math.pi / 16)
f64 = np.sin(x)[:, None] * np.ones((16, 16))
refused("ns_params", lambda: spectral_ns.make_params(0.01, 0.01, dtype="float64"))
refused("ns3d_params", lambda: spectral_ns.make_params(
    0.01, 0.01, length=(1.0, 1.0, 1.0), dtype="float64"))
refused("ns_state", lambda: spectral_ns.to_state(f64, poisson.local_ops((16, 16))))
p3 = spectral_ns.make_params(0.01, 0.01, length=(1.0, 1.0, 1.0))
u3 = spectral_ns3d.taylor_green((8, 8, 8), (1.0, 1.0, 1.0))
refused("ns3d_state", lambda: spectral_ns3d.to_state(u3, p3, poisson.local_ops((8, 8, 8))))
refused("poisson", lambda: poisson.solve(f64, (0.1, 0.1)))
eng = PMEngine("single", (8, 8, 8))
pos = np.random.default_rng(0).random((16, 3))
refused("pm", lambda: eng.distribute(pos, np.zeros((16, 3)), np.ones(16)))
# float32 (and no dtype) still run, in float32
out["f32"] = sorted({
    str(spectral_ns.make_params(0.01, 0.01).nu.dtype),
    str(poisson.solve(f64.astype(np.float32), (0.1, 0.1)).dtype),
    str(eng.distribute(pos.astype(np.float32), np.zeros((16, 3), np.float32),
                       np.ones(16, np.float32))[0].dtype),
})
print(json.dumps(out))
"""


def test_float64_kernels_refused_without_x64():
    """spectral_ns / spectral_ns3d / poisson / PM: float64 with x64 off is a ConfigError."""
    r = _python(KERNELS_F64)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    keys = {
        "ns_params": "dtype",
        "ns3d_params": "dtype",
        "ns_state": "spectral_ns.to_state(omega)",
        "ns3d_state": "spectral_ns3d.to_state(u)",
        "poisson": "poisson.solve(f)",
        "pm": "PMEngine.distribute(pos)",
    }
    for name, key in keys.items():
        assert out[name] != "ran", name
        got, msg = out[name]
        assert got == key
        assert 'jax.config.update("jax_enable_x64", True)' in msg and "float32" in msg
    assert out["f32"] == ["float32"]


def _cli(*args) -> tuple[int, str, str]:
    """``simpar ARGS`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from simpar.cli import main

    with (
        contextlib.redirect_stdout(io.StringIO()) as o,
        contextlib.redirect_stderr(io.StringIO()) as e,
    ):
        code = main(list(args))
    return code, o.getvalue(), e.getvalue()


TG_SMALL = ("--steps", "2", "--quiet", "--set", "grid.shape=[16,16]", "--set", "output.every=2")


@pytest.fixture(scope="module")
def tg_run(tmp_path_factory):
    """One small taylor_green run (16^2, 2 steps): (output path, stderr)."""
    out = tmp_path_factory.mktemp("tg") / "taylor_green.nc"
    tg = str(ROOT / "experiments/taylor_green.toml")
    code, _, err = _cli("run", tg, *TG_SMALL, "--out", str(out))
    assert code == 0, err
    return out, err


def test_ensemble_xdmf_lists_every_member_and_coordinates_have_units(tmp_path):
    """heat_ensemble on pmap (8 devices, mesh 2 per member): the sidecar has one Attribute per
    member and frame whose HyperSlab selects that member's field; diffusivity is in m2 s-1."""
    import xml.etree.ElementTree as ET

    import h5py
    import numpy as np

    out = tmp_path / "ens.nc"
    code, _, err = _cli(
        "run", str(ROOT / "experiments/heat_ensemble.toml"), "--engine", "pmap",
        "--devices", "8", "--mesh", "2", "--steps", "4", "--quiet", "--out", str(out),
        "--set", "grid.shape=[16,16]", "--set", "output.every=2",
    )  # fmt: skip
    assert code == 0, err
    grids = ET.parse(str(out) + ".xdmf").getroot().findall("Domain/Grid/Grid")
    assert len(grids) == 3
    with h5py.File(out) as f:
        u = f["u"][()]  # (time, ensemble, y, x)
        assert u.shape == (3, 4, 16, 16)
        for k, g in enumerate(grids):
            atts = g.findall("Attribute")
            assert [a.get("Name") for a in atts] == [f"u_member{m}" for m in range(4)]
            for m, a in enumerate(atts):
                sel, src = a.find("DataItem").findall("DataItem")
                nums = np.array(sel.text.split(), int).reshape(3, 4)  # start, stride, count
                assert src.text == "ens.nc:/u"
                start, count = nums[0], nums[2]
                assert start.tolist() == [k, m, 0, 0] and count.tolist() == [1, 1, 16, 16]
                picked = u[tuple(slice(s, s + c) for s, c in zip(start, count, strict=True))]
                np.testing.assert_array_equal(picked[0, 0], u[k, m])
        assert f["diffusivity"].attrs["units"].tobytes().decode() == "m2 s-1"
        np.testing.assert_array_equal(f["diffusivity"][()], [0.5, 1.0, 1.5, 2.0])
        assert "units" not in f["seed"].attrs  # an identifier, not a quantity


def test_coordinate_labels_and_lattice_units(tg_run):
    """Spectral x/y are grid points from 0 and say so; LBM fields say lattice units only."""
    import h5py
    import numpy as np

    from simpar import config as cfgmod
    from simpar.grid import lbm_config

    with h5py.File(tg_run[0]) as f:
        for a in ("x", "y"):
            np.testing.assert_allclose(f[a][()], np.arange(16) * (2 * np.pi / 16))
            name = f[a].attrs["long_name"].tobytes().decode()
            assert "grid points" in name and "cell centres" not in name
    cfg = {
        "model": {"name": "lbm"},
        "grid": {"shape": [16, 16], "length": [1.0, 1.0]},
        "boundary": {"x": "wall", "y": {"lower": "wall", "upper": "lid"}},
        "physics": {"reynolds": 100.0, "u_lid": 0.1},
        "time": {"steps": 10},
    }
    model = lbm_config.from_config(cfgmod.Section(cfg)).model
    for name in ("ux", "uy"):
        assert model.units[name] == "1"
        assert "lattice units" in model.long_names[name]
    assert model.diagnostics["kinetic_energy"][0] == "1"
    assert "m s-1" not in {*model.units.values(), *(u for u, _ in model.diagnostics.values())}


def test_unset_removes_a_key_or_a_table(tmp_path):
    """--unset lets a file's key go: taylor_green with a random start, kolmogorov unforced."""
    import h5py
    import numpy as np

    tg = str(ROOT / "experiments/taylor_green.toml")
    kol = str(ROOT / "experiments/kolmogorov.toml")
    small = ("--steps", "2", "--quiet", "--set", "grid.shape=[16,16]", "--set", "output.every=2")
    rnd = ("--set", 'initial.kind="random"')
    code, _, err = _cli("run", tg, *small, *rnd, "--out", str(tmp_path / "a.nc"))
    assert code == 2 and "initial.wavenumber" in err  # the file's key is unknown to "random"
    code, _, err = _cli(
        "run", tg, *small, *rnd, "--unset", "initial.wavenumber", "--unset", "initial.amplitude",
        "--out", str(tmp_path / "a.nc"),
    )  # fmt: skip
    assert code == 0, err
    runs = {}
    for name, extra in (
        ("off", ("--unset", "forcing")),
        ("zero", ("--set", "forcing.amplitude=0.0")),
    ):
        out = tmp_path / f"{name}.nc"
        code, _, err = _cli("run", kol, *small, *extra, "--out", str(out))
        assert code == 0, err
        with h5py.File(out) as f:
            runs[name] = (f["vorticity"][()], f.attrs["config"].tobytes().decode())
    assert "[forcing]" not in runs["off"][1] and "[forcing]" in runs["zero"][1]
    np.testing.assert_array_equal(runs["off"][0], runs["zero"][0])  # default: no forcing
    code, _, err = _cli("run", tg, *small, "--unset", "initial.nope", "--out", str(tmp_path / "b"))
    assert code == 2 and "--unset" in err and "initial.nope" in err and "wavenumber" in err
    assert not (tmp_path / "b").exists()


def test_out_suffix_is_checked_for_grid_and_particle_runs(tmp_path):
    for config, out, allowed in (
        ("heat2d.toml", "x.h5md", ".nc, .nc4, .h5, .hdf5"),
        ("taylor_green.toml", "x.h5md", ".nc, .nc4, .h5, .hdf5"),
        ("heat2d.toml", "x.dat", ".nc, .nc4, .h5, .hdf5"),
        ("lj_melt.toml", "x.nc", ".h5md"),
        ("nbody_plummer.toml", "x.nc", ".h5md"),
    ):
        path = tmp_path / out
        code, _, err = _cli("run", str(ROOT / "experiments" / config), "--out", str(path))
        assert code == 2 and "--out" in err and allowed in err, (config, err)
        assert len(err.strip().splitlines()) == 1 and not path.exists()


def test_dir_lists_the_public_api_and_help_mentions_pm():
    import simpar

    public = [n for n in dir(simpar) if not n.startswith("_")]
    assert set(simpar.__all__) - {"__version__"} <= set(public)
    assert {"grid", "particles", "parallel", "io"} <= set(public)
    for name in public:
        assert getattr(simpar, name) is not None, name
    code, out, _ = _help("run")
    assert code == 0 and 'physics.force = "pm"' in out and "particle-mesh" in out


def _help(*args):
    import contextlib
    import io

    from simpar.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as o, pytest.raises(SystemExit) as e:
        main([*args, "--help"])
    return e.value.code, o.getvalue(), ""


def test_plot_uses_a_diverging_map_for_signed_fields_and_log_axes_for_spectra(
    tmp_path, monkeypatch, tg_run
):
    import numpy as np

    from simpar.io import plot

    figs = {}

    def keep(fig, out):
        figs[out.name] = fig
        return out

    monkeypatch.setattr(plot, "_save", keep)
    out = tmp_path / "heat2d.nc"
    code, _, err = _cli(
        "run", str(ROOT / "experiments/heat2d.toml"), *TG_SMALL, "--out", str(out)
    )  # fmt: skip
    assert code == 0, err
    for path in (tg_run[0], out):
        plot.plot_file(path)
    for name in ("taylor_green_vorticity.png", "taylor_green_u.png"):
        (im,) = figs[name].axes[0].images
        lo, hi = im.get_clim()
        assert im.get_cmap().name == "RdBu_r" and lo == -hi and hi > 0, name
    (im,) = figs["heat2d_u.png"].axes[0].images  # temperature >= 0: sequential
    assert im.get_cmap().name == "viridis" and im.get_clim()[0] >= 0
    ax = figs["taylor_green_spectrum.png"].axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    (line,) = ax.get_lines()
    assert np.all(np.asarray(line.get_xdata()) > 0)
    assert plot.color_scale([np.array([-1.0, 3.0])]) == ("RdBu_r", -3.0, 3.0)
    assert plot.color_scale([np.array([1.0, 3.0])]) == ("viridis", 1.0, 3.0)


def test_run_warns_once_when_the_poisson_source_has_a_mean(tmp_path, monkeypatch, tg_run):
    """The 2-D stream-function solve drops the vorticity's mean: simpar run says so, once."""
    import numpy as np

    from simpar.drive import spectral

    x = np.arange(16) * (2 * np.pi / 16)
    wave = np.sin(x)[:, None] * np.cos(x)[None, :]
    assert spectral.source_mean_warning(wave, "f", "1") is None  # zero mean to round-off
    assert spectral.source_mean_warning(wave.astype(np.float32), "f", "1") is None
    assert "mean 1.5 " in spectral.source_mean_warning(1.5 + wave, "f", "1")
    assert "warning" not in tg_run[1], tg_run[1]  # taylor_green: zero mean, no warning
    args = ("run", str(ROOT / "experiments/taylor_green.toml"), *TG_SMALL)
    initial = spectral._initial
    monkeypatch.setattr(spectral, "_initial", lambda *a: (initial(*a)[0] + 1.5, None))
    code, _, err = _cli(*args, "--out", str(tmp_path / "b.nc"))
    assert code == 0, err
    (line,) = [ln for ln in err.splitlines() if "warning" in ln]
    assert "initial vorticity has mean 1.5 s-1" in line and "drops the mean" in line


def test_train_surrogate_creates_its_default_data_folder(tmp_path, monkeypatch):
    """On a fresh clone (no data/runs) the default --data is accepted and its folder made; a
    folder the user names must exist (nothing is created elsewhere)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "train_surrogate", ROOT / "experiments" / "train_surrogate.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.chdir(tmp_path)
    args = mod.parse_args([])
    assert args.data == "data/runs/surrogate_heat.nc"
    assert (tmp_path / "data" / "runs").is_dir() and not (tmp_path / args.data).exists()
    with pytest.raises(SystemExit) as e:
        mod.parse_args(["--data", "elsewhere/x.nc"])
    assert e.value.code == 2 and not (tmp_path / "elsewhere").exists()


ARGON = {"sigma": 3.405, "epsilon": 0.2381, "mass": 39.948}  # Angstrom, kcal/mol, g/mol


def test_lj_physical_units_open_in_mdanalysis_and_equal_the_reduced_run(tmp_path):
    """[units] style = "real" / "metal": the H5MD file holds the reduced run's values times
    sigma, tau, ... (argon), labelled so that MDAnalysis.Universe(path) converts them."""
    import warnings

    import h5py
    import MDAnalysis
    import numpy as np

    lj = str(ROOT / "experiments/lj_melt.toml")
    base = ["--steps", "10", "--quiet", "--set", "system.cells=[4,4,4]"]
    base += ["--set", "output.every=5", "--set", "output.force=true"]
    eps_metal = ARGON["epsilon"] * 4184.0 / 96485.33212  # the same argon in eV
    styles = {
        "lj": [],
        "real": [f"units.{k}={v}" for k, v in {"style": '"real"', **ARGON}.items()],
        "metal": [f"units.{k}={v}" for k, v in
                  {"style": '"metal"', **ARGON, "epsilon": eps_metal}.items()],
    }  # fmt: skip
    for style, sets in styles.items():
        args = [a for s in sets for a in ("--set", s)]
        code, _, err = _cli("run", lj, *base, *args, "--out", str(tmp_path / f"{style}.h5md"))
        assert code == 0, err
    n_a, kb = 6.02214076e23, 1.380649e-23
    eps_j = ARGON["epsilon"] * 4184.0 / n_a
    tau_ps = 3.405e-10 * np.sqrt(39.948e-3 / n_a / eps_j) * 1e12
    assert tau_ps == pytest.approx(2.156, rel=1e-3) and eps_j / kb == pytest.approx(119.8, rel=1e-3)
    traj = "particles/trajectory/"
    with h5py.File(tmp_path / "lj.h5md") as f:
        red = {k: f[k][()] for k in (traj + "position/value", traj + "velocity/value",
               traj + "force/value", traj + "box/edges/value", traj + "position/time",
               "observables/temperature/value", "observables/total_energy/value",
               "observables/pressure/value")}  # fmt: skip
        assert "unit" not in f[traj + "position/value"].attrs  # reduced: unlabelled
    for style, energy, force_kj in (("real", 0.2381, 4.184), ("metal", eps_metal, 96.48533212)):
        factors = {
            traj + "position/value": 3.405,
            traj + "box/edges/value": 3.405,
            traj + "velocity/value": 3.405 / tau_ps,
            traj + "force/value": energy / 3.405 * (1.0 if style == "real" else force_kj),
            traj + "position/time": tau_ps,
            "observables/temperature/value": eps_j / kb,
            "observables/total_energy/value": energy,
            "observables/pressure/value": eps_j
            / 3.405e-10**3
            / (101325.0 if style == "real" else 1e5),
        }
        path = tmp_path / f"{style}.h5md"
        with h5py.File(path) as f:
            assert f["h5md/modules/units"].attrs["system"] == style
            for key, factor in factors.items():
                np.testing.assert_allclose(f[key][()], red[key] * factor, rtol=1e-9, err_msg=key)
            assert f[traj + "position/value"].attrs["unit"] == "Angstrom"
            assert f[traj + "position/time"].attrs["unit"] == "ps"
            assert f["observables/temperature/value"].attrs["unit"] == "K"
            assert f["observables/total_energy/value"].attrs["unit"] == (
                "kcal mol-1" if style == "real" else "eV"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no types to guess masses from
            u = MDAnalysis.Universe(str(path))  # no extra arguments
        assert u.trajectory.units == {
            "time": "ps", "length": "Angstrom", "velocity": "Angstrom/ps",
            "force": "kcal/(mol*Angstrom)" if style == "real" else "kJ/(mol*Angstrom)",
        }  # fmt: skip
        u.trajectory[-1]
        pos, vel, frc = (red[traj + e + "/value"][-1] for e in ("position", "velocity", "force"))
        np.testing.assert_allclose(u.atoms.positions, pos * 3.405, rtol=1e-6)
        np.testing.assert_allclose(u.atoms.velocities, vel * 3.405 / tau_ps, rtol=1e-5)
        f_kj = frc * energy / 3.405 * force_kj  # MDAnalysis's force unit: kJ/(mol A)
        np.testing.assert_allclose(u.atoms.forces, f_kj, rtol=1e-5, atol=1e-5 * abs(f_kj).max())
        assert u.trajectory.ts.time == pytest.approx(
            red[traj + "position/time"][-1] * tau_ps, rel=1e-9
        )
    code, _, err = _cli("run", lj, *base, "--set", 'units.style="real"', "--out",
                        str(tmp_path / "x.h5md"))  # fmt: skip
    assert code == 2 and "units.sigma" in err and not (tmp_path / "x.h5md").exists()
    # --resume appends converted frames too (the factors are read back from the file)
    real = [a for s in styles["real"] for a in ("--set", s)]
    part = str(tmp_path / "part.h5md")
    short = [a if a != "10" else "5" for a in base]
    assert _cli("run", lj, *short, *real, "--out", part)[0] == 0
    assert _cli("run", lj, *base, *real, "--out", part, "--resume")[0] == 0
    with h5py.File(part) as a, h5py.File(tmp_path / "real.h5md") as b:
        for key in (traj + "position/value", traj + "position/time", "observables/pressure/value"):
            np.testing.assert_array_equal(a[key][()], b[key][()])
    # a physical-units file cannot seed a reduced run
    code, _, err = _cli(
        "run", lj, *base, "--set", 'system.init="h5md"', "--set",
        f"system.file={str(tmp_path / 'real.h5md')!r}", "--out", str(tmp_path / "y.h5md"),
    )  # fmt: skip
    assert code == 2 and "system.file" in err and "'real' units" in err, err
