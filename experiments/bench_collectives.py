"""Latency of cross-process CPU collectives: ``ppermute`` and ``psum`` between 2 processes.

Prints one JSON object. Each job is 2 processes of one CPU device each, joined by
``jax.distributed`` as ``simpar.parallel.distributed`` joins them, with a 1-D mesh ``x`` over
the 2 processes' devices. Under ``jax.shard_map`` each job times

* ``ppermute`` of 8 B, 64 KB and 1.6 MB per device, both directions at once (the pairs
  ``(0, 1), (1, 0)``: each device sends its block to the other and receives the other's);
* ``psum`` of one float64 scalar;
* ``noop``: the same call with no collective (``x + 1``), the dispatch cost of one call;

two ways: ``per_call`` (one collective per jitted call, ``block_until_ready``, timed on the
host: what one small program pays) and ``in_loop`` (a ``lax.fori_loop`` of ``--loop``
chained collectives in one call, divided by ``--loop``: what a collective inside a compiled
chunk, such as an MD step's ghost exchange, pays). Figures are medians over ``--calls`` calls
(``in_loop``: over ``--calls // 10`` calls) after ``--warmup`` calls, from process 0, with
``os.getloadavg()`` read just before each figure; on a shared machine they are indicative.

Jobs: ``--collectives gloo,mpi`` times ``--pin yes,no``. ``gloo`` (the default of simpar's
multi-process runs) starts the workers here, pinned to cores 0 and 1 with
``os.sched_setaffinity`` before they start (``bench_md_procs.pinner``) or not pinned. ``mpi``
(JAX's MPItrampoline collectives) starts them with ``mpirun -np 2 --bind-to core`` (or
``--bind-to none``) and needs ``MPITRAMPOLINE_LIB`` set to an MPIwrapper library built
against the system MPI (``docs/multiprocess.md``); process ids come from
``OMPI_COMM_WORLD_RANK``. Each worker records the CPU affinity it sees.

Run (about a minute; a job that hangs is killed after ``--timeout`` seconds)::

    PYTHONPATH=. .venv/bin/python experiments/bench_collectives.py --collectives gloo
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from simpar.benchmark import environment  # noqa: E402

SIZES = (8, 64 * 1024, 1_600_000)  # bytes per device per ppermute


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker_cmd(args, collectives: str, port: int) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--worker", "--collectives", collectives,
            "--coordinator", f"127.0.0.1:{port}", "--calls", str(args.calls),
            "--warmup", str(args.warmup), "--loop", str(args.loop)]  # fmt: skip


def _launch(args, collectives: str, pin: bool) -> tuple[list[str], list[int]]:
    """Run one 2-process job; (stdout of each launched process, their return codes)."""
    from bench_md_procs import pinner

    cmd = _worker_cmd(args, collectives, _port())
    env = dict(os.environ)
    if collectives == "gloo":
        procs = [subprocess.Popen(cmd + ["--process-id", str(i)], stdout=subprocess.PIPE,
                                  text=True, env=env,
                                  preexec_fn=pinner({i}) if pin else None)  # fmt: skip
                 for i in range(2)]  # fmt: skip
    else:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise SystemExit("bench_collectives.py: --collectives mpi needs mpirun on PATH")
        tmp = tempfile.mkdtemp()  # one stdout file per rank: mpirun's merged output interleaves
        launcher = [mpirun, "-np", "2", "--bind-to", "core" if pin else "none",
                    "--map-by", "core", "--output-filename", tmp,
                    "-x", "MPITRAMPOLINE_LIB", "-x", "PYTHONPATH"]  # fmt: skip
        if os.geteuid() == 0:
            launcher.append("--allow-run-as-root")
        procs = [subprocess.Popen(launcher + cmd, stdout=subprocess.DEVNULL, env=env)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=args.timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"bench_collectives.py: a {collectives} job hung past "
                             f"{args.timeout} s") from None  # fmt: skip
    if collectives == "mpi":
        outs = []
        for path in sorted(glob.glob(os.path.join(tmp, "*", "rank.*", "stdout"))):
            with open(path) as f:
                outs.append(f.read())
        shutil.rmtree(tmp)
    return outs, [p.returncode for p in procs]


def run_job(args, collectives: str, pin: bool) -> dict:
    """One job: the worker results (process 0's figures, every process's affinity)."""
    load = os.getloadavg()
    outs, codes = _launch(args, collectives, pin)
    if any(codes):
        return {"failed": f"return codes {codes}", "load_average_before": load}
    res = [json.loads(line[len("RESULT ") :]) for o in outs for line in o.splitlines()
           if line.startswith("RESULT ")]  # fmt: skip
    res.sort(key=lambda r: r["process"])
    return {**res[0], "affinity": [r["affinity"] for r in res], "load_average_before": load}


def _join(collectives: str, coordinator: str, process_id: int | None) -> None:
    """Join the 2-process run as ``simpar.parallel.distributed.initialize`` does."""
    import jax

    jax.config.update("jax_num_cpu_devices", 1)
    if process_id is None:  # started by mpirun
        process_id = int(os.environ["OMPI_COMM_WORLD_RANK"])
    if collectives == "mpi":
        os.environ["SIMPAR_CPU_COLLECTIVES"] = "mpi"
    from simpar.parallel import distributed

    distributed.initialize(coordinator, 2, process_id)


def _median_s(fn, x, calls: int, warmup: int) -> float:
    for _ in range(warmup):
        x = fn(x)
    x.block_until_ready()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        x = fn(x)
        x.block_until_ready()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker(args) -> None:
    """Time the collectives on this process (one of 2); process 0's figures are reported."""
    _join(args.collectives, args.coordinator, args.process_id)
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_enable_x64", True)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    swap = [(0, 1), (1, 0)]

    def mapped(f):
        return jax.jit(
            jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
        )

    def looped(f):
        return mapped(lambda x: lax.fori_loop(0, args.loop, lambda _, y: f(y), x))

    def array(nbytes: int):
        n = max(nbytes // 8, 1)
        block = np.arange(n, dtype=np.float64)
        return jax.make_array_from_callback((2 * n,), sharding, lambda idx: block)

    ops = {f"ppermute_{b}B": (array(b), lambda y: lax.ppermute(y, "x", swap)) for b in SIZES}
    ops["psum_scalar"] = (array(8), lambda y: lax.psum(y, "x") * 0.5)
    ops["noop"] = (array(8), lambda y: y + 1.0)
    out = {"process": jax.process_index(), "collectives": args.collectives,
           "affinity": sorted(os.sched_getaffinity(0)), **environment(),
           "devices": [str(d) for d in jax.devices()], "calls": args.calls,
           "loop": args.loop, "figures": {}}  # fmt: skip
    for name, (x, f) in ops.items():
        load = os.getloadavg()
        per_call = _median_s(mapped(f), x, args.calls, args.warmup)
        in_loop = _median_s(looped(f), x, max(args.calls // 10, 5), 3) / args.loop
        out["figures"][name] = {"per_call_ms": per_call * 1e3, "in_loop_ms": in_loop * 1e3,
                                "load_average": load}  # fmt: skip
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collectives", default="gloo", help="comma list of gloo, mpi")
    ap.add_argument("--pin", default="yes,no", help="comma list of yes, no")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--loop", type=int, default=20, help="collectives per call for in_loop")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    ap.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    for c in args.collectives.split(","):
        if c not in ("gloo", "mpi"):
            raise SystemExit(f"bench_collectives.py: --collectives takes gloo, mpi; got {c!r}")
    jobs = {}
    for c in args.collectives.split(","):
        for pin in args.pin.split(","):
            jobs[f"{c}_{'pinned' if pin == 'yes' else 'unpinned'}"] = run_job(args, c, pin == "yes")
    print(json.dumps({"benchmark": "cross-process CPU collectives, 2 processes x 1 device",
                      "cores_available": sorted(os.sched_getaffinity(0)),
                      "MPITRAMPOLINE_LIB": os.environ.get("MPITRAMPOLINE_LIB"),
                      "jobs": jobs}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
