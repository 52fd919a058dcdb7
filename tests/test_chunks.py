"""Chunk lengths and the stop decision every process agrees on (``simpar.drive.chunks``).

The two-process runs (SIGTERM to both or to one, resumed bitwise) are in
``tests/test_cluster_faults.py`` (slow tier); here the agreement's rule is checked in this
process: process 0's length, any process's signal (SIGTERM over SIGINT).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from jax.experimental import multihost_utils

from simpar import signals
from simpar.drive.chunks import ChunkClock, next_chunk
from simpar.parallel import distributed

ROOT = Path(__file__).resolve().parents[1]


def test_one_process_agrees_with_itself_and_stops_alone():
    clock = ChunkClock(target=2.0, probe=8)
    assert next_chunk(clock, 5) == 5 and next_chunk(clock, 20) == 8
    assert next_chunk(None, 0) == 0
    assert distributed.agree(7, None) == (7, None)
    signals.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # held until the next safe point
        with pytest.raises(signals.Interrupted) as info:
            next_chunk(clock, 20)
    finally:
        signals.uninstall()
    assert info.value.exit_code == 143 and info.value.reason == "terminated"
    assert not info.value.together  # one process: nobody else to stop with


def test_processes_take_process_0s_length_and_any_signal(monkeypatch):
    rows = {}

    def allgather(x):  # what process_allgather returns: one row per process, in order
        rows["mine"] = np.asarray(x)
        return np.array([[512, 0], [64, int(signal.SIGINT)], [0, int(signal.SIGTERM)]])

    monkeypatch.setattr(distributed, "process_count", lambda: 3)
    monkeypatch.setattr(distributed, "is_main", lambda: True)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    assert distributed.agree(512, None) == (512, signal.SIGTERM)
    assert rows["mine"].tolist() == [512, 0] and rows["mine"].dtype == np.int32
    with pytest.raises(signals.Interrupted) as info:
        next_chunk(ChunkClock(probe=512), 1000)
    assert info.value.together and info.value.exit_code == 143

    monkeypatch.setattr(
        multihost_utils, "process_allgather", lambda x: np.array([[256, 0], [999, 0], [1, 0]])
    )
    assert next_chunk(ChunkClock(probe=1), 1000) == 256  # process 0's clock decides
    with pytest.raises(RuntimeError, match="chunk of 256 steps"):
        next_chunk(ChunkClock(), 100)  # never more than the steps left to the frame


def _simulate(clock, step_s, compile_s, every, steps):
    """Chunks a run of ``steps`` steps with frames every ``every`` steps gets from ``clock``
    when a step takes ``step_s`` seconds and a new chunk length compiles in ``compile_s``:
    [(length, wall seconds)]."""
    out, done, seen = [], 0, set()
    while done < steps:
        k = clock.size(min(every - done % every, steps - done))
        t = k * step_s + (compile_s if k not in seen else 0.0)
        seen.add(k)
        clock.record(k, t)
        out.append((k, t))
        done += k
    return out


@pytest.mark.parametrize("step_s", [3.0, 1.0, 0.3, 1e-4])
def test_every_chunk_from_the_first_is_bounded_by_the_target_plus_one_compile(step_s):
    # issue 31: the first chunk was 128 unmeasured steps (32 s on heat2d 8192^2)
    compile_s = 5.0
    chunks = _simulate(ChunkClock(target=2.0), step_s, compile_s, every=10**6, steps=3000)
    assert chunks[0][0] == 1  # one step (and its compilation) before anything is measured
    for k, t in chunks:
        assert t <= max(2.0, step_s) + compile_s + 1e-9, (k, t)
    assert len({k for k, _ in chunks}) <= 16  # few chunk programs (powers of two)
    if step_s < 1e-3:  # fast steps: long chunks after the two probes
        assert [k for k, _ in chunks] == [1, 1, 2998]


def test_frames_close_together_keep_one_chunk_per_frame():
    chunks = _simulate(ChunkClock(target=2.0), 1e-4, 0.5, every=100, steps=1000)
    assert [k for k, _ in chunks] == [1, 1, 98] + [100] * 9


@pytest.mark.slow
def test_sigterm_in_the_first_chunk_of_a_slow_step_ends_the_run_within_seconds(tmp_path):
    """issue 31: lbm3d at 96^3 (a step of about a second on one CPU device), frames a million
    steps apart; SIGTERM right after frame 0, inside the first chunk. It was 128 unmeasured
    steps (minutes); now one step plus its compilation (bounded here by the set-up time, which
    compiles the state's and diagnostics' programs), then exit 143 with frame 0 kept."""
    from simpar.io import checkpoint

    out = tmp_path / "run.nc"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    start = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "simpar", "run", str(ROOT / "experiments/lbm3d.toml"), "--out",
         str(out), "--quiet", "--devices", "1", "--steps", "2000000", "--set",
         "output.every=1000000", "--set", "grid.shape=[96,96,96]"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    ckpt = checkpoint.checkpoint_path(out)
    while not ckpt.exists():  # frame 0 and its checkpoint are written: now stepping
        assert p.poll() is None, p.communicate()
        assert time.monotonic() - start < 240
        time.sleep(0.05)
    setup = time.monotonic() - start
    time.sleep(0.2)
    sent = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    took = time.monotonic() - sent
    assert p.returncode == 143 and "Traceback" not in err, (p.returncode, err)
    assert took < 5.0 + max(setup, 5.0), (took, setup)
