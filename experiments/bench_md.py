"""Benchmark: LAMMPS in.lj (32,000 LJ atoms, fcc 0.8442, T 1.44, rc 2.5, skin 0.3, dt 0.005)
on the ``single`` engine, in float32 and float64. Prints one JSON object.

What it shows: atom-steps/s of the jitted NVE chunk (neighbour list rebuilt inside the
chunk whenever any atom moved more than skin/2, i.e. the exact policy, which rebuilds more
often than LAMMPS's "every 20 check no"). Reference points on the 2-core CPU machines:
LAMMPS serial ~1.6-1.8 M atom-steps/s, JAX-MD ~0.13 M.

Method: step-0 thermo, a warm-up chunk (compilation), then the first 100 steps timed as
chunks of ``--chunk`` steps (the melting lattice rebuilds its list most often there), and
the best of ``--repeats`` further chunks. Also reports the NVE energy drift over 100 steps.
Each chunk consumes its start's neighbour list (``Simulation.consume_list``), as the chunks of
``simpar run`` do, instead of copying it (12 MiB, ~15 ms per chunk in float64).

Run (about 1-2 minutes on 2 CPU cores):
    .venv/bin/python experiments/bench_md.py [--cells 20] [--chunk 20] [--repeats 3]

``--engines single,pmap:1,pmap:2,shard_map:1,shard_map:2,pmap:8,shard_map:8`` adds the
spatially decomposed engines (``simpar.particles.decomposed_sim``) on meshes of 1, 2 and 8 devices
(8 virtual CPU devices share the cores: that measures the decomposition's overhead), with
ratios to ``single`` from the same run, and the time split of one ``single`` step into
neighbour build, forces, integration and (for the 1x1x1 decomposition) the ghost exchange.
``--processes 2`` runs the engines as 2 processes of one CPU device each, joined by
``jax.distributed`` (gloo), like 2 MPI ranks: XLA:CPU runs the virtual devices of one
process one after another (a pmap of two equal blocks takes twice one block), so only
separate processes measure what two devices on two cores give. ``single`` then runs as its
own 1-process, 1-device job for the ratios.
Each process of ``--processes N`` is pinned to its own core (``os.sched_setaffinity`` before
it starts: core ``i`` modulo the cores available; ``single`` on the first) and reports its
affinity in the JSON (``affinity``); unpinned runs share cores and one already uses ~1.4.
The 1-process job (``single`` and the engines listed as ``name:1``) and the N-process job take
turns ``--rounds`` times, each keeping its best chunk, with the load average before each job
(``bench_md_procs.py``). ``--every N --check yes|no`` set the neighbour policy of every engine
(LAMMPS's ``neigh_modify``; default the exact skin/2 check after every step).
Every JSON holds ``memory``: the peak RSS above the Python + JAX baseline (the RSS once the
backend is up); ``--memory`` adds ``compiled.memory_analysis()`` of each engine's chunk
(arguments, outputs, temporaries, code) and the size of its state and lists. ``--vs-lammps`` runs LAMMPS's ``bench/in.lj`` (``lmp`` or
``lmp_serial`` on PATH; ``lammps_peer.py``) and this benchmark (``single``, each of
``--dtypes``, default float32 and float64, against LAMMPS's double run) in
interleaved rounds, each job pinned to the same core, with both policies (simpar exact vs LAMMPS
``every 1 check yes``; simpar ``every 20 check no`` vs in.lj as shipped), simpar's 100 steps as
one chunk (in.lj has no ``thermo`` line: LAMMPS computes the energy at step 100 only, and so does
one chunk; ``simpar run`` of ``lj_bench.toml`` writes every 20 steps), and prints the best of
``--rounds`` of each, the ratios and both codes' rebuild counts, with the split of each run into
neighbour builds and forces on both sides in CPU time (LAMMPS's Neigh and Pair sections times
its loop's "% CPU use"; simpar's build and force programs timed apart on the run's step-100
configuration, per build and per step, and scaled to the run's builds and 100 steps:
``split_first_100_steps``; ``rest_cpu_s``: simpar's loop less both). ``cpu_ratio_simpar_to_lammps``
compares the loops' CPU times, steadier than the wall clocks on a shared machine. simpar starts there from
LAMMPS's own step-0 velocities (``--velocities``, written by LAMMPS once): its ``velocity
create`` draws them uniformly, and from simpar's Gaussian ones the fastest atoms cross skin/2
sooner (the exact policy rebuilt 14 times in the first 100 steps where LAMMPS rebuilt 11; from
LAMMPS's velocities simpar rebuilds 11 times too and prints LAMMPS's step-100 thermo).
The process holds 8 virtual CPU devices only for ``--engines`` and ``--comm``; ``single`` alone
runs with one, as ``simpar run`` does (with 8 it took 1.3x the CPU time).
``--collectives mpi`` (with ``--processes N``) starts the workers with ``mpirun -np N
--bind-to core`` and JAX's MPI collectives instead of gloo (``bench_md_procs.py``; needs
``MPITRAMPOLINE_LIB``, docs/multiprocess.md; not run in CI).
``--comm`` reports the collectives in the compiled ``sharded`` LJ chunk (HLO) and the bytes
they move per step, beside the bytes of the ghost exchange of the decomposition.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import jax

from simpar.benchmark import environment  # noqa: E402

jax.config.update("jax_enable_x64", True)

import re  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from bench_md_procs import memory_report, peak_rss_mib, pinner, processes, rss_mib  # noqa: E402

from simpar.parallel import ghosts  # noqa: E402
from simpar.parallel.particles import shard_particles  # noqa: E402
from simpar.particles import decomposed_sim as domain  # noqa: E402
from simpar.particles import integrate, lattice, md, neighbors, potentials, space  # noqa: E402


def best_chunk(sim, chunk: int, repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` chunks of ``chunk`` steps."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        sim.advance(chunk)
        jax.block_until_ready(sim.state)
        best = min(best, time.perf_counter() - t0)
    return best


def _tree_mib(tree) -> float:
    """MiB of a pytree's arrays held by this process (its devices' shards)."""
    return sum(sh.data.nbytes for x in jax.tree.leaves(tree)
               for sh in x.addressable_shards) / 2**20  # fmt: skip


def bench(dtype, cells: int, chunk: int, repeats: int, skin: float, every: int = 1,
          check: bool = True, velocities: str | None = None,
          memory: bool = False) -> dict:  # fmt: skip
    r, box = lattice.cubic_lattice("fcc", 0.8442, (cells,) * 3, dtype)
    n = r.shape[0]
    if velocities:  # LAMMPS's own step-0 velocities: the same trajectory, the same rebuilds
        import lammps_peer

        v = jnp.asarray(lammps_peer.lattice_velocities(velocities, r, float(box[0])), dtype)
    else:
        v = lattice.maxwell_boltzmann(jax.random.PRNGKey(87287), n, 1.44, dtype=dtype)
    spc = space.periodic(box, dtype)
    pot = potentials.lennard_jones(cutoff=2.5, dtype=dtype)
    t0 = time.perf_counter()
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=skin, every=every, check=check)
    th0 = sim.thermo()
    setup = time.perf_counter() - t0
    # as ``simpar run`` (drive/lj.py): a chunk consumes its start's list instead of copying it,
    # so each restart from ``start`` takes a copy of its list, made before the clock starts
    sim.consume_list = True
    start = (sim.state, sim.nbrs)

    def restart():
        return start[0], jax.block_until_ready(jax.tree.map(jnp.copy, start[1]))

    sim.state, sim.nbrs = restart()
    t0 = time.perf_counter()
    sim.advance(chunk)  # compiles
    jax.block_until_ready(sim.state)
    compile_s = time.perf_counter() - t0
    sim.state, sim.nbrs = restart()
    builds0 = int(sim.nbrs.n_builds)
    t0, c0 = time.perf_counter(), time.process_time()
    done = 0
    while done < 100:
        sim.advance(min(chunk, 100 - done))
        done += min(chunk, 100 - done)
    jax.block_until_ready(sim.state)
    first100 = time.perf_counter() - t0
    first100_cpu = time.process_time() - c0
    th100 = sim.thermo()
    builds = int(sim.nbrs.n_builds) - builds0
    best = best_chunk(sim, chunk, repeats)
    split = _split(sim, pot, spc, builds) if velocities else {}
    mem = {}
    if memory:
        mem = {name: memory_report(low.compile()) for name, low in sim.lowered(chunk).items()}
        mem["state_and_list_mib"] = _tree_mib((sim.state, sim.nbrs))
    return {
        "compiled_chunk_memory": mem,
        "split_first_100_steps": split,
        "n_atoms": n,
        "steps_per_chunk": chunk,
        "atom_steps_per_s_best_chunk": n * chunk / best,
        "atom_steps_per_s_first_100_steps": n * 100 / first100,
        "cpu_s_first_100_steps": first100_cpu,
        "neighbor_builds_first_100_steps": builds,
        "max_neighbors": sim.spec.max_neighbors,
        "neighbor_regrows": sim.regrows,
        "setup_s": setup,
        "compile_and_warmup_s": compile_s,
        "step0": {
            k: th0[k] for k in ("temperature", "potential_energy", "total_energy", "pressure")
        },
        "step100": {
            k: th100[k] for k in ("temperature", "potential_energy", "total_energy", "pressure")
        },
        "energy_drift_per_atom_100_steps": th100["total_energy"] - th0["total_energy"],
    }


def _split(sim, pot, spc, builds: int, steps: int = 100) -> dict:
    """The neighbour build and the forces of ``sim``'s run, timed apart on its current
    configuration (each the best CPU time of 5 calls of the program the time steps use:
    ``neighbors.build``, ``md.pair_forces`` without energy), and scaled to the ``builds``
    rebuilds and ``steps`` force evaluations of the first 100 steps (LAMMPS's Neigh and
    Pair sections)."""
    s, nb = sim.state, sim.nbrs
    build = jax.jit(neighbors.build, static_argnums=0)
    forces = jax.jit(lambda r, idx: md.pair_forces(pot, spc, r, idx, energy=False))
    b = _best(build, sim.spec, spc, s.position, s.valid, clock=time.process_time)
    f = _best(forces, s.position, nb.idx, clock=time.process_time)
    return {"build_s_per_build": b, "build_s": b * builds, "forces_s_per_step": f,
            "forces_s": f * steps}  # fmt: skip


def _system(dtype, cells):
    r, box = lattice.cubic_lattice("fcc", 0.8442, (cells,) * 3, dtype)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(87287), r.shape[0], 1.44, dtype=dtype)
    return r, v, space.periodic(box, dtype), potentials.lennard_jones(cutoff=2.5, dtype=dtype)


def _best(fn, *args, repeats=5, clock=time.perf_counter):
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        jax.block_until_ready(fn(*args))
        best = min(best, clock() - t0)
    return best


def bench_engines(engines: list[str], dtype, cells: int, chunk: int, repeats: int,
                  every: int = 1, check: bool = True, memory: bool = False) -> dict:  # fmt: skip
    """Atom-steps/s of each engine (``name`` or ``name:devices``): every engine compiles
    with a warm-up chunk, then the engines take turns, one chunk each per round, and each
    keeps its best chunk. All engines follow the same trajectory, so round ``k`` times the
    same steps (the same rebuilds) on every engine, and a slow moment of the machine hits
    them all alike. ``every``, ``check``: the neighbour policy of every engine; ``memory``:
    add ``compiled.memory_analysis()`` of each engine's chunk."""
    r, v, spc, pot = _system(dtype, cells)
    n = r.shape[0]
    sims, mem = {}, {}
    kw = dict(dt=0.005, skin=0.3, every=every, check=check)
    for eng in engines:
        engine, _, m = eng.partition(":")
        if engine == "single":
            sims[eng] = md.make_simulation(spc, pot, r, v, **kw)
        else:
            sims[eng] = domain.make_domain_simulation(engine, (int(m),), spc, pot, r, v, **kw)
        sims[eng].advance(chunk)  # compiles
        if memory:
            sim = sims[eng]
            if engine == "single":
                mem[eng] = {name: memory_report(low.compile())
                            for name, low in sim.lowered(chunk).items()}  # fmt: skip
                mem[eng]["state_and_list_mib"] = _tree_mib((sim.state, sim.nbrs))
            else:
                lowered = sim._fn("chunk").lower(sim.state, sim.lists, spc, pot, sim.params,
                                                 jnp.int32(chunk), False)  # fmt: skip
                mem[eng] = {**memory_report(lowered.compile()),
                            "state_and_list_mib": _tree_mib((sim.state, sim.lists))}  # fmt: skip
    best = dict.fromkeys(sims, float("inf"))
    builds0 = {eng: sim.builds for eng, sim in sims.items()}
    for _ in range(repeats):
        for eng, sim in sims.items():
            best[eng] = min(best[eng], best_chunk(sim, chunk, 1))
    out = {}
    for eng, sim in sims.items():
        out[eng] = {"atom_steps_per_s": n * chunk / best[eng], "regrows": sim.regrows,
                    "neighbor_builds_timed": sim.builds - builds0[eng],
                    "compiled_chunk_memory": mem.get(eng, {})}  # fmt: skip
    return out


def time_split(dtype, cells: int) -> dict:
    """Seconds per call of the parts of one single-engine step (32,000 atoms).

    ``neighbor_build`` is paid at rebuilds only (about every 10 steps in in.lj);
    ``ghost_exchange`` is the per-step forward communication of a 1x1x1 decomposition
    (local copies of the ghost positions), ``ghost_borders`` its per-rebuild selection.
    """
    r, v, spc, pot = _system(dtype, cells)
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3)
    s, nb, spec = sim.state, sim.nbrs, sim.spec
    build = jax.jit(neighbors.build, static_argnums=0)
    forces = jax.jit(lambda r, idx: md.pair_forces(pot, spc, r, idx, energy=False))
    shift = lambda x: space.wrap(spc, x)  # noqa: E731

    @jax.jit
    def integ(r, v, f):
        r, v = integrate.verlet_drift(r, v, f, s.mass, sim.params.dt, shift)
        return r, integrate.kick(v, f, s.mass, sim.params.dt)

    out = {
        "neighbor_build": _best(build, spec, spc, s.position, s.valid),
        "forces": _best(forces, s.position, nb.idx),
        "integration": _best(integ, s.position, s.velocity, s.force),
    }
    dom = domain.make_domain_simulation("local", (1,), spc, pot, r, v, dt=0.005, skin=0.3)
    comm, dspec = dom.mapper.comm, dom.spec
    st = jax.tree.map(lambda x: x[0], dom.state)
    ls = jax.tree.map(lambda x: x[0], dom.lists)
    fwd = jax.jit(lambda p, sends: ghosts.forward(dspec, comm, sends, p))
    box = spc.box.astype(dtype)
    bord = jax.jit(lambda p, ids: ghosts.borders(dspec, comm, box, p, ids)[4])
    out["ghost_exchange"] = _best(fwd, st.position, ls.sends)
    out["ghost_borders"] = _best(bord, st.ref_position, st.ids)
    out["ghosts_per_atom"] = float(np.sum(np.asarray(ls.ghost_ids) >= 0)) / r.shape[0]
    return out


_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "pred": 1}


def _shape_bytes(text: str) -> int:
    total = 0
    for dt, dims in re.findall(r"(f64|f32|s32|u32|s64|u64|pred)\[([\d,]*)\]", text):
        total += _BYTES[dt] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
    return total


def collectives(cells: int = 10, n_dev: int = 8, mesh=(2, 2, 2)) -> dict:
    """Collectives of the compiled ``sharded`` LJ chunk and the ghost-exchange volume.

    The sharded chunk is ``md.run_chunk`` on particle arrays split over a 1-D ``Auto`` mesh;
    its compiled HLO is read per computation (the time step is the while loop's body, the
    neighbour rebuild a conditional inside it). Bytes are the result sizes of each
    collective (per device). The decomposition's forward exchange sends, per step and
    device, the positions of the ghosts it feeds its neighbours (``sum(send)`` slots).
    """
    dtype = jnp.float64
    r, v, spc, pot = _system(dtype, cells)
    n = r.shape[0]
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3,
                             placement=lambda t: shard_particles(t, n_dev, n))  # fmt: skip
    lowered = md.run_chunk.lower("nve", sim.spec, sim.space, sim.pot, sim.params, sim.state,
                                 sim.nbrs, jnp.int32(10),
                                 block=md.row_block(sim.state.position))  # fmt: skip
    txt = lowered.compile().as_text()
    comp, found = None, []
    for line in txt.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            comp = "ENTRY" if line.startswith("ENTRY") else line.split(" ")[0].lstrip("%")
        for op in ("all-gather", "all-reduce", "collective-permute", "all-to-all"):
            if f" {op}(" in line or f" {op}-start(" in line:
                lhs = line.split("=", 1)[1].split(op)[0]
                found.append({"computation": comp, "op": op, "result": lhs.strip(),
                              "bytes": _shape_bytes(lhs)})  # fmt: skip
    # the time step: the while body with the most collectives that is not the rebuild
    per_comp: dict = {}
    for f in found:
        per_comp.setdefault(f["computation"], []).append(f)
    dom = domain.make_domain_simulation("shard_map", mesh, spc, pot, r, v, dt=0.005, skin=0.3)
    ghost_mask = np.asarray(dom.mapper.get(dom.lists.ghost_ids)) >= 0
    itemsize = np.dtype(dtype).itemsize
    return {
        "n_atoms": n,
        "sharded_devices": n_dev,
        "sharded_collectives_by_computation": per_comp,
        "domain_mesh": list(mesh),
        "domain_ghost_slots_per_device": int(dom.spec.n_ghosts),
        "domain_ghosts_per_device_mean": float(ghost_mask.sum(1).mean()),
        "domain_bytes_sent_per_step_per_device_capacity": int(dom.spec.n_ghosts) * 3 * itemsize,
        "domain_bytes_sent_per_step_per_device_used": float(ghost_mask.sum(1).mean())
        * 3
        * itemsize,
        "domain_collective_permutes_per_step": 2 * sum(m > 1 for m in mesh),
    }


def _vs_lammps(args) -> dict:
    """``--vs-lammps``: LAMMPS in.lj and simpar ``single`` float64, interleaved, pinned."""
    import lammps_peer

    lmp = lammps_peer.find_lmp()
    if lmp is None:
        raise SystemExit("--vs-lammps: neither lmp nor lmp_serial is on PATH (Debian: lammps)")
    import tempfile

    core = {sorted(os.sched_getaffinity(0))[-1]}
    tmp = tempfile.TemporaryDirectory()
    vel = lammps_peer.initial_velocities(lmp, tmp.name, args.cells)
    policies = {"exact_vs_check_yes": (1, True), "every20_check_no_vs_in.lj": (20, False)}
    dtypes = args.dtypes.split(",")
    best: dict = {k: {"lammps": None, **{d: None for d in dtypes}} for k in policies}
    loads = []
    for _ in range(args.rounds):
        for name, (every, check) in policies.items():
            loads.append(os.getloadavg()[0])
            lam = lammps_peer.run_lammps(lmp, lammps_peer.in_lj(args.cells, every, check), core)
            cmd = [sys.executable, __file__, "--cells", str(args.cells), "--chunk",
                   "100", "--repeats", "1", "--skin", "0.3", "--dtypes",
                   args.dtypes, "--every", str(every), "--check", "yes" if check else "no",
                   "--velocities", vel]  # fmt: skip
            res = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pinner(core))
            if res.returncode:
                raise SystemExit(f"simpar benchmark failed: {res.stderr[-800:]}")
            sim = json.loads(res.stdout[res.stdout.index("{\n") :])
            b = best[name]
            if b["lammps"] is None or lam["atom_steps_per_s"] > b["lammps"]["atom_steps_per_s"]:
                b["lammps"] = lam
            key = "atom_steps_per_s_first_100_steps"
            for d in dtypes:
                run = sim[d]
                run["affinity"] = sim["affinity"]
                if b[d] is None or run[key] > b[d][key]:
                    b[d] = run
    for b in best.values():
        lam = b["lammps"]
        steps = lam["steps"]
        # per build and per step in CPU time (simpar's split is process time): the sections'
        # wall times times the loop's "% CPU use"
        use = (lam["cpu_use_percent"] or 100.0) / 100
        lam["split"] = {"neigh_s": lam["neigh_s"], "pair_s": lam["pair_s"],
                        "neigh_cpu_s_per_build": lam["neigh_s"] * use
                        / max(lam["neighbor_builds"], 1),
                        "pair_cpu_s_per_step": lam["pair_s"] * use / steps}  # fmt: skip
        for d in dtypes:
            s = b[d]
            sp = s["split_first_100_steps"]
            b[d] = {"simpar": s,
                    "ratio_simpar_to_lammps": s["atom_steps_per_s_first_100_steps"]
                    / lam["atom_steps_per_s"],
                    "builds": {"simpar": s["neighbor_builds_first_100_steps"],
                               "lammps": lam["neighbor_builds"]},
                    # CPU time of the loop (process time; LAMMPS: loop x its "% CPU use"):
                    # a shared core slows both codes' wall clocks unevenly
                    "cpu_ratio_simpar_to_lammps": lam["loop_s"] * lam["cpu_use_percent"]
                    / 100 / s["cpu_s_first_100_steps"] if lam["cpu_use_percent"] else None,
                    "build_per_build_ratio_to_lammps_neigh": sp["build_s_per_build"]
                    / lam["split"]["neigh_cpu_s_per_build"],
                    "forces_per_step_ratio_to_lammps_pair": sp["forces_s_per_step"]
                    / lam["split"]["pair_cpu_s_per_step"],
                    "rest_cpu_s": s["cpu_s_first_100_steps"] - sp["build_s"] - sp["forces_s"]}  # fmt: skip
    tmp.cleanup()
    return {"lammps": lmp, "core": sorted(core), "rounds": args.rounds, "dtypes": dtypes,
            "initial_velocities": "LAMMPS's (velocity create 1.44 87287 loop geom: uniform)",
            "load_average_1min": loads, "policies": best}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skin", type=float, default=0.3)
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument(
        "--engines",
        default="",
        help="e.g. single,pmap:1,pmap:2,shard_map:1,shard_map:2,pmap:8,shard_map:8",
    )
    ap.add_argument("--split", action="store_true", help="time split of a single step")
    ap.add_argument("--comm", action="store_true", help="sharded HLO collectives vs ghosts")
    ap.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run the engines as this many 1-device processes (jax.distributed)",
    )
    ap.add_argument("--every", type=int, default=1, help="neighbour policy: check every N steps")
    ap.add_argument("--check", choices=("yes", "no"), default="yes",
                    help="neighbour policy: rebuild only when an atom moved skin/2 (yes)")  # fmt: skip
    ap.add_argument("--vs-lammps", action="store_true",
                    help="LAMMPS in.lj and simpar interleaved on one pinned core")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of --vs-lammps and --processes (best of)")  # fmt: skip
    ap.add_argument("--velocities", help="a LAMMPS dump of in.lj's step-0 velocities "
                    "(lammps_peer.initial_velocities; --vs-lammps makes one)")  # fmt: skip
    ap.add_argument("--memory", action="store_true",
                    help="memory_analysis() of each compiled chunk and its arrays")  # fmt: skip
    ap.add_argument("--collectives", choices=("gloo", "mpi"), default="gloo",
                    help="CPU collectives of --processes N (mpi: started by mpirun)")  # fmt: skip
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)  # set for the worker processes
    ap.add_argument("--num-processes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.collectives == "mpi" and args.processes < 2 and not args.coordinator:
        ap.error("--collectives mpi is for --processes N (N >= 2)")
    if args.coordinator:  # a worker: one CPU device of a multi-process run
        from simpar.parallel import distributed

        jax.config.update("jax_num_cpu_devices", 1)
        pid = args.process_id
        if pid is None:  # an MPI rank (--collectives mpi)
            pid = int(os.environ["OMPI_COMM_WORLD_RANK"])
        distributed.initialize(args.coordinator, args.num_processes, pid)
    elif args.engines or args.comm:
        # 8 virtual CPU devices only where a run needs them: ``single`` in a process holding 8
        # took 1.3x the CPU time of one holding 1 (in.lj, 100 steps, one pinned core), and a
        # user's ``simpar run`` of ``single`` holds 1
        jax.config.update("jax_num_cpu_devices", 8)
    if args.vs_lammps:
        print(json.dumps({"benchmark": "LAMMPS in.lj (double) vs simpar single, pinned",
                          **environment(), "host": platform.node(),
                          **_vs_lammps(args)}, indent=1))  # fmt: skip
        return
    elif args.processes > 1:
        print(json.dumps({"benchmark": "LAMMPS in.lj, engines as processes",
                          **environment(), **processes(args, __file__)},
                         indent=1))  # fmt: skip
        return
    jax.block_until_ready(jnp.zeros(1) + 1)  # the backend is up: the RSS baseline
    baseline = rss_mib()
    out = {
        "benchmark": "LAMMPS in.lj, single engine",
        **environment(),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "host": platform.node(),
        "skin": args.skin,
        "neighbor_policy": {"every": args.every, "check": args.check},
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    if args.comm:
        out["communication"] = collectives()
        print(json.dumps(out, indent=1))
        return
    for name in args.dtypes.split(","):
        dtype = jnp.dtype(name)
        if not args.engines:
            out[name] = bench(dtype, args.cells, args.chunk, args.repeats, args.skin,
                              args.every, args.check == "yes", args.velocities,
                              args.memory)  # fmt: skip
            continue
        res = bench_engines(args.engines.split(","), dtype, args.cells, args.chunk, args.repeats,
                            args.every, args.check == "yes", args.memory)  # fmt: skip
        for eng, r in res.items():
            print(name, eng, r, flush=True)
        if "single" in res:
            for r in res.values():
                r["ratio_to_single"] = r["atom_steps_per_s"] / res["single"]["atom_steps_per_s"]
        if args.split:
            res["single_time_split_s"] = time_split(dtype, args.cells)
        out[name] = res
    peak = peak_rss_mib()
    out["memory"] = {"baseline_rss_mib": baseline, "peak_rss_mib": peak,
                     "peak_above_baseline_mib": peak - baseline}  # fmt: skip
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
