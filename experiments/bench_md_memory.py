"""Peak memory of ``simpar run experiments/lj_bench.toml`` against LAMMPS. Prints one JSON object.

What it shows (issue 29, item 3): the peak resident memory of the command users run,
``python -m simpar run experiments/lj_bench.toml --steps 100`` (LAMMPS's in.lj: 32,000 LJ
atoms, float64, ``single``), above that of bare JAX, against the whole LAMMPS process running
the same in.lj (``lmp``, ``lammps_peer.in_lj``, 100 steps). Bare JAX is a process that imports
jax and runs one trivial op, ``jnp.ones(3).sum()`` (the CPU client up and one program
compiled, as in any JAX program; the headline baseline, ``bare_jax``) and, for reference, one
that only imports it (``import_jax_only``: the client and the first compilation add ~47 MiB).
Each run is a fresh process: cold (an empty persistent compilation cache, ``XDG_CACHE_HOME``
pointed at a new directory: what a first run sees) and warm (a second run on the cache the
cold one filled). Rounds interleave the kinds of run (and the trees given with ``--tree``,
to compare two checkouts in the same window); each figure is reported as min / median / max
over the rounds, and the ratios use the medians.

The peak is the child's high-water mark ``VmHWM`` (``/proc/<pid>/status``), polled every
few milliseconds while it runs, and its ``ru_maxrss`` from ``os.wait4`` (the same counter,
kept until it is reaped, so it also sees a peak after the last poll). ``ru_maxrss`` survives
``execve``: a child started from a big process reports at least the parent's size, so this
script stays small (it imports neither JAX nor simpar; its own ``VmHWM`` is in the JSON).

Run (about 1 minute per round on 2 CPU cores):
    python experiments/bench_md_memory.py [--rounds 3] [--steps 100]
    python experiments/bench_md_memory.py --tree /path/old --tree . --keep DIR  # before/after

With ``--keep DIR`` the runs' output files stay in DIR (``<tree#>_<kind>_<round>.h5md``), to
compare them (``experiments/compare_outputs.py --files A B``).

Target (issue 29): cold and warm peak above the bare-JAX baseline at most 2x LAMMPS's peak.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOML = os.path.join(HERE, "lj_bench.toml")


def vmhwm_mib(pid: int | str = "self") -> float | None:
    """``VmHWM`` (peak resident set) of a process, in MiB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_of(cmd: list[str], env: dict, cwd: str, timeout: float = 900) -> dict:
    """Run ``cmd``; its peak resident memory (MiB) and wall time (s)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    polled = 0.0
    out_chunks: list[str] = []
    errs: list[str] = []
    # drain the pipes in the background so that a chatty child cannot block on a full pipe
    threads = [threading.Thread(target=lambda: out_chunks.append(proc.stdout.read())),
               threading.Thread(target=lambda: errs.append(proc.stderr.read()))]  # fmt: skip
    for t in threads:
        t.start()
    while True:
        hwm = vmhwm_mib(proc.pid)
        if hwm is not None:
            polled = max(polled, hwm)
        got = os.wait4(proc.pid, os.WNOHANG)
        if got[0] == proc.pid:
            status, usage = got[1], got[2]
            break
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.005)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{''.join(errs)[-3000:]}")
    return {"peak_mib": round(max(polled, usage.ru_maxrss / 1024), 1),
            "polled_vmhwm_mib": round(polled, 1), "ru_maxrss_mib": round(usage.ru_maxrss / 1024, 1),
            "wall_s": round(wall, 2), "stdout": "".join(out_chunks)}  # fmt: skip


def _env(tree: str | None, cache: str | None) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.path.abspath(tree)
    if cache is not None:
        env["XDG_CACHE_HOME"] = cache
    env.pop("SIMPAR_NO_COMPILE_CACHE", None)
    return env


def _stats(xs: list[float]) -> dict:
    return {"min": min(xs), "median": round(statistics.median(xs), 1), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--tree", action="append", help="a simpar checkout to run (PYTHONPATH; "
                    "repeatable; default: the environment's simpar)")  # fmt: skip
    ap.add_argument("--keep", help="directory for the runs' output files (default: deleted)")
    ap.add_argument("--no-lammps", action="store_true", help="skip LAMMPS")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1:
        print("bench_md_memory.py: --rounds and --steps must be >= 1", file=sys.stderr)
        sys.exit(2)
    trees = args.tree or [None]
    for tree in trees:
        if tree is not None and not os.path.isdir(os.path.join(tree, "simpar")):
            print(f"bench_md_memory.py: --tree {tree!r} holds no simpar package", file=sys.stderr)
            sys.exit(2)
    sys.path.insert(0, HERE)
    import lammps_peer

    lmp = None if args.no_lammps else lammps_peer.find_lmp()
    work = tempfile.mkdtemp(prefix="simpar-memory-")
    keep = os.path.abspath(args.keep) if args.keep else work
    os.makedirs(keep, exist_ok=True)
    with open(os.path.join(work, "in.lj"), "w") as fh:
        fh.write(lammps_peer.in_lj(20, steps=args.steps))
    py = sys.executable
    fig: dict = {"bare_jax": [], "import_jax_only": [], "lammps": [],
                 **{f"{i}": {"cold": [], "warm": []} for i in range(len(trees))}}  # fmt: skip
    bare = "import jax, jax.numpy as jnp; jax.block_until_ready(jnp.ones(3).sum())"
    loads, summaries = [], {}
    # which simpar each tree runs (a check that --tree really selects it)
    where = "import simpar; print(simpar.__file__)"
    simpar_files = [subprocess.run([py, "-c", where], env=_env(tree, None), cwd=work, text=True,
                                   capture_output=True).stdout.strip() for tree in trees]  # fmt: skip
    try:
        for rnd in range(args.rounds):
            loads.append(os.getloadavg()[0])
            fig["bare_jax"].append(peak_of([py, "-c", bare], _env(None, None), work))
            fig["import_jax_only"].append(peak_of([py, "-c", "import jax"], _env(None, None),
                                                  work))  # fmt: skip
            if lmp:
                fig["lammps"].append(peak_of([lmp, "-in", "in.lj", "-log", "none"],
                                             dict(os.environ), work))  # fmt: skip
            for i, tree in enumerate(trees):
                cache = tempfile.mkdtemp(prefix="cache-", dir=work)
                for kind in ("cold", "warm"):
                    out = os.path.join(keep, f"{i}_{kind}_{rnd}.h5md")
                    cmd = [py, "-m", "simpar", "run", TOML, "--steps", str(args.steps),
                           "--out", out, "--overwrite", "--quiet"]  # fmt: skip
                    # not from a checkout: ``python -m`` puts the working directory first
                    # on sys.path, ahead of PYTHONPATH
                    res = peak_of(cmd, _env(tree, cache), work)
                    summaries[f"{i}_{kind}"] = json.loads(res["stdout"])
                    fig[f"{i}"][kind].append(res)
                    if not args.keep:
                        os.remove(out)
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peaks = lambda runs: [r["peak_mib"] for r in runs]  # noqa: E731
    base = statistics.median(peaks(fig["bare_jax"]))
    base_import = statistics.median(peaks(fig["import_jax_only"]))
    lmp_peak = statistics.median(peaks(fig["lammps"])) if fig["lammps"] else None
    out = {
        "command": f"python -m simpar run experiments/lj_bench.toml --steps {args.steps}",
        "rounds": args.rounds,
        "load_avg_1min_per_round": loads,
        "bare_jax_peak_mib": _stats(peaks(fig["bare_jax"])),
        "import_jax_only_peak_mib": _stats(peaks(fig["import_jax_only"])),
        "lammps_peak_mib": _stats(peaks(fig["lammps"])) if lmp_peak else None,
        "this_script_vmhwm_mib": round(vmhwm_mib() or 0.0, 1),
        "trees": {},
    }
    for i, tree in enumerate(trees):
        row: dict = {"tree": os.path.abspath(tree) if tree else "environment",
                     "simpar_file": simpar_files[i]}  # fmt: skip
        for kind in ("cold", "warm"):
            runs = fig[f"{i}"][kind]
            above = [round(p - base, 1) for p in peaks(runs)]
            row[kind] = {
                "peak_mib": _stats(peaks(runs)),
                "above_bare_jax_mib": _stats(above),
                "wall_s": _stats([r["wall_s"] for r in runs]),
                "peak_mib_per_round": peaks(runs),
            }
            if lmp_peak:
                med = statistics.median(peaks(runs))
                row[kind]["ratio_to_lammps"] = round((med - base) / lmp_peak, 2)
                row[kind]["ratio_to_lammps_above_import_jax_only"] = round(
                    (med - base_import) / lmp_peak, 2)  # fmt: skip
            s = summaries.get(f"{i}_{kind}", {})
            row[kind]["summary_peak_memory_mib"] = s.get("peak_memory_mib")
            row[kind]["final"] = {k: s.get("final", {}).get(k)
                                  for k in ("temperature", "total_energy")}  # fmt: skip
        out["trees"][str(i)] = row
    if args.keep:
        out["outputs"] = keep
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
