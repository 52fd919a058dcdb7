"""SIGTERM and SIGINT stop a run at a safe point (issue 10; split from tests/test_faults.py).

A run in a child process is signalled at moments recognised from outside, never after a sleep:
its first checkpoint exists (SIGTERM mid-run), simpar's handlers are in place, jaxlib is mapped,
the output file exists (Ctrl-C during start-up and compilation), the handlers are gone (Ctrl-C
during teardown). Each run exits 143 or 130 with the status written, or 0 if it was over.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from simpar.cli import main
from simpar.io import checkpoint
from simpar.io.netcdf import open_frames, read_attrs

ROOT = Path(__file__).resolve().parents[1]
HEAT = str(ROOT / "experiments/heat2d.toml")
SMALL_HEAT = ["--set", "grid.shape=[64,64]", "--set", "time.dt=5e-5", "--set", "output.every=2"]


def _debris(directory):
    return sorted(p for p in os.listdir(directory) if "simpar-tmp" in p or p.endswith(".tmp"))


def _subprocess(*args, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "simpar", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        **kw,
    )


def _wait_until(ready, proc, what, timeout=120):
    """Poll until ``ready()`` is true while ``proc`` runs (the trigger is the observed
    event, not a delay: the poll interval only bounds how late the test reacts)."""
    t0 = time.monotonic()
    while not ready():
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() - t0 < timeout, f"{what}: not seen in {timeout} s"
        time.sleep(0.005)


def _wait_for(path, proc, timeout=120):
    _wait_until(path.exists, proc, f"{path} did not appear", timeout)


def _proc_text(proc, name):
    """``/proc/PID/NAME`` of a child ("" once it has exited)."""
    try:
        return Path(f"/proc/{proc.pid}/{name}").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _catches(proc, sig) -> bool:
    """Whether the child has a handler for ``sig`` (``SigCgt`` in /proc/PID/status)."""
    m = re.search(r"SigCgt:\s*([0-9a-f]+)", _proc_text(proc, "status"))
    return bool(m) and bool(int(m.group(1), 16) & (1 << (sig - 1)))


@pytest.mark.parametrize("sig,code,reason", [(signal.SIGTERM, 143, "terminated")])
def test_sigterm_stops_at_a_safe_point_with_status_and_usable_checkpoint(
    tmp_path, sig, code, reason
):
    out = tmp_path / "run.nc"
    p = _subprocess(
        "run", HEAT, "--out", str(out), "--steps", "10000000", *SMALL_HEAT, "--set",
        "output.every=2000",
    )  # fmt: skip
    _wait_for(checkpoint.checkpoint_path(out), p)  # written after each frame: mid-run now
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == code, err
    assert "Traceback" not in err and reason in err
    assert read_attrs(out)["run_status"] == f"failed: {reason}"
    steps = open_frames(out)[1]
    state, step, _, _ = checkpoint.load(checkpoint.checkpoint_path(out))
    assert step == steps[-1] and np.all(np.isfinite(state["u"]))
    assert _debris(tmp_path) == []
    # the checkpoint continues to the same state as a run that was never stopped
    target = str(int(step) + 2000)
    args = ["--steps", target, *SMALL_HEAT, "--set", "output.every=2000", "--quiet"]
    assert main(["run", HEAT, "--out", str(out), "--resume", *args]) == 0
    ref = tmp_path / "ref.nc"
    assert main(["run", HEAT, "--out", str(ref), *args]) == 0
    np.testing.assert_array_equal(open_frames(out)[2]["u"][-1], open_frames(ref)[2]["u"][-1])
    assert read_attrs(out)["run_status"] == "complete"


# Each phase is recognised from outside the child, with no hook in simpar:
#   handlers: simpar's handlers are in place (SIGTERM caught; Python catches only SIGINT), the
#             config is being read and JAX is not imported yet;
#   jax:      jaxlib's shared libraries are mapped (JAX is importing / starting its backend);
#   compile:  the output file exists, so the first compilation is over and the run's loop is
#             compiled next (the signal arrives during it or at its first safe point).
def _phase_reached(proc, phase, out):
    if phase == "handlers":
        return _catches(proc, signal.SIGTERM)
    if phase == "jax":
        return _catches(proc, signal.SIGTERM) and "jaxlib" in _proc_text(proc, "maps")
    return any(p.name.lstrip(".").startswith(out.name) for p in out.parent.iterdir())


@pytest.mark.parametrize(
    "phase",
    [
        "handlers",
        pytest.param("jax", marks=pytest.mark.slow),
        pytest.param("compile", marks=pytest.mark.slow),
    ],
)
def test_ctrl_c_during_start_up_or_compilation_exits_130_cleanly(tmp_path, phase):
    out = tmp_path / "run.nc"
    p = _subprocess("run", HEAT, "--out", str(out), "--steps", "20", *SMALL_HEAT, "--quiet")
    _wait_until(lambda: _phase_reached(p, phase, out), p, f"phase {phase}")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert "Traceback" not in err and "Segmentation" not in err
    if phase != "compile":  # stopped at a safe point of the set-up: nothing written
        assert p.returncode == 130 and "interrupted" in err, (p.returncode, err)
        assert not out.exists() and _debris(tmp_path) == []
    # 0 only if the run was already over; never a crash (negative: killed by a signal)
    assert p.returncode in (130, 0), (p.returncode, err)
    if p.returncode == 130 and out.exists():
        assert read_attrs(out)["run_status"] in ("failed: interrupted", "running")


@pytest.mark.slow
def test_ctrl_c_after_the_run_finished_is_ignored_during_teardown(tmp_path):
    # Python resets its handlers to the default action early in finalization; a SIGINT in
    # the next ~50 ms used to kill a completed run (exit -2, nothing printed).
    out = tmp_path / "run.nc"
    p = _subprocess("run", HEAT, "--out", str(out), "--steps", "4", *SMALL_HEAT)
    summary = p.stdout.readline()  # one JSON line, the last thing printed before teardown
    # wait until the process stops catching SIGINT (finalization resets Python's handlers)
    # and signal it then: the moment that used to kill it
    while p.poll() is None and _catches(p, signal.SIGINT):
        time.sleep(0.001)
    with contextlib.suppress(ProcessLookupError):
        p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, (p.returncode, err)
    assert json.loads(summary)["run_status"] == "complete"
    assert read_attrs(out)["run_status"] == "complete"
