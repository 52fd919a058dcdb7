"""Multi-process runs (``jax.distributed``): two local processes of 4 CPU devices each, gloo.

The same path runs on a cluster with one process per host; here both processes run on this
machine (docs/multiprocess.md). Each run's output is compared with a
one-process run of the same config: the fields bitwise, global sums to round-off.
Budget: about a minute on 2 CPU cores. The two-process runs are in the slow tier; the
one-process references and the options checked before JAX starts run in this process
(``simpar.cli.main``).
"""

import ctypes
import json
import os
import socket
import subprocess
import sys
import types

import h5py
import jax
import numpy as np
import pytest

from simpar.cli import main

HEAT = ["experiments/heat2d.toml", "--set", "grid.shape=[32,32]", "--steps", "40", "--quiet"]
CAVITY = [
    "experiments/cavity_re100.toml",
    "--set",
    "grid.shape=[32,32]",
    "--set",
    "output.every=10",
    "--quiet",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(*args):
    return [sys.executable, "-m", "simpar", "run", *args]


def _two_processes(*args, devices=4):
    """``simpar run ARGS`` as processes 0 and 1 of one run; returns both CompletedProcess-es."""
    port = _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [
        subprocess.Popen(
            _cmd(
                *args,
                "--devices",
                str(devices),
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def _one_process(*args):
    """The one-process reference run, in this process (8 CPU devices, conftest)."""
    assert main(["run", *args]) == 0


def _compare(path, ref_path, fields):
    with h5py.File(path) as a, h5py.File(ref_path) as b:
        assert a.attrs["process_count"] == 2 and b.attrs["process_count"] == 1
        assert a.attrs["run_status"] == b"complete"
        np.testing.assert_array_equal(a["step"][:], b["step"][:])
        for f in fields:
            np.testing.assert_array_equal(a[f][:], b[f][:], err_msg=f)
        for k in a:
            if k.endswith("_sum") or k in ("mass", "kinetic_energy"):
                np.testing.assert_allclose(a[k][:], b[k][:], rtol=1e-6, err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine, mesh", [("shard_map", "2x4"), ("sharded", "4x2"), ("pmap", "8")], ids=str
)
def test_two_processes_write_what_one_process_writes(tmp_path, engine, mesh):
    out = tmp_path / "two.nc"
    p0, p1 = _two_processes(*HEAT, "--engine", engine, "--mesh", mesh, "--out", str(out))
    assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    summary = json.loads(p0.stdout.strip().splitlines()[-1])
    assert summary["engine"] == engine and summary["steps"] == 40
    # process 1 computes, process 0 reports and writes (gloo prints its own connection lines)
    assert not [line for line in p1.stdout.splitlines() if line.startswith("{")]
    ref = tmp_path / "one.nc"
    _one_process(*HEAT, "--out", str(ref))
    _compare(out, ref, ["u"])


@pytest.mark.slow
def test_two_process_cavity_resumes_to_the_one_process_result(tmp_path):
    """LBM (nine population fields and a uint8 wall flag) on a 2x4 mesh over two processes,
    stopped at step 30 and resumed to 60, equals one uninterrupted one-process run."""
    out = tmp_path / "cav.nc"
    common = (*CAVITY, "--engine", "shard_map", "--mesh", "2x4", "--out", str(out))
    for extra in (("--steps", "30"), ("--steps", "60", "--resume")):
        p0, p1 = _two_processes(*common, *extra)
        assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    assert json.loads(p0.stdout.strip().splitlines()[-1])["resumed_from"] == 30
    ref = tmp_path / "ref.nc"
    _one_process(*CAVITY, "--steps", "60", "--out", str(ref))
    _compare(out, ref, ["rho", "ux", "uy"])


def test_multi_process_options_are_checked_before_jax_joins_exit_2(tmp_path, capsys, monkeypatch):
    """In this process: ``jax.distributed.initialize`` must never be reached (guarded)."""

    def never(*args, **kwargs):
        raise AssertionError("jax.distributed.initialize reached with invalid options")

    monkeypatch.setattr(jax.distributed, "initialize", never)
    out = tmp_path / "x.nc"
    # a process id outside the run
    code = main(["run", *HEAT, "--out", str(out), "--coordinator", "127.0.0.1:1",
                 "--num-processes", "2", "--process-id", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--process-id" in err and "[0, 1]" in err
    code = main(["run", *HEAT, "--out", str(out), "--coordinator", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and "--num-processes" in err and "Traceback" not in err
    assert not out.exists()


def test_cpu_collectives_variable_is_checked_before_jax_joins_exit_2(tmp_path, capsys, monkeypatch):
    """``SIMPAR_CPU_COLLECTIVES``: a value other than gloo / mpi, and mpi without a loadable
    MPIwrapper in ``MPITRAMPOLINE_LIB``, outside ``mpirun`` or with more than one device per
    process, exit 2 naming the variable or option, before JAX joins. The MPI path itself
    needs an MPIwrapper library and ``mpirun`` and is not run in CI
    (``experiments/bench_collectives.py``, docs/benchmarks.md)."""

    def never(*args, **kwargs):
        raise AssertionError("jax.distributed.initialize reached with an invalid environment")

    monkeypatch.setattr(jax.distributed, "initialize", never)
    for var in ("MPITRAMPOLINE_LIB", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "x.nc"
    run = ["run", *HEAT, "--out", str(out), "--coordinator", "127.0.0.1:1",
           "--num-processes", "2", "--process-id", "0"]  # fmt: skip
    cases = [
        ({"SIMPAR_CPU_COLLECTIVES": "nccl"}, ["SIMPAR_CPU_COLLECTIVES", "gloo, mpi", "'nccl'"]),
        ({"SIMPAR_CPU_COLLECTIVES": "mpi"}, ["MPITRAMPOLINE_LIB", "MPIwrapper"]),
        (
            {"SIMPAR_CPU_COLLECTIVES": "mpi", "MPITRAMPOLINE_LIB": str(tmp_path / "no.so")},
            ["MPITRAMPOLINE_LIB", "could not be loaded"],
        ),
        ({"MPITRAMPOLINE_LIB": "libm.so.6"}, ["MPITRAMPOLINE_LIB", "not an MPIwrapper"]),
        # an MPIwrapper (stood in for below), but the processes were not started by mpirun
        ({"MPITRAMPOLINE_LIB": "libmpiwrapper.so"}, ["mpirun"]),
        # as if started by mpirun, but more than one CPU device per process (8 in the tests)
        ({"OMPI_COMM_WORLD_SIZE": "2"}, ["--devices", "one CPU device per process"]),
    ]
    wrapper = types.SimpleNamespace(mpiwrapper_version_major=2)
    for env, words in cases:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        if env.get("MPITRAMPOLINE_LIB") == "libmpiwrapper.so":
            monkeypatch.setattr(ctypes, "CDLL", lambda path: wrapper)
        code = main(run)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err
        assert all(w in err for w in words), err
    assert not out.exists()


@pytest.mark.slow
def test_multi_process_input_errors_exit_2_and_write_nothing(tmp_path):
    out = tmp_path / "x.nc"
    # checked by every process after they meet: 'single' cannot span two processes
    p0, p1 = _two_processes(*HEAT, "--engine", "single", "--out", str(out))
    for p in (p0, p1):
        assert p.returncode == 2 and "runs in one process" in p.stderr
        assert "Traceback" not in p.stderr
    # every frame gathers the state on each host: refused above output.gather_limit_gib
    p0, p1 = _two_processes(
        *HEAT, "--engine", "sharded", "--set", "output.gather_limit_gib=1e-6", "--out", str(out)
    )
    for p in (p0, p1):
        assert p.returncode == 2 and "output.gather_limit_gib" in p.stderr
    # an N-body ring of 4 would leave process 1 without a device
    nb_out = tmp_path / "x_nbody.h5md"
    p0, p1 = _two_processes(
        "experiments/nbody_plummer.toml", "--engine", "pmap", "--mesh", "4", "--steps", "2",
        "--out", str(nb_out),
    )  # fmt: skip
    for p in (p0, p1):
        assert p.returncode == 2 and "leaves process(es) [1] without a device" in p.stderr
        assert "Traceback" not in p.stderr
    assert not nb_out.exists()
    md_out = tmp_path / "x.h5md"
    p0, p1 = _two_processes(
        "experiments/lj_melt.toml", "--engine", "single", "--steps", "2", "--out", str(md_out)
    )
    for p in (p0, p1):
        assert p.returncode == 2 and "'sharded'" in p.stderr
    assert not out.exists() and not md_out.exists()


@pytest.mark.slow
def test_two_process_lj_melt_equals_the_one_process_sharded_run(tmp_path):
    """4,000 LJ atoms split over 8 devices of two processes: the H5MD trajectory equals the
    one-process run on 8 devices (positions bitwise, observables to round-off) and
    MDAnalysis opens it."""
    import MDAnalysis

    out, ref = tmp_path / "two.h5md", tmp_path / "one.h5md"
    common = ("experiments/lj_melt.toml", "--engine", "sharded", "--mesh", "8", "--steps", "40")
    p0, p1 = _two_processes(*common, "--quiet", "--out", str(out))
    assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    _one_process(*common, "--quiet", "--devices", "8", "--out", str(ref))
    traj = "particles/trajectory/position/value"
    with h5py.File(out) as a, h5py.File(ref) as b:
        np.testing.assert_array_equal(a[traj][:], b[traj][:])
        for k in b["observables"]:
            va, vb = a["observables"][k]["value"][:], b["observables"][k]["value"][:]
            np.testing.assert_allclose(va, vb, rtol=1e-12, atol=1e-12, err_msg=k)
    u = MDAnalysis.Universe(str(out), n_atoms=4000, convert_units=False)  # reduced units
    assert len(u.atoms) == 4000 and len(u.trajectory) == 2


NBODY = ("experiments/nbody_plummer.toml", "--set", "particles.n=256", "--steps", "20",
         "--set", "output.every=10", "--quiet")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["pmap", "shard_map"])
def test_two_process_nbody_ring_equals_the_one_process_ring(tmp_path, engine):
    """The N-body ring of 8 devices over two processes (shifts 3 -> 4 and 7 -> 0 cross
    between them) writes the trajectory of the one-process ring of 8, bitwise."""
    out, ref = tmp_path / "two.h5md", tmp_path / "one.h5md"
    p0, p1 = _two_processes(*NBODY, "--engine", engine, "--out", str(out))
    assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    _one_process(*NBODY, "--engine", engine, "--devices", "8", "--out", str(ref))
    traj = "particles/trajectory/"
    with h5py.File(out) as a, h5py.File(ref) as b:
        assert a["parameters"].attrs["process_count"] == 2
        assert a[traj + "position/value"].shape == (3, 256, 3)
        for k in ("position", "velocity"):
            np.testing.assert_array_equal(a[traj + k + "/value"][:], b[traj + k + "/value"][:])
        for k in ("kinetic_energy", "potential_energy", "total_energy"):
            va, vb = a["observables"][k]["value"][:], b["observables"][k]["value"][:]
            np.testing.assert_allclose(va, vb, rtol=1e-13, err_msg=k)
