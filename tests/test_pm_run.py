"""The N-body driver mode ``physics.force = "pm"`` through ``simpar run``.

Every engine equals ``single`` (positions, velocities of every frame) on meshes (8,) and (2, 4);
the plane-wave experiment follows the exact linear Jeans growth; the cosmic-web experiment
forms structure and ``simpar plot`` draws its projected density; a run killed after a frame and
``--resume``d equals an uninterrupted one bit for bit (the scenario of tests/test_drive.py);
bad input is a ConfigError (exit 2) naming the key; overflows regrow pm.capacity / pm.migrate
(a line says so) and lost particles are errors naming the step and the setting to change.
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

from simpar.cli import main
from simpar.drive.loop import KILL_ENV
from simpar.io.plot import projected_density
from simpar.particles.pm_ics import lattice

ROOT = Path(__file__).resolve().parents[1]
WEB = str(ROOT / "experiments/pm_cosmic_web.toml")
WAVE = str(ROOT / "experiments/pm_plane_wave.toml")
SMALL = [  # 512 particles on a 16^3 mesh, 12 steps, frames every 4
    "particles.lattice=[8,8,8]", "physics.pm_mesh=[16,16,16]", "initial.sigma=0.05",
    "time.dt=0.05", "output.every=4",
]  # fmt: skip


def _main(args):
    """``simpar.cli.main`` in this process: (exit code, stdout, stderr)."""
    with (
        contextlib.redirect_stdout(io.StringIO()) as o,
        contextlib.redirect_stderr(io.StringIO()) as e,
    ):
        code = main(args)
    return code, o.getvalue(), e.getvalue()


def _run(out, *extra, config=WEB, sets=SMALL, steps=12):
    args = ["run", config, "--out", str(out), "--steps", str(steps), "--quiet", *extra]
    for s in sets:
        args += ["--set", s]
    return _main(args)


def _frames(path):
    with h5py.File(path, "r") as f:
        t = f["particles/trajectory"]
        return (t["position/step"][:], t["position/value"][:], t["velocity/value"][:],
                t["position/time"][:])  # fmt: skip


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("pm") / "single.h5md"
    code, stdout, err = _run(out)
    assert code == 0, err
    return out, json.loads(stdout)


@pytest.mark.parametrize(
    "engine,mesh",
    [
        pytest.param("pmap", "8", marks=pytest.mark.slow),  # the fast tier stays short
        pytest.param("pmap", "2x4", marks=pytest.mark.slow),
        ("shard_map", "2x4"),
        pytest.param("sharded", "8", marks=pytest.mark.slow),
    ],
)
def test_engine_equals_single_through_simpar_run(engine, mesh, single, tmp_path):
    ref, s_ref = single
    out = tmp_path / f"{engine}.h5md"
    code, stdout, err = _run(out, "--engine", engine, "--devices", "8", "--mesh", mesh)
    assert code == 0, err
    s = json.loads(stdout)
    assert s["mesh"] == [int(m) for m in mesh.split("x")] and s["frames"] == 4
    steps, pos, vel, _ = _frames(out)
    r_steps, r_pos, r_vel, _ = _frames(ref)
    np.testing.assert_array_equal(steps, r_steps)
    np.testing.assert_allclose(pos, r_pos, rtol=0, atol=1e-12)
    np.testing.assert_allclose(vel, r_vel, rtol=0, atol=1e-12)
    for key in ("kinetic_energy", "potential_energy"):
        assert s["final"][key] == pytest.approx(s_ref["final"][key], rel=1e-12)


def test_output_is_h5md_with_a_periodic_box_and_momentum_conserved(single):
    out, s = single
    with h5py.File(out, "r") as f:
        box = f["particles/trajectory/box"]
        assert [b.decode() if isinstance(b, bytes) else b for b in box.attrs["boundary"]] == [
            "periodic"
        ] * 3
        np.testing.assert_array_equal(box["edges/value"][-1], [1.0, 1.0, 1.0])
        assert f["parameters"].attrs["force"] == "pm"
        obs = f["observables"]
        assert set(obs) >= {"kinetic_energy", "potential_energy", "total_energy",
                            "momentum", "density_contrast"}  # fmt: skip
        assert obs["momentum/value"].shape == (4, 3)
    import MDAnalysis

    u = MDAnalysis.Universe(str(out), n_atoms=512, convert_units=False)  # N-body units
    assert len(u.trajectory) == 4
    np.testing.assert_array_equal(u.dimensions, [1.0, 1.0, 1.0, 90.0, 90.0, 90.0])
    assert s["rate_unit"] == "particle_steps/s" and s["details"]["force"] == "pm"
    assert s["details"]["momentum_max_abs"] < 1e-15


def test_plane_wave_experiment_follows_cosh_until_shell_crossing(tmp_path):
    """experiments/pm_plane_wave.toml as shipped (64 x 4 x 4, t = 3, A k: 0.05 -> 0.5):
    the displacement amplitude equals A0 cosh(t) within 1% at every frame (measured 0.25%)."""
    out = tmp_path / "pw.h5md"
    code, _, err = _run(out, config=WAVE, sets=[], steps=300)
    assert code == 0, err
    steps, pos, _, time = _frames(out)
    q = lattice((64, 4, 4), (1.0, 1.0, 1.0))
    k = 2 * math.pi
    errs = []
    for x, t in zip(pos, time, strict=True):
        psi = x[:, 0] - q[:, 0]
        psi -= np.round(psi)
        amp = 2 * np.mean(psi * np.sin(k * q[:, 0]))
        errs.append(abs(amp / (0.05 / k * math.cosh(t)) - 1))
    print("plane wave: relative amplitude error per frame", np.round(errs, 5))
    assert time[-1] == pytest.approx(3.0) and max(errs) < 0.01


@pytest.mark.slow
def test_cosmic_web_grows_structure_and_plot_draws_the_projected_density(tmp_path):
    """pm_cosmic_web.toml at 16^3 particles / mesh to t = 5: the projected density's
    max/mean grows at least 3-fold (measured 1.0 -> 25.5) and the PNG is written."""
    out = tmp_path / "web.h5md"
    sets = ["particles.lattice=[16,16,16]", "physics.pm_mesh=[16,16,16]"]
    code, stdout, err = _run(out, sets=sets, steps=250)
    assert code == 0, err
    _, pos, _, _ = _frames(out)
    first, last = (projected_density(p, (1.0, 1.0), (16, 16)) for p in (pos[0], pos[-1]))
    print("projected max/mean", first.max(), "->", last.max())
    assert last.max() > 3 * first.max()
    assert json.loads(stdout)["final"]["density_contrast"] > 10
    code, stdout, err = _main(["plot", str(out)])
    assert code == 0, err
    png = tmp_path / "web_density.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _killed(args, kill_after):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{KILL_ENV: str(kill_after)})
    return subprocess.run(
        [sys.executable, "-m", "simpar", *args, "--devices", "8"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip


def _datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset)
                     and o.dtype.kind != "O" else None)  # fmt: skip
    return out


@pytest.mark.parametrize(
    "engine", [pytest.param(e, marks=pytest.mark.slow) for e in ("single", "pmap")]
)
def test_resume_after_sigkill_equals_an_uninterrupted_run_bitwise(engine, tmp_path, single):
    ref, part = tmp_path / "ref.h5md", tmp_path / "part.h5md"
    eng = ["--engine", engine, "--mesh", "2x4"] if engine != "single" else []
    if engine == "single":
        ref = single[0]
    else:
        code, _, err = _run(ref, *eng, "--devices", "8")
        assert code == 0, err
    args = ["run", WEB, "--out", str(part), "--steps", "12", "--quiet", *eng]
    for s in SMALL:
        args += ["--set", s]
    killed = _killed(args, 2)  # frames at steps 0 and 4, then SIGKILL
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with h5py.File(part, "r") as f:
        assert list(f["particles/trajectory/position/step"][:]) == [0, 4]
    code, stdout, err = _main([*args, "--resume"])
    assert code == 0, err
    assert json.loads(stdout)["resumed_from"] == 4
    a, b = _datasets(ref), _datasets(part)
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize(
    "sets,extra,key,words",
    [
        (["physics.softening=0.1"], [], "physics.softening", "softened by the mesh"),
        (["physics.boundary='open'"], [], "physics.boundary", "periodic"),
        (["particles.n=100"], [], "particles.n", "particles.lattice"),
        (["physics.pm_mesh=[16,16]"], [], "physics.pm_mesh", "list of 3"),
        (["physics.pm_mesh=[2,16,16]"], [], "physics.pm_mesh", ">= 4"),
        (["initial.kind='plummer'"], [], "initial.kind", "zeldovich"),
        (["physics.box=[1.0,0.0,1.0]"], [], "physics.box", "> 0"),
        (
            ["physics.pm_mesh=[12,12,12]"],
            ["--engine", "pmap", "--devices", "8", "--mesh", "8"],
            "--mesh",
            "does not split",
        ),
        (["physics.force='fmm'"], [], "physics.force", "'direct', 'pm'"),
        (["pm.capacity=0"], [], "pm.capacity", ">= 1"),
    ],
)
def test_bad_input_is_a_config_error_naming_the_key(sets, extra, key, words, tmp_path):
    out = tmp_path / "bad.h5md"
    code, _, err = _run(out, *extra, sets=[*SMALL, *sets])
    assert code == 2, err
    assert key in err and words in err, err
    assert "Traceback" not in err and not out.exists()


def test_pm_keys_with_the_direct_force_are_refused(tmp_path):
    args = ["run", str(ROOT / "experiments/nbody_plummer.toml"), "--out",
            str(tmp_path / "x.h5md"), "--set", "physics.pm_mesh=[8,8,8]", "--quiet"]  # fmt: skip
    code, _, err = _main(args)
    assert code == 2 and "physics.pm_mesh" in err and "physics.force = 'pm'" in err, err


def test_a_too_small_capacity_is_regrown_with_a_line_saying_so(tmp_path, single):
    out = tmp_path / "c.h5md"
    code, stdout, err = _run(out, "--engine", "pmap", "--devices", "8", "--mesh", "8",
                             sets=[*SMALL, "pm.capacity=8"], steps=0)  # fmt: skip
    assert code == 0, err
    assert "nbody-pm: regrew pm.capacity 8 -> " in err and "at step 0" in err, err
    details = json.loads(stdout)["details"]
    assert details["regrows"] == 1 and details["pm_capacity"] > 8
    np.testing.assert_array_equal(_frames(out)[1][0], _frames(single[0])[1][0])


@pytest.mark.slow
def test_overflows_regrow_and_a_lost_particle_stops_the_run_at_its_step(tmp_path):
    out = tmp_path / "m.h5md"
    sets = [*SMALL, "pm.capacity=144", "pm.migrate=48", "time.dt=0.5", "initial.sigma=0.3"]
    code, _, err = _run(out, "--engine", "pmap", "--devices", "8", "--mesh", "8", sets=sets)
    assert code == 1 and "regrew pm.capacity 144 -> 216 (owned-particle capacity overflow at "\
        "step 3" in err, err
    # particles jump more than one slab per step: not repairable, the step it happened
    assert "run failed at step 4: " in err and "lost particles" in err, err
    assert "reduce time.dt" in err and "Last good output" in err, err


@pytest.mark.slow
def test_chunk_sizes_do_not_change_the_results_and_resume_keeps_the_cadence(
    tmp_path, monkeypatch, single
):
    """As tests/test_drive.py checks for every model: chunks cut by the wall-time clock give
    the frames of the uninterrupted run bit for bit; a resume with more steps keeps frames
    at the first step + multiples of output.every."""
    from simpar.drive import loop

    short = tmp_path / "short.h5md"
    sizes = []
    record = loop.ChunkClock.record
    monkeypatch.setattr(
        loop.ChunkClock, "record", lambda s, k, t: (sizes.append(k), record(s, k, t))
    )
    monkeypatch.setattr(loop, "CHUNK_SECONDS", 1e-9)  # every chunk "too long": 1 step each
    monkeypatch.setattr(loop, "PROBE_STEPS", 2)
    code, _, err = _run(short)
    assert code == 0, err
    assert sizes[0] == 2 and set(sizes[1:]) == {1}  # probe (an upper bound: too long), 1s
    a, b = _datasets(single[0]), _datasets(short)
    for name in a:
        if not name.startswith("parameters"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    monkeypatch.undo()
    code, stdout, err = _run(short, "--resume", steps=18)
    assert code == 0, err
    assert list(_frames(short)[0]) == [0, 4, 8, 12, 16, 18]
    assert json.loads(stdout)["frames"] == 6


def test_zeldovich_displacements_have_the_asked_density_contrast():
    """delta = -div Psi of the generated displacements has rms ``sigma`` (spectral divergence,
    Nyquist planes dropped), the same seed gives the same field, growing-mode v = omega Psi."""
    from simpar.particles import pm_ics

    n, box = (16, 8, 12), (1.0, 0.5, 0.75)
    pos, vel = pm_ics.zeldovich(n, box, seed=3, sigma=0.01, spectral_index=-2.0, omega=2.0)
    q = pm_ics.lattice(n, box)
    psi = pos - q
    psi -= np.asarray(box) * np.round(psi / np.asarray(box))
    np.testing.assert_allclose(vel, 2.0 * psi, rtol=0, atol=1e-15)
    div = np.zeros(n)
    for a in range(3):
        k = 2 * math.pi * np.fft.fftfreq(n[a], box[a] / n[a])
        shape = [1, 1, 1]
        shape[a] = n[a]
        f = np.fft.fftn(psi[:, a].reshape(n))
        div += np.real(np.fft.ifftn(1j * k.reshape(shape) * f))
    assert np.std(-div) == pytest.approx(0.01, rel=1e-9)
    again, _ = pm_ics.zeldovich(n, box, seed=3, sigma=0.01, spectral_index=-2.0, omega=2.0)
    np.testing.assert_array_equal(again, pos)
    assert pm_ics.growth_rate(1 / (4 * math.pi), 1.0, (1.0, 1.0, 1.0)) == pytest.approx(1.0)


@pytest.mark.slow
def test_bench_pm_cases_run_at_tiny_size():
    """The PM and ring cases of experiments/bench_fft.py and bench_gpu.py (bench_pm.py) run."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import bench_pm
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    pm = bench_pm.pm_case(8, 8, steps=1, repeats=1)
    assert pm["n"] == 512 and pm["particle_steps_per_s"] > 0
    ring = bench_pm.ring_within(10.0, n_max=512, steps=1)
    assert ring["largest_n"] == 512 and len(ring["measured"]) == 2
    fft = bench_pm.fft_case((8, 8, 16), repeats=1)
    assert fft["distributed"]["rfftn_float32"]["mesh"] == [8]
