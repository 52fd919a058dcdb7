"""Multi-process runs end together (issue 17 item 1): two local processes of 4 CPU devices.

When one process dies (SIGKILL after its second frame, ``SIMPAR_TEST_KILL_AFTER_FRAME``) or
fails (a full disk on process 0 at its third frame, ``SIMPAR_TEST_WRITE_ERROR_AFTER_FRAME``;
SIGTERM to one process), the survivor exits 1 within 30 s with one line naming the failed
process (no C++ stack trace, no Python traceback), process 0 (if alive) leaves
``run_status = "failed: ..."``, and ``--resume`` continues from the last checkpoint
(``simpar.parallel.watchdog``).

Survivor's time to exit, measured here (before: main at 86b86ec; after: this suite's cases):
LJ pmap 2x2x2, kill 1: 83.5 s, SIGABRT + C++ trace, ``running`` -> 10.0 s, exit 1.
Heat shard_map 2x4, kill 1: 95.5 s, traceback + SIGABRT + C++ trace -> 10.3 s, exit 1.
Kill 0 (heat / LJ): 0.9 / 0.8 s, SIGABRT + C++ trace -> 9.8 / 10.0 s, exit 1.
Disk full on 0 (heat / LJ): both hang (issue: minutes) -> 0.2 / 0.3 s, exit 1.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

pytestmark = pytest.mark.slow

HEAT = (
    "experiments/heat2d.toml", "--set", "grid.shape=[32,32]", "--steps", "4000",
    "--set", "output.every=20", "--engine", "shard_map", "--mesh", "2x4",
)  # fmt: skip
LJ = (
    "experiments/lj_melt.toml", "--set", "system.cells=[4,4,4]", "--steps", "4000",
    "--set", "output.every=10", "--engine", "pmap", "--mesh", "2x2x2",
)  # fmt: skip
KILL = "SIMPAR_TEST_KILL_AFTER_FRAME"
WRITE_ERROR = "SIMPAR_TEST_WRITE_ERROR_AFTER_FRAME"
LIMIT_S = 30.0  # the survivor's time to exit after the failure, at most (s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(args, env_of=({}, {}), timeout=240, term=None):
    """``simpar run ARGS`` as processes 0 and 1 (``env_of[i]``: extra environment of i;
    ``term``: SIGTERM to this process once the run's checkpoint exists).

    Returns:
      ``(results, ends)``: a CompletedProcess per process and the monotonic time (s) at
      which each was seen to exit (polled every 50 ms).
    """
    port = _free_port()
    procs, files = [], []
    for i in range(2):
        env = dict(os.environ, PYTHONUNBUFFERED="1", **env_of[i])
        err = open(f"{args[-1]}.p{i}.err", "w+")  # noqa: SIM115  (next to the output file)
        files.append(err)
        cmd = [sys.executable, "-m", "simpar", "run", *args, "--quiet", "--devices", "4",
               "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
               "--process-id", str(i)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env))
    ends = [None, None]
    deadline = time.monotonic() + timeout
    ckpt = Path(f"{args[-1]}.ckpt")
    while None in ends and time.monotonic() < deadline:
        if term is not None and ckpt.exists():
            time.sleep(1.0)
            procs[term].send_signal(signal.SIGTERM)
            term = None
        for i, p in enumerate(procs):
            if ends[i] is None and p.poll() is not None:
                ends[i] = time.monotonic()
        time.sleep(0.05)
    results = []
    for i, p in enumerate(procs):
        if ends[i] is None:
            p.kill()
        stdout = p.communicate()[0]
        files[i].seek(0)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, files[i].read()))
        files[i].close()
    assert None not in ends, [r.stderr[-2000:] for r in results]
    return results, ends


def _simpar_lines(stderr: str) -> list[str]:
    """The lines simpar printed (gloo and absl print their own start-up lines)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("simpar:")]


def _assert_clean_exit(r, failed: int, words: str):
    """Exit 1, one ``simpar:`` line naming process ``failed`` and ``words``, no trace."""
    assert r.returncode == 1, r.stderr[-3000:]
    lines = _simpar_lines(r.stderr)
    assert len(lines) == 1, r.stderr[-3000:]
    assert f"process {failed}" in lines[0] and words in lines[0], lines[0]
    assert "Traceback" not in r.stderr and "stack trace" not in r.stderr, r.stderr[-3000:]


def _status(path) -> str:
    with h5py.File(path) as f:
        attrs = f["parameters"].attrs if "parameters" in f else f.attrs
        status = attrs["run_status"]
    return status.decode() if isinstance(status, bytes) else str(status)


def _resume(args, out):
    (p0, p1), _ = _run_pair((*args[:-2], "--steps", "60", "--resume", *args[-2:]))
    assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    summary = json.loads(p0.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] >= 10 and summary["steps"] == 60
    assert _status(out) == "complete"


@pytest.mark.parametrize("model", ["lj", "heat"])
def test_kill_of_process_1_ends_process_0_with_one_line(tmp_path, model):
    """Process 1 is SIGKILLed after its first frame: process 0 exits 1 naming it, sets
    ``failed: process 1 ...`` and the run resumes from its checkpoint."""
    out = tmp_path / ("run.h5md" if model == "lj" else "run.nc")
    args = (*(LJ if model == "lj" else HEAT), "--out", str(out))
    (p0, p1), (end0, end1) = _run_pair(args, ({}, {KILL: "2"}))
    assert p1.returncode == -9, p1.stderr[-2000:]
    assert end0 - end1 < LIMIT_S
    _assert_clean_exit(p0, 1, "stopped responding")
    assert _status(out).startswith("failed: process 1 stopped responding")
    _resume(args, out)


@pytest.mark.parametrize("model", ["lj", "heat"])
def test_kill_of_process_0_ends_process_1_with_one_line(tmp_path, model):
    """Process 0 (the coordinator) is SIGKILLed after its first frame: process 1 exits 1
    naming it; the file says ``running`` (nobody is left to write it) and resumes."""
    out = tmp_path / ("run.h5md" if model == "lj" else "run.nc")
    args = (*(LJ if model == "lj" else HEAT), "--out", str(out))
    (p0, p1), (end0, end1) = _run_pair(args, ({KILL: "2"}, {}))
    assert p0.returncode == -9, p0.stderr[-2000:]
    assert end1 - end0 < LIMIT_S
    _assert_clean_exit(p1, 0, "process 0")
    _resume(args, out)


@pytest.mark.parametrize("model", ["lj", "heat"])
def test_write_error_on_process_0_ends_both(tmp_path, model):
    """A full disk on process 0 at its third frame: process 0 exits 1 with its own message,
    process 1 exits 1 naming process 0 and the write error, within seconds of each other."""
    out = tmp_path / ("run.h5md" if model == "lj" else "run.nc")
    args = (*(LJ if model == "lj" else HEAT), "--out", str(out))
    (p0, p1), (end0, end1) = _run_pair(args, ({WRITE_ERROR: "2"}, {}))
    assert p0.returncode == 1, p0.stderr[-3000:]
    lines = _simpar_lines(p0.stderr)
    assert len(lines) == 1 and "No space left on device" in lines[0], p0.stderr[-3000:]
    assert "Traceback" not in p0.stderr
    assert abs(end1 - end0) < LIMIT_S
    _assert_clean_exit(p1, 0, "No space left on device")
    assert _status(out).startswith("failed: ") and "No space left" in _status(out)
    _resume(args, out)


def test_sigterm_to_process_1_ends_both(tmp_path):
    """SIGTERM to process 1 only: it exits 143 (``terminated``), process 0 exits 1 naming it
    and sets ``failed: process 1 failed: terminated``. Before: JAX's preemption service
    caught the SIGTERM and both processes hung in their next collective (> 120 s)."""
    out = tmp_path / "run.nc"
    args = (*HEAT, "--steps", "400000", "--out", str(out))
    (p0, p1), (end0, end1) = _run_pair(args, term=1)
    assert p1.returncode == 143 and _simpar_lines(p1.stderr) == ["simpar: terminated"], p1.stderr[
        -3000:
    ]
    assert abs(end0 - end1) < LIMIT_S
    _assert_clean_exit(p0, 1, "terminated")
    assert _status(out) == "failed: process 1 failed: terminated"


@pytest.mark.parametrize("bad", ["model.name=banana", "time.steps=-3"])
def test_invalid_input_on_every_process_exits_2(tmp_path, bad):
    """A bad key seen by both processes (before the run: the model; in the driver: the
    steps): both exit 2 with the one message, as a one-process run does."""
    out = tmp_path / "run.nc"
    (p0, p1), (end0, end1) = _run_pair((*HEAT, "--set", bad, "--out", str(out)), timeout=120)
    key = bad.split("=")[0]
    for r in (p0, p1):
        lines = _simpar_lines(r.stderr)
        assert r.returncode == 2 and len(lines) == 1 and key in lines[0], r.stderr[-3000:]
    assert abs(end0 - end1) < LIMIT_S and not out.exists()
