"""Peak memory of LAMMPS's in.lj on the ``single`` engine, stage by stage. Prints one JSON object.

What it shows: the peak resident memory (``ru_maxrss``) above the Python + JAX baseline of a
process that runs in.lj (32,000 LJ atoms, fcc 0.8442, T 1.44 seed 87287, rc 2.5, skin 0.3,
dt 0.005, float64) as ``experiments/bench_md.py`` does: the lattice, the Maxwell-Boltzmann
velocities, the set-up (``md.make_simulation``: the neighbour list and the step-0 forces), a
warm-up chunk (compilation) and the first 100 steps from the start state. Each stage runs in a
fresh process (the peak is a high-water mark), once with an empty persistent compilation cache
(cold: what a first ``simpar run`` sees, the headline) and once with the cache it left (warm:
a second run). The baseline process imports jax and runs one trivial op. With ``lmp`` on PATH
it also runs LAMMPS's in.lj (``lammps_peer.in_lj``, first 100 steps) under
``/usr/bin/time -v`` and reports its maximum resident set and the ratio. The last stage also
reports what dominates: the live JAX arrays by shape and the chunk program's
``memory_analysis()`` (arguments, outputs, temporaries, generated code).

Run (about 2-3 minutes on 2 busy CPU cores):
    PYTHONPATH=$PWD .venv/bin/python experiments/bench_md_memory.py [--cells 20] [--chunk 20]

Target (issue 18): peak above baseline at most 3x LAMMPS's whole process (43 MB -> 129 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile

STAGES = ("baseline", "lattice", "velocities", "setup", "first_100_steps")


def _mib(x: float) -> float:
    return round(x / 2**20, 1)


def _peak_mib() -> float:
    """Peak resident memory of this process so far (Linux ``ru_maxrss``, KiB), in MiB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _rss_mib() -> float:
    """Resident memory now (``VmRSS``), in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def worker(stage: str, cells: int, chunk: int, cache: str | None) -> dict:
    """Run in.lj up to ``stage`` in this process; the figures (MiB) after each stage."""
    import jax

    jax.config.update("jax_enable_x64", True)
    if cache:  # as ``simpar run`` (``simpar.cli._enable_compile_cache``)
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import jax.numpy as jnp

    marks: dict = {}

    def mark(name):
        marks[name] = {"rss_mib": _rss_mib(), "peak_mib": _peak_mib()}

    jax.block_until_ready(jnp.ones(3).sum())
    mark("baseline")
    out = {"stage": stage, "marks": marks}
    if stage == "baseline":
        return out
    from simpar.particles import lattice, md, potentials, space

    dtype = jnp.float64
    r, box = lattice.cubic_lattice("fcc", 0.8442, (cells,) * 3, dtype)
    jax.block_until_ready(r)
    mark("lattice")
    if stage == "lattice":
        return out
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(87287), r.shape[0], 1.44, dtype=dtype)
    jax.block_until_ready(v)
    mark("velocities")
    if stage == "velocities":
        return out
    spc = space.periodic(box, dtype)
    pot = potentials.lennard_jones(cutoff=2.5, dtype=dtype)
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3)
    sim.thermo()
    del r, v
    mark("setup")
    if stage == "setup":
        return out
    start = (sim.state, sim.nbrs)
    sim.advance(chunk)  # compiles
    jax.block_until_ready(sim.state)
    mark("warm_up_chunk")
    sim.state, sim.nbrs = start
    del start
    done = 0
    while done < 100:
        sim.advance(min(chunk, 100 - done))
        done += min(chunk, 100 - done)
    jax.block_until_ready(sim.state)
    mark("first_100_steps")
    out["builds"] = int(sim.nbrs.n_builds)
    out["neighbor_spec"] = {"max_neighbors": sim.spec.max_neighbors,
                            "column_capacity": sim.spec.column_capacity}  # fmt: skip
    by_shape: dict = {}
    for a in jax.live_arrays():
        k = f"{a.dtype}{list(a.shape)}"
        by_shape[k] = by_shape.get(k, 0) + a.nbytes
    top = sorted(by_shape.items(), key=lambda kv: -kv[1])[:8]
    out["live_arrays_mib"] = {"total": _mib(sum(by_shape.values())),
                              **{k: _mib(b) for k, b in top}}  # fmt: skip
    out["chunk_memory_analysis_mib"] = {}
    for name, lowered in sim.lowered(chunk).items():
        ma = lowered.compile().memory_analysis()
        if ma is not None:
            out["chunk_memory_analysis_mib"][name] = {
                k: _mib(getattr(ma, f"{k}_size_in_bytes", 0))
                for k in ("argument", "output", "temp", "alias", "generated_code")
            }
    return out


def run_stage(stage: str, args, cache: str | None) -> dict:
    cmd = [sys.executable, __file__, "--worker", stage, "--cells", str(args.cells),
           "--chunk", str(args.chunk)] + (["--cache", cache] if cache else [])  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if res.returncode:
        raise RuntimeError(f"stage {stage} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def lammps_max_rss(cells: int) -> dict | None:
    """LAMMPS's in.lj (first 100 steps) under ``/usr/bin/time -v``: its maximum RSS (MiB)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lammps_peer

    lmp = lammps_peer.find_lmp()
    if lmp is None or not os.path.exists("/usr/bin/time"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.lj")
        with open(inp, "w") as fh:
            fh.write(lammps_peer.in_lj(cells))
        res = subprocess.run(["/usr/bin/time", "-v", lmp, "-in", inp, "-log", "none"],
                             capture_output=True, text=True, cwd=tmp, timeout=900)  # fmt: skip
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr)
    if res.returncode or m is None:
        return {"error": res.stderr[-500:]}
    return {"lmp": lmp, "max_rss_mib": round(int(m.group(1)) / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--worker", choices=STAGES, help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.cells, args.chunk, args.cache)))
        return
    cache = tempfile.mkdtemp(prefix="simpar-memory-cache-")
    try:
        base = run_stage("baseline", args, None)["marks"]["baseline"]["peak_mib"]
        cold = {s: run_stage(s, args, None) for s in STAGES[1:-1]}
        cold[STAGES[-1]] = run_stage(STAGES[-1], args, cache)  # fills the cache
        warm = run_stage(STAGES[-1], args, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    last = cold[STAGES[-1]]
    peak_cold = last["marks"]["first_100_steps"]["peak_mib"] - base
    peak_warm = warm["marks"]["first_100_steps"]["peak_mib"] - base
    out = {
        "n_atoms": 4 * args.cells**3,
        "dtype": "float64",
        "baseline_peak_mib": base,
        "peak_above_baseline_mib": {
            "cold_cache": round(peak_cold, 1),
            "warm_cache": round(peak_warm, 1),
        },  # fmt: skip
        "stages_peak_above_baseline_mib": {
            s: round(cold[s]["marks"][s]["peak_mib"] - base, 1) for s in STAGES[1:]
        },
        "last_stage_marks_mib": last["marks"],
        "warm_cache_marks_mib": warm["marks"],
        "builds_first_100_steps": last.get("builds"),
        "neighbor_spec": last.get("neighbor_spec"),
        "live_arrays_mib": last.get("live_arrays_mib"),
        "chunk_memory_analysis_mib": last.get("chunk_memory_analysis_mib"),
    }
    lmp = lammps_max_rss(args.cells)
    if lmp is not None:
        out["lammps"] = lmp
        if "max_rss_mib" in lmp:
            out["ratio_cold_to_lammps"] = round(peak_cold / lmp["max_rss_mib"], 2)
            out["ratio_warm_to_lammps"] = round(peak_warm / lmp["max_rss_mib"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
