"""The research scripts are as safe as the command line (issue 17 item 5).

``experiments/train_surrogate.py``, ``experiments/inverse_heat.py``,
``experiments/fit_lj_to_lammps.py`` and the MD gradient scripts (``check_md_grad.py``,
``bench_md_grad.py``) refuse every bad argument with exit code 2 and one line on stderr naming
the option (no usage block, no traceback), before JAX compiles anything; ``--data PATH`` never
replaces an existing file
without ``--overwrite``.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, str(ROOT / "experiments" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


BAD = [
    ("train_surrogate.py", ["--batch", "0"], "--batch"),
    ("train_surrogate.py", ["--batch", "-4"], "--batch"),
    ("train_surrogate.py", ["--batch", "41"], "--batch"),  # 40 training pairs
    ("train_surrogate.py", ["--batch", "12"], "--batch 12 must be a multiple of --devices 8"),
    ("train_surrogate.py", ["--steps", "0"], "--steps"),
    ("train_surrogate.py", ["--steps", "nan"], "--steps"),
    ("train_surrogate.py", ["--steps", "inf"], "--steps"),
    ("train_surrogate.py", ["--devices", "0"], "--devices"),
    ("train_surrogate.py", ["--devices", "5000"], "--devices"),
    ("train_surrogate.py", ["--version", "fast"], "--version"),
    ("train_surrogate.py", ["--data", "/nonexistent/dir/x.nc"], "/nonexistent/dir"),
    ("train_surrogate.py", ["--data", "frames.txt"], "--data must end in .nc"),
    ("inverse_heat.py", ["--engines", "warp"], "--engines"),
    ("inverse_heat.py", ["--mesh", "2x"], "--mesh"),
    ("inverse_heat.py", ["--mesh", "0x4"], "--mesh"),
    ("inverse_heat.py", ["--mesh", "2x2x2"], "--mesh"),
    ("inverse_heat.py", ["--mesh", "3x3", "--devices", "9"], "not a multiple of 3"),
    ("inverse_heat.py", ["--mesh", "4x4"], "--mesh (4, 4) needs 16 devices"),
    ("inverse_heat.py", ["--shape", "0", "32"], "--shape"),
    ("inverse_heat.py", ["--shape", "nan", "32"], "--shape"),
    ("inverse_heat.py", ["--shape", "32"], "--shape"),
    ("inverse_heat.py", ["--devices", "-1"], "--devices"),
    ("inverse_heat.py", ["--memory", "--steps", "0"], "--steps"),
    ("inverse_heat.py", ["--memory", "--chunk", "0"], "--chunk"),
    ("inverse_heat.py", ["--memory", "--chunk", "30"], "multiple of --chunk 30"),
    ("inverse_heat.py", ["--memory", "--shape", "65536", "65536"], "GiB"),
    ("fit_lj_to_lammps.py", ["--engine", "warp"], "--engine"),
    ("fit_lj_to_lammps.py", ["--mesh", "2x"], "--mesh"),
    ("fit_lj_to_lammps.py", ["--mesh", "4x4"], "--mesh 4x4 needs 16 devices"),
    ("fit_lj_to_lammps.py", ["--engine", "single", "--mesh", "2x2x2"], "decomposed --engine"),
    ("fit_lj_to_lammps.py", ["--start", "0.8"], "--start"),
    ("fit_lj_to_lammps.py", ["--start", "nan", "1.0"], "--start"),
    ("fit_lj_to_lammps.py", ["--start", "0.8", "2.0"], "--start"),
    ("fit_lj_to_lammps.py", ["--seed", "-1"], "--seed"),
    ("fit_lj_to_lammps.py", ["--devices", "-1"], "--devices"),
    ("check_md_grad.py", ["--meshes", "2x4", "2x"], "--meshes"),
    ("check_md_grad.py", ["--meshes", "4x4"], "--meshes need 16 devices"),
    ("check_md_grad.py", ["--fd-max-steps", "-1"], "--fd-max-steps"),
    ("check_md_grad.py", ["--fd-step", "0.5"], "--fd-step"),
    ("bench_md_grad.py", ["--steps", "30", "--chunk", "25"], "multiple of --chunk 25"),
    ("bench_md_grad.py", ["--mesh", "0x4"], "--mesh"),
]


@pytest.mark.slow
@pytest.mark.parametrize("script,args,names", BAD, ids=[f"{s} {' '.join(a)}" for s, a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(script, args, names):
    t0 = time.perf_counter()
    r = _script(script, *args)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert names in lines[0] and lines[0].startswith(f"{script}: error: "), lines[0]
    assert r.stdout == ""
    assert time.perf_counter() - t0 < 60  # refused at start-up, nothing compiled


def test_data_is_never_overwritten_without_overwrite(tmp_path):
    data = tmp_path / "frames.nc"
    data.write_bytes(b"precious")
    r = _script("train_surrogate.py", "--data", str(data), "--steps", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--overwrite" in r.stderr and str(data) in r.stderr
    assert data.read_bytes() == b"precious"
