"""Multi-process runs end together (issue 17 items 1, 2): two local processes of 4 CPU devices.

When one process dies (SIGKILL after its second frame, ``SIMPAR_TEST_KILL_AFTER_FRAME``) or
fails (a full disk on process 0 at its third frame, ``SIMPAR_TEST_WRITE_ERROR_AFTER_FRAME``;
an input error on one process, also before the driver starts), the survivor exits 1 (2 for
an input error) within 30 s with one line naming the failed process (no C++ stack trace, no
Python traceback), process 0 (if alive) leaves ``run_status = "failed: ..."``, and
``--resume`` continues from the last checkpoint (``simpar.parallel.watchdog``).

SIGTERM to every process or to one of them stops all of them at the same chunk boundary
(chunks of ~2 s, their length agreed by every process: ``simpar.drive.chunks``): each exits
143 within seconds, ``run_status = "failed: terminated"``, and the run resumes bitwise.

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
import numpy as np
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
STOP_S = 70.0  # the SIGSTOP test's stop (s): past gRPC's ping timeout (60 s)
TERM_S = 10.0  # each process's time to exit 143 after SIGTERM, at most (s): the chunk in
# flight (~2 s, or more when it is the first of its length and compiles) and the exchange


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(
    args, env_of=({}, {}), timeout=240, term=None, delay=1.0, args_of=None, stop=None, stop_s=0.0
):
    """``simpar run ARGS`` as processes 0 and 1 (``env_of[i]``: extra environment of i;
    every ``ARGS`` has ``--out`` in the test's ``tmp_path``, where the stderr logs go;
    ``args_of[i]``: the arguments of i instead of ``args``; ``term``: SIGTERM to this process,
    or ``"both"``, ``delay`` seconds after the run's checkpoint appeared; ``stop``: SIGSTOP to
    this process then, and SIGCONT ``stop_s`` seconds after the stop once the other exited).

    Returns:
      ``(results, ends, sent)``: a CompletedProcess per process, the monotonic time (s) at
      which each was seen to exit (polled every 50 ms) and when SIGTERM (SIGSTOP) was sent
      (or None).
    """
    port = _free_port()
    args_of = args_of or (args, args)
    procs, files = [], []
    for i in range(2):
        env = dict(os.environ, PYTHONUNBUFFERED="1", **env_of[i])
        argv = args_of[i]  # the log goes next to the output, in the test's tmp_path (not the
        out = Path(argv[argv.index("--out") + 1])  # cwd: the last argument may be --set ...)
        err = open(out.parent / f"{out.name}.p{i}.err", "w+")  # noqa: SIM115
        files.append(err)
        cmd = [sys.executable, "-m", "simpar", "run", *args_of[i], "--quiet", "--devices", "4",
               "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
               "--process-id", str(i)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env))
    ends, sent = [None, None], None
    deadline = time.monotonic() + timeout
    ckpt = Path(f"{args[-1]}.ckpt")
    stopped = None
    while None in ends and time.monotonic() < deadline:
        if stop is not None and stopped is None and ckpt.exists():
            time.sleep(delay)
            procs[stop].send_signal(signal.SIGSTOP)
            stopped = sent = time.monotonic()
        if stopped and ends[1 - stop] is not None and time.monotonic() - stopped > stop_s:
            procs[stop].send_signal(signal.SIGCONT)
            stopped = False
        if term is not None and ckpt.exists():
            time.sleep(delay)
            sent = time.monotonic()
            for i in (0, 1) if term == "both" else (term,):
                procs[i].send_signal(signal.SIGTERM)
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
    return results, ends, sent


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


def _resume(args, out, resumed_from=None):
    (p0, p1), _, _ = _run_pair((*args[:-2], "--steps", "60", "--resume", *args[-2:]))
    assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    summary = json.loads(p0.stdout.strip().splitlines()[-1])
    if resumed_from is None:
        assert summary["resumed_from"] >= 10
    else:
        assert summary["resumed_from"] == resumed_from
    assert summary["steps"] == 60
    assert _status(out) == "complete"


@pytest.mark.parametrize("model", ["lj", "heat"])
def test_kill_of_process_1_ends_process_0_with_one_line(tmp_path, model):
    """Process 1 is SIGKILLed after its first frame: process 0 exits 1 naming it, sets
    ``failed: process 1 ...`` and the run resumes from its checkpoint."""
    out = tmp_path / ("run.h5md" if model == "lj" else "run.nc")
    args = (*(LJ if model == "lj" else HEAT), "--out", str(out))
    (p0, p1), (end0, end1), _ = _run_pair(args, ({}, {KILL: "2"}))
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
    (p0, p1), (end0, end1), _ = _run_pair(args, ({KILL: "2"}, {}))
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
    (p0, p1), (end0, end1), _ = _run_pair(args, ({WRITE_ERROR: "2"}, {}))
    assert p0.returncode == 1, p0.stderr[-3000:]
    lines = _simpar_lines(p0.stderr)
    assert len(lines) == 1 and "No space left on device" in lines[0], p0.stderr[-3000:]
    assert "Traceback" not in p0.stderr
    assert abs(end1 - end0) < LIMIT_S
    _assert_clean_exit(p1, 0, "No space left on device")
    assert _status(out).startswith("failed: ") and "No space left" in _status(out)
    _resume(args, out)


def _datasets(path) -> dict:
    out = {}
    with h5py.File(path) as f:
        f.visititems(
            lambda name, obj: (
                out.__setitem__(name, obj[()])
                if isinstance(obj, h5py.Dataset) and obj.dtype.kind != "O"
                else None
            )
        )
    return out


def _assert_terminated_together(results, ends, sent, out):
    """Both processes exit 143 within TERM_S of the signal, one line each, no trace."""
    for i, r in enumerate(results):
        assert r.returncode == 143, (i, r.stderr[-3000:])
        assert _simpar_lines(r.stderr) == ["simpar: terminated"], (i, r.stderr[-3000:])
        assert "Traceback" not in r.stderr and "stack trace" not in r.stderr, r.stderr[-3000:]
        assert ends[i] - sent < TERM_S, (i, ends[i] - sent)
    assert _status(out) == "failed: terminated"


def test_sigterm_to_both_stops_them_at_one_chunk_boundary_and_resumes_bitwise(tmp_path):
    """Issue 17 item 2 across processes: a frame every 600 steps of 2,000,000; chunks end at
    frames or after ~2 s (process 0's clock, every process runs the same chunks). SIGTERM to
    both (SLURM at the time limit): both exit 143 within TERM_S, ``failed: terminated``;
    ``--resume`` from the last frame's checkpoint continues, and the file equals that of an
    uninterrupted run bit for bit."""
    out = tmp_path / "run.nc"
    common = (*HEAT, "--set", "output.every=600", "--out", str(out))
    results, ends, sent = _run_pair(
        (*common[:-2], "--steps", "2000000", *common[-2:]), term="both", delay=6.0
    )
    _assert_terminated_together(results, ends, sent, out)
    with h5py.File(f"{out}.ckpt") as f:
        ck_step = int(f.attrs["step"])
    assert ck_step % 600 == 0
    steps = str(ck_step + 100)  # frames at ..., ck_step, ck_step + 100 (the last)
    (p0, p1), _, _ = _run_pair((*common[:-2], "--steps", steps, "--resume", *common[-2:]))
    assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    assert json.loads(p0.stdout.strip().splitlines()[-1])["resumed_from"] == ck_step
    ref = tmp_path / "ref.nc"  # uninterrupted, two processes: the same sums bit for bit
    (p0, p1), _, _ = _run_pair((*common[:-2], "--steps", steps, "--out", str(ref)))
    assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    a, b = _datasets(out), _datasets(ref)
    assert sorted(a) == sorted(b)
    assert list(a["step"]) == [*range(0, ck_step + 1, 600), ck_step + 100]
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("model, which", [("heat", 1), ("lj", 0)])
def test_sigterm_to_one_process_stops_both_together(tmp_path, model, which):
    """SIGTERM to one process only: every process learns it before the next chunk and all
    stop there together: exit 143 each, ``failed: terminated``, resumable. Before: JAX's
    preemption service caught the SIGTERM and both hung (> 120 s); then the signalled
    process exited 143 and the other 1 (``process 1 failed: terminated``)."""
    out = tmp_path / ("run.h5md" if model == "lj" else "run.nc")
    base = LJ if model == "lj" else HEAT
    args = (*base, "--steps", "2000000", "--set", "output.every=1000000", "--out", str(out))
    results, ends, sent = _run_pair(args, term=which, delay=4.0)
    _assert_terminated_together(results, ends, sent, out)
    _resume(args, out, resumed_from=0)


def test_process_continued_after_sigstop_exits_1_with_one_line(tmp_path):
    """Process 0 (the writer) is SIGSTOPped (Ctrl-Z, a debugger) for 70 s: process 1 exits 1
    after ~10 s naming it; continued, process 0 exits 1 at once with one line naming its
    stop and process 1's reason, and sets ``run_status`` to it. Before (main at 316632c):
    continued later than the service's heartbeat timeout (25 s), the stopped process died by
    SIGABRT with a C++ trace (``Polled an error from coordination service``), either role;
    then (main at 03a8465) continued later than 60 s, the same (gRPC's ping timeout ended
    its connection to the service: ``simpar.parallel.relay``), 5 of 7 runs here; with the
    relay 0 of 10 (either process stopped)."""
    out = tmp_path / "run.nc"
    args = (*HEAT, "--steps", "400000", "--out", str(out))  # the last --steps counts
    (p0, p1), (end0, end1), stopped = _run_pair(args, timeout=200, stop=0, stop_s=STOP_S)
    _assert_clean_exit(p1, 0, "stopped responding")
    assert end1 - stopped < LIMIT_S
    _assert_clean_exit(p0, 1, "process 0 was stopped for")
    assert end0 - stopped < STOP_S + 5.0, end0 - stopped
    assert "Check failure" not in p0.stderr and "coordination_service" not in p0.stderr
    assert _status(out).startswith("failed: process 0 was stopped for")


@pytest.mark.parametrize(
    "failing, change", [(1, ("--set", "model.name=banana")), (0, "experiments/nowhere.toml")]
)
def test_input_error_on_one_process_before_the_driver_ends_both(tmp_path, failing, change):
    """A config valid on one process only (``model.name``, read before the driver starts)
    or a config file missing on one process (read before JAX starts: that process joins
    the others first to tell them): it exits 2 with its message, the other exits 2 within
    LIMIT_S with one line naming it, no C++ trace. Before (measured, model.name on process
    1): process 1 printed its message and waited in JAX's shutdown barrier; process 0 exited
    1 after 14 s blaming a missing heartbeat, then process 1 aborted (SIGABRT, C++ trace) at
    29 s. A config file missing on one process left the others in
    ``jax.distributed.initialize`` (its timeout: 300 s)."""
    out = tmp_path / "run.nc"
    args = (*HEAT, "--out", str(out))
    bad = (*args, *change) if isinstance(change, tuple) else (change, *args[1:])
    args_of = (bad, args) if failing == 0 else (args, bad)
    results, ends, _ = _run_pair(args, args_of=args_of, timeout=120)
    words = "model.name" if failing == 1 else "config file not found"
    r = results[failing]
    lines = _simpar_lines(r.stderr)
    assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr[-3000:]
    other = results[1 - failing]
    lines = _simpar_lines(other.stderr)
    assert other.returncode == 2 and len(lines) == 1, other.stderr[-3000:]
    assert f"process {failing} failed" in lines[0] and words in lines[0], lines[0]
    for r in results:
        assert "Traceback" not in r.stderr and "stack trace" not in r.stderr, r.stderr[-3000:]
    assert abs(ends[0] - ends[1]) < LIMIT_S and not out.exists()


@pytest.mark.parametrize("bad", ["model.name=banana", "time.steps=-3"])
def test_invalid_input_on_every_process_exits_2(tmp_path, bad):
    """A bad key seen by both processes (before the run: the model; in the driver: the
    steps): both exit 2 with the one message, as a one-process run does."""
    out = tmp_path / "run.nc"
    (p0, p1), (end0, end1), _ = _run_pair((*HEAT, "--set", bad, "--out", str(out)), timeout=120)
    key = bad.split("=")[0]
    for r in (p0, p1):
        lines = _simpar_lines(r.stderr)
        assert r.returncode == 2 and len(lines) == 1 and key in lines[0], r.stderr[-3000:]
    assert abs(end0 - end1) < LIMIT_S and not out.exists()
