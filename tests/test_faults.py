"""Faults a careful user or a hostile input meets (issue 10): outputs are created exclusively
and replaced by rename, full disks and write errors stop a run with exit 1 and intact earlier
frames, bad values never reach a run (exit 2 naming the key), runs that cannot fit in memory
are refused before allocating, and a seeded fuzz of bad configs across every experiment.
SIGTERM and SIGINT: tests/test_signals.py.

Disk-full tests use a real size-limited tmpfs (the tests run as root, in CI too; mounting is
asserted, never skipped) and, deterministically, an injected ``ENOSPC``.
"""

import contextlib
import errno
import glob
import json
import os
import random
import subprocess
import sys
import time
import tomllib
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar import config as cfgmod
from simpar.cli import main
from simpar.config import Section
from simpar.io import checkpoint, files
from simpar.io.h5md import H5MDWriter
from simpar.io.netcdf import GridWriter, open_frames, read_attrs

ROOT = Path(__file__).resolve().parents[1]
HEAT = str(ROOT / "experiments/heat2d.toml")
LJ = str(ROOT / "experiments/lj_melt.toml")
NBODY = str(ROOT / "experiments/nbody_plummer.toml")
SMALL_HEAT = ["--set", "grid.shape=[64,64]", "--set", "time.dt=5e-5", "--set", "output.every=2"]
SMALL_LJ = ["--set", "system.cells=[4,4,4]", "--set", "output.every=5"]
SMALL_NBODY = ["--set", "particles.n=64", "--set", "output.every=2"]


def _main(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def _debris(directory):
    return sorted(p for p in os.listdir(directory) if "simpar-tmp" in p or p.endswith(".tmp"))


@contextlib.contextmanager
def _tmpfs(path, size, ro=False):
    """A size-limited tmpfs at ``path`` (root required: asserted, never skipped)."""
    assert os.geteuid() == 0, "the disk-full tests mount a tmpfs and need root (CI runs as root)"
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if ro else "")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True
    )
    assert r.returncode == 0, f"mount -t tmpfs failed: {r.stderr!r}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _grid_writer(path, overwrite=False, n=8):
    x = np.arange(n) + 0.5
    return GridWriter(
        path,
        coords={"y": x, "x": x},
        variables={"u": {"dims": ("time", "y", "x")}},
        overwrite=overwrite,
    )


# --------------------------------------------------------------------------- 1. outputs
def test_overwrite_replaces_by_rename_and_never_truncates_an_open_file(tmp_path):
    path = tmp_path / "run.nc"
    with _grid_writer(path) as w:
        for k in range(3):
            w.append(k, k, {"u": np.full((8, 8), k, np.float32)})
    reader = h5py.File(path, "r")  # another process's view of the old output
    old_inode = os.stat(path).st_ino
    with _grid_writer(path, overwrite=True) as w:
        w.append(0, 0.0, {"u": np.full((8, 8), 7, np.float32)})
        assert os.stat(path).st_ino != old_inode  # a new file was renamed over the old one
        # the open handle still reads the complete old file
        np.testing.assert_array_equal(reader["u"][:, 0, 0], [0, 1, 2])
    reader.close()
    times, steps, values = open_frames(path)
    np.testing.assert_array_equal(values["u"][:, 0, 0], [7])
    assert _debris(tmp_path) == []


def test_creation_is_exclusive_when_the_output_appears_meanwhile(tmp_path, capsys, monkeypatch):
    out = tmp_path / "race.nc"
    real = files.remove_stale_temps

    def plant(path):  # a second run creates the file after our existence check
        Path(path).write_bytes(b"other run")
        return real(path)

    monkeypatch.setattr(files, "remove_stale_temps", plant)
    code, _, err = _main(capsys, "run", HEAT, "--out", str(out), "--steps", "2", *SMALL_HEAT)
    assert code == 2 and "--out" in err and "already exists" in err
    assert out.read_bytes() == b"other run"  # neither truncated nor shared


def test_particle_writer_never_shares_an_output_that_appeared_meanwhile(tmp_path, monkeypatch):
    out = tmp_path / "lj.h5md"
    real = files.remove_stale_temps

    def plant(path):  # the other LJ run created it after our existence check
        with h5py.File(path, "w") as f:
            f.attrs["owner"] = "other"
        return real(path)

    monkeypatch.setattr(files, "remove_stale_temps", plant)
    with pytest.raises(cfgmod.ConfigError, match="already exists"):
        H5MDWriter(out, 4)
    with h5py.File(out, "r") as f:
        assert f.attrs["owner"] == "other" and "particles" not in f


def test_planted_symlinks_are_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "run.nc"
    out.write_bytes(b"old")
    os.symlink(victim, files.temp_path(out))  # at this process's own temporary name
    with pytest.raises(Exception, match="temporary file"):
        _grid_writer(out, overwrite=True)
    ck = tmp_path / "run.nc.ckpt"
    os.symlink(victim, files.temp_path(ck))
    with pytest.raises(FileExistsError):
        checkpoint.save(ck, {"u": np.zeros(3)}, 1, "", "heat")
    # an existing checkpoint that is a symlink is replaced, not written through
    os.unlink(files.temp_path(ck))
    os.symlink(victim, ck)
    checkpoint.save(ck, {"u": np.ones(3)}, 2, "", "heat")
    assert victim.read_text() == "precious" and out.read_bytes() == b"old"
    assert not ck.is_symlink() and checkpoint.load(ck)[1] == 2


def test_stale_temporary_files_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    pid = int(dead.stdout)
    out = tmp_path / "run.nc"
    stale = files.temp_path(out).with_name(f".run.nc.{pid}.simpar-tmp")
    stale.write_bytes(b"half-written")
    alive = files.temp_path(out).with_name(f".run.nc.{os.getppid()}.simpar-tmp")
    alive.write_bytes(b"being written by a live process")
    with _grid_writer(out):
        pass
    assert not stale.exists() and alive.exists()


# --------------------------------------------------------------------------- 2. write errors
def _heat_frames(path):
    times, steps, values = open_frames(path)
    return steps, values["u"]


@pytest.mark.parametrize("checkpoints", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_disk_full_on_tmpfs_stops_grid_run_with_exit_1_and_intact_frames(
    tmp_path, capsys, checkpoints
):
    ref = tmp_path / "ref.nc"
    args = ["--set", "grid.shape=[256,256]", "--set", "time.dt=2e-6", "--set", "output.every=1"]
    args += ["--set", f"output.checkpoint={str(checkpoints).lower()}"]
    code, _, _ = _main(capsys, "run", HEAT, "--out", str(ref), "--steps", "30", *args, "--quiet")
    assert code == 0
    with _tmpfs(tmp_path / "small", "2m") as mnt:
        out = mnt / "run.nc"
        code, _, err = _main(capsys, "run", HEAT, "--out", str(out), "--steps", "30", *args)
        assert code == 1, err
        assert str(out) in err and "No space left on device" in err
        status = read_attrs(out)["run_status"]
        assert status.startswith("failed: ") and "No space left on device" in status
        steps, u = _heat_frames(out)
        ref_steps, ref_u = _heat_frames(ref)
        assert 1 <= len(steps) < 30
        np.testing.assert_array_equal(steps, ref_steps[: len(steps)])
        np.testing.assert_array_equal(u, ref_u[: len(steps)])  # every earlier frame, bitwise
        assert _debris(mnt) == []
        if checkpoints:
            state, step, _, _ = checkpoint.load(checkpoint.checkpoint_path(out))
            assert step == steps[-1]


def test_refused_run_on_a_full_disk_leaves_no_output(tmp_path, capsys):
    with _tmpfs(tmp_path / "full", "64k") as mnt:
        (mnt / "filler").write_bytes(b"\0" * (64 * 1024 - 4096))
        with contextlib.suppress(OSError):
            with open(mnt / "filler2", "wb") as fh:
                fh.write(b"\0" * 65536)
        out = mnt / "run.nc"
        code, _, err = _main(capsys, "run", HEAT, "--out", str(out), "--steps", "2", *SMALL_HEAT)
        assert code in (1, 2) and str(out) in err and "No space left on device" in err
        assert not out.exists() and _debris(mnt) == []


def _enospc_after(after):
    """A ``h5py.File.flush`` failing with ENOSPC from the ``after``-th call on."""
    real, calls = h5py.File.flush, [0]

    def flush(ds):
        calls[0] += 1
        if calls[0] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(ds)

    return flush


@pytest.mark.parametrize(
    "config,small,ext",
    [(HEAT, SMALL_HEAT, "nc"), (LJ, SMALL_LJ, "h5md"), (NBODY, SMALL_NBODY, "h5md")],
    ids=["grid", "lj", "nbody"],
)
def test_injected_write_error_exit_1_names_path_and_keeps_frames(
    tmp_path, capsys, monkeypatch, config, small, ext
):
    out = tmp_path / f"run.{ext}"
    # one flush per frame (and one per status change): fails mid-run
    monkeypatch.setattr(h5py.File, "flush", _enospc_after(5))
    code, _, err = _main(capsys, "run", config, "--out", str(out), "--steps", "40", *small)
    monkeypatch.undo()
    assert code == 1 and str(out) in err and "No space left on device" in err
    if ext == "nc":
        status = read_attrs(out)["run_status"]
        assert 1 <= len(open_frames(out)[0]) < 21
    else:
        with h5py.File(out, "r") as f:
            status = f["parameters"].attrs["run_status"]
            n = f["particles/trajectory/position/step"].shape[0]
            assert n >= 1
            assert np.all(np.isfinite(f["particles/trajectory/position/value"][:n]))
    assert status.startswith("failed: ") and "No space left on device" in status
    assert _debris(tmp_path) == []


# --------------------------------------------------------------------------- 4. bad values
@pytest.mark.parametrize(
    "config,key,value",
    [
        (HEAT, "time.dt", "nan"),
        (HEAT, "physics.diffusivity", "inf"),
        (HEAT, "initial.width", "-inf"),
        (LJ, "potential.cutoff", "nan"),
        (LJ, "time.dt", "inf"),
        (NBODY, "physics.softening", "nan"),
    ],
)
def test_nan_and_inf_refused_naming_the_key(tmp_path, capsys, config, key, value):
    out = tmp_path / ("x.nc" if config == HEAT else "x.h5md")
    code, _, err = _main(capsys, "run", config, "--out", str(out), "--set", f"{key}={value}")
    assert code == 2 and f"{key}: must be a finite number" in err
    assert not out.exists()


def test_section_get_refuses_non_finite_floats_for_python_callers():
    s = Section({"physics": {"d": float("nan"), "v": [1.0, float("inf")]}})
    with pytest.raises(cfgmod.ConfigError, match="physics.d: must be a finite"):
        s.section("physics").get("d")
    with pytest.raises(cfgmod.ConfigError, match="physics.v: must be a finite"):
        s.section("physics").get("v", length=2)


def test_bad_files_and_paths_exit_2_naming_the_path(tmp_path, capsys):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(Path(HEAT).read_bytes().replace(b"diffusion", b"diffusion \xe9t\xe9"))
    code, _, err = _main(capsys, "run", str(bad))
    assert code == 2 and str(bad) in err and "UTF-8" in err
    afile = tmp_path / "afile"
    afile.write_text("x")
    long_name = "a" * 300 + ".nc"
    cases = {
        str(afile / "x.nc"): "is a file, not a directory",
        str(tmp_path / long_name): "at most 255 bytes",
        "": "empty",
        str(tmp_path): "is a directory",
    }
    for out, message in cases.items():
        code, _, err = _main(capsys, "run", HEAT, "--out", out, "--steps", "2", *SMALL_HEAT)
        assert code == 2 and "--out" in err and message in err, (out, err)
    with _tmpfs(tmp_path / "ro", "1m", ro=True) as mnt:
        for config, ext in ((HEAT, "nc"), (LJ, "h5md"), (NBODY, "h5md")):
            out = str(mnt / f"sub/run.{ext}")
            code, _, err = _main(capsys, "run", config, "--out", out, "--steps", "2")
            assert code == 2 and str(mnt) in err and "not writable" in err, err
    assert sorted(os.listdir(tmp_path)) == ["afile", "latin1.toml", "ro"]


def test_devices_100000_refused_up_front(capsys):
    t0 = time.monotonic()
    code, _, err = _main(capsys, "run", HEAT, "--devices", "100000")
    assert code == 2 and "--devices" in err and time.monotonic() - t0 < 5


@pytest.mark.parametrize("boundary", ["boundary={}", None])
def test_lbm_without_a_lid_side_is_refused(tmp_path, capsys, boundary):
    cfg = tomllib.loads((ROOT / "experiments/cavity_re100.toml").read_text())
    if boundary is None:
        del cfg["boundary"]
    else:
        cfg["boundary"] = {}
    path = tmp_path / "nolid.toml"
    path.write_text(cfgmod.dumps(cfg))
    out = tmp_path / "c.nc"
    code, _, err = _main(capsys, "run", str(path), "--out", str(out))
    assert code == 2 and "boundary" in err and "lid" in err and not out.exists()


def _valid_h5md(path, n=32):
    rng = np.random.default_rng(0)
    with H5MDWriter(path, n, observables=(), rng_key=True, mass=np.ones(n)) as w:
        w.append(
            0, 0.0, rng.random((n, 3)) * 6, box=np.full(3, 6.0), velocity=rng.normal(size=(n, 3)),
            rng_key=np.zeros(2, np.uint32),
        )  # fmt: skip


def _mutate(path, how):
    with h5py.File(path, "a") as f:
        t = f["particles/trajectory"]
        if how == "no particles":
            del f["particles"]
        elif how == "no position":
            del t["position"]
        elif how == "no velocity":
            del t["velocity"]
        elif how == "nan position":
            t["position/value"][0, 3] = np.nan
        elif how == "inf velocity":
            t["velocity/value"][0, 1] = np.inf
        elif how == "zero box":
            t["box/edges/value"][0] = [6.0, 0.0, 6.0]
        elif how == "nan box":
            t["box/edges/value"][0] = [6.0, np.nan, 6.0]
        elif how == "2-d positions":
            del t["position/value"]
            t["position"].create_dataset("value", data=np.zeros((1, 32, 2)))
        elif how == "velocity shape":
            del t["velocity/value"]
            t["velocity"].create_dataset("value", data=np.zeros((1, 31, 3)))
        elif how == "no step":
            del t["position/step"]
        elif how == "string positions":
            del t["position/value"]
            t["position"].create_dataset("value", data=np.full((1, 32, 3), b"x"))
        elif how == "negative mass":
            t["mass"][0] = -1.0
        elif how == "not hdf5":
            pass


H5MD_FAULTS = [
    "no particles", "no position", "no velocity", "nan position", "inf velocity", "zero box",
    "nan box", "2-d positions", "velocity shape", "no step", "string positions", "negative mass",
    "not hdf5",
]  # fmt: skip


@pytest.mark.parametrize("how", H5MD_FAULTS)
def test_malformed_h5md_initial_state_exit_2_naming_the_dataset(tmp_path, capsys, how):
    src = tmp_path / "state.h5md"
    if how == "not hdf5":
        src.write_text("not an HDF5 file")
    else:
        _valid_h5md(src)
        _mutate(src, how)
    out = tmp_path / "out.h5md"
    code, _, err = _main(
        capsys, "run", LJ, "--out", str(out), "--steps", "2",
        "--set", "system.init=\"h5md\"", "--set", f"system.file=\"{src}\"",
        "--set", "potential.cutoff=2.0", "--set", "neighbors.skin=0.3",
    )  # fmt: skip
    assert code == 2 and "system.file" in err and str(src) in err, err
    expected = {
        "nan position": "position/value",
        "inf velocity": "velocity/value",
        "zero box": "box/edges",
        "nan box": "box/edges",
        "2-d positions": "position/value",
        "velocity shape": "velocity/value",
        "string positions": "position/value",
        "negative mass": "mass",
        "no velocity": "velocit",
    }.get(how)
    if expected:
        assert expected in err, err
    assert not out.exists()


# --------------------------------------------------------------------------- 5. memory
@pytest.mark.parametrize(
    "config,override,key",
    [
        (HEAT, "grid.shape=[400000,400000]", "grid.shape"),
        (LJ, "system.cells=[400,400,400]", "system.cells"),
        (NBODY, "particles.n=20000000", "particles.n"),
    ],
)
def test_runs_that_cannot_fit_are_refused_with_the_figures(tmp_path, capsys, config, override, key):
    out = tmp_path / ("x.nc" if config == HEAT else "x.h5md")
    tracemalloc.start()
    code, _, err = _main(capsys, "run", config, "--out", str(out), "--set", override)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert code == 2 and key in err and "may allocate" in err and "needs about" in err
    assert "limited by" in err  # which limit applied: free RAM, a cgroup or RLIMIT_AS
    assert peak < 64 * 2**20  # refused before allocating
    assert not out.exists()


def test_heat_4096_float32_set_up_peaks_below_3x_the_state():
    from simpar.run import grid_setup

    data, _ = cfgmod.load(HEAT, ["grid.shape=[4096,4096]", "time.dt=1e-9"])
    for kind in ("gaussian", "sine", "random"):
        data["initial"] = {"kind": kind}
        tracemalloc.start()
        setup = grid_setup(Section(data))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        state = setup.state["u"].nbytes
        assert state == 4096 * 4096 * 4 and setup.state["u"].dtype == np.float32
        assert peak <= 3 * state, (kind, peak / state)
        del setup


def test_peak_memory_in_every_summary(tmp_path, capsys):
    for config, small, ext in ((HEAT, SMALL_HEAT, "nc"), (NBODY, SMALL_NBODY, "h5md")):
        out = tmp_path / f"x.{ext}"
        code, stdout, _ = _main(capsys, "run", config, "--out", str(out), "--steps", "2", *small)
        summary = json.loads(stdout.strip().splitlines()[-1])
        assert code == 0 and summary["peak_memory_mib"] > 50


# --------------------------------------------------------------------------- 7. fuzz
_EXPERIMENTS = sorted(glob.glob(str(ROOT / "experiments/*.toml")))
_BAD_SCALARS = [float("nan"), float("inf"), float("-inf")]


def _leaves(data, prefix=()):
    for k, v in data.items():
        if isinstance(v, dict):
            yield from _leaves(v, (*prefix, k))
        else:
            yield (*prefix, k), v


def _bad_config(rng: random.Random, data: dict):
    """A copy of ``data`` with one fault that every model must refuse; (data, key)."""
    data = json.loads(json.dumps(data))
    leaves = [(p, v) for p, v in _leaves(data)]
    kind = rng.choice(["nonfinite", "nonfinite", "type", "unknown", "path"])
    if kind == "path":
        key = ("output", "path")
        value = rng.choice(["", "/etc/passwd/x.nc", "/proc/simpar/x.nc", "x" * 300 + ".nc"])
    elif kind == "unknown":
        tables = [k for k, v in data.items() if isinstance(v, dict) and k != "boundary"]
        key = (rng.choice(tables), rng.choice(["dtt", "shapes", "evry", "seeed", "bogus"]))
        value = 1
    else:
        numeric = [(p, v) for p, v in leaves if type(v) in (int, float)]
        path, v = rng.choice(numeric)
        key = path
        if kind == "nonfinite":
            value = rng.choice(_BAD_SCALARS)
        else:  # a string (or a table) where a number belongs
            value = rng.choice(["1.0e-3", "many", {"value": 1}])
    node = data
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = value
    return data, ".".join(key)


@pytest.mark.parametrize("total", [45, pytest.param(300, marks=pytest.mark.slow)])
def test_fuzz_bad_configs_every_experiment_exit_2_naming_the_key(tmp_path, capsys, total):
    """The full fuzz (300 mutations) in the slow tier, its first 45 in the fast tier; the
    spectral and PM models' own: tests/test_fuzz_models.py."""
    rng = random.Random(20261130)
    bases = {p: tomllib.loads(Path(p).read_text()) for p in _EXPERIMENTS}
    assert len(bases) >= 8
    seen = set()
    n = 0
    while n < total:
        exp = _EXPERIMENTS[n % len(_EXPERIMENTS)]
        data, key = _bad_config(rng, bases[exp])
        ext = ".h5md" if data["model"]["name"] in ("lj", "nbody") else ".nc"
        if key != "output.path":
            data.setdefault("output", {})["path"] = str(tmp_path / f"out{n}{ext}")
        cfg = tmp_path / "fuzz.toml"
        try:
            cfg.write_text(cfgmod.dumps(data))
        except TypeError:
            continue
        code, _, err = _main(capsys, "run", str(cfg), "--steps", "2")
        # the key (or, for a value inside an inline table, its table) is named
        named = any(".".join(key.split(".")[:i]) in err for i in range(2, key.count(".") + 2))
        assert code == 2 and named, (exp, key, err)
        assert sorted(os.listdir(tmp_path)) == ["fuzz.toml"], (exp, key, os.listdir(tmp_path))
        seen.add((Path(exp).stem, key))
        n += 1
    assert len({e for e, _ in seen}) == len(_EXPERIMENTS)
