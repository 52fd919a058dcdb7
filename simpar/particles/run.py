"""Driver for particle configs (``[model] name = "lj"``): TOML -> validated run -> H5MD.

Config layout (every key optional unless marked; defaults in brackets)::

    name = "lj_bench"            # run name, default output data/runs/<name>.h5md ["lj"]
    [model]
    name = "lj"                  # required
    [system]
    init = "lattice"             # "lattice" | "h5md"
    lattice = "fcc"              # "fcc" | "sc"              (init = "lattice")
    density = 0.8442             # number density, sigma^-3   (init = "lattice")
    cells = [20, 20, 20]         # unit cells per axis         (init = "lattice")
    temperature = 1.44           # initial T, 3N-3 dof         (init = "lattice") [0]
    seed = 87287                 # velocity seed               (init = "lattice") [0]
    file = "run.h5md"            # state to continue           (init = "h5md")
    frame = -1                   # frame of that file          (init = "h5md")
    mass = 1.0                   # [1.0]
    boundary = "periodic"        # "periodic" | "none"  ["periodic"; h5md: the file's]
    dtype = "float64"            # "float32" | "float64"
    [potential]
    kind = "lj"                  # "lj" | "morse"
    epsilon = 1.0                # LJ epsilon / Morse D0
    sigma = 1.0                  # LJ sigma / Morse r0
    alpha = 5.0                  # Morse only
    cutoff = 2.5
    shift = false                # shift the energy to zero at the cutoff
    [neighbors]
    skin = 0.3                   # rebuild when any atom moved > skin / 2
    max_neighbors = 0            # 0: measured; a too small value is regrown
    capacity_factor = 1.2        # head-room of measured / regrown capacities
    [integrator]
    ensemble = "nve"             # "nve" | "langevin"
    temperature = 1.0            # langevin target T
    gamma = 1.0                  # langevin friction (1/tau)
    seed = 0                     # langevin noise seed (h5md init: the file's key)
    [time]
    dt = 0.005                   # required
    steps = 100                  # required (or --steps)
    [output]
    every = 20                   # steps per frame (and per jitted chunk)
    path = "data/runs/lj.h5md"
    velocity = true
    force = false
    checkpoint = true            # write <path>.ckpt with each frame (for --resume)
    [parallel]
    engine = "single"            # "single" | "pmap" | "shard_map" | "sharded"
    mesh = [8]                   # sharded: devices on the 1-D particle mesh [all];
                                 # pmap / shard_map: the device grid cutting the box
                                 # into sub-boxes, e.g. [2, 4] or [2, 2, 2] [all along x]

Everything is validated before the output file is created.

Restart: with each frame the complete state (``simpar.particles.checkpoint``) is written
atomically to ``<path>.ckpt``; ``run_config(..., resume=True)`` (``simpar run --resume``)
continues from it, appending to the same H5MD file, bit for bit equal to an uninterrupted
run on the same engine and mesh (to round-off on another one). ``system.init = "h5md"``
instead starts a new run from a saved frame: see ``simpar.io.h5md`` for its tolerance.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from simpar import precision, signals
from simpar.config import Section
from simpar.errors import ConfigError, SimulationError
from simpar.io import checkpoint, h5md
from simpar.io.files import (
    check_output_path,
    set_status_or_fail,
    status_on_exit,
    write_error,
)
from simpar.io.meta import run_metadata, run_summary
from simpar.memory import check_fits
from simpar.parallel import distributed
from simpar.parallel.particles import shard_particles
from simpar.particles import checkpoint as particle_checkpoint
from simpar.particles import decomposed_sim as domain
from simpar.particles import lattice, md, observables, potentials, space
from simpar.progress import Progress

ENGINES = ("single", "pmap", "shard_map", "sharded")
DOMAIN_ENGINES = ("pmap", "shard_map")  # spatial decomposition (simpar.parallel.domain)


def _read(data: dict, engine, mesh, steps, out):
    """Read and validate the whole config; returns a plain dict of settings."""
    root = Section(data)
    cfg: dict = {"name": root.get("name", "lj", kind=str)}
    model = root.section("model", required=True)
    cfg["model"] = model.get("name", kind=str, choices=("lj",))

    sysc = root.section("system")
    init = cfg["init"] = sysc.get("init", "lattice", kind=str, choices=("lattice", "h5md"))
    cfg["dtype"] = sysc.get("dtype", "float64", kind=str, choices=("float32", "float64"))
    precision.require(cfg["dtype"], sysc.key("dtype"))
    cfg["mass"] = sysc.get("mass", 1.0, min=0.0, exclusive_min=True)
    if init == "lattice":
        cfg["lattice"] = sysc.get("lattice", "fcc", kind=str, choices=("fcc", "sc"))
        cfg["density"] = sysc.get("density", min=0.0, exclusive_min=True)
        cfg["cells"] = sysc.get("cells", kind=int, length=3, min=1)
        cfg["temperature"] = sysc.get("temperature", 0.0, min=0.0)
        cfg["seed"] = sysc.get("seed", 0, kind=int, min=0)
        cfg["boundary"] = sysc.get("boundary", "periodic", kind=str, choices=("periodic", "none"))
    else:
        path = sysc.get("file", kind=str)
        cfg["frame"] = sysc.get("frame", -1, kind=int)
        if not Path(path).is_file():
            raise ConfigError("system.file", f"H5MD file {path!r} not found")
        try:
            cfg["restart"] = h5md.read_frame(path, cfg["frame"])
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            msg = f"cannot read a state from {path!r}: {err}"
            raise ConfigError("system.file", msg) from None
        fr = cfg["restart"]
        _check_restart(path, fr)
        bnd = fr["boundary"]
        default_b = "none" if all(b == "none" for b in bnd) else "periodic"
        cfg["boundary"] = sysc.get("boundary", default_b, kind=str, choices=("periodic", "none"))
        if fr["box"] is None and cfg["boundary"] == "periodic":
            raise ConfigError("system.file", f"{path!r} has no box/edges for a periodic run")
        cfg["file"] = path

    pot = root.section("potential")
    kind = cfg["kind"] = pot.get("kind", "lj", kind=str, choices=potentials.KINDS)
    cfg["epsilon"] = pot.get("epsilon", 1.0, min=0.0, exclusive_min=True)
    cfg["sigma"] = pot.get("sigma", 1.0, min=0.0, exclusive_min=True)
    cfg["alpha"] = pot.get("alpha", 5.0, min=0.0, exclusive_min=True) if kind == "morse" else 0.0
    cfg["cutoff"] = pot.get("cutoff", 2.5, min=0.0, exclusive_min=True)
    cfg["shift"] = pot.get("shift", False, kind=bool)

    nb = root.section("neighbors")
    cfg["skin"] = nb.get("skin", 0.3, min=0.0, exclusive_min=True)
    cfg["max_neighbors"] = nb.get("max_neighbors", 0, kind=int, min=0) or None
    cfg["capacity_factor"] = nb.get("capacity_factor", 1.2, min=1.0)

    integ = root.section("integrator")
    ens = cfg["ensemble"] = integ.get("ensemble", "nve", kind=str, choices=md.ENSEMBLES)
    if ens == "langevin":
        cfg["kt"] = integ.get("temperature", min=0.0)
        cfg["gamma"] = integ.get("gamma", 1.0, min=0.0)
        cfg["noise_seed"] = integ.get("seed", 0, kind=int, min=0)
    else:
        cfg["kt"], cfg["gamma"], cfg["noise_seed"] = 0.0, 0.0, 0

    tm = root.section("time")
    cfg["dt"] = tm.get("dt", min=0.0, exclusive_min=True)
    n_steps = tm.get("steps", None, kind=int, min=0)
    if steps is not None:
        if steps < 0:
            raise ConfigError("--steps", f"must be >= 0, got {steps}")
        n_steps = steps
    if n_steps is None:
        raise ConfigError("time.steps", "missing; set it in the config or with --steps N")
    cfg["steps"] = n_steps

    o = root.section("output")
    cfg["every"] = o.get("every", max(min(n_steps, 100), 1), kind=int, min=1)
    path = o.get("path", f"data/runs/{cfg['name']}.h5md", kind=str)
    cfg["path"] = out if out is not None else path
    key = cfg["path_key"] = "--out" if out is not None else "output.path"
    check_output_path(cfg["path"], key)
    if not cfg["path"].endswith(".h5md"):
        raise ConfigError(key, f"must end in .h5md (MDAnalysis needs it), got {cfg['path']!r}")
    cfg["write_velocity"] = o.get("velocity", True, kind=bool)
    cfg["write_force"] = o.get("force", False, kind=bool)
    cfg["checkpoint"] = o.get("checkpoint", True, kind=bool)

    par = root.section("parallel")
    eng = par.get("engine", "single", kind=str)
    eng = engine if engine is not None else eng
    if eng not in ENGINES:
        raise ConfigError(
            "parallel.engine" if engine is None else "--engine",
            f"{eng!r} is not supported for model 'lj'; supported: {', '.join(ENGINES)}",
        )
    cfg["engine"] = eng
    ndev = len(jax.devices())
    mesh_cfg = par.get("mesh", None, kind=int, length=(1, 2, 3), min=1)
    mesh = tuple(mesh) if mesh is not None else (tuple(mesh_cfg) if mesh_cfg else None)
    if eng == "single":
        # as for grid models: `single` runs on one device whatever the mesh (the mesh says
        # how the other engines split the work, so one command line serves every engine)
        mesh = (1,)
    elif eng in DOMAIN_ENGINES:
        mesh = mesh or (ndev,)
        if math.prod(mesh) > ndev:
            raise ConfigError(
                "--mesh",
                f"mesh {'x'.join(map(str, mesh))} needs {math.prod(mesh)} devices but only "
                f"{ndev} are available (on CPU, pass --devices {math.prod(mesh)})",
            )
    else:
        mesh = mesh or (ndev,)
        if len(mesh) != 1:
            raise ConfigError("parallel.mesh", f"LJ uses a 1-D particle mesh, got {mesh}")
        if mesh[0] > ndev:
            raise ConfigError("parallel.mesh", f"{mesh[0]} devices asked, {ndev} present")
    cfg["mesh"] = mesh
    root.check_unused()
    return cfg


def _check_restart(path: str, fr: dict) -> None:
    """Refuse an H5MD state that cannot start a run, naming the dataset at fault."""
    traj = "/particles/trajectory"
    pos = np.asarray(fr["position"])
    if pos.ndim != 2 or pos.shape[1] != 3 or pos.shape[0] < 2:
        raise ConfigError(
            "system.file",
            f"{path!r}: {traj}/position/value has frames of shape {pos.shape}; "
            "expected (N, 3) with N >= 2",
        )
    if pos.dtype.kind != "f" or not np.all(np.isfinite(pos)):
        raise ConfigError(
            "system.file", f"{path!r}: {traj}/position/value holds non-finite or non-float values"
        )
    vel = fr["velocity"]
    if vel is None:
        raise ConfigError(
            "system.file", f"{path!r} has no velocities to continue from ({traj}/velocity)"
        )
    vel = np.asarray(vel)
    if vel.shape != pos.shape or vel.dtype.kind != "f" or not np.all(np.isfinite(vel)):
        raise ConfigError(
            "system.file",
            f"{path!r}: {traj}/velocity/value must be finite floats of shape {pos.shape} "
            f"like the positions, got {vel.dtype} {vel.shape}",
        )
    box = fr["box"]
    if box is not None:
        box = np.asarray(box)
        edges = np.diag(box) if box.ndim == 2 else box
        if edges.shape != (3,) or not np.all(np.isfinite(edges)) or np.any(edges < 0):
            raise ConfigError(
                "system.file",
                f"{path!r}: {traj}/box/edges must be 3 finite edge lengths >= 0, got "
                f"{np.asarray(box).tolist()}",
            )
        if all(b == "periodic" for b in fr["boundary"]) and np.any(edges <= 0):
            raise ConfigError(
                "system.file",
                f"{path!r}: {traj}/box/edges has a zero edge {edges.tolist()} for a periodic box",
            )
        fr["box"] = edges
    mass = fr.get("mass")
    if mass is not None:
        mass = np.asarray(mass)
        if mass.shape != (pos.shape[0],) or not np.all(np.isfinite(mass)) or np.any(mass <= 0):
            raise ConfigError(
                "system.file",
                f"{path!r}: {traj}/mass must hold {pos.shape[0]} finite masses > 0",
            )
    key = fr.get("rng_key")
    if key is not None and np.asarray(key).shape != (2,):
        raise ConfigError(
            "system.file", f"{path!r}: /parameters/rng_key/value frames must have shape (2,)"
        )


def _initial(cfg):
    """Positions, velocities, box, step, key from the config (host arrays)."""
    dtype = jnp.dtype(cfg["dtype"])
    if cfg["init"] == "lattice":
        r, box = lattice.cubic_lattice(cfg["lattice"], cfg["density"], cfg["cells"], dtype)
        n = r.shape[0]
        if n < 2:
            raise ConfigError("system.cells", "the lattice must hold at least 2 atoms")
        v = lattice.maxwell_boltzmann(
            jax.random.PRNGKey(cfg["seed"]), n, cfg["temperature"], cfg["mass"], dtype=dtype
        )
        return np.asarray(r), np.asarray(v), np.asarray(box), 0, None
    fr = cfg["restart"]
    r = np.asarray(fr["position"], dtype)
    box = fr["box"]
    if box is None:
        span = r.max(0) - r.min(0)
        box = np.maximum(span, 1.0)
    key = fr["rng_key"]
    return r, np.asarray(fr["velocity"], dtype), np.asarray(box, dtype), fr["step"], key


def _check_memory(cfg) -> None:
    """Refuse a run that cannot fit, before the lattice or neighbour lists are allocated."""
    if cfg["init"] == "lattice":
        n = (4 if cfg["lattice"] == "fcc" else 1) * math.prod(cfg["cells"])
        density = cfg["density"]
    else:
        n = cfg["restart"]["position"].shape[0]
        density = 1.0  # dense liquid; the file's box may be open
    reach = cfg["cutoff"] + cfg["skin"]
    neighbours = cfg["max_neighbors"] or max(
        16, int(density * 4.19 * reach**3 * cfg["capacity_factor"] * 1.5)
    )
    item = np.dtype(cfg["dtype"]).itemsize
    # per atom ~ 16 vectors (state, forces, reference positions, host copies); per
    # neighbour slot an index and its displacement, distance and pair terms
    needed = n * (16 * 3 * item) + n * neighbours * (4 + 6 * item) + (256 << 20)
    check_fits(
        needed,
        "system.cells" if cfg["init"] == "lattice" else "system.file",
        f"{n} atoms with about {neighbours} neighbour slots each",
        "use fewer atoms (system.cells) or more processes (--num-processes)",
    )


def _check_geometry(cfg, box):
    if cfg["boundary"] == "periodic":
        need = 2.0 * (cfg["cutoff"] + cfg["skin"])
        if np.min(box) < need:
            raise ConfigError(
                "system.cells",
                f"box edges {np.round(box, 4).tolist()} must be >= 2 * (potential.cutoff "
                f"+ neighbors.skin) = {need:g} for the minimum image; use more cells",
            )


def _blown_up(g: dict, th: dict, dt: float) -> str | None:
    """Why the run cannot go on (non-finite values, atoms jumping > 0.5 sigma per step).

    ``g``: global host arrays ``position`` and ``velocity`` of the atoms."""
    if not all(math.isfinite(x) for x in th.values()):
        return "non-finite energy or pressure (the run blew up)"
    if not np.all(np.isfinite(g["position"])):
        return "non-finite positions (the run blew up)"
    vmax = float(np.sqrt(np.max(np.sum(g["velocity"] ** 2, axis=-1))))
    if vmax * dt > 0.5:
        return (
            f"unstable integration: the fastest atom moves {vmax * dt:.3g} sigma per "
            f"step (T = {th['temperature']:.3g})"
        )
    return None


def run_config(
    data: dict,
    config_text: str,
    *,
    engine: str | None,
    mesh: tuple[int, ...] | None,
    steps: int | None,
    out: str | None,
    progress: bool = True,
    overwrite: bool = False,
    resume: bool = False,
) -> dict:
    """Run an LJ/Morse MD config and write an H5MD trajectory.

    Args:
      data: parsed TOML (``--set`` overrides applied).
      config_text: the resolved config as TOML text (stored in the output).
      engine: ``"single"`` or ``"sharded"`` (None: ``parallel.engine``).
      mesh: device mesh for ``sharded`` (None: ``parallel.mesh`` or all devices).
      steps: overrides ``time.steps``.
      out: overrides ``output.path``.
      progress: show a progress bar / log lines and a thermo row per frame (stderr).
      overwrite: replace an existing output file (else ``ConfigError`` on ``--out``).
      resume: continue from ``<out>.ckpt`` up to ``steps`` steps after the run's first
        step, appending to the output (only ``time.steps`` may differ from the original
        config). ``initial`` and ``energy_drift`` then refer to the resumed state.

    Returns:
      The run summary (``simpar.io.meta.run_summary``, the same keys for every model):
      ``initial`` / ``final`` are the thermo values at the first and last step, ``rate``
      is in atom-steps/s, ``details`` holds ``n_atoms``, ``energy_drift`` (final minus
      initial total energy per atom), ``regrows``, ``neighbor_builds`` and ``ghost_hops``
      (per axis on pmap/shard_map, else None).

    Raises:
      ConfigError: invalid config (no output file is created).
      SimulationError: NaN / unrepairable overflow, naming the step and what to change.
    """
    cfg = _read(data, engine, mesh, steps, out)
    if distributed.process_count() > 1 and cfg["engine"] == "single":
        raise ConfigError(
            "--engine",
            "engine 'single' runs in one process; across processes MD runs on 'pmap', "
            "'shard_map' or 'sharded'",
        )
    main = distributed.is_main()
    progress = progress and main
    ck = None
    if resume:
        ck, ck_step = checkpoint.load_for_resume(cfg["path"], config_text, "lj")
    elif Path(cfg["path"]).exists() and not overwrite:
        raise ConfigError(
            "--out",
            f"output file {cfg['path']} exists; pass --overwrite to replace it or choose "
            "another --out",
        )
    _check_memory(cfg)
    r, v, box, step0, key = _initial(cfg)
    _check_geometry(cfg, box)
    decomposed = cfg["engine"] in DOMAIN_ENGINES
    if decomposed:
        if cfg["boundary"] != "periodic":
            raise ConfigError(
                "system.boundary",
                f"engine {cfg['engine']!r} cuts a periodic box into sub-boxes; free space "
                "runs on 'single' or 'sharded'",
            )
        domain.check_mesh(cfg["mesh"], box, cfg["cutoff"] + cfg["skin"], cfg["skin"])
    if ck is not None:
        step0 = int(ck.get("start_step", step0))
        if ck_step >= step0 + cfg["steps"]:
            raise ConfigError(
                "--steps", f"the checkpoint is at step {ck_step}; ask for more steps to resume"
            )
        if ck.get("position", r).shape != r.shape:
            raise ConfigError("--resume", "the checkpoint holds another number of atoms")
    dtype = jnp.dtype(cfg["dtype"])
    n = r.shape[0]
    ndev = 1 if decomposed else cfg["mesh"][0]
    cap = -(-n // ndev) * ndev
    valid = np.arange(cap) < n
    pad = lambda x: np.concatenate([x, np.zeros((cap - n,) + x.shape[1:], x.dtype)])  # noqa: E731
    r, v = pad(r), pad(v)
    spc = (space.periodic if cfg["boundary"] == "periodic" else space.free)(box, dtype)
    if cfg["kind"] == "lj":
        pot = potentials.lennard_jones(
            cfg["epsilon"], cfg["sigma"], cfg["cutoff"], cfg["shift"], dtype
        )
    else:
        pot = potentials.morse(
            cfg["epsilon"], cfg["alpha"], cfg["sigma"], cfg["cutoff"], cfg["shift"], dtype
        )
    if key is None:
        key = jax.random.PRNGKey(cfg["noise_seed"])
    placement = None
    if cfg["engine"] == "sharded":
        placement = lambda tree: shard_particles(tree, ndev, cap)  # noqa: E731
    layout = particle_checkpoint.layout_name(cfg["engine"], cfg["mesh"], cap)
    if decomposed:
        sim = domain.make_domain_simulation(
            cfg["engine"], cfg["mesh"], spc, pot, r, v, mass=cfg["mass"], key=key,
            dt=cfg["dt"], ensemble=cfg["ensemble"], kt=cfg["kt"], gamma=cfg["gamma"],
            skin=cfg["skin"], step=step0, max_neighbors=cfg["max_neighbors"],
            capacity_factor=cfg["capacity_factor"],
            restore=None if ck is None else particle_checkpoint.lj_global_arrays(ck),
        )  # fmt: skip
    elif ck is not None:
        sim = particle_checkpoint.lj_sim_from_checkpoint(
            ck, spc, pot, ensemble=cfg["ensemble"], dt=cfg["dt"], kt=cfg["kt"],
            gamma=cfg["gamma"], capacity=cap, layout=layout,
            capacity_factor=cfg["capacity_factor"], placement=placement,
        )  # fmt: skip
    else:
        sim = md.make_simulation(
            spc, pot, r, v, mass=cfg["mass"], valid=valid, key=key, dt=cfg["dt"],
            ensemble=cfg["ensemble"], kt=cfg["kt"], gamma=cfg["gamma"], skin=cfg["skin"],
            step=step0, max_neighbors=cfg["max_neighbors"],
            capacity_factor=cfg["capacity_factor"], placement=placement,
        )  # fmt: skip
    th0 = sim.thermo()
    if not all(math.isfinite(x) for x in th0.values()):
        raise SimulationError(step0, "non-finite energy in the initial state",
                              "check system.* (overlapping atoms?)")  # fmt: skip

    seed = cfg.get("seed") if cfg["init"] == "lattice" else None
    attrs = run_metadata(
        config_text, engine=cfg["engine"], mesh=cfg["mesh"], dtype=cfg["dtype"],
        seed=seed if cfg["ensemble"] == "nve" else cfg["noise_seed"], model="lj",
    )  # fmt: skip
    attrs.update(dt=cfg["dt"], ensemble=cfg["ensemble"], potential=cfg["kind"],
                 cutoff=cfg["cutoff"], skin=cfg["skin"], n_atoms=np.int64(n),
                 velocity_seed=np.int64(-1 if seed is None else seed),
                 noise_seed=np.int64(cfg["noise_seed"]))  # fmt: skip
    path = cfg["path"]
    distributed.barrier("simpar: input validated")  # every process checked before 0 writes
    boundary = [cfg["boundary"]] * 3
    host = distributed.to_host  # a collective in multi-process runs: every process calls it

    last_good = [f"{path} (no frame written)"]

    def snapshot():
        """Global host arrays in atom-id order (a collective across processes)."""
        if decomposed:
            return sim.global_state()  # checks the count and ids: "lost atoms" otherwise
        s = sim.state
        return {"position": host(s.position)[:n], "velocity": host(s.velocity)[:n],
                "force": host(s.force)[:n], "key": host(s.key), "step": int(s.step)}  # fmt: skip

    def frame(writer, th, g, bar):
        """Append a frame and print its thermo row (stderr, LAMMPS-like: one per frame)."""
        nonlocal frames
        frames += 1
        step = int(g["step"])
        bar.write(observables.format_thermo(step, th, header=frames == 1))
        try:
            writer.append(  # distributed.NoWriter on processes other than 0
                step, float(step) * cfg["dt"], g["position"], box=np.asarray(box),
                velocity=g["velocity"] if cfg["write_velocity"] else None,
                force=g["force"] if cfg["write_force"] else None, observables=th,
                rng_key=g["key"],
            )  # fmt: skip
        except (OSError, RuntimeError) as err:  # disk full, I/O error (h5py: RuntimeError)
            raise write_error(err, path, step, last_good[0]) from None
        last_good[0] = f"{path} (frames up to step {step})"
        if cfg["checkpoint"]:  # after the frame: a kill in between drops that frame
            if decomposed:
                state = particle_checkpoint.domain_state_to_checkpoint(sim, g, layout, step0)
            else:
                state = particle_checkpoint.lj_state_to_checkpoint(sim, n, layout, step0, host)
            if main:
                checkpoint.save(checkpoint.checkpoint_path(path), state, step, config_text, "lj")

    t0 = time.perf_counter()
    now = sim.current_step() if decomposed else int(sim.state.step)
    done = first = 0 if ck is None else now - step0
    frames = 0
    th = th0
    signals.check()  # stopped during set-up or compilation: no output is created
    if not main:
        writer = distributed.NoWriter()
    elif ck is not None:
        writer = h5md.H5MDWriter.open_existing(path, step=step0 + done)
        last_good[0] = f"{path} (frames up to step {step0 + done})"
    else:
        writer = h5md.H5MDWriter(
            path, n, boundary=boundary, dtype=cfg["dtype"], velocity=cfg["write_velocity"],
            force=cfg["write_force"], observables=observables.NAMES, rng_key=True,
            mass=np.full(n, cfg["mass"]), attrs=attrs, overwrite=overwrite, key=cfg["path_key"],
        )  # fmt: skip
    with status_on_exit(writer):
        with (
            signals.deferred() as stop,
            Progress(cfg["steps"], enabled=progress, desc=cfg["name"]) as bar,
        ):
            writer.set_status("running")
            if ck is None:
                frame(writer, th0, snapshot(), bar)
            bar.update(done)
            while done < cfg["steps"]:
                stop.check()  # SIGINT/SIGTERM: stop here, after the last frame
                # frames at step0 + multiples of output.every (also after a resume)
                k = min(cfg["every"] - done % cfg["every"], cfg["steps"] - done)
                try:
                    sim.advance(k)
                except RuntimeError as err:
                    raise SimulationError(
                        step0 + done,
                        f"neighbour list overflow could not be repaired ({err})",
                        "raise neighbors.max_neighbors or check for collapsing particles",
                        last_good[0],
                    ) from None
                done += k
                th = sim.thermo()
                g = snapshot()
                problem = _blown_up(g, th, cfg["dt"])
                if problem:
                    raise SimulationError(
                        step0 + done, problem,
                        "reduce time.dt (or check the potential and initial state)",
                        last_good[0],
                    )  # fmt: skip
                frame(writer, th, g, bar)
                bar.update(k, T=f"{th['temperature']:.4g}", E=f"{th['total_energy']:.6g}")
            set_status_or_fail(writer, "complete", path, step0 + done, last_good[0])
    wall = time.perf_counter() - t0
    if progress:
        print(f"wrote {path} ({frames} frames) in {wall:.2f} s", file=sys.stderr)
    return run_summary(
        model="lj",
        path=os.fspath(path),
        engine=cfg["engine"],
        mesh=cfg["mesh"],
        dtype=cfg["dtype"],
        steps=cfg["steps"],
        frames=frames,
        resumed_from=step0 + first if resume else None,
        wall_s=wall,
        rate=n * (cfg["steps"] - first) / wall if wall > 0 else float("nan"),
        rate_unit="atom_steps/s",
        initial=th0,
        final=th,
        details={
            "n_atoms": n,
            "energy_drift": th["total_energy"] - th0["total_energy"],
            "regrows": sim.regrows,
            "neighbor_builds": sim.builds if decomposed else int(sim.nbrs.n_builds),
            "ghost_hops": list(sim.spec.hops) if decomposed else None,
        },
    )
