"""Where the time of decomposed LJ goes, per process: in.lj (32,000 atoms, fcc 0.8442, T 1.44,
rc 2.5, skin 0.3, dt 0.005, ``every 20 check no``) on ``shard_map`` over ``--processes N``
processes of one CPU device each (``jax.distributed``, gloo; each pinned to its own core, as
``bench_md.py --processes``), against ``single`` in one pinned process. Prints one JSON object.

Per process, best of ``--repeats`` (ms): the parts of a rebuild (``migrate``, ``borders``:
ghost selection and exchange, ``borders_and_build``, ``relist``: all of a rebuild), a step's
``forward`` ghost exchange and ``forces``; then whole chunks of the run: ``chunk_19`` steps
without a rebuild, ``chunk_1_rebuild`` (the step that rebuilds, with the chunk's closing
energy) and ``chunk_20``; and the CPU seconds of each thread of the process over 10 chunks of
19 steps (``thread_cpu_s``: the XLA compute thread, the collectives' I/O threads) against the
wall time. ``single`` gets the same chunks and ``build`` / ``forces``. ``ideal_ratio`` is
``single``'s ``chunk_20`` over the slowest process's sum of its parts for 20 steps (one
rebuild, 20 forces, 20 exchanges, one energy pass), each timed as its own call (a program
launch included, so a loose bound): about the speed-up if nothing else cost time.

Run (about 1 minute):
    PYTHONPATH=$PWD .venv/bin/python experiments/bench_md_split.py [--processes 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import time

import jax

from simpar.benchmark import environment  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from bench_md import _best as best_of  # noqa: E402
from bench_md import _system  # noqa: E402
from bench_md_procs import pinner  # noqa: E402

from simpar.parallel import capacity as caps  # noqa: E402
from simpar.parallel import ghosts  # noqa: E402
from simpar.particles import decomposed, md, neighbors  # noqa: E402
from simpar.particles import decomposed_sim as domain  # noqa: E402
from simpar.particles.forces import pair_forces  # noqa: E402

KW = dict(dt=0.005, skin=0.3, every=20, check=False)


def _best(fn, *args, repeats: int) -> float:
    """Best of ``repeats`` calls (after one warm-up), ms."""
    return round(1e3 * best_of(fn, *args, repeats=repeats), 2)


def _thread_cpu() -> dict:
    """CPU seconds of each thread of this process so far (``/proc/self/task``)."""
    out, tick = {}, os.sysconf("SC_CLK_TCK")
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(task + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(task + "/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[f"{os.path.basename(task)}:{name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _chunks(sim, get, put, repeats: int) -> dict:
    """Best ms of 19 steps without a rebuild, the rebuilding step, and 20 steps (step 40 on)."""
    for n in (20, 19, 1):  # compiles; the state is at step 40 after this
        sim.advance(n)
    start = get()
    res: dict = {"chunk_19": [], "chunk_1_rebuild": [], "chunk_20": []}
    for _ in range(repeats):
        for key, steps in (("chunk_19", (19, 1)), ("chunk_20", (20,))):
            put(start)
            for k, n in zip((key, "chunk_1_rebuild"), steps, strict=False):
                t0 = time.perf_counter()
                sim.advance(n)
                jax.block_until_ready(sim.state)
                res[k].append(time.perf_counter() - t0)
    put(start)
    return {k: round(1e3 * min(x), 1) for k, x in res.items()}


def single(args) -> dict:
    r, v, spc, pot = _system(jnp.float64, args.cells)
    sim = md.make_simulation(spc, pot, r, v, **KW)

    def put(x):
        sim.state, sim.nbrs = x

    out = _chunks(sim, lambda: (sim.state, sim.nbrs), put, args.repeats)
    s, nb = sim.state, sim.nbrs
    out["build"] = _best(neighbors.lean_build(), sim.spec, spc, s.position, s.valid,
                         repeats=args.repeats)  # fmt: skip
    forces = jax.jit(lambda p, idx: pair_forces(pot, spc, p, idx, energy=False))
    out["forces"] = _best(forces, s.position, nb.idx, repeats=args.repeats)
    return out


def worker(args) -> dict:
    r, v, spc, pot = _system(jnp.float64, args.cells)
    sim = domain.make_domain_simulation("shard_map", (args.num_processes,), spc, pot, r, v, **KW)

    def put(x):
        sim.state, sim.lists = x

    out = _chunks(sim, lambda: (sim.state, sim.lists), put, args.repeats)
    comm, spec, mapper = sim.mapper.comm, sim.spec, sim.mapper
    s, ls = sim.state, sim.lists
    box = spc.box.astype(s.position.dtype)
    rep = dict(repeats=args.repeats)

    def migrate(st):
        return ghosts.migrate(spec, comm, box, st.position, st.velocity, st.mass,
                              st.position, st.ids)[0]  # fmt: skip

    def build(st):
        _, e_ref, e_img, e_ids, _ = ghosts.borders(spec, comm, box, st.ref_position, st.ids)
        lo = jnp.stack([ghosts.bounds(spec, comm, box, a)[0] for a in range(3)])
        origin = jnp.where(jnp.asarray(spec.ghost_axes), lo - spec.nbr.radius * (1 + caps.MARGIN),
                           0.0)  # fmt: skip
        return neighbors.build(spec.nbr, spc, e_ref, e_ids >= 0, cell_r=e_img - origin,
                               ids=e_ids).idx  # fmt: skip

    def forces(st, lst):
        others = jnp.concatenate([st.position, lst.ghost_position])
        return pair_forces(pot, spc, st.position, lst.idx, energy=False, others=others)

    out["migrate"] = _best(mapper.map(migrate, 1, 0), s, **rep)
    borders = mapper.map(lambda st: ghosts.borders(spec, comm, box, st.ref_position, st.ids)[1],
                         1, 0)  # fmt: skip
    out["borders"] = _best(borders, s, **rep)
    out["borders_and_build"] = _best(mapper.map(build, 1, 0), s, **rep)
    relist = mapper.map(lambda st, lst: decomposed._relist(spec, comm, spc, st, lst, False)[1].idx,
                        2, 0)  # fmt: skip
    out["relist"] = _best(relist, s, ls, **rep)
    fwd = mapper.map(lambda st, lst: ghosts.forward(spec, comm, lst.sends, st.position), 2, 0)
    out["forward"] = _best(fwd, s, ls, **rep)
    out["forces"] = _best(mapper.map(forces, 2, 0), s, ls, **rep)
    before, t0 = _thread_cpu(), time.perf_counter()
    for _ in range(10):
        put((s, ls))
        sim.advance(19)
    jax.block_until_ready(sim.state)
    wall, after = time.perf_counter() - t0, _thread_cpu()
    busy = {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
    out["thread_cpu_s"] = {k: x for k, x in sorted(busy.items(), key=lambda kv: -kv[1]) if x > 0}
    out["wall_s_10_chunks_of_19"] = round(wall, 3)
    out["affinity"] = sorted(os.sched_getaffinity(0))
    out["owned_atoms"] = int(jnp.sum(s.ids.addressable_shards[0].data >= 0))
    return out


def _spawn(args) -> list[dict]:
    cores = sorted(os.sched_getaffinity(0))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = [sys.executable, __file__, "--cells", str(args.cells), "--repeats", str(args.repeats)]
    one = subprocess.run(base + ["--role", "single"], stdout=subprocess.PIPE, text=True,
                         check=True, preexec_fn=pinner({cores[0]}))  # fmt: skip
    cmd = base + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(args.processes)]
    procs = [subprocess.Popen(cmd + ["--process-id", str(i)], stdout=subprocess.PIPE, text=True,
                              preexec_fn=pinner({cores[i % len(cores)]}))  # fmt: skip
             for i in range(args.processes)]  # fmt: skip
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed: {[p.returncode for p in procs]}")
    # the last JSON line of each (gloo prints its connection notes there too)
    return [json.loads([line for line in o.splitlines() if line.startswith("{")][-1])
            for o in [one.stdout, *outs]]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--cells", type=int, default=20, help="fcc cells per axis (20: in.lj)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    ap.add_argument("--num-processes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "single":
        jax.config.update("jax_num_cpu_devices", 1)
        print(json.dumps(single(args)))
        return
    if args.coordinator:
        from simpar.parallel import distributed

        jax.config.update("jax_num_cpu_devices", 1)
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
        print(json.dumps(worker(args)))
        return
    one, *many = _spawn(args)
    n_forces = 20
    parts = [p["relist"] + n_forces * (p["forces"] + p["forward"]) + p["forces"] for p in many]
    print(json.dumps({
        "benchmark": "in.lj time split, shard_map over pinned processes vs single",
        **environment(), "processes": args.processes, "load_average": os.getloadavg(),
        "single": one, "per_process": many,
        "ratio_chunk_20": one["chunk_20"] / max(p["chunk_20"] for p in many),
        "ideal_ratio": one["chunk_20"] / max(parts),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
