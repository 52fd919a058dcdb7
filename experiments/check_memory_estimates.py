"""Every model's memory estimate against the peak resident memory measured through ``simpar run``.

Each case runs ``simpar run EXPERIMENT --set ... --steps S`` in a fresh process with
``SIMPAR_MEMORY_REPORT=1`` (``simpar.memory.REPORT_ENV``): the driver prints the peak its
estimate implies (resident memory at the check plus the estimated bytes) before allocating,
and the run's summary gives the measured peak (``peak_memory_mib``, the process's own VmHWM). Cases: every
shipped experiment (``experiments/*.toml``) and four scaled-up sizes per model family.
Runs are serial (a peak measured beside other runs is still the process's own, but the
machine must have the memory), each with an empty compilation cache (compiling is part of
the peak: the worst case, and the same on every machine). Prints JSON: one object per case with ``estimate_mib``,
``peak_mib`` and ``ratio`` (estimate / peak), and ``worst`` (the ratio furthest from 1).

Run:
  python experiments/check_memory_estimates.py                 # every case (minutes)
  python experiments/check_memory_estimates.py --family spectral2d --family grid
  python experiments/check_memory_estimates.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

_TG3 = ['grid.length=[6.283185307179586,6.283185307179586,6.283185307179586]',
        'initial.kind="abc"', "time.dt=0.002"]  # fmt: skip

#: (family, name, experiment, [--set values], steps); the shipped experiments come first
CASES = [
    ("grid", "advection2d", "advection2d.toml", [], 4),
    ("grid", "cavity_re100", "cavity_re100.toml", [], 4),
    ("grid", "cavity_re1000", "cavity_re1000.toml", [], 4),
    ("grid", "gray_scott", "gray_scott.toml", [], 4),
    ("grid", "heat2d", "heat2d.toml", [], 4),
    ("ensemble", "heat_ensemble", "heat_ensemble.toml", [], 4),
    ("grid", "lbm3d", "lbm3d.toml", [], 4),
    ("grid", "wave2d", "wave2d.toml", [], 4),
    ("spectral2d", "kolmogorov", "kolmogorov.toml", [], 4),
    ("spectral2d", "taylor_green", "taylor_green.toml", [], 4),
    ("lj", "lj_melt", "lj_melt.toml", [], 4),
    ("lj", "lj_bench", "lj_bench.toml", [], 4),
    ("nbody", "nbody_plummer", "nbody_plummer.toml", [], 4),
    ("pm", "pm_plane_wave", "pm_plane_wave.toml", [], 4),
    ("pm", "pm_cosmic_web", "pm_cosmic_web.toml", [], 4),
]
for _n in (1024, 2048, 4096, 8192):
    CASES.append(
        ("grid", f"heat2d {_n}^2", "heat2d.toml", [f"grid.shape=[{_n},{_n}]", "time.dt=1e-9"], 2)
    )
for _n in (512, 1024, 2048, 4096):
    CASES.append(
        ("grid", f"wave2d {_n}^2", "wave2d.toml", [f"grid.shape=[{_n},{_n}]", "time.dt=1e-5"], 2)
    )
for _n in (64, 96, 128, 160):
    CASES.append(("grid", f"lbm3d {_n}^3", "lbm3d.toml", [f"grid.shape=[{_n},{_n},{_n}]"], 2))
for _n in (512, 1024, 2048, 4096):
    CASES.append(("ensemble", f"heat_ensemble {_n}^2", "heat_ensemble.toml",
                  [f"grid.shape=[{_n},{_n}]", "time.dt=1e-9"], 2))  # fmt: skip
for _n in (512, 1024, 2048, 4096):
    CASES.append(("spectral2d", f"taylor_green {_n}^2", "taylor_green.toml",
                  [f"grid.shape=[{_n},{_n}]", "time.dt=0.0005"], 2))  # fmt: skip
for _n in (32, 64, 96, 128):
    CASES.append(("spectral3d", f"abc {_n}^3", "taylor_green.toml",
                  [f"grid.shape=[{_n},{_n},{_n}]", *_TG3], 2))  # fmt: skip
for _n in (14, 20, 26, 32):
    CASES.append(("lj", f"lj_melt {_n}^3 cells", "lj_melt.toml",
                  [f"system.cells=[{_n},{_n},{_n}]"], 2))  # fmt: skip
for _n in (4096, 8192, 16384, 32768):
    CASES.append(("nbody", f"nbody {_n}", "nbody_plummer.toml", [f"particles.n={_n}"], 2))
for _n in (32, 96, 128, 160):
    CASES.append(("pm", f"pm_cosmic_web {_n}^3", "pm_cosmic_web.toml",
                  [f"particles.lattice=[{_n},{_n},{_n}]", f"physics.pm_mesh=[{_n},{_n},{_n}]"],
                  2))  # fmt: skip

_ESTIMATE = re.compile(r"simpar: memory estimate (\S+): ([0-9.]+) MiB peak resident")


def measure(
    experiment: str, sets: list[str], steps: int, *, devices: int = 1, timeout: float = 1800.0
) -> dict:
    """Run one case in a fresh ``simpar run``; returns ``estimate_mib`` (the largest estimate
    the run printed, None if none), ``key`` (its size key), ``peak_mib`` and ``ratio``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / ("out.h5md" if _particles(experiment) else "out.nc")
        cmd = [
            sys.executable,
            "-m",
            "simpar",
            "run",
            str(HERE / experiment),
            "--steps",
            str(steps),
            "--out",
            str(out),
            "--devices",
            str(devices),
        ]
        for s in sets:
            cmd += ["--set", s]
        # a cold compilation cache: compiling is part of the peak (a warm cache lowers small
        # runs' peaks by up to ~80 MiB), and each case is then the same on every machine
        env = dict(os.environ, SIMPAR_MEMORY_REPORT="1", SIMPAR_COMPILE_CACHE_DIR=tmp)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=tmp)  # fmt: skip
    found = [(float(v), k) for k, v in _ESTIMATE.findall(r.stderr)]
    est, key = max(found) if found else (None, None)
    peak = None
    if r.returncode == 0:
        peak = json.loads(r.stdout.strip().splitlines()[-1])["peak_memory_mib"]
    tail = r.stderr.strip().splitlines()[-1:] if r.returncode else []
    return {
        "estimate_mib": est, "key": key, "peak_mib": peak,
        "ratio": round(est / peak, 3) if est and peak else None,
        "rc": r.returncode, **({"error": tail[0][:300]} if tail else {}),
    }  # fmt: skip


def _particles(experiment: str) -> bool:
    return experiment.startswith(("lj", "nbody", "pm"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", help="only these families (repeatable)")
    ap.add_argument("--shipped", action="store_true", help="only the shipped experiments")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.family or c[0] in args.family]
    if args.shipped:
        cases = [c for c in cases if not c[3]]
    if args.list:
        for fam, name, exp, sets, steps in cases:
            print(fam, name, exp, *sets, f"--steps {steps}")
        return 0
    rows = []
    for fam, name, exp, sets, steps in cases:
        row = {"family": fam, "case": name, "experiment": exp, "set": sets,
               **measure(exp, sets, steps)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    worst = max(ratios, key=lambda x: abs(x - 1), default=None)
    print(json.dumps({"cases": rows, "worst": worst}, indent=1))
    return 0 if worst is not None and 0.7 <= worst <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
