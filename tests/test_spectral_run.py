"""``spectral_ns`` through ``simpar run``: the netCDF file, every engine = single, resume, errors.

Small grids (32^2, float64) so the file runs in well under a minute: the Taylor-Green vortex
of ``experiments/taylor_green.toml`` against the exact decay, the Kolmogorov flow of
``experiments/kolmogorov.toml`` (random initial field, forcing, drag: the nonlinear term is
active) on ``pmap``, ``shard_map`` and ``sharded`` against ``single`` on meshes (8,) and (2, 4),
a SIGKILLed run resumed bit for bit, and the exit codes of bad input (2) and a blown-up run (1).
"""

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

from simpar.cli import main
from simpar.drive.loop import KILL_ENV
from simpar.grid import spectral_ns as S
from simpar.grid import spectral_ns3d as S3
from simpar.io.meta import SUMMARY_KEYS

ROOT = Path(__file__).resolve().parents[1]
TG = str(ROOT / "experiments/taylor_green.toml")
KOLMOGOROV = str(ROOT / "experiments/kolmogorov.toml")
SMALL = ["grid.shape=[32,32]"]
CUBE = ["grid.shape=[16,16,16]", f"grid.length=[{math.pi * 2!r}, {math.pi * 2!r}, {math.pi * 2!r}]"]


def _run(config, out, *extra, sets=(), steps=8, every=4):
    """``simpar run`` in this process: (exit code, summary or None, stderr)."""
    args = ["run", config, "--out", str(out), "--steps", str(steps), "--quiet", *extra]
    for s in [*SMALL, f"output.every={every}", *sets]:
        args += ["--set", s]
    with (
        contextlib.redirect_stdout(io.StringIO()) as o,
        contextlib.redirect_stderr(io.StringIO()) as e,
    ):
        code = main(args)
    lines = o.getvalue().strip().splitlines()
    return code, (json.loads(lines[-1]) if code == 0 else None), e.getvalue()


def _open(path):
    return xr.open_dataset(path, engine="h5netcdf")


def test_taylor_green_file_matches_the_exact_decay(tmp_path):
    """The stored vorticity, velocity and energy equal the exact solution; the file has the
    grid layout (CF attributes, XDMF sidecar) and the spectrum with its ``k`` coordinate."""
    out = tmp_path / "tg.nc"
    code, s, err = _run(TG, out, steps=200, every=50)
    assert code == 0, err
    assert tuple(s) == SUMMARY_KEYS
    assert (s["model"], s["engine"], s["frames"], s["run_status"]) == (
        "spectral_ns", "single", 5, "complete"
    )  # fmt: skip
    nu, dt, shape = 0.01, 0.01, (32, 32)
    with _open(out) as ds:
        assert ds.vorticity.dims == ("time", "y", "x") and ds.spectrum.dims == ("time", "k")
        assert ds.attrs["run_status"] == "complete" and ds.attrs["model"] == "spectral_ns"
        assert ds.vorticity.attrs["units"] == "s-1" and ds.u.attrs["units"] == "m s-1"
        assert ds.spectrum.attrs["long_name"] and ds.k.attrs["units"] == "m-1"
        np.testing.assert_array_equal(ds.step.values, [0, 50, 100, 150, 200])
        t = ds.time.values
        np.testing.assert_allclose(t, ds.step.values * dt, rtol=1e-15)
        # the scheme integrates the (only) Fourier mode exactly: round-off is the tolerance
        exact = S.taylor_green(shape, nu=nu, t=t[-1]).T  # file order (y, x)
        w = ds.vorticity.values[-1]
        np.testing.assert_allclose(w, exact, rtol=0, atol=1e-12 * np.abs(exact).max())
        assert np.abs(w - S.taylor_green(shape).T).max() > 1e-3  # it did decay
        x, y = ds.x.values[None, :], ds.y.values[:, None]
        g = math.exp(-2 * nu * t[-1])
        np.testing.assert_allclose(ds.u.values[-1], np.cos(x) * np.sin(y) * g, atol=1e-12)
        np.testing.assert_allclose(ds.v.values[-1], -np.sin(x) * np.cos(y) * g, atol=1e-12)
        np.testing.assert_allclose(ds.energy.values, 0.25 * np.exp(-4 * nu * t), rtol=1e-12)
        np.testing.assert_allclose(ds.enstrophy.values, 0.5 * np.exp(-4 * nu * t), rtol=1e-12)
        spec = ds.spectrum.values
        np.testing.assert_allclose(spec.sum(axis=1), ds.energy.values, rtol=1e-12)
        assert np.argmax(spec[-1]) == 1 and ds.k.values[1] == pytest.approx(1.0)  # |k| = sqrt 2
    xdmf = Path(str(out) + ".xdmf").read_text()
    for name in ("vorticity", "u", "v"):
        assert f'Name="{name}"' in xdmf
    assert 'Name="spectrum"' not in xdmf and xdmf.count("<Time ") == 5


@pytest.mark.slow  # fast tier: test_spectral_ns.py::test_every_engine_equals_single
def test_every_engine_equals_single_through_the_cli(tmp_path):
    """Turbulent Kolmogorov flow (random field, forcing, drag) on every engine and on the
    meshes (8,) (slab) and (2, 4) equals single to 1e-12 (float64)."""
    sets = ["initial.energy=0.5"]
    code, _, err = _run(KOLMOGOROV, tmp_path / "single.nc", sets=sets)
    assert code == 0, err
    with _open(tmp_path / "single.nc") as ref:
        ref = ref.load()
    w0 = ref.vorticity.values[0]
    assert np.abs(ref.vorticity.values[-1] - w0).max() > 1e-2 * np.abs(w0).max()  # it moved
    for mesh in ("8", "2x4"):
        for engine in ("pmap", "shard_map", "sharded"):
            out = tmp_path / f"{engine}_{mesh}.nc"
            code, s, err = _run(KOLMOGOROV, out, "--engine", engine, "--mesh", mesh, sets=sets)
            assert code == 0, (engine, mesh, err)
            assert s["engine"] == engine and math.prod(s["mesh"]) == 8
            with _open(out) as ds:
                for name in ("vorticity", "u", "v"):
                    a, b = ds[name].values, ref[name].values
                    np.testing.assert_allclose(
                        a, b, rtol=0, atol=1e-12 * np.abs(b).max(), err_msg=f"{engine} {name}"
                    )
                for name in ("energy", "enstrophy", "max_speed", "cfl", "spectrum"):
                    np.testing.assert_allclose(
                        ds[name].values, ref[name].values, rtol=1e-12, atol=1e-14,
                        err_msg=f"{engine} {mesh} {name}",
                    )  # fmt: skip


def _datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda n, o: (
                out.__setitem__(n, o[()])
                if isinstance(o, h5py.Dataset) and o.dtype.kind != "O"
                else None
            )
        )
    return out


@pytest.mark.slow
def test_resume_after_sigkill_is_bitwise_on_shard_map(tmp_path):
    """Killed after frame 2 (step 4), resumed: the file equals an uninterrupted run."""
    extra = ["--engine", "shard_map", "--mesh", "2x4"]
    ref, part = tmp_path / "ref.nc", tmp_path / "part.nc"
    code, _, err = _run(KOLMOGOROV, ref, *extra, steps=12)
    assert code == 0, err
    args = ["run", KOLMOGOROV, "--out", str(part), "--steps", "12", "--quiet", *extra]
    for s in [*SMALL, "output.every=4"]:
        args += ["--set", s]
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{KILL_ENV: "2"})
    killed = subprocess.run(
        [sys.executable, "-m", "simpar", *args, "--devices", "8"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with h5py.File(part, "r") as f:
        assert list(f["step"][:]) == [0, 4]
    with h5py.File(str(part) + ".ckpt", "r") as f:
        assert sorted(f["state"]) == ["vorticity_hat_im", "vorticity_hat_re"]
        assert f["state/vorticity_hat_re"].shape == (32, 17)
    code, s, err = _run(KOLMOGOROV, part, *extra, "--resume", steps=12)
    assert code == 0, err
    assert (s["resumed_from"], s["frames"], s["run_status"]) == (4, 4, "complete")
    a, b = _datasets(ref), _datasets(part)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)
    xdmf = Path(str(part) + ".xdmf").read_text()
    assert xdmf.count("<Time ") == 4 and 'Name="spectrum"' not in xdmf  # k is not a mesh axis
    assert xdmf.replace("part.nc", "ref.nc") == Path(str(ref) + ".xdmf").read_text()


@pytest.mark.parametrize(
    "config, extra, sets, key",
    [
        (TG, ["--engine", "pmap", "--mesh", "8"], ["grid.shape=[36,36]"], "--mesh"),
        (TG, ["--engine", "sharded"], ["parallel.mesh=[3]"], "parallel.mesh"),
        (TG, ["--engine", "shard_map", "--mesh", "2x2x2"], [], "--mesh"),
        (TG, [], ["time.dt=0.2"], "time.dt"),
        (TG, [], ["physics.scheme='rk4'", "physics.viscosity=10.0"], "time.dt"),
        (TG, [], ["physics.viscosty=0.1"], "physics.viscosty"),
        (TG, [], ["initial.kind='vortex'"], "initial.kind"),
        (TG, [], ["initial.wavenumber=11"], "initial.wavenumber"),
        (TG, [], ["grid.shape=[16,16,16,16]"], "grid.shape"),
        (TG, [], ["grid.shape=[16,16,16]"], "grid.length"),
        (TG, [], [*CUBE, "initial.wavenumber=2"], "initial.wavenumber"),
        (TG, [], ["output.fields=['pressure']"], "output.fields"),
        (KOLMOGOROV, [], ["forcing.kind='shear'"], "forcing.kind"),
        (KOLMOGOROV, [], ["physics.viscosity=-1.0"], "physics.viscosity"),
    ],
)
def test_bad_input_exits_2_naming_the_key(tmp_path, config, extra, sets, key):
    out = tmp_path / "bad.nc"
    code, _, err = _run(config, out, *extra, sets=sets)
    assert code == 2, err
    assert key in err, err
    assert not out.exists()


def test_a_blown_up_run_exits_1_with_the_step_and_the_settings(tmp_path):
    out = tmp_path / "nan.nc"
    sets = ["forcing.amplitude=1e5", "forcing.wavenumber=2"]
    code, _, err = _run(KOLMOGOROV, out, sets=sets, steps=200, every=50)
    assert code == 1, err
    assert "run failed at step 50" in err and "non-finite" in err, err
    assert "time.dt" in err and "physics.viscosity" in err, err
    with h5py.File(out, "r") as f:
        assert list(f["step"][:]) == [0]
        assert f.attrs["run_status"].decode().startswith("failed")


ABC = [*CUBE, "initial.kind='abc'", "physics.viscosity=0.05", "time.dt=0.02"]


@pytest.mark.slow
def test_abc_flow_in_3d_decays_exactly_through_the_cli(tmp_path):
    """The ABC (Beltrami) flow: only viscosity acts, u(t) = u(0) exp(-nu t)."""
    out = tmp_path / "abc.nc"
    code, s, err = _run(TG, out, sets=ABC, steps=40, every=20)
    assert code == 0, err
    with _open(out) as ds:
        assert ds.u.dims == ("time", "z", "y", "x") and ds.spectrum.dims == ("time", "k")
        assert {"vorticity_x", "vorticity_y", "vorticity_z", "w", "helicity"} <= set(ds)
        t = ds.time.values[-1]
        exact = S3.abc_flow((16, 16, 16), nu=0.05, t=t)  # (3, x, y, z)
        for i, name in enumerate("uvw"):
            np.testing.assert_allclose(
                ds[name].values[-1], exact[i].T, rtol=0, atol=1e-12, err_msg=name
            )
        # curl u = u: the vorticity equals the velocity
        np.testing.assert_allclose(ds.vorticity_x.values[-1], exact[0].T, atol=1e-12)
        e0 = ds.energy.values[0]
        np.testing.assert_allclose(ds.energy.values, e0 * np.exp(-2 * 0.05 * ds.time.values))
        assert np.all(ds.divergence_bound.values < 1e-12)
    assert Path(str(out) + ".xdmf").read_text().count('Name="w"') == 3


@pytest.mark.slow
def test_3d_every_engine_equals_single_through_the_cli(tmp_path):
    """3-D Taylor-Green (nonlinear: it transitions) on a pencil (2, 4) and a slab (8,)."""
    sets = [*CUBE, "physics.viscosity=0.02", "time.dt=0.05"]
    code, _, err = _run(TG, tmp_path / "single.nc", sets=sets, steps=6, every=3)
    assert code == 0, err
    with _open(tmp_path / "single.nc") as ref:
        ref = ref.load()
    assert np.abs(ref.w.values[-1]).max() > 1e-4  # w = 0 at t = 0: the nonlinear term acts
    for engine, mesh in (("shard_map", "2x4"), ("sharded", "8")):  # pmap: 2-D test
        out = tmp_path / f"{engine}.nc"
        extra = ("--engine", engine, "--mesh", mesh)
        code, _, err = _run(TG, out, *extra, sets=sets, steps=6, every=3)
        assert code == 0, (engine, err)
        with _open(out) as ds:
            for name in ("u", "v", "w", "vorticity_z", "energy", "helicity", "spectrum"):
                b = ref[name].values
                np.testing.assert_allclose(
                    ds[name].values, b, rtol=0, atol=1e-12 * np.abs(b).max() + 1e-15,
                    err_msg=f"{engine} {name}",
                )  # fmt: skip


@pytest.mark.parametrize("engine", ["sharded", pytest.param("shard_map", marks=pytest.mark.slow)])
def test_the_adapters_chunk_program_moves_only_the_transposes(engine):
    """The compiled chunk (a ``fori_loop`` of RK4 steps) of the adapter on a (2, 4) mesh:
    8 transforms per step, each ``n_transposes`` all-to-alls, and no other collective."""
    import jax.numpy as jnp

    from simpar import config
    from simpar.config import Section
    from simpar.drive import spectral
    from simpar.drive.loop import Options
    from simpar.parallel.hlo import count

    data, text = config.load(KOLMOGOROV, SMALL)
    plan = spectral.plan(Section(data), Options(engine=engine, mesh=(2, 4)), text)
    run = plan.build(None)
    hlo = run._advance.lower(run.state, run.params, jnp.asarray(3, jnp.int32)).compile()
    n = count(hlo.as_text())
    assert n["all-to-all"] == 8 * plan.eng.plan.n_transposes, n
    assert n["all-gather"] == n["collective-permute"] == n["all-reduce"] == 0, n
