"""LAMMPS as the peer of ``bench_md.py``: its ``bench/in.lj`` on one pinned core
(``--vs-lammps``), or as N MPI ranks pinned one per core (``--processes N``).

``in_lj`` writes LAMMPS's ``bench/in.lj`` (32,000 atoms, fcc 0.8442, T 1.44 seed 87287, LJ
cutoff 2.5, skin 0.3, NVE, 100 steps) with the neighbour policy chosen: as shipped
``neigh_modify delay 0 every 20 check no``, or ``every 1 check yes`` (the exact skin/2 check,
simpar's default). ``run_lammps`` runs it with the CPU affinity given (set before ``exec``, so
every thread of the process inherits it), or as ``ranks`` MPI ranks started by ``mpirun``, rank
``i`` bound to the ``i``-th core given (``--bind-to cpu-list:ordered``, the bindings read back
from ``--report-bindings``), and reads the loop time and the neighbour-list builds from its log.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

IN_LJ = """# LAMMPS bench/in.lj: 3d Lennard-Jones melt
variable x index 1
variable y index 1
variable z index 1
variable xx equal {cells}*$x
variable yy equal {cells}*$y
variable zz equal {cells}*$z
units lj
atom_style atomic
lattice fcc 0.8442
region box block 0 ${{xx}} 0 ${{yy}} 0 ${{zz}}
create_box 1 box
create_atoms 1 box
mass 1 1.0
velocity all create 1.44 87287 loop geom
pair_style lj/cut 2.5
pair_coeff 1 1 1.0 1.0 2.5
neighbor 0.3 bin
neigh_modify delay 0 every {every} check {check}
fix 1 all nve
run {steps}
"""


def find_lmp() -> str | None:
    """The LAMMPS binary on PATH (``lmp``, Debian's name, or ``lmp_serial``), or None."""
    for name in ("lmp", "lmp_serial"):
        path = shutil.which(name)
        if path:
            return path
    return None


def in_lj(cells: int = 20, every: int = 20, check: bool = False, steps: int = 100) -> str:
    """The input script: ``bench/in.lj`` with ``cells`` fcc cells per edge (4 cells^3 atoms)
    and the policy ``neigh_modify delay 0 every <every> check <yes|no>``."""
    return IN_LJ.format(cells=cells, every=every, check="yes" if check else "no", steps=steps)


def run_lammps(lmp: str, script: str, cpus: set[int] | None, ranks: int = 1) -> dict:
    """Run one LAMMPS job (1 OpenMP thread per process) and parse its log.

    Args:
      lmp: the binary.
      script: the input text (``in_lj``).
      cpus: CPU cores to pin the process to (``os.sched_setaffinity``), or None; with
        ``ranks`` > 1 at least ``ranks`` cores, rank ``i`` bound to the ``i``-th lowest.
      ranks: MPI ranks (``mpirun -np ranks``; ``mpirun`` must be on PATH).

    Returns:
      ``{"loop_s": float seconds of the run loop, "atoms": int, "steps": int,
      "atom_steps_per_s": float, "neighbor_builds": int, "dangerous_builds": int | None,
      "pair_s", "neigh_s": float | None seconds of the Pair and Neigh sections,
      "cpu_use_percent": float | None the CPU time of the loop over its wall time (LAMMPS's
      "% CPU use": under load, the share the core gave it), "ranks": int,
      "affinity": list[int] (one core per rank when ranks > 1)}``.

    Raises:
      RuntimeError: LAMMPS or mpirun failed, is missing, or its log lacks the loop line.
    """
    cmd, pin = [lmp], (lambda: os.sched_setaffinity(0, cpus)) if cpus and ranks == 1 else None
    if ranks > 1:
        mpirun = shutil.which("mpirun")
        cores = sorted(cpus or os.sched_getaffinity(0))[:ranks]
        if mpirun is None or len(cores) < ranks:
            raise RuntimeError(f"LAMMPS on {ranks} ranks needs mpirun on PATH and {ranks} cores")
        cmd = [mpirun, "-np", str(ranks), "--bind-to", "cpu-list:ordered", "--cpu-list",
               ",".join(map(str, cores)), "--report-bindings", lmp]  # fmt: skip
        if os.geteuid() == 0:
            cmd[1:1] = ["--allow-run-as-root"]
    with tempfile.TemporaryDirectory() as tmp:
        inp, log = os.path.join(tmp, "in.lj"), os.path.join(tmp, "log.lammps")
        with open(inp, "w") as f:
            f.write(script)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        res = subprocess.run(cmd + ["-in", inp, "-log", log, "-screen", "none"], cwd=tmp,
                             env=env, preexec_fn=pin, capture_output=True, text=True)  # fmt: skip
        text = open(log).read() if os.path.exists(log) else ""
    m = re.search(r"Loop time of ([\d.eE+-]+) on \d+ procs for (\d+) steps with (\d+) atoms", text)
    bound = [c for _, c in sorted((int(i), int(c)) for i, c in re.findall(
        r"rank (\d+) bound to \S+ \S+\[core (\d+)", res.stderr))]  # fmt: skip
    if res.returncode or not m:
        raise RuntimeError(f"LAMMPS failed (exit {res.returncode}): {res.stderr[-500:]}")
    loop, steps, atoms = float(m.group(1)), int(m.group(2)), int(m.group(3))
    builds = re.search(r"Neighbor list builds = (\d+)", text)
    dangerous = re.search(r"Dangerous builds = (\d+)", text)
    cpu_use = re.search(r"([\d.]+)% CPU use", text)  # of the loop's wall time
    # the timing breakdown: "Pair    | 1.1414     | ..." (min over ranks, seconds)
    section = {k: float(v) for k, v in re.findall(r"^(Pair|Neigh|Comm)\s*\|\s*([\d.eE+-]+)",
                                                  text, re.M)}  # fmt: skip
    return {
        "loop_s": loop,
        "atoms": atoms,
        "steps": steps,
        "atom_steps_per_s": atoms * steps / loop,
        "neighbor_builds": int(builds.group(1)) if builds else None,
        "dangerous_builds": int(dangerous.group(1)) if dangerous else None,
        "pair_s": section.get("Pair"),
        "neigh_s": section.get("Neigh"),
        "cpu_use_percent": float(cpu_use.group(1)) if cpu_use else None,
        "ranks": ranks,
        "affinity": bound if ranks > 1 else sorted(cpus or os.sched_getaffinity(0)),
    }


def initial_velocities(lmp: str, directory: str, cells: int = 20) -> str:
    """Write LAMMPS's step-0 atoms of in.lj (``write_dump``, 17 digits, sorted by id) into
    ``directory`` and return the path of the dump (a text file: id x y z vx vy vz).

    Raises:
      RuntimeError: LAMMPS failed or wrote no dump.
    """
    path = os.path.join(directory, "in_lj_step0.txt")
    script = in_lj(cells, steps=0).replace(
        "run 0", f"write_dump all custom {path} id x y z vx vy vz modify sort id "
        "format float %.17g"
    )  # fmt: skip
    inp = os.path.join(directory, "in.step0")
    with open(inp, "w") as f:
        f.write(script)
    res = subprocess.run([lmp, "-in", inp, "-log", "none", "-screen", "none"], cwd=directory,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                         text=True)  # fmt: skip
    if res.returncode or not os.path.exists(path):
        raise RuntimeError(f"LAMMPS failed (exit {res.returncode}): {res.stderr[-500:]}")
    return path


def lattice_velocities(path: str, position, box: float):
    """Velocities of a LAMMPS dump (``initial_velocities``) in the order of ``position``.

    Args:
      path: the dump (id x y z vx vy vz, 9 header lines).
      position: float[N, 3] lattice positions (sigma) of the same atoms, in any order.
      box: the cubic box edge (sigma).

    Returns:
      numpy float64[N, 3] velocities (sigma / tau), row k for ``position[k]``.

    Raises:
      ValueError: the dump's atoms are not the fcc lattice's (count or sites differ).
    """
    import numpy as np

    d = np.loadtxt(path, skiprows=9)
    r = np.asarray(position, np.float64)
    if d.shape[0] != r.shape[0]:
        raise ValueError(f"{path}: {d.shape[0]} atoms, the lattice has {r.shape[0]}")

    m = 2 * round((r.shape[0] / 4) ** (1 / 3))  # fcc sites: multiples of box / m per axis

    def key(x):
        g = np.round(np.mod(x, box) / box * m).astype(np.int64) % m
        return (g[:, 0] * m + g[:, 1]) * m + g[:, 2]

    k_dump, k_lat = key(d[:, 1:4]), key(r)
    o_dump, o_lat = np.argsort(k_dump), np.argsort(k_lat)
    if np.any(k_dump[o_dump] != k_lat[o_lat]):
        raise ValueError(f"{path}: the atoms do not sit on the lattice's sites")
    gap = np.mod(d[o_dump, 1:4] - r[o_lat] + box / 2, box) - box / 2
    if np.max(np.abs(gap)) > 1e-6 * box:  # float32 lattices round at ~1e-6 sigma
        raise ValueError(f"{path}: positions differ from the lattice's by {np.abs(gap).max()}")
    v = np.zeros_like(r)
    v[o_lat] = d[o_dump, 4:7]
    return v
