"""Helpers of ``bench_md.py``: pinned multi-process jobs, interleaved rounds, memory figures.

``processes(args, script)`` runs ``bench_md.py``'s engines as ``--processes N`` processes of
one CPU device each (``jax.distributed``, like N MPI ranks), each pinned to its own core,
against one pinned 1-device process, in interleaved rounds (1 process, N processes, 1, N, ...),
keeping each job's best, and records the load average before every job: on a shared machine
such figures are only indicative. ``--collectives gloo`` (the default) starts the workers here,
pinned with ``os.sched_setaffinity`` before they start; ``--collectives mpi`` starts them with
``mpirun -np N --bind-to core --map-by core`` and ``SIMPAR_CPU_COLLECTIVES=mpi`` (JAX's
MPItrampoline collectives; ``MPITRAMPOLINE_LIB`` must name an MPIwrapper library:
docs/multiprocess.md; this path cannot run in CI). Either way each worker records the affinity it
sees. When LAMMPS (``lmp``) and ``mpirun`` are on PATH, each round also runs LAMMPS's in.lj
(the same cells and neighbour policy, 100 steps) on one pinned core and as N MPI ranks bound one
per core (``lammps_peer.run_lammps``), so the JSON holds LAMMPS's own scaling measured in the
same window (``lammps``) and each float64 engine's ratio to it (``scaling_vs_lammps``): on a
shared machine the two codes' ratios move together.

``rss_mib`` / ``memory_report`` give the peak resident memory above the Python + JAX baseline
(RSS once the backend is up, before any system is built) and the sizes XLA reports for a
compiled chunk (``compiled.memory_analysis()``: arguments, outputs, temporaries, code).
"""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile


def pinner(cpus: set[int]):
    """A ``preexec_fn`` pinning the child to ``cpus`` before it starts (its threads inherit it;
    ``XLA_FLAGS`` thread limits did not hold XLA to one core, affinity does)."""
    return lambda: os.sched_setaffinity(0, cpus)


def rss_mib() -> float:
    """Current resident set size of this process (MiB; Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (MiB): Linux's ``VmHWM``, else
    ``ru_maxrss`` (KiB on Linux; it survives ``execve``, so a worker started from a larger
    process would report at least that process's size)."""
    try:
        with open("/proc/self/status") as f:
            return int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) / 1024
    except (OSError, ValueError, IndexError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_report(compiled) -> dict:
    """MiB of a compiled program's buffers (``compiled.memory_analysis()``): arguments,
    outputs, temporaries (the peak of the live intermediates), generated code."""
    m = compiled.memory_analysis()
    names = ("argument", "output", "alias", "temp", "generated_code")
    return {
        f"{k}_mib": getattr(m, f"{k}_size_in_bytes") / 2**20
        for k in names
        if hasattr(m, f"{k}_size_in_bytes")
    }


def _job(args, script: str, n: int, engines: str, cores: list[int]) -> dict:
    """One benchmark job: ``n`` pinned processes of ``script``; process 0's JSON with the
    affinity and peak RSS of every process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, script, "--cells", str(args.cells), "--chunk", str(args.chunk),
           "--repeats", str(args.repeats), "--skin", str(args.skin), "--dtypes", args.dtypes,
           "--engines", engines, "--every", str(args.every), "--check", args.check,
           "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n)]  # fmt: skip
    if args.memory:
        cmd.append("--memory")
    if args.collectives == "mpi":
        outs = _mpirun(cmd, n, len(cores))
    else:
        procs = [subprocess.Popen(cmd + ["--process-id", str(i)], stdout=subprocess.PIPE,
                                  text=True, env=dict(os.environ),
                                  preexec_fn=pinner({cores[i % len(cores)]}))  # fmt: skip
                 for i in range(n)]  # fmt: skip
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a benchmark process failed: {[p.returncode for p in procs]}")
    res = [json.loads(o[o.index("{\n") :]) for o in outs]
    return {**res[0], "affinity": [r["affinity"] for r in res],
            "memory_per_process": [r["memory"] for r in res]}  # fmt: skip


def _mpirun(cmd: list[str], n: int, n_cores: int) -> list[str]:
    """``cmd`` as ``n`` MPI ranks (``mpirun``, one per core, MPI collectives); each rank's
    stdout, in rank order (``--output-filename``: one file per rank)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None or not os.environ.get("MPITRAMPOLINE_LIB"):
        raise SystemExit("bench_md.py: --collectives mpi needs mpirun on PATH and "
                         "MPITRAMPOLINE_LIB naming an MPIwrapper library (docs/multiprocess.md)")  # fmt: skip
    bind = "core" if n <= n_cores else "core:overload-allowed"
    with tempfile.TemporaryDirectory() as tmp:
        launcher = [mpirun, "-np", str(n), "--bind-to", bind, "--map-by", "core",
                    "--output-filename", tmp, "-x", "SIMPAR_CPU_COLLECTIVES=mpi",
                    "-x", "MPITRAMPOLINE_LIB", "-x", "PYTHONPATH"]  # fmt: skip
        if n > n_cores:
            launcher.append("--oversubscribe")
        if os.geteuid() == 0:
            launcher.append("--allow-run-as-root")
        run = subprocess.run(launcher + cmd, stdout=subprocess.DEVNULL, env=dict(os.environ))
        if run.returncode:
            raise SystemExit(f"a benchmark process failed: mpirun returned {run.returncode}")
        outs = []
        for rank in range(n):
            (path,) = glob.glob(os.path.join(tmp, "*", f"rank.{rank}", "stdout"))
            with open(path) as f:
                outs.append(f.read())
    return outs


def processes(args, script: str) -> dict:
    """``--processes N``: ``single`` (and the engines listed with ``:1``, e.g. ``shard_map:1``,
    the decomposed code on one device) as one pinned process against the other listed
    engines as N pinned 1-device processes, ``--rounds`` times interleaved; per engine the
    best chunk over the rounds (``ratio_to_single``: best over best) and the ratio of each
    round's two jobs (``ratio_per_round``, ``ratio_median``: the steadier figure on a busy
    machine, whose speed drifts between rounds)."""
    cores = sorted(os.sched_getaffinity(0))
    listed = [e for e in args.engines.split(",") if e]
    one = ",".join(["single"] + [e for e in listed if e.endswith(":1")])
    many_engines = ",".join(e for e in listed if e != "single" and not e.endswith(":1"))
    if not many_engines:
        print("bench_md.py: --processes needs --engines naming the engines to run as processes, "
              "e.g. --engines single,shard_map:1,shard_map:2", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    best: dict = {}
    loads, memory, rounds = [], {}, []

    def keep(key, r: dict) -> None:  # a job's rate in this round, and the best so far
        rounds[-1][key] = r["atom_steps_per_s"]
        if key not in best or r["atom_steps_per_s"] > best[key]["atom_steps_per_s"]:
            best[key] = r

    peer = _lammps_peer(args, cores)
    for _ in range(args.rounds):
        rounds.append({})
        for n, engines in ((1, one), (args.processes, many_engines)):
            loads.append(os.getloadavg())
            res = _job(args, script, n, engines, cores)
            memory[n] = res["memory_per_process"]
            for name in args.dtypes.split(","):
                for eng, r in res[name].items():
                    keep((name, eng if n == 1 else f"{eng}x{n}proc"),
                         {**r, "affinity": res["affinity"]})  # fmt: skip
        if peer is not None:
            import lammps_peer

            for ranks in (1, args.processes):
                cpus = {cores[0]} if ranks == 1 else set(cores)
                keep(("lammps", ranks), lammps_peer.run_lammps(*peer, cpus, ranks))
    out = {"processes": args.processes, "devices_per_process": 1, "rounds": args.rounds,
           "collectives": args.collectives,
           "cores_available": cores, "oversubscribed": args.processes > len(cores),
           "neighbor_policy": {"every": args.every, "check": args.check},
           "load_average_before_each_job": loads,
           "memory_per_process_last_round": {str(k): v for k, v in memory.items()}}  # fmt: skip
    for name in args.dtypes.split(","):
        res = {eng: r for (dt, eng), r in best.items() if dt == name}
        for eng, r in res.items():
            r.update(_ratios(best, rounds, (name, eng), (name, "single"), "ratio_to_single"))
        out[name] = res
    if peer is not None:
        n = args.processes
        out["lammps"] = {"binary": peer[0], "1_rank": best[("lammps", 1)],
                         f"{n}_ranks": best[("lammps", n)],
                         **_ratios(best, rounds, ("lammps", n), ("lammps", 1), "ratio")}  # fmt: skip
        if "float64" in out:
            lam = out["lammps"]
            out["float64"]["scaling_vs_lammps"] = {
                eng: {
                    "best": r["ratio_to_single"] / lam["ratio"],
                    "median": r["ratio_median"] / lam["ratio_median"],
                }
                for eng, r in out["float64"].items()
                if eng.endswith(f"x{n}proc")
            }
    return out


def _ratios(best: dict, rounds: list[dict], key, ref, name: str) -> dict:
    """Job ``key``'s rate over job ``ref``'s: best over best (``name``), each round's
    (``ratio_per_round``) and their median (``ratio_median``)."""
    per_round = [x[key] / x[ref] for x in rounds]
    return {name: best[key]["atom_steps_per_s"] / best[ref]["atom_steps_per_s"],
            "ratio_per_round": per_round,
            "ratio_median": statistics.median(per_round)}  # fmt: skip


def _lammps_peer(args, cores: list[int]):
    """``(lmp, script)``: LAMMPS's binary and in.lj for the peer of a ``--processes N``
    run; None without ``lmp`` / ``mpirun`` on PATH, cores for N ranks, or a float64 run."""
    import lammps_peer

    lmp = lammps_peer.find_lmp()
    if (lmp is None or shutil.which("mpirun") is None or args.processes > len(cores)
            or "float64" not in args.dtypes.split(",")):  # fmt: skip
        return None
    return lmp, lammps_peer.in_lj(args.cells, args.every, args.check == "yes")
