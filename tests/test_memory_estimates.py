"""Memory: the cgroup allowance without reclaimable page cache, every model's estimate
against the measured peak (experiments/check_memory_estimates.py), refusals before
allocating."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simpar import memory

ROOT = Path(__file__).resolve().parents[1]

GIB = memory.GIB


def test_cgroup_v2_allowance_leaves_out_inactive_page_cache(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{2 * GIB}\n")
    (v2 / "memory.current").write_text(f"{GIB + GIB // 2}\n")  # 1 GiB of it written output
    (v2 / "memory.stat").write_text(
        f"anon {GIB // 2}\nfile {GIB}\nactive_file 0\ninactive_file {GIB}\n"
    )
    assert memory.cgroup_available(v2)[0] == GIB + GIB // 2
    (v2 / "memory.stat").write_text("anon 1\nactive_file 0\n")  # no counter: usage as is
    assert memory.cgroup_available(v2)[0] == GIB // 2
    (v2 / "memory.stat").write_text(f"inactive_file {4 * GIB}\n")  # never beyond the usage
    assert memory.cgroup_available(v2)[0] == 2 * GIB
    (v2 / "memory.stat").write_text("inactive_file lots\n")  # unreadable: ignored
    assert memory.cgroup_available(v2)[0] == GIB // 2


def test_cgroup_v1_allowance_leaves_out_total_inactive_file(tmp_path):
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{GIB + GIB // 2}\n")
    # v1 lists the cgroup's own inactive_file and the hierarchy's total_inactive_file
    (v1 / "memory.stat").write_text(
        f"cache {GIB}\ninactive_file {GIB // 4}\ntotal_inactive_file {GIB}\n"
    )
    assert memory.cgroup_available(tmp_path / "v1")[0] == GIB + GIB // 2
    (v1 / "memory.stat").unlink()
    assert memory.cgroup_available(tmp_path / "v1")[0] == GIB // 2


# ---- refusals before allocating -------------------------------------------------------------


def _cli(*args, rlimit_as=None, timeout=300):
    """``python -m simpar ARGS`` in a fresh process, under an address-space limit (bytes) set
    by the child itself before simpar starts."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = (
        f"import os, resource, sys; limit = {int(rlimit_as)}; "
        "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); "
        "os.execv(sys.executable, [sys.executable, '-m', 'simpar', *sys.argv[1:]])"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)  # fmt: skip


@pytest.mark.parametrize(
    "sets",
    [
        ["grid.shape=[100000,100000]"],  # was an _ArrayMemoryError traceback (74.5 GiB)
        [
            "grid.shape=[512,512,512]",
            'initial.kind="abc"',
            "time.dt=1.0",  # was 6.4 GB
            "grid.length=[6.283185307179586,6.283185307179586,6.283185307179586]",
        ],  # then CFL
    ],
    ids=["2d-100000^2", "3d-512^3"],
)
def test_spectral_grid_too_big_is_refused_before_allocating(tmp_path, sets):
    out = tmp_path / "o.nc"
    args = ["run", str(ROOT / "experiments/taylor_green.toml"), "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    r = _cli(*args, rlimit_as=8_000_000 * 1024)  # ulimit -v 8000000
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("simpar: invalid input: grid.shape: the run needs about"), line
    assert "spectral grid" in line and "RLIMIT_AS" in line and not out.exists()


def test_estimates_grow_with_the_size_keys():
    from simpar.drive import grid

    spectral = grid.spectral_memory_estimate
    assert spectral((1024, 1024), "float64") - spectral((512, 512), "float64") == pytest.approx(
        3 * (spectral((512, 512), "float64") - grid._SPECTRAL_OVERHEAD), rel=1e-6
    )
    assert spectral((64, 64, 64), "float32") < spectral((64, 64, 64), "float64")
    assert grid.memory_estimate((256, 256), 8, 2, members=4) - grid._OVERHEAD == pytest.approx(
        4 * (grid.memory_estimate((256, 256), 8, 2) - grid._OVERHEAD), rel=1e-6
    )


# ---- estimates against measured peaks -------------------------------------------------------


def _checker():
    spec = importlib.util.spec_from_file_location(
        "check_memory_estimates", ROOT / "experiments/check_memory_estimates.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: a cheap subset of experiments/check_memory_estimates.py's cases: a grid ensemble, the
#: spectral model and MD (the script runs every family at four sizes: minutes)
CHEAP = ["heat_ensemble 512^2", "taylor_green 512^2", "lj_melt"]


@pytest.mark.slow
def test_estimates_are_within_30_percent_of_the_measured_peaks():
    """Each case in a fresh ``simpar run``, one after the other (the peaks are the runs'
    own VmHWM, not ru_maxrss: that one keeps the test worker's size across exec)."""
    mod = _checker()
    cases = {name: (exp, sets, steps) for _, name, exp, sets, steps in mod.CASES}
    rows = {}
    for name in CHEAP:
        exp, sets, steps = cases[name]
        rows[name] = row = mod.measure(exp, sets, steps, timeout=600)
        assert row["rc"] == 0, (name, row)
    bad = {k: r for k, r in rows.items() if not 0.7 <= r["ratio"] <= 1.3}
    assert not bad, bad
